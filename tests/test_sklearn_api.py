"""asp_gmm.GaussianMixture against scikit-learn's GaussianMixture: estimator checks, same-init
agreement on scikit-learn's data sets and random data, fit_predict consistency, validation."""

import json
import os
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn", reason="scikit-learn is an optional dependency of asp_gmm.GaussianMixture")

from sklearn.datasets import load_digits, load_iris, load_wine  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.mixture import GaussianMixture as SkGM  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

import asp_gmm  # noqa: E402
from asp_gmm import sklearn_api  # noqa: E402
from asp_gmm.sklearn_api import GaussianMixture  # noqa: E402
from conftest import make_blobs  # noqa: E402

CVTYPES = ["full", "diag", "tied", "spherical"]
#: Normwise relative tolerance (max |ours - sklearn| / max |sklearn|) by working precision.
REL = {"float64": 1e-6, "float32": 1e-3}


@pytest.fixture(autouse=True)
def _one_blas_thread():
    """scikit-learn's small matrix products are many times slower with 2 OpenBLAS threads than
    with one on small VMs; limiting BLAS (not asp_gmm's OpenMP) keeps this file fast."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


# ------------------------------------------------------------------------------------ estimator checks


def _check_name(check):
    return getattr(check, "func", check).__name__


@parametrize_with_checks([GaussianMixture(covariance_type=c) for c in CVTYPES])
def test_sklearn_estimator_checks(estimator, check):
    if _check_name(check) == "check_array_api_input" and not os.environ.get("SCIPY_ARRAY_API"):
        # scikit-learn skips this check unless SCIPY_ARRAY_API=1 was set before scipy was imported;
        # run it in a fresh interpreter with the variable set instead of skipping it.
        _array_api_check_in_subprocess(estimator, check)
        return
    check(estimator)


_ARRAY_API_RESULTS: dict = {}


def _array_api_check_in_subprocess(estimator, check):
    """One fresh interpreter runs the check for every covariance type (interpreter start-up and
    imports dominate); each parametrized test then reads its own result."""
    key = json.dumps(check.keywords, sort_keys=True)
    if key not in _ARRAY_API_RESULTS:
        code = (
            "import json, sys, traceback\n"
            "from sklearn.utils.estimator_checks import check_array_api_input\n"
            "from asp_gmm import GaussianMixture\n"
            "out = {}\n"
            "for cv in json.loads(sys.argv[1]):\n"
            "    try:\n"
            "        check_array_api_input('GaussianMixture', GaussianMixture(covariance_type=cv),\n"
            "                              **json.loads(sys.argv[2]))\n"
            "        out[cv] = 'ok'\n"
            "    except Exception:\n"
            "        out[cv] = traceback.format_exc()\n"
            "print(json.dumps(out))\n"
        )
        env = dict(os.environ, SCIPY_ARRAY_API="1")
        r = subprocess.run(
            [sys.executable, "-c", code, json.dumps(CVTYPES), key], capture_output=True, text=True, env=env, timeout=300
        )
        assert r.returncode == 0, r.stdout + r.stderr
        _ARRAY_API_RESULTS[key] = json.loads(r.stdout.strip().splitlines()[-1])
    result = _ARRAY_API_RESULTS[key][estimator.covariance_type]
    assert result == "ok", result


# ------------------------------------------------------------------------------------ same init


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def _sk_init(X, M, cvtype):
    """scikit-learn's own k-means initialisation (max_iter=0), as explicit initial parameters."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = SkGM(M, covariance_type=cvtype, random_state=0, max_iter=0).fit(X)
    return dict(weights_init=g.weights_, means_init=g.means_, precisions_init=g.precisions_)


def _data(name, rng):
    if name == "random":
        return make_blobs(rng, 3000, 6, 5), 5
    X = {"iris": load_iris, "wine": load_wine, "digits": load_digits}[name]().data.astype(np.float64)
    return X, {"iris": 3, "wine": 3, "digits": 10}[name]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("cvtype", CVTYPES)
