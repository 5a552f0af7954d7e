"""The CUDA backend's host code (device, compile, launch plans, memory pool, session EM loop) run
against a stand-in for pycuda.driver that records launches instead of running them: no GPU needed.
It checks the plumbing between the package's modules (argument counts match the prepared
signatures, the padded problem reaches the binaries and only the live components come back, the
buffer pool is reused and freed), not numbers: tests/test_cuda_gpu.py checks those on a GPU."""

import shutil
import sys
import types

import numpy as np
import pytest

from asp_gmm.problem import Problem

cu = pytest.importorskip("asp_gmm.backends.cuda")
from asp_gmm.backends.cuda import device as cu_device  # noqa: E402

NVCC = cu.nvcc_command()
pytestmark = pytest.mark.skipif(shutil.which(NVCC[0]) is None, reason="nvcc not found (CUDA toolkit)")


class _Ptr:
    _next = 4096

    def __init__(self, n, log):
        self.addr, self.log = _Ptr._next, log
        _Ptr._next += max(int(n), 16) + 256
        log.append("alloc")

    def __int__(self):
        return self.addr

    def free(self):
        self.log.append("free")


def _fake_driver(log):
    drv = types.ModuleType("pycuda.driver")

    class Error(Exception):
        pass

    class Ctx:
        def push(self):
            pass

    class Device:
        count = staticmethod(lambda: 1)

        def __init__(self, i):
            pass

        def retain_primary_context(self):
            return Ctx()

        def get_attribute(self, a):
            return {1: 1024, 2: 49152, 3: 132, 4: 232448}[a]

        def compute_capability(self):
            return (9, 0)

        def name(self):
            return "stand-in"

        def total_memory(self):
            return 80 << 30

    class Fn:
        def __init__(self, name):
            self.name = name

        def prepare(self, sig):
            self.sig = sig

        def prepared_async_call(self, grid, block, stream, *args, shared_size=0):
            assert len(args) == len(self.sig), (self.name, self.sig, args)
            log.append(self.name)
            if self.name == "asp_upload_chunk":  # (row0, rows, span) of the staged chunk
                drv.chunks.append((int(args[2]), int(args[3]), int(args[4])))

        def prepared_call(self, grid, block, *args):
            assert len(args) == len(self.sig), (self.name, self.sig, args)
            log.append(self.name)

        def set_attribute(self, a, v):
            pass

    class Module:
        def get_function(self, name):
            return Fn(name)

        def get_global(self, name):
            return _Ptr(8, log), 8

    def module_from_buffer(image):
        assert isinstance(image, bytes) and image  # compile_cubin's cubin
        log.append("load")
        return Module()

    def memcpy_dtoh(dst, src):
        if dst.dtype == np.int32 and dst.size == 2:
            dst[:] = (256, 1)  # the moments geometry

    def memcpy_dtoh_async(dst, src, stream):
        if dst.dtype == np.int32:  # the upload's NaN flag: what asp_upload_chunk found in the staged chunks
            log.append("read_flag")
            bad = [
                r0 + i for c, (r0, _, _) in zip(drv.copies, drv.chunks) for i in np.flatnonzero(~np.isfinite(c).all(1))
            ]
            dst[0] = min(bad, default=2**31 - 1)
            return
        dst[0] = -1000.0 - 1e-6 * len(log)  # a finite, changing log-likelihood
        dst[1:2].view(np.int32)[0] = 2**31 - 1  # no bad component

    drv.Error = Error
    drv.init = lambda: None
    drv.get_driver_version = lambda: 12000
    drv.device_attribute = types.SimpleNamespace(
        MAX_THREADS_PER_BLOCK=1,
        MAX_SHARED_MEMORY_PER_BLOCK=2,
        MULTIPROCESSOR_COUNT=3,
        MAX_SHARED_MEMORY_PER_BLOCK_OPTIN=4,
    )
    drv.function_attribute = types.SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES=1)
    drv.Device = Device
    drv.Context = types.SimpleNamespace(pop=lambda: None, synchronize=lambda: None)
    drv.mem_alloc = lambda n: _Ptr(n, log)
    drv.memset_d8 = drv.memset_d32_async = lambda *a: None
    drv.pagelocked_zeros = lambda n, dt: np.zeros(n, dt)
    drv.pagelocked_empty = lambda shape, dt: np.zeros(shape, dt)
    drv.copies, drv.chunks = [], []  # host -> device copies (as arrays) and the upload kernel's chunks
    drv.memcpy_htod_async = lambda dst, src, stream: drv.copies.append(np.array(src))
    drv.Stream = lambda: types.SimpleNamespace(synchronize=lambda: None, wait_for_event=lambda e: None)
    drv.Event = lambda: types.SimpleNamespace(record=lambda s: None, synchronize=lambda: None, time_since=lambda o: 1.0)
    drv.memcpy_htod = drv.memcpy_dtod_async = lambda *a: None
    drv.memcpy_dtoh, drv.memcpy_dtoh_async = memcpy_dtoh, memcpy_dtoh_async
    drv.module_from_buffer = module_from_buffer
    return drv


