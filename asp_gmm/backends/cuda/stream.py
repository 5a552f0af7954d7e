"""Streamed EM on the GPU: the CUDA backend's :class:`~asp_gmm.backends.base.StatsRunner`
(:meth:`CudaBackend.open_stats <asp_gmm.backends.cuda.backend.CudaBackend.open_stats>`).

One CUDA session of ``problem.N`` events (the block capacity) stays allocated for the whole fit;
every block goes through it with the session's own kernels:

* host: the block is copied into one of two pinned host buffers (while the GPU works on the
  previous block);
* copy stream: pinned buffer -> one of two raw device buffers (``memcpy_htod_async``), an event
  marks it copied; it waits until the transpose of the block that used that raw buffer before;
* compute stream (the session's): waits for the copy, transposes the raw rows into the session's
  event array (``asp_upload_chunk``, which also folds the block's first row holding NaN or infinity
  into the slot's flag word, read back with the results: the host makes no NaN pass of its own,
  :attr:`CudaStatsRunner.checks_finite`), then the E-step (log-likelihood copied out at once: the M-step kernels clear it),
  the M-step sums of the block (``asp_moments``/``asp_means``, or a fused variant's E-step and
  means phases) and the covariance variant the selection chose, which centre the block's second
  moments on the *block's* means; counts, block means and sums are copied to pinned result slots,
  and the parameters the means kernels overwrote are restored from the backup they made.

So block k + 1's copy overlaps block k's compute, and the host reads block k's results only when
block k + 1 is under way. The block's statistics are re-centred on the current means in float64 on
the host (``S2_c = S2_b + n_k (m_b - c)(m_b - c)^T``; the sums of ``r (x - m_b)`` are zero up to
the ``10 eps`` of the counts).

A block may be one array or a list of row pieces (consecutive, as
:func:`asp_gmm.streaming.blocks` yields them with ``pieces=True``): the pieces are copied straight
into the pinned buffer, so a block costs the host one multi-threaded copy, whatever the source's
chunking. The session is opened without data (nothing is uploaded before the first block).
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from ...errors import KernelError, NonFiniteError, NonFiniteInputError
from ...problem import Problem
from ..base import BlockStats, StatsRunner
from .batch_layout import packed_cells

_TINY_COUNT = 10.0 * np.finfo(np.float64).eps
_EMPTY = 1e-6
_INT_MAX = 2**31 - 1
#: Host copies into the pinned buffers are split into slices of at least this many bytes.
_SLICE = 16 << 20


class CudaStatsRunner(StatsRunner):
    """Per-block statistics on the GPU with two streams and pinned buffers (see the module docstring)."""

    #: Blocks are checked for NaN/inf on the device: a bad block raises NonFiniteInputError with
    #: ``block`` (its index in the pass) and ``row`` (within the block) set.
    checks_finite = True

    def __init__(self, backend, problem: Problem, kernel=None):
        super().__init__(backend, problem, kernel)
        if kernel is None:
            raise ValueError("the CUDA backend computes block statistics with a covariance variant; pass its kernel")
        self.session = backend.open(None, problem)
        ses = self.session
        self.drv = drv = ses.drv
        self.mod = kernel.handle
        bp = ses.problem  # what the binaries run (M may be padded)
        D, rs = problem.D, problem.np_dtype.itemsize
        self.m_live = problem.M
        self.cells = bp.cells
        with ses.dev.active():
            try:
                self.pinned = [drv.pagelocked_empty((problem.N, D), problem.np_dtype) for _ in range(2)]
                self.raw = [drv.mem_alloc(max(problem.N * D * rs, 16)) for _ in range(2)]
                self.copy_stream = drv.Stream()
                self.copied = [drv.Event() for _ in range(2)]
                self.consumed = [drv.Event() for _ in range(2)]
                self.done = [drv.Event() for _ in range(2)]
                self.res_stat = [drv.pagelocked_zeros(2, np.float64) for _ in range(2)]
                self.res_nk = [drv.pagelocked_zeros(bp.M, np.float64) for _ in range(2)]
                self.res_mu = [drv.pagelocked_zeros(bp.M * D, np.float64) for _ in range(2)]
                self.res_acc = [drv.pagelocked_zeros(bp.M * self.cells, np.float64) for _ in range(2)]
                self.flag = [drv.mem_alloc(16) for _ in range(2)]
                self.res_flag = [drv.pagelocked_zeros(4, np.int32) for _ in range(2)]
            except drv.Error as exc:
                self.close()
                raise MemoryError(
                    f"could not allocate the streaming buffers for blocks of {problem.N} events: "
                    f"{exc}; lower ASP_GMM_BLOCK_BYTES"
                ) from None
        self._n = problem.N
        self._means = None
        self._pool = None
        self._threads = min(
            8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        )

    def set_params(self, weights, means, covars, reg_covar: float) -> None:
        self.session.set_params(weights, means, covars, reg_covar)
        self._means = np.array(means, np.float64)

    def stats(self, X) -> BlockStats:
        return next(iter(self.stats_many([X])))

    # ------------------------------------------------------------------ the pipeline
    def _set_rows(self, n: int) -> None:
        """Point the session's kernels at n events (the last block of a pass may be shorter)."""
        ses = self.session
        if n == self._n:
            return
        if n < self._n:  # posteriors past n from the longer block must read as zero
            b = ses.buf
            self.drv.memset_d8_async(b.resp, 0, ses.problem.M * b.ldn * ses.problem.np_dtype.itemsize, b.stream)
        ses.problem = dataclasses.replace(ses.problem, N=n)
        ses._plans.clear()
        ses._calls.clear()
        self._n = n

    def _submit(self, k: int, X) -> None:
        ses, drv = self.session, self.drv
        b, s = ses.buf, k % 2
        n = sum(p.shape[0] for p in X) if isinstance(X, list) else X.shape[0]
        if k >= 2:
            self.copied[s].synchronize()  # the pinned buffer's last copy has left
        self._to_pinned(self.pinned[s][:n], X)
        self.copy_stream.wait_for_event(self.consumed[s])  # raw[s] transposed by block k - 2
        drv.memcpy_htod_async(self.raw[s], self.pinned[s][:n], self.copy_stream)
        self.copied[s].record(self.copy_stream)
        b.stream.wait_for_event(self.copied[s])
        self._sum_block(k, int(self.raw[s]), n, self.consumed[s])

    def _sum_block(self, k: int, ptr: int, n: int, consumed=None, weights=None) -> None:
        """On the compute stream: transpose the n rows at device pointer ``ptr`` into the session's
        event array (NaN/inf flagged; ``consumed`` recorded once they are read), then the E-step, the
        M-step sums and the covariance variant, their results copied to block k's host buffers.
        ``weights``: ``(device pointer of n float64 sample weights, device double for the weighted
        log-likelihood, event recorded once the weights are read)``; ``asp_weight_rows`` scales the
        posteriors by them after the E-step (a fused variant's E-step takes no weights: not with one)."""
        ses, drv = self.session, self.drv
        b, s = ses.buf, k % 2
        self._set_rows(n)
        D, ldn = self.problem.D, b.ldn
        drv.memset_d32_async(self.flag[s], _INT_MAX, 1, b.stream)
        ses._launch(
            "asp_upload_chunk",
            ses._fn["asp_upload_chunk"],
            (-(-D * ldn // 256), 1),
            (256, 1, 1),
            ptr,
            int(ses.xt),
            np.int32(0),
            np.int32(n),
            np.int32(ldn),
            np.int32(ldn),
            int(self.flag[s]),
        )
        if consumed is not None:
            consumed.record(b.stream)
        drv.memcpy_dtoh_async(self.res_flag[s], self.flag[s], b.stream)
        mod = self.mod
        ses._reset()
        if mod.fused:
            if weights is not None:
                raise ValueError(f"{mod.variant.key} fuses the M-step sums into its E-step: it takes no sample weights")
            ses._variant_phase(mod, "estep")
        else:
            ses._estep_launch()
        if weights is None:
            drv.memcpy_dtoh_async(self.res_stat[s], b.stat, b.stream)  # before the means kernels clear it
        else:
            wptr, wll, wread = weights
            drv.memset_d32_async(wll, 0, 4, b.stream)  # (16 bytes: as res_stat)
            ses._launch(
                "asp_weight_rows",
                ses._fn["asp_weight_rows"],
                (max(1, -(-n // 256)), 1),
                (256, 1, 1),
                int(wptr),
                int(b.resp),
                int(b.logp),
                int(wll),
                np.int32(n),
                np.int32(ldn),
            )
            if wread is not None:
                wread.record(b.stream)
            drv.memcpy_dtoh_async(self.res_stat[s], wll, b.stream)
        if mod.fused:
            ses._variant_phase(mod, "means")
        else:
            ses._means(self.cells if mod.zero_acc else 0)
        ses._variant_phase(mod, "covariance")
        drv.memcpy_dtoh_async(self.res_nk[s], b.nk, b.stream)
        drv.memcpy_dtoh_async(self.res_mu[s], b.ptr("mu64"), b.stream)
        drv.memcpy_dtoh_async(self.res_acc[s], b.acc, b.stream)
        drv.memcpy_dtod_async(b.params, b.backup, b.param_bytes, b.stream)  # the current means again
        self.done[s].record(b.stream)
        ses._launched.clear()

    def _to_pinned(self, dst: np.ndarray, src) -> None:
        """Copy a block (an array, or a list of consecutive row pieces) into pinned memory on
        several threads (NumPy releases the GIL): one thread's memcpy (5-10 GB/s) is slower than
        the host-to-device link. The copy converts the dtype and gathers strided rows."""
        tasks, row = [], 0
        row_bytes = dst.strides[0] if dst.ndim == 2 else dst.itemsize
        for piece in src if isinstance(src, list) else [src]:
            m = piece.shape[0]
            parts = min(self._threads, max(1, (m * row_bytes) // _SLICE))
            cuts = [m * i // parts for i in range(parts + 1)]
            tasks += [(dst[row + a : row + b], piece[a:b]) for a, b in zip(cuts, cuts[1:]) if b > a]
            row += m
        if len(tasks) <= 1:
            for d, p in tasks:
                np.copyto(d, p, casting="same_kind")
            return
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="asp_gmm-pin")
        list(self._pool.map(lambda t: np.copyto(t[0], t[1], casting="same_kind"), tasks))

    def _collect(self, k: int, n: int) -> BlockStats:
        s, m, D = k % 2, self.m_live, self.problem.D
        try:
            self.done[s].synchronize()
        except self.drv.Error as exc:
            raise KernelError(f"a CUDA kernel of streamed EM failed: {exc}") from None
        bad = int(self.res_flag[s][0])
        if bad != _INT_MAX:  # the block's data, still in pinned[s] (block k + 1 went to the other one)
            exc = NonFiniteInputError.at(self.pinned[s], bad, self.problem.np_dtype)
            exc.block = k
            raise exc
        ll = float(self.res_stat[s][0])
        if not math.isfinite(ll):
            raise NonFiniteError(
                f"the log-likelihood is not finite ({ll}): a component has collapsed onto a few events or the data "
                "has an extreme range. Increase reg_covar, use fewer components, or scale the data."
            )
        nk = self.res_nk[s][:m].copy()
        mb = self.res_mu[s].reshape(-1, D)[:m].copy()
        acc = self.res_acc[s].reshape(-1, self.cells)[:m]
        c = self._means
        live = nk >= _EMPTY
        mb[~live] = c[~live]  # an empty component's means kernel kept the current mean
        sumx = mb * (nk + _TINY_COUNT)[:, None]
        d = mb - c
        if self.problem.kernel_cvtype == "full":
            s2 = np.take(acc, packed_cells(D)[1], axis=1).reshape(m, D, D)
            s2 += nk[:, None, None] * np.einsum("ki,kj->kij", d, d)
        else:
            s2 = acc[:, :D] + nk[:, None] * d * d
        return BlockStats(n, ll, nk, sumx, s2)

    def stats_many(self, blocks):
        """Statistics of each block in turn, the next block's copy under way while one computes."""
        pending = None
        with self.session.dev.active():
            for k, X in enumerate(blocks):
                if not isinstance(X, list):
                    X = np.asarray(X)  # (converted, if need be, by the copy into pinned memory)
                self._submit(k, X)
                if pending is not None:
                    yield self._collect(*pending)
                pending = (k, self._n)
            if pending is not None:
                yield self._collect(*pending)

    def close(self) -> None:
        ses = getattr(self, "session", None)
        if ses is None:
            return
        with ses.dev.active():
            for a in getattr(self, "raw", []) + getattr(self, "flag", []):
                a.free()
        self.raw, self.flag = [], []
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        ses.close()
        self.session = None
