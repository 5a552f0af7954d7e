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


#: The margin on a declared ratio (:func:`prior_ratio`): on benchmarks/rule_order.py's grid (H200) a
#: (D, M) pair held out of a variant's declared range fell outside it by at most 1.29x (36-40 of
#: 38-40 held-out shapes within it).
RULE_RATIO_MARGIN = 1.3


def prior_ratio(cfg, primary, cvtype: str) -> float | None:
    """The most ``cfg`` is expected to cost against ``primary`` per iteration when nothing of the
    class predicts it: the slowest its variant ran against the rule's first choice over the device's
    grid, over the fastest the primary's variant ran (the variants' ``rule_ratio`` manifest entries),
    times :data:`RULE_RATIO_MARGIN`. ``None`` where either is not declared for ``cvtype`` or ``cfg``
    is not its variant's default configuration (a tunable point is priced by the search's prediction).

    Without it an unpredicted configuration on CUDA is priced at the backend's
    ``unknown_ratio_prior`` (40: V1-V3 run 10-370x the fastest), and a class whose calls take tens
    of milliseconds never afforded one: at (153 600, 32, 32) full a fresh history stayed on V5 for
    every call while V8 ran the calls 10 % faster (V8's ratio to V5 on the grid: 0.68-2.1)."""
    if cfg.params != cfg.variant.default_tunables():
        return None
    mine = cfg.variant.extra.get("rule_ratio", {}).get(cvtype)
    theirs = primary.variant.extra.get("rule_ratio", {}).get(cvtype)
    if not mine or not theirs or not theirs[0] > 0:
        return None
    return RULE_RATIO_MARGIN * float(mine[1]) / float(theirs[0])


def unknown_ratio(backend, plan) -> float:
    """The ratio charged to a configuration nothing predicts: the plan's unknown ratio (else
    :data:`selection.UNKNOWN_RATIO`) or the backend's ``unknown_ratio_prior``, whichever is wider."""
    return max(plan.unknown_ratio or selection.UNKNOWN_RATIO, getattr(backend, "unknown_ratio_prior", 0.0))


def _ratio_or(cfg, primary, cvtype: str, unknown: float) -> float:
    """:func:`prior_ratio` where declared, else ``unknown``: what an unpredicted ``cfg`` is charged."""
    declared = prior_ratio(cfg, primary, cvtype)
    return unknown if declared is None else declared


def _first_load(sp) -> float:
    """Seconds a kernel's first load in the process is charged: the last measured, else the
    backend's :attr:`~asp_gmm.backends.base.Backend.load_seconds_prior` (a GPU module: ~15 ms)."""
    load = sp._costs.load_seconds
    return getattr(sp.backend, "load_seconds_prior", 0.0) if load is None else load


def _runs_each(backend) -> int:
    """Runs of each explored configuration: two on a backend whose first launch of a configuration
    costs more (the faster kept), else one."""
    return 2 if getattr(backend, "first_launch_costs_more", False) else 1


