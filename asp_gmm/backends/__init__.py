"""Backends: one module per runtime behind :class:`asp_gmm.backends.base.Backend`.

Optional runtimes (pycuda) are imported only when asked for, so the package imports without them.
"""
from __future__ import annotations

import importlib
import threading

from ..errors import BackendUnavailableError

#: name -> (module, class). Order of preference for backend="auto".
_BACKENDS = {
    "cuda": ("asp_gmm.backends.cuda", "CudaBackend"),
    "c": ("asp_gmm.backends.c", "CBackend"),
    "numpy": ("asp_gmm.backends.numpy_ref", "NumpyBackend"),
}
_instances: dict = {}
_lock = threading.Lock()


def backend_class(name: str):
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {['auto', *_BACKENDS]}")
    mod, cls = _BACKENDS[name]
    try:
        return getattr(importlib.import_module(mod), cls)
    except ImportError as exc:
        raise BackendUnavailableError(f"backend {name!r} cannot be imported: {exc}") from exc


def unavailable_reason(name: str):
    """``None`` when backend ``name`` can run here, else the reason."""
    try:
        return backend_class(name).unavailable_reason()
    except BackendUnavailableError as exc:
        return str(exc)


def available() -> list:
    """Names of the backends that can run here, best first."""
    return [n for n in _BACKENDS if unavailable_reason(n) is None]


def get_backend(name: str = "auto"):
    """The (process-wide) backend instance for ``name``; "auto" picks cuda, then c, then numpy."""
    if name == "auto":
        for n in _BACKENDS:
            if unavailable_reason(n) is None:
                return get_backend(n)
        raise BackendUnavailableError("no backend can run here")  # pragma: no cover - numpy always can
    inst = _instances.get(name)
    if inst is None:
        with _lock:
            inst = _instances.get(name)
            if inst is None:
                reason = unavailable_reason(name)
                if reason:
                    raise BackendUnavailableError(f"backend {name!r} is not available: {reason}")
                inst = _instances[name] = backend_class(name)()
    return inst
