#!/usr/bin/env python3
"""Generate a synthetic multi-speaker "meeting" and its reference RTTM.

The meeting is a sequence of turns. Each turn is one to three random sentences spoken by one voice,
synthesised with Debian's ``flite`` (voices awb, rms, slt, kal16) or ``espeak-ng`` (several variants
with different pitch and speed), trimmed of the synthesiser's leading and trailing silence,
resampled to the output rate and scaled by a per-speaker gain. Turns are separated by pauses (no
overlap); consecutive turns never come from the same voice. Optional white noise at a given SNR
hides the digital silence between turns. The reference RTTM marks every turn from its first to its
last non-silent sample, so the pauses *inside* a turn (between sentences, at commas) count as
speech of that speaker, as a human annotator would mark them.

Everything is drawn from ``--seed``: the same command produces the same audio (given the same
flite / espeak-ng builds).

The bundled example meeting was made with::

    python examples/diarization/make_meeting.py examples/diarization/data/meeting.flac \
        --speakers 4 --minutes 2 --seed 7 --snr 40

The benchmark meetings (5 minutes, 4 and 6 speakers, several seeds) are made by
``benchmarks/diarization.py --generate`` with the same generator.

Needs ``apt-get install flite espeak-ng`` (only this generator; the diarizer does not).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

# Voices. "flite:NAME" or "espeak:VOICE[+VARIANT]:PITCH:SPEED" (pitch 0-99, speed words/min).
FLITE_VOICES = ["flite:awb", "flite:rms", "flite:slt", "flite:kal16"]
# espeak-ng variants share one formant synthesiser: many of them (m1, m3, m7, croak, grandpa, ed,
# f1 and f2, f3 and f4, Andy, ...) are the same voice to an MFCC GMM (a merged model of two of them
# fits better than the two apart). These five were measured to be mutually distinct and distinct
# from the flite voices (merge score per frame <= -0.25 for every pair).
ESPEAK_VOICES = [
    "espeak:en-us+f3:62:165",
    "espeak:en-gb+m3:38:150",
    "espeak:en-us+f5:85:175",
    "espeak:en-us+whisperf:50:150",
    "espeak:en-us+Alicia:60:160",
]
ALL_VOICES = FLITE_VOICES + ESPEAK_VOICES

_SUBJECTS = [
    "we",
    "the team",
    "our group",
    "the client",
    "marketing",
    "the new design",
    "everyone",
    "the budget",
    "this project",
    "the committee",
    "my manager",
    "the prototype",
    "the engineers",
    "the remote control",
    "the sales department",
    "our partners",
]
_VERBS = [
    "should review",
    "could finish",
    "will discuss",
    "might postpone",
    "needs to approve",
    "has to present",
    "wants to change",
    "can evaluate",
    "would prefer",
    "must improve",
    "is going to test",
    "forgot to send",
    "agreed to measure",
    "tried to simplify",
]
_OBJECTS = [
    "the quarterly report",
    "the user interface",
    "the meeting notes",
    "the schedule",
    "the cost estimate",
    "the battery design",
    "the survey results",
    "the final draft",
    "the technical specification",
    "the marketing plan",
    "the customer feedback",
    "the production timeline",
    "the color scheme",
    "the spreadsheet",
    "the evaluation",
]
_TAILS = [
    "before friday",
    "next week",
    "by the end of the month",
    "as soon as possible",
    "after lunch",
    "during the next meeting",
    "tomorrow morning",
    "if there is time",
    "without the extra features",
    "with the whole department",
    "in more detail",
    "",
]
_OPENERS = ["", "", "", "well, ", "okay, ", "so, ", "I think ", "honestly, ", "actually, ", "right, ", "you know, "]
_SHORT = [
    "yes, I agree.",
    "okay, sounds good.",
    "no, I don't think so.",
    "sure.",
    "exactly.",
    "right, good point.",
    "hmm, maybe.",
    "that works for me.",
    "wait, really?",
    "thanks.",
]
_QUESTIONS = [
    "what do you think about {o}?",
    "did anyone look at {o}?",
    "how long will {o} take?",
    "can we talk about {o} now?",
    "who is responsible for {o}?",
]


def sentence(rng: np.random.Generator) -> str:
    if rng.random() < 0.2:
        return str(rng.choice(_QUESTIONS)).format(o=rng.choice(_OBJECTS)).capitalize()
    s = f"{rng.choice(_OPENERS)}{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
    tail = str(rng.choice(_TAILS))
    if tail:
        s += " " + tail
    return s[0].upper() + s[1:] + "."


def _read_wav(path: str):
    import soundfile as sf

    x, sr = sf.read(path, dtype="float32", always_2d=True)
    return x.mean(1), sr


def synthesize(voice: str, text: str, workdir: str) -> tuple[np.ndarray, int]:
    """Run the synthesiser for one voice; returns (float32 mono samples, sample rate)."""
    out = os.path.join(workdir, "turn.wav")
    parts = voice.split(":")
    if parts[0] == "flite":
        cmd = ["flite", "-voice", parts[1], "-t", text, "-o", out]
    elif parts[0] == "espeak":
        cmd = ["espeak-ng", "-v", parts[1], "-w", out]
        if len(parts) > 2:
            cmd += ["-p", parts[2]]
        if len(parts) > 3:
            cmd += ["-s", parts[3]]
        cmd.append(text)
    else:
        raise ValueError(f"unknown voice {voice!r} (expected flite:NAME or espeak:VOICE[:PITCH:SPEED])")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return _read_wav(out)


def resample(x: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    if sr_in == sr_out:
        return x
    from math import gcd
    from scipy.signal import resample_poly

    g = gcd(sr_in, sr_out)
    return resample_poly(x, sr_out // g, sr_in // g).astype(np.float32)


def trim(x: np.ndarray, sr: int, rel_db: float = -45.0) -> np.ndarray:
    """Cut leading/trailing samples whose 5 ms envelope is rel_db below the turn's peak."""
    hop = max(1, sr // 200)
    n = len(x) // hop
    if n == 0:
        return x
    env = np.sqrt((x[: n * hop].reshape(n, hop) ** 2).mean(1) + 1e-20)
    on = np.flatnonzero(env > env.max() * 10 ** (rel_db / 20))
    if len(on) == 0:
        return x[:0]
    return x[on[0] * hop : (on[-1] + 1) * hop]


def make_meeting(
    n_speakers: int,
    minutes: float,
    seed: int,
    sr: int = 16000,
    voices: list[str] | None = None,
    snr_db: float | None = None,
    pause=(0.25, 1.0),
    sentences=(1, 2),
    short_turns=0.15,
    level=0.03,
    log=None,
):
    """Returns (audio float32, sr, turns) with turns = [(start_s, dur_s, speaker_label)]."""
    rng = np.random.default_rng(seed)
    if voices is None:
        if n_speakers > len(ALL_VOICES):
            raise ValueError(f"at most {len(ALL_VOICES)} built-in voices")
        # Mix flite and espeak voices: the flite ones are more natural, take them first in random order.
        flite = list(rng.permutation(FLITE_VOICES))
        esp = list(rng.permutation(ESPEAK_VOICES))
        n_fl = min(len(flite), (n_speakers + 1) // 2 + (n_speakers > 4))
        voices = flite[:n_fl] + esp[: n_speakers - n_fl]
    if len(voices) != n_speakers:
        raise ValueError("need exactly one voice per speaker")
    gains_db = rng.uniform(-6.0, 0.0, n_speakers)
    # Speakers talk unequally: Dirichlet shares, as in real meetings.
    share = rng.dirichlet(np.full(n_speakers, 2.0))
    share = 0.5 * share + 0.5 / n_speakers
    labels = [v.replace(":", "_").replace("+", "-") for v in voices]

    total = minutes * 60.0
    pieces, turns = [], []
    t = float(rng.uniform(0.3, 1.0))
    pieces.append(np.zeros(int(t * sr), np.float32))
    prev = -1
    seen = set()
    with tempfile.TemporaryDirectory() as work:
        while t < total or len(seen) < n_speakers:
            # Every speaker speaks at least once, early enough: the first n turns cycle through them.
            if len(seen) < n_speakers and len(turns) >= 2:
                cand = [i for i in range(n_speakers) if i not in seen and i != prev]
                spk = int(rng.choice(cand)) if cand else int(rng.choice([i for i in range(n_speakers) if i != prev]))
            else:
                p = share.copy()
                if prev >= 0:
                    p[prev] = 0
                spk = int(rng.choice(n_speakers, p=p / p.sum()))
            if rng.random() < short_turns:
                text = str(rng.choice(_SHORT)).capitalize()
            else:
                n_sent = int(rng.integers(sentences[0], sentences[1] + 1))
                text = " ".join(sentence(rng) for _ in range(n_sent))
            x, x_sr = synthesize(voices[spk], text, work)
            x = trim(resample(x, x_sr, sr), sr)
            if len(x) < sr // 10:
                continue
            x = x / (np.sqrt(np.mean(x**2)) + 1e-9) * level * 10 ** ((gains_db[spk] + rng.uniform(-2, 2)) / 20)
            start = t
            dur = len(x) / sr
            pieces.append(x.astype(np.float32))
            turns.append((start, dur, labels[spk]))
            if log:
                log(f"{start:7.2f} {dur:5.2f} {labels[spk]:28s} {text}")
            seen.add(spk)
            prev = spk
            t += dur
            gap = float(rng.uniform(*pause))
            pieces.append(np.zeros(int(round(gap * sr)), np.float32))
            t = sum(len(p) for p in pieces) / sr
    audio = np.concatenate(pieces)
    # Turn starts were computed from rounded sample counts: recompute exactly.
    pos, k = 0, 0
    exact = []
    for p in pieces:
        if k < len(turns) and p.any():
            exact.append((pos / sr, len(p) / sr, turns[k][2]))
            k += 1
        pos += len(p)
    turns = exact
    if snr_db is not None:
        speech_rms = np.sqrt(np.mean(np.concatenate([p for p in pieces if p.any()]) ** 2))
        noise = rng.standard_normal(len(audio)).astype(np.float32)
        audio = audio + noise * speech_rms * 10 ** (-snr_db / 20)
    peak = np.abs(audio).max()
    if peak > 0.99:
        audio *= 0.99 / peak
    return audio.astype(np.float32), sr, turns


def write_rttm(path, uri: str, turns) -> None:
    with open(path, "w") as f:
        for start, dur, label in turns:
            f.write(f"SPEAKER {uri} 1 {start:.3f} {dur:.3f} <NA> <NA> {label} <NA> <NA>\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("out", help="output audio (.wav or .flac); the RTTM goes next to it (.rttm)")
    ap.add_argument("--speakers", type=int, default=4)
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sr", type=int, default=16000, help="output sample rate (default 16000)")
    ap.add_argument(
        "--voices", help=f"comma-separated voice list (default: drawn from the seed); built-in: {','.join(ALL_VOICES)}"
    )
    ap.add_argument("--snr", type=float, default=None, help="add white noise at this SNR in dB")
    ap.add_argument("--rttm", help="reference RTTM path (default: OUT with suffix .rttm)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every turn")
    a = ap.parse_args(argv)
    for tool in ("flite", "espeak-ng"):
        if shutil.which(tool) is None:
            print(
                f"make_meeting: '{tool}' not found; install it with: apt-get install flite espeak-ng", file=sys.stderr
            )
            return 2
    voices = a.voices.split(",") if a.voices else None
    try:
        audio, sr, turns = make_meeting(
            a.speakers, a.minutes, a.seed, a.sr, voices, a.snr, log=print if a.verbose else None
        )
    except (ValueError, subprocess.CalledProcessError) as e:
        print(f"make_meeting: {e}", file=sys.stderr)
        return 2
    import soundfile as sf

    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(out), audio, sr, subtype="PCM_16")
    rttm = Path(a.rttm) if a.rttm else out.with_suffix(".rttm")
    write_rttm(rttm, out.stem, turns)
    spk = sorted({t[2] for t in turns})
    print(
        f"wrote {out} ({len(audio) / sr:.1f} s, {len(turns)} turns, {len(spk)} speakers: {', '.join(spk)}) and {rttm}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
