"""Identity of data that cannot change: lets the Face skip re-validating, and the CUDA backend skip
re-uploading, an immutable array it has seen before.

An array counts as frozen only when nothing can write its memory any more: it and every array it is a
view of are read-only (``flags.writeable == False``) and the chain ends in a ``bytes`` object, which
Python never changes (numpy refuses to make such an array writeable again). A read-only array whose
memory numpy owns does *not* count: its owner may set ``writeable = True`` again, write (a NaN, new
data), and freeze it back, and nothing would tell; trusting it served stale data and hid NaN.
:func:`freeze` makes the immutable copy of a data set that is scored or trained on many times.

The identity is ``(weakref, address, shape, dtype)``; a dead weak reference means another array now
lives at that address. Never ``hash()`` or ``id()`` alone: both outlive the object they named.
"""

from __future__ import annotations

import collections
import threading
import weakref

import numpy as np
from numpy.typing import ArrayLike, DTypeLike  # noqa: F401  (annotations)


def identity(X: np.ndarray):
    """``(weakref to X, (address, shape, dtype))`` when X is frozen (immutable), else ``None``."""
    a = X
    while isinstance(a, np.ndarray):
        if a.flags.writeable:
            return None
        a = a.base
    if not isinstance(a, bytes):
        return None  # memory someone can still write: numpy's own (writeable may be set again),
        # an mmap, another library's buffer
    try:
        ref = weakref.ref(X)
    except TypeError:
        return None
    return ref, (X.__array_interface__["data"][0], X.shape, X.dtype.str)


def freeze(X: "ArrayLike", dtype: "DTypeLike | None" = None) -> np.ndarray:
    """An immutable, C-contiguous copy of ``X`` (converted to ``dtype`` when given): X itself when it
    is already one.

    Pass it to ``train``/``score`` of many models: it is checked for NaN and infinity once, and on the
    GPU uploaded once and kept there. Nothing, its creator included, can change its values (numpy
    refuses ``writeable = True``); to change the data, freeze a new copy.

    Examples
    --------
    >>> import numpy as np
    >>> from asp_gmm import freeze
    >>> Xf = freeze(np.ones((4, 2)), dtype=np.float32)
    >>> Xf.dtype, Xf.flags.writeable
    (dtype('float32'), False)
    >>> freeze(Xf) is Xf
    True
    """
    arr = np.asarray(X)
    dt = arr.dtype if dtype is None else np.dtype(dtype)
    if arr.dtype == dt and arr.flags.c_contiguous and identity(arr) is not None:
        return arr
    src = np.ascontiguousarray(arr, dtype=dt)
    return np.frombuffer(src.tobytes(), dtype=dt).reshape(src.shape)


class Memo:
    """A small LRU of facts about frozen arrays (``key -> value``, ``key`` from :func:`identity`)."""

    def __init__(self, size: int = 64):
        self._size = size
        self._d: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, X: np.ndarray, default=None):
        ident = identity(X)
        if ident is None:
            return default
        with self._lock:
            hit = self._d.get(ident[1])
            if hit is None or hit[0]() is not X:
                return default
            self._d.move_to_end(ident[1])
            return hit[1]

    def put(self, X: np.ndarray, value) -> None:
        ident = identity(X)
        if ident is None:
            return
        with self._lock:
            self._d[ident[1]] = (ident[0], value)
            self._d.move_to_end(ident[1])
            while len(self._d) > self._size:
                self._d.popitem(last=False)
