"""CUDA arrays as data (asp_gmm/cuda_arrays.py): recognised by their interface, checked and seeded
where they lie, copied to the host for non-CUDA backends. A host-memory stand-in exercises the
interface here; the GPU test runs PyTorch/CuPy arrays on the device (skipped without a GPU)."""

import numpy as np
import pytest

from asp_gmm import GMM, cuda_arrays
from conftest import make_blobs


class FakeCudaArray:
    """Exposes ``__cuda_array_interface__`` over host memory (the interface, not a device)."""

    __module__ = "fakecuda"

    def __init__(self, a):
        self.a = a

    @property
    def __cuda_array_interface__(self):
        return {
            "shape": self.a.shape,
            "typestr": self.a.dtype.str,
            "data": (self.a.ctypes.data, False),
            "version": 3,
            "strides": self.a.strides if not self.a.flags.c_contiguous else None,
        }

    @property
    def shape(self):
        return self.a.shape

    def copy_to_host(self):
        return self.a.copy()

    def __getitem__(self, k):
        return FakeCudaArray(np.ascontiguousarray(self.a[k]))


def test_recognised_described_and_checked(rng):
    X = make_blobs(rng, 3000, 4, 3)
    f = FakeCudaArray(X)
    assert cuda_arrays.is_cuda_array(f) and not cuda_arrays.is_cuda_array(X)
    info = cuda_arrays.describe(f)
    assert info["shape"] == (3000, 4) and info["dtype"] == np.float64 and info["contiguous"]
    assert not cuda_arrays.describe(FakeCudaArray(X[:, ::2]))["contiguous"]
    assert cuda_arrays.first_non_finite(f) is None
    Y = X.copy()
    Y[2999, 3] = np.inf
    assert cuda_arrays.first_non_finite(FakeCudaArray(Y)) == (2999, 3)
    n, mean, cov = cuda_arrays.seed_stats(f, "full")
    assert n == 3000
    np.testing.assert_allclose(mean, X.mean(0), rtol=1e-12)
    np.testing.assert_allclose(cov, np.cov(X.T, bias=True), rtol=1e-10)
    with pytest.raises(cuda_arrays.CudaArrayError, match="C-contiguous float32"):
        cuda_arrays.in_dtype(f, np.float32)  # no library to convert it with


def test_device_seeding_equals_host_seeding(rng):
    X = make_blobs(rng, 2000, 4, 3)
    for cvtype in ("full", "diag"):
        g = GMM(3, 4, cvtype=cvtype, dtype=np.float64, backend="c", seed=4)
        h = GMM(3, 4, cvtype=cvtype, dtype=np.float64, backend="c", seed=4)
        f = g._cuda_data(FakeCudaArray(X), "train", 3)
        assert g._seed_device(f) == 2000
        h._seed(X)
        np.testing.assert_array_equal(g.means, h.means)
        np.testing.assert_allclose(g.covars, h.covars, rtol=1e-10)


def test_other_backends_copy_it_to_the_host(rng):
    X = make_blobs(rng, 2000, 4, 3)
    g = GMM(3, 4, dtype=np.float64, backend="c")
    h = GMM(3, 4, dtype=np.float64, backend="c")
    # float64 to 1e-12: the 16-core GPU machine ran the two calls on different OpenMP splits (1 ulp apart)
    assert g.train(FakeCudaArray(X)) == pytest.approx(h.train(X), rel=1e-12)
    np.testing.assert_allclose(g.score(FakeCudaArray(X)), h.score(X), rtol=1e-12)
    Y = X.copy()
    Y[5, 1] = np.nan
    with pytest.raises(ValueError, match="row 5, column 1"):
        GMM(3, 4, backend="c").train(FakeCudaArray(Y))


def test_torch_or_cupy_arrays_on_the_gpu(rng):
    cuda_mod = pytest.importorskip("asp_gmm.backends.cuda")
    if cuda_mod.CudaBackend.unavailable_reason():
        pytest.skip(f"CUDA backend unavailable: {cuda_mod.CudaBackend.unavailable_reason()}")
    try:
        import torch

        to_dev = lambda a: torch.as_tensor(a, device="cuda")  # noqa: E731
    except ImportError:
        cupy = pytest.importorskip("cupy")
        to_dev = cupy.asarray
    X = make_blobs(rng, 50000, 8, 4).astype(np.float32)
    g = GMM(4, 8, backend="cuda", seed=1)
    h = GMM(4, 8, backend="cuda", seed=1)
    lg = g.train(to_dev(X), min_em_iters=5, max_em_iters=5, tol=0)
    lh = h.train(X, min_em_iters=5, max_em_iters=5, tol=0)
    assert isinstance(g.means, np.ndarray)
    assert lg == pytest.approx(lh, rel=1e-5)
    np.testing.assert_allclose(g.covars, h.covars, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(g.score(to_dev(X)), h.score(X), rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="NaN or infinity"):
        bad = X.copy()
        bad[7, 2] = np.nan
        GMM(4, 8, backend="cuda").train(to_dev(bad))


def test_the_drop_in_takes_them_through_the_host(rng):
    pytest.importorskip("sklearn")
    from asp_gmm import GaussianMixture

    X = make_blobs(rng, 1000, 4, 3)
    a = GaussianMixture(3, random_state=0, backend="c").fit(FakeCudaArray(X))
    b = GaussianMixture(3, random_state=0, backend="c").fit(X)
    assert a.lower_bound_ == pytest.approx(b.lower_bound_, rel=1e-12)
    np.testing.assert_array_equal(a.predict(FakeCudaArray(X)), b.predict(X))


class FakeDLPack:
    """A DLPack producer (``__dlpack__``/``__dlpack_device__``) without ``__cuda_array_interface__``."""

    def __init__(self, a, device=(2, 0)):
        self.a, self.device = a, device

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):  # pragma: no cover - the fake library below views it
        raise AssertionError("viewed through from_dlpack, never consumed here")


def test_dlpack_producers_are_viewed_through_cupy_or_torch(rng, monkeypatch):
    import sys
    import types

    X = make_blobs(rng, 2000, 4, 3)
    assert cuda_arrays.is_cuda_array(FakeDLPack(X)) and cuda_arrays.is_cuda_array(FakeDLPack(X, (13, 0)))
    assert not cuda_arrays.is_cuda_array(FakeDLPack(X, (1, 0)))  # kDLCPU: not a CUDA array

    class Broken(FakeDLPack):
        def __dlpack_device__(self):
            raise RuntimeError("cannot say")

    assert not cuda_arrays.is_cuda_array(Broken(X))
    # neither library: a clear error naming what to pass
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(cuda_arrays.CudaArrayError, match="neither CuPy nor PyTorch.*pass a CuPy array"):
        cuda_arrays.describe(FakeDLPack(X))
    # the first library present views it; the Face trains on it as on the array itself
    seen = []
    fake_torch = types.ModuleType("torch")
    fake_torch.from_dlpack = lambda p: seen.append(p) or FakeCudaArray(p.a)
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    assert cuda_arrays.describe(FakeDLPack(X))["shape"] == (2000, 4) and len(seen) == 1
    g = GMM(3, 4, dtype=np.float64, backend="c")
    h = GMM(3, 4, dtype=np.float64, backend="c")
    assert g.train(FakeDLPack(X)) == pytest.approx(h.train(X), rel=1e-12)
    np.testing.assert_allclose(g.means, h.means, rtol=1e-12)
