"""Streamed EM: training on data that does not fit the device (or the host), one block at a time.

Every EM pass reads the data once, in chunks, from a *chunk source*:

* a NumPy array or ``numpy.memmap`` (rows sliced ``X[a:b]``);
* an h5py or zarr dataset, or any array-like with a 2-D ``shape`` and row slicing;
* a callable returning a fresh iterable of 2-D row chunks each time it is called (re-iterable: it is
  called once per pass and must yield the same rows every time);
* a :class:`ChunkSource`.

Rows are copied into blocks of a fixed size chosen by the backend (cache-sized on the C backend),
so the result does not depend on how the source cuts its chunks. Per block the backend runs the
E-step and returns the sufficient statistics (:class:`asp_gmm.backends.base.BlockStats`); they are
added across blocks in float64 with compensated (Neumaier) sums, centred on the current means, and
one M-step per pass turns them into the new parameters with the reference formulas (empty
components keep their mean and covariance). Whole-data posteriors are never stored.

Settings
--------
``ASP_GMM_DEVICE_BUDGET``
    Bytes (``"2e9"``, ``"512M"``, ``"8G"``) an in-memory fit may take on the backend's device; a
    larger ``X`` is streamed. Default: ``ASP_GMM_MEMORY_FRACTION`` of the free memory (GPU memory for
    CUDA, available host memory for C and NumPy).
``ASP_GMM_MEMORY_FRACTION``
    Default 0.5.
``ASP_GMM_CHUNK_BYTES``
    Bytes of the source read at a time from an array-like (default 64 MiB; rounded to the dataset's
    own chunking where it has one).
``ASP_GMM_BLOCK_BYTES``
    Bytes of data and posteriors per block handed to the backend (backend default: the last-level
    cache's size, at least 8 MiB, on C; 64 MiB elsewhere).
``ASP_GMM_PROGRESS``
    ``auto`` (default: a progress bar per pass when stderr is a terminal and a pass reads at least
    10^7 events), ``1`` (always, where tqdm is installed) or ``0``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from . import config, cuda_arrays
from . import reference as ref
from .errors import NonFiniteError, NonFiniteInputError, SettingError, StreamError
from .problem import Problem, as_cvtype, per_component  # noqa: F401 (re-exported for the Face)

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
    raw = _setting(name)
    if not raw:
        return default
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}.get(raw[-1].lower(), 1)
    try:
        val = float(raw[:-1] if scale != 1 else raw) * scale
    except ValueError:
        val = float("nan")
    if not (math.isfinite(val) and val > 0):
        raise SettingError(f"{name}={raw!r} is not a positive number of bytes; give e.g. 2e9, 512M or 8G, or unset it")
    return int(val)


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


# ------------------------------------------------------------------------------ statistics
def _neumaier(s: np.ndarray, c: np.ndarray, x: np.ndarray) -> None:
    """``s += x`` with the lost low-order parts kept in ``c`` (in place)."""
    t = s + x
    big = np.abs(s) >= np.abs(x)
    c += np.where(big, (s - t) + x, (x - t) + s)
    s[...] = t


class SuffStats:
    """Sufficient statistics of a pass, accumulated in float64 with compensated sums.

    Attributes
    ----------
    n : int
        Events added.
    loglik : float
    nk : ndarray (M,)
        Raw counts.
    s1 : ndarray (M, D)
        ``sum r (x - c)``, ``c = centre``.
    s2 : ndarray (M, D, D) or (M, D)
        ``sum r (x - c)(x - c)^T`` (diag: its diagonal).
    centre : ndarray (M, D)
        The means the statistics are centred on.
    """

    def __init__(self, M: int, D: int, cvtype: str, centre):
        self.cvtype = cvtype
        self.centre = np.array(centre, np.float64)
        self.n = 0
        shapes = {"ll": (), "nk": (M,), "s1": (M, D), "s2": (M, D, D) if cvtype == "full" else (M, D)}
        self._sum = {k: np.zeros(v) for k, v in shapes.items()}
        self._comp = {k: np.zeros(v) for k, v in shapes.items()}

    def add_block(self, st) -> None:
        """Add a :class:`~asp_gmm.backends.base.BlockStats` computed under means ``centre``."""
        self.n += st.n
        s1 = st.sumx - st.nk[:, None] * self.centre
        for k, v in (("ll", np.float64(st.loglik)), ("nk", st.nk), ("s1", s1), ("s2", st.s2)):
            _neumaier(self._sum[k], self._comp[k], np.asarray(v, np.float64))

    def add(self, other: "SuffStats") -> "SuffStats":
        """This plus ``other`` (re-centred on this centre where it differs); a new object."""
        if not np.array_equal(other.centre, self.centre):
            other = other.recentred(self.centre)
        out = SuffStats.__new__(SuffStats)
        out.cvtype, out.centre, out.n = self.cvtype, self.centre.copy(), self.n + other.n
        out._sum, out._comp = {}, {}
        for k in self._sum:
            s, c = self._sum[k].copy(), np.array(self._comp[k] + other._comp[k])
            _neumaier(s, c, other._sum[k])
            out._sum[k], out._comp[k] = s, c
        return out

    def scaled(self, factor: float) -> "SuffStats":
        """All sums times ``factor`` (online EM's averaging); a new object."""
        out = SuffStats.__new__(SuffStats)
        out.cvtype, out.centre, out.n = self.cvtype, self.centre.copy(), self.n
        out._sum = {k: np.array(v * factor) for k, v in self._sum.items()}
        out._comp = {k: np.array(v * factor) for k, v in self._comp.items()}
        return out

    @property
    def loglik(self) -> float:
        return float(self._sum["ll"] + self._comp["ll"])

    @property
    def nk(self) -> np.ndarray:
        return self._sum["nk"] + self._comp["nk"]

    @property
    def s1(self) -> np.ndarray:
        return self._sum["s1"] + self._comp["s1"]

    @property
    def s2(self) -> np.ndarray:
        return self._sum["s2"] + self._comp["s2"]

    def recentred(self, centre) -> "SuffStats":
        """The same statistics centred on ``centre`` (M, D); a new object."""
        centre = np.asarray(centre, np.float64)
        d = centre - self.centre
        nk, s1, s2 = self.nk, self.s1, self.s2
        out = SuffStats(nk.shape[0], centre.shape[1], self.cvtype, centre)
        out.n = self.n
        out._sum["ll"][...] = self.loglik
        out._sum["nk"][...] = nk
        out._sum["s1"][...] = s1 - nk[:, None] * d
        out._sum["s2"][...] = _shift_second(s2, s1, nk, d, self.cvtype)
        return out

    def mstep(self, prev_means, prev_covars, reg_covar: float):
        """``(weights (M,), means (M, D), covars)`` from these statistics with the reference rules:
        counts ``nk + 10 eps``; a component with a raw count below
        :data:`asp_gmm.reference.EMPTY_COMPONENT_EVENTS` keeps ``prev_means`` and ``prev_covars``;
        covariances around the new means plus ``reg_covar`` on the diagonal."""
        nk, s1, s2 = self.nk, self.s1, self.s2
        eff = nk + 10.0 * np.finfo(np.float64).eps
        weights = eff / eff.sum()
        d = s1 / eff[:, None]
        means = self.centre + d
        cov = _shift_second(s2, s1, nk, d, self.cvtype) / (
            eff[:, None, None] if self.cvtype == "full" else eff[:, None]
        )
        if self.cvtype == "full":
            cov = 0.5 * (cov + np.swapaxes(cov, 1, 2))
            D = cov.shape[1]
            cov[:, np.arange(D), np.arange(D)] += reg_covar
        else:
            cov = cov + reg_covar
        empty = nk < ref.EMPTY_COMPONENT_EVENTS
        means[empty] = np.asarray(prev_means, np.float64)[empty]
        cov[empty] = np.asarray(prev_covars, np.float64)[empty]
        return weights, means, cov


def seeded_as(covars, cvtype: str) -> np.ndarray:
    """Seeded covariances (every component the data's, (M, D, D) or (M, D)) in the shape of
    ``cvtype``: "tied" the one matrix, "spherical" the mean of each diagonal."""
    covars = np.asarray(covars)
    if cvtype == "tied":
        return covars[0].copy()
    if cvtype == "spherical":
        return covars.mean(axis=1)
    return covars


def reduced_mstep(stats: "SuffStats", prev_means, prev_covars, reg_covar: float, cvtype: str):
    """:meth:`SuffStats.mstep` reduced to ``cvtype`` as asp_gmm/reference.py reduces its estimates:
    "tied" the count-weighted mean of the components' full covariances (the pooled scatter over the
    total count), "spherical" the mean of each component's diagonal; ``reg_covar`` added after.
    ``prev_covars`` are per component (:func:`per_component`); returns covariances of ``cvtype``."""
    if cvtype in ("full", "diag"):
        return stats.mstep(prev_means, prev_covars, reg_covar)
    prev = np.asarray(prev_covars, np.float64)
    D = prev.shape[-1]
    # the previous covariances without reg_covar: an empty component keeps them and gets it added again
    prev = prev - (reg_covar * np.eye(D) if cvtype == "tied" else reg_covar)
    w, mu, cv = stats.mstep(prev_means, prev, 0.0)
    if cvtype == "tied":
        nk = stats.nk + 10 * np.finfo(np.float64).eps
        return w, mu, np.tensordot(nk, cv, 1) / nk.sum() + reg_covar * np.eye(D)
    return w, mu, cv.mean(axis=1) + reg_covar


def _shift_second(s2, s1, nk, d, cvtype):
    """``sum r (x - c - d)(x - c - d)^T`` from the sums around ``c``: s2 - d s1^T - s1 d^T + nk d d^T."""
    if cvtype == "full":
        ds1 = np.einsum("ki,kj->kij", d, s1)
        return s2 - ds1 - np.swapaxes(ds1, 1, 2) + nk[:, None, None] * np.einsum("ki,kj->kij", d, d)
    return s2 - 2.0 * d * s1 + nk[:, None] * d * d


# ------------------------------------------------------------------------------ progress
class _Progress:
    """A tqdm bar per pass (events/s, pass, log-likelihood) and an INFO line per pass."""

    def __init__(self, enabled, n_rows):
        self.bar = None
        if enabled is None:
            mode = _setting("ASP_GMM_PROGRESS").lower() or "auto"
            if mode not in ("auto", "0", "1"):
                raise SettingError(f"ASP_GMM_PROGRESS={mode!r} must be auto, 1 or 0")
            enabled = mode == "1" or (
                mode == "auto"
                and sys.stderr is not None
                and sys.stderr.isatty()
                and (n_rows is None or n_rows >= 10_000_000)
            )
        self.enabled = enabled
        if enabled:
            try:
                import tqdm  # noqa: F401
            except ImportError:
                log.info("asp_gmm: install tqdm for a progress bar (pip install asp_gmm[stream])")
                self.enabled = False

    def start(self, k, n_rows):
        self.t0 = time.perf_counter()
        if self.enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=n_rows, desc=f"EM pass {k}", unit="ev", unit_scale=True, leave=False)

    def advance(self, rows):
        if self.bar is not None:
            self.bar.update(rows)

    def end(self, k, st, iters):
        sec = time.perf_counter() - self.t0
        rate = st.n / sec if sec > 0 else float("inf")
        if self.bar is not None:
            self.bar.set_postfix(loglik=f"{st.loglik / st.n:.6g}/ev")
            self.bar.close()
            self.bar = None
        log.info(
            "asp_gmm: streamed pass %d (after %d iterations): %d events in %.3f s (%.3g events/s), "
            "log-likelihood %.10g (%.6g per event)",
            k,
            iters,
            st.n,
            sec,
            rate,
            st.loglik,
            st.loglik / st.n,
        )
        return sec


