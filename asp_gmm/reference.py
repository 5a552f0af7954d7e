"""Float64 NumPy reference for every EM phase: the oracle each compiled variant is tested against.

This module imports nothing of the project. Its conventions are the project's conventions:

* ``X`` is ``(N, D)``; ``weights`` is ``(M,)``; ``means`` is ``(M, D)``; ``covars`` is ``(M, D, D)``
  for ``cvtype="full"``, ``(D, D)`` for ``"tied"`` (one matrix shared by every component),
  ``(M, D)`` for ``"diag"`` and ``(M,)`` for ``"spherical"`` (one variance per component), as
  scikit-learn's ``covariance_type``. The compiled backends run "full" and "diag"; scikit-learn's
  drop-in (:mod:`asp_gmm.sklearn_api`) runs all four through this module.
* ``prec_chol`` is the upper-triangular Cholesky factor ``U`` of each precision matrix
  (``inv(covar) = U @ U.T``), of the same shape as ``covars`` (for "diag" and "spherical" it is
  ``1 / sqrt(covars)``); scikit-learn calls it ``precisions_cholesky_``.
* One EM iteration is an M-step followed by the E-step of the new parameters, so that the
  log-likelihood returned by :func:`em` is the one of the *final* parameters (as in the original
  PyCASP specializer). After ``k`` iterations the parameters equal scikit-learn's
  ``GaussianMixture(max_iter=k)`` started from the same parameters.
* Empty components: the effective count of a component is ``nk = sum_n resp[n, k] + 10 * eps``
  (scikit-learn's rule, so a component never divides by zero). A component whose raw count is below
  :data:`EMPTY_COMPONENT_EVENTS` keeps its previous mean and covariance (instead of collapsing onto the
  origin with a covariance of ``reg_covar``); its weight becomes tiny but finite.
"""

from __future__ import annotations

import math

import numpy as np

#: A component with less total responsibility than this is treated as empty (see module docstring).
EMPTY_COMPONENT_EVENTS = 1e-6

LOG_2PI = math.log(2.0 * math.pi)
_TINY_COUNT = 10.0 * np.finfo(np.float64).eps


class NotPositiveDefiniteError(np.linalg.LinAlgError, ValueError):
    """A covariance matrix is not (numerically) positive definite.

    Attributes
    ----------
    component : int
        Index of the offending component.
    reg_covar, detail
        What the message was built from.

    The package raises :class:`asp_gmm.errors.NotPositiveDefiniteError`, a subclass of this one that
    also derives from :class:`asp_gmm.errors.ASPGMMError` (this module imports nothing of the project).
    """

    def __init__(self, component: int, reg_covar: float | None = None, detail: str = ""):
        self.component, self.reg_covar, self.detail = component, reg_covar, detail
        reg = f" (now {reg_covar:g})" if reg_covar is not None else ""
        super().__init__(
            f"covariance of component {component} is not positive definite or is numerically "
            f"singular{(': ' + detail) if detail else ''}. Increase reg_covar{reg}, use fewer "
            "components, or scale/standardise the data."
        )


class NonFiniteError(FloatingPointError, ValueError):
    """The log-likelihood or a parameter became NaN or infinite.

    The package raises :class:`asp_gmm.errors.NonFiniteError`, a subclass of this one.
    """


#: scikit-learn's covariance types; the compiled backends run "full" and "diag".
COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")


def _check_cvtype(cvtype: str) -> None:
    if cvtype not in COVARIANCE_TYPES:
        raise ValueError(f"cvtype must be one of {COVARIANCE_TYPES}, got {cvtype!r}")


def inv_lower_triangular(L):
    """Inverses of lower-triangular matrices by forward substitution.

    Parameters
    ----------
    L : ndarray, (..., D, D)
        Lower triangular, non-zero diagonal.

    Returns
    -------
    ndarray, (..., D, D), lower triangular.

    (A loop over rows in NumPy: LAPACK's triangular solvers go through multi-threaded BLAS, which on
    small matrices can be orders of magnitude slower on a loaded machine.)
    """
    D = L.shape[-1]
    out = np.zeros_like(L)
    for i in range(D):
        row = -np.einsum("...j,...jk->...k", L[..., i, :i], out[..., :i, :])
        row[..., i] += 1.0
        out[..., i, :] = row / L[..., i, i, None]
    return out


