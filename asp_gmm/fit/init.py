"""Initialisation of the drop-in's fits as scikit-learn's ``_initialize`` does it, in memory
(:func:`from_data`) and on a chunk source (:func:`stream_kmeans`: k-means on a uniform sample, then
the hard-label statistics of every event), with sample weights where given. scikit-learn is
imported on use (it is an optional dependency of asp_gmm).

``weights_init``, ``means_init`` and ``precisions_init`` are used as scikit-learn uses them. The
``init_params`` methods are scikit-learn's, computed the same way while ``n_samples`` is at most
:data:`KMEANS_SUBSAMPLE`; beyond that, "kmeans" and "k-means++" run on a random subsample of
:data:`KMEANS_SUBSAMPLE` events (drawn from ``random_state``), every event is then labelled by its
nearest centre, and the initial parameters are computed from those hard labels on all events in
one pass (O(N D^2), not O(N M D^2)). So for large data the starting point differs from
scikit-learn's (it is a k-means solution of a subsample) and the fit costs a fraction of k-means on
all events. "random" computes one NumPy M-step from random responsibilities, as scikit-learn does.
"""

from __future__ import annotations

import numpy as np

from ..backends.base import BlockStats
from .numpy_em import estimate_params, label_params, one_hot_params
from .sources import blocks, weighted_blocks
from .stats import SuffStats

#: Above this many events, "kmeans" and "k-means++" initialisation run on a random subsample of this
#: size.
KMEANS_SUBSAMPLE = 10_000


def from_data(X, random_state, M: int, cvtype: str, reg: float, method: str, sample_weight=None):
    """scikit-learn's ``_initialize`` from the data: ``(nk (M,), means (M, D), covariances)`` in
    float64 by ``method`` ("kmeans", "k-means++", "random", "random_from_data"); k-means runs on a
    subsample of :data:`KMEANS_SUBSAMPLE` events of large data. With ``sample_weight`` every
    method weighs the events."""
    from sklearn.cluster import KMeans, kmeans_plusplus

    N = X.shape[0]
    X64 = np.asarray(X, dtype=np.float64)
    if sample_weight is not None:
        return _weighted(X64, random_state, M, cvtype, reg, method, sample_weight)
    if method == "random":
        resp = random_state.uniform(size=(N, M))
        resp /= resp.sum(axis=1)[:, None]
        return estimate_params(X64, resp, reg, cvtype)
    if method == "random_from_data":
        idx = random_state.choice(N, size=M, replace=False)
        return one_hot_params(X64, idx, reg, cvtype)
    sub = None
    if N > KMEANS_SUBSAMPLE:
        sub = np.sort(random_state.choice(N, size=KMEANS_SUBSAMPLE, replace=False))
    Xs = X if sub is None else X[sub]
    if method == "k-means++":
        _, idx = kmeans_plusplus(Xs, M, random_state=random_state)
        if sub is not None:
            idx = sub[idx]
        return one_hot_params(X64, idx, reg, cvtype)
    km = KMeans(n_clusters=M, n_init=1, random_state=random_state).fit(Xs)
    labels = km.labels_ if sub is None else km.predict(X)
    return label_params(X64, labels, M, reg, cvtype)


def _weighted(X64, random_state, M, cvtype, reg, method, sample_weight):
    """``_init_from_data`` with weighted events: the responsibilities of each method (random,
    one-hot at drawn events, k-means labels) multiplied by the weights."""
    from sklearn.cluster import KMeans, kmeans_plusplus

    N = X64.shape[0]
    sw = sample_weight
    if method == "random":
        resp = random_state.uniform(size=(N, M))
        resp /= resp.sum(axis=1)[:, None]
        return estimate_params(X64, resp * sw[:, None], reg, cvtype)
    if method in ("random_from_data", "k-means++"):
        if method == "random_from_data":
            idx = random_state.choice(N, size=M, replace=False, p=sw / sw.sum())
        else:
            _, idx = kmeans_plusplus(X64, M, random_state=random_state, sample_weight=sw)
        resp = np.zeros((N, M))
        resp[idx, np.arange(M)] = 1.0
        return estimate_params(X64, resp * sw[:, None], reg, cvtype)
    sub = None
    if N > KMEANS_SUBSAMPLE:
        sub = np.sort(random_state.choice(N, size=KMEANS_SUBSAMPLE, replace=False))
    Xs, ws = (X64, sw) if sub is None else (X64[sub], sw[sub])
    km = KMeans(n_clusters=M, n_init=1, random_state=random_state).fit(Xs, sample_weight=ws)
    labels = km.labels_ if sub is None else km.predict(X64)
    resp = np.zeros((N, M))
    resp[np.arange(N), labels] = sw
    return estimate_params(X64, resp, reg, cvtype)


