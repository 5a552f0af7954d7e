"""The tuning history: storage, batching, concurrency, crashes, corrupt files, export/import, and
PostgreSQL (a throwaway server started here when the binaries and psycopg are installed)."""

import glob
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from asp_gmm import GMM
from asp_gmm.runtime import default_runtime
from asp_gmm.tuning_db import SCHEMA_VERSION, History, HistoryError, SchemaMismatchError, VariantKey, default_url
from conftest import make_blobs

FP = {
    "backend": "c",
    "model": "Test CPU @ 1 GHz",
    "isa": ["avx2", "fma"],
    "arch": "x86_64",
    "threads": 2,
    "compiler": "gcc 12",
}
V3 = VariantKey.of("c", "V3", {"chunk_tiles": 4}, "a" * 64)
V4 = VariantKey.of("c", "V4", {"blocks": 16, "chunk_tiles": 4}, "b" * 64)
ROOT = Path(__file__).resolve().parent.parent


def url(tmp_path, name="h.sqlite"):
    return f"sqlite:///{tmp_path / name}"


@pytest.mark.parametrize("writer", ["lite", "sqlalchemy"])
def test_record_flush_and_read_back(tmp_path, writer):
    """Written with the standard library (a plain path) or through SQLAlchemy (a URL with options):
    the same rows, columns and timestamps."""
    u = url(tmp_path) if writer == "lite" else f"sqlite:///file:{tmp_path / 'h.sqlite'}?uri=true"
    h = History(u, package_version="9.9", flush_interval=3600)
    assert (h._lite_path is None) == (writer == "sqlalchemy")
    h.record("dev1", FP, V3, 10000, 19, 16, "full", "float32", "ok", 0.0125, 0.01, 5)
    h.record("dev1", FP, V4, 10000, 19, 16, "full", "float32", "compile-failed")
    assert h.pending == 2 and History(h.url).count() == 0  # batched: nothing written yet
    assert h.flush() == 2 and h.pending == 0
    rows = History(h.url).rows()
    assert [(r.variant, r.N, r.D, r.M, r.status, r.seconds, r.repeats, r.package_version) for r in rows] == [
        (V3, 10000, 19, 16, "ok", 0.0125, 5, "9.9"),
        (V4, 10000, 19, 16, "compile-failed", None, 1, "9.9"),
    ]
    assert rows[0].variant.tunables_dict == {"chunk_tiles": 4}
    ((dev, fp, n),) = h.devices()
    assert (dev, fp, n) == ("dev1", FP, 2)
    with sqlite3.connect(tmp_path / "h.sqlite") as c:
        assert c.execute("select backend, model, isa, cores, compiler from devices").fetchone() == (
            "c",
            "Test CPU @ 1 GHz",
            "avx2,fma",
            2,
            "gcc 12",
        )
        assert c.execute("select count(*) from variants").fetchone() == (2,)
        assert c.execute("select version from asp_gmm_schema").fetchone() == (SCHEMA_VERSION,)
        assert c.execute("pragma journal_mode").fetchone() == ("wal",)
        for (at,) in c.execute("select created_at from timings union all select created_at from devices"):
            assert len(at) == 26 and at[10] == " "  # SQLAlchemy's DateTime text on SQLite, both ways
    with pytest.raises(ValueError, match="status"):
        h.record("dev1", FP, V3, 1, 1, 1, "full", "float32", "great")
    with pytest.raises(ValueError, match="seconds"):
        h.record("dev1", FP, V3, 1, 1, 1, "full", "float32", "ok", None)


def test_batches_are_time_and_size_bounded(tmp_path):
    h = History(url(tmp_path), batch_rows=10, flush_interval=3600)
    h.flush()
    for i in range(9):
        h.record("d", FP, V3, 100 + i, 2, 2, "full", "float32", "ok", 1e-3)
    assert h.pending == 9
    h.record("d", FP, V3, 1000, 2, 2, "full", "float32", "ok", 1e-3)
    assert h.pending == 0 and h.count() == 10
    h.flush_interval = 0.05
    h.record("d", FP, V3, 1, 2, 2, "full", "float32", "ok", 1e-3)
    time.sleep(0.06)
    h.maybe_flush()
    assert h.pending == 0 and h.count() == 11


