#!/usr/bin/env python3
"""The speech detector alone (examples/diarization/sad.py), cross-validated over the windows of
benchmarks/diarization_cv.py: missed speech and false alarm of every setting of a small grid,
the setting chosen on the other folds applied to each fold, per recording.

    nice -n 10 python benchmarks/diarization_sad_cv.py              # the real set and the extras
    python benchmarks/diarization_sad_cv.py --only ami_tst,ami_dev01  # a quick look

No clustering: every window's features are computed once and every setting runs the detector on
them (GMM backend: asp_gmm's C backend, as the example on this machine). Errors are counted as
benchmarks/diarization_cv.py does (pauses under 0.5 s inside speech closed, +-0.25 s collar, in %
of the reference speech); the choice minimises missed + false alarm, every recording weighing the
same. The detector's bias and level are chosen again, with the clustering, by
benchmarks/diarization_cv.py (its ``--variants``), on the DER.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "diarization"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import diarization_cv as cv  # noqa: E402


def grid(a):
    keys = ("level", "bias", "floor_pct", "boot", "iters")
    boots = [tuple(float(v) for v in b.split("/")) for b in a.boot.split(",")]
    values = (
        a.level.split(","),
        [float(x) for x in a.bias.split(",")],
        [float(x) for x in a.floor_pct.split(",")],
        boots,
        [int(x) for x in a.iters.split(",")],
    )
    return [dict(zip(keys, v)) for v in itertools.product(*values)]


def describe(g):
    return (
        f"level {g['level']}, bias {g['bias']:g}, floor pct {g['floor_pct']:g}, "
        f"boot {g['boot'][0]:g}/{g['boot'][1]:g}, iters {g['iters']}"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--extra-dir", default=str(ROOT / "benchmarks" / "out" / "extra"))
    ap.add_argument("--test-tail", type=float, default=30.0)
    ap.add_argument(
        "--level",
        default="full,band",
        help="levels to bootstrap from: full, band (features.SPEECH_BAND) or band:LO-HI (Hz: another speech band)",
    )
    ap.add_argument("--bias", default="0,0.5,1,2")
    ap.add_argument("--floor-pct", default="10,3")
    ap.add_argument("--boot", default="0.5/0.2,0.4/0.2,0.6/0.3", help="speech/non-speech bootstrap levels")
    ap.add_argument("--iters", default="2")
    ap.add_argument("--only", default="")
    a = ap.parse_args(argv)
    import features
    import sad
    import soundfile as sf
    from asp_gmm import GMM
    from rttm import read_rttm

    def factory(M, D):
        return GMM(M, D, cvtype="diag", reg_covar=1e-3, seed=0, backend="c")

    settings = grid(a)
    files = cv.recordings(Path(a.extra_dir))
    if a.only:
        files = [f for f in files if f.stem in a.only.split(",")]
    recs, err = {}, {}
    for f in files:
        ref = next(iter(read_rttm(f.with_suffix(".rttm")).values()))
        recs[f.stem] = {"speakers": {cv._norm(s[2]) for s in ref}, "windows": []}
        rows = []
        for start, length in cv.windows(round(sf.info(str(f)).duration, 1), a.test_tail):
            wid, path, turns = cv.cut_window(f, start, length, ref)
            recs[f.stem]["windows"].append(wid)
            x, sr = features.load_audio(path)
            feats = {}
            for lv in {g["level"] for g in settings}:
                band = features.SPEECH_BAND
                if lv.startswith("band:"):
                    features.SPEECH_BAND = tuple(float(v) for v in lv[5:].split("-"))
                try:
                    feats[lv] = features.compute_features(x, sr)
                finally:
                    features.SPEECH_BAND = band
            row = []
            for g in settings:
                mask, _ = sad.gmm_speech(
                    feats[g["level"]],
                    factory,
                    iters=g["iters"],
                    boot_speech=g["boot"][0],
                    boot_nonspeech=g["boot"][1],
                    bias=g["bias"],
                    level=g["level"].split(":")[0],
                    floor_pct=g["floor_pct"],
                )
                row.append(cv.speech_errors(turns, sad.close_gaps(mask, 50, 0)))
            rows.append(row)
        err[f.stem] = np.mean(rows, axis=0)  # (settings, 2): missed, false alarm
        print(f"{f.stem}: {len(rows)} windows", flush=True)
    names = sorted(err)
    fold = cv.folds(recs)
    total = np.array([err[n].sum(axis=1) for n in names])  # (recordings, settings)
    held, chosen = {}, {}
    for fd in sorted(set(fold.values())):
        train = [i for i, n in enumerate(names) if fold[n] != fd]
        q = int(np.argmin(total[train].mean(axis=0)))
        chosen[fd] = q
        for n in names:
            if fold[n] == fd:
                held[n] = err[n][q]
    q_all = int(np.argmin(total.mean(axis=0)))
    # the previous detector: the whole spectrum's level, bias 1, as sad.py had it
    previous = [
        i
        for i, g in enumerate(settings)
        if (g["level"], g["bias"], g["floor_pct"], g["boot"], g["iters"]) == ("full", 1.0, 10.0, (0.5, 0.2), 2)
    ]
    old = previous[0] if previous else None
    print(f"\n{len(settings)} settings; chosen on all folds: {describe(settings[q_all])}")
    print("\n| fold | chosen on the other folds |\n|---|---|")
    for fd, q in chosen.items():
        print(f"| {' + '.join(n for n in names if fold[n] == fd)} | {describe(settings[q])} |")
    head = "| recording | held-out missed % | held-out FA % |"
    if old is not None:
        head += " previous detector missed % | FA % |"
    print("\n" + head)
    print("|" + "---|" * (head.count("|") - 1))
    for n in names:
        line = f"| {n} | {held[n][0]:.1f} | {held[n][1]:.1f} |"
        if old is not None:
            line += f" {err[n][old][0]:.1f} | {err[n][old][1]:.1f} |"
        print(line)
    h = np.array([held[n] for n in names])
    line = f"| mean | {h[:, 0].mean():.1f} | {h[:, 1].mean():.1f} |"
    if old is not None:
        o = np.array([err[n][old] for n in names])
        line += f" {o[:, 0].mean():.1f} | {o[:, 1].mean():.1f} |"
    print(line)
    print(
        f"\nheld-out missed + FA {h.sum(axis=1).mean():.1f} %"
        + (f" (previous detector {o.sum(axis=1).mean():.1f} %)" if old is not None else "")
        + f"; recordings with FA above 10 %: {[n for n in names if held[n][1] > 10]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