def stream_kmeans(src, M, D, cvtype, dt, reg, method, random_state, sample_weight=None):
    """k-means initialisation of a streamed fit, as for large in-memory data: a uniform sample of
    :data:`KMEANS_SUBSAMPLE` events drawn in one pass (reservoir sampling from ``random_state``),
    k-means (or k-means++ seeding) on it, then every event labelled by its nearest centre and the
    hard-label parameters computed in a second pass. Returns ``(N, weights, means, covars)``.
    With ``sample_weight`` (a weight source) k-means weighs the sampled events and the second pass
    the labelled ones."""
    k = KMEANS_SUBSAMPLE
    sample = np.empty((k, D))
    sw = None if sample_weight is None else np.empty(k)
    seen = 0
    for _start, blk, w in _blocks(src, D, dt, sample_weight):
        n = blk.shape[0]
        take = min(max(k - seen, 0), n)
        sample[seen : seen + take] = blk[:take]
        t = seen + np.arange(take, n)
        j = (random_state.random_sample(t.shape[0]) * (t + 1)).astype(np.int64)
        hit = np.nonzero(j < k)[0]
        sample[j[hit]] = blk[take + hit]  # in row order: a later row replaces an earlier one
        if sw is not None:
            sw[seen : seen + take] = w[:take]
            sw[j[hit]] = w[take + hit]
        seen += n
    if seen < M:
        raise ValueError(f"Expected n_samples >= n_components but got n_components = {M}, n_samples = {seen}")
    sample = sample[: min(seen, k)]
    sw = None if sw is None else sw[: sample.shape[0]]
    from sklearn.cluster import KMeans, kmeans_plusplus

    if method == "k-means++":
        centres, _ = kmeans_plusplus(sample, M, random_state=random_state, sample_weight=sw)
    else:
        km = KMeans(n_clusters=M, n_init=1, random_state=random_state)
        centres = km.fit(sample, sample_weight=sw).cluster_centers_
    centres = np.asarray(centres, np.float64)
    full = cvtype == "full"
    st = SuffStats(M, D, cvtype, centres)
    for _start, blk, w in _blocks(src, D, dt, sample_weight):
        x = blk.astype(np.float64)
        d2 = (x * x).sum(1)[:, None] - 2.0 * x @ centres.T + (centres * centres).sum(1)
        lab = np.argmin(d2, axis=1)
        nk = np.bincount(lab, weights=w, minlength=M).astype(np.float64)
        sumx = np.zeros((M, D))
        np.add.at(sumx, lab, x if w is None else x * w[:, None])
        s2 = np.zeros((M, D, D) if full else (M, D))
        for c in np.unique(lab):
            y = x[lab == c] - centres[c]
            yw = y if w is None else y * w[lab == c][:, None]
            s2[c] = yw.T @ y if full else (yw * y).sum(0)
        st.add_block(BlockStats(x.shape[0] if w is None else float(w.sum()), 0.0, nk, sumx, s2), x.shape[0])
    prev = np.repeat((np.eye(D) if full else np.ones(D))[None], M, 0)
    w, mu, cv = st.mstep(centres, prev, reg)
    return st.rows, w, mu, cv


def _blocks(src, D, dt, sample_weight):
    """``(start, block, weights or None)`` over a chunk source in blocks of 2^16 rows."""
    if sample_weight is None:
        return ((a, b, None) for a, b in blocks(src, D, dt, 1 << 16))
    return weighted_blocks(src, sample_weight, D, dt, 1 << 16)
