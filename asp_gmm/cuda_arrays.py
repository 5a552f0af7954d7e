"""CUDA arrays (PyTorch tensors, CuPy arrays, anything with ``__cuda_array_interface__`` or a CUDA
``__dlpack__``) as training data: used where they lie by the CUDA backend, copied to the host for the
others. Parameters always come back as NumPy arrays.

Only what the Face needs: recognise such arrays, describe them (device pointer, shape, dtype), check
them for NaN and infinity and compute the seeding statistics on the device with the array's own
library (PyTorch or CuPy; other producers are read back to the host in row chunks for that), and copy
them to the host when the backend is not CUDA.
"""

from __future__ import annotations

import importlib

import numpy as np

from .errors import ASPGMMError

_KDL_CUDA = (2, 13)  # DLPack device types: kDLCUDA, kDLCUDAManaged


class CudaArrayError(ASPGMMError, ValueError):
    """A CUDA array that cannot be trained on as it is (layout, type); the message says what to do."""


def is_cuda_array(X) -> bool:
    """Whether X is a CUDA array (``__cuda_array_interface__``, or a DLPack producer on a CUDA device)."""
    if isinstance(X, np.ndarray):
        return False
    if hasattr(X, "__cuda_array_interface__"):
        return True
    dev = getattr(X, "__dlpack_device__", None)
    if dev is not None:
        try:
            return int(dev()[0]) in _KDL_CUDA
        except Exception:  # noqa: BLE001 - a producer that cannot say: not ours
            return False
    return False


def _lib(X) -> str:
    return type(X).__module__.split(".")[0]


def as_interface(X):
    """An object with ``__cuda_array_interface__`` for X (X itself, or a CuPy/PyTorch view of a
    DLPack producer); raises :class:`CudaArrayError` when neither library is there to view it."""
    if hasattr(X, "__cuda_array_interface__"):
        return X
    for mod in ("cupy", "torch"):
        try:
            lib = importlib.import_module(mod)
        except ImportError:
            continue
        return lib.from_dlpack(X)
    raise CudaArrayError(
        f"{type(X).__name__} is a DLPack CUDA array but neither CuPy nor PyTorch is installed to "
        "view it; pass a CuPy array or a PyTorch tensor"
    )


def describe(X) -> dict:
    """``{"ptr", "shape", "dtype", "contiguous"}`` of a CUDA array (its ``__cuda_array_interface__``)."""
    iface = as_interface(X).__cuda_array_interface__
    shape = tuple(int(s) for s in iface["shape"])
    dtype = np.dtype(iface["typestr"])
    strides = iface.get("strides")
    contiguous = strides is None or tuple(strides) == tuple(
        int(np.prod(shape[i + 1 :], dtype=np.int64)) * dtype.itemsize for i in range(len(shape))
    )
    return {"ptr": int(iface["data"][0]), "shape": shape, "dtype": dtype, "contiguous": contiguous}


def to_host(X) -> np.ndarray:
    """A NumPy copy of the CUDA array X."""
    X = as_interface(X)
    lib = _lib(X)
    if lib == "torch":
        return X.detach().cpu().numpy()
    if hasattr(X, "get"):  # CuPy, numba device arrays
        return X.get() if lib == "cupy" else X.copy_to_host()
    if hasattr(X, "copy_to_host"):
        return X.copy_to_host()
    raise CudaArrayError(f"cannot copy a {type(X).__name__} to the host; pass a CuPy array or a PyTorch tensor")


def in_dtype(X, dtype):
    """X in ``dtype`` and C-contiguous, on its device (the same object when it already is)."""
    X = as_interface(X)
    info = describe(X)
    dtype = np.dtype(dtype)
    if info["dtype"] == dtype and info["contiguous"]:
        return X
    lib = _lib(X)
    if lib == "torch":
        import torch

        return X.to(getattr(torch, dtype.name)).contiguous()
    if lib == "cupy":
        import cupy

        return cupy.ascontiguousarray(X, dtype=dtype)
    raise CudaArrayError(
        f"the CUDA array has dtype {info['dtype']}{'' if info['contiguous'] else ', not C-contiguous'}"
        f"; pass a C-contiguous {dtype.name} array"
    )


def _row_chunks(X, rows=1 << 20):
    """Row chunks of X as float64 arrays of its own library (torch/cupy), or NumPy after a copy."""
    lib = _lib(X)
    n = describe(X)["shape"][0]
    for a in range(0, n, rows):
        part = X[a : a + rows]
        if lib == "torch":
            yield part.double()
        elif lib == "cupy":
            yield part.astype("float64")
        else:
            yield to_host(part).astype(np.float64)


def first_non_finite(X):
    """(row, column) of X's first NaN or infinity, or ``None``, checked on the device (PyTorch,
    CuPy) or in host chunks (other producers)."""
    X = as_interface(X)
    lib = _lib(X)
    start = 0
    for part in _row_chunks(X):
        if lib == "torch":
            import torch

            bad = (~torch.isfinite(part)).reshape(-1)
            flat = int(torch.argmax(bad.to(torch.uint8))) if bool(bad.any()) else None
        else:
            xp = importlib.import_module("cupy") if lib == "cupy" else np
            bad = (~xp.isfinite(part)).reshape(-1)
            flat = int(xp.argmax(bad)) if bool(bad.any()) else None
        if flat is not None:
            r, c = divmod(flat, int(part.shape[1]))
            return r + start, c
        start += int(part.shape[0])
    return None


def finite_members(X) -> np.ndarray:
    """Per member of the (B, N, D) CUDA array X, whether all its values are finite: ``(B,)`` bool
    on the host, computed on the device (PyTorch, CuPy) or from a host copy (other producers)."""
    X = as_interface(X)
    lib = _lib(X)
    B = int(describe(X)["shape"][0])
    if lib == "torch":
        import torch

        return torch.isfinite(X).reshape(B, -1).all(dim=1).cpu().numpy()
    if lib == "cupy":
        import cupy

        return cupy.isfinite(X).reshape(B, -1).all(axis=1).get()
    return np.isfinite(to_host(X)).reshape(B, -1).all(axis=1)


def seed_stats(X, cvtype: str):
    """``(n, mean (D,), covariance (D, D) or variances (D,))`` of X in float64, on the device in
    row chunks (sums centred on the first row)."""
    X = as_interface(X)
    shift = None
    n, s1, s2 = 0, 0.0, 0.0
    for part in _row_chunks(X):
        if shift is None:
            shift = part[0].clone() if _lib(X) == "torch" else part[0].copy()
        y = part - shift
        s1 = s1 + y.sum(0)
        s2 = s2 + ((y.T @ y) if cvtype == "full" else (y * y).sum(0))
        n += int(part.shape[0])
    s1, s2, shift = (to_host(v) if is_cuda_array(v) else np.asarray(v) for v in (s1, s2, shift))
    m1 = s1 / n
    cov = s2 / n - (np.outer(m1, m1) if cvtype == "full" else m1 * m1)
    return n, m1 + shift, cov


def rows(X, index) -> np.ndarray:
    """Rows ``index`` ((k,) int, sorted) of X as a NumPy array."""
    X = as_interface(X)
    lib = _lib(X)
    if lib == "torch":
        import torch

        return X[torch.as_tensor(np.asarray(index), device=X.device)].detach().cpu().numpy()
    if lib == "cupy":
        import cupy

        return X[cupy.asarray(np.asarray(index))].get()
    return np.stack([to_host(X[int(i) : int(i) + 1])[0] for i in index])
