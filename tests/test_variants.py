"""Every registered CPU variant against the float64 reference, on fresh random data and odd shapes."""

import numpy as np
import pytest

from asp_gmm import GMM, registry
from asp_gmm import reference as ref
from conftest import init_params as _init, make_blobs, reference_estep, train_vs_reference

CPU_VARIANTS = [v.name for v in registry.variants("c", "covariance")]
SHAPES = [  # (N, D, M): odd D, D = 1, M = 1, N smaller than a tile, N not a multiple of a tile
    (1003, 7, 3),
    (517, 1, 4),
    (5, 3, 2),
    (2000, 13, 1),
    (4099, 19, 16),
]
TOL = {"float32": dict(rtol=1e-4, atol=1e-4), "float64": dict(rtol=1e-10, atol=1e-10)}


def _skip_unless_declared(variant, cvtype, dtype):
    v = registry.get("c", variant, "covariance")
    if cvtype not in v.cvtypes or dtype not in v.dtypes:
        pytest.skip(f"{variant} does not implement {cvtype} covariance in {dtype}")


def _scale(a):
    return float(np.max(np.abs(a)))


def _compare(g, ll, r, dtype):
    tol = TOL[dtype]
    s = _scale(r["covars"])
    np.testing.assert_allclose(g.covars, r["covars"], rtol=tol["rtol"], atol=tol["atol"] * s)
    np.testing.assert_allclose(g.means, r["means"], rtol=tol["rtol"], atol=tol["atol"] * _scale(r["means"]))
    np.testing.assert_allclose(g.weights, r["weights"], rtol=tol["rtol"], atol=tol["atol"])
    # a total over few events can nearly cancel: allow rounding per event as well as relative
    N = r["logprob"].shape[0]
    assert ll == pytest.approx(r["loglik"], rel=tol["rtol"] * (10 if dtype == "float32" else 1), abs=tol["atol"] * N)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cvtype", ["full", "diag"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "N%d-D%d-M%d" % s)
@pytest.mark.parametrize("variant", CPU_VARIANTS)
def test_variant_matches_reference(variant, shape, cvtype, dtype, rng):
    _skip_unless_declared(variant, cvtype, dtype)
    N, D, M = shape
    X = make_blobs(rng, N, D, M, dtype=dtype)
    g, ll, r = train_vs_reference(rng, X, M, cvtype, 2, dtype=dtype, backend="c", variant=variant)
    assert g.n_iter == 2 and g.last_variant.startswith(variant)
    _compare(g, ll, r, dtype)
    # the E-step outputs too
    logprob, post = g.eval(X)
    rlp, rpost = reference_estep(g, X)
    tol = TOL[dtype]
    np.testing.assert_allclose(logprob, rlp, rtol=tol["rtol"] * 10, atol=tol["atol"] * 10)
    np.testing.assert_allclose(post, rpost, atol=tol["atol"] * 10)


@pytest.mark.parametrize("cvtype", ["full", "diag"])
@pytest.mark.parametrize("variant", CPU_VARIANTS)
def test_variant_large_n(variant, cvtype, rng):
    """N = 200 000: the reduction over many tiles keeps float32 accuracy."""
    _skip_unless_declared(variant, cvtype, "float32")
    N, D, M = 200_000, 5, 3
    X = make_blobs(rng, N, D, M, dtype=np.float32)
    g, ll, r = train_vs_reference(rng, X, M, cvtype, 1, dtype=np.float32, backend="c", variant=variant)
    _compare(g, ll, r, "float32")


@pytest.mark.parametrize("variant", CPU_VARIANTS)
def test_large_offset_keeps_covariance(variant, rng):
    """Data far from the origin (X + 1000): covariances are centred on the means, so float32 keeps
    them; a one-pass sum of squares would lose every digit here."""
    N, D, M = 20_000, 6, 2
    cvtype = "full" if "full" in registry.get("c", variant, "covariance").cvtypes else "diag"
    _skip_unless_declared(variant, cvtype, "float32")
    X = make_blobs(rng, N, D, M, offset=1000.0, dtype=np.float32)
    g, _, r = train_vs_reference(rng, X, M, cvtype, 1, dtype=np.float32, backend="c", variant=variant)
    np.testing.assert_allclose(g.covars, r["covars"], rtol=2e-3, atol=2e-3 * _scale(r["covars"]))


