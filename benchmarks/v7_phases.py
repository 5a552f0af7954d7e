"""Where V7's fused E-step spends its time (H100 notes, issue 5): the kernel rebuilt with clock64()
stamps at its phase barriers, per tile of events: wait (the top barrier: cp.async of this tile's x and
the slowest warp's M phase of the tile before), build (x' and x'^2), E (log p), LSE (log-sum-exp and
posteriors), M (the copy of the stored resp rows, this thread's M-phase sums and flushes, no barrier
after it). Thread 0 of every block
adds its cycles to a device array; the table gives each phase's share and its cycles per tile. A phase
ends at the barrier after it, so each share includes the wait for the block's slowest warp there.
The stamps themselves cost a few cycles per phase; the run is for proportions, not for timings.
Usage: python benchmarks/v7_phases.py [N D M [iters]]"""
import re
import sys
from pathlib import Path

import numpy as np

from asp_gmm import registry

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu import REG  # noqa: E402
from v7_probe import benchmark_session, replace_once, rewrite_v7  # noqa: E402

PHASES = ["wait", "build", "E", "LSE", "M"]

# (anchor in the rendered V7 source, code inserted right after it)
_STAMPS = [
    ("        __syncthreads();   /* this tile's x has landed", None),   # the stamp goes after the statement
    ("        __syncthreads();\n        /* the next tile's loads fly", None),
    ("        __syncthreads();\n        /* c. log-sum-exp", None),
    ("        __syncthreads();\n        /* the stored resp rows", None),   # the M share includes their copy
]


def instrument(src: str) -> str:
    """V7's rendered source with the phase stamps (asserts that every anchor is found once)."""
    head = re.search(r'extern "C" __global__ void __launch_bounds__\([^)]*\)\nasp_v7_estep\(', src)
    src = src[:head.start()] + "__device__ unsigned long long v7_clk[8];\n" + src[head.start():]
    src = replace_once(src, "    const int ntiles = (n + TE - 1) / TE;\n",
               "    const int ntiles = (n + TE - 1) / TE;\n"
               "    unsigned long long ck[5] = {0, 0, 0, 0, 0};\n    long long ct = clock64();\n")
    for i, (anchor, _) in enumerate(_STAMPS):
        stmt_end = "__syncthreads();"
        pos = src.index(anchor) + anchor.index(stmt_end) + len(stmt_end)
        assert src.count(anchor) == 1, anchor
        src = src[:pos] + f" {{ const long long cn = clock64(); ck[{i}] += cn - ct; ct = cn; }}" + src[pos:]
    src = replace_once(src, "    }\n    if (first && mact) {",
               "        { const long long cn = clock64(); ck[4] += cn - ct; ct = cn; }\n"
               "    }\n"
               "    if (tid == 0) { for (int i = 0; i < 5; i++) atomicAdd(&v7_clk[i], ck[i]);\n"
               "                    atomicAdd(&v7_clk[5], 1ull); }\n"
               "    if (first && mact) {")
    return src


def main():
    N, D, M, iters = (int(a) for a in (sys.argv[1:5] + ["500000", "36", "128", "8"][len(sys.argv[1:5]):]))
    rewrite_v7(instrument)
    be, s, k, _, p = benchmark_session(N, D, M)
    try:
        s.em(k, iters, iters, 0.0, REG)   # converge towards the timed iterations' state
        mod = next(m for m in be._modules.values() if getattr(m.variant, "name", "") == "V7")
        ptr, size = mod.module.get_global("v7_clk")
        with s.dev.active():
            s.drv.memset_d8(ptr, 0, size)
            run = s.em(k, 4, 4, 0.0, REG)
            clk = np.zeros(8, np.uint64)
            s.drv.memcpy_dtoh(clk, ptr)
    finally:
        s.close()
    v = registry.get("cuda", "V7", "covariance")
    te = int(v.derive(dict(p.as_dict(), **v.default_tunables()))["TE"])
    tiles_per_block = (N + te - 1) // te / (clk[5] / 4)
    total = float(clk[:5].sum())
    print(f"V7 phases at (N, D, M) = ({N}, {D}, {M}), TE = {te}; {int(clk[5]) // 4} blocks, "
          f"{tiles_per_block:.1f} tiles a block; iteration {1e3 * float(np.median(run.iter_seconds)):.3f} ms "
          f"(instrumented), phases {1e3 * float(np.median([x[2] for x in s.phase_seconds])):.3f} ms F+E")
    print(f"{'phase':<6} {'share':>6} {'cycles/tile':>12}")
    for i, name in enumerate(PHASES):
        print(f"{name:<6} {100 * float(clk[i]) / total:>5.1f}% {float(clk[i]) / clk[5] / tiles_per_block:>12.0f}")


if __name__ == "__main__":
    main()
