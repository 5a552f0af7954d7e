"""V9, the diagonal E-step and M-step sums as tensor-core GEMMs (variants/cuda/cov_v9.cu.j2): the geometry
of its manifest (no GPU needed), then on a GPU against the float64 reference: odd shapes (D not a
multiple of the 8- and 16-dimension tiles, M = 1, N below one block of events, more than one component
tile, dimensions in two column groups), data offset by +1000, every tunable, both guards tripped (every
component's log p exact; every component's sums exact), and one-iteration float32 accuracy."""

import numpy as np
import pytest

from asp_gmm import registry
from asp_gmm.backends import cuda as cu
from asp_gmm.problem import Problem
from conftest import check_fit, make_blobs, reference_estep, session_vs_reference, train_vs_reference

V9 = registry.get("cuda", "V9", "covariance")
CTX = dict(cu._DEFAULT_LIMITS)


def _env(D, M, **tun):
    t = dict(V9.default_tunables(), **tun)
    return V9.derive(dict(Problem(1000, D, M, "diag", "float32").as_dict(), **t, **CTX))


def test_geometry_covers_every_dimension_and_component():
    """The E-step's tiles cover DK >= D dimensions and MPAD >= M components; the sums' column groups
    cover D (one group up to D = 128: each resp row is read once)."""
    for D in (1, 7, 16, 33, 128, 130, 300):
        for M in (1, 5, 128, 129, 1024):
            e = _env(D, M)
            assert e["DK"] >= D and e["DK"] % e["kd"] == 0 and e["MPAD"] >= M and e["MPAD"] % 128 == 0
            assert e["CG"] * e["DC"] >= D and e["CTS"] * 64 >= M
            assert e["ENTH"] == 128 * e["EW"] and e["EW"] * 16 * e["MI"] == e["be"]
    assert _env(128, 1024)["CG"] == 1 and _env(130, 8)["CG"] == 2


def test_large_d_takes_a_smaller_event_tile_and_the_limit_is_data():
    """Shared memory bounds the E-step's tile of events x dimensions: a larger D takes a smaller be,
    and where none fits the variant declares the limit (another variant runs)."""
    assert V9.first_allowed(Problem(1000, 128, 64, "diag", "float32"), extra=CTX)["be"] == 128
    assert V9.first_allowed(Problem(1000, 1000, 64, "diag", "float32"), extra=CTX)["be"] == 32
    reason = V9.check(Problem(1000, 5000, 64, "diag", "float32"), extra=CTX)
    assert reason is not None and "shared memory" in reason
    assert V9.allows(Problem(1000, 16, 8192, "diag", "float32"), extra=CTX)
    reason = V9.check(Problem(1000, 16, 8193, "diag", "float32"), extra=CTX)
    assert reason is not None and "guarded-component list" in reason


REASON = cu.CudaBackend.unavailable_reason()
gpu = pytest.mark.skipif(REASON is not None, reason=f"CUDA backend unavailable: {REASON}")


_check = check_fit


def _hopper():
    return cu.CudaBackend().device.attrs["cc"] == 90


def _needs_hopper(tun):
    t = dict(V9.default_tunables(), **tun)
    return bool(t["wg"] or t["ws"])


SHAPES = [
    (1003, 7, 3),
    (517, 1, 4),
    (2000, 13, 1),
    (90, 5, 2),  # fewer events than one E-step block
    (20_011, 33, 5),
    (3001, 130, 200),  # two component tiles (padding in the second), two column groups
    (40_003, 36, 300),
    (4001, 97, 128),
]


@gpu
@pytest.mark.parametrize("offset", [0.0, 1000.0])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "N%d-D%d-M%d" % s)
def test_v9_matches_reference(shape, offset, rng):
    """One EM iteration (more iterations at a few events per component amplify any float32 difference, V5's
    as much: (3001, 130, 200) +1000 after 3 iterations differs by 1e-1 for both)."""
    N, D, M = shape
    X = make_blobs(rng, N, D, M, offset=offset, dtype=np.float32)
    g, ll, r = train_vs_reference(rng, X, M, "diag", 1, dtype="float32", backend="cuda", variant="V9")
    assert g.last_variant.startswith("V9")
    _check(g.covars, g.means, g.weights, ll, r)
    lp, post = g.eval(X)
    rlp, rpost = reference_estep(g, X)
    np.testing.assert_allclose(lp, rlp, rtol=1e-4 if offset == 0 else 1e-3, atol=1e-3)
    np.testing.assert_allclose(post, rpost, atol=1e-3)


