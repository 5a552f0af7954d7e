"""Chunk sources: what a streamed fit reads, one chunk at a time, and the fixed-size blocks it is
cut into (see :mod:`asp_gmm.streaming` for what a source may be and the settings).

Every pass reads the source once. Rows are copied into blocks of a fixed size chosen by the
backend, so the result does not depend on how the source cuts its chunks. Sample weights travel as
a second source aligned with the rows (:func:`as_weights`): an (N,) array, or a source of (n_i,)
chunks; :func:`blocks` cuts both into the same blocks.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from .. import config, cuda_arrays
from ..errors import SettingError, StreamError
from ..problem import Problem

log = logging.getLogger("asp_gmm")

#: Sessions smaller than this are never streamed unless ASP_GMM_DEVICE_BUDGET is set.
_NEVER_STREAM_BYTES = 64 << 20

#: Libraries whose arrays live in memory (never streamed because of their type).
_IN_MEMORY_LIBS = ("numpy", "torch", "cupy", "jax", "jaxlib", "dask", "scipy", "pandas", "polars", "pyarrow", "sparse")


# ------------------------------------------------------------------------------ settings
_ATTR = {
    "ASP_GMM_DEVICE_BUDGET": "device_budget",
    "ASP_GMM_MEMORY_FRACTION": "memory_fraction",
    "ASP_GMM_BLOCK_BYTES": "block_bytes",
    "ASP_GMM_CHUNK_BYTES": "chunk_bytes",
    "ASP_GMM_PROGRESS": "progress",
}


def _setting(name: str) -> str:
    """The raw value of one of the streaming settings (asp_gmm/config.py reads the environment)."""
    return getattr(config.settings(), _ATTR[name])


def _bytes_setting(name: str, default):
    return config.settings().nbytes(name, default)


def memory_fraction() -> float:
    raw = _setting("ASP_GMM_MEMORY_FRACTION")
    if not raw:
        return 0.5
    try:
        val = float(raw)
    except ValueError:
        val = float("nan")
    if not (0 < val <= 1):
        raise SettingError(f"ASP_GMM_MEMORY_FRACTION={raw!r} must be a number in (0, 1]; unset it for 0.5")
    return val


def _free_host_bytes() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


def _free_device_bytes(backend) -> int | None:
    if backend.name != "cuda":
        return _free_host_bytes()
    try:
        dev = backend.device
        with dev.active():
            free, _total = dev.drv.mem_get_info()
        return int(free)
    except Exception as exc:  # noqa: BLE001 - no device to ask: do not stream because of memory
        if not _warned_free_memory:
            _warned_free_memory.append(exc)
            log.warning(
                "asp_gmm: could not read the GPU's free memory (%s: %s); in-memory fits will not be "
                "streamed for lack of memory: set ASP_GMM_DEVICE_BUDGET (e.g. 8G) to bound them",
                type(exc).__name__,
                exc,
            )
        return None


_warned_free_memory: list = []  # the first failed free-memory query (warned once per process)


def device_budget(backend) -> int | None:
    """Bytes an in-memory fit may take on ``backend``'s device: ``ASP_GMM_DEVICE_BUDGET``, else
    ``ASP_GMM_MEMORY_FRACTION`` (0.5) of its free memory; ``None`` when unknown (no limit)."""
    fixed = _bytes_setting("ASP_GMM_DEVICE_BUDGET", None)
    if fixed is not None:
        return fixed
    free = _free_device_bytes(backend)
    return None if free is None else int(free * memory_fraction())


# ------------------------------------------------------------------------------ sources
class ChunkSource:
    """A re-iterable source of row chunks.

    Attributes
    ----------
    n_rows : int or None
        Rows per pass, where known before reading.
    n_features : int or None
        Columns, where known before reading.
    """

    n_rows: int | None = None
    n_features: int | None = None

    def chunks(self):
        """Yield 2-D row chunks ``(n_i, D)``, the same rows on every call."""
        raise NotImplementedError

    def rows(self, index: np.ndarray) -> np.ndarray | None:
        """Rows at sorted ``index`` ((k,) int), or ``None`` when the source cannot index (then a pass
        collects them)."""
        return None


class ArraySource(ChunkSource):
    """Rows ``X[a:b]`` of an array-like with a 2-D ``shape`` (ndarray, memmap, h5py, zarr...)."""

    def __init__(self, X, chunk_rows: int | None = None):
        shape = tuple(X.shape)
        if len(shape) != 2:
            hint = " For a single feature reshape it to (N, 1)." if len(shape) == 1 else ""
            raise StreamError(f"X must be 2-D (N events, D dimensions), got shape {shape}.{hint}")
        self.X = X
        self.n_rows, self.n_features = int(shape[0]), int(shape[1])
        if chunk_rows is None:
            itemsize = getattr(getattr(X, "dtype", None), "itemsize", 8) or 8
            chunk_rows = max(1, _bytes_setting("ASP_GMM_CHUNK_BYTES", 64 << 20) // (max(self.n_features, 1) * itemsize))
            own = getattr(X, "chunks", None)  # h5py / zarr chunking: read whole chunks of the dataset
            if isinstance(own, tuple) and own and isinstance(own[0], int) and own[0] > 0:
                chunk_rows = max(own[0], chunk_rows // own[0] * own[0])
        self.chunk_rows = int(chunk_rows)

    def chunks(self):
        for a in range(0, self.n_rows, self.chunk_rows):
            yield self.X[a : a + self.chunk_rows]

    def rows(self, index):
        return np.stack([np.asarray(self.X[int(i)]) for i in index]) if len(index) else None


class CallableSource(ChunkSource):
    """A callable returning a fresh iterable of row chunks on every call (once per pass)."""

    def __init__(self, fn):
        self.fn = fn

    def chunks(self):
        it = self.fn()
        if it is None or not hasattr(it, "__iter__"):
            raise StreamError(
                f"the chunk source {self.fn!r} returned {type(it).__name__}, not an iterable of "
                "row chunks; make it a function that returns a new generator (or list) of (n_i, D) "
                "arrays each time it is called"
            )
        if iter(it) is it and getattr(self, "_seen", None) is it:
            raise StreamError(
                "the chunk source returned the same iterator twice; it must return a new one per call "
                "(e.g. a generator function, not a generator object)"
            )
        self._seen = it
        return iter(it)


def is_source(X) -> bool:
    """Whether ``X`` is trained on by streaming rather than loaded whole: a memmap, a callable, a
    :class:`ChunkSource`, or an array-like (h5py, zarr...) that is not an in-memory array."""
    if isinstance(X, (ChunkSource, np.memmap)):
        return True
    if isinstance(X, np.ndarray) or X is None:
        return False
    if callable(X) and not hasattr(X, "shape"):
        return True
    if type(X).__module__.split(".")[0] in _IN_MEMORY_LIBS:
        return False
    if hasattr(X, "__cuda_array_interface__") or hasattr(X, "__dlpack__"):
        return False
    return hasattr(X, "shape") and hasattr(X, "__getitem__")


def as_source(X, chunk_rows: int | None = None) -> ChunkSource:
    """A :class:`ChunkSource` over ``X`` (see the module docstring for what ``X`` may be)."""
    if isinstance(X, ChunkSource):
        return X
    if callable(X) and not hasattr(X, "shape"):
        return CallableSource(X)
    if hasattr(X, "shape") and hasattr(X, "__getitem__"):
        return ArraySource(X, chunk_rows)
    raise StreamError(
        f"cannot stream a {type(X).__name__}: pass an (N, D) array, a numpy.memmap, an h5py or zarr "
        "dataset, or a callable returning an iterable of (n_i, D) row chunks"
    )


def _ordinal(k: int) -> str:
    suf = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suf}"


def check_chunk(chunk, index: int, start: int, D: int | None, dtype, check_finite: bool = True) -> np.ndarray:
    """Validate chunk ``index`` (0-based) that starts at global row ``start``; return it as a
    C-contiguous ``(n, D)`` array of ``dtype``. Errors name the chunk and the row. Without
    ``check_finite`` the values are not looked at (the runner checks them on the device)."""
    where = f"the {_ordinal(index + 1)} chunk of the source (chunk index {index}, from row {start})"
    if cuda_arrays.is_cuda_array(chunk):  # a CUDA array beyond the device budget: streamed via the host
        chunk = cuda_arrays.to_host(chunk)
    arr = np.asarray(chunk)
    if arr.dtype.kind != "f":
        raise StreamError(
            f"{where} has dtype {arr.dtype}; training needs floating-point data: make the source "
            f"yield float arrays (e.g. chunk.astype(np.{np.dtype(dtype).name}))"
        )
    if arr.ndim != 2:
        raise StreamError(
            f"{where} has shape {arr.shape}; every chunk must be 2-D (rows, D)" + (f" with D={D}" if D else "")
        )
    if D is not None and arr.shape[1] != D:
        raise StreamError(
            f"{where} has {arr.shape[1]} columns but the model has D={D}; every chunk must have shape (rows, {D})"
        )
    with np.errstate(over="ignore"):
        out = np.ascontiguousarray(arr, dtype=dtype)
    if not check_finite:
        return out
    ok = np.isfinite(out)
    if not ok.all():
        r, c = divmod(int(np.argmin(ok.reshape(-1))), out.shape[1])
        what = (
            "a value beyond the {} range".format(np.dtype(dtype).name) if np.isfinite(arr[r, c]) else "NaN or infinity"
        )
        raise StreamError(
            f"{where} has {what} at row {start + r} (row {r} of the chunk), column {c}; remove or "
            "impute those events" + (" or use dtype=np.float64" if np.isfinite(arr[r, c]) else "")
        )
    return out


def blocks(
    source: ChunkSource,
    D: int | None,
    dtype,
    block_rows: int,
    expect_rows: int | None = None,
    first_chunk: int = 0,
    first_row: int = 0,
    check_finite: bool = True,
    pieces: bool = False,
):
    """Yield ``(start_row, block)`` with every block but the last of exactly ``block_rows`` rows,
    copied from the source's chunks (validated by :func:`check_chunk`; messages count chunks from
    ``first_chunk`` and rows from ``first_row``, for a source that is part of a larger one). The
    block buffer is reused: use each block before asking for the next. With ``pieces`` a block is
    the list of its row pieces (views of the chunks, no copy; only for sources whose chunks stay
    valid, such as :class:`ArraySource`); ``check_finite`` as in :func:`check_chunk`."""
    buf = None
    fill, total, index = 0, 0, -1
    for index, chunk in enumerate(source.chunks()):
        arr = check_chunk(chunk, first_chunk + index, first_row + total, D, dtype, check_finite)
        if D is None:
            D = arr.shape[1]
        if buf is None:
            buf = [] if pieces else np.empty((block_rows, D), dtype)
        pos = 0
        while pos < arr.shape[0]:
            take = min(block_rows - fill, arr.shape[0] - pos)
            if fill == 0 and take == block_rows:  # a whole block inside the chunk: no copy
                yield total + pos - fill, [arr[pos : pos + take]] if pieces else arr[pos : pos + take]
            elif pieces:
                buf.append(arr[pos : pos + take])
                fill += take
                if fill == block_rows:
                    yield total + pos + take - fill, buf
                    buf, fill = [], 0
            else:
                buf[fill : fill + take] = arr[pos : pos + take]
                fill += take
                if fill == block_rows:
                    yield total + pos + take - fill, buf
                    fill = 0
            pos += take
        total += arr.shape[0]
    if fill:
        yield total - fill, buf if pieces else buf[:fill]
    if total == 0:
        raise StreamError(
            "the chunk source yielded no rows"
            + (" (no chunks at all)" if index < 0 else "")
            + "; pass a source with at least one event (a callable source must return a new, "
            "non-empty iterable of chunks every time it is called)"
        )
    if expect_rows is not None and total != expect_rows:
        raise StreamError(
            f"the chunk source yielded {total} rows in this pass but {expect_rows} before; a source "
            "must yield the same rows on every pass (a callable must return a new iterable over the "
            "same data each time it is called)"
        )


def wants_stream(X, backend, problem: Problem) -> bool:
    """Whether :meth:`~asp_gmm.specializer.Specializer.train` streams ``X``: it is a chunk source
    (:func:`is_source`), or an in-memory session of ``problem`` would take more than
    :func:`device_budget` on ``backend``'s device."""
    if is_source(X):
        return True
    need = backend.session_bytes(problem)
    fixed = _bytes_setting("ASP_GMM_DEVICE_BUDGET", None)  # (a bad value is reported on every call)
    if need <= _NEVER_STREAM_BYTES and fixed is None and memory_fraction():
        return False  # small: not worth asking the device (the diarization example trains thousands)
    budget = device_budget(backend)
    return budget is not None and need > budget


