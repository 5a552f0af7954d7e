"""asp_gmm.frozen: which arrays count as unchangeable, the memo keyed by them, and freeze()."""

import numpy as np
import pytest

import asp_gmm
from asp_gmm import GMM, frozen
from asp_gmm.gmm import check_data


def test_only_immutable_chains_are_frozen():
    a = np.arange(12.0).reshape(4, 3).copy()  # owns its memory
    assert frozen.identity(a) is None
    a.flags.writeable = False
    assert frozen.identity(a) is None  # read-only, but its owner can make it writeable again
    v = a[1:]
    assert frozen.identity(v) is None
    b = np.frombuffer(b"\x00" * 96, dtype=np.float64).reshape(4, 3)
    assert frozen.identity(b) is not None  # bytes cannot change
    assert frozen.identity(b[1:]) is not None and frozen.identity(b[1:])[1] != frozen.identity(b)[1]
    with pytest.raises(ValueError):
        b.flags.writeable = True


def test_freeze_makes_an_immutable_copy_once():
    X = np.arange(12.0).reshape(6, 2)
    F = asp_gmm.freeze(X, np.float32)
    assert F.dtype == np.float32 and F.flags.c_contiguous and frozen.identity(F) is not None
    np.testing.assert_array_equal(F, X.astype(np.float32))
    for arr in (F, F.base):
        with pytest.raises(ValueError):
            arr.flags.writeable = True
    X[0, 0] = 99.0  # a copy: the original stays the owner's
    assert F[0, 0] == 0.0
    assert asp_gmm.freeze(F) is F and asp_gmm.freeze(F, np.float32) is F
    assert asp_gmm.freeze(F, np.float64).dtype == np.float64


def test_memo_forgets_dead_arrays_and_changeable_ones():
    m = frozen.Memo(size=2)
    a = np.ones(5)
    m.put(a, 1)
    assert m.get(a) is None  # writeable: never remembered
    a.flags.writeable = False
    m.put(a, 1)
    assert m.get(a) is None  # read-only but changeable: never remembered either
    f = asp_gmm.freeze(a)
    m.put(f, 1)
    assert m.get(f) == 1
    key = frozen.identity(f)[1]
    del f
    c = asp_gmm.freeze(np.ones(5))
    if frozen.identity(c)[1] == key:  # same address reused: the dead weakref tells
        assert m.get(c) is None
    for i in range(3):
        m.put(asp_gmm.freeze(np.full(3, float(i))), i)
    assert len(m._d) <= 2


def test_check_data_still_refuses_nan_in_read_only_data():
    X = np.ones((10, 2))
    X[3, 1] = np.nan
    X.flags.writeable = False
    for data in (X, asp_gmm.freeze(X)):
        for _ in range(2):
            with pytest.raises(ValueError, match=r"NaN or infinity \(first at row 3, column 1\)"):
                check_data(data, 2, np.float64)
    Y = asp_gmm.freeze(np.ones((10, 2)))
    assert check_data(Y, 2, np.float64) is Y
    assert check_data(Y, 2, np.float64) is Y  # the memoised path returns the same array


def test_a_read_only_array_its_owner_changed_is_checked_again():
    """The owner of read-only data makes it writeable, writes a NaN and freezes it again: the next
    call names the NaN (not a collapsed component or zero variance)."""
    X = np.random.default_rng(0).standard_normal((300, 3))
    X.flags.writeable = False
    g = GMM(2, 3, backend="c", dtype=np.float64, seed=0)
    g.train(X, max_em_iters=2)
    g.score(X)
    X.flags.writeable = True
    X[7, 2] = np.nan
    X.flags.writeable = False
    for call, name in ((g.score, "score()"), (g.predict, "predict()"), (g.eval, "eval()"), (g.train, "training")):
        with pytest.raises(ValueError, match=rf"NaN or infinity \(first at row 7, column 2\).*before {name}"):
            call(X)


