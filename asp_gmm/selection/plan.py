"""The plan (what runs a problem), the selector protocol and the fixed rule used when nothing is
measured; the exploration constants. See :mod:`asp_gmm.selection`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..config import settings
from ..problem import Problem
from ..variant import Config

log = logging.getLogger("asp_gmm.selection")


#: Most of a call's (estimated) time that exploring may take; the rest is left for next calls.
EXPLORE_FRACTION = 0.10
#: ... once the variants are explored and the tunable search proposes: its share of a call, and the
#: rate at which earlier calls bank allowance for it. The search moves a variant by tens of per
#: cent where the variants moved it by 1.1-10x. At the variants' share (with the bank: up to a
#: quarter of a call) the search of V8's and V9's tunables was most of the exploring of the first
#: ten calls at (500 000, 36, 128) full and (1 000 000, 128, 1024) diag (H200,
#: benchmarks/selection.py --regret, paired: cumulative after 10 calls 1.12-1.13 and 1.08-1.18 the
#: best pinned variant's); half the share for all exploring gave 1.09-1.11 and 1.04-1.05, with the
#: winning variant reached at the same call, but slowed the variants' exploration where a fresh
#: class has many (tests/test_selection_rules.py: a class settles within three calls).
TUNE_FRACTION = 0.05


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
    #: {Config: predicted time relative to the fastest in the class (>= 1)} of the configurations
    #: to explore whose cost the history predicts; the others are assumed ``unknown_ratio`` times
    #: the fastest (the exploration allowance is charged with the prediction before each runs).
    predicted: dict = field(default_factory=dict)
    #: the assumed cost ratio of a configuration nothing predicts: the widest spread between the
    #: configurations of one class measured on this device for the cvtype and dtype
    #: (:data:`UNKNOWN_RATIO` at least)
    unknown_ratio: float = 0.0
    #: seconds per event of the fastest configuration measured in the class (None: none is); the
    #: exploration allowance is reckoned from it before anything runs on the sample
    fastest: float | None = None
    #: seconds per event of the fastest configuration timed on a sample in the class (None: none is);
    #: predicts what a sampled iteration costs
    sampled_fastest: float | None = None
    #: seconds of exploring allowance earlier calls of the class left unspent:
    #: :attr:`fraction` of the whole-data iterations recorded in the class less the
    #: sampled iterations recorded there (a call may spend up to as much again as its own allowance)
    banked: float = 0.0
    #: the share of the call's time its exploring may take: :data:`EXPLORE_FRACTION`, or
    #: :data:`TUNE_FRACTION` where ``explore`` holds the tunable search's proposals
    fraction: float = EXPLORE_FRACTION
    #: ``explore`` holds variants timed only on samples of the class, to run on the whole data (in
    #: place: a sample's ranking need not hold for the data, see :data:`CONFIRM_WITHIN`)
    confirm: bool = False
    #: {Config: seconds per event on samples} of the configurations a whole-data check runs: once
    #: the call's first iteration has timed the primary on the data, a check is priced at its
    #: sampled time against that (it may lose to the data's size, it cannot gain from it)
    confirm_times: dict = field(default_factory=dict)


#: Rule for each backend when nothing has been measured: names in order of preference, with the
#: reason. C: VF (diagonal, float64) needs no pass over the events of its own; VD (diagonal) reads each
#: event once per component with no scratch copies; V4 splits
#: the events, so all cores work for any M (V3 idles cores when M is small);
#: other backends declare a ``preference`` attribute (list of names) that takes precedence.
PREFERENCE = {
    "c": ["VF", "VD", "VT", "V4", "V3", "BLAS", "V2", "V1"],
    # CUDA: V5 (register-tiled sums) first; then the tensor-core variants, which gain the most
    # where their limits let them run (diag as two GEMMs, diag fused into the E-step, full as
    # GEMMs: 1.5-2.6x V5 at large diagonal problems), so that a new class explores them on its
    # first call rather than its third to sixth; V4 fills the GPU for any M; V3 only for M >= SMs
    "cuda": ["V5", "V9", "V7", "V8", "V4", "V3", "V2", "V1"],
    # diagonal on CUDA: V7 (fused into the E-step) then V9 (two GEMMs). Measured (H200, default
    # tunables, 40 shapes N 2e5-1e6, D 4-128, M 8-512: benchmarks/rule_order.py), V7 was the fastest
    # wherever its limits let it run but at (D, M) = (64, 128) (1.5x V9's time there), V9 wherever
    # V7 could not run, and V5 at none (1.2-2.6x); V5 first ran a new diagonal class's first calls
    # at V5's speed until V7 was explored (the fourth call of a fresh history at 500 000 x 36 x 128)
    ("cuda", "diag"): ["V7", "V9", "V5", "V8", "V4", "V3", "V2", "V1"],
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
#: What a configuration nothing predicts is assumed to cost, at least, relative to the fastest
#: measured on the sample (the widest spread measured in one class of the history counts when it
#: is wider): exploring charges this to the allowance before it runs the configuration.
UNKNOWN_RATIO = 4.0
#: A tunables combination of a variant is charged this factor over the variant's best time in the
#: class when nothing predicts it (tunables move a variant's time by tens of per cent).
TUNE_RATIO = 1.5
#: A sampled configuration's first run slower than this many times the fastest measured in the call
#: cannot be a contender that its first launch hid (a kernel's first launch cost 1.2-3.8x its next
#: on a 32 768-event sample of (500 000, 36, 128) diag, H200): on a backend whose first launch costs
#: more, its second run is skipped when it would overshoot the allowance (closer to the fastest,
#: both runs are made and the faster recorded).
FIRST_LAUNCH_MAX = 4.0
#: Fewest events an exploration sample has: below that, fixed costs (thread teams, launches)
#: blur the per-event times the sample is for.
SAMPLE_MIN = 32768
#: An untried candidate predicted this many times slower than the predicted best is not explored.
PRUNE_FACTOR = 1.5
#: ... provided the prediction draws on at least this many measured classes.
PRUNE_MIN_CLASSES = 2
#: A variant of a backend's ``rule_tail`` is not explored in a class where a variant the rule puts
#: before it was measured this many times slower than the class's best (see
#: ``HistorySelector._rule_tail``): the tail runs slower still wherever the rule's grid measured it
#: (CUDA's V1-V3: 10-200x the best), so it cannot win there.
RULE_TAIL_FACTOR = 2.0
#: Variants whose (best) time in the class is within this factor of the best get their tunables
#: searched, at most :data:`TUNE_VARIANTS` of them, :data:`TUNE_PROPOSALS` combinations a call.
TUNE_WITHIN = 1.25
TUNE_VARIANTS = 2
TUNE_PROPOSALS = 8
#: The search of a variant's tunables in a class ends once its last :data:`TUNE_PATIENCE`
#: measured combinations (in the order measured) each failed to beat its best so far by
#: :data:`TUNE_GAIN`: its proposals come most expected gain first, and each costs a GPU call
#: about a tenth of itself (H200, (500 000, 36, 128) full: the search of V8 and V5 ran on through
#: call 10, ten combinations, none 2 % faster than V8's defaults).
TUNE_PATIENCE = 4
TUNE_GAIN = 0.02
#: A class whose planned call explored nothing (nothing left to try, or nothing that fits the
#: allowance) reuses that plan for its next calls while the policy's state token stays the same
#: (:meth:`asp_gmm.selection.Policy.state_token`): one call, then two, four... up to this many
#: between plans, the span reset whenever a plan differs. Planning such a call (the policy's choice,
#: the in-place and sampled pricing of what cannot fit) cost 0.4-0.5 ms of a 9-10 ms call on an
#: H200 at (150 000, 19, 16) and (153 600, 32, 32) diag: 1.06x the same variant pinned, every call.
SETTLED_CALLS = 16
#: A variant timed only on samples of a class whose best configuration ran on the whole data is
#: run on the whole data too (in place, within the allowance) when its best sampled time is within
#: this factor of the fastest sampled time there: a sample fits in caches where the data does not,
#: so the ranking on samples need not hold (2-core CPU, N = 1.5 M: V2 or V3 won on the sample in 2
#: of 5 fresh histories and stayed, 2.9x and 1.3x slower than V4 on the data; V4 was up to 1.6x V2
#: on the sample).
CONFIRM_WITHIN = 2.0


def autotune_enabled() -> bool:
    """``ASP_GMM_AUTOTUNE=0`` (or ``ASP_GMM_DETERMINISTIC=1``) turns measuring and exploring off."""
    s = settings()
    return s.autotune and not s.deterministic


def deterministic() -> bool:
    """``ASP_GMM_DETERMINISTIC=1``: every choice by the fixed rule, so that a call repeated on the
    same data gives bitwise the same result (what history, exploring and a stand-in variant while
    the planned one compiles would change by rounding)."""
    return settings().deterministic


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

    def bind(self, runtime) -> None:
        """Called by the policy it is given to, with the specializer's runtime (a selector that reads
        the runtime's shared history takes it from here)."""

    def warm(self, backend, problems) -> None:
        """Called by ``prepare``: do now the one-time work that the first :meth:`plan` of these
        problems would do (a history selector reads the device's rows and fits its predictors).
        The rule has none."""

    def state_token(self, backend, problem: Problem, local: bool = False):
        """A value that changes whenever what :meth:`plan` decides for ``problem`` may change, or
        None when the selector cannot say (every call is then planned); ``local``: for a plan made
        from the class's own measurements alone (reason "history"). A class whose calls explore
        nothing is re-planned only every few calls while it stays the same (:data:`SETTLED_CALLS`)."""
        return None


