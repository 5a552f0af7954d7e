"""Runs many independent EM problems in one call: the batched counterpart of the specializer.

Given the members' data, parameters and problems (one D, cvtype and dtype; each its own N and
M), :class:`BatchSpecializer` asks the selection for a batched variant of the backend
(``phase = "batch"`` manifests, limits as data) for the batch's class
(:class:`asp_gmm.problem.BatchProblem`: the events of all members, the largest M, the member
count), compiles or loads it, opens one batched session over all members, runs their EM loops
in one call, and reports the batch's time back to the history under the batched variant (so a
batch's timings never mix with single problems'). A call that explores runs its candidate in
place for one iteration of the batch (the second), where its predicted cost fits the allowance and
every member runs at least :data:`IN_PLACE_MIN_ITERS` iterations; a call of fewer iterations
explores by running whole on the candidate, as all did before.

A backend without batched variants (the NumPy reference) runs the members one after another
through the ordinary :class:`~asp_gmm.specializer.Specializer`. Members fail alone: a bad member's
exception is returned in its slot and the others' results are kept.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref
from dataclasses import dataclass

import numpy as np

from . import registry, selection
from .explore import unknown_ratio
from .backends.batch_base import BatchRuns, DeviceStack, MemberRun, check_problems
from .errors import CompileError, KernelError
from .problem import BatchProblem
from .registry import Config
from .specializer import Specializer, TrainResult

log = logging.getLogger("asp_gmm")

_SUPPORT: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
#: A batched call explores its planned candidate in place (its second iteration) where every member
#: runs at least this many iterations: none can stop within the first two, and one is left after.
IN_PLACE_MIN_ITERS = 3


def _joined_runs(segments: list, max_iters: int) -> BatchRuns:
    """One :class:`BatchRuns` of consecutive segments of the same members' EM (each segment's
    trace starts where the last one's ended)."""
    last = segments[-1]
    out = BatchRuns.empty(len(last.loglik), max_iters)
    out.loglik, out.converged, out.skipped = last.loglik.copy(), last.converged.copy(), last.skipped.copy()
    out.trace[:, 0] = segments[0].trace[:, 0]
    at = np.zeros(len(last.loglik), np.int64)
    for seg in segments:
        for b in range(len(at)):
            k = int(seg.iters[b])
            if k:
                out.trace[b, at[b] + 1 : at[b] + 1 + k] = seg.trace[b, 1 : 1 + k]
                at[b] += k
        for b, e in seg.errors.items():
            out.errors.setdefault(b, e)
    out.iters = at
    for b in out.errors:  # a member failed in an earlier segment: its last log-likelihood stands
        if np.isnan(out.loglik[b]) and at[b]:
            out.loglik[b] = out.trace[b, at[b]]
    return out


_LOCK = threading.Lock()


def _joined(X, support=None):
    """A member given as parts (``X.parts``, e.g. :class:`asp_gmm.Concat`) or as rows of an
    immutable array (``X.X``, ``X.index``: :class:`asp_gmm.Rows`) as one array, unless ``support``
    (a batch support) takes that form itself."""
    parts = getattr(X, "parts", None)
    if parts is not None:
        if support is not None and support.takes_parts:
            return X
        return parts[0] if len(parts) == 1 else np.concatenate(parts)
    index = getattr(X, "index", None)
    if index is not None and isinstance(getattr(X, "X", None), np.ndarray):
        if support is not None and support.takes_rows:
            return X
        return X.X[index]
    return X


def batch_support(backend):
    """The backend's :class:`~asp_gmm.backends.batch_base.BatchSupport`, or ``None`` when it has no
    batched variants (one per backend object)."""
    with _LOCK:
        if backend in _SUPPORT:
            return _SUPPORT[backend]
        sup = None
        if backend.name == "c":
            from .backends.c_batch import CBatchSupport

            sup = _SelectionView(backend, CBatchSupport(backend))
        elif backend.name == "cuda":
            from .backends.cuda.batch import CudaBatchSupport

            sup = _SelectionView(backend, CudaBatchSupport(backend))
        _SUPPORT[backend] = sup
        return sup