def precision_cholesky(
    covars, cvtype: str, reg_covar: float | None = None, cond_limit: float | None = 1e15, n_features: int | None = None
):
    """Upper Cholesky factors of the precision matrices.

    Parameters
    ----------
    covars : ndarray, (M, D, D) "full", (D, D) "tied", (M, D) "diag" or (M,) "spherical"
    cvtype : {"full", "tied", "diag", "spherical"}
    reg_covar : float, optional
        Only used in the error message.
    cond_limit : float or None
        A covariance whose squared Cholesky pivot ratio (the ratio of its extreme variances for
        "diag") exceeds this is reported as singular; ``None`` reports only a failed factorisation
        or a variance that is not positive (scikit-learn's rule).
    n_features : int, optional
        ``D``; needed for the log-determinant of "spherical" only.

    Returns
    -------
    prec_chol : ndarray, same shape as ``covars``
    log_det : ndarray (M,), or a float for "tied"
        ``log det(U)`` = ``-0.5 * log det(covar)`` for each component.

    Raises
    ------
    NotPositiveDefiniteError
        Naming the first offending component (0 for "tied").
    """
    _check_cvtype(cvtype)
    covars = np.asarray(covars, dtype=np.float64)
    if cvtype in ("diag", "spherical"):
        var = covars if cvtype == "diag" else covars[:, None]
        bad = ~np.isfinite(var).all(1) | (var <= 0).any(1)
        if bad.any():
            raise NotPositiveDefiniteError(int(np.argmax(bad)), reg_covar, "a variance is zero, negative or not finite")
        if cond_limit is not None:
            ratio = var.max(1) / var.min(1)
            if np.any(ratio > cond_limit):
                raise NotPositiveDefiniteError(int(np.argmax(ratio)), reg_covar, "condition number too large")
        prec = 1.0 / np.sqrt(covars)
        if cvtype == "diag":
            return prec, np.log(prec).sum(1)
        if n_features is None:
            raise ValueError("precision_cholesky of 'spherical' covariances needs n_features (D) for the log-det")
        return prec, log_det_cholesky(prec, cvtype, n_features)
    mats = covars if cvtype == "full" else covars[None]
    try:
        L = np.linalg.cholesky(mats)
    except np.linalg.LinAlgError:
        k = 0
        for k in range(mats.shape[0]):  # which one: factorise them one by one
            try:
                np.linalg.cholesky(mats[k])
            except np.linalg.LinAlgError:
                break
        raise NotPositiveDefiniteError(k, reg_covar, "Cholesky factorisation failed") from None
    d = np.diagonal(L, axis1=1, axis2=2)
    finite = np.isfinite(L).all(axis=(1, 2))
    if not finite.all():
        raise NotPositiveDefiniteError(int(np.argmin(finite)), reg_covar, "the factor is not finite")
    if cond_limit is not None:
        ratio = (d.max(1) / d.min(1)) ** 2
        if np.any(ratio > cond_limit):
            raise NotPositiveDefiniteError(int(np.argmax(ratio)), reg_covar, "condition number too large")
    prec = np.swapaxes(inv_lower_triangular(L), 1, 2)
    log_det = -np.log(d).sum(1)
    if cvtype == "tied":
        return prec[0], float(log_det[0])
    return prec, log_det


def log_det_cholesky(prec_chol, cvtype: str, n_features: int):
    """``log det(U)`` of precision factors: ``(M,)``, or a float for "tied".

    Parameters
    ----------
    prec_chol : ndarray, (M, D, D), (D, D), (M, D) or (M,)
    cvtype : {"full", "tied", "diag", "spherical"}
    n_features : int
        ``D`` (a spherical factor is ``D`` equal diagonal entries).
    """
    _check_cvtype(cvtype)
    pc = np.asarray(prec_chol, dtype=np.float64)
    if cvtype == "full":
        return np.log(np.diagonal(pc, axis1=1, axis2=2)).sum(1)
    if cvtype == "tied":
        return float(np.log(np.diag(pc)).sum())
    if cvtype == "diag":
        return np.log(pc).sum(1)
    return n_features * np.log(pc)


def precision_cholesky_from_precisions(precisions, cvtype: str):
    """Upper factors ``U`` with ``U @ U.T = precisions`` (the Cholesky factor of the row- and
    column-reversed matrix, reversed back), same shape as ``precisions``."""
    _check_cvtype(cvtype)
    p = np.asarray(precisions, dtype=np.float64)
    if cvtype in ("full", "tied"):
        return np.linalg.cholesky(p[..., ::-1, ::-1])[..., ::-1, ::-1]
    return np.sqrt(p)


