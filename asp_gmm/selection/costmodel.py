"""A cost model of each configuration's time per event over problem sizes, fitted to the history.

For one device, cvtype and dtype, every configuration (variant, tunables, source) measured in at
least :data:`MIN_POINTS` problem classes gets a ridge regression of ``ln(seconds per event)`` on
quadratic features of the log-sizes ``(ln N, ln D, ln M)`` (:func:`features`). The prediction for
an unseen shape is the configuration with the lowest predicted time. Pure NumPy on the
aggregates the selector already holds; it imports nothing of the backends.

:func:`loo_accuracy` judges a predictor by leave-one-out over the measured classes (each class
removed in turn, the rest predicting its best configuration): the fraction of classes where the
predicted configuration is within ``tolerance`` of the class's measured best. The selector
(:mod:`asp_gmm.selection`) uses the cost model for unseen shapes only where it scores at least
as well as the nearest-neighbour rule on the same history.
"""

from __future__ import annotations

import math

import numpy as np

#: Classes a configuration must be measured in before it gets a fitted model.
MIN_POINTS = 4
#: Ridge penalty on the non-constant coefficients (log-sizes are O(1..15)).
RIDGE = 1e-2


def features(lnN: float, lnD: float, lnM: float) -> np.ndarray:
    """(10,) features: constant, the three log-sizes, their squares and pairwise products."""
    return np.array([1.0, lnN, lnD, lnM, lnN * lnN, lnD * lnD, lnM * lnM, lnN * lnD, lnN * lnM, lnD * lnM])


class CostModel:
    """Fitted per-configuration models of one (device, cvtype, dtype).

    Parameters
    ----------
    points : dict
        {config key: [(lnN, lnD, lnM, ln seconds per event), ...]}.
    """

    def __init__(self, points: dict):
        self.coef: dict = {}
        #: {config key: measured classes its model rests on} (the evidence pruning asks for)
        self.n: dict = {}
        for k, pts in points.items():
            if len(pts) < MIN_POINTS:
                continue
            A = np.array([features(*p[:3]) for p in pts])
            y = np.array([p[3] for p in pts])
            # centre the features so the ridge does not pull the level towards zero
            mu = A[:, 1:].mean(axis=0)
            sd = A[:, 1:].std(axis=0)
            sd[sd < 1e-9] = 1.0
            Z = (A[:, 1:] - mu) / sd
            ym = y.mean()
            coef = np.linalg.solve(Z.T @ Z + RIDGE * len(y) * np.eye(Z.shape[1]), Z.T @ (y - ym))
            self.coef[k] = (mu, sd, ym, coef)
            self.n[k] = len(pts)

    def predict(self, key, lnN: float, lnD: float, lnM: float) -> float | None:
        """Predicted ln(seconds per event) of configuration ``key``, or None (not modelled)."""
        got = self.coef.get(key)
        if got is None:
            return None
        mu, sd, ym, coef = got
        z = (features(lnN, lnD, lnM)[1:] - mu) / sd
        return float(ym + z @ coef)

    def rank(self, keys, lnN: float, lnD: float, lnM: float) -> list:
        """[(predicted ln seconds per event, key)] of the modelled ``keys``, fastest first."""
        out = [(self.predict(k, lnN, lnD, lnM), k) for k in keys]
        return sorted((p, k) for p, k in out if p is not None)


def _accuracy(classes: dict, choose, tolerance: float) -> tuple:
    """``(fraction, judged)``: over the classes with at least two configurations, how often
    ``choose(index, coords, times)`` names one within ``1 + tolerance`` of the class's best."""
    good = total = 0
    for i, (coords, times) in enumerate(classes.items()):
        if len(times) < 2:
            continue
        total += 1
        choice = choose(i, coords, times)
        if choice is not None and times.get(choice, math.inf) <= (1 + tolerance) * min(times.values()):
            good += 1
    return (good / total if total else 0.0), total


