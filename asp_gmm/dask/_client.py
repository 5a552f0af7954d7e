"""On the client: :func:`fit` checks the input, persists it, starts one loop per worker
(:mod:`asp_gmm.dask._worker`), seeds, and drives the passes: parameters out to every loop, float64
sufficient statistics back, summed here in a fixed order, M-step here. A lost worker restarts the
pass from the last parameters with new loops over wherever the blocks live now (Dask recomputes the
lost ones from X's graph, that is from their source)."""

from __future__ import annotations

import atexit
import contextlib
import logging
import numbers
import queue
import threading
import time
import uuid

import numpy as np

from .. import cuda_arrays, streaming
from ..errors import NonFiniteError, from_reference
from ..problem import CVTYPES, KERNEL_CVTYPE, Problem, per_component
from ..reference import NotPositiveDefiniteError, change_per_event, precision_cholesky
from ..reference import converged as converged_rule
from ._result import (
    DaskFitResult,
    DaskInputError,
    WorkersLostError,
    _check_array,
    _check_sample_weight,
    _dask,
    _int_arg,
)
from ._worker import LoopSpec, pack, param_queue, stats_queue, unpack, worker_loop

log = logging.getLogger("asp_gmm")

#: Seconds between two checks that every loop's worker is still there, while replies are awaited.
POLL_SECONDS = 0.5


class _Lost(Exception):
    """A loop's worker left (or its task was restarted elsewhere): start the loops again."""


# ------------------------------------------------------------------------------ the local client
_local_lock = threading.Lock()
_local = {}


def _local_client():
    """A client of a one-worker cluster in this process (started once, closed at exit): what a fit
    runs on when no Dask client exists."""
    from distributed import Client, LocalCluster

    with _local_lock:
        c = _local.get("client")
        if c is None or c.status != "running":
            cluster = LocalCluster(
                n_workers=1,
                threads_per_worker=1,
                processes=False,
                dashboard_address=None,
                worker_dashboard_address=None,
            )
            c = Client(cluster, set_as_default=False)
            _local.update(client=c, cluster=cluster)
            atexit.register(_close_local)
        return c


def _close_local():
    with _local_lock:
        for k in ("client", "cluster"):
            obj = _local.pop(k, None)
            if obj is not None:
                with contextlib.suppress(Exception):
                    obj.close()


