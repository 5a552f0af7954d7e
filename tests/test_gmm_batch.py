"""GMMBatch (B models of one shape as stacked arrays) against training each member alone and the
float64 reference: odd sizes (N below a tile, M = 1, odd D), X + 1000, ragged N, seeding, bad
members, scoring, refusals."""

import numpy as np
import pytest

from asp_gmm import GMM, BatchMemberError, GMMBatch, registry, train_many
from asp_gmm import reference as ref
from conftest import init_params, make_blobs

TOL64 = dict(rtol=1e-10, atol=1e-10)


def _problems(rng, B, N, D, M, cvtype, dtype=np.float64, offset_every=2):
    X = np.stack(
        [
            make_blobs(rng, N, D, min(M, 4), offset=1000.0 if b % offset_every == 0 else 0.0, dtype=dtype)
            for b in range(B)
        ]
    )
    params = [init_params(rng, X[b], M, cvtype) for b in range(B)]
    W, MU, CV = (np.stack([p[i] for p in params]) for i in range(3))
    return X, W, MU, CV


def _alone(X, W, MU, CV, cvtype, dtype, backend, **kw):
    gs = []
    for b in range(len(X)):
        g = GMM(
            W.shape[1],
            X[b].shape[1],
            means=MU[b],
            covars=CV[b],
            weights=W[b],
            cvtype=cvtype,
            dtype=dtype,
            backend=backend,
        )
        g.train(X[b], **kw)
        gs.append(g)
    return gs


def _same(batch, gs, tol=TOL64):
    for b, g in enumerate(gs):
        for name in ("weights", "means", "covars"):
            a, e = getattr(batch, name)[b], getattr(g, name)
            np.testing.assert_allclose(
                a, e, rtol=tol["rtol"], atol=tol["atol"] * max(np.abs(e).max(), 1), err_msg=f"{name} of member {b}"
            )
        assert batch.loglik[b] == pytest.approx(g.loglik, rel=1e-10)
        assert batch.n_iter[b] == g.n_iter and batch.converged[b] == g.converged


@pytest.mark.parametrize("backend", ["c", "numpy"])
@pytest.mark.parametrize("cvtype", ["full", "diag"])
@pytest.mark.parametrize("N,D,M", [(20, 3, 2), (517, 1, 1), (1003, 7, 5)])
def test_gmmbatch_equals_each_alone_float64(backend, cvtype, N, D, M, rng):
    X, W, MU, CV = _problems(rng, 5, N, D, M, cvtype)
    kw = dict(min_em_iters=2, max_em_iters=6, tol=1e-5)
    batch = GMMBatch(5, M, D, means=MU, covars=CV, weights=W, cvtype=cvtype, dtype=np.float64, backend=backend)
    given = MU.copy()
    got = batch.train(X, **kw)
    np.testing.assert_array_equal(MU, given)  # the caller's arrays are not written
    np.testing.assert_array_equal(got, batch.loglik)
    _same(batch, _alone(X, W, MU, CV, cvtype, np.float64, backend, **kw))
    # and the float64 reference (member 0 is offset by 1000)
    r = ref.em(X[0], W[0], MU[0], CV[0], cvtype, 1e-6, 2, 6, 1e-5)
    np.testing.assert_allclose(batch.covars[0], r["covars"], rtol=1e-9, atol=1e-9 * np.abs(r["covars"]).max())
    assert batch.loglik_trace.shape == (5, 7)
    k = int(batch.n_iter[0])
    assert np.isfinite(batch.loglik_trace[0, : k + 1]).all() and np.isnan(batch.loglik_trace[0, k + 1 :]).all()