@pytest.mark.parametrize("data", ["iris", "wine", "digits", "random"])
def test_same_init_same_result(data, cvtype, dtype, rng):
    X, M = _data(data, rng)
    init = _sk_init(X, M, cvtype)
    ref = SkGM(M, covariance_type=cvtype, max_iter=200, **init).fit(X)
    ours = GaussianMixture(M, covariance_type=cvtype, max_iter=200, dtype=dtype, **init).fit(X)
    tol = REL[dtype]
    assert ours.n_iter_ == ref.n_iter_ and ours.converged_ == ref.converged_
    assert abs(ours.lower_bound_ - ref.lower_bound_) <= tol * abs(ref.lower_bound_)
    assert _rel(ours.means_, ref.means_) <= tol
    assert _rel(ours.covariances_, ref.covariances_) <= tol
    assert _rel(ours.weights_, ref.weights_) <= tol
    assert _rel(ours.precisions_cholesky_, ref.precisions_cholesky_) <= tol * 10
    assert np.allclose(ours.lower_bounds_, ref.lower_bounds_, rtol=tol, atol=0)
    assert ours.means_.dtype == np.dtype(dtype)
    # the inference methods on the fitted model
    assert _rel(ours.score_samples(X), ref.score_samples(X)) <= tol * 10
    assert abs(ours.bic(X) - ref.bic(X)) <= tol * abs(ref.bic(X))
    assert abs(ours.aic(X) - ref.aic(X)) <= tol * abs(ref.aic(X))
    assert np.mean(ours.predict(X) == ref.predict(X)) >= (1.0 if dtype == "float64" else 0.99)


@pytest.mark.parametrize("cvtype", CVTYPES)
@pytest.mark.parametrize("init_params", ["kmeans", "k-means++", "random", "random_from_data"])
def test_init_params_as_sklearn(cvtype, init_params, rng):
    """Below KMEANS_SUBSAMPLE events every init method draws the same random numbers as
    scikit-learn: with the same random_state (and n_init=2) the fits agree."""
    X = make_blobs(rng, 600, 4, 3)
    kw = dict(covariance_type=cvtype, init_params=init_params, random_state=7, n_init=2, max_iter=300)
    ref = SkGM(3, **kw).fit(X)
    ours = GaussianMixture(3, **kw).fit(X)
    assert ours.n_iter_ == ref.n_iter_
    assert ours.lower_bound_ == pytest.approx(ref.lower_bound_, rel=1e-6)
    # both initialisations may reach the same optimum with the components in another order; which
    # one is kept then depends on the last bit of two equal lower bounds, so compare as a set
    order = lambda mu: mu[np.lexsort(mu.T[::-1])]  # noqa: E731
    assert _rel(order(ours.means_), order(ref.means_)) <= 1e-6


@pytest.mark.parametrize("cvtype", CVTYPES)
def test_fit_predict_equals_fit_then_predict(cvtype, rng, monkeypatch):
    # no exploration: two fits on two variants may keep two equal optima in another component order
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "0")
    X = make_blobs(rng, 800, 3, 4)
    kw = dict(covariance_type=cvtype, random_state=3, n_init=2, max_iter=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        labels = GaussianMixture(4, **kw).fit_predict(X)
        g = GaussianMixture(4, **kw).fit(X)
    np.testing.assert_array_equal(labels, g.predict(X))
    proba = g.predict_proba(X)
    assert proba.shape == (800, 4)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-10)


@pytest.mark.parametrize("cvtype", ["full", "diag", "spherical"])
def test_not_converged_warns_like_sklearn(cvtype, rng):
    X = make_blobs(rng, 500, 3, 3)
    for max_iter in (1, 2):
        kw = dict(covariance_type=cvtype, random_state=0, max_iter=max_iter)
        with pytest.warns(ConvergenceWarning, match="did not converge"):
            ref = SkGM(3, **kw).fit(X)
        with pytest.warns(ConvergenceWarning, match="did not converge"):
            ours = GaussianMixture(3, **kw).fit(X)
        assert ours.n_iter_ == ref.n_iter_ == max_iter and not ours.converged_
        assert ours.lower_bound_ == pytest.approx(ref.lower_bound_, rel=1e-9)
        assert _rel(ours.covariances_, ref.covariances_) <= 1e-9