# ------------------------------------------------------------------------------ checks
def fit(
    X,
    M: int,
    *,
    cvtype: str = "full",
    dtype=np.float32,
    weights=None,
    means=None,
    covars=None,
    reg_covar: float = 1e-6,
    min_iters: int = 1,
    max_iters: int = 10,
    tol: float = 1e-3,
    backend: str = "auto",
    variant: str | None = None,
    seed=None,
    client=None,
    sample_weight=None,
    max_restarts: int = 3,
    split_every: int = 8,
    progress: bool | None = None,
    callback=None,
) -> DaskFitResult:
    """Train a Gaussian mixture on a Dask array with the specialized kernels on every worker, the
    data resident where it lies and one EM loop per worker.

    Parameters
    ----------
    X : dask.array.Array (N, D), float
        Rows are the events (rechunked to whole rows). Persisted on the cluster by the fit (kept
        where it is when already persisted); each worker's blocks are validated once and stay in its
        memory, on its GPU for a GPU worker (a CuPy-backed array is used where it lies).
    M : int
        Components.
    cvtype : {"full", "diag", "tied", "spherical"}
        ("tied" and "spherical": the workers compute the per-component statistics of "full" and
        "diag"; the client reduces each M-step to the type)
    dtype : {np.float32, np.float64}
        Working precision of the workers' kernels (statistics are summed in float64).
    weights, means, covars : arrays (M,), (M, D), (M, D, D) or (M, D), optional
        Initial parameters; those missing are seeded as ``GMM.train`` seeds them (means at events
        at even intervals, or ``seed``'s random distinct events; the data's covariance).
    reg_covar, min_iters, max_iters, tol
        As ``GMM(reg_covar=...)`` and ``GMM.train(min_em_iters, max_em_iters, tol)``; the change
        compared with ``tol`` is per unit of weight.
    backend : {"auto", "c", "cuda", "numpy"}
        The backend every worker asks for ("auto": CUDA where the worker has a GPU, else C).
    variant : str, optional
        Pin a covariance variant on every worker.
    seed : int, optional
    client : distributed.Client or False, optional
        Default: the current client (``distributed.get_client``) if there is one, else (and with
        ``False``) a one-worker cluster in this process.
    sample_weight : dask.array.Array (N,) or ndarray (N,), optional
        A non-negative weight per row of X (rechunked to X's rows); statistics are weighted, so an
        integer weight equals repeating the row. Weighted passes compute the posteriors of each
        block and weight them in float64 (slower than the unweighted kernels).
    max_restarts : int
        Times a pass may be started again after a lost worker before :class:`WorkersLostError`.
    split_every : int
        Ignored (statistics are summed on the client); kept for callers of the earlier API.
    progress : bool, optional
        A progress bar per pass (tqdm; default ``ASP_GMM_PROGRESS``); each pass is logged at INFO.
    callback : callable, optional
        Called on the client after each pass as ``callback(pass_index, loglik)``.

    Returns
    -------
    DaskFitResult

    Examples
    --------
    >>> import dask.array as da
    >>> import numpy as np
    >>> import asp_gmm.dask
    >>> X = np.concatenate([np.random.default_rng(0).normal(m, 1, (500, 2)) for m in (0, 6)])
    >>> r = asp_gmm.dask.fit(da.from_array(X, chunks=(250, 2)), M=2, cvtype="diag", client=False)
    >>> r.means.shape, r.covars.shape
    ((2, 2), (2, 2))
    """
    _dask()
    _int_arg("M", M, 1)
    _int_arg("split_every", split_every, 2)
    _int_arg("max_restarts", max_restarts, 0)
    if cvtype not in CVTYPES:
        raise DaskInputError(f"cvtype must be one of {', '.join(map(repr, CVTYPES))}, got {cvtype!r}")
    _int_arg("min_iters", min_iters, 0)
    _int_arg("max_iters", max_iters, 0)
    if not (isinstance(tol, numbers.Real) and tol >= 0):
        raise DaskInputError(f"tol must be a number >= 0, got {tol!r}")
    if not (isinstance(reg_covar, numbers.Real) and reg_covar >= 0 and np.isfinite(reg_covar)):
        raise DaskInputError(f"reg_covar must be a finite number >= 0, got {reg_covar!r}")
    dt = np.dtype(dtype)
    if dt not in (np.float32, np.float64):
        raise DaskInputError(f"dtype must be float32 or float64, got {dt}")
    X = _check_array(X)
    sw = _check_sample_weight(sample_weight, X)
    N, D = int(X.shape[0]), int(X.shape[1])
    if N < M:
        raise DaskInputError(f"X has N={N} events, fewer than the M={M} components; use fewer components or more data")
    if client is False:
        client = _local_client()
    elif client is None:
        try:
            from distributed import get_client

            client = get_client()
        except ValueError:
            client = _local_client()
    problem = Problem(N, D, M, KERNEL_CVTYPE[cvtype], dt.name)  # the workers' per-component statistics
    t_start = time.perf_counter()
    co = _Coordinator(client, X, sw, problem, backend, variant, max_restarts)
    try:
        return _em(
            co,
            X,
            problem,
            cvtype,
            weights,
            means,
            covars,
            float(reg_covar),
            min_iters,
            max_iters,
            tol,
            seed,
            progress,
            callback,
            t_start,
        )
    finally:
        co.close()


