"""The small abstract base every runtime implements (numpy reference, C/OpenMP, CUDA).

A backend compiles (or loads from the cache) a variant for a problem into a :class:`Kernel` and opens
a :class:`Session` over one data set. A session owns the data and the model parameters on the
device and runs the EM loop; only scalars and, on request, the parameters come back.
Backends never import the Face (``asp_gmm.gmm``) nor the tuning history.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .. import registry
from ..problem import Problem


@dataclass
class EMRun:
    """What one call of :meth:`Session.em` did.

    Attributes
    ----------
    loglik : float
        Total log-likelihood of the session's data under the parameters after the call.
    iters : int
        EM iterations run (each an M-step followed by an E-step).
    converged : bool
        Stopped because the per-event change was below ``tol``.
    iter_seconds, cov_seconds : list of float
        Each iteration's time and the part of it spent in the covariance variant, measured by the
        backend's own timer (CPU monotonic clock, CUDA events).
    loglik_trace : list of float
        ``iters + 1`` values: the log-likelihood before the first iteration and after each one
        (scikit-learn's ``lower_bound_`` is the second to last, times 1/N).
    """

    loglik: float
    iters: int
    converged: bool
    iter_seconds: list = field(default_factory=list)
    cov_seconds: list = field(default_factory=list)
    loglik_trace: list = field(default_factory=list)


@dataclass(eq=False)
class Kernel:
    """A variant compiled for a problem class (backend, cvtype, dtype, tunables)."""

    variant: registry.Variant
    tunables: dict
    handle: object = None  # backend-specific: a function pointer, a cubin module...
    binary: str = ""  # path of the cached binary, if any

    @property
    def config(self) -> registry.Config:
        """The variant with its tunables (:class:`asp_gmm.registry.Config`) this kernel was compiled from."""
        return registry.Config(self.variant, tuple(sorted(self.tunables.items())))

    @property
    def label(self) -> str:
        return self.config.label


class Session(abc.ABC):
    """One data set and one model on a backend.

    Parameters are exchanged in float64: ``weights`` (M,), ``means`` (M, D), ``covars`` (M, D, D) for
    full or (M, D) for diag.
    """

    problem: Problem

    @abc.abstractmethod
    def set_params(self, weights, means, covars, reg_covar: float) -> None:
        """Load parameters; raises :class:`asp_gmm.errors.NotPositiveDefiniteError`."""

    @abc.abstractmethod
    def params(self):
        """Return float64 copies ``(weights, means, covars)``."""

    def em(self, kernel: Kernel, *, min_iters: int, max_iters: int, tol: float, reg_covar: float) -> EMRun:
        """Run up to ``max_iters`` EM iterations with ``kernel`` computing the covariance, stopping once
        :func:`asp_gmm.reference.converged` holds (at least ``min_iters`` done); keywords only:
        ``em(kernel, min_iters=1, max_iters=10, tol=1e-3, reg_covar=1e-6)``. Backends implement
        :meth:`_em`.
        """
        return self._em(
            kernel, min_iters=int(min_iters), max_iters=int(max_iters), tol=float(tol), reg_covar=float(reg_covar)
        )

    def _em(self, kernel: Kernel, *, min_iters: int, max_iters: int, tol: float, reg_covar: float) -> EMRun:
        """The backend's EM loop (see :meth:`em`)."""
        raise NotImplementedError(f"{type(self).__name__} implements neither em nor _em")

    @abc.abstractmethod
    def loglik(self) -> float:
        """Total log-likelihood under the current parameters (runs the E-step if needed)."""

    @abc.abstractmethod
    def eval(self, want_resp: bool = True):
        """``(logprob (N,), resp (N, M) or None)`` under the current parameters, in the problem dtype."""

    #: True when :meth:`set_sample_weight` folds sample weights into this session's own EM loop
    takes_sample_weight: bool = False

    def set_sample_weight(self, sample_weight) -> None:
        """Weigh every event of the session from now on: ``sample_weight`` (N,) float64, >= 0, checked
        by the caller. The posteriors of each E-step are multiplied by the weights, so the M-step
        sums, :meth:`loglik` and the change per unit of weight that stops :meth:`em` are weighted.
        Only a session with :attr:`takes_sample_weight`; the others run weighted fits as passes
        (:mod:`asp_gmm.fit.passes`)."""
        raise NotImplementedError(f"{type(self).__name__} takes no sample weights in its EM loop")

    def close(self) -> None:  # pragma: no cover - default: garbage collection frees everything
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_log = logging.getLogger("asp_gmm")
_futures_lock = threading.Lock()


def background_pool() -> ThreadPoolExecutor:
    """The default runtime's background-compile pool (:meth:`asp_gmm.runtime.Runtime.background_pool`)."""
    from ..runtime import default_runtime

    return default_runtime().background_pool()


def _logged(fn, what):
    def run():
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - kept in the future; the caller that waits sees it
            _log.info(
                "asp_gmm: background compile of %s failed: %s", what, str(exc).splitlines()[0] if str(exc) else exc
            )
            raise

    return run


class Backend(abc.ABC):
    """A runtime: where kernels are compiled and sessions run."""

    name: str = ""
    #: True when a binary is specific to (D, M) (CUDA), so a new problem shape means compiling.
    shape_specific_binaries: bool = False
    #: True when a configuration's first launch in a process costs more than its next ones (CUDA:
    #: its functions are loaded on first launch; measured on a 32 768-event sample of (500 000, 36,
    #: 128) diag on an H200, the first iteration took 1.2x (V5) to 3.8x (V4) the next one). The
    #: sampled exploration then runs each configuration twice and keeps the faster iteration: one
    #: run's time had V7 measured 3x too slow, and never chosen where it was the fastest.
    first_launch_costs_more: bool = False
    #: True when an EM iteration run alone (``em(max_iters=1)``) costs wall clock its timer does not
    #: see (a device's launches, synchronisation and read-backs around kernels timed by events):
    #: exploring in place is then charged for splitting a call (:meth:`asp_gmm.explore.InPlace.first`).
    #: A host backend's timer holds its whole iteration.
    split_costs_more: bool = False
    #: What a configuration nothing predicts is assumed to cost relative to the class's fastest when
    #: it would explore in place (:class:`asp_gmm.explore.InPlace`; ``Plan.unknown_ratio`` when that
    #: is wider): in place, a ratio set too low overshoots by whole iterations of the data, where a
    #: sampled run overshoots by a sample's.
    unknown_ratio_prior: float = 0.0
    #: Variants the fixed rule puts last because they are slow wherever a later one can run: one of
    #: them is not explored in a class where a variant the rule puts before it measured
    #: ``RULE_TAIL_FACTOR`` times the best or more (they stay fallbacks).
    rule_tail: tuple = ()
    #: True when an exploration sample leaves the device partly idle, so that a variant that gains
    #: with size looks slower on it than on the data (a GPU): every variant within
    #: ``CONFIRM_WITHIN`` of the fastest on the sample is checked on the data (``selection/confirm.py``).
    samples_underfill: bool = False
    #: Seconds a kernel's first load in a process is assumed to cost until one is measured (an
    #: exploring call charges it to its allowance before loading an unloaded configuration).
    load_seconds_prior: float = 0.0
    #: Seconds a sampled exploration's fixed part (the sample's session and upload, the runs'
    #: launches and read-backs) is assumed to cost until one is measured: a class whose EM
    #: iteration costs less than that explores in place instead (:func:`asp_gmm.explore.in_place_cheaper`).
    sample_fixed_prior: float = 0.0
    #: True when the compiled kernels take sample weights themselves (:meth:`open_weighted_stats`
    #: folds them into the posteriors on the device); a weighted fit then chooses among the
    #: covariance variants that declare it possible (:attr:`asp_gmm.registry.Variant.takes_weights`).
    weights_in_kernels: bool = False
    #: True when the backend's sessions weigh their events themselves
    #: (:meth:`Session.set_sample_weight`): a weighted in-memory fit then runs the session's EM loop
    weights_in_session: bool = False

    @classmethod
    @abc.abstractmethod
    def unavailable_reason(cls) -> str | None:
        """``None`` when the backend can run here, else why not (and what to install)."""

    @abc.abstractmethod
    def fingerprint(self) -> dict:
        """A stable description of the device: model, ISA or compute capability, core count,
        driver and compiler versions. Timings are only compared within one fingerprint."""

    def run_threads(self, problem) -> int | None:
        """CPU threads a run of ``problem`` uses (stored with its timing), ``None`` where that does
        not apply (a GPU)."""
        return None

    @property
    def device_id(self) -> str:
        """sha256 (first 16 hex digits) of the fingerprint: the device part of every stored key."""
        from ..tuning_db.devices import device_id  # no database import: the history's one formula

        return device_id(self.fingerprint())

    def covariance_variants(self, problem: Problem | None = None) -> list:
        """This backend's covariance variants (those whose declared limits allow ``problem`` with some
        combination of their tunables)."""
        vs = registry.variants(self.name, "covariance")
        return [v for v in vs if problem is None or self.tunables_for(v, problem) is not None]

    def tunables_for(self, variant, problem: Problem) -> dict | None:
        """The tunables ``variant`` runs ``problem`` with unless told otherwise: the first combination,
        defaults first, that its limits allow on this backend (``None``: it cannot run the problem)."""
        return variant.first_allowed(problem, extra=self.limit_context())

    def selection_key(self, problem: Problem) -> Problem:
        """What decides which variants can run ``problem`` on this backend: the problem with N set to
        0 when no covariance variant's limits name N (memo key for the specializer)."""
        if registry.limits_name_n(self.name, "covariance"):
            return problem
        return dataclasses.replace(problem, N=0)

    def limit_context(self) -> dict:
        """Device quantities the variants' limits may name (threads per block, shared memory...)."""
        return {}

    @abc.abstractmethod
    def kernel(self, variant: registry.Variant, tunables: dict | None, problem: Problem) -> Kernel:
        """Compile (or fetch from the cache) ``variant`` for ``problem``'s class."""

    def is_loaded(self, variant: registry.Variant, tunables: dict | None, problem: Problem) -> bool:
        """True when ``variant`` is loaded in this process for ``problem`` (running it costs no load;
        :attr:`load_seconds_prior`). Backends whose loads are cheap answer True."""
        return True

    def is_ready(self, variant: registry.Variant, tunables: dict | None, problem: Problem) -> bool:
        """Whether :meth:`kernel` would return without compiling (loaded, or in the disk cache)."""
        return True

    def readiness_token(self):
        """A value that changes when :meth:`is_ready` or :meth:`is_loaded` may answer differently
        (a kernel compiled or loaded in this process): a settled class's plan is made again then.
        Backends with nothing to load answer a constant."""
        return 0

    def prepare(self, problem: Problem) -> None:
        """Load (compiling if needed) what every session for ``problem`` runs besides the covariance
        variant (an EM core, an E-step), so that the first real call does not pay for it."""

    # ------------------------------------------------------------------ in the background
    def _futures(self) -> dict:
        f = self.__dict__.get("_bg_futures")
        if f is None:
            f = self.__dict__.setdefault("_bg_futures", {})
        return f

    def _submit(self, key, fn, what) -> Future:
        futs = self._futures()
        with _futures_lock:
            fut = futs.get(key)
            if fut is None or fut.cancelled():
                fut = futs[key] = background_pool().submit(_logged(fn, what))
        return fut

    def wait_background(self, timeout: float | None = None) -> bool:
        """Wait until this backend's background compiles have finished (failed ones included);
        ``False`` when ``timeout`` seconds passed first."""
        import concurrent.futures as cf

        with _futures_lock:
            futs = list(self._futures().values())
        _, pending = cf.wait(futs, timeout=timeout)
        return not pending

    def prepare_async(self, problem: Problem) -> Future:
        """Start :meth:`prepare` for ``problem`` in the background (once per problem class); the
        future's result is ``None``. A caller that needs the result simply calls :meth:`prepare`
        (it waits on the compile cache's lock, never compiles twice)."""
        return self._submit(
            ("prepare", self.prepare_key(problem)), lambda: self.prepare(problem), f"{self.name} modules of {problem}"
        )

    def prepare_key(self, problem: Problem):
        """What :meth:`prepare`'s work depends on (its binaries' problem class)."""
        return (problem.D, problem.M, problem.cvtype, problem.dtype)

    def kernel_async(self, variant, tunables: dict | None, problem: Problem) -> Future:
        """Compile ``variant`` for ``problem`` in the background; the future holds the :class:`Kernel`
        (or the :class:`~asp_gmm.errors.CompileError`)."""
        key = ("kernel", variant.key, tuple(sorted((tunables or {}).items())), self.prepare_key(problem))
        return self._submit(key, lambda: self.kernel(variant, tunables, problem), f"{variant.key} for {problem}")

    @abc.abstractmethod
    def open(self, X: np.ndarray, problem: Problem) -> Session:
        """Open a session over ``X`` ((N, D), C-contiguous, of ``problem.dtype``)."""

    # streamed EM (asp_gmm/streaming.py): the per-block contract
    def open_stats(self, problem: Problem, kernel: Kernel | None = None) -> "StatsRunner":
        """A :class:`StatsRunner` for blocks of up to ``problem.N`` events."""
        return StatsRunner(self, problem, kernel)

    def open_weighted_stats(
        self, problem: Problem, kernel: Kernel | None = None, resident: bool = False
    ) -> "StatsRunner":
        """A :class:`StatsRunner` whose :meth:`StatsRunner.stats_weighted` gives the statistics of
        weighted blocks. By default the backend's E-step gives each block's posteriors (a session
        per block) and the weights are folded into them in float64 NumPy; a backend whose kernels
        take the weights themselves overrides this (and sets :attr:`weights_in_kernels`).
        ``resident``: the blocks come from an in-memory array that fits the device and stays
        unchanged for the whole fit, so a runner may keep them on the device between passes."""
        return StatsRunner(self, problem, kernel)

    def stream_block_rows(self, problem: Problem) -> int:
        """Events per block of streamed EM (``problem.N`` ignored): by default as many as
        ``ASP_GMM_BLOCK_BYTES`` (default 64 MiB) of data and posteriors hold."""
        return block_rows_for(problem, default_bytes=64 << 20)

    def session_bytes(self, problem: Problem) -> int:
        """Device memory an in-memory session of ``problem`` takes: the data, the posteriors and the
        per-event log-likelihoods in the working precision."""
        return problem.N * (problem.D + problem.M + 1) * problem.np_dtype.itemsize


# ------------------------------------------------------------------------ per-block statistics
@dataclass
class BlockStats:
    """Sufficient statistics of one block of events under given parameters (streamed EM).

    Attributes
    ----------
    n : int
        Events in the block.
    loglik : float
        Sum of the block's per-event log-likelihoods.
    nk : ndarray (M,)
        Raw counts, sum over events of the posteriors.
    sumx : ndarray (M, D)
        Sum of ``resp * x``.
    s2 : ndarray (M, D, D) for full, (M, D) for diag
        Sum of ``resp * (x - m)(x - m)^T`` (or its diagonal), ``m`` the means the statistics were
        computed under (those of :meth:`StatsRunner.set_params`).
    """

    n: int
    loglik: float
    nk: np.ndarray
    sumx: np.ndarray
    s2: np.ndarray


def stats_from_posteriors(X, logprob, resp, means, cvtype: str, sample_weight=None) -> BlockStats:
    """:class:`BlockStats` of a block from its posteriors, in float64 NumPy; with ``sample_weight``
    ((n,) float64) the weights are folded into the posteriors and the log-likelihoods (``n`` is
    then the block's total weight).

    Parameters
    ----------
    X : ndarray (n, D)
    logprob : ndarray (n,)
    resp : ndarray (n, M)
    means : ndarray (M, D)
        The means the posteriors were computed under (the second moments are centred on them).
    """
    X = np.asarray(X, np.float64)
    resp = np.asarray(resp, np.float64)
    means = np.asarray(means, np.float64)
    n = X.shape[0]
    if sample_weight is not None:
        resp = resp * sample_weight[:, None]
        logprob = np.asarray(logprob, np.float64) * sample_weight
        n = float(np.sum(sample_weight))
    M, D = means.shape
    nk = resp.sum(axis=0)
    sumx = resp.T @ X
    full = cvtype in ("full", "tied")  # per-component second moments: full or diagonal
    s2 = np.empty((M, D, D) if full else (M, D))
    for k in range(M):
        diff = X - means[k]
        s2[k] = (resp[:, k] * diff.T) @ diff if full else resp[:, k] @ (diff * diff)
    return BlockStats(n, float(np.sum(logprob, dtype=np.float64)), nk, sumx, s2)


class StatsRunner:
    """The per-block contract of streamed EM: the E-step and the sufficient statistics of one block
    of events under given parameters; no posteriors are kept between blocks.

    This default opens a :class:`Session` per block and sums its posteriors in NumPy (any backend
    can stream through it); backends override it with compiled code.

    Parameters
    ----------
    backend : Backend
    problem : Problem
        The block problem: ``problem.N`` is the most events one :meth:`stats` call gets.
    kernel : Kernel or None
        The covariance variant to compute the second moments with, where the backend uses one.
    """

    def __init__(self, backend: "Backend", problem: Problem, kernel: Kernel | None = None):
        self.backend, self.problem, self.kernel = backend, problem, kernel
        self._params = None

    def set_params(self, weights, means, covars, reg_covar: float) -> None:
        """Parameters (float64) of the following :meth:`stats` calls; raises
        :class:`asp_gmm.errors.NotPositiveDefiniteError`."""
        from .. import reference as ref
        from ..errors import from_reference

        try:
            ref.precision_cholesky(covars, self.problem.cvtype, reg_covar)
        except ref.NotPositiveDefiniteError as exc:
            raise from_reference(exc) from None
        self._params = (
            np.array(weights, np.float64),
            np.array(means, np.float64),
            np.array(covars, np.float64),
            float(reg_covar),
        )

    def stats(self, X: np.ndarray) -> BlockStats:
        """Statistics of the block ``X`` ((n, D), C-contiguous, ``problem.dtype``, n <= ``problem.N``)."""
        w, mu, cv, reg = self._params
        sub = dataclasses.replace(self.problem, N=X.shape[0])
        with self.backend.open(X, sub) as session:
            session.set_params(w, mu, cv, reg)
            logprob, resp = session.eval(True)
        ll = float(np.sum(logprob, dtype=np.float64))
        if not np.isfinite(ll):
            from ..errors import NonFiniteError

            raise NonFiniteError(
                f"the log-likelihood is not finite ({ll}): increase reg_covar, use fewer components, or scale the data"
            )
        return stats_from_posteriors(X, logprob, resp, mu, self.problem.cvtype)

    def stats_weighted(self, X: np.ndarray, sample_weight: np.ndarray) -> BlockStats:
        """:meth:`stats` of the block ``X`` with each event's posteriors and log-likelihood multiplied
        by its weight (``sample_weight`` (n,) float64, >= 0): the backend's E-step gives the
        posteriors, the weighted sums are taken in float64 NumPy (``n`` is the total weight)."""
        w, mu, cv, reg = self._params
        sub = dataclasses.replace(self.problem, N=X.shape[0])
        with self.backend.open(X, sub) as session:
            session.set_params(w, mu, cv, reg)
            logprob, resp = session.eval(True)
        return self._finite(stats_from_posteriors(X, logprob, resp, mu, self.problem.cvtype, sample_weight))

    @staticmethod
    def _finite(st: BlockStats) -> BlockStats:
        if not np.isfinite(st.loglik):
            from ..errors import NonFiniteError

            raise NonFiniteError(
                f"the log-likelihood is not finite ({st.loglik}): increase reg_covar, use fewer components, "
                "or scale the data"
            )
        return st

    def stats_many(self, blocks):
        """Yield :meth:`stats` of each block of the iterable ``blocks`` in order (a backend may overlap
        one block's transfer with the previous one's compute; each block is copied before the next
        is asked for, so a reused buffer is fine)."""
        for X in blocks:
            yield self.stats(X)

    def close(self) -> None:
        pass


def block_rows_for(problem: Problem, default_bytes: int) -> int:
    """Rows of ``problem``'s data and posteriors (D + M values each) that fit ``ASP_GMM_BLOCK_BYTES``
    bytes (``default_bytes`` where unset), at least 256."""
    from ..config import settings

    nbytes = settings().nbytes("ASP_GMM_BLOCK_BYTES", default_bytes)
    per_row = (problem.D + problem.M + 1) * problem.np_dtype.itemsize
    return max(256, int(nbytes) // per_row)
