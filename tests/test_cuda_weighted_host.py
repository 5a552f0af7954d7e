"""The CUDA kernels take sample weights: what can be checked without a GPU. The declarations (the
backend's ``weights_in_kernels``, the variants' ``sample_weight``), the weighted plan of the pass
loop, which rows may stay on the device, and the weighted runner's host code
(asp_gmm/backends/cuda/weighted.py) against the recording stand-in for pycuda.driver of
tests/test_cuda_host.py, with the EM core compiled for sm_90 by nvcc. Plumbing, not numbers:
tests/test_cuda_weighted_gpu.py checks those on a GPU."""

import types

import numpy as np
import pytest

from asp_gmm import registry
from asp_gmm.fit import passes
from asp_gmm.fit.sources import ArraySource, CallableSource
from asp_gmm.problem import Problem

cu = pytest.importorskip("asp_gmm.backends.cuda")
from test_cuda_stream_host import NVCC, backend  # noqa: E402,F401  (the stand-in driver's fixture)

import shutil  # noqa: E402

HAVE_NVCC = shutil.which(NVCC[0]) is not None


def test_backends_declare_whether_their_kernels_take_weights():
    from asp_gmm.backends.base import Backend
    from asp_gmm.backends.c import CBackend
    from asp_gmm.backends.numpy_ref import NumpyBackend

    assert cu.CudaBackend.weights_in_kernels and CBackend.weights_in_kernels
    assert not Backend.weights_in_kernels and not NumpyBackend.weights_in_kernels


def test_variants_whose_estep_fuses_the_sums_take_no_weights():
    """A CUDA variant with launches of its own E-step (the M-step sums fused into it) declares
    ``sample_weight = false``; every other variant takes weights."""
    fused = set()
    for v in registry.variants("cuda", "covariance"):
        own_estep = any(spec.get("phase") == "estep" for spec in v.extra.get("launch", []))
        assert v.takes_weights is (not own_estep), v.name
        if own_estep:
            fused.add(v.name)
    assert fused == {"V7", "V9"}
    assert all(v.takes_weights for v in registry.variants("c", "covariance"))


def test_the_core_has_the_weighting_kernel():
    v = registry.get("cuda", "core", "core")
    for cvtype, dtype in (("full", "float32"), ("diag", "float64")):
        src = cu.render_source(v, v.default_tunables(), Problem(1000, 5, 3, cvtype, dtype))
        assert 'extern "C" __global__ void __launch_bounds__(256) asp_weight_rows(' in src
    assert cu.CORE_SIGNATURES["asp_weight_rows"] == "PPPPii"


class _Spec:
    """What :func:`asp_gmm.fit.passes.plan` asks of a specializer: candidates, a policy that takes
    the first, and kernels."""

    def __init__(self, be):
        self.backend = be
        self.policy = types.SimpleNamespace(
            choose=lambda be, p, cands, pinned, tuning: types.SimpleNamespace(primary=cands[0], reason="rule")
        )

    def candidates(self, problem, variant=None):
        vs = [registry.get("cuda", n, "covariance") for n in ("V7", "V9", "V6", "V2")]
        if variant is not None:
            vs = [v for v in vs if v.name == variant]
        return [registry.Config.of(v, v.default_tunables()) for v in vs]

    def _kernel(self, cfg, problem, policy, reraise=False):
        return types.SimpleNamespace(variant=cfg.variant)


def test_a_weighted_plan_chooses_among_the_variants_that_take_weights():
    be = types.SimpleNamespace(weights_in_kernels=True, stream_block_rows=lambda p: 1 << 20, name="cuda")
    p = Problem(5000, 6, 4, "diag", "float32")
    assert passes.plan(_Spec(be), p).config.variant.name == "V7"  # unweighted: as the policy says
    assert passes.plan(_Spec(be), p, weighted=True).config.variant.name == "V6"
    # pinned: kept (the backend folds the weights on the host for it)
    assert passes.plan(_Spec(be), p, "V9", weighted=True).config.variant.name == "V9"
    host = types.SimpleNamespace(weights_in_kernels=False, stream_block_rows=lambda p: 1 << 20, name="fake")
    assert passes.plan(_Spec(host), p, weighted=True).config.variant.name == "V7"


