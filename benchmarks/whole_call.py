"""Whole calls as users make them: the data path (upload, checks, set-up) plus the iterations.

    python3 benchmarks/whole_call.py                         # GPU: whole-call table, fixed cost, streamed runs
    python3 benchmarks/whole_call.py --shapes 150000x19x16xfull --stream ''     # a quick subset
    python3 benchmarks/whole_call.py --cpu                   # CPU: the drop-in on array-API vs NumPy input

GPU, per shape (N x D x M x cov; X float32 starting in host memory; 10 EM iterations per call; the
median of ``--calls`` calls after ``--warm`` warm ones; every call starts from the same parameters):

* asp_gmm, NumPy X: ``GMM(...).train(X)`` on a writeable array (uploaded and checked every call);
* asp_gmm, frozen X: ``train(freeze(X))`` (checked and uploaded once, then resident);
* asp_gmm, device X: ``train`` on a PyTorch CUDA tensor (CuPy without PyTorch);
* PyTorch user: ``torch.from_numpy(X).cuda()`` then 10 iterations of scikit-learn's formulas in
  PyTorch (benchmarks/gpu.py ``torch_impl``), timed whole;
* Flash-GMM user: the same transfer, then 10 iterations of Flash-GMM's E-step and its README's
  M-step (``--flash-dir``, see ../shared/peers/README.md; left out when absent);
* floor: X over PCIe at the pinned bandwidth measured here plus 10 of asp_gmm's own iterations (an
  iteration: the difference of two calls on frozen data, 2 and 8 iterations, over 6).

Then the fixed per-call cost on device-resident data (a 1-iteration call minus one iteration; the
target is 0.5 ms at (150000, 19, 16)), and streamed fits (data beyond the device budget, one EM
iteration, parameters given) at ``--stream`` sizes on a virtual array that repeats one block of
events (a numpy.memmap's interface: shape and row slices; no 86 GB of host memory needed): events/s,
% of the pinned host-to-device bandwidth and % of the in-memory events/s (an iteration on
``--inmem-n`` events, frozen).

``--cpu``: the drop-in ``asp_gmm.GaussianMixture`` fit + score on (``--cpu-shape``) diag data, NumPy
input against ``array_api_strict`` input under ``sklearn.config_context(array_api_dispatch=True)``.

Printed: the tables last (Markdown); ``--json PATH`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time

os.environ.setdefault("SCIPY_ARRAY_API", "1")  # before scipy / scikit-learn are imported

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SHAPES = "500000x36x128xdiag,500000x36x128xfull,1000000x128x1024xdiag,150000x19x16xfull"
STREAM = "150000000x36x128xdiag,150000000x36x128xfull,600000000x36x128xdiag,600000000x36x128xfull"
ITERS = 10
REG = 1e-6


def parse(text):
    out = []
    for part in filter(None, text.split(",")):
        n, d, m, cv = part.split("x")
        out.append((int(n), int(d), int(m), cv))
    return out


def say(msg):
    print(f"  [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def median_time(fn, warm, calls, sync=None):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(calls):
        if sync:
            sync()
        t = time.perf_counter()
        fn()
        if sync:
            sync()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def data(N, D, M, cvtype, seed=0):
    from peers import mixture, start

    rng = np.random.default_rng(seed)
    X, centres, scales = mixture(rng, N, D, M)
    return X, start(rng, X, M, cvtype, (X, centres, scales))


def asp_call(X, params, cvtype, iters=ITERS):
    from asp_gmm import GMM

    w, mu, cov = params
    M, D = mu.shape

    def call():
        g = GMM(M, D, means=mu, covars=cov, weights=w, cvtype=cvtype, backend="cuda", reg_covar=REG)
        g.train(X, min_em_iters=iters, max_em_iters=iters, tol=0.0)
        return g

    return call


def pinned_bandwidth(nbytes=1 << 30):
    """Host-to-device bytes/s from pinned memory (median of 5 copies of ``nbytes``)."""
    import pycuda.driver as drv

    from asp_gmm.backends import get_backend

    dev = get_backend("cuda").device
    with dev.active():
        host = drv.pagelocked_empty(nbytes, np.uint8)
        host[:] = 1
        d = drv.mem_alloc(nbytes)
        s = drv.Stream()
        a, b = drv.Event(), drv.Event()
        ts = []
        for _ in range(6):
            a.record(s)
            drv.memcpy_htod_async(d, host, s)
            b.record(s)
            b.synchronize()
            ts.append(b.time_since(a) * 1e-3)
        d.free()
    return nbytes / statistics.median(ts[1:])


def torch_user(X, params, cvtype, iters=ITERS):
    import torch
    from gpu import torch_impl

    prec_chol, estep, mstep_means, covariance = torch_impl(torch)
    w0, mu0, cov0 = (torch.as_tensor(a, device="cuda", dtype=torch.float32) for a in params)

    def call():
        Xt = torch.from_numpy(X).cuda()
        U, ld = prec_chol(cov0, cvtype)
        resp, _ = estep(Xt, w0, mu0, U, ld, cvtype)
        for _ in range(iters):
            nk, m = mstep_means(Xt, resp)
            c = covariance(Xt, resp, nk, m, cvtype)
            u, d = prec_chol(c, cvtype)
            resp, ll = estep(Xt, nk / nk.sum(), m, u, d, cvtype)
        return float(ll)

    return call


def flash_user(flash_dir, X, params, cvtype, iters=ITERS):
    import torch
    from peers import flash_step

    step = flash_step(flash_dir, cvtype)
    p0 = [torch.as_tensor(a, device="cuda", dtype=torch.float64) for a in params]

    def call():
        Xt = torch.from_numpy(X).cuda()
        w, mu, cov = p0
        for _ in range(iters):
            w, mu, cov, ll = step(Xt, w, mu, cov)
        return float(ll)

    return call


def device_array(X):
    try:
        import torch

        return torch.from_numpy(X).cuda(), torch.cuda.synchronize
    except ImportError:
        import cupy

        return cupy.asarray(X), cupy.cuda.Device().synchronize


def iteration_seconds(Xf, params, cvtype, k1=2, k2=8, reps=3):
    t1 = median_time(asp_call(Xf, params, cvtype, k1), 1, reps)
    t2 = median_time(asp_call(Xf, params, cvtype, k2), 1, reps)
    return max(t2 - t1, 1e-9) / (k2 - k1)


def whole_call_rows(args, bw, rows):
    from asp_gmm import freeze

    for N, D, M, cv in parse(args.shapes):
        say(f"whole calls at ({N}, {D}, {M}) {cv}")
        X, params = data(N, D, M, cv)
        Xf = freeze(X)
        row = dict(shape=f"{N}, {D}, {M} {cv}")
        row["numpy_ms"] = 1e3 * median_time(asp_call(X, params, cv), args.warm, args.calls)
        row["frozen_ms"] = 1e3 * median_time(asp_call(Xf, params, cv), args.warm, args.calls)
        Xd, sync = device_array(X)
        row["device_ms"] = 1e3 * median_time(asp_call(Xd, params, cv), args.warm, args.calls, sync)
        del Xd
        it = iteration_seconds(Xf, params, cv)
        row["iter_ms"] = 1e3 * it
        row["floor_ms"] = 1e3 * (X.nbytes / bw + ITERS * it)
        try:
            import torch

            if "torch" in args.peers:
                row["torch_ms"] = 1e3 * median_time(torch_user(X, params, cv), 2, args.calls, torch.cuda.synchronize)
            if "flash" in args.peers and os.path.isdir(args.flash_dir):
                row["flash_ms"] = 1e3 * median_time(
                    flash_user(args.flash_dir, X, params, cv), 2, args.calls, torch.cuda.synchronize
                )
            torch.cuda.empty_cache()
        except ImportError:
            pass
        row["ratio"] = row["numpy_ms"] / row["floor_ms"]
        say(json.dumps(row))
        rows.append(row)
    return rows


def fixed_cost(args):
    N, D, M, cv = parse(args.fixed)[0]
    X, params = data(N, D, M, cv, seed=1)
    Xd, sync = device_array(X)
    one = median_time(asp_call(Xd, params, cv, 1), 8, 21, sync)
    it = iteration_seconds(Xd, params, cv, 2, 12, 5)
    return dict(shape=f"{N}, {D}, {M} {cv}", call1_ms=1e3 * one, iter_ms=1e3 * it, fixed_ms=1e3 * (one - it))


class Tiled:
    """A read-only (N, D) array-like repeating ``base`` (rows sliced as a numpy.memmap is)."""

    def __init__(self, base, N):
        self.base, self.shape, self.dtype = base, (int(N), base.shape[1]), base.dtype
        self.served = 0

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            return self.base[int(key) % len(self.base)]
        a, b, _ = key.indices(self.shape[0])
        self.served += b - a
        B = len(self.base)
        if a // B == (b - 1) // B:
            return self.base[a % B : a % B + (b - a)]
        return np.concatenate([self.base[a % B :], self.base[: (b - a) - (B - a % B)]])


def streamed_rows(args, bw, rows):
    from asp_gmm import GMM, freeze, streaming

    inmem = {}
    chunk_rows = None
    for N, D, M, cv in parse(args.stream):
        if (D, M, cv) not in inmem:
            say(f"in-memory reference at ({args.inmem_n}, {D}, {M}) {cv}")
            Xr, params = data(args.inmem_n, D, M, cv, seed=2)
            inmem[(D, M, cv)] = (args.inmem_n / iteration_seconds(freeze(Xr), params, cv, 1, 3, 1), Xr, params)
        ev_in, Xr, params = inmem[(D, M, cv)]
        itemsize = 4
        chunk_rows = max(1, streaming._bytes_setting("ASP_GMM_CHUNK_BYTES", 64 << 20) // (D * itemsize))
        base = Xr[: max(chunk_rows, len(Xr) // chunk_rows * chunk_rows)]
        src = Tiled(np.ascontiguousarray(base), N)
        w, mu, cov = params
        say(f"streamed fit at ({N}, {D}, {M}) {cv}")
        g = GMM(M, D, means=mu, covars=cov, weights=w, cvtype=cv, backend="cuda", reg_covar=REG)
        t = time.perf_counter()
        g.train(src, min_em_iters=1, max_em_iters=1, tol=0.0)
        sec = time.perf_counter() - t
        passes = src.served / N
        ev = N * passes / sec
        rows.append(
            dict(
                shape=f"{N}, {D}, {M} {cv}",
                seconds=sec,
                passes=passes,
                events_per_s=ev,
                pct_bandwidth=100.0 * ev * D * itemsize / bw,
                pct_inmem=100.0 * ev / ev_in,
                inmem_events_per_s=ev_in,
            )
        )
        say(json.dumps(rows[-1]))
    return rows


def cpu_rows(args):
    import array_api_strict as xp
    import sklearn

    from asp_gmm import GaussianMixture

    N, D, M, cv = parse(args.cpu_shape)[0]
    X, params = data(N, D, M, cv, seed=3)
    X = X.astype(np.float64)
    w, mu, cov = params
    kw = dict(covariance_type=cv, max_iter=args.cpu_iters, tol=0.0, weights_init=w, means_init=mu, random_state=0)
    kw["precisions_init"] = 1.0 / cov

    def fit_numpy():
        g = GaussianMixture(M, **kw).fit(X)
        return g.score(X)

    Xx = xp.asarray(X)

    def fit_xp():
        with sklearn.config_context(array_api_dispatch=True):
            g = GaussianMixture(M, **kw).fit(Xx)
            return g.score(Xx)

    fit_numpy()  # compile / load, explore
    fit_xp()
    ta, tb = [], []
    for _ in range(args.calls):  # interleaved: a busy machine's load changes slowly
        for fn, ts in ((fit_numpy, ta), (fit_xp, tb)):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    a, b = statistics.median(ta), statistics.median(tb)
    return [dict(shape=f"{N}, {D}, {M} {cv}", iters=args.cpu_iters, numpy_s=a, array_api_s=b, ratio=b / a)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--fixed", default="150000x19x16xfull")
    ap.add_argument("--stream", default=STREAM)
    ap.add_argument("--inmem-n", type=int, default=10_000_000)
    ap.add_argument("--peers", default="torch,flash")
    ap.add_argument("--flash-dir", default=".peers")
    ap.add_argument("--warm", type=int, default=8)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--cpu", action="store_true", help="the CPU figure only (array-API vs NumPy input)")
    ap.add_argument("--cpu-shape", default="500000x36x16xdiag")
    ap.add_argument("--cpu-iters", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    out = {"whole": [], "fixed": None, "stream": []}

    def stop(signum, frame):  # a `timeout` ends the run: print what was measured
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        if args.cpu:
            out["cpu"] = cpu_rows(args)
        else:
            bw = pinned_bandwidth()
            say(f"pinned host-to-device bandwidth: {bw / 1e9:.1f} GB/s")
            out["pinned_GBps"] = bw / 1e9
            if args.shapes:
                whole_call_rows(args, bw, out["whole"])
            if args.fixed:
                out["fixed"] = fixed_cost(args)
            if args.stream:
                streamed_rows(args, bw, out["stream"])
    except KeyboardInterrupt:
        say("stopped: the tables hold what was measured")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print_tables(out)


def print_tables(out):
    def f(v, nd=1):
        return "-" if v is None else f"{v:.{nd}f}"

    if out.get("cpu"):
        print("\n| (N, D, M) cov | EM iters | NumPy input s | array_api_strict input s | ratio |")
        print("|---|---|---|---|---|")
        for r in out["cpu"]:
            print(
                f"| {r['shape']} | {r['iters']} | {f(r['numpy_s'], 3)} | {f(r['array_api_s'], 3)} | {f(r['ratio'], 3)} |"
            )
        return
    if "pinned_GBps" not in out:
        return
    print(f"\npinned host-to-device bandwidth: {out['pinned_GBps']:.1f} GB/s")
    if out["whole"]:
        print(
            "\n| (N, D, M) cov | NumPy X ms | frozen X ms | device X ms | PyTorch user | Flash-GMM user | floor | NumPy/floor |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for r in out["whole"]:
            print(
                f"| {r['shape']} | {f(r['numpy_ms'])} | {f(r['frozen_ms'])} | {f(r['device_ms'])} | "
                f"{f(r.get('torch_ms'))} | {f(r.get('flash_ms'))} | {f(r['floor_ms'])} | {f(r['ratio'], 2)} |"
            )
    if out["fixed"]:
        r = out["fixed"]
        print(
            f"\nfixed per-call cost on device data at ({r['shape']}): 1-iteration call {r['call1_ms']:.2f} ms, "
            f"iteration {r['iter_ms']:.2f} ms, fixed {r['fixed_ms']:.2f} ms (target 0.5)"
        )
    if out["stream"]:
        print("\n| streamed (N, D, M) cov | s | passes | M events/s | % pinned bandwidth | % in-memory events/s |")
        print("|---|---|---|---|---|---|")
        for r in out["stream"]:
            print(
                f"| {r['shape']} | {f(r['seconds'], 2)} | {f(r['passes'], 2)} | {f(r['events_per_s'] / 1e6)} | "
                f"{f(r['pct_bandwidth'])} | {f(r['pct_inmem'])} |"
            )


if __name__ == "__main__":
    main()
