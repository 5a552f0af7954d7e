"""C/OpenMP backend: variants rendered from ``variants/c`` and compiled with the system C compiler,
loaded through cffi (ABI mode), the whole EM loop running in compiled code.

The EM core (``core.c.j2``) and each covariance variant are separate shared libraries; the core
receives the variant as a function pointer, so a train call can switch variants between iterations
(the autotuner explores that way) without copying any data. The library variant ``BLAS`` is a cffi
callback into numpy's matmul.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import shutil
import sys
import threading
import weakref
from functools import lru_cache

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import cache, registry
from ..blas import one_blas_thread
from ..config import settings
from ..errors import KernelError, NonFiniteError, NotPositiveDefiniteError
from ..problem import Problem
from ..runtime import default_runtime
from .base import Backend, BlockStats, EMRun, Kernel, Session, StatsRunner, block_rows_for
from .c_decls import CORE_CDEF, load_ffi


ffi = load_ffi("_ffi_c", CORE_CDEF)

_ERR_NOT_PD, _ERR_NONFINITE, _ERR_ALLOC = 1, 2, 3
#: Covariance condition limits (squared pivot ratio) by working precision.
COND_LIMIT = {"float32": 1e10, "float64": 1e15}


def _compiler() -> list:
    return settings().c_compiler()


FLAGS = [
    "-O3",
    "-march=native",
    "-fopenmp",
    "-fPIC",
    "-shared",
    "-std=gnu11",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-ffp-contract=fast",
]


@lru_cache(maxsize=1)
def _cpu() -> dict:
    model, flags = platform.processor() or platform.machine(), ""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        m = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
        model = m.group(1).strip() if m else model
        m = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, re.M)
        flags = m.group(1) if m else ""
    except OSError:
        pass
    isa = sorted(
        set(flags.split()) & {"avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "asimd", "sve", "sse4_2"}
    )
    return {"model": model, "isa": isa, "arch": platform.machine()}


class CBackend(Backend):
    """Compiled C with OpenMP on this machine's cores."""

    name = "c"

    def __init__(self):
        reason = self.unavailable_reason()
        if reason:
            from ..errors import BackendUnavailableError

            raise BackendUnavailableError(reason)
        self._kernels: dict = {}
        self._cores: dict = {}
        self._lock = threading.Lock()

    @classmethod
    def unavailable_reason(cls):
        cc = _compiler()
        if not cc or shutil.which(cc[0]) is None:
            where = settings().c_compiler_origin()
            return (
                f"the C compiler {(cc or [''])[0]!r} ({where}) was not found; install gcc (apt-get install gcc) "
                "or set ASP_GMM_CC to a C compiler"
            )
        return None

    # ------------------------------------------------------------------ device
    def fingerprint(self) -> dict:
        """The CPU (:class:`asp_gmm.tuning_db.devices.CpuFingerprint`): ``threads`` are its hardware
        threads; the threads a call uses (``ASP_GMM_NUM_THREADS``) belong to the run, not the device."""
        cpu = _cpu()
        return {
            "backend": "c",
            "model": cpu["model"],
            "isa": cpu["isa"],
            "arch": cpu["arch"],
            "threads": os.cpu_count() or 1,
            "compiler": cache.tool_version(_compiler()),
        }

    def run_threads(self, problem: Problem) -> int:
        return threads_for(problem)

    # ------------------------------------------------------------------ compiling
    def _context(self, problem: Problem) -> dict:
        f32 = problem.dtype == "float32"
        lanes = 8 if f32 else 4
        return {
            "real": "float" if f32 else "double",
            "lanes": lanes,
            "tile": 8 * lanes,
            "cond_limit": COND_LIMIT[problem.dtype],
        }

    def _build(self, source: str, name: str):
        cc, key = self._build_args()
        command = lambda src, out: cc + FLAGS + ["-o", out, src, "-lm"]  # noqa: E731
        path = cache.build(source, ".so", command, key, name)
        try:
            return ffi.dlopen(str(path)), str(path)
        except OSError:
            # a binary whose digest matched but that the loader rejects: rebuild once
            cache.invalidate(path)
            path = cache.build(source, ".so", command, key, name)
            return ffi.dlopen(str(path)), str(path)

    def core(self, problem: Problem):
        """The EM core library for ``problem``'s (cvtype, dtype)."""
        key = (problem.cvtype, problem.dtype)
        lib = self._cores.get(key)
        if lib is None:
            with self._lock:
                lib = self._cores.get(key)
                if lib is None:
                    v = registry.get("c", "core", "core")
                    src = registry.render(v, None, _class_problem(problem), **self._context(problem))
                    lib, _ = self._build(src, f"c-core-{problem.cvtype}-{problem.dtype}")
                    if lib.asp_abi() != 4:
                        raise KernelError("EM core ABI mismatch; clear the cache folder")
                    self._cores[key] = lib
        return lib

    @staticmethod
    def _key(variant, tun: dict, problem: Problem) -> tuple:
        return (variant.key, variant.source_sha256, tuple(sorted(tun.items())), problem.cvtype, problem.dtype)

    def _variant_source(self, variant, tun: dict, problem: Problem):
        """(rendered source, binary name) of a covariance variant for the problem's class."""
        src = registry.render(variant, tun, _class_problem(problem), **self._context(problem))
        return src, f"c-{Kernel(variant, tun).label}-{problem.cvtype}-{problem.dtype}"

    def kernel(self, variant, tunables, problem: Problem) -> Kernel:
        tun = variant.default_tunables()
        tun.update(tunables or {})
        key = self._key(variant, tun, problem)
        k = self._kernels.get(key)
        if k is not None:
            return k
        with self._lock:
            k = self._kernels.get(key)
            if k is None:
                if not variant.template:
                    k = Kernel(variant, tun, handle=None)
                else:
                    lib, path = self._build(*self._variant_source(variant, tun, problem))
                    k = Kernel(variant, tun, handle=(lib, ffi.cast("void *", lib.asp_covariance)), binary=path)
                self._kernels[key] = k
        return k

    def _build_args(self):
        cc = _compiler()
        key = [cache.tool_version(cc), " ".join(FLAGS), _cpu()["model"], ",".join(_cpu()["isa"]), sys.platform]
        return cc, key

    def prepare(self, problem: Problem) -> None:
        self.core(problem)

    def prepare_key(self, problem: Problem):
        return (problem.cvtype, problem.dtype)  # binaries serve every N, D, M

    def readiness_token(self):
        """Kernels loaded in this process (see the base class)."""
        return len(self._kernels)

    def is_ready(self, variant, tunables, problem: Problem) -> bool:
        tun = variant.default_tunables()
        tun.update(tunables or {})
        if not variant.template or self._key(variant, tun, problem) in self._kernels:
            return True
        src, name = self._variant_source(variant, tun, problem)
        return cache.lookup(src, ".so", self._build_args()[1], name) is not None

    def open(self, X, problem: Problem) -> "CSession":
        return CSession(self, X, problem)

    def open_stats(self, problem: Problem, kernel: Kernel | None = None) -> "CStatsRunner":
        return CStatsRunner(self, problem, kernel)

    #: the core's E-step takes the sample weights (``asp_set_weights``)
    weights_in_kernels = True

    def open_weighted_stats(
        self, problem: Problem, kernel: Kernel | None = None, resident: bool = False
    ) -> "CStatsRunner":
        """The core takes the weights itself (:meth:`CStatsRunner.stats_weighted`); the blocks are
        read where they lie (``resident`` changes nothing)."""
        return CStatsRunner(self, problem, kernel)

    def stream_block_rows(self, problem: Problem) -> int:
        """Streamed EM loops over blocks whose data and posteriors fit the last-level cache (so that
        the covariance pass after the E-step reads them from the cache), at least 8 MiB:
        every block costs a few OpenMP fork/joins, which on a loaded machine take milliseconds
        (measured on 2 busy cores: 1 MiB blocks made a pass 3x slower than 32 MiB ones).
        ``ASP_GMM_BLOCK_BYTES`` overrides."""
        return block_rows_for(problem, default_bytes=max(_llc_bytes(), 8 << 20))


