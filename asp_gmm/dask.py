"""Distributed EM on Dask (``dask.distributed``): :func:`fit` trains a GMM on a ``dask.array``.

Every pass sends the current parameters with the tasks; each worker runs the specialized kernels
(C or CUDA, chosen by that worker's own selection and tuning history) over its own row blocks,
streaming them through the backend's per-block statistics exactly as a local streamed fit does
(:mod:`asp_gmm.streaming`), and returns float64 sufficient statistics. They are added in a tree
(``split_every`` at a time) on the workers and the root comes back to the client, which does the
M-step; the new parameters go out with the next pass. A worker lost mid-pass loses only tasks that
Dask recomputes from the graph (the tasks are pure), so the answer does not change.

One worker per GPU: :func:`gpu_cluster` (``dask-cuda``'s ``LocalCUDACluster`` where installed, else
one worker process per GPU with its own ``CUDA_VISIBLE_DEVICES``). CPU workers: any
``distributed.LocalCluster`` or a real cluster's ``Client``.

Requires ``dask[array]`` and ``distributed`` (``pip install asp_gmm[dask]``).
"""

from __future__ import annotations

import contextlib
import logging
import numbers
import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from . import streaming
from .errors import ASPGMMError, NonFiniteError, from_reference
from .problem import CVTYPES, KERNEL_CVTYPE, Problem
from .reference import NotPositiveDefiniteError, precision_cholesky

log = logging.getLogger("asp_gmm")

__all__ = ["fit", "DaskFitResult", "gpu_cluster"]


class DaskInputError(ASPGMMError, ValueError):
    """What was passed to :func:`asp_gmm.dask.fit` cannot be trained on; the message says why."""


def _dask():
    try:
        import dask
        import dask.array as da
    except ImportError as exc:  # pragma: no cover - the extra is installed where this is used
        raise ImportError(f"asp_gmm.dask needs dask: pip install 'asp_gmm[dask]' ({exc})") from exc
    return dask, da


@dataclass
class DaskFitResult:
    """Outcome of :func:`fit`.

    Attributes
    ----------
    weights : ndarray (M,); means : ndarray (M, D); covars : ndarray (M, D, D) or (M, D)
        Final parameters, float64.
    loglik : float
        Total log-likelihood of X under the final parameters.
    iters : int
    converged : bool
    n_events : int
    loglik_trace : list of float
        Before the first iteration and after each (``iters + 1`` values).
    pass_seconds : list of float
        Wall time of each pass (statistics on the workers, reduction, M-step).
    seconds : float
    """

    weights: np.ndarray
    means: np.ndarray
    covars: np.ndarray
    loglik: float
    iters: int
    converged: bool
    n_events: int
    loglik_trace: list = field(default_factory=list)
    pass_seconds: list = field(default_factory=list)
    seconds: float = 0.0


# ------------------------------------------------------------------------------ on the workers
_local = threading.local()


def _runner(backend: str, problem: Problem, variant):
    """This worker thread's statistics runner for ``problem`` (its own specializer, selection and
    history choose the variant; compiled kernels are cached per process)."""
    cache = getattr(_local, "runners", None)
    if cache is None:
        cache = _local.runners = {}
    key = (backend, problem, variant)
    hit = cache.get(key)
    if hit is None:
        from .specializer import Specializer

        spec = Specializer(backend)
        sp = streaming.plan(spec, problem, variant)
        hit = cache[key] = spec.backend.open_stats(sp.problem, sp.kernel)
    return hit


def block_stats(block, params, problem: Problem, backend: str, variant, chunk_index: int, first_row: int):
    """Task: :class:`~asp_gmm.streaming.SuffStats` of one row block of the Dask array under ``params``
    ``(weights, means, covars, reg_covar)``."""
    w, mu, cv, reg = params
    runner = _runner(backend, problem, variant)
    runner.set_params(w, mu, cv, reg)
    st = streaming.SuffStats(problem.M, problem.D, problem.cvtype, mu)
    src = streaming.ArraySource(np.asarray(block), chunk_rows=max(int(block.shape[0]), 1))
    for _start, blk in streaming.blocks(
        src, problem.D, problem.np_dtype, runner.problem.N, first_chunk=chunk_index, first_row=first_row
    ):
        st.add_block(runner.stats(blk))
    return st


