"""asp_gmm: just-in-time specialized Gaussian Mixture Model training.

    from asp_gmm import GMM, compute_distance_BIC
    g = GMM(M, D); loglik = g.train(X)

Under ``train`` a specializer picks a code variant for the problem and device, renders its Jinja2
template to C or CUDA, compiles and caches it, and runs the whole EM loop in compiled code.
"""
__version__ = "0.1.0"

from .errors import CompileError, NotPositiveDefiniteError  # noqa: E402,F401
from .gmm import GMM, compute_distance_BIC, prepare  # noqa: E402

__all__ = ["GMM", "compute_distance_BIC", "prepare", "CompileError", "NotPositiveDefiniteError", "__version__"]


def __getattr__(name):
    # the scikit-learn drop-in imports scikit-learn lazily (optional dependency)
    if name == "GaussianMixture":
        from .sklearn_api import GaussianMixture
        return GaussianMixture
    raise AttributeError(f"module 'asp_gmm' has no attribute {name!r}")
