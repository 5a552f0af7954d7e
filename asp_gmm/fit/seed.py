"""The one seeding of missing parameters: means at events at even intervals of the (weighted)
data, or at ``rng_seed``'s random distinct events; every covariance the data's (co)variance plus
``reg_covar``; equal weights.

Whatever holds the data (a host array, a CUDA array, a chunk source, Dask partitions) gives the
count and the mean and (co)variance, or the sums they come from (:func:`moments_from_sums`);
:func:`event_index` picks the events for the means and :func:`covariances` finishes the
covariances, with the one check on zero variance (:func:`check_covariances`).

With sample weights an event of weight ``w`` counts ``w`` times: the picked events are those a
repetition of the rows would pick (the cumulative weight crosses ``k W / M``), an event of weight
zero is never picked, and the (co)variance is the weighted one.
"""

from __future__ import annotations

import threading

import numpy as np

from ..blas import one_blas_thread
from ..errors import StreamError
from .sources import as_source, blocks, weighted_blocks
from .stats import _neumaier

#: The one message for data that cannot be seeded.
ZERO_VARIANCE = "the data has zero variance in some dimension; increase reg_covar or drop constant features"


def event_index(n: int, M: int, rng_seed=None, weights=None) -> np.ndarray:
    """Sorted indices (M,) of the events the means start at.

    Parameters
    ----------
    n : int
        Events.
    M : int
        Components.
    rng_seed : int, optional
        Random distinct events (with weights: drawn with probability proportional to the weight);
        by default events at even intervals.
    weights : ndarray (n,), optional
        Sample weights (non-negative, at least M of them positive).
    """
    if weights is None:
        if rng_seed is None:
            return (np.arange(M) * n) // M
        return np.sort(np.random.default_rng(rng_seed).choice(n, M, replace=False))
    w = np.asarray(weights, np.float64)
    if rng_seed is not None:
        return np.sort(_weighted_draw(w, M, np.random.default_rng(rng_seed)))
    cum = np.cumsum(w)
    total = cum[-1]
    # the event a repetition of the rows puts at position floor(k W / M): the first whose cumulative
    # weight exceeds it (zero-weight events never do)
    targets = np.floor(np.arange(M) * total / M)
    return np.searchsorted(cum, targets, side="right")


#: Events per group of :func:`_weighted_draw`'s two-level search
_DRAW_GROUP = 1024


