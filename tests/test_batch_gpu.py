"""Batched training on the GPU (the CUDA batched variant GB: a ragged batch, one launch per EM
phase) against the float64 reference and against training each model alone: odd sizes (N below a
block, M = 1, D not a multiple of anything), X + 1000, ragged M, a bad member.

Skipped, with the reason, where pycuda or a GPU is missing (CI); the GPU command in the report of
issue 35 (and scripts/gpu_check.sh) runs it on the GPU machine.
"""

import numpy as np
import pytest

from asp_gmm import (
    GMM,
    BatchMemberError,
    GMMBatch,
    compute_distance_BIC,
    compute_distance_BIC_many,
    score_many,
    train_many,
)
from asp_gmm import reference as ref
from asp_gmm import registry
from asp_gmm.batch_driver import batch_support
from asp_gmm.problem import BatchProblem
from conftest import check_fit, init_params, make_blobs

cuda_mod = pytest.importorskip("asp_gmm.backends.cuda")
REASON = cuda_mod.CudaBackend.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"CUDA backend unavailable: {REASON}")

# (N, M): N below one block (128 threads), M = 1, N not a multiple of a block, ragged M
MEMBERS = [(50, 2), (517, 1), (1003, 3), (300, 8), (4099, 16), (129, 5)]


def _batch(rng, D, cvtype, members=MEMBERS):
    data, params = [], []
    for b, (N, M) in enumerate(members):
        X = make_blobs(rng, N, D, min(M, 4), offset=1000.0 if b % 2 == 0 else 0.0, dtype=np.float32)
        data.append(X)
        params.append(init_params(rng, X, M, cvtype))
    return data, params


def _models(params, D, cvtype):
    return [GMM(len(w), D, means=mu, covars=cv, weights=w, cvtype=cvtype, backend="cuda") for w, mu, cv in params]


@pytest.mark.parametrize(
    "D, cvtype, threads",
    [(2, "full", 128), (19, "full", 128), (19, "diag", 128), (1, "diag", 128), (19, "full", 256), (7, "diag", 256)],
)
@pytest.mark.parametrize("variant, chunk", [("GB", None), ("GBS", 2048), ("GBS", 512)])
@pytest.mark.parametrize("ept", [1, 2])
def test_gb_against_reference(D, cvtype, threads, variant, chunk, ept, rng):
    """GB and GBS (its M-step over chunks: 512 splits the 4 099-event member in 9, a 50-event
    member is one chunk), one and two events a thread of the E-step, against the float64 reference."""
    data, params = _batch(rng, D, cvtype)
    many = _models(params, D, cvtype)
    problems = [g._problem(len(X)) for g, X in zip(many, data)]
    view = batch_support(many[0]._specializer.backend)
    v = registry.get("cuda", variant, "batch")
    tun = {"threads": threads, "ept": ept} if chunk is None else {"threads": threads, "ept": ept, "chunk": chunk}
    kernel = view.support.kernel(v, tun, BatchProblem.of(problems))
    s = view.support.open(data, problems, kernel)
    try:
        assert s.set_params(params, [1e-6] * len(params)) == [None] * len(params)
        runs = s.em(min_iters=3, max_iters=3, tol=0.0, reg_covars=[1e-6] * len(params))
        for b, (X, (w, mu, cv), r) in enumerate(zip(data, params, runs)):
            assert r.error is None and r.iters == 3, (b, r.error)
            rr = ref.em(X.astype(np.float64), w, mu, cv, cvtype, 1e-6, 3, 3, 0.0)
            got = s.params(b)
            if len(X) >= 10 * D:  # near-singular fits of a handful of events: loglik checked loosely
                check_fit(got[2], got[1], got[0], r.loglik, rr)
            else:
                np.testing.assert_allclose(got[1], rr["means"], rtol=2e-4, atol=2e-4 * np.abs(rr["means"]).max())
    finally:
        s.close()


