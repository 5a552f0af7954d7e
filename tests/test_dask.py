"""Distributed EM on Dask (asp_gmm/dask.py): a LocalCluster of 2 worker processes gives the
single-process answer, also when a worker dies mid-pass; bad inputs are named."""

import os
import sys

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import asp_gmm.dask as agd  # noqa: E402
import cloudpickle  # noqa: E402
import conftest  # noqa: E402
from asp_gmm import GMM  # noqa: E402
from asp_gmm.errors import ASPGMMError, StreamError  # noqa: E402
from conftest import make_blobs  # noqa: E402

# the worker processes cannot import the tests: the test's block function travels by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(conftest)

N, D, M = 3000, 4, 3
ITERS = 5


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, worker_dashboard_address=None
    )
    with cluster, distributed.Client(cluster) as c:
        yield c


def data(seed=3, offset=0.0):
    return make_blobs(np.random.default_rng(seed), N, D, M, offset=offset)


def in_process(X, cvtype, dtype=np.float64):
    g = GMM(M, D, cvtype=cvtype, dtype=dtype, backend="c")
    g.train(X, min_em_iters=ITERS, max_em_iters=ITERS, tol=0.0)
    return g


def assert_same(r, g, tol=1e-10):
    assert r.loglik == pytest.approx(g.loglik, rel=tol)
    assert r.iters == g.n_iter and r.n_events == g.n_events and len(r.loglik_trace) == ITERS + 1
    np.testing.assert_allclose(r.covars, g.covars, rtol=0, atol=tol * np.abs(g.covars).max())
    np.testing.assert_allclose(r.means, g.means, rtol=0, atol=tol * np.abs(g.means).max())
    np.testing.assert_allclose(r.weights, g.weights, rtol=0, atol=tol)


@pytest.mark.parametrize("cvtype", ["full", "diag"])
def test_two_worker_processes_equal_a_single_process(client, cvtype):
    X = data(offset=100.0)
    g = in_process(X, cvtype)
    dX = da.from_array(X, chunks=(700, D)).persist()
    assert len(client.scheduler_info()["workers"]) == 2
    r = agd.fit(dX, M, cvtype=cvtype, dtype=np.float64, backend="c", min_iters=ITERS, max_iters=ITERS, tol=0.0)
    assert_same(r, g)


def _block_or_die(block_id, marker):
    """Block ``block_id[0]`` of the test data; the first call that finds ``marker`` removes it and
    kills its worker process (a worker lost mid-pass)."""
    i = block_id[0]
    if i == 2 and os.path.exists(marker):
        try:
            os.remove(marker)
        except FileNotFoundError:
            pass
        else:
            os._exit(1)
    X = data()
    return X[i * 500 : (i + 1) * 500]


def test_a_worker_killed_mid_fit_changes_nothing(client, tmp_path):
    X = data()
    g = in_process(X, "full")
    marker = str(tmp_path / "kill-a-worker")
    dX = da.map_blocks(_block_or_die, marker=marker, chunks=((500,) * (N // 500), (D,)), dtype=np.float64)
    passes = []

    def arm(k, ll):
        passes.append(k)
        if k == 1:  # the third pass loses a worker while it computes its blocks
            open(marker, "w").close()

    r = agd.fit(
        dX, M, cvtype="full", dtype=np.float64, backend="c", min_iters=ITERS, max_iters=ITERS, tol=0.0, callback=arm
    )
    assert not os.path.exists(marker), "the worker was never killed"
    assert passes == list(range(ITERS + 1))
    assert_same(r, g)


def test_nan_in_a_block_names_the_block_and_row(client):
    X = data()
    X[1234, 1] = np.nan
    with pytest.raises(StreamError, match=r"3rd chunk .*from row 1000.* row 1234 \(row 234 of the chunk\), column 1"):
        agd.fit(
            da.from_array(X, chunks=(500, D)),
            M,
            dtype=np.float64,
            backend="c",
            means=X[:M],
            covars=np.repeat(np.eye(D)[None], M, 0),
            weights=np.full(M, 1 / M),
        )


def test_bad_inputs_are_named():
    with pytest.raises(agd.DaskInputError, match="needs a dask.array") as exc:
        agd.fit(np.ones((10, 2)), 2)
    assert isinstance(exc.value, ASPGMMError) and isinstance(exc.value, ValueError)
    with pytest.raises(agd.DaskInputError, match="floating-point"):
        agd.fit(da.ones((10, 2), dtype=int, chunks=5), 2)
    with pytest.raises(agd.DaskInputError, match="fewer than the M=20"):
        agd.fit(da.ones((10, 2), chunks=5), 20)
    with pytest.raises(agd.DaskInputError, match="max_iters must be an integer >= 0"):
        agd.fit(da.ones((10, 2), chunks=5), 2, max_iters=-1)


def test_local_scheduler_without_a_cluster_gives_the_same_answer():
    X = data()
    g = in_process(X, "diag")
    r = agd.fit(
        da.from_array(X, chunks=(1000, 2)),
        M,
        cvtype="diag",
        dtype=np.float64,
        backend="c",
        min_iters=ITERS,
        max_iters=ITERS,
        tol=0.0,
        client=False,
        split_every=2,
    )
    assert_same(r, g)


def test_one_worker_per_gpu_sees_only_its_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert agd.gpu_count() == 2
    specs = agd.gpu_worker_specs(2)
    assert [s["options"]["env"]["CUDA_VISIBLE_DEVICES"] for s in specs.values()] == ["3", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(agd.DaskInputError, match="no GPU"):
        agd.gpu_cluster()


def test_the_workers_runners_are_closed_when_the_fit_ends(client, monkeypatch):
    # each worker thread keeps one open statistics runner for the passes of a fit (on CUDA workers:
    # pinned and device buffers); the fit closes them when it ends, here and on the workers
    from asp_gmm.backends import c as cbackend

    opened, closed = [], []
    orig_open, orig_close = cbackend.CBackend.open_stats, cbackend.CStatsRunner.close
    monkeypatch.setattr(
        cbackend.CBackend, "open_stats", lambda self, *a, **k: opened.append(1) or orig_open(self, *a, **k)
    )
    monkeypatch.setattr(cbackend.CStatsRunner, "close", lambda self: closed.append(1) or orig_close(self))
    X = data()
    kw = dict(cvtype="diag", dtype=np.float64, backend="c", min_iters=2, max_iters=2, tol=0.0)
    agd.fit(da.from_array(X, chunks=(500, D)), M, client=False, **kw)  # the threaded scheduler, in this process
    assert opened and len(closed) == len(opened)
    agd.fit(da.from_array(X, chunks=(700, D)).persist(), M, **kw)  # two worker processes
    assert client.run(lambda: len(agd._runners)) and set(client.run(lambda: len(agd._runners)).values()) == {0}