# ------------------------------------------------------------------------------ sample weights
def check_weights(w, n: int | None = None, where: str = "") -> np.ndarray:
    """``sample_weight`` (or a chunk of it) as a float64 (n,) array, refused with a message naming
    ``sample_weight`` when it is not 1-D, has the wrong length, or holds negative, NaN or infinite
    values. ``where``: which chunk, for a streamed source."""
    arr = np.asarray(cuda_arrays.to_host(w) if cuda_arrays.is_cuda_array(w) else w)
    if arr.dtype.kind not in "fiub":
        raise TypeError(f"sample_weight{where} has dtype {arr.dtype}; pass non-negative numbers (one per event)")
    if arr.ndim != 1:
        raise ValueError(f"sample_weight{where} must be 1-D (one weight per event), got shape {arr.shape}")
    if n is not None and arr.shape[0] != n:
        raise ValueError(
            f"sample_weight{where} has {arr.shape[0]} values but X has {n} events; pass one weight per event"
        )
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    ok = np.isfinite(arr)
    if not ok.all():
        i = int(np.argmin(ok))
        raise ValueError(f"sample_weight{where} contains NaN or infinity (first at index {i}); pass finite weights")
    if arr.size and arr.min() < 0:
        i = int(np.argmin(arr))
        raise ValueError(f"sample_weight{where} has a negative value ({arr[i]:g} at index {i}); weights must be >= 0")
    return arr


