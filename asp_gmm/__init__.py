"""asp_gmm: just-in-time specialized Gaussian Mixture Model training.

    from asp_gmm import GMM, compute_distance_BIC
    g = GMM(M, D); loglik = g.train(X)

Under ``train`` a specializer picks a code variant for the problem and device, renders its Jinja2
template to C or CUDA, compiles it and caches it, and runs the whole EM loop in compiled code.
"""

import importlib.util as _importlib_util

from ._version import __version__  # noqa: F401  (setup.cfg's version, read from the installed metadata)

from .errors import (  # noqa: E402,F401
    ASPGMMError,
    BatchMemberError,
    CompileError,
    NonFiniteError,
    NotPositiveDefiniteError,
)
from .gmm import GMM, compute_distance_BIC, freeze, prepare  # noqa: E402
from .gmm_batch import GMMBatch  # noqa: E402
from .many import Concat, Rows, compute_distance_BIC_many, prepare_many, score_many, train_many  # noqa: E402


def _sklearn_installed() -> bool:
    try:
        return _importlib_util.find_spec("sklearn") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules["sklearn"] is None (blocked)
        return False


#: ``GaussianMixture`` (the scikit-learn drop-in) is listed only where scikit-learn is installed, so
#: that ``from asp_gmm import *`` works without it; ``asp_gmm.GaussianMixture`` then says what to install.
__all__ = [
    "GMM",
    "compute_distance_BIC",
    "prepare",
    "freeze",
    "train_many",
    "GMMBatch",
    "Concat",
    "Rows",
    "score_many",
    "compute_distance_BIC_many",
    "prepare_many",
    "ASPGMMError",
    "BatchMemberError",
    "CompileError",
    "NonFiniteError",
    "NotPositiveDefiniteError",
    "__version__",
] + (["GaussianMixture"] if _sklearn_installed() else [])


def __getattr__(name):
    # the scikit-learn drop-in imports scikit-learn lazily (optional dependency)
    if name == "GaussianMixture":
        from .sklearn_api import GaussianMixture

        return GaussianMixture
    raise AttributeError(f"module 'asp_gmm' has no attribute {name!r}")
