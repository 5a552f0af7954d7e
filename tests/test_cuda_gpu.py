"""The CUDA backend on a GPU: every covariance variant against the float64 reference on fresh random
data, the E-step outputs, end-to-end training against the C backend and scikit-learn, errors.

Skipped, with the reason, where pycuda or a GPU is missing (CI); scripts/gpu_check.sh runs it on the
GPU machine.
"""

import warnings

import numpy as np
import pytest

from asp_gmm import GMM, registry
from asp_gmm.errors import KernelError, NotPositiveDefiniteError
from asp_gmm.problem import Problem
from conftest import init_params as _init, make_blobs, reference_estep, session_vs_reference, train_vs_reference

cuda_mod = pytest.importorskip("asp_gmm.backends.cuda")
REASON = cuda_mod.CudaBackend.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"CUDA backend unavailable: {REASON}")

VARIANTS = [v.name for v in registry.variants("cuda", "covariance") if cuda_mod.pluggable(v)]
SHAPES = [  # (N, D, M): odd D, D = 1, M = 1, N not a multiple of any block size
    (1003, 7, 3),
    (517, 1, 4),
    (2000, 13, 1),
    (4099, 19, 16),
    (20_011, 33, 5),
    (3001, 5, 11),  # small: runs padded to 12 components (cuda.component_class)
    (2501, 9, 21),  # padded to 24
]
TOL = {"float32": dict(rtol=2e-4, atol=2e-4), "float64": dict(rtol=1e-9, atol=1e-9)}


def _compare(g, ll, r, dtype):
    tol = TOL[dtype]
    s = float(np.max(np.abs(r["covars"])))
    np.testing.assert_allclose(g.covars, r["covars"], rtol=tol["rtol"], atol=tol["atol"] * s)
    np.testing.assert_allclose(
        g.means, r["means"], rtol=tol["rtol"], atol=tol["atol"] * float(np.max(np.abs(r["means"])))
    )
    np.testing.assert_allclose(g.weights, r["weights"], rtol=tol["rtol"], atol=tol["atol"])
    assert ll == pytest.approx(r["loglik"], rel=tol["rtol"] * 10)


def _allowed(variant, N, D, M, cvtype, dtype):
    be = cuda_mod.CudaBackend()
    v = registry.get("cuda", variant, "covariance")
    return v.allows(Problem(N, D, M, cvtype, dtype), extra=be.limit_context())