def require_positive(sw: np.ndarray, M: int, components: str = "the M={M} components") -> np.ndarray:
    """``sw`` when at least ``M`` of its weights are positive, else a ``ValueError`` naming
    ``sample_weight`` (seeding and the first M-step need ``M`` events that count)."""
    k = int(np.count_nonzero(sw))
    if k == 0:
        raise ValueError("sample_weight is zero for every event; give at least one event a positive weight")
    if k < M:
        raise ValueError(
            f"sample_weight has {k} positive values, fewer than {components.format(M=M)}; give more events a "
            "positive weight or use fewer components"
        )
    return sw


class WeightSource:
    """Sample weights aligned with a chunk source's rows: an (N,) array-like (sliced like the rows)
    or a callable returning a fresh iterable of (n_i,) chunks on every call (once per pass)."""

    def __init__(self, w, chunk_rows: int = 1 << 20):
        self.w, self.chunk_rows = w, int(chunk_rows)
        self.callable = callable(w) and not hasattr(w, "shape")
        if not self.callable:
            shape = tuple(np.shape(w))
            if len(shape) != 1:
                raise ValueError(f"sample_weight must be 1-D (one weight per event), got shape {shape}")
        self.n_rows = None if self.callable else int(np.shape(w)[0])

    def chunks(self):
        if self.callable:
            it = self.w()
            if it is None or not hasattr(it, "__iter__"):
                raise StreamError(
                    f"the sample_weight source {self.w!r} returned {type(it).__name__}, not an iterable of "
                    "weight chunks; make it a function that returns a new iterable of (n_i,) arrays per call"
                )
            yield from it
        else:
            for a in range(0, self.n_rows, self.chunk_rows):
                yield self.w[a : a + self.chunk_rows]


