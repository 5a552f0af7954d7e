"""The one data layer: what X is (host array, device array, chunk source) and its validation.

:func:`as_data` decides the kind once for every entry and returns a :class:`Data`; every message
about bad input names the public call that got it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import cuda_arrays
from ..errors import StreamError
from . import sources


def _finite_memo():
    """The runtime's memo of immutable arrays already checked for NaN/inf."""
    from ..runtime import default_runtime

    return default_runtime().finite_memo


def _as_dtype(dtype) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in (np.float32, np.float64):
        raise TypeError(f"dtype must be float32 or float64, got {dt}")
    return dt


def check_data(
    X, D: int | None, dtype, min_events: int = 1, name: str = "X", method: str = "train", device_checks: bool = False
) -> np.ndarray:
    """Validate and return X as a C-contiguous (N, D) array of ``dtype``; messages name ``method``
    (the public call that got X: "train", "score", "eval", "predict").

    Integer, boolean, complex or object arrays are refused (convert explicitly); float arrays of the
    other precision and non-contiguous arrays are converted (a copy). NaN and infinity are looked for
    on every call, except in an immutable array (:func:`asp_gmm.freeze`) already checked, and
    except with ``device_checks``: the CUDA backend checks X on the GPU while uploading it
    (:mod:`asp_gmm.backends.cuda.staging`) and raises :class:`~asp_gmm.errors.NonFiniteInputError`.
    """
    call = f"{method}()"
    if X is None:
        raise TypeError(f"{name} is None; pass an (N, D) float array" + ("" if method == "train" else f" to {call}"))
    arr = np.asarray(X)
    if arr.dtype.kind not in "f":
        hint = f"{name}.astype(np.{np.dtype(dtype).name})"
        who = "GMM training" if method == "train" else call
        raise TypeError(f"{name} has dtype {arr.dtype}; {who} needs floating-point data. Convert it with {hint}.")
    _check_shape(arr.shape, D, min_events, name, call)
    given = arr
    with np.errstate(over="ignore"):
        arr = np.ascontiguousarray(arr, dtype=dtype)
    if device_checks or _finite_memo().get(arr):
        return arr  # checked on the GPU; or immutable and already checked (many models, one data set)
    bad = _first_non_finite(arr)
    if bad is not None:
        if given.dtype != arr.dtype and np.isfinite(given[bad]):
            dt = np.dtype(dtype).name
            raise ValueError(
                f"{name} has values beyond the {dt} range (first at row {bad[0]}, column {bad[1]}: "
                f"{given[bad]:.3g}); scale the data or use dtype=np.float64"
            )
        raise ValueError(
            f"{name} contains NaN or infinity (first at row {bad[0]}, column {bad[1]}); "
            "remove or impute those events before " + ("training" if method == "train" else call)
        )
    _finite_memo().put(arr, True)
    return arr


def _check_shape(shape, D, min_events, name, call) -> None:
    """The shape checks of :func:`check_data` and :func:`check_device_data`; messages start with the call."""
    if len(shape) != 2:
        hint = f" For a single feature use {name}.reshape(-1, 1)." if len(shape) == 1 else ""
        raise ValueError(f"{call}: {name} must be 2-D (N events, D dimensions), got shape {tuple(shape)}.{hint}")
    if shape[0] == 0:
        need = max(min_events, 1)
        raise ValueError(f"{call}: {name} is empty (0 events); pass at least {need} event{'s' * (need != 1)}")
    if D is not None and shape[1] != D:
        raise ValueError(
            f"{call}: {name} has {shape[1]} dimensions but the model has D={D}; "
            f"pass data of shape (N, {D}) or build GMM(M, {shape[1]})"
        )
    if shape[0] < min_events:
        raise ValueError(
            f"{call}: {name} has N={shape[0]} events, fewer than the M={min_events} components; "
            "use fewer components or more data"
        )


#: Elements checked for NaN/inf at a time (no N x D temporary; ~3 ms per 10^8 float32 values).
_CHUNK = 1 << 20


