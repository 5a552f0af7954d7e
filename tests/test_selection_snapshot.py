"""The selection's aggregates saved between processes (asp_gmm/selection/snapshot.py): a new
selector loads them and reads only the rows stored after them, with the same aggregates, predictors
and plans as one that reads every row; a history that changed under them, a damaged or foreign
file, and queued rows all mean reading the rows."""

import json
import os

import numpy as np
import pytest

from asp_gmm.problem import Problem
from asp_gmm.selection import Config, HistorySelector, snapshot
from asp_gmm.tuning_db import History
from test_selection import FakeBackend, fake_variant

VARIANTS = [fake_variant("V1"), fake_variant("V2"), fake_variant("V3", {"chunk": [4, 8]}), fake_variant("V4")]
CONFIGS = [Config.of(VARIANTS[0]), Config.of(VARIANTS[1]), Config.of(VARIANTS[2], {"chunk": 8}), Config.of(VARIANTS[3])]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    (tmp_path / "cache").mkdir(mode=0o700)  # the compile cache's folder, as asp_gmm.cache makes it
    monkeypatch.setenv("ASP_GMM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(snapshot, "MIN_ROWS", 50)
    snapshot._to_save.clear()
    yield tmp_path / "cache"
    snapshot._to_save.clear()


def _fill(sel, be, rng, n, start=0):
    """``n`` rows: timings of four configurations over many classes (some sampled), and failures."""
    for i in range(start, start + n):
        cv = ("diag", "full")[i % 2]
        p = Problem(int(rng.integers(1_000, 2_000_000)), int(rng.integers(2, 40)), int(rng.integers(1, 64)), cv)
        c = CONFIGS[i % 4]
        if i % 37 == 5:
            sel.record(be, p, c, "launch-failed")
        elif i % 7 == 3:
            sel.record(be, Problem(4096, p.D, p.M, cv), c, "ok", float(rng.uniform(1e-3, 1e-1)), sampled_from=p.N)
        else:
            sel.record(be, p, c, "ok", float(rng.uniform(1e-3, 1e-1)))


def _canonical(state):
    """A state with its variant numbering resolved and every list in a fixed order."""
    vks = [tuple(v) for v in state["variants"]]

    def table(t):
        return sorted((tuple(ck), sorted((vks[i], tuple(vals), n, med) for i, vals, n, med in per)) for ck, per in t)

    return {
        "classes": table(state["classes"]),
        "sampled": table(state["sampled"]),
        "compile_failed": sorted((vks[i], *r) for i, *r in state["compile_failed"]),
        "run_failed": sorted((vks[i], *r) for i, *r in state["run_failed"]),
        "spent": sorted((tuple(ck), *r) for ck, *r in state["spent"]),
    }


def _fresh(url):
    h = History(url)
    return HistorySelector(h), h


def _filled(tmp_path, seed, n=200):
    """A history of ``n`` rows: (url, backend, selector, history)."""
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    be = FakeBackend(VARIANTS)
    sel, h = _fresh(url)
    _fill(sel, be, np.random.default_rng(seed), n)
    h.flush()
    return url, be, sel, h


def _saved(tmp_path, seed):
    """:func:`_filled`, its aggregates saved by a process that read every row."""
    url, be, sel, h = _filled(tmp_path, seed)
    _fresh(url)[0].index(be)
    snapshot.save_all()
    return url, be, sel, h


def test_a_new_selector_loads_the_saved_aggregates_and_reads_no_old_row(tmp_path, cache):
    url, be, sel, h = _filled(tmp_path, 0, 400)
    sel2, h2 = _fresh(url)  # a process that reads every row, and saves at its exit
    built = sel2.index(be)
    assert len(built.view.rows) == h.count() and built.view.start_id == 0
    for ct in (("diag", "float32"), ("full", "float32")):
        built.predictor(*ct)
    snapshot.save_all()
    assert len(list((cache / "selection").glob("*.json"))) == 1

    sel3, h3 = _fresh(url)  # the next process
    loaded = sel3.index(be)
    assert loaded.view.rows == [] and loaded.view.start_id > 0
    assert _canonical(loaded.state()) == _canonical(built.state())
    for ct in (("diag", "float32"), ("full", "float32")):
        assert loaded._loo[ct] == built._loo[ct]  # saved, not recomputed
        got, want = loaded.predictor(*ct), built.predictor(*ct)
        assert got[0] == want[0] and got[2:] == want[2:]
    for p in (Problem(30_000, 12, 16, "diag"), Problem(700_000, 33, 40, "full"), Problem(5_000, 3, 2, "diag")):
        a, b = sel2.plan(be, p, CONFIGS), sel3.plan(be, p, CONFIGS)
        assert (a.primary, a.explore, a.reason) == (b.primary, b.explore, b.reason)
    for x in (h, h2, h3):
        x.close()


def test_rows_stored_after_the_saved_ones_are_folded_in(tmp_path, cache):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    be = FakeBackend(VARIANTS)
    rng = np.random.default_rng(1)
    sel, h = _fresh(url)
    _fill(sel, be, rng, 300)
    h.flush()
    sel2, h2 = _fresh(url)
    sel2.index(be)
    snapshot.save_all()
    _fill(sel, be, rng, 120, start=300)  # another process goes on measuring
    h.flush()
    sel3, h3 = _fresh(url)
    loaded = sel3.index(be)
    assert len(loaded.view.rows) == 120
    with pytest.MonkeyPatch.context() as m:
        m.setattr(snapshot, "load", lambda *a: None)  # every row read
        full = HistorySelector(History(url)).index(be)
    assert len(full.view.rows) == 420
    assert _canonical(loaded.state()) == _canonical(full.state())
    for x in (h, h2, h3):
        x.close()


def test_a_cleared_or_replaced_history_is_read_in_full(tmp_path, cache):
    url, be, sel, h = _saved(tmp_path, 2)
    h.clear()
    _fill(sel, be, np.random.default_rng(3), 60)  # new rows; the saved newest row is gone
    h.flush()
    sel3, h3 = _fresh(url)
    idx = sel3.index(be)
    assert idx.view.start_id == 0 and len(idx.view.rows) == 60
    assert sum(a.n for per in idx.classes.values() for a in per.values()) <= 60
    h.close()
    h3.close()


def test_the_bound_deleting_the_newest_saved_row_keeps_them(tmp_path, cache):
    """The per-class bound deletes a key's oldest rows; the newest saved row may go, the others of
    the anchors stay, and the aggregates are still used."""
    import sqlite3

    url, be, sel, h = _saved(tmp_path, 7)
    (path,) = (cache / "selection").glob("*.json")
    anchors = json.loads(path.read_text())["anchors"]
    assert len(anchors) == snapshot.ANCHORS
    con = sqlite3.connect(tmp_path / "h.sqlite")
    con.execute("DELETE FROM timings WHERE id = ?", (anchors[0][0],))
    con.commit()
    assert _fresh(url)[0].index(be).view.start_id == anchors[0][0]
    con.execute(f"DELETE FROM timings WHERE id IN ({','.join(str(a[0]) for a in anchors)})")
    con.commit()
    con.close()
    assert _fresh(url)[0].index(be).view.start_id == 0  # none left: read in full
    h.close()


def test_a_damaged_or_foreign_file_is_ignored_and_replaced(tmp_path, cache):
    url, be, sel, h = _saved(tmp_path, 4)
    (path,) = (cache / "selection").glob("*.json")
    os.chmod(path, 0o620)  # writable by the group: never read
    assert _fresh(url)[0].index(be).view.start_id == 0
    os.chmod(path, 0o600)
    assert _fresh(url)[0].index(be).view.start_id > 0
    path.write_text('{"format": 1, "url": ')  # damaged
    sel4, h4 = _fresh(url)
    assert sel4.index(be).view.start_id == 0
    snapshot.save_all()  # the reading process saved them again
    assert json.loads(path.read_text())["format"] == snapshot.FORMAT
    doc = json.loads(path.read_text())
    doc["state"]["classes"][0][1][0][0] = 10_000  # a variant number out of range
    path.write_text(json.dumps(doc))
    assert _fresh(url)[0].index(be).view.start_id == 0
    path.write_text("[1, 2]")  # valid JSON, not an object: read the rows (it raised before)
    sel5, h5 = _fresh(url)
    assert sel5.index(be).view.start_id == 0
    assert sel5.plan(be, Problem(30_000, 12, 16, "diag"), CONFIGS).reason != "rule"  # the history serves
    h.close()
    h4.close()
    h5.close()


def test_no_file_where_the_cache_folder_is_missing_or_shared(tmp_path, cache):
    url, be, sel, h = _filled(tmp_path, 6)
    os.chmod(cache, 0o770)  # writable by the group: not a place to read aggregates from
    _fresh(url)[0].index(be)
    snapshot.save_all()
    assert not (cache / "selection").exists()
    os.rmdir(cache)
    _fresh(url)[0].index(be)
    snapshot.save_all()
    assert not cache.exists()  # the compile cache makes its folder, not the selection
    h.close()


def test_queued_rows_are_never_saved(tmp_path, cache):
    """Rows not yet stored have no id: aggregates holding them would count them twice later."""
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    be = FakeBackend(VARIANTS)
    h = History(url, batch_rows=10_000, flush_interval=3600)
    sel = HistorySelector(h)
    _fill(sel, be, np.random.default_rng(5), 200)
    assert h.pending == 200
    sel.index(be)
    snapshot.save_all()
    assert not (cache / "selection").exists() or not list((cache / "selection").glob("*.json"))
    h.close()


def test_the_folder_keeps_the_most_recently_used_files(tmp_path, cache, monkeypatch):
    """Temporary histories (tests, benchmarks) left their files behind for good; saving now keeps
    the KEEP_FILES most recently used (a load marks its file used), never another user's or
    another name, and the file just written."""
    monkeypatch.setattr(snapshot, "KEEP_FILES", 4)
    url, be, sel, h = _saved(tmp_path, 0)  # the history in use: its file, loaded later
    folder = cache / "selection"
    (ours,) = folder.glob("*.json")
    old = []
    for k in range(6):  # files of histories that are gone, older than ours
        f = folder / f"{k:040x}.json"
        f.write_text("{}")
        os.utime(f, (1000 + k, 1000 + k))
        old.append(f)
    os.utime(ours, (500, 500))  # oldest of all, until a load uses it
    other = folder / "notes.json"
    other.write_text("{}")
    sel2, h2 = _fresh(url)
    assert sel2.index(be).view.start_id > 0  # loaded, and marked used
    url3 = f"sqlite:///{tmp_path / 'h3.sqlite'}"  # another history, saved: the folder is pruned
    sel3, h3 = _fresh(url3)
    _fill(sel3, be, np.random.default_rng(3), 200)
    h3.flush()
    _fresh(url3)[0].index(be)
    snapshot.save_all()
    left = {p.name for p in folder.glob("*.json")}
    assert ours.name in left and "notes.json" in left
    assert len(left - {"notes.json"}) == 4
    assert {f.name for f in old[-2:]} <= left and not {f.name for f in old[:4]} & left
    for x in (h, h2, h3):
        x.close()


def test_the_saved_leave_one_out_is_reused_while_the_classes_grow_by_a_few(tmp_path, cache, monkeypatch):
    """A history that grows by a class or two per process reuses the saved leave-one-out (most of a
    process's first plan) until its classes grow by more than index.LOO_REUSE."""
    from asp_gmm.selection import costmodel
    from asp_gmm.selection import index as index_mod

    url, be, sel, h = _filled(tmp_path, 3, 400)
    rng = np.random.default_rng(4)  # (the rows to come: new classes)
    sel2, h2 = _fresh(url)
    built = sel2.index(be)
    ct = ("full", "float32")
    built.predictor(*ct)
    saved = built._loo[ct]
    snapshot.save_all()
    _fill(sel, be, rng, 4, start=400)  # a few new classes, two of them full
    h.flush()

    calls = []
    real = costmodel.loo_nearest_accuracy
    monkeypatch.setattr(costmodel, "loo_nearest_accuracy", lambda *a, **k: calls.append(1) or real(*a, **k))
    sel3, h3 = _fresh(url)
    loaded = sel3.index(be)
    assert len(loaded.view.rows) == 4
    n = sum(1 for k in loaded.classes if k[:2] == ct)
    assert saved[0] < n <= saved[0] * (1 + index_mod.LOO_REUSE)
    assert loaded.predictor(*ct)[2:] == saved[1:] and calls == []  # reused

    _fill(sel, be, rng, 80, start=404)  # then many: recomputed over the classes there are now
    h.flush()
    sel4, h4 = _fresh(url)
    again = sel4.index(be)
    again.predictor(*ct)
    assert calls == [1] and again._loo[ct][0] == sum(1 for k in again.classes if k[:2] == ct) > n
    for x in (h, h2, h3, h4):
        x.close()
