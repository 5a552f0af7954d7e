"""The one home of selection policy (:class:`Policy`): the covariance plan, the compile-cost gate on
exploration, the exploration budget and the E-step choice."""

from __future__ import annotations

import dataclasses
import logging

from ..errors import KernelError
from ..problem import Problem
from ..variant import Config
from .history import HistorySelector
from .index import problem_class
from . import plan as _plan
from .plan import (
    ESTEP_PREFERENCE,
    EXPLORE_FRACTION,
    SAMPLE_MIN,
    SETTLED_CALLS,
    Plan,
    RuleSelector,
    Selector,
    rule_order,
)

log = logging.getLogger("asp_gmm")


# ---------------------------------------------------------------------------------- the policy
class Policy:
    """The one home of selection policy: which configuration runs a problem (exploit, explore,
    predict: the :class:`Selector`), the compile-cost gate on exploration, and the E-step choice.

    The specializer is given one (or makes one); a backend that chooses among E-step variants asks
    its policy (:meth:`choose_estep`). Swap it to change the policy; nothing here is global.

    Parameters
    ----------
    selector : Selector, optional
        Plans and records the covariance choice; by default ``runtime``'s selector (a
        :class:`HistorySelector` on its shared history), looked up on each use, or the fixed rule
        without a runtime. A selector given here is bound to ``runtime`` (:meth:`Selector.bind`).
    runtime : asp_gmm.runtime.Runtime, optional
        The process state whose selector and histories are used (the specializer passes its own).
    explore_compile_work : float, optional
        Problems of less work than this per iteration (:attr:`Problem.work`) never compile just to
        explore on backends whose binaries are shape-specific (:data:`EXPLORE_COMPILE_WORK`).
    estep_preference : dict, optional
        Backend name -> E-step variant names in order of preference (:data:`ESTEP_PREFERENCE`).
    """

    def __init__(
        self,
        selector: Selector | None = None,
        explore_compile_work: float | None = None,
        estep_preference: dict | None = None,
        runtime=None,
    ):
        self._selector = selector
        self.runtime = runtime
        if selector is not None and runtime is not None:
            selector.bind(runtime)
        self._explore_compile_work = explore_compile_work
        self.estep_preference = dict(ESTEP_PREFERENCE if estep_preference is None else estep_preference)

    @property
    def explore_compile_work(self) -> float:
        """The work under which exploring never compiles (:data:`asp_gmm.selection.plan.EXPLORE_COMPILE_WORK` unless set)."""
        w = self._explore_compile_work
        return _plan.EXPLORE_COMPILE_WORK if w is None else w

    @property
    def selector(self) -> Selector:
        if self._selector is not None:
            return self._selector
        if self.runtime is not None:
            return self.runtime.selector
        return RuleSelector()

    # ------------------------------------------------------------------ covariance
    def choose(self, backend, problem: Problem, candidates: list, pinned: bool = False, tuning: bool = True) -> Plan:
        """The plan for ``problem`` among ``candidates`` (configurations whose limits allow it).

        With ``tuning`` off nothing is explored; under ``ASP_GMM_DETERMINISTIC=1`` the fixed rule
        alone decides (:func:`asp_gmm.selection.plan.deterministic`). On a backend with shape-specific binaries, a
        problem smaller than :attr:`explore_compile_work` explores only what is already compiled
        and runs a compiled candidate rather than compile the planned one (a compile costs more
        than a small problem can win back; larger problems and ``asp-gmm tune`` fill in).
        Elsewhere a call never waits for an optional compile: it explores only what is compiled
        (``compile_later`` lists the others, compiled in the background after the call), and a
        planned configuration not compiled yet is compiled in the background while the call runs
        on a compiled candidate (``primary_in_background``).
        """
        if _plan.deterministic():
            # the fixed rule, compiled before the call if need be: nothing that depends on the
            # history, on timings or on what happens to be compiled changes the arithmetic
            return RuleSelector().plan(backend, problem, candidates, pinned=pinned)
        plan = self.selector.plan(backend, problem, candidates, pinned=pinned)
        explore = list(plan.explore) if tuning else []
        ready = lambda c: backend.is_ready(c.variant, c.params, problem)  # noqa: E731
        if backend.shape_specific_binaries and problem.work < self.explore_compile_work:
            explore = [c for c in explore if ready(c)]
            if not pinned and not ready(plan.primary):
                alt = next((c for c in rule_order(backend, candidates) if ready(c)), None)
                if alt is not None:
                    plan = dataclasses.replace(
                        plan, primary=alt, explore=[], reason=plan.reason + ", compiled", primary_sampled=False
                    )
            return dataclasses.replace(plan, explore=explore)
        # a call never waits for an optional compile: it explores what is compiled, the others
        # compile after it; a planned configuration not compiled yet compiles in the background
        later = [c for c in explore if not ready(c)]
        explore = [c for c in explore if c not in later]
        return dataclasses.replace(
            plan, explore=explore, compile_later=later, primary_in_background=not pinned and not ready(plan.primary)
        )

    def state_token(self, backend, problem: Problem, local: bool = False):
        """What a plan for ``problem`` stands on (:meth:`Selector.state_token`, with the selector
        itself and the backend's :meth:`~asp_gmm.backends.base.Backend.readiness_token`), or None
        (plan every call): under ``ASP_GMM_DETERMINISTIC=1``, or for a selector that cannot say."""
        if _plan.deterministic():
            return None
        sel = self.selector
        ask = getattr(sel, "state_token", None)  # a selector need not subclass Selector
        token = None if ask is None else ask(backend, problem, local)
        if token is None:
            return None
        return (id(sel), token, backend.readiness_token())

    def settled_plan(self, store: dict, key, backend, problem: Problem, extra=None) -> Plan | None:
        """The plan a settled class reuses for this call (taking one of its calls) from ``store``
        (the runtime's, per backend), or None: none settled, its calls used up, or what it stands
        on changed (:meth:`state_token`, local for a plan from the class's own measurements, and
        ``extra``: e.g. the declarations the candidates came from)."""
        got = store.get(key)
        if got is None:
            return None
        token = self.state_token(backend, problem, got[1].reason == "history")
        if token is None or got[0] != (token, extra):
            store.pop(key, None)
            return None
        if got[2] <= 0:
            return None
        got[2] -= 1
        return got[1]

    def settle(self, store: dict, key, backend, problem: Problem, plan: Plan, most: int = SETTLED_CALLS, extra=None):
        """Note in ``store`` that the class's planned call explored nothing: its next calls reuse
        ``plan`` (with nothing to explore) while what it stands on holds (:meth:`settled_plan`),
        twice as many calls as last time when the plan runs the same configuration, at most
        ``most`` (:data:`SETTLED_CALLS`, or fewer where a candidate left for later may fit sooner;
        under 1: not settled)."""
        token = self.state_token(backend, problem, plan.reason == "history")
        old = store.get(key)
        span = 1
        if old is not None and old[0] == (token, extra) and old[1].primary == plan.primary:
            span = 2 * old[3]
        span = min(span, most)
        if token is None or span < 1:
            store.pop(key, None)
            return
        why = (plan.why + "; " if plan.why else "") + f"settled: planned again after {span} call(s)"
        kept = dataclasses.replace(plan, explore=[], compile_later=[], primary_in_background=False, why=why)
        store[key] = [(token, extra), kept, span, span]

    def confirm(self, backend, problem: Problem, candidates: list, plan: Plan) -> Plan | None:
        """After a call's sampled exploration: ``plan`` with the variants timed only on samples
        that are close to its primary there (compiled ones) to run in place on the whole data
        (:attr:`Plan.confirm`), or None (see :meth:`HistorySelector.confirm`)."""
        ask = getattr(self.selector, "confirm", None)
        if ask is None or _plan.deterministic():
            return None
        got = ask(backend, problem, candidates, plan)
        if got is None:
            return None
        is_ready = lambda c: backend.is_ready(c.variant, c.params, problem)  # noqa: E731
        primary = got.primary if is_ready(got.primary) else plan.primary
        ready = [c for c in got.explore if c != primary and is_ready(c)]
        return dataclasses.replace(got, primary=primary, explore=ready) if ready else None

    def record(
        self,
        backend,
        problem: Problem,
        config: Config,
        status: str,
        seconds: float | None = None,
        cov_seconds: float | None = None,
        repeats: int = 1,
        sampled_from: int | None = None,
    ) -> None:
        """Report a measurement or a failure to the selector (see :meth:`Selector.record`)."""
        if sampled_from is None:
            self.selector.record(backend, problem, config, status, seconds, cov_seconds, repeats)
        else:
            self.selector.record(
                backend, problem, config, status, seconds, cov_seconds, repeats, sampled_from=sampled_from
            )

    # ------------------------------------------------------------------ exploration budget
    def sample_size(self, problem: Problem, n_explore: int, max_iters: int) -> int:
        """Events to explore ``n_explore`` configurations on: ``problem.N`` (explore in place: each
        explored iteration is one of the call's EM iterations) when that is at most a quarter of
        the sample the budget allows, else a sample of about :data:`EXPLORE_FRACTION` of the
        call's events-iterations shared by the explored configurations and the primary (each run
        for one iteration, each allowed twice the primary's time) and the tunable search's
        proposals, at least :data:`SAMPLE_MIN`.
        """
        N = problem.N
        s = max(
            SAMPLE_MIN, int(EXPLORE_FRACTION * max(max_iters, 1) * N / (2 * (n_explore + 1) + _plan.TUNE_PROPOSALS))
        )
        return N if 4 * s > N else s

    def explore_allowance(
        self,
        problem: Problem,
        max_iters: int,
        seconds_per_event: float,
        call_seconds: float | None = None,
        fraction: float = EXPLORE_FRACTION,
    ) -> float:
        """Seconds of a call that exploring may take: ``fraction`` (the plan's) of its estimated time,
        ``max_iters`` iterations of ``problem.N`` events at ``seconds_per_event`` (the fastest
        measured so far), or of ``call_seconds`` each where the specializer's part of the class's
        last call took longer per iteration (the data's upload and the session's set-up are part of
        what the caller waits for, not only the kernels)."""
        per_iter = max(problem.N * seconds_per_event, call_seconds or 0.0)
        return fraction * max(max_iters, 1) * per_iter

    # ------------------------------------------------------------------ E-step
    def choose_estep(self, backend, problem: Problem, candidates: list, pinned: str | None = None):
        """``(variant, tunables)`` of the E-step for ``problem``.

        Parameters
        ----------
        backend : Backend
        problem : Problem
            As the binaries run it (padded, for CUDA).
        candidates : list of (Variant, dict)
            Every E-step variant of the backend, with the tunables combinations its limits allow
            (``[(variant, [tunables, ...])]``, first combination first).
        pinned : str, optional
            A variant name that must be used (``ASP_GMM_CUDA_ESTEP``).

        The fastest E-step measured on this device for the problem's class when the history has
        such timings, else the first candidate in :attr:`estep_preference` order.
        """
        usable = [(v, tuns) for v, tuns in candidates if tuns]
        if pinned:
            usable = [(v, tuns) for v, tuns in usable if v.name == pinned]
        if not usable:
            raise KernelError(
                f"no {backend.name} E-step variant can run {problem}" + (f" (pinned: {pinned})" if pinned else "")
            )
        if pinned:
            return usable[0][0], usable[0][1][0]
        measured = None if _plan.deterministic() else self._estep_measured(backend, problem, usable)
        if measured is not None:
            return measured
        rank = {n: i for i, n in enumerate(self.estep_preference.get(backend.name, []))}
        v, tuns = min(usable, key=lambda vt: rank.get(vt[0].name, len(rank)))
        return v, tuns[0]

    def _estep_measured(self, backend, problem, usable):
        """The fastest measured E-step configuration among ``usable`` in the problem's class, or
        None (no history, no timings, or a history that cannot be read)."""
        sel = self.selector
        if not isinstance(sel, HistorySelector):
            return None
        history = None
        try:
            history = sel.history()
            if history is None:
                return None
            idx = sel.index(backend, history)
        except Exception as exc:  # noqa: BLE001 - a broken history must not break the E-step choice
            if history is not None:
                sel._disable(history, exc)  # as plan() does: stop using it, warn once
            else:
                log.warning("asp_gmm: the tuning history could not be opened (%s); E-step by the default order", exc)
            return None
        measured = idx.classes.get(problem_class(problem), {})
        if not measured:
            return None
        # the class's few measured keys looked up among the candidates, not every candidate's
        # tunables combination (300 for the CUDA E-steps: 1-2 ms of every call) made a key
        where = {(v.backend, v.name, v.source_sha256): (i, v, tuns) for i, (v, tuns) in enumerate(usable)}
        best = None
        for vk, agg in measured.items():
            hit = where.get((vk.backend, vk.name, vk.source_sha256))
            if hit is None:
                continue
            i, v, tuns = hit
            tun = vk.tunables_dict
            try:
                j = tuns.index(tun)
            except ValueError:  # a combination its limits do not allow here
                continue
            cand = (agg.median, i, j, v)
            if best is None or cand[:3] < best[:3]:
                best = cand
        return None if best is None else (best[3], usable[best[1]][1][best[2]])
