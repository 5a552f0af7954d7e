"""GPU benchmark (issue 4): per-variant covariance time and per-EM-iteration time of the CUDA backend,
full and diag, side by side with a PyTorch implementation of the same M-step and E-step (what users
write today: scikit-learn's formulas ported to torch, one component at a time for full covariance)
and with torchgmm 0.1.4 (the maintained PyTorch Lightning GMM library), in the same process.

    python3 benchmarks/gpu.py [--shapes 150000x19x16,...] [--quick] [--json out.json]

asp_gmm times come from the backend's CUDA events (EMRun.iter_seconds / cov_seconds, medians of the
timed iterations after one warm-up iteration); "wall" is the host clock per iteration of the whole em()
call (launches and the per-iteration scalar read-back included). PyTorch times are CUDA-event medians.
torchgmm's per-iteration time is (fit(k2) - fit(k1)) / (k2 - k1) with the means given (no k-means),
so its fixed costs (trainer set-up, initial pass) cancel.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

import numpy as np

from asp_gmm import registry

SHAPES = [(150_000, 19, 16), (153_600, 32, 32), (500_000, 36, 128), (1_000_000, 64, 64)]
#: tunables swept per variant (the rest at their defaults)
SWEEP = {
    "V3": [{"threads": 128}, {"threads": 256}, {"tile": 2}],
    "V4": [
        {"blocks": 264},
        {"blocks": 528},
        {"blocks": 264, "tile": 2},
        {"blocks": 528, "tile": 2},
        {"blocks": 528, "tile": 2, "threads": 128},
    ],
}
REG = 1e-6
#: E-step tunables timed beside the default by bench_iteration (E alone), per covariance type
ESTEP_SWEEP = {"full": [{"rows": 1, "comps": 16}, {"cols": 8}], "diag": [{"rows": 1}, {"dcomps": 32}]}
#: covariance-variant tunables whose covariance phase bench_iteration times beside the default (sweep)
COV_SWEEP = {
    "full": [{"events": 16}],
    "diag": [{"warps": 2}, {"warps": 8}, {"warps": 16}, {"nqw": 5, "warps": 4}, {"blocks": 528}, {"blocks": 132}],
}


def time_estep(s, iters):
    """Median CUDA-event time (ms) of the session's E-step alone, after one warm-up launch."""
    e, times = s.buf.events, []
    with s.dev.active():
        for _ in range(iters + 1):
            e[0].record(s.buf.stream)
            s._reset()
            s._estep_launch()
            e[1].record(s.buf.stream)
            s._read_stat()
            times.append(e[1].time_since(e[0]))
    return statistics.median(times[1:])


def blobs(rng, N, D, M):
    centres = rng.normal(0.0, 3.0, (M, D))
    lab = rng.integers(0, M, N)
    X = centres[lab] + rng.standard_normal((N, D)) * rng.uniform(0.5, 1.5, (M, D))[lab]
    return X.astype(np.float32)


def init_params(rng, X, M, cvtype):
    N, D = X.shape
    means = X[rng.choice(N, M, replace=False)].astype(np.float64)
    sub = X[rng.choice(N, min(N, 20000), replace=False)].astype(np.float64)
    cov = np.cov(sub, rowvar=False) + 1e-3 * np.eye(D)
    covars = np.repeat(cov[None], M, 0) if cvtype == "full" else np.repeat(np.diag(cov)[None], M, 0)
    return np.full(M, 1.0 / M), means, covars


