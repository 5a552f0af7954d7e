"""The drop-in on data never loaded whole: fit on chunk sources and Dask arrays, partial_fit."""

import numpy as np
import pytest

pytest.importorskip("sklearn")

from asp_gmm import GaussianMixture  # noqa: E402
from conftest import make_blobs  # noqa: E402

D, M = 4, 3


def inits(X, cvtype):
    rng = np.random.default_rng(1)
    means = X[rng.choice(len(X), M, replace=False)]
    var = X.var(0)
    prec = {
        "full": np.repeat(np.diag(1 / var)[None], M, 0),
        "tied": np.diag(1 / var),
        "diag": np.repeat((1 / var)[None], M, 0),
        "spherical": np.full(M, 1 / var.mean()),
    }[cvtype]
    return dict(weights_init=np.full(M, 1 / M), means_init=means, precisions_init=prec)


@pytest.mark.parametrize("cvtype", ["full", "diag", "tied", "spherical"])
def test_fit_on_a_chunk_source_equals_fit_in_memory(cvtype, rng):
    X = make_blobs(rng, 2000, D, M)
    kw = dict(covariance_type=cvtype, backend="c", max_iter=20, **inits(X, cvtype))
    g = GaussianMixture(M, **kw).fit(X)
    h = GaussianMixture(M, **kw).fit(lambda: (X[a : a + 37] for a in range(0, len(X), 37)))
    assert h.n_iter_ == g.n_iter_ and h.converged_ == g.converged_ and h.n_features_in_ == D
    assert h.lower_bound_ == pytest.approx(g.lower_bound_, rel=1e-10)
    np.testing.assert_allclose(h.lower_bounds_, g.lower_bounds_, rtol=1e-10)
    np.testing.assert_allclose(h.covariances_, g.covariances_, rtol=0, atol=1e-10 * np.abs(g.covariances_).max())
    np.testing.assert_allclose(h.means_, g.means_, rtol=0, atol=1e-10 * np.abs(g.means_).max())
    np.testing.assert_array_equal(h.predict(X), g.predict(X))


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # 15 iterations on purpose
@pytest.mark.parametrize("cvtype", ["full", "tied", "spherical"])
def test_fit_on_a_dask_array_equals_fit_on_a_chunk_source(cvtype, rng):
    da = pytest.importorskip("dask.array")
    X = make_blobs(rng, 3000, D, M)
    kw = dict(covariance_type=cvtype, backend="c", max_iter=15, random_state=3, init_params="random_from_data")
    h = GaussianMixture(M, **kw).fit(lambda: (X[a : a + 500] for a in range(0, len(X), 500)))
    d = GaussianMixture(M, **kw).fit(da.from_array(X, chunks=(700, D)))
    assert d.n_iter_ == h.n_iter_
    assert d.lower_bound_ == pytest.approx(h.lower_bound_, rel=1e-10)
    np.testing.assert_allclose(d.covariances_, h.covariances_, rtol=0, atol=1e-10 * np.abs(h.covariances_).max())


def test_streamed_kmeans_initialisation_reaches_the_in_memory_solution():
    rng = np.random.default_rng(11)
    centres = rng.normal(0, 4, (M, D))
    X = centres[rng.integers(0, M, 30000)] + rng.standard_normal((30000, D))
    g = GaussianMixture(M, random_state=0, backend="c").fit(X)  # k-means on a 10 000-event sample
    h = GaussianMixture(M, random_state=0, backend="c").fit(lambda: (X[a : a + 999] for a in range(0, 30000, 999)))
    assert h.lower_bound_ == pytest.approx(g.lower_bound_, rel=1e-5)
    order_g, order_h = np.argsort(g.means_[:, 0]), np.argsort(h.means_[:, 0])
    np.testing.assert_allclose(h.means_[order_h], g.means_[order_g], atol=1e-2)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # 4 iterations on purpose
@pytest.mark.parametrize("cvtype", ["tied", "spherical"])
def test_streamed_tied_and_spherical_match_the_reference(cvtype, rng):
    """A streamed fit of the two reduced types (per-component statistics of the full and diagonal
    kernels, reduced in each M-step) equals the float64 reference's EM from the same start."""
    from asp_gmm import reference as ref

    X = make_blobs(rng, 1999, D, M, offset=1000.0)
    kw = dict(covariance_type=cvtype, backend="c", max_iter=4, tol=0.0, **inits(X, cvtype))
    h = GaussianMixture(M, **kw).fit(lambda: (X[a : a + 301] for a in range(0, len(X), 301)))
    pc = ref.precision_cholesky_from_precisions(kw["precisions_init"], cvtype)
    cv0 = ref.covariances_from_precision_cholesky(pc, cvtype)
    r = ref.em(X, kw["weights_init"], kw["means_init"], cv0, cvtype, 1e-6, 4, 4, 0.0)
    np.testing.assert_allclose(h.covariances_, r["covars"], rtol=1e-9)
    np.testing.assert_allclose(h.means_, r["means"], rtol=1e-12)


