"""asp_gmm.dask on a GPU worker (skipped without a GPU): the blocks stay resident on the worker's GPU
(NumPy blocks uploaded once, CuPy blocks used where they lie) and the fit equals the in-process GPU
fit on the same data (float32)."""

import sys

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import asp_gmm.dask as agd  # noqa: E402
import cloudpickle  # noqa: E402
import conftest  # noqa: E402
from asp_gmm import GMM  # noqa: E402
from asp_gmm.backends import cuda as cu  # noqa: E402
from asp_gmm.errors import StreamError  # noqa: E402
from conftest import make_blobs  # noqa: E402

REASON = cu.CudaBackend.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"CUDA backend unavailable: {REASON}")

cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(conftest)

N, D, M, ITERS = 40_000, 7, 5, 4


@pytest.fixture(scope="module")
def client():
    with agd.gpu_cluster(1) as cluster, distributed.Client(cluster) as c:
        c.wait_for_workers(1)
        yield c


def data():
    return make_blobs(np.random.default_rng(11), N, D, M, offset=10.0, dtype=np.float32)


def _on_gpu(block):
    import cupy

    return cupy.asarray(block)


@pytest.mark.parametrize("cvtype", ["full", "diag"])
@pytest.mark.parametrize("where", ["host", "device"])
def test_resident_blocks_on_the_gpu_equal_the_in_process_fit(client, cvtype, where):
    X = data()
    dX = da.from_array(X, chunks=(9_000, D))
    if where == "device":
        pytest.importorskip("cupy")
        dX = dX.map_blocks(_on_gpu, dtype=np.float32, meta=np.empty((0, D), np.float32))
    g = GMM(M, D, cvtype=cvtype, backend="cuda")
    g.train(X, min_em_iters=ITERS, max_em_iters=ITERS, tol=0.0)
    r = agd.fit(dX, M, cvtype=cvtype, backend="cuda", min_iters=ITERS, max_iters=ITERS, tol=0.0)
    assert r.loads == 5 and r.workers == 1 and r.iters == ITERS
    assert r.loglik == pytest.approx(g.loglik, rel=1e-5)
    np.testing.assert_allclose(r.covars, g.covars, rtol=0, atol=1e-4 * np.abs(g.covars).max())
    np.testing.assert_allclose(r.means, g.means, rtol=0, atol=1e-4 * np.abs(g.means).max())


def _nan_on_gpu(block, block_id=None):
    import cupy

    out = cupy.asarray(block)
    if block_id[0] == 2:
        out[17, 3] = cupy.nan
    return out


def test_nan_in_a_device_block_names_worker_block_and_row(client):
    pytest.importorskip("cupy")
    dX = da.from_array(data(), chunks=(9_000, D)).map_blocks(
        _nan_on_gpu, dtype=np.float32, meta=np.empty((0, D), np.float32)
    )
    with pytest.raises(
        StreamError, match=r"on worker \S+, block 2 of X .* at row 18017 \(row 17 of the block\), column 3"
    ):
        agd.fit(dX, M, backend="cuda", max_iters=1)
