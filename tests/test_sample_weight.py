"""sample_weight through every path of the fitting wing (asp_gmm/fit/): an event of integer weight k is
k copies of it (float64, 1e-10), weight 0 is a dropped event, and bad weights are refused with a
message naming the argument. In memory, memmap, callable source; NumPy and C backends; full and diag
(GMM) and every covariance type (GaussianMixture, fit and partial_fit)."""

import numpy as np
import pytest

from asp_gmm import GMM
from conftest import make_blobs

RTOL = 1e-10
#: fixed iteration counts (tol=0) never "converge"
pytestmark = pytest.mark.filterwarnings("ignore:Best performing initialization did not converge")


def _fit(X, cvtype, backend, sample_weight=None, iters=8, **kw):
    g = GMM(3, 3, cvtype=cvtype, dtype=np.float64, backend=backend, **kw)
    ll = g.train(X, max_em_iters=iters, tol=0.0, sample_weight=sample_weight)
    return g, ll


def _same(a, b, rtol=RTOL):
    ga, la = a
    gb, lb = b
    assert la == pytest.approx(lb, rel=rtol)
    for name in ("weights", "means", "covars"):
        np.testing.assert_allclose(getattr(ga, name), getattr(gb, name), rtol=rtol, atol=rtol, err_msg=name)


def _data(rng, N=900, D=3):
    X = make_blobs(rng, N, D, 3, offset=5.0)
    k = rng.integers(0, 4, N)  # integer weights, zeros included
    k[:3] = 1
    return X, k


@pytest.mark.parametrize("backend", ["numpy", "c"])
@pytest.mark.parametrize("cvtype", ["full", "diag"])
def test_integer_weights_equal_repeated_rows(rng, backend, cvtype):
    X, k = _data(rng)
    rep = np.repeat(X, k, axis=0)
    want = _fit(rep, cvtype, backend)
    got = _fit(X, cvtype, backend, k.astype(np.float64))
    # both seed the same events (the cumulative weight crosses k W / M) and run the same iterations
    _same(got, want)
    assert got[0].n_iter == want[0].n_iter == 8


@pytest.mark.parametrize("cvtype", ["full", "diag"])
def test_zero_weights_equal_dropped_rows(rng, cvtype):
    X, k = _data(rng)
    keep = k > 0
    _same(_fit(X, cvtype, "c", keep.astype(np.float64)), _fit(X[keep], cvtype, "c"))


@pytest.mark.parametrize("cvtype", ["full", "diag"])
def test_random_seed_draws_only_weighted_events(rng, cvtype):
    X, k = _data(rng)
    g, _ = _fit(X, cvtype, "numpy", k.astype(np.float64), iters=0, seed=3)
    assert all(k[np.nonzero((X == m).all(1))[0]].min() > 0 for m in g.means)


def test_memmap_and_callable_sources(rng, tmp_path):
    X, k = _data(rng)
    want = _fit(np.repeat(X, k, axis=0), "full", "c")
    path = tmp_path / "X.f64"
    mm = np.memmap(path, np.float64, "w+", shape=X.shape)
    mm[:] = X
    mm.flush()
    wmm = np.memmap(tmp_path / "w.f64", np.float64, "w+", shape=k.shape)
    wmm[:] = k
    wmm.flush()
    _same(_fit(np.memmap(path, np.float64, "r", shape=X.shape), "full", "c", wmm), want)

    def chunks():  # uneven chunks, weights cut differently from the rows
        return (X[a : a + 97] for a in range(0, len(X), 97))

    def wchunks():
        return (k[a : a + 50].astype(np.float64) for a in range(0, len(k), 50))

    _same(_fit(chunks, "full", "c", wchunks), want)
    _same(_fit(chunks, "full", "c", k.astype(np.float64)), want)  # an aligned array


def test_float32(rng):
    X, k = _data(rng)
    X = X.astype(np.float32)
    g = GMM(3, 3, dtype=np.float32, backend="c")
    g.train(X, max_em_iters=5, tol=0.0, sample_weight=k)
    h = GMM(3, 3, dtype=np.float32, backend="c")
    h.train(np.repeat(X, k, axis=0), max_em_iters=5, tol=0.0)
    np.testing.assert_allclose(g.covars, h.covars, rtol=2e-4, atol=1e-5)
    np.testing.assert_allclose(g.means, h.means, rtol=2e-4, atol=1e-4)


