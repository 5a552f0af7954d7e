"""Fit time to convergence: sklearn.mixture.GaussianMixture vs asp_gmm.GaussianMixture (the drop-in),
same data, same initial parameters, same tol and max_iter.

    python benchmarks/sklearn_dropin.py                                  # CPU, both default sizes
    python benchmarks/sklearn_dropin.py --backend cuda                   # on a GPU machine
    python benchmarks/sklearn_dropin.py --sizes 150000x19x16 --cvtypes diag --sk-blas-threads 1

Data: N events from a mixture of M anisotropic, correlated Gaussians in D dimensions (float64, fixed
seed; overlapping clusters, ``--spread``). Initial parameters: asp_gmm's k-means initialisation (on a subsample, see
asp_gmm.sklearn_api.KMEANS_SUBSAMPLE), passed to both as weights_init/means_init/precisions_init, so
both run the same EM from the same point; the time of that initialisation is reported separately
(``init s``), and with ``--time-sklearn-init`` also scikit-learn's own k-means on all events.
asp_gmm's compile time is excluded (a warm-up fit on a slice compiles or loads the variants first) and
reported on its own line; so is the autotuner's one-time exploration of untried variants on this
problem class (``tune s``; ``ASP_GMM_AUTOTUNE=0`` skips it and uses the fixed rule instead). ``--dtype float32`` runs asp_gmm in float32 on the same float64 data.

Printed: a Markdown table (iterations, converged, seconds, seconds per iteration, lower bound of each,
their relative difference, speed-up) and, with ``--json PATH``, the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings

import numpy as np


def make_data(N, D, M, seed=0, spread=1.0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, spread, (M, D))
    scales = rng.uniform(0.5, 1.5, (M, D))
    lab = rng.integers(0, M, N)
    X = centres[lab] + rng.standard_normal((N, D)) * scales[lab]
    X = X @ (np.eye(D) + 0.3 * rng.standard_normal((D, D)) / np.sqrt(D))
    return np.ascontiguousarray(X)


def parse_sizes(text):
    out = []
    for part in text.split(","):
        n, d, m = (int(v) for v in part.lower().split("x"))
        out.append((n, d, m))
    return out


def _blas_limit(threads):
    if threads is None:
        import contextlib

        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=threads, user_api="blas")


def _say(msg):
    print(f"  [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _tune(X, M, cvtype, dtype, args):
    """Untimed: let the autotuner try every untried variant on this problem class (one EM iteration
    each, recorded in the tuning history) so that the timed fit runs the variant the history picks,
    as every later fit on this device does. Returns the seconds spent."""
    from asp_gmm import GaussianMixture, selection
    from asp_gmm.problem import Problem
    from asp_gmm.specializer import Specializer

    if not selection.autotune_enabled():
        return 0.0
    spec = Specializer(args.backend)
    prob = Problem(X.shape[0], X.shape[1], M, cvtype, np.dtype(dtype or X.dtype).name)
    t = time.perf_counter()
    for _ in range(3):
        plan = spec.selector.plan(spec.backend, prob, spec.candidates(prob))
        if not plan.explore:
            break
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            GaussianMixture(
                M,
                covariance_type=cvtype,
                max_iter=len(plan.explore) + 1,
                tol=0.0,
                random_state=0,
                backend=args.backend,
                dtype=dtype,
            ).fit(X)
    spent = time.perf_counter() - t
    _say(f"tuning {spent:.1f} s (plan: {plan.primary.label}, {plan.reason})")
    return spent


def run_case(N, D, M, cvtype, args):
    from sklearn.mixture import GaussianMixture as SkGM
    from asp_gmm import GaussianMixture

    X = make_data(N, D, M, spread=args.spread)
    common = dict(covariance_type=cvtype, tol=args.tol, max_iter=args.max_iter, reg_covar=1e-6)
    dtype = None if args.dtype == "float64" else args.dtype

    # warm-up: compile (or load from the cache) on a slice
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        GaussianMixture(M, max_iter=2, random_state=0, backend=args.backend, dtype=dtype, covariance_type=cvtype).fit(
            X[: max(20 * M, 2000)]
        )
    compile_s = time.perf_counter() - t
    _say(f"{N}x{D}x{M} {cvtype}: warm-up {compile_s:.1f} s")

    tune_s = _tune(X, M, cvtype, dtype, args) if cvtype in ("full", "diag") else 0.0

    t = time.perf_counter()
    g0 = GaussianMixture(M, covariance_type=cvtype, max_iter=0, random_state=0, backend=args.backend).fit(X)
    init_s = time.perf_counter() - t
    init = dict(weights_init=g0.weights_, means_init=g0.means_, precisions_init=g0.precisions_)
    _say(f"init {init_s:.1f} s")

    row = dict(
        N=N,
        D=D,
        M=M,
        cvtype=cvtype,
        backend=args.backend,
        dtype=args.dtype,
        compile_s=compile_s,
        tune_s=tune_s,
        init_s=init_s,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = time.perf_counter()
        ours = GaussianMixture(M, backend=args.backend, dtype=dtype, **common, **init).fit(X)
        row["asp_s"] = time.perf_counter() - t
    row.update(asp_iters=ours.n_iter_, asp_conv=bool(ours.converged_), asp_lb=ours.lower_bound_)
    _say(f"asp_gmm {row['asp_s']:.1f} s, {ours.n_iter_} iterations")

    if args.time_sklearn_init:
        with _blas_limit(args.sk_blas_threads), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = time.perf_counter()
            SkGM(M, covariance_type=cvtype, max_iter=0, random_state=0).fit(X)
            row["sk_init_s"] = time.perf_counter() - t
    if not args.skip_sklearn:
        with _blas_limit(args.sk_blas_threads), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = time.perf_counter()
            ref = SkGM(M, **common, **init).fit(X)
            row["sk_s"] = time.perf_counter() - t
        row.update(sk_iters=ref.n_iter_, sk_conv=bool(ref.converged_), sk_lb=ref.lower_bound_)
        row["lb_rel_diff"] = abs(ours.lower_bound_ - ref.lower_bound_) / abs(ref.lower_bound_)
        row["speedup"] = row["sk_s"] / row["asp_s"]
        row["speedup_per_iter"] = (row["sk_s"] / max(ref.n_iter_, 1)) / (row["asp_s"] / max(ours.n_iter_, 1))
    return row


def fmt_table(rows):
    head = (
        "| N, D, M | cov | asp_gmm backend/dtype | init s | sklearn s (iters) | asp_gmm s (iters) "
        "| s/iter sklearn / asp_gmm | lower bound rel. diff | speed-up |"
    )
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in rows:
        sk = f"{r['sk_s']:.2f} ({r['sk_iters']}{'' if r['sk_conv'] else ', not conv.'})" if "sk_s" in r else "-"
        asp = f"{r['asp_s']:.2f} ({r['asp_iters']}{'' if r['asp_conv'] else ', not conv.'})"
        per = (
            f"{r['sk_s'] / max(r['sk_iters'], 1):.3f} / {r['asp_s'] / max(r['asp_iters'], 1):.3f}"
            if "sk_s" in r
            else f"- / {r['asp_s'] / max(r['asp_iters'], 1):.3f}"
        )
        diff = f"{r['lb_rel_diff']:.1e}" if "lb_rel_diff" in r else "-"
        sp = f"{r['speedup']:.1f}x" if "speedup" in r else "-"
        lines.append(
            f"| {r['N']}, {r['D']}, {r['M']} | {r['cvtype']} | {r['backend']}/{r['dtype']} "
            f"| {r['init_s']:.2f} | {sk} | {asp} | {per} | {diff} | {sp} |"
        )
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="auto", choices=["auto", "c", "cuda"])
    p.add_argument("--sizes", default="150000x19x16,500000x36x128", help="NxDxM,... (default: %(default)s)")
    p.add_argument("--cvtypes", default="full,diag")
    p.add_argument(
        "--dtype",
        default="float64",
        choices=["float64", "float32"],
        help="asp_gmm's working precision (scikit-learn always gets the float64 data)",
    )
    p.add_argument("--max-iter", type=int, default=100)
    p.add_argument(
        "--spread",
        type=float,
        default=1.0,
        help="standard deviation of the true centres (unit-scale clusters): smaller "
        "overlaps more and takes EM more iterations (default: %(default)s)",
    )
    p.add_argument("--tol", type=float, default=1e-3)
    p.add_argument(
        "--sk-blas-threads",
        type=int,
        default=None,
        help="limit scikit-learn's BLAS threads (default: the library's own choice)",
    )
    p.add_argument("--skip-sklearn", action="store_true", help="time asp_gmm only")
    p.add_argument(
        "--time-sklearn-init",
        action="store_true",
        help="also time scikit-learn's own k-means initialisation on all events",
    )
    p.add_argument("--json", help="write the rows to this file")
    args = p.parse_args(argv)

    from asp_gmm.specializer import Specializer
    import sklearn

    backend_name = Specializer(args.backend).backend.name if args.backend != "auto" else "auto"
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()}, "
        f"python {sys.version.split()[0]}, scikit-learn {sklearn.__version__}, numpy {np.__version__}, "
        f"asp_gmm backend {args.backend} ({backend_name}), sklearn BLAS threads "
        f"{args.sk_blas_threads or 'default'}",
        flush=True,
    )
    rows = []
    for N, D, M in parse_sizes(args.sizes):
        for cv in args.cvtypes.split(","):
            r = run_case(N, D, M, cv, args)
            rows.append(r)
            print(json.dumps(r), flush=True)
    print(f"# load after: {os.getloadavg()}")
    print(fmt_table(rows))
    print(
        "\ncompile/warm-up s, tuning s: "
        + ", ".join(f"{r['N']}x{r['D']}x{r['M']} {r['cvtype']}: {r['compile_s']:.2f}, {r['tune_s']:.2f}" for r in rows)
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
