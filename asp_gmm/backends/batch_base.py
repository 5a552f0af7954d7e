"""Batched sessions: many independent problems (one D, cvtype and dtype; each its own data, N and
M) trained in one call. A backend's batched variants (``phase = "batch"`` manifests) are compiled
and opened through a :class:`BatchSupport`; :class:`LoopBatchSession` runs the members one after
another on ordinary sessions (the NumPy backend, and the reference the batched variants are
tested against).

Members fail alone: a member whose parameters are not positive definite, or whose EM fails, gets
its exception in its :class:`MemberRun` and keeps its last good parameters; the others run on.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field

import numpy as np

from .. import registry
from ..problem import BatchProblem, Problem
from .base import Backend, Kernel


@dataclass
class MemberRun:
    """What a batched EM call did for one member (see :class:`asp_gmm.backends.base.EMRun`).

    ``error`` is the exception the member raised (its parameters are then its last good ones),
    ``None`` when it ran."""

    loglik: float = float("nan")
    iters: int = 0
    converged: bool = False
    loglik_trace: list = field(default_factory=list)
    seconds: float = 0.0
    error: BaseException | None = None


@dataclass
class BatchRuns:
    """What a batched EM call did, as arrays over its B members (the array form of a list of
    :class:`MemberRun`: a batch of 1 000 small problems is not 1 000 Python objects).

    Attributes
    ----------
    loglik : ndarray (B,)
        Each member's last log-likelihood (NaN for a member skipped or failed before its first).
    iters : ndarray of int (B,)
    converged : ndarray of bool (B,)
    trace : ndarray (B, max_iters + 1)
        Each member's log-likelihood after 0, 1, ... iterations; NaN past its ``iters``.
    errors : dict
        Member -> the exception it raised (its parameters are then its last good ones).
    skipped : ndarray of bool (B,)
        Members that did not run (refused before the call).
    """

    loglik: np.ndarray
    iters: np.ndarray
    converged: np.ndarray
    trace: np.ndarray
    errors: dict
    skipped: np.ndarray

    @classmethod
    def empty(cls, B: int, max_iters: int, skipped: bool = False) -> "BatchRuns":
        """B members that have not run (``skipped``: marked as skipped, to be filled in)."""
        return cls(
            np.full(B, np.nan),
            np.zeros(B, np.int64),
            np.zeros(B, bool),
            np.full((B, max_iters + 1), np.nan),
            {},
            np.full(B, skipped),
        )

    @classmethod
    def of(cls, runs: list, max_iters: int, skip=()) -> "BatchRuns":
        """The arrays of a list of :class:`MemberRun` (members in ``skip`` did not run)."""
        out = cls.empty(len(runs), max_iters)
        for b, r in enumerate(runs):
            if b in skip:
                out.skipped[b] = True
                continue
            out.loglik[b], out.iters[b], out.converged[b] = r.loglik, r.iters, r.converged
            t = list(r.loglik_trace)[: max_iters + 1]
            out.trace[b, : len(t)] = t
            if r.error is not None:
                out.errors[b] = r.error
        return out

    def member_runs(self) -> list:
        """The same as a list of :class:`MemberRun`."""
        runs = []
        for b in range(len(self.loglik)):
            if self.skipped[b]:
                runs.append(MemberRun())
                continue
            k = int(self.iters[b])
            runs.append(
                MemberRun(
                    float(self.loglik[b]),
                    k,
                    bool(self.converged[b]),
                    self.trace[b, : k + 1].tolist(),
                    0.0,
                    self.errors.get(b),
                )
            )
        return runs


class DeviceStack:
    """B members of equal N as one C-contiguous (B, N, D) CUDA array (PyTorch, CuPy), checked:
    a batched session of the CUDA backend copies it on the device (no host copy). Indexing and
    iteration give each member as a host array (a backend that cannot take it)."""

    def __init__(self, X, ptr: int, shape: tuple, dtype):
        self.X, self.ptr, self.shape, self.dtype = X, int(ptr), tuple(shape), np.dtype(dtype)
        self.ndim = 3

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, b):
        from ..cuda_arrays import to_host

        return np.ascontiguousarray(to_host(self.X[b]), dtype=self.dtype)

    def __iter__(self):
        return (self[b] for b in range(len(self)))


class BatchSession(abc.ABC):
    """The members' data and parameters on one backend.

    Parameters are exchanged per member in float64: ``(weights (M_b,), means (M_b, D), covars
    (M_b, D, D) or (M_b, D))``, or, for members of one M, as stacked arrays
    (:meth:`set_params_stacked`, :meth:`params_stacked`, :meth:`em_arrays`: no per-member Python
    where the backend implements them)."""

    problems: list

    @abc.abstractmethod
    def set_params(self, params: list, reg_covars: list) -> list:
        """Load every member's parameters; returns, per member, ``None`` or the exception
        (:class:`asp_gmm.errors.NotPositiveDefiniteError`) that refused them."""

    @abc.abstractmethod
    def em(self, *, min_iters: int, max_iters: int, tol: float, reg_covars: list, skip=()) -> list:
        """EM on every member not in ``skip`` (indices); a :class:`MemberRun` per member."""

    @abc.abstractmethod
    def params(self, b: int):
        """Float64 copies ``(weights, means, covars)`` of member ``b``."""

    @abc.abstractmethod
    def score(self, skip=()) -> list:
        """Per member: its per-event log-likelihood ``(N_b,)`` in the problem dtype, or the
        exception its E-step raised (``None`` for members in ``skip``)."""

    def set_params_stacked(self, weights, means, covars, reg_covars) -> list:
        """:meth:`set_params` for members of one M, given as float64 arrays ``weights (B, M)``,
        ``means (B, M, D)``, ``covars (B, M, D, D)`` or ``(B, M, D)``. By default split per member."""
        return self.set_params(list(zip(weights, means, covars)), reg_covars)

    def params_stacked(self):
        """Every member's float64 parameters as arrays ``(B, M, ...)`` (members of one M). By
        default stacked from :meth:`params`."""
        got = [self.params(b) for b in range(len(self.problems))]
        return tuple(np.stack([g[i] for g in got]) for i in range(3))

    def em_arrays(self, *, min_iters: int, max_iters: int, tol: float, reg_covars: list, skip=()) -> BatchRuns:
        """:meth:`em` with its results as arrays (:class:`BatchRuns`). By default from :meth:`em`."""
        runs = self.em(min_iters=min_iters, max_iters=max_iters, tol=tol, reg_covars=reg_covars, skip=skip)
        return BatchRuns.of(runs, max_iters, skip)

    def close(self) -> None:  # pragma: no cover - default: garbage collection frees everything
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class BatchSupport(abc.ABC):
    """A backend's batched variants: which exist, compiling them, opening sessions."""

    #: Batched variant names in the order the fixed rule prefers them (when nothing is measured).
    preference: tuple = ()
    #: Whether :meth:`open` takes members given as parts (an object with a ``parts`` tuple of
    #: arrays, e.g. :class:`asp_gmm.Concat`: the member is their rows in order); otherwise the
    #: driver concatenates them first.
    takes_parts: bool = False
    #: Whether :meth:`open` takes members given as rows of an immutable array (an object with ``X``
    #: and ``index``, e.g. :class:`asp_gmm.Rows`); otherwise the driver takes ``X[index]`` first.
    takes_rows: bool = False

    #: Seconds a configuration found not compiled is taken as such without looking again.
    ABSENT_S = 5.0

    def __init__(self, backend: Backend):
        self.backend = backend
        self._found: set = set()  # keys whose binaries are in the compile cache
        self._absent: dict = {}  # key -> when its binary was last found missing (time.monotonic)

    def _in_cache(self, key, lookup) -> bool:
        """Whether the binary of configuration ``key`` is in the compile cache, ``lookup()`` (which
        renders its source and asks the cache) called at most once for a found one (cache entries are
        only ever added or rebuilt) and once per :data:`ABSENT_S` seconds for a missing one (another
        process may compile it; a compile in this process loads it, which :meth:`is_ready` sees
        first). The selection asks for every candidate on every call: rendering each untried
        configuration cost ~1 ms of a batched call on either backend."""
        if key in self._found:
            return True
        now = time.monotonic()
        if now - self._absent.get(key, -self.ABSENT_S) < self.ABSENT_S:
            return False
        if lookup():
            self._found.add(key)
            self._absent.pop(key, None)
            return True
        self._absent[key] = now
        return False

    def variants(self) -> list:
        return registry.variants(self.backend.name, "batch")

    def tunables_for(self, variant, problem: BatchProblem) -> dict | None:
        return variant.first_allowed(problem, extra=self.backend.limit_context())

    def is_ready(self, variant, tunables, problem: BatchProblem) -> bool:
        return True

    def readiness_token(self):
        """A value that changes when :meth:`is_ready` may answer differently (binaries found
        compiled or loaded in this process): a settled batch class is planned again then."""
        return len(self._found)

    @abc.abstractmethod
    def kernel(self, variant, tunables, problem: BatchProblem) -> Kernel:
        """Compile (or load) the batched variant for the batch's class."""

    def prepare_class(self, problem: BatchProblem) -> None:
        """Compile (or load) what the class's calls need besides their batched kernel (nothing by
        default); called by :meth:`asp_gmm.batch_driver.BatchSpecializer.prepare`, beside the kernels."""

    @abc.abstractmethod
    def open(self, Xs: list, problems: list, kernel: Kernel) -> BatchSession:
        """A session over the members' data ``Xs`` (each ``(N_b, D)``) of ``problems``."""

    def open_scoring(self, Xs: list, problems: list, kernel: Kernel) -> BatchSession:
        """A session that only sets parameters and scores (no ``em``); members may share one data
        array (``Xs[a] is Xs[b]``), which a backend may then hold once. By default :meth:`open`."""
        return self.open(Xs, problems, kernel)


