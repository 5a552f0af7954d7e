"""What each part of V7's fused E-step costs (H100 notes, issue 5, eleventh pass): the kernel rebuilt with
parts removed at render time (wrong results: cost only) and timed in the EM loop at the benchmark's data
(benchmarks/v7_probe.benchmark_session), F+E (factor + fused E-step) and the iteration, CUDA-event medians
of 10 iterations after 4, two sessions per build.
Builds: committed; noM (no M-phase sums); noE (log p constants instead of the E phase); noEM (neither);
noEML (neither, nor the log-sum-exp); setup (no tiles: block setup and zero partials); empty (returns at
once: the factor kernel and the launches).
Usage: python benchmarks/v7_cost.py [NxDxM,...] [build,...]"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu import REG  # noqa: E402
from v7_probe import benchmark_session, replace_once, rewrite_v7  # noqa: E402

_NO_M = ("            v7tc_msums(wm, wn, mgrp, xT, rs, tot);\n", "")
_NO_E = ("            v7_logp(g, h, xT, pT, qT, cs, lp);\n",
         "            for (int i = 0; i < EV; i++) for (int k = 0; k < 8; k++) lp[i][k] = -(float)(k + i + (g & 3));\n")
#: build -> [(text in the rendered V7 source, its replacement)]
BUILDS = {
    "committed": [],
    "noM": [_NO_M],
    "noE": [_NO_E],
    "noEM": [_NO_M, _NO_E],
    "noEML": [_NO_M, _NO_E, ("e - tid / LT < TE;", "e - tid / LT < 0;")],
    "setup": [("    const int ntiles = (n + TE - 1) / TE;\n", "    const int ntiles = 0;\n")],
    "empty": [("    if (blockDim.x != NTH) __trap();", "    if (blockDim.x != NTH) __trap();\n    if (n > 0) return;")],
}


def main():
    shapes = [tuple(int(x) for x in s.split("x")) for s in (sys.argv[1:2] or ["500000x36x128"])[0].split(",")]
    builds = (sys.argv[2:3] or [",".join(BUILDS)])[0].split(",")
    current = [[]]

    def edit(src):
        for old, new in current[0]:
            src = replace_once(src, old, new)
        return src

    rewrite_v7(edit)
    print(f"{'shape':<16} {'build':<10} {'iter ms':>8} {'F+E ms':>8}")
    for N, D, M in shapes:
        for _ in range(2):
            for b in builds:
                current[0] = BUILDS[b]
                _, s, k, _, _ = benchmark_session(N, D, M)   # a new backend: the build's own binary
                try:
                    s.em(k, 4, 4, 0.0, REG)
                    run = s.em(k, 10, 10, 0.0, REG)
                    fe = 1e3 * float(np.median([x[2] for x in s.phase_seconds]))
                finally:
                    s.close()
                print(f"{N}x{D}x{M:<8} {b:<10} {1e3 * float(np.median(run.iter_seconds)):>8.3f} {fe:>8.3f}", flush=True)


if __name__ == "__main__":
    main()