@pytest.mark.parametrize("cvtype", ["full", "diag"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "N%d-D%d-M%d" % s)
@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_matches_reference(variant, shape, cvtype, rng):
    N, D, M = shape
    dtype = "float32"
    if not _allowed(variant, N, D, M, cvtype, dtype):
        pytest.skip(f"{variant} declares it cannot run {shape} {cvtype}")
    X = make_blobs(rng, N, D, M, dtype=dtype)
    g, ll, r = train_vs_reference(rng, X, M, cvtype, 2, dtype=dtype, backend="cuda", variant=variant)
    assert g.n_iter == 2 and g.last_variant.startswith(variant)
    _compare(g, ll, r, dtype)
    logprob, post = g.eval(X)
    rlp, rpost = reference_estep(g, X)
    np.testing.assert_allclose(logprob, rlp, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(post, rpost, atol=1e-3)


TUNED = [
    ("V3", {"tile": 2}),
    ("V3", {"threads": 512}),
    ("V4", {"tile": 2}),
    ("V4", {"tile": 2, "threads": 128}),
    ("V4", {"blocks": 528, "tile": 2}),
    ("V4", {"blocks": 132, "threads": 128}),
]


@pytest.mark.parametrize(
    "shape",
    [(4099, 19, 16), (20_011, 33, 5), (3001, 64, 2), (2000, 1, 1), (1500, 71, 2)],
    ids=lambda s: "N%d-D%d-M%d" % s,
)
@pytest.mark.parametrize("variant,tunables", TUNED, ids=lambda t: str(t))
def test_tunables_match_reference(variant, tunables, shape, rng):
    """Non-default tunables (2 x 2 cell tiles, other thread counts and B) through the session API."""
    N, D, M = shape
    be = cuda_mod.CudaBackend()
    v = registry.get("cuda", variant, "covariance")
    if not v.allows(Problem(N, D, M, "full", "float32"), tunables, extra=be.limit_context()):
        pytest.skip("declared limit")
    X = make_blobs(rng, N, D, M, dtype=np.float32)
    (weights, means, covars), run, r = session_vs_reference(rng, X, M, "full", variant, tunables)

    class G:  # the attributes _compare reads
        pass

    g = G()
    g.weights, g.means, g.covars = weights, means, covars
    _compare(g, run.loglik, r, "float32")


ESTEPS = [v.name for v in registry.variants("cuda", "estep") if cuda_mod.pluggable(v)]


@pytest.mark.parametrize("cvtype", ["full", "diag"])
@pytest.mark.parametrize(
    "shape",
    [(1003, 7, 3), (4099, 19, 16), (20_011, 33, 5), (3001, 64, 2), (2000, 1, 1)],
    ids=lambda s: "N%d-D%d-M%d" % s,
)
@pytest.mark.parametrize("estep", ESTEPS)
def test_estep_variant_matches_reference(estep, shape, cvtype, rng, monkeypatch):
    """Each E-step variant (pinned) inside the whole EM loop, and its outputs, against the reference."""
    N, D, M = shape
    v = registry.get("cuda", estep, "estep")
    if not any(
        v.allows(Problem(N, D, M, cvtype, "float32"), t, extra=cuda_mod._DEFAULT_LIMITS) for t in v.tunable_space()
    ):
        pytest.skip(f"{estep} declares it cannot run {shape} {cvtype}")
    monkeypatch.setenv("ASP_GMM_CUDA_ESTEP", estep)
    X = make_blobs(rng, N, D, M, dtype=np.float32)
    g, ll, r = train_vs_reference(rng, X, M, cvtype, 2, dtype="float32", backend="cuda", variant="V4")
    _compare(g, ll, r, "float32")
    logprob, post = g.eval(X)
    rlp, rpost = reference_estep(g, X)
    np.testing.assert_allclose(logprob, rlp, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(post, rpost, atol=1e-3)


@pytest.mark.parametrize("cvtype", ["full", "diag"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_float64(variant, cvtype, rng):
    N, D, M = 3001, 9, 4
    if not _allowed(variant, N, D, M, cvtype, "float64"):
        pytest.skip(f"{variant} declares it cannot run float64")
    X = make_blobs(rng, N, D, M, dtype=np.float64)
    g, ll, r = train_vs_reference(rng, X, M, cvtype, 2, dtype=np.float64, backend="cuda", variant=variant)
    _compare(g, ll, r, "float64")


@pytest.mark.parametrize("cvtype", ["full", "diag"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_one_million_events(variant, cvtype, rng):
    """N = 1 000 000: long reductions keep float32 accuracy; the grid is not a multiple of N."""
    N, D, M = 1_000_000, 5, 3
    if not _allowed(variant, N, D, M, cvtype, "float32"):
        pytest.skip(f"{variant} declares it cannot run N=1e6, D=5, M=3 {cvtype}")
    X = make_blobs(rng, N, D, M, dtype=np.float32)
    g, ll, r = train_vs_reference(rng, X, M, cvtype, 1, dtype=np.float32, backend="cuda", variant=variant)
    _compare(g, ll, r, "float32")


@pytest.mark.parametrize("variant", VARIANTS)
def test_large_offset_and_large_d(variant, rng):
    """D = 71 (cells tiled, Cholesky in global memory, E-step operands in shared memory) and data far
    from the origin: covariances are centred on the means, so float32 keeps them."""
    N, D, M = 6007, 71, 3
    if not _allowed(variant, N, D, M, "full", "float32"):
        pytest.skip("declared limit")
    X = make_blobs(rng, N, D, M, offset=100.0, dtype=np.float32)
    g, ll, r = train_vs_reference(rng, X, M, "full", 1, dtype=np.float32, backend="cuda", variant=variant)
    s = float(np.max(np.abs(r["covars"])))
    np.testing.assert_allclose(g.covars, r["covars"], rtol=1e-3, atol=1e-3 * s)
    assert ll == pytest.approx(r["loglik"], rel=1e-3)


@pytest.mark.parametrize("cvtype", ["full", "diag"])
def test_train_agrees_with_c_and_sklearn(cvtype, rng):
    sk = pytest.importorskip("sklearn.mixture")
    N, D, M, iters = 20_000, 6, 4, 5
    X = make_blobs(rng, N, D, M, dtype=np.float32)
    means = X[rng.choice(N, M, replace=False)].astype(np.float64)
    cov = np.cov(X.T.astype(np.float64)) + 0.1 * np.eye(D)
    covars = np.repeat(cov[None], M, 0) if cvtype == "full" else np.repeat(np.diag(cov)[None], M, 0)
    w = np.full(M, 1 / M)
    results = {}
    for backend in ("cuda", "c"):
        g = GMM(M, D, means=means, covars=covars, weights=w, cvtype=cvtype, dtype=np.float32, backend=backend)
        ll = g.train(X, min_em_iters=iters, max_em_iters=iters, tol=0.0)
        results[backend] = (ll, g.means.copy(), g.covars.copy(), g.weights.copy())
    prec = np.linalg.inv(covars) if cvtype == "full" else 1 / covars
    m = sk.GaussianMixture(
        M,
        covariance_type=cvtype,
        max_iter=iters,
        tol=0.0,
        reg_covar=1e-6,
        weights_init=w,
        means_init=means,
        precisions_init=prec,
        init_params="random",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m.fit(X.astype(np.float64))
    for name, (ll, mu, cv, wt) in results.items():
        np.testing.assert_allclose(mu, m.means_, rtol=1e-3, atol=1e-3, err_msg=name)
        np.testing.assert_allclose(cv, m.covariances_, rtol=1e-3, atol=1e-3, err_msg=name)
        np.testing.assert_allclose(wt, m.weights_, rtol=1e-3, atol=1e-4, err_msg=name)
        assert ll == pytest.approx(m.score(X.astype(np.float64)) * N, rel=1e-4), name
    assert results["cuda"][0] == pytest.approx(results["c"][0], rel=1e-5)


def test_loglik_trace(rng):
    """EMRun.loglik_trace: the log-likelihood before the first iteration and after each one."""
    X = make_blobs(rng, 3000, 4, 3, dtype=np.float32)
    w, mu, cv = _init(rng, X, 3, "full")
    be = cuda_mod.CudaBackend()
    p = Problem(3000, 4, 3, "full", "float32")
    s = be.open(X, p)
    try:
        s.set_params(w, mu, cv, 1e-6)
        ll0 = s.loglik()
        run = s.em(
            be.kernel(registry.get("cuda", "V4", "covariance"), None, p),
            min_iters=3,
            max_iters=3,
            tol=0.0,
            reg_covar=1e-6,
        )
    finally:
        s.close()
    assert len(run.loglik_trace) == run.iters + 1 == 4
    assert run.loglik_trace[0] == pytest.approx(ll0) and run.loglik_trace[-1] == pytest.approx(run.loglik)
    assert all(b >= a - 1e-3 * abs(a) for a, b in zip(run.loglik_trace, run.loglik_trace[1:]))


def test_auto_picks_cuda():
    from asp_gmm.backends import get_backend

    assert get_backend("auto").name == "cuda"


def test_singular_covariance_raises(rng):
    X = make_blobs(rng, 500, 3, 2, dtype=np.float32)
    be = cuda_mod.CudaBackend()
    s = be.open(X, Problem(500, 3, 2, "full", "float32"))
    try:
        cv = np.repeat(np.eye(3)[None], 2, 0)
        cv[1] = 0.0
        with pytest.raises(NotPositiveDefiniteError) as ei:
            s.set_params(np.full(2, 0.5), X[:2].astype(np.float64), cv, 1e-6)
        assert ei.value.component == 1
    finally:
        s.close()


def test_launch_error_names_kernel_and_configuration(rng):
    X = make_blobs(rng, 500, 3, 2, dtype=np.float32)
    be = cuda_mod.CudaBackend()
    s = be.open(X, Problem(500, 3, 2, "full", "float32"))
    try:
        with s.dev.active(), pytest.raises(KernelError) as ei:
            s._launch("asp_reset", s._fn["asp_reset"], (1, 1), (4096, 1, 1), int(s.buf.stat))
            s._sync()
        assert "asp_reset" in str(ei.value) and "4096" in str(ei.value)
    finally:
        s.close()


def test_immutable_data_is_uploaded_once_for_every_m(rng):
    """An immutable data set (asp_gmm.freeze) stays on the device and serves sessions of any M (the
    diarization example scores all frames under every cluster's model)."""
    import asp_gmm

    X = asp_gmm.freeze(make_blobs(rng, 5000, 4, 2, dtype=np.float32))
    be = cuda_mod.CudaBackend()
    ptrs = []
    for M in (2, 3, 11):
        s = be.open(X, Problem(5000, 4, M, "full", "float32"))
        ptrs.append(int(s.xt))
        s.close()
    assert len(set(ptrs)) == 1
    Y = np.array(X)  # writeable: uploaded into the session's own buffer
    s = be.open(Y, Problem(5000, 4, 2, "full", "float32"))
    try:
        assert int(s.xt) != ptrs[0]
    finally:
        s.close()


def test_read_only_data_its_owner_can_change_is_never_stale(rng):
    """Read-only data whose owner can make it writeable again is uploaded on every call: a score
    after its owner changed it and froze it again sees the new values, and a NaN written so is
    named, not hidden."""
    X = make_blobs(rng, 3000, 3, 2, dtype=np.float32)
    X.flags.writeable = False
    g = GMM(2, 3, backend="cuda", seed=0)
    g.train(X, max_em_iters=2)
    before = g.score(X)
    X.flags.writeable = True
    X[:] = X[::-1].copy()
    X.flags.writeable = False
    np.testing.assert_allclose(g.score(X), before[::-1], rtol=1e-5, atol=1e-4)
    X.flags.writeable = True
    X[5, 1] = np.nan
    X.flags.writeable = False
    with pytest.raises(ValueError, match=r"NaN or infinity \(first at row 5, column 1\).*score\(\)"):
        g.score(X)


@pytest.mark.parametrize("cvtype", ["full", "diag"])
def test_pooled_buffers_and_padding_over_varying_n_and_m(cvtype, rng):
    """Calls of decreasing N reuse larger pooled buffers (stale posteriors beyond N must not leak
    into the sums) and M that is not a component class runs padded: every result matches the
    reference, weights of the live components sum to 1 and no padding shows."""
    D = 6
    for N, M in ((9000, 7), (8800, 7), (6000, 10), (5900, 9), (8000, 13), (7900, 13)):
        X = make_blobs(rng, N, D, M, dtype=np.float32)
        if N % 2:
            X.flags.writeable = False
        g, ll, r = train_vs_reference(rng, X, M, cvtype, 2, backend="cuda")
        assert g.weights.shape == (M,) and g.means.shape == (M, D)
        assert g.weights.sum() == pytest.approx(1.0, abs=1e-5)
        _compare(g, ll, r, "float32")
        logprob, post = g.eval(X)
        assert post.shape == (N, M)
        np.testing.assert_allclose(post.sum(axis=1), 1.0, atol=1e-4)
