"""Batched EM on the C backend: the ``phase = "batch"`` variants of ``variants/c`` (``CB``: OpenMP
threads across problems, each member's EM loop on one thread), through cffi like the core.

One library holds the EM core and the batch driver, so the members' states are created by the
same binary that runs them. Members are handed to the threads largest first (by N x M), so a
long member does not start last.
"""

from __future__ import annotations

import threading

import numpy as np

from .. import cache, registry
from ..errors import KernelError, NonFiniteError, NotPositiveDefiniteError
from ..problem import BatchProblem, Problem
from . import c as cbackend
from .base import Kernel
from .c_decls import BATCH_CDEF, load_ffi
from .batch_base import BatchRuns, BatchSession, BatchSupport

ffi = load_ffi("_ffi_c_batch", BATCH_CDEF)


def _dptr(a: np.ndarray):
    return ffi.cast("double *", ffi.from_buffer(a))


def _iptr(a: np.ndarray):
    return ffi.cast("int *", ffi.from_buffer(a))


class CBatchSupport(BatchSupport):
    """Compiles the C batch variants (sources depend on cvtype, dtype and tunables only)."""

    #: CB's vectorised covariance measured about 2x faster than CBE's per-event loop (diag, D=20,
    #: M=16, 120 members of 700-3000 events, one core); CBC (full only) 20-25 % faster than CB
    #: (32 members of D=19, M=8 and 16, 2k-20k events, 2 cores)
    preference = ("CBC", "CB", "CBE")
    #: a member given as rows of an immutable (C-contiguous) array is gathered straight into its
    #: tiles (asp_batch_create_rows), not copied out first
    takes_rows = True

    def __init__(self, backend):
        super().__init__(backend)
        self._libs: dict = {}
        self._lock = threading.Lock()

    def _source(self, variant, tun: dict, problem: Problem):
        cls = Problem(0, 0, 0, problem.cvtype, problem.dtype)
        src = registry.render(variant, tun, cls, **self.backend._context(problem))
        return src, f"c-{Kernel(variant, tun).label}-{problem.cvtype}-{problem.dtype}"

    def _tun(self, variant, tunables):
        tun = variant.default_tunables()
        tun.update(tunables or {})
        return tun

    def readiness_token(self):
        return (len(self._found), len(self._libs))

    def is_ready(self, variant, tunables, problem):
        tun = self._tun(variant, tunables)
        key = (variant.key, variant.source_sha256, tuple(sorted(tun.items())), problem.cvtype, problem.dtype)
        if key in self._libs:
            return True

        def lookup():
            src, name = self._source(variant, tun, problem)
            return cache.lookup(src, ".so", self.backend._build_args()[1], name) is not None

        return self._in_cache(key, lookup)

    def kernel(self, variant, tunables, problem):
        tun = self._tun(variant, tunables)
        key = (variant.key, variant.source_sha256, tuple(sorted(tun.items())), problem.cvtype, problem.dtype)
        k = self._libs.get(key)
        if k is not None:
            return k
        with self._lock:
            k = self._libs.get(key)
            if k is None:
                src, name = self._source(variant, tun, problem)
                cc, bkey = self.backend._build_args()
                command = lambda s, out: cc + cbackend.FLAGS + ["-o", out, s, "-lm"]  # noqa: E731
                path = cache.build(src, ".so", command, bkey, name)
                lib = ffi.dlopen(str(path))
                if lib.asp_abi() != 4 or lib.asp_batch_abi() != 4:
                    raise KernelError("C batch library ABI mismatch; clear the cache folder")
                k = self._libs[key] = Kernel(variant, tun, handle=lib, binary=str(path))
        return k

    def open(self, Xs, problems, kernel):
        return CBatchSession(kernel.handle, Xs, problems)

    def open_scoring(self, Xs, problems, kernel):
        return CBatchScoring(kernel.handle, Xs, problems)


