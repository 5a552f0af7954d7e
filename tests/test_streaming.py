"""Streamed EM (asp_gmm/streaming.py): the same answers as in memory for any chunking, every kind of
chunk source, the device budget, progress and logging, and bad sources named precisely."""

import logging

import numpy as np
import pytest

from asp_gmm import GMM, streaming
from asp_gmm.backends import get_backend
from asp_gmm.errors import ASPGMMError, SettingError, StreamError
from asp_gmm.problem import Problem
from conftest import make_blobs

N, D, M = 601, 4, 3
ITERS = 6


def chunked(X, rows):
    """A re-iterable callable source of ``rows``-row chunks of X."""
    return lambda: (X[a : a + rows] for a in range(0, len(X), rows))


def fit(X, cvtype, dtype, backend="c", iters=ITERS, **kw):
    g = GMM(M, X.shape[1] if hasattr(X, "shape") else D, cvtype=cvtype, dtype=dtype, backend=backend, **kw)
    ll = g.train(X, min_em_iters=iters, max_em_iters=iters, tol=0.0)
    return g, ll


def assert_same(g, ll, h, lh, dtype):
    rtol = 1e-10 if dtype == np.float64 else 2e-4
    assert lh == pytest.approx(ll, rel=rtol * (1 if dtype == np.float64 else 0.1))
    scale = np.abs(g.covars).max()
    np.testing.assert_allclose(h.covars, g.covars, rtol=0, atol=rtol * scale)
    np.testing.assert_allclose(h.means, g.means, rtol=0, atol=rtol * max(np.abs(g.means).max(), 1.0))
    np.testing.assert_allclose(h.weights, g.weights, rtol=0, atol=rtol)
    assert h.n_iter == g.n_iter == ITERS and h.n_events == g.n_events


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("cvtype", ["full", "diag"])
@pytest.mark.parametrize("rows", [1, 7, N, N - 1])
def test_streamed_equals_in_memory_for_any_chunk_size(rows, cvtype, dtype, rng, monkeypatch):
    X = make_blobs(rng, N, D, M).astype(dtype)
    g, ll = fit(X, cvtype, dtype)
    assert "streamed" not in g.last_variant
    # blocks of 256 rows: several blocks a pass, so the cross-block sums are exercised too
    monkeypatch.setenv("ASP_GMM_BLOCK_BYTES", "1")
    h, lh = fit(chunked(X, rows), cvtype, dtype)
    assert h.last_variant.endswith("(streamed)")
    assert_same(g, ll, h, lh, dtype)


@pytest.mark.parametrize("cvtype", ["full", "diag"])
def test_offset_data_keeps_its_accuracy(cvtype, rng, monkeypatch):
    X = make_blobs(rng, N, D, M) + 1000.0
    g, ll = fit(X, cvtype, np.float64)
    monkeypatch.setenv("ASP_GMM_BLOCK_BYTES", "1")
    h, lh = fit(chunked(X, 13), cvtype, np.float64)
    assert_same(g, ll, h, lh, np.float64)


def test_numpy_backend_streams_too(rng):
    X = make_blobs(rng, N, D, M)
    g, ll = fit(X, "full", np.float64, backend="numpy")
    h, lh = fit(chunked(X, 50), "full", np.float64, backend="numpy")
    assert_same(g, ll, h, lh, np.float64)


def test_block_size_does_not_change_the_answer(rng, monkeypatch):
    X = make_blobs(rng, 3000, D, M)
    monkeypatch.setenv("ASP_GMM_BLOCK_BYTES", "1")
    a, la = fit(chunked(X, 100), "full", np.float64)
    monkeypatch.setenv("ASP_GMM_BLOCK_BYTES", str(10**9))
    b, lb = fit(chunked(X, 100), "full", np.float64)
    assert_same(a, la, b, lb, np.float64)


def test_memmap_source(rng, tmp_path):
    X = make_blobs(rng, N, D, M)
    mm = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.float64, shape=X.shape)
    mm[:] = X
    mm.flush()
    src = np.load(tmp_path / "x.npy", mmap_mode="r")
    assert streaming.is_source(src) and not streaming.is_source(X)
    g, ll = fit(X, "diag", np.float64)
    h, lh = fit(src, "diag", np.float64)
    assert h.last_variant.endswith("(streamed)")
    assert_same(g, ll, h, lh, np.float64)


def test_h5py_dataset_source(rng, tmp_path):
    h5py = pytest.importorskip("h5py")
    X = make_blobs(rng, N, D, M)
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f.create_dataset("X", data=X, chunks=(64, D))
    g, ll = fit(X, "full", np.float64)
    with h5py.File(tmp_path / "x.h5", "r") as f:
        assert streaming.is_source(f["X"])
        assert streaming.as_source(f["X"]).chunk_rows % 64 == 0  # whole dataset chunks
        h, lh = fit(f["X"], "full", np.float64)
    assert_same(g, ll, h, lh, np.float64)