@pytest.mark.parametrize("variant", sorted(v.name for v in registry.variants("c", "batch")))
@pytest.mark.parametrize("cvtype", ["full", "diag"])
def test_gmmbatch_float32_against_reference(cvtype, variant, rng):
    """One EM iteration within 1e-5 of float64 EM (members offset by 1000 included); five within
    float32 EM's usual drift (the same as a lone GMM.train: iterations amplify rounding)."""
    if cvtype not in registry.get("c", variant, "batch").cvtypes:
        pytest.skip(f"{variant} does not compute {cvtype} covariances (its manifest's cvtypes)")
    X, W, MU, CV = _problems(rng, 4, 700, 5, 3, cvtype, dtype=np.float32)
    for iters, rtol in ((1, 1e-5), (5, 5e-4)):
        batch = GMMBatch(4, 3, 5, means=MU, covars=CV, weights=W, cvtype=cvtype, backend="c")
        batch.train(X, min_em_iters=iters, max_em_iters=iters, tol=0.0, variant=variant)
        assert batch.covars.dtype == np.float32 and batch.last_variant.startswith(variant)
        for b in range(4):
            r = ref.em(X[b].astype(np.float64), W[b], MU[b], CV[b], cvtype, 1e-6, iters, iters, 0.0)
            s = np.abs(r["covars"]).max()
            np.testing.assert_allclose(batch.covars[b], r["covars"], rtol=rtol, atol=rtol * s, err_msg=f"{iters} it")


def test_gmmbatch_ragged_members_and_train_many(rng):
    D, M = 4, 3
    Xs = [make_blobs(rng, n, D, 3, offset=1000.0 * (n % 2)) for n in (30, 901, 257)]
    params = [init_params(rng, x, M, "full") for x in Xs]
    W, MU, CV = (np.stack([p[i] for p in params]) for i in range(3))
    batch = GMMBatch(3, M, D, means=MU, covars=CV, weights=W, dtype=np.float64, backend="c")
    batch.train(Xs, max_em_iters=4)
    gs = [GMM(M, D, means=mu, covars=cv, weights=w, dtype=np.float64, backend="c") for w, mu, cv in params]
    train_many(gs, Xs, max_em_iters=4)
    _same(batch, gs)
    assert batch.n_events.tolist() == [30, 901, 257]


@pytest.mark.parametrize("backend", ["c", "numpy"])
@pytest.mark.parametrize("cvtype", ["full", "diag", "spherical", "tied"])
def test_gmmbatch_seeds_as_gmm_train(backend, cvtype, rng):
    X, *_ = _problems(rng, 3, 400, 3, 4, "full")
    batch = GMMBatch(3, 4, 3, cvtype=cvtype, dtype=np.float64, backend=backend)
    batch.train(X, max_em_iters=3)
    gs = []
    for b in range(3):
        g = GMM(4, 3, cvtype=cvtype, dtype=np.float64, backend=backend)
        g.train(X[b], max_em_iters=3)
        gs.append(g)
    _same(batch, gs)
    # a second train warm-starts from the trained parameters, as GMM.train does
    batch.train(X, max_em_iters=2)
    for g, x in zip(gs, X):
        g.train(x, max_em_iters=2)
    _same(batch, gs)


def test_gmmbatch_bad_member_fails_alone(rng):
    X, W, MU, CV = _problems(rng, 4, 300, 3, 2, "full")
    X[2, 17, 1] = np.nan
    batch = GMMBatch(4, 2, 3, means=MU, covars=CV, weights=W, dtype=np.float64, backend="c")
    with pytest.raises(BatchMemberError) as info:
        batch.train(X, max_em_iters=3)
    err = info.value
    assert set(err.errors) == {2}
    assert "X[2]" in str(err.errors[2]) and "row 17, column 1" in str(err.errors[2])
    assert err.results[2] is None and all(err.results[b] == batch.loglik[b] for b in (0, 1, 3))
    np.testing.assert_array_equal(batch.means[2], MU[2])  # the failed member keeps its parameters
    assert np.isnan(batch.loglik[2])
    ok = [0, 1, 3]
    gs = _alone(X[ok], W[ok], MU[ok], CV[ok], "full", np.float64, "c", max_em_iters=3)
    for j, b in enumerate(ok):
        np.testing.assert_allclose(batch.covars[b], gs[j].covars, rtol=1e-10, atol=1e-12)


