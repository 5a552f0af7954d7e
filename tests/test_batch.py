"""Batched training (asp_gmm.train_many and its kin) against training each model alone and against
the float64 reference: ragged batches (N below a tile, M = 1, odd D, X + 1000), bad members."""

import numpy as np
import pytest

from asp_gmm import (
    GMM,
    BatchMemberError,
    compute_distance_BIC,
    compute_distance_BIC_many,
    registry,
    score_many,
    train_many,
)
from asp_gmm import reference as ref
from asp_gmm.problem import BatchProblem
from conftest import init_params, make_blobs

# (N, M) of the members of a ragged batch: N below one tile, M = 1, N not a tile multiple
MEMBERS = [(20, 2), (517, 1), (1003, 3), (40, 8), (4099, 16), (300, 4)]
TOL = {"float32": dict(rtol=1e-4, atol=1e-4), "float64": dict(rtol=1e-10, atol=1e-10)}
#: every batched variant of the C backend, as the registry lists them
C_BATCH = sorted(v.name for v in registry.variants("c", "batch"))


def _skip_unless_computes(variant, cvtype):
    if variant and cvtype not in registry.get("c", variant, "batch").cvtypes:
        pytest.skip(f"{variant} does not compute {cvtype} covariances (its manifest's cvtypes)")


def _batch(rng, D, cvtype, dtype, offset_every=2):
    data, params = [], []
    for b, (N, M) in enumerate(MEMBERS):
        X = make_blobs(rng, N, D, min(M, 4), offset=1000.0 if b % offset_every == 0 else 0.0, dtype=dtype)
        data.append(X)
        params.append(init_params(rng, X, M, cvtype))
    return data, params


def _models(params, D, cvtype, dtype, backend):
    return [
        GMM(len(w), D, means=mu, covars=cv, weights=w, cvtype=cvtype, dtype=dtype, backend=backend)
        for w, mu, cv in params
    ]


def _close(a, b, tol, what):
    s = max(float(np.max(np.abs(b))), 1e-300)
    np.testing.assert_allclose(a, b, rtol=tol["rtol"], atol=tol["atol"] * s, err_msg=what)


@pytest.mark.parametrize("backend", ["c", *(f"c:{n}" for n in C_BATCH), "numpy"])
@pytest.mark.parametrize("cvtype", ["full", "diag"])
@pytest.mark.parametrize("D", [7, 1])
def test_batch_equals_one_by_one_float64(backend, cvtype, D, rng):
    backend, _, variant = backend.partition(":")
    _skip_unless_computes(variant, cvtype)
    data, params = _batch(rng, D, cvtype, np.float64)
    alone = _models(params, D, cvtype, np.float64, backend)
    lone = [g.train(X, min_em_iters=3, max_em_iters=3, tol=0.0) for g, X in zip(alone, data)]
    many = _models(params, D, cvtype, np.float64, backend)
    ll = train_many(many, data, min_em_iters=3, max_em_iters=3, tol=0.0, variant=variant or None)
    tol = TOL["float64"]
    for b, (g, h) in enumerate(zip(alone, many)):
        _close(h.covars, g.covars, tol, f"member {b} covars")
        _close(h.means, g.means, tol, f"member {b} means")
        _close(h.weights, g.weights, tol, f"member {b} weights")
        # (the member of 40 events and 8 components is near-singular: its log-likelihood moves by
        # ~1e-10 per event with the covariance sums' order, which differs between the variants)
        assert ll[b] == pytest.approx(lone[b], rel=1e-10, abs=1e-9 * len(data[b]))
        assert h.loglik == ll[b] and h.n_iter == 3 and h.n_events == len(data[b])
        assert len(h.last_train.loglik_trace) == 4
    if backend == "c":
        assert many[0].last_variant.startswith(variant or "CB")


@pytest.mark.parametrize("variant", C_BATCH)
@pytest.mark.parametrize("cvtype", ["full", "diag"])
def test_batch_float32_against_reference(cvtype, variant, rng):
    _skip_unless_computes(variant, cvtype)
    D = 5
    data, params = _batch(rng, D, cvtype, np.float32)
    many = _models(params, D, cvtype, np.float32, "c")
    ll = train_many(many, data, min_em_iters=2, max_em_iters=2, tol=0.0, variant=variant)
    assert many[0].last_variant.startswith(variant + "(")
    tol = TOL["float32"]
    for b, (g, X, (w, mu, cv)) in enumerate(zip(many, data, params)):
        r = ref.em(X.astype(np.float64), w, mu, cv, cvtype, 1e-6, 2, 2, 0.0)
        _close(g.covars, r["covars"], tol, f"member {b} covars")
        _close(g.means, r["means"], tol, f"member {b} means")
        np.testing.assert_allclose(g.weights, r["weights"], rtol=tol["rtol"], atol=tol["atol"])
        # the log-density of a fit of a handful of events is near-singular: in float32 it misses
        # the reference by ~1e-2 nats per event (train alone as well); parameters are checked above
        if len(X) >= 10 * D:
            assert ll[b] == pytest.approx(r["loglik"], rel=1e-3, abs=1e-4 * len(X))


