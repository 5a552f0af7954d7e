"""The CUDA backend's upload path (asp_gmm/backends/cuda/staging.py) against the recording stand-in
for pycuda.driver of test_cuda_host.py: host data goes up in chunks, in order, through the two
reused pinned buffers (dtype converted and strided input gathered on the way); the NaN/inf flag is
set once and read once per upload, and a NaN in the last chunk is named by its row and column,
naming the public call; the buffers are reused across calls and across GMM instances, and a
writeable array changed between calls is uploaded again (never served stale). The stand-in's
flag read computes what asp_upload_chunk would have folded into the flag from the chunks that
reached it (tests/test_cuda_gpu.py checks the kernel itself on a GPU)."""

import re
import sys
import types

import numpy as np
import pytest

from asp_gmm.errors import NonFiniteInputError
from asp_gmm.problem import Problem

cu = pytest.importorskip("asp_gmm.backends.cuda")
from asp_gmm.backends.cuda import device as cu_device  # noqa: E402
from test_cuda_host import _fake_driver, pytestmark  # noqa: E402,F401  (pytestmark: skip without nvcc)


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
        cu_device._probe.cache_clear()


def _params(M, D, cvtype):
    cov = np.stack([np.eye(D)] * M) if cvtype == "full" else np.ones((M, D))
    return np.full(M, 1.0 / M), np.zeros((M, D)), cov


def _open(be, X, M=3, cvtype="diag"):
    p = Problem(X.shape[0], X.shape[1], M, cvtype, "float32")
    return be.open(X, p)


def test_chunks_go_up_in_order_through_two_reused_pinned_buffers(backend):
    be, log = backend
    drv = be.device.drv
    st = be.memory.staging()
    st.chunk_bytes = 4 * 5 * 64  # 64 rows of D=5 float32 per chunk
    X = np.random.default_rng(0).standard_normal((300, 5))  # float64: converted while staged
    Xs = np.asfortranarray(X)  # and gathered from a strided layout
    with _open(be, Xs) as s:
        ldn = s.buf.ldn
    assert st.last_chunks == [(0, 64), (64, 64), (128, 64), (192, 64), (256, 44)]
    assert [len(c) for c in drv.copies] == [64, 64, 64, 64, 44]
    np.testing.assert_array_equal(np.concatenate(drv.copies), X.astype(np.float32))
    assert all(c.dtype == np.float32 for c in drv.copies)
    assert drv.chunks[-1] == (256, 44, ldn - 256)  # the last chunk zeroes the padding up to ldn
    assert [c[:2] for c in drv.chunks[:-1]] == st.last_chunks[:-1]
    assert log.count("read_flag") == 1  # one flag read per upload
    pinned = [id(b) for b in st._pinned]
    drv.copies.clear()
    with _open(be, X):
        pass
    assert [id(b) for b in st._pinned] == pinned and len(drv.copies) == 5  # reused, not reallocated


def test_a_nan_in_the_last_chunk_is_named_by_row_and_column(backend):
    be, log = backend
    st = be.memory.staging()
    st.chunk_bytes = 4 * 3 * 100
    X = np.ones((450, 3), np.float32)
    X[437, 2] = np.nan
    X[449, 0] = np.inf
    with pytest.raises(NonFiniteInputError, match=r"NaN or infinity \(first at row 437, column 2\)") as info:
        _open(be, X)
    assert isinstance(info.value, ValueError) and info.value.row == 437
    assert log.count("read_flag") == 1 and len(st.last_chunks) == 5
    assert not be.memory._pool or all(b.key for b in be.memory._pool)  # the session's buffers went back
    assert "before score()" in str(info.value.for_call("score"))
    assert "before training" in str(info.value.for_call("train"))


def test_float64_beyond_float32_is_named_as_such(backend):
    be, _ = backend
    X = np.ones((40, 3))
    X[7, 1] = 1e300
    with pytest.raises(NonFiniteInputError, match=r"beyond the float32 range \(first at row 7, column 1\)"):
        _open(be, X)  # float64 data: the staging copy converts it and the device finds the overflow