class Exploration:
    """The sampled exploration of one call, charged against the policy's allowance.

    Every cost is counted, by the wall clock: the sample's copy and its session, the kernels'
    look-ups (a configuration not compiled is never compiled here: the policy compiles it after or
    beside the call), the parameter uploads and the launches. The primary runs first on the sample
    unless sampled before (it measures what a sampled iteration costs). Before each configuration
    runs its cost is predicted (:meth:`_predicted`): the fastest per-event time measured on the
    sample (in this call, else in earlier calls, else the class's whole-data best) times the plan's
    predicted ratio for it (:attr:`Plan.unknown_ratio`, or the widest ratio seen in this call, when
    nothing predicts it), plus the largest per-run overhead seen, the sample's copy when not made
    yet and its kernel's load when not loaded yet; it runs only when that fits what is left.

    The allowance is :data:`EXPLORE_FRACTION` of the call's estimated time plus what earlier calls
    of the class left unspent (:attr:`Plan.banked`, at most :data:`BANK_CALLS` times as much): a
    class whose candidates cost more than one call's allowance is explored over several calls. One
    sample and one session serve every round of the call; the sample is not copied when nothing fits.
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
        self.fraction = plan.fraction  # the share of the call it may take
        # the largest per-run cost besides the timed iteration (from the class's last exploration)
        self.overhead = sp._costs.overhead.get(selection.problem_class(problem), 0.0)
        self.runs, self.skipped, self.measured = 0, [], set()
        self.least_overhead = math.inf  # ... and the smallest (a run whose kernel was loaded already)
        self.failed = 0  # configurations that failed at run time in this call (recorded: the plan changes)

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

    def allowance(self, saved: float = 0.0) -> float | None:
        rates = [r for r in (self.fastest, self.whole) if r]
        if not rates:
            return None
        wall = self.sp._costs.call_seconds.get(selection.problem_class(self.problem))
        base = self.sp.policy.explore_allowance(self.problem, self.max_iters, min(rates), wall, self.fraction)
        return base + min(self.banked + saved, BANK_CALLS * base)

    def _predicted(self, cfg, plan, loaded=None) -> float:
        """Seconds a sampled run of ``cfg`` is charged before it runs (``inf``: nothing prices it)."""
        # per-event time on a sample: measured in this call, else on samples before (a sample's
        # iteration costs more per event than the whole data's), else the whole data's
        rate = min((r for r in (self.fastest, self.sampled) if r), default=self.whole or math.inf)
        unknown = max(plan.unknown_ratio or 1.0, self.slowest / self.fastest if self.fastest else 1.0)
        prior = _ratio_or(cfg, plan.primary, self.problem.cvtype, unknown)
        ratio = 1.0 if cfg == plan.primary else plan.predicted.get(cfg, prior)
        # (a GPU module's load, once uncharged: V4 at (500 000, 36, 128) full spent 24 of 17 ms)
        if loaded is None:
            loaded = self.sp.backend.is_loaded(cfg.variant, cfg.params, self.sp_problem)
        runs = _runs_each(self.sp.backend) * ratio * rate * self.sp_problem.N
        return runs + self.overhead + self._predicted_copy() + (0.0 if loaded else _first_load(self.sp))

    def fits(self, plan, saved: float = 0.0) -> bool:
        """Whether a configuration of ``plan`` to explore would fit this exploration's allowance with
        ``saved`` seconds more in the class's savings (the primary's sampled run first where it has
        none), priced as :meth:`round` prices it; nothing runs."""
        allowance = self.allowance(saved)
        if allowance is None:
            return True
        primary = 0.0 if plan.primary_sampled else self._predicted(plan.primary, plan)
        return any(primary + self._predicted(c, plan) <= allowance for c in plan.explore if c != plan.primary)

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
        runs_each = _runs_each(backend)
        for cfg in first + [c for c in plan.explore if c != plan.primary and c not in self.measured]:
            allowance = self.allowance()
            loaded = backend.is_loaded(cfg.variant, cfg.params, spp)
            predicted = self._predicted(cfg, plan, loaded) if allowance is not None else math.inf
            if predicted < math.inf and self.spent() + predicted > allowance:
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
            if not loaded:
                sp._costs.load_seconds = time.perf_counter() - t
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
                self.failed += 1
                continue
            wall = time.perf_counter() - t
            timed = sum(r.iter_seconds[0] for r in runs)
            run = min(runs, key=lambda r: r.iter_seconds[0])
            it = run.iter_seconds[0]
            self.extra += max(timed - wall, 0.0)
            self.overhead = max(self.overhead, wall - timed)
            self.least_overhead = min(self.least_overhead, wall - timed)
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
        log.debug("sampled exploration: %.3g s spent before its session's close", self.spent())
        if self.session is not None:
            self.session.close()
        if self.runs:
            self.sp._costs.overhead[selection.problem_class(self.problem)] = self.overhead
            # the fixed part: the session over the sample and a run's own overhead, a kernel's
            # first load left out (a class exploring in place pays that too)
            self.sp._costs.sample_fixed = self.copy + max(self.least_overhead, 0.0)
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


def in_place_cheaper(sp, problem, plan, margin: float = 1.0) -> bool:
    """Whether a problem large enough to explore on a sample explores in place instead (each
    explored configuration runs one of the call's own iterations, within the allowance:
    :class:`InPlace`): when one of the class's EM iterations costs less than a sampled
    exploration's fixed part (its session, upload, launches and read-backs: measured by the last
    sampled exploration, else the backend's
    :attr:`~asp_gmm.backends.base.Backend.sample_fixed_prior`), or, on a backend with such a
    cost, when nothing is known of the class yet (the call's first iteration then prices the
    others). At (150 000, 19, 16) diag on an H200 a sampled exploration cost 4-6 ms of a 7.5 ms
    call, while an explored iteration of a variant within 10 % of the best costs under 0.1 ms more
    than the call's own."""
    fixed = sp._costs.sample_fixed
    if fixed is None:
        fixed = getattr(sp.backend, "sample_fixed_prior", 0.0)
    if not fixed:
        return False
    per_iter = sp._costs.call_seconds.get(selection.problem_class(problem))
    if per_iter is None and plan.fastest:
        per_iter = plan.fastest * problem.N
    return per_iter is None or per_iter * margin < fixed


