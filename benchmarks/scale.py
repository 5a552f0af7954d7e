"""Streamed and distributed EM at scale: GPU (streamed against in-memory) and CPU (Dask against in-process).

    python benchmarks/scale.py gpu [--quick] [--max-n 600000000] [--iters 2] [--json out.json]
    python benchmarks/scale.py cpu [--quick] [--n 2000000] [--iters 4] [--json out.json]

GPU part (backend="cuda"; never imports dask):
  * the host->device bandwidth, measured: pinned host buffer of 1 GiB copied to the device;
  * full and diag at D=36, M=128 for N = 10M, 100M, 600M (600M x 36 float32 = 86 GB: more than the
    GPU): N events from P distinct chunks of 2M events, each generated on the host from its own seed
    (chunk i is chunk i mod P: generating 600M normal vectors would take the host longer than the GPU
    takes to train on them), streamed through GMM.train from a callable source; in-memory at every N
    that fits (ASP_GMM_DEVICE_BUDGET raised to 90 % of the free memory for it), same data, same run;
  * events/s per EM pass (the wall time of `iters` iterations minus that of 0 iterations, so seeding,
    selection and the first E-step cancel), streamed as % of in-memory, and the bytes per second the
    streamed pass moves as % of the measured bandwidth;
  * Flash-GMM's shape: diag, D=128, M=1024, N=100M streamed; the time one pass over 1e9 points would
    take at that rate, against Flash-GMM's published 1e9 points in ~28 min on an A100.
  --quick: N = 2M and 6M only, and Flash-GMM's shape at 4M. --max-n: skip larger N. --backend c
  --n-list 20000 --flash-n 5000 tries the script on a CPU.

CPU part (backend="c"; needs dask and distributed): (N, D, M) = (2M, 19, 16) full, float32:
  * in-process in memory, in-process streamed (asp_gmm.streaming), and asp_gmm.dask.fit on a
    LocalCluster of 1 worker (2 threads) and of 2 workers (1 thread each), the array persisted on
    the workers; milliseconds per pass (median over passes 1..iters) and the Dask path's per-pass
    overhead over the in-process in-memory iteration; and a Dask pass over 20 000 events (4 blocks),
    whose time is the path's fixed per-pass cost (scheduling, parameters out, statistics back, reduction).
The table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

REG = 1e-6
CHUNK = 2_000_000


def pool(P, D, M, seed=0, rows=CHUNK):
    """P chunks of ``rows`` events from one M-component mixture (float32), chunk p seeded by (seed, p)."""
    centres = np.random.default_rng(seed).normal(0.0, 3.0, (M, D))
    out = []
    for p in range(P):
        rng = np.random.default_rng([seed, p])
        lab = rng.integers(0, M, rows)
        X = centres[lab] + rng.standard_normal((rows, D), dtype=np.float32)
        out.append(np.ascontiguousarray(X, dtype=np.float32))
    return out


def source(chunks, N):
    """A re-iterable source of N rows made of the pool's chunks in turn."""

    def gen():
        done = 0
        i = 0
        while done < N:
            c = chunks[i % len(chunks)]
            take = min(len(c), N - done)
            yield c[:take]
            done += take
            i += 1

    return gen


