"""V7 in the EM loop (H100 notes, issue 5): per iteration, the phases (means = V7's finish, covariance =
the exact fallback, factor + the fused E-step) and how many components the guard flagged, at the
benchmark's data (benchmarks/gpu.py blobs); then the accuracy of the unguarded fused sums against the
exact centred pass on the same posteriors (one M-step with ratio_limit = 1e30, then with 0: everything
recomputed exactly), binned by the cancellation ratio S2 / sum = 1 + (mu - s)^2 / sigma^2. Between the
two, the iteration under the tunables of SWEEP.
Usage: python benchmarks/v7_probe.py [N D M [iters]]"""
import sys
from pathlib import Path

import numpy as np

from asp_gmm import registry
from asp_gmm.backends import cuda as cu
from asp_gmm.problem import Problem

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu import REG, blobs, init_params  # noqa: E402


#: the tunables timed side by side after the per-iteration table
SWEEP = [{}, {"tc_wm": 1}, {"mtc": 0}, {"flush": 32}, {"bps": 1}, {"bps": 3}, {"bps": 4}]
#: the tunables whose unguarded accuracy is measured: the M-phase sums on the tensor cores and on the CUDA cores
ACCURACY = [{}, {"mtc": 0}]


def rewrite_v7(edit):
    """From now on (this process), V7's source is rendered through ``edit(source) -> source``: the
    rebuilt kernels of benchmarks/v7_phases.py and benchmarks/v7_cost.py."""
    from asp_gmm.backends.cuda import backend as cu_backend   # where the backend renders sources
    plain = cu_backend.render_source

    def render(variant, tunables, problem):
        src = plain(variant, tunables, problem)
        return edit(src) if variant.name == "V7" else src

    cu_backend.render_source = render


def replace_once(src: str, old: str, new: str) -> str:
    """``src`` with ``old`` replaced by ``new``; asserts that ``old`` occurs exactly once."""
    assert src.count(old) == 1, f"anchor not found once: {old!r}"
    return src.replace(old, new)


def benchmark_session(N, D, M):
    """The benchmark's data and start (benchmarks/gpu.py) in a CUDA session, its parameters set, and V7
    at its defaults: (backend, session, kernel, params, problem). The caller closes the session."""
    rng = np.random.default_rng(2026)
    X = blobs(rng, N, D, M)
    params = init_params(rng, X, M, "diag")
    be = cu.CudaBackend()
    p = Problem(N, D, M, "diag", "float32")
    s = be.open(X, p)
    try:
        k = be.kernel(registry.get("cuda", "V7", "covariance"), {}, p)
        s.set_params(*params, REG)
    except BaseException:
        s.close()
        raise
    return be, s, k, params, p


def main():
    N, D, M, iters = (int(a) for a in (sys.argv[1:5] + ["500000", "36", "128", "8"][len(sys.argv[1:5]):]))
    be, s, k, params, p = benchmark_session(N, D, M)
    try:
        print(f"{'it':>3} {'iter ms':>8} {'finish':>7} {'exact':>7} {'F+E':>7} {'flagged':>7} {'loglik/N':>10}")
        for it in range(iters):
            run = s.em(k, 1, 1, 0.0, REG)
            flags = np.zeros(D + M, np.float64)
            with s.dev.active():
                s.drv.memcpy_dtoh(flags, s.buf.scratch)
            a, b, c = (1e3 * x for x in s.phase_seconds[0])
            print(f"{it:>3} {1e3 * run.iter_seconds[0]:>8.3f} {a:>7.3f} {b:>7.3f} {c:>7.3f} "
                  f"{int((flags[D:] != 0).sum()):>7} {run.loglik / N:>10.4f}")
        print(f"{'tunables (others: defaults)':<28} {'iter ms':>8} {'finish':>7} {'exact':>7} {'F+E':>7}")
        for tun in SWEEP:
            k = be.kernel(registry.get("cuda", "V7", "covariance"), tun, p)
            s.set_params(*params, REG)
            s.em(k, 1, 1, 0.0, REG)
            run = s.em(k, 10, 10, 0.0, REG)
            ph = [1e3 * float(np.median(x)) for x in zip(*s.phase_seconds)]
            label = " ".join(f"{a}={b}" for a, b in tun.items()) or "defaults"
            print(f"{label:<28} {1e3 * float(np.median(run.iter_seconds)):>8.3f} {ph[0]:>7.3f} {ph[1]:>7.3f} {ph[2]:>7.3f}")
    finally:
        s.close()
    for tun in ACCURACY:
        accuracy(dict(tun, flush=64))


def accuracy(tunables):
    from v6_probe import labelled_blobs
    rng = np.random.default_rng(7)
    bins = [1, 4, 16, 64, 256, 1024, 4096, 1e30]
    worst = np.zeros(len(bins) - 1)
    v = registry.get("cuda", "V7", "covariance")
    be = cu.CudaBackend()
    for (N, D, M, spread, scale, offset) in [(200_000, 36, 16, 3.0, 1.0, 0.0), (200_000, 36, 16, 3.0, 1.0, 1000.0),
                                            (200_000, 36, 16, 30.0, 0.3, 0.0), (200_000, 12, 16, 100.0, 0.1, 50.0),
                                            (20_000, 19, 8, 30.0, 0.3, 0.0), (500_000, 36, 128, 3.0, 1.0, 0.0)]:
        X, w, mu, cv = labelled_blobs(rng, N, D, M, spread, scale, offset)
        p = Problem(N, D, M, "diag", "float32")
        s = be.open(X, p)
        try:
            out = {}
            for lim in (1e30, 0.0):
                s.set_params(w, mu, cv, REG)
                # NaN flags before the first E-step: it stores every resp row, so both M-steps sum the
                # same posteriors (else the exact one recomputes them: ~3e-6 apart, which is not what
                # this table measures)
                with s.dev.active():
                    s.drv.memset_d8(s.buf.ensure_scratch(1 << 26), 0xFF, 1 << 26)
                s.em(be.kernel(v, dict(tunables, ratio_limit=lim), p), 1, 1, 0.0, REG)
                out[lim] = s.params()
        finally:
            s.close()
        we, me, ce = out[0.0]
        shift = (we[:, None] * mu).sum(0)   # what the E-step used: sum_c w_c mu_c of the parameters set
        ratio = 1.0 + (me - shift) ** 2 / ce
        rel = np.abs(out[1e30][2] - ce) / ce
        for i, (lo, hi) in enumerate(zip(bins[:-1], bins[1:])):
            sel = (ratio >= lo) & (ratio < hi)
            if sel.any():
                worst[i] = max(worst[i], rel[sel].max())
        print(f"{tunables} N={N} D={D} M={M} spread={spread} scale={scale} offset={offset}: max ratio {ratio.max():.3g}, "
              f"max rel. error {rel.max():.2e}")
    print(f"{tunables}: worst relative error of the unguarded sums by cancellation ratio")
    print("ratio bin        " + " ".join(f"{lo:>9.0f}-" for lo in bins[:-1]))
    print("max rel. error   " + " ".join(f"{x:>10.2e}" for x in worst))


if __name__ == "__main__":
    main()