@pytest.mark.parametrize("cvtype", ["full", "diag", "tied", "spherical"])
def test_partial_fit_on_a_stationary_stream_approaches_the_batch_fit(cvtype):
    rng = np.random.default_rng(7)
    centres = rng.normal(0, 4, (M, D))

    def batch(n):
        return centres[rng.integers(0, M, n)] + rng.standard_normal((n, D))

    X = batch(20000)
    target = GaussianMixture(M, covariance_type=cvtype, random_state=0, backend="c").fit(X).score(X)
    p = GaussianMixture(M, covariance_type=cvtype, random_state=0, backend="c")
    gaps = []
    for i in range(200):
        p.partial_fit(batch(400))
        if i in (2, 199):
            gaps.append(target - p.score(X))
    assert p.n_iter_ == 200 and len(p.lower_bounds_) == 200 and not p.converged_
    assert gaps[1] < gaps[0] and abs(gaps[1]) < 5e-3, gaps


def test_partial_fit_checks_its_input(rng):
    X = make_blobs(rng, 500, D, M)
    p = GaussianMixture(M, backend="c").partial_fit(X)
    with pytest.raises(ValueError, match="features"):
        p.partial_fit(X[:, :2])
    with pytest.raises(ValueError, match="online_kappa"):
        GaussianMixture(M, online_kappa=0.3).partial_fit(X)
    with pytest.raises(ValueError, match="n_samples >= n_components"):
        GaussianMixture(M).partial_fit(X[:2])


def test_fit_resets_what_partial_fit_accumulated(rng):
    # partial_fit(A), fit(B), partial_fit(B) must be fit(B), partial_fit(B): nothing of A left over
    A = make_blobs(rng, 600, D, M) + 40.0
    B = make_blobs(rng, 600, D, M)
    kw = dict(covariance_type="full", backend="c", random_state=0, max_iter=30)
    g = GaussianMixture(M, **kw).partial_fit(A).fit(B).partial_fit(B)
    h = GaussianMixture(M, **kw).fit(B).partial_fit(B)
    np.testing.assert_allclose(g.means_, h.means_, rtol=0, atol=1e-9 * np.abs(h.means_).max())
    np.testing.assert_allclose(g.covariances_, h.covariances_, rtol=0, atol=1e-9 * np.abs(h.covariances_).max())
    # (within rounding, not bit for bit: with autotuning on, the two fits' iterations may run on
    # different variants; what partial_fit(A) left behind would show as a far larger difference)
    assert g.n_iter_ == h.n_iter_ and g.lower_bounds_ == pytest.approx(h.lower_bounds_, rel=1e-12, abs=0)
    # partial_fit after fit continues from the fitted parameters (one online step, not a restart)
    assert np.abs(h.means_ - GaussianMixture(M, **kw).fit(B).means_).max() < 0.5


def test_partial_fit_names_a_changed_n_components(rng):
    X = make_blobs(rng, 500, D, M)
    p = GaussianMixture(M, backend="c").partial_fit(X)
    p.set_params(n_components=M + 1)
    with pytest.raises(ValueError, match=r"partial_fit\(\).*n_components.*3.*4.*fit\(\)"):
        p.partial_fit(X)
    p.set_params(covariance_type="diag", n_components=M)
    with pytest.raises(ValueError, match=r"partial_fit\(\).*covariance_type"):
        p.partial_fit(X)
    p.fit(X)  # fit starts over with the new parameters; partial_fit then continues from it
    p.partial_fit(X)
    assert p.means_.shape == (M, D) and p.covariances_.shape == (M, D)


@pytest.mark.parametrize("t0,kappa", [(2.0, 0.6), (5.0, 0.9)])
def test_partial_fit_mixes_each_batch_in_with_its_step_size(rng, t0, kappa):
    # the running statistics after update t are (1 - rho_t) S + rho_t s_t, rho_t = (t0 + t)^-kappa;
    # the means are their first moments over their counts. Batches far apart make every rho visible.
    kw = dict(covariance_type="diag", backend="c", dtype="float64", online_t0=t0, online_kappa=kappa)
    batches = [make_blobs(rng, 300, D, M) + 4.0 * t for t in range(5)]
    w0 = np.full(M, 1.0 / M)
    mu0 = batches[0][:M].copy()
    prec0 = np.repeat((1.0 / batches[0].var(0))[None], M, 0)
    start = GaussianMixture(M, weights_init=w0, means_init=mu0, precisions_init=prec0, max_iter=0, **kw)
    p = GaussianMixture(M, weights_init=w0, means_init=mu0, precisions_init=prec0, **kw)
    S = None
    for t, Xb in enumerate(batches):
        # posteriors of the batch under the parameters before the step (the initial ones at t = 0)
        r = (start.fit(Xb) if t == 0 else p).predict_proba(Xb)
        s = np.concatenate([r.mean(0)[:, None], r.T @ Xb / len(Xb)], axis=1)  # (M, 1 + D): counts, moments
        S = s if t == 0 else (1 - (t0 + t) ** -kappa) * S + (t0 + t) ** -kappa * s
        p.partial_fit(Xb)
        np.testing.assert_allclose(p.means_, S[:, 1:] / S[:, :1], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(p.weights_, S[:, 0] / S[:, 0].sum(), rtol=1e-9)