def _first_non_finite(arr: np.ndarray):
    """(row, column) of the first NaN or infinity of the C-contiguous 2-D ``arr``, or ``None``.

    A chunk's minimum and maximum are finite exactly when all its values are (both propagate NaN;
    an infinity is one of them): two vectorised reductions without a boolean temporary, 3.4x
    faster than ``isfinite(...).all()`` (0.76 against 2.6 ms for 260 000 x 19 float32); the
    position is looked for only in a chunk that fails."""
    flat = arr.reshape(-1)
    starts = range(0, flat.size, _CHUNK)

    def finite(i):
        part = flat[i : i + _CHUNK]
        return not part.size or bool(np.isfinite(part.min()) and np.isfinite(part.max()))

    if len(starts) >= 4:
        from ..runtime import default_runtime

        # the chunks on the runtime's host threads (NumPy releases the GIL in a reduction): one
        # thread scanned 500 000 x 36 float32 in 13 ms on a 16-core host
        ok_chunks = default_runtime().host_map(finite, starts)
    else:
        ok_chunks = map(finite, starts)
    for i, good in zip(starts, ok_chunks):
        if good:
            continue
        ok = np.isfinite(flat[i : i + _CHUNK])
        if not ok.all():
            return divmod(i + int(np.argmin(ok)), arr.shape[1])
    return None


def check_device_data(X, D: int, dtype, min_events: int = 1, method: str = "train", check: bool = True):
    """A CUDA array (PyTorch, CuPy, ``__cuda_array_interface__``/DLPack) checked like
    :func:`check_data`, on its device, in ``dtype`` (converted there if needed). Without ``check``
    the values are not looked at here: the session's transpose checks them."""
    X = cuda_arrays.in_dtype(X, dtype)
    info = cuda_arrays.describe(X)
    _check_shape(info["shape"], D, min_events, "X", f"{method}()")
    bad = cuda_arrays.first_non_finite(X) if check else None
    if bad is not None:
        raise ValueError(
            f"X contains NaN or infinity (first at row {bad[0]}, column {bad[1]}); remove or impute "
            "those events before " + ("training" if method == "train" else f"{method}()")
        )
    return X


@dataclass
class Data:
    """The data of one call.

    Attributes
    ----------
    kind : {"host", "device", "stream"}
        A C-contiguous NumPy array, a CUDA array used where it lies, or a chunk source.
    X : ndarray, CUDA array or ChunkSource
    N : int
        Events (0 when a source does not know before reading).
    """

    kind: str
    X: object
    N: int


def as_data(
    X, backend_name: str, D: int, dtype, min_events: int = 1, method: str = "train", device_checks: bool = False
) -> Data:
    """Decide what ``X`` is for ``backend_name`` and check it: a CUDA array stays on its device for
    the CUDA backend (copied to the host for others), a chunk source (:func:`sources.is_source`)
    is streamed, anything else is a host array checked by :func:`check_data`. ``device_checks``:
    the backend looks for NaN/inf itself (the CUDA backend, while uploading), so no host pass."""
    if cuda_arrays.is_cuda_array(X) and backend_name == "cuda":
        X = check_device_data(X, D, dtype, min_events, method, check=not device_checks)
        return Data("device", X, cuda_arrays.describe(X)["shape"][0])
    if method == "train" and sources.is_source(X):
        src = sources.as_source(X)
        if src.n_features is not None and src.n_features != D:
            raise StreamError(
                f"X has {src.n_features} dimensions but the model has D={D}; pass data of shape "
                f"(N, {D}) or build GMM(M, {src.n_features})"
            )
        return Data("stream", src, src.n_rows or 0)
    if cuda_arrays.is_cuda_array(X):  # another backend than CUDA: its data lives on the host
        X = cuda_arrays.to_host(X)
    X = check_data(X, D, dtype, min_events, method=method, device_checks=device_checks)
    return Data("host", X, X.shape[0])
