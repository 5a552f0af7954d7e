"""The drop-in's checks of its parameters and sample weights, with scikit-learn's messages."""

from __future__ import annotations

import numpy as np

from . import sources


def _check_array(a, **kw):
    from sklearn.utils import check_array

    return check_array(a, **kw)


def _sample_weight(sample_weight, n, M):
    """``sample_weight`` checked (:func:`asp_gmm.fit.sources.check_weights`, messages naming it)
    with at least ``M`` positive weights."""
    return sources.require_positive(sources.check_weights(sample_weight, n), M, "n_components = {M}")


def _check_shape(param, shape, name):
    if param.shape != shape:
        raise ValueError("The parameter '%s' should have the shape of %s, but got %s" % (name, shape, param.shape))


def _check_weights(weights, M):
    weights = _check_array(weights, dtype=[np.float64, np.float32], ensure_2d=False)
    _check_shape(weights, (M,), "weights")
    if np.any(weights < 0.0) or np.any(weights > 1.0):
        raise ValueError(
            "The parameter 'weights' should be in the range [0, 1], but got max value "
            "%.5f, min value %.5f" % (np.min(weights), np.max(weights))
        )
    atol = 1e-6 if weights.dtype == np.float32 else 1e-8
    if not np.allclose(np.abs(1.0 - np.sum(weights)), 0.0, atol=atol):
        raise ValueError("The parameter 'weights' should be normalized, but got sum(weights) = %.5f" % np.sum(weights))
    return weights


def _check_means(means, M, D):
    means = _check_array(means, dtype=[np.float64, np.float32], ensure_2d=False)
    _check_shape(means, (M, D), "means")
    return means


def _check_precisions(precisions, cvtype, M, D):
    precisions = _check_array(precisions, dtype=[np.float64, np.float32], ensure_2d=False, allow_nd=cvtype == "full")
    shapes = {"full": (M, D, D), "tied": (D, D), "diag": (M, D), "spherical": (M,)}
    _check_shape(precisions, shapes[cvtype], "%s precision" % cvtype)
    if cvtype in ("diag", "spherical"):
        if np.any(precisions <= 0.0):
            raise ValueError("'%s precision' should be positive" % cvtype)
    else:
        mats = precisions if cvtype == "full" else precisions[None]
        if not (np.allclose(mats, np.swapaxes(mats, -1, -2)) and np.all(np.linalg.eigvalsh(mats) > 0.0)):
            raise ValueError("'%s precision' should be symmetric, positive-definite" % cvtype)
    return precisions


def _working_dtype(dtype, X_dtype) -> np.dtype:
    if dtype is None:
        return np.dtype(np.float32) if X_dtype == np.float32 else np.dtype(np.float64)
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(
            f"The 'dtype' parameter of GaussianMixture must be None, 'float32' or 'float64'. Got {dtype!r} instead."
        )
    return dt
