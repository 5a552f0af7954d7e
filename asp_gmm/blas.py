"""One BLAS thread for a block of work (threadpoolctl), shared by the Face and the backends.

The first call of a threaded BLAS starts its threads, which on a busy machine costs more than a small
product (0.4-1.5 s against 0.07-0.19 s for the data covariance of 100 000 x 19 events); the C
backend's Python-threaded components also want one BLAS thread each.
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def one_blas_thread():
    """Run the block with BLAS limited to one thread (a no-op without threadpoolctl)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        yield
        return
    with threadpool_limits(1, user_api="blas"):
        yield