def sample_first(sp, problem, plan, max_iters, saved: float = 0.0) -> list:
    """The configurations a call that explores in place should time on a sample first: those whose
    in-place price (:meth:`InPlace.price`: an unpredicted one at the backend's
    :attr:`~asp_gmm.backends.base.Backend.unknown_ratio_prior`, 40 on CUDA) exceeds the allowance
    while a sampled run of them fits it, taken in the plan's order while the total fits. A sampled
    run is priced by what sampled explorations cost: the fixed part (the last one's session, copy
    and per-run overhead, measured, else the backend's prior), the primary's runs on the sample when
    it was not sampled before, and each configuration's runs at its predicted ratio (else the
    plan's unknown ratio), per event at the class's sampled rate (else its whole-data rate), with
    its kernel's load where it is not loaded yet. ``saved``: seconds more in the class's savings.

    Without this a GPU class whose iteration costs less than a sample's session explored only what
    the history predicted: on a fresh history nothing ((500 000, 36, 128) full stayed on the rule's
    V5, V8 1.3x faster). Empty when the class's call time is not known yet (its first call)."""
    ck = selection.problem_class(problem)
    t_iter = sp._costs.call_seconds.get(ck)
    if t_iter is None or not plan.fastest or plan.confirm or not plan.explore:
        return []
    probe = InPlace(sp, problem, plan, max_iters, None)
    allowance = probe._allowance(t_iter, saved)
    t_kernel = plan.fastest * problem.N
    fixed = sp._costs.sample_fixed
    if fixed is None:
        fixed = getattr(sp.backend, "sample_fixed_prior", 0.0)
    n = sp.policy.sample_size(problem, len(plan.explore), max_iters)
    if n >= problem.N:
        return []
    runs_each = _runs_each(sp.backend)
    rate = plan.sampled_fastest or plan.fastest
    unknown = max(plan.unknown_ratio or selection.UNKNOWN_RATIO, 1.0)
    total = fixed + (0.0 if plan.primary_sampled else runs_each * rate * n)
    chosen = []
    for cfg in plan.explore:
        if cfg == plan.primary or probe.price(cfg, t_kernel) <= allowance:
            continue  # in place prices it within the allowance: it runs there
        cost = runs_each * plan.predicted.get(cfg, _ratio_or(cfg, plan.primary, problem.cvtype, unknown)) * rate * n
        if not sp.backend.is_loaded(cfg.variant, cfg.params, problem):
            cost += _first_load(sp)
        if total + cost <= allowance:
            total += cost
            chosen.append(cfg)
    return chosen


