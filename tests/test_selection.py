"""Selection from history, replayed deterministically from tests/data/replay_history.json.

The fixture is the history of a fake device ("replay-cpu") with five variants V1..V5 (V3 has a
tunable ``chunk`` in [4, 8]; V5 declares ``M <= 8``); seconds per EM iteration, full covariance,
float32:

    P1 N=10 000  D=8  M=4    V1 4.0e-3  V2 3.0e-3  V3 1.2e-3 (chunk=8: 1.0e-3)  V4 3.5e-3  V5 1.5e-3
    P2 N=100 000 D=32 M=64   V1 0.9  V2 0.5  V3 0.3  V4 0.1          (V5 excluded by its limit)
    P3 N=10 000  D=8  M=16   V1 0.02  V2 0.01                        (V3, V4 untried; V5 excluded)
    P4 N=5 000   D=16 M=32   V1 0.05  V2 0.03  V3 0.02  V4 launch-failed
    P5 N=50 000  D=4  M=2    V3 of an *older source* 1e-4, V1 8e-4  V2 6e-4  V4 3e-4  V5 5e-4
    V2 compile-failed for diag float32.

Then the specializer end to end with a fake backend (the NumPy reference under fake variants, with
deterministic per-variant costs) and with the real C backend.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from asp_gmm import GMM, registry, selection
from asp_gmm.backends import get_backend
from asp_gmm.backends.base import Kernel
from asp_gmm.backends.numpy_ref import NumpyBackend, NumpySession
from asp_gmm.errors import CompileError, KernelError
from asp_gmm.problem import Problem
from asp_gmm.registry import Limit, Variant
from asp_gmm.selection import Config, HistorySelector
from asp_gmm.specializer import Specializer
from asp_gmm.tuning_db import History
from conftest import make_blobs

FIXTURE = Path(__file__).parent / "data" / "replay_history.json"
FINGERPRINT = {"backend": "fake", "model": "replay-cpu", "threads": 2, "compiler": "none"}


def fake_variant(name, tunables=None, limits=(), sha=None):
    return Variant(
        name=name,
        backend="fake",
        phase="covariance",
        template="",
        cvtypes=("full", "diag"),
        dtypes=("float32", "float64"),
        description="fake",
        tunables=dict(tunables or {}),
        limits=tuple(Limit(r, why) for r, why in limits),
        source_sha256=sha or f"sha-{name}",
    )


VARIANTS = [
    fake_variant("V1"),
    fake_variant("V2"),
    fake_variant("V3", {"chunk": [4, 8]}),
    fake_variant("V4"),
    fake_variant("V5", limits=[("M <= 8", "one component per lane")]),
]


class FakeBackend(NumpyBackend):
    """The NumPy reference under fake variant names; each variant 'costs' a fixed time per event,
    reported as its iteration time, so that selection is deterministic."""

    name = "fake"
    preference = ["V4", "V3", "V2", "V1", "V5"]

    def __init__(self, variants=VARIANTS, costs=None, broken_compile=(), broken_launch=()):
        self.variants = list(variants)
        self.costs = costs or {}
        self.broken_compile, self.broken_launch = set(broken_compile), set(broken_launch)
        self.compiled, self.ran = [], []

    def fingerprint(self):
        return dict(FINGERPRINT)

    def covariance_variants(self, problem=None):
        return [v for v in self.variants if problem is None or v.allows(problem)]

    def kernel(self, variant, tunables, problem):
        self.compiled.append(variant.name)
        if variant.name in self.broken_compile:
            raise CompileError(["cc", "x.c"], "x.c:1: error: boom", "/nonexistent/x.c", variant.name)
        return Kernel(variant, dict(tunables or {}))

    def open(self, X, problem):
        return FakeSession(self, X, problem)


class FakeSession(NumpySession):
    def __init__(self, backend, X, problem):
        super().__init__(X, problem)
        self.backend = backend

    def _em(self, kernel, *, min_iters, max_iters, tol, reg_covar):
        name = kernel.variant.name
        self.backend.ran.append((name, max_iters))
        if name in self.backend.broken_launch:
            raise KernelError(f"{name}: too many resources requested for launch")
        run = super()._em(kernel, min_iters=min_iters, max_iters=max_iters, tol=tol, reg_covar=reg_covar)
        cost = self.backend.costs.get(name, 1e-6) * self.problem.N
        run.iter_seconds = [cost] * run.iters
        run.cov_seconds = [cost / 2] * run.iters
        return run


def configs(problem, backend=None):
    backend = backend or FakeBackend()
    return [Config.of(v) for v in backend.covariance_variants(problem)]


@pytest.fixture
def replay(tmp_path):
    h = History(f"sqlite:///{tmp_path / 'replay.sqlite'}")
    added, skipped = h.import_(FIXTURE)
    assert (added, skipped) == (len(json.loads(FIXTURE.read_text())["timings"]), 0)
    yield HistorySelector(h), FakeBackend()
    h.close()


def test_fixture_device_id_matches_the_fake_backend():
    assert FakeBackend().device_id == json.loads(FIXTURE.read_text())["devices"][0]["id"]


@pytest.mark.parametrize("N", [10000, 11000])  # 11 000 is in the same half-octave class
def test_exact_hit_uses_the_fastest_including_tuned_configurations(replay, N):
    sel, be = replay
    p = Problem(N, 8, 4)
    plan = sel.plan(be, p, configs(p))
    assert plan.reason == "history" and plan.explore == []
    assert plan.primary.variant.name == "V3" and plan.primary.params == {"chunk": 8}


def test_exact_hit_large_problem(replay, monkeypatch):
    sel, be = replay
    p = Problem(100000, 32, 64)
    for autotune in ("1", "0"):
        monkeypatch.setenv("ASP_GMM_AUTOTUNE", autotune)
        plan = sel.plan(be, p, configs(p))
        assert (plan.primary.label, plan.reason, plan.explore) == ("V4", "history", [])


def test_exploration_order_and_primary(replay, monkeypatch):
    """P3: V1 and V2 measured, V3 and V4 untried. The bulk runs the best measured (V2); V3 is
    explored before V4 because the nearest informative classes (P3 itself, P4, P1, P2) score V3 at
    0.245 and V4 at 0.648 (weighted mean log-ratio to the fastest there)."""
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    sel, be = replay
    p = Problem(10000, 8, 16)
    plan = sel.plan(be, p, configs(p))
    assert plan.reason == "explore"
    assert plan.primary.label == "V2"
    assert [c.label for c in plan.explore] == ["V3(chunk=4)", "V4"]


def test_nothing_measured_explores_in_rule_order(replay, monkeypatch):
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    sel, be = replay
    p = Problem(10000, 8, 4, dtype="float64")  # no float64 timings at all
    plan = sel.plan(be, p, configs(p))
    assert plan.reason == "explore"
    assert [plan.primary.variant.name] + [c.variant.name for c in plan.explore] == ["V4", "V3", "V2", "V1", "V5"]
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "0")
    plan = sel.plan(be, p, configs(p))
    assert (plan.primary.variant.name, plan.reason, plan.explore) == ("V4", "rule", [])


@pytest.mark.parametrize(
    "N,D,M,expected",
    [
        (120000, 30, 60, "V4"),  # nearest: P2, where V4 wins by far
        (9000, 8, 5, "V3"),  # nearest: P1, where V3 is the fastest default configuration
        (6000, 14, 30, "V3"),  # nearest: P4 (V4 failed there, but only for D=16, M=32)
    ],
)
def test_nearest_neighbour_prediction_with_autotuning_off(replay, monkeypatch, caplog, N, D, M, expected):
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "0")
    sel, be = replay
    p = Problem(N, D, M)
    with caplog.at_level("DEBUG", logger="asp_gmm.selection"):
        plan = sel.plan(be, p, configs(p))
    assert (plan.primary.variant.name, plan.reason, plan.explore) == (expected, "predicted", [])
    assert any("predicted" in r.getMessage() and expected in r.getMessage() for r in caplog.records)


def test_prediction_distance_weighs_log_n_by_half():
    sel_idx = selection._Index(type("V", (), {"rows": []})())
    sel_idx.classes = {("full", "float32", 8, 4, 27): {}, ("full", "float32", 8, 16, 27): {}}
    near = sel_idx.nearest(Problem(40000, 8, 4))
    # N four times larger: 0.5 * ln 4 (bucket centre 2**13.5), M four times larger: ln 4
    assert near[0][1] == ("full", "float32", 8, 4, 27)
    assert near[0][0] == pytest.approx(0.5 * abs(math.log(40000) - 13.5 * math.log(2)), rel=1e-9)
    assert near[1][0] == pytest.approx(math.hypot(near[0][0], math.log(4)), rel=1e-9)


def test_variant_excluded_by_limits_is_never_a_candidate(replay, monkeypatch):
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    sel, be = replay
    for p in (Problem(100000, 32, 64), Problem(10000, 8, 16), Problem(77, 3, 9)):
        plan = sel.plan(be, p, configs(p))
        assert "V5" not in [plan.primary.variant.name] + [c.variant.name for c in plan.explore]


def test_failed_variants_are_not_retried(replay, monkeypatch):
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    sel, be = replay
    # V4 failed at launch for D=16, M=32: every other candidate is measured there -> exploit V3
    for N in (5000, 900000):
        p = Problem(N, 16, 32)
        plan = sel.plan(be, p, configs(p))
        names = [plan.primary.variant.name] + [c.variant.name for c in plan.explore]
        assert "V4" not in names
    plan = sel.plan(be, Problem(5000, 16, 32), configs(Problem(5000, 16, 32)))
    # every variant measured: the tunable search of the fastest (V3, chunk=4 measured) proposes chunk=8
    assert (plan.primary.variant.name, plan.reason) == ("V3", "explore")
    assert [c.label for c in plan.explore] == ["V3(chunk=8)"] and "coordinate search" in plan.why
    # V2 failed to compile for diag float32: never planned for diag float32, still for full
    p = Problem(3000, 5, 3, cvtype="diag")
    plan = sel.plan(be, p, configs(p))
    assert "V2" not in [plan.primary.variant.name] + [c.variant.name for c in plan.explore]
    p = Problem(3000, 5, 3, cvtype="full")
    plan = sel.plan(be, p, configs(p))  # (where the prediction puts it far slower, it is pruned)
    assert "V2" in [plan.primary.variant.name] + [c.variant.name for c in plan.explore + plan.pruned]


def test_timings_of_an_older_source_are_not_used(replay, monkeypatch):
    """P5: the fastest row is V3 of source "sha-V3-old"; the current V3 ("sha-V3") is untried."""
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    sel, be = replay
    p = Problem(50000, 4, 2)
    plan = sel.plan(be, p, configs(p))
    assert plan.reason == "explore"
    assert plan.primary.variant.name == "V4"  # fastest of the current sources
    assert [c.variant.name for c in plan.explore] == ["V3"]
    # the same fixture read by a V3 whose source is the old one: a plain exact hit
    old = [
        fake_variant("V1"),
        fake_variant("V2"),
        fake_variant("V3", {"chunk": [4, 8]}, sha="sha-V3-old"),
        fake_variant("V4"),
        VARIANTS[4],
    ]
    plan = sel.plan(be, p, [Config.of(v) for v in old])
    assert (plan.primary.variant.name, plan.reason) == ("V3", "explore")
    assert [c.label for c in plan.explore] == ["V3(chunk=8)"]  # the tunable search goes on


def test_changing_a_template_changes_the_key(tmp_path, monkeypatch):
    """Edit a real template (in a copy of variants/): its sha256 changes, and timings recorded under
    the old source are not used for the new one."""
    import shutil

    root = tmp_path / "variants"
    shutil.copytree(Path(registry.__file__).parent.parent / "variants", root)
    monkeypatch.setattr(registry, "_variants_root", lambda: root)
    for f in (registry.all_variants, registry._environment):
        f.cache_clear()
    try:
        before = {v.name: v for v in registry.variants("c", "covariance")}
        h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
        sel = HistorySelector(h)
        be = FakeBackend(variants=list(before.values()))
        p = Problem(20000, 6, 3)
        for i, v in enumerate(before.values()):
            sel.record(be, p, Config.of(v), "ok", 1e-3 * (i + 1), 5e-4, 3)
        plan = sel.plan(be, p, [Config.of(v) for v in before.values()])
        assert plan.reason == "history"
        tmpl = root / "c" / before["V3"].template
        tmpl.write_text(tmpl.read_text() + "\n/* edited */\n")
        for f in (registry.all_variants, registry._environment):
            f.cache_clear()
        after = {v.name: v for v in registry.variants("c", "covariance")}
        assert after["V3"].source_sha256 != before["V3"].source_sha256
        assert after["V4"].source_sha256 == before["V4"].source_sha256
        monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
        plan = sel.plan(be, p, [Config.of(v) for v in after.values()])
        assert plan.reason == "explore" and [c.variant.name for c in plan.explore] == ["V3"]
        h.close()
    finally:
        monkeypatch.undo()
        for f in (registry.all_variants, registry._environment):
            f.cache_clear()


# ------------------------------------------------------------------ end to end, fake backend
COSTS = {"V1": 5e-7, "V2": 3e-7, "V3": 1e-7, "V4": 2e-7, "V5": 4e-7}


def _train(sp, X, M, iters=10, variant=None):
    N, D = X.shape
    p = Problem(N, D, M, "full", X.dtype.name)
    w = np.full(M, 1.0 / M)
    mu = X[np.linspace(0, N - 1, M).astype(int)].astype(np.float64)
    cv = np.repeat((np.cov(X.T.astype(np.float64)) + 1e-3 * np.eye(D))[None], M, 0)
    return sp.train(X, w, mu, cv, p, 1e-6, iters, iters, 0.0, variant)


def test_train_explores_then_exploits_and_the_result_is_unchanged(tmp_path, monkeypatch, rng):
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    be = FakeBackend(costs=COSTS)
    sp = Specializer(be, HistorySelector(h))
    X = make_blobs(rng, 3000, 4, 3)
    first = _train(sp, X, 3)
    assert first.reason == "explore"
    assert first.explored == ["V3(chunk=4)", "V2", "V1", "V5"]  # rule order after the primary V4
    assert first.iters == 10 and first.variant == "V4"
    assert [n for n, k in be.ran] == ["V3", "V2", "V1", "V5", "V4"] and be.ran[-1][1] == 6
    second = _train(sp, X, 3)  # every variant measured: the coordinate search tries V3's other chunk
    assert (second.reason, second.explored) == ("explore", ["V3(chunk=8)"])
    third = _train(sp, X, 3)
    assert (third.reason, third.variant, third.explored) == ("history", "V3(chunk=4)", [])
    # same function whatever ran: the same parameters as the reference run with one variant only
    ref = _train(Specializer(FakeBackend(costs=COSTS), selection.RuleSelector()), X, 3)
    np.testing.assert_allclose(first.means, ref.means, rtol=1e-12)
    np.testing.assert_allclose(first.covars, ref.covars, rtol=1e-12)
    h.flush()
    rows = h.rows()
    assert {r.variant.name for r in rows} == {"V1", "V2", "V3", "V4", "V5"}
    assert {r.variant.tunables for r in rows if r.variant.name == "V3"} == {'{"chunk":4}', '{"chunk":8}'}
    assert all(r.status == "ok" and r.device_id == be.device_id for r in rows)
    v4 = [r for r in rows if r.variant.name == "V4"][0]
    assert v4.repeats == 6 and v4.seconds == pytest.approx(COSTS["V4"] * 3000)
    h.close()


def test_autotune_off_records_nothing_and_does_not_explore(tmp_path, monkeypatch, rng):
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "0")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    be = FakeBackend(costs=COSTS)
    res = _train(Specializer(be, HistorySelector(h)), make_blobs(rng, 500, 3, 2), 2)
    assert (res.reason, res.explored, res.variant) == ("rule", [], "V4")
    assert h.count() == 0
    h.close()


def test_train_records_failures_once_and_falls_back(tmp_path, monkeypatch, rng):
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    be = FakeBackend(costs=COSTS, broken_compile={"V3"}, broken_launch={"V2"})
    sp = Specializer(be, HistorySelector(h))
    X = make_blobs(rng, 2000, 3, 12)  # M = 12: V5 (M <= 8) is excluded by its limit
    first = _train(sp, X, 12)
    assert first.iters == 10 and first.explored == ["V1"]
    assert "V5" not in be.compiled and "V5" not in [n for n, _ in be.ran]
    status = {r.variant.name: r.status for r in h.rows()}
    assert status == {"V3": "compile-failed", "V2": "launch-failed", "V1": "ok", "V4": "ok"}
    for r in h.rows():
        assert r.variant.source_sha256 == f"sha-{r.variant.name}"
    compiled, ran = list(be.compiled), list(be.ran)
    second = _train(sp, X, 12)
    assert (second.reason, second.variant) == ("history", "V4")
    assert be.compiled[len(compiled) :] == ["V4"] and [n for n, _ in be.ran[len(ran) :]] == ["V4"]
    # a second process (a new selector over the same file) does not retry them either
    h.flush()
    sp2 = Specializer(be, HistorySelector(History(h.url)))
    third = _train(sp2, X, 12)
    assert (third.reason, third.variant) == ("history", "V4")
    h.close()


def test_primary_that_fails_to_compile_falls_back(tmp_path, monkeypatch, rng):
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "0")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    be = FakeBackend(costs=COSTS, broken_compile={"V4"})
    res = _train(Specializer(be, HistorySelector(h)), make_blobs(rng, 500, 3, 2), 2)
    assert res.variant != "V4" and res.iters == 10
    assert [r.status for r in h.rows()] == ["compile-failed"]
    h.close()


# ------------------------------------------------------------------ the real C backend
def test_c_backend_explores_inside_train_and_matches_a_pinned_run(tmp_path, monkeypatch, rng):
    monkeypatch.setenv("ASP_GMM_DB", f"sqlite:///{tmp_path / 'c.sqlite'}")
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    X = make_blobs(rng, 4000, 5, 4, dtype=np.float64)
    g = GMM(4, 5, backend="c", dtype=np.float64, seed=1)
    ll = g.train(X, min_em_iters=8, max_em_iters=8, tol=0.0)
    res = g.last_train
    full = [v for v in registry.variants("c", "covariance") if "full" in v.cvtypes]
    # a call never waits for an optional compile: it explores what is compiled (BLAS always is) while
    # the other candidates compile in the background; later calls explore those
    assert res.reason == "explore" and 1 <= len(res.explored) <= len(full) - 1 and "BLAS" in res.explored
    explored = list(res.explored)
    for _ in range(len(full)):
        assert get_backend("c").wait_background(timeout=120)
        later = GMM(4, 5, backend="c", dtype=np.float64, seed=1)
        later.train(X, min_em_iters=8, max_em_iters=8, tol=0.0)
        explored += later.last_train.explored
        names = {label.split("(")[0] for label in explored}
        if later.last_train.reason == "history" or len(names) >= len(full) - 1:
            break  # every variant measured (the tunable search of the fastest may follow)
    names = {label.split("(")[0] for label in explored}
    assert sorted(explored) == sorted(set(explored)) and len(full) - 1 <= len(names) <= len(full)
    pinned = GMM(4, 5, backend="c", dtype=np.float64, seed=1, variant=res.variant.split("(")[0])
    ll_pinned = pinned.train(X, min_em_iters=8, max_em_iters=8, tol=0.0)
    assert ll == pytest.approx(ll_pinned, rel=1e-10)
    np.testing.assert_allclose(g.covars, pinned.covars, rtol=1e-8, atol=1e-10)
    # then the tunables of the fastest variants are searched, a few per call, until the search converges
    reasons = []
    for _ in range(12):
        assert get_backend("c").wait_background(timeout=120)  # the proposals compile between calls
        g2 = GMM(4, 5, backend="c", dtype=np.float64, seed=1)
        g2.train(X, min_em_iters=8, max_em_iters=8, tol=0.0)
        reasons.append(g2.last_train.reason)
        if reasons[-1] == "history":
            break
    assert reasons[-1] == "history" and g2.last_train.explored == [] and len(reasons) <= 8, reasons


def test_a_call_never_waits_for_the_planned_variant_to_compile(tmp_path, monkeypatch, rng):
    """With the planned variant still compiling, train runs on a compiled one (BLAS needs no compile),
    records those iterations under it, gives the same result, and a later call runs the planned one."""
    import threading

    from asp_gmm.backends.c import CBackend

    monkeypatch.setenv("ASP_GMM_DB", f"sqlite:///{tmp_path / 'h.sqlite'}")
    monkeypatch.setenv("ASP_GMM_CACHE_DIR", str(tmp_path / "cache"))  # nothing compiled yet
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    be = CBackend()
    gate = threading.Event()
    real_kernel = be.kernel

    def slow_kernel(variant, tunables, problem):
        if variant.name == "V4":
            assert gate.wait(60), "the call waited for the planned variant's compile"
        return real_kernel(variant, tunables, problem)

    monkeypatch.setattr(be, "kernel", slow_kernel)
    spec = Specializer(be, HistorySelector())
    X = make_blobs(rng, 3000, 5, 3)
    p = Problem(3000, 5, 3, "full", "float64")
    from conftest import init_params

    w, mu, cv = init_params(rng, X, 3, "full")
    res = spec.train(X, w, mu, cv, p, 1e-6, 6, 6, 0.0)
    # BLAS explored (the only compiled candidate when the plan was made), then a compiled candidate
    # standing in for V4 while V4 compiles; the history has every iteration under what ran it
    assert res.iters == 6 and not res.variant.startswith("V4") and res.explored == ["BLAS"]
    rows = spec.selector.history().rows()
    assert [(r.status, r.repeats) for r in rows] == [("ok", 1)] * 6
    assert rows[0].variant.name == "BLAS" and {r.variant.name for r in rows[1:]} == {res.variant.split("(")[0]}
    gate.set()
    assert be.wait_background(timeout=120)
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "0")  # the rule's plan (V4, compiled by now) on a new history
    monkeypatch.setenv("ASP_GMM_DB", f"sqlite:///{tmp_path / 'h2.sqlite'}")
    again = Specializer(be, HistorySelector()).train(X, w, mu, cv, p, 1e-6, 6, 6, 0.0)
    assert again.variant.startswith("V4") and again.explored == []
    np.testing.assert_allclose(again.covars, res.covars, rtol=1e-9, atol=1e-12)
    assert again.loglik == pytest.approx(res.loglik, rel=1e-12)


def test_estep_choice_follows_the_preference_until_the_history_has_timings(tmp_path):
    """The E-step choice lives in the policy: the preference order when nothing is measured for the
    problem's class, the fastest measured E-step once the history has timings for it."""
    from asp_gmm.selection import Policy

    be = FakeBackend()
    fast, slow = fake_variant("estep_fast"), fake_variant("estep")
    cands = [(slow, [{}]), (fast, [{}])]
    p = Problem(10_000, 4, 3, "full", "float32")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    policy = Policy(HistorySelector(h), estep_preference={be.name: ["estep_fast", "estep"]})
    assert policy.choose_estep(be, p, cands)[0] is fast
    assert policy.choose_estep(be, p, cands, pinned="estep")[0] is slow
    policy.record(be, p, Config.of(slow), "ok", 1e-3)
    policy.record(be, p, Config.of(fast), "ok", 5e-3)
    h.flush()
    assert policy.choose_estep(be, p, cands)[0] is slow
    far = Problem(10_000, 40, 3, "full", "float32")  # another class: nothing measured
    assert policy.choose_estep(be, far, cands)[0] is fast
    with pytest.raises(KernelError, match="E-step"):
        policy.choose_estep(be, p, [(fast, [])])


