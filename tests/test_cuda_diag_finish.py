"""The finish that V7 and V9 share (variants/cuda/diag_finish.cuh.j2): their uncentred M-step sums turned
into counts, means and centred sums, the cancellation guard and V7's watch, and the warp-ballot list of
flagged components. Without a GPU: both variants render the one definition. On a GPU, what a wrong finish
would break, for both variants against the float64 reference: one iteration at odd sizes (M = 1, D = 1, D
not a multiple of the tiles, N below one block) with X + 1000; a component that gets no events (it keeps
its mean and covariance); V9's guards on a scattered set of components (the lists of asp_v9_efix and of
the finish's flags, across a 32-component boundary); V7's watch (flag 0.5) between a quarter of the limit
and the limit. The cases of tests/test_cuda_v7.py and tests/test_cuda_v9.py (more iterations, every
tunable, both guards tripped everywhere) run the same code."""

import re

import numpy as np
import pytest

from asp_gmm import reference as ref, registry
from asp_gmm.backends import cuda as cu
from asp_gmm.problem import Problem
from conftest import check_fit, init_params, make_blobs, scattered_blobs, train_vs_reference

V7 = registry.get("cuda", "V7", "covariance")
V9 = registry.get("cuda", "V9", "covariance")
CTX = dict(cu._DEFAULT_LIMITS)


def _definition(src: str, name: str) -> str:
    """The text of the template function ``name`` in a rendered source (from its template line to the
    closing brace at the start of a line)."""
    m = re.search(r"^template <[^\n]*>\n__device__ __forceinline__ \w+ " + name + r"\(.*?^}\n", src, re.S | re.M)
    assert m, f"{name} is not defined in the source"
    return m.group(0)


@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (36, 128), (130, 200)], ids=lambda s: "D%d-M%d" % s)
def test_both_variants_render_the_one_finish(shape):
    """The finish and the ballot list are written once: both sources hold the same definitions (from the
    include), the finish kernels only call it, and the partials are summed nowhere else."""
    D, M = shape
    p = Problem(0, D, M, "diag", "float32")
    srcs = {
        v.name: cu.render_source(v, v.first_allowed(Problem(1000, D, M, "diag", "float32"), extra=CTX), p)
        for v in (V7, V9)
    }
    for name in ("asp_diag_finish", "asp_warp_list"):
        assert _definition(srcs["V7"], name) == _definition(srcs["V9"], name)
    for v, watch in (("V7", "true"), ("V9", "false")):
        src = srcs[v]
        assert len(re.findall(r"\basp_sum_parts<", src)) == 1  # the finish's call (common.cuh.j2 defines it)
        kernel = re.search(r"asp_" + v.lower() + r"_finish\(.*?\) \{\n(.*?)^}\n", src, re.S | re.M).group(1)
        assert re.search(r"^\s+asp_diag_finish<" + watch + r">\(", kernel, re.M) and kernel.count(";") <= 2
        assert len(re.findall(r"\basp_warp_list<", src)) == 1  # V7's E-step, asp_v9_efix
        assert src.count("__ballot_sync(") == 2  # asp_warp_list's and the exact fallback's (cov_exact.cuh.j2)


REASON = cu.CudaBackend.unavailable_reason()
gpu = pytest.mark.skipif(REASON is not None, reason=f"CUDA backend unavailable: {REASON}")


@gpu
@pytest.mark.parametrize("offset", [0.0, 1000.0])
@pytest.mark.parametrize(
    "shape", [(700, 3, 1), (517, 1, 2), (2003, 17, 5), (90, 33, 3)], ids=lambda s: "N%d-D%d-M%d" % s
)
@pytest.mark.parametrize("variant", ["V7", "V9"])
def test_one_iteration_matches_float64(variant, shape, offset, rng):
    """nk (the weights), means and centred sums (the covariances) of one iteration: M = 1, D = 1, D not a
    multiple of V7's 4- or V9's 8- and 16-dimension tiles, N below one block of events."""
    N, D, M = shape
    X = make_blobs(rng, N, D, M, offset=offset, dtype=np.float32)
    g, ll, r = train_vs_reference(rng, X, M, "diag", 1, dtype="float32", backend="cuda", variant=variant)
    assert g.last_variant.startswith(variant)
    check_fit(g.covars, g.means, g.weights, ll, r)


