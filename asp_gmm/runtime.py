"""The process's asp_gmm state, in one explicit object: :class:`Runtime`.

What used to be module-level mutable state lives here: the default selector, the shared tuning
histories (one per URL), the URLs found broken (warned once, then the fixed rule decides), the
backend instances, the one-time warning about the slow NumPy fallback, the background and NVRTC
compile pools, the finite-check memo and the registry's memo of what it derives from the
declarations. One default instance is
created lazily on first use (:func:`default_runtime`); tests and applications can make their own
and install it (:func:`set_default_runtime`) or pass a selector or policy explicitly.

Importing asp_gmm creates none of this and registers no hook; the history registers its exit and
fork hooks when the first history is opened, and the first thread pool a runtime makes registers
the fork hook that gives a forked child none of the parent's pools (their threads do not exist in
the child, and a pool that believes it has idle threads never runs what it is given there).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import warnings
import weakref

from .config import settings

log = logging.getLogger("asp_gmm")


def cores() -> int:
    """Cores this process may run on (its CPU affinity where the system tells it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


#: runtimes that made a thread pool, reset in a forked child (see :func:`_pools_made`)
_WITH_POOLS: "weakref.WeakSet" = weakref.WeakSet()
_fork_hook = []  # [True] once the fork hook is registered


def _pools_made(rt) -> None:
    """Note that ``rt`` holds thread pools: a forked child starts without them (and with a new lock,
    which another thread may have held at the fork)."""
    _WITH_POOLS.add(rt)
    if not _fork_hook and hasattr(os, "register_at_fork"):
        _fork_hook.append(True)
        os.register_at_fork(after_in_child=_reset_pools_in_child)


def _reset_pools_in_child() -> None:  # (run in a forked child only)
    for rt in list(_WITH_POOLS):
        rt.lock = threading.RLock()
        rt._pool = rt._compile_pool = rt._host_pool = None
        rt.compiles_running = 0  # (the parent's compiles are not the child's)


class ExploreCosts:
    """What the sampled explorations of one backend cost in this process: ``overhead`` (problem
    class -> the largest per-run cost besides the timed iteration in the class's last exploration),
    ``copy_rate`` (seconds per byte of the last sample's copy and session; None before one) and
    ``call_seconds`` (problem class -> wall seconds per EM iteration of the specializer's part of
    its last call, exploring left out: the data's upload, the session and the launches included,
    the Face's checks and seeding not), ``sample_fixed`` (seconds of the last sampled
    exploration's fixed part: its copy, session and per-run overhead; None before one),
    ``load_seconds`` (the last measured first load of a kernel by an exploring call; None before
    one), ``lookup`` (problem class -> the slowest look-up of a loaded kernel by an exploring
    call in place), ``in_place_spent`` (problem class -> seconds that exploring in place cost
    beyond the call's own iterations in this process: debited from the class's banked allowance),
    ``in_place_iter`` (problem class -> the iteration the class's last call exploring in place
    priced its allowance from), ``loop_gap`` (problem class -> the wall clock per iteration beyond
    the kernels in its last call's EM loop), ``in_place_entry`` (problem class -> what one of its
    iterations run alone costs beyond the loop's: each split of a call exploring in place) and
    ``settled`` (a class whose last planned call explored nothing ->
    ``[(token, extra), plan, calls left, span]``: the plan reused while what it stands on holds, see
    :meth:`asp_gmm.selection.Policy.settled_plan`)."""

    __slots__ = (
        "overhead",
        "copy_rate",
        "call_seconds",
        "sample_fixed",
        "load_seconds",
        "lookup",
        "in_place_spent",
        "in_place_iter",
        "loop_gap",
        "in_place_entry",
        "settled",
    )

    def __init__(self):
        self.overhead: dict = {}
        self.copy_rate: float | None = None
        self.call_seconds: dict = {}
        self.sample_fixed: float | None = None
        self.load_seconds: float | None = None
        self.lookup: dict = {}
        self.in_place_spent: dict = {}
        self.in_place_iter: dict = {}
        self.loop_gap: dict = {}
        self.in_place_entry: dict = {}
        self.settled: dict = {}


class Runtime:
    """Process state of asp_gmm (thread-safe).

    Attributes
    ----------
    backends : dict
        Backend name -> the instance :func:`asp_gmm.backends.get_backend` hands out.
    histories : dict
        Database URL -> the shared :class:`~asp_gmm.tuning_db.History` of every
        :class:`~asp_gmm.selection.HistorySelector` made without one.
    broken : dict
        Database URL -> why it cannot be used (not retried in this runtime).
    warned_slow : bool
        Whether the "backend='auto' fell back to NumPy" warning was given.
    warned : set
        Other things warned about once (e.g. ``("cache-fallback", folder)``: a read-only cache).
    finite_memo : asp_gmm.frozen.Memo
        Immutable arrays already checked for NaN/inf.
    declarations_memo : dict
        What the registry derives from the declared variants, per declaration.
    """

    def __init__(self):
        self.lock = threading.RLock()
        self.backends: dict = {}
        self.histories: dict = {}
        self.broken: dict = {}
        self._urls: dict = {}  # $ASP_GMM_DB -> URL (default_url() touches the file system)
        self._selector = None
        self.warned_slow = False
        self.warned: set = set()
        self.compiles_running = 0  # compiles running in this process now (see compiling)
        self._pool = None  # the background-compile pool, made on first use
        self._compile_pool = None  # NVRTC's compile threads, made on first use
        self._host_pool = None  # threads for passes over host data (host_map), made on first use
        from .frozen import Memo

        #: immutable arrays already checked for NaN/inf (:func:`asp_gmm.fit.data.check_data`)
        self.finite_memo = Memo()
        #: immutable host arrays' seeding moments: {cvtype: (per-dimension variance, (co)variance)}
        #: (:func:`asp_gmm.fit.seed.host_moments`, unweighted)
        self.moments_memo = Memo()
        #: what :mod:`asp_gmm.registry` derives from the declared variants (the variants of a backend
        #: and phase, whether their limits name N): key -> (the declarations, the answer), recomputed
        #: when the declarations are reloaded
        self.declarations_memo: dict = {}
        #: backend -> what its sampled explorations cost in this process (:class:`ExploreCosts`),
        #: shared by every specializer of the backend (a GMM per call: each made its own and
        #: predicted every call's first run and sample copy as free)
        self._explore_costs: dict = {}
        #: backend -> {(selection key, pinned variant): (the declarations, candidates)}: the
        #: specializers' memo of which configurations may run a problem, shared by every
        #: specializer of the backend (a GMM per call made its own and walked every variant's
        #: tunables on each call)
        self._candidates: dict = {}

    def _per_backend(self, store: dict, backend, make):
        got = store.get(backend)
        if got is None:
            with self.lock:
                got = store.setdefault(backend, make())
        return got

    def candidates_memo(self, backend) -> dict:
        """The memo of the candidates of ``backend``'s problems in this process (made on first use;
        see :meth:`asp_gmm.specializer.Specializer.candidates`)."""
        return self._per_backend(self._candidates, backend, dict)

    @contextlib.contextmanager
    def compiling(self):
        """Counts a compile (a compiler process, or NVRTC in a thread) while it runs: it keeps a core
        busy, which the C backend's short calls leave to it (:func:`asp_gmm.backends.c.threads_for`;
        :attr:`compiles_running`)."""
        with self.lock:
            self.compiles_running += 1
        _pools_made(self)  # a forked child starts with none running
        try:
            yield
        finally:
            with self.lock:
                self.compiles_running -= 1

    def explore_costs(self, backend) -> "ExploreCosts":
        """The :class:`ExploreCosts` of ``backend`` in this process (made on first use)."""
        return self._per_backend(self._explore_costs, backend, ExploreCosts)

    # ------------------------------------------------------------------ background compiles
    def background_pool(self):
        """The pool that compiles in the background (one thread per core: gcc runs as a process,
        NVRTC releases the GIL), made on first use. Compiles not yet started when the interpreter
        exits are cancelled (those running finish, so no cache entry is left half-written)."""
        if self._pool is None:
            with self.lock:
                if self._pool is None:
                    from concurrent.futures import ThreadPoolExecutor

                    pool = ThreadPoolExecutor(max_workers=max(2, cores()), thread_name_prefix="asp_gmm-bg")
                    register = getattr(threading, "_register_atexit", None)
                    if register is not None:  # runs before the executor's own exit hook joins its threads
                        register(lambda: pool.shutdown(wait=False, cancel_futures=True))
                    self._pool = pool
                    _pools_made(self)
        return self._pool

    def host_threads(self) -> int:
        """How many threads :meth:`host_map` runs on: one per core, up to 8."""
        return max(1, min(cores(), 8))

    def host_map(self, fn, items) -> list:
        """``[fn(x) for x in items]``, on the host threads where there are several (passes over host
        data: the seeding's moments, the NaN scan; NumPy releases the GIL in their work). The pool
        is made on first use and kept: a pool made per call cost more than the pass (40 ms a call on
        a 16-core host for 500 000 x 36 events)."""
        if self.host_threads() < 2:
            return [fn(x) for x in items]
        return list(self._host_executor().map(fn, items))

    def host_imap(self, fn, items, threads: int | None = None):
        """:meth:`host_map` as an iterator: each result as soon as it and those before it are done
        (a pipeline: the caller works on the first results while the host threads make the next),
        at most ``threads`` items (default: every host thread) running ahead of the one consumed."""
        items = list(items)
        n = self.host_threads() if threads is None else max(1, min(int(threads), self.host_threads()))
        if n < 2 or len(items) < 2:
            return (fn(x) for x in items)
        return self._windowed(fn, items, n)

    def _host_executor(self):
        """The host threads' pool, made on first use and kept."""
        if self._host_pool is None:
            with self.lock:
                if self._host_pool is None:
                    from concurrent.futures import ThreadPoolExecutor

                    self._host_pool = ThreadPoolExecutor(self.host_threads(), thread_name_prefix="asp_gmm-host")
                    _pools_made(self)
        return self._host_pool

    def _windowed(self, fn, items, n):
        """At most ``n`` items submitted ahead of the one consumed. Closed early (the consumer
        raised, or stopped): the items not started are cancelled and those running waited for, so
        nothing writes into the caller's buffers after it has moved on."""
        pool = self._host_executor()
        pending = [pool.submit(fn, x) for x in items[:n]]
        try:
            for i in range(len(items)):
                got = pending[i].result()
                if i + n < len(items):
                    pending.append(pool.submit(fn, items[i + n]))
                yield got
        finally:
            for f in pending:
                if not f.cancel():
                    f.exception()  # (waits; an error of an abandoned item is not the caller's)

    def compile_pool(self):
        """The pool :func:`asp_gmm.backends.nvrtc.compile_many` compiles on (one thread per core),
        made on first use; separate from :meth:`background_pool`, whose tasks wait on it."""
        if self._compile_pool is None:
            with self.lock:
                if self._compile_pool is None:
                    from concurrent.futures import ThreadPoolExecutor

                    self._compile_pool = ThreadPoolExecutor(
                        max_workers=max(2, cores()), thread_name_prefix="asp_gmm-compile"
                    )
                    _pools_made(self)
        return self._compile_pool

    # ------------------------------------------------------------------ selection
    @property
    def selector(self):
        """The selector specializers use unless given one (a HistorySelector, made on first use)."""
        if self._selector is None:
            with self.lock:
                if self._selector is None:
                    from .selection import HistorySelector

                    self._selector = HistorySelector(runtime=self)
        return self._selector

    @selector.setter
    def selector(self, selector) -> None:
        self._selector = selector

    # ------------------------------------------------------------------ histories
    def shared_history(self):
        """The History at ``$ASP_GMM_DB`` (or the default place), opened on first use; ``None``
        when it cannot be opened (one warning says why)."""
        env = settings().db
        url = self._urls.get(env)
        if url is None:
            from .tuning_db import default_url

            url = self._urls[env] = default_url()
        h = self.histories.get(url)
        if h is not None or url in self.broken:
            return h
        with self.lock:
            h = self.histories.get(url)
            if h is None and url not in self.broken:
                from ._version import __version__
                from .tuning_db import History, HistoryError

                try:
                    h = self.histories[url] = History(url, package_version=__version__, background=True)
                except HistoryError as exc:
                    self._warn_broken(url, exc)
        return h

    def _warn_broken(self, url, exc):
        self.broken[url] = str(exc)
        msg = (
            f"asp_gmm: the tuning history cannot be used, so variants are chosen by the fixed rule and "
            f"nothing is measured in this process: {exc}"
        )
        log.warning(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=5)

    def disable(self, history, exc) -> None:
        """A history that failed mid-run: stop using it in this runtime (warn once)."""
        with self.lock:
            for url, h in list(self.histories.items()):
                if h is history:
                    del self.histories[url]
                    self._warn_broken(url, exc)
                    return
        if getattr(history, "_asp_gmm_warned", False) is False:
            history._asp_gmm_warned = True
            log.warning("asp_gmm: the tuning history failed (%s); continuing without it", exc)


def default_selector():
    """The selector specializers use unless given one: the default runtime's
    (:class:`~asp_gmm.selection.HistorySelector`)."""
    return default_runtime().selector


def set_default_selector(selector) -> None:
    """Install ``selector`` in the default runtime (``None``: a new HistorySelector on next use)."""
    default_runtime().selector = selector


_default_runtime: Runtime | None = None
_default_lock = threading.Lock()


def default_runtime() -> Runtime:
    """The process's default :class:`Runtime`, created on first use."""
    global _default_runtime
    rt = _default_runtime
    if rt is None:
        with _default_lock:
            if _default_runtime is None:
                _default_runtime = Runtime()
            rt = _default_runtime
    return rt


def set_default_runtime(runtime: Runtime | None) -> None:
    """Install ``runtime`` as the default (``None``: a fresh one is made on next use)."""
    global _default_runtime
    _default_runtime = runtime
