"""History contracts: typed device fingerprints and the schema 1 -> 2 migration.

tests/data/history-schema1.{sqlite,json} were written by the schema-1 code (a CPU recorded with 1 and
with 2 threads, so two devices; an H100 stored with cores = 0 and isa = "")."""

import shutil
import sqlite3
from pathlib import Path

from asp_gmm.tuning_db import SCHEMA_VERSION, History
from asp_gmm.tuning_db.devices import CpuFingerprint, CudaFingerprint, device_id, device_of

DATA = Path(__file__).parent / "data"
GPU = {
    "backend": "cuda",
    "model": "NVIDIA H100 80GB HBM3",
    "arch": "sm_90",
    "sm_count": 132,
    "memory": 84929216512,
    "driver": 12080,
    "compiler": "nvcc 13.0",
}


def test_one_fingerprint_type_per_backend_fills_the_columns():
    g = device_of(GPU)
    assert isinstance(g, CudaFingerprint) and (g.cc, g.sm_count, g.memory, g.driver) == (
        "sm_90",
        132,
        84929216512,
        "12080",
    )
    assert g.columns() == dict(
        backend="cuda", model="NVIDIA H100 80GB HBM3", isa="sm_90", cores=132, driver="12080", compiler="nvcc 13.0"
    )
    c = device_of({"backend": "c", "model": "X", "isa": ["avx2", "fma"], "threads": 16, "arch": "x86_64"})
    assert isinstance(c, CpuFingerprint) and c.columns()["isa"] == "avx2,fma" and c.columns()["cores"] == 16


def test_the_cpu_fingerprint_does_not_depend_on_the_threads_setting(monkeypatch):
    from asp_gmm.backends.c import CBackend

    be = CBackend()
    monkeypatch.setenv("ASP_GMM_NUM_THREADS", "1")
    one = be.device_id
    monkeypatch.setenv("ASP_GMM_NUM_THREADS", "2")
    assert be.device_id == one == device_id(be.fingerprint())


def _open_copy(tmp_path):
    db = tmp_path / "h.sqlite"
    shutil.copy(DATA / "history-schema1.sqlite", db)
    with sqlite3.connect(db) as c:
        assert c.execute("select version from asp_gmm_schema").fetchone()[0] == 1
        before = c.execute("select count(*) from timings").fetchone()[0]
    return db, before, History(f"sqlite:///{db}")


def test_a_schema1_file_is_migrated_and_keeps_its_rows(tmp_path):
    db, before, h = _open_copy(tmp_path)
    try:
        devices = h.devices()
        rows = h.rows()
    finally:
        h.close()
    assert SCHEMA_VERSION == 3 and before == len(rows) == 6
    cpus = [(d, fp, n) for d, fp, n in devices if fp["backend"] == "c"]
    assert len(cpus) == 1 and cpus[0][1]["threads"] == 2 and cpus[0][2] == 4  # one CPU, one device
    cpu_rows = sorted((r.M, r.threads, r.seconds) for r in rows if r.device_id == cpus[0][0])
    assert cpu_rows == [(4, 1, 0.04), (4, 2, 0.08), (16, 1, 0.16), (16, 2, 0.32)]
    assert all(r.sampled_from is None for r in rows)  # schema 3: older timings ran on the whole data
    with sqlite3.connect(db) as c:
        assert c.execute("select version from asp_gmm_schema").fetchone()[0] == 3
        gpu = c.execute("select isa, cores, driver from devices where backend = 'cuda'").fetchall()
        assert gpu == [("sm_90", 132, "12080")]
        assert c.execute("select count(*) from devices where backend = 'c'").fetchone()[0] == 1
    h = History(f"sqlite:///{db}")  # opening again: already version 2, nothing changes
    try:
        assert len(h.rows()) == 6 and len(h.devices()) == 2
    finally:
        h.close()


def test_export_import_round_trip_after_migration(tmp_path):
    db, _, h = _open_copy(tmp_path)
    try:
        h.export(tmp_path / "e.json")
        rows = sorted((r.uid, r.device_id, r.threads, r.seconds) for r in h.rows())
    finally:
        h.close()
    h2 = History(f"sqlite:///{tmp_path / 'b.sqlite'}")
    try:
        assert h2.import_(tmp_path / "e.json") == (6, 0)
        assert h2.import_(tmp_path / "e.json") == (0, 6)
        assert sorted((r.uid, r.device_id, r.threads, r.seconds) for r in h2.rows()) == rows
    finally:
        h2.close()


def test_a_schema1_export_imports_with_the_same_merge(tmp_path):
    db, _, h = _open_copy(tmp_path)
    try:
        migrated = sorted((r.uid, r.device_id, r.threads) for r in h.rows())
    finally:
        h.close()
    h2 = History(f"sqlite:///{tmp_path / 'c.sqlite'}")
    try:
        assert h2.import_(DATA / "history-schema1.json") == (6, 0)
        assert sorted((r.uid, r.device_id, r.threads) for r in h2.rows()) == migrated
        assert len(h2.devices()) == 2
    finally:
        h2.close()


def test_a_c_run_stores_the_threads_it_used(tmp_path, monkeypatch):
    import numpy as np

    from asp_gmm import GMM
    from asp_gmm.backends import get_backend
    from asp_gmm.runtime import default_runtime

    if get_backend("c").unavailable_reason():
        import pytest

        pytest.skip("no C compiler")
    db = tmp_path / "h.sqlite"
    monkeypatch.setenv("ASP_GMM_DB", f"sqlite:///{db}")
    monkeypatch.setenv("ASP_GMM_NUM_THREADS", "1")
    monkeypatch.setattr(default_runtime(), "_urls", {})
    X = np.random.default_rng(0).normal(size=(3000, 3)).astype(np.float32)
    GMM(2, 3, backend="c").train(X, max_em_iters=3)
    default_runtime().shared_history().flush()
    rows = History(f"sqlite:///{db}").rows()
    ok = [r for r in rows if r.status == "ok"]
    assert ok and {r.threads for r in ok} == {1}