# ------------------------------------------------------------------------------ the coordinator
class _Coordinator:
    """The loops of one fit: started on the workers that hold X's blocks, asked for seeding sums
    and passes, started again where a worker was lost."""

    def __init__(self, client, X, sw, problem, backend, variant, max_restarts):
        from distributed import Queue, futures_of

        self.client, self.problem, self.backend, self.variant = client, problem, backend, variant
        self.max_restarts = max_restarts
        self.fit_id = uuid.uuid4().hex[:12]
        self.gen, self.loops, self.restarts, self.loads = -1, [], 0, 0
        self.starts = np.concatenate([[0], np.cumsum(X.chunks[0])[:-1]]).astype(int)
        self.futs = _ordered(futures_of(client.persist(X)), X.numblocks[0])
        self.wfuts = _ordered(futures_of(client.persist(sw)), X.numblocks[0]) if sw is not None else None
        self.replies = Queue(stats_queue(self.fit_id), client=client)
        # replies are read by a thread that waits on the Dask queue with no timeout (a timed-out
        # wait is an error logged by the scheduler); the client polls this local inbox instead
        self._inbox = queue.Queue()
        self._reader = threading.Thread(target=self._read, name=f"asp-gmm-{self.fit_id}", daemon=True)
        self._reader.start()
        self.summaries = []
        try:
            try:
                self._start()
            except _Lost as lost:
                self._restart(lost)
        except BaseException:
            self.close()  # (bad data: the loops, the reader and the queues go now)
            raise

    def _read(self):
        while True:
            try:
                msg = unpack(self.replies.get())
            except Exception as exc:  # noqa: BLE001 - the client or the scheduler went away
                self._inbox.put(("__gone__", -1, -1, exc))
                return
            if msg[0] == "__bye__":
                return
            self._inbox.put(msg)

    # -------------------------------------------------------------- loops
    def _start(self):
        from distributed import Queue, wait

        self.gen += 1
        with self.client.as_current():  # (the local client is nobody's default)
            wait(self.futs + (self.wfuts or []))
        who = self.client.who_has(self.futs)
        live = sorted(self.client.ncores())
        groups: dict = {}
        for j, f in enumerate(self.futs):
            holders = sorted(a for a in who.get(f.key, ()) if a in live) or live[j % len(live) : j % len(live) + 1]
            groups.setdefault(holders[0], []).append(j)
        self.loops, self.block_ids = [], []
        for i, addr in enumerate(sorted(groups)):
            idx = groups[addr]
            spec = LoopSpec(
                self.fit_id,
                self.gen,
                i,
                self.problem,
                self.backend,
                self.variant,
                tuple(idx),
                tuple(int(self.starts[j]) for j in idx),
                self.wfuts is not None,
            )
            args = [self.futs[j] for j in idx] + ([self.wfuts[j] for j in idx] if self.wfuts is not None else [])
            q = Queue(param_queue(self.fit_id, self.gen, i), client=self.client)
            fut = self.client.submit(
                worker_loop,
                spec,
                *args,
                workers=[addr],
                allow_other_workers=False,
                pure=False,
                key=f"asp-gmm-loop-{self.fit_id}-{self.gen}-{i}",
            )
            self.loops.append((addr, fut, q))
            self.block_ids.append(idx)
        self.summaries = self._collect("ready", None)
        self.loads += sum(s["loads"] for s in self.summaries)

    def _stop(self, wait_s: float = 0.0):
        """Ask every loop to stop; with ``wait_s``, let them finish first (their ``finally`` closes
        the resident stores: pinned and device buffers on CUDA workers) before their queues are
        closed and what is still running is cancelled."""
        loops, self.loops = self.loops, []
        for _addr, fut, q in loops:
            with contextlib.suppress(Exception):
                q.put(pack(("stop", -1, None)))
        if wait_s > 0 and loops:
            from distributed import wait

            with contextlib.suppress(Exception), self.client.as_current():
                wait([f for _a, f, _q in loops], timeout=wait_s)
        for _addr, fut, q in loops:
            with contextlib.suppress(Exception):
                q.close()
        with contextlib.suppress(Exception):
            self.client.cancel([fut for _a, fut, _q in loops if not fut.done()], force=True)

    def close(self):
        self._stop(wait_s=10)
        with contextlib.suppress(Exception):
            self.replies.put(pack(("__bye__", -1, -1)))
            self._reader.join(10)
        with contextlib.suppress(Exception):
            self.replies.close()

    def _check(self):
        for _addr, fut, _q in self.loops:
            if fut.status == "error":
                exc = fut.exception()
                self._stop()
                raise exc
            if fut.status in ("finished", "cancelled", "lost"):
                raise _Lost(f"a loop ended early ({fut.status})")
        live = self.client.ncores()
        gone = [a for a, _f, _q in self.loops if a not in live]
        if gone:
            raise _Lost(f"worker(s) {', '.join(gone)} left")

    def _collect(self, kind, k):
        got = {}
        while len(got) < len(self.loops):
            try:
                tag, gen, i, *rest = self._inbox.get(timeout=POLL_SECONDS)
            except queue.Empty:
                self._check()
                continue
            if tag == "__gone__":
                raise rest[0]
            if gen != self.gen:
                continue  # from the loops of an abandoned generation
            if tag == "error":
                self._stop()
                raise rest[1]
            if tag == "ready" and kind != "ready":
                raise _Lost("a loop was started again (its worker was lost)")
            if tag != kind or (k is not None and rest[0] != k):
                continue
            got[i] = rest[-1]
        return [got[i] for i in range(len(self.loops))]

    def request(self, kind, k, payload):
        """Send ``(kind, k, payload(block indices of the loop))`` to every loop, return their
        replies in loop order; a lost worker starts the loops again and repeats the request."""
        while True:
            try:
                for (_addr, _fut, q), ids in zip(self.loops, self.block_ids):
                    q.put(pack((kind, k, payload(ids))))
                return self._collect(kind, k)
            except _Lost as lost:
                self._restart(lost)

    def _restart(self, lost):
        """Stop this generation's loops and start new ones where the blocks now live (again while a
        worker is lost during the start), at most ``max_restarts`` times per fit."""
        while True:
            self.restarts += 1
            if self.restarts > self.max_restarts:
                self._stop()
                raise WorkersLostError(
                    f"Dask workers were lost {self.restarts} times during one fit ({lost}); check the "
                    "workers' logs (memory limits, GPU errors) or raise max_restarts"
                ) from None
            log.warning("asp_gmm.dask: %s; the loops start again on the remaining workers", lost)
            self._stop()
            try:
                self._start()
                return
            except _Lost as again:
                lost = again


