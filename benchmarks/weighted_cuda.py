"""Weighted against unweighted whole fits on the GPU: the CUDA kernels take the sample weights
(asp_gmm/backends/cuda/weighted.py; the target is a weighted fit within 1.3x of the unweighted one).

    python benchmarks/weighted_cuda.py [--iters 10] [--repeats 3] [--warm 6]

Per shape ((1000000, 16, 16) full and (500000, 36, 128) diag, float32): the wall seconds of
``GMM.train`` for ``iters`` EM iterations (tol=0), end to end as a user calls it, best of
``repeats`` after ``warm`` untimed calls of each (compiles, and the history's measurements and
tunable search: a weighted fit chooses among the variants that take weights, so its search is its
own until it settles); the
weighted fit with uniform random weights in [0, 2), a tenth of them zero. Prints the variant each
fit ran and a table last.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from asp_gmm import GMM

SHAPES = [(1_000_000, 16, 16, "full"), (500_000, 36, 128, "diag")]


def _fit(X, M, cvtype, iters, sample_weight=None):
    g = GMM(M, X.shape[1], cvtype=cvtype, dtype=np.float32, backend="cuda", seed=1)
    t = time.perf_counter()
    g.train(X, min_em_iters=iters, max_em_iters=iters, tol=0, sample_weight=sample_weight)
    return time.perf_counter() - t, g.last_variant


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warm", type=int, default=6, help="untimed calls of each first")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for N, D, M, cvtype in SHAPES:
        X = (rng.standard_normal((N, D)) + rng.integers(0, 8, (N, 1))).astype(np.float32)
        w = rng.uniform(0.0, 2.0, N)
        w[rng.random(N) < 0.1] = 0.0
        for _ in range(args.warm):  # untimed: compiles, the history's measurements and search
            for sw in (None, w):
                _fit(X, M, cvtype, args.iters, sw)
        best = {}
        for _ in range(args.repeats):
            for name, sw in (("unweighted", None), ("weighted", w)):
                sec, label = _fit(X, M, cvtype, args.iters, sw)
                if sec < best.get(name, (float("inf"),))[0]:
                    best[name] = (sec, label)
        for name in ("unweighted", "weighted"):
            print(f"({N}, {D}, {M}) {cvtype} {name}: {best[name][0]:.3f} s ({best[name][1]})", flush=True)
        rows.append((f"({N}, {D}, {M}) {cvtype}", best["unweighted"][0], best["weighted"][0]))
    print(f"\nwhole fits, float32, {args.iters} iterations, best of {args.repeats} (target: weighted <= 1.3x)")
    print(f"{'shape':26s} {'unweighted':>11s} {'weighted':>9s} {'ratio':>6s}")
    for shape, t0, t1 in rows:
        print(f"{shape:26s} {t0:10.3f}s {t1:8.3f}s {t1 / t0:6.2f}")


if __name__ == "__main__":
    main()
