"""Each rule of the selection that pays for itself, replayed from committed histories.

* sample-based exploration and its budget (a fake backend with fixed per-event costs);
* pruning of candidates predicted far slower (tests/data/replay_rules.json, V1 always 3x);
* tunable search (coordinate descent, cheaper than exhaustive);
* the cost model for unseen shapes, chosen over nearest neighbour by leave-one-out;
* a property: a pinned variant or ``ASP_GMM_AUTOTUNE=0`` never explores.
"""

import dataclasses
import time
from pathlib import Path

import numpy as np
import pytest

from asp_gmm import selection
from asp_gmm.selection import costmodel, search
from asp_gmm.problem import Problem
from asp_gmm.selection import Config, HistorySelector, Policy, RuleSelector
from asp_gmm.specializer import BANK_CALLS, Specializer
from asp_gmm.tuning_db import History
from conftest import make_blobs
from test_selection import FakeBackend, FakeSession, _train, fake_variant

RULES = Path(__file__).parent / "data" / "replay_rules.json"
RULE_VARIANTS = [fake_variant("V1"), fake_variant("V2"), fake_variant("V3", {"chunk": [4, 8]}), fake_variant("V4")]


@pytest.fixture
def rules(tmp_path):
    h = History(f"sqlite:///{tmp_path / 'rules.sqlite'}")
    h.import_(RULES)
    yield HistorySelector(h), FakeBackend(RULE_VARIANTS), h
    h.close()


def cands(p):
    return [Config.of(v) for v in RULE_VARIANTS]


# ------------------------------------------------------------------ sampled exploration, budget
class _FirstLaunchBackend(FakeBackend):
    """A fake whose first iteration of V3 in a session costs ``extra`` seconds more (a GPU loading
    a kernel's functions on its first launch; how much differs between variants): 3x V3's
    iteration on a 32 768-event sample, 7 % of a 10-iteration call on 140 000 events."""

    first_launch_costs_more = True
    extra = {"V3": 3 * 1e-6 * 32768}

    def open(self, X, problem):
        session = super().open(X, problem)
        first, launched = session._em, set()

        def em(kernel, **kw):
            run = first(kernel, **kw)
            if kernel.variant.name not in launched:
                launched.add(kernel.variant.name)
                run.iter_seconds = list(run.iter_seconds)
                run.iter_seconds[0] += self.extra.get(kernel.variant.name, 0.0)
            return run

        session._em = em
        return session


@pytest.mark.parametrize("warm_launch", [True, False])
def test_a_first_launchs_extra_cost_does_not_rank_a_configuration(tmp_path, monkeypatch, rng, warm_launch):
    """V3 is the fastest, but its first launch costs 4x: a backend that declares it gets each
    sampled configuration run twice and the faster run recorded, so V3 is found and runs the
    bulk; without the second run V3's sample reads 4x (4 us against V4's 2 us per event) and
    the call runs V4."""
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    # (reported costs, not slept: a call's allowance, 10 % of ~2 s, dwarfs the real per-run overheads)
    be = _FirstLaunchBackend(costs={"V1": 5e-6, "V2": 3e-6, "V3": 1e-6, "V4": 2e-6, "V5": 4e-6})
    monkeypatch.setattr(be, "first_launch_costs_more", warm_launch)
    sp = Specializer(be, HistorySelector(h))
    X = make_blobs(rng, 140000, 3, 2)
    calls = [_train(sp, X, 2, iters=10) for _ in range(4)]
    assert any(label.startswith("V3") for c in calls for label in c.explored), [c.explored for c in calls]
    h.flush()
    v3 = [r.seconds / r.N for r in h.rows() if r.sampled_from and r.variant.name == "V3"]
    assert v3 and (v3[0] == pytest.approx(1e-6) if warm_launch else v3[0] == pytest.approx(4e-6))
    assert _train(sp, X, 2, iters=10).variant.startswith("V3" if warm_launch else "V4")


def test_what_exploring_costs_is_known_to_every_specializer_of_the_backend(tmp_path, monkeypatch, rng):
    """A GMM per call makes a specializer per call: the per-run overhead and the sample copy's rate
    that one call measured must charge the next call's first run and copy (they were each
    specializer's own, so every call predicted them as free and overshot its allowance)."""
    from asp_gmm.explore import Exploration as _Exploration

    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    be = FakeBackend(costs={"V1": 5e-7, "V2": 3e-7, "V3": 1e-7, "V4": 2e-7, "V5": 4e-7})
    X = make_blobs(rng, 140000, 3, 2)
    one = Specializer(be, HistorySelector(h))
    assert _train(one, X, 2, iters=10).explored and one.last_exploration["copy"] > 0
    other = Specializer(be, HistorySelector(h))
    p = Problem(len(X), 3, 2, "full", X.dtype.name)
    plan = other.policy.choose(be, p, other.candidates(p))
    ex = _Exploration(other, X, p, selection.SAMPLE_MIN, 10, plan)
    assert ex._predicted_copy() > 0 and ex.overhead > 0
    assert ex.overhead == one._costs.overhead[selection.problem_class(p)]
    # the allowance is a tenth of the call as a whole (its last wall time per iteration, exploring
    # left out), not only of its kernels' time
    own = one._costs.call_seconds[selection.problem_class(p)]
    assert own > 0
    kernels = ex.sp.policy.explore_allowance(p, 10, min(r for r in (ex.fastest, ex.whole) if r))
    one._costs.call_seconds[selection.problem_class(p)] = 100 * kernels
    assert ex.allowance() >= selection.EXPLORE_FRACTION * 10 * 100 * kernels
    h.close()


def test_a_copy_too_costly_for_anything_to_fit_is_predicted_half_as_costly_next(tmp_path, monkeypatch, rng):
    """One costly copy of the sample that stops every candidate from fitting is predicted half as
    costly on the next call, so that exploring is not stopped for good by a process's first session
    (38 ms against 3 ms after on the H200)."""
    from asp_gmm.explore import Exploration

    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    be = FakeBackend(costs={"V1": 5e-7, "V2": 3e-7, "V3": 1e-7, "V4": 2e-7, "V5": 4e-7})
    sp = Specializer(be, HistorySelector(h))
    X = make_blobs(rng, 140000, 3, 2)
    N, D = X.shape
    p = Problem(N, D, 2, "full", X.dtype.name)
    w, mu = np.full(2, 0.5), X[[0, N - 1]].astype(np.float64)
    cv = np.repeat(np.eye(D)[None], 2, 0)
    sp.train(X, w, mu, cv, p, 1e-6, 10, 10, 0.0)
    assert sp._costs.call_seconds[selection.problem_class(p)] > 0
    sp._costs.copy_rate = 1.0  # a second per byte: nothing can fit
    plan = sp.policy.choose(be, p, sp.candidates(p))
    assert plan.explore
    ex = Exploration(sp, X, p, selection.SAMPLE_MIN, 10, plan)
    ex.round(plan, w, mu, cv, 1e-6)
    ex.close()
    assert ex.runs == 0 and ex.skipped and sp._costs.copy_rate == 0.5
    h.close()


