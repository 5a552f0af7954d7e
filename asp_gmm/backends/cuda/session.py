"""The CUDA session: one data set on the GPU and the EM loop issued from the host.

One EM iteration (five launches on one stream, one 16-byte read back):
``moments -> means -> covariance variant -> factor -> E-step``, then the host reads
``stat`` (the log-likelihood scalar and the bad-component word). A weighted session
(:meth:`CudaSession.set_sample_weight`) adds a sixth launch after every E-step, the core's
``asp_weight_rows``: the posteriors times the events' weights (kept on the device) and the weighted
log-likelihood in place of the plain one, so the sums of the next M-step are weighted. A failed factorisation restores the
parameters of the previous iteration (device-to-device copy) and raises
:class:`~asp_gmm.errors.NotPositiveDefiniteError`. The device buffers are described in
:mod:`asp_gmm.backends.cuda.memory`, the variants' launches in :mod:`asp_gmm.backends.cuda.launch`.

Errors from the driver are raised as :class:`~asp_gmm.errors.KernelError` naming the kernel and its
grid and block; ``ASP_GMM_CUDA_SYNC=1`` synchronises after every launch to pin asynchronous faults
on the launch that caused them.
"""

from __future__ import annotations

import math

import numpy as np

from ... import cuda_arrays
from ...errors import KernelError, NonFiniteError, NotPositiveDefiniteError
from ...reference import change_per_event
from ...reference import converged as converged_rule
from ...problem import Problem, as_cvtype, per_component
from ..base import EMRun, Kernel, Session
from .launch import COV_ARGS, ESTEP_ARGS, _Module, plan_launches
from ...config import settings

_INT_MAX = 2**31 - 1