# ------------------------------------------------------------------------------ EM
@dataclass
class StreamPlan:
    """What a streamed fit runs: the block problem, the covariance configuration and why."""

    problem: Problem
    config: object
    kernel: object
    reason: str


def plan(spec, problem: Problem, variant: str | None = None) -> StreamPlan:
    """Choose the covariance configuration for ``problem``'s blocks through ``spec``'s selection (on
    the block's problem shape), falling back past configurations that fail to compile."""
    from . import selection

    rows = spec.backend.stream_block_rows(problem)
    if problem.N:
        rows = min(rows, problem.N)
    bp = Problem(int(rows), problem.D, problem.M, problem.cvtype, problem.dtype)
    cands = spec.candidates(bp, variant)
    p = spec.policy.choose(spec.backend, bp, cands, pinned=variant is not None, tuning=False)
    order = [p.primary] + [c for c in selection.rule_order(spec.backend, cands) if c != p.primary]
    for cfg in order:
        kernel = spec._kernel(cfg, bp, spec.policy, reraise=variant is not None)
        if kernel is not None:
            return StreamPlan(bp, cfg, kernel, p.reason)
    from .errors import KernelError

    raise KernelError("every candidate variant failed to compile; see the warnings above")


def pass_stats(
    runner, source: ChunkSource, problem: Problem, weights, means, covars, reg_covar, expect_rows=None, progress=None
) -> SuffStats:
    """One pass over ``source``: the statistics of every block under the given parameters."""
    runner.set_params(weights, means, covars, reg_covar)
    st = SuffStats(problem.M, problem.D, problem.cvtype, means)
    on_device = getattr(runner, "checks_finite", False)  # NaN/inf found by the runner (the GPU)
    starts = []

    def rows():
        for start, blk in blocks(
            source,
            problem.D,
            problem.np_dtype,
            runner.problem.N,
            expect_rows,
            check_finite=not on_device,
            pieces=on_device and isinstance(source, ArraySource),
        ):
            starts.append(start)
            yield blk

    try:
        for bs in runner.stats_many(rows()):
            st.add_block(bs)
            if progress is not None:
                progress.advance(bs.n)
    except NonFiniteInputError as exc:
        row = starts[exc.block] + exc.row if getattr(exc, "block", None) is not None else exc.row
        what = f"values beyond the {exc.beyond} range" if exc.beyond else "NaN or infinity"
        raise StreamError(
            f"X has {what} at row {row}, column {exc.column}; remove or impute those events"
            + (" or use dtype=np.float64" if exc.beyond else "")
        ) from None
    if not math.isfinite(st.loglik):
        raise NonFiniteError(
            f"the log-likelihood is not finite ({st.loglik}): increase reg_covar, use fewer "
            "components, or scale the data"
        )
    return st


