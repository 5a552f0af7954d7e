#!/usr/bin/env python3
"""Diarization of real recordings: DER, its parts, speakers found and speed of
examples/diarization/diarize.py, one fresh process per file (so that the end-to-end figure is
what a user gets from the command line).

    # the real development set (../shared/diarization-real, or $ASP_GMM_REAL_SET)
    python benchmarks/diarization_real.py
    # add generated meetings (any AUDIO with AUDIO.rttm beside it), several --seed values
    python benchmarks/diarization_real.py --extra benchmarks/out/val/*.flac --seeds 0,1,2,3,4
    # the previous defaults (relative gain alone, c1..c19), for comparison
    python benchmarks/diarization_real.py --diarize-args "--cosine-threshold -1 --first-cep 1"
    # the ones before
    python benchmarks/diarization_real.py --diarize-args "--sad energy --merge-rule bic \\
        --components 5 --max-model-components 32 --pre-iters 0 --bic-iters 0 --final sliding \\
        --min-segment 0"

Columns: DER and its parts in % of the reference speech (pyannote.metrics, +-0.25 s collar,
overlap scored), spk = speakers found / in the reference, proc = x-realtime of the processing
(reading the audio to the labels, GMM code loaded before), e2e = x-realtime end to end (from the
start of the Python process to the RTTM written, as diarize.py measures it), wall = seconds of
the whole command (interpreter exit included). The DER is computed here from the RTTM that
diarize.py wrote (it is run without --ref, so its time holds no scoring).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples" / "diarization"
sys.path.insert(0, str(EX))


def real_set_dir() -> Path:
    return Path(os.environ.get("ASP_GMM_REAL_SET", ROOT.parent / "shared" / "diarization-real"))


def run_file(audio: Path, extra: list[str], seed: int, backend: str):
    from rttm import der, read_rttm

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{audio.stem}.rttm"
        cmd = [
            sys.executable,
            str(EX / "diarize.py"),
            str(audio),
            "--rttm",
            str(out),
            "--backend",
            backend,
            "--seed",
            str(seed),
            *extra,
        ]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr}")
        hyp = next(iter(read_rttm(out).values())) if out.stat().st_size else []
    text = r.stdout
    proc = float(re.search(r"x-realtime: ([\d.]+) \(processing\)", text).group(1))
    e2e = float(re.search(r"; ([\d.]+) end to end", text).group(1))
    dur = float(re.search(r": ([\d.]+) s of audio", text).group(1))
    ref = next(iter(read_rttm(audio.with_suffix(".rttm")).values()))
    d = der(ref, hyp, audio.stem, duration=dur)
    tot = d["total"] or 1.0
    return {
        "file": audio.stem,
        "seed": seed,
        "seconds": dur,
        "der": 100 * d["der"],
        "missed": 100 * d["missed detection"] / tot,
        "fa": 100 * d["false alarm"] / tot,
        "conf": 100 * d["confusion"] / tot,
        "hyp": len({s[2] for s in hyp}),
        "ref": len({s[2] for s in ref}),
        "proc": proc,
        "e2e": e2e,
        "wall": wall,
    }


HEAD = (
    "| file | s | DER % | missed | false alarm | confusion | spk found/true | x-RT proc | "
    "x-RT e2e | wall s |\n|---|---|---|---|---|---|---|---|---|---|"
)


def row(r):
    return (
        f"| {r['file']} | {r['seconds']:.0f} | {r['der']:.1f} | {r['missed']:.1f} | {r['fa']:.1f} | "
        f"{r['conf']:.1f} | {r['hyp']}/{r['ref']} | {r['proc']:.0f} | {r['e2e']:.0f} | "
        f"{r['wall']:.2f} |"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="audio files with .rttm beside them (default: the real set)")
    ap.add_argument(
        "--extra", nargs="*", default=[], help="more audio files (e.g. generated meetings) after the real set"
    )
    ap.add_argument("--seeds", default="0", help="comma-separated --seed values")
    ap.add_argument("--backend", default="c")
    ap.add_argument("--diarize-args", default="", help="extra options for diarize.py, quoted")
    a = ap.parse_args(argv)
    files = [Path(f) for f in a.files]
    if not files:
        d = real_set_dir()
        files = sorted(d.glob("*.flac"))
        if not files:
            print(f"no recordings in {d} (set ASP_GMM_REAL_SET)", file=sys.stderr)
            return 2
    files += [Path(f) for f in a.extra]
    seeds = [int(s) for s in a.seeds.split(",")]
    extra = a.diarize_args.split()
    print(f"{os.cpu_count()} CPUs, backend {a.backend}, diarize options: {extra or 'defaults'}, seeds {seeds}")
    rows = []
    for seed in seeds:
        print(f"\nseed {seed}\n{HEAD}")
        for f in files:
            r = run_file(f, extra, seed, a.backend)
            rows.append(r)
            print(row(r), flush=True)
        sel = [r for r in rows if r["seed"] == seed]
        n = len(sel)
        mean = {k: sum(r[k] for r in sel) / n for k in ("der", "missed", "fa", "conf", "proc", "e2e")}
        right = sum(r["hyp"] == r["ref"] for r in sel)
        print(
            f"| mean of {n} | | {mean['der']:.1f} | {mean['missed']:.1f} | {mean['fa']:.1f} | "
            f"{mean['conf']:.1f} | {right}/{n} right | {mean['proc']:.0f} | {mean['e2e']:.0f} | |"
        )
    if len(seeds) > 1:
        print("\nDER by --seed (spread = max - min):")
        for f in files:
            v = [r["der"] for r in rows if r["file"] == f.stem]
            k = [r["hyp"] for r in rows if r["file"] == f.stem]
            print(
                f"  {f.stem:18s} "
                + " ".join(f"{x:5.1f}" for x in v)
                + f"   spread {max(v) - min(v):4.1f}   speakers {k}"
            )
        means = [sum(r["der"] for r in rows if r["seed"] == s) / len(files) for s in seeds]
        print(f"  {'mean':18s} " + " ".join(f"{x:5.1f}" for x in means) + f"   spread {max(means) - min(means):4.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