def _ordered(futs, n):
    """X's block futures in block order (keys ``(name, i, 0)``)."""
    by = {}
    for f in futs:
        key = f.key
        by[key[1] if isinstance(key, tuple) else len(by)] = f
    return [by[i] for i in range(n)]


# ------------------------------------------------------------------------------ the EM loop
def _em(
    co,
    X,
    problem,
    cvtype,
    weights,
    means,
    covars,
    reg_covar,
    min_iters,
    max_iters,
    tol,
    seed,
    progress,
    callback,
    t_start,
):
    N, D, M = problem.N, problem.D, problem.M
    wsum = None
    if co.wfuts is not None:
        per_block = {}
        for s in co.summaries:
            per_block.update(s["wsum"])
        wsum = np.array([per_block[j] for j in range(len(co.futs))])
        if not wsum.sum() > 0:
            raise DaskInputError("sample_weight sums to 0; give some rows a positive weight")
    total = float(wsum.sum()) if wsum is not None else float(N)
    if weights is None or means is None or covars is None:
        w0, mu0, cv0 = _seed(co, X, problem, reg_covar, seed, wsum)
        cv0 = streaming.seeded_as(cv0, cvtype)
        weights = w0 if weights is None else weights
        means = mu0 if means is None else means
        covars = cv0 if covars is None else covars
    w = np.array(weights, np.float64)
    mu = np.array(means, np.float64)
    cv = np.array(covars, np.float64)
    shape = Problem(N, D, M, cvtype).covars_shape()
    for name, arr, want in (("weights", w, (M,)), ("means", mu, (M, D)), ("covars", cv, shape)):
        if arr.shape != want or not np.isfinite(arr).all():
            raise DaskInputError(f"{name} must be a finite array of shape {want}, got shape {arr.shape}")
    bar = streaming._Progress(progress, N)
    compute = []

    def one_pass(k, w, mu, cv):
        bar.start(k, None)
        t0 = time.perf_counter()
        parts = co.request("pass", k, lambda _ids: (w, mu, cv, reg_covar))
        compute.append(max(getattr(p, "compute_seconds", 0.0) for p in parts))
        st = parts[0]
        for p in parts[1:]:
            st = st.add(p)
        if not np.isfinite(st.loglik):
            raise NonFiniteError(
                f"the log-likelihood is not finite ({st.loglik}): increase reg_covar, use fewer "
                "components, or scale the data"
            )
        bar.end(k, st, k)
        return st, time.perf_counter() - t0

    st, sec = one_pass(0, w, mu, per_component(cv, cvtype, M, D))
    if callback is not None:
        callback(0, st.loglik)
    ll, trace, secs, iters, converged = st.loglik, [st.loglik], [sec], 0, False
    while iters < max_iters:
        t0 = time.perf_counter()
        w, mu, cv = streaming.reduced_mstep(st, mu, per_component(cv, cvtype, M, D), reg_covar, cvtype)
        try:  # NotPositiveDefiniteError here, not on every worker
            precision_cholesky(cv, cvtype, reg_covar, n_features=D)
        except NotPositiveDefiniteError as exc:
            raise from_reference(exc) from None
        st, sec = one_pass(iters + 1, w, mu, per_component(cv, cvtype, M, D))
        iters += 1
        secs.append(time.perf_counter() - t0)  # the M-step and the pass
        trace.append(st.loglik)
        if callback is not None:
            callback(iters, st.loglik)
        change, ll = change_per_event(st.loglik, ll, total), st.loglik
        if converged_rule(iters, min_iters, change, tol):
            converged = True
            break
    first = co.summaries[0] if co.summaries else {}
    return DaskFitResult(
        weights=w,
        means=mu,
        covars=cv,
        loglik=ll,
        iters=iters,
        converged=converged,
        variant=str(first.get("variant") or ""),
        explored=[],
        reason=str(first.get("reason") or ""),
        seconds=time.perf_counter() - t_start,
        loglik_trace=trace,
        n_events=N,
        weight_sum=total if wsum is not None else 0.0,
        pass_seconds=secs,
        workers=len(co.loops),
        restarts=co.restarts,
        loads=co.loads,
        weight_total=total,
        compute_seconds=compute,
    )


