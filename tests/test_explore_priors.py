"""Exploring in place a configuration nothing of the class predicts: priced from its variant's
declared ratio to the rule's first choice (``rule_ratio`` in the manifest, ``explore.prior_ratio``),
its module's first load paid from what the class saved beyond ``BANK_CALLS`` calls."""

from __future__ import annotations

import dataclasses
import time

import pytest

from asp_gmm import explore, registry
from asp_gmm.selection import Config, HistorySelector
from asp_gmm.specializer import Specializer
from asp_gmm.tuning_db import History
from conftest import make_blobs
from test_selection import FakeBackend, _train, fake_variant


def _declared(name, ratio, tunables=None):
    v = fake_variant(name, tunables)
    return dataclasses.replace(v, extra={"rule_ratio": {"full": list(ratio)}})


def test_prior_ratio_is_the_slowest_over_the_primarys_fastest_with_the_margin():
    first, fast, other = (
        _declared("V4", (1.0, 1.0)),
        _declared("V3", (0.5, 1.2), {"chunk": [4, 8]}),
        fake_variant("V2"),
    )
    got = explore.prior_ratio(Config.of(fast), Config.of(first), "full")
    assert got == pytest.approx(explore.RULE_RATIO_MARGIN * 1.2)
    # the primary faster than the rule's first: the other's slowest over the primary's fastest
    assert explore.prior_ratio(Config.of(first), Config.of(fast), "full") == pytest.approx(
        explore.RULE_RATIO_MARGIN * 1.0 / 0.5
    )
    assert explore.prior_ratio(Config.of(fast, {"chunk": 8}), Config.of(first), "full") is None  # a tunable point
    assert explore.prior_ratio(Config.of(fast), Config.of(first), "diag") is None  # not declared for diag
    assert explore.prior_ratio(Config.of(other), Config.of(first), "full") is None  # not declared


def test_every_cuda_variant_declaring_rule_ratio_declares_a_range_of_its_own_cvtypes():
    for v in registry.variants("cuda", "covariance"):
        rr = v.extra.get("rule_ratio")
        if rr is None:
            continue
        for cv, (lo, hi) in rr.items():
            assert cv in v.cvtypes and 0 < lo <= hi, (v.name, cv, lo, hi)
    v8, v5 = registry.get("cuda", "V8", "covariance"), registry.get("cuda", "V5", "covariance")
    assert 1.0 < explore.prior_ratio(Config.of(v8), Config.of(v5), "full") < 5.0


class _LoadingBackend(FakeBackend):
    """A GPU-like backend: an unpredicted configuration is charged 40x in place, a sample's
    session costs more than any allowance (so the class explores in place only), and a kernel's
    first load in the process takes ``LOAD`` seconds (priced at the prior, a little more)."""

    unknown_ratio_prior = 40.0
    sample_fixed_prior = 10.0
    load_seconds_prior = 0.08
    LOAD = 0.05

    def __init__(self, **kw):
        super().__init__(**kw)
        self.loaded = set()

    def is_loaded(self, variant, tunables, problem):
        return (variant.name, tuple(sorted((tunables or {}).items()))) in self.loaded

    def kernel(self, variant, tunables, problem):
        key = (variant.name, tuple(sorted((tunables or {}).items())))
        if key not in self.loaded:
            time.sleep(self.LOAD)
            self.loaded.add(key)
        return super().kernel(variant, tunables, problem)


#: V4 (the rule's first) and V3 twice as fast, in the backend's reported time (about the wall
#: clock's: the class's bank is saved from reported times)
COSTS = {"V1": 4e-6, "V2": 3e-6, "V3": 0.75e-7, "V4": 1.5e-7, "V5": 2e-6}


def _calls(tmp_path, variants, n_calls, rng, backend=None, costs=COSTS, D=2):
    """``n_calls`` trainings of one class on a fresh history: (variant used, explorations'
    accounts, the runs (variant, iterations) of each call)."""
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    be = (backend or _LoadingBackend)(variants=variants, costs=costs)
    sp = Specializer(be, HistorySelector(h))
    X = make_blobs(rng, 140000, D, 2)
    used, accounts, runs = [], [], []
    for _ in range(n_calls):
        be.ran = []
        res = _train(sp, X, 2, iters=10)
        used.append(res.variant.split("(")[0])
        runs.append(list(be.ran))
        if sp.last_exploration is not None:
            accounts.append(dict(sp.last_exploration))
    h.close()
    return used, accounts, runs


