"""What :func:`asp_gmm.dask.fit` returns (:class:`DaskFitResult`) and raises."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import ASPGMMError


class DaskInputError(ASPGMMError, ValueError):
    """What was passed to :func:`asp_gmm.dask.fit` cannot be trained on; the message says why."""


class WorkersLostError(ASPGMMError, RuntimeError):
    """Workers were lost more often than ``max_restarts`` allows; the message says how to go on."""


@dataclass
class DaskFitResult:
    """Outcome of :func:`fit`.

    Attributes
    ----------
    weights : ndarray (M,); means : ndarray (M, D); covars : ndarray (M, D, D) or (M, D)
        Final parameters, float64.
    loglik : float
        Total (weighted) log-likelihood of X under the final parameters.
    iters : int
    converged : bool
    n_events : int
        Rows of X.
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
    variant : str
        The covariance configuration the first loop's worker chose (its label).
    compute_seconds : list of float
        Per pass, the slowest loop's time in its statistics (the rest of ``pass_seconds`` is
        communication, the sum and the M-step).
    """

    weights: np.ndarray
    means: np.ndarray
    covars: np.ndarray
    loglik: float
    iters: int
    converged: bool
    n_events: int
    loglik_trace: list = field(default_factory=list)
    pass_seconds: list = field(default_factory=list)
    seconds: float = 0.0
    workers: int = 0
    restarts: int = 0
    loads: int = 0
    weight_total: float = 0.0
    variant: str = ""
    compute_seconds: list = field(default_factory=list)
