#!/usr/bin/env python3
"""Diarization benchmark: DER and x-realtime of examples/diarization on generated meetings, for
several GMM backends on the same audio, with the time breakdown (features, E-steps of the
resegmentation, training, BIC pairs, Python overhead).

Meetings (benchmarks/out is git-ignored):

    # 5-minute 4- and 6-speaker meetings, seeds 1..3 (needs flite and espeak-ng)
    python benchmarks/diarization.py --generate
    # benchmark them with asp_gmm's C backend and scikit-learn
    python benchmarks/diarization.py --backend c,sklearn
    # a long meeting made by looping the available meetings (no synthesiser needed: without
    # benchmarks/out/m*.flac it loops the bundled 2-minute meeting), fresh noise on every copy
    python benchmarks/diarization.py --minutes 60 --backend cuda

On a machine without flite (the GPU host), either carry benchmarks/out/*.flac there or let
--minutes loop the bundled meeting. Every run prints one table row per (meeting, backend) and the
speed-up of each backend over scikit-learn on the same audio.

The 1-hour measurement on the lent H100 (carry .gpu; nothing else is needed, the bundled meeting
is looped 30 times with fresh noise on every copy, 4 speakers):

    source .gpu/device-env.sh && python3 benchmarks/diarization.py --minutes 60 --backend cuda,c

Columns: time = reading the audio to the speaker labels (library imports and asp_gmm's one-time
compilation happen before the clock, as in diarize.py: its "processing" figure; the end-to-end
figure of a fresh process is measured by benchmarks/diarization_real.py); read, feat(ures) + SAD
(the speech detector's GMMs); E-step = scoring all
frames under every cluster model (resegmentation); train = retraining the clusters; BIC = training
the merged model of every pair; py = everything else (votes, gathering frames, output). With
--jobs > 1 the GMM columns are wall time of concurrent calls.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples" / "diarization"
OUT = ROOT / "benchmarks" / "out"
sys.path.insert(0, str(EX))


def generate(seeds, speakers, minutes, snr):
    import make_meeting

    OUT.mkdir(parents=True, exist_ok=True)
    made = []
    for n in speakers:
        for s in seeds:
            path = OUT / f"m{n}_s{s}.flac"
            if path.exists() and path.with_suffix(".rttm").exists():
                made.append(path)
                continue
            rc = make_meeting.main(
                [str(path), "--speakers", str(n), "--minutes", str(minutes), "--seed", str(s), "--snr", str(snr)]
            )
            if rc:
                sys.exit(rc)
            made.append(path)
    return made


def build_long(minutes: float, sources, seed: int = 0) -> Path:
    """Concatenate the source meetings (looping over them) up to ``minutes``, with 0.5 s pauses
    and fresh white noise on every copy so that no two copies are sample-identical."""
    import soundfile as sf
    from rttm import read_rttm, write_rttm

    path = OUT / f"long_{minutes:g}min.wav"
    if path.exists() and path.with_suffix(".rttm").exists():
        return path
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    loaded = []
    for src in sources:
        x, sr = sf.read(str(src), dtype="float32", always_2d=True)
        ref = read_rttm(Path(src).with_suffix(".rttm"))
        loaded.append((x.mean(1), sr, next(iter(ref.values()))))
    sr = loaded[0][1]
    if any(s != sr for _, s, _ in loaded):
        raise SystemExit("all source meetings must have the same sample rate")
    pieces, segs, t, k = [], [], 0.0, 0
    pause = np.zeros(int(0.5 * sr), np.float32)
    while t < minutes * 60:
        x, _, ref = loaded[k % len(loaded)]
        noise_level = 2e-4 * (1 + rng.random())
        pieces += [x + noise_level * rng.standard_normal(len(x)).astype(np.float32), pause]
        segs += [(t + s, d, lab) for s, d, lab in ref]
        t += (len(x) + len(pause)) / sr
        k += 1
    sf.write(str(path), np.concatenate(pieces), sr, subtype="PCM_16")
    write_rttm(path.with_suffix(".rttm"), path.stem, segs)
    print(f"built {path} ({t / 60:.1f} min from {k} copies of {len(loaded)} meeting(s))")
    return path


def run_one(audio: Path, backend: str, extra: list[str]):
    import diarize as D
    from rttm import der, read_rttm

    with tempfile.TemporaryDirectory() as tmp:
        args = D.build_parser().parse_args([str(audio), "--rttm", f"{tmp}/h.rttm", "--backend", backend, *extra])
        r = D.diarize(audio, args, log=None)
    ref_path = audio.with_suffix(".rttm")
    d = None
    n_ref = None
    if ref_path.exists():
        ref = next(iter(read_rttm(ref_path).values()))
        n_ref = len({s[2] for s in ref})
        d = der(ref, r["segments"], audio.stem, duration=r["duration"])
    c = r["clusterer"].prof
    t = r["times"]
    return {
        "meeting": audio.name,
        "backend": r["backend"],
        "minutes": r["duration"] / 60,
        "n_ref": n_ref,
        "n_hyp": r["n_speakers"],
        "der": None if d is None else 100 * d["der"],
        "total": t["total"],
        "xrt": r["duration"] / t["total"],
        "read": t["load"],
        "features": t["features"] + t.get("sad", 0.0),
        "clustering": t["clustering"],
        "train": c.seconds["train"],
        "score": c.seconds["score"],
        "bic": c.seconds["bic"],
        "python": c.other + t["output"],
        "calls": dict(c.calls),
        "merges": c.merges,
        "warmup": t["warmup"],
    }


def fmt_row(r):
    der = "-" if r["der"] is None else f"{r['der']:.2f}"
    return (
        f"| {r['meeting']:14s} | {r['backend']:7s} | {r['minutes']:5.1f} | "
        f"{r['n_ref'] if r['n_ref'] is not None else '-'}/{r['n_hyp']} | {der:>6s} | "
        f"{r['total']:7.2f} | {r['xrt']:7.1f} | {r['read']:5.2f} | {r['features']:5.2f} | "
        f"{r['score']:6.2f} | {r['train']:6.2f} | {r['bic']:6.2f} | {r['python']:5.2f} | "
        f"{r['calls']['score']}/{r['calls']['train']}/{r['calls']['bic']} |"
    )


HEADER = (
    "| meeting        | backend | min   | spk ref/hyp | DER %  | time s  | x-RT    | read  | feat+SAD "
    "| E-step | train  | BIC    | py    | calls score/train/BIC |\n"
    "|" + "---|" * 14
)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "meetings",
        nargs="*",
        help="audio files with a .rttm beside them (default: benchmarks/out/m*_s*.flac, else the bundled meeting)",
    )
    ap.add_argument("--backend", default="c,sklearn", help="comma-separated backends (auto, c, cuda, numpy, sklearn)")
    ap.add_argument("--generate", action="store_true", help="generate the 5-minute meetings first")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--speakers", default="4,6")
    ap.add_argument("--gen-minutes", type=float, default=5.0)
    ap.add_argument("--snr", type=float, default=30.0)
    ap.add_argument(
        "--minutes",
        type=float,
        help="benchmark one long meeting of this length, looped from the meetings available (see module docstring)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="runs per (meeting, backend); the fastest is reported")
    ap.add_argument("--diarize-args", default="", help="extra options for diarize.py, quoted")
    a = ap.parse_args(argv)
    if a.generate:
        gen = generate(
            [int(s) for s in a.seeds.split(",")], [int(s) for s in a.speakers.split(",")], a.gen_minutes, a.snr
        )
        if not a.meetings:
            a.meetings = [str(p) for p in gen]
    meetings = [Path(m) for m in a.meetings] or [Path(p) for p in sorted(glob.glob(str(OUT / "m*_s*.flac")))]
    if not meetings:
        meetings = [EX / "data" / "meeting.flac"]
    if a.minutes:
        meetings = [build_long(a.minutes, meetings)]
    backends = a.backend.split(",")
    extra = a.diarize_args.split()
    print(f"{os.cpu_count()} CPUs; backends {backends}; diarize options: {extra or 'defaults'}")
    print(HEADER)
    rows = []
    for m in meetings:
        for be in backends:
            best = None
            for _ in range(a.repeat):
                r = run_one(m, be, extra)
                if best is None or r["total"] < best["total"]:
                    best = r
            rows.append(best)
            print(fmt_row(best), flush=True)
    # Speed-up over scikit-learn on the same audio.
    by = {}
    for r in rows:
        by.setdefault(r["meeting"], {})[r["backend"]] = r
    if "sklearn" in backends and len(backends) > 1:
        print("\nspeed-up of the same clustering code over --backend sklearn (total time, same audio):")
        for m, d in by.items():
            if "sklearn" in d:
                base = d["sklearn"]["total"]
                print(
                    f"  {m}: "
                    + ", ".join(
                        f"{b} {base / r['total']:.1f}x (clustering {d['sklearn']['clustering'] / r['clustering']:.1f}x)"
                        for b, r in d.items()
                        if b != "sklearn"
                    )
                )
    ders = [r["der"] for r in rows if r["der"] is not None]
    if ders:
        print(f"\nDER over {len(ders)} runs: mean {np.mean(ders):.2f} %, max {np.max(ders):.2f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