def _class_problem(problem: Problem) -> Problem:
    """Sources depend on cvtype and dtype only (N, D, M are run-time arguments), so one binary
    serves every size: render with placeholder sizes so the cache key does not vary with them."""
    return Problem(0, 0, 0, problem.cvtype, problem.dtype)


#: Below this many multiply-adds per E-step (N * M * D^2) a problem runs on one thread: forking
#: and joining OpenMP teams several times per iteration costs more than it saves (and much more on
#: a loaded machine). About 1 ms of single-core work.
SERIAL_WORK = 2e7


#: Below this much work per E-step (about 10 ms of one core) a problem's OpenMP team leaves a core
#: to each compile running in this process (see :func:`threads_for`).
SHORT_WORK = 2e8


def threads_for(problem: Problem) -> int:
    """OpenMP threads for a call on ``problem``: one below :data:`SERIAL_WORK`, else one a core
    (or ``ASP_GMM_NUM_THREADS``); below :data:`SHORT_WORK`, one less for each compile running in
    this process. A candidate compiled in the background keeps a core busy, and a team spread over
    that core waits at every barrier for the thread the compiler displaced, for a scheduler slice:
    on 2 cores, one call each of 32 small models (1-4 ms a call) had calls of 100-130 ms while
    compiles ran. A longer call keeps its team: it outlasts the compile, and the count is taken
    once, when its session opens."""
    if problem.work < SERIAL_WORK:
        return 1
    n = _omp_threads()
    if problem.work < SHORT_WORK:
        busy = default_runtime().compiles_running
        if busy > 0:
            return max(1, n - busy)
    return n


