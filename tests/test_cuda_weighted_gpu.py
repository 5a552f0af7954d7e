"""The CUDA kernels take sample weights: an in-memory fit keeps them on the device beside its rows and
the session's own EM loop folds them into every E-step's posteriors and log-likelihood (the core's
``asp_weight_rows``, asp_gmm/backends/cuda/session.py); the pass loop sends each block's weights with
its rows (asp_gmm/backends/cuda/weighted.py). Block statistics of every covariance variant that takes weights against the float64
reference's weighted statistics, whole fits of the four covariance types against the float64
reference, integer weights against repeated rows, zero weights against dropped rows, X + 1000,
float32 and float64; skipped without a GPU (the lead runs them on the H100)."""

import numpy as np
import pytest

from asp_gmm import GMM
from asp_gmm.problem import Problem
from conftest import make_blobs

cuda_mod = pytest.importorskip("asp_gmm.backends.cuda")
REASON = cuda_mod.CudaBackend.unavailable_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=f"CUDA backend unavailable: {REASON}")]


@pytest.fixture(scope="module")
def cuda():
    from asp_gmm.backends import get_backend

    return get_backend("cuda")


def _params(X, M, cvtype):
    D = X.shape[1]
    var = X.astype(np.float64).var(0).mean()
    return (
        np.full(M, 1.0 / M),
        X[:: max(1, len(X) // M)][:M].astype(np.float64),
        np.repeat(np.eye(D)[None], M, 0) * var if cvtype == "full" else np.full((M, D), var),
    )


@pytest.mark.parametrize("cvtype", ["full", "diag"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_weighted_variant_equals_the_reference_block_statistics(cuda, rng, cvtype, dtype):
    """Each CUDA covariance variant that takes weights: the device-weighted statistics of blocks
    (odd sizes, a last block shorter than the first, X + 1000) equal the float64 reference's."""
    from asp_gmm.backends import get_backend
    from asp_gmm.backends.cuda.weighted import CudaWeightedStatsRunner

    ref = get_backend("numpy")
    N, D, M = 3001, 7, 5
    X = (make_blobs(rng, N, D, M) + 1000.0).astype(dtype)
    w = rng.uniform(0.0, 4.0, N)
    w[::7] = 0.0
    params = _params(X, M, cvtype)
    p = Problem(2048, D, M, cvtype, dtype)
    tol = 1e-10 if dtype == "float64" else 2e-5
    cuts = [(0, 2048), (2048, N)]
    want = ref.open_weighted_stats(p)
    want.set_params(*params, 1e-6)
    expect = [want.stats_weighted(X[a:b], w[a:b]) for a, b in cuts]
    tried = 0
    for v in cuda.covariance_variants(p):
        tun = cuda.tunables_for(v, p)
        if not v.takes_weights or tun is None:
            continue
        runner = cuda.open_weighted_stats(p, cuda.kernel(v, tun, p))
        assert isinstance(runner, CudaWeightedStatsRunner), v.name
        tried += 1
        try:
            for _ in range(2):  # a second pass, as EM runs them
                runner.set_params(*params, 1e-6)
                got = list(runner.stats_weighted_many((X[a:b], w[a:b]) for a, b in cuts))
                for g, e, (a, b) in zip(got, expect, cuts):
                    assert g.n == pytest.approx(w[a:b].sum(), rel=1e-12)
                    assert g.loglik == pytest.approx(e.loglik, rel=tol), v.name
                    np.testing.assert_allclose(g.nk, e.nk, rtol=tol, atol=tol * e.nk.max(), err_msg=v.name)
                    np.testing.assert_allclose(
                        g.sumx, e.sumx, rtol=tol, atol=tol * np.abs(e.sumx).max(), err_msg=v.name
                    )
                    # covariances (second moments per unit of weight) to ~1e-5 relative in float32
                    cg = g.s2 / g.nk.reshape((-1,) + (1,) * (g.s2.ndim - 1))
                    ce = e.s2 / e.nk.reshape((-1,) + (1,) * (e.s2.ndim - 1))
                    np.testing.assert_allclose(cg, ce, rtol=tol, atol=tol * np.abs(ce).max(), err_msg=v.name)
        finally:
            runner.close()
    assert tried >= 2


def _fit(X, backend, cvtype, dtype, sample_weight=None, iters=5, seed=None, M=5):
    g = GMM(M, X.shape[1], cvtype=cvtype, dtype=dtype, backend=backend, seed=seed)
    ll = g.train(X.astype(dtype), min_em_iters=iters, max_em_iters=iters, tol=0, sample_weight=sample_weight)
    return g, ll


def _close(a, b, tol, what=""):
    for name in ("weights", "means", "covars"):
        x, y = getattr(a, name).astype(np.float64), getattr(b, name).astype(np.float64)
        np.testing.assert_allclose(x, y, rtol=tol, atol=tol * np.abs(y).max(), err_msg=f"{what} {name}")


@pytest.mark.parametrize("cvtype", ["full", "tied", "diag", "spherical"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("blocks", ["one", "many", "stream"])
def test_cuda_weighted_fit_equals_the_float64_reference(cvtype, dtype, blocks, rng, monkeypatch):
    """X + 1000, zero weights included: in memory, in the session's own loop; in memory through the
    pass loop with blocks of a few hundred events kept on the device (the backend told its sessions
    take no weights); or blocks streamed from a callable source (the reference reads the same
    source, in float64)."""
    N, D = 20011, 7
    # the reference trains on the same values (X rounded to the working precision), in float64
    X = (make_blobs(rng, N, D, 5, offset=10.0) + 1000.0).astype(dtype).astype(np.float64)
    w = rng.uniform(0.0, 3.0, N)
    w[rng.random(N) < 0.1] = 0.0
    if blocks != "one":
        monkeypatch.setenv("ASP_GMM_BLOCK_BYTES", "65536")
    if blocks == "many":
        monkeypatch.setattr(cuda_mod.CudaBackend, "weights_in_session", False)
    if blocks == "stream":
        data = lambda: (X[a : a + 997].astype(dtype) for a in range(0, N, 997))  # noqa: E731
        ref_data = lambda: (X[a : a + 997] for a in range(0, N, 997))  # noqa: E731
    else:
        data, ref_data = X.astype(dtype), X
    ref = GMM(5, D, cvtype=cvtype, dtype=np.float64, backend="numpy", seed=2)
    lr = ref.train(ref_data, min_em_iters=5, max_em_iters=5, tol=0, sample_weight=w)
    g = GMM(5, D, cvtype=cvtype, dtype=dtype, backend="cuda", seed=2)
    lg = g.train(data, min_em_iters=5, max_em_iters=5, tol=0, sample_weight=w)
    assert g.last_variant.endswith("(weighted)" if blocks == "one" else "(weighted passes)"), g.last_variant
    assert not g.last_variant.startswith(("V7", "V9")), g.last_variant  # variants that take no weights
    tol = 1e-9 if dtype == np.float64 else max(1e-4, _float32_sensitivity(X, w, cvtype, ref))
    assert lg == pytest.approx(lr, rel=tol)
    _close(g, ref, tol, cvtype)


def _float32_sensitivity(X, w, cvtype, ref):
    """How far rounding of float32 size moves this fit: the float64 reference fit again on X with
    every value moved by one float32 unit in the last place (up or down at random; twice), its
    largest difference from the reference relative to each parameter's scale. At X + 1000 that is
    the error of float32's x - mean, so a float32 fit cannot be held closer. Five EM iterations
    amplify it where a component boundary runs through the data: most draws move 1e-4 or less, a
    spherical model of elongated blobs up to 2e-3 (the C backend's float32 fit, unweighted fits
    too, moving as far). The test data must leave a bug visible: below 1e-2."""
    out = 0.0
    for k in range(2):
        step = np.spacing(X.astype(np.float32)).astype(np.float64)
        Xp = X + np.random.default_rng(k).choice([-1.0, 1.0], X.shape) * step
        p = GMM(5, ref.D, cvtype=cvtype, dtype=np.float64, backend="numpy", seed=2)
        p.train(Xp, min_em_iters=5, max_em_iters=5, tol=0, sample_weight=w)
        out = max(
            [out]
            + [
                np.max(np.abs(getattr(p, n) - getattr(ref, n))) / np.abs(getattr(ref, n)).max()
                for n in ("weights", "means", "covars")
            ]
        )
    assert out < 1e-2, f"the test's data is too ill-conditioned for a float32 comparison ({out:.2g})"
    return out


@pytest.mark.parametrize("cvtype", ["full", "tied", "diag", "spherical"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cuda_integer_weights_equal_repeated_rows_and_zero_weights_dropped_rows(cvtype, dtype, rng):
    X = make_blobs(rng, 5003, 6, 5) + 1000.0
    k = rng.integers(0, 4, len(X))
    k[:5] = 1
    # seeded at even intervals: the weighted rule picks the events the repetition puts there
    a, la = _fit(X, "cuda", cvtype, dtype, k.astype(np.float64))
    b, lb = _fit(np.repeat(X, k, axis=0), "cuda", cvtype, dtype)
    tol = 1e-10 if dtype == np.float64 else 2e-5
    assert la == pytest.approx(lb, rel=tol)
    _close(a, b, 10 * tol, "repeated")
    keep = k > 0
    c, lc = _fit(X, "cuda", cvtype, dtype, keep.astype(np.float64))
    d, ld = _fit(X[keep], "cuda", cvtype, dtype)
    assert lc == pytest.approx(ld, rel=tol)
    _close(c, d, 10 * tol, "dropped")


def test_a_pinned_variant_without_weights_folds_them_on_the_host(cuda, rng):
    """V7 fuses the M-step sums into its E-step: pinned on a weighted fit it gets the default runner
    (the posteriors read back, the weights folded in float64) and the same answer."""
    from asp_gmm import registry
    from asp_gmm.backends.base import StatsRunner

    v = registry.get("cuda", "V7", "covariance")
    assert not v.takes_weights
    X = (make_blobs(rng, 8000, 6, 4) + 1000.0).astype(np.float32)
    w = rng.uniform(0.0, 2.0, len(X))
    p = Problem(len(X), 6, 4, "diag", "float32")
    tun = cuda.tunables_for(v, p)
    if tun is None:
        pytest.skip("V7 cannot run this problem here")
    runner = cuda.open_weighted_stats(p, cuda.kernel(v, tun, p))
    try:
        assert type(runner) is StatsRunner
    finally:
        runner.close()
    g = GMM(4, 6, cvtype="diag", dtype=np.float32, backend="cuda", seed=1, variant="V7")
    lg = g.train(X, min_em_iters=4, max_em_iters=4, tol=0, sample_weight=w)
    assert g.last_variant.startswith("V7")
    h = GMM(4, 6, cvtype="diag", dtype=np.float32, backend="cuda", seed=1)
    lh = h.train(X, min_em_iters=4, max_em_iters=4, tol=0, sample_weight=w)
    assert lg == pytest.approx(lh, rel=2e-5)
    _close(g, h, 2e-4, "V7")


@pytest.mark.parametrize("cvtype", ["full", "diag"])
def test_the_weighted_session_stops_where_the_reference_does(cvtype, rng):
    """tol > 0: the session's loop takes the change of the log-likelihood per unit of weight (not per
    event), so it stops after as many iterations as the float64 reference's weighted pass loop; the
    result reports the weight sum and the weighted log-likelihood."""
    X = make_blobs(rng, 6007, 5, 4, offset=6.0)
    w = rng.uniform(0.0, 10.0, len(X))  # a weight sum far from N: a per-event rule stops elsewhere
    ref = GMM(4, 5, cvtype=cvtype, dtype=np.float64, backend="numpy", seed=3)
    lr = ref.train(X, min_em_iters=1, max_em_iters=200, tol=1e-7, sample_weight=w)
    g = GMM(4, 5, cvtype=cvtype, dtype=np.float64, backend="cuda", seed=3)
    lg = g.train(X, min_em_iters=1, max_em_iters=200, tol=1e-7, sample_weight=w)
    assert g.last_variant.endswith("(weighted)"), g.last_variant
    assert 2 < ref.n_iter < 200 and g.n_iter == ref.n_iter
    assert lg == pytest.approx(lr, rel=1e-9)
    _close(g, ref, 1e-8, cvtype)


def test_nan_in_a_weighted_block_is_named_by_its_row(rng):
    X = make_blobs(rng, 3000, 5, 3).astype(np.float32)
    X[2345, 3] = np.nan
    g = GMM(3, 5, dtype=np.float32, backend="cuda", seed=1)
    with pytest.raises(Exception, match="2345"):
        g.train(X, min_em_iters=2, max_em_iters=2, tol=0, sample_weight=np.ones(len(X)))
