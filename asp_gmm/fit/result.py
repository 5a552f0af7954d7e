"""What a fit returns (:class:`TrainResult`): the parameters, the log-likelihood and its trace, the
iterations, whether it converged, and which configuration ran and why. Every entry (in memory,
streamed, distributed) returns this one type."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class TrainResult:
    """Outcome of :meth:`Specializer.train`.

    Attributes
    ----------
    weights : ndarray (M,); means : ndarray (M, D); covars : ndarray (M, D, D) or (M, D)
        Final parameters, float64.
    loglik : float
        Total log-likelihood of X under the final parameters.
    iters : int
    converged : bool
    variant : str
        Label of the configuration that ran the bulk of the iterations (or the last explored one).
    explored : list of str
        Configurations tried for one iteration each.
    reason : str
        Why the selector chose it ("history", "predicted", "rule", "pinned", ...).
    why : str
        What the choice rested on, in one line (measured times, the predictor and its
        leave-one-out score, pruned candidates, the tunable search).
    seconds : float
        Wall time of the call inside the specializer.
    loglik_trace : list of float
        Log-likelihood before the first iteration and after each (``iters + 1`` values).
    n_events : int
        Events trained on (0: ``problem.N``; a streamed fit counts what its source yielded).
    weight_sum : float
        The total sample weight of a weighted fit (0.0: unweighted); the log-likelihoods are sums of
        weighted per-event values, so ``loglik / weight_sum`` is the weighted mean.
    """

    weights: np.ndarray
    means: np.ndarray
    covars: np.ndarray
    loglik: float
    iters: int
    converged: bool
    variant: str
    explored: list
    reason: str
    seconds: float
    loglik_trace: list
    why: str = ""
    n_events: int = 0
    weight_sum: float = 0.0
