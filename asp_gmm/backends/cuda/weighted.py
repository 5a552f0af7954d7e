"""Weighted streamed EM on the GPU: the CUDA backend's weighted statistics runner
(:meth:`CudaBackend.open_weighted_stats <asp_gmm.backends.cuda.backend.CudaBackend.open_weighted_stats>`).

The same pipeline as :class:`~asp_gmm.backends.cuda.stream.CudaStatsRunner` (two pinned buffers,
a copy stream, block k + 1's copy under block k's compute), with each block's sample weights
(float64) copied with its rows: after the E-step the core's ``asp_weight_rows`` multiplies every
posterior of an event by its weight and sums ``w * logp`` (double) for the block's log-likelihood,
so the moments, the means and the covariance variant that follow take weighted sums, with no
posterior read back. A block's ``n`` is its total weight, as the C core's weighted runner and
:func:`asp_gmm.backends.base.stats_from_posteriors` give it.

``resident=True`` (an in-memory array that fits the device, unchanged for the whole fit): every
block's rows and weights are copied into device buffers of their own on the first pass and read
there on the later passes, so a pass costs no host copy and no transfer (a device that runs out of
memory streams the blocks it could not keep).

A covariance variant that fuses the M-step sums into its own E-step (its manifest says
``sample_weight = false``) cannot be weighted here; the backend then opens the default runner.
"""

from __future__ import annotations

import numpy as np

from ..base import BlockStats
from .stream import CudaStatsRunner


class CudaWeightedStatsRunner(CudaStatsRunner):
    """Weighted block statistics on the GPU (see the module docstring).

    Parameters
    ----------
    backend : CudaBackend
    problem : Problem
        The block problem (``problem.N``: the most events of one block).
    kernel : Kernel
        The covariance variant (one that takes sample weights).
    resident : bool
        Keep the blocks' rows and weights on the device after the first pass.
    """

    def __init__(self, backend, problem, kernel=None, resident: bool = False):
        if kernel is not None and kernel.handle is not None and kernel.handle.fused:
            raise ValueError(f"{kernel.variant.key} fuses the M-step sums into its E-step: it takes no sample weights")
        super().__init__(backend, problem, kernel)
        drv = self.drv
        self._kept = []  # block k -> (rows allocation, weights allocation, rows) on the device
        self._wsum = [0.0, 0.0]
        with self.session.dev.active():
            try:
                self.wpinned = [drv.pagelocked_empty(max(problem.N, 1), np.float64) for _ in range(2)]
                self.wdev = [drv.mem_alloc(max(problem.N * 8, 16)) for _ in range(2)]
                self.wll = [drv.mem_alloc(16) for _ in range(2)]
                self.wread = [drv.Event() for _ in range(2)]
            except drv.Error as exc:
                self.close()
                raise MemoryError(
                    f"could not allocate the sample-weight buffers for blocks of {problem.N} events: "
                    f"{exc}; lower ASP_GMM_BLOCK_BYTES"
                ) from None
        self.resident = bool(resident)

    def stats_weighted(self, X, sample_weight) -> BlockStats:
        """Statistics of the block ``X`` ((n, D) or a list of row pieces) with each event's posteriors
        and log-likelihood multiplied by its weight (``sample_weight`` (n,) float64, >= 0)."""
        return list(self.stats_weighted_many([(X, sample_weight)]))[0]

    def stats_weighted_many(self, pairs):
        """:meth:`stats_weighted` of each ``(block, weights)`` of the iterable ``pairs`` in turn, the
        next block's copy under way while one computes (``pairs`` restart at block 0 every pass)."""
        pending = None
        with self.session.dev.active():
            for k, (X, w) in enumerate(pairs):
                if not isinstance(X, list):
                    X = np.asarray(X)
                self._submit_weighted(k, X, w)
                if pending is not None:
                    yield self._collect_weighted(*pending)
                pending = (k, self._n)
            if pending is not None:
                yield self._collect_weighted(*pending)

    # ------------------------------------------------------------------ the pipeline
    def _submit_weighted(self, k: int, X, w) -> None:
        ses, drv = self.session, self.drv
        b, s = ses.buf, k % 2
        n = sum(p.shape[0] for p in X) if isinstance(X, list) else X.shape[0]
        w = np.asarray(w, np.float64)
        if w.shape != (n,):
            raise ValueError(f"sample_weight of block {k} has shape {w.shape}, its rows {n}; pass one weight per event")
        self._wsum[s] = float(w.sum())
        kept = self._kept[k] if k < len(self._kept) else None
        if kept is not None and kept[2] == n:  # a later pass: the rows and weights are on the device
            self._sum_block(k, int(kept[0]), n, None, (kept[1], self.wll[s], None))
            return
        if k >= 2:
            self.copied[s].synchronize()  # the pinned buffers' last copies have left
        self._to_pinned(self.pinned[s][:n], X)
        self.wpinned[s][:n] = w
        keep = self._keep(k, n) if self.resident and len(self._kept) == k else None
        if keep is None:
            rows, wts = self.raw[s], self.wdev[s]
            self.copy_stream.wait_for_event(self.consumed[s])  # raw[s] transposed by block k - 2
            self.copy_stream.wait_for_event(self.wread[s])  # and wdev[s] read
        else:
            rows, wts = keep
        drv.memcpy_htod_async(rows, self.pinned[s][:n], self.copy_stream)
        drv.memcpy_htod_async(wts, self.wpinned[s][:n], self.copy_stream)
        self.copied[s].record(self.copy_stream)
        b.stream.wait_for_event(self.copied[s])
        self._sum_block(k, int(rows), n, self.consumed[s], (wts, self.wll[s], self.wread[s]))

    def _keep(self, k: int, n: int):
        """Device buffers of block k's rows and weights, kept for the later passes (``None`` when the
        device has no room: this block and the following ones stream)."""
        drv, rs = self.drv, self.problem.np_dtype.itemsize
        try:
            rows = drv.mem_alloc(max(n * self.problem.D * rs, 16))
        except drv.Error:
            self.resident = False
            return None
        try:
            wts = drv.mem_alloc(max(n * 8, 16))
        except drv.Error:
            rows.free()
            self.resident = False
            return None
        self._kept.append((rows, wts, n))
        return rows, wts

    def _collect_weighted(self, k: int, n: int) -> BlockStats:
        st = self._collect(k, n)
        return BlockStats(self._wsum[k % 2], st.loglik, st.nk, st.sumx, st.s2)

    def close(self) -> None:
        ses = getattr(self, "session", None)
        if ses is not None:
            with ses.dev.active():
                for a in getattr(self, "wdev", []) + getattr(self, "wll", []):
                    a.free()
                for rows, wts, _n in getattr(self, "_kept", []):
                    rows.free()
                    wts.free()
        self.wdev, self.wll, self._kept = [], [], []
        super().close()