class _SelectionView:
    """The backend as the selection sees a batch: its device and limits, with the batched
    variants' readiness (the selection asks whether a configuration is compiled)."""

    def __init__(self, backend, support):
        self._backend, self.support = backend, support

    def __getattr__(self, name):
        return getattr(self._backend, name)

    @property
    def preference(self) -> list:
        """The batched variants in the fixed rule's order (:func:`asp_gmm.selection.rule_order`)."""
        return list(self.support.preference)

    def is_ready(self, variant, tunables, problem):
        return self.support.is_ready(variant, tunables, problem)

    def readiness_token(self):
        return (self._backend.readiness_token(), self.support.readiness_token())

    def run_threads(self, problem):
        return self._backend.run_threads(BatchProblem(10**12, problem.D, problem.M, problem.cvtype, problem.dtype))


@dataclass
class StackedFit:
    """The results of :meth:`BatchSpecializer.train_stacked`: float64 ``weights (B, M)``, ``means
    (B, M, D)``, ``covars``; the runs as arrays (:class:`~asp_gmm.backends.batch_base.BatchRuns`);
    ``errors`` (member -> exception: refused before the run or failed in it; such a member's
    parameters are not meaningful); the variant's label, why it was chosen and the call's seconds."""

    weights: np.ndarray
    means: np.ndarray
    covars: np.ndarray
    runs: BatchRuns
    errors: dict
    variant: str | None
    reason: str
    seconds: float


