"""The tied and spherical covariance types on the compiled backends: every C variant that declares them
(and every CUDA variant, on a GPU) against the float64 reference on fresh random data with odd sizes
and offsets, the PyCASP-style GMM and the scikit-learn drop-in routing them to the specializer.

"tied" runs the full kernels with one shared precision factor (C: the E-step projects each tile once;
the M-step takes the pooled scatter around the data's mean from VT), "spherical" the diagonal kernels
with one variance per component. GPU tests skip, with the reason, where pycuda or a GPU is missing.
"""

import warnings

import numpy as np
import pytest

from asp_gmm import GMM, registry
from asp_gmm import reference as ref
from asp_gmm.problem import Problem
from conftest import init_params, make_blobs, reference_estep, train_vs_reference

TYPES = ["tied", "spherical"]
C_VARIANTS = [v.name for v in registry.variants("c", "covariance") if set(TYPES) & set(v.cvtypes)]
SHAPES = [(1003, 7, 3), (517, 1, 4), (5, 3, 2), (2000, 13, 1), (4099, 19, 16)]
TOL = {"float32": dict(rtol=1e-4, atol=1e-4), "float64": dict(rtol=1e-10, atol=1e-10)}


def _declared(backend, variant, cvtype, dtype):
    v = registry.get(backend, variant, "covariance")
    if cvtype not in v.cvtypes or dtype not in v.dtypes:
        pytest.skip(f"{variant} does not implement {cvtype} covariance in {dtype}")


def _compare(g, ll, r, dtype, rtol=None):
    tol = dict(TOL[dtype])
    if rtol is not None:
        tol = dict(rtol=rtol, atol=rtol)
    s = float(np.max(np.abs(r["covars"])))
    np.testing.assert_allclose(g.covars, r["covars"], rtol=tol["rtol"], atol=tol["atol"] * s)
    np.testing.assert_allclose(
        g.means, r["means"], rtol=tol["rtol"], atol=tol["atol"] * float(np.max(np.abs(r["means"])))
    )
    np.testing.assert_allclose(g.weights, r["weights"], rtol=tol["rtol"], atol=tol["atol"])
    N = r["logprob"].shape[0]
    assert ll == pytest.approx(r["loglik"], rel=tol["rtol"] * (10 if dtype == "float32" else 1), abs=tol["atol"] * N)


def test_problem_shapes_and_kernel_family():
    assert Problem(10, 3, 4, "tied").covars_shape() == (3, 3)
    assert Problem(10, 3, 4, "spherical").covars_shape() == (4,)
    assert Problem(10, 3, 4, "tied").as_dict()["cvtype"] == "full"
    assert Problem(10, 3, 4, "spherical").as_dict()["cvtype"] == "diag"
    assert Problem(10, 3, 4, "spherical").as_dict()["cov_kind"] == "spherical"
    assert Problem(10, 3, 4, "tied").cells == 6 and Problem(10, 3, 4, "spherical").cells == 3


def test_per_component_round_trip(rng):
    """How the kernels hold the two types (every component a copy of the tied matrix, every dimension
    a copy of the spherical variance: the CUDA session and the streamed statistics) and back."""
    from asp_gmm.problem import as_cvtype, per_component

    tied, sph = rng.standard_normal((3, 3)), rng.uniform(1, 2, 4)
    assert per_component(tied, "tied", 4, 3).shape == (4, 3, 3)
    assert per_component(sph, "spherical", 4, 3).shape == (4, 3)
    np.testing.assert_array_equal(as_cvtype(per_component(tied, "tied", 4, 3), "tied"), tied)
    np.testing.assert_array_equal(as_cvtype(per_component(sph, "spherical", 4, 3), "spherical"), sph)


def test_every_type_has_a_c_variant():
    for cvtype in TYPES:
        assert any(cvtype in v.cvtypes for v in registry.variants("c", "covariance")), cvtype
    assert registry.get("c", "VT", "covariance").cvtypes == ("tied",)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cvtype", TYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "N%d-D%d-M%d" % s)
@pytest.mark.parametrize("variant", C_VARIANTS)
def test_c_variant_matches_reference(variant, shape, cvtype, dtype, rng):
    _declared("c", variant, cvtype, dtype)
    N, D, M = shape
    X = make_blobs(rng, N, D, M, dtype=dtype)
    g, ll, r = train_vs_reference(rng, X, M, cvtype, 2, dtype=dtype, backend="c", variant=variant)
    assert g.n_iter == 2 and g.last_variant.startswith(variant)
    assert g.covars.shape == Problem(N, D, M, cvtype).covars_shape()
    _compare(g, ll, r, dtype)
    logprob, post = g.eval(X)
    rlp, rpost = reference_estep(g, X)
    tol = TOL[dtype]
    np.testing.assert_allclose(logprob, rlp, rtol=tol["rtol"] * 10, atol=tol["atol"] * 10)
    np.testing.assert_allclose(post, rpost, atol=tol["atol"] * 10)


