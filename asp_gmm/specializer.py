"""Turns one ``train`` call into a problem, a device and a plan, and runs it.

The specializer asks Selection for a plan, asks the Backend for compiled kernels (the compile cache
makes that free after the first time), opens a session over the data, runs the exploration
iterations (one iteration per untried variant, each timed by the backend and reported back) and
then the remaining iterations with the chosen variant, entirely in compiled code.
It never validates user input (the Face does) and never touches the tuning history directly
(Selection does).
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import statistics
import time
from dataclasses import dataclass

import numpy as np

from . import selection
from .backends import get_backend
from .errors import CompileError, KernelError, VariantNotApplicableError
from .problem import Problem
from .selection import Config

log = logging.getLogger("asp_gmm")

#: Rounds of sampled exploration in one call (the variants, then steps of the tunable search),
#: each stopped by the policy's allowance of the call's time.
SAMPLE_ROUNDS = 4


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


class Specializer:
    """Runs EM for the Face on one backend.

    Parameters
    ----------
    backend : str or Backend
    selector : Selector, optional
        Shorthand for ``policy=Policy(selector)``.
    policy : asp_gmm.selection.Policy, optional
        Decides which configuration runs (and explores) each problem; a new
        :class:`~asp_gmm.selection.Policy` on the default selector when not given.
    """

    def __init__(self, backend="auto", selector: selection.Selector | None = None,
                 policy: selection.Policy | None = None):
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        self.policy = policy if policy is not None else selection.Policy(selector)
        self._candidates: dict = {}

    @property
    def selector(self) -> selection.Selector:
        return self.policy.selector

    def candidates(self, problem: Problem, variant: str | None = None) -> list:
        """Configurations (variant + default tunables) whose limits allow ``problem`` (memoised by the
        backend's selection key: the diarization example asks thousands of times for a handful of
        shapes with ever-new N)."""
        key = (self.backend.selection_key(problem), variant)
        hit = self._candidates.get(key)
        if hit is None:
            if len(self._candidates) > 4096:
                self._candidates.clear()
            hit = self._candidates[key] = self._find_candidates(problem, variant)
        return list(hit)

    def _find_candidates(self, problem: Problem, variant: str | None) -> list:
        if variant is not None:
            from . import registry
            try:
                v = registry.get(self.backend.name, variant, "covariance")
            except KeyError as exc:
                raise ValueError(str(exc.args[0])) from None
            tun = self.backend.tunables_for(v, problem)
            if tun is None:
                why = v.check(problem, extra=self.backend.limit_context())
                raise VariantNotApplicableError(f"pinned variant cannot run this problem: {why}; "
                                                "choose another variant or variant=None")
            return [Config.of(v, tun)]
        # a manifest may keep its variant out of automatic selection (selectable = false: measured
        # slower where it runs; still pinnable and tested); exploring it would only cost compiles
        cands = []
        for v in self.backend.covariance_variants():
            tun = self.backend.tunables_for(v, problem) if v.extra.get("selectable", True) else None
            if tun is not None:   # one walk of the tunables per variant, not a filter and then a pick
                cands.append(Config.of(v, tun))
        if not cands:
            raise VariantNotApplicableError(
                f"no {self.backend.name} variant can run N={problem.N}, D={problem.D}, M={problem.M} "
                f"({problem.cvtype}, {problem.dtype}); see `asp-gmm info` for the variants' limits")
        return cands

    def train(self, X, weights, means, covars, problem: Problem, reg_covar: float,
              min_iters: int, max_iters: int, tol: float, variant: str | None = None) -> TrainResult:
        t_start = time.perf_counter()
        sel = self.policy
        tuning = selection.autotune_enabled()
        plan = sel.choose(self.backend, problem, self.candidates(problem, variant), pinned=variant is not None,
                          tuning=tuning)
        explore = list(plan.explore)
        sample = sel.sample_size(problem, len(explore), max_iters) if explore else problem.N
        if sample < problem.N:
            # large N: explore on a sample of the events (nothing of the call's EM advances), then
            # run every iteration with the best configuration the history now knows
            sampled, budget = [], {"spent": 0.0, "fastest": None, "slowest": 0.0}
            for _ in range(SAMPLE_ROUNDS):   # the variants, then the tunable search while the budget lasts
                done, stopped = self._explore_sample(X, weights, means, covars, problem, reg_covar, plan, sample,
                                                     max_iters, sel, budget)
                sampled += done
                plan = sel.choose(self.backend, problem, self.candidates(problem, variant), tuning=tuning)
                if stopped or not done or not plan.explore:
                    break
            explore = []
        session = self.backend.open(X, problem)
        try:
            session.set_params(weights, means, covars, reg_covar)
            iters, converged, explored, used = 0, False, [], None
            trace = []
            N = problem.N
            while explore and iters < max_iters and not converged:
                cfg = explore.pop(0)
                kernel = self._kernel(cfg, problem, sel)
                if kernel is None:
                    continue
                before = session.loglik()
                try:
                    run = session.em(kernel, 1, 1, 0.0, reg_covar)
                except KernelError as exc:
                    sel.record(self.backend, problem, cfg, "launch-failed")
                    log.warning("asp_gmm: variant %s failed at run time (%s); not retried", cfg.label, exc)
                    continue
                iters += 1
                trace.extend(run.loglik_trace[1 if trace else 0:])
                explored.append(cfg.label)
                used = cfg
                if tuning:
                    sel.record(self.backend, problem, cfg, "ok", run.iter_seconds[0], run.cov_seconds[0], 1)
                converged = iters >= min_iters and abs(run.loglik - before) / N < tol
            if iters < max_iters and not converged:
                # the planned configuration, then the other candidates should it fail to compile or
                # to run (each failure is recorded and never retried for its source)
                order = itertools.chain([plan.primary], (c for c in self.candidates(problem, variant)
                                                        if c != plan.primary))
                last_exc = None
                for cfg in order:
                    kernel = self._kernel(cfg, problem, sel, reraise=variant is not None)
                    if kernel is None:
                        continue
                    try:
                        run = session.em(kernel, max_iters - iters, max(min_iters - iters, 0), tol, reg_covar)
                    except KernelError as exc:
                        sel.record(self.backend, problem, cfg, "launch-failed")
                        if variant is not None:
                            raise
                        log.warning("asp_gmm: variant %s failed at run time (%s); trying another", cfg.label, exc)
                        last_exc = exc
                        continue
                    iters += run.iters
                    trace.extend(run.loglik_trace[1 if trace else 0:])
                    converged = run.converged
                    used = cfg
                    if tuning and run.iters:
                        sel.record(self.backend, problem, cfg, "ok", statistics.median(run.iter_seconds),
                                   statistics.median(run.cov_seconds), run.iters)
                    break
                else:
                    raise KernelError("every candidate variant failed to compile or run; see the "
                                      "warnings above") from last_exc
            loglik = session.loglik()
            if not trace:
                trace = [loglik]
            w, mu, cv = session.params()
        finally:
            session.close()
        label = used.label if used is not None else plan.primary.label
        if sample < problem.N:
            explored = sampled
        return TrainResult(w, mu, cv, loglik, iters, converged, label, explored, plan.reason,
                           time.perf_counter() - t_start, trace, plan.why)

    def _explore_sample(self, X, weights, means, covars, problem, reg_covar, plan, sample, max_iters, sel, budget):
        """One EM iteration of the primary and of each configuration to explore on ``sample``
        evenly spaced events, each recorded as sampled, until the policy's allowance of the call's
        time is spent (the rest is explored by later calls; ``budget`` carries the spending across
        rounds); returns (labels explored, whether the allowance stopped it)."""
        step = max(problem.N // sample, 1)
        Xs = X[::step][:sample]
        Xs = Xs.contiguous() if hasattr(Xs, "contiguous") else np.ascontiguousarray(Xs)
        sp = dataclasses.replace(problem, N=int(Xs.shape[0]))
        done, stopped = [], False
        spent, fastest, slowest = budget["spent"], budget["fastest"], budget["slowest"]
        session = self.backend.open(Xs, sp)
        try:
            first = [] if plan.primary_sampled else [plan.primary]
            for cfg in first + [c for c in plan.explore if c != plan.primary]:
                if fastest is not None and spent + slowest * sp.N > sel.explore_allowance(problem, max_iters, fastest):
                    stopped = True
                    break
                kernel = self._kernel(cfg, sp, sel)
                if kernel is None:
                    continue
                session.set_params(weights, means, covars, reg_covar)
                try:
                    run = session.em(kernel, 1, 1, 0.0, reg_covar)
                except KernelError as exc:
                    sel.record(self.backend, problem, cfg, "launch-failed")
                    log.warning("asp_gmm: variant %s failed at run time (%s); not retried", cfg.label, exc)
                    continue
                t = run.iter_seconds[0]
                spent += t
                fastest = t / sp.N if fastest is None else min(fastest, t / sp.N)
                slowest = max(slowest, t / sp.N)
                sel.record(self.backend, sp, cfg, "ok", t, run.cov_seconds[0], 1, sampled_from=problem.N)
                done.append(cfg.label)
        finally:
            session.close()
        budget.update(spent=spent, fastest=fastest, slowest=slowest)
        return done, stopped

    def prepare(self, problem: Problem, variant: str | None = None) -> int:
        """Compile or load every candidate configuration for ``problem`` and the backend's other
        modules; returns how many configurations are ready. A compile failure is recorded as in a
        real call (and not retried)."""
        sel = self.policy
        ready = sum(self._kernel(cfg, problem, sel) is not None for cfg in self.candidates(problem, variant))
        self.backend.prepare(problem)
        return ready

    def _kernel(self, cfg: Config, problem: Problem, sel, reraise: bool = False):
        try:
            return self.backend.kernel(cfg.variant, cfg.params, problem)
        except CompileError as exc:
            sel.record(self.backend, problem, cfg, "compile-failed")
            if reraise:
                raise
            log.warning("asp_gmm: variant %s did not compile; it is recorded and not retried.\n%s",
                        cfg.label, exc)
            return None

    def evaluate(self, X, weights, means, covars, problem: Problem, reg_covar: float, want_resp=True):
        """``(logprob (N,), resp (N, M) or None)`` of X under the given parameters."""
        session = self.backend.open(X, problem)
        try:
            session.set_params(weights, means, covars, reg_covar)
            return session.eval(want_resp)
        finally:
            session.close()