def combine(*parts):
    """Task: the sum of several :class:`~asp_gmm.streaming.SuffStats` (one level of the tree)."""
    out = parts[0]
    for p in parts[1:]:
        out = out.add(p)
    return out


def seed_sums(block, shift, cvtype: str, dtype: str):
    """Task: ``(n, sum y, sum y y^T or sum y^2)`` of ``y = block - shift`` in float64, the block first
    rounded to the working ``dtype`` as ``GMM.train`` rounds X (seeding)."""
    y = np.asarray(block).astype(dtype).astype(np.float64) - shift
    return y.shape[0], y.sum(0), (y.T @ y if cvtype == "full" else (y * y).sum(0))


def add_seed_sums(*parts):
    n = sum(p[0] for p in parts)
    return n, sum(p[1] for p in parts), sum(p[2] for p in parts)


# ------------------------------------------------------------------------------ on the client
def _tree(dask, items, fn, split_every: int):
    while len(items) > 1:
        items = [dask.delayed(fn, pure=True)(*items[i : i + split_every]) for i in range(0, len(items), split_every)]
    return items[0]


def _compute(dask, obj, client):
    if client is not None:
        return client.compute(obj).result()
    return dask.compute(obj)[0]


def _check_array(X, D):
    dask, da = _dask()
    if not isinstance(X, da.Array):
        raise DaskInputError(
            f"asp_gmm.dask.fit needs a dask.array.Array, got {type(X).__name__}; wrap it with "
            "dask.array.from_array(X, chunks=(rows, -1)), or call GMM.train for in-memory data"
        )
    if X.ndim != 2:
        raise DaskInputError(f"X must be 2-D (N events, D dimensions), got shape {X.shape}")
    if X.dtype.kind != "f":
        raise DaskInputError(f"X has dtype {X.dtype}; GMM training needs floating-point data: X.astype(np.float32)")
    if D is not None and X.shape[1] != D:
        raise DaskInputError(f"X has {X.shape[1]} dimensions but D={D} was given")
    if any(np.isnan(c) for c in X.chunks[0]):
        raise DaskInputError("X has unknown chunk sizes; call X.compute_chunk_sizes() first")
    if len(X.chunks[1]) > 1:
        X = X.rechunk({1: -1})  # whole rows per block
    return X


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
    split_every: int = 8,
    progress: bool | None = None,
    callback=None,
) -> DaskFitResult:
    """Train a Gaussian mixture on a Dask array with the specialized kernels on every worker.

    Parameters
    ----------
    X : dask.array.Array (N, D), float
        Rows are the events; each row block is one task per pass (rechunked to whole rows). Persist
        it first (``X = X.persist()``) when it fits the cluster's memory, so that passes do not
        recompute or reload it.
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
        As ``GMM(reg_covar=...)`` and ``GMM.train(min_em_iters, max_em_iters, tol)``.
    backend : {"auto", "c", "cuda", "numpy"}
        The backend every worker asks for ("auto": CUDA where the worker has a GPU, else C).
    variant : str, optional
        Pin a covariance variant on every worker.
    seed : int, optional
    client : distributed.Client or False, optional
        Default: the current client (``distributed.get_client``) if there is one, else Dask's
        default scheduler in this process; ``False``: Dask's threaded scheduler in this process even
        where a client exists.
    split_every : int
        Fan-in of the reduction tree (>= 2).
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
    dask, da = _dask()
    for name, val in (("M", M), ("split_every", split_every)):
        if not isinstance(val, numbers.Integral) or isinstance(val, bool) or val < (1 if name == "M" else 2):
            raise DaskInputError(f"{name} must be an integer >= {1 if name == 'M' else 2}, got {val!r}")
    if cvtype not in CVTYPES:
        raise DaskInputError(f"cvtype must be one of {', '.join(map(repr, CVTYPES))}, got {cvtype!r}")
    for name, val in (("min_iters", min_iters), ("max_iters", max_iters)):
        if not isinstance(val, numbers.Integral) or isinstance(val, bool) or val < 0:
            raise DaskInputError(f"{name} must be an integer >= 0, got {val!r}")
    if not (isinstance(tol, numbers.Real) and tol >= 0):
        raise DaskInputError(f"tol must be a number >= 0, got {tol!r}")
    if not (isinstance(reg_covar, numbers.Real) and reg_covar >= 0 and np.isfinite(reg_covar)):
        raise DaskInputError(f"reg_covar must be a finite number >= 0, got {reg_covar!r}")
    dt = np.dtype(dtype)
    if dt not in (np.float32, np.float64):
        raise DaskInputError(f"dtype must be float32 or float64, got {dt}")
    X = _check_array(X, None)
    N = int(X.shape[0])
    if N < M:
        raise DaskInputError(f"X has N={N} events, fewer than the M={M} components; use fewer components or more data")
    local = contextlib.nullcontext()
    if client is False:
        client, local = None, dask.config.set(scheduler="threads")
    elif client is None:
        try:
            from distributed import get_client

            client = get_client()
        except (ImportError, ValueError):
            client = None
    with local:
        return _fit(
            dask,
            X,
            M,
            cvtype,
            dt,
            weights,
            means,
            covars,
            reg_covar,
            min_iters,
            max_iters,
            tol,
            backend,
            variant,
            seed,
            client,
            split_every,
            progress,
            callback,
        )


def _fit(
    dask,
    X,
    M,
    cvtype,
    dt,
    weights,
    means,
    covars,
    reg_covar,
    min_iters,
    max_iters,
    tol,
    backend,
    variant,
    seed,
    client,
    split_every,
    progress,
    callback,
):
    N, D = int(X.shape[0]), int(X.shape[1])
    t_start = time.perf_counter()
    parts = X.to_delayed().ravel()
    starts = np.concatenate([[0], np.cumsum(X.chunks[0])[:-1]]).astype(int)

    kcv = KERNEL_CVTYPE[cvtype]
    if weights is None or means is None or covars is None:
        w0, mu0, cv0 = _seed(dask, X, parts, M, kcv, dt, reg_covar, seed, client, split_every)
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
    problem = Problem(N, D, M, kcv, dt.name)  # the workers' per-component statistics
    bar = streaming._Progress(progress, N)

    def one_pass(k, w, mu, cv):
        bar.start(k, None)
        t0 = time.perf_counter()
        params = (w, mu, cv, float(reg_covar))
        if client is not None:
            params = client.scatter(params, broadcast=True, hash=False)
        tasks = [
            dask.delayed(block_stats, pure=True)(p, params, problem, backend, variant, i, int(s))
            for i, (p, s) in enumerate(zip(parts, starts))
        ]
        st = _compute(dask, _tree(dask, tasks, combine, split_every), client)
        if not np.isfinite(st.loglik):
            raise NonFiniteError(
                f"the log-likelihood is not finite ({st.loglik}): increase reg_covar, use fewer "
                "components, or scale the data"
            )
        bar.end(k, st, k)
        return st, time.perf_counter() - t0

    st, sec = one_pass(0, w, mu, streaming.per_component(cv, cvtype, M, D))
    if callback is not None:
        callback(0, st.loglik)
    ll, trace, secs, iters, converged = st.loglik, [st.loglik], [sec], 0, False
    while iters < max_iters:
        w, mu, cv = streaming.reduced_mstep(st, mu, streaming.per_component(cv, cvtype, M, D), reg_covar, cvtype)
        try:  # NotPositiveDefiniteError here, not on every worker
            precision_cholesky(cv, cvtype, reg_covar, n_features=D)
        except NotPositiveDefiniteError as exc:
            raise from_reference(exc) from None
        st, sec = one_pass(iters + 1, w, mu, streaming.per_component(cv, cvtype, M, D))
        iters += 1
        secs.append(sec)
        trace.append(st.loglik)
        if callback is not None:
            callback(iters, st.loglik)
        change, ll = (st.loglik - ll) / N, st.loglik
        if iters >= min_iters and abs(change) < tol:
            converged = True
            break
    return DaskFitResult(w, mu, cv, ll, iters, converged, N, trace, secs, time.perf_counter() - t_start)


def _seed(dask, X, parts, M, cvtype, dt, reg_covar, seed, client, split_every):
    """Seeds as ``GMM.train`` does, in one pass of sums around the first event plus a gather of M rows."""
    N, D = int(X.shape[0]), int(X.shape[1])
    shift = np.asarray(_compute(dask, X[0], client)).astype(dt).astype(np.float64)
    sums = [dask.delayed(seed_sums, pure=True)(p, shift, cvtype, dt.name) for p in parts]
    n, s1, s2 = _compute(dask, _tree(dask, sums, add_seed_sums, split_every), client)
    m1 = s1 / n
    cov = s2 / n - (np.outer(m1, m1) if cvtype == "full" else m1 * m1)
    if seed is None:
        idx = (np.arange(M) * N) // M
    else:
        idx = np.sort(np.random.default_rng(seed).choice(N, M, replace=False))
    means = np.asarray(_compute(dask, X[idx], client)).astype(dt).astype(np.float64)
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


# ------------------------------------------------------------------------------ GPU clusters
def gpu_count() -> int:
    """GPUs this host shows: ``CUDA_VISIBLE_DEVICES`` if set, else the CUDA driver's count (0 without one)."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return len([v for v in vis.split(",") if v.strip() and v.strip() != "-1"])
    try:
        import pycuda.driver as drv

        drv.init()
        return drv.Device.count()
    except Exception:  # noqa: BLE001 - no pycuda or no driver
        return 0


