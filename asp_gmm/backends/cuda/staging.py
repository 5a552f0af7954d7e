"""Host data up to the GPU at the rate of the link, checked for NaN and infinity on the way.

A call on a NumPy array used to copy it with one pageable ``memcpy_htod`` (~8 GB/s: the driver
stages pageable memory itself, one buffer at a time) into a temporary device array, transpose it,
and scan it for NaN on the host before that (one more pass over X). :class:`Staging` replaces
both: X goes up in chunks through two pinned host buffers and two device buffers that live as
long as the backend (allocated on the first upload, grown when a larger row needs it, never per
call):

* host: chunk k is copied into pinned buffer k % 2 (on several threads: one thread's memcpy,
  5-10 GB/s, is slower than the link; the copy also converts the dtype and gathers a
  non-contiguous X, so the caller needs no converted copy of its own);
* copy stream: pinned buffer -> device buffer k % 2 (``memcpy_htod_async``), then an event;
* compute stream (the session's): waits for that event and runs ``asp_upload_chunk``, which
  transposes the chunk into the session's event array and folds the first row holding NaN or
  infinity into one device word (``atomicMin``).

So the host fills chunk k + 1 while chunk k crosses the link and chunk k - 1 is transposed. After
the last chunk the word is read back once: :class:`~asp_gmm.errors.NonFiniteInputError` names the
first bad row (and its column, found in that one row on the host), and nothing of X is scanned on
the host.

Layout and kernel: ``variants/cuda/core.cu.j2`` (``asp_upload_chunk``).
"""

from __future__ import annotations

import os
import threading

import numpy as np

from ...errors import KernelError, NonFiniteInputError

#: Bytes of one staging chunk (two pinned host buffers and two device buffers of this size): large
#: enough that a chunk's copy and launch overheads (~10 us) are small against its transfer (0.6 ms
#: at 54 GB/s), small enough that the first chunk's unoverlapped host copy is short.
CHUNK_BYTES = 32 << 20
#: Host copies of a chunk are split into slices of at least this many bytes across threads.
SLICE_BYTES = 4 << 20
_INT_MAX = 2**31 - 1


def _threads() -> int:
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, n))


