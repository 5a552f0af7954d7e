"""Online (stepwise) EM of the drop-in's ``partial_fit``: a batch's statistics for the covariance
types without compiled variants, and the M-step of the running statistics reduced to the covariance
type as scikit-learn reduces its estimates."""

from __future__ import annotations

import numpy as np

from ..backends.base import stats_from_posteriors
from .numpy_em import estep, precision_cholesky
from .stats import SuffStats


def numpy_stats(X, weights, means, covars, cvtype, sample_weight=None):
    """:class:`asp_gmm.SuffStats` of X for "tied" (full second moments) and "spherical"
    (diagonal ones), from the reference's E-step in float64 NumPy."""
    X = np.asarray(X, np.float64)
    lpn, resp = estep(X, weights, means, precision_cholesky(covars, cvtype, X.shape[1]), cvtype)
    kind = "full" if cvtype == "tied" else "diag"
    st = SuffStats(len(weights), X.shape[1], kind, means)
    st.add_block(stats_from_posteriors(X, lpn, resp, means, kind, sample_weight), X.shape[0])
    return st


def online_mstep(stats, means, covars, reg, cvtype):
    """The M-step of the running statistics, reduced to ``cvtype`` as scikit-learn reduces its
    estimates: "tied" the count-weighted mean of the full covariances, "spherical" each diagonal's
    mean."""
    if cvtype in ("full", "diag"):
        return stats.mstep(means, covars, reg)
    D = means.shape[1]
    if cvtype == "tied":
        prev = np.repeat(np.asarray(covars, np.float64)[None], len(means), 0)
    else:
        prev = np.repeat(np.asarray(covars, np.float64)[:, None], D, 1)
    w, mu, cv = stats.mstep(means, prev, 0.0)
    if cvtype == "tied":
        nk = stats.nk + 10 * np.finfo(np.float64).eps
        return w, mu, np.tensordot(nk, cv, 1) / nk.sum() + reg * np.eye(D)
    return w, mu, cv.mean(1) + reg