# ------------------------------------------------------------------------------------------ asp_gmm
def bench_asp(X, params, cvtype, iters, log):
    from asp_gmm.backends import cuda as cu
    from asp_gmm.backends.cuda import CudaBackend
    from asp_gmm.problem import Problem

    N, D = X.shape
    M = params[0].shape[0]
    be = CudaBackend()
    p = Problem(N, D, M, cvtype, "float32")
    rows = []
    s = be.open(X, p)
    try:
        # E-step alone (CUDA events), for every E-step variant that can run the problem
        s.set_params(*params, REG)
        default = s.estep_mod
        estep_times = {}
        for v, tun in cu.estep_variants(p, be.limit_context()):
            s.estep_mod = be.estep(p, v, tun)
            estep_times[v.name] = time_estep(s, iters)
        s.estep_mod = default
        ev, etun = be.estep_variant(p)
        estep_ms = estep_times[ev.name]
        log(f"    E-step alone (ms): {estep_times}")
        for v in be.covariance_variants(p):
            for tun in SWEEP.get(v.name, [{}]):
                k = None
                try:
                    k = be.kernel(v, tun, p)
                    n_it = iters if v.name not in ("V1", "V2") or M * p.cells * N < 2e10 else 2
                    s.set_params(*params, REG)
                    s.em(k, min_iters=1, max_iters=1, tol=0.0, reg_covar=REG)  # warm-up
                    s.set_params(*params, REG)
                    t0 = time.perf_counter()
                    run = s.em(k, min_iters=n_it, max_iters=n_it, tol=0.0, reg_covar=REG)
                    wall = (time.perf_counter() - t0) / max(run.iters, 1)
                    rows.append(
                        dict(
                            variant=k.label,
                            name=v.name,
                            tunables=dict(k.tunables),
                            cov_ms=1e3 * statistics.median(run.cov_seconds),
                            iter_ms=1e3 * statistics.median(run.iter_seconds),
                            wall_ms=1e3 * wall,
                            estep_ms=estep_ms,
                            estep=ev.name,
                            estep_all=estep_times,
                            loglik=run.loglik,
                        )
                    )
                except Exception as exc:  # noqa: BLE001 - a failing variant is reported, not fatal
                    rows.append(dict(variant=(k.label if k else v.name), name=v.name, error=repr(exc)[:300]))
                log(f"    asp {cvtype} {rows[-1]}")
        # the best V1-V4 configuration's iteration with every other E-step variant too
        paper = [r for r in rows if "error" not in r and r["name"] in ("V1", "V2", "V3", "V4")]
        if paper:
            best = min(paper, key=lambda r: r["iter_ms"])
            best["iter_ms_by_estep"] = {ev.name: best["iter_ms"]}
            v = registry.get("cuda", best["name"], "covariance")
            tun = {k2: v2 for k2, v2 in best["tunables"].items()}
            for v2, tun2 in cu.estep_variants(p, be.limit_context()):
                if v2.name == ev.name:
                    continue
                s.estep_mod = be.estep(p, v2, tun2)
                k = be.kernel(v, tun, p)
                s.set_params(*params, REG)
                s.em(k, min_iters=1, max_iters=1, tol=0.0, reg_covar=REG)
                run = s.em(k, min_iters=iters, max_iters=iters, tol=0.0, reg_covar=REG)
                best["iter_ms_by_estep"][v2.name] = 1e3 * statistics.median(run.iter_seconds)
            s.estep_mod = default
            log(f"    best V1-V4 {best['variant']} iteration by E-step (ms): {best['iter_ms_by_estep']}")
    finally:
        s.close()
    return rows


PEAK_FLOPS, PEAK_BW = 51e12, 3e12  # H100 fp32 SGEMM and device copy (shared/gpu/README.md)