class Staging:
    """The pinned/double-buffered upload of one device (thread-safe: uploads are serialised).

    Parameters
    ----------
    dev : _Device
        The device (its ``drv`` and ``active()``).
    chunk_bytes : int
        Bytes per chunk (:data:`CHUNK_BYTES`); at least one row is staged at a time.
    """

    def __init__(self, dev, chunk_bytes: int = CHUNK_BYTES):
        self._dev = dev
        self.chunk_bytes = int(chunk_bytes)
        self._lock = threading.Lock()
        self._cap = 0  # bytes of each buffer
        self._pinned = []  # 2 pinned host byte buffers
        self._raw = []  # 2 device buffers
        self._copy_stream = None
        self._copied = self._consumed = None
        self._flag = self._flag_host = None
        self._pool = None
        self._nthreads = _threads()
        #: (row0, rows) of the chunks of the last upload, in order (for tests and diagnostics)
        self.last_chunks: list = []

    # ------------------------------------------------------------------ buffers
    def _ensure(self, nbytes: int) -> None:
        drv = self._dev.drv
        if self._copy_stream is None:
            self._copy_stream = drv.Stream()
            self._copied = [drv.Event() for _ in range(2)]
            self._consumed = [drv.Event() for _ in range(2)]
            self._flag = drv.mem_alloc(16)
            self._flag_host = drv.pagelocked_empty(4, np.int32)
        if nbytes > self._cap:
            self._free_buffers()
            try:
                self._pinned = [drv.pagelocked_empty(nbytes, np.uint8) for _ in range(2)]
                self._raw = [drv.mem_alloc(nbytes) for _ in range(2)]
            except drv.Error as exc:
                self._free_buffers()
                raise MemoryError(f"could not allocate {2 * nbytes} bytes of upload staging buffers: {exc}") from None
            self._cap = nbytes

    def _free_buffers(self) -> None:
        for a in self._raw:
            a.free()
        self._raw, self._pinned, self._cap = [], [], 0

    def free(self) -> None:
        """Release the buffers (at exit, while the context exists)."""
        with self._lock:
            self._free_buffers()
            if self._flag is not None:
                self._flag.free()
                self._flag = None
            self._copy_stream = None
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None

    # ------------------------------------------------------------------ host copies
    def _to_pinned(self, dst: np.ndarray, src: np.ndarray) -> None:
        """``dst[:] = src`` (dtype converted, gathered if strided) on several threads (NumPy
        releases the GIL in copies)."""
        n = src.shape[0]
        parts = min(self._nthreads, max(1, dst.nbytes // SLICE_BYTES), n)
        if parts <= 1:
            np.copyto(dst, src, casting="same_kind")
            return
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self._nthreads, thread_name_prefix="asp_gmm-stage")
        cuts = [n * i // parts for i in range(parts + 1)]
        list(
            self._pool.map(
                lambda i: np.copyto(dst[cuts[i] : cuts[i + 1]], src[cuts[i] : cuts[i + 1]], casting="same_kind"),
                range(parts),
            )
        )

    # ------------------------------------------------------------------ the upload
    def upload(self, X: np.ndarray, dst, N: int, D: int, ldn: int, dtype, upload_fn, stream) -> None:
        """Transpose X (N, D) of any float dtype and layout into ``dst`` [D][ldn] of ``dtype`` on the
        device (padding columns zeroed), checking every value on the way.

        Raises
        ------
        NonFiniteInputError
            X holds NaN or infinity (the first such row and column are named); ``dst`` is then
            partly written, which the caller's session never uses.
        """
        drv = self._dev.drv
        dtype = np.dtype(dtype)
        row_bytes = D * dtype.itemsize
        rows_per = max(1, self.chunk_bytes // row_bytes)
        with self._lock, self._dev.active():
            self._ensure(rows_per * row_bytes)
            chunks = [(r, min(rows_per, N - r)) for r in range(0, N, rows_per)]
            self.last_chunks = chunks
            try:
                self._copy_stream.synchronize()  # (an upload interrupted mid-way left copies behind)
                drv.memset_d32_async(self._flag, _INT_MAX, 1, stream)
                for k, (row0, rows) in enumerate(chunks):
                    s = k % 2
                    if k >= 2:
                        self._copied[s].synchronize()  # pinned[s]'s last copy has left the host
                    host = self._pinned[s][: rows * row_bytes].view(dtype).reshape(rows, D)
                    with np.errstate(over="ignore", invalid="ignore"):
                        self._to_pinned(host, X[row0 : row0 + rows])
                    if k >= 2:
                        self._copy_stream.wait_for_event(self._consumed[s])  # raw[s] transposed
                    drv.memcpy_htod_async(self._raw[s], host, self._copy_stream)
                    self._copied[s].record(self._copy_stream)
                    stream.wait_for_event(self._copied[s])
                    span = ldn - row0 if k == len(chunks) - 1 else rows
                    upload_fn.prepared_async_call(
                        (-(-D * span // 256), 1),
                        (256, 1, 1),
                        stream,
                        int(self._raw[s]),
                        int(dst),
                        np.int32(row0),
                        np.int32(rows),
                        np.int32(span),
                        np.int32(ldn),
                        int(self._flag),
                    )
                    self._consumed[s].record(stream)
                drv.memcpy_dtoh_async(self._flag_host, self._flag, stream)
                stream.synchronize()
            except drv.Error as exc:
                raise KernelError(
                    f"uploading X ({N} x {D}) to the GPU failed (asp_upload_chunk, chunks of {rows_per} rows): {exc}"
                ) from None
            bad = int(self._flag_host[0])
        if bad != _INT_MAX:
            exc = NonFiniteInputError.at(X, bad, dtype)
            exc.source = X  # (the Face counts the row in the array it was given)
            raise exc

    def transpose_device(self, X, ptr: int, dst, N: int, D: int, ldn: int, dtype, upload_fn, stream) -> None:
        """Transpose the C-contiguous CUDA array X (N, D) of ``dtype`` at device pointer ``ptr`` into
        ``dst`` [D][ldn] where it lies (no copy through the host), checked as :meth:`upload` checks:
        one pass over X, one word read back.

        Raises
        ------
        NonFiniteInputError
            X holds NaN or infinity (that row alone is copied to the host to name its column).
        """
        drv = self._dev.drv
        total = D * ldn
        with self._lock, self._dev.active():
            self._ensure(0)
            try:
                drv.Context.synchronize()  # the producer's pending writes to X (its own streams)
                drv.memset_d32_async(self._flag, _INT_MAX, 1, stream)
                upload_fn.prepared_async_call(
                    (-(-total // 256), 1),
                    (256, 1, 1),
                    stream,
                    int(ptr),
                    int(dst),
                    np.int32(0),
                    np.int32(N),
                    np.int32(ldn),
                    np.int32(ldn),
                    int(self._flag),
                )
                drv.memcpy_dtoh_async(self._flag_host, self._flag, stream)
                stream.synchronize()
            except drv.Error as exc:
                raise KernelError(
                    f"CUDA kernel asp_upload_chunk on a device array (grid=({-(-total // 256)}, 1), block=256) "
                    f"failed: {exc}"
                ) from None
            bad = int(self._flag_host[0])
        if bad != _INT_MAX:
            from ... import cuda_arrays

            raise NonFiniteInputError.at(X, bad, dtype, line=cuda_arrays.rows(X, np.array([bad]))[0])


#: bytes of plain members' rows from which a batch goes up through :class:`PinnedRows`
PINNED_FROM = 1 << 20
#: the page-locked buffer's largest size (a larger span goes up in turns of this)
PINNED_MAX = 64 << 20
#: bytes of one piece of :meth:`PinnedRows.upload`'s pipeline, and the host threads filling pieces
#: at once (lent H200 host, a 32-member diarization batch's 19.7 MB: pieces of 1 / 2 / 4 MB on 4
#: threads 1.9 / 1.5 / 1.3 ms; 8 or 16 threads slower, the host's memory bandwidth is the limit;
#: every member copied on 8 threads and then one DMA 2.2-2.6 ms, pageable copies 1.8-2.0 ms)
PINNED_PIECE = 4 << 20
PINNED_THREADS = 4


class PinnedRows:
    """Members' rows up to the device through one page-locked host buffer, kept for the backend's
    life (grown to at most :data:`PINNED_MAX`; larger spans go up in turns): pieces of
    :data:`PINNED_PIECE` bytes are filled on the runtime's host threads, each sent by an
    asynchronous DMA as soon as it and those before it are filled, so the transfer runs beside the
    host copies. Thread-safe: uploads take turns."""

    def __init__(self, dev):
        self._dev = dev
        self._buf = None
        self._stream = None
        self._lock = threading.Lock()

    def _ensure(self, nbytes: int):
        if self._buf is None or self._buf.nbytes < nbytes:
            self._buf = None  # (freed when collected)
            self._buf = self._dev.drv.pagelocked_empty(max(nbytes, 1 << 20), np.uint8)
        if self._stream is None:
            self._stream = self._dev.drv.Stream()
        return self._buf

    def upload(self, dst: int, D: int, starts: list, parts: list) -> None:
        """Each float array ``parts[i]`` (n_i, D) to rows ``starts[i]`` of the float32 device array
        at ``dst`` (rows of D values): the span from the lowest to the highest row goes up whole (rows
        of the span no part covers get whatever the buffer held: the caller writes them later)."""
        from ...runtime import default_runtime

        row = 4 * D
        lo = min(starts)
        hi = max(s + len(p) for s, p in zip(starts, parts))
        turn = max(1, min(hi - lo, PINNED_MAX // row))  # rows the buffer holds
        piece = max(1, PINNED_PIECE // row)  # rows a piece
        drv = self._dev.drv
        nested = threading.current_thread().name.startswith("asp_gmm-host")
        rt = default_runtime()
        with self._lock:
            buf = self._ensure(turn * row)
            view = buf[: turn * row].view(np.float32).reshape(turn, D)
            stream = self._stream
            for t0 in range(lo, hi, turn):
                t1 = min(hi, t0 + turn)

                def fill(p0, t0=t0, t1=t1):
                    """Rows p0 .. p0 + piece of the turn into the buffer (from the parts that
                    overlap them); returns the piece's rows."""
                    p1 = min(t1, p0 + piece)
                    for s, p in zip(starts, parts):
                        a, b = max(s, p0), min(s + len(p), p1)
                        if a < b:
                            np.copyto(view[a - t0 : b - t0], p[a - s : b - s], casting="same_kind")
                    return p0, p1

                cuts = range(t0, t1, piece)
                done = (fill(c) for c in cuts) if nested else rt.host_imap(fill, cuts, PINNED_THREADS)
                try:
                    for p0, p1 in done:
                        drv.memcpy_htod_async(dst + p0 * row, buf[(p0 - t0) * row : (p1 - t0) * row], stream)
                finally:
                    done.close()  # (on an error: no fill left running into the buffer)
                    stream.synchronize()  # (the next turn overwrites the buffer; the caller's data is up)