class BatchSpecializer:
    """Runs batches for the Face on one backend (with the policy of the models' specializer)."""

    def __init__(self, specializer: Specializer):
        self.single = specializer
        self.backend = specializer.backend
        self.policy = specializer.policy

    def candidates(self, view, bp: BatchProblem, variant: str | None = None) -> list:
        out = []
        if variant is not None:
            from .errors import VariantNotApplicableError

            names = [v.name for v in view.support.variants()] if view is not None else []
            if variant not in names:
                raise ValueError(
                    f"the {self.backend.name} backend has no batched variant {variant!r}; it has {names or 'none'}"
                )
            v = next(v for v in view.support.variants() if v.name == variant)
            tun = view.support.tunables_for(v, bp)
            if tun is None:
                raise VariantNotApplicableError(
                    f"pinned batched variant cannot run this batch: {v.check(bp, extra=view.limit_context())}"
                )
            return [Config.of(v, tun)]
        for v in view.support.variants():
            if bp.cvtype not in v.cvtypes or bp.dtype not in v.dtypes:
                continue
            tun = view.support.tunables_for(v, bp)
            if tun is not None and v.selectable_for(bp, view.limit_context()):
                out.append(Config.of(v, tun))
        return out

    def train(self, Xs, params, problems, reg_covars, min_iters, max_iters, tol, variant=None) -> list:
        """Per member, a :class:`~asp_gmm.specializer.TrainResult` or the exception it raised
        (``variant``: a batched variant's name, pinned)."""
        if not problems:
            return []

        def collect(session, bad, runs, cfg, plan, total):
            out = [None] * len(problems)
            for b, r in enumerate(runs.member_runs()):
                if bad[b] is not None:
                    out[b] = bad[b]
                    continue
                if r.error is not None:
                    out[b] = r.error
                    continue
                w, mu, cv = session.params(b)
                out[b] = TrainResult(
                    w,
                    mu,
                    cv,
                    r.loglik,
                    r.iters,
                    r.converged,
                    cfg.label,
                    [c.label for c in plan.explore[:1]],
                    plan.reason,
                    total,
                    r.loglik_trace or [r.loglik],
                    plan.why,
                )
            return out

        got = self._em(
            Xs,
            problems,
            reg_covars,
            min_iters,
            max_iters,
            tol,
            variant,
            lambda s: s.set_params(params, reg_covars),
            collect,
        )
        if got is None:
            return self._one_by_one([_joined(X) for X in Xs], params, problems, reg_covars, min_iters, max_iters, tol)
        return got

    def train_stacked(self, Xs, weights, means, covars, problems, reg_covars, min_iters, max_iters, tol, variant=None):
        """:meth:`train` for members of one M with parameters and results as stacked float64 arrays
        (``weights (B, M)``, ``means (B, M, D)``, ``covars (B, M, D, D)`` or ``(B, M, D)``): no
        per-member Python where the backend's session takes arrays (a batch of 1 000 small
        problems). Returns a :class:`StackedFit`."""
        B = len(problems)

        def collect(session, bad, runs, cfg, plan, total):
            w, mu, cv = session.params_stacked()
            errors = dict(runs.errors)
            for b, e in enumerate(bad):
                if e is not None:
                    errors[b] = e
            return StackedFit(w, mu, cv, runs, errors, cfg.label, plan.reason, total)

        def load(session):
            return session.set_params_stacked(weights, means, covars, reg_covars)

        got = self._em(Xs, problems, reg_covars, min_iters, max_iters, tol, variant, load, collect) if B else None
        if got is not None:
            return got
        t0 = time.perf_counter()
        res = self._one_by_one(
            [_joined(X) for X in Xs], list(zip(weights, means, covars)), problems, reg_covars, min_iters, max_iters, tol
        )
        w, mu, cv = np.array(weights, np.float64), np.array(means, np.float64), np.array(covars, np.float64)
        runs = BatchRuns.of(
            [
                MemberRun(error=r)
                if isinstance(r, BaseException)
                else MemberRun(r.loglik, r.iters, r.converged, r.loglik_trace)
                for r in res
            ],
            max_iters,
        )
        label = None
        for b, r in enumerate(res):
            if not isinstance(r, BaseException):
                w[b], mu[b], cv[b] = r.weights, r.means, r.covars
                label = r.variant
        return StackedFit(w, mu, cv, runs, dict(runs.errors), label, "one by one", time.perf_counter() - t0)

    def _em(self, Xs, problems, reg_covars, min_iters, max_iters, tol, variant, load, collect):
        """The batched EM call: selection, kernel, one session; ``load(session)`` sets the
        parameters (per member ``None`` or a refusal), ``collect(session, refused, runs, cfg, plan,
        seconds)`` reads the results before the session closes. ``None`` when the backend has no
        batched variant for this batch (the caller runs the members one by one)."""
        check_problems(problems)
        view = batch_support(self.backend)
        bp = BatchProblem.of(problems)
        cands = self.candidates(view, bp, variant) if (view is not None or variant) else []
        if not cands:
            return None
        if not (isinstance(Xs, (np.ndarray, DeviceStack)) and Xs.ndim == 3):  # (B, N, D): the members as they are
            Xs = [_joined(X, view.support) for X in Xs]
        t_start = time.perf_counter()
        tuning = selection.autotune_enabled()
        # a settled class runs its last plan while nothing it stands on changed (SETTLED_CALLS)
        ask = variant is None and tuning
        store = self.single._costs.settled
        skey, decl = self._settled_key("train", bp, cands)
        plan = self.policy.settled_plan(store, skey, view, bp, decl) if ask else None
        settled = plan is not None
        if plan is None:
            plan = self.policy.choose(view, bp, cands, pinned=variant is not None, tuning=tuning)
        calm = not (plan.explore or plan.compile_later or plan.primary_in_background or plan.confirm)
        later = list(plan.compile_later)
        # a candidate explores in place (one iteration of the batch, within the allowance) where no
        # member can stop in the iterations it shares; else, as before, a whole call runs on it
        in_place = bool(plan.explore) and min_iters >= IN_PLACE_MIN_ITERS
        if in_place and not self._may_fit(bp, plan, max_iters):
            # known not to fit even before the call times anything: one EM call on the primary (not
            # split around an iteration whose candidate would not run)
            in_place, plan = False, dataclasses.replace(plan, explore=[])
        if plan.explore and not in_place:
            cfg = plan.explore[0]
        else:
            cfg = self._ready_or_compiled(view, plan, cands, bp, later)
        try:
            kernel = view.support.kernel(cfg.variant, cfg.params, bp)
        except CompileError:
            self.policy.record(view, bp, cfg, "compile-failed")
            raise
        t_open = time.perf_counter()
        session = view.support.open(Xs, problems, kernel)
        try:
            bad = load(session)
            t_open = time.perf_counter() - t_open
            skip = {b for b, e in enumerate(bad) if e is not None}
            t0 = time.perf_counter()
            try:
                if in_place:
                    runs, explored, seconds, iters = self._in_place(
                        view, bp, plan, session, Xs, problems, reg_covars, min_iters, max_iters, tol, skip, t_open
                    )
                    plan = dataclasses.replace(plan, explore=explored)
                else:
                    runs = session.em_arrays(
                        min_iters=min_iters, max_iters=max_iters, tol=tol, reg_covars=reg_covars, skip=skip
                    )
                    seconds = time.perf_counter() - t0
                    iters = int(runs.iters.max()) if len(runs.iters) else 0
            except KernelError:
                self.policy.record(view, bp, cfg, "launch-failed")
                raise
            if tuning and iters and not skip:
                self.policy.record(view, bp, cfg, "ok", seconds / iters, None, iters)
            out = collect(session, bad, runs, cfg, plan, time.perf_counter() - t_start)
        finally:
            session.close()
        for c in later:
            self._compile_later(view, c, bp)
        if ask and not settled:
            if calm and cfg == plan.primary:  # (a class with candidates left for later: planned every call)
                self.policy.settle(store, skey, view, bp, plan, extra=decl)
            else:
                store.pop(skey, None)
        return out

    @staticmethod
    def _settled_key(kind, bp, cands):
        """``(key, declarations)`` of the batch class's settled plan for ``kind`` of call (training,
        scoring; :meth:`Policy.settled_plan`, in the runtime's store). (The bundled meeting planned
        193 batched calls of 18 classes: 73 ms of its 2-core CPU time.)"""
        key = ("batch", kind, selection.problem_class(bp), tuple(c.label for c in cands))
        return key, registry.all_variants()

    def _priced(self, bp, plan, max_iters, t_iter):
        """``(class key, ratio, allowance)`` of exploring the plan's first candidate in place in a
        call of iterations of ``t_iter`` seconds: the plan's ratio for it (the unknown ratio where
        nothing predicts it) and the call's share plus the class's whole bank (not BANK_CALLS
        calls' worth: one iteration of a candidate nothing predicts is charged (unknown - 1)
        iterations, more than a few calls' shares of a short call, so capped it never ran; the
        class's exploring stays within its fraction of its time)."""
        ck = ("batch",) + selection.problem_class(bp)
        ratio = plan.predicted.get(plan.explore[0], unknown_ratio(self.backend, plan))
        bank = max(plan.banked - self.single._costs.in_place_spent.get(ck, 0.0), 0.0)
        return ck, ratio, self.policy.explore_allowance(bp, max_iters, 0.0, t_iter, plan.fraction) + bank

    def _may_fit(self, bp, plan, max_iters) -> bool:
        """False when the class's known whole-data time shows that the candidate's predicted cost
        (as :meth:`_in_place` prices it, less the session's opening) exceeds the allowance."""
        if not plan.fastest:
            return True
        t = plan.fastest * bp.N
        _, ratio, allowance = self._priced(bp, plan, max_iters, t)
        return max(ratio - 1.0, 0.0) * t <= allowance

    def _in_place(self, view, bp, plan, session, Xs, problems, reg_covars, min_iters, max_iters, tol, skip, t_open):
        """The batch's EM on ``session`` (the primary's) with the plan's first candidate run for its
        second iteration in a session of its own, where its predicted cost fits the allowance: the
        members' parameters go over and back, and no member can stop within those iterations
        (``min_iters`` >= :data:`IN_PLACE_MIN_ITERS`), so the results are the primary's up to the
        candidate's rounding. Charged: the candidate's session and iteration less the primary's
        iteration it replaces; predicted before it runs from the primary's first iteration times
        the plan's ratio for it (the unknown ratio where nothing predicts it) plus a session's
        opening as the primary's took. Returns (runs, [explored], the primary's seconds, its iterations).

        (A whole call on an unexplored candidate cost a fresh history's bundled meeting up to 3-6x
        a call: 0.79 s of training against 0.2.)"""
        cand = plan.explore[0]
        costs = self.single._costs
        t0 = time.perf_counter()
        first = session.em_arrays(min_iters=1, max_iters=1, tol=0.0, reg_covars=reg_covars, skip=skip)
        t_p = time.perf_counter() - t0
        segments, explored = [first], []
        ck, ratio, allowance = self._priced(bp, plan, max_iters, t_p)
        predicted = max(ratio - 1.0, 0.0) * t_p + t_open
        done = {b for b in first.errors} | set(skip)
        spent = 0.0
        if predicted <= allowance and view.is_ready(cand.variant, cand.params, bp):
            t1 = time.perf_counter()
            other = None
            try:
                other = view.support.open(Xs, problems, view.support.kernel(cand.variant, cand.params, bp))
                mine = [session.params(b) for b in range(len(problems))]
                refused = other.set_params(mine, reg_covars)
                t2 = time.perf_counter()
                gone = done | {b for b, e in enumerate(refused) if e is not None}
                second = other.em_arrays(min_iters=1, max_iters=1, tol=0.0, reg_covars=reg_covars, skip=gone)
                t_c = time.perf_counter() - t2
                if gone == done and not second.errors:
                    theirs = [mine[b] if b in done else other.params(b) for b in range(len(problems))]
                    if any(e is not None for e in session.set_params(theirs, reg_covars)):
                        session.set_params(mine, reg_covars)  # the candidate's iteration is dropped
                    else:
                        segments.append(second)
                        explored.append(cand)
                        self.policy.record(view, bp, cand, "ok", t_c, None, 1)
            except (KernelError, CompileError) as exc:
                self.policy.record(view, bp, cand, "launch-failed")
                log.warning("asp_gmm: batched variant %s failed at run time (%s); not retried", cand.label, exc)
            finally:
                if other is not None:
                    other.close()
            spent = max(time.perf_counter() - t1 - t_p, 0.0)
            costs.in_place_spent[ck] = costs.in_place_spent.get(ck, 0.0) + spent
        log.debug(
            "batched in place %s: ratio %.3g, predicted %.3g s, spent %.3g s of %.3g s",
            cand.label,
            ratio,
            predicted,
            spent,
            allowance,
        )
        k = len(segments)
        t3 = time.perf_counter()
        rest = session.em_arrays(
            min_iters=max(min_iters - k, 0), max_iters=max_iters - k, tol=tol, reg_covars=reg_covars, skip=done
        )
        seconds = t_p + time.perf_counter() - t3
        runs = _joined_runs(segments + [rest], max_iters)
        iters = int(runs.iters.max()) if len(runs.iters) else 0
        return runs, explored, seconds * iters / max(iters - (k - 1), 1), iters

    @staticmethod
    def _ready_or_compiled(view, plan, cands, bp, later):
        """The plan's primary, or, where it is not compiled yet, a compiled configuration of the
        fixed rule's order (the primary then compiles in the background: ``later`` gets it). A call
        never waits for an optional compile: the 1-hour diarization waited 1.3 s for one, and a
        scoring call, which asked for the primary as it was, waited for a compile running beside
        it."""
        cfg = plan.primary
        if not plan.primary_in_background or view.is_ready(cfg.variant, cfg.params, bp):
            return cfg
        alt = next(
            (c for c in selection.rule_order(view, cands) if c != cfg and view.is_ready(c.variant, c.params, bp)),
            None,
        )
        if alt is None:
            return cfg
        later.append(cfg)
        return alt

    def prepare(self, batches) -> int:
        """Compile or load, for every given batch class (:class:`~asp_gmm.problem.BatchProblem`),
        the batched configuration the selection runs first, load the others already compiled, and
        open the tuning history, so that the first batched calls pay for none of it; the class's
        configurations not compiled yet (those the history may explore) start compiling in the
        background. Returns how many configurations are ready now.

        (Compiling every candidate here made a cold 1-hour diarization wait 9.7 s for its warm-up
        once GBS joined GB: six configurations a class where two had been.)"""
        view = batch_support(self.backend)
        if view is None:
            return 0
        # the history is read once per process: here rather than in the first call
        warm = getattr(self.policy.selector, "warm", None)  # a selector need not subclass Selector
        if warm is not None:
            warm(view, batches)
        ready = 0
        # every class's first configuration compiles at once (each on the background pool, then
        # waited for): one after the other, a cold run's warm-up waited for each compile in turn
        firsts, extras = [], []
        for bp in batches:
            cands = self.candidates(view, bp)
            if cands:
                first = self.policy.choose(view, bp, cands, tuning=False).primary
                firsts.append((bp, cands, first, self._compile_later(view, first, bp)))
                extras.append(self._prepare_class_later(view, bp))
        for fut in extras:  # (a failure here is the first call's to report)
            if fut is not None:
                fut.exception()
        for bp, cands, first, fut in firsts:
            try:
                if fut is not None:
                    fut.result()
                view.support.kernel(first.variant, first.params, bp)  # loaded now (compiled above)
                ready += 1
            except CompileError:
                self.policy.record(view, bp, first, "compile-failed")
            for cfg in cands:
                if cfg == first:
                    continue
                if view.is_ready(cfg.variant, cfg.params, bp):  # compiled: loaded now (no compile)
                    try:
                        view.support.kernel(cfg.variant, cfg.params, bp)
                        ready += 1
                    except CompileError:
                        self.policy.record(view, bp, cfg, "compile-failed")
                else:
                    self._compile_later(view, cfg, bp)
        return ready

    def _prepare_class_later(self, view, bp):
        """:meth:`~asp_gmm.backends.batch_base.BatchSupport.prepare_class` of ``bp`` on the
        background pool (once per class); the future, or None where the backend has no pool (then
        it runs here)."""
        fn = getattr(self.backend, "_submit", None)
        if fn is None:
            view.support.prepare_class(bp)
            return None
        return fn(
            ("batch-class", bp.D, bp.M, bp.cvtype, bp.dtype),
            lambda: view.support.prepare_class(bp),
            f"batched {bp.cvtype} {bp.dtype} D={bp.D} M={bp.M}",
        )

    def _compile_later(self, view, cfg, bp):
        """Compile ``cfg`` for ``bp`` on the background pool (once per configuration and class);
        the future, or None where the backend has no pool."""
        fn = getattr(self.backend, "_submit", None)
        if fn is None:
            return None
        return fn(
            ("batch", cfg, bp.cvtype, bp.dtype), lambda: view.support.kernel(cfg.variant, cfg.params, bp), cfg.label
        )

    def score(self, Xs, params, problems, reg_covars) -> list:
        """Per member, its per-event log-likelihood ``(N_b,)`` or the exception it raised."""
        if not problems:
            return []
        check_problems(problems)
        view = batch_support(self.backend)
        bp = BatchProblem.of(problems)
        cands = self.candidates(view, bp) if view is not None else []
        if not cands:
            out = []
            for X, (w, mu, cv), p, reg in zip(Xs, params, problems, reg_covars):
                try:
                    out.append(self.single.evaluate(X, w, mu, cv, p, reg, want_resp=False)[0])
                except (ArithmeticError, ValueError, RuntimeError) as exc:
                    out.append(exc)
            return out
        store = self.single._costs.settled
        skey, decl = self._settled_key("score", bp, cands)
        plan = self.policy.settled_plan(store, skey, view, bp, decl)
        if plan is None:
            plan = self.policy.choose(view, bp, cands, tuning=False)
            if not plan.primary_in_background:
                self.policy.settle(store, skey, view, bp, plan, extra=decl)
        later = []
        cfg = self._ready_or_compiled(view, plan, cands, bp, later)
        for c in later:
            self._compile_later(view, c, bp)
        kernel = view.support.kernel(cfg.variant, cfg.params, bp)
        session = view.support.open_scoring(Xs, problems, kernel)
        try:
            bad = session.set_params(params, reg_covars)
            skip = {b for b, e in enumerate(bad) if e is not None}
            got = session.score(skip=skip)
            return [bad[b] if b in skip else got[b] for b in range(len(problems))]
        finally:
            session.close()

    def _one_by_one(self, Xs, params, problems, reg_covars, min_iters, max_iters, tol) -> list:
        out = []
        for X, (w, mu, cv), p, reg in zip(Xs, params, problems, reg_covars):
            try:
                out.append(self.single.train(X, w, mu, cv, p, reg, min_iters, max_iters, tol))
            except (ArithmeticError, ValueError, RuntimeError) as exc:
                out.append(exc)
        return out
