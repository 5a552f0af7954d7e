"""Device memory of the CUDA backend: session buffers (pooled for reuse), the resident copies of
immutable data sets (LRU) and the upload of events (copied, then transposed on the device).

Device data layout (one session = one data set; ``real`` is float or double, the problem's dtype;
``ldn`` = N rounded up to a multiple of 256; columns ``n >= N`` are zero in ``xt`` and ``resp``)::

    xt     real   [D][ldn]    events transposed (uploaded once, transposed on the device)
    resp   real   [M][ldn]    posteriors of the last E-step, resp[c*ldn + n]
    logp   real   [ldn]       per-event log-likelihood of the last E-step
    nk     double [M]         raw counts sum_n resp[c][n] of the running M-step
    means  real   [M][D]      means of the running M-step (covariances are centred on them)
    acc    double [M][cells]  covariance sums written by the covariance variant:
                              full: packed lower triangle, cell p = i*(i+1)/2 + j (j <= i);
                              diag: cell p = i.   acc[c][p] = sum_n resp[c][n] (x_i - mu_ci)(x_j - mu_cj)
    prec   real   [M][cells]  upper Cholesky factor U of each precision (inv(cov) = U U^T), packed by
                              columns: U[i][j] (i <= j) at j*(j+1)/2 + i; diag: 1/sigma_i
    logc   real   [M]         log w_c - D/2 log(2 pi) + log det U_c
    stat   double [2]         stat[0]: log-likelihood sum of the E-step; int at stat+1: first bad
                              component of the last factorisation (INT_MAX when none)
    params (w64, mu64, cov64 [M][D][D] or [M][D], logdet) in double, backed up before each M-step.

Data: an immutable array (:func:`asp_gmm.freeze`; :func:`asp_gmm.frozen.identity` says which arrays
are) stays on the GPU after its first session (LRU, :data:`RESIDENT_BYTES` at most) and is shared by
every later session on it, whatever the model's M: score a data set under many models without
uploading it again. Every other array is uploaded on every session: its contents may change between
calls, a merely read-only one too (its owner can make it writeable again). Session buffers are
pooled by (D, M, cvtype, dtype) and a capacity in events, so calls on data of varying N reuse them.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import threading

import numpy as np

from ... import cuda_arrays, frozen, registry
from ...errors import KernelError
from ...problem import Problem

LDN_ALIGN = 256
#: Device bytes that read-only data sets may keep resident between sessions.
RESIDENT_BYTES = 2 << 30
#: Idle session buffers kept for reuse, at most this many and this many bytes (the least recently
#: released are freed first): an application alternating between a few dozen shapes keeps them all.
POOL_IDLE = 32
POOL_IDLE_BYTES = 1 << 30


def _capacity(n: int) -> int:
    """Events a new session buffer holds for n: n rounded up to LDN_ALIGN and to 16 steps per
    octave, so a buffer serves every later call up to 1/16 larger."""
    n = max(int(n), 1)
    step = max(LDN_ALIGN, (1 << (n.bit_length() - 1)) // 16)
    return -(-n // step) * step


class DeviceMemory:
    """The pool of idle session buffers and the resident data sets of one device (thread-safe).

    The idle buffers and resident copies are freed at interpreter exit (while the context still
    exists); the hook is registered when the first one is created, not at import.
    """

    def __init__(self, device_getter):
        self._device = device_getter  # () -> _Device, created on first use
        self._lock = threading.RLock()
        self._pool: list = []  # idle _Buffers, least recently released first
        self._resident = collections.OrderedDict()  # read-only data sets on the device (LRU)
        self._hooked = False
        self._staging = None  # the pinned upload path (:mod:`.staging`), made on first use
        self._stream = None  # the stream of resident uploads

    def staging(self):
        """The device's :class:`~asp_gmm.backends.cuda.staging.Staging` (pinned, double-buffered
        upload with the NaN check), made on first use and kept."""
        if self._staging is None:
            with self._lock:
                if self._staging is None:
                    from .staging import Staging

                    self._hook()
                    self._staging = Staging(self._device())
        return self._staging

    def upload(self, X, dst, problem: Problem, ldn: int, upload_fn, stream=None) -> None:
        """Upload the host array X (problem.N, problem.D) transposed into ``dst`` [D][ldn] through
        the staging buffers, checked for NaN/inf on the device (see :mod:`.staging`)."""
        if stream is None:
            if self._stream is None:
                with self._device().active():
                    self._stream = self._device().drv.Stream()
            stream = self._stream
        self.staging().upload(X, dst, problem.N, problem.D, ldn, problem.np_dtype, upload_fn, stream)

    def transpose_device(self, X, dst, problem: Problem, ldn: int, upload_fn, stream) -> None:
        """Transpose the C-contiguous CUDA array X (PyTorch, CuPy: ``__cuda_array_interface__``)
        of shape (problem.N, problem.D) into ``dst`` [D][ldn] on the device, with no copy through
        the host, checked for NaN/inf in the same pass (see :mod:`.staging`)."""
        info = cuda_arrays.describe(X)
        N, D = problem.N, problem.D
        if info["shape"] != (N, D) or not info["contiguous"]:
            raise KernelError(
                f"the CUDA array has shape {info['shape']} (contiguous: {info['contiguous']}), not a "
                f"C-contiguous ({N}, {D})"
            )
        self.staging().transpose_device(X, info["ptr"], dst, N, D, ldn, problem.np_dtype, upload_fn, stream)

    def _hook(self):
        if not self._hooked:
            self._hooked = True
            atexit.register(self.free_all)

    def free_all(self):
        """Free the idle device buffers and the resident data (at exit, while the context exists).
        Everything is freed and dropped with the device's context current: pycuda objects (events,
        streams, page-locked buffers) released outside it warn at exit ("could not be cleaned up")."""
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self._device().active())
            except Exception:  # noqa: BLE001 - no context left: nothing can be freed
                return
            if self._staging is not None:
                with contextlib.suppress(Exception):
                    self._staging.free()
                self._staging = None
            with self._lock:
                while self._pool:
                    with contextlib.suppress(Exception):
                        self._pool.pop().free()
                while self._resident:
                    with contextlib.suppress(Exception):
                        self._resident.popitem()[1][1].free()

    def acquire(self, problem: Problem, exact: bool = False) -> "_Buffers":
        """Idle buffers of the problem's (D, M, cvtype, dtype) holding N events (the smallest that
        is at most twice the need; with ``exact``, of capacity _capacity(N) exactly, the leading
        dimension of resident data), else new ones of capacity _capacity(N)."""
        key = (problem.D, problem.M, problem.cvtype, problem.dtype)
        cap = _capacity(problem.N)
        hi = cap if exact else 2 * cap
        with self._lock:
            fits = [b for b in self._pool if b.key == key and problem.N <= b.capacity <= hi]
            if fits:
                buf = min(fits, key=lambda b: b.capacity)
                self._pool.remove(buf)
                return buf
        self._hook()
        return _Buffers(self._device(), Problem(cap, problem.D, problem.M, problem.cvtype, problem.dtype))

    def acquire_bytes(self, nbytes: int) -> "_Block":
        """An idle block of at least ``nbytes`` device bytes (the smallest at most twice the need),
        else a new one rounded up like :func:`_capacity`: a batched session carves its buffers from
        one block, and a new allocation and its free cost 0.3 ms of a 5 ms call of 1 000 small
        models. Give it back with :meth:`release` once nothing queued on the device uses it."""
        cap = _capacity(nbytes)
        with self._lock:
            fits = [b for b in self._pool if b.key == _Block.key and nbytes <= b.capacity <= 2 * cap]
            if fits:
                blk = min(fits, key=lambda b: b.capacity)
                self._pool.remove(blk)
                return blk
        self._hook()
        try:
            return _Block(self._device(), cap)
        except Exception:  # noqa: BLE001 - out of memory: the idle buffers go first, then one more try
            with self._lock:
                idle, self._pool = self._pool, []
            for b in idle:
                b.free()
            return _Block(self._device(), cap)

    def release(self, buf: "_Buffers | _Block"):
        with self._lock:
            self._pool.append(buf)
            while len(self._pool) > POOL_IDLE or sum(b.nbytes for b in self._pool) > POOL_IDLE_BYTES:
                self._pool.pop(0).free()

    def resident_xt(self, X: np.ndarray, problem: Problem, upload_fn):
        """Device pointer and leading dimension of the immutable X's resident copy (uploaded and
        transposed now if it is not resident), or None when X may change (anything but an immutable
        array, see :mod:`asp_gmm.frozen`: the copy is keyed by X's identity, never re-read)."""
        ident = frozen.identity(X)
        if ident is None:
            return None
        key = ident[1]
        with self._lock:
            hit = self._resident.get(key)
            if hit is not None and hit[0]() is X:
                self._resident.move_to_end(key)
                return hit[1], hit[2]
            dev = self._device()
            self._hook()
            with dev.active():
                if hit is not None:  # another array now lives at that address
                    self._resident.pop(key)[1].free()
                ldn = _capacity(problem.N)  # the leading dimension of the buffers it runs with
                nbytes = max(problem.D * ldn * problem.np_dtype.itemsize, 16)
                if nbytes > RESIDENT_BYTES:
                    return None
                while self._resident and sum(v[3] for v in self._resident.values()) + nbytes > RESIDENT_BYTES:
                    self._resident.popitem(last=False)[1][1].free()
                xt = dev.drv.mem_alloc(nbytes)
                try:
                    self.upload(X, xt, problem, ldn, upload_fn)
                except BaseException:
                    xt.free()
                    raise
                self._resident[key] = (ident[0], xt, ldn, nbytes)
            return xt, ldn


class _Block:
    """``capacity`` bytes of device memory in one allocation (``int(block)``: its address), pooled by
    :meth:`DeviceMemory.acquire_bytes` for the batched sessions."""

    key = ("bytes",)

    def __init__(self, dev, nbytes: int):
        self._dev = dev
        self.capacity = self.nbytes = int(nbytes)
        with dev.active():
            self.alloc = dev.drv.mem_alloc(self.nbytes)

    def __int__(self) -> int:
        return int(self.alloc)

    def free(self):
        if self.alloc is not None:
            with self._dev.active():
                self.alloc.free()
            self.alloc = None


class _Buffers:
    """Device memory for sessions of one (D, M, cvtype, dtype) on up to ``problem.N`` events (the
    capacity), reused across sessions. ``xt`` is allocated on the first upload of writeable data
    (sessions on resident read-only data use the resident copy)."""

    def __init__(self, dev, problem: Problem):
        drv = dev.drv
        self.problem = problem
        self.capacity = problem.N
        self.key = (problem.D, problem.M, problem.cvtype, problem.dtype)
        self.last_n = None  # events of the last session: resp beyond them is stale otherwise
        N, D, M = problem.N, problem.D, problem.M
        rs = problem.np_dtype.itemsize
        full = problem.kernel_cvtype == "full"  # tied: M copies of the one matrix; spherical: D of each variance
        self.ldn = ldn = -(-max(N, 1) // LDN_ALIGN) * LDN_ALIGN
        cells = problem.cells
        covcells = D * D if full else D
        self.off = off = {}
        n64 = 0
        for name, size in (("w64", M), ("mu64", M * D), ("cov64", M * covcells), ("logdet", M)):
            off[name] = 8 * n64
            n64 += size
        rbase = -(-8 * n64 // 16) * 16
        nr = 0
        for name, size in (("mu", M * D), ("prec", M * cells), ("logc", M)):
            off[name] = rbase + rs * nr
            nr += size
        self.param_bytes = rbase + rs * nr
        self.param_vec = -(-self.param_bytes // 16)  # 16-byte words copied by asp_moments to the backup
        self.sizes = {"w64": M, "mu64": M * D, "cov64": M * covcells, "mu": M * D}
        core = registry.get("cuda", "core", "core")
        self.mom_blocks = int(core.default_tunables()["mom_blocks"])
        with dev.active():
            try:
                alloc = drv.mem_alloc
                self.xt = None
                self.xt_bytes = max(D * ldn * rs, 16)
                self.nbytes = (
                    self.xt_bytes
                    + (M + 1) * ldn * rs
                    + 32 * self.param_vec
                    + 8 * M
                    + 8 * self.mom_blocks * M * (D + 1)
                    + 8 * M * cells
                )
                self.resp = alloc(max(M * ldn * rs, 16))
                self.logp = alloc(ldn * rs)
                self.params = alloc(16 * self.param_vec)
                self.backup = alloc(16 * self.param_vec)
                self.nk = alloc(8 * M)
                self.part = alloc(8 * self.mom_blocks * M * (D + 1))
                self.acc = alloc(8 * M * cells)
                self.work = alloc(8 * (M * D * D + M * D)) if full and (D * D + D) * 8 > 40960 else None
                self.stat = alloc(16)
                self.stat_host = drv.pagelocked_zeros(2, np.float64)
                drv.memset_d8(self.resp, 0, M * ldn * rs)
                drv.memset_d8(self.logp, 0, ldn * rs)
                drv.memset_d8(self.params, 0, self.param_bytes)
                drv.memset_d8(self.acc, 0, 8 * M * cells)
                self.stream = drv.Stream()
                self.events = [drv.Event() for _ in range(4)]
            except drv.Error as exc:
                raise MemoryError(f"could not allocate GPU memory for N={N}, D={D}, M={M}: {exc}") from None
        self.scratch = None
        self.scratch_bytes = 0
        self._dev = dev

    def own_xt(self):
        """This buffer set's own event array (for writeable data), allocated on first use."""
        if self.xt is None:
            with self._dev.active():
                self.xt = self._dev.drv.mem_alloc(self.xt_bytes)
        return self.xt

    def ptr(self, name: str) -> int:
        return int(self.params) + self.off[name]

    def ensure_scratch(self, nbytes: int):
        if nbytes > self.scratch_bytes:
            with self._dev.active():
                if self.scratch is not None:
                    self.scratch.free()
                self.scratch = self._dev.drv.mem_alloc(max(nbytes, 16))
            self.scratch_bytes = nbytes
        return self.scratch

    def free(self):
        with self._dev.active():
            for name in ("xt", "resp", "logp", "params", "backup", "nk", "part", "acc", "work", "stat", "scratch"):
                a = getattr(self, name, None)
                if a is not None:
                    a.free()
                    setattr(self, name, None)