def test_the_allowance_is_a_tenth_of_the_call_as_a_whole():
    pol = Policy()
    p = Problem(500000, 36, 128)
    kernels = pol.explore_allowance(p, 10, 4e-9)
    assert kernels == pytest.approx(selection.EXPLORE_FRACTION * 10 * 500000 * 4e-9)
    assert pol.explore_allowance(p, 10, 4e-9, 5.4e-3) == pytest.approx(selection.EXPLORE_FRACTION * 10 * 5.4e-3)
    assert pol.explore_allowance(p, 10, 4e-9, 1e-6) == kernels  # never below the kernels' own


def test_large_n_explores_on_a_sample_records_it_as_sampled_and_keeps_the_result(tmp_path, monkeypatch, rng):
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    costs = {"V1": 5e-7, "V2": 3e-7, "V3": 1e-7, "V4": 2e-7, "V5": 4e-7}
    be = FakeBackend(costs=costs)
    sp = Specializer(be, HistorySelector(h))
    N = 140000
    assert sp.policy.sample_size(Problem(N, 3, 2), 4, 10) == selection.SAMPLE_MIN < N // 4
    X = make_blobs(rng, N, 3, 2)
    first = _train(sp, X, 2, iters=10)
    # the primary and then the others ran one iteration each on the sample, within the budget
    sample_runs = [n for n, k in be.ran[:-1]]
    assert first.explored and first.explored[0] == "V4" and len(first.explored) == len(sample_runs)
    assert be.ran[-1] == (first.variant.split("(")[0], 10)  # every EM iteration of the call
    h.flush()
    sampled = [r for r in h.rows() if r.sampled_from is not None]
    assert sampled and all(r.sampled_from == N and r.N == selection.SAMPLE_MIN for r in sampled)
    assert [r for r in h.rows() if r.sampled_from is None][0].N == N
    # the call's result is that of the configuration it ran, pinned
    be2 = FakeBackend(costs=costs)
    be2.preference = [first.variant.split("(")[0]]
    ref = _train(Specializer(be2, selection.RuleSelector()), X, 2, iters=10)
    np.testing.assert_allclose(first.means, ref.means, rtol=1e-12)
    # and the best variant (V3) is measured on the sample within three calls (each within its
    # allowance) and from then on runs the bulk
    calls = [first]
    while len(calls) < 3 and not any(label.startswith("V3") for c in calls for label in c.explored):
        calls.append(_train(sp, X, 2, iters=10))
    assert any(label.startswith("V3") for c in calls for label in c.explored), [c.explored for c in calls]
    assert _train(sp, X, 2, iters=10).variant.startswith("V3")
    h.close()


@pytest.mark.parametrize("iters", [5, 10, 30])
@pytest.mark.parametrize("spread", [(1, 2, 3, 4, 4), (4, 1, 2, 4, 3), (1, 4, 4, 4, 4)])
def test_a_call_never_spends_more_than_its_allowance_and_a_class_settles_in_three_calls(
    tmp_path, monkeypatch, rng, iters, spread
):
    """Every cost of the sampled exploration (the sample's copy and session, the launches) is
    charged, each configuration's cost predicted before it runs; with the candidates within the
    assumed spread of an unpredicted one (UNKNOWN_RATIO), no call spends more than its allowance
    (EXPLORE_FRACTION of the call's time on the configuration it runs), and by the third call the
    class needs no more exploring (the fourth with 5 iterations a call)."""
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    assert max(spread) <= selection.UNKNOWN_RATIO
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    costs = {n: 1e-5 * r for n, r in zip(["V4", "V3", "V2", "V1", "V5"], spread)}
    be = FakeBackend(costs=costs)
    sp = Specializer(be, HistorySelector(h))
    N = 400000
    X = make_blobs(rng, N, 3, 2)
    reasons, total_spent, total_time = [], 0.0, 0.0
    settle = 3 if iters >= 10 else 4  # a short call's allowance holds fewer sampled iterations
    for call in range(settle + 1):
        res = _train(sp, X, 2, iters=iters)
        reasons.append(res.reason)
        a = sp.last_exploration
        call_time = costs[res.variant.split("(")[0]] * N * iters
        total_time += call_time
        if a is not None:
            # its own share, and what earlier calls of the class left unspent (bounded)
            assert a["allowance"] <= (1 + BANK_CALLS) * selection.EXPLORE_FRACTION * call_time * (1 + 1e-9)
            assert a["spent"] <= a["allowance"], (call, a)
            assert "allowance" in res.why
            total_spent += a["spent"]
        # and the class's exploring, all calls together, within the fraction of their time
        assert total_spent <= selection.EXPLORE_FRACTION * total_time * 1.02, (call, total_spent, total_time)
    assert reasons[settle] == "history" and sp.last_exploration is None, reasons


def test_a_configuration_predicted_to_overshoot_is_left_for_the_next_call(tmp_path, monkeypatch, rng):
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    costs = {"V4": 1e-6, "V3": 1e-5, "V2": 1e-5, "V1": 1e-5, "V5": 1e-5}  # others 10x slower
    be = FakeBackend(costs=costs)
    sp = Specializer(be, HistorySelector(h))
    X = make_blobs(rng, 140000, 3, 2)
    first = _train(sp, X, 2, iters=10)
    # V4 (primary) costs 2.3% of the call; an unpredicted candidate is charged 4x that: none fits
    assert first.explored == ["V4"]
    a = sp.last_exploration
    assert a["spent"] <= a["allowance"] and set(a["skipped"]) >= {"V3(chunk=4)", "V2"}
    assert "would overshoot" in first.why
    h.close()


def test_exploration_within_twice_the_primary_stays_inside_the_allowance(tmp_path, monkeypatch, rng):
    # candidates at most twice the primary's cost: every call's exploring (one sampled iteration a
    # configuration) stays within its allowance, nothing is measured twice, and within four calls
    # every candidate has been measured
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    costs = {"V4": 1e-6, "V3": 1.5e-6, "V2": 1.2e-6, "V1": 2e-6, "V5": 1.8e-6}
    be = FakeBackend(costs=costs)
    sp = Specializer(be, HistorySelector(h))
    X = make_blobs(rng, 140000, 3, 2)
    explored = []
    for _ in range(4):
        res = _train(sp, X, 2, iters=10)
        a = sp.last_exploration
        if a is not None:
            assert a["spent"] <= a["allowance"], a
        assert not set(res.explored) & set(explored), (res.explored, explored)
        explored += res.explored
    assert {label.split("(")[0] for label in explored} == set(costs), explored
    h.close()


def test_a_runs_overhead_seen_in_one_call_is_charged_before_the_next_calls_first_run(tmp_path, monkeypatch, rng):
    """Each sampled run costs 30 ms besides its timed iteration (a GPU's launches, parameters and
    look-ups; here a sleep in the kernel look-up), far more than a call's allowance. The first call
    cannot know it and overshoots once; every later call is charged it before its first run, so
    none overshoots (charged nothing, each call's first run overshot again)."""

    class SlowLookup(FakeBackend):
        def kernel(self, variant, tunables, problem):
            time.sleep(0.03)
            return super().kernel(variant, tunables, problem)

    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    be = SlowLookup(costs={"V4": 1e-8, "V3": 1.5e-8, "V2": 1.2e-8, "V1": 2e-8, "V5": 1.8e-8})
    sp = Specializer(be, HistorySelector(h))
    X = make_blobs(rng, 140000, 3, 2)
    _train(sp, X, 2, iters=10)
    first = sp.last_exploration
    assert first["runs"] >= 1 and first["spent"] > first["allowance"]  # unknown until measured
    over_in_place = 0
    for _ in range(3):
        _train(sp, X, 2, iters=10)
        a = sp.last_exploration
        if a is None:
            continue
        if a["sample"] < len(X):
            # (2 ms: a 30 ms sleep's scheduling on a busy 2-core machine, and the plan made after a
            # round; charged nothing, each call overshot by the 30 ms)
            assert a["spent"] <= a["allowance"] + 2e-3, a
        else:
            # in place a loaded kernel's look-up is charged as the class's slowest seen in place:
            # unknown at the class's first, which may overshoot once (then it is known)
            over_in_place += a["spent"] > a["allowance"] + 2e-3
    assert over_in_place <= 1
    h.close()


