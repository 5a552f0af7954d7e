"""Backends: one module per runtime behind :class:`asp_gmm.backends.base.Backend`.

Optional runtimes (pycuda) are imported only when asked for, so the package imports without them.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import warnings

from ..errors import BackendUnavailableError
from ..runtime import default_runtime

log = logging.getLogger("asp_gmm")

#: name -> (module, class). Order of preference for backend="auto".
_BACKENDS = {
    "cuda": ("asp_gmm.backends.cuda", "CudaBackend"),
    "c": ("asp_gmm.backends.c", "CBackend"),
    "numpy": ("asp_gmm.backends.numpy_ref", "NumpyBackend"),
}


def backend_class(name: str):
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {['auto', *_BACKENDS]}")
    mod, cls = _BACKENDS[name]
    try:
        return getattr(importlib.import_module(mod), cls)
    except ImportError as exc:
        raise BackendUnavailableError(f"backend {name!r} cannot be imported: {exc}") from exc


#: backend -> the module it cannot run without: where that is not installed, the backend's own
#: package is not imported to find it out (the CUDA package is 25-90 ms of a CPU process's start)
_NEEDS = {"cuda": "pycuda"}


def _installed(module: str) -> bool:
    """Whether ``module`` is imported or importable, without importing it."""
    if module in sys.modules:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def unavailable_reason(name: str):
    """``None`` when backend ``name`` can run here, else the reason."""
    need = _NEEDS.get(name)
    if need is not None and not _installed(need):
        return f"{need} is not installed (No module named {need!r}); pip install {need}"
    try:
        return backend_class(name).unavailable_reason()
    except BackendUnavailableError as exc:
        return str(exc)


def available() -> list:
    """Names of the backends that can run here, best first."""
    return [n for n in _BACKENDS if unavailable_reason(n) is None]


def get_backend(name: str = "auto", runtime=None):
    """The backend instance for ``name`` (one per runtime, by default the process's
    :func:`~asp_gmm.runtime.default_runtime`); "auto" picks cuda, then c, then numpy."""
    rt = runtime or default_runtime()
    if name == "auto":
        for n in _BACKENDS:
            if unavailable_reason(n) is None:
                note_auto_choice(n, rt)
                return get_backend(n, rt)
        raise BackendUnavailableError("no backend can run here")  # pragma: no cover - numpy always can
    inst = rt.backends.get(name)
    if inst is None:
        with rt.lock:
            inst = rt.backends.get(name)
            if inst is None:
                reason = unavailable_reason(name)
                if reason:
                    raise BackendUnavailableError(f"backend {name!r} is not available: {reason}")
                inst = rt.backends[name] = backend_class(name)()
    return inst


def note_auto_choice(name: str, runtime=None) -> None:
    """Called with the backend ``backend="auto"`` settled on: when that is the NumPy reference because
    no C compiler was found, say so once per runtime (a RuntimeWarning and the log), with the fix."""
    rt = runtime or default_runtime()
    if name != "numpy" or rt.warned_slow:
        return
    reason = unavailable_reason("c")
    if reason is None:
        return
    rt.warned_slow = True
    msg = (
        f"asp_gmm: backend='auto' is running the NumPy reference backend, which is slow (no compiled code), "
        f"because {reason}. Pass backend='numpy' to choose it deliberately."
    )
    log.warning(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=4)