@pytest.fixture
def backend(monkeypatch):
    log = []
    pkg = types.ModuleType("pycuda")
    pkg.driver = _fake_driver(log)
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", pkg.driver)
    cu_device._probe.cache_clear()
    try:
        yield cu.CudaBackend(), log
    finally:
        cu_device._probe.cache_clear()  # the real answer for the other tests


@pytest.mark.parametrize("M, cvtype", [(3, "full"), (11, "diag")])
def test_sessions_run_the_em_loop_through_every_module(backend, M, cvtype):
    be, log = backend
    D, N = 4, 1000
    p = Problem(N, D, M, cvtype, "float32")
    X = np.random.default_rng(0).standard_normal((N, D)).astype(np.float32)
    w = np.full(M, 1.0 / M)
    mu = np.zeros((M, D))
    cov = np.stack([np.eye(D)] * M) if cvtype == "full" else np.ones((M, D))
    v = be.covariance_variants(p)[0]
    k = be.kernel(v, be.tunables_for(v, p), p)
    assert be.is_ready(v, k.tunables, p)
    for _ in range(2):  # the second session reuses the pooled buffers
        with be.open(X, p) as s:
            assert s.problem == cu.binary_problem(p) and s.m_live == M
            s.set_params(w, mu, cov, 1e-6)
            run = s.em(k, min_iters=3, max_iters=3, tol=0.0, reg_covar=1e-6)
            assert run.iters == 3 and len(run.loglik_trace) == 4
            pw, pm, pc = s.params()
            assert pw.shape == (M,) and pm.shape == (M, D) and pc.shape == cov.shape
            lp, r = s.eval(True)
            assert lp.shape == (N,) and r.shape == (N, M)
        allocs = log.count("alloc")
    assert len(be.memory._pool) == 1
    assert {"asp_moments", "asp_means", "asp_factor"} <= set(log)
    be.memory.free_all()
    assert not be.memory._pool and log.count("free") >= allocs - 2


def test_a_driver_that_refuses_an_nvrtc_cubin_gets_nvcc_from_then_on(backend, monkeypatch, tmp_path, caplog):
    """A driver older than the NVRTC that compiled a cubin refuses it: the cubin is rebuilt by nvcc,
    a warning says why and what to install, and the process compiles with nvcc from then on."""
    from asp_gmm import runtime
    from asp_gmm.backends import nvrtc
    from asp_gmm.backends.cuda import compile as cc

    if not (nvrtc.available() and cc._nvcc_present()):
        pytest.skip("needs both NVRTC and nvcc")
    monkeypatch.setattr(runtime, "_default_runtime", runtime.Runtime())
    monkeypatch.setenv("ASP_GMM_CACHE_DIR", str(tmp_path / "cache"))
    be, log = backend
    dev = be.device
    real = dev.drv.module_from_buffer
    seen = []

    def picky(image):
        seen.append(image)
        if len(seen) == 1:
            raise dev.drv.Error("device kernel image is invalid")
        return real(image)

    monkeypatch.setattr(dev.drv, "module_from_buffer", picky)
    assert cc.use_nvrtc()
    with caplog.at_level("WARNING", logger="asp_gmm"):
        _, path = cc.load_module(dev, 'extern "C" __global__ void refused(float *x) { x[0] = 2.0f; }\n', "refused")
    assert len(seen) == 2 and not cc.use_nvrtc() and cc.compiler_version() != nvrtc.version()
    assert "nvrtc" not in path.with_suffix(".json").read_text()  # rebuilt by nvcc
    assert any("refused a cubin compiled by NVRTC" in r.getMessage() for r in caplog.records)
