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
    drv.memcpy_htod_async = lambda dst, src, stream: copies.append(np.array(src))
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
    copies = copies[1:]  # (the first: the session's opening upload, through the staging buffers)
    assert [len(c) for c in copies] == [1000, 1000, 600]
    np.testing.assert_array_equal(np.concatenate(copies), X)  # what reached the device, in order
    assert log.count("asp_transpose") == 3 and log.count("restore") == 3
    assert log.count("asp_upload_chunk") == 1  # the session opening
    assert log.count("memset_resp") == 1  # the shorter last block
    assert runner.session.problem.N == 600
    runner.close()
    assert runner.session is None
