"""
Fitting on a Dask cluster
=========================

:func:`asp_gmm.dask.fit` fits a :class:`dask.array.Array` where its blocks live: every worker runs
the E-step of its own blocks through the specialized kernels and returns the sufficient statistics,
which are added in a tree, and the client does the M-step. Here on a real
:class:`~distributed.LocalCluster` of two worker processes; with a cluster of many machines (or one
worker per GPU, :func:`asp_gmm.dask.gpu_cluster`) the code is the same.
"""

import dask.array as da
import matplotlib.pyplot as plt
import numpy as np
from distributed import Client, LocalCluster

import asp_gmm.dask
from asp_gmm import GMM

rng = np.random.default_rng(2)
M, D, N = 4, 6, 60_000
centres = rng.normal(0, 4, (M, D))
X = centres[rng.integers(0, M, N)] + rng.normal(size=(N, D))

if __name__ == "__main__":  # Dask starts its worker processes by importing the main module anew
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, Client(cluster):
        Xd = da.from_array(X, chunks=(15_000, D)).persist()  # four row blocks, spread over the workers
        r = asp_gmm.dask.fit(Xd, M=M, cvtype="diag", dtype=np.float64, max_iters=10, tol=0.0)
        print(f"{r.iters} passes, log-likelihood {r.loglik:.2f}")
        print("seconds per pass:", np.round(r.pass_seconds, 3))

    # The same fit in this process (GMM.train: same seeding, same iterations) gives the same model.
    g = GMM(M, D, cvtype="diag", dtype=np.float64)
    ll = g.train(X, min_em_iters=10, max_em_iters=10, tol=0.0)
    print(f"in process: log-likelihood {ll:.2f}")
    print("largest difference of the means:", float(np.abs(r.means - g.means).max()))

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    ax.plot(np.array(r.loglik_trace) / N, "o-", label="asp_gmm.dask.fit, 2 workers")
    ax.plot(np.array(g.last_train.loglik_trace) / N, "x--", ms=9, label="GMM.train, this process")
    ax.set_xlabel("EM iteration")
    ax.set_ylabel("log-likelihood per event")
    ax.legend()
    fig.tight_layout()
    plt.show()