def test_batch_converges_per_member(rng):
    """Each member stops by the one convergence rule on its own (as train alone does)."""
    D = 3
    data, params = _batch(rng, D, "diag", np.float64)
    alone = _models(params, D, "diag", np.float64, "c")
    for g, X in zip(alone, data):
        g.train(X, min_em_iters=1, max_em_iters=50, tol=1e-3)
    many = _models(params, D, "diag", np.float64, "c")
    train_many(many, data, min_em_iters=1, max_em_iters=50, tol=1e-3)
    assert [g.n_iter for g in many] == [g.n_iter for g in alone]
    assert [g.converged for g in many] == [g.converged for g in alone]


def test_seeding_as_train(rng):
    """Models without parameters are seeded by train_many exactly as by train."""
    D = 4
    data = [make_blobs(rng, n, D, 3) for n in (50, 700, 3)]
    alone = [GMM(3, D, cvtype="full", dtype=np.float64, backend="c", seed=7) for _ in data]
    many = [GMM(3, D, cvtype="full", dtype=np.float64, backend="c", seed=7) for _ in data]
    for g, X in zip(alone, data):
        g.train(X, max_em_iters=2)
    train_many(many, data, max_em_iters=2)
    for g, h in zip(alone, many):
        np.testing.assert_allclose(h.means, g.means, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("backend", ["c", "numpy"])
def test_bad_members_are_named_and_the_rest_kept(backend, rng):
    D = 3
    data, params = _batch(rng, D, "diag", np.float64)
    data[1] = data[1].copy()
    data[1][7, 2] = np.nan
    data[3] = data[3][:5]  # 5 events for 8 components
    many = _models(params, D, "diag", np.float64, backend)
    before = [g.means.copy() for g in many]
    with pytest.raises(BatchMemberError) as info:
        train_many(many, data, min_em_iters=2, max_em_iters=2, tol=0.0)
    err = info.value
    assert set(err.errors) == {1, 3}
    msg = str(err)
    assert "member 1" in msg and "datasets[1]" in msg and "NaN" in msg
    assert "member 3" in msg and "fewer than the M=8 components" in msg
    assert err.results[1] is None and err.results[3] is None
    for b in (1, 3):
        np.testing.assert_array_equal(many[b].means, before[b])  # untouched
    alone = _models(params, D, "diag", np.float64, backend)
    for b in (0, 2, 4, 5):
        ll = alone[b].train(data[b], min_em_iters=2, max_em_iters=2, tol=0.0)
        assert err.results[b] == pytest.approx(ll, rel=1e-10)
        np.testing.assert_allclose(many[b].covars, alone[b].covars, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", ["c", "numpy"])
def test_member_not_positive_definite(backend, rng):
    """A member whose covariance collapses (a constant dimension, no regularisation) fails alone
    and keeps its last good parameters."""
    D = 3
    data, params = _batch(rng, D, "full", np.float64)
    bad = data[2].copy()
    bad[:, 1] = 5.0
    w, mu, _ = params[2]
    cov = np.repeat(np.eye(D)[None], len(w), 0)
    data[2] = bad
    many = [
        GMM(len(w_), D, means=m_, covars=c_, weights=w_, cvtype="full", dtype=np.float64, backend=backend, reg_covar=0)
        for (w_, m_, c_) in params[:2]
    ]
    many.append(
        GMM(len(w), D, means=mu, covars=cov, weights=w, cvtype="full", dtype=np.float64, backend=backend, reg_covar=0)
    )
    with pytest.raises(BatchMemberError) as info:
        train_many(many, data[:3], min_em_iters=2, max_em_iters=2, tol=0.0)
    assert set(info.value.errors) == {2}
    assert isinstance(info.value.errors[2], np.linalg.LinAlgError)
    assert "not positive definite" in str(info.value)
    assert info.value.results[0] is not None and info.value.results[1] is not None
    assert np.all(np.isfinite(many[2].covars))


@pytest.mark.parametrize("backend", ["c", "numpy"])
def test_score_many(backend, rng):
    D = 6
    data, params = _batch(rng, D, "diag", np.float32)
    models = _models(params, D, "diag", np.float32, backend)
    X = data[4]
    got = score_many(models, X)
    for g, s in zip(models, got):
        np.testing.assert_allclose(s, g.score(X), rtol=1e-6, atol=1e-4)
    got = score_many(models, data)
    for g, X, s in zip(models, data, got):
        assert s.shape == (len(X),)
        np.testing.assert_allclose(s, g.score(X), rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cvtype", ["full", "diag"])
def test_score_many_shared_data_against_reference(cvtype, dtype, rng):
    """One array scored by every model (packed once on the C backend) gives the float64
    reference's per-event log-likelihoods, the same values as each model scoring its own copy,
    odd D, N not a tile multiple, M = 1 and X + 1000 included."""
    D = 7
    data, params = _batch(rng, D, cvtype, dtype)
    models = _models(params, D, cvtype, dtype, "c")
    X = data[2] + dtype(1000.0) if dtype == np.float64 else data[2]
    shared = score_many(models, X)
    copies = score_many(models, [X.copy() for _ in models])
    rtol = 1e-10 if dtype == np.float64 else 1e-5
    for b, (s, c, (w, mu, cv)) in enumerate(zip(shared, copies, params)):
        np.testing.assert_array_equal(s, c, err_msg=f"member {b}")
        want = ref.estep(X.astype(np.float64), w, mu, cv, cvtype, 0.0)[0]
        np.testing.assert_allclose(s, want, rtol=rtol, atol=rtol * np.abs(want).max(), err_msg=f"member {b}")


def test_bic_many_equals_pairs(rng):
    D = 5
    data, params = _batch(rng, D, "diag", np.float64)
    models = _models(params, D, "diag", np.float64, "c")
    train_many(models, data, min_em_iters=2, max_em_iters=2)
    pairs = [(0, 1), (2, 5), (4, 1)]
    Xs = [np.concatenate([data[i], data[j]]) for i, j in pairs]
    got = compute_distance_BIC_many([(models[i], models[j]) for i, j in pairs], Xs, min_em_iters=3, max_em_iters=3)
    for (i, j), X, (merged, score) in zip(pairs, Xs, got):
        m2, s2 = compute_distance_BIC(models[i], models[j], X, min_em_iters=3, max_em_iters=3)
        assert score == pytest.approx(s2, rel=1e-10, abs=1e-8)
        np.testing.assert_allclose(merged.covars, m2.covars, rtol=1e-10, atol=1e-12)
        assert merged.M == models[i].M + models[j].M


def test_mixed_models_refused():
    with pytest.raises(ValueError, match="member 1"):
        train_many([GMM(2, 3, backend="c"), GMM(2, 4, backend="c")], [np.zeros((5, 3)), np.zeros((5, 4))])
    with pytest.raises(ValueError, match="2 models but 1 datasets"):
        train_many([GMM(2, 3, backend="c"), GMM(2, 3, backend="c")], [np.zeros((5, 3))])
    assert train_many([], []) == []


def test_batch_limits_are_data():
    v = registry.get("c", "CB", "batch")
    assert v.check(BatchProblem(1000, 19, 8, "diag", "float32", B=32)) is None
    why = v.check(BatchProblem(10**7, 19, 8, "diag", "float32", B=2**21))
    assert why is not None and "2^20" in why


def test_batch_history_records_and_exploits(tmp_path, rng):
    """The batch is timed under its batched configurations and class (the events of all members,
    the largest M): every batched variant of a diagonal batch is explored, one whole call each."""
    from asp_gmm.selection import HistorySelector
    from asp_gmm.specializer import Specializer
    from asp_gmm.tuning_db import History

    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    try:
        spec = Specializer("c", HistorySelector(h))
        D = 4
        data, params = _batch(rng, D, "diag", np.float32)
        ran, diag = set(), {v.name for v in registry.variants("c", "batch") if "diag" in v.cvtypes}
        assert {"CB", "CBE", "CBF"} <= diag
        for _ in range(9):  # every batched variant is explored (whole calls), compiled in the background
            many = _models(params, D, "diag", np.float32, "c")
            many[0]._specializer = spec  # the batch runs with the first model's policy
            train_many(many, data, min_em_iters=2, max_em_iters=2)
            ran.add(many[0].last_variant.split("(")[0])
            spec.backend.wait_background(120)
            if ran == diag:
                break
        assert ran == diag
        rows = h.rows()
        assert {r["N"] if isinstance(r, dict) else getattr(r, "N") for r in rows} == {sum(len(X) for X in data)}
        text = " ".join(map(str, rows))
        assert all(n in text for n in diag)
    finally:
        h.close()


def test_three_d_data(rng):
    """One (B, N, D) array is the members' data (gmm-gpu's layout); a bad member is still named."""
    X = rng.standard_normal((5, 60, 2)).astype(np.float32)
    params = [init_params(rng, X[b], 2, "full") for b in range(5)]
    a = _models(params, 2, "full", np.float32, "c")
    b_ = _models(params, 2, "full", np.float32, "c")
    train_many(a, X, min_em_iters=4, max_em_iters=4, tol=0.0)
    train_many(b_, list(X), min_em_iters=4, max_em_iters=4, tol=0.0)
    for g, h in zip(a, b_):  # two calls may run different batched variants (exploring): equal to rounding
        np.testing.assert_allclose(g.covars, h.covars, rtol=1e-5, atol=1e-6)
    X[3, 5, 1] = np.inf
    with pytest.raises(BatchMemberError, match=r"member 3: .*datasets\[3\] contains NaN or infinity"):
        train_many(_models(params, 2, "full", np.float32, "c"), X, max_em_iters=2)


@pytest.mark.parametrize("cvtype", ["tied", "spherical"])
def test_tied_and_spherical_run_one_by_one(cvtype, rng):
    """No batched variant implements tied or spherical covariance: the members run through the
    ordinary specializer, with the same results."""
    D = 3
    data = [make_blobs(rng, n, D, 2) for n in (40, 300, 77)]
    alone = [GMM(2, D, cvtype=cvtype, dtype=np.float64, backend="c", seed=3) for _ in data]
    many = [GMM(2, D, cvtype=cvtype, dtype=np.float64, backend="c", seed=3) for _ in data]
    lone = [g.train(X, min_em_iters=3, max_em_iters=3, tol=0.0) for g, X in zip(alone, data)]
    ll = train_many(many, data, min_em_iters=3, max_em_iters=3, tol=0.0)
    for g, h, a, b in zip(alone, many, lone, ll):
        np.testing.assert_allclose(h.covars, g.covars, rtol=1e-12, atol=1e-12)
        assert a == pytest.approx(b, rel=1e-12)


def test_fused_batch_redoes_far_moves_in_two_passes(rng):
    """CBF takes the diagonal sums from moments around the E-step's means; a first M-step that moves
    the means by ~100 standard deviations would cancel float32 digits there (~1e-3 relative), so the
    core must redo that step in two passes: the fit still meets the float64 reference."""
    D = 6
    data, params = [], []
    for b, (N, M) in enumerate(MEMBERS):
        X = make_blobs(rng, N, D, min(M, 4), offset=1000.0 if b % 2 == 0 else 0.0, dtype=np.float32)
        w, mu, cv = init_params(rng, X, M, "diag")
        mu = mu + 100.0 * np.sqrt(X.astype(np.float64).var(axis=0) + 1e-3)  # far from every event
        data.append(X)
        params.append((w, mu, cv * 1e4))
    many = _models(params, D, "diag", np.float32, "c")
    train_many(many, data, min_em_iters=3, max_em_iters=3, tol=0.0, variant="CBF")
    assert many[0].last_variant.startswith("CBF(")
    for b, (g, X, (w, mu, cv)) in enumerate(zip(many, data, params)):
        r = ref.em(X.astype(np.float64), w, mu, cv, "diag", 1e-6, 3, 3, 0.0)
        _close(g.covars, r["covars"], TOL["float32"], f"member {b} covars")
        _close(g.means, r["means"], TOL["float32"], f"member {b} means")


@pytest.mark.parametrize("backend", ["c", "numpy"])
def test_concat_members_equal_concatenated_arrays(backend, rng):
    """A member given as Concat(parts) trains as the parts concatenated (its N the sum), a part
    shared by several members included; compute_distance_BIC_many takes them too."""
    from asp_gmm import Concat

    D = 5
    parts = [make_blobs(rng, n, D, 2, offset=1000.0 * (k % 2), dtype=np.float64) for k, n in enumerate([40, 517, 9])]
    members = [(0, 1), (1, 2), (2,), (0, 1, 2)]
    joined = [np.concatenate([parts[i] for i in m]) for m in members]
    params = [init_params(rng, X, 2, "diag") for X in joined]
    a = _models(params, D, "diag", np.float64, backend)
    la = train_many(a, [Concat(*[parts[i] for i in m]) for m in members], 2, 2, tol=0.0)
    b = _models(params, D, "diag", np.float64, backend)
    lb = train_many(b, joined, 2, 2, tol=0.0)
    # equal to float64 rounding (the selection may run another batched variant in the second call)
    tol = TOL["float64"]
    for k, (g, h, X) in enumerate(zip(a, b, joined)):
        assert la[k] == pytest.approx(lb[k], rel=1e-10, abs=1e-10 * len(X))
        _close(g.covars, h.covars, tol, f"member {k} covars")
        _close(g.means, h.means, tol, f"member {k} means")
        assert g.n_events == len(X)
    got = compute_distance_BIC_many([(a[0], a[1])], [Concat(parts[0], parts[1])], min_em_iters=2, max_em_iters=2)
    want = compute_distance_BIC_many([(a[0], a[1])], [joined[0]], min_em_iters=2, max_em_iters=2)
    assert got[0][1] == pytest.approx(want[0][1], rel=1e-10, abs=1e-10 * len(joined[0]))


def test_concat_member_with_a_bad_part_is_named_and_the_others_train(rng):
    from asp_gmm import Concat

    D = 3
    good = make_blobs(rng, 200, D, 2)
    bad = good.copy()
    bad[7, 1] = np.nan
    ms = [GMM(2, D, backend="c", seed=0) for _ in range(3)]
    with pytest.raises(BatchMemberError) as info:
        train_many(ms, [Concat(good, good), Concat(good, bad), good], 2, 2)
    assert set(info.value.errors) == {1}
    assert "datasets[1]" in str(info.value.errors[1]) and "part 1" in str(info.value.errors[1])
    assert info.value.results[0] is not None and info.value.results[2] is not None
    with pytest.raises(ValueError, match="at least one array"):
        Concat()
    with pytest.raises(BatchMemberError, match="fewer than the M=2"):
        train_many([GMM(2, D, backend="c")], [Concat(good[:1])], 1, 1)


@pytest.mark.parametrize("backend", ["c", "numpy"])
def test_rows_members_equal_the_gathered_arrays(backend, rng):
    """A member given as Rows(frozen X, index) trains as X[index] (repeated and unordered rows, a
    member of one row short of M refused by name); compute_distance_BIC_many takes them too."""
    from asp_gmm import Rows, freeze

    D = 4
    X = freeze(make_blobs(rng, 3000, D, 3, offset=1000.0, dtype=np.float64))
    idx = [rng.permutation(3000)[:700], np.arange(5, 2000, 3), np.r_[np.arange(100), np.arange(100)]]
    params = [init_params(rng, X[i], 3, "full") for i in idx]
    a = _models(params, D, "full", np.float64, backend)
    la = train_many(a, [Rows(X, i) for i in idx], 2, 2, tol=0.0)
    b = _models(params, D, "full", np.float64, backend)
    lb = train_many(b, [X[i] for i in idx], 2, 2, tol=0.0)
    for k, (g, h) in enumerate(zip(a, b)):
        assert la[k] == pytest.approx(lb[k], rel=1e-10, abs=1e-10 * len(idx[k]))
        _close(g.covars, h.covars, TOL["float64"], f"member {k}")
        assert g.n_events == len(idx[k])
    pair = np.concatenate(idx[:2])
    got = compute_distance_BIC_many([(a[0], a[1])], [Rows(X, pair)], min_em_iters=2, max_em_iters=2)
    want = compute_distance_BIC_many([(a[0], a[1])], [X[pair]], min_em_iters=2, max_em_iters=2)
    assert got[0][1] == pytest.approx(want[0][1], rel=1e-10, abs=1e-10 * len(pair))
    with pytest.raises(BatchMemberError, match="fewer than the M=3"):
        train_many([GMM(3, D, backend=backend)], [Rows(X, [1, 2])], 1, 1)


@pytest.mark.parametrize("variant", C_BATCH)
@pytest.mark.parametrize("cvtype", ["full", "diag"])
def test_c_batch_gathers_rows_into_its_tiles(variant, cvtype, rng):
    """The C batch takes Rows members as they are (asp_batch_create_rows gathers them into the
    tiles, no copy of the rows first) and trains them as the gathered arrays, float32 at X + 1000,
    members below a tile, of one tile and a row, and with repeated rows."""
    from asp_gmm import Rows, freeze
    from asp_gmm.batch_driver import batch_support

    _skip_unless_computes(variant, cvtype)
    D, M = 5, 3
    X = freeze(make_blobs(rng, 2000, D, 3, offset=1000.0, dtype=np.float32))
    idx = [
        rng.permutation(2000)[:9],
        rng.permutation(2000)[:65],
        np.r_[np.arange(300), np.arange(50)],
        np.arange(1999, -1, -1),
    ]
    params = [init_params(rng, X[i], M, cvtype) for i in idx]
    a = _models(params, D, cvtype, np.float32, "c")
    assert batch_support(a[0]._specializer.backend).support.takes_rows
    la = train_many(a, [Rows(X, i) for i in idx], 2, 2, tol=0.0, variant=variant)
    b = _models(params, D, cvtype, np.float32, "c")
    lb = train_many(b, [X[i] for i in idx], 2, 2, tol=0.0, variant=variant)
    for k, (g, h) in enumerate(zip(a, b)):
        np.testing.assert_array_equal(g.covars, h.covars, err_msg=f"member {k}")
        np.testing.assert_array_equal(g.means, h.means, err_msg=f"member {k}")
        assert la[k] == lb[k] and g.last_variant.startswith(variant + "(")


def test_rows_refuses_what_it_cannot_trust(rng):
    from asp_gmm import Rows, freeze

    X = make_blobs(rng, 50, 3, 2)
    with pytest.raises(ValueError, match="freeze"):
        Rows(X, [0, 1])  # writeable: its rows could change between calls
    Xf = freeze(X)
    with pytest.raises(ValueError, match=r"0 \.\. 49"):
        Rows(Xf, [0, 50])
    with pytest.raises(ValueError, match="integer"):
        Rows(Xf, [0.5])
    assert len(Rows(Xf, [])) == 0 and Rows(Xf, [3, 3]).shape == (2, 3)
    np.testing.assert_array_equal(Rows(Xf, [4, 1]).take(), X[[4, 1]])
    # another dtype than the model's: the rows of the converted array
    g = GMM(2, 3, backend="c", dtype=np.float32, seed=0)
    train_many([g], [Rows(Xf, np.arange(40))], 2, 2)
    assert g.n_events == 40 and g.means.dtype == np.float32


def test_a_batch_never_waits_for_its_planned_configuration_to_compile(rng, monkeypatch):
    """A planned batched configuration that is not compiled (the history's best for a class whose
    binary this process has not built) compiles in the background; a compiled one of the fixed
    rule's order runs the call meanwhile, with the same results."""
    import dataclasses

    from asp_gmm.batch_driver import BatchSpecializer, batch_support
    from asp_gmm.selection.plan import Plan

    data, params = _batch(rng, 3, "diag", np.float64)
    models = _models(params, 3, "diag", np.float64, "c")
    spec = BatchSpecializer(models[0]._specializer)
    view = batch_support(spec.backend)
    problems = [g._problem(len(X)) for g, X in zip(models, data)]
    bp = BatchProblem.of(problems)
    cands = spec.candidates(view, bp)
    planned = next(c for c in cands if c.variant.name == "CBE")
    monkeypatch.setattr(type(view), "is_ready", lambda self, v, t, p: v.name != "CBE")
    monkeypatch.setattr(
        spec.policy, "choose", lambda *a, **k: dataclasses.replace(Plan(planned), primary_in_background=True)
    )
    built, later = [], []
    kernel = view.support.kernel
    monkeypatch.setattr(view.support, "kernel", lambda v, t, p: built.append(v.name) or kernel(v, t, p))
    monkeypatch.setattr(spec, "_compile_later", lambda view, c, bp: later.append(c.variant.name))
    got = spec.train(data, params, problems, [1e-6] * len(data), 3, 3, 0.0)
    assert "CBE" not in built and built and later == ["CBE"]
    alone = _models(params, 3, "diag", np.float64, "c")
    for g, X, r in zip(alone, data, got):
        g.train(X, min_em_iters=3, max_em_iters=3, tol=0.0)
        _close(r.covars, g.covars, TOL["float64"], "stand-in")
    # scoring, likewise (it asked for the planned configuration as it was: a compile in the call)
    built.clear(), later.clear()
    scores = spec.score(data, params, problems, [1e-6] * len(data))
    assert "CBE" not in built and built and later == ["CBE"]
    for (w, mu, cv), X, sc in zip(params, data, scores):
        g = GMM(len(w), X.shape[1], means=mu, covars=cv, weights=w, cvtype="diag", dtype=np.float64, backend="c")
        np.testing.assert_allclose(sc, g.score(X), rtol=1e-9)


def test_prepare_compiles_every_classs_first_configuration_at_once(monkeypatch):
    """The first configurations of several batch classes are all submitted to the background
    compiler before prepare() waits for any of them (one after the other, a cold warm-up waited for
    each compile in turn)."""
    from asp_gmm.batch_driver import BatchSpecializer

    g = GMM(4, 3, cvtype="diag", dtype=np.float64, backend="c")
    spec = BatchSpecializer(g._specializer)
    bps = [BatchProblem(10_000, 3, m, "diag", "float64", B=2) for m in (2, 4, 8)]
    events = []

    class Submitted:  # a future that says when it is waited for
        def __init__(self, m):
            self.m = m
            events.append(("submit", m))

        def result(self):
            events.append(("wait", self.m))

    monkeypatch.setattr(spec, "_compile_later", lambda view, cfg, bp: Submitted(bp.M))
    spec.prepare(bps)
    waits = [i for i, e in enumerate(events) if e[0] == "wait"]
    firsts = [e for e in events[: waits[0]] if e[0] == "submit"]
    assert sorted(m for _, m in firsts) == [2, 4, 8] and len(waits) == 3


def test_prepare_compiles_what_runs_first_and_the_rest_in_the_background(monkeypatch):
    """prepare() compiles each class's first configuration (every class's at once, on the
    background pool, waited for) and loads it, loads those already compiled, and hands the others to
    the background compiler without waiting (a cold start does not wait for every configuration the
    history may explore)."""
    from asp_gmm.batch_driver import BatchSpecializer, batch_support

    g = GMM(4, 3, cvtype="diag", dtype=np.float64, backend="c")
    spec = BatchSpecializer(g._specializer)
    view = batch_support(spec.backend)
    bp = BatchProblem(10_000, 3, 4, "diag", "float64", B=2)
    cands = spec.candidates(view, bp)
    # the plan's first configuration fixed (the shared history may hold a tuned one from other tests)
    from asp_gmm.selection.plan import Plan

    first = cands[0]
    monkeypatch.setattr(spec.policy, "choose", lambda *a, **k: Plan(first))
    cached = next(c for c in cands if c.variant.name != first.variant.name)
    monkeypatch.setattr(
        type(view), "is_ready", lambda self, v, t, p: v.name in (first.variant.name, cached.variant.name)
    )
    built, later = [], []
    kernel = view.support.kernel
    monkeypatch.setattr(view.support, "kernel", lambda v, t, p: built.append(v.name) or kernel(v, t, p))
    monkeypatch.setattr(spec, "_compile_later", lambda view, c, bp: later.append(c.variant.name))
    n = spec.prepare([bp])
    rest = sorted(c.variant.name for c in cands if c.variant.name not in (first.variant.name, cached.variant.name))
    assert built[0] == first.variant.name and cached.variant.name in built and n == len(cands) - len(rest)
    assert later[0] == first.variant.name and sorted(later[1:]) == rest and not set(later[1:]) & set(built)


def test_prepare_prepares_every_class_beside_its_kernels(monkeypatch):
    """prepare() asks the backend's batch support for what each class's calls need besides their
    kernel (on CUDA the module that uploads a frozen recording), every class's at once with the
    kernels' compiles, and waits for it: the first call of a cold run compiled it on its own thread."""
    from asp_gmm.batch_driver import BatchSpecializer, batch_support

    g = GMM(4, 3, cvtype="diag", dtype=np.float64, backend="c")
    spec = BatchSpecializer(g._specializer)
    view = batch_support(spec.backend)
    bps = [BatchProblem(10_000, 3, m, "diag", "float64", B=2) for m in (2, 4)]
    events = []

    class Submitted:
        def __init__(self, m):
            self.m = m
            events.append(("submit", m))

        def result(self):
            events.append(("wait", self.m))

    def now(key, fn, what):  # the background pool, run here (its futures are kept per key and process)
        from concurrent.futures import Future

        fut = Future()
        fut.set_result(fn())
        return fut

    monkeypatch.setattr(spec, "_compile_later", lambda view, cfg, bp: Submitted(bp.M))
    monkeypatch.setattr(spec.backend, "_submit", now)
    monkeypatch.setattr(
        type(view.support), "prepare_class", lambda self, bp: events.append(("class", bp.M)), raising=False
    )
    spec.prepare(bps)
    first_wait = next(i for i, e in enumerate(events) if e[0] == "wait")
    assert sorted(m for k, m in events[:first_wait] if k == "class") == [2, 4]


@pytest.mark.parametrize("backend", ["c", "numpy"])
def test_bad_values_left_to_the_batch_are_named_as_the_host_names_them(backend, rng, monkeypatch):
    """Where the backend checks data on the device (CUDA: GMM._device_checks), train_many makes no
    host pass for NaN/inf: a bad member fails non-finite in the batch and only it is scanned then,
    its error the host check's (row, column; a float64 value beyond float32 named as such); the
    others are trained. Here the C and NumPy backends stand in for the device (the flag forced)."""
    from asp_gmm import many as many_mod
    from asp_gmm.gmm import GMM as GMMClass

    monkeypatch.setattr(GMMClass, "_device_checks", lambda self, seeding=False: True)
    scanned = []
    real_first = many_mod.check_data

    def spy(X, *a, **k):
        if not k.get("device_checks"):
            scanned.append(k.get("name"))
        return real_first(X, *a, **k)

    monkeypatch.setattr(many_mod, "check_data", spy)
    D = 3
    data = [make_blobs(rng, n, D, 2).astype(np.float32) for n in (80, 120, 60)]
    params = [init_params(rng, X, 2, "diag") for X in data]
    data[1] = data[1].copy()
    data[1][5, 2] = np.nan
    big = data[2].astype(np.float64)
    big[7, 0] = 1e39  # finite in float64, infinite in float32
    data[2] = big
    models = _models(params, D, "diag", np.float32, backend)
    with pytest.raises(BatchMemberError) as info:
        train_many(models, data, min_em_iters=2, max_em_iters=2, tol=0.0)
    errs = info.value.errors
    assert set(errs) == {1, 2}
    assert isinstance(errs[1], ValueError) and "datasets[1] contains NaN or infinity (first at row 5, column 2)" in str(
        errs[1]
    )
    assert "datasets[2] has values beyond the float32 range (first at row 7, column 0" in str(errs[2])
    assert scanned == ["datasets[1]", "datasets[2]"]  # only the failed members, after the batch
    assert info.value.results[0] is not None and np.isfinite(models[0].loglik)


def test_c_batch_cache_lookups_are_remembered(monkeypatch):
    """The C batch support's is_ready renders a configuration's source and asks the compile cache
    once for a found binary, and once per ABSENT_S seconds for a missing one (the selection asks
    for every candidate on every call; each render cost ~1 ms of a batched call)."""
    from asp_gmm import registry as reg
    from asp_gmm.backends import batch_base, c_batch, get_backend

    support = c_batch.CBatchSupport(get_backend("c"))
    v = reg.get("c", "CB", "batch")
    bp = BatchProblem(10_000, 19, 8, "full", "float64", B=4)
    tun = support.tunables_for(v, bp)
    asked, found, clock = [], {"now": False}, {"t": 50.0}
    monkeypatch.setattr(c_batch.cache, "lookup", lambda *a, **k: asked.append(1) or ("x" if found["now"] else None))
    monkeypatch.setattr(batch_base.time, "monotonic", lambda: clock["t"])
    assert not support.is_ready(v, tun, bp) and not support.is_ready(v, tun, bp) and len(asked) == 1
    found["now"] = True
    assert not support.is_ready(v, tun, bp) and len(asked) == 1  # still taken as absent
    clock["t"] += support.ABSENT_S
    assert all(support.is_ready(v, tun, bp) for _ in range(3)) and len(asked) == 2


@pytest.mark.parametrize("tile_vecs", registry.get("c", "CBF", "batch").tunables["tile_vecs"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_batch_at_every_tile_size_against_reference(tile_vecs, dtype, rng, monkeypatch):
    """CBF at each tile size of its manifest (16 vectors a tile sums its even and odd vectors
    apart, core.c.j2: tile_shifted_moments): members below one tile, one tile and two events over
    (both halves of the last tile partly padding), M = 1, D not a multiple of the lanes, X + 1000,
    against the float64 reference."""
    v = registry.get("c", "CBF", "batch")
    monkeypatch.setitem(v.tunables, "tile_vecs", [tile_vecs] + [t for t in v.tunables["tile_vecs"] if t != tile_vecs])
    lanes = 8 if dtype == np.float32 else 4
    D, tile = 5, lanes * tile_vecs  # (padded to 6: a block of four dimensions and two more)
    data, params = [], []
    for k, (N, M) in enumerate([(5, 1), (tile + 2, 3), (tile * 3 - 1, 1), (2000, 5)]):
        X = make_blobs(rng, N, D, min(M, 3), offset=1000.0 if k % 2 else 0.0, dtype=dtype)
        data.append(X)
        params.append(init_params(rng, X, M, "diag"))
    many = _models(params, D, "diag", dtype, "c")
    train_many(many, data, min_em_iters=2, max_em_iters=2, tol=0.0, variant="CBF")
    assert f"tile_vecs={tile_vecs}" in many[0].last_variant
    tol = TOL["float32" if dtype == np.float32 else "float64"]
    for b, (g, X, (w, mu, cv)) in enumerate(zip(many, data, params)):
        r = ref.em(X.astype(np.float64), w, mu, cv, "diag", 1e-6, 2, 2, 0.0)
        _close(g.covars, r["covars"], tol, f"member {b} covars")
        _close(g.means, r["means"], tol, f"member {b} means")


@pytest.mark.parametrize("cvtype, primary, candidate", [("diag", "CBF", "CB"), ("full", "CBC", "CBE")])
def test_a_batch_explores_a_candidate_in_place_within_its_allowance(
    rng, monkeypatch, tmp_path, cvtype, primary, candidate
):
    """A batched call explores its planned candidate for one iteration of the batch (its second),
    the members' parameters handed over and back, not for the whole call (a whole call on an
    unexplored candidate cost a fresh history's bundled meeting 3-6x a call): the results are the
    primary's alone, the candidate's iteration is recorded; a candidate predicted to cost more than
    the allowance is not run at all."""
    from asp_gmm.batch_driver import BatchSpecializer, batch_support
    from asp_gmm.selection.plan import Plan

    monkeypatch.setenv("ASP_GMM_DB", f"sqlite:///{tmp_path / 'h.sqlite'}")
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    data, params = _batch(rng, 5, cvtype, np.float64)
    models = _models(params, 5, cvtype, np.float64, "c")
    spec = BatchSpecializer(models[0]._specializer)
    view = batch_support(spec.backend)
    problems = [g._problem(len(X)) for g, X in zip(models, data)]
    bp = BatchProblem.of(problems)
    cands = {c.variant.name: c for c in spec.candidates(view, bp)}
    p, c = cands[primary], cands[candidate]
    for cfg in (p, c):  # compiled (a plan explores only what is)
        view.support.kernel(cfg.variant, cfg.params, bp)
    recorded, opened = [], []
    monkeypatch.setattr(
        spec.policy, "record", lambda v, b, cfg, status, *a, **k: recorded.append((cfg.variant.name, status, a))
    )
    real_open = view.support.open
    monkeypatch.setattr(
        view.support, "open", lambda X, pr, k: opened.append(k.config.variant.name) or real_open(X, pr, k)
    )
    reg = [1e-6] * len(data)
    for ratio, runs_on in ((1.2, [primary, candidate]), (1e6, [primary])):
        plan = Plan(p, [c], "explore", predicted={c: ratio}, banked=0.05)
        monkeypatch.setattr(spec.policy, "choose", lambda *a, _plan=plan, **k: _plan)
        recorded.clear(), opened.clear()
        got = spec.train(data, params, problems, reg, 5, 5, 0.0)
        assert opened == runs_on, (ratio, opened)
        assert [n for n, s, _ in recorded] == runs_on[1:] + [primary], recorded
        monkeypatch.setattr(spec.policy, "choose", lambda *a, **k: Plan(p))
        alone = spec.train(data, params, problems, reg, 5, 5, 0.0)
        for r, a in zip(got, alone):
            assert r.iters == a.iters == 5 and len(r.loglik_trace) == len(a.loglik_trace)
            _close(r.covars, a.covars, TOL["float64"], f"{cvtype} in place, ratio {ratio}")
            _close(np.array(r.loglik_trace), np.array(a.loglik_trace), TOL["float64"], "trace")
        assert got[0].explored == ([c.label] if ratio < 2 else [])
    # the class's known time shows the candidate cannot fit: one EM call on the primary, not split
    calls = []

    def counted(X, pr, k):
        sess = real_open(X, pr, k)
        em = sess.em_arrays
        sess.em_arrays = lambda **kw: calls.append(kw["max_iters"]) or em(**kw)
        return sess

    monkeypatch.setattr(view.support, "open", counted)
    known = Plan(p, [c], "explore", predicted={c: 1e6}, banked=0.05, fastest=1e-7)
    monkeypatch.setattr(spec.policy, "choose", lambda *a, **k: known)
    got = spec.train(data, params, problems, reg, 5, 5, 0.0)
    assert calls == [5] and got[0].explored == []
