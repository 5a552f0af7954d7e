"""Resident blocks on a GPU worker: the rows stay in device memory for the whole fit, every pass
runs the CUDA backend's per-block statistics on them with no host-to-device copy.

A block is either a CUDA array the Dask array already holds (a CuPy-backed ``dask.array``: used
where it lies, after one check on the device) or a NumPy block uploaded once (validated on the host
first) into a device buffer of its rows. Per pass and per piece of at most the runner's capacity,
the same launches as :class:`asp_gmm.backends.cuda.stream.CudaStatsRunner` run on the session's
stream: ``asp_upload_chunk`` of the piece's rows (device to device) into the session's event array
(its NaN flag read back as the streamed runner reads it), the E-step, the M-step sums and the
covariance variant; the host collects piece k while piece k + 1
computes, and re-centres its statistics as the streamed runner does.
"""

from __future__ import annotations

import numpy as np

from .. import cuda_arrays
from ..backends.cuda.stream import CudaStatsRunner
from ..errors import NonFiniteInputError, StreamError


class ResidentCudaRunner(CudaStatsRunner):
    """A :class:`~asp_gmm.backends.cuda.stream.CudaStatsRunner` whose blocks are already on the
    device (pointers to C-contiguous ``(n, D)`` rows of the working dtype)."""

    def upload(self, X: np.ndarray):
        """A device copy of the validated host block ``X`` (n, D); returns the allocation."""
        drv = self.drv
        with self.session.dev.active():
            buf = drv.mem_alloc(max(X.nbytes, 16))
            drv.memcpy_htod(buf, X)
        return buf

    def sync(self) -> None:
        """Wait for every pending write on the device (a CUDA array's producer)."""
        with self.session.dev.active():
            self.drv.Context.synchronize()

    def _collect(self, k: int, n: int):
        try:
            return super()._collect(k, n)
        except NonFiniteInputError:  # (the streamed runner would name a row of its pinned buffer)
            raise StreamError(
                f"piece {k} of this worker's resident rows holds NaN or infinity on the device although "
                "it was checked when loaded: something wrote to X's blocks during the fit"
            ) from None

    def stats_pieces(self, pieces):
        """Statistics of each ``(device pointer, rows)`` piece in turn (rows <= ``problem.N``)."""
        pending = None
        with self.session.dev.active():
            for k, (ptr, n) in enumerate(pieces):
                self._sum_block(k, int(ptr), int(n))  # rows read where they lie
                if pending is not None:
                    yield self._collect(*pending)
                pending = (k, n)
            if pending is not None:
                yield self._collect(*pending)


def device_block(X, dtype):
    """``(array, pointer)``: the CUDA array X in ``dtype``, C-contiguous, on its device."""
    arr = cuda_arrays.in_dtype(X, dtype)
    return arr, cuda_arrays.describe(arr)["ptr"]


def device_seed_sums(X, shift, cvtype: str, weights=None):
    """``(n or sum of weights, sum y, sum y y^T or sum y^2)`` of ``y = X - shift`` in float64, on
    the device of the CUDA array X (CuPy; other producers are copied to the host)."""
    if cuda_arrays._lib(X) != "cupy":
        return None
    import cupy

    y = X.astype(cupy.float64) - cupy.asarray(shift)
    if weights is None:
        n = float(y.shape[0])
        s1 = y.sum(0)
        s2 = y.T @ y if cvtype == "full" else (y * y).sum(0)
    else:
        w = cupy.asarray(weights, dtype=cupy.float64)
        n = float(w.sum())
        s1 = w @ y
        s2 = (y * w[:, None]).T @ y if cvtype == "full" else w @ (y * y)
    return n, cupy.asnumpy(s1), cupy.asnumpy(s2)
