"""The reference as a backend: every phase in float64 NumPy (``asp_gmm/reference.py``).

Slow but always available; results are returned in the problem's dtype like every other backend.
"""

from __future__ import annotations

import platform
import time

import numpy as np

from .. import reference as ref
from ..errors import NonFiniteError, from_reference
from ..problem import Problem
from .base import Backend, EMRun, Kernel, Session, StatsRunner, stats_from_posteriors


class NumpyBackend(Backend):
    name = "numpy"

    @classmethod
    def unavailable_reason(cls):
        return None

    def fingerprint(self) -> dict:
        return {"backend": "numpy", "numpy": np.__version__, "arch": platform.machine(), "model": platform.processor()}

    def kernel(self, variant, tunables, problem: Problem) -> Kernel:
        return Kernel(variant, dict(tunables or {}))

    def open(self, X, problem: Problem) -> "NumpySession":
        return NumpySession(X, problem)

    def open_stats(self, problem: Problem, kernel=None) -> "NumpyStatsRunner":
        return NumpyStatsRunner(self, problem, kernel)

    def open_weighted_stats(self, problem: Problem, kernel=None, resident: bool = False) -> "NumpyStatsRunner":
        return NumpyStatsRunner(self, problem, kernel)


class NumpySession(Session):
    def __init__(self, X, problem: Problem):
        self.problem = problem
        self.X = np.asarray(X, dtype=np.float64)
        self._cache = None

    def set_params(self, weights, means, covars, reg_covar: float) -> None:
        try:
            ref.precision_cholesky(
                covars, self.problem.cvtype, reg_covar, n_features=self.problem.D
            )  # raises if not PD
        except ref.NotPositiveDefiniteError as exc:
            raise from_reference(exc) from None
        self.weights = np.array(weights, np.float64)
        self.means = np.array(means, np.float64)
        self.covars = np.array(covars, np.float64)
        self._cache = None

    def params(self):
        return self.weights.copy(), self.means.copy(), self.covars.copy()

    def _estep(self, reg_covar=None):
        if self._cache is None:
            try:
                self._cache = ref.estep(self.X, self.weights, self.means, self.covars, self.problem.cvtype, reg_covar)
            except (ref.NotPositiveDefiniteError, ref.NonFiniteError) as exc:
                raise from_reference(exc) from None
            ll = float(self._cache[0].sum())
            if not np.isfinite(ll):
                raise NonFiniteError(
                    f"the log-likelihood is not finite ({ll}): increase reg_covar, use fewer components, "
                    "or scale the data"
                )
        return self._cache

    def _em(self, kernel, *, min_iters, max_iters, tol, reg_covar) -> EMRun:
        cv = self.problem.cvtype
        logprob, resp = self._estep(reg_covar)
        ll = float(logprob.sum())
        N = self.problem.N
        iters, conv, it_s, cov_s, trace = 0, False, [], [], [ll]
        while iters < max_iters:
            t0 = time.perf_counter()
            nk, w, mu = ref.mstep_weights_means(self.X, resp, self.means)
            tc = time.perf_counter()
            cov = ref.covariance(self.X, resp, nk, mu, cv, reg_covar, self.covars)
            cov_s.append(time.perf_counter() - tc)
            self.set_params(w, mu, cov, reg_covar)
            logprob, resp = self._estep(reg_covar)
            it_s.append(time.perf_counter() - t0)
            iters += 1
            new = float(logprob.sum())
            change, ll = ref.change_per_event(new, ll, N), new
            trace.append(ll)
            if ref.converged(iters, min_iters, change, tol):
                conv = True
                break
        return EMRun(ll, iters, conv, it_s, cov_s, trace)

    def loglik(self) -> float:
        return float(self._estep()[0].sum())

    def eval(self, want_resp: bool = True):
        logprob, resp = self._estep()
        dt = self.problem.np_dtype
        return logprob.astype(dt), (resp.astype(dt) if want_resp else None)


class NumpyStatsRunner(StatsRunner):
    """Block statistics straight from the reference E-step, in float64."""

    def stats_weighted(self, X, sample_weight):
        w, mu, cv, reg = self._params
        try:
            logprob, resp = ref.estep(X, w, mu, cv, self.problem.cvtype, reg)
        except (ref.NotPositiveDefiniteError, ref.NonFiniteError) as exc:
            raise from_reference(exc) from None
        return self._finite(stats_from_posteriors(X, logprob, resp, mu, self.problem.kernel_cvtype, sample_weight))

    def stats(self, X):
        w, mu, cv, reg = self._params
        try:
            logprob, resp = ref.estep(X, w, mu, cv, self.problem.cvtype, reg)
        except (ref.NotPositiveDefiniteError, ref.NonFiniteError) as exc:
            raise from_reference(exc) from None
        st = stats_from_posteriors(X, logprob, resp, mu, self.problem.kernel_cvtype)
        if not np.isfinite(st.loglik):
            raise NonFiniteError(
                f"the log-likelihood is not finite ({st.loglik}): increase reg_covar, use fewer components, "
                "or scale the data"
            )
        return st