def bench_iteration(X, params, cvtype, iters, log, variant="V5", sweep=False):
    """What GMM(..., backend="cuda").train runs per EM iteration: the covariance variant ``variant`` with
    its default tunables and the backend's default E-step. CUDA-event medians over ``iters`` iterations of
    one em() call (whole iteration and its phases: moments + means, covariance, factor + E-step), the
    E-step alone, host wall per iteration of em(), and GMM.train's wall per iteration as the difference
    of two train() calls (k1, k2 iterations: upload, selection and the first E-step cancel). ``sweep``:
    the E-step alone with the tunables of ESTEP_SWEEP too."""
    from asp_gmm import GMM
    from asp_gmm.backends.cuda import CudaBackend
    from asp_gmm.problem import Problem

    N, D = X.shape
    M = params[0].shape[0]
    be = CudaBackend()
    p = Problem(N, D, M, cvtype, "float32")
    v = registry.get("cuda", variant, "covariance")
    out = dict(variant=variant, estep=be.estep_variant(p)[0].name)
    s = be.open(X, p)
    try:
        k = be.kernel(v, {}, p)
        out["variant"] = k.label
        s.set_params(*params, REG)
        out["estep_ms"] = time_estep(s, iters)
        if sweep:
            default, (ev, _) = s.estep_mod, be.estep_variant(p)
            out["estep_sweep"] = {}
            for tun in ESTEP_SWEEP.get(cvtype, []):
                try:
                    s.estep_mod = be.estep(p, ev, tun)
                    out["estep_sweep"][str(tun)] = time_estep(s, iters)
                except Exception as exc:  # noqa: BLE001 - a tunable the limits exclude, say
                    out["estep_sweep"][str(tun)] = repr(exc)[:120]
            s.estep_mod = default
        s.em(k, min_iters=1, max_iters=1, tol=0.0, reg_covar=REG)  # warm-up
        s.set_params(*params, REG)
        t0 = time.perf_counter()
        run = s.em(k, min_iters=iters, max_iters=iters, tol=0.0, reg_covar=REG)
        out["em_wall_ms"] = 1e3 * (time.perf_counter() - t0) / max(run.iters, 1)
        out["iter_ms"] = 1e3 * statistics.median(run.iter_seconds)
        ph = list(zip(*s.phase_seconds))
        out["sums_ms"], out["cov_ms"], out["fe_ms"] = (1e3 * statistics.median(x) for x in ph)
        out["loglik"] = run.loglik
        for tun in COV_SWEEP.get(cvtype, []) if sweep else []:
            try:
                k2 = be.kernel(v, tun, p)
                s.set_params(*params, REG)
                s.em(k2, min_iters=1, max_iters=1, tol=0.0, reg_covar=REG)
                s.set_params(*params, REG)
                s.em(k2, min_iters=iters, max_iters=iters, tol=0.0, reg_covar=REG)
                out.setdefault("cov_sweep", {})[str(tun)] = 1e3 * statistics.median(list(zip(*s.phase_seconds))[1])
            except Exception as exc:  # noqa: BLE001
                out.setdefault("cov_sweep", {})[str(tun)] = repr(exc)[:120]
    finally:
        s.close()
    Xr = X.copy()
    Xr.setflags(write=False)  # read-only: the session reuses the upload

    def train(k):
        g = GMM(
            M,
            D,
            means=params[1],
            covars=params[2],
            weights=params[0],
            cvtype=cvtype,
            dtype=np.float32,
            backend="cuda",
            variant=variant,
        )
        t0 = time.perf_counter()
        g.train(Xr, min_em_iters=k, max_em_iters=k, tol=0.0)
        return time.perf_counter() - t0, g.n_iter

    train(2)
    k1, k2 = 3, 3 + 4 * iters
    (t1, n1), (t2, n2) = train(k1), train(k2)
    out["train_wall_ms"] = 1e3 * (t2 - t1) / max(n2 - n1, 1)
    # fractions of the H100's peaks: covariance flops (full: the lower triangle), bytes of the sums
    cells = D * (D + 1) // 2 if cvtype == "full" else D
    out["cov_frac"] = (2.0 * N * M * cells / PEAK_FLOPS if cvtype == "full" else 4.0 * N * (M + D) / PEAK_BW) / (
        1e-3 * out["cov_ms"]
    )
    out["sums_bw"] = 4.0 * N * (M + D) / (1e-3 * out["sums_ms"]) / PEAK_BW
    out["estep_frac"] = (N * M * D * D * 2.0 / PEAK_FLOPS if cvtype == "full" else 4.0 * N * (2 * M + D) / PEAK_BW) / (
        1e-3 * out["estep_ms"]
    )
    log(f"    iteration {cvtype} {out}")
    return out


# ------------------------------------------------------------------------------------------ PyTorch
def torch_impl(torch):
    """The M-step and E-step as people write them in PyTorch (scikit-learn's formulas)."""
    LOG2PI = float(np.log(2 * np.pi))

    def prec_chol(cov, cvtype):
        if cvtype == "full":
            L = torch.linalg.cholesky(cov)
            eye = torch.eye(cov.shape[-1], device=cov.device, dtype=cov.dtype).expand_as(cov)
            U = torch.linalg.solve_triangular(L, eye, upper=False).transpose(-1, -2)
            return U, -torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
        p = torch.rsqrt(cov)
        return p, torch.log(p).sum(-1)

    def estep(X, w, mu, U, logdet, cvtype):
        N, D = X.shape
        M = mu.shape[0]
        if cvtype == "full":
            lp = torch.empty(N, M, device=X.device, dtype=X.dtype)
            for k in range(M):
                y = X @ U[k] - mu[k] @ U[k]
                lp[:, k] = (y * y).sum(1)
        else:
            prec = U * U
            lp = (mu * mu * prec).sum(1) - 2.0 * X @ (mu * prec).T + (X * X) @ prec.T
        lp = -0.5 * (D * LOG2PI + lp) + logdet + torch.log(w)
        ll = torch.logsumexp(lp, dim=1)
        return torch.exp(lp - ll[:, None]), ll.sum()

    def mstep_means(X, resp):
        nk = resp.sum(0) + 10 * torch.finfo(resp.dtype).eps
        return nk, (resp.T @ X) / nk[:, None]

    def covariance(X, resp, nk, mu, cvtype):
        D = X.shape[1]
        if cvtype == "full":
            cov = torch.empty(mu.shape[0], D, D, device=X.device, dtype=X.dtype)
            for k in range(mu.shape[0]):
                diff = X - mu[k]
                cov[k] = (resp[:, k, None] * diff).T @ diff / nk[k]
                cov[k].diagonal().add_(REG)
            return cov
        avg_x2 = (resp.T @ (X * X)) / nk[:, None]
        avg_xm = mu * ((resp.T @ X) / nk[:, None])
        return avg_x2 - 2 * avg_xm + mu * mu + REG

    return prec_chol, estep, mstep_means, covariance