@pytest.mark.parametrize("cvtype", ["full", "diag"])
def test_train_many_gpu_equals_alone(cvtype, rng):
    D = 19
    # members with at least 3 D events a component: a lone float32 fit of 25 events in 19-D at an
    # offset of 1000 can fail its Cholesky where the batched kernel (factors in double) does not
    # (the reference test above covers those near-singular members)
    data, params = _batch(rng, D, cvtype, [(N, M) for N, M in MEMBERS if N >= 3 * D * M])
    many = _models(params, D, cvtype)
    ll = train_many(many, data, min_em_iters=5, max_em_iters=5, tol=0.0)
    assert many[0].last_variant.startswith("GB")
    alone = _models(params, D, cvtype)
    for b, (g, h, X) in enumerate(zip(alone, many, data)):
        lone = g.train(X, min_em_iters=5, max_em_iters=5, tol=0.0)
        s = float(np.abs(g.covars).max())
        np.testing.assert_allclose(h.covars, g.covars, rtol=5e-4, atol=5e-4 * s, err_msg=f"member {b}")
        np.testing.assert_allclose(h.means, g.means, rtol=5e-4, atol=5e-4 * float(np.abs(g.means).max()))
        if len(X) >= 10 * D:
            assert ll[b] == pytest.approx(lone, rel=1e-3, abs=1e-3 * len(X))


def test_gpu_convergence_and_bad_member(rng):
    D = 5
    data, params = _batch(rng, D, "diag")
    data[1] = data[1].copy()
    data[1][3, 0] = np.nan
    data[3] = data[3][:4]  # 4 events for 8 components
    many = _models(params, D, "diag")
    with pytest.raises(BatchMemberError) as info:
        train_many(many, data, min_em_iters=1, max_em_iters=40, tol=1e-3)
    assert set(info.value.errors) == {1, 3}
    # its NaN found on the device (no host scan of the members' data), named as the host check names it
    err = info.value.errors[1]
    assert isinstance(err, ValueError) and "datasets[1] contains NaN or infinity (first at row 3, column 0)" in str(err)
    alone = _models(params, D, "diag")
    for b in (0, 2, 4, 5):
        alone[b].train(data[b], min_em_iters=1, max_em_iters=40, tol=1e-3)
        assert many[b].n_iter == pytest.approx(alone[b].n_iter, abs=1)  # float32 rounding may move the stop by one


def test_gpu_score_and_bic_many(rng):
    D = 19
    data, params = _batch(rng, D, "diag")
    models = _models(params, D, "diag")
    train_many(models, data, min_em_iters=2, max_em_iters=2)
    X = data[4]
    for g, s in zip(models, score_many(models, X)):
        np.testing.assert_allclose(s, g.score(X), rtol=1e-4, atol=1e-3)
    pairs = [(0, 1), (2, 4)]
    Xs = [np.concatenate([data[i], data[j]]) for i, j in pairs]
    got = compute_distance_BIC_many([(models[i], models[j]) for i, j in pairs], Xs, min_em_iters=3, max_em_iters=3)
    for (i, j), X, (_, score) in zip(pairs, Xs, got):
        _, s2 = compute_distance_BIC(models[i], models[j], X, min_em_iters=3, max_em_iters=3)
        assert score == pytest.approx(s2, rel=1e-3, abs=1e-3 * len(X))