def _seed(co, X, problem, reg_covar, seed, wsum):
    """Seeds as ``GMM.train`` does (with weights: as it seeds the rows repeated by their integer
    weights), in one request to the loops: sums around the first event and the M chosen rows."""
    N, D, M, cvtype = problem.N, problem.D, problem.M, problem.cvtype
    dt = problem.np_dtype
    first = co.client.compute(X[0]).result()
    if cuda_arrays.is_cuda_array(first):  # a CuPy-backed (or other device) Dask array
        first = cuda_arrays.to_host(first)
    shift = np.asarray(first).astype(dt).astype(np.float64)
    starts = co.starts
    wanted: dict = {}
    if wsum is None or seed is not None:
        if seed is None:
            idx = (np.arange(M) * N) // M
        else:
            idx = np.sort(np.random.default_rng(seed).choice(N, M, replace=False))
        blk = np.searchsorted(starts, idx, side="right") - 1
        for m, (b, i) in enumerate(zip(blk, idx)):
            wanted.setdefault(int(b), []).append((m, int(i - starts[b])))
    else:
        total = wsum.sum()
        if np.all(wsum == np.round(wsum)) and total < 2**53:  # integer weights: the repeated rows' indices
            pos = (np.arange(M, dtype=np.int64) * int(total)) // M
        else:
            pos = np.arange(M) * (total / M)
        cum = np.cumsum(wsum)
        blk = np.searchsorted(cum, pos, side="right")
        for m, (b, p) in enumerate(zip(blk, pos)):
            b = min(int(b), len(wsum) - 1)
            wanted.setdefault(b, []).append((m, float(p - (cum[b - 1] if b else 0.0))))
    by_row = wsum is None or seed is not None  # (random rows are chosen as without weights)
    parts = co.request("seed", 0, lambda ids: (shift, {b: wanted[b] for b in ids if b in wanted}, by_row))
    n, s1, s2, rows = 0.0, 0.0, 0.0, {}
    for pn, p1, p2, prow in parts:
        n, s1, s2 = n + pn, s1 + p1, s2 + p2
        rows.update(prow)
    means = np.stack([rows[m] for m in range(M)])
    m1 = s1 / n
    cov = s2 / n - (np.outer(m1, m1) if cvtype == "full" else m1 * m1)
    if not np.isfinite(means).all() or not np.isfinite(cov).all():
        raise DaskInputError("X contains NaN or infinity; remove or impute those events")
    if cvtype == "full":
        cov = 0.5 * (cov + cov.T) + reg_covar * np.eye(D)
        if np.any(np.diag(cov) <= 0):
            raise DaskInputError(
                "the data has zero variance in some dimension; increase reg_covar or drop constant features"
            )
        covars = np.repeat(cov[None], M, axis=0)
    else:
        if np.any(cov + reg_covar <= 0):
            raise DaskInputError(
                "the data has zero variance in some dimension; increase reg_covar or drop constant features"
            )
        covars = np.repeat((cov + reg_covar)[None], M, axis=0)
    covars = covars.astype(dt).astype(np.float64)
    return np.full(M, 1.0 / M, dtype=dt).astype(np.float64), means, covars
