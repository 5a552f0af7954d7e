"""Smallest use of the package: train a GMM on generated data and show what the specializer chose.

python examples/demo.py [--N 150000] [--D 19] [--M 16] [--backend auto]
"""

import argparse
import time

import numpy as np

from asp_gmm import GMM

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--N", type=int, default=150_000)
p.add_argument("--D", type=int, default=19)
p.add_argument("--M", type=int, default=16)
p.add_argument("--backend", default="auto")
a = p.parse_args()

rng = np.random.default_rng(0)
centres = rng.normal(0, 4, (a.M, a.D))
X = (centres[rng.integers(0, a.M, a.N)] + rng.normal(0, 1, (a.N, a.D))).astype(np.float32)
g = GMM(a.M, a.D, backend=a.backend, seed=0)
g.train(X[:2000], max_em_iters=1)  # compiles (first time only) and warms the caches
t = time.perf_counter()
ll = g.train(X, max_em_iters=10)
dt = time.perf_counter() - t
print(
    f"backend {g.backend}, variant {g.last_variant}: {g.n_iter} EM iterations, "
    f"log-likelihood {ll:.6g} ({ll / a.N:.4f} per event), {dt:.3f} s ({dt / max(g.n_iter, 1) * 1e3:.1f} ms/iteration)"
)
