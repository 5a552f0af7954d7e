"""V6, the tensor-core diagonal covariance (variants/cuda/cov_v6.cu.j2), and the tensor-core moments of
the core (variants/cuda/mom_tc.cuh.j2): the cases the generic variant tests do not reach: data far from
the origin, components whose centring would cancel (the exact fallback must run, and only then),
every tunable. Skipped without a GPU (test_cuda_compile.py compiles the templates everywhere)."""

import numpy as np
import pytest

from conftest import check_fit, make_blobs, reference_estep, session_vs_reference, train_vs_reference

cuda_mod = pytest.importorskip("asp_gmm.backends.cuda")
REASON = cuda_mod.CudaBackend.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"CUDA backend unavailable: {REASON}")


def _v6_allowed():
    return cuda_mod.CudaBackend().limit_context().get("cc", 0) >= 80


def _check(g, ll, r):
    check_fit(g.covars, g.means, g.weights, ll, r)


@pytest.mark.parametrize("offset", [0.0, 1000.0])
@pytest.mark.parametrize("shape", [(40_003, 36, 16), (5003, 19, 5), (700, 3, 1)], ids=lambda s: "N%d-D%d-M%d" % s)
def test_v6_matches_reference(shape, offset, rng):
    if not _v6_allowed():
        pytest.skip("V6 needs compute capability 8.0")
    N, D, M = shape
    X = make_blobs(rng, N, D, M, offset=offset, dtype=np.float32)
    g, ll, r = train_vs_reference(rng, X, M, "diag", 3, dtype="float32", backend="cuda", variant="V6")
    assert g.last_variant.startswith("V6")
    _check(g, ll, r)
    lp, post = g.eval(X)
    rlp, rpost = reference_estep(g, X)
    np.testing.assert_allclose(lp, rlp, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(post, rpost, atol=1e-3)


@pytest.mark.parametrize("blocks", [132, 528])
def test_v6_tunables(blocks, rng):
    if not _v6_allowed():
        pytest.skip("V6 needs compute capability 8.0")
    X = make_blobs(rng, 30_011, 21, 8, dtype=np.float32)
    (weights, means, covars), run, r = session_vs_reference(rng, X, 8, "diag", "V6", {"wm": 1, "blocks": blocks})
    np.testing.assert_allclose(covars, r["covars"], rtol=2e-4, atol=2e-4 * float(np.abs(r["covars"]).max()))
    np.testing.assert_allclose(means, r["means"], rtol=2e-4, atol=2e-4 * float(np.abs(r["means"]).max()))
    assert run.loglik == pytest.approx(r["loglik"], rel=2e-3)


def test_v6_guard_flags_only_cancelling_components(rng):
    """Tight components far from the data mean (ratio S2 / sum >> RATIO_LIMIT) are recomputed exactly
    and the result is accurate; ordinary blobs are not flagged (the fast path is really used)."""
    if not _v6_allowed():
        pytest.skip("V6 needs compute capability 8.0")
    from cuda_helpers import labelled_blobs, mstep_probe

    X, w, mu, cv = labelled_blobs(rng, 50_000, 12, 8, 100.0, 0.05, 0.0)
    pr = mstep_probe(X, w, mu, cv)
    assert pr["flags"].all(), pr["ratio"].max(1)
    np.testing.assert_allclose(pr["acc"], pr["exact"], rtol=2e-5)
    X, w, mu, cv = labelled_blobs(rng, 50_000, 12, 8, 1.0, 1.0, 0.0)
    pr = mstep_probe(X, w, mu, cv)
    assert not pr["flags"].any(), pr["ratio"].max(1)
    np.testing.assert_allclose(pr["acc"], pr["exact"], rtol=2e-5)
