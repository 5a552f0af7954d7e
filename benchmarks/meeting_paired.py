#!/usr/bin/env python3
"""The bundled meeting end to end, warm, this checkout against another, in alternating processes.

    python benchmarks/meeting_paired.py --base /tmp/base_checkout --pairs 10

Each pair runs ``examples/diarization/diarize.py`` of the base checkout (its own ``asp_gmm`` first
on ``PYTHONPATH``) and of this one, in turn, on the same audio with the same history and compile
cache (the user's, or ``ASP_GMM_DB`` / ``ASP_GMM_CACHE_DIR``). Two untimed warm-up runs of each come
first. Per run: the script's own "end to end" figure (process start to the RTTM written), the
whole process's wall time (``time.perf_counter`` around it here) and its DER against the reference.
Prints the medians, the pairs' ratios (this / base) and a table last. Issue 35's target: the bundled
meeting warm on 2 CPU cores <= 0.8 s end to end.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "examples" / "diarization" / "data"


def run(checkout: Path, audio: Path, ref: Path, backend: str) -> tuple:
    env = dict(os.environ)
    # byte code written and reused as a user's interpreter does: without it every process of a
    # fresh checkout compiles the package from source (0.1-0.2 s, on the base side only)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = str(checkout) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, str(checkout / "examples" / "diarization" / "diarize.py"), str(audio)]
    cmd += ["--ref", str(ref), "--rttm", os.devnull, "--backend", backend]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{checkout}: diarize.py failed:\n{out.stderr[-2000:]}")
    e2e = float(re.search(r"\(([0-9.]+) s from process start", out.stdout).group(1))
    der = float(re.search(r"DER: ([0-9.]+) %", out.stdout).group(1))
    return e2e, wall, der


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, type=Path, help="the other checkout (e.g. git archive of a commit)")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--audio", type=Path, default=DATA / "meeting.flac")
    ap.add_argument("--ref", type=Path, default=DATA / "meeting.rttm")
    ap.add_argument("--backend", default="auto")
    a = ap.parse_args()
    sides = {"base": a.base.resolve(), "this": ROOT}
    for _ in range(2):
        for p in sides.values():
            run(p, a.audio, a.ref, a.backend)
    got = {k: [] for k in sides}
    for i in range(a.pairs):
        for k, p in sides.items() if i % 2 == 0 else reversed(list(sides.items())):
            got[k].append(run(p, a.audio, a.ref, a.backend))
    med = {k: [statistics.median(r[j] for r in v) for j in range(3)] for k, v in got.items()}
    ratio = [statistics.median(t[j] / b[j] for t, b in zip(got["this"], got["base"])) for j in range(2)]
    print(f"machine: {os.cpu_count()} CPUs; {a.pairs} pairs; audio {a.audio.name}; backend {a.backend}")
    print("| checkout | end to end s (median, min-max) | whole process s | DER % |")
    print("|---|---|---|---|")
    for k, v in got.items():
        e = [r[0] for r in v]
        print(f"| {k} | {med[k][0]:.3f} ({min(e):.2f}-{max(e):.2f}) | {med[k][1]:.3f} | {med[k][2]:.2f} |")
    print(f"| this / base, paired | {ratio[0]:.3f} | {ratio[1]:.3f} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
