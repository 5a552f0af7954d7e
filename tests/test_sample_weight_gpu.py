"""sample_weight on the CUDA backend (in memory: the session's own EM loop with the weights folded into
the posteriors of every CUDA E-step, asp_gmm/backends/cuda/session.py): against the float64 NumPy reference's weighted fit and against repeated rows, full and
diag, float32 and float64, one block and many; skipped without a GPU (the lead runs them on the H100)."""

import numpy as np
import pytest

from asp_gmm import GMM
from conftest import make_blobs

cuda_mod = pytest.importorskip("asp_gmm.backends.cuda")
REASON = cuda_mod.CudaBackend.unavailable_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=f"CUDA backend unavailable: {REASON}")]


def _fit(X, backend, cvtype, dtype, sample_weight=None, iters=5, seed=2):
    g = GMM(5, X.shape[1], cvtype=cvtype, dtype=dtype, backend=backend, seed=seed)
    ll = g.train(X.astype(dtype), min_em_iters=iters, max_em_iters=iters, tol=0, sample_weight=sample_weight)
    return g, ll


@pytest.mark.parametrize("cvtype", ["full", "diag"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("block_bytes", ["", "65536"])
def test_cuda_weighted_equals_reference(cvtype, dtype, block_bytes, rng, monkeypatch):
    N, D = 20011, 7
    X = make_blobs(rng, N, D, 5, offset=10.0)
    w = rng.uniform(0.0, 3.0, N)
    w[rng.random(N) < 0.1] = 0.0
    ref, lr = _fit(X, "numpy", cvtype, np.float64, w)  # the float64 reference, weighted
    if block_bytes:
        monkeypatch.setenv("ASP_GMM_BLOCK_BYTES", block_bytes)  # blocks of a few hundred events
    got, lg = _fit(X, "cuda", cvtype, dtype, w)
    assert got.last_variant.endswith("(weighted)"), got.last_variant
    tol = 1e-9 if dtype == np.float64 else 1e-4
    assert lg == pytest.approx(lr, rel=tol)
    for name in ("weights", "means", "covars"):
        a, b = getattr(got, name).astype(np.float64), getattr(ref, name)
        np.testing.assert_allclose(a, b, rtol=0, atol=tol * 10 * np.abs(b).max(), err_msg=name)


@pytest.mark.parametrize("cvtype", ["full", "diag"])
def test_cuda_integer_weights_equal_repeated_rows(cvtype, rng):
    X = make_blobs(rng, 5003, 6, 5)
    k = rng.integers(0, 4, len(X))
    k[:5] = 1
    # seeded at even intervals: the weighted rule picks the events the repetition puts there (a
    # random seed draws events with probability proportional to the weight, another draw)
    a, la = _fit(X, "cuda", cvtype, np.float64, k.astype(np.float64), seed=None)
    b, lb = _fit(np.repeat(X, k, axis=0), "cuda", cvtype, np.float64, seed=None)
    assert la == pytest.approx(lb, rel=1e-10)
    for name in ("weights", "means", "covars"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-9, atol=1e-10, err_msg=name)