@pytest.mark.parametrize("cvtype", ["diag", "full"])
def test_concat_members_assembled_on_the_device(cvtype, rng):
    """Members given as Concat(parts) (two clusters' frames, each cluster in several pairs) are
    assembled on the device from each distinct part uploaded once, beside plain members: every
    result equals the same call with the parts concatenated on the host (the same rows in the same
    order: bitwise), and meets the float64 reference."""
    from asp_gmm import Concat

    D = 7
    # every cluster at X + 1000 (a merged pair of clusters 1000 apart is too ill-conditioned for a
    # float32 fit to meet the reference: the C backend misses it by 1e-3 as well)
    clusters = [make_blobs(rng, n, D, 2, offset=1000.0, dtype=np.float32) for n in [50, 517, 129, 1003]]
    pairs = [(0, 1), (1, 2), (2, 3), (0, 3), (3, 3)]
    plain = make_blobs(rng, 300, D, 2, dtype=np.float32)
    joined = [np.concatenate([clusters[i], clusters[j]]) for i, j in pairs] + [plain]
    params = [init_params(rng, X, 3, cvtype) for X in joined]
    many = _models(params, D, cvtype)
    # pinned to GB (one block per sum: the same order in both calls), so that equal rows give equal bits
    train_many(many, [Concat(clusters[i], clusters[j]) for i, j in pairs] + [plain], 3, 3, tol=0.0, variant="GB")
    host = _models(params, D, cvtype)
    train_many(host, joined, 3, 3, tol=0.0, variant="GB")
    for b, (g, h, X, (w, mu, cv)) in enumerate(zip(many, host, joined, params)):
        np.testing.assert_array_equal(g.covars, h.covars, err_msg=f"member {b}")
        np.testing.assert_array_equal(g.means, h.means, err_msg=f"member {b}")
        assert g.loglik == h.loglik and g.n_events == len(X)
        rr = ref.em(X.astype(np.float64), w, mu, cv, cvtype, 1e-6, 3, 3, 0.0)
        check_fit(g.covars, g.means, g.weights, g.loglik, rr)


@pytest.mark.parametrize("cvtype", ["diag", "full"])
def test_rows_members_gathered_on_the_device(cvtype, rng):
    """Members given as Rows(frozen X, index) are gathered on the device from X's resident copy
    (beside plain and Concat members): every result equals the same call on X[index] arrays (the
    same rows in the same order: bitwise) and meets the float64 reference; a second call reuses
    the resident copy."""
    from asp_gmm import Concat, Rows, freeze

    D = 7
    X = freeze(make_blobs(rng, 5000, D, 3, offset=1000.0, dtype=np.float32))
    idx = [rng.permutation(5000)[:517], np.arange(0, 5000, 2), np.arange(40), np.r_[np.arange(300), np.arange(300)]]
    plain = make_blobs(rng, 129, D, 2, offset=1000.0, dtype=np.float32)
    arrays = [X[i] for i in idx] + [plain, np.concatenate([plain, X[idx[2]]])]
    data = [Rows(X, i) for i in idx] + [plain, Concat(plain, X[idx[2]])]
    params = [init_params(rng, A, 3, cvtype) for A in arrays]
    for _ in range(2):
        many = _models(params, D, cvtype)
        train_many(many, data, 3, 3, tol=0.0, variant="GB")  # GB: bitwise comparable (see above)
        host = _models(params, D, cvtype)
        train_many(host, arrays, 3, 3, tol=0.0, variant="GB")
        for b, (g, h, A, (w, mu, cv)) in enumerate(zip(many, host, arrays, params)):
            np.testing.assert_array_equal(g.covars, h.covars, err_msg=f"member {b}")
            assert g.loglik == h.loglik and g.n_events == len(A)
            rr = ref.em(A.astype(np.float64), w, mu, cv, cvtype, 1e-6, 3, 3, 0.0)
            check_fit(g.covars, g.means, g.weights, g.loglik, rr)