@pytest.mark.parametrize(
    "w, match",
    [
        (lambda n: -np.ones(n), r"sample_weight has a negative value"),
        (lambda n: np.r_[np.nan, np.ones(n - 1)], r"sample_weight contains NaN or infinity"),
        (lambda n: np.ones(n + 1), r"sample_weight has \d+ values but X has \d+ events"),
        (lambda n: np.ones((n, 1)), r"sample_weight must be 1-D"),
        (lambda n: np.r_[np.ones(2), np.zeros(n - 2)], r"sample_weight has 2 positive values"),
    ],
)
def test_bad_weights_are_refused(rng, w, match):
    X, _ = _data(rng, N=300)
    with pytest.raises(ValueError, match=match):
        GMM(3, 3, dtype=np.float64, backend="numpy").train(X, sample_weight=w(len(X)))


def test_bad_streamed_weights_are_refused(rng):
    X, k = _data(rng, N=300)

    def chunks():
        return (X[a : a + 100] for a in range(0, len(X), 100))

    for bad, match in (
        (lambda: iter([np.ones(100), np.ones(100)]), r"sample_weight has 200 values but X has more events"),
        (lambda: iter([np.ones(400)]), r"sample_weight has 400 values but X has 300 events"),
        (lambda: iter([np.ones(100), -np.ones(200)]), r"sample_weight \(chunk 1, from index 100\) has a negative"),
        (lambda: iter([np.zeros(300)]), r"sample_weight"),
    ):
        with pytest.raises(ValueError, match=match):
            GMM(3, 3, dtype=np.float64, backend="numpy").train(chunks, sample_weight=bad)


# ---------------------------------------------------------------------------------- GaussianMixture
CVTYPES = ["full", "diag", "tied", "spherical"]


def _inits(rng, X, M, cvtype):
    D = X.shape[1]
    means = X[rng.choice(len(X), M, replace=False)]
    prec = {
        "full": np.repeat(np.eye(D)[None], M, 0) * 0.2,
        "diag": np.full((M, D), 0.2),
        "tied": np.eye(D) * 0.2,
        "spherical": np.full(M, 0.2),
    }[cvtype]
    return dict(means_init=means, weights_init=np.full(M, 1.0 / M), precisions_init=prec)


def _gm(cvtype, init, backend="c", **kw):
    from asp_gmm.sklearn_api import GaussianMixture

    return GaussianMixture(3, covariance_type=cvtype, backend=backend, max_iter=8, tol=0.0, **init, **kw)


def _same_gm(a, b, rtol=RTOL):
    for name in ("weights_", "means_", "covariances_", "precisions_cholesky_"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=rtol, atol=rtol, err_msg=name)
    assert a.lower_bound_ == pytest.approx(b.lower_bound_, rel=rtol)
    assert a.n_iter_ == b.n_iter_


@pytest.mark.parametrize("cvtype", CVTYPES)
def test_gaussian_mixture_fit(rng, cvtype):
    pytest.importorskip("sklearn")
    X, k = _data(rng)
    init = _inits(rng, X, 3, cvtype)
    want = _gm(cvtype, init).fit(np.repeat(X, k, axis=0))
    _same_gm(_gm(cvtype, init).fit(X, sample_weight=k), want)
    keep = k > 0
    _same_gm(_gm(cvtype, init).fit(X, sample_weight=keep * 1.0), _gm(cvtype, init).fit(X[keep]))


@pytest.mark.parametrize("cvtype", CVTYPES)
def test_gaussian_mixture_partial_fit(rng, cvtype):
    pytest.importorskip("sklearn")
    X, k = _data(rng)
    init = _inits(rng, X, 3, cvtype)
    a, b = _gm(cvtype, init), _gm(cvtype, init)
    for part in np.array_split(np.arange(len(X)), 3):
        a.partial_fit(X[part], sample_weight=k[part])
        b.partial_fit(np.repeat(X[part], k[part], axis=0))
    for name in ("weights_", "means_", "covariances_"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=RTOL, atol=RTOL, err_msg=name)
    assert a.lower_bound_ == pytest.approx(b.lower_bound_, rel=RTOL)


@pytest.mark.parametrize("cvtype", CVTYPES)
def test_gaussian_mixture_streamed(rng, tmp_path, cvtype):
    pytest.importorskip("sklearn")
    X, k = _data(rng)
    init = _inits(rng, X, 3, cvtype)
    mm = np.memmap(tmp_path / "X.f64", np.float64, "w+", shape=X.shape)
    mm[:] = X
    mm.flush()
    want = _gm(cvtype, init).fit(np.repeat(X, k, axis=0))
    # streamed for every type ("tied", "spherical": the per-component statistics of the full and diag
    # kernels, reduced in each M-step) against the compiled in-memory fit of the repeated rows
    _same_gm(_gm(cvtype, init).fit(mm, sample_weight=k), want)

    def chunks():
        return (X[a : a + 128] for a in range(0, len(X), 128))

    _same_gm(_gm(cvtype, init).fit(chunks, sample_weight=k.astype(np.float64)), want)
    # without *_init: the streamed k-means initialisation weighs the events
    g = _gm(cvtype, {}, random_state=0).fit(chunks, sample_weight=k.astype(np.float64))
    assert np.isfinite(g.lower_bound_)


