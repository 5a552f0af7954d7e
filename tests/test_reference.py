"""asp_gmm.reference for the four covariance types: against scikit-learn's public estimator (E-step and
M-step), between its own entry points (factors and conversions, hard-label M-step), its errors, and its
robustness to an offset of the data."""

import warnings

import numpy as np
import pytest

from asp_gmm import reference as ref
from conftest import make_blobs

CVTYPES = ["full", "tied", "diag", "spherical"]


def _params(rng, X, M, cvtype):
    """Distinct events as means, scaled copies of the data covariance, random weights."""
    N, D = X.shape
    means = X[rng.choice(N, M, replace=False)].astype(np.float64)
    cov = np.cov(X, rowvar=False, bias=True) + 1e-3 * np.eye(D)
    w = rng.uniform(0.5, 1.5, M)
    covars = {
        "full": cov[None] * rng.uniform(0.5, 2.0, (M, 1, 1)),
        "tied": cov,
        "diag": np.diag(cov) * rng.uniform(0.5, 2.0, (M, D)),
        "spherical": np.diag(cov).mean() * rng.uniform(0.5, 2.0, M),
    }[cvtype]
    return w / w.sum(), means, covars


@pytest.mark.parametrize("cvtype", CVTYPES)
def test_estep_and_mstep_equal_sklearn(cvtype, rng):
    """The E-step equals scikit-learn's score_samples/predict_proba of the same parameters, and one
    M-step of its posteriors equals one iteration of scikit-learn's fit (which is E-step, M-step)."""
    mixture = pytest.importorskip("sklearn.mixture")
    X = make_blobs(rng, 600, 3, 4)
    w, mu, cv = _params(rng, X, 4, cvtype)
    prec = ref.precisions_from_cholesky(ref.precision_cholesky(cv, cvtype, n_features=3)[0], cvtype)
    kw = dict(covariance_type=cvtype, weights_init=w, means_init=mu, precisions_init=prec, reg_covar=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g1 = mixture.GaussianMixture(4, max_iter=1, **kw).fit(X)
    logprob, resp = ref.estep(X, g1.weights_, g1.means_, g1.covariances_, cvtype)
    np.testing.assert_allclose(logprob, g1.score_samples(X), rtol=1e-10)
    np.testing.assert_allclose(resp, g1.predict_proba(X), rtol=1e-8, atol=1e-12)
    _, resp = ref.estep(X, w, mu, cv, cvtype)
    weights, means, covars = ref.mstep(X, resp, None, None, cvtype, 1e-6)
    assert covars.shape == g1.covariances_.shape
    np.testing.assert_allclose(weights, g1.weights_, rtol=1e-10)
    np.testing.assert_allclose(means, g1.means_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(covars, g1.covariances_, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("cvtype", CVTYPES)
def test_factor_conversions_round_trip(cvtype, rng):
    X = make_blobs(rng, 300, 4, 3)
    _, _, cv = _params(rng, X, 3, cvtype)
    pc, log_det = ref.precision_cholesky(cv, cvtype, n_features=4)
    assert pc.shape == np.shape(cv)
    if cvtype in ("full", "tied"):
        assert np.all(np.tril(pc, -1) == 0.0)  # upper triangular, as scikit-learn's factors
    np.testing.assert_allclose(ref.covariances_from_precision_cholesky(pc, cvtype), cv, rtol=1e-10)
    P = ref.precisions_from_cholesky(pc, cvtype)
    if cvtype in ("full", "tied"):
        np.testing.assert_allclose(P @ cv, np.broadcast_to(np.eye(4), np.shape(cv)), atol=1e-10)
    else:
        np.testing.assert_allclose(P * cv, 1.0, rtol=1e-12)
    back = ref.precision_cholesky_from_precisions(P, cvtype)
    np.testing.assert_allclose(ref.precisions_from_cholesky(back, cvtype), P, rtol=1e-10)
    want = {
        "full": lambda: -0.5 * np.linalg.slogdet(cv)[1],
        "tied": lambda: -0.5 * np.linalg.slogdet(cv)[1],
        "diag": lambda: -0.5 * np.log(cv).sum(1),
        "spherical": lambda: -2.0 * np.log(cv),
    }[cvtype]()
    np.testing.assert_allclose(log_det, want, rtol=1e-12)
    np.testing.assert_allclose(ref.log_det_cholesky(pc, cvtype, 4), want, rtol=1e-12)


def test_not_positive_definite_names_the_component():
    full = np.repeat(np.eye(3)[None], 4, 0)
    full[2] = -np.eye(3)
    cases = [
        (full, "full", 2),
        (-np.eye(3), "tied", 0),
        (np.array([[1.0, 2.0], [1.0, 0.0]]), "diag", 1),
        (np.array([1.0, 1.0, -1.0]), "spherical", 2),
        (np.array([1.0, np.nan]), "spherical", 1),
    ]
    for covars, cvtype, k in cases:
        with pytest.raises(ref.NotPositiveDefiniteError, match="reg_covar") as info:
            ref.precision_cholesky(covars, cvtype, 1e-6, n_features=3)
        assert info.value.component == k
        assert isinstance(info.value, (np.linalg.LinAlgError, ValueError))
    with pytest.raises(ValueError, match="n_features"):
        ref.precision_cholesky(np.ones(3), "spherical")
    with pytest.raises(ValueError, match="cvtype"):
        ref.precision_cholesky(np.ones(3), "bogus")


@pytest.mark.parametrize("cvtype", ["full", "tied", "diag"])
def test_cond_limit_none_reports_only_failed_factorisations(cvtype):
    """scikit-learn accepts any matrix it can factorise; the oracle's default also refuses one that is
    numerically singular."""
    small = np.diag([1.0, 1e-17])
    cv = {"full": small[None], "tied": small, "diag": np.diag(small)[None]}[cvtype]
    with pytest.raises(ref.NotPositiveDefiniteError, match="condition number"):
        ref.precision_cholesky(cv, cvtype)
    pc, _ = ref.precision_cholesky(cv, cvtype, cond_limit=None)
    assert np.all(np.isfinite(pc))


@pytest.mark.parametrize("cvtype", CVTYPES)
def test_mstep_from_labels_equals_the_one_hot_mstep(cvtype, rng):
    X = rng.standard_normal((400, 3)) * rng.uniform(0.5, 2.0, 3) + 50.0
    labels = rng.integers(-1, 4, 400)  # -1: an event no component owns; component 4 of 5 stays empty
    nk, means, cov = ref.mstep_from_labels(X, labels, 5, cvtype, 1e-6)
    resp = np.zeros((400, 5))
    own = np.nonzero(labels >= 0)[0]
    resp[own, labels[own]] = 1.0
    nk2, _, means2 = ref.mstep_weights_means(X, resp)
    cov2 = ref.covariance(X, resp, nk2, means2, cvtype, 1e-6)
    np.testing.assert_allclose(nk, nk2, rtol=1e-14)
    np.testing.assert_allclose(means, means2, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cov, cov2, rtol=1e-10, atol=1e-12)
    assert np.all(means[4] == 0.0)
    if cvtype != "tied":
        np.testing.assert_allclose(cov[4], 1e-6 * np.eye(3) if cvtype == "full" else 1e-6, rtol=1e-12, atol=0)


@pytest.mark.parametrize("cvtype", CVTYPES)
def test_robust_to_an_offset(cvtype, rng):
    """Shifting the data by 1e6 changes neither the M-step's covariances nor the E-step (a one-pass
    E[x^2] - mean^2 would lose about 1e-4 of the variances here)."""
    X = make_blobs(rng, 2000, 3, 3)
    logits = rng.standard_normal((2000, 3))
    resp = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    w, mu, cv = ref.mstep(X, resp, None, None, cvtype, 1e-6)
    w2, mu2, cv2 = ref.mstep(X + 1e6, resp, None, None, cvtype, 1e-6)
    np.testing.assert_allclose(w2, w, rtol=1e-12)
    np.testing.assert_allclose(mu2 - 1e6, mu, atol=1e-8)
    np.testing.assert_allclose(cv2, cv, rtol=1e-7)
    lp, r = ref.estep(X, w, mu, cv, cvtype)
    lp2, r2 = ref.estep(X + 1e6, w2, mu2, cv2, cvtype)
    np.testing.assert_allclose(lp2, lp, rtol=1e-7)
    np.testing.assert_allclose(r2, r, atol=1e-7)


@pytest.mark.parametrize("cvtype", CVTYPES)
def test_em_runs_every_type(cvtype, rng):
    """The oracle's EM loop on every type: the log-likelihood never decreases."""
    X = make_blobs(rng, 800, 2, 3)
    w, mu, cv = _params(rng, X, 3, cvtype)
    lls = []
    for _ in range(6):
        r = ref.em(X, w, mu, cv, cvtype, 1e-6, 1, 1, 0.0)
        w, mu, cv = r["weights"], r["means"], r["covars"]
        lls.append(r["loglik"])
    assert np.shape(cv) == np.shape(_params(rng, X, 3, cvtype)[2])
    assert np.all(np.diff(lls) >= -1e-9 * abs(lls[0]))
