"""V7, the diagonal covariance fused into the E-step (variants/cuda/cov_v7.cu.j2): the geometry of both
M phases (tensor cores, the default, and CUDA cores; one definition in v7.toml [derived] for the manifest
and the template; checked without a GPU) and the fallback from one to the other, and on a GPU
the cases the generic variant tests do not reach: data far from the origin, components whose centring
would cancel (the exact fallback must run, and only then), more M-phase tiles than threads, blocks
without events, the session's switch between the plain and the fused E-step."""

import numpy as np
import pytest

from asp_gmm import registry
from asp_gmm.backends import cuda as cu
from asp_gmm.problem import Problem
from conftest import (
    check_fit,
    init_params,
    make_blobs,
    reference_estep,
    scattered_blobs,
    session_vs_reference,
    train_vs_reference,
)

V7 = registry.get("cuda", "V7", "covariance")
SHAPES = [
    (150_000, 19, 16),
    (500_000, 36, 128),
    (1003, 7, 3),
    (517, 1, 4),
    (2000, 13, 1),
    (3001, 5, 12),
    (2501, 9, 24),
    (6007, 71, 3),
    (4001, 65, 128),
    (4001, 97, 128),
    (1000, 24, 512),
    (999, 150, 2),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "N%d-D%d-M%d" % s)
def test_v7_geometry_is_consistent(shape):
    """The M phase on the CUDA cores (mtc = 0): what the kernels assume of the derived geometry: lanes
    of one event inside a warp, 16-byte aligned tiles, every M-phase tile owned, shared memory within
    the limit it declares."""
    N, D, M = shape
    p = Problem(N, D, M, "diag", "float32")
    ctx = dict(cu._DEFAULT_LIMITS)
    tun = dict(V7.default_tunables(), mtc=0)
    env = V7.derive(dict(p.as_dict(), **tun, **ctx))
    if not V7.allows(p, tun, extra=ctx):
        assert env["TECAP"] < 4 or env["SMEM"] > ctx["smem_optin"]
        return
    assert env["NTH"] % 64 == 0 and 128 <= env["NTH"] <= 512
    assert env["XR"] % 4 == 0 and env["XR"] >= env["DG"] * env["DT"] >= D > (env["DG"] - 1) * env["DT"]
    assert 4 <= env["DT"] <= 6
    assert 32 % env["LT"] == 0 and env["NTH"] % env["LT"] == 0
    assert env["TE"] % 4 == 0 and env["TE"] >= 4 and env["MP"] % 8 == 0 and env["LDR"] % 8 == 4
    assert env["ES"] * min(env["MTILES"], env["NTH"]) <= env["NTH"]
    assert env["SMEM"] <= ctx["smem_optin"]
    src = cu.render_source(V7, tun, p)
    for name in ("NTH", "TE", "ES", "LT", "MP"):
        assert f"#define {name} {env[name]}\n" in src
    grid, block, shared = next(s for s in cu.launches(V7) if s.phase == "estep").config(dict(env, ldn=N))
    assert block[0] == env["NTH"] and shared == env["SMEM"] and 1 <= grid[0] <= ctx["sm_count"] * env["bps"]