def test_zarr_array_source(rng, tmp_path):
    zarr = pytest.importorskip("zarr")
    X = make_blobs(rng, N, D, M)
    z = zarr.open(str(tmp_path / "x.zarr"), mode="w", shape=X.shape, chunks=(100, D), dtype="f8")
    z[:] = X
    g, ll = fit(X, "diag", np.float64)
    h, lh = fit(zarr.open(str(tmp_path / "x.zarr"), mode="r"), "diag", np.float64)
    assert_same(g, ll, h, lh, np.float64)


def test_seeding_from_a_stream_matches_in_memory_seeding(rng):
    X = make_blobs(rng, N, D, M)
    for seed in (None, 5):
        g = GMM(M, D, dtype=np.float64, backend="c", seed=seed)
        h = GMM(M, D, dtype=np.float64, backend="c", seed=seed)
        g.train(X, max_em_iters=0)
        h.train(chunked(X, 10), max_em_iters=0)
        np.testing.assert_array_equal(h.means, g.means)
        np.testing.assert_allclose(h.covars, g.covars, rtol=1e-12)
        assert h.loglik == pytest.approx(g.loglik, rel=1e-12)


def test_x_beyond_the_device_budget_is_streamed(rng, monkeypatch):
    X = make_blobs(rng, N, D, M)
    g, ll = fit(X, "full", np.float64)
    monkeypatch.setenv("ASP_GMM_DEVICE_BUDGET", "1k")
    assert streaming.device_budget(get_backend("c")) == 1024
    h, lh = fit(X, "full", np.float64)
    assert h.last_variant.endswith("(streamed)")
    assert_same(g, ll, h, lh, np.float64)
    monkeypatch.setenv("ASP_GMM_DEVICE_BUDGET", "1G")
    assert "streamed" not in fit(X, "full", np.float64)[0].last_variant


@pytest.mark.parametrize(
    "name, value",
    [
        ("ASP_GMM_DEVICE_BUDGET", "lots"),
        ("ASP_GMM_DEVICE_BUDGET", "-5"),
        ("ASP_GMM_MEMORY_FRACTION", "2"),
        ("ASP_GMM_PROGRESS", "maybe"),
    ],
)
def test_bad_settings_are_named(name, value, rng, monkeypatch):
    monkeypatch.setenv(name, value)
    X = make_blobs(rng, 50, D, M)
    with pytest.raises(SettingError, match=name):  # the budget is consulted for in-memory data
        fit(chunked(X, 10) if name == "ASP_GMM_PROGRESS" else X, "full", np.float64)


def test_progress_bar_and_info_log(rng, monkeypatch, caplog, capsys):
    pytest.importorskip("tqdm")
    monkeypatch.setenv("ASP_GMM_PROGRESS", "1")
    with caplog.at_level(logging.INFO, logger="asp_gmm"):
        fit(chunked(make_blobs(rng, 300, D, M), 50), "diag", np.float64, iters=2)
    passes = [r.getMessage() for r in caplog.records if "streamed pass" in r.getMessage()]
    assert len(passes) == 3 and "events/s" in passes[0] and "log-likelihood" in passes[-1]
    assert "EM pass 2" in capsys.readouterr().err


# ------------------------------------------------------------------------------ bad sources
def test_nan_in_the_37th_chunk_names_chunk_and_row(rng):
    X = make_blobs(rng, 500, D, M)
    X[363, 2] = np.nan  # chunks of 10 rows: the 37th chunk (index 36) holds rows 360-369
    with pytest.raises(
        StreamError,
        match=r"37th chunk .*chunk index 36, from row 360.* row 363 \(row 3 of the "
        r"chunk\), column 2",
    ) as exc:
        fit(chunked(X, 10), "full", np.float64)
    assert isinstance(exc.value, ValueError) and isinstance(exc.value, ASPGMMError)


def test_chunk_of_the_wrong_width(rng):
    X = make_blobs(rng, 100, D, M)

    def src():
        yield X[:50]
        yield X[50:, :3]

    with pytest.raises(StreamError, match=r"2nd chunk .* 3 columns but the model has D=4"):
        fit(src, "full", np.float64)


@pytest.mark.parametrize("empty", [lambda: iter(()), lambda: [np.empty((0, D))]])
def test_a_source_that_yields_nothing(empty):
    with pytest.raises(StreamError, match="yielded no rows"):
        GMM(M, D, backend="c").train(empty)


def test_a_source_that_changes_between_passes(rng):
    X = make_blobs(rng, 200, D, M)
    calls = []

    def src():
        calls.append(1)
        return iter([X[:150]] if len(calls) > 3 else [X])

    g = GMM(M, D, backend="c", means=X[:M], covars=np.repeat(np.eye(D)[None], M, 0), weights=np.full(M, 1 / M))
    with pytest.raises(StreamError, match="same rows on every pass"):
        g.train(src, max_em_iters=5, tol=0)