def test_a_declared_ratio_and_a_saved_up_load_let_a_small_class_explore_in_place(tmp_path, monkeypatch, rng):
    """A class whose calls are too short to ever hold a module's load in BANK_CALLS calls' allowance,
    with nothing predicting its candidates (priced at 40x), stayed on the rule's first choice for
    good (on the H200, (153 600, 32, 32) full: V5 in every call, V8 10 % faster). With the variants'
    declared ratios and the load paid from what the class saved, it explores the faster one in
    place, within every call's allowance, and moves to it."""
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    # no call's allowance holds a load (82 ms against 10 % of ten 20-30 ms iterations, nothing banked)
    monkeypatch.setattr(explore, "BANK_CALLS", 0)
    declared = [
        _declared("V4", (1.0, 1.0)),
        _declared("V3", (0.5, 1.2), {"chunk": [4, 8]}),
        fake_variant("V2"),
        fake_variant("V1"),
    ]
    used, accounts, runs = _calls(tmp_path / "a", declared, 12, rng)
    # (0.1 s for the scheduling of a 50 ms sleep and 20 ms iterations on a busy machine: the
    # allowances are held to the letter in tests/test_selection_rules.py)
    assert all(a["spent"] <= a["allowance"] + 0.1 for a in accounts), accounts
    assert "V3" in used and used[-1] == "V3", used
    # while the class saves for the load, its calls run whole (the first prices the class: split;
    # the code before split them all)
    k = used.index("V3")
    assert k >= 2 and any(r == [("V4", 10)] for r in runs[1:k]), runs[: k + 1]
    # the same class without the declarations explores nothing in place
    plain = [fake_variant("V4"), fake_variant("V3", {"chunk": [4, 8]}), fake_variant("V2"), fake_variant("V1")]
    used, accounts, _ = _calls(tmp_path / "b", plain, 12, rng)
    assert set(used) == {"V4"} and not any(a["runs"] for a in accounts), (used, accounts)