@pytest.mark.parametrize("tc_wm", [1, 2])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "N%d-D%d-M%d" % s)
def test_v7_tensor_core_geometry_is_consistent(shape, tc_wm):
    """The tensor-core M phase (mtc = 1): whole 16-event chunks, every mma tile owned by one warp of each
    event group, the x tiles' rows (x', x'^2, the ones row) and their conflict-free stride; the template
    and the launch agree with the manifest."""
    N, D, M = shape
    p = Problem(N, D, M, "diag", "float32")
    ctx = dict(cu._DEFAULT_LIMITS)
    tun = dict(V7.default_tunables(), mtc=1, tc_wm=tc_wm)
    env = V7.derive(dict(p.as_dict(), **tun, **ctx))
    if not V7.allows(p, tun, extra=ctx):
        assert env["WM"] * env["WN"] > 12 or env["TECAP"] < 16 or env["SMEM"] > ctx["smem_optin"]
        return
    assert env["TE"] % 16 == 0 and env["XS"] % 32 == 8 and env["XS"] >= env["TE"]
    assert env["XR"] % 4 == 0 and env["XR"] >= D and env["NB"] % 8 == 0 and env["NB"] > 2 * env["XR"]
    assert env["WGM"] * env["WM"] >= env["TMT"] > (env["WGM"] - 1) * env["WM"]
    assert env["WGN"] * env["WN"] >= env["NT"] > (env["WGN"] - 1) * env["WN"]
    assert 1 <= env["ES"] * env["WGM"] * env["WGN"] <= env["NW"] and env["LDR"] % 8 == 4
    assert env["SMEM"] <= ctx["smem_optin"]
    src = cu.render_source(V7, tun, p)
    assert env["TE"] % env["EV"] == 0 and env["WM"] * env["WN"] <= 12
    for name in ("NTH", "TE", "ES", "XS", "NB", "WM", "WN", "WGM", "WGN", "EV", "TCO"):
        assert f"#define {name} {env[name]}" in src
    grid, block, shared = next(s for s in cu.launches(V7) if s.phase == "estep").config(dict(env, ldn=N))
    assert block[0] == env["NTH"] and shared == env["SMEM"]


def test_v7_shapes_reach_every_code_path():
    """The geometry test's shapes include both one M-phase tile per thread and rounds of tiles; so do
    the GPU shapes below ((4001, 97, 128): rounds)."""
    ctx = dict(cu._DEFAULT_LIMITS)
    envs = [
        V7.derive(dict(Problem(N, D, M, "diag", "float32").as_dict(), **dict(V7.default_tunables(), mtc=0), **ctx))
        for N, D, M in SHAPES
    ]
    assert {e["MTILES"] > e["NTH"] for e in envs if e["SMEM"] <= ctx["smem_optin"]} == {True, False}
    # the tensor-core M phase: warps that split the events (ES > 1) and warps with several component
    # tiles, in the GPU shapes of test_v7_tensor_cores_match_reference
    tc = [
        V7.derive(
            dict(Problem(N, D, M, "diag", "float32").as_dict(), **dict(V7.default_tunables(), mtc=1, tc_wm=2), **ctx)
        )
        for N, D, M in TC_SHAPES
    ]
    assert any(e["ES"] > 1 for e in tc) and any(e["WM"] > 1 for e in tc) and any(e["TMT"] % e["WM"] for e in tc)
    # E-phase thread tiles of 4, 2 and 1 events, and warps with several column tiles that split the events
    assert {e["EV"] for e in tc} == {1, 2, 4} and any(e["ES"] > 1 and e["WN"] > 1 for e in tc)
    # both mma orders: term by term over a warp's tiles (TCO = 1) and column tile by column tile (0), each with
    # several component tiles a warp
    assert {e["TCO"] for e in tc} == {0, 1} and {e["TCO"] for e in tc if e["WM"] > 1} == {0, 1}


def test_v7_runs_on_the_cuda_cores_where_the_tensor_cores_cannot(monkeypatch):
    """The default M phase is the tensor cores' (mtc = 1); a problem whose mma tiles do not fit a warp's
    registers, or a GPU without TF32 mma.sync, gets mtc = 0 (the first tunables the limits allow),
    not a V7 removed from selection."""
    ctx = dict(cu._DEFAULT_LIMITS)
    big, usual = Problem(4001, 97, 128, "diag", "float32"), Problem(500_000, 36, 128, "diag", "float32")
    assert V7.default_tunables()["mtc"] == 1 and V7.allows(usual, extra=ctx) and not V7.allows(big, extra=ctx)
    assert V7.first_allowed(big, extra=ctx)["mtc"] == 0
    be = object.__new__(cu.CudaBackend)  # what is asked here needs the limit context only, not a device
    monkeypatch.setattr(be, "limit_context", lambda: dict(ctx, cc=75))
    assert be.tunables_for(V7, usual) == dict(V7.default_tunables(), mtc=0)
    assert V7 in be.covariance_variants(usual) and V7 in be.covariance_variants(big)
    monkeypatch.setattr(be, "limit_context", lambda: dict(ctx))
    assert be.tunables_for(V7, usual) == V7.default_tunables()


