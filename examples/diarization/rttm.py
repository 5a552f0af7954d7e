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


def labels_to_segments(
    labels: np.ndarray, frame_rate: int, merge_gap: float = 0.0, names=None, min_duration: float = 0.0
) -> list[tuple[float, float, str]]:
    """Frame labels (-1 = non-speech) -> [(start, dur, label)].

    Runs of the same label separated by less than ``merge_gap`` seconds of non-speech are joined
    (short pauses inside a turn are that speaker's, as annotators mark them). Then a segment
    shorter than ``min_duration`` seconds goes to the speaker of the nearer neighbouring segment
    when one is within ``merge_gap`` (and is joined to it), and is dropped otherwise, so that no
    absurdly short segment is written.
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
    shortest = int(round(min_duration * frame_rate))
    while shortest > 0 and segs:
        lengths = [e - s for s, e, _ in segs]
        i = int(np.argmin(lengths))
        if lengths[i] >= shortest:
            break
        s, e, _ = segs[i]
        cands = []
        if i > 0 and s - segs[i - 1][1] <= gap:
            cands.append((s - segs[i - 1][1], i - 1))
        if i + 1 < len(segs) and segs[i + 1][0] - e <= gap:
            cands.append((segs[i + 1][0] - e, i + 1))
        if not cands:
            del segs[i]
            continue
        j = min(cands)[1]
        if j < i:
            segs[j][1] = e
        else:
            segs[j][0] = s
        del segs[i]
        # neighbours of the same speaker that now touch are joined
        k = min(i, j)
        while 0 < k < len(segs) and segs[k - 1][2] == segs[k][2] and segs[k][0] - segs[k - 1][1] <= gap:
            segs[k - 1][1] = segs[k][1]
            del segs[k]
        while k + 1 < len(segs) and segs[k][2] == segs[k + 1][2] and segs[k + 1][0] - segs[k][1] <= gap:
            segs[k][1] = segs[k + 1][1]
            del segs[k + 1]
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
    components in seconds ('missed detection', 'false alarm', 'confusion', 'correct', 'total').

    Computed here with NumPy (and SciPy's Hungarian method) as pyannote.metrics'
    ``DiarizationErrorRate(collar=2 * collar, skip_overlap=False)`` does: the scored time is
    [0, duration] less +-collar around every reference segment's start and end; the hypothesis
    speakers are mapped one-to-one onto the reference speakers that maximise their co-occurrence
    in the scored time; on each stretch with r reference and h hypothesis speakers, of which c are
    mapped pairs, r is counted in the total, max(r - h, 0) missed, max(h - r, 0) false alarm and
    min(r, h) - c confusion. (pyannote.metrics imports pandas, scipy.stats and matplotlib: 2 s of
    a run; the tests check both agree to 1e-9 s.) One difference: a speaker's own overlapping
    segments count once here, twice in pyannote (no RTTM written by this example has them).
    """
    if duration is None:
        duration = max([s[0] + s[1] for s in list(reference) + list(hypothesis)] or [0.0])
    duration = float(duration)
    ref = [(float(s), float(s) + float(d), lab) for s, d, lab in reference if d > 0]
    hyp = [(float(s), float(s) + float(d), lab) for s, d, lab in hypothesis if d > 0]
    zones = [(t - collar, t + collar) for s, e, _ in ref for t in (s, e)] if collar > 0 else []
    cuts = {0.0, duration}
    cuts.update(t for s, e, _ in ref + hyp for t in (s, e))
    cuts.update(t for z in zones for t in z)
    edges = np.array(sorted(t for t in cuts if 0.0 <= t <= duration))
    out = {"missed detection": 0.0, "false alarm": 0.0, "confusion": 0.0, "correct": 0.0, "total": 0.0}
    if len(edges) < 2:
        out["der"] = 0.0
        return out
    lo, hi = edges[:-1], edges[1:]
    mid, dur = 0.5 * (lo + hi), hi - lo
    scored = dur > 0
    for a, b in zones:
        scored &= ~((mid > a) & (mid < b))
    dur = np.where(scored, dur, 0.0)

    def activity(segs):
        names = sorted({lab for _, _, lab in segs})
        act = np.zeros((len(mid), len(names)), bool)
        col = {n: i for i, n in enumerate(names)}
        for s, e, lab in segs:
            act[:, col[lab]] |= (mid > s) & (mid < e)
        return names, act

    rn, R = activity(ref)
    hn, H = activity(hyp)
    nr, nh = R.sum(1), H.sum(1)
    matched = np.zeros(len(mid))
    if rn and hn:
        cooc = (H.T * dur) @ R.astype(float)  # (hyp, ref) seconds spoken together
        for h, r in max_weight_matching(cooc):
            if cooc[h, r] > 0:
                matched += H[:, h] & R[:, r]
    out["total"] = float(dur @ nr)
    out["missed detection"] = float(dur @ np.maximum(nr - nh, 0))
    out["false alarm"] = float(dur @ np.maximum(nh - nr, 0))
    out["confusion"] = float(dur @ (np.minimum(nr, nh) - matched))
    out["correct"] = float(dur @ matched)
    err = out["missed detection"] + out["false alarm"] + out["confusion"]
    out["der"] = err / out["total"] if out["total"] > 0 else (0.0 if err == 0 else 1.0)
    return out


