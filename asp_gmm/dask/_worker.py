"""On the workers: one long-running task per worker holds that worker's row blocks for the whole fit
and answers the client's requests (seeding sums, one pass of sufficient statistics) over Dask queues.

The task receives its blocks as arguments (the persisted blocks that live on its worker: Dask hands
them over in place, nothing is sent), validates and converts each once (:class:`BlockStore`), keeps
them (host memory on a CPU worker; device memory on a GPU worker, see :mod:`asp_gmm.dask._cuda`) and
then loops: it reads a request from its own queue, computes over every resident block with the
specialized kernels its worker chose, and puts the float64 statistics on the fit's shared queue.
Messages are pickled bytes (Dask queues carry msgpack values); each is tagged with the fit's
generation, so that the client ignores what a loop of an abandoned generation still sends.
"""

from __future__ import annotations

import contextlib
import pickle
import time
from dataclasses import dataclass

import numpy as np

from .. import cuda_arrays, streaming
from ..errors import StreamError
from ..problem import Problem

#: Seconds a loop waits for its next request before it concludes that the client is gone.
IDLE_TIMEOUT = 900.0


@dataclass(frozen=True)
class LoopSpec:
    """What one worker's loop needs: the fit, its generation, the loop's index and its blocks."""

    fit_id: str
    gen: int
    index: int
    problem: Problem  # N = all events of X
    backend: str
    variant: str | None
    block_ids: tuple  # global block indices, in row order
    starts: tuple  # first global row of each block
    weighted: bool
    idle_timeout: float = IDLE_TIMEOUT


def param_queue(fit_id: str, gen: int, index: int) -> str:
    return f"asp-gmm-{fit_id}-{gen}-requests-{index}"


def stats_queue(fit_id: str) -> str:
    return f"asp-gmm-{fit_id}-replies"


def pack(obj) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def unpack(raw: bytes):
    return pickle.loads(raw)


def worker_loop(spec: LoopSpec, *data):
    """Task: the loop of one worker over its resident blocks (``data``: the blocks, then their
    sample weights when ``spec.weighted``). Returns the number of blocks it loaded."""
    from distributed import Queue, get_client, get_worker, secede

    nb = len(spec.block_ids)
    blocks = data[:nb]
    weights = data[nb:] if spec.weighted else (None,) * nb
    addr = get_worker().address
    secede()  # a long-running task: the worker's thread is free for other tasks
    client = get_client()
    requests = Queue(param_queue(spec.fit_id, spec.gen, spec.index), client=client)
    replies = Queue(stats_queue(spec.fit_id), client=client)

    def send(kind, *rest):
        replies.put(pack((kind, spec.gen, spec.index) + rest))

    store = None
    try:
        store = BlockStore(spec, blocks, weights, addr)
        send("ready", addr, store.summary())
        while True:
            try:
                kind, k, payload = unpack(requests.get(timeout=spec.idle_timeout))
            except TimeoutError:
                break
            if kind == "stop":
                break
            if kind == "pass":
                t0 = time.perf_counter()
                st = store.stats(*payload)
                st.compute_seconds = time.perf_counter() - t0  # (the client reports the slowest loop's)
                send("pass", k, st)
            elif kind == "seed":
                send("seed", k, store.seed_sums(*payload))
        return store.loads
    except Exception as exc:
        try:
            send("error", addr, exc)
        except Exception:  # noqa: BLE001 - the reply cannot travel: the task's own error still does
            pass
        raise
    finally:
        if store is not None:
            store.close()
        for q in (requests, replies):
            try:
                q.close()
            except Exception:  # noqa: BLE001 - the scheduler is going away
                pass


# ------------------------------------------------------------------------------ checks
def _where(addr: str, b: int, r0: int, n: int) -> str:
    return f"on worker {addr}, block {b} of X (rows {r0} to {r0 + n - 1})"


def _check_host(raw, addr, b, r0, D, dtype) -> np.ndarray:
    """The block validated and converted (a contiguous copy in ``dtype``); errors name worker, block, row."""
    try:
        return streaming.check_chunk(raw, b, r0, D, dtype)
    except StreamError as exc:
        n = int(getattr(raw, "shape", (0,))[0]) if getattr(raw, "ndim", 0) else 0
        raise StreamError(f"{_where(addr, b, r0, max(n, 1))}: {exc}") from None


def _check_device(raw, addr, b, r0, D, dtype):
    """The CUDA block in ``dtype``, C-contiguous, checked on its device; ``(array, pointer)``."""
    from ._cuda import device_block

    info = cuda_arrays.describe(raw)
    shape = info["shape"]
    where = _where(addr, b, r0, shape[0] if shape else 1)
    if info["dtype"].kind != "f":
        raise StreamError(f"{where}: the block has dtype {info['dtype']}; training needs floating-point data")
    if len(shape) != 2 or shape[1] != D:
        raise StreamError(f"{where}: the block has shape {shape}; every block must have shape (rows, {D})")
    arr, ptr = device_block(raw, dtype)
    bad = cuda_arrays.first_non_finite(arr)
    if bad is not None:
        r, c = bad
        raise StreamError(
            f"{where}: NaN or infinity (or a value beyond the {np.dtype(dtype).name} range) at row {r0 + r} "
            f"(row {r} of the block), column {c}; remove or impute those events"
        )
    return arr, ptr


