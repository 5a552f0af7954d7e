"""Float64 NumPy reference for every EM phase: the oracle each compiled variant is tested against.

This module imports nothing of the project. Its conventions are the project's conventions:

* ``X`` is ``(N, D)``; ``weights`` is ``(M,)``; ``means`` is ``(M, D)``; ``covars`` is ``(M, D, D)``
  for ``cvtype="full"`` and ``(M, D)`` for ``cvtype="diag"``.
* ``prec_chol`` is the upper-triangular Cholesky factor ``U`` of each precision matrix
  (``inv(covar) = U @ U.T``), ``(M, D, D)`` or ``(M, D)`` for diagonal; scikit-learn calls it
  ``precisions_cholesky_``.
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
            "components, or scale/standardise the data.")


class NonFiniteError(FloatingPointError, ValueError):
    """The log-likelihood or a parameter became NaN or infinite.

    The package raises :class:`asp_gmm.errors.NonFiniteError`, a subclass of this one.
    """


def precision_cholesky(covars, cvtype: str, reg_covar: float | None = None, cond_limit: float = 1e15):
    """Upper Cholesky factors of the precision matrices.

    Parameters
    ----------
    covars : ndarray, (M, D, D) for "full" or (M, D) for "diag"
    cvtype : {"full", "diag"}
    reg_covar : float, optional
        Only used in the error message.
    cond_limit : float
        A covariance whose squared Cholesky pivot ratio exceeds this is reported as singular.

    Returns
    -------
    prec_chol : ndarray, same shape as ``covars``
    log_det : ndarray, (M,)
        ``log det(U)`` = ``-0.5 * log det(covar)`` for each component.
    """
    covars = np.asarray(covars, dtype=np.float64)
    if cvtype == "diag":
        if not np.all(np.isfinite(covars)) or np.any(covars <= 0):
            bad = int(np.argmax(~np.isfinite(covars).all(1) | (covars <= 0).any(1)))
            raise NotPositiveDefiniteError(bad, reg_covar, "a variance is zero, negative or not finite")
        ratio = covars.max(1) / covars.min(1)
        if np.any(ratio > cond_limit):
            raise NotPositiveDefiniteError(int(np.argmax(ratio)), reg_covar, "condition number too large")
        prec = 1.0 / np.sqrt(covars)
        return prec, np.log(prec).sum(1)
    M, D, _ = covars.shape
    prec = np.empty_like(covars)
    log_det = np.empty(M)
    for k in range(M):
        try:
            L = np.linalg.cholesky(covars[k])
        except np.linalg.LinAlgError:
            raise NotPositiveDefiniteError(k, reg_covar, "Cholesky factorisation failed") from None
        d = np.diag(L)
        if not np.all(np.isfinite(L)) or (d.max() / d.min()) ** 2 > cond_limit:
            raise NotPositiveDefiniteError(k, reg_covar, "condition number too large")
        Linv = np.linalg.solve(L, np.eye(D))  # lower triangular
        prec[k] = Linv.T
        log_det[k] = -np.log(d).sum()
    return prec, log_det


def log_gaussian_prob(X, means, prec_chol, log_det, cvtype: str):
    """Per-event, per-component Gaussian log-density (without the weights).

    Parameters
    ----------
    X : ndarray, (N, D)
    means : ndarray, (M, D)
    prec_chol : ndarray, (M, D, D) or (M, D)
    log_det : ndarray, (M,)
    cvtype : {"full", "diag"}

    Returns
    -------
    ndarray, (N, M)
    """
    X = np.asarray(X, dtype=np.float64)
    N, D = X.shape
    M = means.shape[0]
    maha = np.empty((N, M))
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


def estep(X, weights, means, covars, cvtype: str, reg_covar: float | None = None):
    """E-step: per-event log-likelihood and posteriors.

    Parameters
    ----------
    X : ndarray, (N, D)
    weights : ndarray, (M,)
    means : ndarray, (M, D)
    covars : ndarray, (M, D, D) or (M, D)
    cvtype : {"full", "diag"}

    Returns
    -------
    logprob : ndarray, (N,)
        ``log sum_k w_k N(x_n | mu_k, Sigma_k)``.
    resp : ndarray, (N, M)
        Posterior probability of each component for each event; rows sum to one.
    """
    prec, log_det = precision_cholesky(covars, cvtype, reg_covar)
    with np.errstate(divide="ignore"):
        lw = np.log(np.asarray(weights, dtype=np.float64))
    lp = log_gaussian_prob(X, np.asarray(means, np.float64), prec, log_det, cvtype) + lw
    logprob = logsumexp_rows(lp)
    resp = np.exp(lp - logprob[:, None])
    return logprob, resp


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


def covariance(X, resp, nk, means, cvtype: str, reg_covar: float, prev_covars=None):
    """M-step, second part: covariances around the *new* means (two-pass, robust to offsets).

    Parameters
    ----------
    X : ndarray, (N, D)
    resp : ndarray, (N, M)
    nk : ndarray, (M,)
    means : ndarray, (M, D)
    cvtype : {"full", "diag"}
    reg_covar : float
        Added to every diagonal element.
    prev_covars : ndarray, optional
        Kept for empty components.

    Returns
    -------
    ndarray, (M, D, D) or (M, D)
    """
    X = np.asarray(X, dtype=np.float64)
    M, D = means.shape
    if cvtype == "full":
        out = np.empty((M, D, D))
        for k in range(M):
            diff = X - means[k]
            out[k] = (resp[:, k] * diff.T) @ diff / nk[k]
            out[k].flat[:: D + 1] += reg_covar
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
    """Whole M-step. Returns ``(weights (M,), means (M, D), covars)``."""
    nk, weights, means = mstep_weights_means(X, resp, prev_means)
    covars = covariance(X, resp, nk, means, cvtype, reg_covar, prev_covars)
    return weights, means, covars


def change_per_event(new_loglik: float, old_loglik: float, N: int) -> float:
    """Change of the mean per-event log-likelihood between two iterations (totals over ``N`` events)."""
    return (new_loglik - old_loglik) / N


def converged(iters: int, min_iters: int, change: float, tol: float) -> bool:
    """The convergence rule of every EM loop of the project: at least ``min_iters`` iterations done and
    ``|change|`` (of the mean per-event log-likelihood, :func:`change_per_event`) below ``tol``.

    The compiled loops use the same rule (``ASP_EM_CONVERGED`` in ``variants/em_rule.h.j2``).
    """
    return iters >= min_iters and abs(change) < tol


def em(X, weights, means, covars, cvtype: str, reg_covar: float = 1e-6,
       min_iters: int = 1, max_iters: int = 10, tol: float = 1e-3):
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
    return dict(weights=weights, means=means, covars=covars, loglik=ll, iters=iters,
                converged=done, logprob=logprob, resp=resp)
