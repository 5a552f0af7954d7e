"""Seconds per EM iteration on the CPU: every C variant against scikit-learn, in the same run.

    python benchmarks/cpu.py [--shapes 150000x19x16,500000x36x128] [--iters 3] [--cvtype full]
                             [--skip-slow] [--json out.json]

For each shape (N x D x M) it times, on the same random data from the same parameters:
  * each C covariance variant with its default tunables (the EM core is shared): median of --iters
    iterations measured by the core's own clock, float32 (and float64 with --float64);
  * scikit-learn's GaussianMixture, float64 (its default) and float32 data, one EM iteration as its
    own `_e_step` + `_m_step` (median of --sk-iters).
--skip-slow skips V1 and V2 where N*M*cells makes them take minutes (they are the paper's baselines).
The table is printed last.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings

import numpy as np

from asp_gmm import registry
from asp_gmm.backends import get_backend
from asp_gmm.problem import Problem


def make_data(N, D, M, dtype, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 3, (M, D))
    X = centres[rng.integers(0, M, N)] + rng.standard_normal((N, D))
    return X.astype(dtype)


def init_params(X, M, cvtype, seed=1):
    rng = np.random.default_rng(seed)
    N, D = X.shape
    means = X[rng.choice(N, M, replace=False)].astype(np.float64)
    cov = np.cov(X[:20000].astype(np.float64).T) + 1e-3 * np.eye(D)
    covars = np.repeat(cov[None], M, 0) if cvtype == "full" else np.repeat(np.diag(cov)[None], M, 0)
    return np.full(M, 1.0 / M), means, covars


def time_variant(backend, variant, X, params, cvtype, iters):
    N, D = X.shape
    M = params[1].shape[0]
    problem = Problem(N, D, M, cvtype, X.dtype.name)
    kernel = backend.kernel(variant, None, problem)
    with backend.open(X, problem) as s:
        s.set_params(*params, 1e-6)
        s.loglik()  # first E-step outside the timing
        run = s.em(kernel, min_iters=iters, max_iters=iters, tol=0.0, reg_covar=1e-6)
    return statistics.median(run.iter_seconds), statistics.median(run.cov_seconds)


def time_sklearn(X, params, cvtype, iters):
    from sklearn.mixture import GaussianMixture
    from sklearn.mixture._gaussian_mixture import _compute_precision_cholesky

    w, mu, cv = params
    M = mu.shape[0]
    sk = GaussianMixture(M, covariance_type=cvtype, reg_covar=1e-6)
    sk.weights_, sk.means_, sk.covariances_ = w.copy(), mu.astype(X.dtype), cv.astype(X.dtype)
    sk.precisions_cholesky_ = _compute_precision_cholesky(sk.covariances_, cvtype)
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        _, log_resp = sk._e_step(X)
        sk._m_step(X, log_resp)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="150000x19x16,500000x36x128")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--sk-iters", type=int, default=1)
    p.add_argument("--cvtype", default="full")
    p.add_argument("--variants", default="", help="comma-separated subset (default: all)")
    p.add_argument("--skip-slow", action="store_true")
    p.add_argument("--no-sklearn", action="store_true")
    p.add_argument("--float64", action="store_true", help="also time the variants in float64")
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    backend = get_backend("c")
    fp = backend.fingerprint()
    print(f"machine: {fp['model']}, {fp['threads']} threads, ISA {','.join(fp['isa'])}; {platform.python_version()}")
    names = [v for v in a.variants.split(",") if v]
    variants = [v for v in registry.variants("c", "covariance") if not names or v.name in names]
    rows = []
    for shape in a.shapes.split(","):
        N, D, M = (int(x) for x in shape.lower().split("x"))
        X = make_data(N, D, M, np.float32)
        params = init_params(X, M, a.cvtype)
        row = {"shape": (N, D, M), "cvtype": a.cvtype, "variants": {}, "sklearn": {}}
        work = N * M * D * D
        for v in variants:
            if a.skip_slow and v.name in ("V1", "V2") and work > 5e10:
                continue
            for dt in ["float32", "float64"] if a.float64 else ["float32"]:
                if a.cvtype not in v.cvtypes or dt not in v.dtypes:
                    continue  # e.g. VD and VF are diagonal only, VF float64 only
                Xd = X if dt == "float32" else X.astype(np.float64)
                it, cov = time_variant(backend, v, Xd, params, a.cvtype, a.iters)
                row["variants"][f"{v.name}/{dt}"] = (it, cov)
                print(f"  {shape} {v.name:5s} {dt}: {it:.4f} s/iter (covariance {cov:.4f} s)", flush=True)
        if not a.no_sklearn:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for dt in ("float32", "float64"):
                    t = time_sklearn(X.astype(dt), params, a.cvtype, a.sk_iters)
                    row["sklearn"][dt] = t
                    print(f"  {shape} sklearn {dt}: {t:.4f} s/iter", flush=True)
        rows.append(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print()
    print(f"| N x D x M ({a.cvtype}) | variant | s/iter | covariance s | vs sklearn f32 | vs sklearn f64 |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        shp = "x".join(map(str, row["shape"]))
        s32, s64 = row["sklearn"].get("float32"), row["sklearn"].get("float64")
        for name, (it, cov) in row["variants"].items():
            r32 = f"{s32 / it:.1f}x" if s32 else "-"
            r64 = f"{s64 / it:.1f}x" if s64 else "-"
            print(f"| {shp} | {name} | {it:.4f} | {cov:.4f} | {r32} | {r64} |")
        for dt, t in row["sklearn"].items():
            print(f"| {shp} | sklearn {dt} | {t:.4f} | - | - | - |")


if __name__ == "__main__":
    sys.exit(main())
