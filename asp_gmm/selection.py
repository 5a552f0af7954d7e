"""Which variant runs a problem: pure policy, no compiling and no running.

:class:`Policy` is the one home of it, passed to the specializer (and held by a backend that
chooses among E-step variants): it asks a :class:`Selector` for the plan (rules 1-4 below), applies
the compile-cost gate on exploration (:data:`EXPLORE_COMPILE_WORK`) and chooses the E-step
(:meth:`Policy.choose_estep`: the fastest measured in the problem's class, else
:data:`ESTEP_PREFERENCE`).

The specializer hands a :class:`Selector` the problem, the device and the candidate configurations
(variant + tunables) whose declared limits allow the problem; the selector answers with a
:class:`Plan`: the configuration for the bulk of the iterations and, optionally, configurations to
try for one iteration each first (exploration). After running, the specializer reports every
measured timing and every failure back through :meth:`Selector.record`.

:class:`RuleSelector` is the fixed, documented rule used when no history is available:
the first configuration of the backend's preference list (:data:`PREFERENCE`) that is a candidate.

:class:`HistorySelector` (the default) chooses from the measured history of this device
(``asp_gmm.tuning_db``), invisibly to the caller:

*Problem identity.* Timings are stored with the exact (N, D, M, cvtype, dtype); selection groups
them by *problem class*: the same D, M, cvtype, dtype and N within half an octave (``round(2 *
log2 N)``, :func:`problem_class`). Within a class, timings are compared per event (seconds / N), so
a class measured at N = 10 000 serves N = 12 000 without new exploration; a program that trains on
thousands of slightly different N (the diarization example) explores each class once, not each N.

1. *Exploit.* Every valid candidate has an ``ok`` timing in this class: run the fastest (median
   of its rows' seconds per event per EM iteration), no exploration. Reason ``"history"``.
2. *Explore* (autotuning on, the default): some valid candidates are untried in this class. The
   bulk runs the fastest measured one (or the predicted best when none is measured) and each
   untried candidate runs one EM iteration first, most promising first (the prediction order of
   3.). Every EM iteration computes the same function, so the result of ``train`` is unchanged;
   the backend's timer measures each iteration and the specializer records it. Reason
   ``"explore"``. A call with fewer iterations than untried variants explores the rest next time.
3. *Predict* (autotuning off, ``ASP_GMM_AUTOTUNE=0``, and the class not fully measured): from the
   nearest measured classes on this device of the same cvtype and dtype, with the distance

       d = sqrt((0.5 * ln(N/N'))**2 + (ln(D/D'))**2 + (ln(M/M'))**2)

   (log-sizes; N weighs half because the ranking of the variants depends mostly on D and M: how
   the covariance cells and components spread over the cores). The :data:`NEIGHBOURS` nearest
   classes in which at least two candidates were measured each score every candidate by
   ``ln(t_variant / t_fastest there)``; scores are averaged with weights ``1 / (d + 0.25)`` and the
   lowest wins; candidates never measured nearby rank after, in the rule's order. Reason
   ``"predicted"`` (logged at debug level), or ``"rule"`` when nothing usable is measured.
4. *Limits and failures.* Candidates come from the backend already filtered by their declared
   limits, so an excluded variant is never compiled or run; a tuned configuration read from the
   history is checked against the limits again. A ``compile-failed`` row excludes that (variant
   source hash, tunables) for every problem of its cvtype and dtype on the device; a
   ``launch-failed`` or ``invalid`` row excludes it for that (D, M, cvtype, dtype), any N. Neither
   is retried until the source changes (a new hash is a new key).

*Exploration that pays for itself* (issue 24). At large N (:meth:`Policy.sample_size`: when the
budget's sample is at most a quarter of N) the untried candidates, and the primary unless it has a
sampled timing already, each run one EM iteration on a sample of evenly spaced events (at least
:data:`SAMPLE_MIN`), recorded with ``sampled_from = N`` (history schema 3) and compared within the
class per event, scaled by the class's whole-data/sampled calibration; the specializer stops once
:data:`EXPLORE_FRACTION` of the call's estimated time is spent (the rest is explored by later
calls) and then runs every iteration of the call with the best configuration now known. Small
problems explore in place as before (each explored iteration is one of the call's). Untried
candidates that the prediction puts more than :data:`PRUNE_FACTOR` times slower than the best,
on at least :data:`PRUNE_MIN_CLASSES` measured classes, are pruned (``Plan.pruned``).

*Tunables.* Once every variant is measured in a class, the search strategy
(:mod:`asp_gmm.search`, coordinate descent by default) proposes tunable combinations of the
variants within :data:`TUNE_WITHIN` of the best, at most :data:`TUNE_PROPOSALS` a call, until it
converges; ``asp-gmm tune --tunables`` measures the whole space. Exploitation uses the fastest
measured combination.

*Unseen shapes.* The prediction (rule 3, and the exploration order) uses the cost model of
:mod:`asp_gmm.costmodel` where its leave-one-out accuracy on this history is at least the
nearest-neighbour rule's, else the nearest-neighbour rule; ``Plan.why`` (``TrainResult.why``,
``asp-gmm history why``) says which, with both scores.

*Cost.* The history of the device is read once per process into memory
(:meth:`asp_gmm.tuning_db.History.view`) and folded into per-class aggregates; planning on a warm
history is dictionary look-ups (tens of microseconds). Records are queued and written in batches
(one transaction per second at most, and at exit).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from dataclasses import dataclass, field

import numpy as np

from .errors import KernelError
from .problem import Problem
from .registry import Config
from .config import settings

log = logging.getLogger("asp_gmm.selection")


@dataclass
class Plan:
    """What runs a problem: ``primary`` for the bulk of the iterations, ``explore`` one iteration
    each first, and why (``reason``)."""

    primary: Config
    explore: list = field(default_factory=list)
    reason: str = ""
    #: configurations left unexplored because a prediction put them far slower than the best
    pruned: list = field(default_factory=list)
    #: one line: what the decision rested on (``TrainResult.why``, ``asp-gmm history why``)
    why: str = ""
    #: whether ``primary`` has a sampled timing in the class already (sampled exploration then
    #: need not time it again on the sample)
    primary_sampled: bool = False
    #: Candidates to explore that are not compiled: they compile in the background after the call,
    #: for later calls to explore (a call never waits for an optional compile).
    compile_later: list = field(default_factory=list)
    #: ``primary`` is not compiled: it compiles in the background while the call runs on a compiled
    #: candidate, and the call switches to it once it is ready.
    primary_in_background: bool = False


#: The answer of :meth:`Policy.choose` (a plan).
Choice = Plan


#: Rule for each backend when nothing has been measured: names in order of preference, with the
#: reason. C: VF (diagonal, float64) needs no pass over the events of its own; VD (diagonal) reads each
#: event once per component with no scratch copies; V4 splits
#: the events, so all cores work for any M (V3 idles cores when M is small);
#: other backends declare a ``preference`` attribute (list of names) that takes precedence.
PREFERENCE = {
    "c": ["VF", "VD", "VT", "V4", "V3", "BLAS", "V2", "V1"],
    # CUDA: V4 fills the GPU for any M; V3 only for M >= SMs
    "cuda": ["V5", "V4", "V3", "V2", "V1"],
    "numpy": ["reference"],
}
#: E-step variants in order of preference, per backend, used when the history has no E-step timings
#: for the problem's class (the first one whose limits allow the problem).
ESTEP_PREFERENCE = {
    "cuda": ["estep_fast", "estep_tc", "estep"],
}
#: Problems with fewer multiply-adds per EM iteration (about N * M * D^2) than this never trigger a
#: compile just to explore a variant on backends whose binaries are specific to (D, M) (CUDA): the
#: diarization example trains hundreds of such GMMs of ever-new M, and a compile takes seconds.
EXPLORE_COMPILE_WORK = 1e9
#: Most of a call's (estimated) time that exploring may take; the rest is left for next calls.
EXPLORE_FRACTION = 0.10
#: Fewest events an exploration sample has: below that, fixed costs (thread teams, launches)
#: blur the per-event times the sample is for.
SAMPLE_MIN = 32768
#: An untried candidate predicted this many times slower than the predicted best is not explored.
PRUNE_FACTOR = 1.5
#: ... provided the prediction draws on at least this many measured classes.
PRUNE_MIN_CLASSES = 2
#: Variants whose (best) time in the class is within this factor of the best get their tunables
#: searched, at most :data:`TUNE_VARIANTS` of them, :data:`TUNE_PROPOSALS` combinations a call.
TUNE_WITHIN = 1.25
TUNE_VARIANTS = 2
TUNE_PROPOSALS = 6


def autotune_enabled() -> bool:
    """``ASP_GMM_AUTOTUNE=0`` turns measuring and exploring off."""
    return settings().autotune


class Selector:
    """Interface; also the history-free rule."""

    def plan(self, backend, problem: Problem, candidates: list, pinned: bool = False) -> Plan:
        raise NotImplementedError

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
        """Report one measurement (status "ok") or failure ("compile-failed", "launch-failed",
        "invalid"). ``problem`` is what ran; ``sampled_from``: the N of the call whose events
        were sampled (the timing then stands for that problem's class). The rule keeps nothing."""


def rule_order(backend, candidates: list) -> list:
    """``candidates`` sorted by the backend's preference list (unlisted ones last, stable)."""
    order = list(getattr(backend, "preference", None) or PREFERENCE.get(backend.name, []))
    rank = {n: i for i, n in enumerate(order)}
    return sorted(candidates, key=lambda c: rank.get(c.variant.name, len(order)))


class RuleSelector(Selector):
    """The documented fixed rule (no history, no exploration)."""

    def plan(self, backend, problem, candidates, pinned=False) -> Plan:
        if not candidates:
            raise ValueError(f"no variant of backend {backend.name!r} can run {problem}")
        if pinned or len(candidates) == 1:
            return Plan(candidates[0], [], "pinned" if pinned else "only candidate")
        best = rule_order(backend, candidates)[0]
        log.debug("rule: %s for %s on %s", best.label, problem, backend.name)
        return Plan(best, [], "rule")


# ---------------------------------------------------------------------------------- history
#: Classes consulted by the nearest-neighbour prediction (rule 3).
NEIGHBOURS = 4
#: Weight of log N in the prediction distance (D and M weigh 1).
N_WEIGHT = 0.5
#: Timings kept per (class, configuration) in memory for the median (the database keeps all).
_KEEP = 63


def problem_class(problem: Problem) -> tuple:
    """The key timings are grouped by: (cvtype, dtype, D, M, N in half-octaves)."""
    return (problem.cvtype, problem.dtype, problem.D, problem.M, round(2 * math.log2(max(problem.N, 1))))


class _Agg:
    """Seconds per event per EM iteration of one configuration in one class."""

    __slots__ = ("values", "median", "n")

    def __init__(self):
        self.values, self.median, self.n = [], 0.0, 0

    def add(self, v: float):
        if len(self.values) < _KEEP:
            self.values.append(v)
        else:
            self.values[self.n % _KEEP] = v
        self.n += 1
        s = sorted(self.values)
        k = len(s)
        self.median = s[k // 2] if k % 2 else 0.5 * (s[k // 2 - 1] + s[k // 2])


class _Index:
    """Aggregates of one device's rows: ok timings per class (full-data and sampled apart),
    failures per scope, and the predictors fitted to them."""

    def __init__(self, view):
        self.view = view
        self.consumed = 0
        self.classes: dict = {}  # class key -> {VariantKey: _Agg}, timings on the whole data
        self.sampled: dict = {}  # class key -> {VariantKey: _Agg}, timings on a sample
        self.compile_failed: set = set()  # (VariantKey, cvtype, dtype)
        self.run_failed: set = set()  # (VariantKey, cvtype, dtype, D, M)
        self._coords: dict = {}  # (cvtype, dtype) -> (class keys, array of log-coordinates)
        self._predictor: dict = {}  # (cvtype, dtype) -> (name, CostModel or None, loo nn, loo model)
        self._vkeys: dict = {}  # (cvtype, dtype) -> every configuration measured on the whole data
        self.searched: dict = {}  # (class key, measured configurations) -> search proposals
        self.options: dict = {}  # (class key, number measured, candidates) -> [(Config, VariantKey)]

    def update(self):
        rows = self.view.rows
        if self.consumed == len(rows):
            return
        for r in rows[self.consumed :]:
            if r.status == "ok":
                if r.seconds is None or r.N <= 0:
                    continue
                of = getattr(r, "sampled_from", None)
                ck = (r.cvtype, r.dtype, r.D, r.M, round(2 * math.log2(max(of or r.N, 1))))
                table = self.sampled if of else self.classes
                per = table.get(ck)
                if per is None:
                    per = table[ck] = {}
                    if not of:
                        self._coords.pop((r.cvtype, r.dtype), None)
                        self._predictor.pop((r.cvtype, r.dtype), None)
                agg = per.get(r.variant)
                if agg is None:
                    agg = per[r.variant] = _Agg()
                    if not of:
                        self._vkeys.pop((r.cvtype, r.dtype), None)
                agg.add(r.seconds / r.N)
            elif r.status == "compile-failed":
                self.compile_failed.add((r.variant, r.cvtype, r.dtype))
            else:
                self.run_failed.add((r.variant, r.cvtype, r.dtype, r.D, r.M))
        self.consumed = len(rows)

    def scores(self, ck) -> dict:
        """{VariantKey: seconds per event} in class ``ck``: the whole-data median where there is one,
        else the sampled median scaled by the class's calibration (median ratio whole/sampled of
        the configurations measured both ways; 1 when none is)."""
        full = self.classes.get(ck, {})
        samp = self.sampled.get(ck, {})
        out = {vk: a.median for vk, a in full.items()}
        if samp:
            ratios = sorted(full[vk].median / a.median for vk, a in samp.items() if vk in full and a.median > 0)
            cal = ratios[len(ratios) // 2] if ratios else 1.0
            for vk, a in samp.items():
                if vk not in out:
                    out[vk] = a.median * cal
        return out

    def failed(self, vk, problem: Problem) -> bool:
        return (vk, problem.cvtype, problem.dtype) in self.compile_failed or (
            vk,
            problem.cvtype,
            problem.dtype,
            problem.D,
            problem.M,
        ) in self.run_failed

    def nearest(self, problem: Problem):
        """Measured classes of the problem's cvtype and dtype, nearest first: [(distance, key)]."""
        ct = (problem.cvtype, problem.dtype)
        got = self._coords.get(ct)
        if got is None:
            keys = [k for k in self.classes if k[:2] == ct]
            arr = np.array(
                [(N_WEIGHT * k[4] * math.log(2) / 2, math.log(k[2]), math.log(k[3])) for k in keys], dtype=float
            ).reshape(-1, 3)
            got = self._coords[ct] = (keys, arr)
        keys, arr = got
        if not keys:
            return []
        here = np.array([N_WEIGHT * math.log(max(problem.N, 1)), math.log(problem.D), math.log(problem.M)])
        d = np.sqrt(((arr - here) ** 2).sum(axis=1))
        return [(float(d[i]), keys[i]) for i in np.argsort(d, kind="stable")]

    def measured_keys(self, cvtype: str, dtype: str) -> set:
        """Every configuration (VariantKey) with a whole-data timing of this cvtype and dtype."""
        got = self._vkeys.get((cvtype, dtype))
        if got is None:
            got = self._vkeys[(cvtype, dtype)] = {
                vk for k, per in self.classes.items() if k[:2] == (cvtype, dtype) for vk in per
            }
        return got

    def predictor(self, cvtype: str, dtype: str):
        """``(name, model, loo_nearest, loo_model)`` for unseen shapes of (cvtype, dtype): the cost
        model (:mod:`asp_gmm.costmodel`) where its leave-one-out accuracy over the measured
        classes is at least the nearest-neighbour rule's, else ``"nearest"`` (model ``None``).
        Refitted only when a new class is measured."""
        got = self._predictor.get((cvtype, dtype))
        if got is None:
            from . import costmodel

            classes = {}
            for k in self.classes:
                if k[:2] == (cvtype, dtype):
                    classes[(k[4] * math.log(2) / 2, math.log(k[2]), math.log(k[3]))] = self.scores(k)
            if len(classes) < costmodel.MIN_POINTS + 1:
                got = ("nearest", None, 0.0, 0.0)
            else:
                nn, _ = costmodel.loo_accuracy(classes, costmodel.nearest_predictor)
                md, _ = costmodel.loo_accuracy(classes, costmodel.model_predictor)
                model = None
                if md >= nn:
                    points: dict = {}
                    for c, times in classes.items():
                        for vk, t in times.items():
                            points.setdefault(vk, []).append((*c, math.log(t)))
                    model = costmodel.CostModel(points)
                got = ("model" if model is not None else "nearest", model, nn, md)
            self._predictor[(cvtype, dtype)] = got
        return got


class HistorySelector(Selector):
    """Selection from the measured history of the device (see the module documentation).

    Parameters
    ----------
    history : asp_gmm.tuning_db.History, optional
        The store to read and record into; by default the one at ``$ASP_GMM_DB`` (or the user data
        folder), opened on first use and re-opened when ``ASP_GMM_DB`` changes. When it cannot be
        opened, one warning says why and the fixed rule (:class:`RuleSelector`) decides instead.
    runtime : asp_gmm.runtime.Runtime, optional
        Whose shared histories to use without ``history`` (default: the default runtime).
    strategy : str, optional
        The search strategy over tunables (:mod:`asp_gmm.search`; default ``"coordinate"``).
    """

    def __init__(self, history=None, runtime=None, strategy: str | None = None):
        from . import search

        self.strategy = search.get(strategy)  # searches the tunables (asp_gmm.search)
        self._fixed = history
        self._runtime = runtime  # whose shared history to use (default: the default runtime)
        self._rule = RuleSelector()
        self._lock = threading.RLock()
        self._indexes: dict = {}  # (id(history), device_id) -> _Index
        self._devices: dict = {}  # id(backend) -> (backend, device_id, fingerprint)
        self._vkeys: dict = {}  # Config -> VariantKey

    # ------------------------------------------------------------------ plumbing
    def history(self):
        """The :class:`~asp_gmm.tuning_db.History` in use, or ``None`` when it cannot be opened."""
        if self._fixed is not None:
            return self._fixed
        return self.runtime.shared_history()

    @property
    def runtime(self):
        """The :class:`asp_gmm.runtime.Runtime` whose shared history this selector uses."""
        if self._runtime is not None:
            return self._runtime
        from .runtime import default_runtime

        return default_runtime()

    def _device(self, backend):
        d = self._devices.get(id(backend))
        if d is None or d[0] is not backend:
            fp = backend.fingerprint()
            d = self._devices[id(backend)] = (backend, backend.device_id, fp)
        return d[1], d[2]

    def vkey(self, config: Config):
        """The history key of ``config`` (memoised by variant identity: hashing a Config is slow)."""
        v = config.variant
        k = (id(v), config.tunables)
        got = self._vkeys.get(k)
        if got is None or got[0] is not v:
            from .tuning_db import VariantKey

            got = self._vkeys[k] = (v, VariantKey.of(v.backend, v.name, dict(config.tunables), v.source_sha256))
        return got[1]

    def index(self, backend, history=None):
        """The up-to-date aggregates of ``backend``'s device (for tools and tests)."""
        history = history or self.history()
        device_id, _ = self._device(backend)
        key = (id(history), device_id)
        with self._lock:
            view = history.view(device_id)
            idx = self._indexes.get(key)
            if idx is None or idx.view is not view:
                idx = self._indexes[key] = _Index(view)
            idx.update()
        return idx

    # ------------------------------------------------------------------ policy
    def plan(self, backend, problem, candidates, pinned=False) -> Plan:
        if pinned or len(candidates) <= 1:
            return self._rule.plan(backend, problem, candidates, pinned)
        history = self.history()
        if history is None:
            return self._rule.plan(backend, problem, candidates, pinned)
        try:
            history.maybe_flush()
            idx = self.index(backend, history)
        except Exception as exc:  # noqa: BLE001 - a broken history must not break train()
            self.runtime.disable(history, exc)
            return self._rule.plan(backend, problem, candidates, pinned)
        with self._lock:  # another thread's record() may be folding rows into the index
            return self._decide(backend, problem, candidates, idx)

    def _decide(self, backend, problem, candidates, idx) -> Plan:
        valid = [c for c in candidates if not idx.failed(self.vkey(c), problem)]
        if not valid:
            log.debug("every candidate failed before on this device; trying the rule's choice again")
            return self._rule.plan(backend, problem, candidates)
        scores = idx.scores(problem_class(problem))
        options = self._options(backend, problem, valid, scores, idx)
        untried = [c for c in valid if self.vkey(c) not in scores]
        best = min(options, key=lambda o: o[1]) if options else None
        if not autotune_enabled():
            if not untried:
                return Plan(best[0], [], "history", why=self._why_best(best, options))
            ranking, predicted, _, how = self._rank(backend, problem, valid, idx)
            log.debug(
                "%s %s for %s on %s (%s)",
                "predicted" if predicted else "rule",
                ranking[0].label,
                problem,
                backend.name,
                how,
            )
            return Plan(ranking[0], [], "predicted" if predicted else "rule", why=how)
        pruned, explore, why = [], [], ""
        if untried:
            ranking, predicted, rel, how = self._rank(backend, problem, valid, idx)
            for c in ranking:
                if c not in untried:
                    continue
                r = rel.get(c)
                if r is not None and r[1] >= PRUNE_MIN_CLASSES and r[0] > math.log(PRUNE_FACTOR):
                    pruned.append(c)
                else:
                    explore.append(c)
            primary = best[0] if best else next((c for c in ranking if c not in pruned), ranking[0])
            why = how + (
                f"; pruned {', '.join(c.label for c in pruned)} (predicted > {PRUNE_FACTOR:g}x the best)"
                if pruned
                else ""
            )
        else:
            primary = best[0]
        if not explore:
            skey = (problem_class(problem), frozenset(self.vkey(c) for c, _ in options), len(valid))
            explore = idx.searched.get(skey)
            if explore is None:
                if len(idx.searched) > 4096:
                    idx.searched.clear()
                explore = idx.searched[skey] = self._search(backend, problem, valid, options, idx)
            explore = list(explore)
            if explore:
                why = f"{self.strategy.name} search of the tunables of " + ", ".join(
                    sorted({c.variant.name for c in explore})
                )
        explore = [c for c in explore if c != primary] if untried else explore
        if not explore:
            return Plan(primary, [], "history", pruned, self._why_best(best, options) + ("; " + why if why else ""))
        done = self.vkey(primary) in idx.sampled.get(problem_class(problem), {})
        return Plan(primary, explore, "explore", pruned, why, done)

    @staticmethod
    def _why_best(best, options) -> str:
        if not best:
            return ""
        rest = sorted(t for c, t in options if c != best[0])
        vs = f", next {rest[0] / best[1]:.2f}x" if rest else ""
        return f"fastest of {len(options)} measured in the class ({best[1] * 1e9:.3g} ns/event{vs})"

    def _options(self, backend, problem, valid, measured, idx) -> list:
        """[(config, seconds per event)] measured in this class: the candidates, and tuned
        configurations of the same variants (same source hash) that the limits allow. Which
        configurations qualify is remembered per (class, configurations measured, candidates):
        only their times change from call to call."""
        vks = [self.vkey(c) for c in valid]
        ckey = (problem_class(problem), len(measured), tuple(vks))
        got = idx.options.get(ckey)
        if got is None:
            got, by_source = [], {}
            for c, vk in zip(valid, vks):
                by_source[(vk.backend, vk.name, vk.source_sha256)] = (c.variant, vk.tunables)
                if vk in measured:
                    got.append((c, vk))
            if len(measured) > len(got):
                for vk in measured:
                    src = by_source.get((vk.backend, vk.name, vk.source_sha256))
                    if src is None or vk.tunables == src[1] or idx.failed(vk, problem):
                        continue
                    v, tun = src[0], vk.tunables_dict
                    if set(tun) != set(v.tunables) or v.check(problem, tun, extra=backend.limit_context()):
                        continue
                    got.append((Config.of(v, tun), vk))
            if len(idx.options) > 4096:
                idx.options.clear()
            idx.options[ckey] = got
        return [(c, measured[vk]) for c, vk in got]

    def _search(self, backend, problem, valid, options, idx) -> list:
        """Tunable combinations to measure next (the search strategy's proposals) for the variants
        within :data:`TUNE_WITHIN` of the best measured time, best variant first."""
        if not options:
            return []
        from . import search

        strategy = self.strategy
        best_by_variant: dict = {}
        for c, t in options:
            n = c.variant.name
            if n not in best_by_variant or t < best_by_variant[n][1]:
                best_by_variant[n] = (c, t)
        top = min(t for _, t in best_by_variant.values())
        out = []
        ctx = backend.limit_context()
        start_of = {c.variant.name: c for c in valid}
        for name, (c, t) in sorted(best_by_variant.items(), key=lambda kv: kv[1][1])[:TUNE_VARIANTS]:
            v = c.variant
            if t > TUNE_WITHIN * top or not v.tunables or name not in start_of:
                continue
            measured = {search.key(o.params): tt for o, tt in options if o.variant.name == name}
            for combo in v.tunable_space():  # combinations its limits or failures exclude: never proposed
                k = search.key(combo)
                if k not in measured and (
                    not v.allows(problem, combo, ctx) or idx.failed(self.vkey(Config.of(v, combo)), problem)
                ):
                    measured[k] = math.inf
            for combo in strategy.propose(v.tunables, start_of[name].params, measured, TUNE_PROPOSALS - len(out)):
                out.append(Config.of(v, combo))
            if len(out) >= TUNE_PROPOSALS:
                break
        return out

    def _rank(self, backend, problem, valid, idx):
        """Candidates best-first by the prediction for the problem's class.

        Returns ``(ranking, predicted?, {config: (ln(t / t_best predicted), classes it rests on)},
        one line saying how)``. The predictor is the cost model where it beats the nearest-neighbour
        rule by leave-one-out on this history, else the nearest-neighbour rule."""
        base = rule_order(backend, valid)
        keys = {self.vkey(c): c for c in base}
        name, model, loo_nn, loo_model = idx.predictor(problem.cvtype, problem.dtype)
        if model is not None:
            # the model also ranks tuned configurations of the candidates measured in other classes
            # (each modelled from enough classes; nearest neighbour would favour the rarely measured)
            keys = dict(keys)
            by_source = {(vk.backend, vk.name, vk.source_sha256): c.variant for vk, c in keys.items()}
            ctx = None
            for vk in sorted(idx.measured_keys(problem.cvtype, problem.dtype) - set(keys), key=str):
                v = by_source.get((vk.backend, vk.name, vk.source_sha256))
                if v is None or idx.failed(vk, problem):
                    continue  # tuned configurations of the candidates, measured in other classes
                tun = vk.tunables_dict
                ctx = backend.limit_context() if ctx is None else ctx
                if set(tun) == set(v.tunables) and v.allows(problem, tun, extra=ctx):
                    c = Config.of(v, tun)
                    keys[vk] = c
                    base.append(c)
        pos = {c: i for i, c in enumerate(base)}
        if model is not None:
            ranked = model.rank(list(keys), math.log(max(problem.N, 1)), math.log(problem.D), math.log(problem.M))
            if ranked:
                lo = ranked[0][0]
                npts = len(idx.classes)
                rel = {keys[k]: (p - lo, npts) for p, k in ranked}
                ranking = sorted(base, key=lambda c: (0, rel[c][0], pos[c]) if c in rel else (1, 0.0, pos[c]))
                return (
                    ranking,
                    True,
                    rel,
                    (f"cost model (leave-one-out {100 * loo_model:.0f}% against nearest {100 * loo_nn:.0f}%)"),
                )
        score, weight, count, used = {}, {}, {}, 0
        for d, ck in idx.nearest(problem):
            per = idx.scores(ck)
            here = [(per[vk], vk) for vk in keys if vk in per]
            if len(here) < 2:
                continue
            fastest = min(t for t, _ in here)
            w = 1.0 / (d + 0.25)
            for t, vk in here:
                score[vk] = score.get(vk, 0.0) + w * math.log(t / fastest)
                weight[vk] = weight.get(vk, 0.0) + w
                count[vk] = count.get(vk, 0) + 1
            used += 1
            if used >= NEIGHBOURS:
                break
        if not score:
            return base, False, {}, "rule order (nothing measured nearby)"
        ranking = sorted(
            base,
            key=lambda c: (
                (0, score[self.vkey(c)] / weight[self.vkey(c)], pos[c]) if self.vkey(c) in score else (1, 0.0, pos[c])
            ),
        )
        raw = {keys[vk]: score[vk] / weight[vk] for vk in score}
        lo = min(raw.values())
        rel = {c: (v - lo, count[self.vkey(c)]) for c, v in raw.items()}
        return ranking, True, rel, f"nearest {used} measured class(es)"

    def record(
        self,
        backend,
        problem,
        config,
        status,
        seconds=None,
        cov_seconds=None,
        repeats=1,
        sampled_from: int | None = None,
    ) -> None:
        if status == "ok" and not (seconds and seconds > 0):
            return
        history = self.history()
        if history is None:
            return
        device_id, fp = self._device(backend)
        try:
            history.record(
                device_id,
                fp,
                self.vkey(config),
                problem.N,
                problem.D,
                problem.M,
                problem.cvtype,
                problem.dtype,
                status,
                seconds,
                cov_seconds,
                repeats,
                threads=backend.run_threads(problem),
                sampled_from=sampled_from,
            )
        except Exception as exc:  # noqa: BLE001 - a broken history must not break train()
            self.runtime.disable(history, exc)

    def flush(self) -> None:
        h = self.history()
        if h is not None:
            h.flush()


def default_selector() -> Selector:
    """The selector the specializer uses unless given one: the default runtime's
    (:class:`HistorySelector`, see :mod:`asp_gmm.runtime`)."""
    from .runtime import default_runtime

    return default_runtime().selector


def set_default_selector(selector: Selector | None) -> None:
    """Install ``selector`` in the default runtime (``None``: a new HistorySelector on next use)."""
    from .runtime import default_runtime

    default_runtime().selector = selector


# ---------------------------------------------------------------------------------- the policy
class Policy:
    """The one home of selection policy: which configuration runs a problem (exploit, explore,
    predict: the :class:`Selector`), the compile-cost gate on exploration, and the E-step choice.

    The specializer is given one (or makes one); a backend that chooses among E-step variants asks
    its policy (:meth:`choose_estep`). Swap it to change the policy; nothing here is global.

    Parameters
    ----------
    selector : Selector, optional
        Plans and records the covariance choice; by default the process's default selector
        (a :class:`HistorySelector` on the shared history), looked up on each use.
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
    ):
        self._selector = selector
        self._explore_compile_work = explore_compile_work
        self.estep_preference = dict(ESTEP_PREFERENCE if estep_preference is None else estep_preference)

    @property
    def explore_compile_work(self) -> float:
        """The work under which exploring never compiles (:data:`EXPLORE_COMPILE_WORK` unless set)."""
        w = self._explore_compile_work
        return EXPLORE_COMPILE_WORK if w is None else w

    @property
    def selector(self) -> Selector:
        if self._selector is not None:
            return self._selector
        return default_selector()

    # ------------------------------------------------------------------ covariance
    def choose(self, backend, problem: Problem, candidates: list, pinned: bool = False, tuning: bool = True) -> Plan:
        """The plan for ``problem`` among ``candidates`` (configurations whose limits allow it).

        With ``tuning`` off nothing is explored. On a backend with shape-specific binaries, a
        problem smaller than :attr:`explore_compile_work` explores only what is already compiled
        and runs a compiled candidate rather than compile the planned one (a compile costs more
        than a small problem can win back; larger problems and ``asp-gmm tune`` fill in).
        Elsewhere a call never waits for an optional compile: it explores only what is compiled
        (``compile_later`` lists the others, compiled in the background after the call), and a
        planned configuration not compiled yet is compiled in the background while the call runs
        on a compiled candidate (``primary_in_background``).
        """
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
        for one iteration, each allowed twice the primary's time), at least :data:`SAMPLE_MIN`.
        """
        N = problem.N
        s = max(SAMPLE_MIN, int(EXPLORE_FRACTION * max(max_iters, 1) * N / (2 * (n_explore + 1))))
        return N if 4 * s > N else s

    def explore_allowance(self, problem: Problem, max_iters: int, seconds_per_event: float) -> float:
        """Seconds of a call that exploring may take: :data:`EXPLORE_FRACTION` of its estimated time
        (``max_iters`` iterations of ``problem.N`` events at ``seconds_per_event``, the fastest
        measured so far)."""
        return EXPLORE_FRACTION * max(max_iters, 1) * problem.N * seconds_per_event

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
        measured = self._estep_measured(backend, problem, usable)
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
                sel.runtime.disable(history, exc)  # as plan() does: stop using it, warn once
            else:
                log.warning("asp_gmm: the tuning history could not be opened (%s); E-step by the default order", exc)
            return None
        measured = idx.classes.get(problem_class(problem), {})
        if not measured:
            return None
        best = None
        for v, tuns in usable:
            for tun in tuns:
                agg = measured.get(sel.vkey(Config.of(v, tun)))
                if agg is not None and (best is None or agg.median < best[0]):
                    best = (agg.median, v, tun)
        return None if best is None else (best[1], best[2])
