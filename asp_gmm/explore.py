"""The sampled exploration of one ``train`` call (:class:`Exploration`): candidates timed for one
EM iteration each on a sample of the events, every cost charged against the policy's allowance of
the call's time. Used by :class:`asp_gmm.specializer.Specializer` for problems too large to explore
in place; what it measures is recorded as sampled timings (``sampled_from``)."""

from __future__ import annotations

import dataclasses
import logging
import math
import time

import numpy as np

from . import selection
from .errors import KernelError

log = logging.getLogger("asp_gmm")

#: A call may spend, beyond its own allowance, what earlier calls of its class left unspent, up to
#: this many times its own allowance (a candidate costlier than one call's allowance is explored
#: once enough is saved, the class's total exploring held within the fraction of its total time).
BANK_CALLS = 3


class Exploration:
    """The sampled exploration of one call, charged against the policy's allowance.

    Every cost is counted, by the wall clock: the sample's copy and its session, the kernels'
    look-ups (a configuration not compiled is never compiled here: the policy compiles it after
    or beside the call), the parameter uploads and the launches. The primary runs first on the
    sample unless sampled before (it measures what a sampled iteration costs). Before each configuration
    runs its cost is predicted: the fastest per-event time measured on the sample (in this call,
    else in earlier calls, else the class's whole-data best) times the plan's predicted ratio for
    it (the cost model or the nearest classes; :attr:`Plan.unknown_ratio`, or the widest ratio
    seen in this call, when nothing predicts it), plus the largest per-run overhead seen and the
    sample's copy when not made yet; it runs only when that fits what is left of the allowance.

    The allowance is :data:`EXPLORE_FRACTION` of the call's estimated time plus what earlier calls
    of the class left unspent (:attr:`Plan.banked`, at most :data:`BANK_CALLS` times as much): a class whose
    candidates cost more than one call's allowance is explored over several calls, its total
    exploring held within the fraction of its total time. One sample and one session serve every
    round of the call; the sample is not copied when nothing fits.
    """

    def __init__(self, sp, X, problem, sample, max_iters, plan):
        self.sp, self.problem, self.max_iters, self.X = sp, problem, max_iters, X
        self.t0 = time.perf_counter()
        self.step = max(problem.N // sample, 1)
        self.sp_problem = dataclasses.replace(problem, N=min(sample, len(range(0, problem.N, self.step))))
        self.session = None  # opened on the first configuration that fits the allowance
        self.copy = 0.0  # the sample's copy and its session
        self.extra = 0.0  # reported iteration time beyond the wall clock (a backend's own timer)
        self.fastest = None  # seconds per event, fastest measured on the sample in this call
        self.slowest = 0.0  # ... and the slowest (an unpredicted configuration is charged at least as much)
        self.whole = plan.fastest  # seconds per event of the class's best on the whole data (or None)
        self.sampled = plan.sampled_fastest  # ... on samples, in earlier calls (or None)
        self.banked = plan.banked  # allowance earlier calls of the class left unspent
        # the largest per-run cost besides the timed iteration (from the class's last exploration)
        self.overhead = sp._costs.overhead.get(selection.problem_class(problem), 0.0)
        self.runs, self.skipped, self.measured = 0, [], set()

    def _open(self):
        t = time.perf_counter()
        Xs = self.X[:: self.step][: self.sp_problem.N]
        Xs = Xs.contiguous() if hasattr(Xs, "contiguous") else np.ascontiguousarray(Xs)
        self.session = self.sp._open(Xs, self.sp_problem)
        self.copy = time.perf_counter() - t
        nbytes = getattr(Xs, "nbytes", 0) or 1
        self.sp._costs.copy_rate = self.copy / nbytes  # predicts the next call's copy before it is made
        return nbytes

    def _predicted_copy(self) -> float:
        if self.session is not None:
            return 0.0
        rate = self.sp._costs.copy_rate
        if rate is None:
            return 0.0
        itemsize = getattr(getattr(self.X, "dtype", None), "itemsize", 4)
        return rate * self.sp_problem.N * self.problem.D * itemsize

    def spent(self) -> float:
        return time.perf_counter() - self.t0 + self.extra

    def allowance(self) -> float | None:
        rates = [r for r in (self.fastest, self.whole) if r]
        if not rates:
            return None
        wall = self.sp._costs.call_seconds.get(selection.problem_class(self.problem))
        base = self.sp.policy.explore_allowance(self.problem, self.max_iters, min(rates), wall)
        return base + min(self.banked, BANK_CALLS * base)

    def round(self, plan, weights, means, covars, reg_covar):
        """One EM iteration of the primary (unless sampled before) and of each configuration to
        explore on the sample, those whose predicted cost fits the allowance (on a backend whose
        first launch costs more, two, the faster recorded); returns (labels measured, whether the
        allowance stopped one)."""
        sp, sel, backend, spp = self.sp, self.sp.policy, self.sp.backend, self.sp_problem
        done, stopped = [], False
        # the primary runs first unless sampled before (ratio 1: it measures what a sampled
        # iteration costs, which every later prediction scales)
        first = [] if plan.primary_sampled or plan.primary in self.measured else [plan.primary]
        # a backend whose first launch of a configuration costs more: each runs twice, the faster kept
        runs_each = 2 if getattr(backend, "first_launch_costs_more", False) else 1
        for cfg in first + [c for c in plan.explore if c != plan.primary and c not in self.measured]:
            allowance = self.allowance()
            # per-event time on a sample: measured in this call, else on samples before (a sample's
            # iteration costs more per event than the whole data's), else the whole data's
            rate = min((r for r in (self.fastest, self.sampled) if r), default=self.whole or math.inf)
            unknown = max(plan.unknown_ratio or 1.0, self.slowest / self.fastest if self.fastest else 1.0)
            ratio = 1.0 if cfg == plan.primary else plan.predicted.get(cfg, unknown)
            if allowance is not None and rate < math.inf:
                predicted = runs_each * ratio * rate * spp.N + self.overhead + self._predicted_copy()
                if self.spent() + predicted > allowance:
                    stopped = True
                    self.skipped.append(cfg.label)
                    continue  # a cheaper one further down may still fit
            if not backend.is_ready(cfg.variant, cfg.params, spp):
                continue  # never compile to explore: the policy compiles it beside or after the call
            if self.session is None:
                self._open()
            t = time.perf_counter()
            kernel = sp._kernel(cfg, spp, sel)
            if kernel is None:
                continue
            try:
                runs, last = [], 0.0
                for k in range(runs_each):
                    if k and allowance is not None and self.fastest and self.spent() + last > allowance:
                        # it would overshoot; the first is recorded if no first launch hides a contender
                        if runs[0].iter_seconds[0] / spp.N > selection.FIRST_LAUNCH_MAX * self.fastest:
                            break
                    t1 = time.perf_counter()
                    self.session.set_params(weights, means, covars, reg_covar)
                    runs.append(self.session.em(kernel, min_iters=1, max_iters=1, tol=0.0, reg_covar=reg_covar))
                    last = max(time.perf_counter() - t1, runs[-1].iter_seconds[0])
            except KernelError as exc:
                sel.record(backend, self.problem, cfg, "launch-failed")
                log.warning("asp_gmm: variant %s failed at run time (%s); not retried", cfg.label, exc)
                continue
            wall = time.perf_counter() - t
            timed = sum(r.iter_seconds[0] for r in runs)
            run = min(runs, key=lambda r: r.iter_seconds[0])
            it = run.iter_seconds[0]
            self.extra += max(timed - wall, 0.0)
            self.overhead = max(self.overhead, wall - timed)
            self.fastest = it / spp.N if self.fastest is None else min(self.fastest, it / spp.N)
            self.slowest = max(self.slowest, it / spp.N)
            self.runs += 1
            self.measured.add(cfg)
            log.debug(
                "explored %s: %.3g s (iteration %.3g s); %.3g of %s s", cfg.label, wall, it, self.spent(), allowance
            )
            sel.record(backend, spp, cfg, "ok", it, run.cov_seconds[0], 1, sampled_from=self.problem.N)
            done.append(cfg.label)
        return done, stopped

    def close(self):
        if self.session is not None:
            self.session.close()
        if self.runs:
            self.sp._costs.overhead[selection.problem_class(self.problem)] = self.overhead
        elif self.skipped and self.session is None and self.sp._costs.copy_rate:
            # nothing fitted with the sample's predicted copy: halve that prediction, so that one
            # costly copy (a process's first session: 38 ms against 3 ms after) cannot stop the
            # exploring for good; the next copy made measures it again
            self.sp._costs.copy_rate *= 0.5
        self.closed = self.spent()

    def account(self) -> dict:
        """What the exploration cost (seconds) against its allowance."""
        return {
            "spent": getattr(self, "closed", None) or self.spent(),
            "allowance": self.allowance() or 0.0,
            "copy": self.copy,
            "runs": self.runs,
            "skipped": list(self.skipped),
            "sample": self.sp_problem.N,
        }

    def summary(self) -> str:
        a = self.account()
        line = (
            f"explored {a['runs']} on a {a['sample']}-event sample: {1e3 * a['spent']:.3g} ms of a "
            f"{1e3 * a['allowance']:.3g} ms allowance (sample copy {1e3 * a['copy']:.3g} ms)"
        )
        if a["skipped"]:
            line += f"; left for later calls (would overshoot): {', '.join(a['skipped'])}"
        return line