@pytest.mark.parametrize("dtype,offset,rtol", [("float32", 1000.0, 2e-3), ("float64", 1e6, 1e-8)])
@pytest.mark.parametrize("cvtype", TYPES)
@pytest.mark.parametrize("variant", C_VARIANTS)
def test_c_large_offset(variant, cvtype, dtype, offset, rtol, rng):
    """Data far from the origin: tied sums around the data's mean, spherical around the means, so the
    offset costs no digits (float64 X + 1e6 is itself only known to about 1e-10 of it: the events are
    multiples of 1.2e-10, and the covariances of unit scale keep 8 digits, a one-pass sum none)."""
    _declared("c", variant, cvtype, dtype)
    N, D, M = 20_011, 6, 3
    X = make_blobs(rng, N, D, M, offset=offset, dtype=dtype)
    g, ll, r = train_vs_reference(rng, X, M, cvtype, 2, dtype=dtype, backend="c", variant=variant)
    s = float(np.max(np.abs(r["covars"])))
    np.testing.assert_allclose(g.covars, r["covars"], rtol=rtol, atol=rtol * s)


@pytest.mark.parametrize("cvtype", TYPES)
def test_numpy_backend_is_the_reference(cvtype, rng):
    X = make_blobs(rng, 701, 4, 3)
    g, ll, r = train_vs_reference(rng, X, 3, cvtype, 3, dtype=np.float64, backend="numpy")
    assert ll == pytest.approx(r["loglik"], rel=1e-12)
    np.testing.assert_allclose(g.covars, r["covars"], rtol=1e-12)


@pytest.mark.parametrize("cvtype", TYPES)
def test_gmm_seeds_and_trains_every_type(cvtype, rng):
    X = make_blobs(rng, 3001, 5, 4, dtype=np.float32)
    g = GMM(4, 5, cvtype=cvtype, backend="c")
    g.train(X, max_em_iters=5)
    assert g.covars.shape == Problem(1, 5, 4, cvtype).covars_shape() and g.covars.dtype == np.float32
    assert np.all(np.isfinite(g.score(X)))
    with pytest.raises(ValueError, match="covars must have shape"):
        GMM(4, 5, cvtype=cvtype, covars=np.ones((4, 5, 5)))


def test_gmm_refuses_an_unknown_type():
    with pytest.raises(ValueError, match="'tied', 'spherical'"):
        GMM(2, 3, cvtype="banded")


def test_merging_tied_models_weights_their_matrices(rng):
    from asp_gmm import compute_distance_BIC

    X1, X2 = make_blobs(rng, 1500, 4, 2), make_blobs(rng, 900, 4, 2) + 5.0
    g1, g2 = GMM(2, 4, cvtype="tied", backend="c"), GMM(2, 4, cvtype="tied", backend="c")
    g1.train(X1.astype(np.float32))
    g2.train(X2.astype(np.float32))
    merged, _ = compute_distance_BIC(g1, g2, np.concatenate([X1, X2]).astype(np.float32), max_em_iters=0)
    want = (g1.covars.astype(np.float64) * g1.n_events + g2.covars * g2.n_events) / (g1.n_events + g2.n_events)
    np.testing.assert_allclose(merged.covars, want, rtol=1e-6)