def as_weights(sample_weight, n_rows: int | None = None) -> WeightSource | None:
    """A :class:`WeightSource` for a streamed fit (``None`` for no weights); an array is checked
    whole here when it is in memory."""
    if sample_weight is None:
        return None
    if isinstance(sample_weight, WeightSource):
        return sample_weight
    if isinstance(sample_weight, np.ndarray) and not isinstance(sample_weight, np.memmap):
        sample_weight = check_weights(sample_weight, n_rows)
    elif not callable(sample_weight) and n_rows is not None and np.shape(sample_weight)[:1] != (n_rows,):
        raise ValueError(
            f"sample_weight has {np.shape(sample_weight)[0] if np.ndim(sample_weight) else 'no'} values but X "
            f"has {n_rows} events; pass one weight per event"
        )
    return WeightSource(sample_weight)


def weighted_blocks(
    source: ChunkSource,
    weights: WeightSource,
    D: int | None,
    dtype,
    block_rows: int,
    expect_rows=None,
    check_finite: bool = True,
    pieces: bool = False,
):
    """:func:`blocks` with each block's sample weights: yields ``(start_row, block, w)``, ``w`` a
    float64 (n,) array checked by :func:`check_weights`. The weights must cover exactly the rows.
    ``check_finite`` and ``pieces`` as in :func:`blocks`."""
    it = iter(weights.chunks())
    have = np.empty(0)
    index, seen = -1, 0
    for start, blk in blocks(source, D, dtype, block_rows, expect_rows, check_finite=check_finite, pieces=pieces):
        n = sum(p.shape[0] for p in blk) if pieces else blk.shape[0]
        parts, got = [have], have.shape[0]
        while got < n:
            try:
                chunk = next(it)
            except StopIteration:
                raise ValueError(
                    f"sample_weight has {seen} values but X has more events (at least {start + n}); "
                    "pass one weight per event"
                ) from None
            index += 1
            arr = check_weights(chunk, where=f" (chunk {index}, from index {seen})")
            seen += arr.shape[0]
            parts.append(arr)
            got += arr.shape[0]
        allw = np.concatenate(parts) if len(parts) > 1 else have
        yield start, blk, allw[:n]
        have = allw[n:]
    rest = sum(check_weights(c).shape[0] for c in it)
    if have.shape[0] or rest:
        raise ValueError(
            f"sample_weight has {seen + rest} values but X has {seen - have.shape[0]} events; pass one weight per event"
        )
