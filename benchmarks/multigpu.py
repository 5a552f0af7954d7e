"""Distributed EM on several GPUs of one host through Dask: seconds per EM iteration and events/s
per GPU with 1, 2 and 4 GPUs, against one GPU in-process on the same data.

    python benchmarks/multigpu.py [--gpus 1,2,4] [--full 80000000] [--diag 400000000] [--iters 3]
        [--block 1000000] [--inproc-diag 80000000] [--no-inproc] [--backend cuda]
    python benchmarks/multigpu.py --cpu [--rounds 5] [--iters 3]     # the CPU target, (2M, 19, 16) full

One Dask worker process per GPU (:func:`asp_gmm.dask.gpu_worker_specs`: ``CUDA_VISIBLE_DEVICES``
per worker, no host memory limit). The data is generated block by block *on the workers* (each block
of ``--block`` rows from its own seed: CuPy on the worker's GPU where CuPy is importable, so the
blocks are device arrays from the start; NumPy otherwise) and persisted there; :func:`asp_gmm.dask.fit`
then keeps every block resident on its worker's GPU and runs one loop per worker. Per-iteration
time = the median of the client's pass times after the first pass and the first iteration
(compiles happen before the first pass: excluded). All fits start from the same parameters; the
covariances of 2 and 4 GPUs and of the in-process fit are compared with 1 GPU (relative Frobenius).

The in-process baseline trains ``asp_gmm.GMM`` on a CuPy array of the same blocks on one GPU
(in memory: ``ASP_GMM_MEMORY_FRACTION=0.95``), variant pinned to the one the Dask workers chose;
diag at ``--inproc-diag`` rows (400M rows of diag do not fit one GPU with their posteriors).
The table is printed last; JSON lines and ``multigpu.json`` go to ``$OUT`` (or here).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

D, M = 36, 128


def centres(seed=0):
    return np.random.default_rng(seed).normal(0.0, 3.0, (M, D))


def _cupy():
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
        return cupy
    except Exception:  # noqa: BLE001 - no CuPy or no GPU: NumPy blocks
        return None


def block_rows(i, rows, seed=0, gpu=True):
    """Block ``i``: ``rows`` events of the mixture, float32, generated from the block's own seed
    (CuPy on this process's GPU when ``gpu`` and CuPy is there, else NumPy)."""
    cp = _cupy() if gpu else None
    c = centres(seed)
    if cp is not None:
        rs = cp.random.RandomState(seed * 1_000_003 + i)
        lab = rs.randint(0, M, rows)
        return cp.asarray(c, dtype=cp.float32)[lab] + rs.standard_normal((rows, D), dtype=cp.float32)
    rng = np.random.default_rng([seed, i])
    lab = rng.integers(0, M, rows)
    return (c[lab] + rng.standard_normal((rows, D), dtype=np.float32)).astype(np.float32)


def make_block(block_info=None, rows=0, seed=0, gpu=True):
    """Task: the rows of block ``block_info``'s index, generated on the worker that runs it."""
    return block_rows(block_info[None]["chunk-location"][0], rows, seed, gpu)


def data(N, block, seed=0, gpu=True):
    import dask.array as da

    nb = max(1, N // block)
    return da.map_blocks(
        make_block,
        chunks=((block,) * nb, (D,)),
        dtype=np.float32,
        meta=np.empty((0, D), np.float32),
        rows=block,
        seed=seed,
        gpu=gpu,
    )


def start(cvtype, seed=1):
    rng = np.random.default_rng(seed)
    mu = centres() + 0.3 * rng.standard_normal((M, D))
    cov = np.stack([np.eye(D) * 1.5] * M) if cvtype == "full" else np.full((M, D), 1.5)
    return np.full(M, 1.0 / M), mu, cov


def per_iter(pass_seconds):
    """Median seconds of the passes after the first pass and the first iteration."""
    tail = pass_seconds[2:] or pass_seconds[1:] or pass_seconds
    return statistics.median(tail)


def run_dask(n_gpus, cases, iters, block, threads, backend):
    from distributed import Client, Scheduler, SpecCluster, futures_of, wait

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
            X = data(N, block, gpu=backend != "c").persist()
            wait(X)
            gen = time.perf_counter() - t0
            w, mu, cov = start(cvtype)
            t0 = time.perf_counter()
            r = adask.fit(
                X,
                M,
                cvtype=cvtype,
                weights=w,
                means=mu,
                covars=cov,
                min_iters=1 + iters,
                max_iters=1 + iters,
                tol=0.0,
                backend=backend,
                client=client,
                progress=False,
            )
            wall = time.perf_counter() - t0
            per = per_iter(r.pass_seconds)
            n = int(X.shape[0])
            out[cvtype] = dict(
                N=n,
                gen_s=gen,
                fit_s=wall,
                iter_s=per,
                pass_s=r.pass_seconds,
                compute_s=r.compute_seconds,
                loglik=r.loglik,
                covars=r.covars,
                events_per_s=n / per,
                events_per_s_per_gpu=n / per / n_gpus,
                workers=r.workers,
                loads=r.loads,
                variant=r.variant,
            )
            row = {k: v for k, v in out[cvtype].items() if k != "covars"}
            print(json.dumps(row | dict(gpus=n_gpus, cvtype=cvtype)), flush=True)
            client.cancel(futures_of(X))  # free the GPUs' blocks before the next case
            del X
    return out


def run_inprocess(cases, iters, block, inproc_diag, variants, backend):
    """One GPU in this process: ``GMM.train`` on a CuPy array of the same blocks (in memory)."""
    os.environ.setdefault("ASP_GMM_MEMORY_FRACTION", "0.95")
    from asp_gmm import GMM

    cp = _cupy()
    out = {}
    for cvtype, N in cases:
        n = min(N, inproc_diag) if cvtype == "diag" else N
        nb = max(1, n // block)
        if cp is not None:
            X = cp.empty((nb * block, D), cp.float32)
            for i in range(nb):
                X[i * block : (i + 1) * block] = block_rows(i, block)
        else:
            X = np.concatenate([block_rows(i, block, gpu=False) for i in range(nb)])
        w, mu, cov = start(cvtype)
        name = (variants.get(cvtype) or "").split("(")[0] or None
        times = {}
        g = None
        for k in (1, 1 + iters):
            g = GMM(M, D, means=mu, covars=cov, weights=w, cvtype=cvtype, backend=backend, variant=name)
            t0 = time.perf_counter()
            g.train(X, min_em_iters=k, max_em_iters=k, tol=0.0)
            times[k] = time.perf_counter() - t0
        per = (times[1 + iters] - times[1]) / iters
        out[cvtype] = dict(
            N=int(X.shape[0]),
            iter_s=per,
            covars=np.asarray(g.covars, np.float64),
            loglik=float(g.loglik),
            events_per_s=int(X.shape[0]) / per,
            events_per_s_per_gpu=int(X.shape[0]) / per,
            variant=g.last_variant,
        )
        print(
            json.dumps({k: v for k, v in out[cvtype].items() if k != "covars"} | dict(gpus="1 in-process")), flush=True
        )
        del X, g
        if cp is not None:
            cp.get_default_memory_pool().free_all_blocks()
    return out


def cpu_target(rounds, iters, n):
    """One Dask worker (all cores) against the in-process pass at (n, 19, 16) full, float32, on this
    CPU: alternating rounds (an in-process fit, then a Dask fit, 1 + iters iterations each, the same
    variant), per pass = the median over the iterations after the first: the C session's own
    iteration times in-process, the client's pass times (M-step, parameters out, statistics back
    included) for Dask."""
    import dask.array as da
    from distributed import Client, LocalCluster, wait

    import asp_gmm.dask as agd
    from asp_gmm import GMM
    from asp_gmm.backends import c as cb

    runs = []
    em = cb.CSession._em

    def recorded(self, *args, **kw):  # the in-process iteration times (EMRun.iter_seconds)
        run = em(self, *args, **kw)
        runs.append(run)
        return run

    cb.CSession._em = recorded
    Dc, Mc = 19, 16
    rng = np.random.default_rng(0)
    c = rng.normal(0, 3, (Mc, Dc))
    X = (c[rng.integers(0, Mc, n)] + rng.standard_normal((n, Dc))).astype(np.float32)
    w, mu, cov = np.full(Mc, 1 / Mc), X[:: n // Mc][:Mc].astype(np.float64), np.stack([np.eye(Dc) * 2.0] * Mc)
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    make = lambda v: GMM(Mc, Dc, means=mu, covars=cov, weights=w, cvtype="full", backend="c", variant=v)  # noqa: E731
    g = make(None)
    g.train(X, min_em_iters=2, max_em_iters=2, tol=0)
    variant = g.last_variant.split("(")[0]
    ins, dks, loads, labels = [], [], [], {}
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            env={"ASP_GMM_NUM_THREADS": str(ncpu)},
        ) as cl,
        Client(cl),
    ):
        dX = da.from_array(X, chunks=(-(-n // 4), Dc)).persist()
        wait(dX)
        kw = dict(M=Mc, cvtype="full", backend="c", variant=variant, weights=w, means=mu, covars=cov, tol=0)
        agd.fit(dX, min_iters=1, max_iters=1, **kw)  # compiles on the worker
        for _ in range(rounds):
            loads.append(os.getloadavg()[0])
            gk = make(variant)
            gk.train(X, min_em_iters=1 + iters, max_em_iters=1 + iters, tol=0)
            ins.append(statistics.median(runs[-1].iter_seconds[1:] or runs[-1].iter_seconds))
            r = agd.fit(dX, min_iters=1 + iters, max_iters=1 + iters, **kw)
            dks.append(per_iter(r.pass_seconds))
            labels = {"in-process": gk.last_variant, "Dask": r.variant}
            row = dict(
                inprocess_ms=1e3 * ins[-1], dask_ms=1e3 * dks[-1], dask_worker_ms=1e3 * per_iter(r.compute_seconds)
            )
            print(json.dumps(row | dict(load=loads[-1])), flush=True)
    cb.CSession._em = em
    ratios = [d / i for d, i in zip(dks, ins)]
    print(f"\nCPU ({ncpu} cores), (N, D, M) = ({n}, {Dc}, {Mc}) full float32, {rounds} rounds; variants {labels}")
    print(f"load average (1 min) during the rounds: {min(loads):.1f} to {max(loads):.1f}")
    print(f"in-process pass : median {1e3 * statistics.median(ins):7.1f} ms, min {1e3 * min(ins):7.1f} ms")
    print(f"one Dask worker : median {1e3 * statistics.median(dks):7.1f} ms, min {1e3 * min(dks):7.1f} ms")
    print(
        f"Dask / in-process: median of the rounds' ratios {statistics.median(ratios):.3f}x, of the medians "
        f"{statistics.median(dks) / statistics.median(ins):.3f}x, of the minima {min(dks) / min(ins):.3f}x"
    )


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="1,2,4")
    ap.add_argument("--full", type=int, default=80_000_000, help="rows of the full case (0: skip)")
    ap.add_argument("--diag", type=int, default=400_000_000, help="rows of the diag case (0: skip)")
    ap.add_argument("--iters", type=int, default=3, help="timed iterations (after the first)")
    ap.add_argument("--block", type=int, default=1_000_000, help="rows per block")
    ap.add_argument("--inproc-diag", type=int, default=80_000_000, help="rows of the in-process diag fit")
    ap.add_argument("--no-inproc", action="store_true", help="skip the one-GPU in-process baseline")
    ap.add_argument("--backend", default="cuda", help="c: try the script on a CPU (small N)")
    ap.add_argument("--threads", type=int, default=1, help="threads per worker")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "multigpu.json"))
    ap.add_argument("--cpu", action="store_true", help="the CPU target instead: one Dask worker vs in-process")
    ap.add_argument("--rounds", type=int, default=5, help="--cpu: alternating rounds")
    ap.add_argument("--cpu-n", type=int, default=2_000_000, help="--cpu: events")
    a = ap.parse_args()
    if a.cpu:
        cpu_target(a.rounds, a.iters, a.cpu_n)
        return
    cases = [c for c in (("full", a.full), ("diag", a.diag)) if c[1] > 0]
    gpus = [int(v) for v in a.gpus.split(",")]
    results = {}
    for g in gpus:
        results[g] = run_dask(g, cases, a.iters, a.block, a.threads, a.backend)
    inproc = {}
    if not a.no_inproc:
        variants = {c: results[gpus[0]][c]["variant"] for c, _ in cases}
        inproc = run_inprocess(cases, a.iters, a.block, a.inproc_diag, variants, a.backend)
    with open(a.json, "w") as f:
        json.dump(
            {
                "dask": {
                    g: {c: {k: v for k, v in r.items() if k != "covars"} for c, r in rs.items()}
                    for g, rs in results.items()
                },
                "inprocess": {c: {k: v for k, v in r.items() if k != "covars"} for c, r in inproc.items()},
            },
            f,
            indent=1,
        )
    base_g = gpus[0]
    print(f"\nDistributed EM, one Dask worker per GPU, blocks resident on the GPUs, D={D}, M={M}, float32")
    print("seconds per EM iteration (median after the first), M events/s per GPU, covariances vs the first column")
    head = f"{'cov':<5} {'N':>11} {'1 GPU in-proc':>16} " + " ".join(f"{str(g) + ' GPU dask':>16}" for g in gpus)
    print(head + f"  {'speed-up':>9}  {'dask/in-proc':>12}  cov diff")
    for cvtype, _ in cases:
        base = results[base_g][cvtype]
        ip = inproc.get(cvtype)
        cells = [f"{ip['iter_s']:7.3f}s {ip['events_per_s_per_gpu'] / 1e6:6.0f}M" if ip else f"{'-':>16}"]
        cells += [
            f"{results[g][cvtype]['iter_s']:7.3f}s {results[g][cvtype]['events_per_s_per_gpu'] / 1e6:6.0f}M"
            for g in gpus
        ]
        last = results[gpus[-1]][cvtype]
        speed = base["iter_s"] / last["iter_s"]
        ratio = f"{ip['events_per_s'] / base['events_per_s']:.2f}x" if ip else "-"
        diffs = [rel(results[g][cvtype]["covars"], base["covars"]) for g in gpus[1:]]
        if ip and ip["N"] == base["N"]:
            diffs.append(rel(ip["covars"], base["covars"]))
        print(
            f"{cvtype:<5} {base['N']:>11} "
            + " ".join(f"{c:>16}" for c in cells)
            + f"  {speed:>8.2f}x  {ratio:>12}  {max(diffs) if diffs else 0.0:.1e}"
        )
    ipd, dd = inproc.get("diag"), results[base_g].get("diag")
    if ipd and dd and ipd["N"] != dd["N"]:
        print(f"(in-process diag at N={inproc['diag']['N']}: {a.diag} rows and their posteriors do not fit one GPU)")


if __name__ == "__main__":
    main()