def test_small_n_explores_in_place(tmp_path, monkeypatch, rng):
    p = Problem(5000, 3, 2)
    assert Policy().sample_size(p, 4, 10) == 5000


class _CostlySampleBackend(FakeBackend):
    """A backend whose sampled exploration has a fixed cost far above one EM iteration (a GPU's
    session over the sample: 4-6 ms against a 0.75 ms iteration at (150 000, 19, 16) diag)."""

    sample_fixed_prior = 10.0

    def open(self, X, problem):
        self.opened = getattr(self, "opened", []) + [problem.N]
        return super().open(X, problem)


def test_a_class_whose_iteration_costs_less_than_a_sample_explores_in_place_within_the_allowance(
    tmp_path, monkeypatch, rng
):
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    be = _CostlySampleBackend(costs={"V1": 2e-9, "V2": 1.2e-9, "V3": 1.5e-9, "V4": 1e-9, "V5": 1.8e-9})
    sp = Specializer(be, HistorySelector(h))
    X = make_blobs(rng, 140000, 3, 2)
    assert sp.policy.sample_size(Problem(140000, 3, 2), 4, 10) < 140000  # large enough for a sample
    explored = []
    for _ in range(3):
        res = _train(sp, X, 2, iters=10)
        a = sp.last_exploration
        if a is not None:
            assert a["sample"] == 140000 and a["copy"] == 0.0 and a["spent"] <= a["allowance"], a
        explored += res.explored
    assert explored and len(explored) == len(set(explored))
    assert be.opened == [140000] * 3  # no session over a sample
    h.flush()
    assert not any(r.sampled_from for r in h.rows())  # every timing is of the whole data
    # the same parameters as a run of one configuration (explored iterations are the call's own)
    ref = _train(Specializer(FakeBackend(costs=be.costs), selection.RuleSelector()), X, 2)
    np.testing.assert_allclose(res.means, ref.means, rtol=1e-10)
    h.close()


def test_in_place_a_configuration_predicted_to_overshoot_is_left_for_a_later_call(tmp_path, monkeypatch, rng):
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    monkeypatch.setattr(selection.plan, "UNKNOWN_RATIO", 1e9)  # nothing predicted fits any allowance
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    be = _CostlySampleBackend(costs={"V1": 2e-9, "V2": 1.2e-9, "V3": 1.5e-9, "V4": 1e-9, "V5": 1.8e-9})
    sp = Specializer(be, HistorySelector(h))
    X = make_blobs(rng, 140000, 3, 2)
    res = _train(sp, X, 2, iters=10)
    a = sp.last_exploration
    assert res.explored == [] and a["runs"] == 0 and a["spent"] == 0.0 and len(a["skipped"]) == 4, a
    assert "left for later calls" in res.why
    assert [n for n, _ in be.ran] == ["V4"] * len(be.ran)  # only the planned configuration ran
    h.close()


class _UnknownCostlyBackend(FakeBackend):
    """A GPU-like backend: a sampled exploration's fixed part costs more than one EM iteration of
    the class (so it explores in place) and an unpredicted configuration is charged 40x the
    fastest in place (so nothing unpredicted ever fits there); ``opened`` lists the sessions' N."""

    unknown_ratio_prior = 40.0
    sample_fixed_prior = 0.05

    def open(self, X, problem):
        self.opened = getattr(self, "opened", []) + [problem.N]
        return super().open(X, problem)


def test_what_in_place_cannot_afford_is_timed_on_a_sample_within_the_allowance(tmp_path, monkeypatch, rng):
    """A class that explores in place with nothing predicted (a fresh history) explored nothing,
    ever (on the H200, (500 000, 36, 128) full stayed on V5 while V8 ran its iterations 1.3x faster); now the
    candidates in place cannot afford are timed on a sample where that fits the allowance (with
    what earlier calls left unspent), every call within its allowance, and the class moves to the
    fastest once a whole-data check confirms it."""
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    # V4 (the rule's first) 14 ms an iteration at N = 140 000 in reported time; V3 is 2x faster
    be = _UnknownCostlyBackend(costs={"V1": 4e-7, "V2": 1.5e-7, "V3": 0.5e-7, "V4": 1e-7, "V5": 2e-7})
    sp = Specializer(be, HistorySelector(h))
    X = make_blobs(rng, 140000, 3, 2)
    used, sampled_calls = [], 0
    for call in range(8):
        res = _train(sp, X, 2, iters=10)
        used.append(res.variant.split("(")[0])
        a = sp.last_exploration
        if a is not None:
            assert a["spent"] <= a["allowance"] * (1 + 1e-9), (call, a)
        if any(n < 140000 for n in be.opened):
            sampled_calls += 1
        be.opened = []
    h.flush()
    assert sampled_calls >= 1 and any(r.sampled_from for r in h.rows())
    assert used[-1] == "V3", used
    h.close()


# ------------------------------------------------------------------ pruning
def test_a_candidate_predicted_far_slower_is_pruned(rules, monkeypatch):
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    sel, be, _ = rules
    p = Problem(100000, 8, 16)  # held out of the fixture
    plan = sel.plan(be, p, cands(p))
    assert plan.reason == "explore"
    assert [c.variant.name for c in plan.pruned] == ["V1"]
    assert "V1" not in [c.variant.name for c in plan.explore] + [plan.primary.variant.name]
    assert "pruned V1" in plan.why


def test_a_class_ranks_its_candidates_once_until_something_new_is_measured(rules, monkeypatch):
    """V1 stays untried (pruned), so every plan of the class needs the candidates ranked: the
    ranking is computed once and reused until a configuration is measured in a class for the
    first time (or RANK_ROWS rows come in), not on every call."""
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    sel, be, h = rules
    p = Problem(100000, 8, 16)
    ranked, real = [], sel._rank
    monkeypatch.setattr(sel, "_rank", lambda *a: ranked.append(1) or real(*a))
    first = sel.plan(be, p, cands(p))
    assert [c.variant.name for c in first.pruned] == ["V1"]
    for _ in range(5):
        again = sel.plan(be, p, cands(p))
        assert again.primary == first.primary and again.pruned == first.pruned and again.explore == first.explore
    assert len(ranked) == 1
    # a configuration measured in the class for the first time: ranked again
    sel.record(be, p, first.primary, "ok", 0.5)
    h.flush()
    assert sel.plan(be, p, cands(p)).pruned == first.pruned
    assert len(ranked) == 2
    # another timing of it: the ranking stands
    sel.record(be, p, first.primary, "ok", 0.6)
    h.flush()
    sel.plan(be, p, cands(p))
    assert len(ranked) == 2