def bench_torch(torch, X, params, cvtype, iters):
    prec_chol, estep, mstep_means, covariance = torch_impl(torch)
    dev = torch.device("cuda")
    Xt = torch.as_tensor(X, device=dev)
    w, mu, cov = (torch.as_tensor(a, device=dev, dtype=torch.float32) for a in params)
    U, logdet = prec_chol(cov, cvtype)
    resp, _ = estep(Xt, w, mu, U, logdet, cvtype)

    def timed(fn):
        out = []
        for _ in range(iters + 1):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        return statistics.median(out[1:])

    nk, mu1 = mstep_means(Xt, resp)
    cov_ms = timed(lambda: covariance(Xt, resp, nk, mu1, cvtype))
    estep_ms = timed(lambda: estep(Xt, w, mu, U, logdet, cvtype))

    state = {"resp": resp}

    def iteration():
        r = state["resp"]
        nk, m = mstep_means(Xt, r)
        c = covariance(Xt, r, nk, m, cvtype)
        u, ld = prec_chol(c, cvtype)
        state["resp"], ll = estep(Xt, nk / nk.sum(), m, u, ld, cvtype)
        ll.item()  # the scalar a convergence test needs, as in asp_gmm

    iter_ms = timed(iteration)
    del Xt, resp, state
    torch.cuda.empty_cache()
    return dict(cov_ms=cov_ms, estep_ms=estep_ms, iter_ms=iter_ms)


def bench_torchgmm(torch, X, params, cvtype, log, k1=2, k2=6):
    try:
        from torchgmm.bayes import GaussianMixture
    except Exception as exc:  # noqa: BLE001
        return dict(error=f"torchgmm not importable: {exc!r}"[:200])
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning").setLevel(logging.ERROR)
    Xt = torch.as_tensor(X, device="cuda")
    means = torch.as_tensor(params[1], dtype=torch.float32)
    M = means.shape[0]

    def fit(k):
        gm = GaussianMixture(
            M,
            covariance_type=cvtype,
            init_means=means.clone(),
            convergence_tolerance=0.0,
            trainer_params=dict(
                accelerator="gpu",
                devices=1,
                max_epochs=k,
                logger=False,
                enable_progress_bar=False,
                enable_checkpointing=False,
                enable_model_summary=False,
            ),
        )
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gm.fit(Xt)
        torch.cuda.synchronize()
        return time.perf_counter() - t0, gm.num_iter_

    try:
        fit(1)  # warm-up (CUDA/Lightning initialisation)
        t1, n1 = fit(k1)
        t2, n2 = fit(k2)
        t1b, _ = fit(k1)
        t2b, _ = fit(k2)
        per = (min(t2, t2b) - min(t1, t1b)) / max(n2 - n1, 1)
        return dict(iter_ms=1e3 * per, iters=(n1, n2))
    except Exception as exc:  # noqa: BLE001
        return dict(error=repr(exc)[:300])
    finally:
        del Xt
        torch.cuda.empty_cache()


def profile_once(X, params, cvtype, variant="V5", tunables=None, iters=2):
    """``iters`` EM iterations through the backend and nothing else, for a profiler (ncu -k ...): the
    kernels of what train() runs, the first iteration loading the binaries."""
    from asp_gmm.backends.cuda import CudaBackend
    from asp_gmm.problem import Problem

    N, D = X.shape
    be = CudaBackend()
    p = Problem(N, D, params[0].shape[0], cvtype, "float32")
    s = be.open(X, p)
    try:
        k = be.kernel(registry.get("cuda", variant, "covariance"), tunables or {}, p)
        s.set_params(*params, REG)
        s.em(k, min_iters=iters, max_iters=iters, tol=0.0, reg_covar=REG)
    finally:
        s.close()


