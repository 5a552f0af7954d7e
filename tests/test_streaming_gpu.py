"""Streamed EM on the GPU (asp_gmm/backends/cuda/stream.py): the same answers as in memory, blocks
of every size through two streams; skipped without a GPU (the lead runs them on the H100)."""

import numpy as np
import pytest

from asp_gmm import GMM
from conftest import make_blobs

cuda_mod = pytest.importorskip("asp_gmm.backends.cuda")
REASON = cuda_mod.CudaBackend.unavailable_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=f"CUDA backend unavailable: {REASON}")]


@pytest.mark.parametrize("cvtype", ["full", "diag"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("block_bytes", ["1", str(1 << 30)])
def test_cuda_streamed_equals_cuda_in_memory(cvtype, dtype, block_bytes, rng, monkeypatch):
    N, D, M = 20011, 8, 5
    X = make_blobs(rng, N, D, M, offset=10.0).astype(dtype)
    g = GMM(M, D, cvtype=cvtype, dtype=dtype, backend="cuda", seed=1)
    ll = g.train(X, min_em_iters=5, max_em_iters=5, tol=0)
    monkeypatch.setenv("ASP_GMM_BLOCK_BYTES", block_bytes)  # 256-event blocks (78 a pass), or one block
    h = GMM(M, D, cvtype=cvtype, dtype=dtype, backend="cuda", seed=1)
    lh = h.train(lambda: (X[a : a + 997] for a in range(0, N, 997)), min_em_iters=5, max_em_iters=5, tol=0)
    assert h.last_variant.endswith("(streamed)")
    tol = 1e-9 if dtype == np.float64 else 1e-4
    assert lh == pytest.approx(ll, rel=tol)
    np.testing.assert_allclose(h.covars, g.covars, rtol=0, atol=tol * 10 * np.abs(g.covars).max())
    np.testing.assert_allclose(h.means, g.means, rtol=0, atol=tol * 10 * np.abs(g.means).max())


def test_cuda_streamed_equals_c_streamed(rng):
    N, D, M = 30000, 12, 16
    X = make_blobs(rng, N, D, M).astype(np.float64)
    src = lambda: (X[a : a + 4096] for a in range(0, N, 4096))  # noqa: E731
    out = []
    for be in ("cuda", "c"):
        g = GMM(M, D, dtype=np.float64, backend=be, seed=3)
        out.append((g.train(src, min_em_iters=4, max_em_iters=4, tol=0), g))
    assert out[0][0] == pytest.approx(out[1][0], rel=1e-10)
    np.testing.assert_allclose(out[0][1].covars, out[1][1].covars, rtol=0, atol=1e-9 * np.abs(out[1][1].covars).max())