def test_prune_min_classes_counts_classes_of_the_cvtype_and_dtype(rules, monkeypatch):
    """The pruning evidence is the classes of the problem's cvtype and dtype the prediction rests
    on (not every class of the device), so PRUNE_MIN_CLASSES decides."""
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    sel, be, _ = rules
    p = Problem(100000, 8, 16)
    idx = sel.index(be)
    _, _, rel, _ = sel._rank(be, p, cands(p), idx)
    here = sum(1 for k in idx.classes if k[:2] == (p.cvtype, p.dtype))
    assert rel and all(0 < n <= here for _, n in rel.values())
    n_v1 = next(n for c, (_, n) in rel.items() if c.variant.name == "V1")
    monkeypatch.setattr(selection.plan, "PRUNE_MIN_CLASSES", n_v1 + 1)
    idx.searched.clear()
    assert not sel.plan(be, p, cands(p)).pruned
    monkeypatch.setattr(selection.plan, "PRUNE_MIN_CLASSES", n_v1)
    assert [c.variant.name for c in sel.plan(be, p, cands(p)).pruned] == ["V1"]
    # another dtype has no evidence here
    assert p.dtype == "float32"
    p64 = Problem(100000, 8, 16, dtype="float64")
    _, _, rel64, _ = sel._rank(be, p64, cands(p64), idx)
    assert all(n == 0 for _, n in rel64.values())


def test_the_tunable_search_proposes_the_predicted_gain_first():
    space = {"a": [1, 2, 3], "b": [10, 20]}
    start = {"a": 1, "b": 10}
    measured = {search.key(start): 1.0}
    plain = search.get("coordinate").propose(space, start, measured, 3)
    assert plain[0] == {"a": 2, "b": 10}
    prior = {search.key({"a": 1, "b": 20}): -0.5, search.key({"a": 2, "b": 10}): 0.3}
    got = search.get("coordinate").propose(space, start, measured, 3, prior=prior)
    assert got == [{"a": 1, "b": 20}, {"a": 3, "b": 10}, {"a": 2, "b": 10}]


# ------------------------------------------------------------------ tunable search
def test_coordinate_search_converges_in_fewer_measurements_than_exhaustive():
    space = {"a": [1, 2, 3], "b": [10, 20, 30], "c": [0, 1]}
    cost = lambda t: (t["a"] - 3) ** 2 + (t["b"] - 20) ** 2 / 100 + t["c"] + 1  # noqa: E731
    for name in ("coordinate", "exhaustive"):
        strat, measured, start = search.get(name), {}, {"a": 1, "b": 10, "c": 0}
        while True:
            nxt = strat.propose(space, start, measured, 4)
            if not nxt:
                break
            for t in nxt:
                measured[search.key(t)] = cost(t)
        best = min(measured, key=measured.get)
        assert dict(best) == {"a": 3, "b": 20, "c": 0}
        if name == "coordinate":
            assert len(measured) < search.space_size(space) == 18
        else:
            assert len(measured) == 18


def test_unknown_strategy_names_the_known_ones():
    with pytest.raises(ValueError, match="coordinate.*exhaustive"):
        search.get("annealing")


def test_tunable_search_inside_the_plan_once_variants_are_measured(rules, monkeypatch):
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    sel, be, _ = rules
    p = Problem(10000, 8, 4)  # V3 (chunk=4) fastest, every variant measured
    plan = sel.plan(be, p, cands(p))
    assert plan.reason == "explore" and [c.label for c in plan.explore] == ["V3(chunk=8)"]
    assert plan.primary.label == "V3(chunk=4)" and "coordinate search" in plan.why


def test_the_tunable_search_explores_at_its_own_smaller_share(rules, monkeypatch, tmp_path, rng):
    """Once a class's variants are measured, the tunable search's proposals run within
    TUNE_FRACTION of a call (and what earlier calls banked at that rate), not the variants' share:
    the search moves a variant by tens of per cent, and at the variants' share it took a call or two
    of every ten (H200, benchmarks/selection.py --regret)."""
    from asp_gmm.explore import Exploration

    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    sel, be, _ = rules
    p = Problem(10000, 8, 4)  # every variant measured: the search proposes V3's other chunk
    plan = sel.plan(be, p, cands(p))
    assert "coordinate search" in plan.why and plan.fraction == selection.TUNE_FRACTION < selection.EXPLORE_FRACTION
    fresh = Problem(10000, 8, 300)  # nothing measured here: the variants first, at their share
    assert sel.plan(be, fresh, cands(fresh)).fraction == selection.EXPLORE_FRACTION
    # the sampled exploration's allowance is the plan's share of the call
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    fb = FakeBackend(costs={"V1": 5e-7, "V2": 3e-7, "V3": 1e-7, "V4": 2e-7, "V5": 4e-7})
    X = make_blobs(rng, 140000, 3, 2)
    sp = Specializer(fb, HistorySelector(h))
    _train(sp, X, 2, iters=10)
    q = Problem(len(X), 3, 2, "full", X.dtype.name)
    base = sp.policy.choose(fb, q, sp.candidates(q))
    got = {}
    for frac in (selection.EXPLORE_FRACTION, selection.TUNE_FRACTION):
        ex = Exploration(sp, X, q, selection.SAMPLE_MIN, 10, dataclasses.replace(base, banked=0.0, fraction=frac))
        got[frac] = ex.allowance()
    assert got[selection.TUNE_FRACTION] == pytest.approx(
        got[selection.EXPLORE_FRACTION] * selection.TUNE_FRACTION / selection.EXPLORE_FRACTION
    )
    h.close()


# ------------------------------------------------------------------ cost model
def test_cost_model_beats_or_matches_nearest_neighbour_by_leave_one_out(rules):
    sel, be, _ = rules
    idx = sel.index(be)
    name, model, loo_nn, loo_model = idx.predictor("full", "float32")
    assert loo_model >= 0.9 and loo_model >= loo_nn
    assert name == "model" and model is not None


@pytest.mark.parametrize("N,D,M,best", [(100000, 8, 16, "V4"), (10000, 32, 4, "V3"), (30000, 6, 48, "V4")])
def test_unseen_shapes_are_predicted_by_the_cost_model(rules, monkeypatch, N, D, M, best):
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "0")
    sel, be, _ = rules
    p = Problem(N, D, M)
    plan = sel.plan(be, p, cands(p))
    assert (plan.reason, plan.primary.variant.name) == ("predicted", best)
    assert "cost model" in plan.why


def test_loo_accuracy_counts_within_tolerance():
    classes = {(0.0, 0.0, 0.0): {"a": 1.0, "b": 2.0}, (1.0, 0.0, 0.0): {"a": 1.0, "b": 1.04}}
    assert costmodel.loo_accuracy(classes, lambda o, c, k: "b") == (0.5, 2)


@pytest.mark.parametrize("seed", range(8))
def test_fast_leave_one_out_equals_refitting_every_fold(seed):
    """The selector's per-process leave-one-out (linear in the points) gives the same accuracies as
    the generic one that refits every model for every fold, on random histories with grid ties,
    classes of one configuration and configurations below MIN_POINTS."""
    r = np.random.default_rng(seed)
    keys = [f"V{i}" for i in range(int(r.integers(2, 7)))]
    classes = {}
    for _ in range(int(r.integers(3, 40))):
        c = (float(r.integers(10, 40)) / 2, float(np.log(r.integers(1, 64))), float(np.log(r.integers(1, 256))))
        ks = r.choice(keys, size=int(r.integers(1, len(keys) + 1)), replace=False)
        classes[c] = {str(k): float(np.exp(r.normal(-18, 1))) for k in ks}
    assert costmodel.loo_model_accuracy(classes) == costmodel.loo_accuracy(classes, costmodel.model_predictor)
    assert costmodel.loo_nearest_accuracy(classes) == costmodel.loo_accuracy(classes, costmodel.nearest_predictor)


