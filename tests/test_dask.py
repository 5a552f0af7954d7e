"""Distributed EM on Dask (asp_gmm/dask/): a cluster started with the ``dask scheduler`` and
``dask worker`` commands (2 worker processes) gives the single-process answer, also when a worker is
killed between passes; each worker's blocks are loaded once and never sent again; bad blocks and bad
sample weights are named (worker, block, row); integer sample weights equal repeated rows."""

import os
import signal
import subprocess
import sys
import time

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

# the worker processes cannot import the tests: the test's block functions travel by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(conftest)

N, D, M = 3000, 4, 3
ITERS = 5


def _dask_cli():
    exe = os.path.join(os.path.dirname(sys.executable), "dask")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "dask"]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """A scheduler and two workers started as the commands a cluster's operator runs."""
    logs = tmp_path_factory.mktemp("dask")
    sched_file = str(logs / "scheduler.json")
    # the scheduler and the workers import this module's block functions, as a real deployment
    # imports its own code: the tests folder is on their path
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    procs = [
        subprocess.Popen(
            _dask_cli() + ["scheduler", "--scheduler-file", sched_file, "--port", "0", "--no-dashboard"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(logs / "scheduler.log", "w"),
        )
    ]
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(sched_file) and time.monotonic() < deadline:
            time.sleep(0.1)
        for i in range(2):
            procs.append(
                subprocess.Popen(
                    _dask_cli()
                    + ["worker", "--scheduler-file", sched_file, "--nthreads", "1", "--no-dashboard"]
                    + ["--memory-limit", "0"],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=open(logs / f"worker-{i}.log", "w"),
                )
            )
        with distributed.Client(scheduler_file=sched_file, timeout=60) as c:
            c.wait_for_workers(2, timeout=60)
            yield c
    finally:
        for p in procs[::-1]:
            p.terminate()
        for p in procs[::-1]:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def data(seed=3, offset=0.0):
    return make_blobs(np.random.default_rng(seed), N, D, M, offset=offset)


def in_process(X, cvtype, dtype=np.float64):
    g = GMM(M, D, cvtype=cvtype, dtype=dtype, backend="c")
    g.train(X, min_em_iters=ITERS, max_em_iters=ITERS, tol=0.0)
    return g


def assert_same(r, g, tol=1e-10, n_events=None):
    assert r.loglik == pytest.approx(g.loglik, rel=tol)
    assert r.iters == g.n_iter and len(r.loglik_trace) == ITERS + 1
    assert r.n_events == (g.n_events if n_events is None else n_events)
    np.testing.assert_allclose(r.covars, g.covars, rtol=0, atol=tol * np.abs(g.covars).max())
    np.testing.assert_allclose(r.means, g.means, rtol=0, atol=tol * np.abs(g.means).max())
    np.testing.assert_allclose(r.weights, g.weights, rtol=0, atol=tol)


def fit(dX, cvtype="full", **kw):
    return agd.fit(dX, M, cvtype=cvtype, dtype=np.float64, backend="c", min_iters=ITERS, max_iters=ITERS, tol=0.0, **kw)


@pytest.mark.parametrize("cvtype", ["full", "diag"])
def test_scheduler_and_two_worker_commands_equal_a_single_process(client, cvtype):
    X = data(offset=100.0)
    g = in_process(X, cvtype)
    dX = da.from_array(X, chunks=(700, D)).persist()
    distributed.wait(dX)
    assert len(client.scheduler_info()["workers"]) == 2
    r = fit(dX, cvtype)
    assert_same(r, g)
    assert r.workers == 2 and r.restarts == 0 and r.loads == 5


def _generated(block_id, seed):
    """Block ``block_id[0]`` of the test data, made where the task runs (the blocks' source)."""
    i = block_id[0]
    return data(seed)[i * 500 : (i + 1) * 500]


def test_a_worker_killed_mid_loop_changes_nothing(client):
    X = data(seed=5)
    g = in_process(X, "full")
    dX = da.map_blocks(_generated, seed=5, chunks=((500,) * (N // 500), (D,)), dtype=np.float64, meta=np.empty((0, D)))
    pids = list(client.run(os.getpid).values())
    passes = []

    def kill(k, ll):
        passes.append(k)
        if k == 1:  # both loops wait for pass 2's parameters: one loses its worker process
            os.kill(pids[0], signal.SIGKILL)

    r = fit(dX, callback=kill)
    assert r.restarts >= 1, "the lost worker went unnoticed"
    assert passes == list(range(ITERS + 1))
    assert_same(r, g)
    client.wait_for_workers(2, timeout=30)  # the nanny started a new worker


def test_workers_lost_more_often_than_allowed_are_reported(client):
    dX = da.map_blocks(_generated, seed=6, chunks=((500,) * (N // 500), (D,)), dtype=np.float64, meta=np.empty((0, D)))
    pids = list(client.run(os.getpid).values())

    def kill(k, ll):
        if k == 0:
            os.kill(pids[-1], signal.SIGKILL)

    with pytest.raises(agd.WorkersLostError, match=r"lost 1 times .* raise max_restarts"):
        fit(dX, callback=kill, max_restarts=0)
    client.wait_for_workers(2, timeout=30)


class Recorded:
    """A block that records every time it is pickled (sent between processes) in ``log``: the
    recording stand-in for a transfer."""

    def __init__(self, arr, log):
        self.arr, self.log = arr, log
        self.shape, self.dtype, self.ndim = arr.shape, arr.dtype, arr.ndim

    def __array__(self, dtype=None, copy=None):
        return self.arr if dtype is None else self.arr.astype(dtype)

    def __getitem__(self, idx):
        return self.arr[idx]

    def __reduce__(self):
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return (Recorded, (self.arr, self.log))


def _recorded_block(block_id, log):
    i = block_id[0]
    return Recorded(data()[i * 600 : (i + 1) * 600], log)


def test_resident_blocks_are_not_sent_again(client, tmp_path):
    log = str(tmp_path / "sent")
    open(log, "w").close()
    dX = da.map_blocks(
        _recorded_block, log=log, chunks=((600,) * 5, (D,)), dtype=np.float64, meta=np.empty((0, D))
    ).persist()
    distributed.wait(dX)
    r = fit(dX)
    assert r.iters == ITERS and r.loads == 5 and r.workers == 2
    with open(log) as f:
        assert f.read() == "", "a block was sent between processes during the fit"
    client.gather(distributed.futures_of(dX)[0])  # the stand-in does record a transfer
    with open(log) as f:
        assert len(f.read().split()) >= 1


def _bad_block(block_id, kind):
    i = block_id[0]
    X = data()[i * 500 : (i + 1) * 500]
    if kind == "nan" and i == 3:
        X[234, 1] = np.nan
    if kind == "width" and i == 1:
        X = np.hstack([X, X[:, :1]])
    return X


def test_nan_in_one_workers_block_names_worker_block_and_row(client):
    dX = da.map_blocks(_bad_block, kind="nan", chunks=((500,) * 6, (D,)), dtype=np.float64, meta=np.empty((0, D)))
    with pytest.raises(StreamError, match=r"on worker tcp://\S+, block 3 of X .*NaN or infinity at row 1734 \(row 234"):
        fit(dX)


def test_blocks_of_different_widths_are_named(client):
    dX = da.map_blocks(_bad_block, kind="width", chunks=((500,) * 6, (D,)), dtype=np.float64, meta=np.empty((0, D)))
    with pytest.raises(StreamError, match=r"on worker tcp://\S+, block 1 of X \(rows 500 to 999\).* 5 columns"):
        fit(dX)


def test_integer_sample_weights_equal_repeated_rows(client):
    X = data(seed=7)
    w = np.random.default_rng(1).integers(0, 4, N)
    g = in_process(np.repeat(X, w, axis=0), "full")
    r = fit(da.from_array(X, chunks=(800, D)), sample_weight=da.from_array(w, chunks=1000))
    assert_same(r, g, n_events=N)
    assert r.weight_total == w.sum()
    rd = fit(da.from_array(X, chunks=(800, D)), "diag", sample_weight=w.astype(float))
    assert_same(rd, in_process(np.repeat(X, w, axis=0), "diag"), n_events=N)


def test_bad_sample_weights_are_named(client):
    X = da.from_array(data(), chunks=(1000, D))
    w = np.ones(N)
    w[2345] = -1.0
    with pytest.raises(StreamError, match=r"sample_weight on worker tcp://\S+, block 2 .*-1.0 at row 2345"):
        fit(X, sample_weight=w)
    w[2345] = np.nan
    with pytest.raises(StreamError, match=r"sample_weight .*nan at row 2345"):
        fit(X, sample_weight=w)
    with pytest.raises(agd.DaskInputError, match=r"sample_weight must be 1-D with one weight per row"):
        fit(X, sample_weight=np.ones(N - 1))
    with pytest.raises(agd.DaskInputError, match=r"sample_weight sums to 0"):
        fit(X, sample_weight=np.zeros(N))


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


def test_without_a_cluster_one_worker_in_this_process_gives_the_same_answer():
    X = data()
    g = in_process(X, "diag")
    r = fit(da.from_array(X, chunks=(1000, 2)), "diag", client=False)
    assert_same(r, g)
    assert r.workers == 1 and r.loads == 3


def test_one_worker_per_gpu_sees_only_its_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert agd.gpu_count() == 2
    specs = agd.gpu_worker_specs(2)
    assert [s["options"]["env"]["CUDA_VISIBLE_DEVICES"] for s in specs.values()] == ["3", "5"]
    assert all(s["options"]["memory_limit"] == 0 for s in specs.values())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(agd.DaskInputError, match="no GPU"):
        agd.gpu_cluster()


def test_the_workers_resident_stores_are_closed_when_the_fit_ends(monkeypatch):
    # each worker's loop keeps its resident blocks and an open statistics runner for the passes of a
    # fit (on CUDA workers: pinned and device buffers); the loop closes them when the fit ends
    from asp_gmm.dask import _worker

    opened, closed = [], []
    orig_init, orig_close = _worker.BlockStore.__init__, _worker.BlockStore.close

    def init(self, *a, **k):
        opened.append(self)
        orig_init(self, *a, **k)

    def close(self):
        closed.append(self)
        orig_close(self)

    monkeypatch.setattr(_worker.BlockStore, "__init__", init)
    monkeypatch.setattr(_worker.BlockStore, "close", close)
    X = data()
    kw = dict(cvtype="diag", dtype=np.float64, backend="c", min_iters=2, max_iters=2, tol=0.0)
    agd.fit(da.from_array(X, chunks=(500, D)), M, client=False, **kw)  # one worker in this process
    assert opened and [id(s) for s in closed] == [id(s) for s in opened]
    assert all(s.runner is None and s.items == [] for s in closed)


def test_the_dask_result_is_a_train_result(client):
    """One TrainResult for every entry: the Dask result derives from it and fills its fields (the
    configuration, why it was chosen, the weight sum as every weighted fit reports it)."""
    from asp_gmm.fit.result import TrainResult

    assert issubclass(agd.DaskFitResult, TrainResult)
    X = data(seed=11)
    r = fit(da.from_array(X, chunks=(1000, D)))
    assert isinstance(r, TrainResult) and r.explored == [] and r.reason and r.variant
    assert r.weight_sum == 0.0 and r.weight_total == N and r.n_events == N
    assert len(r.loglik_trace) == r.iters + 1 and r.seconds > 0
    w = np.random.default_rng(2).uniform(0.0, 2.0, N)
    rw = fit(da.from_array(X, chunks=(1000, D)), sample_weight=w)
    assert rw.weight_sum == pytest.approx(w.sum()) and rw.weight_total == rw.weight_sum