REASON = cu.CudaBackend.unavailable_reason()
gpu = pytest.mark.skipif(REASON is not None, reason=f"CUDA backend unavailable: {REASON}")


_check = check_fit


@gpu
@pytest.mark.parametrize("offset", [0.0, 1000.0])
@pytest.mark.parametrize(
    "shape",
    [(40_003, 36, 16), (5003, 19, 5), (700, 3, 1), (4001, 97, 128), (300, 4, 2), (3001, 11, 40)],
    ids=lambda s: "N%d-D%d-M%d" % s,
)
def test_v7_matches_reference(shape, offset, rng):
    """(4001, 97, 128): more M-phase tiles than threads (rounds); (300, 4, 2): one tile, most blocks
    without events (their partials must read as zero); (3001, 11, 40): an odd number of E-phase component
    groups (GCN = 5)."""
    N, D, M = shape
    X = make_blobs(rng, N, D, M, offset=offset, dtype=np.float32)
    g, ll, r = train_vs_reference(rng, X, M, "diag", 3, dtype="float32", backend="cuda", variant="V7")
    assert g.last_variant.startswith("V7")
    _check(g.covars, g.means, g.weights, ll, r)
    lp, post = g.eval(X)
    rlp, rpost = reference_estep(g, X)
    np.testing.assert_allclose(lp, rlp, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(post, rpost, atol=1e-3)


TC_SHAPES = [
    (40_003, 36, 16),
    (5003, 19, 5),
    (700, 3, 1),
    (300, 4, 2),
    (3001, 11, 40),
    (20_001, 36, 128),
    (2000, 24, 72),
    (6007, 71, 3),
    (2001, 24, 32),
]


@gpu
@pytest.mark.parametrize(
    "tun", [{"mtc": 0}, {"tc_wm": 1}, {"tc_wm": 2}], ids=lambda t: "-".join(f"{k}{v}" for k, v in t.items())
)
@pytest.mark.parametrize("offset", [0.0, 1000.0])
@pytest.mark.parametrize("shape", TC_SHAPES, ids=lambda s: "N%d-D%d-M%d" % s)
def test_v7_both_m_phases_match_reference(shape, offset, tun, rng):
    """The M-step sums on the tensor cores (3xTF32, the default) and on the CUDA cores (mtc = 0): float32
    accuracy, data far from the origin included; (3001, 11, 40) and (2000, 24, 72) with tc_wm = 2: a
    last warp with one component tile of two; (700, 3, 1): warps that split the events; (2001, 24, 32): two
    component tiles a warp in the term-by-term mma order (TCO = 1)."""
    N, D, M = shape
    X = make_blobs(rng, N, D, M, offset=offset, dtype=np.float32)
    (weights, means, covars), run, r = session_vs_reference(rng, X, M, "diag", "V7", tun, iters=3)
    _check(covars, means, weights, run.loglik, r)


@gpu
@pytest.mark.parametrize("bps", [1, 3, 4])
def test_v7_tunables(bps, rng):
    X = make_blobs(rng, 30_011, 21, 8, dtype=np.float32)
    (weights, means, covars), run, r = session_vs_reference(rng, X, 8, "diag", "V7", {"bps": bps}, iters=3)
    _check(covars, means, weights, run.loglik, r)


def _session(X, M, w, mu, cv):
    be = cu.CudaBackend()
    p = Problem(X.shape[0], X.shape[1], M, "diag", "float32")
    s = be.open(X, p)
    s.set_params(w, mu, cv, 1e-6)
    return be, p, s


def _fill_scratch(s, byte):
    """A scratch buffer filled with ``byte`` before V7's first E-step reads its flags there: 0x00 (no
    resp row stored, so the exact fallback recomputes the posteriors of the components it flags) or
    0xff (NaN flags: every row stored)."""
    nbytes = 1 << 24
    with s.dev.active():
        s.drv.memset_d8(s.buf.ensure_scratch(nbytes), byte, nbytes)


def _flags(s, D, M):
    out = np.zeros(D + M, np.float64)
    with s.dev.active():
        s.drv.memcpy_dtoh(out, s.buf.scratch)
    return out[D : D + M]


@gpu
@pytest.mark.parametrize("fill", [0x00, 0xFF], ids=["recomputed", "stored"])
@pytest.mark.parametrize("mtc", [0, 1])
def test_v7_guard_flags_only_cancelling_components(mtc, fill, rng):
    """Tight components far from the data mean are recomputed exactly (and the result is accurate),
    from their resp rows or, where the E-step before did not store them, from posteriors recomputed
    from its parameters; ordinary blobs are neither flagged nor watched, so the fused sums are what
    runs."""
    from asp_gmm import reference as ref
    from cuda_helpers import labelled_blobs

    for spread, scale, want in ((100.0, 0.05, True), (1.0, 1.0, False)):
        X, w, mu, cv = labelled_blobs(rng, 50_000, 12, 8, spread, scale, 0.0)
        r = ref.em(X.astype(np.float64), w, mu, cv, "diag", 1e-6, 1, 1, 0.0)
        be, p, s = _session(X, 8, w, mu, cv)
        try:
            _fill_scratch(s, fill)
            run = s.em(be.kernel(V7, {"mtc": mtc}, p), min_iters=1, max_iters=1, tol=0.0, reg_covar=1e-6)
            flags = _flags(s, 12, 8)
            weights, means, covars = s.params()
        finally:
            s.close()
        assert (flags == 1.0).all() if want else not flags.any(), flags
        _check(covars, means, weights, run.loglik, r, rtol=5e-5)


@gpu
@pytest.mark.parametrize("fill", [0x00, 0xFF], ids=["recomputed", "stored"])
@pytest.mark.parametrize("mtc", [0, 1])
def test_v7_exact_pass_serves_scattered_flags(mtc, fill, rng):
    """The exact fallback takes the flagged components 4 at a time by ballots over 32 flags: flags on
    both sides of a 32-component boundary, 8 of 40 (two passes), the others left to the fused sums."""
    from asp_gmm import reference as ref

    N, D, M = 40_000, 7, 40
    far = np.array([2, 5, 31, 32, 33, 34, 36, 39])
    X, w, mu, cv = scattered_blobs(rng, N, D, M, far)
    r = ref.em(X.astype(np.float64), w, mu, cv, "diag", 1e-6, 1, 1, 0.0)
    be, p, s = _session(X, M, w, mu, cv)
    try:
        _fill_scratch(s, fill)
        run = s.em(be.kernel(V7, {"mtc": mtc}, p), min_iters=1, max_iters=1, tol=0.0, reg_covar=1e-6)
        flags = _flags(s, D, M)
        weights, means, covars = s.params()
    finally:
        s.close()
    assert np.flatnonzero(flags == 1.0).tolist() == far.tolist(), flags
    _check(covars, means, weights, run.loglik, r, rtol=5e-5)


@gpu
def test_v7_after_plain_estep_and_failed_step(rng):
    """loglik() runs the plain E-step (no sums): the next em must run V7's own E-step first; two em
    calls in a row continue from the sums the last E-step left; eval then gives every posterior row
    (V7's E-step stores only those its exact fallback may need)."""
    from asp_gmm import reference as ref

    X = make_blobs(rng, 20_011, 10, 6, dtype=np.float32)
    w, mu, cv = init_params(rng, X, 6, "diag")
    r = ref.em(X.astype(np.float64), w, mu, cv, "diag", 1e-6, 3, 3, 0.0)
    be, p, s = _session(X, 6, w, mu, cv)
    try:
        ll0 = s.loglik()
        k = be.kernel(V7, None, p)
        first = s.em(k, min_iters=1, max_iters=1, tol=0.0, reg_covar=1e-6)
        assert first.loglik_trace[0] == pytest.approx(ll0, rel=1e-6)
        run = s.em(k, min_iters=2, max_iters=2, tol=0.0, reg_covar=1e-6)
        weights, means, covars = s.params()
        # V7's E-step stores only the resp rows its exact fallback may need: eval must give them all
        lp, post = s.eval(want_resp=True)
    finally:
        s.close()
    _check(covars, means, weights, run.loglik, r)
    np.testing.assert_allclose(post, r["resp"], atol=1e-4)
    np.testing.assert_allclose(lp, r["logprob"], rtol=1e-4, atol=1e-3)