def max_weight_matching(weights) -> list:
    """The one-to-one pairs (row, column) of ``weights`` (n, m) with the largest total weight (the
    Hungarian method, O(n^2 m) for n <= m; the transpose otherwise), as scipy's
    ``linear_sum_assignment(-weights)``; here so that scoring needs no scipy.optimize import."""
    w = np.asarray(weights, float)
    if w.shape[0] > w.shape[1]:
        return [(r, c) for c, r in max_weight_matching(w.T)]
    n, m = w.shape
    cost = w.max() - w if w.size else w  # minimise; every row gets a column
    u, v = np.zeros(n + 1), np.zeros(m + 1)
    match = np.zeros(m + 1, int)  # match[j]: row (1-based) in column j; 0 none
    way = np.zeros(m + 1, int)
    for i in range(1, n + 1):
        match[0], j0 = i, 0
        minv = np.full(m + 1, np.inf)
        used = np.zeros(m + 1, bool)
        while True:
            used[j0] = True
            i0 = match[j0]
            cur = cost[i0 - 1] - u[i0] - v[1:]
            free = ~used[1:]
            better = free & (cur < minv[1:])
            minv[1:][better] = cur[better]
            way[1:][better] = j0
            cand = np.where(free, minv[1:], np.inf)
            j1 = int(np.argmin(cand)) + 1
            delta = cand[j1 - 1]
            u[match[used]] += delta
            v[used] -= delta
            minv[1:][free] -= delta
            j0 = j1
            if match[j0] == 0:
                break
        while j0:
            j1 = way[j0]
            match[j0] = match[j1]
            j0 = j1
    return sorted((int(match[j]) - 1, j - 1) for j in range(1, m + 1) if match[j])


def der_pyannote(reference, hypothesis, uri: str, collar: float = NIST_COLLAR, duration=None) -> dict:
    """:func:`der` through pyannote.metrics (the tests compare the two)."""
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


def speaker_mapping(reference, hypothesis) -> dict:
    """The one-to-one hypothesis -> reference speaker mapping that maximises their overlap in
    time (the mapping the DER uses), by the Hungarian method; unmatched speakers are left out."""
    from scipy.optimize import linear_sum_assignment

    ref_names = sorted({s[2] for s in reference})
    hyp_names = sorted({s[2] for s in hypothesis})
    if not ref_names or not hyp_names:
        return {}
    ov = np.zeros((len(hyp_names), len(ref_names)))
    for hs, hd, hl in hypothesis:
        for rs, rd, rl in reference:
            o = min(hs + hd, rs + rd) - max(hs, rs)
            if o > 0:
                ov[hyp_names.index(hl), ref_names.index(rl)] += o
    rows, cols = linear_sum_assignment(-ov)
    return {hyp_names[r]: ref_names[c] for r, c in zip(rows, cols) if ov[r, c] > 0}


def plot_timeline(path, reference, hypothesis, title: str = "") -> None:
    """PNG with one row per speaker: reference speakers on top, hypothesis speakers below. A
    hypothesis speaker has the colour of the reference speaker it is mapped to (the DER's
    optimal mapping); unmatched hypothesis speakers get colours of their own."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap(
        "tab10" if len({s[2] for s in (reference or [])} | {s[2] for s in hypothesis}) <= 10 else "tab20"
    )
    ref_names = sorted({s[2] for s in reference}) if reference is not None else []
    colour = {("ref", n): cmap(i % cmap.N) for i, n in enumerate(ref_names)}
    mapping = speaker_mapping(reference, hypothesis) if reference is not None else {}
    extra = len(ref_names)
    for n in sorted({s[2] for s in hypothesis}):
        if n in mapping:
            colour[("hyp", n)] = colour[("ref", mapping[n])]
        else:
            colour[("hyp", n)] = cmap(extra % cmap.N)
            extra += 1
    rows = []
    for tag, segs in (("ref", reference), ("hyp", hypothesis)):
        if segs is None:
            continue
        for lab in sorted({s[2] for s in segs}):
            shown = f"{tag}: {lab}" + (f" (= {mapping[lab]})" if tag == "hyp" and lab in mapping else "")
            rows.append((shown, [(s[0], s[1]) for s in segs if s[2] == lab], tag, colour[(tag, lab)]))
    end = max((s[0] + s[1] for _, segs, _, _ in rows for s in segs), default=1.0)
    fig, ax = plt.subplots(figsize=(min(40, 6 + end / 10), 0.4 * len(rows) + 1.2))
    for i, (name, spans, tag, c) in enumerate(rows):
        ax.broken_barh(spans, (len(rows) - 1 - i - 0.4, 0.8), color=c, alpha=1.0 if tag == "hyp" else 0.6)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in rows][::-1], fontsize=8)
    ax.set_xlim(0, end)
    ax.set_xlabel("time (s)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