def _check_weights(w, addr, b, r0, n) -> np.ndarray:
    where = _where(addr, b, r0, n)
    if cuda_arrays.is_cuda_array(w):
        w = cuda_arrays.to_host(w)
    arr = np.asarray(w)
    if arr.dtype.kind not in "fiub":
        raise StreamError(f"sample_weight {where}: dtype {arr.dtype} is not numeric; pass float weights")
    arr = arr.astype(np.float64).reshape(-1) if arr.ndim == 2 and arr.shape[1:] == (1,) else arr.astype(np.float64)
    if arr.shape != (n,):
        raise StreamError(
            f"sample_weight {where}: has shape {arr.shape} where X's block has {n} rows; sample_weight "
            "must be a 1-D array aligned with X's rows"
        )
    ok = np.isfinite(arr) & (arr >= 0)
    if not ok.all():
        r = int(np.argmin(ok))
        raise StreamError(
            f"sample_weight {where}: {arr[r]} at row {r0 + r} (row {r} of the block); weights must be finite and >= 0"
        )
    return arr


def _whole_plan(sp, problem: Problem, variant):
    """:func:`asp_gmm.streaming.plan` for ``problem`` itself (no cap at the streaming block size): the
    selection (and tunables) an in-process fit of all of X would get."""
    from .. import selection

    cands = sp.candidates(problem, variant)
    choice = sp.policy.choose(sp.backend, problem, cands, pinned=variant is not None, tuning=False)
    order = [choice.primary] + [
        c for c in selection.rule_order(sp.backend, cands, problem.kernel_cvtype) if c != choice.primary
    ]
    for cfg in order:
        kernel = sp._kernel(cfg, problem, sp.policy, reraise=variant is not None)
        if kernel is not None:
            return streaming.StreamPlan(problem, cfg, kernel, choice.reason)
    from ..errors import KernelError

    raise KernelError("every candidate variant failed to compile; see the warnings above")


# ------------------------------------------------------------------------------ the blocks
@dataclass
class _Item:
    b: int  # global block index
    r0: int  # its first global row
    n: int
    host: np.ndarray | None  # validated rows in the working dtype (host)
    dev: object = None  # the device array or allocation holding them (GPU workers)
    ptr: int = 0
    w: np.ndarray | None = None


