"""A class whose planned call explored nothing reuses that plan for its next calls while nothing it
stands on changes (``specializer.SETTLED_CALLS``): one call, then two, four... between plans."""

from __future__ import annotations

import pytest

from asp_gmm import registry
from asp_gmm.selection import Config, HistorySelector, Policy
from asp_gmm.specializer import SETTLED_CALLS, Specializer
from asp_gmm.tuning_db import History
from conftest import make_blobs
from test_selection import COSTS, FakeBackend, _train


class _Counting(Policy):
    """The policy, counting the plans it makes."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.plans = 0

    def choose(self, *a, **kw):
        self.plans += 1
        return super().choose(*a, **kw)


def _settling(tmp_path, rng, be):
    """A specializer on ``be`` and a fresh history, its class trained until its calls explore
    nothing: (specializer, counting policy, data, history)."""
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    policy = _Counting(HistorySelector(h))
    sp = Specializer(be, policy=policy)
    X = make_blobs(rng, 3000, 4, 3)
    for _ in range(6):
        res = _train(sp, X, 3)
        if not res.explored and res.reason == "history":
            break
    assert res.reason == "history" and not res.explored
    return sp, policy, X, h


@pytest.fixture
def settled(tmp_path, monkeypatch, rng):
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    be = FakeBackend(costs=COSTS)
    sp, policy, X, h = _settling(tmp_path, rng, be)
    yield sp, be, policy, X, h
    h.close()


def _planned(sp, policy, X, n, **kw):
    """Whether each of ``n`` calls was planned, and the configurations they ran."""
    out, ran = [], []
    for _ in range(n):
        before = policy.plans
        res = _train(sp, X, 3, **kw)
        out.append(policy.plans > before)
        ran.append(res.variant)
    return out, ran


def test_a_settled_class_plans_after_one_two_four_calls_up_to_the_span(settled):
    sp, be, policy, X, _h = settled
    planned, ran = _planned(sp, policy, X, 64)
    # the call that settled was planned with span 1: one reused call, then a plan, two reused...
    spans, run = [], 0
    for p in planned:
        if p:
            spans.append(run)
            run = 0
        else:
            run += 1
    assert spans[:5] == [1, 2, 4, 8, 16][: len(spans[:5])] and max(spans) == SETTLED_CALLS, planned
    assert len(set(ran)) == 1  # the same configuration throughout
    # a reused call runs the whole EM on it, with nothing explored
    be.ran = []
    res = _train(sp, X, 3)
    assert be.ran == [(res.variant.split("(")[0], 10)] and res.explored == [] and res.iters == 10


def test_the_same_result_as_a_planned_call(settled):
    sp, _be, policy, X, _h = settled
    a = _train(sp, X, 3)
    b = _train(sp, X, 3)
    fresh = _train(Specializer(FakeBackend(costs=COSTS), policy=Policy(policy.selector)), X, 3)
    for r in (a, b):
        assert r.variant == fresh.variant
        for got, want in zip((r.weights, r.means, r.covars), (fresh.weights, fresh.means, fresh.covars)):
            assert got.tobytes() == want.tobytes()


def test_a_new_measurement_or_failure_plans_the_next_call(settled):
    sp, be, policy, X, h = settled
    _planned(sp, policy, X, 8)  # well into a span
    p = _train(sp, X, 3)
    assert "settled" in p.why
    # a configuration of the class measured for the first time (another process, say)
    from asp_gmm.problem import Problem

    prob = Problem(X.shape[0], X.shape[1], 3, "full", X.dtype.name)
    v1 = next(v for v in be.variants if v.name == "V1")
    policy.record(be, prob, Config.of(v1, {}), "launch-failed")
    before = policy.plans
    _train(sp, X, 3)
    assert policy.plans == before + 1
    # the declarations reloaded (a new variant): planned again too
    _planned(sp, policy, X, 4)
    registry.all_variants.cache_clear()
    try:
        before = policy.plans
        _train(sp, X, 3)
        assert policy.plans == before + 1
    finally:
        registry.all_variants.cache_clear()


def test_deterministic_and_untuned_calls_plan_every_time(settled, monkeypatch):
    sp, _be, policy, X, _h = settled
    monkeypatch.setenv("ASP_GMM_DETERMINISTIC", "1")
    planned, _ = _planned(sp, policy, X, 4)
    assert all(planned)
    monkeypatch.delenv("ASP_GMM_DETERMINISTIC")
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "0")
    planned, _ = _planned(sp, policy, X, 4)
    assert all(planned)


class _Loads(FakeBackend):
    """A backend whose readiness changes when it loads a kernel."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.loads = 0

    def readiness_token(self):
        return self.loads


