"""Identity of data that cannot change: lets the Face skip re-validating, and the CUDA backend skip
re-uploading, a read-only array it has seen before.

An array counts as frozen when it and every array it is a view of are read-only
(``flags.writeable == False``) and the chain ends in memory numpy owns or in ``bytes``. Its identity is
``(weakref, address, shape, dtype)``; a dead weak reference means another array now lives at that
address. Never ``hash()`` or ``id()`` alone: both outlive the object they named.
"""
from __future__ import annotations

import collections
import threading
import weakref

import numpy as np


def identity(X: np.ndarray):
    """``(weakref to X, (address, shape, dtype))`` when X is frozen, else ``None``."""
    a = X
    while isinstance(a, np.ndarray):
        if a.flags.writeable:
            return None
        a = a.base
    if a is not None and not isinstance(a, bytes):
        return None     # a buffer we cannot see into (mmap, another library's memory)
    try:
        ref = weakref.ref(X)
    except TypeError:
        return None
    return ref, (X.__array_interface__["data"][0], X.shape, X.dtype.str)


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
