"""The history's writes on a thread of their own, so that a caller never waits for a commit.

A :class:`~tuning_db.store.History` opened with ``background=True`` hands its batches to a
:class:`Writer`: :meth:`Writer.request` (called where the store used to flush on the caller's thread:
when a batch is full or the last write is older than the flush interval) only wakes the writer's
thread, which runs :meth:`History.flush` there. A ``train`` call on a small problem then never pays an
SQLite commit (4-9 ms on a busy disk) in its own time.

No row is lost:

* at interpreter exit, the store's exit hook flushes every open history on the main thread;
  ``History.flush`` serialises with a write in progress on the writer's thread (a flush lock), so
  the exit flush waits for it and then writes what remains;
* in a forked child, the parent's queue stays the parent's (the store clears the child's copy); the
  child's own rows get a writer thread of the child (started on its first request, the parent's
  thread does not exist there), and a child started by :mod:`multiprocessing` (which ends with
  ``os._exit``, skipping ``atexit``) flushes at its exit through :class:`multiprocessing.util.Finalize`;
  the fork itself waits until no thread is inside SQLite (:mod:`tuning_db.forksafe`), whose locks a
  child would otherwise inherit held;
* a write that fails on the writer's thread (a read-only or locked database) leaves the rows queued
  and its error is raised on the caller's thread by the next :meth:`Writer.raise_pending` (the
  store's ``record`` and ``maybe_flush``), where the package already turns a broken history into a
  warning.

This module, like the rest of ``tuning_db``, imports nothing of ``asp_gmm``.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref

log = logging.getLogger("asp_gmm")

#: How long the writer's thread sleeps between checks that its history still exists (seconds).
IDLE_WAKE = 5.0


class Writer:
    """Flushes one history on a daemon thread when asked (see the module documentation)."""

    def __init__(self, history):
        self._history = weakref.ref(history)
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._error: BaseException | None = None
        self.writes = 0  # flushes done on the thread (for tests and diagnostics)
        try:  # a multiprocessing child clears the finalisers it inherits, then runs these hooks
            from multiprocessing import util

            util.register_after_fork(self, _in_multiprocessing_child)
        except Exception:  # noqa: BLE001 - without multiprocessing there is no such exit path
            pass

    # ------------------------------------------------------------------ caller's side
    def request(self) -> None:
        """Ask for the queue to be written soon; returns at once."""
        self._ensure_thread()
        self._wake.set()

    def raise_pending(self) -> None:
        """Raise, on the caller's thread, the error of the last failed background write (once)."""
        err = self._error
        if err is not None:
            self._error = None
            raise err

    def after_fork_in_child(self) -> None:
        """The parent's thread does not exist in a forked child: forget it (a new one starts on the
        child's first request) and flush the child's rows at a multiprocessing child's exit."""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = None
        self._pid = os.getpid()
        self._error = None

    # ------------------------------------------------------------------ writer's side
    def _ensure_thread(self) -> None:
        t = self._thread
        if t is not None and t.is_alive() and self._pid == os.getpid():
            return
        with self._lock:
            t = self._thread
            if t is not None and t.is_alive() and self._pid == os.getpid():
                return
            self._pid = os.getpid()
            t = threading.Thread(
                target=_loop, args=(weakref.ref(self), self._wake), name="asp_gmm-history", daemon=True
            )
            t.start()
            self._thread = t


def _loop(writer_ref, wake: threading.Event) -> None:
    """The writer's thread: wait for a request, flush, repeat until the history is gone. Holds the
    history strongly only while writing, so an unused history can still be collected."""
    while True:
        wake.wait(IDLE_WAKE)
        wake.clear()
        writer = writer_ref()
        if writer is None or writer._wake is not wake:  # gone, or replaced after a fork
            return
        history = writer._history()
        if history is None:
            return
        try:
            history.flush()
            writer.writes += 1
        except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread instead
            writer._error = exc
        del history, writer


def _in_multiprocessing_child(writer: Writer) -> None:
    """In a child started by multiprocessing (which exits with ``os._exit``, skipping ``atexit``):
    flush the history's queue at the child's exit."""
    from multiprocessing import util

    util.Finalize(None, _flush_quietly, args=(writer._history,), exitpriority=10)


def _flush_quietly(history_ref) -> None:
    h = history_ref()
    if h is None:
        return
    try:
        h.flush()
    except Exception as exc:  # noqa: BLE001 - never raise at a child's exit; say what was lost
        log.warning("asp_gmm: could not save %d timing(s) to %s at exit: %s", h.pending, h.where, exc)
