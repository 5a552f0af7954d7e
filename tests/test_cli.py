"""The ``asp-gmm`` command: tune over a small grid, history list/export/import/clear, info."""

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from asp_gmm import GMM, autotune, cli, registry
from asp_gmm.problem import Problem
from asp_gmm.tuning_db import History

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def db(tmp_path, monkeypatch):
    u = f"sqlite:///{tmp_path / 'cli.sqlite'}"
    monkeypatch.setenv("ASP_GMM_DB", u)
    return u


def test_console_script_is_declared():
    try:
        metadata.version("asp_gmm")
    except metadata.PackageNotFoundError:  # run from a checkout on PYTHONPATH (as on the GPU machine)
        pytest.skip("asp_gmm is not installed here (run from the checkout): no entry points to read")
    eps = [e for e in metadata.entry_points(group="console_scripts") if e.name == "asp-gmm"]
    assert eps and eps[0].value == "asp_gmm.cli:main"


def test_tune_records_every_timing_and_train_then_uses_them(db, tmp_path, capsys, monkeypatch):
    png, js = tmp_path / "map.png", tmp_path / "t.json"
    rc = cli.main(
        [
            "tune",
            "--N",
            "600,1500",
            "--D",
            "2,5",
            "--M",
            "1,3",
            "--repeats",
            "2",
            "--out",
            str(png),
            "--json",
            str(js),
            "--quiet",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    n_variants = len([v for v in registry.variants("c", "covariance") if "full" in v.cvtypes])
    assert History(db).count() == 8 * n_variants
    assert all(r.status == "ok" and r.repeats == 2 for r in History(db).rows())
    lines = [l for l in out.splitlines() if l.strip()[:1].isdigit() and len(l.split()) == 3 + n_variants + 2]
    assert len(lines) == 8  # one table row per problem, each with a winner
    names = {v.name for v in registry.variants("c", "covariance")}
    for line in lines:
        assert line.split()[-2] in names
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(js.read_text())
    assert {(d["N"], d["D"], d["M"]) for d in doc} == {(n, d, m) for n in (600, 1500) for d in (2, 5) for m in (1, 3)}
    # train() on a tuned problem exploits the sweep: same keys, no exploration
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    X = np.random.default_rng(5).standard_normal((1500, 5)).astype(np.float32)
    g = GMM(3, 5, backend="c")
    g.train(X, min_em_iters=10, max_em_iters=10)  # the tunable search explores in place first
    winner = min((r for r in History(db).rows() if (r.N, r.D, r.M) == (1500, 5, 3)), key=lambda r: r.seconds)
    # the sweep measured default tunables only: train exploits its winner and searches its tunables
    assert g.last_train.reason in ("history", "explore")
    assert g.last_variant.split("(")[0] == winner.variant.name
    assert all("=" in label for label in g.last_train.explored)


def test_tune_with_tunables_sweeps_the_combinations(db, capsys):
    rc = cli.main(
        [
            "tune",
            "--N",
            "700",
            "--D",
            "3",
            "--M",
            "2",
            "--repeats",
            "1",
            "--tunables",
            "--variants",
            "V3",
            "--out",
            "",
            "--quiet",
        ]
    )
    assert rc == 0
    space = [json.dumps(t, sort_keys=True, separators=(",", ":")) for t in registry.get("c", "V3").tunable_space()]
    rows = History(db).rows()
    assert len(space) > 1 and sorted(r.variant.tunables for r in rows) == sorted(space)
    assert {r.variant.name for r in rows} == {"V3"}


def test_measure_marks_a_wrong_variant_invalid(tmp_path):
    from test_selection import FakeBackend, FakeSession, VARIANTS
    from asp_gmm.selection import Config

    class Wrong(FakeSession):
        def em(self, kernel, *a, **kw):
            run = super().em(kernel, *a, **kw)
            if kernel.variant.name == "V2":
                self.covars = self.covars * 1.5  # a wrong covariance
            return run

    be = FakeBackend()
    be.open = lambda X, p: Wrong(be, X, p)
    p = Problem(400, 3, 2, dtype="float64")
    got = []
    ms = autotune.measure(
        be, p, [Config.of(v) for v in VARIANTS], repeats=2, record=lambda *a: got.append((a[1].variant.name, a[2]))
    )
    assert {m.config.variant.name: m.status for m in ms} == {
        "V1": "ok",
        "V2": "invalid",
        "V3": "ok",
        "V4": "ok",
        "V5": "ok",
    }
    assert ("V2", "invalid") in got


def test_history_list_export_import_clear(db, tmp_path, capsys, monkeypatch):
    assert cli.main(["tune", "--N", "500", "--D", "2", "--M", "2", "--repeats", "1", "--out", "", "--quiet"]) == 0
    n = History(db).count()
    capsys.readouterr()
    assert cli.main(["history", "list"]) == 0
    out = capsys.readouterr().out
    assert f"({n} rows)" in out and out.count("  500 ") == n
    exp = tmp_path / "wisdom.json"
    assert cli.main(["history", "export", str(exp)]) == 0
    other = f"sqlite:///{tmp_path / 'other.sqlite'}"
    monkeypatch.setenv("ASP_GMM_DB", other)
    assert cli.main(["history", "import", str(exp)]) == 0
    assert History(other).count() == n
    assert cli.main(["history", "import", str(exp)]) == 0
    assert "already present" in capsys.readouterr().out and History(other).count() == n
    doc = json.loads(exp.read_text())
    doc["schema_version"] += 1
    (tmp_path / "future.json").write_text(json.dumps(doc))
    assert cli.main(["history", "import", str(tmp_path / "future.json")]) == 1
    assert "schema version" in capsys.readouterr().err
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    assert cli.main(["history", "clear"]) == 2 and History(other).count() == n
    assert cli.main(["history", "clear", "--yes"]) == 0 and History(other).count() == 0


def test_info(db, capsys):
    """Short by default (the compiler on one line, no limits); --verbose adds tunables and limits."""
    assert cli.main(["info", "--backend", "c"]) == 0
    out = capsys.readouterr().out
    assert db in out and "cache folder" in out
    from asp_gmm.backends import get_backend

    be = get_backend("c")
    assert be.device_id in out and str(be.fingerprint()["model"]) in out
    (compiler,) = [ln for ln in out.splitlines() if ln.strip().startswith("compiler:")]
    assert "|" not in compiler and "Copyright" not in compiler and len(compiler) < 100
    assert "limit:" not in out and "tunables:" not in out and "--verbose" in out
    for v in registry.variants("c", "covariance"):
        assert f"variant {v.name}" in out and v.source_sha256[:12] in out
    assert cli.main(["info", "--backend", "c", "--verbose"]) == 0
    out = capsys.readouterr().out
    for v in registry.variants("c", "covariance"):
        for lim in v.limits:
            assert lim.require in out
    assert "tunables:" in out and "Copyright" in out  # the compiler's full text, once


def test_version(capsys):
    import asp_gmm

    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0 and asp_gmm.__version__ in capsys.readouterr().out


def _parsers(parser, path=()):
    yield path, parser
    for a in parser._actions:
        if isinstance(a, __import__("argparse")._SubParsersAction):
            for name, p in a.choices.items():
                yield from _parsers(p, path + (name,))


def test_every_help_shows_the_defaults():
    checked = 0
    for path, parser in _parsers(cli.build_parser()):
        text = parser.format_help()
        for a in parser._actions:
            if not a.option_strings or a.required or a.nargs == 0 or a.default is None and not a.help:
                continue
            opt = a.option_strings[-1]
            block = text[text.index(f"  {a.option_strings[0]}") :]
            nxt = [i for i in (block.find("\n  -", 1),) if i > 0]
            block = block[: nxt[0]] if nxt else block
            assert "(default: " in block, (path, opt, block)
            checked += 1
    assert checked >= 12


def _tune(*extra):
    return cli.main(["tune", "--N", "600", "--D", "2", "--M", "2", "--out", "", "--quiet", *extra])


def test_tune_refuses_unknown_variants_and_bad_sizes(db, capsys):
    assert _tune("--variants", "V1,V9") == 2
    err = capsys.readouterr().err
    assert "unknown variant V9 for backend c; known: " in err and "V1" in err.split("known:")[1]
    for bad, words in (
        (["--N", "abc"], "argument --N: 'abc' is not a positive integer"),
        (["--M", "2,x"], "argument --M: 'x' is not a positive integer"),
        (["--D", "0"], "argument --D: '0' is not a positive integer"),
        (["--repeats", "0"], "argument --repeats: '0' is not a positive integer"),
    ):
        with pytest.raises(SystemExit) as info:
            cli.main(["tune", "--N", "600", "--D", "2", "--M", "2", *bad])
        assert info.value.code == 2 and words in capsys.readouterr().err
    assert cli.main(["tune", "--N", "100,1000", "--D", "2", "--M", "2,500", "--out", "", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "N=100 < M=500" in err and "at least as many events as components" in err
    assert History(db).count() == 0


def test_tune_warns_that_single_timings_are_noise(db, capsys):
    assert _tune("--repeats", "1", "--variants", "V1,V2") == 0
    err = capsys.readouterr().err
    assert "asp-gmm: RuntimeWarning: --repeats 1: single timings are noise" in err
    assert "Traceback" not in err and "warnings.warn" not in err
    assert _tune("--repeats", "3", "--variants", "v1") == 0  # names are case-insensitive
    assert "noise" not in capsys.readouterr().err


def test_heat_map_shows_the_table_gain_and_the_times(db, tmp_path, capsys, monkeypatch):
    import matplotlib.axes

    texts = []
    real = matplotlib.axes.Axes.text
    monkeypatch.setattr(
        matplotlib.axes.Axes, "text", lambda self, x, y, s, *a, **k: texts.append(s) or real(self, x, y, s, *a, **k)
    )
    png = tmp_path / "m.png"
    assert (
        cli.main(
            [
                "tune",
                "--N",
                "600",
                "--D",
                "2,3",
                "--M",
                "2",
                "--repeats",
                "2",
                "--variants",
                "V1,V2,V3",
                "--out",
                str(png),
                "--quiet",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    rows = [ln.split() for ln in out.splitlines() if ln.split()[:1] == ["600"] and len(ln.split()) == 8]
    assert len(rows) == 2 and len(texts) == 2
    for row, text in zip(rows, texts):
        winner, gain = row[-2], row[-1]
        assert gain.endswith("x") and float(gain[:-1]) >= 1.0
        assert text.split("\n") == [winner, gain, row[3 + ["V1", "V2", "V3"].index(winner)] + " ms"]
    assert png.exists()


def test_unexpected_errors_are_one_line(monkeypatch, capsys):
    def boom(args):
        raise RuntimeError("something odd")

    monkeypatch.setattr(cli, "cmd_info", boom)
    assert cli.main(["info"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RuntimeError: something odd" in err and "ASP_GMM_DEBUG" in err


def test_corrupt_database_is_reported_with_the_path(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"\0garbage" * 1000)
    monkeypatch.setenv("ASP_GMM_DB", str(bad))
    assert cli.main(["history", "list"]) == 1
    err = capsys.readouterr().err
    assert str(bad) in err and "move" in err


def test_runs_as_a_module(db):
    r = subprocess.run(
        [sys.executable, "-m", "asp_gmm.cli", "history", "list"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and "(0 rows)" in r.stdout


def test_history_why_shows_the_plan_and_its_reasons(db, capsys, monkeypatch):
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    assert cli.main(["history", "why", "--N", "1500000", "--D", "19", "--M", "16"]) == 0
    out = capsys.readouterr().out
    assert "N=1500000 D=19 M=16 full float32: runs" in out and "(explore)" in out
    assert "why: rule order (nothing measured nearby)" in out and "explores first" in out
    assert (
        "budget: nothing explored on samples in this class yet (allowance 10 % of each call, 5 % for the tunable search)"
        in out
    )
    # what exploring spent in the class: its sampled iterations against the whole-data ones
    from asp_gmm.problem import Problem
    from asp_gmm.specializer import Specializer

    sp = Specializer("c")
    p = Problem(1500000, 19, 16)
    cfg = sp.candidates(p)[0]
    sp.policy.record(sp.backend, Problem(40000, 19, 16), cfg, "ok", 0.25, 0.1, 1, sampled_from=p.N)
    sp.policy.record(sp.backend, p, cfg, "ok", 0.5, 0.2, 10)
    sp.policy.selector.flush()
    assert cli.main(["history", "why", "--N", "1500000", "--D", "19", "--M", "16"]) == 0
    out = capsys.readouterr().out
    assert "budget: exploring spent 0.25 s on 1 sampled iteration(s) in this class against 5 s" in out
    assert "(4.8 % of the time; allowance 10 % of each call, 5 % for the tunable search)" in out
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "0")
    assert cli.main(["history", "why", "--N", "1000", "--D", "2", "--M", "2"]) == 0
    assert "(rule)" in capsys.readouterr().out


def test_tune_without_matplotlib_names_the_extra(db, capsys, monkeypatch, tmp_path):
    def no_matplotlib(*a, **k):
        raise ImportError("No module named 'matplotlib'")

    monkeypatch.setattr(autotune, "heatmap", no_matplotlib)
    args = ["tune", "--N", "600", "--D", "2", "--M", "2", "--repeats", "1", "--quiet", "--out", str(tmp_path / "m.png")]
    assert cli.main(args) == 0
    err = capsys.readouterr().err
    assert "no heat map" in err and "pip install 'asp_gmm[tune]'" in err


def test_info_says_when_a_backends_variants_cannot_run_here(db, capsys, monkeypatch):
    from asp_gmm import backends

    monkeypatch.setattr(backends, "unavailable_reason", lambda name: "no GPU here" if name == "cuda" else None)
    assert cli.main(["info", "--backend", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "backend cuda: not available (no GPU here)" in out
    head = out.index("its variants (none can run here without the cuda backend)")
    assert head < out.index("variant V1")


def test_readme_commands_are_complete():
    # what a newcomer copies from the README runs as written
    readme = (ROOT / "README.md").read_text()
    assert "clear --yes" in readme  # clear refuses without --yes
    contract = readme[readme.index("The per-block contract") :]
    contract = contract[: contract.index("\n\n")]
    assert "CUDA" in contract and "through their sessions" not in contract