def loo_model_accuracy(classes: dict, tolerance: float = 0.05) -> tuple:
    """:func:`loo_accuracy` of :func:`model_predictor`, computed without refitting every model
    for every fold: removing a class changes only the models of the configurations measured in
    it, and only those configurations are ranked there, so each fold refits just those (one
    small ridge solve each) on feature rows computed once. Linear in the points instead of
    quadratic in the classes (the history of a long-running program has hundreds of classes)."""
    coords = list(classes)
    if not coords:
        return 0.0, 0
    C = np.array(coords, float).reshape(-1, 3)
    lnN, lnD, lnM = C[:, 0], C[:, 1], C[:, 2]
    F = np.stack([lnN, lnD, lnM, lnN * lnN, lnD * lnD, lnM * lnM, lnN * lnD, lnN * lnM, lnD * lnM], axis=1)
    rows: dict = {}  # config key -> ([class indices], [ln seconds per event])
    for i, c in enumerate(coords):
        for k, t in classes[c].items():
            got = rows.setdefault(k, ([], []))
            got[0].append(i)
            got[1].append(math.log(t))
    # every fold of every configuration at once: fold j of configuration k leaves out its j-th
    # class (a (folds, points - 1, 9) stack of the remaining feature rows, then one batched solve);
    # the same arithmetic as refitting each fold alone, without a Python loop over the ~1 500 folds
    # of a history of 150 classes (0.15 s of the first call of a process)
    pred: dict = {}  # (class index, config key) -> predicted ln seconds per event
    for k, (ix, y) in rows.items():
        ix, y = np.array(ix), np.array(y)
        n = len(ix)
        if n - 1 < MIN_POINTS:
            continue
        keep = ~np.eye(n, dtype=bool)
        A = F[ix][np.nonzero(keep)[1]].reshape(n, n - 1, F.shape[1])
        yk = np.broadcast_to(y, (n, n))[keep].reshape(n, n - 1)
        mu, sd = A.mean(axis=1), A.std(axis=1)
        sd[sd < 1e-9] = 1.0
        Z = (A - mu[:, None, :]) / sd[:, None, :]
        ym = yk.mean(axis=1)
        lhs = np.einsum("fpi,fpj->fij", Z, Z) + RIDGE * (n - 1) * np.eye(Z.shape[2])
        rhs = np.einsum("fpi,fp->fi", Z, yk - ym[:, None])
        coef = np.linalg.solve(lhs, rhs[..., None])[..., 0]
        at = ym + np.einsum("fi,fi->f", (F[ix] - mu) / sd, coef)
        for j, i in enumerate(ix.tolist()):
            pred[(i, k)] = float(at[j])

    def choose(i, _coords, times):
        ranked = [(pred[(i, k)], k) for k in times if (i, k) in pred]
        return min(ranked)[1] if ranked else None

    return _accuracy(classes, choose, tolerance)


def loo_nearest_accuracy(classes: dict, tolerance: float = 0.05, neighbours: int = 4, n_weight: float = 0.5) -> tuple:
    """:func:`loo_accuracy` of :func:`nearest_predictor` with the distances computed once (one
    matrix) instead of per fold; the same choices, neighbour order and ties."""
    coords = list(classes)
    if not coords:
        return 0.0, 0
    raw = np.array(coords, float).reshape(-1, 3)
    C = raw * np.array([n_weight, 1.0, 1.0])
    dist = np.sqrt(((C[:, None, :] - C[None, :, :]) ** 2).sum(axis=2))

    def choose(i, _coords, times):
        # nearest first, ties by the coordinates (as sorting (distance, coords) tuples does)
        order = np.lexsort((raw[:, 2], raw[:, 1], raw[:, 0], dist[i]))
        near = ((float(dist[i, j]), classes[coords[j]]) for j in order if j != i)
        return _nearest_vote(near, set(times), neighbours)

    return _accuracy(classes, choose, tolerance)


def loo_accuracy(classes: dict, predict, tolerance: float = 0.05) -> tuple:
    """Leave-one-out accuracy of ``predict`` over measured classes.

    Parameters
    ----------
    classes : dict
        {(lnN, lnD, lnM): {config key: seconds per event}}, classes with at least two configurations.
    predict : callable
        ``predict(others, coords, keys) -> key``: the configuration predicted for ``coords`` from
        ``others`` (the dict without that class), among ``keys``.
    tolerance : float
        Relative slack: a prediction counts when its time is within ``1 + tolerance`` of the best.

    Returns
    -------
    (fraction within tolerance, number of classes judged)
    """
    return _accuracy(
        classes, lambda _i, c, times: predict({o: t for o, t in classes.items() if o != c}, c, list(times)), tolerance
    )


def model_predictor(others: dict, coords, keys):
    """A :func:`loo_accuracy` predictor: fit :class:`CostModel` on ``others``, pick the fastest."""
    points: dict = {}
    for c, times in others.items():
        for k, t in times.items():
            points.setdefault(k, []).append((*c, math.log(t)))
    ranked = CostModel(points).rank(keys, *coords)
    return ranked[0][1] if ranked else None


def nearest_predictor(others: dict, coords, keys, neighbours: int = 4, n_weight: float = 0.5):
    """A :func:`loo_accuracy` predictor: the nearest-neighbour rule of :mod:`asp_gmm.selection`
    (relative scores ``ln(t / t_fastest)`` of the nearest classes, weighted ``1 / (d + 0.25)``)."""
    here = np.array(coords, float)
    w_axes = np.array([n_weight, 1.0, 1.0])
    dist = sorted((float(np.sqrt((((np.array(c) - here) * w_axes) ** 2).sum())), c) for c in others)
    return _nearest_vote(((d, others[c]) for d, c in dist), keys, neighbours)


def _nearest_vote(near, keys, neighbours: int):
    """The nearest rule's vote: ``near`` yields ``(distance, {config key: seconds per event})``
    nearest first; the first ``neighbours`` classes with two or more of ``keys`` score each key by
    ``ln(t / t_fastest)`` weighted ``1 / (distance + 0.25)``; the lowest mean score wins (ties by
    name), None when no class votes."""
    score, weight, used = {}, {}, 0
    for d, measured in near:
        times = {k: t for k, t in measured.items() if k in keys}
        if len(times) < 2:
            continue
        fastest = min(times.values())
        w = 1.0 / (d + 0.25)
        for k, t in times.items():
            score[k] = score.get(k, 0.0) + w * math.log(t / fastest)
            weight[k] = weight.get(k, 0.0) + w
        used += 1
        if used >= neighbours:
            break
    if not score:
        return None
    return min(score, key=lambda k: (score[k] / weight[k], str(k)))