# ------------------------------------------------------------------------------------------ main
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES))
    ap.add_argument("--cvtypes", default="full,diag")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--no-torchgmm", action="store_true")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch and torchgmm columns")
    ap.add_argument(
        "--iteration-only",
        action="store_true",
        help="only the per-EM-iteration table (V5 + default E-step, what train() runs), no V1-V4 sweep",
    )
    ap.add_argument(
        "--estep-sweep", action="store_true", help="also time the E-step alone with the tunables of ESTEP_SWEEP"
    )
    ap.add_argument(
        "--profile", action="store_true", help="only two EM iterations per shape and covariance type (run under ncu)"
    )
    ap.add_argument(
        "--diag-variant",
        default="V6",
        help="covariance variant of the diag iteration rows (V6 needs sm_80; V5 runs everywhere)",
    )
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "gpu_bench.json"))
    a = ap.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",") if s]
    if a.profile:
        rng = np.random.default_rng(2026)
        for N, D, M in shapes:
            X = blobs(rng, N, D, M)
            for cvtype in a.cvtypes.split(","):
                profile_once(X, init_params(rng, X, M, cvtype), cvtype)
        return True

    def log(msg):
        print(msg, flush=True)

    try:
        import torch

        have_torch = torch.cuda.is_available()
    except ImportError:
        torch, have_torch = None, False
    from asp_gmm.backends.cuda import CudaBackend

    be = CudaBackend()
    fp = be.fingerprint()
    log(f"device: {fp['model']} ({fp['arch']}, {fp['sm_count']} SMs), nvcc: {fp['compiler'][:80]}")
    results = []
    rng = np.random.default_rng(2026)
    for N, D, M in shapes:
        X = blobs(rng, N, D, M)
        for cvtype in a.cvtypes.split(","):
            params = init_params(rng, X, M, cvtype)
            log(f"== N={N} D={D} M={M} {cvtype}")
            rec = dict(N=N, D=D, M=M, cvtype=cvtype)
            rec["asp"] = [] if a.iteration_only else bench_asp(X, params, cvtype, a.iters, log)
            try:
                rec["iteration"] = bench_iteration(
                    X,
                    params,
                    cvtype,
                    max(a.iters, 10),
                    log,
                    sweep=a.estep_sweep,
                    variant=a.diag_variant if cvtype == "diag" else "V5",
                )
            except Exception as exc:  # noqa: BLE001 - reported in the table, not fatal
                rec["iteration"] = dict(error=repr(exc)[:300])
                log(f"    iteration ERROR {rec['iteration']}")
            if have_torch and not a.no_torch:
                rec["torch"] = bench_torch(torch, X, params, cvtype, a.iters)
                log(f"    torch {rec['torch']}")
                if not a.no_torchgmm and (cvtype == "full" or (N, D, M) == (153_600, 32, 32)):
                    rec["torchgmm"] = bench_torchgmm(torch, X, params, cvtype, log)
                    log(f"    torchgmm {rec['torchgmm']}")
            results.append(rec)
            with open(a.json, "w") as f:
                json.dump(dict(device=fp, results=results), f, indent=1)
    print_table(results)
    return results


