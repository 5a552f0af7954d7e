"""The drop-in's array API convention: results in the input's namespace and on its device.

scikit-learn estimators that support the `array API standard <https://data-apis.org/array-api/>`_
follow ``sklearn.set_config(array_api_dispatch=True)``: given PyTorch, CuPy or ``array_api_strict``
arrays they return arrays of that library on that device. :class:`asp_gmm.GaussianMixture` does the
same through :func:`follows_input_namespace`, which wraps its public methods:

* on entry, X (and the fitted attributes and ``*_init`` parameters, when they are arrays of another
  library) are moved to NumPy on the host (zero-copy through DLPack where the producer allows); the
  method then runs exactly as it does for NumPy input (dispatch is off inside it), the compiled EM
  included;
* on exit, the method's arrays (posteriors, labels, per-event scores, samples) and, after a fit, the
  fitted attributes (``weights_``, ``means_``, ``covariances_``, ``precisions_``,
  ``precisions_cholesky_``) are moved to X's namespace and device; scalars (``score``, ``bic``,
  ``aic``) stay Python floats, and the ``*_init`` parameters are left as given.

Without ``array_api_dispatch`` nothing changes, except that any CPU DLPack producer (an object with
``__dlpack__`` and a CPU ``__dlpack_device__``, NumPy itself included) is accepted as X and read
without a copy. Where scikit-learn raises NotImplementedError (its "kmeans" and "k-means++"
initialisation under array API dispatch), the drop-in runs its own k-means on the host copy, so those
fits work.

Nothing here depends on which library the arrays come from: the namespace and device are those
scikit-learn finds (:func:`sklearn.utils._array_api.get_namespace_and_device`), and arrays move with
its ``move_to`` (DLPack, else the library's own host copy).
"""

from __future__ import annotations

import functools
import threading

import numpy as np

#: Fitted attributes that follow X's namespace and device after a fit.
FITTED = ("weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_")
#: Parameters that may be given as arrays of any namespace (moved to NumPy for the call only).
INITS = ("weights_init", "means_init", "precisions_init")
_KDL_CPU = 1
_depth = threading.local()


def dispatch_enabled() -> bool:
    """Whether scikit-learn's ``array_api_dispatch`` is on (False without scikit-learn)."""
    try:
        from sklearn import get_config
    except ImportError:  # pragma: no cover - the drop-in needs scikit-learn
        return False
    return bool(get_config().get("array_api_dispatch", False))


def _foreign(a) -> bool:
    """An array of another library than NumPy (not None, not a NumPy array or scalar)."""
    return a is not None and not isinstance(a, (np.ndarray, np.generic, list, tuple, str, int, float))


def is_cpu_dlpack(X) -> bool:
    """A DLPack producer on the CPU that NumPy can read without a copy (not an ndarray)."""
    if isinstance(X, np.ndarray) or not hasattr(X, "__dlpack__"):
        return False
    dev = getattr(X, "__dlpack_device__", None)
    try:
        return dev is not None and int(dev()[0]) == _KDL_CPU
    except Exception:  # noqa: BLE001 - a producer that cannot say is not read this way
        return False


def namespace_and_device(*arrays):
    """``(xp, device)`` of the first foreign array (scikit-learn's view of it), or ``None`` when
    every array is NumPy (or None)."""
    foreign = [a for a in arrays if _foreign(a)]
    if not foreign:
        return None
    try:
        from sklearn.utils._array_api import get_namespace_and_device

        xp, _, device = get_namespace_and_device(foreign[0])
        return xp, device
    except Exception:  # noqa: BLE001 - an older scikit-learn: the array's own namespace
        xp = foreign[0].__array_namespace__()
        return xp, getattr(foreign[0], "device", None)


def to_numpy(a):
    """``a`` as a NumPy array on the host (NumPy arrays and None unchanged)."""
    if a is None or isinstance(a, np.ndarray):
        return a
    if is_cpu_dlpack(a) and not hasattr(a, "__array_namespace__"):
        return np.from_dlpack(a)
    try:
        from sklearn.utils._array_api import move_to

        return move_to(a, xp=np, device="cpu")
    except ImportError:  # pragma: no cover - older scikit-learn
        return np.from_dlpack(a)
    except Exception:  # noqa: BLE001 - a producer DLPack cannot read: its own host copy
        return np.asarray(a)


def from_numpy(a, xp, device):
    """The NumPy array ``a`` as an array of namespace ``xp`` on ``device`` (scalars unchanged)."""
    if not isinstance(a, np.ndarray):
        return a
    try:
        from sklearn.utils._array_api import move_to

        return move_to(a, xp=xp, device=device)
    except ImportError:  # pragma: no cover - older scikit-learn
        return xp.asarray(a, device=device)


def follows_input_namespace(fits: bool = False, of_fitted: bool = False):
    """Decorate a public method ``method(self, X, ...)`` of the drop-in (see the module docstring).

    ``fits``: the method fits (its fitted attributes follow X afterwards). ``of_fitted``: the
    method takes no X (``sample``): results follow the fitted attributes' namespace."""

    def wrap(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            if getattr(_depth, "on", False):  # a public method called by another: already moved
                return method(self, *args, **kwargs)
            X = None if of_fitted or not args else args[0]
            state = self.__dict__
            attrs = {k: state[k] for k in FITTED + INITS if _foreign(state.get(k))}
            host_dlpack = X is not None and is_cpu_dlpack(X) and not hasattr(X, "__array_namespace__")
            if not attrs and not host_dlpack and (X is None or isinstance(X, np.ndarray) or not dispatch_enabled()):
                return method(self, *args, **kwargs)  # the NumPy path: nothing to move
            target = None
            if dispatch_enabled():
                target = namespace_and_device(*(state.get(k) for k in FITTED)) if of_fitted else namespace_and_device(X)
            if X is not None and _foreign(X):
                args = (to_numpy(X),) + tuple(args[1:])
            for k, v in attrs.items():
                state[k] = to_numpy(v)
            _depth.on = True
            try:
                if target is not None:  # the NumPy path exactly (scikit-learn's helpers too)
                    from sklearn import config_context

                    with config_context(array_api_dispatch=False):
                        out = method(self, *args, **kwargs)
                else:
                    out = method(self, *args, **kwargs)
            except BaseException:
                state.update(attrs)  # the model as it was
                raise
            finally:
                _depth.on = False
            for k in INITS:  # the parameters stay as the user gave them
                if k in attrs:
                    state[k] = attrs[k]
            if not fits:
                for k in FITTED:
                    if k in attrs:
                        state[k] = attrs[k]
            if target is None:
                return out
            xp, device = target
            if fits:
                for k in FITTED:
                    if isinstance(state.get(k), np.ndarray):
                        state[k] = from_numpy(state[k], xp, device)
            if isinstance(out, tuple):
                return tuple(from_numpy(o, xp, device) for o in out)
            if isinstance(out, np.floating):
                return float(out)  # scores are Python floats under dispatch, as scikit-learn's
            return from_numpy(out, xp, device)

        return call

    return wrap