@lru_cache(maxsize=1)
def _llc_bytes() -> int:
    """Size of the largest CPU cache (sysfs; 0 where unknown)."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        names = os.listdir(base)
    except OSError:
        return 0
    for name in names:
        try:
            with open(os.path.join(base, name, "size")) as f:
                text = f.read().strip()
        except OSError:
            continue
        m = re.fullmatch(r"(\d+)([KMG]?)", text)
        if m:
            best = max(best, int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)])
    return best


@lru_cache(maxsize=1)
def _omp_threads() -> int:
    asked = settings().threads()
    if asked is not None:
        return asked
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class CSession(Session):
    """Data packed once into the core's tile layout; parameters shared with C through numpy arrays."""

    def __init__(self, backend: CBackend, X: np.ndarray, problem: Problem):
        self.problem, self.backend = problem, backend
        N, D, M = problem.N, problem.D, problem.M
        lib = backend.core(problem)
        self._lib = lib
        tile = lib.asp_tile()
        ntiles, dp = -(-N // tile), D + (D & 1)
        dt = problem.np_dtype
        self.X = X
        self.xt = np.empty((ntiles, dp, tile), dt)
        self.resp_t = np.empty((ntiles, M, tile), dt)
        self.logprob_t = np.empty(ntiles * tile, dt)
        self.weights = np.zeros(M)
        self.means = np.zeros((M, D))
        self.covars = np.zeros(problem.covars_shape())
        self.nk = np.zeros(M)
        p = ffi.from_buffer
        state = lib.asp_create(
            p(X),
            N,
            D,
            M,
            p(self.xt),
            p(self.resp_t),
            p(self.logprob_t),
            _dptr(self.weights),
            _dptr(self.means),
            _dptr(self.covars),
            _dptr(self.nk),
        )
        if state == ffi.NULL:
            raise MemoryError(f"could not allocate the C session for N={N}, D={D}, M={M}")
        self._state = state
        self._finalizer = weakref.finalize(self, lib.asp_destroy, state)
        lib.asp_set_threads(state, threads_for(problem))
        self._callbacks = {}
        self._stale = True
        self._resp_written = False
        self._error = None

    def close(self):
        self._finalizer()

    # ------------------------------------------------------------------ parameters
    def set_params(self, weights, means, covars, reg_covar: float) -> None:
        self.weights[:] = weights
        self.means[:] = means
        self.covars[:] = covars
        self._check(self._lib.asp_set_params(self._state, float(reg_covar)), reg_covar)
        self._stale = True
        self._resp_written = False

    def params(self):
        return self.weights.copy(), self.means.copy(), self.covars.copy()

    def _check(self, rc: int, reg_covar: float | None = None):
        if rc == 0:
            return
        msg = ffi.string(self._lib.asp_error(self._state)).decode()
        if self._error is not None:  # an exception raised inside the Python (BLAS) variant
            err, self._error = self._error, None
            raise err
        if rc == _ERR_NOT_PD:
            raise NotPositiveDefiniteError(int(self._lib.asp_bad_component(self._state)), reg_covar)
        if rc == _ERR_NONFINITE:
            raise NonFiniteError(msg)
        if rc == _ERR_ALLOC:
            raise MemoryError(msg)
        raise KernelError(msg or f"C kernel failed with code {rc}")

    # ------------------------------------------------------------------ running
    def _fn(self, kernel: Kernel):
        if kernel.handle is not None:
            return kernel.handle[1]
        cb = self._callbacks.get(kernel.variant.key)
        if cb is None:
            cb = ffi.callback("int(*)(const void *, double *)", self._blas_covariance)
            self._callbacks[kernel.variant.key] = cb
        return cb

    def _blas_covariance(self, _view, acc_ptr) -> int:
        """Library variant: per component, Y = sqrt(resp) * (X - mean); acc = Y^T Y (numpy matmul).

        Components run on a pool of Python threads (numpy releases the GIL) with single-threaded
        BLAS: a threaded BLAS on these skinny (D x N)(N x D) products spends its time synchronising
        (25x the CPU time measured on 2 cores under load)."""
        try:
            N, D, M = self.problem.N, self.problem.D, self.problem.M
            full = self.problem.cvtype == "full"
            cells = D * D if full else D
            acc = np.frombuffer(ffi.buffer(acc_ptr, 8 * M * cells), dtype=np.float64).reshape(M, cells)
            dt = self.X.dtype

            def one(c):
                if self.nk[c] == 0:
                    acc[c] = 0.0
                    return
                r = self.resp_t[:, c, :].reshape(-1)[:N]
                diff = self.X - self.means[c].astype(dt)
                if full:
                    y = diff * np.sqrt(r)[:, None]
                    acc[c] = (y.T @ y).reshape(-1)
                else:
                    acc[c] = r @ (diff * diff)

            with one_blas_thread():
                workers = min(threads_for(self.problem), M)
                if workers > 1:
                    with ThreadPoolExecutor(workers) as pool:
                        list(pool.map(one, range(M)))
                else:
                    for c in range(M):
                        one(c)
            return 0
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
            self._error = exc
            return 1

    def _em(self, kernel: Kernel, *, min_iters: int, max_iters: int, tol: float, reg_covar: float) -> EMRun:
        n = max(int(max_iters), 1)
        it_s, cov_s, trace = np.zeros(n), np.zeros(n), np.zeros(n + 1)
        ll, iters, conv = ffi.new("double *"), ffi.new("int *"), ffi.new("int *")
        moments = _wants_moments(kernel.variant, self.problem)
        self._resp_written = False
        rc = self._lib.asp_em(
            self._state,
            self._fn(kernel),
            int(moments),
            int(min_iters),
            int(max_iters),
            float(tol),
            float(reg_covar),
            ll,
            iters,
            conv,
            _dptr(it_s),
            _dptr(cov_s),
            _dptr(trace),
        )
        self._check(rc, reg_covar)
        self._stale = False
        self._resp_written = not moments
        k = iters[0]
        return EMRun(float(ll[0]), k, bool(conv[0]), it_s[:k].tolist(), cov_s[:k].tolist(), trace[: k + 1].tolist())

    def _estep(self, need_resp: bool = False):
        if self._stale or (need_resp and not self._resp_written):
            self._check(self._lib.asp_estep(self._state))
            self._stale = False
            self._resp_written = True

    def loglik(self) -> float:
        self._estep()
        return float(self._lib.asp_loglik(self._state))

    def eval(self, want_resp: bool = True):
        self._estep(need_resp=True)
        N, M = self.problem.N, self.problem.M
        logprob = self.logprob_t[:N].copy()
        resp = None
        if want_resp:
            resp = np.ascontiguousarray(self.resp_t.transpose(0, 2, 1).reshape(-1, M)[:N])
        return logprob, resp


def _wants_moments(variant, problem: Problem) -> bool:
    """Whether ``variant`` reads the E-step's shifted moments instead of the posteriors (its
    manifest says ``estep_moments = true``; diagonal and spherical covariance only)."""
    return bool(variant.extra.get("estep_moments", False)) and problem.kernel_cvtype == "diag"


def _dptr(a: np.ndarray):
    return ffi.cast("double *", ffi.from_buffer(a))


class CStatsRunner(StatsRunner):
    """Streamed EM on the C core: one state whose tile buffers hold a block of up to ``problem.N``
    events; each block is packed into them (``asp_load``) and its E-step and statistics computed by
    the core and the covariance variant (``asp_stats``), the variant centring on the current means."""

    def __init__(self, backend: CBackend, problem: Problem, kernel: Kernel | None = None):
        super().__init__(backend, problem, kernel)
        if kernel is None:
            raise ValueError("the C backend computes block statistics with a covariance variant; pass its kernel")
        if problem.cvtype not in ("full", "diag"):
            # the block statistics are per component: streamed "tied" and "spherical" fits take them from
            # the "full" and "diag" problem of the same data (asp_gmm.streaming)
            raise ValueError(f"block statistics are computed for 'full' or 'diag' problems, not {problem.cvtype!r}")
        self._session = CSession(backend, np.zeros((problem.N, problem.D), problem.np_dtype), problem)
        self._moments = _wants_moments(kernel.variant, problem)
        M, D = problem.M, problem.D
        self._cells = D * D if problem.cvtype == "full" else D
        self._out = np.zeros(1 + M + M * D + M * self._cells)

    def set_params(self, weights, means, covars, reg_covar: float) -> None:
        self._session.set_params(weights, means, covars, reg_covar)
        self._reg = reg_covar

    def stats(self, X) -> BlockStats:
        ses, lib = self._session, self._session._lib
        n = X.shape[0]
        ses._check(lib.asp_load(ses._state, ffi.from_buffer(X), n))
        ses.X = X  # the library (BLAS) variant reads the block's rows
        ses.problem = dataclasses.replace(self.problem, N=n)
        try:
            lib.asp_set_threads(ses._state, threads_for(ses.problem))
            ses._check(lib.asp_stats(ses._state, ses._fn(self.kernel), int(self._moments), _dptr(self._out)), self._reg)
        finally:
            ses.problem = self.problem
            ses._stale = True
        M, D = self.problem.M, self.problem.D
        o = self._out
        nk = o[1 : 1 + M].copy()
        sumx = o[1 + M : 1 + M + M * D].reshape(M, D).copy()
        acc = o[1 + M + M * D :].reshape((M, D, D) if self.problem.cvtype == "full" else (M, D)).copy()
        if self.problem.cvtype == "full":  # the variants write the lower triangle
            low = np.tril(acc)
            acc = low + np.swapaxes(np.tril(acc, -1), 1, 2)
        return BlockStats(n, float(o[0]), nk, sumx, acc)

    def stats_weighted(self, X, sample_weight) -> BlockStats:
        """:meth:`stats` with the weights folded into the posteriors by the core's E-step
        (``asp_set_weights``): every sum the core and the variant take is weighted."""
        ses, lib = self._session, self._session._lib
        w = np.ascontiguousarray(sample_weight, np.float64)
        lib.asp_set_weights(ses._state, _dptr(w))
        try:
            st = self.stats(X)
        finally:
            lib.asp_set_weights(ses._state, ffi.NULL)
        return BlockStats(float(w.sum()), st.loglik, st.nk, st.sumx, st.s2)

    def close(self) -> None:
        self._session.close()
