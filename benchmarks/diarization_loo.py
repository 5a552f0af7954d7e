#!/usr/bin/env python3
"""Leave-one-recording-out choice of the diarizer's two stopping thresholds (the relative merge
score, --relative-threshold, and the supervector cosine, --cosine-threshold).

    # the real set (../shared/diarization-real or $ASP_GMM_REAL_SET) plus generated meetings
    python benchmarks/diarization_loo.py --extra /tmp/dev/*.flac --seeds 0,1,2,3,4
    # another background model for the cosine
    python benchmarks/diarization_loo.py --diarize-args "--ubm-components 16"

Every recording is clustered once per seed with the merging carried on down to one cluster; after
every merge round the final labels (Viterbi resegmentation with the models of that round) are
scored, and the round's best pair's relative score and cosine are kept. A pair of thresholds then
stops each recording at the first round where the relative score or the cosine is under its
threshold, so every pair of a grid is evaluated without clustering again. For each recording in
turn, the pair with the lowest mean DER on all the others (all seeds; ties: the pair nearest the
current defaults) is applied to it: the mean of these left-out DERs is the figure to quote, not
the DER of the pair fitted on everything.

The last lines are a table: per recording, DER at the defaults and left out, by seed.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples" / "diarization"
sys.path.insert(0, str(EX))


def real_set_dir() -> Path:
    return Path(os.environ.get("ASP_GMM_REAL_SET", ROOT.parent / "shared" / "diarization-real"))


def trajectory(audio: Path, seed: int, extra: list[str], backend: str):
    """[{k, rel, cos, der, missed, fa, conf, hyp}] for every merge round of one recording."""
    import diarize
    from rttm import der, labels_to_segments, read_rttm

    ref = next(iter(read_rttm(audio.with_suffix(".rttm")).values()))
    args = diarize.build_parser().parse_args(
        [str(audio), "--rttm", os.devnull, "--backend", backend, "--seed", str(seed), *extra, "--speakers", "1"]
    )
    rounds = []

    def on_round(c):
        lab = c.final_labels(args.final, penalty=args.penalty, min_run=max(1, int(round(args.min_run * 100))))
        k, rel, _ = c.history[-1]
        rounds.append((k, rel, c.pair_cosines[-1], lab))

    r = diarize.diarize(audio, args, log=None, on_round=on_round)
    speech = r["speech_mask"]
    out = []
    for k, rel, cos, lab in rounds:
        full = np.full(len(speech), -1)
        full[speech] = lab
        segs = labels_to_segments(full, 100, merge_gap=args.merge_gap, min_duration=args.min_segment)
        d = der(ref, segs, audio.stem, duration=r["duration"])
        tot = d["total"] or 1.0
        out.append(
            {
                "k": k,
                "rel": rel,
                "cos": cos,
                "der": 100 * d["der"],
                "missed": 100 * d["missed detection"] / tot,
                "fa": 100 * d["false alarm"] / tot,
                "conf": 100 * d["confusion"] / tot,
                "hyp": len({s[2] for s in segs}),
                "ref": len({s[2] for s in ref}),
            }
        )
    return out


def stop(traj, t_rel: float, t_cos: float):
    """The round where the thresholds stop the merging: the first whose best pair's relative
    score or cosine is under its threshold (the last round when none is)."""
    for t in traj:
        if t["rel"] < t_rel or t["cos"] < t_cos:
            return t
    return traj[-1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="audio files with .rttm beside them (default: the real set)")
    ap.add_argument("--extra", nargs="*", default=[], help="more audio files with .rttm beside")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--backend", default="c")
    ap.add_argument("--diarize-args", default="", help="other diarize.py options, quoted")
    ap.add_argument("--relative", default="0.4,0.45,0.49,0.55,0.6", help="relative thresholds to try")
    ap.add_argument("--cosine", default="-0.5,-0.4,-0.35,-0.3,-0.25,-0.2,-0.15,-0.1", help="cosine thresholds to try")
    a = ap.parse_args(argv)
    import diarize

    defaults = diarize.build_parser().parse_args(["x", "--rttm", "y"])
    d_rel, d_cos = defaults.relative_threshold, defaults.cosine_threshold
    files = [Path(f) for f in a.files] or sorted(real_set_dir().glob("*.flac"))
    files += [Path(f) for f in a.extra]
    if not files:
        print(f"no recordings in {real_set_dir()} (set ASP_GMM_REAL_SET)", file=sys.stderr)
        return 2
    seeds = [int(s) for s in a.seeds.split(",")]
    extra = a.diarize_args.split()
    T = {}
    for f in files:
        for s in seeds:
            T[f.stem, s] = trajectory(f, s, extra, a.backend)
            print(
                f"{f.stem} seed {s}: "
                + " ".join(f"{t['k']}:{t['rel']:.2f}/{t['cos']:.2f}/{t['der']:.0f}" for t in T[f.stem, s]),
                flush=True,
            )
    names = [f.stem for f in files]
    grid = list(itertools.product([float(x) for x in a.relative.split(",")], [float(x) for x in a.cosine.split(",")]))

    def mean_der(pair, keep):
        return np.mean([stop(T[n, s], *pair)["der"] for n in keep for s in seeds])

    def best(keep):
        return min(grid, key=lambda g: (round(mean_der(g, keep), 6), abs(g[0] - d_rel) + abs(g[1] - d_cos)))

    fitted = best(names)
    print(
        f"\nfitted on all {len(names)} recordings: relative {fitted[0]}, cosine {fitted[1]}, "
        f"mean DER {mean_der(fitted, names):.1f} %"
    )
    print(
        f"\n| file | spk | DER % at defaults ({d_rel}, {d_cos}) by seed | spk found | "
        "left-out thresholds | left-out DER % by seed |\n|---|---|---|---|---|---|"
    )
    loo, at_def = {}, {}
    for n in names:
        pick = best([m for m in names if m != n])
        loo[n] = [stop(T[n, s], *pick)["der"] for s in seeds]
        at_def[n] = [stop(T[n, s], d_rel, d_cos) for s in seeds]
        print(
            f"| {n} | {T[n, seeds[0]][0]['ref']} | "
            + " ".join(f"{t['der']:.1f}" for t in at_def[n])
            + " | "
            + " ".join(str(t["hyp"]) for t in at_def[n])
            + f" | {pick[0]}, {pick[1]} | "
            + " ".join(f"{x:.1f}" for x in loo[n])
            + " |"
        )
    real = [n for n in names if n in {f.stem for f in real_set_dir().glob("*.flac")}]
    for label, group in (("real set", real), ("all", names)):
        if not group:
            continue
        by_seed = [np.mean([at_def[n][i]["der"] for n in group]) for i in range(len(seeds))]
        loo_seed = [np.mean([loo[n][i] for n in group]) for i in range(len(seeds))]
        print(
            f"| mean, {label} ({len(group)}) | | "
            + " ".join(f"{x:.1f}" for x in by_seed)
            + " | | | "
            + " ".join(f"{x:.1f}" for x in loo_seed)
            + " |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