# ------------------------------------------------------------------ property: never explores
@pytest.mark.parametrize("seed", range(12))
def test_pinned_or_autotune_off_never_explores(rules, monkeypatch, seed):
    sel, be, _ = rules
    r = np.random.default_rng(seed)
    p = Problem(
        int(10 ** r.uniform(3, 7)), int(r.integers(1, 40)), int(r.integers(1, 130)), str(r.choice(["full", "diag"]))
    )
    pol = Policy(sel)
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    c = cands(p)
    pin = c[int(r.integers(0, len(c)))]
    plan = pol.choose(be, p, [pin], pinned=True)
    assert plan.explore == [] and plan.primary == pin
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "0")
    plan = pol.choose(be, p, c, tuning=selection.autotune_enabled())
    assert plan.explore == [] and plan.reason in ("history", "predicted", "rule")


def test_autotune_off_train_runs_one_configuration_at_large_n(tmp_path, monkeypatch, rng):
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "0")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    be = FakeBackend()
    res = _train(Specializer(be, HistorySelector(h)), make_blobs(rng, 140000, 3, 2), 2, iters=3)
    assert res.explored == [] and len(be.ran) == 1 and h.count() == 0
    h.close()


# ------------------------------------------------------------------ bounded history
# a plain SQLite path is written with the standard library (tuning_db.lite), a URL with options
# through SQLAlchemy (tuning_db.sa_ops): the bound's logic is one, its statements are two
WRITERS = {"lite": "sqlite:///{}", "sqlalchemy": "sqlite:///file:{}?uri=true"}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_the_history_keeps_a_bounded_number_of_timings_per_class(tmp_path, writer):
    from asp_gmm.tuning_db import VariantKey

    h = History(WRITERS[writer].format(tmp_path / "h.sqlite"), keep_per_class=4, flush_interval=0)
    assert (h._lite_path is None) == (writer == "sqlalchemy")
    k = VariantKey.of("c", "V1", {}, "f" * 64)
    for i in range(30):  # thousands of slightly different N in one class: the diarization pattern
        h.record("dev", {"backend": "c", "model": "x"}, k, 10000 + i, 4, 2, "full", "float32", "ok", 1e-3)
    h.record("dev", {"backend": "c", "model": "x"}, k, 10000, 4, 2, "full", "float32", "ok", 1e-3, sampled_from=10**6)
    h.flush()
    rows = h.rows()
    assert len([r for r in rows if r.sampled_from is None]) == 4
    assert max(r.N for r in rows if r.sampled_from is None) == 10029  # the newest kept
    assert len([r for r in rows if r.sampled_from]) == 1
    h.close()


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_the_bound_holds_within_one_write_batch(tmp_path, writer):
    from asp_gmm.tuning_db import VariantKey
    from asp_gmm.tuning_db.store import KEEP_PER_CLASS

    url = WRITERS[writer].format(tmp_path / "h.sqlite")
    h = History(url, batch_rows=10**6, flush_interval=3600)  # the default bound, one flush
    k = VariantKey.of("c", "V1", {}, "f" * 64)
    for i in range(100):
        h.record("dev", {"backend": "c", "model": "x"}, k, 10000 + i, 4, 2, "full", "float32", "ok", 1e-3)
    h.record("dev", {"backend": "c", "model": "x"}, k, 10000, 4, 2, "full", "float32", "compile-failed")
    assert h.pending == 101
    h.flush()
    h.close()
    h = History(url)
    rows = h.rows()
    ok = [r.N for r in rows if r.status == "ok"]
    assert sorted(ok) == list(range(10100 - KEEP_PER_CLASS, 10100))  # the newest of the batch
    assert [r.status for r in rows if r.status != "ok"] == ["compile-failed"]  # failures are kept
    h.close()


# ------------------------------------------------------------------ tunables predicted from neighbours
@pytest.mark.parametrize("classes_with_tuned", [1, 3])
def test_an_unseen_shape_runs_the_tunables_its_nearest_classes_prefer(tmp_path, monkeypatch, classes_with_tuned):
    """Nearest rule (fewer classes than the cost model needs): V3 is the best variant nearby, and
    V3(chunk=8) is 20 % faster than V3's default in the classes that measured it. Measured in at
    least two of them, the unseen shape runs V3(chunk=8); in one only, V3's default (one timing
    does not decide)."""
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "0")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    sel, be = HistorySelector(h), FakeBackend(RULE_VARIANTS)
    v1, v3 = RULE_VARIANTS[0], RULE_VARIANTS[2]
    for i, (D, M) in enumerate([(8, 16), (10, 16), (8, 20)]):
        p = Problem(20000, D, M)
        sel.record(be, p, Config.of(v1), "ok", 2e-3, None, 3)
        sel.record(be, p, Config.of(v3), "ok", 1e-3, None, 3)
        if i < classes_with_tuned:
            sel.record(be, p, Config.of(v3, {"chunk": 8}), "ok", 0.8e-3, None, 3)
    h.flush()
    plan = sel.plan(be, Problem(20000, 9, 18), cands(Problem(20000, 9, 18)))
    assert plan.reason == "predicted" and "nearest" in plan.why
    want = "V3(chunk=8)" if classes_with_tuned >= 2 else "V3(chunk=4)"
    assert plan.primary.label == want, plan.why
    h.close()


def test_warm_reads_the_rows_and_fits_the_predictor_before_the_first_plan(rules):
    """prepare's hook does the first plan's one-time work: the device's rows folded into the index
    and the predictor of each (cvtype, dtype) asked for fitted; a plan afterwards adds nothing."""
    sel, be, h = rules
    p = Problem(100000, 8, 16, "diag", "float32")
    sel.warm(be, [p, Problem(5000, 3, 2, "diag", "float32")])
    idx = sel.index(be)
    assert idx.consumed == len(h.view(be.device_id).rows) > 0
    assert set(idx._predictor) == {("diag", "float32")}
    fitted = idx._predictor[("diag", "float32")]
    sel.plan(be, p, cands(p))
    assert idx._predictor[("diag", "float32")] is fitted
    RuleSelector().warm(be, [p])  # the rule has nothing to warm


def test_warm_on_a_broken_history_disables_it_and_does_not_raise(rules, monkeypatch):
    sel, be, h = rules

    def broken(*a, **k):
        raise RuntimeError("disk gone")

    monkeypatch.setattr(h, "view", broken)
    sel.warm(be, [Problem(1000, 3, 2)])
    assert h._asp_gmm_warned is True  # warned once; calls go on without the history