def test_rows_beside_small_plain_members(rng):
    """Rows members (gathered first) beside several small plain arrays, which are uploaded as one
    concatenated copy after the gathered rows: each member reads its own rows."""
    from asp_gmm import Rows, freeze

    D = 5
    X = freeze(make_blobs(rng, 2000, D, 2, offset=1000.0, dtype=np.float32))
    idx = [np.arange(0, 2000, 3), rng.permutation(2000)[:300]]
    plain = [make_blobs(rng, n, D, 2, offset=1000.0, dtype=np.float32) for n in (60, 200, 129)]
    arrays = [X[i] for i in idx] + plain
    params = [init_params(rng, A, 2, "diag") for A in arrays]
    many = _models(params, D, "diag")
    train_many(many, [Rows(X, i) for i in idx] + plain, 3, 3, tol=0.0, variant="GB")
    host = _models(params, D, "diag")
    train_many(host, arrays, 3, 3, tol=0.0, variant="GB")
    for b, (g, h) in enumerate(zip(many, host)):
        np.testing.assert_array_equal(g.covars, h.covars, err_msg=f"member {b}")
        assert g.loglik == h.loglik


@pytest.mark.parametrize("cvtype", ["full", "diag"])
@pytest.mark.parametrize("N, D, M", [(50, 2, 2), (517, 1, 1), (1003, 19, 3)])
def test_gmmbatch_gpu_against_reference_and_train_many(cvtype, N, D, M, rng):
    """GMMBatch (stacked parameters in and out of the GB session) against the float64 reference,
    and equal to train_many on the same members (the same kernels: bitwise)."""
    B = 7
    X = np.stack([make_blobs(rng, N, D, min(M, 4), offset=1000.0 * (b % 2), dtype=np.float32) for b in range(B)])
    params = [init_params(rng, X[b], M, cvtype) for b in range(B)]
    W, MU, CV = (np.stack([p[i] for p in params]) for i in range(3))
    batch = GMMBatch(B, M, D, means=MU, covars=CV, weights=W, cvtype=cvtype, backend="cuda")
    ll = batch.train(X, min_em_iters=3, max_em_iters=3, tol=0.0)
    assert batch.last_variant.startswith("GB") and ll.shape == (B,)
    many = _models(params, D, cvtype)
    train_many(many, X, min_em_iters=3, max_em_iters=3, tol=0.0)
    for b in range(B):  # the same kernels; GBS adds its chunks' double sums in any order
        np.testing.assert_allclose(batch.covars[b], many[b].covars, rtol=1e-6, atol=1e-6 * np.abs(many[b].covars).max())
        assert ll[b] == pytest.approx(many[b].loglik, rel=1e-9)
        if N >= 10 * D:
            rr = ref.em(X[b].astype(np.float64), W[b], MU[b], CV[b], cvtype, 1e-6, 3, 3, 0.0)
            check_fit(batch.covars[b], batch.means[b], batch.weights[b], ll[b], rr)


def test_gmmbatch_gpu_bad_member(rng):
    X = np.stack([make_blobs(rng, 300, 4, 2, dtype=np.float32) for _ in range(5)])
    X[3, 10, 2] = np.inf
    batch = GMMBatch(5, 2, 4, cvtype="diag", backend="cuda")
    with pytest.raises(BatchMemberError) as info:
        batch.train(X, max_em_iters=5)
    assert set(info.value.errors) == {3} and "X[3]" in str(info.value.errors[3])
    ok = [0, 1, 2, 4]
    assert np.isfinite(batch.loglik[ok]).all() and np.isnan(batch.means[3]).all()
    for b in ok:
        g = GMM(2, 4, cvtype="diag", backend="cuda")
        g.train(X[b], max_em_iters=5)
        np.testing.assert_allclose(batch.means[b], g.means, rtol=1e-4, atol=1e-4)


