"""The upload path on a GPU (asp_gmm/backends/cuda/staging.py, asp_upload_chunk): the transposed
events on the device equal X (float32 and float64 models, float64 and strided input converted on
the way, N not a multiple of the chunk, padding zeroed up to ldn); NaN and infinity in the first,
a middle and the last chunk are named by row and column; a streamed fit names a NaN by its row in
the pass; results after reuse of the staging buffers across calls and models are unchanged.

Skipped, with the reason, where pycuda or a GPU is missing (CI)."""

import numpy as np
import pytest

from asp_gmm import GMM
from asp_gmm.errors import NonFiniteInputError, StreamError
from asp_gmm.problem import Problem

cuda_mod = pytest.importorskip("asp_gmm.backends.cuda")
REASON = cuda_mod.CudaBackend.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"CUDA backend unavailable: {REASON}")


def _xt(session):
    b, p = session.buf, session.problem
    out = np.empty((p.D, b.ldn), p.np_dtype)
    with session.dev.active():
        session.drv.memcpy_dtoh(out, session.xt)
    return out


@pytest.fixture
def small_chunks():
    from asp_gmm.backends import get_backend

    st = get_backend("cuda").memory.staging()
    old = st.chunk_bytes
    st.chunk_bytes = 4096  # many chunks even for small X
    yield st
    st.chunk_bytes = old


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_device_copy_equals_x_with_zero_padding(dtype, small_chunks, rng):
    from asp_gmm.backends import get_backend

    be = get_backend("cuda")
    X = rng.standard_normal((3001, 7)) + 1000.0
    Xs = np.asfortranarray(X)  # strided, float64: converted and gathered by the staging copy
    p = Problem(3001, 7, 3, "diag", dtype)
    with be.open(Xs, p) as s:
        xt = _xt(s)
    assert len(small_chunks.last_chunks) > 10
    np.testing.assert_array_equal(xt[:, :3001], X.T.astype(dtype))
    assert not xt[:, 3001:].any()


@pytest.mark.parametrize("row", [0, 1500, 2999])
def test_nan_and_inf_are_named_by_row_and_column(row, small_chunks, rng):
    from asp_gmm.backends import get_backend

    be = get_backend("cuda")
    X = rng.standard_normal((3000, 5)).astype(np.float32)
    X[row, 3] = np.nan
    if row < 2999:
        X[2999, 0] = np.inf  # a later bad row is not the one named
    with pytest.raises(NonFiniteInputError, match=rf"first at row {row}, column 3"):
        be.open(X, Problem(3000, 5, 2, "diag", "float32"))


def test_warm_calls_name_the_call_and_results_are_unchanged_by_reuse(rng):
    X = rng.standard_normal((20000, 6)).astype(np.float32)
    g = GMM(4, 6, backend="cuda", seed=0)
    g.train(X, max_em_iters=3)
    ref = g.score(X)
    h = GMM(4, 6, backend="cuda", means=g.means, covars=g.covars, weights=g.weights)
    np.testing.assert_array_equal(h.score(X), ref)  # another model, the same buffers and kernels
    X[19999, 2] = np.inf
    with pytest.raises(ValueError, match=r"NaN or infinity \(first at row 19999, column 2\).*before predict\(\)"):
        h.predict(X)


def test_a_streamed_fit_names_a_nan_by_its_row_in_the_pass(rng, monkeypatch):
    monkeypatch.setenv("ASP_GMM_DEVICE_BUDGET", "1000000")  # stream even this small X
    monkeypatch.setenv("ASP_GMM_BLOCK_BYTES", "200000")
    X = rng.standard_normal((30000, 4)).astype(np.float32)
    g = GMM(3, 4, backend="cuda", seed=0)
    g.train(X, max_em_iters=2)
    X[23456, 1] = np.nan
    with pytest.raises((StreamError, ValueError), match=r"NaN or infinity.*row 23456.*column 1"):
        g.train(X, max_em_iters=1)


def test_a_device_array_with_nan_is_named_on_warm_calls(rng):
    torch = pytest.importorskip("torch")
    X = rng.standard_normal((5000, 3)).astype(np.float32)
    g = GMM(2, 3, backend="cuda", seed=0)
    Xt = torch.from_numpy(X).cuda()
    g.train(Xt, max_em_iters=2)
    np.testing.assert_allclose(g.score(Xt), g.score(X), rtol=1e-5, atol=1e-5)
    Xt[4321, 1] = float("nan")
    with pytest.raises(ValueError, match=r"NaN or infinity \(first at row 4321, column 1\).*before score\(\)"):
        g.score(Xt)


def test_exit_frees_staging_and_pools_without_warnings(tmp_path):
    """A process that trained on host data (page-locked staging, pooled buffers with their streams
    and events, resident frozen data) exits without pycuda's "could not be cleaned up" warnings:
    the exit hook frees and drops them with the context current."""
    import os
    import subprocess
    import sys

    code = (
        "import numpy as np, asp_gmm\n"
        "X = np.random.default_rng(0).standard_normal((50000, 8)).astype(np.float32)\n"
        "g = asp_gmm.GMM(4, 8, cvtype='diag', backend='cuda'); g.train(X, max_em_iters=3)\n"
        "F = asp_gmm.freeze(X); asp_gmm.GMM(4, 8, cvtype='diag', backend='cuda').train(F, max_em_iters=2)\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONWARNINGS": "always"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    assert "could not be cleaned up" not in r.stderr, r.stderr
