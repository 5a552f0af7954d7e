"""What sample_weight costs: a weighted fit (the pass loop, weights folded into the posteriors of the
backend's E-step) against the unweighted fit of the same events, and against the repeated rows.

    python benchmarks/sample_weight.py [--backend c|cuda|numpy] [--n 200000] [--d 16] [--m 16]

Prints one line per fit: wall seconds for 10 EM iterations (float32, full and diag), end to end as a
user calls GMM.train (the first, compiling call is run once before timing).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from asp_gmm import GMM


def _time(X, backend, cvtype, sample_weight=None, repeats=3):
    best = float("inf")
    for _ in range(repeats):
        g = GMM(args.m, X.shape[1], cvtype=cvtype, dtype=np.float32, backend=backend, seed=1)
        t = time.perf_counter()
        g.train(X, min_em_iters=10, max_em_iters=10, tol=0, sample_weight=sample_weight)
        best = min(best, time.perf_counter() - t)
    return best


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="c")
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--d", type=int, default=16)
    ap.add_argument("--m", type=int, default=16)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    X = (rng.standard_normal((args.n, args.d)) + rng.integers(0, 4, (args.n, 1))).astype(np.float32)
    k = rng.integers(1, 3, args.n)
    rep = np.repeat(X, k, axis=0)
    print(f"backend={args.backend} N={args.n} D={args.d} M={args.m} float32, 10 iterations (best of 3)")
    print(f"{'cvtype':8s} {'unweighted':>11s} {'weighted':>9s} {'repeated rows':>14s}")
    for cvtype in ("full", "diag"):
        _time(X[:4096], args.backend, cvtype, repeats=1)  # compile once
        _time(X[:4096], args.backend, cvtype, k[:4096].astype(np.float64), repeats=1)
        t0 = _time(X, args.backend, cvtype)
        t1 = _time(X, args.backend, cvtype, k.astype(np.float64))
        t2 = _time(rep, args.backend, cvtype)
        print(f"{cvtype:8s} {t0:10.3f}s {t1:8.3f}s {t2:13.3f}s")