def test_the_estep_choice_takes_the_fastest_measured_combination_its_limits_allow(tmp_path):
    """With tunables: the fastest measured combination among those offered for the problem; one
    measured but not offered (its limits exclude it here) is not taken, nor is another variant's
    code of the same name (another source); a tie goes to the earlier candidate."""
    from asp_gmm.selection import Policy

    be = FakeBackend()
    a = fake_variant("estep_fast", {"tile": [1, 2, 4]})
    b = fake_variant("estep", {"w": [8, 16]})
    other = fake_variant("estep", {"w": [8, 16]}, sha="another-source")
    p = Problem(10_000, 4, 3, "diag", "float32")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    policy = Policy(HistorySelector(h), estep_preference={be.name: ["estep_fast", "estep"]})
    cands = [(a, [{"tile": 1}, {"tile": 2}]), (b, [{"w": 8}, {"w": 16}])]
    for v, tun, sec in ((a, {"tile": 4}, 1e-4), (other, {"w": 8}, 2e-4), (a, {"tile": 2}, 3e-3), (b, {"w": 16}, 2e-3)):
        policy.record(be, p, Config.of(v, tun), "ok", sec)
    h.flush()
    assert policy.choose_estep(be, p, cands) == (b, {"w": 16})
    policy.record(be, p, Config.of(a, {"tile": 1}), "ok", 2e-3)  # ties b's w=16: the earlier wins
    h.flush()
    assert policy.choose_estep(be, p, cands) == (a, {"tile": 1})
    h.close()


def test_a_history_failing_in_the_estep_choice_is_reported_and_set_aside(tmp_path):
    from asp_gmm.selection import Policy

    class Runtime:
        disabled = []

        def disable(self, history, exc):
            self.disabled.append((history, str(exc)))

    be = FakeBackend()
    fast, slow = fake_variant("estep_fast"), fake_variant("estep")
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    sel = HistorySelector(h, runtime=Runtime())
    sel.index = lambda backend, history=None: (_ for _ in ()).throw(OSError("disk gone"))
    policy = Policy(sel, estep_preference={be.name: ["estep_fast", "estep"]})
    assert policy.choose_estep(be, Problem(10_000, 4, 3), [(slow, [{}]), (fast, [{}])])[0] is fast
    assert sel.runtime.disabled == [(h, "disk gone")]
    h.close()