def em(
    spec,
    source,
    weights,
    means,
    covars,
    problem: Problem,
    reg_covar: float,
    min_iters: int,
    max_iters: int,
    tol: float,
    variant: str | None = None,
    progress: bool | None = None,
):
    """Streamed EM through ``spec`` (a :class:`~asp_gmm.specializer.Specializer`): the same iterations as
    the in-memory loop (an M-step, then the statistics of the new parameters), one pass over the
    source per iteration plus the first. Returns a :class:`~asp_gmm.specializer.TrainResult`.
    "tied" and "spherical" stream the per-component statistics of the "full" and "diag" problem and
    reduce each M-step to their type (:func:`reduced_mstep`)."""
    from .specializer import TrainResult

    t_start = time.perf_counter()
    source = as_source(source)
    cvtype = problem.cvtype
    problem = dataclasses.replace(problem, cvtype=problem.kernel_cvtype)
    covars = per_component(covars, cvtype, problem.M, problem.D)
    sp = plan(spec, problem, variant)
    bar = _Progress(progress, problem.N or source.n_rows)
    runner = spec.backend.open_stats(sp.problem, sp.kernel)
    w = np.array(weights, np.float64)
    mu = np.array(means, np.float64)
    cv = np.array(covars, np.float64)
    try:
        bar.start(0, source.n_rows)
        st = pass_stats(runner, source, problem, w, mu, cv, reg_covar, None, bar)
        bar.end(0, st, 0)
        N = st.n
        ll = st.loglik
        trace, iters, converged = [ll], 0, False
        while iters < max_iters:
            w, mu, cv = reduced_mstep(st, mu, cv, reg_covar, cvtype)
            cv = per_component(cv, cvtype, problem.M, problem.D)
            bar.start(iters + 1, N)
            st = pass_stats(runner, source, problem, w, mu, cv, reg_covar, N, bar)
            iters += 1
            bar.end(iters, st, iters)
            change, ll = (st.loglik - ll) / N, st.loglik
            trace.append(ll)
            if iters >= min_iters and abs(change) < tol:
                converged = True
                break
    finally:
        runner.close()
    return TrainResult(
        w,
        mu,
        as_cvtype(cv, cvtype),
        ll,
        iters,
        converged,
        sp.config.label + " (streamed)",
        [],
        sp.reason,
        time.perf_counter() - t_start,
        trace,
        n_events=N,
    )