def _session(X, M, w, mu, cv):
    be = cu.CudaBackend()
    p = Problem(X.shape[0], X.shape[1], M, "diag", "float32")
    s = be.open(X, p)
    assert s.problem.M == M, "these shapes must not be padded (M = 1..8 or a class size)"
    s.set_params(w, mu, cv, 1e-6)
    return be, p, s


def _doubles(s, count):
    out = np.zeros(count, np.float64)
    with s.dev.active():
        s.drv.memcpy_dtoh(out, s.buf.scratch)
    return out


@gpu
@pytest.mark.parametrize("variant", ["V7", "V9"])
def test_a_component_without_events_keeps_its_mean_and_covariance(variant, rng):
    """A component far from every event gets no responsibility (S0 = 0 < ASP_EMPTY_EVENTS): the finish
    leaves its mean, the factor its covariance, as the reference does; nothing else is disturbed and
    nothing turns NaN (two iterations: the second E-step runs with its tiny weight)."""
    N, D, M = 5003, 7, 4
    X = make_blobs(rng, N, D, M - 1, offset=1000.0, dtype=np.float32)
    w, mu, cv = init_params(rng, X, M, "diag")
    mu[-1] = X.mean(0) + 1e4  # every event 1e4 standard deviations away
    w[-1] = 1e-6  # the data mean (the sums' shift) stays with the events
    w /= w.sum()
    r = ref.em(X.astype(np.float64), w, mu, cv, "diag", 1e-6, 2, 2, 0.0)
    assert r["means"][-1].tolist() == mu[-1].tolist()
    be, p, s = _session(X, M, w, mu, cv)
    try:
        v = registry.get("cuda", variant, "covariance")
        run = s.em(
            be.kernel(v, be.tunables_for(v, p), p),
            min_iters=2,
            max_iters=2,
            tol=0.0,
            reg_covar=1e-6,
        )
        weights, means, covars = s.params()
    finally:
        s.close()
    assert np.isfinite(covars).all() and np.isfinite(means).all() and np.isfinite(run.loglik)
    np.testing.assert_allclose(means[-1], mu[-1], rtol=1e-9)
    np.testing.assert_allclose(covars[-1], r["covars"][-1], rtol=1e-5)
    assert 0 <= weights[-1] < 1e-9
    check_fit(covars, means, weights, run.loglik, r)


