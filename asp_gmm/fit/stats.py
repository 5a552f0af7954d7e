"""Sufficient statistics of EM, accumulated in float64 with compensated sums (:class:`SuffStats`),
and the M-step from them (:meth:`SuffStats.mstep`, the reference rules).

The per-block statistics a backend returns are :class:`asp_gmm.backends.base.BlockStats` (count,
log-likelihood, N_k, sum r x, second moments centred on the current means; with sample weights the
posteriors are multiplied by the weights first, so ``n`` is the blocks' total weight). A
distributed loop adds per-worker :class:`SuffStats` (:meth:`SuffStats.add`), calls
:meth:`SuffStats.mstep` and tests :func:`asp_gmm.reference.converged` on the change of
``loglik / n``.
"""

from __future__ import annotations

import numpy as np

from .. import reference as ref
from ..backends.base import BlockStats, stats_from_posteriors  # noqa: F401  (the per-block statistics)


def _neumaier(s: np.ndarray, c: np.ndarray, x: np.ndarray) -> None:
    """``s += x`` with the lost low-order parts kept in ``c`` (in place)."""
    t = s + x
    big = np.abs(s) >= np.abs(x)
    c += np.where(big, (s - t) + x, (x - t) + s)
    s[...] = t


class SuffStats:
    """Sufficient statistics of a pass, accumulated in float64 with compensated sums.

    Attributes
    ----------
    n : int or float
        Events added (with sample weights: their total weight).
    rows : int
        Rows added (``n`` without sample weights).
    loglik : float
    nk : ndarray (M,)
        Raw counts.
    s1 : ndarray (M, D)
        ``sum r (x - c)``, ``c = centre``.
    s2 : ndarray (M, D, D) or (M, D)
        ``sum r (x - c)(x - c)^T`` (diag: its diagonal).
    centre : ndarray (M, D)
        The means the statistics are centred on.
    """

    def __init__(self, M: int, D: int, cvtype: str, centre):
        self.cvtype = cvtype
        self.centre = np.array(centre, np.float64)
        self.n = 0
        self.rows = 0
        shapes = {"ll": (), "nk": (M,), "s1": (M, D), "s2": (M, D, D) if cvtype == "full" else (M, D)}
        self._sum = {k: np.zeros(v) for k, v in shapes.items()}
        self._comp = {k: np.zeros(v) for k, v in shapes.items()}

    def add_block(self, st, rows: int | None = None) -> None:
        """Add a :class:`~asp_gmm.backends.base.BlockStats` computed under means ``centre`` (``rows``:
        the block's rows where ``st.n`` is a total weight)."""
        self.n += st.n
        self.rows += st.n if rows is None else rows
        s1 = st.sumx - st.nk[:, None] * self.centre
        for k, v in (("ll", np.float64(st.loglik)), ("nk", st.nk), ("s1", s1), ("s2", st.s2)):
            _neumaier(self._sum[k], self._comp[k], np.asarray(v, np.float64))

    def add(self, other: "SuffStats") -> "SuffStats":
        """This plus ``other`` (re-centred on this centre where it differs); a new object."""
        if not np.array_equal(other.centre, self.centre):
            other = other.recentred(self.centre)
        out = SuffStats.__new__(SuffStats)
        out.cvtype, out.centre, out.n = self.cvtype, self.centre.copy(), self.n + other.n
        out.rows = self.rows + other.rows
        out._sum, out._comp = {}, {}
        for k in self._sum:
            s, c = self._sum[k].copy(), np.array(self._comp[k] + other._comp[k])
            _neumaier(s, c, other._sum[k])
            out._sum[k], out._comp[k] = s, c
        return out

    def scaled(self, factor: float) -> "SuffStats":
        """All sums times ``factor`` (online EM's averaging); a new object."""
        out = SuffStats.__new__(SuffStats)
        out.cvtype, out.centre, out.n, out.rows = self.cvtype, self.centre.copy(), self.n, self.rows
        out._sum = {k: np.array(v * factor) for k, v in self._sum.items()}
        out._comp = {k: np.array(v * factor) for k, v in self._comp.items()}
        return out

    @property
    def loglik(self) -> float:
        return float(self._sum["ll"] + self._comp["ll"])

    @property
    def nk(self) -> np.ndarray:
        return self._sum["nk"] + self._comp["nk"]

    @property
    def s1(self) -> np.ndarray:
        return self._sum["s1"] + self._comp["s1"]

    @property
    def s2(self) -> np.ndarray:
        return self._sum["s2"] + self._comp["s2"]

    def recentred(self, centre) -> "SuffStats":
        """The same statistics centred on ``centre`` (M, D); a new object."""
        centre = np.asarray(centre, np.float64)
        d = centre - self.centre
        nk, s1, s2 = self.nk, self.s1, self.s2
        out = SuffStats(nk.shape[0], centre.shape[1], self.cvtype, centre)
        out.n, out.rows = self.n, self.rows
        out._sum["ll"][...] = self.loglik
        out._sum["nk"][...] = nk
        out._sum["s1"][...] = s1 - nk[:, None] * d
        out._sum["s2"][...] = _shift_second(s2, s1, nk, d, self.cvtype)
        return out

    def mstep(self, prev_means, prev_covars, reg_covar: float):
        """``(weights (M,), means (M, D), covars)`` from these statistics with the reference rules:
        counts ``nk + 10 eps``; a component with a raw count below
        :data:`asp_gmm.reference.EMPTY_COMPONENT_EVENTS` keeps ``prev_means`` and ``prev_covars``;
        covariances around the new means plus ``reg_covar`` on the diagonal."""
        nk, s1, s2 = self.nk, self.s1, self.s2
        eff = nk + 10.0 * np.finfo(np.float64).eps
        weights = eff / eff.sum()
        d = s1 / eff[:, None]
        means = self.centre + d
        cov = _shift_second(s2, s1, nk, d, self.cvtype) / (
            eff[:, None, None] if self.cvtype == "full" else eff[:, None]
        )
        if self.cvtype == "full":
            cov = 0.5 * (cov + np.swapaxes(cov, 1, 2))
            D = cov.shape[1]
            cov[:, np.arange(D), np.arange(D)] += reg_covar
        else:
            cov = cov + reg_covar
        empty = nk < ref.EMPTY_COMPONENT_EVENTS
        means[empty] = np.asarray(prev_means, np.float64)[empty]
        cov[empty] = np.asarray(prev_covars, np.float64)[empty]
        return weights, means, cov