def test_gmmbatch_gpu_takes_a_torch_cuda_tensor(rng):
    """A (B, N, D) CUDA tensor is checked and copied on the device: the same results as the host
    array, bitwise; a member with NaN is named and the others are trained from the tensor."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    B, N, D, M = 9, 333, 3, 2
    X = np.stack([make_blobs(rng, N, D, 2, offset=1000.0 * (b % 3 == 0), dtype=np.float32) for b in range(B)])
    params = [init_params(rng, X[b], M, "full") for b in range(B)]
    W, MU, CV = (np.stack([p[i] for p in params]) for i in range(3))
    host = GMMBatch(B, M, D, means=MU, covars=CV, weights=W, backend="cuda")
    host.train(X, min_em_iters=4, max_em_iters=4, tol=0.0)
    dev = GMMBatch(B, M, D, means=MU, covars=CV, weights=W, backend="cuda")
    dev.train(torch.from_numpy(X).cuda(), min_em_iters=4, max_em_iters=4, tol=0.0)
    # the same kernels on the same values; sums of blocks and chunks added in any order
    np.testing.assert_allclose(dev.covars, host.covars, rtol=1e-6, atol=1e-6 * np.abs(host.covars).max())
    np.testing.assert_allclose(dev.loglik, host.loglik, rtol=1e-9)
    Xbad = X.copy()
    Xbad[4, 7, 2] = np.nan
    part = GMMBatch(B, M, D, means=MU, covars=CV, weights=W, backend="cuda")
    with pytest.raises(BatchMemberError) as info:
        part.train(torch.from_numpy(Xbad).cuda(), min_em_iters=4, max_em_iters=4, tol=0.0)
    assert set(info.value.errors) == {4} and "row 7, column 2" in str(info.value.errors[4])
    ok = [b for b in range(B) if b != 4]
    np.testing.assert_allclose(part.covars[ok], host.covars[ok], rtol=1e-6, atol=1e-6 * np.abs(host.covars).max())
    np.testing.assert_array_equal(part.covars[4], CV[4].astype(np.float32))
    # scoring a tensor: read on the host, the same as scoring the array
    np.testing.assert_allclose(host.score(torch.from_numpy(X).cuda()), host.score(X), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cvtype", ["diag", "full"])
def test_a_gpu_batch_explores_in_place_with_the_primarys_results(cvtype, rng, monkeypatch, tmp_path):
    """The in-place exploration of a batched call on the GPU: GB runs, GBS takes the second
    iteration in its own session (parameters over and back on the device's sessions), and the
    results are GB's alone at float32's tolerance."""
    from asp_gmm.batch_driver import BatchSpecializer
    from asp_gmm.selection.plan import Plan

    monkeypatch.setenv("ASP_GMM_DB", f"sqlite:///{tmp_path / 'h.sqlite'}")
    monkeypatch.setenv("ASP_GMM_AUTOTUNE", "1")
    D = 5
    data = [make_blobs(rng, n, D, 3) for n in (300, 2000, 57, 900)]
    params = [init_params(rng, X, m, cvtype) for X, m in zip(data, (3, 4, 2, 4))]
    models = [GMM(len(w), D, cvtype=cvtype, backend="cuda") for w, _, _ in params]
    spec = BatchSpecializer(models[0]._specializer)
    view = batch_support(spec.backend)
    problems = [g._problem(len(X)) for g, X in zip(models, data)]
    bp = BatchProblem.of(problems)
    cands = {c.variant.name: c for c in spec.candidates(view, bp)}
    p, c = cands["GB"], cands["GBS"]
    for cfg in (p, c):
        view.support.kernel(cfg.variant, cfg.params, bp)
    reg = [1e-6] * len(data)
    monkeypatch.setattr(spec.policy, "choose", lambda *a, **k: Plan(p, [c], "explore", predicted={c: 1.0}, banked=1.0))
    got = spec.train(data, params, problems, reg, 5, 5, 0.0)
    assert got[0].explored == [c.label]
    monkeypatch.setattr(spec.policy, "choose", lambda *a, **k: Plan(p))
    alone = spec.train(data, params, problems, reg, 5, 5, 0.0)
    for r, a in zip(got, alone):
        assert r.iters == a.iters == 5
        np.testing.assert_allclose(r.covars, a.covars, rtol=1e-4, atol=1e-4 * float(np.max(np.abs(a.covars))))
        np.testing.assert_allclose(r.means, a.means, rtol=1e-4, atol=1e-4 * float(np.max(np.abs(a.means))))