def test_spread_is_the_widest_class_ratio_and_follows_new_rows(rules):
    """The widest slowest/fastest ratio of a class, kept per class: equal to recomputing it from the
    aggregates, and a new row that widens one class's ratio shows at once."""
    sel, be, h = rules
    idx = sel.index(be)

    def brute(ct):
        w = 1.0
        for k, per in list(idx.classes.items()) + list(idx.sampled.items()):
            ts = [a.median for a in per.values() if a.median > 0]
            if k[:2] == ct and len(ts) > 1:
                w = max(w, max(ts) / min(ts))
        return w

    cts = {k[:2] for k in idx.classes}
    for ct in cts:
        assert idx.spread(*ct) == pytest.approx(brute(ct), rel=1e-12)
    ct = ("full", "float32") if ("full", "float32") in cts else sorted(cts)[0]
    k = next(k for k, per in idx.classes.items() if k[:2] == ct and len(per) > 1)
    p = Problem(int(2 ** (k[4] / 2)), k[2], k[3], *ct)
    slow = 1e3 * max(a.median for a in idx.classes[k].values()) * p.N
    for _ in range(40):  # enough rows to move the slowest configuration's median
        sel.record(be, p, cands(p)[0], "ok", slow)
    idx = sel.index(be)
    assert idx.spread(*ct) == pytest.approx(brute(ct), rel=1e-12) and idx.spread(*ct) > 100


def test_spread_counts_the_ratios_measured_on_samples(rules):
    """In a fresh history the sampled timings are all there is: a configuration 70x the fastest on a
    sample widens the spread, so the next unmeasured ones are predicted that costly, not at the
    4x floor (they overshot a call's allowance 2-10x)."""
    sel, be, h = rules
    idx = sel.index(be)
    ct = ("diag", "float32")
    before = idx.spread(*ct)
    p = Problem(32768, 7, 5, *ct)  # a class the history has not measured
    fast, slow = cands(p)[:2]
    for cfg, per_event in ((fast, 1e-8), (slow, 70e-8)):
        sel.record(be, p, cfg, "ok", per_event * p.N, None, 1, sampled_from=3_000_000)
    idx = sel.index(be)
    assert idx.spread(*ct) == pytest.approx(max(before, 70.0), rel=1e-6) and idx.spread(*ct) >= 70.0 - 1e-6


def test_every_selectable_cuda_variant_has_a_place_in_the_rule():
    """The fixed rule (what a new class runs first and the order it explores in) names every CUDA
    covariance variant the selection may choose: an unlisted one is explored last, which is how the
    tensor-core variants (the largest gains at large problems) came to be tried on a class's third
    to sixth call. They come right after the rule's first choice."""
    from asp_gmm import registry
    from asp_gmm.selection import PREFERENCE

    selectable = {v.name for v in registry.variants("cuda", "covariance") if v.extra.get("selectable", True)}
    for order, first in ((PREFERENCE["cuda"], "V5"), (PREFERENCE[("cuda", "diag")], "V7")):
        assert selectable <= set(order), sorted(selectable - set(order))
        assert order[0] == first and order.index("V4") > max(order.index(n) for n in ("V7", "V8", "V9"))


@pytest.mark.parametrize(
    "cvtype, without, first",
    [("diag", (), "V7"), ("spherical", (), "V7"), ("diag", ("V7",), "V9"), ("full", (), "V5"), ("tied", (), "V5")],
)
def test_the_cuda_rule_starts_a_diagonal_class_on_v7_and_a_full_one_on_v5(cvtype, without, first):
    """A fresh history runs the rule's first choice: for diagonal (and spherical) problems V7, else
    V9 (measured fastest where V7 cannot run; V5 nowhere: benchmarks/rule_order.py), for full (and
    tied) V5. Every caller passes the problem's kernel covariance type."""
    from types import SimpleNamespace

    from asp_gmm import registry
    from asp_gmm.selection import Config, RuleSelector

    be = SimpleNamespace(name="cuda")
    cands = [
        Config.of(v, v.default_tunables())
        for v in registry.variants("cuda", "covariance")
        if v.name not in without and Problem(1000, 8, 4, cvtype, "float32").kernel_cvtype in v.cvtypes
    ]
    plan = RuleSelector().plan(be, Problem(1000, 8, 4, cvtype, "float32"), cands)
    assert plan.primary.variant.name == first


@pytest.mark.parametrize("slow", [100.0, 2.0])
def test_a_second_sampled_run_that_would_overshoot_the_allowance_is_not_made(tmp_path, monkeypatch, rng, slow):
    """On a backend whose first launch costs more, each sampled configuration runs twice; but one
    whose first run leaves no room in the allowance for a second and is slower than any first
    launch makes a contender (100x the fastest here) runs once: its second run overshot the call's
    allowance by as much again. One 2x the fastest runs twice (its first launch may hide a
    contender)."""
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    # (reported costs, not slept, large enough that the NumPy runs' own wall time, charged as the
    # runs' overhead, stays small beside the allowance on a loaded machine)
    be = _FirstLaunchBackend(costs={"V1": slow * 2e-6, "V2": 3e-6, "V3": 1e-6, "V4": 2e-6, "V5": 4e-6})
    be.extra = {}
    be.preference = ["V4", "V1", "V3", "V2", "V5"]  # V1 explored on the first call
    # the allowance a call's own: 10 % of 10 iterations on 600 000 events (1.2 s) fits the
    # primary's and V1's predicted sampled runs (2 x 32 768 events each, V1 at 4x the fastest)
    sp = Specializer(be, HistorySelector(h))
    X = make_blobs(rng, 600_000, 3, 2)
    c = _train(sp, X, 2, iters=10)
    assert any(label.startswith("V1") for label in c.explored), c.explored
    assert [n for n, k in be.ran if k == 1].count("V1") == (1 if slow > 4 else 2)


def test_specializers_of_one_backend_share_the_candidates_memo(monkeypatch):
    """A GMM per call makes a specializer per call: the candidates of a problem are found once per
    backend and process, and found again when the declared variants are reloaded."""
    from asp_gmm import registry
    from asp_gmm.runtime import Runtime

    rt = Runtime()
    be = FakeBackend()
    found = []
    real = Specializer._find_candidates
    monkeypatch.setattr(Specializer, "_find_candidates", lambda self, p, v: found.append(p) or real(self, p, v))
    p = Problem(5000, 3, 2)
    a, b = Specializer(be, runtime=rt), Specializer(be, runtime=rt)
    assert a.candidates(p) == b.candidates(p) and len(found) == 1
    assert Specializer(FakeBackend(), runtime=rt).candidates(p) and len(found) == 2  # another backend
    reloaded = tuple(list(registry.all_variants()))  # the same declarations, read again: a new tuple
    monkeypatch.setattr(registry, "all_variants", lambda: reloaded)
    b.candidates(p)
    assert len(found) == 3


def test_a_one_iteration_call_of_a_class_exploring_in_place_explores_nothing(tmp_path, monkeypatch, rng):
    """Its only iteration is the planned configuration's (an unpriced configuration could cost
    UNKNOWN_RATIO times the call or more)."""
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    be = _CostlySampleBackend(costs={"V1": 2e-9, "V2": 1.2e-9, "V3": 1.5e-9, "V4": 1e-9, "V5": 1.8e-9})
    sp = Specializer(be, HistorySelector(h))
    res = _train(sp, make_blobs(rng, 140000, 3, 2), 2, iters=1)
    assert res.explored == [] and [n for n, _ in be.ran] == ["V4"] and be.opened == [140000]
    h.close()


