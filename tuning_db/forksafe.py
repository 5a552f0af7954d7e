"""A gate that keeps ``fork()`` out of the history's SQLite calls.

SQLite is not safe across ``fork()``: a thread of the parent that is inside the library when another
thread forks (opening or closing a file holds SQLite's process-wide inode lock) leaves that lock held
in the child, and the child's first SQLite call waits for it forever. A ``multiprocessing`` child of
a process whose history writer thread was writing then hangs, and so does its parent's exit (it
joins the child). Measured with the standard library alone: one thread writing in a loop, 26 of 300
forked children that open a database of their own hung.

Every database call of :class:`~tuning_db.store.History` runs inside :meth:`Gate.inside`, and so
does the closing of its engine's connections when a history is collected (:func:`dispose_quietly`,
a finaliser: the garbage collector would otherwise close them on whatever thread it runs); the
fork hooks (registered with the history's other hooks when the first history opens) wait in
:meth:`Gate.before_fork` until no other thread is inside, hold new entries back until the fork is
done, and give the child a fresh gate. A call that outlasts :data:`FORK_WAIT` lets the fork go on
with a warning (a child that then uses SQLite may hang; one that does not, does not).

This module, like the rest of ``tuning_db``, imports nothing of ``asp_gmm``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

log = logging.getLogger("asp_gmm")

#: How long a fork waits for the database calls in progress on other threads (seconds).
FORK_WAIT = 60.0


class Gate:
    """Many threads may be inside at once; a fork waits until none (but the forking one) is."""

    def __init__(self):
        # re-entrant: a garbage collection on a thread that is in the gate's own code may run a
        # history's finaliser (:func:`dispose_quietly`), which enters the gate
        self._cond = threading.Condition(threading.RLock())
        self._inside: dict = {}  # thread ident -> depth
        self._forker = None  # the thread in before_fork, never held back by its own fork

    @contextlib.contextmanager
    def inside(self):
        """Hold the gate open for a database call on this thread (re-entrant)."""
        me = threading.get_ident()
        with self._cond:
            while self._forker not in (None, me) and me not in self._inside:
                self._cond.wait()
            self._inside[me] = self._inside.get(me, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                depth = self._inside.pop(me) - 1
                if depth:
                    self._inside[me] = depth
                self._cond.notify_all()

    # ------------------------------------------------------------------ fork hooks
    def before_fork(self) -> None:
        me = threading.get_ident()
        end = time.monotonic() + FORK_WAIT
        with self._cond:
            self._forker = me
            while any(t != me for t in self._inside):
                left = end - time.monotonic()
                if left <= 0:
                    log.warning(
                        "asp_gmm: forking while another thread has been writing the tuning history for %.0f s; "
                        "a child that uses the history may hang (fork before training, or use the 'spawn' start "
                        "method)",
                        FORK_WAIT,
                    )
                    break
                self._cond.wait(left)

    def after_fork_in_parent(self) -> None:
        with self._cond:
            self._forker = None
            self._cond.notify_all()

    def after_fork_in_child(self) -> None:
        # the parent's threads do not exist here, and one may have held the condition's lock
        self.__init__()


def dispose(engine) -> None:
    """Close an engine's pooled connections inside the gate (closing an SQLite file takes the lock a
    forked child would inherit)."""
    with GATE.inside():
        engine.dispose()


def dispose_quietly(engine) -> None:
    """:func:`dispose` as a history's finaliser, so that a connection is never closed by the garbage
    collector on some thread while another forks; never raises."""
    try:
        dispose(engine)
    except Exception:  # noqa: BLE001 - a finaliser never raises
        pass


#: The process's gate (reset in a forked child by :meth:`Gate.after_fork_in_child`).
GATE = Gate()