class _SlowOpenBackend(_LoadingBackend):
    """Every kernel loaded; a session's opening costs far more than an EM iteration (the call's
    wall clock per iteration then says little of what an explored iteration costs)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.loaded = {(n, ()) for n in ("V1", "V2", "V4")} | {("V3", (("chunk", 4),))}

    def open(self, X, problem):
        time.sleep(1.5)
        return super().open(X, problem)


def test_a_call_whose_candidates_cannot_fit_its_in_place_allowance_runs_whole(tmp_path, monkeypatch, rng):
    """The check that a call has nothing to explore reckoned the allowance from the call's wall
    clock per iteration (the session's opening in it), exploring in place from a priced iteration:
    a candidate between the two split every call around its first iterations and never ran (H200,
    (150 000, 19, 16) diag, 0.9 against 0.11 ms). Both now reckon it as exploring in place did."""
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    monkeypatch.setattr(explore, "BANK_CALLS", 0)
    variants = [
        _declared("V4", (1.0, 1.0)),
        _declared("V3", (0.5, 4.5), {"chunk": [4, 8]}),  # priced 5.9x: 100 ms a run of 21
        fake_variant("V2"),
        fake_variant("V1"),
    ]
    _, _, runs = _calls(tmp_path, variants, 4, rng, _SlowOpenBackend)
    assert all(r == [("V4", 10)] for r in runs[2:]), runs


class _CostlyInPlaceBackend(FakeBackend):
    """An unpredicted configuration charged 40x in place; a sample's session cheap (0.05 s)."""

    unknown_ratio_prior = 40.0
    sample_fixed_prior = 0.05


def test_a_sample_prices_an_unmeasured_variant_from_its_declared_ratio(tmp_path, monkeypatch, rng):
    """What exploring in place cannot afford is timed on a sample first, priced there at the plan's
    unknown ratio (4x): V3, declared 12-370x the rule's first on the grid, ran 30-40x on a sample
    and overshot its call's allowance 3x ((1 000 000, 64, 64) diag, H200: 33.5 ms of 11.5). Its
    declared ratio prices it now, and it does not fit these calls' allowances."""
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    variants = [
        _declared("V4", (1.0, 1.0)),
        _declared("V3", (30.0, 40.0), {"chunk": [4, 8]}),
        _declared("V2", (0.5, 1.2)),
        fake_variant("V1"),
    ]
    costs = {"V1": 4e-7, "V2": 0.5e-7, "V3": 4e-6, "V4": 1e-7}
    _, accounts, runs = _calls(tmp_path, variants, 8, rng, _CostlyInPlaceBackend, costs, D=3)
    assert all(a["spent"] <= a["allowance"] * (1 + 1e-9) for a in accounts), accounts
    ran = [n for r in runs for n, _ in r]
    # (priced at 4x, V3 ran on a sample in the sixth call: 0.14 s against a 0.05 s allowance)
    assert "V2" in ran and "V3" not in ran, ran


def test_every_selectable_cuda_variant_declares_its_ratio_for_full_and_diag():
    """An undeclared variant nothing of the class predicts is priced on a sample at the plan's
    unknown ratio (4x in a fresh history): V2, ~100x V9 at (1 000 000, 128, 1024) diag on the H200
    and undeclared, ran on a sample and spent 103 ms of a 43 ms allowance. Every variant selection
    may explore on CUDA declares its ratio (benchmarks/rule_order.py --variants), so its price
    there is its declared slowest against the primary's fastest: V2 behind V9 well beyond 40x."""
    for v in registry.variants("cuda", "covariance"):
        if not v.extra.get("selectable", True):
            continue
        for cv in {"full", "diag"} & set(v.cvtypes):
            assert cv in v.extra.get("rule_ratio", {}), (v.name, cv)
    v2, v9 = registry.get("cuda", "V2", "covariance"), registry.get("cuda", "V9", "covariance")
    assert explore.prior_ratio(Config.of(v2), Config.of(v9), "diag") > 40


class _SplitCostBackend(FakeBackend):
    """Every kernel loaded, a sample's session dearer than any allowance (the class explores in
    place), and each EM entry costing ``ENTRY`` s of wall clock beyond its iterations, whose
    reported time is their wall clock (the variant's cost, slept, and the NumPy work): a split
    call pays the entry once per split, the pinned loop once. ``reported``: the iterations' sum
    and the E-steps of ``loglik``."""

    unknown_ratio_prior = 40.0
    sample_fixed_prior = 10.0
    split_costs_more = True
    ENTRY = 0.05

    def is_loaded(self, variant, tunables, problem):
        return True

    def open(self, X, problem):
        s = super().open(X, problem)
        em, costs = s._em, self.costs

        def split(kernel, **kw):
            t = time.perf_counter()
            run = em(kernel, **kw)
            cost = costs[kernel.variant.name] * problem.N
            time.sleep(self.ENTRY + cost * run.iters)
            run.iter_seconds = [(time.perf_counter() - t - self.ENTRY) / run.iters] * run.iters
            self.reported += sum(run.iter_seconds)
            return run

        def loglik():  # (an E-step where the parameters are new: the pinned loop does it in em)
            t = time.perf_counter()
            got = ll()
            self.reported += time.perf_counter() - t
            return got

        ll, s._em, s.loglik = s.loglik, split, loglik
        return s


def test_a_call_exploring_in_place_is_charged_for_its_splits(tmp_path, monkeypatch, rng):
    """Each iteration run alone costs its entry (the wall clock beyond its kernels: parameters set,
    the log-likelihood read back, the launches' set-up) once more than the pinned call's one loop;
    the account left those out (H200, (1 000 000, 128, 1024) diag: calls 60-80 ms over the pinned
    ones on accounts of 23-33 ms). Every call's excess over the pinned loop, by the wall clock, now
    stays within its account and its allowance once the class's first call has measured its loop
    (before, a split is not charged), and the faster candidate is still found."""
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    variants = [_declared("V4", (1.0, 1.0)), _declared("V3", (0.5, 1.2), {"chunk": [4, 8]})]
    costs = {"V3": 1e-7, "V4": 2e-7}  # 14 and 28 ms an iteration at N = 140 000
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    be = _SplitCostBackend(variants=variants, costs=costs)
    sp = Specializer(be, HistorySelector(h))
    X = make_blobs(rng, 140000, 2, 2)
    used, over, plain = [], [], []
    for _ in range(12):
        be.reported = 0.0
        t = time.perf_counter()
        res = _train(sp, X, 2, iters=10)
        # beyond the pinned loop (one entry and the iterations that ran): the call's own work
        # (planning, the session), and what exploring cost
        extra = time.perf_counter() - t - be.ENTRY - be.reported
        used.append(res.variant.split("(")[0])
        a = sp.last_exploration
        if a is not None and len(used) > 1:  # (the class's first loop measures a split)
            # (a call split around its first iterations, whether or not a candidate then ran)
            over.append((extra, a["spent"], a["allowance"]))
        elif a is None:
            plain.append(extra)
    h.close()
    assert any(spent for _, spent, _ in over) and plain, (used, over)
    own = min(plain)
    # (0.035 s a call for the scheduling of the sleeps beside other work, and the loop's part of an
    # entry that the split's charge leaves out; the code before left out 0.06-0.1 s of each such call)
    slack = 0.035
    assert sum(x - own for x, _, _ in over) <= sum(spent for _, spent, _ in over) + slack * len(over), (own, over)
    assert all(x - own <= allowance + slack for x, _, allowance in over), (own, over)
    assert used[-1] == "V3", used