def test_the_face_skips_its_host_scan_where_the_gpu_checks(backend, monkeypatch):
    """On warm calls of a CUDA model the Face makes no host NaN pass; the upload finds the NaN and
    the error names the public call. Two models of one (D, M, cvtype) share the pooled buffers."""
    from asp_gmm import GMM, runtime
    from asp_gmm.fit import data as gmm_mod  # (the Face's data checks live in the fitting wing)

    be, log = backend
    rt = runtime.Runtime()
    rt.backends["cuda"] = be
    monkeypatch.setattr(runtime, "_default_runtime", rt)
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "0")
    scans = []
    real = gmm_mod._first_non_finite
    monkeypatch.setattr(gmm_mod, "_first_non_finite", lambda a: scans.append(a.shape) or real(a))
    D, M = 4, 3
    w, mu, cov = _params(M, D, "diag")
    X = np.random.default_rng(2).standard_normal((500, D)).astype(np.float32)
    g = GMM(M, D, means=mu, covars=cov, weights=w, cvtype="diag", backend="cuda")
    g.train(X, max_em_iters=2)
    assert g.score(X).shape == (500,)
    h = GMM(M, D, means=mu, covars=cov, weights=w, cvtype="diag", backend="cuda")
    h.score(X)
    assert scans == [] and len(be.memory._pool) == 1  # no host pass; one buffer set for both models
    X[499, 3] = np.nan
    for call, where in (("score", "score()"), ("predict", "predict()"), ("train", "training")):
        with pytest.raises(
            ValueError, match=rf"NaN or infinity \(first at row 499, column 3\).*before {re.escape(where)}"
        ):
            getattr(g, call)(X)
    assert scans == []
    fresh = GMM(M, D, cvtype="diag", backend="cuda")  # seeding reads X on the host: checked there
    with pytest.raises(ValueError, match="NaN or infinity"):
        fresh.train(X)
    assert scans


def test_writeable_arrays_are_uploaded_again_on_every_call(backend):
    """Reuse across calls never serves stale data: a writeable array changed in place between two
    sessions reaches the device again (its new values), a frozen one only once."""
    from asp_gmm import freeze

    be, _ = backend
    drv = be.device.drv
    X = np.random.default_rng(1).standard_normal((200, 4)).astype(np.float32)
    with _open(be, X):
        pass
    X[5] = 123.0
    drv.copies.clear()
    with _open(be, X):
        pass
    np.testing.assert_array_equal(np.concatenate(drv.copies), X)
    Xf = freeze(X)
    drv.copies.clear()
    for _ in range(3):
        with _open(be, Xf):
            pass
    assert sum(len(c) for c in drv.copies) == 200  # uploaded once, then resident


def test_a_device_array_is_transposed_and_checked_in_one_pass_where_it_lies(backend, monkeypatch):
    """A CUDA array (here: the interface over host memory) goes through asp_upload_chunk from its
    own pointer, no host copy; the flag names a bad row, whose column is read from that row alone."""
    from test_cuda_arrays import FakeCudaArray

    be, log = backend
    drv = be.device.drv
    X = np.random.default_rng(3).standard_normal((700, 4)).astype(np.float32)
    with _open(be, FakeCudaArray(X)) as s:
        ldn = s.buf.ldn
    assert drv.copies == [] and drv.chunks == [(0, 700, ldn)] and log.count("read_flag") == 1
    X[612, 2] = np.nan
    real = drv.memcpy_dtoh_async

    def flag(dst, src, stream):  # what the kernel would have found
        if dst.dtype == np.int32:
            dst[0] = 612
        else:
            real(dst, src, stream)

    monkeypatch.setattr(drv, "memcpy_dtoh_async", flag)
    with pytest.raises(NonFiniteInputError, match=r"first at row 612, column 2"):
        _open(be, FakeCudaArray(X))


def test_a_row_found_in_a_sample_of_x_is_counted_in_x():
    """The specializer explores on every k-th event (X[::k][:n]); a NaN found there is named by its
    row in the array the user passed."""
    X = np.ones((100, 3), np.float32)
    Xs = X[::4][:20]
    exc = NonFiniteInputError(5, 1)
    exc.source = Xs
    assert exc.for_call("score", within=X).row == 20
    assert "first at row 20, column 1" in str(exc.for_call("score", within=X))
    exc.source = X[10:]
    assert exc.for_call("train", within=X).row == 15
    assert exc.for_call("train", within=np.ones((5, 3))).row == 5  # another array: as found
