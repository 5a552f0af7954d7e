"""The drop-in's float64 NumPy numerics: the reference (:mod:`asp_gmm.reference`) with scikit-learn's
conventions (upper Cholesky factor U of each precision, inv(cov) = U U^T), scikit-learn's error rule
and message, and the M-step from soft or hard responsibilities (initialisation). Every covariance
type's EM loop runs on the specialized backends (:mod:`asp_gmm.fit.dropin`).
"""

from __future__ import annotations

import numpy as np

from .. import reference as ref
from ..blas import one_blas_thread

#: scikit-learn's message for a covariance that cannot be factored.
ILL_DEFINED = (
    "Fitting the mixture model failed because some components have ill-defined empirical covariance "
    "(for instance caused by singleton or collapsed samples). Try to decrease the number of "
    "components, increase reg_covar, or scale the input data."
)


def precision_cholesky(cov, cvtype, D):
    """scikit-learn's ``precisions_cholesky_`` of covariances, float64, same shape as ``cov``.

    As scikit-learn, only a failed factorisation (or a variance that is not positive) is an error:
    a ValueError with scikit-learn's message. ``D`` is the number of features."""
    try:
        return ref.precision_cholesky(cov, cvtype, cond_limit=None, n_features=D)[0]
    except ref.NotPositiveDefiniteError:
        raise ValueError(ILL_DEFINED) from None


def estep(X, weights, means, prec_chol, cvtype):
    """``(log p(x) (N,), responsibilities (N, M))`` of float64 X under the given factors."""
    return ref.estep_cholesky(X, weights, means, prec_chol, cvtype)


def estimate_params(X, resp, reg, cvtype):
    """Counts ``nk`` (M,) (unnormalised weights), means (M, D) and covariances from soft
    responsibilities (N, M): scikit-learn's M-step (no empty-component rule)."""
    nk, _, means = ref.mstep_weights_means(X, resp)
    return nk, means, ref.covariance(X, resp, nk, means, cvtype, reg)


def label_params(X, labels, M, reg, cvtype):
    """As :func:`_estimate_params` for 0/1 responsibilities (component k owns the events labelled
    k; any other label owns nothing), in O(N D^2) instead of O(N M D^2)."""
    with one_blas_thread():
        return ref.mstep_from_labels(X, labels, M, cvtype, reg)


def one_hot_params(X, idx, reg, cvtype):
    """Component k owns exactly event ``idx[k]`` (k-means++, random_from_data)."""
    idx = np.asarray(idx)
    M = len(idx)
    if np.unique(idx).size == M:
        labels = np.full(X.shape[0], -1, dtype=np.intp)
        labels[idx] = np.arange(M)
        nk, means, cov = label_params(X, labels, M, reg, cvtype)
        # Start where scikit-learn starts. The exact variance of a one-event component is reg_covar;
        # scikit-learn's one-pass formula E[x^2] - mean^2 leaves about 10 eps x^2 in it, which next to a
        # reg_covar of 1e-6 steers the first iterations. Its "tied" formula counts every event's
        # scatter, owned or not (the total scatter of X over M, not reg_covar).
        if cvtype in ("diag", "spherical"):
            x = X[idx]
            cov = x * x / nk[:, None] - means**2 + reg
            cov = cov if cvtype == "diag" else cov.mean(axis=1)
        elif cvtype == "tied":
            cov = (X.T @ X - (nk * means.T) @ means) / nk.sum()
            cov.flat[:: X.shape[1] + 1] += reg
        return nk, means, cov
    resp = np.zeros((X.shape[0], M))  # an event drawn twice belongs to two components
    resp[idx, np.arange(M)] = 1.0
    return estimate_params(X, resp, reg, cvtype)