def test_view_is_immediate_for_own_rows_and_refreshes_others(tmp_path):
    a = History(url(tmp_path), flush_interval=3600, refresh_interval=0.2)
    b = History(a.url, flush_interval=0)
    va = a.view("d")
    assert va.rows == []
    a.record("d", FP, V3, 10, 2, 2, "full", "float32", "ok", 1e-3)
    assert len(a.view("d").rows) == 1  # visible before it is written
    b.record("d", FP, V4, 10, 2, 2, "full", "float32", "ok", 2e-3)
    assert len(a.view("d").rows) == 1  # not yet re-read
    time.sleep(0.25)
    assert sorted(r.variant.name for r in a.view("d").rows) == ["V3", "V4"]
    a.flush()
    time.sleep(0.25)
    assert len(a.view("d").rows) == 2  # its own row, read back, is not counted twice


def test_default_url_and_plain_paths(tmp_path, monkeypatch):
    import platformdirs

    monkeypatch.delenv("ASP_GMM_DB", raising=False)
    monkeypatch.setattr(platformdirs, "user_data_dir", lambda app: str(tmp_path / "data" / app))
    assert default_url() == f"sqlite:///{tmp_path / 'data' / 'asp_gmm' / 'history.sqlite'}"
    monkeypatch.setenv("ASP_GMM_DB", str(tmp_path / "x.sqlite"))
    assert default_url() == f"sqlite:///{tmp_path / 'x.sqlite'}"
    assert History().path == str(tmp_path / "x.sqlite")


CHILD_WRITER = """
import sys, time
from asp_gmm.tuning_db import History, VariantKey
url, tag, n, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
h = History(url, batch_rows=batch, flush_interval=0 if batch == 1 else 3600, keep_per_class=0)
k = VariantKey.of("c", "V" + tag, {}, "f" * 64)
for i in range(n):
    h.record("dev", {"backend": "c"}, k, 1000 + i, 3, 2, "full", "float32", "ok", 1e-3 + i * 1e-6)
print("done", flush=True)
"""