def seed(source, M: int, D: int | None, cvtype: str, dtype, reg_covar: float, rng_seed=None):
    """The Face's seeding from a stream: ``(N, means (M, D), covars (M, D, D) or (M, D))`` with the means at events at even
    intervals (or ``rng_seed``'s random distinct events) and every covariance the data's (co)variance
    plus ``reg_covar`` (float64, one pass, centred on the first event)."""
    source = as_source(source)
    dtype = np.dtype(dtype)
    shift = s1 = s2 = None
    n = 0
    for _start, blk in blocks(source, D, dtype, 1 << 16):
        x = blk.astype(np.float64)
        if shift is None:
            shift = x[0].copy()
            D = x.shape[1]
            s1, c1 = np.zeros(D), np.zeros(D)
            s2, c2 = np.zeros((D, D) if cvtype == "full" else D), np.zeros((D, D) if cvtype == "full" else D)
        y = x - shift
        _neumaier(s1, c1, y.sum(0))
        _neumaier(s2, c2, y.T @ y if cvtype == "full" else (y * y).sum(0))
        n += x.shape[0]
    s1, s2 = s1 + c1, s2 + c2
    if n < M:
        raise StreamError(
            f"the source has N={n} events, fewer than the M={M} components; use fewer components or more data"
        )
    m1 = s1 / n
    cov = s2 / n - (np.outer(m1, m1) if cvtype == "full" else m1 * m1)
    if rng_seed is None:
        idx = (np.arange(M) * n) // M
    else:
        idx = np.sort(np.random.default_rng(rng_seed).choice(n, M, replace=False))
    rows = source.rows(idx) if source.n_rows == n else None
    if rows is None:
        rows = np.empty((M, D), dtype)
        want = {int(i): j for j, i in enumerate(idx)}
        for start, blk in blocks(source, D, dtype, 1 << 16):
            for i in [i for i in want if start <= i < start + blk.shape[0]]:
                rows[want[i]] = blk[i - start]
    means = np.asarray(rows, dtype)
    if cvtype == "full":
        cov = 0.5 * (cov + cov.T) + reg_covar * np.eye(D)
        covars = np.repeat(cov[None], M, axis=0)
    else:
        covars = np.repeat((cov + reg_covar)[None], M, axis=0)
    return n, means, covars


def source_stats(
    spec, source, problem: Problem, weights, means, covars, reg_covar: float, variant: str | None = None
) -> SuffStats:
    """One pass of :func:`pass_stats` over ``source`` through ``spec``'s selected kernels (the online
    EM of ``GaussianMixture.partial_fit``): the statistics of every row under the given parameters."""
    source = as_source(source)
    sp = plan(spec, problem, variant)
    runner = spec.backend.open_stats(sp.problem, sp.kernel)
    try:
        return pass_stats(runner, source, problem, weights, means, covars, reg_covar)
    finally:
        runner.close()