def gpu_worker_specs(n_gpus: int, threads_per_worker: int = 1) -> dict:
    """``distributed.SpecCluster`` worker specs: one nanny-managed worker process per GPU, each seeing
    only its GPU through ``CUDA_VISIBLE_DEVICES`` (used where dask-cuda is not installed)."""
    from distributed import Nanny

    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in vis.split(",") if v.strip()] if vis else [str(i) for i in range(n_gpus)]
    return {
        f"gpu-{i}": {"cls": Nanny, "options": {"nthreads": threads_per_worker, "env": {"CUDA_VISIBLE_DEVICES": ids[i]}}}
        for i in range(n_gpus)
    }


def gpu_cluster(n_gpus: int | None = None, **kwargs):
    """A local cluster with one worker per GPU: ``dask_cuda.LocalCUDACluster`` where dask-cuda is
    installed, else a ``distributed.SpecCluster`` of :func:`gpu_worker_specs`. ``kwargs`` go to
    the cluster class. Use it as ``with gpu_cluster() as cluster, Client(cluster) as client:``."""
    n = gpu_count() if n_gpus is None else int(n_gpus)
    if n < 1:
        raise DaskInputError(
            "no GPU is visible here (CUDA_VISIBLE_DEVICES or the CUDA driver); use a "
            "distributed.LocalCluster of CPU workers instead"
        )
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        from distributed import Scheduler, SpecCluster

        return SpecCluster(
            workers=gpu_worker_specs(n), scheduler={"cls": Scheduler, "options": {"dashboard_address": None}}, **kwargs
        )
    return LocalCUDACluster(n_workers=n, **kwargs)
