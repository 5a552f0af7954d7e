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

import numpy as np

from . import registry, selection
from .fit import passes, sources
from .fit.result import TrainResult
from .backends import get_backend
from .errors import CompileError, KernelError, VariantNotApplicableError
from .problem import Problem
from .runtime import default_runtime
from .reference import change_per_event
from .reference import converged as converged_rule
from .selection import Config
from .explore import BANK_CALLS, Exploration, InPlace, in_place_cheaper, sample_first

__all__ = ["BANK_CALLS", "SAMPLE_ROUNDS", "SETTLED_CALLS", "Specializer"]

log = logging.getLogger("asp_gmm")

#: Rounds of sampled exploration in one call (the variants, then steps of the tunable search),
#: each stopped by the policy's allowance of the call's time.
SAMPLE_ROUNDS = 8

#: Calls a settled class reuses its plan for, at most (:data:`asp_gmm.selection.plan.SETTLED_CALLS`)
SETTLED_CALLS = selection.SETTLED_CALLS


class Specializer:
    """Runs EM for the Face on one backend.

    Parameters
    ----------
    backend : str or Backend
    selector : Selector, optional
        Shorthand for ``policy=Policy(selector)``.
    policy : asp_gmm.selection.Policy, optional
        Decides which configuration runs (and explores) each problem; a new
        :class:`~asp_gmm.selection.Policy` on the runtime's selector when not given.
    runtime : asp_gmm.runtime.Runtime, optional
        The process state it draws on (backends, shared histories, the default selector); the
        default runtime when not given.
    """

    def __init__(
        self,
        backend="auto",
        selector: selection.Selector | None = None,
        policy: selection.Policy | None = None,
        runtime=None,
    ):
        self.runtime = runtime if runtime is not None else default_runtime()
        self.backend = get_backend(backend, runtime=self.runtime) if isinstance(backend, str) else backend
        if policy is None:
            policy = selection.Policy(selector, runtime=self.runtime)
        elif policy.runtime is None:
            policy.runtime = self.runtime
            if policy._selector is not None:
                policy._selector.bind(self.runtime)
        self.policy = policy
        self._candidates = self.runtime.candidates_memo(self.backend)
        #: the last call's exploration: {"spent", "allowance", "copy", "runs", "skipped", "sample"}
        #: (seconds; ``sample`` is N when it explored in place; None when it explored nothing)
        self.last_exploration = None
        #: per-iteration seconds of the last call's main run (not its exploration)
        self.last_iter_seconds: list = []
        #: what the backend's sampled explorations cost in this process (the per-run overhead per
        #: class, the sample copy's rate, the calls' own time per iteration), shared with the
        #: backend's other specializers: a call's
        #: first run and its copy are charged before they run (charged nothing, they overshot a
        #: GPU call's allowance 2-6x)
        self._costs = self.runtime.explore_costs(self.backend)

    def _open(self, X, problem: Problem):
        """``backend.open``; a backend that chooses among E-step variants gets this specializer's
        policy to choose with."""
        if getattr(self.backend, "chooses_estep", False):
            return self.backend.open(X, problem, policy=self.policy)
        return self.backend.open(X, problem)

    @property
    def selector(self) -> selection.Selector:
        return self.policy.selector

    def candidates(self, problem: Problem, variant: str | None = None, weighted: bool = False) -> list:
        """Configurations (variant + default tunables) whose limits allow ``problem`` (memoised by the
        backend's selection key: the diarization example asks thousands of times for a handful of
        shapes with ever-new N). ``weighted``: only the variants that take sample weights
        (:attr:`asp_gmm.variant.Variant.takes_weights`; may be empty)."""
        key = (self.backend.selection_key(problem), variant)
        decl = registry.all_variants()  # reloaded declarations (a new variant) invalidate the memo
        got = self._candidates.get(key)
        if got is None or got[0] is not decl:
            if len(self._candidates) > 4096:
                self._candidates.clear()
            got = self._candidates[key] = (decl, self._find_candidates(problem, variant))
        hit = got[1]
        if weighted:
            return [c for c in hit if c.variant.takes_weights]
        return list(hit)

    def _weights_in_session(self, problem: Problem, sample_weight, variant) -> bool:
        """Whether a weighted fit of ``X`` runs in the backend's own session (its kernels fold the
        weights into the posteriors, :meth:`asp_gmm.backends.base.Session.set_sample_weight`) for an
        in-memory X within the device budget (the caller's check): weights as an (N,) array, and a
        candidate variant that takes them. Otherwise the pass loop runs it (:mod:`asp_gmm.fit.passes`)."""
        return (
            getattr(self.backend, "weights_in_session", False)
            and isinstance(sample_weight, np.ndarray)
            and sample_weight.shape == (problem.N,)
            and bool(self.candidates(problem, variant, weighted=True))
        )

    def _find_candidates(self, problem: Problem, variant: str | None) -> list:
        if variant is not None:
            try:
                v = registry.get(self.backend.name, variant, "covariance")
            except KeyError as exc:
                raise ValueError(str(exc.args[0])) from None
            tun = self.backend.tunables_for(v, problem)
            if tun is None:
                why = v.check(problem, extra=self.backend.limit_context())
                raise VariantNotApplicableError(
                    f"pinned variant cannot run this problem: {why}; choose another variant or variant=None"
                )
            return [Config.of(v, tun)]
        # a manifest may keep its variant out of automatic selection (selectable = false, or an
        # expression: measured slower where it fails; still pinnable and tested); exploring it there would
        # only cost compiles
        cands = []
        ctx = self.backend.limit_context()
        for v in self.backend.covariance_variants():
            tun = self.backend.tunables_for(v, problem) if v.selectable_for(problem, ctx) else None
            if tun is not None:  # one walk of the tunables per variant, not a filter and then a pick
                cands.append(Config.of(v, tun))
        if not cands:
            raise VariantNotApplicableError(
                f"no {self.backend.name} variant can run N={problem.N}, D={problem.D}, M={problem.M} "
                f"({problem.cvtype}, {problem.dtype}); see `asp-gmm info` for the variants' limits"
            )
        return cands

    def train(
        self,
        X,
        weights,
        means,
        covars,
        problem: Problem,
        reg_covar: float,
        min_iters: int,
        max_iters: int,
        tol: float,
        variant: str | None = None,
        progress: bool | None = None,
        sample_weight=None,
    ) -> TrainResult:
        """EM from the given parameters (float64) on X: the pass loop (:func:`asp_gmm.fit.passes.em`)
        for a chunk source, an X beyond the device budget or a weighted fit (``sample_weight``,
        checked by the caller) that the backend's session cannot weigh itself, else the backend's
        compiled loop with the policy's plan (weighted: among the variants that take the weights)."""
        streamed = sources.wants_stream(X, self.backend, problem)
        weighed = (
            sample_weight is not None and not streamed and self._weights_in_session(problem, sample_weight, variant)
        )
        if streamed or (sample_weight is not None and not weighed):
            return passes.em(
                self,
                X,
                weights,
                means,
                covars,
                problem,
                reg_covar,
                min_iters,
                max_iters,
                tol,
                variant,
                progress,
                sample_weight=sample_weight,
            )
        t_start = time.perf_counter()
        self.last_iter_seconds = []
        backend = self.backend
        # what every session needs (an EM core...) compiles while the history opens and the plan is made
        backend.prepare_async(problem)
        sel = self.policy
        tuning = selection.autotune_enabled()
        # a settled class runs its last plan while nothing it stands on changed (SETTLED_CALLS)
        ck = selection.problem_class(problem)
        skey = (backend.selection_key(problem), ck, weighed)
        ask = variant is None and tuning  # (decl: the declarations reloaded mean new candidates)
        decl = registry.all_variants()
        plan = sel.settled_plan(self._costs.settled, skey, backend, problem, decl) if ask else None
        settled = plan is not None
        if plan is None:
            plan = sel.choose(
                backend, problem, self.candidates(problem, variant, weighed), pinned=variant is not None, tuning=tuning
            )
        explore = list(plan.explore)
        ready = lambda c: backend.is_ready(c.variant, c.params, problem)  # noqa: E731
        sample = sel.sample_size(problem, len(explore), max_iters) if explore else problem.N
        # a problem large enough for a sample whose iteration still costs less than a sample's
        # session explores in place, within the allowance (small problems: in place, every candidate)
        # (a variant timed only on samples is checked on the whole data: in place too)
        gated = (
            sample < problem.N
            and not plan.primary_in_background
            and (plan.confirm or in_place_cheaper(self, problem, plan))
        )
        # ... but what in place cannot afford (nothing predicts it) is timed on a sample first
        first = sample_first(self, problem, plan, max_iters) if gated and tuning and max_iters >= 2 else []
        if gated and not first:
            sample = problem.N
        note = ""
        spent_before = 0.0  # what the call's sampled exploration spent, before exploring in place
        fits_in = None  # calls until a candidate that nothing fits now may fit (in place)
        if sample < problem.N:
            # large N: explore on a sample of the events (nothing of the call's EM advances), then
            # run every iteration with the best configuration the history now knows
            sampled = []
            # (a class exploring in place times only ``first`` on the sample: the round gets that plan)
            round_plan = dataclasses.replace(plan, explore=first) if first else plan
            ex = Exploration(self, X, problem, sample, max_iters, round_plan)
            try:
                for _ in range(SAMPLE_ROUNDS):  # the variants, then the tunable search while the budget lasts
                    done, stopped = ex.round(round_plan, weights, means, covars, reg_covar)
                    sampled += done
                    if not done and not ex.failed:
                        break  # nothing measured, nothing failed: the plan stands (planning again cost 0.2 ms)
                    plan = round_plan = sel.choose(
                        backend, problem, self.candidates(problem, variant, weighed), tuning=tuning
                    )
                    if stopped or not done or not plan.explore or plan.confirm or first:
                        break  # (a whole-data check runs in place, below)
            finally:
                ex.close()
            self.last_exploration = ex.account()
            note = ex.summary()
            explore = []
            if first:
                # the rest explores in place, within what the sample left of the allowance
                explore, spent_before = list(plan.explore), self.last_exploration["spent"]
            if tuning and max_iters >= 2 and not plan.primary_in_background:
                # variants close to the sample's winner on the sample run on the data in this call
                # (in place, within what the sample left of the allowance): a sample fits caches the
                # data does not, and a call's whole EM on a sample's winner cost up to 3x
                cands = self.candidates(problem, variant, weighed)
                checked = plan if plan.confirm else sel.confirm(backend, problem, cands, plan)
                if checked is not None and checked.explore:
                    plan, gated, spent_before = checked, True, self.last_exploration["spent"]
                    explore = list(plan.explore)
        else:
            self.last_exploration = None
        pending = None  # (config, future) of the planned configuration compiling in the background
        if plan.primary_in_background:
            fut = backend.kernel_async(plan.primary.variant, plan.primary.params, problem)
            if fut is not None:
                pending = (plan.primary, fut)
        session = self._open(X, problem)
        try:
            N = problem.N  # what the change of the log-likelihood is taken per: events, or their weight
            if weighed:
                session.set_sample_weight(sample_weight)
                N = float(np.sum(sample_weight))
            session.set_params(weights, means, covars, reg_covar)
            iters, converged, explored, used = 0, False, [], None
            trace = []
            stand_in = None
            if pending is not None and not pending[1].done():
                stand_in = next(
                    (
                        c
                        for c in selection.rule_order(
                            backend, self.candidates(problem, None, weighed), problem.kernel_cvtype
                        )
                        if c != pending[0] and ready(c)
                    ),
                    None,
                )

            def one_iteration(cfg, kernel, record=True):
                nonlocal iters, converged, used
                before = session.loglik()
                run = session.em(kernel, min_iters=1, max_iters=1, tol=0.0, reg_covar=reg_covar)
                iters += 1
                trace.extend(run.loglik_trace[1 if trace else 0 :])
                used = cfg
                if tuning and record:
                    sel.record(backend, problem, cfg, "ok", run.iter_seconds[0], run.cov_seconds[0], 1)
                converged = converged_rule(iters, min_iters, change_per_event(run.loglik, before, N), tol)
                return run

            if gated and explore and max_iters >= 2:
                # explore in place: the call's first iteration (the planned configuration) prices
                # the others, which run the call's next iterations while they fit the allowance
                in_place = InPlace(self, problem, plan, max_iters, one_iteration, spent_before)
                hopeless = in_place.hopeless()
                if hopeless and ask:
                    # (a class whose iteration is near a sample's fixed cost may explore on a
                    # sample, not gated, next time: its pricing too)
                    n = sel.sample_size(problem, len(plan.explore), max_iters)
                    timed = self._costs.call_seconds.get(ck, 0.0) > 0
                    near = not (timed and in_place_cheaper(self, problem, plan, margin=2.0))
                    probe = Exploration(self, X, problem, n, max_iters, plan) if near and n < problem.N else None
                    fits_in = in_place.calls_to_fit(SETTLED_CALLS, probe)
                kernel = None if hopeless else self._kernel(plan.primary, problem, sel)
                if kernel is None:
                    self.last_exploration = in_place.account()
                    note = in_place.summary()
                else:
                    left = lambda: 0 if converged else max_iters - iters  # noqa: E731
                    in_place.first(kernel, left)
                    explored += in_place.explore(left)
                    if in_place.done:  # the best configuration now known runs the rest
                        best = sel.choose(
                            backend, problem, self.candidates(problem, variant, weighed), tuning=False
                        ).primary
                        if ready(best):
                            plan = dataclasses.replace(plan, primary=best)
                    self.last_exploration = in_place.account()
                    note = in_place.summary()
            if gated:
                explore = []  # (a one-iteration call of such a class explores nothing)
            while explore and iters < max_iters and not converged:
                cfg = explore.pop(0)
                kernel = self._kernel(cfg, problem, sel)
                if kernel is None:
                    continue
                try:
                    one_iteration(cfg, kernel)
                    explored.append(cfg.label)
                except KernelError as exc:
                    sel.record(backend, problem, cfg, "launch-failed")
                    log.warning("asp_gmm: variant %s failed at run time (%s); not retried", cfg.label, exc)
            if stand_in is not None:
                # iterations on a compiled configuration until the planned one's compile finishes
                kernel = self._kernel(stand_in, problem, sel)
                while kernel is not None and not pending[1].done() and iters < max_iters and not converged:
                    try:
                        one_iteration(stand_in, kernel)
                    except KernelError as exc:
                        sel.record(backend, problem, stand_in, "launch-failed")
                        log.warning("asp_gmm: variant %s failed at run time (%s)", stand_in.label, exc)
                        break
                if used is stand_in:
                    log.info(
                        "asp_gmm: %d iteration(s) ran on %s while %s compiled", iters, stand_in.label, pending[0].label
                    )
            skip = set()
            if pending is not None and pending[1].done() and not pending[1].cancelled():
                exc = pending[1].exception()
                if isinstance(exc, CompileError):
                    sel.record(backend, problem, pending[0], "compile-failed")
                    log.warning(
                        "asp_gmm: variant %s did not compile; it is recorded and not retried.\n%s",
                        pending[0].label,
                        exc,
                    )
                    skip.add(pending[0])
            if iters < max_iters and not converged:
                # the planned configuration, then the other candidates should it fail to compile or
                # to run (each failure is recorded and never retried for its source)
                order = itertools.chain(
                    [plan.primary], (c for c in self.candidates(problem, variant, weighed) if c != plan.primary)
                )
                last_exc = None
                for cfg in order:
                    if cfg in skip:
                        continue
                    kernel = self._kernel(cfg, problem, sel, reraise=variant is not None)
                    if kernel is None:
                        continue
                    t_loop = time.perf_counter()
                    try:
                        run = session.em(
                            kernel,
                            min_iters=max(min_iters - iters, 0),
                            max_iters=max_iters - iters,
                            tol=tol,
                            reg_covar=reg_covar,
                        )
                    except KernelError as exc:
                        sel.record(backend, problem, cfg, "launch-failed")
                        if variant is not None:
                            raise
                        log.warning("asp_gmm: variant %s failed at run time (%s); trying another", cfg.label, exc)
                        last_exc = exc
                        continue
                    if run.iters >= 2 and (used is None or ck not in self._costs.loop_gap):
                        # the loop's wall clock per iteration beyond its kernels (the rest of a call
                        # that explored holds a switch back: only until a whole call's is measured)
                        gap = (time.perf_counter() - t_loop - sum(run.iter_seconds)) / run.iters
                        self._costs.loop_gap[ck] = max(gap, 0.0)
                    iters += run.iters
                    trace.extend(run.loglik_trace[1 if trace else 0 :])
                    converged = run.converged
                    used = cfg
                    self.last_iter_seconds = list(run.iter_seconds)  # (benchmarks/selection.py's trail)
                    if tuning and run.iters:
                        sel.record(
                            backend,
                            problem,
                            cfg,
                            "ok",
                            statistics.median(run.iter_seconds),
                            statistics.median(run.cov_seconds),
                            run.iters,
                        )
                    break
                else:
                    raise KernelError(
                        "every candidate variant failed to compile or run; see the warnings above"
                    ) from last_exc
            loglik = session.loglik()
            if not trace:
                trace = [loglik]
            w, mu, cv = session.params()
        finally:
            session.close()
        if iters:  # this call's own time per iteration, exploring left out: the next allowance's basis
            own = time.perf_counter() - t_start - (self.last_exploration or {}).get("spent", 0.0)
            self._costs.call_seconds[ck] = own / iters
        if ask and not settled:
            acct = self.last_exploration or {}
            quiet = not explored and not acct.get("runs") and used == plan.primary and pending is None
            # (candidates left for later calls: settled only until the class's savings may pay one)
            span = SETTLED_CALLS if not acct.get("skipped") else (fits_in or 1) - 1
            if quiet and not plan.compile_later and not plan.confirm:
                sel.settle(self._costs.settled, skey, backend, problem, plan, span, decl)
            else:
                self._costs.settled.pop(skey, None)
        # the candidates to explore compile after the call, not competing with it for the cores
        for c in plan.compile_later:
            backend.kernel_async(c.variant, c.params, problem)
        label = (used.label if used is not None else plan.primary.label) + (" (weighted)" if weighed else "")
        if sample < problem.N:
            explored = sampled
        return TrainResult(
            w,
            mu,
            cv,
            loglik,
            iters,
            converged,
            label,
            explored,
            plan.reason,
            time.perf_counter() - t_start,
            trace,
            plan.why + ("; " if plan.why and note else "") + note,
            weight_sum=N if weighed else 0.0,
        )

    def prepare(self, problem: Problem, variant: str | None = None) -> int:
        """:meth:`prepare_many` of one problem."""
        return self.prepare_many([problem], variant)

    def prepare_many(self, problems, variant: str | None = None) -> int:
        """Make the first calls of ``problems`` pay no compile and no load: the backend's other
        modules and, per problem, the configuration the selection runs first are loaded (compiled
        if need be), every candidate not compiled yet is compiled (all at once on the background
        pool, one thread per core, then waited for), and the history is read. Candidates already
        compiled are not loaded: a call that explores one loads it then (a module load, ~15 ms on
        CUDA); loading the 18 compiled candidates of two shapes cost a warm process 0.27 s for the
        one or two it ran. Returns the configurations ready (compiled) in all; a compile failure
        is recorded as in a real call (and not retried)."""
        sel = self.policy
        problems = list(problems)
        warm = getattr(sel.selector, "warm", None)  # a selector need not subclass Selector
        if warm is not None:
            warm(self.backend, problems)  # the history read before choosing what runs first
        jobs, ready = [], 0
        for p in problems:
            jobs.append((None, p, self.backend.prepare_async(p)))
            cands = self.candidates(p, variant)
            first = (
                sel.choose(self.backend, p, cands, pinned=variant is not None, tuning=False).primary if cands else None
            )
            for cfg in cands:
                if cfg == first or not self.backend.is_ready(cfg.variant, cfg.params, p):
                    jobs.append((cfg, p, self.backend.kernel_async(cfg.variant, cfg.params, p)))
                else:
                    ready += 1
        for cfg, p, fut in jobs:
            if cfg is None:
                if fut is None:
                    self.backend.prepare(p)
                else:
                    fut.result()
                continue
            exc = fut.exception() if fut is not None else None
            if isinstance(exc, CompileError):
                sel.record(self.backend, p, cfg, "compile-failed")
                log.warning("asp_gmm: variant %s did not compile; it is recorded and not retried.\n%s", cfg.label, exc)
                continue
            ready += self._kernel(cfg, p, sel) is not None
        return ready

    def _kernel(self, cfg: Config, problem: Problem, sel, reraise: bool = False):
        try:
            return self.backend.kernel(cfg.variant, cfg.params, problem)
        except CompileError as exc:
            sel.record(self.backend, problem, cfg, "compile-failed")
            if reraise:
                raise
            log.warning("asp_gmm: variant %s did not compile; it is recorded and not retried.\n%s", cfg.label, exc)
            return None

    def evaluate(self, X, weights, means, covars, problem: Problem, reg_covar: float, want_resp=True):
        """``(logprob (N,), resp (N, M) or None)`` of X under the given parameters."""
        session = self._open(X, problem)
        try:
            session.set_params(weights, means, covars, reg_covar)
            return session.eval(want_resp)
        finally:
            session.close()
