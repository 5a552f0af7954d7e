"""RTTM reading/writing, frame labels <-> segments, DER (pyannote.metrics) and the timeline plot."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from features import DiarizationError

#: NIST md-eval's no-score collar is +-0.25 s around every reference boundary. pyannote.metrics
#: counts its ``collar`` as the *total* width centred on a boundary, so NIST 0.25 s is collar=0.5.
NIST_COLLAR = 0.25


def write_rttm(path, uri: str, segments) -> None:
    """segments: iterable of (start_s, dur_s, label)."""
    with open(path, "w") as f:
        for start, dur, label in segments:
            f.write(f"SPEAKER {uri} 1 {start:.3f} {dur:.3f} <NA> <NA> {label} <NA> <NA>\n")


def read_rttm(path) -> dict[str, list[tuple[float, float, str]]]:
    """Returns {uri: [(start, dur, label), ...]}; only SPEAKER lines are used."""
    p = Path(path)
    if not p.is_file():
        raise DiarizationError(f"{path}: reference RTTM not found")
    out: dict[str, list] = {}
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise DiarizationError(f"{path}: cannot read reference RTTM ({e})") from None
    for n, line in enumerate(text.splitlines(), 1):
        f = line.split()
        if not f or f[0].startswith(";") or f[0] != "SPEAKER":
            continue
        try:
            start, dur, label = float(f[3]), float(f[4]), f[7]
        except (IndexError, ValueError):
            raise DiarizationError(f"{path}:{n}: malformed RTTM line: {line.strip()!r}") from None
        out.setdefault(f[1], []).append((start, dur, label))
    if not out:
        raise DiarizationError(f"{path}: no SPEAKER lines in the reference RTTM")
    return out


def labels_to_segments(labels: np.ndarray, frame_rate: int, merge_gap: float = 0.0,
                       names=None) -> list[tuple[float, float, str]]:
    """Frame labels (-1 = non-speech) -> [(start, dur, label)].

    Runs of the same label separated by less than ``merge_gap`` seconds of non-speech are joined
    (short pauses inside a turn are that speaker's, as annotators mark them).
    """
    labels = np.asarray(labels)
    segs: list[list] = []
    if len(labels) == 0:
        return []
    change = np.flatnonzero(np.diff(labels)) + 1
    bounds = np.concatenate([[0], change, [len(labels)]])
    gap = int(round(merge_gap * frame_rate))
    for s, e in zip(bounds[:-1], bounds[1:]):
        lab = int(labels[s])
        if lab < 0:
            continue
        if segs and segs[-1][2] == lab and s - segs[-1][1] <= gap:
            segs[-1][1] = e
        else:
            segs.append([s, e, lab])
    name = (lambda k: names[k]) if names is not None else (lambda k: f"spk{k:02d}")
    # Frame i is centred on i/frame_rate: a run [s, e) covers [s - 0.5, e - 0.5) frames.
    out = []
    for s, e, lab in segs:
        start = max(0.0, (s - 0.5) / frame_rate)
        out.append((start, (e - 0.5) / frame_rate - start, name(lab)))
    return out


def to_annotation(segments, uri: str):
    from pyannote.core import Annotation, Segment
    ann = Annotation(uri=uri)
    for i, (start, dur, label) in enumerate(segments):
        ann[Segment(start, start + dur), i] = label
    return ann


def der(reference, hypothesis, uri: str, collar: float = NIST_COLLAR, duration=None) -> dict:
    """Diarization error rate and its parts with a +-``collar`` s no-score zone (NIST convention).

    reference, hypothesis: lists of (start, dur, label); duration: the audio's length, scored from
    0 to duration (default: the union of both extents). Returns a dict with 'der' and the
    components in seconds ('missed detection', 'false alarm', 'confusion', 'total').
    """
    from pyannote.core import Segment, Timeline
    from pyannote.metrics.diarization import DiarizationErrorRate
    metric = DiarizationErrorRate(collar=2.0 * collar, skip_overlap=False)
    ref = to_annotation(reference, uri)
    hyp = to_annotation(hypothesis, uri)
    if duration is None:
        duration = max([s[0] + s[1] for s in list(reference) + list(hypothesis)] or [0.0])
    uem = Timeline([Segment(0.0, float(duration))], uri=uri)
    detail = metric(ref, hyp, uem=uem, detailed=True)
    d = {k: float(v) for k, v in detail.items()}
    d["der"] = d.pop("diarization error rate")
    return d


def plot_timeline(path, reference, hypothesis, title: str = "") -> None:
    """PNG with one row per speaker: reference speakers on top, hypothesis speakers below."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = []
    for tag, segs in (("ref", reference), ("hyp", hypothesis)):
        if segs is None:
            continue
        for lab in sorted({s[2] for s in segs}):
            rows.append((f"{tag}: {lab}", [(s[0], s[1]) for s in segs if s[2] == lab], tag))
    end = max((s[0] + s[1] for _, segs, _ in rows for s in segs), default=1.0)
    fig, ax = plt.subplots(figsize=(min(40, 6 + end / 10), 0.4 * len(rows) + 1.2))
    cmap = plt.get_cmap("tab10")
    for i, (name, spans, tag) in enumerate(rows):
        ax.broken_barh(spans, (len(rows) - 1 - i - 0.4, 0.8), color=cmap(i % 10),
                       alpha=1.0 if tag == "hyp" else 0.6)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in rows][::-1], fontsize=8)
    ax.set_xlim(0, end)
    ax.set_xlabel("time (s)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
