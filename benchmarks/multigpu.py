"""Distributed EM on several GPUs of one host through Dask: per-iteration time with 1 and 2 GPUs.

    python benchmarks/multigpu.py [--gpus 1,2] [--full 20000000] [--diag 200000000] [--iters 3]

One Dask worker process per GPU (:func:`asp_gmm.dask.gpu_cluster` specs: dask-cuda where installed, else
``CUDA_VISIBLE_DEVICES`` per worker). The data is generated block by block *on the workers* (each
block of ``--block`` rows from its own seed, one M-component mixture), persisted in the workers'
memory, and every EM pass runs :func:`asp_gmm.dask.fit` (statistics of each block on its worker's GPU,
tree reduction, M-step on the client). Per-iteration time = (wall of 1+iters iterations - wall of 1
iteration) / iters, so seeding, compiles and the first pass cancel. The fits with 1 and with 2 GPUs
start from the same parameters; their covariances are compared (relative Frobenius difference).
The table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

D, M = 36, 128


def centres(seed=0):
    return np.random.default_rng(seed).normal(0.0, 3.0, (M, D))


def make_block(block_info=None, rows=0, seed=0):
    """Rows of block ``block_info``'s index, generated where the task runs (a worker)."""
    i = block_info[None]["chunk-location"][0]
    rng = np.random.default_rng([seed, i])
    c = centres(seed)
    lab = rng.integers(0, M, rows)
    return (c[lab] + rng.standard_normal((rows, D), dtype=np.float32)).astype(np.float32)


def data(N, block, seed=0):
    import dask.array as da

    nb = N // block
    return da.map_blocks(make_block, chunks=((block,) * nb, (D,)), dtype=np.float32, rows=block, seed=seed)


def start(cvtype, seed=1):
    rng = np.random.default_rng(seed)
    mu = centres() + 0.3 * rng.standard_normal((M, D))
    cov = np.stack([np.eye(D) * 1.5] * M) if cvtype == "full" else np.full((M, D), 1.5)
    return np.full(M, 1.0 / M), mu, cov


def run(n_gpus, cases, iters, block, threads, backend="cuda"):
    from distributed import Client, Scheduler, SpecCluster, wait

    from asp_gmm import dask as adask

    specs = adask.gpu_worker_specs(n_gpus, threads_per_worker=threads)
    out = {}
    with (
        SpecCluster(workers=specs, scheduler={"cls": Scheduler, "options": {"dashboard_address": None}}) as cl,
        Client(cl) as client,
    ):
        client.wait_for_workers(n_gpus)
        for cvtype, N in cases:
            t0 = time.perf_counter()
            X = data(N, block).persist()
            wait(X)
            gen = time.perf_counter() - t0
            w, mu, cov = start(cvtype)
            res = {}
            for k in (1, 1, 1 + iters):  # the first call compiles and explores: a warm-up
                t0 = time.perf_counter()
                r = adask.fit(
                    X,
                    M,
                    cvtype=cvtype,
                    weights=w,
                    means=mu,
                    covars=cov,
                    min_iters=k,
                    max_iters=k,
                    tol=0.0,
                    backend=backend,
                    client=client,
                    progress=False,
                )
                res[k] = (time.perf_counter() - t0, r)
            per = (res[1 + iters][0] - res[1][0]) / iters
            r = res[1 + iters][1]
            out[cvtype] = dict(
                N=N,
                gen_s=gen,
                iter_s=per,
                pass_s=r.pass_seconds,
                loglik=r.loglik,
                covars=r.covars,
                events_per_s=N / per,
            )
            print(
                json.dumps({k: v for k, v in out[cvtype].items() if k != "covars"} | dict(gpus=n_gpus, cvtype=cvtype)),
                flush=True,
            )
            del X
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="1,2")
    ap.add_argument("--full", type=int, default=20_000_000)
    ap.add_argument("--diag", type=int, default=200_000_000)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--block", type=int, default=2_000_000)
    ap.add_argument("--backend", default="cuda", help="c: try the script on a CPU")
    ap.add_argument("--threads", type=int, default=1, help="threads per worker")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "multigpu.json"))
    a = ap.parse_args()
    cases = [c for c in (("full", a.full), ("diag", a.diag)) if c[1] > 0]
    results = {}
    for g in [int(v) for v in a.gpus.split(",")]:
        results[g] = run(g, cases, a.iters, a.block, a.threads, a.backend)
    with open(a.json, "w") as f:
        json.dump(
            {g: {c: {k: v for k, v in r.items() if k != "covars"} for c, r in rs.items()} for g, rs in results.items()},
            f,
            indent=1,
        )
    gs = sorted(results)
    print(f"\nDistributed EM, one Dask worker per GPU, D={D}, M={M}, float32; seconds per EM iteration")
    print(
        f"{'cov':<5} {'N':>11} " + " ".join(f"{str(g) + ' GPU':>10}" for g in gs) + "   speed-up  covariances vs 1 GPU"
    )
    for cvtype, _ in cases:
        base = results[gs[0]][cvtype]
        row = f"{cvtype:<5} {base['N']:>11} " + " ".join(f"{results[g][cvtype]['iter_s']:>10.3f}" for g in gs)
        last = results[gs[-1]][cvtype]
        diff = np.linalg.norm(last["covars"] - base["covars"]) / np.linalg.norm(base["covars"])
        print(row + f"   {base['iter_s'] / last['iter_s']:>7.2f}x  {diff:.1e}")


if __name__ == "__main__":
    main()