@gpu
def test_v9_guards_serve_scattered_components(rng):
    """V9's two guards on 8 of 40 components, on both sides of a 32-component boundary: asp_v9_efix forms
    exactly the log p of those its prep flagged (the ballot list) and the finish flags exactly those whose
    centring cancels; the fit agrees with float64 EM."""
    N, D, M = 40_000, 7, 40
    far = np.array([2, 5, 31, 32, 33, 34, 36, 39])
    X, w, mu, cv = scattered_blobs(rng, N, D, M, far)
    r = ref.em(X.astype(np.float64), w, mu, cv, "diag", 1e-6, 1, 1, 0.0)
    # the E-step guard as asp_v9_prep decides it for the E-step that ends the iteration (the updated
    # parameters): sum_d p^2 (mu - s)^2 > elimit x D, s the data mean
    s_shift = (r["weights"][:, None] * r["means"]).sum(0)
    quad = ((r["means"] - s_shift) ** 2 / r["covars"]).sum(1)
    elimit = V9.default_tunables()["elimit"]
    want_e = np.flatnonzero(quad > elimit * D)
    assert set(far) <= set(want_e) and np.all(np.abs(quad / (elimit * D) - 1.0) > 0.1)
    be, p, s = _session(X, M, w, mu, cv)
    try:
        tun = be.tunables_for(V9, p)  # this GPU's first allowed: the wgmma E-step (wg = 1) on Hopper
        run = s.em(be.kernel(V9, tun, p), min_iters=1, max_iters=1, tol=0.0, reg_covar=1e-6)
        weights, means, covars = s.params()
        env = V9.derive(dict(p.as_dict(), **tun, **CTX))
        mpad, dk, nbp = env["MPAD"], env["DK"], 2 + 2 * tun["wg"]
        # floats: B (2 planes, 4 with wg), c, flags, mu - s, the count (cov_v9.cu.j2)
        fsize = nbp * mpad * dk + 2 * mpad + mpad * dk + 4
        raw = _doubles(s, fsize // 2 + D + M)
    finally:
        s.close()
    eflags = raw[: fsize // 2].view(np.float32)[nbp * mpad * dk + mpad :][:M]
    assert np.flatnonzero(eflags != 0).tolist() == want_e.tolist()
    flags = raw[fsize // 2 + D : fsize // 2 + D + M]
    assert np.flatnonzero(flags == 1.0).tolist() == far.tolist() and set(np.unique(flags)) <= {0.0, 1.0}
    check_fit(covars, means, weights, run.loglik, r, rtol=5e-5)


@gpu
@pytest.mark.parametrize("mtc", [0, 1])
def test_v7_watches_between_a_quarter_of_the_limit_and_the_limit(mtc, rng):
    """The finish's watch: a component whose S2 / (centred sum) lies between RATIO_LIMIT / 4 and
    RATIO_LIMIT is marked 0.5 (not flagged: its fused sums are used), the others 0; the E-step that ends
    the iteration then stores its resp row (and records it). The limit is set from the data: twice the far component's ratio."""
    N, D, M = 30_000, 5, 6
    centres = rng.normal(0.0, 1.0, (M, D))
    centres[-1] = 35.0
    lab = rng.integers(0, M, N)
    X = (centres[lab] + rng.standard_normal((N, D))).astype(np.float32)
    w = np.bincount(lab, minlength=M) / N
    mu = np.stack([X[lab == c].mean(0) for c in range(M)]).astype(np.float64)
    cv = np.stack([X[lab == c].var(0) for c in range(M)]).astype(np.float64) + 1e-6
    r = ref.em(X.astype(np.float64), w, mu, cv, "diag", 1e-6, 1, 1, 0.0)
    # S2 / (S2 - S1^2 / S0) per component and dimension: 1 + (new mean - s)^2 / (new variance)
    s_shift = (w[:, None] * mu).sum(0).astype(np.float32).astype(np.float64)
    ratio = (1.0 + (r["means"] - s_shift) ** 2 / (r["covars"] - 1e-6)).max(1)
    limit = float(round(2.0 * ratio[-1]))
    assert ratio[:-1].max() < limit / 8 and limit <= 4096  # clear of both thresholds; the fused sums accurate
    be, p, s = _session(X, M, w, mu, cv)
    try:
        k = be.kernel(V7, {"mtc": mtc, "ratio_limit": limit}, p)
        run = s.em(k, min_iters=1, max_iters=1, tol=0.0, reg_covar=1e-6)
        raw = _doubles(s, D + 2 * M + 1)
        weights, means, covars = s.params()
    finally:
        s.close()
    # the iteration: finish (flags), exact fallback, factor, E-step (stored rows from those flags)
    flags, stored = raw[D : D + M], raw[D + M + 1 :]
    assert flags.tolist() == [0.0] * (M - 1) + [0.5]
    assert stored.tolist() == [0.0] * (M - 1) + [1.0]
    check_fit(covars, means, weights, run.loglik, r)