def test_only_an_in_memory_array_within_the_budget_stays_on_the_device(tmp_path, monkeypatch):
    from asp_gmm.backends.numpy_ref import NumpyBackend

    spec = types.SimpleNamespace(backend=NumpyBackend())
    p = Problem(0, 4, 3, "full", "float32")
    X = np.zeros((1000, 4), np.float32)
    assert passes._resident(spec, ArraySource(X), p)
    mm = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.float32, shape=(1000, 4))
    assert not passes._resident(spec, ArraySource(mm), p)
    assert not passes._resident(spec, CallableSource(lambda: iter([X])), p)
    monkeypatch.setenv("ASP_GMM_DEVICE_BUDGET", "1000")  # bytes: the session would not fit
    assert not passes._resident(spec, ArraySource(X), p)
    # the session (1000 x (4 + 3 + 1) float32) fits, not with a copy of the rows and weights besides
    monkeypatch.setenv("ASP_GMM_DEVICE_BUDGET", "40000")
    assert spec.backend.session_bytes(Problem(1000, 4, 3, "full", "float32")) == 32000
    assert not passes._resident(spec, ArraySource(X), p)
    monkeypatch.setenv("ASP_GMM_DEVICE_BUDGET", "56000")
    assert passes._resident(spec, ArraySource(X), p)


@pytest.mark.skipif(not HAVE_NVCC, reason="nvcc not found (CUDA toolkit)")
@pytest.mark.parametrize("resident", [False, True])
def test_weights_go_up_with_their_rows_and_are_folded_after_the_estep(backend, resident):  # noqa: F811
    be, log, copies = backend
    from asp_gmm.backends.cuda.weighted import CudaWeightedStatsRunner

    drv = be.device.drv  # rows feed the stand-in's NaN flag, weights do not

    def htod(dst, src, stream):
        copies.append(np.array(src))
        if np.ndim(src) == 2:
            drv.copies.append(copies[-1])

    drv.memcpy_htod_async = htod

    M, D, cap = 3, 4, 1000
    p = Problem(cap, D, M, "full", "float32")
    v = next(v for v in be.covariance_variants(p) if v.takes_weights)
    runner = be.open_weighted_stats(p, be.kernel(v, be.tunables_for(v, p), p), resident=resident)
    assert isinstance(runner, CudaWeightedStatsRunner)
    w0, mu = np.full(M, 1.0 / M), np.zeros((M, D))
    cov = np.stack([np.eye(D)] * M)
    X = np.random.default_rng(0).standard_normal((2600, D)).astype(np.float32)
    sw = np.random.default_rng(1).uniform(0, 2, 2600)
    cuts = [(0, 1000), (1000, 2000), (2000, 2600)]
    for npass in range(2):
        copies.clear()
        drv.copies.clear()
        drv.chunks.clear()
        log.clear()
        runner.set_params(w0, mu, cov, 1e-6)
        out = list(runner.stats_weighted_many((X[a:b], sw[a:b]) for a, b in cuts))
        assert [b.n for b in out] == pytest.approx([sw[a:b].sum() for a, b in cuts], rel=1e-12)
        if npass == 0 or not resident:  # the rows, then the weights, of each block
            assert [len(c) for c in copies] == [1000, 1000, 1000, 1000, 600, 600]
            np.testing.assert_array_equal(np.concatenate(copies[1::2]), sw)
            np.testing.assert_array_equal(np.concatenate(copies[0::2]), X)
        else:  # kept on the device: nothing copied
            assert copies == []
        launches = [e for e in log if e.startswith("asp_")]
        assert launches.count("asp_weight_rows") == 3 and launches.count("asp_upload_chunk") == 3
        for i, name in enumerate(launches):  # after the E-step, before the M-step sums
            if name == "asp_weight_rows":
                assert launches[i - 1].startswith("asp_estep") and launches[i + 1] == "asp_moments"
    assert len(runner._kept) == (3 if resident else 0)
    runner.close()
    assert runner.session is None and runner._kept == []