def test_integer_chunks_and_wrong_returns_are_refused(rng):
    with pytest.raises(StreamError, match="dtype int64"):
        GMM(M, D, backend="c").train(lambda: [np.ones((50, D), np.int64)])
    with pytest.raises(StreamError, match="not an iterable"):
        GMM(M, D, backend="c").train(lambda: 3)
    with pytest.raises(StreamError, match="fewer than the M=3"):
        GMM(M, D, backend="c").train(lambda: [np.ones((2, D))])


# ------------------------------------------------------------------------------ statistics
@pytest.mark.parametrize("cvtype", ["full", "diag"])
def test_recentred_statistics_equal_statistics_around_the_new_centre(cvtype, rng):
    from asp_gmm.backends.base import stats_from_posteriors

    X = make_blobs(rng, 400, D, M) + 50
    resp = rng.dirichlet(np.ones(M), 400)
    c1, c2 = X[:M] + 0.5, X[M : 2 * M] - 0.25
    s = streaming.SuffStats(M, D, cvtype, c1)
    s.add_block(stats_from_posteriors(X, np.zeros(400), resp, c1, cvtype))
    t = streaming.SuffStats(M, D, cvtype, c2)
    t.add_block(stats_from_posteriors(X, np.zeros(400), resp, c2, cvtype))
    r = s.recentred(c2)
    np.testing.assert_allclose(r.s1, t.s1, atol=1e-9 * np.abs(t.s1).max())
    np.testing.assert_allclose(r.s2, t.s2, rtol=1e-10)
    both = s.add(t)
    np.testing.assert_allclose(both.nk, 2 * t.nk)
    np.testing.assert_allclose(both.s2, 2 * s.s2, rtol=1e-10)


def test_block_statistics_of_c_and_numpy_agree(rng):
    X = make_blobs(rng, 700, D, M)
    prob = Problem(256, D, M, "full", "float64")
    from asp_gmm.specializer import Specializer

    w = np.full(M, 1 / M)
    mu = X[:M].copy()
    cv = np.repeat(np.cov(X.T)[None], M, 0)
    out = []
    for be in ("c", "numpy"):
        sp = streaming.plan(Specializer(be), prob)
        r = get_backend(be).open_stats(sp.problem, sp.kernel)
        r.set_params(w, mu, cv, 1e-6)
        out.append([r.stats(np.ascontiguousarray(X[a : a + 256])) for a in range(0, 700, 256)])
        r.close()
    for a, b in zip(*out):
        assert a.n == b.n and a.loglik == pytest.approx(b.loglik, rel=1e-12)
        np.testing.assert_allclose(a.nk, b.nk, rtol=1e-12)
        np.testing.assert_allclose(a.sumx, b.sumx, rtol=1e-11, atol=1e-9)
        np.testing.assert_allclose(a.s2, b.s2, rtol=1e-11, atol=1e-9)


def test_pass_sums_are_compensated_across_blocks():
    # a large first block and many small ones: plain float64 addition loses every small block
    # (1e16 + 1 == 1e16); the compensated sums keep them, in add_block and in add (Dask's tree)
    from types import SimpleNamespace

    def block(ll, nk):
        nk = np.full(2, nk)
        return SimpleNamespace(n=1, loglik=ll, nk=nk, sumx=np.zeros((2, 1)), s2=np.zeros((2, 1)))

    st = streaming.SuffStats(2, 1, "diag", np.zeros((2, 1)))
    st.add_block(block(1e16, 1e16))
    for _ in range(1000):
        st.add_block(block(1.0, 1.0))
    st.add_block(block(-1e16, -1e16))
    assert st.loglik == 1000.0 and np.array_equal(st.nk, [1000.0, 1000.0])
    parts = [streaming.SuffStats(2, 1, "diag", np.zeros((2, 1))) for _ in range(3)]
    parts[0].add_block(block(1e16, 0.0))
    for _ in range(500):
        parts[1].add_block(block(1.0, 0.0))
    parts[2].add_block(block(-1e16, 0.0))
    assert parts[0].add(parts[1]).add(parts[2]).loglik == 500.0


def test_a_failed_device_memory_query_is_reported(monkeypatch, caplog):
    class NoDevice:
        name = "cuda"

        @property
        def device(self):
            raise RuntimeError("driver gone")

    monkeypatch.delenv("ASP_GMM_DEVICE_BUDGET", raising=False)
    monkeypatch.setattr(streaming, "_warned_free_memory", [])
    with caplog.at_level(logging.WARNING, logger="asp_gmm"):
        assert streaming.device_budget(NoDevice()) is None
        assert streaming.device_budget(NoDevice()) is None
    msgs = [r.getMessage() for r in caplog.records if "free memory" in r.getMessage()]
    assert len(msgs) == 1 and "driver gone" in msgs[0] and "ASP_GMM_DEVICE_BUDGET" in msgs[0]
