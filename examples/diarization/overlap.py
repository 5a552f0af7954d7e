"""Overlapped speech: a second speaker on the frames where the final resegmentation hesitates.

Every speech frame has a log-likelihood under every speaker's final GMM (cluster.py, the
``final_ll`` of the Viterbi resegmentation). Where two people speak at once, the frames are a
mixture of both voices and the model of the speaker the resegmentation chose no longer wins
clearly: the runner-up, often the other voice, scores nearly as well. So a frame is marked as
overlapped where the chosen speaker's lead over the best other speaker, averaged over a centred
window of ``width`` frames, is under ``margin`` nats per frame, in runs of at least ``min_run``
frames; the runner-up of the window is the second speaker there. ``margin`` 0 turns it off.
The lead is also small at a change of speaker and between similar voices, which is why the
margin is chosen by cross-validation over recordings (benchmarks/diarization_cv.py).
"""

from __future__ import annotations

import numpy as np


def second_speaker(ll: np.ndarray, labels: np.ndarray, margin: float, width: int = 50, min_run: int = 30) -> np.ndarray:
    """Second speaker of every frame, -1 where none.

    Parameters
    ----------
    ll : array (K, n)
        Per-speaker log-likelihoods of the n speech frames.
    labels : array (n,) of int
        The speaker chosen for every frame (0..K-1).
    margin : float
        Largest mean lead (nats per frame) of the chosen speaker over the runner-up that counts
        as overlap; 0 or less: no overlap.

    Returns
    -------
    second : ndarray (n,) of int
        The runner-up where the frame is overlapped (never equal to ``labels``), else -1.
    """
    K, n = ll.shape
    out = np.full(n, -1, np.intp)
    if margin <= 0 or K < 2 or n == 0:
        return out
    labels = np.asarray(labels, np.intp)
    rel = np.maximum(ll.astype(np.float64) - ll.max(axis=0), -30.0)  # as reseg.resegment
    c = np.zeros((K, n + 1))
    np.cumsum(rel, axis=1, out=c[:, 1:])
    h = width // 2
    lo = np.clip(np.arange(n) - h, 0, n)
    hi = np.clip(np.arange(n) - h + width, 0, n)
    S = (c[:, hi] - c[:, lo]) / np.maximum(hi - lo, 1)  # (K, n) windowed mean
    own = S[labels, np.arange(n)]
    S[labels, np.arange(n)] = -np.inf
    other = S.argmax(axis=0)
    lead = own - S[other, np.arange(n)]
    mark = lead < margin
    # runs of at least min_run frames
    d = np.diff(np.concatenate([[0], mark.astype(np.int8), [0]]))
    for s, e in zip(np.flatnonzero(d == 1), np.flatnonzero(d == -1)):
        if e - s >= min_run:
            out[s:e] = other[s:e]
    return out
