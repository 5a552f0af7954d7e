"""Before/after agreement of a restructure: the same set of fits run by two checkouts, compared.

    python benchmarks/agreement.py run OUT.json              # fits with the asp_gmm on sys.path
    python benchmarks/agreement.py compare BEFORE.json AFTER.json

To run the fits with another checkout's code (e.g. main), put its package first on the path:
``git archive main | tar -x -C /tmp/before`` and ``PYTHONPATH=/tmp/before python
benchmarks/agreement.py run before.json``. The fits use public names only: ``GMM.train`` (NumPy and C
backends; full and diag; float64 and float32; in memory and streamed from a memmap) and the drop-in's
``fit`` (every covariance type) and ``partial_fit``. ``ASP_GMM_AUTOTUNE=0`` and fresh history and
cache folders make the variant choice the fixed rule in both runs. ``compare`` prints the largest
relative difference per fit (float64 fits should agree to ~1e-12: the same arithmetic in the same
order, or a reordered sum).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np


def _blobs(seed, N, D, M):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 3.0, (M, D))
    lab = rng.integers(0, M, N)
    X = centres[lab] + rng.standard_normal((N, D)) * rng.uniform(0.5, 1.5, (M, D))[lab]
    return X @ (np.eye(D) + 0.3 * rng.standard_normal((D, D)) / np.sqrt(D)) + 4.0


def run(out: str) -> None:
    tmp = tempfile.mkdtemp(prefix="asp_gmm_agree_")
    os.environ["ASP_GMM_AUTOTUNE"] = "0"
    os.environ["ASP_GMM_DB"] = f"sqlite:///{tmp}/history.sqlite"
    os.environ["ASP_GMM_CACHE_DIR"] = f"{tmp}/cache"
    import asp_gmm
    from asp_gmm import GMM

    res = {}

    def put(key, ll, *arrays, variant=""):
        res[key] = {
            "loglik": float(ll),
            "params": [np.asarray(a, np.float64).ravel().tolist() for a in arrays],
            "variant": variant,
        }

    for seed, (N, D, M) in enumerate([(3000, 4, 3), (1500, 7, 5), (4000, 2, 1), (257, 3, 4)]):
        X = _blobs(seed, N, D, M)
        for backend in ("numpy", "c"):
            for cvtype in ("full", "diag"):
                for dtype in (np.float64, np.float32):
                    g = GMM(M, D, cvtype=cvtype, dtype=dtype, backend=backend)
                    ll = g.train(X.astype(dtype), max_em_iters=12, tol=0.0)
                    put(
                        f"GMM {backend} {cvtype} {np.dtype(dtype).name} N={N} D={D} M={M}",
                        ll,
                        g.weights,
                        g.means,
                        g.covars,
                    )
                path = os.path.join(tmp, f"X{seed}.f64")
                mm = np.memmap(path, np.float64, "w+", shape=X.shape)
                mm[:] = X
                mm.flush()
                g = GMM(M, D, cvtype="full", dtype=np.float64, backend=backend, seed=7)
                ll = g.train(np.memmap(path, np.float64, "r", shape=X.shape), max_em_iters=8, tol=0.0)
                put(f"GMM memmap {backend} full seed=7 N={N} D={D} M={M}", ll, g.weights, g.means, g.covars)
        try:
            from asp_gmm.sklearn_api import GaussianMixture
        except ImportError:  # pragma: no cover - scikit-learn missing
            continue
        for cvtype in ("full", "diag", "tied", "spherical"):
            gm = GaussianMixture(M, covariance_type=cvtype, backend="c", random_state=seed, max_iter=20).fit(X)
            put(
                f"GaussianMixture.fit {cvtype} N={N} D={D} M={M}",
                gm.lower_bound_,
                gm.weights_,
                gm.means_,
                gm.covariances_,
            )
            gm = GaussianMixture(M, covariance_type=cvtype, backend="c", random_state=seed)
            for part in np.array_split(X, 4):
                gm.partial_fit(part)
            put(
                f"GaussianMixture.partial_fit {cvtype} N={N} D={D} M={M}",
                gm.lower_bound_,
                gm.weights_,
                gm.means_,
                gm.covariances_,
            )
    res["_version"] = asp_gmm.__file__
    with open(out, "w") as f:
        json.dump(res, f)
    print(f"{len(res) - 1} fits -> {out} ({asp_gmm.__file__})")


def compare(before: str, after: str) -> int:
    a, b = json.load(open(before)), json.load(open(after))
    keys = sorted(k for k in a if not k.startswith("_"))
    worst = {"float64": 0.0, "float32": 0.0}
    print(f"{'fit':70s} {'max rel diff':>13s}")
    for k in keys:
        if k not in b:
            print(f"{k:70s} {'missing':>13s}")
            continue
        d = abs(a[k]["loglik"] - b[k]["loglik"]) / max(abs(a[k]["loglik"]), 1e-300)
        for pa, pb in zip(a[k]["params"], b[k]["params"]):
            pa, pb = np.asarray(pa), np.asarray(pb)
            d = max(d, float(np.max(np.abs(pa - pb) / np.maximum(np.abs(pa), 1e-12))) if pa.size else 0.0)
        kind = "float32" if "float32" in k else "float64"
        worst[kind] = max(worst[kind], d)
        va, vb = a[k].get("variant", ""), b[k].get("variant", "")
        note = "" if va == vb else f"  (variant {va} -> {vb}: a background compile finished at another time)"
        print(f"{k:70s} {d:13.3g}{note}")
    print(
        f"\n{len(keys)} fits; largest relative difference: float64 {worst['float64']:.3g}, float32 {worst['float32']:.3g}"
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "run":
        run(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        print(__doc__)
        sys.exit(2)
