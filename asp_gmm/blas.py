"""One BLAS thread for a block of work (threadpoolctl), shared by the Face and the backends.

The first call of a threaded BLAS starts its threads, which on a busy machine costs more than a small
product (0.4-1.5 s against 0.07-0.19 s for the data covariance of 100 000 x 19 events); the C
backend's Python-threaded components also want one BLAS thread each.

The loaded BLAS libraries are found once per process (a ``threadpoolctl.ThreadpoolController``):
``threadpool_limits`` walks every shared object of the process and reads files on each use, 0.8 ms,
which made seeding a batch of 32 small models a third slower.
"""

from __future__ import annotations

import contextlib
import threading

_CONTROLLER = None
_LOCK = threading.Lock()


def _controller():
    global _CONTROLLER
    if _CONTROLLER is None:
        with _LOCK:
            if _CONTROLLER is None:
                from threadpoolctl import ThreadpoolController

                _CONTROLLER = ThreadpoolController()
    return _CONTROLLER


def one_blas_thread():
    """A context in which BLAS runs on one thread (a no-op without threadpoolctl)."""
    try:
        ctl = _controller()
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        return contextlib.nullcontext()
    return ctl.limit(limits=1, user_api="blas")
