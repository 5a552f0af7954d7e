"""Online (stepwise) EM of the drop-in's ``partial_fit``: the M-step of the running statistics reduced
to the covariance type as scikit-learn reduces its estimates. A batch's statistics are the
per-component ones of the type's kernels ("full" for "tied", "diag" for "spherical"), computed by the
specializer (:func:`asp_gmm.fit.passes.source_stats`)."""

from __future__ import annotations

from ..problem import per_component
from .stats import reduced_mstep


def online_mstep(stats, means, covars, reg, cvtype):
    """The M-step of the running statistics (per component, of the "full" or "diag" kernels), reduced
    to ``cvtype`` as scikit-learn reduces its estimates: "tied" the count-weighted mean of the full
    covariances, "spherical" each diagonal's mean."""
    M, D = means.shape
    return reduced_mstep(stats, means, per_component(covars, cvtype, M, D), reg, cvtype)