# ------------------------------------------------------------------ a sample's ranking checked on the data
class _CacheSession(FakeSession):
    """Per-event costs that depend on the events' number: ``sample_costs`` up to 100 000 events (a
    sample fits in caches), ``costs`` beyond; every run logged as (variant, events, iterations)."""

    def _em(self, kernel, **kw):
        run = super()._em(kernel, **kw)
        be = self.backend
        per = (be.sample_costs if self.problem.N <= 100_000 else be.costs).get(kernel.variant.name, 1e-6)
        run.iter_seconds = [per * self.problem.N] * run.iters
        run.cov_seconds = [per * self.problem.N / 2] * run.iters
        be.log.append((kernel.variant.name, self.problem.N, run.iters))
        return run


class _CacheBackend(FakeBackend):
    def __init__(self, sample_costs, costs):
        super().__init__(costs=costs)
        self.sample_costs, self.log = sample_costs, []

    def open(self, X, problem):
        return _CacheSession(self, X, problem)


def test_a_samples_winner_is_checked_on_the_data_within_the_call(tmp_path, monkeypatch, rng):
    """V2 is the fastest on a sample and 3x slower than V4 on the data (a sample fits in caches; 2
    of 5 fresh histories at N = 1.5 M on the 2-core CPU kept V2 or V3 this way). The call whose
    sampled exploration makes V2 the class's choice runs on V4, the best timed on the data, and
    checks V2 there in place (one iteration); later calls plan V4. The old selection ran that
    call's every iteration on V2 (and, with no whole-data timing of V4 yet, kept it: one
    calibration of sampled times cannot reorder them). V1, put after V2 by the rule and slower on
    the sample, never runs on the data."""
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    # (reported times large against the NumPy runs' wall clock: the allowance covers the samples)
    sample_costs = {"V1": 1.4e-5, "V2": 1.0e-5, "V3": 1.3e-5, "V4": 1.2e-5, "V5": 9e-5}
    costs = {"V1": 4e-5, "V2": 3e-5, "V3": 1.5e-5, "V4": 1e-5, "V5": 9e-5}
    be = _CacheBackend(sample_costs, costs)
    sp = Specializer(be, HistorySelector(h))
    N = 140000
    X = make_blobs(rng, N, 3, 2)
    calls = []
    for _ in range(8):
        be.log.clear()
        res = _train(sp, X, 2, iters=10)
        calls.append((res.variant.split("(")[0], [(n, k) for n, nn, k in be.log if nn == N]))
    on_data = [run for _, runs in calls for run in runs]
    assert ("V2", 10) not in on_data, calls  # never a whole call on the sample's winner
    assert ("V2", 1) in on_data and "V1" not in {n for n, _ in on_data}, calls
    checked = next(runs for _, runs in calls if ("V2", 1) in runs)
    assert checked == [("V4", 1), ("V4", 1), ("V2", 1), ("V4", 7)], calls  # V4 (two), V2 checked, V4 the rest
    assert calls[-1] == ("V4", [("V4", 10)]), calls
    h.flush()
    assert {r.variant.name for r in h.rows() if r.sampled_from is None} >= {"V2", "V4"}
    h.close()


def test_a_sample_only_class_checks_its_winner_against_the_rules_choice_in_one_call(tmp_path, monkeypatch, rng):
    """Every variant timed on samples only, none on the data, V2 fastest there and V4 1.6x slower
    (within CONFIRM_WITHIN): the next call runs V2's first two iterations on the data, then V4 and V3
    (put before V2 by the rule) one each, priced by their sampled times against V2's iteration on
    the data, and the rest on V4, the fastest on the data; V1 (after V2 in the rule) is not run
    there."""
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    sample_costs = {"V1": 1.5e-5, "V2": 1.0e-5, "V3": 1.7e-5, "V4": 1.6e-5, "V5": 9e-5}
    costs = {"V1": 4e-5, "V2": 3e-5, "V3": 1.5e-5, "V4": 1e-5, "V5": 9e-5}
    be = _CacheBackend(sample_costs, costs)
    sel = HistorySelector(h)
    sp = Specializer(be, sel)
    N, D, M = 140000, 3, 2
    sample = Problem(selection.SAMPLE_MIN, D, M, "full", "float32")
    for cfg in [Config.of(v, v.default_tunables()) for v in be.covariance_variants(sample)]:
        sel.record(be, sample, cfg, "ok", sample_costs[cfg.variant.name] * sample.N, None, 1, sampled_from=N)
    X = make_blobs(rng, N, D, M).astype(np.float32)
    res = _train(sp, X, M, iters=10)
    on_data = [(n, k) for n, nn, k in be.log if nn == N]
    assert on_data == [("V2", 1), ("V2", 1), ("V4", 1), ("V3", 1), ("V4", 6)], (on_data, res.why)
    assert res.variant.split("(")[0] == "V4"
    h.close()


class _UnderfillBackend(_CacheBackend):
    """Samples under-fill this device (a GPU): V5 runs a sample faster than V4, V4 the data faster."""

    samples_underfill = True


def test_where_samples_under_fill_the_device_a_variant_slower_on_the_sample_is_checked_on_the_data(
    tmp_path, monkeypatch, rng
):
    """V4 is put after V5 by this backend's rule and runs a sample 1.3x slower than V5 but the data
    2x faster (on an H200 at (500 000, 36, 128) full, V8 against V5). The call whose sampled
    exploration times V4 checks it on the data in place and runs the rest on it; without
    ``samples_underfill`` (a CPU, whose samples fit caches) it is not checked there."""
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    # (reported times below the NumPy runs' wall clock, which the allowances are reckoned from)
    sample_costs = {"V1": 2.2e-8, "V2": 2.1e-8, "V3": 2e-8, "V4": 1.3e-8, "V5": 1.0e-8}
    costs = {"V1": 2.2e-8, "V2": 2.1e-8, "V3": 2e-8, "V4": 0.5e-8, "V5": 1.0e-8}
    for cls, checked in ((_UnderfillBackend, True), (_CacheBackend, False)):
        h = History(f"sqlite:///{tmp_path / (cls.__name__ + '.sqlite')}")
        be = cls(sample_costs, costs)
        be.preference = ["V5", "V4", "V3", "V2", "V1"]
        sp = Specializer(be, HistorySelector(h))
        X = make_blobs(rng, 140000, 3, 2)
        ran = []
        for _ in range(5):
            be.log.clear()
            res = _train(sp, X, 2, iters=10)
            ran.append((res.variant.split("(")[0], [(n, k) for n, nn, k in be.log if nn == 140000]))
        on_data = {n for _, runs in ran for n, _ in runs}
        assert ("V4" in on_data) == checked, ran
        if checked:
            assert ran[-1][0] == "V4", ran
        h.close()


