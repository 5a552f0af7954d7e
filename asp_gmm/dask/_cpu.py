"""Resident rows on a CPU worker: the worker's blocks packed once into one C state (the tile layout
the C core computes on), so that a pass is one ``asp_stats`` call over all of them, as the in-process
session's iteration is one loop over its packed data; nothing is copied or checked again per pass."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..backends import c as cb
from ..backends.base import BlockStats
from ..problem import Problem


class ResidentCRunner:
    """The statistics of resident rows (validated, C-contiguous, of the working dtype) on the C core;
    they are packed at creation and never again.

    Parameters
    ----------
    backend : CBackend
    problem : Problem
        The rows' problem (``N`` = their number).
    kernel : Kernel
        The covariance variant (the one :func:`asp_gmm.streaming.plan` chose).
    X : ndarray (N, D)
    """

    def __init__(self, backend, problem: Problem, kernel, X: np.ndarray):
        self.problem, self.kernel = problem, kernel
        self._session = cb.CSession(backend, X, problem)  # packs X into the tile layout
        self._moments = cb._wants_moments(kernel.variant, problem)
        M, D = problem.M, problem.D
        self._cells = D * D if problem.cvtype == "full" else D
        self._out = np.zeros(1 + M + M * D + M * self._cells)
        self._reg = 0.0

    def set_params(self, weights, means, covars, reg_covar: float) -> None:
        self._session.set_params(weights, means, covars, reg_covar)
        self._reg = reg_covar

    def stats(self) -> BlockStats:
        # CStatsRunner.stats without its asp_load: the state already holds the block
        ses = self._session
        lib = ses._lib
        ses._check(lib.asp_stats(ses._state, ses._fn(self.kernel), int(self._moments), cb._dptr(self._out)), self._reg)
        ses._stale = True
        M, D, n = self.problem.M, self.problem.D, self.problem.N
        o = self._out
        nk = o[1 : 1 + M].copy()
        sumx = o[1 + M : 1 + M + M * D].reshape(M, D).copy()
        acc = o[1 + M + M * D :].reshape((M, D, D) if self.problem.cvtype == "full" else (M, D)).copy()
        if self.problem.cvtype == "full":  # the variants write the lower triangle
            acc = np.tril(acc) + np.swapaxes(np.tril(acc, -1), 1, 2)
        return BlockStats(n, float(o[0]), nk, sumx, acc)

    def close(self) -> None:
        self._session.close()


def block_problem(problem: Problem, rows: int) -> Problem:
    return dataclasses.replace(problem, N=int(rows))
