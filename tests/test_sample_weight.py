"""sample_weight through every path of the fitting wing (asp_gmm/fit/): an event of integer weight k is
k copies of it (float64, 1e-10), weight 0 is a dropped event, and bad weights are refused with a
message naming the argument. In memory, memmap, callable source; NumPy and C backends; full and diag
(GMM) and every covariance type (GaussianMixture, fit and partial_fit)."""

import numpy as np
import pytest

from asp_gmm import GMM
from conftest import make_blobs

RTOL = 1e-10


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