def covariances_from_precision_cholesky(prec_chol, cvtype: str):
    """Covariances ``inv(U @ U.T)`` (symmetrised for "full" and "tied"), same shape as ``prec_chol``."""
    _check_cvtype(cvtype)
    pc = np.asarray(prec_chol, dtype=np.float64)
    if cvtype in ("full", "tied"):
        W = inv_lower_triangular(np.swapaxes(pc, -1, -2))  # inv(U.T); the covariance is W @ W.T
        cov = W @ np.swapaxes(W, -1, -2)
        return 0.5 * (cov + np.swapaxes(cov, -1, -2))
    return 1.0 / (pc * pc)


def precisions_from_cholesky(prec_chol, cvtype: str):
    """Precisions ``U @ U.T``, same shape as ``prec_chol``."""
    _check_cvtype(cvtype)
    pc = np.asarray(prec_chol, dtype=np.float64)
    if cvtype in ("full", "tied"):
        return pc @ np.swapaxes(pc, -1, -2)
    return pc * pc


def log_gaussian_prob(X, means, prec_chol, log_det, cvtype: str):
    """Per-event, per-component Gaussian log-density (without the weights).

    Parameters
    ----------
    X : ndarray, (N, D)
    means : ndarray, (M, D)
    prec_chol : ndarray, (M, D, D), (D, D), (M, D) or (M,)
    log_det : ndarray (M,) or float
    cvtype : {"full", "tied", "diag", "spherical"}

    Returns
    -------
    ndarray, (N, M)
    """
    _check_cvtype(cvtype)
    X = np.asarray(X, dtype=np.float64)
    means = np.asarray(means, dtype=np.float64)
    N, D = X.shape
    M = means.shape[0]
    maha = np.empty((N, M))
    if cvtype == "tied":  # one factor: project the events once
        XU, muU = X @ prec_chol, means @ prec_chol
        for k in range(M):
            y = XU - muU[k]
            maha[:, k] = np.einsum("nd,nd->n", y, y)
    elif cvtype == "spherical":  # one precision per component: squared distances, scaled
        for k in range(M):
            diff = X - means[k]
            maha[:, k] = np.einsum("nd,nd->n", diff, diff) * prec_chol[k] ** 2
    else:
        for k in range(M):
            diff = X - means[k]
            y = diff @ prec_chol[k] if cvtype == "full" else diff * prec_chol[k]
            maha[:, k] = np.einsum("nd,nd->n", y, y)
    return -0.5 * (D * LOG_2PI + maha) + log_det


def logsumexp_rows(a):
    """Row-wise log-sum-exp of an (N, M) array: returns (N,)."""
    mx = a.max(axis=1)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    return mx + np.log(np.exp(a - mx[:, None]).sum(axis=1))


def estep_cholesky(X, weights, means, prec_chol, cvtype: str, log_det=None):
    """E-step from precision factors: per-event log-likelihood and posteriors.

    Parameters
    ----------
    X : ndarray, (N, D)
    weights : ndarray, (M,)
    means : ndarray, (M, D)
    prec_chol : ndarray, (M, D, D), (D, D), (M, D) or (M,)
    cvtype : {"full", "tied", "diag", "spherical"}
    log_det : ndarray (M,) or float, optional
        ``log det(U)``; computed from ``prec_chol`` when not given.

    Returns
    -------
    logprob : ndarray, (N,)
        ``log sum_k w_k N(x_n | mu_k, Sigma_k)``.
    resp : ndarray, (N, M)
        Posterior probability of each component for each event; rows sum to one.
    """
    X = np.asarray(X, dtype=np.float64)
    if log_det is None:
        log_det = log_det_cholesky(prec_chol, cvtype, X.shape[1])
    with np.errstate(divide="ignore"):
        lw = np.log(np.asarray(weights, dtype=np.float64))
    lp = log_gaussian_prob(X, means, prec_chol, log_det, cvtype) + lw
    logprob = logsumexp_rows(lp)
    resp = np.exp(lp - logprob[:, None])
    return logprob, resp


def estep(X, weights, means, covars, cvtype: str, reg_covar: float | None = None):
    """E-step: per-event log-likelihood and posteriors.

    Parameters
    ----------
    X : ndarray, (N, D)
    weights : ndarray, (M,)
    means : ndarray, (M, D)
    covars : ndarray, (M, D, D), (D, D), (M, D) or (M,)
    cvtype : {"full", "tied", "diag", "spherical"}

    Returns
    -------
    logprob : ndarray, (N,)
        ``log sum_k w_k N(x_n | mu_k, Sigma_k)``.
    resp : ndarray, (N, M)
        Posterior probability of each component for each event; rows sum to one.
    """
    X = np.asarray(X, dtype=np.float64)
    prec, log_det = precision_cholesky(covars, cvtype, reg_covar, n_features=X.shape[1])
    return estep_cholesky(X, weights, np.asarray(means, np.float64), prec, cvtype, log_det)


