#!/usr/bin/env python3
"""Issue 5 on the GPU: build, check and time the V5 covariance kernel and the fast E-step.

Standalone (needs CuPy, PyTorch and nvcc; torchgmm optional): renders the templates through
``asp_gmm.registry``, compiles them with ``nvcc -arch=sm_90 --cubin``, loads them with CuPy, and

1. checks one full EM iteration (M-step sums, means, V5 covariance, Cholesky, E-step) on fresh random
   data (odd shapes, X + 1000 included) against ``asp_gmm/reference.py`` (float64), outputs poisoned
   with NaN beforehand; the V5 sums are also checked alone against float64 sums around the device means;
2. times V5 over a grid of tunables, the E-step, the M-step sums, one whole EM iteration (eager and as
   a CUDA graph), the diagonal E-/M-steps, and the peers: plain PyTorch (same algorithm, float32,
   TF32 off) and torchgmm;
3. prints a table with the fraction of the measured fp32 peak (51 TFLOP/s) or of the copy bandwidth
   (3 TB/s), and writes every number to $OUT/gpu_v5.json (and a log to $OUT/gpu_v5.log).

    source .gpu/device-env.sh && python3 benchmarks/gpu_v5.py [--quick]
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

try:  # the variants folder is installed as asp_gmm.variants; map it when running from a bare checkout
    import asp_gmm.variants  # noqa: F401,E402
except ImportError:
    import importlib.util
    _spec = importlib.util.spec_from_file_location("asp_gmm.variants", os.path.join(ROOT, "variants", "__init__.py"),
                                                   submodule_search_locations=[os.path.join(ROOT, "variants")])
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules["asp_gmm.variants"] = _mod
    _spec.loader.exec_module(_mod)
from asp_gmm import registry  # noqa: E402
from asp_gmm import reference as ref  # noqa: E402
from asp_gmm.problem import Problem  # noqa: E402

PEAK_FLOPS = 51e12      # measured fp32 SGEMM on the H100 (issue 5)
PEAK_BW = 3.0e12        # measured device-to-device copy, bytes read + written
OUT = os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu_v5_")
LOG = open(os.path.join(OUT, "gpu_v5.log"), "a")
RESULTS: dict = {"checks": [], "timings": [], "errors": []}


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.write(s + "\n")
    LOG.flush()


def err(where, e):
    tb = traceback.format_exc()
    log(f"ERROR in {where}: {e!r}\n{tb}")
    RESULTS["errors"].append({"where": where, "error": repr(e), "traceback": tb})


# ----------------------------------------------------------------------------- building
BUILD = os.environ.get("GPU_V5_BUILD") or tempfile.mkdtemp(prefix="gpu_v5_build_")
os.makedirs(BUILD, exist_ok=True)


def full_tun(name, tun):
    t = registry.get("cuda", name).default_tunables()
    t.update(tun or {})
    return t


def build(name, D, cvtype, tun, M=8):
    """Render and compile one variant; returns (cubin path, label, ptxas report). M only matters to the
    backend-signature kernels (asp_cov_v5, asp_estep_fast), which take it as a constant."""
    v = registry.get("cuda", name)
    tun = full_tun(name, tun)
    src = registry.render(v, tun, Problem(1000, D, M, cvtype, "float32"))
    label = f"{name}-D{D}-M{M}-{cvtype}-" + "-".join(f"{k}{tun[k]}" for k in sorted(tun))
    cu = os.path.join(BUILD, label + ".cu")
    cubin = os.path.join(BUILD, label + ".cubin")
    with open(cu, "w") as f:
        f.write(src)
    p = subprocess.run(["nvcc", "-arch=sm_90", "--cubin", "-O3", "--resource-usage", "-o", cubin, cu],
                       capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"nvcc failed for {label}:\n{p.stderr[-3000:]}")
    return cubin, label, p.stderr


class Module:
    """A compiled template loaded with CuPy."""

    def __init__(self, cubin, label, report):
        import cupy as cp
        self.cp, self.label, self.report = cp, label, report
        self.mod = cp.RawModule(path=cubin)
        self._f, self._smem = {}, {}

    def fn(self, name, smem=0):
        f = self._f.get(name)
        if f is None:
            f = self.mod.get_function(name)
            self._f[name] = f
        if smem > 48 * 1024 and self._smem.get(name, 0) < smem:
            f.max_dynamic_shared_size_bytes = smem
            self._smem[name] = smem
        return f

    def geometry(self, sym):
        cp = self.cp
        ptr = self.mod.get_global(sym)
        n = 8 if "v5" in sym else 4
        return [int(v) for v in cp.ndarray((n,), cp.int32, memptr=ptr).get()]

    def regs(self, name):
        try:
            return int(self.fn(name).num_regs)
        except Exception:  # noqa: BLE001
            return None


def build_many(jobs):
    """jobs: list of (name, D, cvtype, tunables) -> dict key -> Module or exception."""
    out = {}
    with cf.ThreadPoolExecutor(max(1, min(16, os.cpu_count() or 4))) as ex:
        futs = {ex.submit(build, *j): j for j in jobs}
        for fu in cf.as_completed(futs):
            j = futs[fu]
            key = (j[0], j[1], j[2], tuple(sorted(full_tun(j[0], j[3]).items())), j[4] if len(j) > 4 else 8)
            try:
                out[key] = fu.result()
            except Exception as e:  # noqa: BLE001
                out[key] = e
                err(f"build {j}", e)
    return out


# ----------------------------------------------------------------------------- data
def make_blobs(rng, N, D, M, offset=0.0):
    centres = rng.normal(0.0, 3.0, (M, D))
    scales = rng.uniform(0.5, 1.5, (M, D))
    lab = rng.integers(0, M, N)
    X = centres[lab] + rng.standard_normal((N, D)) * scales[lab]
    if D > 1:
        X = X @ (np.eye(D) + 0.3 * rng.standard_normal((D, D)) / np.sqrt(D))
    return (X + offset).astype(np.float32)


def init_params(rng, X, M, cvtype="full"):
    N, D = X.shape
    means = X[rng.choice(N, M, replace=False)].astype(np.float64)
    cov = np.atleast_2d(np.cov(X.astype(np.float64), rowvar=False, bias=True)) + 1e-3 * np.eye(D)
    covars = np.repeat(cov[None], M, 0) if cvtype == "full" else np.repeat(np.diag(cov)[None], M, 0)
    w = rng.uniform(0.5, 1.5, M)
    return w / w.sum(), means, covars


# float64 reference on the GPU through torch (same formulas as asp_gmm/reference.py), for the big sizes
def t_estep(X, w, mu, cov, cvtype):
    import torch
    N, D = X.shape
    M = mu.shape[0]
    lp = torch.empty((N, M), dtype=torch.float64, device=X.device)
    if cvtype == "full":
        L = torch.linalg.cholesky(cov)
        U = torch.linalg.solve_triangular(L, torch.eye(D, dtype=X.dtype, device=X.device).expand(M, D, D),
                                          upper=False).transpose(1, 2)
        logdet = -torch.log(torch.diagonal(L, dim1=1, dim2=2)).sum(1)
        for k in range(M):
            y = (X - mu[k]) @ U[k]
            lp[:, k] = (y * y).sum(1)
    else:
        p = 1.0 / torch.sqrt(cov)
        logdet = torch.log(p).sum(1)
        for k in range(M):
            y = (X - mu[k]) * p[k]
            lp[:, k] = (y * y).sum(1)
    lp = -0.5 * (D * math.log(2 * math.pi) + lp) + logdet + torch.log(w)
    lse = torch.logsumexp(lp, 1)
    return lse, torch.exp(lp - lse[:, None])


def t_mstep(X, resp, mu_prev, cov_prev, cvtype, reg):
    import torch
    raw = resp.sum(0)
    nk = raw + 10 * np.finfo(np.float64).eps
    means = (resp.T @ X) / nk[:, None]
    empty = raw < ref.EMPTY_COMPONENT_EVENTS
    means[empty] = mu_prev[empty]
    M, D = means.shape
    if cvtype == "full":
        cov = torch.empty((M, D, D), dtype=X.dtype, device=X.device)
        for k in range(M):
            d = X - means[k]
            cov[k] = (resp[:, k, None] * d).T @ d / nk[k]
            cov[k].diagonal().add_(reg)
    else:
        cov = torch.stack([resp[:, k] @ ((X - means[k]) ** 2) / nk[k] + reg for k in range(M)])
    cov[empty] = cov_prev[empty]
    return nk / nk.sum(), means, cov, nk


def relerr(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if not np.all(np.isfinite(a)):
        return float("inf")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


# ----------------------------------------------------------------------------- device EM iteration
class DeviceEM:
    """Buffers and launches for one EM iteration: sums -> means -> V5 -> prepare -> E-step."""

    def __init__(self, X, resp0, w, mu, cov, cvtype, v5: Module | None, es: Module, waves=1, reg=1e-6):
        import cupy as cp
        self.cp = cp
        N, D = X.shape
        M = mu.shape[0]
        self.N, self.D, self.M, self.cvtype, self.reg = N, D, M, cvtype, reg
        self.ld = -(-N // 256) * 256
        xt = np.zeros((D, self.ld), np.float32)
        xt[:, :N] = X.T
        self.xt = cp.asarray(xt)
        r = np.zeros((M, self.ld), np.float32)
        r[:, :N] = resp0.T
        self.resp = cp.asarray(r)
        self.resp_init = self.resp.copy()
        f32 = np.float32
        self.means = cp.asarray(mu.astype(f32))
        self.covars = cp.asarray(cov.astype(f32))
        self.weights = cp.asarray(w.astype(f32))
        self.nk = cp.zeros(M, f32)
        self.sums = cp.zeros((M, D + 1), f32)
        self.acc = cp.zeros((M, D, D) if cvtype == "full" else (M, D + 1), f32)
        self.prec = cp.zeros((M, D, D) if cvtype == "full" else (M, D), f32)
        self.cst = cp.zeros(M, f32)
        self.status = cp.zeros(M, cp.int32)
        self.logprob = cp.zeros(self.ld, f32)
        self.loglik = cp.zeros(1, cp.float64)
        self.v5, self.es = v5, es
        dev = cp.cuda.Device()
        dev.synchronize()
        self.sms = dev.attributes["MultiProcessorCount"]
        self.eg = es.geometry("estep_geometry")
        self.mg = es.geometry("moments_geometry")
        # moments: one wave of blocks, every component group walks the same event chunks
        cgm = -(-M // self.mg[2])
        self.m_grid = (cgm, max(1, (self.sms * max(1, 2048 // self.mg[0] // 2)) // cgm))
        if v5 is not None:
            self.set_v5(v5, waves)

    def set_v5(self, v5, waves=1):
        self.v5 = v5
        g = v5.geometry("cov_v5_geometry")
        self.v5g = g
        nth, smem, mb, tg = g[0], g[1], g[2], g[3]
        regs = v5.regs("cov_v5") or 64
        occ = occupancy(nth, regs, smem)
        cgs = -(-self.M // mb) * tg
        self.v5_grid = (cgs, max(1, round(waves * occ * self.sms / cgs)))
        self.v5_occ = occ

    def reset(self):
        self.cp.cuda.Device().synchronize()
        self.resp[...] = self.resp_init
        self.cp.cuda.Device().synchronize()

    def z(self, arr, s):
        self.cp.cuda.runtime.memsetAsync(arr.data.ptr, 0, arr.nbytes, s.ptr)

    def launch_sums(self, s):
        i32 = np.int32
        self.z(self.sums, s)
        f = self.es.fn("mstep_sums", self.mg[1])
        f(self.m_grid, (self.mg[0],), (self.xt, i32(self.ld), self.resp, i32(self.ld), self.sums, i32(self.N),
                                        i32(self.M)), shared_mem=self.mg[1], stream=s)
        f = self.es.fn("finalize_means")
        f((-(-self.M * self.D // 128),), (128,), (self.sums, i32(self.M), self.means, self.weights, self.nk),
          stream=s)

    def launch_cov(self, s):
        i32 = np.int32
        self.z(self.acc, s)
        if self.cvtype == "full":
            g = self.v5g
            f = self.v5.fn("cov_v5", g[1])
            f(self.v5_grid, (g[0],), (self.xt, i32(self.ld), self.resp, i32(self.ld), self.means, self.acc,
                                      i32(self.N), i32(self.M)), shared_mem=g[1], stream=s)
        else:
            f = self.es.fn("mstep_diag_sq", self.mg[1])
            f(self.m_grid, (self.mg[0],), (self.xt, i32(self.ld), self.resp, i32(self.ld), self.means, self.acc,
                                            i32(self.N), i32(self.M)), shared_mem=self.mg[1], stream=s)

    def launch_prepare(self, s):
        f = self.es.fn("prepare_" + self.cvtype)
        f((self.M,), (128,), (self.acc, self.sums, self.weights, self.covars, np.float32(self.reg),
                              np.float64(1e10), self.prec, self.cst, self.status), stream=s)

    def launch_estep(self, s):
        i32 = np.int32
        self.z(self.loglik, s)
        g = self.eg
        f = self.es.fn("estep_" + self.cvtype, g[1])
        f((-(-self.N // g[2]),), (g[0],), (self.xt, i32(self.ld), i32(self.N), i32(self.M), self.prec, self.means,
                                          self.cst, self.resp, i32(self.ld), self.logprob, self.loglik),
          shared_mem=g[1], stream=s)

    def iteration(self, s):
        self.launch_sums(s)
        self.launch_cov(s)
        self.launch_prepare(s)
        self.launch_estep(s)


def occupancy(threads, regs, smem):
    """Resident blocks per SM on sm_90 (65536 registers, 228 KB shared, 2048 threads, 32 blocks)."""
    warps = -(-threads // 32)
    regs_warp = -(-max(regs, 1) * 32 // 256) * 256
    by_regs = 65536 // (regs_warp * warps)
    by_smem = (233472) // (smem + 1024) if smem else 32
    by_thr = 2048 // (warps * 32)
    return max(1, min(by_regs, by_smem, by_thr, 32))


def timeit(fn, stream, reps=20, warm=3):
    import cupy as cp
    for _ in range(warm):
        fn()
    stream.synchronize()
    ts = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(stream)
        fn()
        b.record(stream)
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b) * 1e-3)
    return float(np.median(ts)), float(np.min(ts)), float(np.max(ts))


def torch_time(fn, reps=10, warm=2):
    import torch
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3)
    return float(np.median(ts)), float(np.min(ts)), float(np.max(ts))


def record_time(what, shape, sec, extra=None):
    row = {"what": what, "N": shape[0], "D": shape[1], "M": shape[2], "seconds": sec[0], "min": sec[1],
           "max": sec[2]}
    row.update(extra or {})
    RESULTS["timings"].append(row)
    log(f"  time {what:46s} {sec[0] * 1e3:9.3f} ms  (min {sec[1] * 1e3:.3f}, max {sec[2] * 1e3:.3f})"
        + (f"  {extra}" if extra else ""))
    return row


# ----------------------------------------------------------------------------- checks
def check_iteration(shape, cvtype, v5mods, es, offset=0.0, seed=0, use_torch_ref=False):
    """One EM iteration on the device vs the float64 reference; returns dict of errors."""
    import cupy as cp
    N, D, M = shape
    rng = np.random.default_rng(seed + 1000 * N + D * 7 + M)
    X = make_blobs(rng, N, D, min(M, 64), offset)
    w, mu, cov = init_params(rng, X, M, cvtype)
    X64 = X.astype(np.float64)
    if use_torch_ref:
        import torch
        Xt = torch.as_tensor(X64, device="cuda")
        tw, tmu, tcov = (torch.as_tensor(a, device="cuda") for a in (w, mu, cov))
        _, resp0 = t_estep(Xt, tw, tmu, tcov, cvtype)
        w1, mu1, cov1, nk1 = t_mstep(Xt, resp0, tmu, tcov, cvtype, 1e-6)
        lp1, resp1 = t_estep(Xt, w1, mu1, cov1, cvtype)
        resp0, w1, mu1, cov1, lp1, resp1 = (a.cpu().numpy() for a in (resp0, w1, mu1, cov1, lp1, resp1))
    else:
        _, resp0 = ref.estep(X64, w, mu, cov, cvtype)
        w1, mu1, cov1 = ref.mstep(X64, resp0, mu, cov, cvtype, 1e-6)
        lp1, resp1 = ref.estep(X64, w1, mu1, cov1, cvtype)
    res = {}
    for v5 in (v5mods or [None]):
        em = DeviceEM(X, resp0, w, mu, cov, cvtype, v5, es)
        s = cp.cuda.Stream(non_blocking=True)
        em.prec.fill(np.nan)
        em.cst.fill(np.nan)
        em.logprob.fill(np.nan)
        em.acc.fill(np.nan)
        cp.cuda.Device().synchronize()
        # M-step sums and means, then the covariance sums alone against float64 around the device means
        em.launch_sums(s)
        em.launch_cov(s)
        s.synchronize()
        dmu = em.means.get().astype(np.float64)
        acc = em.acc.get()
        if cvtype == "full":
            if use_torch_ref:
                import torch
                Xt = torch.as_tensor(X64, device="cuda")
                R0 = torch.as_tensor(resp0, device="cuda")
                accr = np.stack([((R0[:, k, None] * (Xt - torch.as_tensor(dmu[k], device="cuda"))).T
                                  @ (Xt - torch.as_tensor(dmu[k], device="cuda"))).cpu().numpy() for k in range(M)])
            else:
                accr = np.stack([(resp0[:, k, None] * (X64 - dmu[k])).T @ (X64 - dmu[k]) for k in range(M)])
            res["v5_sums"] = max(relerr(acc[k], accr[k]) for k in range(M))
        em.launch_prepare(s)
        em.launch_estep(s)
        s.synchronize()
        label = v5.label if v5 is not None else "diag"
        wrap = {}
        try:  # the CUDA backend's signatures: packed double sums, packed-by-columns U, stat[0]
            i32 = np.int32
            cells = D * (D + 1) // 2
            ii, jj = np.tril_indices(D)
            if cvtype == "full" and v5 is not None:
                accp = cp.zeros((M, cells), cp.float64)
                g = em.v5g
                f = v5.fn("asp_cov_v5", g[1])
                f(em.v5_grid, (g[0],), (em.xt, em.resp_init, em.means, em.nk, accp, accp, i32(N), i32(em.ld)),
                  shared_mem=g[1], stream=s)
                s.synchronize()
                ref_packed = np.stack([accr[k][ii, jj] for k in range(M)])
                wrap["asp_cov_v5"] = max(relerr(accp.get()[k], ref_packed[k]) for k in range(M))
            U = em.prec.get()
            if cvtype == "full":
                packed = np.zeros((M, cells), np.float32)
                for j in range(D):
                    for i in range(j + 1):
                        packed[:, j * (j + 1) // 2 + i] = U[:, i, j]
            else:
                packed = U
            r2, lp2, st = cp.zeros_like(em.resp), cp.zeros(em.ld, cp.float32), cp.zeros(2, cp.float64)
            g = em.eg
            f = es.fn("asp_estep_fast", g[1])
            f((-(-N // g[2]),), (g[0],), (em.xt, em.means, cp.asarray(packed), em.cst, r2, lp2, st, i32(N), i32(em.ld)),
              shared_mem=g[1], stream=s)
            s.synchronize()
            wrap["asp_estep_fast_logp"] = relerr(lp2.get()[:N], lp1)
            wrap["asp_estep_fast_resp"] = float(np.abs(r2.get()[:, :N].T - resp1).max())
            wrap["asp_estep_fast_ll"] = abs(float(st.get()[0]) - float(lp1.sum())) / abs(float(lp1.sum()))
        except Exception as e:  # noqa: BLE001
            err(f"backend-signature kernels {shape} {cvtype}", e)
            wrap["failed"] = 1.0
        r = {
            "means": relerr(em.means.get(), mu1),
            "weights": relerr(em.weights.get(), w1),
            "covars": relerr(em.covars.get(), cov1),
            "logprob": relerr(em.logprob.get()[:N], lp1),
            "resp_maxabs": float(np.nanmax(np.abs(em.resp.get()[:, :N].T - resp1))) if np.all(
                np.isfinite(em.resp.get()[:, :N])) else float("inf"),
            "resp_pad_zero": bool(np.all(em.resp.get()[:, N:] == 0)),
            "loglik": abs(float(em.loglik.get()[0]) - float(lp1.sum())) / abs(float(lp1.sum())),
            "status_ok": bool(np.all(em.status.get() == 0)),
        }
        if cvtype == "full":
            r["v5_sums"] = res.pop("v5_sums")
        r.update(wrap)
        tol = dict(means=1e-5, weights=1e-5, covars=(2e-3 if offset else 1e-4), logprob=1e-4,
                   resp_maxabs=(2e-2 if offset else 2e-3), loglik=1e-4, v5_sums=(2e-4 if offset else 2e-5),
                   asp_cov_v5=(2e-4 if offset else 2e-5), asp_estep_fast_logp=1e-4,
                   asp_estep_fast_resp=(2e-2 if offset else 2e-3), asp_estep_fast_ll=1e-4, failed=0.0)
        ok = all((r[k] <= tol[k]) for k in tol if k in r) and r["resp_pad_zero"] and r["status_ok"]
        row = {"shape": shape, "cvtype": cvtype, "offset": offset, "kernel": label, "ok": ok, **r}
        RESULTS["checks"].append(row)
        log(f"  check {str(shape):22s} {cvtype} off={offset:g} {label:40s} {'OK ' if ok else 'BAD'} "
            + " ".join(f"{k}={v:.1e}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
        res[label] = row
    return res


# ----------------------------------------------------------------------------- peers
def torch_iteration_fns(X, resp, mu, cov, w, cvtype="full", reg=1e-6, chunk=16):
    """Plain PyTorch float32 EM phases (the same algorithm, batched over components)."""
    import torch
    N, D = X.shape
    M = mu.shape[0]

    def cov_step(means):
        out = torch.empty((M, D, D), device=X.device)
        for c in range(M):
            d = X - means[c]
            out[c] = (d * resp[:, c, None]).T @ d
        return out

    def means_step():
        nk = resp.sum(0) + 1e-15
        return nk, (resp.T @ X) / nk[:, None]

    def prep(covs, nk):
        covs = covs / nk[:, None, None] + reg * torch.eye(D, device=X.device)
        L = torch.linalg.cholesky(covs)
        U = torch.linalg.solve_triangular(L, torch.eye(D, device=X.device).expand(M, D, D), upper=False)
        U = U.transpose(1, 2)
        logdet = -torch.log(torch.diagonal(L, dim1=1, dim2=2)).sum(1)
        return U, logdet

    def estep(means, U, logdet, wts):
        lp = torch.empty((N, M), device=X.device)
        for c0 in range(0, M, chunk):
            c1 = min(M, c0 + chunk)
            d = X[None] - means[c0:c1, None]
            y = torch.bmm(d, U[c0:c1])
            lp[:, c0:c1] = (y * y).sum(2).T
        lp = -0.5 * (D * math.log(2 * math.pi) + lp) + logdet + torch.log(wts)
        lse = torch.logsumexp(lp, 1)
        return lse, torch.exp(lp - lse[:, None])

    def iteration():
        nk, means = means_step()
        covs = cov_step(means)
        U, logdet = prep(covs, nk)
        return estep(means, U, logdet, nk / nk.sum())

    return cov_step, estep, iteration, prep


def time_torchgmm(X_np, M, iters=(2, 6)):
    import torch
    from torchgmm.bayes import GaussianMixture
    X = torch.as_tensor(X_np, device="cuda")
    init = X[torch.randperm(X.shape[0], device="cuda")[:M]].clone()
    ts = {}
    for k in (1,) + tuple(iters):   # the first fit warms Lightning and the kernels up
        gm = GaussianMixture(M, covariance_type="full", init_means=init, convergence_tolerance=0.0,
                             trainer_params=dict(max_epochs=k, accelerator="gpu", devices=1,
                                                 enable_progress_bar=False, logger=False,
                                                 enable_checkpointing=False, enable_model_summary=False))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        gm.fit(X)
        torch.cuda.synchronize()
        ts[k] = (time.perf_counter() - t0, gm.num_iter_)
    (a, (ta, ia)), (b, (tb, ib)) = sorted(ts.items())[-2:]
    return (tb - ta) / max(1, ib - ia), ts


# ----------------------------------------------------------------------------- main
def plan_jobs(quick):
    BIG, SMALL = (500_000, 36, 128), (150_000, 19, 16)
    v5_grid36 = [dict(tile=6, comps=c, threads=256, events=e) for c in (4, 2, 8) for e in (12, 16)]
    v5_grid36 += [dict(tile=4, comps=4, threads=256, events=32), dict(tile=6, comps=4, threads=128, events=16)]
    v5_grid19 = [dict(tile=t, comps=c, threads=256, events=e) for t in (4, 6) for c in (4, 8) for e in (8, 16)]
    es_grid = [dict(threads=256, rows=1, comps=c, mcomps=16) for c in (2, 4, 8)]
    es_grid += [dict(threads=256, rows=2, comps=4, mcomps=16), dict(threads=256, rows=1, comps=4, mcomps=8)]
    if quick:
        v5_grid36, v5_grid19, es_grid = v5_grid36[:2], v5_grid19[:2], es_grid[:2]
    check_shapes = [(1003, 7, 3), (517, 1, 4), (4099, 19, 16), (2000, 36, 5), (3001, 13, 9)]
    jobs = [("V5", BIG[1], "full", t) for t in v5_grid36] + [("V5", SMALL[1], "full", t) for t in v5_grid19]
    jobs += [("estep_fast", D, cv, t) for D in (BIG[1], SMALL[1]) for cv in ("full", "diag") for t in es_grid]
    for (_, D, M) in check_shapes + [(0, 6, 2)]:
        jobs += [("V5", D, "full", {}, M), ("V5", D, "full", {"tile": 4}, M), ("estep_fast", D, "full", {}, M),
                 ("estep_fast", D, "diag", {}, M)]
    jobs = list({(j[0], j[1], j[2], tuple(sorted(full_tun(j[0], j[3]).items())), j[4] if len(j) > 4 else 8): j
                 for j in jobs}.values())
    return jobs, (BIG, SMALL, v5_grid36, v5_grid19, es_grid, check_shapes)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer tunables")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--build-only", action="store_true", help="render and compile every kernel, then stop")
    args = ap.parse_args()
    if args.build_only:
        jobs, _ = plan_jobs(args.quick)
        built = build_many(jobs)
        bad = [k for k, v in built.items() if isinstance(v, Exception)]
        log(f"built {len(built) - len(bad)} of {len(built)} kernels")
        return 1 if bad else 0
    import cupy as cp
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    log(f"device: {props['name'].decode() if isinstance(props['name'], bytes) else props['name']}, "
        f"{dev.attributes['MultiProcessorCount']} SMs; out={OUT}")
    RESULTS["device"] = str(props["name"])

    jobs, (BIG, SMALL, v5_grid36, v5_grid19, es_grid, check_shapes) = plan_jobs(args.quick)
    t0 = time.time()
    built = build_many(jobs)
    log(f"built {len(built)} kernels in {time.time() - t0:.1f} s")

    def mod(name, D, cv, tun, M=8):
        b = built.get((name, D, cv, tuple(sorted(full_tun(name, tun).items())), M))
        if b is None or isinstance(b, Exception):
            return None
        m = Module(*b)
        return m

    es_default = {}
    # ---------------------------------------------------------------- correctness
    log("== correctness: one EM iteration vs asp_gmm/reference.py (float64)")
    for shape in check_shapes:
        for cv in ("full", "diag"):
            try:
                v5s = ([mod("V5", shape[1], "full", {}, shape[2]), mod("V5", shape[1], "full", {"tile": 4}, shape[2])]
                       if cv == "full" else None)
                check_iteration(shape, cv, v5s, mod("estep_fast", shape[1], cv, es_default, shape[2]))
            except Exception as e:  # noqa: BLE001
                err(f"check {shape} {cv}", e)
    for cv in ("full", "diag"):
        try:  # large offsets: centring keeps the covariance
            check_iteration((20_000, 6, 2), cv, [mod("V5", 6, "full", {}, 2)] if cv == "full" else None,
                            mod("estep_fast", 6, cv, es_default, 2), offset=1000.0)
        except Exception as e:  # noqa: BLE001
            err(f"check offset {cv}", e)

    # ---------------------------------------------------------------- timings
    summary = {}
    for shape, v5grid in ((BIG, v5_grid36), (SMALL, v5_grid19)):
        N, D, M = shape
        log(f"== timings at (N, D, M) = {shape}")
        rng = np.random.default_rng(7)
        X = make_blobs(rng, N, D, M)
        w, mu, cov = init_params(rng, X, M)
        import torch
        Xt = torch.as_tensor(X, device="cuda")
        # initial posteriors from the float64 reference E-step (fresh data, not zeros)
        _, resp0 = t_estep(Xt.double(), torch.as_tensor(w, device="cuda"), torch.as_tensor(mu, device="cuda"),
                           torch.as_tensor(cov, device="cuda"), "full")
        resp0_np = resp0.float().cpu().numpy()
        s = cp.cuda.Stream(non_blocking=True)
        flops_cov = N * M * D * (D + 1)          # lower triangle, 2 flops per multiply-add
        flops_es_issue = 2 * N * M * D * D       # the issue's E-step count (N M D^2 multiply-adds)
        em = None
        # V5 scan
        best = None
        for tun in v5grid:
            m5 = mod("V5", D, "full", tun)
            if m5 is None:
                continue
            for waves in (1, 2):
                try:
                    if em is None:
                        em = DeviceEM(X, resp0_np, w, mu, cov, "full", m5, mod("estep_fast", D, "full", es_default),
                                      waves)
                        em.launch_sums(s)
                        s.synchronize()
                    em.set_v5(m5, waves)
                    t = timeit(lambda: em.launch_cov(s), s, reps=15)
                    row = record_time(f"V5 {m5.label.split('full-')[1]} w{waves}", shape, t,
                                      {"grid": em.v5_grid, "occ": em.v5_occ, "regs": m5.regs("cov_v5"),
                                       "frac_peak": flops_cov / t[0] / PEAK_FLOPS})
                    if best is None or t[0] < best[0][0]:
                        best = (t, tun, waves, row)
                except Exception as e:  # noqa: BLE001
                    err(f"V5 {tun} {shape}", e)
        if best is None:
            continue
        em.set_v5(mod("V5", D, "full", best[1]), best[2])
        summary[shape] = {"cov": best[0][0], "cov_cfg": (best[1], best[2])}
        # correctness of the best V5 at this size (float64 on the GPU)
        try:
            em.launch_sums(s)
            em.launch_cov(s)
            s.synchronize()
            dmu = torch.as_tensor(em.means.get().astype(np.float64), device="cuda")
            X64, R64 = Xt.double(), resp0.double()
            acc = torch.as_tensor(em.acc.get().astype(np.float64), device="cuda")
            e = max(float(torch.linalg.norm(acc[k] - ((R64[:, k, None] * (X64 - dmu[k])).T @ (X64 - dmu[k])))
                          / torch.linalg.norm(acc[k])) for k in range(M))
            RESULTS["checks"].append({"shape": shape, "kernel": "best V5", "v5_sums": e, "ok": e < 1e-4})
            log(f"  check best V5 at {shape}: max relative error {e:.2e} {'OK' if e < 1e-4 else 'BAD'}")
        except Exception as ex:  # noqa: BLE001
            err("big V5 check", ex)
        # E-step scan
        beste = None
        for tun in es_grid:
            me = mod("estep_fast", D, "full", tun)
            if me is None:
                continue
            try:
                em2 = DeviceEM(X, resp0_np, w, mu, cov, "full", em.v5, me)
                em2.set_v5(em.v5, best[2])
                em2.iteration(s)
                s.synchronize()
                t = timeit(lambda: em2.launch_estep(s), s, reps=15)
                row = record_time(f"estep_full {me.label.split('full-')[1]}", shape, t,
                                  {"regs": me.regs("estep_full"), "frac_issue_floor": flops_es_issue / t[0] / PEAK_FLOPS,
                                   "frac_triangle": flops_cov / t[0] / PEAK_FLOPS})
                if beste is None or t[0] < beste[0][0]:
                    beste = (t, tun, em2)
            except Exception as e:  # noqa: BLE001
                err(f"estep {tun} {shape}", e)
        if beste is None:
            continue
        em2 = beste[2]
        summary[shape].update(estep=beste[0][0], estep_cfg=beste[1])
        try:
            # correctness of the E-step at this size against float64 torch
            em2.reset()
            em2.iteration(s)
            s.synchronize()
            w1 = torch.as_tensor(em2.weights.get().astype(np.float64), device="cuda")
            mu1 = torch.as_tensor(em2.means.get().astype(np.float64), device="cuda")
            cv1 = torch.as_tensor(em2.covars.get().astype(np.float64), device="cuda")
            lp, rr = t_estep(Xt.double(), w1, mu1, cv1, "full")
            e_lp = relerr(em2.logprob.get()[:N], lp.cpu().numpy())
            e_r = float((torch.as_tensor(em2.resp.get()[:, :N].T, device="cuda").double() - rr).abs().max())
            ok = e_lp < 1e-4 and e_r < 2e-3
            RESULTS["checks"].append({"shape": shape, "kernel": "best estep", "logprob": e_lp, "resp_maxabs": e_r,
                                      "ok": ok})
            log(f"  check best E-step at {shape}: logprob {e_lp:.2e} resp max abs {e_r:.2e} {'OK' if ok else 'BAD'}")
        except Exception as ex:  # noqa: BLE001
            err("big estep check", ex)
        # M-step sums, prepare, whole iteration eager and as a graph
        try:
            t = timeit(lambda: em2.launch_sums(s), s, reps=15)
            bytes_m = 4 * (N * M + N * D)
            record_time("mstep_sums+finalize_means", shape, t, {"frac_bw": bytes_m / t[0] / PEAK_BW})
            summary[shape]["sums"] = t[0]
            t = timeit(lambda: em2.launch_prepare(s), s, reps=15)
            record_time("prepare_full (Cholesky)", shape, t)
            summary[shape]["prepare"] = t[0]

            t = timeit(lambda: em2.iteration(s), s, reps=10)
            record_time("EM iteration (eager, 4 phases)", shape, t)
            summary[shape]["iter_eager"] = t[0]
            s.begin_capture()
            em2.iteration(s)
            g = s.end_capture()
            t = timeit(lambda: g.launch(s), s, reps=20)
            record_time("EM iteration (CUDA graph)", shape, t)
            summary[shape]["iter_graph"] = t[0]
        except Exception as ex:  # noqa: BLE001
            err("iteration timing", ex)
        # diagonal E-/M-steps
        try:
            md = mod("estep_fast", D, "diag", es_grid[0])
            wd, mud, cvd = w, mu, np.stack([np.diag(c) for c in cov])
            emd = DeviceEM(X, resp0_np, wd, mud, cvd, "diag", None, md)
            emd.iteration(s)
            s.synchronize()
            t = timeit(lambda: emd.launch_estep(s), s, reps=15)
            record_time("estep_diag", shape, t, {"frac_bw": 4 * (N * D + N * M) / t[0] / PEAK_BW})
            t = timeit(lambda: emd.launch_cov(s), s, reps=15)
            record_time("mstep_diag_sq", shape, t, {"frac_bw": 4 * (N * D + N * M) / t[0] / PEAK_BW})
            s.begin_capture()
            emd.iteration(s)
            g = s.end_capture()
            t = timeit(lambda: g.launch(s), s, reps=20)
            record_time("EM iteration diag (CUDA graph)", shape, t)
            summary[shape]["iter_diag_graph"] = t[0]
        except Exception as ex:  # noqa: BLE001
            err("diag timing", ex)
        # peers
        if not args.no_peers:
            try:
                R = resp0.float().contiguous()
                tmu, tcov, tw = (torch.as_tensor(a, device="cuda", dtype=torch.float32) for a in (mu, cov, w))
                cov_step, estep_t, iteration_t, prep = torch_iteration_fns(Xt, R, tmu, tcov, tw)
                nk = R.sum(0)
                t = torch_time(lambda: cov_step(tmu), reps=5)
                record_time("PyTorch covariance (bmm, fp32)", shape, t)
                summary[shape]["torch_cov"] = t[0]
                U, logdet = prep(cov_step(tmu), nk)
                t = torch_time(lambda: estep_t(tmu, U, logdet, tw), reps=5)
                record_time("PyTorch E-step (bmm, fp32)", shape, t)
                summary[shape]["torch_estep"] = t[0]
                t = torch_time(iteration_t, reps=5)
                record_time("PyTorch EM iteration", shape, t)
                summary[shape]["torch_iter"] = t[0]
                del R, U
                torch.cuda.empty_cache()
            except Exception as ex:  # noqa: BLE001
                err("torch peers", ex)
            try:
                per, raw = time_torchgmm(X, M)
                RESULTS["timings"].append({"what": "torchgmm iteration", "N": N, "D": D, "M": M, "seconds": per,
                                           "raw": {str(k): v for k, v in raw.items()}})
                log(f"  time torchgmm per EM iteration {per * 1e3:9.3f} ms  raw {raw}")
                summary[shape]["torchgmm_iter"] = per
            except Exception as ex:  # noqa: BLE001
                err("torchgmm", ex)
        del em, em2
        cp.get_default_memory_pool().free_all_blocks()

    RESULTS["summary"] = {str(k): v for k, v in summary.items()}
    with open(os.path.join(OUT, "gpu_v5.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    # ---------------------------------------------------------------- table
    log("\n== checks: %d, failed: %d, errors: %d" % (
        len(RESULTS["checks"]), sum(not c["ok"] for c in RESULTS["checks"]), len(RESULTS["errors"])))
    for c in RESULTS["checks"]:
        if not c["ok"]:
            log("  FAILED", c)
    for e in RESULTS["errors"]:
        log("  ERROR", e["where"], e["error"])
    log("\n| size (N,D,M) | what | ours (ms) | PyTorch (ms) | torchgmm (ms) | fraction of peak |")
    log("|---|---|---|---|---|---|")
    for shape, sm in summary.items():
        N, D, M = shape
        f = lambda k: f"{sm[k] * 1e3:.3f}" if k in sm else "-"  # noqa: E731
        if "cov" in sm:
            log(f"| {shape} | covariance (V5 {sm['cov_cfg']}) | {f('cov')} | {f('torch_cov')} | - | "
                f"{N * M * D * (D + 1) / sm['cov'] / PEAK_FLOPS:.0%} of 51 TFLOP/s |")
        if "estep" in sm:
            log(f"| {shape} | E-step full ({sm['estep_cfg']}) | {f('estep')} | {f('torch_estep')} | - | "
                f"{2 * N * M * D * D / sm['estep'] / PEAK_FLOPS:.0%} (issue's N M D^2 count) |")
        if "sums" in sm:
            log(f"| {shape} | M-step sums | {f('sums')} | - | - | {4 * (N * M + N * D) / sm['sums'] / PEAK_BW:.0%} of 3 TB/s |")
        if "iter_graph" in sm:
            log(f"| {shape} | EM iteration full (graph / eager) | {f('iter_graph')} / {f('iter_eager')} | "
                f"{f('torch_iter')} | {f('torchgmm_iter')} | - |")
        if "iter_diag_graph" in sm:
            log(f"| {shape} | EM iteration diag (graph) | {f('iter_diag_graph')} | - | - | - |")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001
        err("main", e)
        with open(os.path.join(OUT, "gpu_v5.json"), "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)
        raise