def test_immutable_data_is_checked_once(monkeypatch):
    calls = []
    from asp_gmm.fit import data

    real = data._first_non_finite
    monkeypatch.setattr(data, "_first_non_finite", lambda a: calls.append(1) or real(a))
    F = asp_gmm.freeze(np.random.default_rng(1).standard_normal((200, 2)))
    g = GMM(2, 2, backend="c", dtype=np.float64, seed=0)
    g.train(F, max_em_iters=1)
    for _ in range(3):
        g.score(F)
    assert len(calls) == 1
    R = np.array(F)
    R.flags.writeable = False
    for _ in range(3):
        g.score(R)
    assert len(calls) == 4


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_the_first_non_finite_value_is_found_in_any_chunk(dtype, bad, monkeypatch):
    """The chunks' minimum and maximum find NaN and both infinities; the position is the first one,
    in the first chunk, a middle one, the last (partial) chunk, across chunk edges."""
    from asp_gmm.fit import data

    monkeypatch.setattr(data, "_CHUNK", 1000)
    rng = np.random.default_rng(3)
    X = rng.standard_normal((2003, 7)).astype(dtype)
    assert data._first_non_finite(X) is None
    for flat in (0, 999, 1000, 6999, 7003, 14020):
        Y = X.copy()
        Y.reshape(-1)[flat] = bad
        Y.reshape(-1)[min(flat + 1500, Y.size - 1)] = np.nan  # a later one is not reported
        assert data._first_non_finite(Y) == divmod(flat, 7)
        with pytest.raises(ValueError, match=f"row {flat // 7}, column {flat % 7}"):
            check_data(Y, 7, dtype)


def test_an_immutable_arrays_seeding_moments_are_computed_once(monkeypatch):
    """Seeding a model reads the data's (co)variance: kept for a frozen array (per covariance type),
    computed on every call for an array that can change."""
    from asp_gmm.fit import seed

    calls = []
    real = seed.host_moments
    monkeypatch.setattr(seed, "host_moments", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    X = np.random.default_rng(2).standard_normal((300, 3)) + 1000
    F = asp_gmm.freeze(X)
    fits = []
    for cv in ("diag", "diag", "full", "full", "diag"):
        g = GMM(2, 3, cvtype=cv, backend="c", dtype=np.float64, seed=0)
        g.train(F, max_em_iters=2)
        fits.append((cv, g.covars.copy()))
    assert calls == ["diag", "full"]
    for cv, cov in fits:
        g = GMM(2, 3, cvtype=cv, backend="c", dtype=np.float64, seed=0)
        g.train(X, max_em_iters=2)  # the writable original: computed, and the same
        np.testing.assert_allclose(g.covars, cov, rtol=1e-10)
    assert calls == ["diag", "full"] + [cv for cv, _ in fits]


@pytest.mark.parametrize("blas_threads", [0, 64])
@pytest.mark.parametrize("cvtype", ["diag", "full"])
def test_the_seeding_moments_of_a_large_array_match_float64_on_both_sum_paths(blas_threads, cvtype, monkeypatch):
    """host_moments on the host threads (blocks of float64 scratch, column sums by BLAS or by NumPy's
    reduction) against NumPy's float64 covariance, at an offset that costs float32 its digits."""
    from asp_gmm.fit import seed

    monkeypatch.setattr(seed, "BLAS_SUM_THREADS", blas_threads)
    monkeypatch.setattr(seed, "HOST_BLOCK_BYTES", 1 << 16)  # blocks of 1170 rows: 35 blocks
    X = (np.random.default_rng(5).standard_normal((40_003, 7)) * [1, 2, 3, 4, 5, 6, 0.5] + 1000).astype(np.float32)
    assert len(range(0, len(X), seed._block_rows(7))) >= 4  # (the threaded path)
    var, cov = seed.host_moments(X, cvtype)
    ref = np.cov(X.astype(np.float64).T, bias=True)
    np.testing.assert_allclose(var, np.diag(ref), rtol=1e-12)
    np.testing.assert_allclose(cov, ref if cvtype == "full" else np.diag(ref), rtol=1e-12, atol=1e-12)