def _weighted_draw(w: np.ndarray, M: int, rng) -> np.ndarray:
    """M distinct indices drawn one after another, each with probability proportional to its weight
    among those not drawn yet (successive sampling: the law of ``Generator.choice(n, M,
    replace=False, p=w / w.sum())``, whose search over every event per draw took 13 ms at a million
    events). Two levels: the weight sums of groups of :data:`_DRAW_GROUP` events, then the events of
    the group drawn; a drawn event's weight leaves its group's sum. ``w`` (n,) >= 0 with at least M
    positive values."""
    n, G = w.shape[0], _DRAW_GROUP
    pad = np.zeros(-(-n // G) * G)
    pad[:n] = w
    groups = pad.reshape(-1, G)
    gsum = groups.sum(axis=1)
    out = np.empty(M, np.int64)
    for k in range(M):
        cum = np.cumsum(gsum)
        u = rng.random() * cum[-1]
        g = min(int(np.searchsorted(cum, u, side="right")), len(cum) - 1)
        if gsum[g] <= 0.0:  # (rounding at a group boundary: the nearest group that has weight)
            pos = np.flatnonzero(gsum > 0.0)
            g = int(pos[np.argmin(np.abs(pos - g))])
        inner = np.cumsum(groups[g])
        r = min(max(u - (cum[g] - gsum[g]), 0.0), inner[-1])
        i = min(int(np.searchsorted(inner, r, side="right")), G - 1)
        while groups[g, i] <= 0.0:  # (r at the group's end: its last event that has weight)
            i -= 1
        out[k] = g * G + i
        groups[g, i] = 0.0  # (a copy: the caller's weights are untouched)
        gsum[g] = groups[g].sum()
    return out


def moments_from_sums(n, s1, s2, cvtype: str):
    """``(mean offset (D,), (co)variance)`` from the (weighted) count ``n`` and the sums ``s1``
    (D,) and ``s2`` ((D, D) for full, (D,) otherwise) of the data minus a shift."""
    m1 = s1 / n
    return m1, s2 / n - (np.outer(m1, m1) if cvtype == "full" else m1 * m1)


def covariances(cov, M: int, cvtype: str, reg_covar: float, symmetrise: bool = True) -> np.ndarray:
    """Every component's covariance: the data's ``cov`` ((D, D) for full, (D,) for diag),
    symmetrised (sums of outer products; ``np.cov`` of a host array is used as it is), plus
    ``reg_covar`` on the diagonal; float64 (M, D, D) or (M, D)."""
    cov = np.asarray(cov, np.float64)
    if cvtype == "full":
        cov = np.atleast_2d(cov)
        full = (0.5 * (cov + cov.T) if symmetrise else cov) + reg_covar * np.eye(cov.shape[0])
        return np.repeat(full[None], M, axis=0)
    return np.repeat((cov + reg_covar)[None], M, axis=0)


def check_covariances(covars, cvtype: str) -> None:
    """Raise ``ValueError`` (:data:`ZERO_VARIANCE`) when a seeded variance is not positive."""
    diag = np.diagonal(covars, axis1=1, axis2=2) if cvtype == "full" else covars
    if not np.all(np.isfinite(covars)) or np.any(diag <= 0):
        raise ValueError(ZERO_VARIANCE)


def seeded_as(covars, cvtype: str) -> np.ndarray:
    """Seeded covariances, every component the data's ((M, D, D) or (M, D), the kernel type's), in
    the shape of ``cvtype``: "tied" the one (D, D) matrix, "spherical" (M,) the mean of each
    diagonal (taken in float64, returned in the covariances' dtype); "full" and "diag" unchanged."""
    covars = np.asarray(covars)
    if cvtype == "tied":
        return np.array(covars[0])  # a copy, C-contiguous
    if cvtype == "spherical":
        return np.ascontiguousarray(covars.mean(axis=1, dtype=np.float64).astype(covars.dtype))
    return covars


def equal_weights(M: int, dtype) -> np.ndarray:
    """The mixture weights a seeded model starts with: 1/M each."""
    return np.full(M, 1.0 / M, dtype=dtype)


#: Bytes of float64 per block of :func:`host_moments` (cache-sized: each thread keeps one block's
#: scratch; a fresh 9 MB temporary per block was page-faulted in on every call)
HOST_BLOCK_BYTES = 1 << 21

_scratch = threading.local()


def _block_rows(D: int) -> int:
    """Rows of a block of D dimensions: about :data:`HOST_BLOCK_BYTES` of float64 (what each host
    thread keeps as its scratch, also for large D), 64 to 32 768 rows."""
    return max(64, min(1 << 15, HOST_BLOCK_BYTES // (8 * max(D, 1))))


#: Above this many threads a block's column sums are NumPy's reductions, not BLAS: OpenBLAS serialises
#: calls made at once from many threads (a 500 000 x 36 pass: 12 ms on 8-16 threads of a 16-core
#: host, against 18-25 ms through BLAS; on 2-4 threads BLAS is faster: 15 against 21 ms on 2 cores)
BLAS_SUM_THREADS = 4


def _block_sums(Xb, shift, wb, full: bool, blas: bool = True):
    """``(sum y, sum y^2, sum w y, sum w y y^T or sum w y^2)`` of one block's rows ``y = x - shift``
    in float64 (``wb`` None: unweighted, the weighted sums are the plain ones). The rows are
    centred into this thread's scratch block, kept between calls; ``blas``: the diagonal case's
    column sums by BLAS (else NumPy's reduction)."""
    n, D = Xb.shape
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.shape[0] < n or buf.shape[1] != D:
        buf = _scratch.buf = np.empty((max(n, _block_rows(D)), D))
        _scratch.ones = np.ones(buf.shape[0])
    Y = buf[:n]
    Y[...] = Xb  # (a cast copy and an in-place subtraction: 1.3-1.8x faster than one mixed-type ufunc)
    Y -= shift
    ones = _scratch.ones[:n]
    if wb is None and not full and not blas:
        q1 = np.add.reduce(Y, axis=0)
        np.square(Y, out=Y)
        q2 = np.add.reduce(Y, axis=0)
        return q1, q2, q1, q2
    q1 = ones @ Y  # (BLAS: a column sum of a C-ordered block is slow in NumPy's own reduction)
    if wb is None:
        if full:
            s2 = Y.T @ Y
            return q1, np.diag(s2).copy(), q1, s2
        np.square(Y, out=Y)
        q2 = ones @ Y
        return q1, q2, q1, q2
    s1 = wb @ Y
    if full:
        q2 = np.einsum("ij,ij->j", Y, Y)
        Y *= np.sqrt(wb)[:, None]
        return q1, q2, s1, Y.T @ Y
    np.square(Y, out=Y)
    return q1, ones @ Y, s1, wb @ Y


def host_moments(X: np.ndarray, cvtype: str, sample_weight=None):
    """``(per-dimension variance of the unweighted rows (D,), (co)variance)`` of the host array X
    (N, D, any float dtype): the (co)variance weighted where ``sample_weight`` (N,) is given, (D, D)
    for "full", (D,) otherwise. Blocked passes in float64 over X minus a shift (the mean of rows at
    even intervals: an offset of the data, ``X + 1000``, costs no digits), with no full-size copy of
    X (a float64 copy and the centred rows of a million events of 16 dimensions were four 128 MB
    temporaries); large X on the runtime's host threads (NumPy releases the GIL in the block's work;
    the partial sums are added in block order, so the result does not depend on the scheduling; a
    machine with more than :data:`BLAS_SUM_THREADS` of them sums a block's columns by NumPy
    instead of BLAS, which may differ in the last bits). The
    unweighted variance checks the data's scale against the working precision, zero-weight rows
    included (they are in the E-steps too)."""
    N, D = X.shape
    w = None if sample_weight is None else np.asarray(sample_weight, np.float64)
    full = cvtype == "full"
    shift = X[:: max(N // 1024, 1)].astype(np.float64).mean(axis=0)
    rows = _block_rows(D)
    starts = range(0, N, rows)

    rt = None
    if len(starts) >= 4:
        from ..runtime import default_runtime

        rt = default_runtime()
    blas = rt is None or rt.host_threads() <= BLAS_SUM_THREADS

    def one(a):
        return _block_sums(X[a : a + rows], shift, None if w is None else w[a : a + rows], full, blas)

    if rt is not None:
        # one BLAS thread under each block thread (a threaded BLAS under every one of them made the
        # diarization example's feature threads 1.4-2.2x slower than one thread on a 16-core host)
        with one_blas_thread():
            parts = rt.host_map(one, starts)
    else:
        parts = [one(a) for a in starts]
    q1, q2, s1, s2 = (np.array(parts[0][k]) for k in range(4))  # (copies: the blocks' sums may alias)
    for p in parts[1:]:
        q1 += p[0]
        q2 += p[1]
        s1 += p[2]
        s2 += p[3]
    var = q2 / N - (q1 / N) ** 2
    if w is None:
        _m1, cov = moments_from_sums(N, q1, s2, cvtype)
    else:
        _m1, cov = moments_from_sums(float(w.sum()), s1, s2, cvtype)
    return var, np.atleast_2d(cov) if full else cov


def seed(source, M: int, D: int | None, cvtype: str, dtype, reg_covar: float, rng_seed=None, sample_weight=None):
    """Seeding from a chunk source: ``(N, means (M, D), covars (M, D, D) or (M, D))`` with the means
    at :func:`event_index`'s events and every covariance the data's (co)variance plus ``reg_covar``
    (float64, one pass, centred on the first event; a second pass collects the means' rows where
    the source cannot index them). ``sample_weight``: a weight source aligned with the rows
    (:func:`asp_gmm.fit.sources.as_weights`); ``N`` is then the number of rows."""
    source = as_source(source)
    dtype = np.dtype(dtype)
    shift = s1 = s2 = None
    n, total = 0, 0.0
    wparts = [] if sample_weight is not None else None
    passes = (
        weighted_blocks(source, sample_weight, D, dtype, 1 << 16)
        if sample_weight is not None
        else ((s, b, None) for s, b in blocks(source, D, dtype, 1 << 16))
    )
    for _start, blk, w in passes:
        x = blk.astype(np.float64)
        if shift is None:
            shift = x[0].copy()
            D = x.shape[1]
            s1, c1 = np.zeros(D), np.zeros(D)
            s2, c2 = np.zeros((D, D) if cvtype == "full" else D), np.zeros((D, D) if cvtype == "full" else D)
        y = x - shift
        if w is None:
            _neumaier(s1, c1, y.sum(0))
            _neumaier(s2, c2, y.T @ y if cvtype == "full" else (y * y).sum(0))
            total += x.shape[0]
        else:
            wparts.append(np.array(w, np.float64))
            _neumaier(s1, c1, w @ y)
            _neumaier(s2, c2, (y.T * w) @ y if cvtype == "full" else w @ (y * y))
            total += float(w.sum())
        n += x.shape[0]
    s1, s2 = s1 + c1, s2 + c2
    wall = np.concatenate(wparts) if wparts is not None else None
    positive = n if wall is None else int(np.count_nonzero(wall))
    if positive < M:
        what = "events" if wall is None else "events of positive sample_weight"
        raise StreamError(
            f"the source has N={positive} {what}, fewer than the M={M} components; use fewer components or more data"
        )
    _m1, cov = moments_from_sums(total, s1, s2, cvtype)
    idx = event_index(n, M, rng_seed, wall)
    rows = source.rows(idx) if source.n_rows == n else None
    if rows is None:
        rows = np.empty((M, D), dtype)
        for start, blk in blocks(source, D, dtype, 1 << 16):
            for j in np.nonzero((idx >= start) & (idx < start + blk.shape[0]))[0]:
                rows[j] = blk[idx[j] - start]
    means = np.asarray(rows, dtype)
    return n, means, covariances(cov, M, cvtype, reg_covar)
