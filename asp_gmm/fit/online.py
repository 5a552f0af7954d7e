"""Online (stepwise) EM of the drop-in's ``partial_fit``: the M-step of the running statistics reduced
to the covariance type as scikit-learn reduces its estimates. A batch's statistics are the
per-component ones of the type's kernels ("full" for "tied", "diag" for "spherical"), computed by the
specializer (:func:`asp_gmm.fit.passes.source_stats`)."""

from __future__ import annotations

import numpy as np

from ..errors import NotPositiveDefiniteError
from ..problem import KERNEL_CVTYPE, Problem, per_component
from .numpy_em import ILL_DEFINED, precision_cholesky
from .passes import source_stats
from .stats import reduced_mstep


def online_mstep(stats, means, covars, reg, cvtype):
    """The M-step of the running statistics (per component, of the "full" or "diag" kernels), reduced
    to ``cvtype`` as scikit-learn reduces its estimates: "tied" the count-weighted mean of the full
    covariances, "spherical" each diagonal's mean."""
    M, D = means.shape
    return reduced_mstep(stats, means, per_component(covars, cvtype, M, D), reg, cvtype)


def check_unchanged(est) -> bool:
    """Whether ``est`` is fitted; raises ``ValueError`` when its ``n_components`` or
    ``covariance_type`` changed since (``partial_fit`` continues from the fitted parameters)."""
    if not hasattr(est, "means_"):
        return False
    M, cvtype = est.n_components, est.covariance_type
    M0, D0 = est.means_.shape
    want = {"full": (M, D0, D0), "diag": (M, D0), "tied": (D0, D0), "spherical": (M,)}[cvtype]
    if M0 != M or np.shape(est.covariances_) != want or getattr(est, "_fitted_cvtype", cvtype) != cvtype:
        what, was, now = ("n_components", M0, M) if M0 != M else ("covariance_type", "another", repr(cvtype))
        raise ValueError(
            f"partial_fit(): {what} changed from {was} to {now} since the model was fitted; "
            "call fit() to start over with the new value, or set it back"
        )
    return True


def step(est, Xw, params, sample_weight=None):
    """One ``partial_fit`` step of ``est`` on the batch ``Xw`` (n, D) in the working dtype from
    ``params`` (float64 weights, means, covariances): the batch's statistics per unit of weight
    (the per-component ones of the "full" or "diag" kernels; "tied" and "spherical" are reduced in
    the M-step), mixed into ``est``'s running ones (they become them on the first batch, or the
    first after ``fit``), then the M-step. Returns ``(new params, the batch's statistics)``."""
    w, mu, cv = params
    n, D = Xw.shape
    M, cvtype, reg = est.n_components, est.covariance_type, float(est.reg_covar)
    try:
        prob = Problem(n, D, M, KERNEL_CVTYPE[cvtype], Xw.dtype.name)
        cvk = per_component(cv, cvtype, M, D)
        st = source_stats(est._specializer(prob), Xw, prob, w, mu, cvk, reg, sample_weight=sample_weight)
        st = st.scaled(1.0 / st.n)
        if not hasattr(est, "_online_stats"):
            est._online_stats, est._online_steps = st, 0
        else:
            est._online_steps += 1
            rho = (float(est.online_t0) + est._online_steps) ** -float(est.online_kappa)
            est._online_stats = est._online_stats.recentred(st.centre).scaled(1.0 - rho).add(st.scaled(rho))
        new = online_mstep(est._online_stats, mu, cv, reg, cvtype)
        precision_cholesky(new[2], cvtype, D)
    except (NotPositiveDefiniteError, FloatingPointError) as exc:
        raise ValueError(f"{ILL_DEFINED} ({exc})") from exc
    return new, st