def params_for(chunks, M, cvtype):
    X = chunks[0]
    means = X[:: max(1, len(X) // M)][:M].astype(np.float64)
    cov = np.cov(X[:200_000].astype(np.float64).T) + 1e-3 * np.eye(X.shape[1])
    covars = np.repeat(cov[None], M, 0) if cvtype == "full" else np.repeat(np.diag(cov)[None], M, 0)
    return np.full(M, 1.0 / M), means, covars


def per_pass(make, X, iters, repeats=2):
    """Seconds per EM pass: (time of `iters` iterations - time of 0) / iters, each the best of
    ``repeats`` runs on a fresh model (so the first pass, selection and setup cancel)."""
    t = []
    for k in (0, iters):
        best = float("inf")
        for _ in range(repeats):
            g = make()
            t0 = time.perf_counter()
            g.train(X, min_em_iters=k, max_em_iters=k, tol=0.0)
            best = min(best, time.perf_counter() - t0)
        t.append(best)
    return (t[1] - t[0]) / iters, g


# ------------------------------------------------------------------------------ GPU
def h2d_bandwidth(nbytes=1 << 30):
    import pycuda.autoinit  # noqa: F401
    import pycuda.driver as drv

    host = drv.pagelocked_empty(nbytes, np.uint8)
    host[:] = 1
    dev = drv.mem_alloc(nbytes)
    drv.memcpy_htod(dev, host)
    best = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        drv.memcpy_htod(dev, host)
        drv.Context.synchronize()
        best = max(best, nbytes / (time.perf_counter() - t0))
    dev.free()
    return best


def free_gpu_bytes():
    import pycuda.driver as drv

    free, _ = drv.mem_get_info()
    return free


def gpu_part(args, rows):
    from asp_gmm import GMM
    from asp_gmm.errors import KernelError
    from asp_gmm.backends import get_backend

    be = args.backend
    get_backend(be)
    bw = h2d_bandwidth() if be == "cuda" else float("nan")
    print(f"host->device: {bw / 1e9:.1f} GB/s (pinned, 1 GiB)", flush=True)
    D, M = 36, 128
    Ns = [2_000_000, 6_000_000] if args.quick else [10_000_000, 100_000_000, 600_000_000]
    Ns = args.n_list or [n for n in Ns if n <= args.max_n]
    chunks = pool(4 if args.quick else 8, D, M, rows=min(CHUNK, max(Ns)))
    for cv in ("full", "diag"):
        w, mu, c = params_for(chunks, M, cv)
        make = lambda: GMM(M, D, means=mu, covars=c, weights=w, cvtype=cv, backend=be)  # noqa: E731
        make().train(chunks[0], max_em_iters=1)  # compiles, fills the history
        make().train(source(chunks, len(chunks[0])), max_em_iters=1)  # the streamed path's block shape
        for N in Ns:
            src = source(chunks, N)
            # blocks of 1M events: whole blocks inside the 2M-event chunks go to the pinned buffers as they are
            os.environ["ASP_GMM_BLOCK_BYTES"] = str(1_000_000 * (D + M + 1) * 4)
            s, g = per_pass(make, src, args.iters)
            del os.environ["ASP_GMM_BLOCK_BYTES"]
            row = dict(
                part="gpu",
                cvtype=cv,
                N=N,
                D=D,
                M=M,
                streamed_s=s,
                streamed_evs=N / s,
                variant=g.last_variant,
                bw_pct=100 * N * D * 4 / s / bw,
            )
            need = N * (D + M + 1) * 4
            free = free_gpu_bytes() if be == "cuda" else 8 * need
            if need < 0.9 * free:
                X = np.concatenate([chunks[i % len(chunks)] for i in range(-(-N // len(chunks[0])))])[:N]
                os.environ["ASP_GMM_DEVICE_BUDGET"] = str(int(0.9 * free))
                try:
                    m, gm = per_pass(make, X, args.iters)
                    row.update(in_memory_s=m, in_memory_evs=N / m, pct=100 * m / s, in_memory_variant=gm.last_variant)
                except (MemoryError, KernelError) as exc:  # the estimate was short of what the session takes
                    print(f"in memory at N={N} did not fit: {exc}", flush=True)
                finally:
                    del os.environ["ASP_GMM_DEVICE_BUDGET"]
                    del X
            rows.append(row)
            print(row, flush=True)
    # Flash-GMM's shape
    D, M, N = 128, 1024, args.flash_n or (4_000_000 if args.quick else 100_000_000)
    if N <= args.max_n:
        chunks = pool(2 if args.quick else 4, D, M, rows=min(1_000_000, N))
        w, mu, c = params_for(chunks, M, "diag")
        make = lambda: GMM(M, D, means=mu, covars=c, weights=w, cvtype="diag", backend=be)  # noqa: E731
        os.environ["ASP_GMM_BLOCK_BYTES"] = str(250_000 * (D + M + 1) * 4)  # 4 blocks a 1M-event chunk
        make().train(source(chunks, len(chunks[0])), max_em_iters=1)  # compiles
        s, g = per_pass(make, source(chunks, N), args.iters)
        del os.environ["ASP_GMM_BLOCK_BYTES"]
        rows.append(
            dict(
                part="gpu-flash",
                cvtype="diag",
                N=N,
                D=D,
                M=M,
                streamed_s=s,
                streamed_evs=N / s,
                variant=g.last_variant,
                bw_pct=100 * N * D * 4 / s / bw,
                pass_1e9_min=1e9 / (N / s) / 60,
            )
        )
        print(rows[-1], flush=True)
    return bw


# ------------------------------------------------------------------------------ CPU
def cpu_part(args, rows):
    import warnings

    warnings.filterwarnings("ignore", message=".*large graph.*")  # the array is sent once, then persisted
    import dask.array as da
    from distributed import Client, LocalCluster

    from asp_gmm import GMM
    import asp_gmm.dask as agd

    N, D, M = (400_000 if args.quick else args.n), 19, 16
    X = pool(1, D, M, rows=N)[0]
    w, mu, c = params_for([X], M, "full")
    make = lambda: GMM(M, D, means=mu, covars=c, weights=w, cvtype="full", backend="c")  # noqa: E731
    for _ in range(2):  # the tuning history explores the C variants and settles on one
        make().train(X, min_em_iters=6, max_em_iters=6, tol=0)
    os.environ["ASP_GMM_AUTOTUNE"] = "0"  # then every path (workers too) runs the history's choice
    base, g = per_pass(make, X, args.iters)
    print(f"in-process variant: {g.last_variant}", flush=True)
    rows.append(dict(part="cpu", path="in-process, in memory", N=N, ms=1e3 * base, overhead_ms=0.0))
    print(rows[-1], flush=True)
    s, _ = per_pass(make, lambda: (X[a : a + 250_000] for a in range(0, N, 250_000)), args.iters)
    rows.append(dict(part="cpu", path="in-process, streamed", N=N, ms=1e3 * s, overhead_ms=1e3 * (s - base)))
    print(rows[-1], flush=True)
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    for workers in (1, 2):
        threads = max(1, ncpu // workers)
        with (
            LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                env={"ASP_GMM_NUM_THREADS": str(threads), "ASP_GMM_AUTOTUNE": "0"},
            ) as cl,
            Client(cl),
        ):
            dX = da.from_array(X, chunks=(-(-N // (4 * workers)), D)).persist()
            agd.fit(dX, M, cvtype="full", backend="c", weights=w, means=mu, covars=c, max_iters=1, tol=0)  # warm
            r = agd.fit(
                dX,
                M,
                cvtype="full",
                backend="c",
                weights=w,
                means=mu,
                covars=c,
                min_iters=args.iters,
                max_iters=args.iters,
                tol=0,
            )
            ms = 1e3 * statistics.median(r.pass_seconds[1:])
            # the fixed cost of a pass (scheduling, parameters out, statistics back, reduction): 20 000 events
            small = da.from_array(X[:20_000], chunks=(5_000, D)).persist()
            agd.fit(small, M, cvtype="full", backend="c", weights=w, means=mu, covars=c, max_iters=1, tol=0)
            r = agd.fit(
                small,
                M,
                cvtype="full",
                backend="c",
                weights=w,
                means=mu,
                covars=c,
                min_iters=args.iters,
                max_iters=args.iters,
                tol=0,
            )
            fixed = 1e3 * statistics.median(r.pass_seconds[1:])
        rows.append(
            dict(
                part="cpu",
                path=f"Dask, {workers} worker{'s' if workers > 1 else ''} x {threads} thread"
                f"{'s' if threads > 1 else ''}",
                N=N,
                ms=ms,
                overhead_ms=ms - 1e3 * base,
                fixed_ms=fixed,
            )
        )
        print(rows[-1], flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=["gpu", "cpu"])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--max-n", type=int, default=600_000_000)
    ap.add_argument("--n", type=int, default=2_000_000)
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--json")
    ap.add_argument("--backend", default="cuda", help="gpu part: the backend (c: to try the script on a CPU)")
    ap.add_argument(
        "--n-list",
        type=lambda t: [int(float(v)) for v in t.split(",")],
        default=None,
        help="gpu part: these N instead of the defaults (e.g. 20000,50000)",
    )
    ap.add_argument("--flash-n", type=int, default=None, help="gpu part: N of Flash-GMM's shape")
    args = ap.parse_args()
    args.iters = args.iters or (2 if args.part == "gpu" else 4)
    rows = []
    bw = gpu_part(args, rows) if args.part == "gpu" else cpu_part(args, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, host=platform.node(), bandwidth=bw), f, indent=1)
    print(
        f"\n# benchmarks/scale.py {args.part} on {platform.node()} ({os.cpu_count()} CPUs)"
        + (f", host->device {bw / 1e9:.1f} GB/s" if bw else "")
    )
    if args.part == "gpu":
        print(
            f"{'shape':<34}{'streamed ev/s':>15}{'in-mem ev/s':>14}{'% in-mem':>10}{'% bandwidth':>13}"
            "  variant streamed / in memory"
        )
        for r in rows:
            shape = f"{r['cvtype']} N={r['N']:.0e} D={r['D']} M={r['M']}"
            im = f"{r['in_memory_evs']:.3g}" if "in_memory_evs" in r else "-"
            pct = f"{r['pct']:.0f}%" if "pct" in r else "-"
            print(
                f"{shape:<34}{r['streamed_evs']:>15.3g}{im:>14}{pct:>10}{r['bw_pct']:>12.0f}%  {r['variant']} / {r.get('in_memory_variant', '-')}"
            )
            if "pass_1e9_min" in r:
                print(
                    f"  Flash-GMM's shape: one pass over 1e9 points would take {r['pass_1e9_min']:.1f} min "
                    "(Flash-GMM, published: 1e9 points in ~28 min on an A100, bfloat16)"
                )
    else:
        print(f"{'path':<34}{'N':>10}{'ms/pass':>10}{'overhead ms':>13}{'pass at N=20000, ms':>21}")
        for r in rows:
            fixed = f"{r['fixed_ms']:.1f}" if "fixed_ms" in r else "-"
            print(f"{r['path']:<34}{r['N']:>10}{r['ms']:>10.1f}{r['overhead_ms']:>13.1f}{fixed:>21}")
        print(f"(load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    sys.exit(main())