def print_table(results):
    print(
        "\nms per step (CUDA events, medians). 'best cov': fastest V1-V4 covariance; E own/fast: E-step alone with "
        "the issue-4 kernel (estep) / issue 5's estep_fast; 'it ownE'/'it fast': whole EM iteration of the best V1-V4 "
        "configuration with each E-step; wall: host clock per iteration; tgmm: torchgmm 0.1.4 per iteration"
    )
    hdr = (
        f"{'N':>8} {'D':>3} {'M':>4} {'cv':<4} | {'V1 cov':>8} {'V2 cov':>8} {'V3 cov':>8} {'V4 cov':>8} "
        f"| {'best cov':>8} {'E own':>6} {'E fast':>6} {'it ownE':>7} {'it fast':>7} {'wall':>7} "
        f"| {'torch cov':>9} {'E':>6} {'iter':>7} | {'tgmm it':>8} | best V1-V4"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        ok = [x for x in r["asp"] if "error" not in x]
        by = {}
        for x in ok:
            if x["name"] not in by or x["cov_ms"] < by[x["name"]]["cov_ms"]:
                by[x["name"]] = x
        paper = [x for x in ok if x["name"] in ("V1", "V2", "V3", "V4")]
        best = min(paper, key=lambda x: x["iter_ms"]) if paper else {}
        bestcov = min((x["cov_ms"] for x in paper), default=float("nan"))
        t = r.get("torch", {})
        tg = r.get("torchgmm", {})
        es = best.get("estep_all", {})
        ie = best.get("iter_ms_by_estep", {})

        def f(v, w=8):
            return f"{v:>{w}.2f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"

        cells = " ".join(f(by.get(n, {}).get("cov_ms")) for n in ("V1", "V2", "V3", "V4"))
        print(
            f"{r['N']:>8} {r['D']:>3} {r['M']:>4} {r['cvtype']:<4} | {cells} | {f(bestcov)} "
            f"{f(es.get('estep'), 6)} {f(es.get('estep_fast'), 6)} {f(ie.get('estep'), 7)} "
            f"{f(ie.get('estep_fast'), 7)} {f(best.get('wall_ms'), 7)} | "
            f"{f(t.get('cov_ms'), 9)} {f(t.get('estep_ms'), 6)} {f(t.get('iter_ms'), 7)} | "
            f"{f(tg.get('iter_ms'))} | {best.get('variant', '-')}"
        )
    errs = [
        (r["N"], r["D"], r["M"], r["cvtype"], x["variant"], x["error"])
        for r in results
        for x in r["asp"]
        if "error" in x
    ]
    for e in errs:
        print("ERROR", *e)
    extra = [x for r in results for x in r["asp"] if "error" not in x and x["name"] not in ("V1", "V2", "V3", "V4")]
    if extra:
        print(
            "other variants:", "; ".join(f"{x['variant']} cov {x['cov_ms']:.2f} iter {x['iter_ms']:.2f}" for x in extra)
        )
    print_iteration_table(results)


def print_iteration_table(results):
    """The last table (scripts/gpu_check.sh prints from its first line on)."""
    print(
        "\nper-EM-iteration through the backend (what GMM(..., backend='cuda').train runs: V5 + default E-step), "
        "ms, CUDA-event medians; sums = moments + means launches; F+E = factor + E-step; em wall / train wall: "
        "host clock per iteration of Session.em / of GMM.train (difference of two train() calls); cov%: full: "
        "fraction of 51 TFLOP/s (lower triangle), diag: of 3 TB/s; sums BW: fraction of 3 TB/s; E%: full: "
        "of the N*M*D^2 FMA floor at 51 TFLOP/s, diag: of 3 TB/s (x + resp written twice)"
    )
    hdr = (
        f"{'N':>8} {'D':>3} {'M':>4} {'cv':<4} | {'iter':>7} {'sums':>6} {'cov':>7} {'F+E':>7} {'E alone':>7} "
        f"{'em wall':>7} {'trn wall':>8} | {'cov%':>5} {'sumsBW':>6} {'E%':>5} | {'torch it':>8} {'tgmm it':>8} "
        f"{'x torch':>7} | variant / E-step"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        it = r.get("iteration", {})
        t, tg = r.get("torch", {}), r.get("torchgmm", {})

        def f(v, w=7, d=3):
            return f"{v:>{w}.{d}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"

        def pc(v):
            return f"{100 * v:>4.0f}%" if isinstance(v, (int, float)) else f"{'-':>5}"

        if "error" in it:
            print(f"{r['N']:>8} {r['D']:>3} {r['M']:>4} {r['cvtype']:<4} | ERROR {it['error']}")
            continue
        speed = t.get("iter_ms") / it["iter_ms"] if t.get("iter_ms") and it.get("iter_ms") else None
        print(
            f"{r['N']:>8} {r['D']:>3} {r['M']:>4} {r['cvtype']:<4} | {f(it.get('iter_ms'))} "
            f"{f(it.get('sums_ms'), 6)} {f(it.get('cov_ms'))} {f(it.get('fe_ms'))} {f(it.get('estep_ms'))} "
            f"{f(it.get('em_wall_ms'))} {f(it.get('train_wall_ms'), 8)} | {pc(it.get('cov_frac'))} "
            f"{pc(it.get('sums_bw')):>6} {pc(it.get('estep_frac'))} | {f(t.get('iter_ms'), 8, 2)} "
            f"{f(tg.get('iter_ms'), 8, 1)} {f(speed, 7, 1)} | {it.get('variant', '-')} / {it.get('estep', '-')}"
        )
        for tun, ms in it.get("estep_sweep", {}).items():
            print(f"{'':>26}   E alone with {tun}: {f(ms)}")
        for tun, ms in it.get("cov_sweep", {}).items():
            print(f"{'':>26}   covariance with {tun}: {f(ms)}")


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
