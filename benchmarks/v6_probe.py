"""V6 (tensor-core diagonal covariance) probe: one M-step on the GPU, read back V6's scratch, and
compare its *unguarded* tensor-core centring S2 - 2 mu' S1 + mu'^2 S0 with the exact float64 sum
sum_n r (x - mu)^2 for every (component, dimension), binned by the cancellation ratio S2 / sum.
This is how RATIO_LIMIT in variants/cuda/cov_v6.cu.j2 was chosen; tests/test_cuda_v6.py uses
``mstep_probe`` to check which components the guard flags.

    python3 benchmarks/v6_probe.py            # prints max relative error per ratio bin
"""
from __future__ import annotations

import numpy as np

from asp_gmm import registry
from asp_gmm.problem import Problem


def mstep_probe(X, weights, means, covars, tunables=None):
    """One E-step + moments + V6 on (X, parameters). Returns a dict: exact (M, D) float64 centred sums
    from the posteriors V6 read, tc (M, D) the tensor-core centring from its partials, acc (M, D) what
    V6 wrote (guarded), ratio (M, D) = S2 / exact, flags (M,) bool."""
    from asp_gmm.backends import cuda as cu
    N, D = X.shape
    M = len(weights)
    be = cu.CudaBackend()
    p = Problem(N, D, M, "diag", "float32")
    v = registry.get("cuda", "V6", "covariance")
    tun = dict(v.default_tunables(), **(tunables or {}))
    kern = be.kernel(v, tun, p)
    s = be.open(np.ascontiguousarray(X, np.float32), p)
    try:
        assert s.problem.M == M, "probe shapes must not be padded (use M = 1..8 or a class size)"
        s.set_params(weights, means, covars, 1e-6)
        drv, b = s.drv, s.buf
        with s.dev.active():
            s._run_estep()
            s._means(0)
            nbytes, confs = s._plan(kern.handle, cu.COV_ARGS, scratch_bytes=True)
            scr = b.ensure_scratch(nbytes)
            ev = [drv.Event() for _ in range(len(confs) + 1)]
            ev[0].record(b.stream)
            singles = [[conf] for conf in confs]   # kept alive: _run_plan memoises by the list's id
            for i, one in enumerate(singles):      # V6's launches one by one, timed
                s._run_plan(one, scr)
                ev[i + 1].record(b.stream)
            s._sync()
            launch_ms = {conf[0]: ev[i + 1].time_since(ev[i]) for i, conf in enumerate(confs)}
            resp = np.empty((M, b.ldn), np.float32)
            drv.memcpy_dtoh(resp, b.resp)
            mu = np.empty(M * D, np.float32)
            drv.memcpy_dtoh(mu, b.ptr("mu"))
            acc = np.empty(M * D, np.float64)
            drv.memcpy_dtoh(acc, b.acc)
            scratch = np.empty(nbytes // 8, np.float64)
            drv.memcpy_dtoh(scratch, b.scratch)
    finally:
        s.close()
    mu = mu.reshape(M, D).astype(np.float64)
    r = resp[:, :N].astype(np.float64)
    Xd = X.astype(np.float32).astype(np.float64)
    exact = np.stack([(r[c][:, None] * (Xd - mu[c]) ** 2).sum(0) for c in range(M)])
    shift = scratch[:D]
    flags = scratch[D:D + M] != 0
    part = scratch[D + M:].reshape(tun["blocks"], M, 2 * D + 1).sum(0)
    s1, s0, s2 = part[:, :D], part[:, D], part[:, D + 1:]
    mup = mu - shift
    tc = s2 - 2 * mup * s1 + mup ** 2 * s0[:, None]
    return dict(exact=exact, tc=tc, acc=acc.reshape(M, D), ratio=s2 / exact, flags=flags, launch_ms=launch_ms)


def labelled_blobs(rng, N, D, M, spread, scale, offset):
    """Blobs (centres N(0, spread^2), per-dimension spreads scale x U(0.5, 1.5), + offset) and the
    parameters of their true labelling: (X float32 (N, D), weights (M,), means (M, D), variances (M, D))."""
    centres = rng.normal(0.0, spread, (M, D))
    scales = rng.uniform(0.5, 1.5, (M, D)) * scale
    lab = rng.integers(0, M, N)
    X = (centres[lab] + rng.standard_normal((N, D)) * scales[lab] + offset).astype(np.float32)
    w = np.bincount(lab, minlength=M) / N
    mu = np.stack([X[lab == c].mean(0) for c in range(M)]).astype(np.float64)
    cv = np.stack([X[lab == c].var(0) for c in range(M)]).astype(np.float64) + 1e-6
    return X, w, mu, cv


def main():
    rng = np.random.default_rng(5)
    bins = [1, 4, 16, 64, 256, 1024, 4096, 1e9]
    rows = []
    for (N, D, M, spread, scale, offset) in [(200_000, 36, 16, 3.0, 1.0, 0.0), (200_000, 36, 16, 3.0, 1.0, 1000.0),
                                            (200_000, 19, 8, 10.0, 1.0, 0.0), (200_000, 36, 16, 30.0, 0.3, 0.0),
                                            (200_000, 12, 16, 100.0, 0.1, 50.0), (500_000, 36, 128, 3.0, 1.0, 0.0)]:
        X, w, mu, cv = labelled_blobs(rng, N, D, M, spread, scale, offset)
        pr = mstep_probe(X, w, mu, cv)
        rel = np.abs(pr["tc"] - pr["exact"]) / pr["exact"]
        grel = np.abs(pr["acc"] - pr["exact"]) / pr["exact"]
        for lo, hi in zip(bins[:-1], bins[1:]):
            sel = (pr["ratio"] >= lo) & (pr["ratio"] < hi)
            if sel.any():
                rows.append((f"{N},{D},{M} spread {spread} scale {scale} +{offset}", f"[{lo:g},{hi:g})",
                             int(sel.sum()), float(rel[sel].max()), float(np.median(rel[sel])), float(grel[sel].max())))
        print(f"case {N},{D},{M} spread {spread}: flagged {int(pr['flags'].sum())}/{M}, guarded max rel err "
              f"{float(grel.max()):.2e}; launches (ms) {pr['launch_ms']}")
    print("| case | ratio S2/sum | cells | max rel err (unguarded TC) | median | max rel err (guarded, what V6 returns) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.2e} | {r[4]:.2e} | {r[5]:.2e} |")


if __name__ == "__main__":
    main()
