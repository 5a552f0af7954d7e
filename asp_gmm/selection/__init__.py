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
the first configuration of the backend's preference list (:data:`PREFERENCE`, per covariance type
where it has one: CUDA starts diagonal problems on V7, full ones on V5) that is a candidate.

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
problems explore in place as before (each explored iteration is one of the call's). A problem
large enough for a sample whose EM iteration costs less than a sampled exploration's fixed part
(its session over the sample, upload and read-backs: measured, else the backend's
``sample_fixed_prior``; on CUDA also a class with nothing measured yet) explores in place within
the allowance (:class:`asp_gmm.explore.InPlace`): the call's first iteration prices the others,
each runs one of the call's iterations when its predicted extra cost fits, and the best
configuration then known runs the rest; what in place cannot afford (an unpredicted
configuration is charged the backend's ``unknown_ratio_prior`` there, 40 on CUDA) is timed on a
sample first where the sample's price fits the allowance (``asp_gmm.explore.sample_first``). Untried
candidates that the prediction puts more than :data:`PRUNE_FACTOR` times slower than the best,
on at least :data:`PRUNE_MIN_CLASSES` measured classes *of the problem's cvtype and dtype* (the
classes the cost model of each configuration rests on), are pruned (``Plan.pruned``).

*A sample's ranking checked on the data* (issue 37). A sample fits caches the whole data does
not, so the variant fastest on it may be slower on the data (2-core CPU, N = 1.5 M: V2 or V3 won
on the sample in 2 of 5 fresh histories and kept the class, 2.9x and 1.3x slower than V4, which
was up to 1.6x V2 on the sample), and sampled times scaled by one calibration cannot reorder
themselves. The sample's winner, when timed on samples only, and the variants the fixed rule puts
before it within :data:`CONFIRM_WITHIN` of the fastest sampled time (the rule's order encodes what
scales to large data; once a configuration ran on the data, only those faster on the sample than
it on the data) run one iteration each on the data, in place, within the allowance
(:attr:`Plan.confirm`, :mod:`asp_gmm.selection.confirm`; in the call that sampled them, with what
the sample left of its allowance, else in a later call), each priced by its sampled time against
the call's first iteration on the data; meanwhile the call runs the best configuration timed on
the data where there is one. The best on the data then runs the rest. A GPU's sample leaves it
partly idle, so there a variant that gains with size looks slower on the sample
(``Backend.samples_underfill``; H200, (500 000, 36, 128) full: V8 1.3 % slower than V5 on the
sample, 1.3x faster on the data): every variant within :data:`CONFIRM_WITHIN` of the fastest on
the sample is checked, wherever the rule puts it, as soon as it is sampled (not only once the
class has explored everything), priced by its ratio to the primary's sampled time.

*The rule's tail.* A backend's ``rule_tail`` (CUDA: V3, V2, V1, 10-200x the best at every shape
of ``benchmarks/rule_order.py``) is not explored in a class where a variant the rule puts before
it ran :data:`RULE_TAIL_FACTOR` times the best or more; they stay fallbacks.

*An allowance that holds* (issue 37). Every cost of the sampled exploration is charged by the wall
clock (the sample's copy and session, kernel look-ups and first loads, parameter uploads,
launches; nothing is compiled to explore) and each configuration's cost is predicted before it
runs (a kernel's first load included: the last measured, else ``load_seconds_prior``): the fastest
sampled per-event time times the plan's predicted ratio (``Plan.predicted``: the cost model or the
nearest classes; for tunables the variant's time times the prior, else :data:`TUNE_RATIO`), or
``Plan.unknown_ratio`` (the device's widest measured spread, at least :data:`UNKNOWN_RATIO`)
when nothing predicts it, plus the overheads seen; a configuration that would overshoot is left
for a later call. What earlier calls of the class left unspent (``Plan.banked``) may be spent
too (at most ``asp_gmm.explore.BANK_CALLS`` times the call's own allowance), so the class's
total exploring stays within :data:`EXPLORE_FRACTION` of its total time. ``TrainResult.why``
states each call's spending; ``asp-gmm history why`` the class's. The bound rests on the
prediction: a configuration slower than predicted (an unpredicted one more than
``unknown_ratio`` times the fastest) overshoots once, and its measured ratio then counts.

*Tunables.* Once every variant is measured in a class, the search strategy
(:mod:`asp_gmm.selection.search`, coordinate descent by default) proposes tunable combinations of the
variants within :data:`TUNE_WITHIN` of the best, at most :data:`TUNE_PROPOSALS` a call, until it
converges or a variant's last :data:`TUNE_PATIENCE` combinations brought no gain of
:data:`TUNE_GAIN`, within :data:`TUNE_FRACTION` of each call (half the variants' share: the search moves a
variant by tens of per cent, not by the variants' 1.1-10x); ``asp-gmm tune --tunables`` measures the
whole space. Exploitation uses the fastest measured combination.

*Unseen shapes.* The prediction (rule 3, and the exploration order) uses the cost model of
:mod:`asp_gmm.selection.costmodel` where its leave-one-out accuracy on this history is at least the
nearest-neighbour rule's, else the nearest-neighbour rule; ``Plan.why`` (``TrainResult.why``,
``asp-gmm history why``) says which, with both scores.

*Cost.* The history of the device is read once per process into memory
(:meth:`asp_gmm.tuning_db.History.view`) and folded into per-class aggregates; planning on a warm
history is dictionary look-ups (tens of microseconds). Records are queued and written in batches
(one transaction per second at most, and at exit).
"""

from .plan import (  # noqa: F401
    CONFIRM_WITHIN,
    ESTEP_PREFERENCE,
    EXPLORE_COMPILE_WORK,
    EXPLORE_FRACTION,
    FIRST_LAUNCH_MAX,
    PREFERENCE,
    PRUNE_FACTOR,
    PRUNE_MIN_CLASSES,
    RULE_TAIL_FACTOR,
    SAMPLE_MIN,
    SETTLED_CALLS,
    TUNE_FRACTION,
    TUNE_GAIN,
    TUNE_PATIENCE,
    TUNE_PROPOSALS,
    TUNE_RATIO,
    UNKNOWN_RATIO,
    TUNE_VARIANTS,
    TUNE_WITHIN,
    Plan,
    RuleSelector,
    Selector,
    autotune_enabled,
    rule_order,
)
from ..variant import Config  # noqa: F401  (the configuration a plan names)
from .index import NEIGHBOURS, N_WEIGHT, _Index, problem_class  # noqa: F401
from .history import HistorySelector  # noqa: F401
from .policy import Policy  # noqa: F401
from . import costmodel, search  # noqa: F401