def test_a_readiness_change_plans_the_next_call(tmp_path, monkeypatch, rng):
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    be = _Loads(costs=COSTS)
    sp, policy, X, h = _settling(tmp_path, rng, be)
    _planned(sp, policy, X, 8)
    before = policy.plans
    _train(sp, X, 3)
    reused = policy.plans == before
    be.loads += 1
    _train(sp, X, 3)
    assert reused and policy.plans == before + 1
    h.close()


def test_a_class_with_nothing_that_fits_settles_until_a_candidate_may_fit(tmp_path, monkeypatch, rng):
    """Exploring in place with nothing that fits the allowance is a settled class too, its plan made
    again no later than the call in which a candidate may fit (``InPlace.calls_to_fit``)."""
    from asp_gmm import explore
    from test_explore_priors import _LoadingBackend, _declared

    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")

    def hopeless(self, saved=0.0):
        self.skipped = [c.label for c in self.plan.explore]  # (left for later calls, as it reports)
        return True

    monkeypatch.setattr(explore.InPlace, "hopeless", hopeless)
    monkeypatch.setattr(explore.InPlace, "calls_to_fit", lambda self, horizon, sampled=None: 3)
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    be = _LoadingBackend(variants=[_declared("V4", (1.0, 1.0)), _declared("V3", (0.5, 4.0))])
    policy = _Counting(HistorySelector(h))
    sp = Specializer(be, policy=policy)
    X = make_blobs(rng, 140000, 2, 2)
    _train(sp, X, 2, iters=10)  # the first call prices nothing
    planned, _ = _planned(sp, policy, X, 16)
    h.close()
    # reused calls between two planned ones (the last run may be cut short by the loop's end)
    reused = [len(r) for r in "".join("p" if p else "r" for p in planned).split("p")[:-1] if r]
    assert reused[:2] == [1, 2] and set(reused[2:]) == {2}, planned  # spans 1, 2, 2...: not 4 or 8


def test_calls_to_fit_counts_the_calls_until_the_savings_may_pay_a_candidate(monkeypatch):
    """Each call adds its fraction of the iterations to the class's savings; the first call whose
    savings make a candidate fit in place, on a sample first or on a sample is the answer."""
    import types

    from asp_gmm import explore

    plan = types.SimpleNamespace(fraction=0.1, fastest=1e-6, primary=None, explore=["c"])
    probe = explore.InPlace(types.SimpleNamespace(), types.SimpleNamespace(N=1000, cvtype="full"), plan, 10, None)
    per_call = 0.1 * 10 * 1e-6 * 1000
    monkeypatch.setattr(explore, "sample_first", lambda *a: [])
    monkeypatch.setattr(explore.InPlace, "hopeless", lambda self, saved=0.0: saved < 2.5 * per_call)
    assert probe.calls_to_fit(16) == 3
    monkeypatch.setattr(explore.InPlace, "hopeless", lambda self, saved=0.0: True)
    assert probe.calls_to_fit(16) == 17
    sampled = types.SimpleNamespace(fits=lambda plan, saved: saved > 4.5 * per_call)
    assert probe.calls_to_fit(16, sampled) == 5
    monkeypatch.setattr(explore, "sample_first", lambda sp, problem, plan, iters, saved: saved > 1.5 * per_call)
    assert probe.calls_to_fit(16, sampled) == 2


def test_a_settled_batch_class_reuses_its_plans(tmp_path, monkeypatch, rng):
    """Batched training and scoring settle too (the bundled meeting planned 193 batched calls of
    18 classes); a reused plan gives the same models as a planned one."""
    import numpy as np

    from asp_gmm import score_many, train_many
    from test_batch import _batch, _models

    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    policy = _Counting(HistorySelector(h))
    spec = Specializer("c", policy=policy)
    D = 4
    data, params = _batch(rng, D, "diag", np.float32)

    def train():
        many = _models(params, D, "diag", np.float32, "c")
        many[0]._specializer = spec  # the batch runs with the first model's policy
        train_many(many, data, min_em_iters=2, max_em_iters=2)
        return many

    try:
        for _ in range(40):  # until a call explores nothing (the variants compile in the background)
            before = policy.plans
            many = train()
            spec.backend.wait_background(120)
            if "explore" not in many[0].last_train.reason and policy.plans == before + 1:
                break
        else:
            pytest.fail("the batch class kept exploring for 40 calls")
        planned, last = [], (many[0].last_variant, [np.asarray(g.means).tobytes() for g in many])
        for _ in range(12):
            before = policy.plans
            got = train()
            planned.append(policy.plans > before)
            mine = (got[0].last_variant, [np.asarray(g.means).tobytes() for g in got])
            if planned[-1]:
                last = mine
            else:  # the configuration of the last plan, and its very result
                assert mine == last
        # (1, 2, 4 calls reused between plans: 4 plans in 12; configurations within the timings'
        # noise may take turns, each new plan reusing for one call)
        assert sum(planned) <= 7, planned
        before = policy.plans
        for _ in range(6):
            score_many(got, data[0])
        assert policy.plans - before <= 3
    finally:
        h.close()
