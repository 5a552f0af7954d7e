"""The history's background writer (tuning_db/writer.py): record() returns without writing, the rows
reach the database on the writer's thread, and none is lost at interpreter exit or in a forked child
(a multiprocessing child ends with os._exit, skipping atexit); a failed background write is raised
on the caller's thread."""

import multiprocessing
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from asp_gmm.tuning_db import History, HistoryError, VariantKey

FP = {"backend": "c", "model": "Test CPU", "threads": 2}
K = VariantKey.of("c", "V3", {"chunk_tiles": 4}, "a" * 64)
ROOT = Path(__file__).resolve().parent.parent


def _record(h, n, base=0):
    for i in range(n):
        h.record("d", FP, K, 1000 + base + i, 3, 2, "full", "float32", "ok", 1e-3 + i * 1e-6)


def _wait(cond, seconds=20.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_record_never_writes_on_the_callers_thread(tmp_path, monkeypatch):
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}", batch_rows=1, flush_interval=0, background=True, keep_per_class=0)
    writers = []
    real = h._insert

    def insert(*a, **kw):
        writers.append(threading.current_thread())
        return real(*a, **kw)

    monkeypatch.setattr(h, "_insert", insert)
    _record(h, 20)
    assert _wait(lambda: h.pending == 0 and h.count() == 20)
    assert writers and threading.main_thread() not in writers
    assert len(h.view("d").rows) == 20  # visible at once, written once (uids)
    h.close()


EXITING = """
import sys
from asp_gmm.tuning_db import History, VariantKey
h = History(sys.argv[1], batch_rows=7, flush_interval=0, background=True, keep_per_class=0)
k = VariantKey.of("c", "V3", {}, "f" * 64)
for i in range(500):
    h.record("d", {"backend": "c"}, k, 1000 + i, 3, 2, "full", "float32", "ok", 1e-3 + i * 1e-6)
"""


def test_no_row_is_lost_at_interpreter_exit(tmp_path):
    """The process exits while its writer thread is busy and rows are still queued."""
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    out = subprocess.run([sys.executable, "-c", EXITING, url], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert History(url).count() == 500


def _child(url):
    h = _CHILD_HISTORY[0]
    assert h.pending == 0  # the parent's queue stays the parent's
    _record(h, 30, base=10_000)  # flush_interval is long: queued at exit, written by the finaliser


_CHILD_HISTORY = []


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_no_row_is_lost_in_a_forked_child(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    h = History(url, flush_interval=3600, batch_rows=10_000, background=True, keep_per_class=0)
    _CHILD_HISTORY[:] = [h]
    p = None
    try:
        _record(h, 5)
        assert h.pending == 5
        ctx = multiprocessing.get_context("fork")
        p = ctx.Process(target=_child, args=(url,))
        p.start()
        p.join(120)
        assert p.exitcode == 0
        assert History(url).count() == 30  # the child's rows, not the parent's queue
        assert h.flush() == 5
        assert History(url).count() == 35
    finally:
        _end(p)
        _CHILD_HISTORY.clear()
        h.close()


def _end(p):
    """Kill a child that is still running: a hung child would hang pytest's exit (multiprocessing
    joins its children there)."""
    if p is not None and p.exitcode is None:
        p.kill()
        p.join(10)


def _fresh_history_child(url, dump=None):
    if dump is not None:  # a hung child says where (the test reads the file)
        import faulthandler

        faulthandler.dump_traceback_later(10, exit=True, file=open(dump, "w"))  # noqa: SIM115 - kept open
    h = History(url, keep_per_class=0)  # creates the file: SQLite opens, writes and closes
    _record(h, 3)
    h.close()


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_a_fork_waits_for_the_sqlite_calls_of_other_threads(tmp_path):
    """Threads write histories in a loop while the main thread forks children that open histories
    of their own. Without the gate (tuning_db/forksafe.py) a fork that lands while a writer is inside
    SQLite leaves the child waiting forever on SQLite's inherited lock: with the gate opened
    (FORK_WAIT = 0) 7 to 10 of the 200 children hung, in each of 5 runs. The histories this test
    opens to count rows are left to the garbage collector, which closes their connections on
    whatever thread it runs (one child of 200 hung so in the full suite before the finaliser of
    tuning_db/forksafe.py closed them inside the gate)."""
    stop = threading.Event()
    writes = []

    def hammer(h):
        i = 0
        while not stop.is_set():
            _record(h, 1, base=i)
            h.flush()
            writes.append(i)
            i += 1
        h.close()

    threads = [
        threading.Thread(
            target=hammer,
            args=(
                History(f"sqlite:///{tmp_path / f'busy{j}.sqlite'}", batch_rows=1, flush_interval=0, keep_per_class=0),
            ),
            daemon=True,
        )
        for j in range(4)
    ]
    for t in threads:
        t.start()
    ctx = multiprocessing.get_context("fork")
    hung, p = [], None
    try:
        assert _wait(lambda: len(writes) > 20)
        for k in range(FORKS):
            url = f"sqlite:///{tmp_path / f'c{k}.sqlite'}"
            dump = tmp_path / f"c{k}.stacks"
            p = ctx.Process(target=_fresh_history_child, args=(url, str(dump)))
            p.start()
            p.join(20)
            if p.exitcode != 0:  # faulthandler ends a child stuck for 10 s, with its stack
                _end(p)
                hung.append(f"child {k} (exit code {p.exitcode}): {dump.read_text() if dump.exists() else ''}")
            else:
                assert History(url).count() == 3
    finally:
        _end(p)
        stop.set()
        for t in threads:
            t.join(30)
    assert not hung, "forked children hung in SQLite:\n" + "\n".join(hung)
    assert len(writes) > FORKS  # the writers really ran during the forks


FORKS = 200


def test_a_failed_background_write_is_raised_on_the_callers_thread(tmp_path):
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}", batch_rows=1, flush_interval=0, background=True)
    boom = HistoryError("could not write to the tuning history: disk full")

    def fail(*a, **kw):
        raise boom

    h._run = fail
    _record(h, 1)
    assert _wait(lambda: h._writer._error is not None)
    with pytest.raises(HistoryError, match="disk full"):
        h.maybe_flush()
    assert h.pending == 1  # kept for a later write
    h._pending.clear()