class CudaSession(Session):
    """One data set on the GPU; the EM loop issued from here, kernels on one stream.

    Parameters
    ----------
    backend : CudaBackend
    X : ndarray (N, D), or a CUDA array (PyTorch, CuPy: used on the device where it lies)
        The events, of ``problem.dtype``.
    problem : Problem
        The problem the binaries run (M padded to its component class when small, see
        :func:`asp_gmm.backends.cuda.backend.binary_problem`).
    m_live : int
        The caller's M: components ``m_live..M-1`` are padding of weight 0, never returned.
    policy : asp_gmm.selection.Policy, optional
        Chooses the E-step (the specializer's; default the backend's).
    """

    def __init__(self, backend, X: np.ndarray, problem: Problem, m_live: int, policy=None):
        #: the live components; ``self.problem`` is what the binaries run (M padded when small)
        self.m_live = m_live
        self.problem, self.backend = problem, backend
        self.dev = backend.device
        self.drv = self.dev.drv
        self.core = backend.core(problem)
        self.estep_mod = backend.estep(problem, policy=policy)
        self._fn = {spec.kernel: fn for spec, fn in self.core.funcs}
        resident = backend.memory.resident_xt(X, problem, self._fn["asp_upload_chunk"])
        self.buf = backend.memory.acquire(problem, exact=resident is not None)
        self._closed = False
        self._stale = True
        self._fused_sums = None  # the fused variant whose M-step sums the last E-step left, if any
        self._resp_whole = False  # whether resp holds every row of the last E-step (a fused one may
        # store only the rows its exact fallback needs)
        self._sw = None  # the sample weights on the device (float64, N), if any
        self._norm = float(problem.N)  # what the change of the log-likelihood is taken per: N or sum(w)
        self._launched = []
        self._plans, self._calls = {}, {}  # launch configurations and argument lists, per module
        self.phase_seconds = []
        self._sync_each = settings().cuda_sync
        b = self.buf
        try:
            if b.last_n is not None and b.last_n != problem.N:
                # posteriors beyond N from an earlier, larger session: padding must read as zero
                with self.dev.active():
                    self.drv.memset_d8(b.resp, 0, problem.M * b.ldn * problem.np_dtype.itemsize)
            b.last_n = problem.N
            if resident is not None and resident[1] == b.ldn:
                self.xt = resident[0]
            elif X is None:  # the caller fills xt itself (the streaming runner, block by block)
                self.xt = b.own_xt()
            else:
                self.xt = b.own_xt()
                if cuda_arrays.is_cuda_array(X):  # a PyTorch/CuPy array: transposed (and checked) where it lies
                    backend.memory.transpose_device(
                        cuda_arrays.in_dtype(X, problem.np_dtype),
                        self.xt,
                        problem,
                        b.ldn,
                        self._fn["asp_upload_chunk"],
                        b.stream,
                    )
                else:  # pinned, chunked, checked for NaN/inf on the device (staging.py)
                    backend.memory.upload(
                        np.asarray(X), self.xt, problem, b.ldn, self._fn["asp_upload_chunk"], b.stream
                    )
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ helpers
    @property
    def _env(self) -> dict:
        env = dict(self.problem.as_dict())
        env["ldn"] = self.buf.ldn
        env.update(self.backend.limit_context())
        return env

    def _launch(self, name, fn, grid, block, *args, shared=0):
        grid = tuple(grid)
        self._launched.append(f"{name} grid={grid} block={block}")
        try:
            if shared > 48 * 1024 and getattr(fn, "_asp_dyn_smem", 0) < shared:
                # more than 48 KiB of dynamic shared memory must be asked for per function
                fn.set_attribute(self.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, int(shared))
                fn._asp_dyn_smem = shared
            fn.prepared_async_call(grid, block, self.buf.stream, *args, shared_size=shared)
            if self._sync_each:
                self.buf.stream.synchronize()
        except self.drv.Error as exc:
            raise KernelError(
                f"CUDA kernel {name} (grid={grid}, block={block}, shared={shared} bytes) failed: {exc}"
            ) from None

    def _sync(self):
        try:
            self.buf.stream.synchronize()
        except self.drv.Error as exc:
            raise KernelError(
                f"a CUDA kernel failed ({exc}); launched since the last check: " + "; ".join(self._launched[-12:])
            ) from None
        self._launched.clear()

    def _read_stat(self):
        b = self.buf
        try:
            self.drv.memcpy_dtoh_async(b.stat_host, b.stat, b.stream)
        except self.drv.Error as exc:
            raise KernelError(f"reading the status back failed: {exc}") from None
        self._sync()
        ll = float(b.stat_host[0])
        bad = int(b.stat_host[1:2].view(np.int32)[0])
        return ll, (None if bad == _INT_MAX else bad)

    # ------------------------------------------------------------------ phases
    def _reset(self):
        self._launch("asp_reset", self._fn["asp_reset"], (1, 1), (1, 1, 1), int(self.buf.stat))

    def _factor(self, reg_covar: float, mode: int):
        b, M = self.buf, self.problem.M
        ft = int(self.core.tunables["factor_threads"])
        self._launch(
            "asp_factor",
            self._fn["asp_factor"],
            (M, 1),
            (ft, 1, 1),
            int(b.acc),
            int(b.nk),
            b.ptr("w64"),
            b.ptr("cov64"),
            b.ptr("logdet"),
            b.ptr("prec"),
            b.ptr("logc"),
            int(b.work) if b.work is not None else 0,
            int(b.stat),
            np.float64(reg_covar),
            np.int32(mode),
            np.int32(self.m_live),
        )

    def _args(self, names, scratch=None) -> list:
        b, p = self.buf, self.problem
        val = {
            "xt": lambda: int(self.xt),
            "resp": lambda: int(b.resp),
            "means": lambda: b.ptr("mu"),
            "nk": lambda: int(b.nk),
            "acc": lambda: int(b.acc),
            "scratch": lambda: int(scratch) if scratch is not None else 0,
            "prec": lambda: b.ptr("prec"),
            "logc": lambda: b.ptr("logc"),
            "logp": lambda: int(b.logp),
            "stat": lambda: int(b.stat),
            "n": lambda: np.int32(p.N),
            "ldn": lambda: np.int32(b.ldn),
            "d": lambda: np.int32(p.D),
            "m": lambda: np.int32(p.M),
            "mu64": lambda: b.ptr("mu64"),
            "w64": lambda: b.ptr("w64"),
            "params": lambda: int(b.params),
            "backup": lambda: int(b.backup),
            "pvec": lambda: np.int32(b.param_vec),
            # the parameters of the last E-step (every E-step copies them to the backup)
            "bmu64": lambda: int(b.backup) + b.off["mu64"],
            "bprec": lambda: int(b.backup) + b.off["prec"],
            "blogc": lambda: int(b.backup) + b.off["logc"],
        }
        return [val[a]() for a in names]

    def _plan(self, mod: _Module, default_args: tuple, scratch_bytes: bool = False, phase=None):
        """(scratch bytes, [(kernel, function, grid, block, shared, argument names)]) of a variant's
        launches (those of ``phase`` when given) for this session's problem, evaluated once: the
        manifests' expressions are long and the host must keep ahead of the GPU at small sizes."""
        plan = self._plans.get((mod, phase))
        if plan is None:
            # shared by the backend's sessions of the same problem and leading dimension: a call on
            # data of a size seen before evaluates no expression (the session's own dict is the
            # fast path within a call; the streaming runner clears it when N changes)
            key = (mod, phase, default_args, scratch_bytes, self.problem, self.buf.ldn)
            shared = self.backend.__dict__.setdefault("_plan_cache", {})
            plan = shared.get(key)
            if plan is None:
                if len(shared) > 4096:
                    shared.clear()
                plan = shared[key] = plan_launches(mod, self._env, default_args, scratch_bytes, phase)
            self._plans[(mod, phase)] = plan
        return plan

    def _run_plan(self, confs, scratch=None):
        key = (id(confs), int(scratch) if scratch is not None else 0)
        calls = self._calls.get(key)
        if calls is None:
            calls = self._calls[key] = [
                (k, fn, g, bl, tuple(self._args(names, scratch)), sh) for k, fn, g, bl, sh, names in confs
            ]
        for k, fn, g, bl, args, sh in calls:
            self._launch(k, fn, g, bl, *args, shared=sh)

    def _estep_launch(self):
        self._run_plan(self._plan(self.estep_mod, ESTEP_ARGS)[1])
        if self._sw is not None:
            self._weigh()

    def _weigh(self):
        """After an E-step: every event's posteriors times its weight; the status's log-likelihood
        replaced by the weighted sum (the bad-component word is left alone)."""
        b, n = self.buf, self.problem.N
        self.drv.memset_d32_async(b.stat, 0, 2, b.stream)
        self._launch(
            "asp_weight_rows",
            self._fn["asp_weight_rows"],
            (max(1, -(-n // 256)), 1),
            (256, 1, 1),
            int(self._sw),
            int(b.resp),
            int(b.logp),
            int(b.stat),
            np.int32(n),
            np.int32(b.ldn),
        )

    def _means(self, zero_cells: int = 0):
        """Moments and means of the M-step (two launches). Also: the parameters are backed up (for
        the undo of a failed step), the status is cleared (as asp_reset) and, with ``zero_cells``, the
        first zero_cells acc cells of every component are zeroed (for variants with zero_acc)."""
        b, M = self.buf, self.problem.M
        self._launch(
            "asp_moments",
            self._fn["asp_moments"],
            (b.mom_blocks, self.core.mom_grid_y),
            (self.core.mom_threads, 1, 1),
            int(self.xt),
            int(b.resp),
            int(b.part),
            np.int32(self.problem.N),
            np.int32(b.ldn),
            int(b.params),
            int(b.backup),
            np.int32(b.param_vec),
        )
        self._launch(
            "asp_means",
            self._fn["asp_means"],
            (M, 1),
            (256, 1, 1),
            int(b.part),
            np.int32(b.mom_blocks),
            int(b.nk),
            b.ptr("mu64"),
            b.ptr("mu"),
            int(b.stat),
            int(b.acc),
            np.int32(zero_cells),
        )

    def _variant_phase(self, mod: _Module, phase: str):
        """A covariance variant's launches of one phase. A variant asking for zeroed acc gets it from
        asp_means; a fused one, whose "means" launches replace asp_means, before them."""
        b = self.buf
        nbytes, confs = self._plan(mod, COV_ARGS, scratch_bytes=True, phase=phase)
        scratch = b.ensure_scratch(nbytes)
        if mod.zero_acc and phase == "means":
            self.drv.memset_d32_async(b.acc, 0, 2 * self.problem.M * self.problem.cells, b.stream)
        self._run_plan(confs, scratch)

    def _run_estep(self, fused: _Module | None = None):
        """The E-step (log-likelihood, posteriors); with ``fused``, that variant's E-step, which also
        leaves the sums of the next M-step in its scratch."""
        self._reset()
        if fused is None:
            self._estep_launch()
        else:
            self._refuse_fused(fused)
            self._variant_phase(fused, "estep")
        ll, _ = self._read_stat()
        self._check_ll(ll)
        self._ll = ll
        self._stale = False
        self._fused_sums = fused
        self._resp_whole = fused is None
        return ll

    @staticmethod
    def _check_ll(ll):
        if not math.isfinite(ll):
            raise NonFiniteError(
                f"the log-likelihood is not finite ({ll}): a component has collapsed onto a few events or "
                "the data has an extreme range. Increase reg_covar, use fewer components, or scale the data."
            )

    def _refuse_fused(self, mod):
        if self._sw is not None:
            raise ValueError(
                f"{mod.variant.key} fuses the M-step sums into its E-step: it takes no sample weights "
                "(its manifest says sample_weight = false); choose a variant that does"
            )

    # ------------------------------------------------------------------ Session API
    #: sample weights are folded into the posteriors on the device (``asp_weight_rows``)
    takes_sample_weight = True

    def set_sample_weight(self, sample_weight) -> None:
        """Weigh the events from now on (see :meth:`asp_gmm.backends.base.Session.set_sample_weight`):
        ``sample_weight`` (N,) float64 >= 0 is copied to the device once; every later E-step of this
        session (:meth:`em`, :meth:`loglik`, :meth:`eval`, whose posteriors are then weighted) folds
        it in."""
        p = self.problem
        w = np.ascontiguousarray(sample_weight, dtype=np.float64)
        if w.shape != (p.N,):
            raise ValueError(f"sample_weight has shape {w.shape}, X has {p.N} events; pass one weight per event")
        with self.dev.active():
            if self._sw is None:
                try:
                    self._sw = self.drv.mem_alloc(max(8 * p.N, 16))
                except self.drv.Error as exc:
                    raise MemoryError(
                        f"could not allocate {8 * p.N} bytes for the sample weights on the device: {exc}"
                    ) from None
            self.drv.memcpy_htod(self._sw, w)
        self._norm = float(w.sum())
        self._stale = True

    def set_params(self, weights, means, covars, reg_covar: float) -> None:
        b, p = self.buf, self.problem
        rt = p.np_dtype
        # tied and spherical run on the full and diag kernels: every component holds its copy of the one
        # matrix, every dimension its copy of the component's variance (the core keeps them equal)
        covars = per_component(covars, p.cvtype, self.m_live, p.D)
        pad = p.M - self.m_live
        if pad:
            # padding components: copies of component 0 (finite, positive definite) of weight 0
            weights = np.concatenate([np.asarray(weights, np.float64), np.zeros(pad)])
            means, covars = (
                np.concatenate([a, np.repeat(a[:1], pad, axis=0)])
                for a in (np.asarray(means, np.float64), np.asarray(covars, np.float64))
            )
        with self.dev.active():
            host = np.zeros(b.param_bytes, np.uint8)
            for name, arr, dt in (
                ("w64", weights, np.float64),
                ("mu64", means, np.float64),
                ("cov64", covars, np.float64),
                ("mu", means, rt),
            ):
                a = np.ascontiguousarray(np.asarray(arr, dtype=np.float64).astype(dt).reshape(-1))
                host[b.off[name] : b.off[name] + a.nbytes] = a.view(np.uint8)
            self.drv.memcpy_htod(b.params, host)
            self._reset()
            self._factor(reg_covar, 0)
            _, bad = self._read_stat()
        self._stale = True
        if bad is not None:
            raise NotPositiveDefiniteError(bad, reg_covar)

    def params(self):
        b, p = self.buf, self.problem
        host = np.empty(b.param_bytes, np.uint8)
        with self.dev.active():
            self.drv.memcpy_dtoh(host, b.params)

        def get(name, shape):
            n = int(np.prod(shape))
            return host[b.off[name] : b.off[name] + 8 * n].view(np.float64).reshape(shape).copy()

        D, M = p.D, p.M
        cshape = (M, D, D) if p.kernel_cvtype == "full" else (M, D)
        m = self.m_live
        return get("w64", (M,))[:m], get("mu64", (M, D))[:m], as_cvtype(get("cov64", cshape)[:m], p.cvtype)

    def _em(self, kernel: Kernel, *, min_iters: int, max_iters: int, tol: float, reg_covar: float) -> EMRun:
        mod = kernel.handle
        b = self.buf
        it_s, cov_s = [], []
        iters, converged = 0, False
        self.phase_seconds = []
        fused = mod.fused
        if fused:
            self._refuse_fused(mod)
        with self.dev.active():
            if self._stale or (fused and self._fused_sums is not mod) or not (fused or self._resp_whole):
                self._run_estep(mod if fused else None)  # (a plain M-step reads every row of resp)
            ll = self._ll
            trace = [float(ll)]
            e = b.events
            while iters < max_iters:
                # 5 launches: moments (+ parameter backup), means (+ status reset, acc zeroing),
                # covariance variant, factor, E-step; then the 16-byte status read. A fused variant:
                # its means launch (from the sums its E-step left), its covariance launches, factor,
                # its E-step (+ parameter backup and the next M-step's sums).
                e[0].record(b.stream)
                if fused:
                    self._variant_phase(mod, "means")
                else:
                    self._means(self.problem.cells if mod.zero_acc else 0)
                e[1].record(b.stream)
                self._variant_phase(mod, "covariance")
                e[2].record(b.stream)
                self._factor(reg_covar, 1)
                if fused:
                    self._variant_phase(mod, "estep")
                else:
                    self._estep_launch()
                e[3].record(b.stream)
                new_ll, bad = self._read_stat()
                if bad is not None:
                    # restore the last good parameters; resp still holds their E-step
                    self.drv.memcpy_dtod_async(b.params, b.backup, b.param_bytes, b.stream)
                    self._sync()
                    self._stale = True
                    self._fused_sums = None
                    raise NotPositiveDefiniteError(bad, reg_covar)
                self._check_ll(new_ll)
                it_s.append(e[3].time_since(e[0]) * 1e-3)
                cov_s.append(e[2].time_since(e[1]) * 1e-3)
                # (moments + means, covariance, factor + E-step) of each iteration: benchmarks/gpu.py
                self.phase_seconds.append((e[1].time_since(e[0]) * 1e-3, cov_s[-1], e[3].time_since(e[2]) * 1e-3))
                iters += 1
                change, ll = change_per_event(new_ll, ll, self._norm), new_ll
                self._ll = ll
                trace.append(float(ll))
                if converged_rule(iters, min_iters, change, tol):
                    converged = True
                    break
        return EMRun(float(ll), iters, converged, it_s, cov_s, trace)

    def loglik(self) -> float:
        if self._stale:
            with self.dev.active():
                self._run_estep()
        return float(self._ll)

    def eval(self, want_resp: bool = True):
        p, b = self.problem, self.buf
        with self.dev.active():
            if self._stale or (want_resp and not self._resp_whole):
                self._run_estep()
            logp = np.empty(b.ldn, p.np_dtype)
            self.drv.memcpy_dtoh(logp, b.logp)
            resp = None
            if want_resp:
                r = np.empty((p.M, b.ldn), p.np_dtype)
                self.drv.memcpy_dtoh(r, b.resp)
                resp = np.ascontiguousarray(r[: self.m_live, : p.N].T)
        return logp[: p.N].copy(), resp

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._sw is not None:
                with self.dev.active():
                    self._sw.free()
                self._sw = None
            self.backend.memory.release(self.buf)
