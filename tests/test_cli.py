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
    eps = [e for e in metadata.entry_points(group="console_scripts") if e.name == "asp-gmm"]
    assert eps and eps[0].value == "asp_gmm.cli:main"


def test_tune_records_every_timing_and_train_then_uses_them(db, tmp_path, capsys, monkeypatch):
    png, js = tmp_path / "map.png", tmp_path / "t.json"
    rc = cli.main(["tune", "--N", "600,1500", "--D", "2,5", "--M", "1,3", "--repeats", "2", "--out", str(png),
                   "--json", str(js), "--quiet"])
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
    g.train(X, max_em_iters=3)
    winner = min((r for r in History(db).rows() if (r.N, r.D, r.M) == (1500, 5, 3)), key=lambda r: r.seconds)
    assert g.last_train.reason == "history" and g.last_train.explored == []
    assert g.last_variant.split("(")[0] == winner.variant.name


def test_tune_with_tunables_sweeps_the_combinations(db, capsys):
    rc = cli.main(["tune", "--N", "700", "--D", "3", "--M", "2", "--repeats", "1", "--tunables", "--variants",
                   "V3", "--out", "", "--quiet"])
    assert rc == 0
    space = [json.dumps(t, sort_keys=True, separators=(",", ":")) for t in registry.get("c", "V3").tunable_space()]
    rows = History(db).rows()
    assert len(space) > 1 and sorted(r.variant.tunables for r in rows) == sorted(space)
    assert {r.variant.name for r in rows} == {"V3"}


def test_measure_marks_a_wrong_variant_invalid(tmp_path):
    from test_selection import FakeBackend, FakeSession, VARIANTS
    from asp_gmm.selection import Config

    class Wrong(FakeSession):
        def em(self, kernel, *a):
            run = super().em(kernel, *a)
            if kernel.variant.name == "V2":
                self.covars = self.covars * 1.5  # a wrong covariance
            return run

    be = FakeBackend()
    be.open = lambda X, p: Wrong(be, X, p)
    p = Problem(400, 3, 2, dtype="float64")
    got = []
    ms = autotune.measure(be, p, [Config.of(v) for v in VARIANTS], repeats=2,
                          record=lambda *a: got.append((a[1].variant.name, a[2])))
    assert {m.config.variant.name: m.status for m in ms} == {"V1": "ok", "V2": "invalid", "V3": "ok", "V4": "ok",
                                                             "V5": "ok"}
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
    assert cli.main(["info", "--backend", "c"]) == 0
    out = capsys.readouterr().out
    assert db in out and "cache folder" in out
    from asp_gmm.backends import get_backend
    be = get_backend("c")
    assert be.device_id in out and str(be.fingerprint()["model"]) in out
    for v in registry.variants("c", "covariance"):
        assert f"variant {v.name}" in out and v.source_sha256[:12] in out
        for lim in v.limits:
            assert lim.require in out


def test_corrupt_database_is_reported_with_the_path(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"\0garbage" * 1000)
    monkeypatch.setenv("ASP_GMM_DB", str(bad))
    assert cli.main(["history", "list"]) == 1
    err = capsys.readouterr().err
    assert str(bad) in err and "move" in err


def test_runs_as_a_module(db):
    r = subprocess.run([sys.executable, "-m", "asp_gmm.cli", "history", "list"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "(0 rows)" in r.stdout