class CBatchSession(BatchSession):
    """Every member's data packed into its own core state of the batch library; parameters
    shared with C through NumPy arrays, one set per member."""

    def __init__(self, lib, Xs, problems, scoring=False):
        self._lib, self.problems = lib, list(problems)
        tile = lib.asp_tile()
        self._keep, self._states = [], []
        self.weights, self.means, self.covars, self._logprob = [], [], [], []
        # largest members first: the dynamic schedule then ends with the small ones
        self.order = np.argsort([-(p.N * p.M) for p in problems], kind="stable")
        # members of one M keep their parameters as rows of stacked arrays (set and read in one
        # copy each: set_params_stacked, params_stacked)
        self._stacked = None
        if problems and len({p.M for p in problems}) == 1:
            p0 = problems[0]
            self._stacked = (
                np.zeros((len(problems), p0.M)),
                np.zeros((len(problems), p0.M, p0.D)),
                np.zeros((len(problems),) + p0.covars_shape()),
            )
        try:
            for b, (X, p) in enumerate(zip(Xs, problems)):
                rows = getattr(X, "index", None)
                if rows is not None and not (X.X.flags.c_contiguous and X.X.dtype == p.np_dtype):
                    X, rows = X.X[rows], None  # (frozen arrays are C-contiguous: not expected)
                if scoring:  # the state holds parameters and scratch only: one event (CBatchScoring)
                    X, p, rows = (
                        (X.X[rows[:1]] if rows is not None else X[:1]),
                        Problem(1, p.D, p.M, p.cvtype, p.dtype),
                        None,
                    )
                ntiles, dp = -(-p.N // tile), p.D + (p.D & 1)
                dt = p.np_dtype
                xt = np.empty((ntiles, dp, tile), dt)
                resp = np.empty((ntiles, p.M, tile), dt)
                logprob = np.empty(ntiles * tile, dt)
                if self._stacked is not None:
                    w, mu, cv = (a[b] for a in self._stacked)
                else:
                    w, mu = np.zeros(p.M), np.zeros((p.M, p.D))
                    cv = np.zeros((p.M, p.D, p.D) if p.cvtype == "full" else (p.M, p.D))
                nk = np.zeros(p.M)
                fb = ffi.from_buffer
                if rows is not None:
                    rows = np.ascontiguousarray(rows, np.int64)
                    st = lib.asp_batch_create_rows(
                        fb(X.X),
                        ffi.cast("int64_t *", fb(rows)),
                        p.N,
                        p.D,
                        p.M,
                        fb(xt),
                        fb(resp),
                        fb(logprob),
                        _dptr(w),
                        _dptr(mu),
                        _dptr(cv),
                        _dptr(nk),
                    )
                    X = (X.X, rows)  # kept alive with the state
                else:
                    st = lib.asp_batch_create(
                        fb(X), p.N, p.D, p.M, fb(xt), fb(resp), fb(logprob), _dptr(w), _dptr(mu), _dptr(cv), _dptr(nk)
                    )
                if st == ffi.NULL:
                    raise MemoryError(f"could not allocate the C state of a member of N={p.N}, D={p.D}, M={p.M}")
                self._states.append(st)
                self._keep.append((X, xt, resp, nk))
                self.weights.append(w)
                self.means.append(mu)
                self.covars.append(cv)
                self._logprob.append(logprob)
        except BaseException:
            self.close()
            raise
        self._ptrs = ffi.new("asp_state *[]", [self._states[i] for i in self.order] or [ffi.NULL])
        # one thread (no OpenMP team at all) for a batch of less work than one fork is worth
        self._threads = cbackend.threads_for(BatchProblem.of(self.problems)) if self.problems else 1

    def close(self):
        for st in self._states:
            self._lib.asp_destroy(st)
        self._states = []

    def __del__(self):
        self.close()

    def _error(self, b: int, rc: int, reg: float):
        st = self._states[b]
        msg = ffi.string(self._lib.asp_error(st)).decode()
        if rc == cbackend._ERR_NOT_PD:
            return NotPositiveDefiniteError(int(self._lib.asp_bad_component(st)), reg)
        if rc == cbackend._ERR_NONFINITE:
            return NonFiniteError(msg)
        if rc == cbackend._ERR_ALLOC:
            return MemoryError(msg)
        return KernelError(msg or f"C batch kernel failed with code {rc}")

    def _unsorted(self, a):
        out = np.empty_like(a)
        out[self.order] = a
        return out

    def set_params(self, params, reg_covars):
        for b, (w, mu, cv) in enumerate(params):
            self.weights[b][:] = w
            self.means[b][:] = mu
            self.covars[b][:] = cv
        return self._factor(reg_covars)

    def set_params_stacked(self, weights, means, covars, reg_covars):
        if self._stacked is None:
            return super().set_params_stacked(weights, means, covars, reg_covars)
        for a, v in zip(self._stacked, (weights, means, covars)):
            a[...] = v
        return self._factor(reg_covars)

    def params_stacked(self):
        if self._stacked is None:
            return super().params_stacked()
        return tuple(a.copy() for a in self._stacked)

    def _factor(self, reg_covars):
        nb = len(self.problems)
        reg = np.asarray(reg_covars, np.float64)[self.order].copy()
        rc = np.zeros(nb, np.intc)
        # O(M D^3) per member: on the calling thread (a fork would cost more)
        self._lib.asp_batch_set_params(self._ptrs, nb, 1, _dptr(reg), _iptr(rc))
        rc = self._unsorted(rc)
        return [None if rc[b] == 0 else self._error(b, int(rc[b]), reg_covars[b]) for b in range(nb)]

    def em(self, *, min_iters, max_iters, tol, reg_covars, skip=()):
        return self.em_arrays(
            min_iters=min_iters, max_iters=max_iters, tol=tol, reg_covars=reg_covars, skip=skip
        ).member_runs()

    def em_arrays(self, *, min_iters, max_iters, tol, reg_covars, skip=()):
        nb = len(self.problems)
        live = [b for b in self.order if b not in skip]
        ptrs = ffi.new("asp_state *[]", [self._states[b] for b in live] or [ffi.NULL])
        n = len(live)
        reg = np.asarray([reg_covars[b] for b in live], np.float64)
        rc, iters, conv = np.zeros(max(n, 1), np.intc), np.zeros(max(n, 1), np.intc), np.zeros(max(n, 1), np.intc)
        ll, secs = np.full(max(n, 1), np.nan), np.zeros(max(n, 1))
        trace = np.full((max(n, 1), max_iters + 1), np.nan)

        def run(j0, j1):
            self._lib.asp_batch_em(
                ptrs + j0,
                j1 - j0,
                1,
                int(min_iters),
                int(max_iters),
                float(tol),
                _dptr(reg[j0:j1]),
                _iptr(rc[j0:j1]),
                _dptr(ll[j0:j1]),
                _iptr(iters[j0:j1]),
                _iptr(conv[j0:j1]),
                _dptr(trace[j0:j1]),
                _dptr(secs[j0:j1]),
            )

        self._spread(run, [self.problems[b] for b in live])
        out = BatchRuns.empty(nb, max_iters, skipped=True)  # the members that ran are filled in
        if n:
            at = np.asarray(live, np.intp)
            out.loglik[at], out.iters[at], out.converged[at] = ll[:n], iters[:n], conv[:n] != 0
            out.skipped[at] = False
            # the library writes each member's trace up to its iterations; NaN past them
            past = np.arange(max_iters + 1)[None, :] > iters[:n, None]
            out.trace[at] = np.where(past, np.nan, trace[:n])
            for j in np.flatnonzero(rc[:n]):
                b = live[j]
                out.errors[b] = self._error(b, int(rc[j]), reg_covars[b])
        return out

    def params(self, b):
        return self.weights[b].copy(), self.means[b].copy(), self.covars[b].copy()

    def _spread(self, run, problems):
        """``run(j0, j1)`` over slices of the members (largest first) on ``self._threads`` host
        threads, each slice run by the library on one thread (cffi releases the GIL): threads
        across problems without an OpenMP team, whose idle threads spin and, on a loaded machine,
        took the working threads' cores (the bundled meeting's retraining took 3.1 s with a team
        of 2 on 2 busy cores, 0.6 s on one thread). About four slices per thread, of equal work."""
        n = len(problems)
        if n == 0:
            return
        if self._threads <= 1 or n == 1:
            run(0, n)
            return
        work = np.cumsum([p.N * p.M for p in problems], dtype=np.float64)
        parts = min(n, 4 * self._threads)
        cuts = np.searchsorted(work, work[-1] * np.arange(1, parts) / parts, side="right")
        edges = sorted({0, n, *[int(c) for c in cuts]})
        slices = [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]
        list(_pool(self._threads).map(lambda ab: run(*ab), slices))

    def score(self, skip=()):
        nb = len(self.problems)
        live = [b for b in self.order if b not in skip]
        ptrs = ffi.new("asp_state *[]", [self._states[b] for b in live] or [ffi.NULL])
        rc, ll = np.zeros(max(len(live), 1), np.intc), np.zeros(max(len(live), 1))

        def run(j0, j1):
            self._lib.asp_batch_estep(ptrs + j0, j1 - j0, 1, _iptr(rc[j0:j1]), _dptr(ll[j0:j1]))

        self._spread(run, [self.problems[b] for b in live])
        out = [None] * nb
        for j, b in enumerate(live):
            out[b] = self._error(b, int(rc[j]), 0.0) if rc[j] else self._logprob[b][: self.problems[b].N].copy()
        return out


class CBatchScoring(CBatchSession):
    """Scoring only (``set_params``, ``score``): each distinct data array is packed once, however
    many members score it (a recording's frames under every cluster's model), and the members'
    states hold their parameters on one event each. ``em`` is not available."""

    def __init__(self, lib, Xs, problems):
        super().__init__(lib, Xs, problems, scoring=True)
        tile = lib.asp_tile()
        packed: dict = {}  # id(X) -> (X, its tiles)
        self._xts, self._out = [], []
        for X, p in zip(Xs, problems):
            got = packed.get(id(X))
            if got is None or got[0] is not X:
                xt = np.empty((-(-p.N // tile), p.D + (p.D & 1), tile), p.np_dtype)
                lib.asp_batch_pack(ffi.from_buffer(X), p.N, p.D, ffi.from_buffer(xt))
                got = packed[id(X)] = (X, xt)
            self._xts.append(got[1])
            self._out.append(np.empty(p.N, p.np_dtype))

    def em(self, **kw):
        raise TypeError("a scoring session does not train; open the batch with open()")

    def params(self, b):
        raise TypeError("a scoring session does not train; open the batch with open()")

    def score(self, skip=()):
        nb = len(self.problems)
        live = [b for b in self.order if b not in skip]
        n = max(len(live), 1)
        ptrs = ffi.new("asp_state *[]", [self._states[b] for b in live] or [ffi.NULL])
        xts = ffi.new("const void *[]", [ffi.from_buffer(self._xts[b]) for b in live] or [ffi.NULL])
        outs = ffi.new("void *[]", [ffi.from_buffer(self._out[b]) for b in live] or [ffi.NULL])
        ns = np.array([self.problems[b].N for b in live] or [0], np.int64)
        rc, ll = np.zeros(n, np.intc), np.zeros(n)

        def run(j0, j1):
            self._lib.asp_batch_score(
                ptrs + j0,
                j1 - j0,
                1,
                xts + j0,
                ffi.cast("int64_t *", ffi.from_buffer(ns)) + j0,
                outs + j0,
                _iptr(rc[j0:j1]),
                _dptr(ll[j0:j1]),
            )

        self._spread(run, [self.problems[b] for b in live])
        out = [None] * nb
        for j, b in enumerate(live):
            out[b] = self._error(b, int(rc[j]), 0.0) if rc[j] else self._out[b]
        return out


_POOLS: dict = {}
_POOLS_LOCK = threading.Lock()


def _pool(n: int):
    """A process-wide pool of ``n`` host threads for the batched calls (made once per size)."""
    with _POOLS_LOCK:
        p = _POOLS.get(n)
        if p is None:
            from concurrent.futures import ThreadPoolExecutor

            p = _POOLS[n] = ThreadPoolExecutor(n, thread_name_prefix="asp_gmm-batch")
        return p


def batch_problem(problems) -> BatchProblem:
    return BatchProblem.of(problems)
