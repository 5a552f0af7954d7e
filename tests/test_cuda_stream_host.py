"""The CUDA streaming runner's host code (asp_gmm/backends/cuda/stream.py) against the recording
stand-in for pycuda.driver of test_cuda_host.py: every block is copied, transposed and run through
the E-step, the M-step sums and the covariance variant, the parameters are restored after each block,
a shorter last block re-plans the launches, and only the live components come back. Plumbing, not
numbers: tests/test_streaming_gpu.py checks those on a GPU."""

import sys
import types

import numpy as np
import pytest

from asp_gmm.problem import Problem

cu = pytest.importorskip("asp_gmm.backends.cuda")
from asp_gmm.backends.cuda import device as cu_device  # noqa: E402
from test_cuda_host import NVCC, _fake_driver  # noqa: E402

import shutil  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which(NVCC[0]) is None, reason="nvcc not found (CUDA toolkit)")


@pytest.fixture
def backend(monkeypatch):
    log = []
    drv = _fake_driver(log)
    copies = []
    drv.pagelocked_empty = lambda shape, dt: np.zeros(shape, dt)
    drv.memset_d8_async = lambda *a: log.append("memset_resp")
    drv.memcpy_htod_async = lambda dst, src, stream: (copies.append(np.array(src)), drv.copies.append(copies[-1]))
    drv.memcpy_dtod_async = lambda *a: log.append("restore")
    drv.Stream = lambda: types.SimpleNamespace(synchronize=lambda: None, wait_for_event=lambda e: None)
    drv.Event = lambda: types.SimpleNamespace(record=lambda s: None, synchronize=lambda: None, time_since=lambda o: 1.0)
    pkg = types.ModuleType("pycuda")
    pkg.driver = drv
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", drv)
    cu_device._probe.cache_clear()
    try:
        yield cu.CudaBackend(), log, copies
    finally:
        cu_device._probe.cache_clear()


@pytest.mark.parametrize("M, cvtype", [(3, "full"), (11, "diag")])
def test_blocks_go_through_copy_transpose_estep_sums_and_restore(backend, M, cvtype):
    be, log, copies = backend
    D, cap = 4, 1000
    p = Problem(cap, D, M, cvtype, "float32")
    v = be.covariance_variants(p)[0]
    k = be.kernel(v, be.tunables_for(v, p), p)
    runner = be.open_stats(p, k)
    w, mu = np.full(M, 1.0 / M), np.zeros((M, D))
    cov = np.stack([np.eye(D)] * M) if cvtype == "full" else np.ones((M, D))
    runner.set_params(w, mu, cov, 1e-6)
    X = np.random.default_rng(0).standard_normal((2600, D)).astype(np.float32)
    blocks = [X[:1000], X[1000:2000], X[2000:]]
    out = list(runner.stats_many(blocks))
    assert [b.n for b in out] == [1000, 1000, 600]
    for b in out:
        assert b.nk.shape == (M,) and b.sumx.shape == (M, D)
        assert b.s2.shape == ((M, D, D) if cvtype == "full" else (M, D))
    assert [len(c) for c in copies] == [1000, 1000, 600]  # (the session opened with no upload)
    np.testing.assert_array_equal(np.concatenate(copies), X)  # what reached the device, in order
    assert log.count("asp_upload_chunk") == 3 and log.count("restore") == 3
    assert log.count("read_flag") == 3  # each block's NaN flag, read with its results
    assert log.count("memset_resp") == 1  # the shorter last block
    assert runner.session.problem.N == 600
    runner.close()
    assert runner.session is None


def test_pieces_go_straight_to_pinned_memory_and_a_nan_is_named_by_its_global_row(backend):
    """A block given as row pieces (streaming.blocks(pieces=True): views of the source's chunks) is
    copied into the pinned buffer piece by piece, float64 converted on the way; the device's NaN
    flag of a block names the row in the pass (streaming.pass_stats adds the block's start)."""
    from asp_gmm import streaming
    from asp_gmm.errors import StreamError

    be, log, copies = backend
    M, D, cap = 3, 4, 1000
    p = Problem(cap, D, M, "diag", "float32")
    v = be.covariance_variants(p)[0]
    k = be.kernel(v, be.tunables_for(v, p), p)
    runner = be.open_stats(p, k)
    w, mu, cov = np.full(M, 1.0 / M), np.zeros((M, D)), np.ones((M, D))
    X = np.random.default_rng(1).standard_normal((2500, D))  # float64 source, float32 model
    src = streaming.ArraySource(X, chunk_rows=300)  # blocks of 1000 rows span 4 chunks
    st = streaming.pass_stats(runner, src, Problem(2500, D, M, "diag", "float32"), w, mu, cov, 1e-6)
    assert st.n == 2500 and [len(c) for c in copies] == [1000, 1000, 500]
    np.testing.assert_array_equal(np.concatenate(copies), X.astype(np.float32))
    X[2345, 1] = np.nan
    copies.clear()
    be.device.drv.copies.clear()
    be.device.drv.chunks.clear()
    with pytest.raises(StreamError, match=r"NaN or infinity at row 2345, column 1"):
        streaming.pass_stats(runner, src, Problem(2500, D, M, "diag", "float32"), w, mu, cov, 1e-6)
    runner.close()