class BlockStore:
    """One worker's blocks, validated once and kept where its kernels read them."""

    def __init__(self, spec: LoopSpec, blocks, weights, addr: str):
        from ..specializer import Specializer

        p = spec.problem
        self.spec, self.addr = spec, addr
        self.loads = 0
        self.items: list[_Item] = []
        self.runner = None
        sp = Specializer(spec.backend)
        self.backend = sp.backend
        self.gpu = self.backend.name == "cuda"
        dt = p.np_dtype
        rows = max([int(getattr(x, "shape", (1,))[0]) for x in blocks] + [1])
        resident_gpu = self.gpu and not spec.weighted
        # the C core: all of this worker's rows packed once into one state, as an in-process session
        # packs X (a pass is one asp_stats call: no per-pass packing, no per-block OpenMP fork/joins);
        # others: the streamed runner
        self.packed = self.backend.name == "c" and not spec.weighted
        if self.packed:  # the configuration an in-process fit of all of X would run
            self.plan = _whole_plan(sp, p, spec.variant)
        else:  # blocks of at most the backend's streaming size
            self.plan = streaming.plan(
                sp, Problem(rows, p.D, p.M, p.cvtype, p.dtype), spec.variant, weighted=spec.weighted
            )
        self.cap = int(self.plan.problem.N) if not self.packed else rows
        if resident_gpu:
            from ._cuda import ResidentCudaRunner

            self.runner = ResidentCudaRunner(self.backend, self.plan.problem, self.plan.kernel)
        elif spec.weighted:
            # the backend's weighted runner: its kernels fold each block's weights into the posteriors
            # (C, CUDA: the rows and weights kept on the device after the first pass; the blocks are
            # this worker's, unchanged for the whole fit)
            self.runner = self.backend.open_weighted_stats(self.plan.problem, self.plan.kernel, resident=True)
        elif not self.packed:
            self.runner = self.backend.open_stats(self.plan.problem, self.plan.kernel)
        try:
            for raw, w, b, r0 in zip(blocks, weights, spec.block_ids, spec.starts):
                if self.gpu and cuda_arrays.is_cuda_array(raw):
                    arr, ptr = _check_device(raw, addr, b, r0, p.D, dt)
                    n = int(arr.shape[0])
                    item = _Item(b, r0, n, None, arr, ptr)
                    if spec.weighted:
                        item.host = np.ascontiguousarray(cuda_arrays.to_host(arr))
                else:
                    host = _check_host(raw, addr, b, r0, p.D, dt)
                    item = _Item(b, r0, host.shape[0], host)
                    if resident_gpu:
                        item.dev = self.runner.upload(host)  # once: every pass reads the device copy
                        item.ptr = int(item.dev)

                self.loads += 1
                if w is not None:
                    item.w = _check_weights(w, addr, b, r0, item.n)
                self.items.append(item)
            if resident_gpu:
                self.runner.sync()
            if self.packed:
                self._pack()
        except BaseException:
            self.close()
            raise

    def _pack(self) -> None:
        """One C state over the concatenation of the blocks (the blocks become views of it)."""
        from ._cpu import ResidentCRunner, block_problem

        hosts = [it.host for it in self.items]
        cat = hosts[0] if len(hosts) == 1 else np.concatenate(hosts)
        a = 0
        for it in self.items:
            it.host = cat[a : a + it.n]
            a += it.n
        self.runner = ResidentCRunner(self.backend, block_problem(self.plan.problem, a), self.plan.kernel, cat)

    def summary(self) -> dict:
        return {
            "rows": {it.b: it.n for it in self.items},
            "wsum": {it.b: float(it.w.sum()) for it in self.items} if self.spec.weighted else None,
            "loads": self.loads,
            "variant": getattr(self.plan.config, "label", str(self.plan.config)),
            "variant_name": getattr(getattr(self.plan.config, "variant", None), "name", None),
            "reason": getattr(self.plan, "reason", ""),
        }

    # -------------------------------------------------------------- a pass
    def _pieces(self, it: _Item):
        for a in range(0, it.n, self.cap):
            yield a, min(self.cap, it.n - a)

    def stats(self, weights, means, covars, reg_covar) -> streaming.SuffStats:
        p = self.spec.problem
        st = streaming.SuffStats(p.M, p.D, p.cvtype, means)
        if self.spec.weighted:
            self.runner.set_params(weights, means, covars, reg_covar)
            pairs = [(it.host[a : a + n], it.w[a : a + n]) for it in self.items for a, n in self._pieces(it)]
            many = getattr(self.runner, "stats_weighted_many", None)  # (pipelined on the GPU)
            gen = many(iter(pairs)) if many is not None else (self.runner.stats_weighted(x, w) for x, w in pairs)
            for (x, _w), bs in zip(pairs, gen):
                st.add_block(bs, x.shape[0])
            return st
        if self.packed:
            self.runner.set_params(weights, means, covars, reg_covar)
            st.add_block(self.runner.stats())
            return st
        self.runner.set_params(weights, means, covars, reg_covar)
        if self.gpu:
            isz = p.D * p.np_dtype.itemsize
            gen = self.runner.stats_pieces((it.ptr + a * isz, n) for it in self.items for a, n in self._pieces(it))
        else:
            gen = self.runner.stats_many(it.host[a : a + n] for it in self.items for a, n in self._pieces(it))
        for bs in gen:
            st.add_block(bs)
        return st

    # -------------------------------------------------------------- seeding
    def seed_sums(self, shift, wanted, by_row=True):
        """``(n or sum of weights, sum y, sum yy^T or sum y^2, {m: row})`` of ``y = x - shift`` over
        the blocks, and the rows the client asked for: ``wanted`` maps a block index to
        ``[(m, local row)]``, or (``by_row`` false) to ``[(m, position)]`` on the block's weight
        scale: the row whose cumulative weight first exceeds it."""
        p = self.spec.problem
        full = p.cvtype == "full"
        n, s1, s2, rows = 0.0, np.zeros(p.D), np.zeros((p.D, p.D) if full else p.D), {}
        for it in self.items:
            sums = None
            if it.host is None:
                from ._cuda import device_seed_sums

                sums = device_seed_sums(it.dev, shift, p.cvtype, it.w)
                x = None
            if sums is None:
                x = it.host if it.host is not None else cuda_arrays.to_host(it.dev)
                y = x.astype(np.float64) - shift
                if it.w is None:
                    sums = (float(it.n), y.sum(0), y.T @ y if full else (y * y).sum(0))
                else:
                    sums = (float(it.w.sum()), it.w @ y, (y * it.w[:, None]).T @ y if full else it.w @ (y * y))
            n, s1, s2 = n + sums[0], s1 + sums[1], s2 + sums[2]
            for m, pos in wanted.get(it.b, ()):
                r = int(pos) if by_row else int(np.searchsorted(np.cumsum(it.w), pos, side="right"))
                r = min(r, it.n - 1)
                row = x[r] if x is not None else cuda_arrays.rows(it.dev, [r])[0]
                rows[m] = np.asarray(row, np.float64)
        return n, s1, s2, rows

    def close(self) -> None:
        ses = getattr(self.runner, "session", None)
        with ses.dev.active() if ses is not None else contextlib.nullcontext():
            for it in self.items:
                if it.dev is not None and hasattr(it.dev, "free"):  # an upload (not a CUDA array of X)
                    try:
                        it.dev.free()
                    except Exception:  # noqa: BLE001 - the context is gone with the process
                        pass
        self.items = []
        if self.runner is not None:
            self.runner.close()
            self.runner = None