def _shift_second(s2, s1, nk, d, cvtype):
    """``sum r (x - c - d)(x - c - d)^T`` from the sums around ``c``: s2 - d s1^T - s1 d^T + nk d d^T."""
    if cvtype == "full":
        ds1 = np.einsum("ki,kj->kij", d, s1)
        return s2 - ds1 - np.swapaxes(ds1, 1, 2) + nk[:, None, None] * np.einsum("ki,kj->kij", d, d)
    return s2 - 2.0 * d * s1 + nk[:, None] * d * d


def reduced_mstep(stats: SuffStats, prev_means, prev_covars, reg_covar: float, cvtype: str):
    """:meth:`SuffStats.mstep` reduced to ``cvtype`` as asp_gmm/reference.py reduces its estimates:
    "tied" the count-weighted mean of the components' full covariances (the pooled scatter over the
    total count, or total weight), "spherical" the mean of each component's diagonal; ``reg_covar``
    added after. ``stats`` are the per-component ones of the type's kernels ("full" for "tied",
    "diag" for "spherical"); ``prev_covars`` are per component
    (:func:`asp_gmm.problem.per_component`); returns covariances of ``cvtype``."""
    if cvtype in ("full", "diag"):
        return stats.mstep(prev_means, prev_covars, reg_covar)
    prev = np.asarray(prev_covars, np.float64)
    D = prev.shape[-1]
    # the previous covariances without reg_covar: an empty component keeps them and gets it added again
    prev = prev - (reg_covar * np.eye(D) if cvtype == "tied" else reg_covar)
    w, mu, cv = stats.mstep(prev_means, prev, 0.0)
    if cvtype == "tied":
        nk = stats.nk + 10 * np.finfo(np.float64).eps
        return w, mu, np.tensordot(nk, cv, 1) / nk.sum() + reg_covar * np.eye(D)
    return w, mu, cv.mean(axis=1) + reg_covar
