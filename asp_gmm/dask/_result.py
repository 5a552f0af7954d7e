"""What :func:`asp_gmm.dask.fit` returns (:class:`DaskFitResult`) and raises, and the checks of its
inputs (:class:`DaskInputError` naming the problem)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

from ..errors import ASPGMMError
from ..fit.result import TrainResult


class DaskInputError(ASPGMMError, ValueError):
    """What was passed to :func:`asp_gmm.dask.fit` cannot be trained on; the message says why."""


class WorkersLostError(ASPGMMError, RuntimeError):
    """Workers were lost more often than ``max_restarts`` allows; the message says how to go on."""


@dataclass
class DaskFitResult(TrainResult):
    """Outcome of :func:`fit`: the one :class:`~asp_gmm.fit.result.TrainResult` of every entry,
    with what a distributed fit adds (the passes' times, the workers, restarts and loads).

    Attributes
    ----------
    weights : ndarray (M,); means : ndarray (M, D); covars : ndarray (M, D, D) or (M, D)
        Final parameters, float64.
    loglik : float
        Total (weighted) log-likelihood of X under the final parameters.
    iters : int
    converged : bool
    variant : str
        The covariance configuration the first loop's worker chose (its label).
    explored : list of str
        Empty: the loops explore nothing.
    reason : str
        Why the first loop's worker chose its configuration ("history", "rule", "pinned", ...).
    n_events : int
        Rows of X.
    weight_sum : float
        Sum of ``sample_weight`` (0.0 without it, as :class:`TrainResult` says).
    loglik_trace : list of float
        Before the first iteration and after each (``iters + 1`` values).
    pass_seconds : list of float
        Wall time of each pass on the client (requests out, statistics on the workers, sum, M-step).
    seconds : float
    workers : int
        Loops (one per worker holding blocks of X) in the last generation.
    restarts : int
        Times the loops were started again after a worker was lost.
    loads : int
        Blocks validated and stored (uploaded to a GPU) by the loops: the number of blocks per
        generation, never per pass.
    weight_total : float
        Sum of ``sample_weight`` (``n_events`` without it).
    compute_seconds : list of float
        Per pass, the slowest loop's time in its statistics (the rest of ``pass_seconds`` is
        communication, the sum and the M-step).
    """

    pass_seconds: list = field(default_factory=list)
    workers: int = 0
    restarts: int = 0
    loads: int = 0
    weight_total: float = 0.0
    compute_seconds: list = field(default_factory=list)


def _dask():
    try:
        import dask
        import dask.array as da
        import distributed
    except ImportError as exc:  # pragma: no cover - the extra is installed where this is used
        raise ImportError(f"asp_gmm.dask needs dask and distributed: pip install 'asp_gmm[dask]' ({exc})") from exc
    return dask, da, distributed


def _check_array(X, D=None):
    _, da, _ = _dask()
    if not isinstance(X, da.Array):
        raise DaskInputError(
            f"asp_gmm.dask.fit needs a dask.array.Array, got {type(X).__name__}; wrap it with "
            "dask.array.from_array(X, chunks=(rows, -1)), or call GMM.train for in-memory data"
        )
    if X.ndim != 2:
        raise DaskInputError(f"X must be 2-D (N events, D dimensions), got shape {X.shape}")
    if X.dtype.kind != "f":
        raise DaskInputError(f"X has dtype {X.dtype}; GMM training needs floating-point data: X.astype(np.float32)")
    if D is not None and X.shape[1] != D:
        raise DaskInputError(f"X has {X.shape[1]} dimensions but D={D} was given")
    if any(np.isnan(c) for c in X.chunks[0]):
        raise DaskInputError("X has unknown chunk sizes; call X.compute_chunk_sizes() first")
    if len(X.chunks[1]) > 1:
        X = X.rechunk({1: -1})  # whole rows per block
    return X


def _check_sample_weight(sample_weight, X):
    """``sample_weight`` as a Dask array with X's row chunks (a NumPy array is wrapped)."""
    _, da, _ = _dask()
    if sample_weight is None:
        return None
    if not isinstance(sample_weight, da.Array):
        arr = np.asarray(sample_weight)
        if arr.dtype.kind not in "fiub":
            raise DaskInputError(f"sample_weight has dtype {arr.dtype}; pass numeric weights, one per row of X")
        if arr.shape != (X.shape[0],):
            raise DaskInputError(
                f"sample_weight must be 1-D with one weight per row of X ({X.shape[0]} rows), got shape {arr.shape}"
            )
        sample_weight = da.from_array(arr, chunks=(X.chunks[0],))
    if sample_weight.ndim != 1 or sample_weight.shape[0] != X.shape[0]:
        raise DaskInputError(
            f"sample_weight must be 1-D with one weight per row of X ({X.shape[0]} rows), got shape "
            f"{sample_weight.shape}"
        )
    if sample_weight.dtype.kind not in "fiub":
        raise DaskInputError(f"sample_weight has dtype {sample_weight.dtype}; pass numeric weights")
    if sample_weight.chunks[0] != X.chunks[0]:
        sample_weight = sample_weight.rechunk((X.chunks[0],))
    return sample_weight


def _int_arg(name, val, low):
    if not isinstance(val, numbers.Integral) or isinstance(val, bool) or val < low:
        raise DaskInputError(f"{name} must be an integer >= {low}, got {val!r}")