class InPlace:
    """Exploring in place, charged against the policy's allowance.

    The call's first iteration runs the planned configuration and is timed by the wall clock
    (``t``) and by the backend (``k``, the kernels alone); the allowance is
    :data:`EXPLORE_FRACTION` of ``max_iters`` such iterations plus what earlier calls of the class
    left unspent (at most :data:`BANK_CALLS` times as much, less what exploring in place has
    already cost the class in this process). Each configuration to explore then runs one
    iteration of the call (two where the backend's first launch costs more, the faster recorded)
    when its predicted extra cost fits what is left: ``(ratio - 1) * k`` per iteration (the plan's
    predicted ratio, else the ratio its variant declares against the primary's (:func:`prior_ratio`),
    else its unknown ratio, the backend's
    :attr:`~asp_gmm.backends.base.Backend.unknown_ratio_prior` or the widest measured in the call,
    whichever is widest) plus its kernel's look-up (the slowest seen in the class) or, not loaded
    yet, its load (the last measured, else the backend's prior; a load may also be paid from what
    the class saved beyond :data:`BANK_CALLS` calls, the allowance then grown by it) and the
    splits it brings. What it costs is the wall clock of its iterations less the pinned loop's
    each; the primary's first iterations, run alone, cost a split each (a split: an iteration's
    wall clock beyond its kernels, ``t - k``, less the loop's part, measured by the class's last loop).

    Parameters
    ----------
    sp : Specializer
    problem : Problem
    plan : Plan
    max_iters : int
    step : callable
        ``step(config, kernel, record) -> run``: one iteration of the call's EM on ``config``
        (its timing recorded by the caller when ``record`` is true; this class records the
        faster of an explored configuration's runs itself).
    spent_before : float
        Seconds the call already spent exploring on a sample (a whole-data check after it,
        :attr:`Plan.confirm`): taken off the allowance, and counted in :meth:`account`.
    """

    def __init__(self, sp, problem, plan, max_iters, step, spent_before: float = 0.0):
        self.sp, self.problem, self.plan, self.max_iters, self.step = sp, problem, plan, max_iters, step
        self.spent_before = float(spent_before)
        self.spent, self.allowance, self.runs, self.skipped, self.done = 0.0, 0.0, 0, [], []
        self.t_iter = self.t_kernel = None
        self.entry = 0.0  # a split iteration's wall clock beyond its kernels and the loop's part
        self.bank_for_load = 0.0  # (set with the allowance)

    def hopeless(self, saved: float = 0.0) -> bool:
        """True when the class's last timings show that nothing to explore could fit this call's
        allowance (the call then runs whole, not split around a first iteration): its module's
        load included where it is not loaded, as :meth:`explore` charges it (a settled
        class whose candidates fit only but for their loads ran every call split: H200,
        (150 000, 19, 16) diag, 10.7 ms a call against 10.0 for the same variant pinned)."""
        sp, problem, plan = self.sp, self.problem, self.plan
        ck = selection.problem_class(problem)
        # the allowance as exploring in place reckoned it last (from a priced iteration, not the
        # call's wall clock per iteration, which holds the session's opening: H200, (150 000, 19,
        # 16) diag, 0.9 against 0.11 ms, and every call split around a first iteration for nothing)
        t_iter = sp._costs.in_place_iter.get(ck, sp._costs.call_seconds.get(ck))
        if t_iter is None or not plan.fastest:
            return False
        t_kernel = plan.fastest * problem.N
        allowance = max(self._allowance(t_iter, saved) - self.spent_before, 0.0)
        unknown = self._unknown()

        runs_each = _runs_each(sp.backend)
        # the splits a candidate brings: the primary's second iteration, its own runs, the rest
        splits = (runs_each + 2) * sp._costs.in_place_entry.get(ck, 0.0)

        def fits(c):
            price = runs_each * max(plan.predicted.get(c, self._prior(c, unknown)) - 1.0, 0.0) * t_kernel + splits
            if sp.backend.is_loaded(c.variant, c.params, problem):
                return price <= allowance
            load = _first_load(sp)
            return price + load <= allowance + self._load_extra(False, load)

        if not any(fits(c) for c in plan.explore):
            if not saved:
                self.allowance = allowance
                self.skipped = [c.label for c in plan.explore]
            return True
        return False

    def calls_to_fit(self, horizon: int, sampled=None) -> int:
        """After :meth:`hopeless`: in how many calls a candidate may fit in place, on a sample first
        (:func:`sample_first`) or on a sample (``sampled``: an :class:`Exploration`, not run), the
        class saving its fraction of each call meanwhile (at most ``horizon`` + 1; bisected)."""
        per_call = self.plan.fraction * max(self.max_iters, 1) * (self.plan.fastest or 0.0) * self.problem.N
        keep, sp, plan = self.bank_for_load, self.sp, self.plan

        def fits(k):
            saved = k * per_call
            if not self.hopeless(saved) or sample_first(sp, self.problem, plan, self.max_iters, saved):
                return True
            return sampled is not None and sampled.fits(plan, saved)

        lo, hi = 1, horizon + 1  # fits(hi) taken as true: the answer is in [lo, hi]
        try:
            while lo < hi:
                mid = hi - 1 if hi == horizon + 1 else (lo + hi) // 2  # (the horizon first)
                lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
            return lo
        finally:
            self.bank_for_load = keep

    def first(self, kernel, iters_left=None) -> None:
        """The call's first iterations, on the planned configuration: time what an iteration costs
        (recorded when the plan is a whole-data check, :attr:`Plan.confirm`: the primary's own time
        on the data is what the checked configurations are compared with before the call goes on).

        Two where the call leaves room for them and a proposal after (``iters_left()``: the
        iterations the call has left, 0 once converged): the second prices the rest.
        A call's first iteration carries one-time costs outside its kernels' timing (H200,
        (1 000 000, 128, 1024) diag: 60 ms of wall clock around 15 ms of kernels, the later ones
        20 ms): priced from it, every proposal looked free (70-130 ms over the pinned call on an
        account of 0 ms). A split is charged its wall clock beyond its kernels and the loop's part."""

        def primary():
            t = time.perf_counter()
            run = self.step(self.plan.primary, kernel, self.plan.confirm)
            return run, time.perf_counter() - t

        steps = [primary()]
        left = self.max_iters - 1 if iters_left is None else iters_left()  # (0 once converged)
        if left >= 2 + _runs_each(self.sp.backend):  # a second, then a proposal's runs and one more
            steps.append(primary())
        (run, wall), primes = steps[-1], len(steps)
        self.t_kernel = run.iter_seconds[0] or wall
        # an iteration run alone costs more than in the loop (uncounted: 60-80 ms over on 23-33),
        # less the loop's part (the class's last loop; none yet: nothing charged); noise one-sided
        # (stalls of 100 ms beside a busy core): the least seen in these steps and before
        ck, costs = selection.problem_class(self.problem), self.sp._costs
        if getattr(self.sp.backend, "split_costs_more", False) and (gap := costs.loop_gap.get(ck)) is not None:
            now = min(max(w - (r.iter_seconds[0] or w) - gap, 0.0) for r, w in steps)
            self.entry = costs.in_place_entry[ck] = min(now, costs.in_place_entry.get(ck, now))
        self.spent += self.entry * primes  # (the second, and the rest of the call, run alone)
        # a kernel's first launch in the session may still sit inside the timed part: where the
        # class's whole-data best is known, that part counts at no more than it (the wall clock's
        # part beyond it, the call's own per-iteration overhead, is kept)
        known = self.plan.fastest * self.problem.N if self.plan.fastest else None
        self.t_iter = max(min(wall, known), wall - max(self.t_kernel - known, 0.0)) if known else wall
        self.allowance = max(self._allowance(self.t_iter) - self.spent_before, 0.0)
        self.sp._costs.in_place_iter[selection.problem_class(self.problem)] = self.t_iter
        log.debug(
            "in place: iteration %d of the primary %.3g s (kernels %.3g, known %.3g) priced %.3g s; allowance %.3g s",
            primes,
            wall,
            self.t_kernel,
            known or 0.0,
            self.t_iter,
            self.allowance,
        )

    def _allowance(self, t_iter: float, saved: float = 0.0) -> float:
        """The call's allowance for iterations of ``t_iter`` seconds: its own share and what the
        class left unspent (and ``saved`` more), less what exploring in place has cost the class in
        this process."""
        ck = selection.problem_class(self.problem)
        base = self.sp.policy.explore_allowance(self.problem, self.max_iters, 0.0, t_iter, self.plan.fraction)
        banked = max(self.plan.banked + saved - self.sp._costs.in_place_spent.get(ck, 0.0), 0.0)
        # what the class saved beyond BANK_CALLS calls: spent only on a module's first load
        self.bank_for_load = max(banked - BANK_CALLS * base, 0.0)
        return base + min(banked, BANK_CALLS * base)

    def _unknown(self) -> float:
        """The ratio charged to a configuration nothing predicts (:func:`unknown_ratio`)."""
        return unknown_ratio(self.sp.backend, self.plan)

    def _prior(self, cfg, unknown: float) -> float:
        """The ratio charged to ``cfg`` when nothing of the class predicts it (:func:`_ratio_or`)."""
        return _ratio_or(cfg, self.plan.primary, self.problem.cvtype, unknown)

    def _load_extra(self, loaded: bool, load: float) -> float:
        """What the class's savings beyond :data:`BANK_CALLS` calls add to the allowance for a
        configuration: its module's first load, where it is not loaded (at most what is saved)."""
        return 0.0 if loaded else min(load, self.bank_for_load)

    def _priced(self, cfg, t_kernel, unknown, loaded):
        """(ratio, load, seconds) a configuration is charged before it runs in place: its
        ratio (predicted, a whole-data check's sampled time against ``t_kernel``, else
        ``unknown``) less one, times ``t_kernel`` per run, plus its kernel's look-up or load."""
        sp, problem, plan = self.sp, self.problem, self.plan
        ratio = plan.predicted.get(cfg, self._prior(cfg, unknown))
        sampled = plan.confirm_times.get(cfg)
        if sampled is not None and t_kernel:
            # a whole-data check: its sampled time against the primary's, timed on the data now
            ratio = max(sampled * problem.N / t_kernel, 1.0)
        load = sp._costs.lookup.get(selection.problem_class(problem), 0.0) if loaded else _first_load(sp)
        runs = _runs_each(sp.backend)
        splits = runs * self.entry  # (the rest's is spent already)
        return ratio, load, runs * max(ratio - 1.0, 0.0) * t_kernel + load + splits

    def price(self, cfg, t_kernel) -> float:
        """Seconds exploring ``cfg`` in place is charged against the allowance (before it runs),
        with the class's fastest iteration ``t_kernel`` seconds."""
        loaded = self.sp.backend.is_loaded(cfg.variant, cfg.params, self.problem)
        return self._priced(cfg, t_kernel, self._unknown(), loaded)[2]

    def explore(self, iters_left) -> list:
        """Explore what fits while at least one iteration is left for the best; returns the labels
        explored."""
        sp, backend, problem, plan = self.sp, self.sp.backend, self.problem, self.plan
        runs_each = _runs_each(backend)
        unknown = self._unknown()
        ck = selection.problem_class(problem)
        for cfg in plan.explore:
            if iters_left() < runs_each + 1:
                break
            loaded = backend.is_loaded(cfg.variant, cfg.params, problem)
            ratio, load, predicted = self._priced(cfg, self.t_kernel, unknown, loaded)
            shown = (cfg.label, ratio, load, predicted, self.spent, self.allowance)
            log.debug("in place %s: ratio %.3g, load %.3g s, predicted %.3g s; %.3g of %.3g s spent", *shown)
            # a module's first load (~15 ms on CUDA) may come out of what the class saved beyond
            # BANK_CALLS calls: a class of calls of tens of milliseconds never held one otherwise
            extra = self._load_extra(loaded, load)
            if self.spent + predicted > self.allowance + extra:
                self.skipped.append(cfg.label)
                continue
            self.allowance += extra
            self.bank_for_load -= extra
            t = time.perf_counter()
            kernel = sp._kernel(cfg, problem, sp.policy)
            if kernel is None:
                continue
            if loaded:
                sp._costs.lookup[ck] = max(sp._costs.lookup.get(ck, 0.0), time.perf_counter() - t)
            else:
                sp._costs.load_seconds = time.perf_counter() - t
            runs = []
            try:
                for _ in range(runs_each):
                    runs.append(self.step(cfg, kernel, False))
            except KernelError as exc:
                sp.policy.record(backend, problem, cfg, "launch-failed")
                log.warning("asp_gmm: variant %s failed at run time (%s); not retried", cfg.label, exc)
                self.spent += max(time.perf_counter() - t - len(runs) * self.t_iter, 0.0)
                continue
            took = time.perf_counter() - t
            self.spent += max(took - runs_each * (self.t_iter - self.entry), 0.0)  # (against the loop's)
            its = " ".join(f"{r.iter_seconds[0]:.3g}" for r in runs)
            log.debug("in place %s: %.3g s for %d run(s) of %s s", cfg.label, took, runs_each, its)
            best = min(runs, key=lambda r: r.iter_seconds[0])
            sp.policy.record(backend, problem, cfg, "ok", best.iter_seconds[0], best.cov_seconds[0], 1)
            worst = best.iter_seconds[0] / max(self.t_kernel, 1e-12)
            unknown = max(unknown, worst)
            self.runs += 1
            self.done.append(cfg.label)
        sp._costs.in_place_spent[ck] = sp._costs.in_place_spent.get(ck, 0.0) + self.spent
        return self.done

    def account(self) -> dict:
        """What exploring cost the call (a sample's exploration before, included) against its allowance."""
        return {
            "spent": self.spent + self.spent_before,
            "allowance": self.allowance + self.spent_before,
            "copy": 0.0,
            "runs": self.runs,
            "skipped": list(self.skipped),
            "sample": self.problem.N,
        }

    def summary(self) -> str:
        line = f"explored {self.runs} in place: {1e3 * self.spent:.3g} ms of a {1e3 * self.allowance:.3g} ms allowance"
        if self.spent_before:
            line = f"explored on a sample ({1e3 * self.spent_before:.3g} ms), then {line} left"
        if self.skipped:
            line += f"; left for later calls (would overshoot): {', '.join(self.skipped)}"
        return line