def test_gmmbatch_member_never_seeded_then_seeded(rng):
    X, *_ = _problems(rng, 3, 200, 2, 2, "diag")
    Xs = [X[0], X[1][:1], X[2]]  # member 1: one event for two components
    batch = GMMBatch(3, 2, 2, cvtype="diag", dtype=np.float64, backend="c")
    with pytest.raises(BatchMemberError, match="member 1: .*fewer than the M=2"):
        batch.train(Xs)
    assert np.isnan(batch.means[1]).all() and np.isfinite(batch.means[[0, 2]]).all()
    with pytest.raises(BatchMemberError):
        batch.score(X)  # member 1 has no parameters: named, the others scored
    batch.train(X)  # now member 1 is seeded from its data
    assert np.isfinite(batch.means).all()


def test_gmmbatch_not_positive_definite_member(rng):
    X, W, MU, CV = _problems(rng, 3, 200, 2, 2, "full")
    CV[1, 0] = [[1.0, 2.0], [2.0, 1.0]]  # indefinite
    batch = GMMBatch(3, 2, 2, means=MU, covars=CV, weights=W, dtype=np.float64, backend="c")
    with pytest.raises(BatchMemberError) as info:
        batch.train(X, max_em_iters=2)
    assert set(info.value.errors) == {1}
    np.testing.assert_array_equal(batch.covars[1], CV[1])


@pytest.mark.parametrize("backend", ["c", "numpy"])
def test_gmmbatch_score(backend, rng):
    X, W, MU, CV = _problems(rng, 3, 150, 4, 3, "diag")
    batch = GMMBatch(3, 3, 4, means=MU, covars=CV, weights=W, cvtype="diag", dtype=np.float64, backend=backend)
    got = batch.score(X)
    assert got.shape == (3, 150)
    shared = batch.score(X[1])
    for b in range(3):
        g = batch[b]
        np.testing.assert_allclose(got[b], g.score(X[b]), rtol=1e-10)
        np.testing.assert_allclose(shared[b], g.score(X[1]), rtol=1e-10)


def test_gmmbatch_member_view_and_refusals(rng):
    X, W, MU, CV = _problems(rng, 2, 100, 3, 2, "full")
    batch = GMMBatch(2, 2, 3, means=MU, covars=CV, weights=W, dtype=np.float64, backend="c")
    batch.train(X, max_em_iters=2)
    g = batch[-1]
    assert isinstance(g, GMM) and g.loglik == batch.loglik[1] and g.n_events == 100
    np.testing.assert_array_equal(g.means, batch.means[1])
    assert len(batch) == 2 and len(batch.models()) == 2 and "B=2" in repr(batch)
    with pytest.raises(IndexError):
        batch[2]
    with pytest.raises(ValueError, match="holds 3 members' data but the batch has B=2"):
        batch.train(np.zeros((3, 100, 3)))
    with pytest.raises(ValueError, match="D=3"):
        batch.train(np.zeros((2, 100, 4)))
    with pytest.raises(TypeError, match="floating-point"):
        batch.train(np.zeros((2, 100, 3), int))
    with pytest.raises(ValueError, match="fewer than the M=2"):
        batch.train(np.zeros((2, 1, 3)))
    with pytest.raises(ValueError, match="one per member"):
        batch.train([X[0]])
    with pytest.raises(ValueError, match="max_em_iters"):
        batch.train(X, max_em_iters=-1)
    with pytest.raises(ValueError, match="shape"):
        GMMBatch(2, 2, 3, means=MU[:1])
    bad_w = W.copy()
    bad_w[1] = [0.9, 0.9]
    with pytest.raises(ValueError, match="member 1"):
        GMMBatch(2, 2, 3, weights=bad_w)
    with pytest.raises(ValueError, match="B must be a positive integer"):
        GMMBatch(0, 2, 3)
    with pytest.raises(RuntimeError, match="no parameters"):
        GMMBatch(2, 2, 3).score(X)
