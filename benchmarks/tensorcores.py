"""A tensor-core variant's tunable sets against each other, per EM iteration on the GPU: V9's E-step
GEMM on mma.sync against Hopper's wgmma (``wg``), V8's tile plans (``tmax``) and chunks (``events``).

For each shape (N, D, M) and each tunable set of ``--variant`` (V9 diag by default; V8 with
``--variant V8 --cvtype full``): the median iteration time and its phases (CUDA events,
``iters`` iterations of one pinned session after a warm-up), and at a smaller shape the covariance error
of one iteration against float64 EM with the data offset by +10 and +1000 (relative Frobenius norm).

    python benchmarks/tensorcores.py --shapes 1000000x128x1024,500000x36x128 --iters 5
    python benchmarks/tensorcores.py --variant V8 --cvtype full --shapes 1000000x64x64,500000x36x128 \
        --tunables "tmax=8;tmax=12;events=64"

The table goes to stdout last; the JSON to ``--json``.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu import blobs, init_params  # noqa: E402
from asp_gmm import reference as ref  # noqa: E402
from asp_gmm import registry  # noqa: E402
from asp_gmm.problem import Problem  # noqa: E402

REG = 1e-6
TUNABLES = {"V9": ["wg=0", "wg=1", "wg=1,be=64", "wg=1,kd=32", "wg=0,kd=16"], "V8": ["tmax=8", "tmax=12", "events=64"]}


def parse_tun(s):
    return {k: int(v) for k, v in (a.split("=") for a in s.split(",") if a)}


def time_shape(be, X, params, tun, iters, variant="V9", cvtype="diag", reg=REG):
    """Median iteration and phase times (ms) of ``variant`` at ``tun`` and the final log-likelihood."""
    N, D = X.shape
    p = Problem(N, D, params[0].shape[0], cvtype, "float32")
    v = registry.get("cuda", variant, "covariance")
    s = be.open(X, p)
    try:
        k = be.kernel(v, tun, p)
        s.set_params(*params, reg)
        s.em(k, min_iters=1, max_iters=1, tol=0.0, reg_covar=reg)  # loads the module
        s.set_params(*params, reg)
        t0 = time.perf_counter()
        run = s.em(k, min_iters=iters, max_iters=iters, tol=0.0, reg_covar=reg)
        wall = 1e3 * (time.perf_counter() - t0) / max(run.iters, 1)
        ph = [1e3 * statistics.median(x) for x in zip(*s.phase_seconds)]
        return dict(
            label=k.label,
            iter_ms=1e3 * statistics.median(run.iter_seconds),
            wall_ms=wall,
            phases_ms=ph,
            loglik=run.loglik,
        )
    finally:
        s.close()


def error(be, rng, shape, offset, tun, variant="V9", cvtype="diag"):
    """Covariance error of one iteration of ``variant`` at ``tun`` against float64 EM from the same start."""
    N, D, M = shape
    X = blobs(rng, N, D, M) + np.float32(offset)
    w, mu, cv = init_params(rng, X, M, cvtype)
    r = ref.em(X.astype(np.float64), w, mu, cv, cvtype, REG, 1, 1, 0.0)
    p = Problem(N, D, M, cvtype, "float32")
    s = be.open(X, p)
    try:
        s.set_params(w, mu, cv, REG)
        s.em(
            be.kernel(registry.get("cuda", variant, "covariance"), tun, p),
            min_iters=1,
            max_iters=1,
            tol=0.0,
            reg_covar=REG,
        )
        _, _, c = s.params()
    finally:
        s.close()
    return float(np.linalg.norm(c - r["covars"]) / np.linalg.norm(r["covars"]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1000000x128x1024,500000x36x128,200000x128x256")
    ap.add_argument("--variant", default="V9", choices=sorted(TUNABLES))
    ap.add_argument("--cvtype", default="diag", choices=["diag", "full"])
    ap.add_argument("--tunables", help="';'-separated sets, e.g. 'wg=0;wg=1,be=64' (default: the variant's list)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--error-shape", default="20000x36x128")
    ap.add_argument(
        "--reg",
        type=float,
        default=REG,
        help="reg_covar of the timed shapes (full at (200000, 128, 256) needs 1e-2: some blobs' components "
        "are singular at 1e-6); the error check keeps 1e-6",
    )
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "tensorcores.json"))
    a = ap.parse_args(argv)
    from asp_gmm.backends.cuda import CudaBackend

    be = CudaBackend()
    rng = np.random.default_rng(0)
    tuns = [t for t in (a.tunables or ";".join(TUNABLES[a.variant])).split(";") if t]
    rows, out = [], {"device": be.device.name, "shapes": {}, "errors": {}}
    for sh in a.shapes.split(","):
        N, D, M = (int(x) for x in sh.split("x"))
        X = blobs(rng, N, D, M) + np.float32(10.0)
        params = init_params(rng, X, M, a.cvtype)
        for t in tuns:
            try:
                r = time_shape(be, X, params, parse_tun(t), a.iters, a.variant, a.cvtype, a.reg)
            except Exception as exc:  # noqa: BLE001 - a limit, a compile error: reported, the others go on
                r = {"error": repr(exc)[:300]}
            out["shapes"].setdefault(sh, {})[t] = r
            rows.append((sh, t, r))
            print(sh, t, r, flush=True)
    es = tuple(int(x) for x in a.error_shape.split("x"))
    for t in tuns:
        for off in (10.0, 1000.0):
            try:
                e = error(be, np.random.default_rng(1), es, off, parse_tun(t), a.variant, a.cvtype)
            except Exception as exc:  # noqa: BLE001
                e = repr(exc)[:200]
            out["errors"][f"{t} +{off:g}"] = e
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"\n{be.device.name}: {a.variant} {a.cvtype} per EM iteration (median of {a.iters}, CUDA events), ms")
    print("| (N, D, M) | tunables | iteration | phases (sums+means, cov, factor+E-step) | wall/iter |")
    print("|---|---|---|---|---|")
    for sh, t, r in rows:
        if "error" in r:
            print(f"| {sh} | {t} | {r['error'][:80]} | | |")
        else:
            ph = ", ".join(f"{x:.2f}" for x in r["phases_ms"])
            print(f"| {sh} | {t} ({r['label']}) | {r['iter_ms']:.2f} | {ph} | {r['wall_ms']:.2f} |")
    print(f"\ncovariance error after one iteration at {a.error_shape} (relative Frobenius, vs float64 EM)")
    for k, e in out["errors"].items():
        print(f"  {k}: {e if isinstance(e, str) else f'{e:.2e}'}")


if __name__ == "__main__":
    main()