def _python(code, *args, env=None, **kw):
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def test_two_processes_writing_at_once_lose_nothing(tmp_path):
    """Three writers start on a file that does not exist yet (they race to create it too): one
    commits every row, one writes in batches of 7 and the rest at exit (atexit), one commits every
    row; every row is there afterwards, once."""
    u = url(tmp_path)
    procs = [
        _python(CHILD_WRITER, u, "1", 300, 1),
        _python(CHILD_WRITER, u, "2", 300, 7),
        _python(CHILD_WRITER, u, "3", 150, 1),
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    rows = History(u).rows()
    assert len(rows) == 750 and len({r.uid for r in rows}) == 750
    for tag, n in (("V1", 300), ("V2", 300), ("V3", 150)):
        assert sorted(r.N for r in rows if r.variant.name == tag) == list(range(1000, 1000 + n))
    with sqlite3.connect(tmp_path / "h.sqlite") as c:
        assert c.execute("pragma integrity_check").fetchone() == ("ok",)


CHILD_CRASH = """
import os, sys
from sqlalchemy import text
from asp_gmm.tuning_db import History, VariantKey
h = History(sys.argv[1], flush_interval=3600, keep_per_class=0)  # every row: not a test of the bound
k = VariantKey.of("c", "V1", {}, "e" * 64)
for i in range(50):
    h.record("dev", {"backend": "c"}, k, 100 + i, 3, 2, "full", "float32", "ok", 1e-3)
h.flush()
for i in range(5):  # queued, never written: lost with the process, and only those
    h.record("dev", {"backend": "c"}, k, 900 + i, 3, 2, "full", "float32", "ok", 1e-3)
with h._write() as conn:  # die in the middle of a write transaction
    conn.execute(text("insert into timings (uid, device_id, variant_id, N, D, M, cvtype, dtype, repeats, "
                      "status, created_at, package_version) values ('x', 'dev', 1, 1, 1, 1, 'full', 'float32', 1, 'ok', "
                      "'2026-01-01', '')"))
    sys.stdout.write("mid-write\\n"); sys.stdout.flush()
    os._exit(9)
"""


def test_a_crash_mid_write_loses_nothing_committed(tmp_path):
    u = url(tmp_path)
    p = _python(CHILD_CRASH, u)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 9 and "mid-write" in out, err
    rows = History(u).rows()
    assert sorted(r.N for r in rows) == list(range(100, 150))
    with sqlite3.connect(tmp_path / "h.sqlite") as c:
        assert c.execute("pragma integrity_check").fetchone() == ("ok",)


def test_corrupt_file_names_the_path_and_the_fix(tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"this is not a database\n" * 500)
    with pytest.raises(HistoryError) as info:
        History(f"sqlite:///{bad}")
    msg = str(info.value)
    assert str(bad) in msg and "corrupt" in msg and "move" in msg and "ASP_GMM_DB" in msg


def test_foreign_database_is_refused(tmp_path):
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as c:
        c.execute("create table invoices (id integer)")
    with pytest.raises(HistoryError, match="not an asp_gmm tuning history") as info:
        History(f"sqlite:///{other}")
    assert str(other) in str(info.value)
    with sqlite3.connect(other) as c:  # untouched
        assert [r[0] for r in c.execute("select name from sqlite_master where type='table'")] == ["invoices"]


def test_other_schema_version_is_refused(tmp_path):
    h = History(url(tmp_path))
    h.close()
    with sqlite3.connect(tmp_path / "h.sqlite") as c:
        c.execute("update asp_gmm_schema set version = 99")
    with pytest.raises(SchemaMismatchError, match="schema version 99"):
        History(url(tmp_path))


def test_train_with_a_corrupt_history_warns_once_and_uses_the_rule(tmp_path, monkeypatch, rng):
    bad = tmp_path / "corrupt.sqlite"
    bad.write_bytes(os.urandom(8192))
    monkeypatch.setenv("ASP_GMM_DB", f"sqlite:///{bad}")
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    X = make_blobs(rng, 600, 3, 2, dtype=np.float64)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(3):
            g = GMM(2, 3, backend="c", dtype=np.float64)
            g.train(X)
            assert g.last_train.reason == "rule" and g.last_train.explored == []
    msgs = [str(x.message) for x in w if "tuning history" in str(x.message)]
    assert len(msgs) == 1 and str(bad) in msgs[0] and "move" in msgs[0]
    assert bad.read_bytes()[:16] != b"SQLite format 3\x00"  # left alone


def test_export_import_round_trip(tmp_path):
    a = History(url(tmp_path, "a.sqlite"))
    for i in range(5):
        a.record("devA", FP, V3, 1000 * (i + 1), 19, 4, "full", "float32", "ok", 1e-3 * (i + 1), 5e-4, 3)
    a.record("devA", FP, V4, 1000, 19, 4, "full", "float32", "launch-failed")
    assert a.export(tmp_path / "e.json") == 6
    b = History(url(tmp_path, "b.sqlite"))
    assert b.import_(tmp_path / "e.json") == (6, 0)
    assert b.import_(tmp_path / "e.json") == (0, 6)  # idempotent

    def key(r):
        return (r.uid, r.variant, r.N, r.D, r.M, r.status, r.seconds, r.cov_seconds, r.repeats, r.created_at)

    assert sorted(map(key, a.rows())) == sorted(map(key, b.rows()))
    assert b.devices() == [("devA", FP, 6)]


def test_import_refuses_another_schema_version(tmp_path):
    a = History(url(tmp_path, "a.sqlite"))
    a.record("devA", FP, V3, 1000, 19, 4, "full", "float32", "ok", 1e-3)
    a.export(tmp_path / "e.json")
    doc = json.loads((tmp_path / "e.json").read_text())
    doc["schema_version"] = SCHEMA_VERSION + 1
    (tmp_path / "new.json").write_text(json.dumps(doc))
    b = History(url(tmp_path, "b.sqlite"))
    with pytest.raises(SchemaMismatchError, match=f"schema version {SCHEMA_VERSION + 1}.*not imported"):
        b.import_(tmp_path / "new.json")
    assert b.count() == 0
    (tmp_path / "junk.json").write_text('{"hello": 1}')
    with pytest.raises(HistoryError, match="not an asp_gmm history export"):
        b.import_(tmp_path / "junk.json")


def test_clear(tmp_path):
    h = History(url(tmp_path))
    h.record("d", FP, V3, 10, 2, 2, "full", "float32", "ok", 1e-3)
    h.record("d", FP, V4, 10, 2, 2, "full", "float32", "ok", 1e-3)
    assert h.clear() == 2 and h.count() == 0 and h.devices() == [] and h.view("d").rows == []
    h.record("d", FP, V3, 10, 2, 2, "full", "float32", "ok", 1e-3)
    assert h.count() == 1


def _export_doc(tmp_path):
    a = History(url(tmp_path, "src.sqlite"))
    a.record("devA", FP, V3, 1000, 19, 4, "full", "float32", "ok", 1e-3, 5e-4, 3)
    a.record("devA", FP, V4, 2000, 19, 4, "full", "float32", "ok", 2e-3, 1e-3, 3)
    a.record("devA", FP, V4, 3000, 19, 4, "diag", "float64", "compile-failed")
    a.export(tmp_path / "e.json")
    return json.loads((tmp_path / "e.json").read_text())


def _set(path, value):
    def change(doc):
        *head, last = path
        d = doc
        for k in head:
            d = d[k]
        d[last] = value

    return change


BAD_IMPORTS = {
    "N too large": (_set(["timings", 1, "N"], 10**30), "timings[1].N"),
    "N negative": (_set(["timings", 0, "N"], -5), "timings[0].N"),
    "D not an integer": (_set(["timings", 0, "D"], 1.5), "timings[0].D"),
    "M a string": (_set(["timings", 2, "M"], "4"), "timings[2].M"),
    "fingerprint a string": (_set(["devices", 0, "fingerprint"], "x86"), "devices[0].fingerprint"),
    "seconds a string": (_set(["timings", 1, "seconds"], "fast"), "timings[1].seconds"),
    "seconds negative": (_set(["timings", 1, "seconds"], -1.0), "timings[1].seconds"),
    "ok without seconds": (_set(["timings", 0, "seconds"], None), "timings[0].seconds"),
    "tunables not JSON": (_set(["timings", 1, "variant", "tunables"], "{bad"), "timings[1].variant.tunables"),
    "tunables not an object": (_set(["timings", 1, "variant", "tunables"], "[1, 2]"), "timings[1].variant.tunables"),
    "unknown status": (_set(["timings", 2, "status"], "great"), "timings[2].status"),
    "unknown cvtype": (_set(["timings", 0, "cvtype"], "banded"), "timings[0].cvtype"),
    "unknown dtype": (_set(["timings", 0, "dtype"], "int8"), "timings[0].dtype"),
    "repeats zero": (_set(["timings", 0, "repeats"], 0), "timings[0].repeats"),
    "created_at not a date": (_set(["timings", 0, "created_at"], "yesterday"), "timings[0].created_at"),
    "device id unknown": (_set(["timings", 1, "device_id"], "devB"), "timings[1].device_id"),
    "device id a number": (_set(["devices", 0, "id"], 7), "devices[0].id"),
    "uid twice": (lambda doc: doc["timings"][2].update(uid=doc["timings"][0]["uid"]), "timings[2].uid"),
    "timing not an object": (_set(["timings", 1], 42), "timings[1]"),
}


@pytest.mark.parametrize("case", list(BAD_IMPORTS))
def test_import_checks_every_row_before_writing_anything(tmp_path, case):
    """One bad value rejects the whole file with one line naming the row and the field; nothing is
    written (not even the good rows before it) and the history stays readable."""
    change, where = BAD_IMPORTS[case]
    doc = _export_doc(tmp_path)
    change(doc)
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    b = History(url(tmp_path, "b.sqlite"))
    with pytest.raises(HistoryError) as info:
        b.import_(tmp_path / "bad.json")
    msg = str(info.value)
    assert f"{where} " in msg and "nothing was imported" in msg and "\n" not in msg
    assert b.count() == 0 and b.devices() == [] and b.rows() == []


def test_import_of_an_unreadable_file_is_one_error(tmp_path):
    b = History(url(tmp_path, "b.sqlite"))
    (tmp_path / "deep.json").write_text('{"a":' * 100000 + "1" + "}" * 100000)
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00garbage" * 100)
    for name in ("deep.json", "binary.json", "missing.json"):
        with pytest.raises(HistoryError, match=f"cannot read .*{name}"):
            b.import_(tmp_path / name)
    assert b.count() == 0


def test_import_accepts_what_export_writes_and_canonicalises_tunables(tmp_path):
    doc = _export_doc(tmp_path)
    doc["timings"][0]["variant"]["tunables"] = '{ "chunk_tiles" : 4 }'
    doc["timings"][0]["created_at"] += "+00:00"
    (tmp_path / "ok.json").write_text(json.dumps(doc))
    b = History(url(tmp_path, "b.sqlite"))
    assert b.import_(tmp_path / "ok.json") == (3, 0)
    assert {r.variant for r in b.rows()} == {V3, V4}


def _damage(path, device_id):
    """Rows an older import let in: values no asp_gmm writes (SQLite keeps any value in any column)."""
    with sqlite3.connect(path) as c:
        c.execute("insert into variants (backend, name, tunables, source_sha256) values ('c', 'V3', '{bad', 'x')")
        bad_variant = c.execute("select max(id) from variants").fetchone()[0]
        good_variant = c.execute("select min(id) from variants").fetchone()[0]
        cols = "uid, device_id, variant_id, N, D, M, cvtype, dtype, seconds, cov_seconds, repeats, status, created_at, package_version"
        rows = [
            ("d1", bad_variant, 1000, "ok", 1e-3, "2026-01-01 00:00:00.000000"),
            ("d2", good_variant, 1000, "ok", "fast", "2026-01-01 00:00:00.000000"),
            ("d3", good_variant, "abc", "ok", 1e-3, "2026-01-01 00:00:00.000000"),
            ("d4", good_variant, 1000, "ok", 1e-3, "not a time"),
        ]
        for uid, vid, N, st, sec, at in rows:
            c.execute(
                f"insert into timings ({cols}) values (?, ?, ?, ?, 3, 2, 'full', 'float64', ?, null, 1, ?, ?, '')",
                (uid, device_id, vid, N, sec, st, at),
            )
        return [r[0] for r in c.execute("select id from timings where uid like 'd_' order by id")]


def test_a_damaged_history_is_read_around_and_repaired(tmp_path, monkeypatch, rng, capsys):
    """Damaged rows are skipped with one warning naming them: `history list` works, train still
    explores and records (tuning is not switched off), and `history repair` deletes them."""
    from asp_gmm import cli
    from asp_gmm.backends import get_backend

    be = get_backend("c")
    u = url(tmp_path)
    monkeypatch.setenv("ASP_GMM_DB", u)
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    h = History(u)
    good = h.record(be.device_id, be.fingerprint(), V3, 1000, 3, 2, "full", "float64", "ok", 1e-3)
    h.close()
    bad = _damage(tmp_path / "h.sqlite", be.device_id)
    with pytest.warns(RuntimeWarning, match="damaged") as w:
        rows = History(u).rows()
    assert [r.uid for r in rows] == [good.uid]
    msg = str(w[0].message)
    assert all(f"id {i}" in msg for i in bad) and "asp-gmm history repair" in msg
    assert "seconds" in msg and "variant.tunables" in msg and "N " in msg and "created_at" in msg
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli.main(["history", "list"]) == 0
        assert "(5 rows)" in capsys.readouterr().out
        X = make_blobs(rng, 1000, 3, 2, dtype=np.float64)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            g = GMM(2, 3, backend="c", dtype=np.float64)
            g.train(X, max_em_iters=3)
        assert not [x for x in w if "cannot be used" in str(x.message)]
        assert g.last_train.reason == "explore" and g.last_train.explored
        default_runtime().selector.flush()  # what train recorded
    assert cli.main(["history", "repair"]) == 0
    assert "deleted 4" in capsys.readouterr().out
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(History(u).rows()) >= 1 + len(g.last_train.explored)
    assert cli.main(["history", "clear", "--yes"]) == 0 and History(u).count() == 0


def test_the_standard_library_reading_equals_sqlalchemys(tmp_path):
    """A plain SQLite history is read through tuning_db.lite; the rows (damaged ones skipped alike),
    their order, limits and id lists are those of the SQLAlchemy query on the same file."""
    h = History(url(tmp_path))
    for i in range(7):
        h.record("d1" if i % 3 else "d2", FP, (V3, V4)[i % 2], 100 + i, 2, 2, "full", "float32", "ok", 1e-3 * (i + 1))
    h.record("d1", FP, V4, 5, 2, 2, "diag", "float64", "compile-failed", threads=2, sampled_from=None)
    h.close()
    _damage(tmp_path / "h.sqlite", "d1")
    lite_h = History(url(tmp_path))
    assert lite_h._lite_path == str(tmp_path / "h.sqlite") and lite_h._engine_obj is None
    sa_h = History(url(tmp_path))
    sa_h._lite_path = None  # the SQLAlchemy reading of the same file
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the damaged rows' warning (its own test is above)
        for args in [
            ("d1", 0),
            (None, 0),
            ("d1", 3),
            ("d2", 0, 2),
            (None, 0, 7, True),
            ("d1", 0, None, False, [2, 4, 5]),
        ]:
            got, want = lite_h._select(*args), sa_h._select(*args)
            assert got == want and got, args
    assert lite_h._engine_obj is None  # reading made no engine


def test_a_process_that_reads_and_records_timings_does_not_load_sqlalchemy(tmp_path):
    """A plain SQLite history is read and written with the standard library (SQLAlchemy's import
    is ~0.15 s of every short process); the engine is made for anything else, e.g. count()."""
    h = History(url(tmp_path))
    h.record("d", FP, V3, 10, 2, 2, "full", "float32", "ok", 1e-3)
    h.close()
    code = (
        "import sys\n"
        "from asp_gmm.tuning_db import History, VariantKey\n"
        f"h = History({url(tmp_path)!r})\n"
        "assert len(h.view('d').rows) == 1 and 'sqlalchemy' not in sys.modules\n"
        "h.record('d', {}, VariantKey.of('c', 'V4', {}, 'b' * 64), 10, 2, 2, 'full', 'float32', 'ok', 2e-3)\n"
        "h.flush()\n"
        "assert len(h.rows()) == 2 and 'sqlalchemy' not in sys.modules\n"
        "assert h.count() == 2 and 'sqlalchemy' in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert [r.variant.name for r in History(url(tmp_path)).rows()] == ["V3", "V4"]


def test_a_history_damaged_after_opening_is_a_clear_error_on_read(tmp_path):
    h = History(url(tmp_path))
    h.record("d", FP, V3, 10, 2, 2, "full", "float32", "ok", 1e-3)
    h.close()
    r = History(url(tmp_path), refresh_interval=0)
    assert len(r.view("d").rows) == 1
    for p in glob.glob(str(tmp_path / "h.sqlite*")):
        Path(p).write_bytes(b"not a database at all" * 300)
    with pytest.raises(HistoryError, match="corrupt or not an SQLite file") as info:
        r.view("d")
    assert str(tmp_path / "h.sqlite") in str(info.value)


def test_a_foreign_sqlite_file_is_left_byte_for_byte(tmp_path):
    import hashlib

    other = tmp_path / "invoices.sqlite"
    with sqlite3.connect(other) as c:
        c.execute("create table invoices (id integer, amount real)")
        c.execute("insert into invoices values (1, 9.5)")
    before = hashlib.sha256(other.read_bytes()).hexdigest()
    with pytest.raises(HistoryError, match="not an asp_gmm tuning history"):
        History(f"sqlite:///{other}")
    assert hashlib.sha256(other.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["invoices.sqlite"]


@pytest.mark.parametrize("where", ["under-a-file", "uncreatable"])
def test_an_unusable_history_location_warns_once_and_train_works(tmp_path, monkeypatch, rng, where):
    f = tmp_path / "a-file"
    f.write_text("x")
    path = (
        f / "h.sqlite" if where == "under-a-file" else Path("/proc/asp_gmm_nowhere") / str(tmp_path.name) / "h.sqlite"
    )
    monkeypatch.setenv("ASP_GMM_DB", str(path))
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    X = make_blobs(rng, 500, 3, 2, dtype=np.float64)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(2):
            g = GMM(2, 3, backend="c", dtype=np.float64)
            assert np.isfinite(g.train(X, max_em_iters=2))
            assert g.last_train.reason == "rule"
    msgs = [str(x.message) for x in w if "tuning history" in str(x.message)]
    assert len(msgs) == 1 and str(path) in msgs[0] and "ASP_GMM_DB" in msgs[0]
    with pytest.raises(HistoryError, match="ASP_GMM_DB"):
        History(str(path))


def test_a_read_only_history_is_never_advised_deleted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    h = History(url(tmp_path))
    h.record("d", FP, V3, 10, 2, 2, "full", "float32", "ok", 1e-3)
    h.close()
    ro = History(f"sqlite:///file:{tmp_path / 'h.sqlite'}?mode=ro&uri=true")
    assert ro.path == str(tmp_path / "h.sqlite") and ro.count() == 1
    ro.record("d", FP, V3, 10, 2, 2, "full", "float32", "ok", 1e-3)
    with pytest.raises(HistoryError) as info:
        ro.flush()
    msg = str(info.value)
    assert "read-only" in msg and str(tmp_path / "h.sqlite") in msg and "ASP_GMM_DB" in msg
    assert "delete" not in msg and "move" not in msg
    ro._pending.clear()


# ------------------------------------------------------------------ PostgreSQL
def _pg_bin():
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    cands = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(cands[-1]).parent if cands else None


@pytest.fixture(scope="module")
def postgres_url():
    """A throwaway PostgreSQL server in a temporary folder (as the postgres user when run as root)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (pip install 'psycopg[binary]', the test extra)")
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries not found (apt-get install postgresql)")
    run_as = []
    folder = tempfile.mkdtemp(prefix="asp_gmm_pg_")
    if os.geteuid() == 0:
        import pwd

        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no postgres user to run the server")
        os.chown(folder, pw.pw_uid, pw.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    data = os.path.join(folder, "data")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run(
        run_as + [str(bindir / "initdb"), "-N", "-D", data, "-U", "postgres", "-A", "trust"],
        capture_output=True,
        text=True,
    )
    if r.returncode:
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(f"initdb failed: {r.stderr.strip()[-300:]}")
    opts = f"-k {folder} -p {port} -c listen_addresses='' -c fsync=off"
    r = subprocess.run(
        run_as
        + [
            str(bindir / "pg_ctl"),
            "-D",
            data,
            "-o",
            opts,
            "-l",
            os.path.join(folder, "log"),
            "-w",
            "-t",
            "60",
            "start",
        ],
        capture_output=True,
        text=True,
    )
    if r.returncode:
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(f"the PostgreSQL server did not start: {r.stdout.strip()[-300:]}")
    try:
        yield f"postgresql+psycopg://postgres@/postgres?host={folder}&port={port}"
    finally:
        subprocess.run(
            run_as + [str(bindir / "pg_ctl"), "-D", data, "-m", "immediate", "-W", "stop"], capture_output=True
        )
        for _ in range(200):  # pg_ctl's own wait polls slowly; the postmaster is gone in milliseconds
            if not os.path.exists(os.path.join(data, "postmaster.pid")):
                break
            time.sleep(0.025)
        shutil.rmtree(folder, ignore_errors=True)


def test_postgresql_shared_history(postgres_url, tmp_path):
    h = History(postgres_url, package_version="0.1")
    h.clear()
    h.record("devP", FP, V3, 10000, 19, 16, "full", "float32", "ok", 0.02, 0.01, 5)
    h.record("devP", FP, V4, 10000, 19, 16, "full", "float32", "launch-failed")
    h.flush()
    assert "password" not in h.where and h.path is None
    # two writers at once, as two machines of a lab would
    procs = [_python(CHILD_WRITER, postgres_url, str(i), 60, 1 if i == 5 else 9) for i in (5, 6)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    other = History(postgres_url)
    rows = other.rows()
    assert len(rows) == 122 and len({r.uid for r in rows}) == 122
    assert {(r.variant.name, r.status) for r in rows if r.device_id == "devP"} == {
        ("V3", "ok"),
        ("V4", "launch-failed"),
    }
    # the rows the selection's saved aggregates are checked against (tuning_db.History.row_uids)
    some = {r.id: r.uid for r in rows[:3]}
    assert other.row_uids([*some, 10**9]) == some
    v = other.view("devP", start_id=max(r.id for r in rows if r.device_id == "devP"))
    assert v.rows == [] and v.start_id > 0
    # a selector over the server sees the same history as over a file
    other.export(tmp_path / "pg.json")
    local = History(url(tmp_path))
    assert local.import_(tmp_path / "pg.json") == (122, 0)
    h.close()
    other.close()


@pytest.mark.parametrize("query", ["", "?timeout=5"])  # the standard library's path, SQLAlchemy's
def test_row_uids_and_a_view_of_the_rows_after_an_id(tmp_path, query):
    h = History(url(tmp_path) + query)
    for i in range(6):
        h.record("dev", FP, V3, 1000 + i, 19, 16, "full", "float32", "ok", 0.01 + i * 1e-3)
    h.flush()
    rows = h.rows()
    assert h.row_uids([r.id for r in rows] + [10**9]) == {r.id: r.uid for r in rows}
    v = h.view("dev", start_id=rows[3].id)
    assert [r.uid for r in v.rows] == [r.uid for r in rows[4:]] and v.start_id == rows[3].id
    assert h.view("dev", start_id=0) is v  # made once: its start stays
    h.drop_view("dev")
    assert len(h.view("dev").rows) == 6
    h.close()