def test_a_rule_tail_variant_behind_one_measured_far_slower_is_not_explored(tmp_path, monkeypatch):
    """The backend's rule_tail (CUDA: V3, V2, V1, 10-200x the fastest on the rule's grid) is left
    unexplored in a class where a variant the rule puts before it ran RULE_TAIL_FACTOR times the
    best; a tail variant ahead of that measurement, or a backend without a tail, explores as before."""
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    be = FakeBackend(RULE_VARIANTS)
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    sel = HistorySelector(h)
    p = Problem(300000, 5, 7, "full", "float32")  # a class the replayed history has not seen
    cfgs = {c.variant.name: c for c in cands(p)}
    sel.record(be, p, cfgs["V4"], "ok", 1e-6 * p.N, None, 1)
    sel.record(be, p, cfgs["V3"], "ok", 2.5e-6 * p.N, None, 1)  # the rule: V4, V3, V2, V1
    plan = sel.plan(be, p, cands(p))
    assert {c.variant.name for c in plan.explore} == {"V2", "V1"}  # no tail: explored
    be.rule_tail = ("V2", "V1")
    sel = HistorySelector(h)
    plan = sel.plan(be, p, cands(p))
    assert plan.explore == [] or {c.variant.name for c in plan.explore} == {"V3"}, plan.explore
    assert {c.variant.name for c in plan.pruned} >= {"V2", "V1"}
    assert "the rule's tail" in plan.why and "predicted >" not in plan.why
    h.close()


class _SlowLoadBackend(FakeBackend):
    """A backend whose kernels' first load costs (a GPU module: ~15 ms); V3 is never loaded."""

    load_seconds_prior = 1e3

    def is_loaded(self, variant, tunables, problem):
        return variant.name != "V3"


def test_a_kernels_first_load_is_charged_before_a_sampled_run(tmp_path, monkeypatch, rng):
    """A configuration whose kernel is not loaded yet is charged its load (the backend's prior until
    one is measured) before it runs on the sample: here V3's would overshoot every allowance, so it
    is left for later calls while the others are explored; the load was not predicted before (a
    call exploring V4 at (500 000, 36, 128) full on an H200 spent 24 ms of a 17 ms allowance)."""
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    be = _SlowLoadBackend(costs={"V1": 1.1e-5, "V2": 1.05e-5, "V3": 1e-5, "V4": 1e-5, "V5": 1.2e-5})
    sp = Specializer(be, HistorySelector(h))
    X = make_blobs(rng, 400000, 3, 2)
    explored, skipped = [], set()
    for _ in range(4):
        res = _train(sp, X, 2, iters=10)
        explored += res.explored
        a = sp.last_exploration
        if a is not None:
            skipped |= set(a["skipped"])
    assert not any(label.startswith("V3") for label in explored), explored
    assert any(label.startswith("V3") for label in skipped), skipped
    assert {"V2", "V1"} <= {label.split("(")[0] for label in explored}, explored
    h.close()


def test_in_place_exploring_is_not_priced_from_an_inflated_first_iteration(tmp_path, monkeypatch):
    """The first iteration of a call exploring in place prices the rest; a first iteration slowed by
    one-time costs (a kernel's first launch: here 40 ms of wall clock) is reckoned at the class's
    known whole-data time, so the allowance and the proposals' cost are not inflated by it (an
    H200 call that explored V9's tunables in place ran 144 ms over the pinned call while its
    account, reckoned from its first iteration, said 0 ms)."""
    import types

    from asp_gmm.explore import InPlace

    be = FakeBackend()
    sp = Specializer(be, HistorySelector(History(f"sqlite:///{tmp_path / 'h.sqlite'}")))
    p = Problem(100_000, 4, 2)
    cfg = Config.of(be.variants[0])

    def step(c, kernel, record):
        t = time.perf_counter()
        time.sleep(0.04)  # the first launch, inside the iteration's own timing
        return types.SimpleNamespace(iter_seconds=[time.perf_counter() - t], cov_seconds=[0.0])

    known = selection.Plan(cfg, [cfg], "explore", fastest=5e-8)  # 5 ms an iteration on the data
    ip = InPlace(sp, p, known, 10, step)
    ip.first(kernel=None)
    assert 5e-8 * p.N <= ip.t_iter < 0.02  # 5 ms and the step's own overhead, not the 40 ms
    assert ip.allowance == pytest.approx(ip._allowance(ip.t_iter))
    unknown = InPlace(sp, p, selection.Plan(cfg, [cfg], "explore"), 10, step)  # nothing measured yet
    unknown.first(kernel=None)
    assert unknown.t_iter >= 0.04


def test_in_place_exploring_is_priced_from_an_iteration_after_the_calls_first(tmp_path, monkeypatch):
    """A call's first iteration carries one-time costs outside its kernels' timing (H200,
    (1 000 000, 128, 1024) diag: 60 ms of wall clock around 15 ms of kernels); priced from it, every
    proposal looked free and the allowance was three times too large. A second iteration of the
    primary prices the rest where the call has room for it."""
    import types

    from asp_gmm.explore import InPlace

    be = FakeBackend()
    sp = Specializer(be, HistorySelector(History(f"sqlite:///{tmp_path / 'h.sqlite'}")))
    p = Problem(100_000, 4, 2)
    cfg = Config.of(be.variants[0])
    calls = []

    def step(c, kernel, record):
        if not calls:
            time.sleep(0.05)  # one-time, outside the kernels' own timing
        calls.append(c)
        t = time.perf_counter()
        time.sleep(0.005)
        return types.SimpleNamespace(iter_seconds=[time.perf_counter() - t], cov_seconds=[0.0])

    for plan in (selection.Plan(cfg, [cfg], "explore"), selection.Plan(cfg, [cfg], "explore", fastest=5e-8)):
        calls.clear()
        ip = InPlace(sp, p, plan, 10, step)
        ip.first(kernel=None)
        assert len(calls) == 2
        assert ip.t_iter < 0.03, ip.t_iter  # 5 ms and the step's overhead, not the 55 ms
    calls.clear()
    short = InPlace(sp, p, selection.Plan(cfg, [cfg], "explore"), 3, step)  # no room: one iteration
    short.first(kernel=None)
    assert len(calls) == 1 and short.t_iter >= 0.05
    calls.clear()
    done = InPlace(sp, p, selection.Plan(cfg, [cfg], "explore"), 10, step)  # converged at once:
    done.first(kernel=None, iters_left=lambda: 0)  # no iteration past convergence
    assert len(calls) == 1


def test_a_variants_tunable_search_ends_after_its_patience_without_a_gain(tmp_path, monkeypatch):
    """A variant whose tunable combinations all run as fast as its defaults (within TUNE_GAIN) gets
    TUNE_PATIENCE of them measured, then no more proposals: the coordinate search alone would
    walk its every neighbour (here 9), a GPU call paying about a tenth of itself for each."""
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    wide = fake_variant("V3", {"a": [1, 2, 3, 4], "b": [1, 2, 3, 4], "c": [1, 2, 3, 4]})
    variants = [fake_variant("V1"), wide]
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    sel, be = HistorySelector(h), FakeBackend(variants)
    p = Problem(10000, 8, 4)
    cs = [Config.of(v) for v in variants]
    sel.record(be, p, cs[0], "ok", 2e-3, None, 1)
    sel.record(be, p, cs[1], "ok", 1e-3, None, 1)
    measured = 0
    for step in range(20):
        plan = sel.plan(be, p, cs)
        if not plan.explore:
            break
        cfg = plan.explore[0]
        # each within 1 % of the defaults, or a gain where it is noted below
        sel.record(be, p, cfg, "ok", 1e-3 * (0.995 if step % 2 else 1.005), None, 1)
        measured += 1
    assert measured == selection.TUNE_PATIENCE, measured
    assert search.stale([1.0, 0.99, 0.5, 0.52, 0.51], 0.02) == 2
    assert search.stale([1.0, 0.97], 0.02) == 0
    h.close()