def mstep_weights_means(X, resp, prev_means=None):
    """M-step, first part: component counts, weights and means.

    Parameters
    ----------
    X : ndarray, (N, D)
    resp : ndarray, (N, M)
    prev_means : ndarray, (M, D), optional
        Kept for components that are empty (see module docstring).

    Returns
    -------
    nk : ndarray, (M,)
        Effective counts ``sum_n resp + 10 eps``.
    weights : ndarray, (M,)
    means : ndarray, (M, D)
    """
    X = np.asarray(X, dtype=np.float64)
    raw = resp.sum(axis=0)
    nk = raw + _TINY_COUNT
    means = (resp.T @ X) / nk[:, None]
    if prev_means is not None:
        empty = raw < EMPTY_COMPONENT_EVENTS
        means[empty] = prev_means[empty]
    return nk, nk / nk.sum(), means


def _tied_covariance(X, owned, nk, means, reg_covar):
    """Pooled within-component covariance ``sum_k sum_n r_nk (x_n - mu_k)(x_n - mu_k)^T / sum_k nk_k``
    plus ``reg_covar I``, (D, D), in O(N D^2): ``sum_n s_n y_n y_n^T - sum_k nk_k v_k v_k^T`` around the
    data's mean c (``y = x - c``, ``v = mu - c``, ``s_n = sum_k r_nk`` the responsibility each event gives
    out), so that an offset of the data costs no precision. Equal to scikit-learn's
    ``(X^T X - sum_k nk_k mu_k mu_k^T) / sum_k nk_k`` whenever every event's responsibilities sum to one
    (always in EM).
    """
    D = X.shape[1]
    c = X.mean(axis=0)
    Y = X - c
    V = means - c
    out = (Y.T * owned) @ Y - (nk * V.T) @ V
    out /= nk.sum()
    out.flat[:: D + 1] += reg_covar
    return out


def covariance(X, resp, nk, means, cvtype: str, reg_covar: float, prev_covars=None):
    """M-step, second part: covariances around the *new* means (two-pass, robust to offsets).

    Parameters
    ----------
    X : ndarray, (N, D)
    resp : ndarray, (N, M)
    nk : ndarray, (M,)
    means : ndarray, (M, D)
    cvtype : {"full", "tied", "diag", "spherical"}
    reg_covar : float
        Added to every diagonal element (to each variance for "spherical").
    prev_covars : ndarray, optional
        Kept for empty components ("full", "diag", "spherical"; the shared "tied" matrix has no
        per-component part to keep).

    Returns
    -------
    ndarray, (M, D, D), (D, D), (M, D) or (M,)
        "spherical" is the mean of the diagonal variances of each component.
    """
    _check_cvtype(cvtype)
    X = np.asarray(X, dtype=np.float64)
    M, D = means.shape
    if cvtype == "tied":
        return _tied_covariance(X, resp.sum(axis=1), nk, means, reg_covar)
    if cvtype == "full":
        out = np.empty((M, D, D))
        for k in range(M):
            diff = X - means[k]
            out[k] = (resp[:, k] * diff.T) @ diff / nk[k]
            out[k].flat[:: D + 1] += reg_covar
    elif cvtype == "spherical":  # the mean of the diagonal variances: squared distances / D
        out = np.empty(M)
        for k in range(M):
            diff = X - means[k]
            out[k] = resp[:, k] @ np.einsum("nd,nd->n", diff, diff) / (nk[k] * D) + reg_covar
    else:
        out = np.empty((M, D))
        for k in range(M):
            diff = X - means[k]
            out[k] = resp[:, k] @ (diff * diff) / nk[k] + reg_covar
    if prev_covars is not None:
        empty = resp.sum(axis=0) < EMPTY_COMPONENT_EVENTS
        out[empty] = prev_covars[empty]
    return out


def mstep(X, resp, prev_means, prev_covars, cvtype: str, reg_covar: float):
    """Whole M-step. Returns ``(weights (M,), means (M, D), covars)`` (covars shaped by ``cvtype``)."""
    nk, weights, means = mstep_weights_means(X, resp, prev_means)
    covars = covariance(X, resp, nk, means, cvtype, reg_covar, prev_covars)
    return weights, means, covars


