"""asp_gmm.frozen: which arrays count as unchangeable, and the memo keyed by them."""
import numpy as np

from asp_gmm import frozen
from asp_gmm.gmm import check_data


def test_only_fully_read_only_chains_are_frozen():
    a = np.arange(12.0).reshape(4, 3).copy()   # owns its memory
    assert frozen.identity(a) is None
    v = a[1:]
    v.flags.writeable = False
    assert frozen.identity(v) is None          # its base can still be written
    a.flags.writeable = False
    assert frozen.identity(v) is not None and frozen.identity(a) is not None
    assert frozen.identity(v)[1] != frozen.identity(a)[1]
    b = np.frombuffer(b"\x00" * 64, dtype=np.float64)
    assert frozen.identity(b) is not None     # bytes cannot change


def test_memo_forgets_dead_arrays_and_writeable_ones():
    m = frozen.Memo(size=2)
    a = np.ones(5)
    m.put(a, 1)
    assert m.get(a) is None                    # writeable: never remembered
    a.flags.writeable = False
    m.put(a, 1)
    assert m.get(a) == 1
    key = frozen.identity(a)[1]
    del a
    c = np.ones(5)
    c.flags.writeable = False
    if frozen.identity(c)[1] == key:           # same address reused: the dead weakref tells
        assert m.get(c) is None
    for i in range(3):
        x = np.full(3, float(i))
        x.flags.writeable = False
        m.put(x, i)
    assert len(m._d) == 2


def test_check_data_still_refuses_nan_in_read_only_data():
    X = np.ones((10, 2))
    X[3, 1] = np.nan
    X.flags.writeable = False
    for _ in range(2):
        try:
            check_data(X, 2, np.float64)
        except ValueError as exc:
            assert "NaN" in str(exc)
        else:
            raise AssertionError("NaN accepted")
    Y = np.ones((10, 2))
    Y.flags.writeable = False
    assert check_data(Y, 2, np.float64) is Y
    assert check_data(Y, 2, np.float64) is Y  # the memoised path returns the same array