@pytest.mark.parametrize("cvtype", ["full", "tied"])
def test_warm_start_as_sklearn(cvtype, rng):
    X = make_blobs(rng, 700, 3, 3)
    kw = dict(covariance_type=cvtype, random_state=1, warm_start=True, max_iter=2)
    ref, ours = SkGM(3, **kw), GaussianMixture(3, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for _ in range(12):  # continues where the last fit stopped, then converges
            ref.fit(X)
            ours.fit(X)
            assert ours.n_iter_ == ref.n_iter_ and ours.converged_ == ref.converged_
            assert ours.lower_bound_ == pytest.approx(ref.lower_bound_, rel=1e-9)
    assert ours.converged_


def test_max_iter_zero_keeps_initial_parameters(rng):
    X = make_blobs(rng, 300, 3, 2)
    init = _sk_init(X, 2, "full")
    ours = GaussianMixture(2, max_iter=0, **init).fit(X)
    assert ours.n_iter_ == 0 and not ours.converged_ and ours.lower_bound_ == -np.inf
    np.testing.assert_allclose(ours.precisions_, init["precisions_init"], rtol=1e-10)
    np.testing.assert_allclose(ours.means_, init["means_init"])


def test_float32_data_stays_float32_and_dtype_keyword(rng):
    X = make_blobs(rng, 400, 3, 2, dtype=np.float32)
    g = GaussianMixture(2, random_state=0).fit(X)
    assert g.means_.dtype == np.float32 and g.score_samples(X).dtype == np.float32
    g64 = GaussianMixture(2, random_state=0, dtype="float64").fit(X)
    assert g64.means_.dtype == np.float64
    with pytest.raises(ValueError, match="dtype"):
        GaussianMixture(2, dtype="int32").fit(X)


def test_backends_agree(rng):
    X = make_blobs(rng, 500, 4, 3)
    a = GaussianMixture(3, random_state=0, backend="c").fit(X)
    b = GaussianMixture(3, random_state=0, backend="numpy").fit(X)
    assert a.n_iter_ == b.n_iter_
    assert _rel(a.covariances_, b.covariances_) <= 1e-9


def test_sample_as_sklearn(rng):
    X = make_blobs(rng, 500, 3, 2)
    for cvtype in CVTYPES:
        init = _sk_init(X, 2, cvtype)
        ref = SkGM(2, covariance_type=cvtype, random_state=5, **init).fit(X)
        ours = GaussianMixture(2, covariance_type=cvtype, random_state=5, **init).fit(X)
        (xr, yr), (xo, yo) = ref.sample(50), ours.sample(50)
        np.testing.assert_array_equal(yo, yr)
        np.testing.assert_allclose(xo, xr, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="at least one sample"):
        ours.sample(0)


def test_large_n_kmeans_runs_on_a_subsample(rng, monkeypatch):
    """Above KMEANS_SUBSAMPLE events, k-means runs on a subsample; the initial parameters are the
    hard-label statistics of all events (scikit-learn's formulas with 0/1 responsibilities)."""
    from sklearn.cluster import KMeans

    monkeypatch.setattr(sklearn_api, "KMEANS_SUBSAMPLE", 400)
    X = make_blobs(rng, 3000, 4, 3)
    calls = []
    real_fit = KMeans.fit

    def spy(self, Xs, *a, **k):
        calls.append(Xs.shape[0])
        return real_fit(self, Xs, *a, **k)

    monkeypatch.setattr(KMeans, "fit", spy)
    for cvtype in CVTYPES:
        g = GaussianMixture(3, covariance_type=cvtype, random_state=0, max_iter=0).fit(X)
        rs = np.random.RandomState(0)
        sub = np.sort(rs.choice(3000, 400, replace=False))
        labels = real_fit(KMeans(3, n_init=1, random_state=rs), X[sub]).predict(X)
        resp = np.eye(3)[labels]
        nk, means, cov = sklearn_api._estimate_params(X, resp, 1e-6, cvtype)
        np.testing.assert_allclose(g.means_, means, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(g.covariances_, cov, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(g.weights_, nk / 3000, rtol=1e-12)
    assert calls and set(calls) == {400}
    # k-means++ on the subsample too: the means are events of X
    g = GaussianMixture(3, init_params="k-means++", random_state=0, max_iter=0).fit(X)
    assert all((np.abs(X - m).sum(axis=1) < 1e-9).any() for m in g.means_)


# ------------------------------------------------------------------------------------ validation


def _messages(cls_a, cls_b, X, **kw):
    out = []
    for cls in (cls_a, cls_b):
        with pytest.raises((ValueError, TypeError)) as exc:
            cls(**kw).fit(X)
        out.append(str(exc.value))
    return out


@pytest.mark.parametrize(
    "kw",
    [
        dict(n_components=0),
        dict(n_components=10),
        dict(covariance_type="bogus"),
        dict(tol=-1.0),
        dict(max_iter=-1),
        dict(n_init=0),
        dict(init_params="nope"),
        dict(n_components=2, weights_init=[0.2, 0.2]),
        dict(n_components=2, weights_init=[0.5, 0.5, 0.0]),
        dict(n_components=2, means_init=np.zeros((3, 2))),
        dict(n_components=2, precisions_init=np.ones((2, 2))),
        dict(n_components=2, covariance_type="diag", precisions_init=-np.ones((2, 2))),
        dict(n_components=2, covariance_type="tied", precisions_init=np.array([[1.0, 2.0], [0.0, 1.0]])),
    ],
    ids=lambda kw: ",".join(f"{k}" for k in kw),
)
def test_validation_messages_match_sklearn(kw, rng):
    X = rng.standard_normal((5, 2))
    ours, ref = _messages(GaussianMixture, SkGM, X, **kw)
    assert _sorted_sets(ours) == _sorted_sets(ref)


def _sorted_sets(msg):
    """scikit-learn prints option sets ({'a', 'b'}) in set order, which varies between processes."""
    import re

    return re.sub(r"\{([^{}]*)\}", lambda m: "{" + ", ".join(sorted(m.group(1).split(", "))) + "}", msg)


def test_ill_defined_covariance_message(rng):
    X = np.repeat(rng.standard_normal((3, 4)), 20, axis=0)  # 3 distinct events
    with pytest.raises(ValueError, match="ill-defined empirical covariance"):
        GaussianMixture(5, reg_covar=0.0, random_state=0).fit(X)


def test_pickle_and_params_roundtrip(rng):
    X = make_blobs(rng, 300, 2, 2)
    g = GaussianMixture(2, covariance_type="diag", backend="c", random_state=0).fit(X)
    h = pickle.loads(pickle.dumps(g))
    np.testing.assert_array_equal(h.predict(X), g.predict(X))
    assert g.get_params()["backend"] == "c"
    assert g.set_params(backend="numpy", dtype="float32").get_params()["dtype"] == "float32"


def test_exposed_at_package_level():
    assert asp_gmm.GaussianMixture is GaussianMixture
    assert "GaussianMixture" in asp_gmm.__all__
    ns = {}
    exec("from asp_gmm import *", ns)
    assert ns["GaussianMixture"] is GaussianMixture


def test_import_error_without_sklearn():
    code = (
        "import sys\nsys.modules['sklearn'] = None\nimport asp_gmm\n"
        "from asp_gmm import *\n"
        "try:\n    asp_gmm.GaussianMixture\nexcept ImportError as e:\n    print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "pip install scikit-learn" in r.stdout


@pytest.mark.parametrize("cvtype", CVTYPES)
def test_score_averages_in_the_working_precision_as_sklearn(cvtype):
    """scikit-learn's score is score_samples(X).mean() in the model's dtype (its test_score[float32]
    compares the two to 7 decimals)."""
    rng = np.random.RandomState(0)
    X = (rng.randn(500, 2) * 7 + np.array([[30.0, -20.0]]) * rng.randint(0, 2, (500, 1))).astype(np.float32)
    gm = GaussianMixture(2, covariance_type=cvtype, max_iter=1, reg_covar=0, random_state=rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gm.fit(X)
    samples = gm.score_samples(X)
    assert samples.dtype == np.float32
    assert gm.score(X) == samples.mean() and np.asarray(gm.score(X)).dtype == np.float32
    np.testing.assert_almost_equal(gm.score(X), samples.mean())


def test_auto_without_a_c_compiler_warns_once(monkeypatch, rng):
    monkeypatch.setenv("ASP_GMM_CC", "no-such-compiler-asp")
    from asp_gmm.runtime import default_runtime
    from asp_gmm import backends

    monkeypatch.setattr(default_runtime(), "warned_slow", False)
    monkeypatch.delitem(default_runtime().backends, "c", raising=False)
    real_reason = backends.unavailable_reason  # a GPU machine: hide CUDA so "auto" falls past it
    monkeypatch.setattr(backends, "unavailable_reason", lambda n: "hidden" if n == "cuda" else real_reason(n))
    X = make_blobs(rng, 200, 2, 2)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        GaussianMixture(2, random_state=0).fit(X)
        GaussianMixture(2, random_state=0).fit(X)
    msgs = [str(x.message) for x in w if "NumPy reference" in str(x.message)]
    assert len(msgs) == 1 and "ASP_GMM_CC" in msgs[0]


def test_hard_label_statistics_equal_sklearn_formulas(rng):
    """The O(N D^2) hard-label initial parameters equal scikit-learn's formulas with 0/1
    responsibilities, empty components included (mean 0, covariance reg_covar)."""
    X = rng.standard_normal((300, 3)) + 5.0
    labels = rng.integers(0, 4, 300)  # component 4 of 5 stays empty
    for cvtype in CVTYPES:
        got = sklearn_api._label_params(X, labels, 5, 1e-6, cvtype)
        want = sklearn_api._estimate_params(X, np.eye(5)[labels], 1e-6, cvtype)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cvtype", ["diag", "spherical"])
def test_verbose_output_like_sklearn(cvtype, rng, capsys):
    X = make_blobs(rng, 400, 2, 2)
    kw = dict(covariance_type=cvtype, random_state=0, verbose=2, verbose_interval=1, n_init=2)
    SkGM(2, **kw).fit(X)
    ref = capsys.readouterr().out.splitlines()
    GaussianMixture(2, **kw).fit(X)
    ours = capsys.readouterr().out.splitlines()

    def shape(lines):  # the lines' kinds and counts (times differ)
        return [ln.split("\t")[0].split(".")[0] for ln in lines]

    assert shape(ours) == shape(ref)


def test_one_specializer_per_backend_kept_out_of_params_and_pickles(monkeypatch, rng):
    """predict/score reuse the Specializer fit built (and its memoised candidates); it is not a
    parameter, and pickles and deep copies leave it out and build their own."""
    import copy

    from asp_gmm import specializer

    built = []
    real_init = specializer.Specializer.__init__

    def spy(self, *a, **k):
        built.append(a[0] if a else k.get("backend"))
        real_init(self, *a, **k)

    monkeypatch.setattr(specializer.Specializer, "__init__", spy)
    X = make_blobs(rng, 300, 2, 2)
    g = GaussianMixture(2, covariance_type="diag", backend="numpy", random_state=0).fit(X)
    assert built == ["numpy"]
    for _ in range(3):
        g.predict(X), g.score(X), g.predict_proba(X), g.score_samples(X[:7])
    assert built == ["numpy"]
    g.set_params(backend="c")
    g.predict(X), g.score(X)
    assert built == ["numpy", "c"]
    assert "_specializers" not in g.get_params()
    for h in (pickle.loads(pickle.dumps(g)), copy.deepcopy(g)):
        assert "_specializers" not in h.__dict__
        np.testing.assert_array_equal(h.predict(X), g.predict(X))
    assert set(g._specializers) == {"numpy", "c"}  # pickling did not touch the original


@pytest.mark.parametrize("cvtype", ["tied", "spherical"])
@pytest.mark.parametrize("data", ["iris", "wine", "random"])
def test_numpy_types_equal_sklearn_in_float64(data, cvtype, rng):
    """ "tied" and "spherical" run scikit-learn's loop on the compiled core (float64 here): from the same
    initial parameters they give scikit-learn's fit up to rounding."""
    X, M = _data(data, rng)
    init = _sk_init(X, M, cvtype)
    ref = SkGM(M, covariance_type=cvtype, max_iter=200, **init).fit(X)
    ours = GaussianMixture(M, covariance_type=cvtype, max_iter=200, **init).fit(X)
    assert ours.n_iter_ == ref.n_iter_ and ours.converged_ == ref.converged_
    np.testing.assert_allclose(ours.lower_bounds_, ref.lower_bounds_, rtol=1e-10, atol=0)
    for name in ("weights_", "means_", "covariances_", "precisions_cholesky_", "precisions_"):
        assert _rel(getattr(ours, name), getattr(ref, name)) <= 1e-9, name
    assert _rel(ours.score_samples(X), ref.score_samples(X)) <= 1e-10