@pytest.mark.parametrize("init_params", ["kmeans", "k-means++", "random", "random_from_data"])
def test_gaussian_mixture_weighted_initialisation(rng, init_params):
    pytest.importorskip("sklearn")
    X, k = _data(rng)
    g = _gm("full", {}, init_params=init_params, random_state=1).fit(X, sample_weight=k)
    assert np.isfinite(g.lower_bound_) and g.weights_.sum() == pytest.approx(1.0)


def test_gaussian_mixture_refuses_bad_weights(rng):
    pytest.importorskip("sklearn")
    X, k = _data(rng, N=200)
    for bad, match in (
        (-np.ones(200), "sample_weight has a negative value"),
        (np.ones(199), "sample_weight has 199 values but X has 200 events"),
        (np.r_[np.inf, np.ones(199)], "sample_weight contains NaN or infinity"),
        (np.r_[np.ones(2), np.zeros(198)], "sample_weight has 2 positive values"),
    ):
        with pytest.raises(ValueError, match=match):
            _gm("full", {}).fit(X, sample_weight=bad)
        with pytest.raises(ValueError, match=match):
            _gm("diag", {}).partial_fit(X, sample_weight=bad)


@pytest.mark.parametrize("cvtype", ["full", "diag"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_c_core_takes_the_weights(rng, cvtype, dtype):
    """Every C covariance variant's block statistics with the weights folded into the posteriors by
    the core's E-step (asp_set_weights) equal the float64 reference's weighted statistics; a later
    unweighted block is unweighted again."""
    from asp_gmm.backends import get_backend
    from asp_gmm.problem import Problem

    c, ref = get_backend("c"), get_backend("numpy")
    N, D, M = 1037, 5, 4  # not a multiple of the tile
    X = make_blobs(rng, N, D, M, offset=100.0).astype(dtype)
    w = rng.uniform(0.0, 4.0, N)
    w[::7] = 0.0
    params = (
        np.full(M, 1.0 / M),
        X[:M].astype(np.float64),
        np.repeat(np.eye(D)[None], M, 0) * 30.0 if cvtype == "full" else np.full((M, D), 30.0),
    )
    p = Problem(N, D, M, cvtype, dtype)
    want = ref.open_weighted_stats(p)
    want.set_params(*params, 1e-6)
    expect = want.stats_weighted(X, w)
    tol = 1e-10 if dtype == "float64" else 2e-5
    for v in c.covariance_variants(p):
        runner = c.open_weighted_stats(p, c.kernel(v, c.tunables_for(v, p), p))
        try:
            runner.set_params(*params, 1e-6)
            got = runner.stats_weighted(X, w)
            assert got.n == pytest.approx(w.sum(), rel=1e-12)
            assert got.loglik == pytest.approx(expect.loglik, rel=tol), v.name
            for name in ("nk", "sumx", "s2"):
                a, b = getattr(got, name), getattr(expect, name)
                if name == "s2" and cvtype == "full":
                    a, b = np.tril(a), np.tril(b)
                np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max(), err_msg=f"{v.name} {name}")
            plain = runner.stats(X)
            assert plain.n == N and plain.nk.sum() == pytest.approx(N, rel=1e-5)
        finally:
            runner.close()


def test_the_weighted_random_pick_follows_successive_sampling():
    """seed.event_index with weights and a seed draws M distinct events one after another, each with
    probability proportional to its weight among those left: the frequencies of the ordered pairs of
    4 events (weights 0, 1, 2, 5, and one more group boundary crossed) against the exact law (a
    uniform or an unrenormalised pick is off by 0.1-0.25), and distinct weighted events of a million."""
    from asp_gmm.fit import seed

    w = np.zeros(2051)
    w[[3, 1500, 2050]] = [1.0, 2.0, 5.0]  # three groups of 1024 events, most of them weight 0
    W = w.sum()
    counts = {}
    for s in range(6000):
        got = tuple(seed.event_index(len(w), 2, s, w))
        assert len(set(got)) == 2 and all(w[i] > 0 for i in got)
        counts[got] = counts.get(got, 0) + 1
    for a, b in [(3, 1500), (3, 2050), (1500, 2050)]:
        exact = w[a] / W * w[b] / (W - w[a]) + w[b] / W * w[a] / (W - w[b])
        assert counts.get((a, b), 0) / 6000 == pytest.approx(exact, abs=0.02), (a, b)
    rng = np.random.default_rng(0)
    big = rng.uniform(0, 2, 1_000_000)
    big[rng.random(big.size) < 0.1] = 0.0
    idx = seed.event_index(big.size, 64, 7, big)
    assert len(np.unique(idx)) == 64 and (big[idx] > 0).all()