def test_numpy_backend_is_the_reference(rng):
    N, D, M = 700, 4, 3
    X = make_blobs(rng, N, D, M)
    g, ll, r = train_vs_reference(rng, X, M, "full", 3, dtype=np.float64, backend="numpy")
    assert ll == pytest.approx(r["loglik"], rel=1e-12)
    np.testing.assert_allclose(g.covars, r["covars"], rtol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("variant", [v.name for v in registry.variants("c", "covariance") if "diag" in v.cvtypes])
def test_large_offset_diag(variant, dtype, rng):
    """Diagonal covariances of data far from the origin (X + 1000), in both precisions: the
    diagonal-only variants must centre on the means as the others do."""
    _skip_unless_declared(variant, "diag", dtype)
    N, D, M = 20_000, 7, 3
    X = make_blobs(rng, N, D, M, offset=1000.0, dtype=dtype)
    g, _, r = train_vs_reference(rng, X, M, "diag", 2, dtype=dtype, backend="c", variant=variant)
    rtol = 2e-3 if dtype == "float32" else 1e-8
    np.testing.assert_allclose(g.covars, r["covars"], rtol=rtol, atol=rtol * _scale(r["covars"]))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "shape", [(1003, 7, 3), (517, 1, 4), (5, 3, 2), (4099, 19, 16)], ids=lambda s: "N%d-D%d-M%d" % s
)
def test_vd_every_tunable_combination(shape, dtype, rng):
    """Every tunable combination of the diagonal variant VD (register blocks of 2, 4 and 6 dimensions
    against odd D, more event blocks than tiles) gives the reference's covariance sums."""
    from asp_gmm.backends import get_backend
    from asp_gmm.problem import Problem

    N, D, M = shape
    X = make_blobs(rng, N, D, M, dtype=dtype)
    w, mu, cv = _init(rng, X, M, "diag")
    r = ref.em(X.astype(np.float64), w, mu, cv, "diag", 1e-6, 1, 1, 0.0)
    be, v = get_backend("c"), registry.get("c", "VD", "covariance")
    prob = Problem(N, D, M, "diag", dtype)
    for tun in v.tunable_space():
        with be.open(X, prob) as s:
            s.set_params(w, mu, cv, 1e-6)
            s.em(be.kernel(v, tun, prob), min_iters=1, max_iters=1, tol=0.0, reg_covar=1e-6)
            _, _, covars = s.params()
        tol = TOL[dtype]
        np.testing.assert_allclose(
            covars, r["covars"], rtol=tol["rtol"], atol=tol["atol"] * _scale(r["covars"]), err_msg=str(tun)
        )


def test_switching_between_moment_and_posterior_variants(rng):
    """One session alternating VF (reads the E-step's moments, leaves the posteriors unwritten) with
    variants that read the posteriors (as exploration does) gives a pure VD run's parameters, and
    eval() afterwards returns the posteriors of the final parameters."""
    from asp_gmm.backends import get_backend
    from asp_gmm.problem import Problem

    N, D, M = 3001, 7, 4
    X = make_blobs(rng, N, D, M, dtype=np.float64)
    w, mu, cv = _init(rng, X, M, "diag")
    be, prob = get_backend("c"), Problem(N, D, M, "diag", "float64")
    k = {n: be.kernel(registry.get("c", n, "covariance"), None, prob) for n in ("VD", "VF", "V4", "BLAS")}
    with be.open(X, prob) as s:
        s.set_params(w, mu, cv, 1e-6)
        for name in ("VF", "V4", "VF", "BLAS", "VF", "VD"):
            s.em(k[name], min_iters=1, max_iters=1, tol=0.0, reg_covar=1e-6)
        s.em(k["VF"], min_iters=1, max_iters=1, tol=0.0, reg_covar=1e-6)
        mixed, ll = s.params(), s.loglik()
        logprob, post = s.eval()
    r = ref.em(X, w, mu, cv, "diag", 1e-6, 7, 7, 0.0)
    tol = TOL["float64"]
    np.testing.assert_allclose(mixed[2], r["covars"], rtol=tol["rtol"], atol=tol["atol"] * _scale(r["covars"]))
    np.testing.assert_allclose(mixed[1], r["means"], rtol=tol["rtol"], atol=tol["atol"] * _scale(r["means"]))
    assert ll == pytest.approx(r["loglik"], rel=tol["rtol"])
    rlp, rpost = ref.estep(X, *mixed, "diag")
    np.testing.assert_allclose(logprob, rlp, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(post, rpost, atol=1e-9)


@pytest.mark.parametrize("sigma", [1e-1, 1e-3, 1e-4])
def test_moments_variant_keeps_accuracy_when_means_move_far(sigma, rng):
    """VF's sums around the previous means cancel when a mean moves by many standard deviations
    (here 4 / sigma of them, on X + 1000); past its limit the core redoes the step in two passes,
    so one iteration still matches the reference as the two-pass variants do (without that,
    sigma = 1e-4 loses six digits)."""
    N, D, M = 4000, 3, 2
    lab = rng.integers(0, 2, N)
    X = np.where(lab[:, None] == 0, -5.0, 5.0) + sigma * rng.standard_normal((N, D)) + 1000.0
    mu, cv, w = np.array([[999.0] * D, [1001.0] * D]), np.ones((M, D)), np.full(M, 0.5)
    r = ref.em(X, w, mu, cv, "diag", 1e-12, 1, 1, 0.0)
    g = GMM(
        M,
        D,
        means=mu,
        covars=cv,
        weights=w,
        cvtype="diag",
        dtype=np.float64,
        backend="c",
        variant="VF",
        reg_covar=1e-12,
    )
    g.train(X, 1, 1, 0.0)
    np.testing.assert_allclose(g.covars, r["covars"], rtol=1e-10)
    np.testing.assert_allclose(g.means, r["means"], rtol=1e-12)