def why_best(best, options) -> str:
    """One line on the measured best ``(config, seconds per event)`` among ``options``."""
    if not best:
        return ""
    rest = sorted(t for c, t in options if c != best[0])
    vs = f", next {rest[0] / best[1]:.2f}x" if rest else ""
    return f"fastest of {len(options)} measured in the class ({best[1] * 1e9:.3g} ns/event{vs})"


def rule_order(backend, candidates: list, cvtype: str | None = None) -> list:
    """``candidates`` sorted by the backend's preference list (unlisted ones last, stable): the
    backend's own ``preference`` attribute, else :data:`PREFERENCE` for (backend, ``cvtype``, the
    problem's kernel covariance type) where it has one, else for the backend."""
    order = list(
        getattr(backend, "preference", None)
        or PREFERENCE.get((backend.name, cvtype))
        or PREFERENCE.get(backend.name, [])
    )
    rank = {n: i for i, n in enumerate(order)}
    return sorted(candidates, key=lambda c: rank.get(c.variant.name, len(order)))


class RuleSelector(Selector):
    """The documented fixed rule (no history, no exploration)."""

    def plan(self, backend, problem, candidates, pinned=False) -> Plan:
        if not candidates:
            raise ValueError(f"no variant of backend {backend.name!r} can run {problem}")
        if pinned or len(candidates) == 1:
            return Plan(candidates[0], [], "pinned" if pinned else "only candidate")
        best = rule_order(backend, candidates, problem.kernel_cvtype)[0]
        log.debug("rule: %s for %s on %s", best.label, problem, backend.name)
        return Plan(best, [], "rule")

    def state_token(self, backend, problem: Problem, local: bool = False):
        return "rule"  # (the rule's choice depends on the candidates alone)