@gpu
@pytest.mark.parametrize(
    "tun",
    [
        {"be": 64},
        {"be": 32, "wg": 0},
        {"kd": 16},
        {"xt": 2, "ws": 0},
        {"sbps": 2},
        {"elimit": 0.0},
        {"ratio_limit": 1.0},
    ]
    + [{"wg": 0}, {"wg": 0, "be": 64}, {"wg": 0, "kd": 16}, {"wg": 0, "elimit": 0.0}, {"be": 64, "kd": 16}]
    + [{"ws": 0}, {"ws": 0, "sbps": 2}, {"ws": 0, "ratio_limit": 1.0}, {"wg": 0, "ws": 0}],
    ids=lambda t: "-".join(f"{k}{v}" for k, v in t.items()),
)
@pytest.mark.parametrize("shape", [(20_011, 36, 130), (3001, 11, 40), (700, 3, 1)], ids=lambda s: "N%d-D%d-M%d" % s)
def test_v9_tunables_and_guards(shape, tun, rng):
    """elimit = 0 trips the E-step guard for every component (log p in the exact form), ratio_limit = 1
    the sums guard (every component's sums recomputed exactly from the E-step's log p)."""
    N, D, M = shape
    if _needs_hopper(tun) and not _hopper():
        pytest.skip("the wgmma E-step and sums (wg = 1, ws = 1) run on compute capability 9.0 only")
    X = make_blobs(rng, N, D, M, offset=1000.0, dtype=np.float32)
    (weights, means, covars), run, r = session_vs_reference(rng, X, M, "diag", "V9", tun, iters=2)
    _check(covars, means, weights, run.loglik, r)


@gpu
@pytest.mark.parametrize("offset", [10.0, 1000.0])
def test_v9_one_iteration_is_float32_accurate(offset, rng):
    """One EM iteration against float64 EM: covariances within 1e-5 (relative Frobenius), as V7."""
    N, D, M = 100_000, 36, 128
    X = make_blobs(rng, N, D, M, offset=offset, dtype=np.float32)
    errs = {}
    for variant in ("V7", "V9"):
        g, _, r = train_vs_reference(
            np.random.default_rng(5), X, M, "diag", 1, dtype="float32", backend="cuda", variant=variant
        )
        errs[variant] = float(np.linalg.norm(g.covars - r["covars"]) / np.linalg.norm(r["covars"]))
    assert errs["V9"] < 1e-5, errs
    for tun in ({"wg": 0}, {"wg": 1}) if _hopper() else ({"wg": 0},):  # both E-step GEMMs, same start
        (_, _, covars), _, r = session_vs_reference(np.random.default_rng(5), X, M, "diag", "V9", tun, iters=1)
        err = float(np.linalg.norm(covars - r["covars"]) / np.linalg.norm(r["covars"]))
        assert err < 1e-5, (tun, err)


@gpu
@pytest.mark.parametrize("tun", [{"wg": 1, "be": 64}, {"wg": 0, "ws": 0}], ids=["wgmma-be64", "mma"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "N%d-D%d-M%d" % s)
def test_v9_gemms_match_reference_at_odd_shapes(shape, tun, rng):
    """Both E-step GEMMs and both sums (wgmma, the first allowed on a Hopper GPU and so what
    test_v9_matches_reference runs there, here at one warpgroup an E-step block; mma.sync) at the odd
    shapes, X + 1000, two iterations."""
    if _needs_hopper(tun) and not _hopper():
        pytest.skip("the wgmma E-step and sums (wg = 1, ws = 1) run on compute capability 9.0 only")
    N, D, M = shape
    X = make_blobs(rng, N, D, M, offset=1000.0, dtype=np.float32)
    (weights, means, covars), run, r = session_vs_reference(rng, X, M, "diag", "V9", tun, iters=2)
    _check(covars, means, weights, run.loglik, r)


def test_selection_offers_v9_only_beyond_v7s_range():
    """V9 is pinnable everywhere but offered to the selection only where M x D outgrows V7 (manifest
    `selectable` expression); V6 (selectable = false) stays out everywhere."""
    small, big = Problem(500_000, 36, 128, "diag", "float32"), Problem(1_000_000, 128, 1024, "diag", "float32")
    assert not V9.selectable_for(small, CTX) and V9.selectable_for(big, CTX)
    assert V9.allows(small, extra=CTX)
    v6 = registry.get("cuda", "V6", "covariance")
    assert not v6.selectable_for(small, CTX) and not v6.selectable_for(big, CTX)