class LoopBatchSession(BatchSession):
    """One ordinary session per member, run in turn with ``kernel`` (a covariance kernel of the
    backend, or ``kernels[b]`` per member)."""

    def __init__(self, backend: Backend, Xs: list, problems: list, kernels: list):
        self.backend, self.problems, self._kernels = backend, list(problems), list(kernels)
        self._sessions = [backend.open(X, p) for X, p in zip(Xs, problems)]

    def set_params(self, params, reg_covars):
        out = []
        for s, (w, mu, cv), reg in zip(self._sessions, params, reg_covars):
            try:
                s.set_params(w, mu, cv, reg)
                out.append(None)
            except (ArithmeticError, ValueError, np.linalg.LinAlgError) as exc:
                out.append(exc)
        return out

    def em(self, *, min_iters, max_iters, tol, reg_covars, skip=()):
        runs = []
        for b, (s, k, reg) in enumerate(zip(self._sessions, self._kernels, reg_covars)):
            if b in skip:
                runs.append(MemberRun())
                continue
            t0 = time.perf_counter()
            try:
                r = s.em(k, min_iters=min_iters, max_iters=max_iters, tol=tol, reg_covar=reg)
            except (ArithmeticError, ValueError, np.linalg.LinAlgError, RuntimeError) as exc:
                runs.append(MemberRun(error=exc, seconds=time.perf_counter() - t0))
                continue
            runs.append(MemberRun(r.loglik, r.iters, r.converged, list(r.loglik_trace), time.perf_counter() - t0))
        return runs

    def params(self, b):
        return self._sessions[b].params()

    def score(self, skip=()):
        out = []
        for b, s in enumerate(self._sessions):
            if b in skip:
                out.append(None)
                continue
            try:
                out.append(s.eval(False)[0])
            except (ArithmeticError, ValueError, np.linalg.LinAlgError, RuntimeError) as exc:
                out.append(exc)
        return out

    def close(self):
        for s in self._sessions:
            s.close()


def member_problems(problems: list) -> BatchProblem:
    """The batch class of ``problems`` (see :class:`asp_gmm.problem.BatchProblem`)."""
    return BatchProblem.of(problems)


def check_problems(problems: list) -> None:
    """Members of one batch share D, cvtype and dtype."""
    p0 = problems[0]
    if isinstance(p0, Problem) and problems.count(p0) == len(problems):
        return  # one Problem for every member (a GMMBatch of equal N): nothing to compare
    for b, p in enumerate(problems):
        if not isinstance(p, Problem) or (p.D, p.cvtype, p.dtype) != (p0.D, p0.cvtype, p0.dtype):
            raise ValueError(
                f"member {b} is {p}; every member of a batch has D={p0.D}, cvtype={p0.cvtype!r}, dtype={p0.dtype!r}"
            )