def mstep_from_labels(X, labels, n_components: int, cvtype: str, reg_covar: float):
    """M-step from hard responsibilities, in O(N D^2) (O(N D) for "diag"/"spherical") instead of
    O(N M D^2): equal to :func:`mstep_weights_means` and :func:`covariance` (without previous
    parameters) of the 0/1 responsibilities ``resp[n, k] = (labels[n] == k)``.

    Parameters
    ----------
    X : ndarray, (N, D)
    labels : ndarray of int, (N,)
        The component owning each event; an event labelled outside ``0 .. n_components - 1``
        (e.g. -1) belongs to none (its responsibilities are all zero).
    n_components : int
    cvtype : {"full", "tied", "diag", "spherical"}
    reg_covar : float

    Returns
    -------
    nk : ndarray, (M,)
        Effective counts (events owned + 10 eps); an empty component has mean 0 and covariance
        ``reg_covar``.
    means : ndarray, (M, D)
    covars : ndarray, (M, D, D), (D, D), (M, D) or (M,)
    """
    _check_cvtype(cvtype)
    X = np.asarray(X, dtype=np.float64)
    labels = np.asarray(labels)
    M, D = int(n_components), X.shape[1]
    order = np.argsort(labels, kind="stable")
    bounds = np.searchsorted(labels[order], np.arange(M + 1))
    parts = [X[order[bounds[k] : bounds[k + 1]]] for k in range(M)]
    nk = np.diff(bounds).astype(np.float64) + _TINY_COUNT
    means = np.stack([p.sum(axis=0) for p in parts]) / nk[:, None] if M else np.empty((0, D))
    if cvtype == "tied":
        owned = ((labels >= 0) & (labels < M)).astype(np.float64)
        return nk, means, _tied_covariance(X, owned, nk, means, reg_covar)
    if cvtype == "full":
        cov = np.empty((M, D, D))
        for k in range(M):
            diff = parts[k] - means[k]
            cov[k] = diff.T @ diff / nk[k]
            cov[k].flat[:: D + 1] += reg_covar
        return nk, means, cov
    cov = np.stack([np.einsum("nd,nd->d", p - mu, p - mu) for p, mu in zip(parts, means)]) / nk[:, None] + reg_covar
    return nk, means, (cov.mean(axis=1) if cvtype == "spherical" else cov)


def change_per_event(new_loglik: float, old_loglik: float, N: int) -> float:
    """Change of the mean per-event log-likelihood between two iterations (totals over ``N`` events)."""
    return (new_loglik - old_loglik) / N


def converged(iters: int, min_iters: int, change: float, tol: float) -> bool:
    """The convergence rule of every EM loop of the project: at least ``min_iters`` iterations done and
    ``|change|`` (of the mean per-event log-likelihood, :func:`change_per_event`) below ``tol``.

    The compiled loops use the same rule (``ASP_EM_CONVERGED`` in ``variants/em_rule.h.j2``).
    """
    return iters >= min_iters and abs(change) < tol


def converged_many(iters, min_iters: int, change, tol: float):
    """:func:`converged` of many loops at once: ``iters`` (int or array) and ``change`` (array, of
    :func:`change_per_event` on arrays) give a boolean array, element by element the same rule."""
    return (np.asarray(iters) >= min_iters) & (np.abs(change) < tol)


def em(
    X,
    weights,
    means,
    covars,
    cvtype: str,
    reg_covar: float = 1e-6,
    min_iters: int = 1,
    max_iters: int = 10,
    tol: float = 1e-3,
):
    """Whole EM loop, as the compiled backends run it.

    Each iteration is an M-step followed by an E-step of the new parameters. The loop stops after
    ``max_iters`` iterations, or after at least ``min_iters`` once the change of the mean per-event
    log-likelihood is below ``tol``.

    Returns
    -------
    dict with ``weights`` (M,), ``means`` (M, D), ``covars``, ``loglik`` (float, total over events
    under the final parameters), ``iters`` (int), ``converged`` (bool), ``logprob`` (N,),
    ``resp`` (N, M).
    """
    X = np.asarray(X, dtype=np.float64)
    N = X.shape[0]
    weights = np.asarray(weights, np.float64)
    means = np.asarray(means, np.float64)
    covars = np.asarray(covars, np.float64)
    logprob, resp = estep(X, weights, means, covars, cvtype, reg_covar)
    ll = float(logprob.sum())
    iters, done = 0, False
    while iters < max_iters:
        weights, means, covars = mstep(X, resp, means, covars, cvtype, reg_covar)
        iters += 1
        logprob, resp = estep(X, weights, means, covars, cvtype, reg_covar)
        new_ll = float(logprob.sum())
        change, ll = change_per_event(new_ll, ll, N), new_ll
        if converged(iters, min_iters, change, tol):
            done = True
            break
    return dict(
        weights=weights, means=means, covars=covars, loglik=ll, iters=iters, converged=done, logprob=logprob, resp=resp
    )