@pytest.mark.parametrize("cvtype", TYPES)
def test_dropin_runs_the_specializer_and_agrees_with_sklearn(cvtype, rng):
    """The drop-in's tied and spherical fits run on the compiled backend (the C core, not NumPy) and
    reach scikit-learn's parameters from the same start."""
    sk = pytest.importorskip("sklearn.mixture")
    from asp_gmm import GaussianMixture

    X = make_blobs(rng, 3000, 6, 4)
    kw = dict(covariance_type=cvtype, random_state=2, init_params="random_from_data", max_iter=30, tol=1e-8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = GaussianMixture(4, backend="c", **kw).fit(X)
        theirs = sk.GaussianMixture(4, **kw).fit(X)
    assert "c" in ours._specializers
    assert ours.n_iter_ == theirs.n_iter_
    assert ours.lower_bound_ == pytest.approx(theirs.lower_bound_, rel=1e-8)
    np.testing.assert_allclose(ours.covariances_, theirs.covariances_, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(ours.predict_proba(X), theirs.predict_proba(X), atol=1e-6)


@pytest.mark.parametrize("cvtype", TYPES)
def test_partial_fit_uses_the_kernels_statistics(cvtype, rng):
    """partial_fit of the two types: the per-component statistics of the full and diagonal kernels,
    reduced in the M-step; the first batch's M-step equals the reference's."""
    from asp_gmm import GaussianMixture

    X = make_blobs(rng, 2003, 4, 3)
    w, mu, cv = init_params(rng, X, 3, cvtype)
    prec = ref.precisions_from_cholesky(ref.precision_cholesky(cv, cvtype, n_features=4)[0], cvtype)
    g = GaussianMixture(3, covariance_type=cvtype, backend="c", weights_init=w, means_init=mu, precisions_init=prec)
    g.partial_fit(X)
    r = ref.em(X, w, mu, cv, cvtype, 1e-6, 1, 1, 0.0)
    np.testing.assert_allclose(g.covariances_, r["covars"], rtol=1e-9)
    np.testing.assert_allclose(g.means_, r["means"], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("cvtype", TYPES)
def test_dask_fit_of_every_type(cvtype, rng):
    pytest.importorskip("dask.array")
    import dask
    import dask.array as da

    from asp_gmm import dask as adask

    X = make_blobs(rng, 2500, 5, 3)
    w, mu, cv = init_params(rng, X, 3, cvtype)
    with dask.config.set(scheduler="synchronous"):
        res = adask.fit(
            da.from_array(X, chunks=(613, 5)),
            3,
            weights=w,
            means=mu,
            covars=cv,
            cvtype=cvtype,
            dtype=np.float64,
            backend="c",
            min_iters=3,
            max_iters=3,
            tol=0.0,
        )
    r = ref.em(X, w, mu, cv, cvtype, 1e-6, 3, 3, 0.0)
    np.testing.assert_allclose(res.covars, r["covars"], rtol=1e-9)
    assert res.loglik == pytest.approx(r["loglik"], rel=1e-10)


# ------------------------------------------------------------------------------ on a GPU
try:
    from asp_gmm.backends import cuda as _cu

    _GPU_REASON = _cu.CudaBackend.unavailable_reason()
except ImportError as exc:  # pragma: no cover
    _cu, _GPU_REASON = None, str(exc)
gpu = pytest.mark.skipif(_GPU_REASON is not None, reason=f"CUDA backend unavailable: {_GPU_REASON}")
CUDA_VARIANTS = [
    v.name for v in registry.variants("cuda", "covariance") if set(TYPES) & set(v.cvtypes) and _cu and _cu.pluggable(v)
]
GPU_SHAPES = [(1003, 7, 3), (3001, 5, 11), (20_011, 36, 128)]  # odd D, padded M (11 -> 12), the benchmark shape


def _cuda_allowed(variant, N, D, M, cvtype, dtype):
    be = _cu.CudaBackend()
    v = registry.get("cuda", variant, "covariance")
    return cvtype in v.cvtypes and be.tunables_for(v, Problem(N, D, M, cvtype, dtype)) is not None


@gpu
@pytest.mark.parametrize("cvtype", TYPES)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "N%d-D%d-M%d" % s)
@pytest.mark.parametrize("variant", CUDA_VARIANTS)
def test_cuda_variant_matches_reference(variant, shape, cvtype, rng):
    N, D, M = shape
    if not _cuda_allowed(variant, N, D, M, cvtype, "float32"):
        pytest.skip(f"{variant} declares it cannot run {shape} {cvtype}")
    X = make_blobs(rng, N, D, M, dtype=np.float32)
    g, ll, r = train_vs_reference(rng, X, M, cvtype, 2, dtype=np.float32, backend="cuda", variant=variant)
    assert g.covars.shape == Problem(N, D, M, cvtype).covars_shape()
    _compare(g, ll, r, "float32", rtol=2e-4)
    logprob, post = g.eval(X)
    rlp, rpost = reference_estep(g, X)
    np.testing.assert_allclose(logprob, rlp, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(post, rpost, atol=1e-3)


@gpu
@pytest.mark.parametrize("cvtype", TYPES)
@pytest.mark.parametrize("variant", CUDA_VARIANTS)
def test_cuda_float64_and_offset(variant, cvtype, rng):
    N, D, M = 3001, 9, 4
    if _cuda_allowed(variant, N, D, M, cvtype, "float64"):
        X = make_blobs(rng, N, D, M, offset=1e6, dtype=np.float64)
        g, ll, r = train_vs_reference(rng, X, M, cvtype, 2, dtype=np.float64, backend="cuda", variant=variant)
        _compare(g, ll, r, "float64", rtol=1e-8)
    X = make_blobs(rng, N, D, M, offset=1000.0, dtype=np.float32)
    if _cuda_allowed(variant, N, D, M, cvtype, "float32"):
        g, ll, r = train_vs_reference(rng, X, M, cvtype, 1, dtype=np.float32, backend="cuda", variant=variant)
        s = float(np.max(np.abs(r["covars"])))
        np.testing.assert_allclose(g.covars, r["covars"], rtol=2e-3, atol=2e-3 * s)


@gpu
@pytest.mark.parametrize("cvtype", TYPES)
def test_cuda_agrees_with_c(cvtype, rng):
    X = make_blobs(rng, 50_000, 12, 8, dtype=np.float32)
    w, mu, cv = init_params(rng, X, 8, cvtype)
    out = {}
    for be in ("c", "cuda"):
        g = GMM(8, 12, means=mu, covars=cv, weights=w, cvtype=cvtype, backend=be)
        out[be] = (g.train(X, min_em_iters=5, max_em_iters=5, tol=0.0), g.covars)
    assert out["cuda"][0] == pytest.approx(out["c"][0], rel=1e-5)
    np.testing.assert_allclose(out["cuda"][1], out["c"][1], rtol=1e-3, atol=1e-4)
