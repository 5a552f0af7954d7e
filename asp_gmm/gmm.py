"""The Face: the ``GMM`` class and ``compute_distance_BIC``, compatible with the PyCASP specializer.

It validates input, owns the public attributes, and hands every computation to the
:class:`~asp_gmm.specializer.Specializer`; it knows nothing of C, CUDA or databases.
"""

from __future__ import annotations

import contextlib

import numbers

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from . import cuda_arrays
from .blas import one_blas_thread
from .errors import NonFiniteInputError
from .fit import seed, sources
from .fit.data import Data, _as_dtype, as_data, check_data  # noqa: F401  (check_data: for the drop-in)
from .frozen import freeze  # noqa: F401  (public: asp_gmm.freeze)
from .problem import CVTYPES, KERNEL_CVTYPE, Problem
from .runtime import default_runtime
from .specializer import Specializer

__all__ = ["GMM", "compute_distance_BIC", "prepare", "freeze"]


@contextlib.contextmanager
def _naming_call(method: str, X=None):
    """A NaN/inf the backend found in X while uploading it is reported naming the public call (and
    the row in X, also when the backend was checking a sample of X's rows)."""
    try:
        yield
    except NonFiniteInputError as exc:
        raise exc.for_call(method, X if isinstance(X, np.ndarray) else None) from None


class GMM:
    """A Gaussian mixture model trained by specialized EM.

    Parameters
    ----------
    M : int
        Number of components.
    D : int
        Dimensions of the data.
    means : array (M, D), optional
    covars : array (M, D, D) for ``cvtype="full"``, (D, D) for ``"tied"`` (one matrix shared by every
        component), (M, D) for ``"diag"``, (M,) for ``"spherical"`` (one variance per component), optional
    weights : array (M,), optional
        Initial parameters; those not given are seeded from the data by the first :meth:`train`.
    cvtype : {"full", "diag", "tied", "spherical"}
    dtype : {np.float32, np.float64}
        Working precision of the compiled code (parameters are accumulated in float64).
    reg_covar : float
        Added to the diagonal of every covariance after each M-step.
    backend : {"auto", "c", "numpy", "cuda"}
        "auto" takes CUDA when pycuda and a GPU are present, else C.
    variant : str, optional
        Pin a covariance variant (e.g. "V3"); by default the specializer chooses.
    seed : int, optional
        Seeds the initial means (random distinct events); by default events at even intervals.

    Attributes
    ----------
    means, covars, weights : ndarray of ``dtype``
    loglik : float or None
        Total log-likelihood returned by the last :meth:`train`.
    n_events : int or None
        Number of events of the last :meth:`train`.
    n_iter, converged, last_variant : results of the last :meth:`train`.

    Examples
    --------
    >>> import numpy as np
    >>> from asp_gmm import GMM
    >>> X = np.random.default_rng(0).normal(size=(1000, 2)) + np.repeat([[0.0, 0.0], [6.0, 6.0]], 500, axis=0)
    >>> g = GMM(2, 2, cvtype="diag", dtype=np.float64)
    >>> loglik = g.train(X, max_em_iters=50)
    >>> np.sort(g.means[:, 0]).round().astype(int).tolist()
    [0, 6]
    >>> g.predict(X[:2]).shape
    (2,)
    """

    def __init__(
        self,
        M: int,
        D: int,
        means: ArrayLike | None = None,
        covars: ArrayLike | None = None,
        weights: ArrayLike | None = None,
        cvtype: str = "full",
        dtype: DTypeLike = np.float32,
        reg_covar: float = 1e-6,
        backend: str = "auto",
        variant: str | None = None,
        seed: int | None = None,
    ) -> None:
        for name, val in (("M", M), ("D", D)):
            if not isinstance(val, numbers.Integral) or isinstance(val, bool) or val <= 0:
                raise ValueError(f"{name} must be a positive integer, got {val!r}")
        if cvtype not in CVTYPES:
            raise ValueError(f"cvtype must be one of {', '.join(map(repr, CVTYPES))}, got {cvtype!r}")
        if not (isinstance(reg_covar, numbers.Real) and reg_covar >= 0 and np.isfinite(reg_covar)):
            raise ValueError(f"reg_covar must be a finite number >= 0, got {reg_covar!r}")
        self.M, self.D, self.cvtype = int(M), int(D), cvtype
        self._kcv = KERNEL_CVTYPE[cvtype]  # how the data's (co)variance seeds it: "full" or "diag"
        self.dtype = _as_dtype(dtype)
        self.reg_covar = float(reg_covar)
        self.variant, self.seed = variant, seed
        self._specializer = Specializer(backend)
        self.backend = self._specializer.backend.name
        self.means = self.covars = self.weights = None
        if means is not None:
            self.means = self._check_param("means", means, (self.M, self.D))
        if covars is not None:
            self.covars = self._check_param("covars", covars, self._problem(0).covars_shape())
        if weights is not None:
            w = self._check_param("weights", weights, (self.M,))
            if np.any(w < 0) or not np.isclose(w.sum(dtype=np.float64), 1.0, rtol=1e-4):
                raise ValueError("weights must be non-negative and sum to 1")
            self.weights = w
        self.loglik = None
        self.n_events = None
        self.n_iter = 0
        self.converged = False
        self.last_variant = None

    def _check_param(self, name, value, shape, copy: bool = False, hint: str = ""):
        """``value`` as a C-contiguous array of the model's dtype and ``shape`` (``copy``: always a
        new array), or a clear error; ``hint`` follows the expected shape in the message."""
        arr = np.asarray(value)
        if arr.dtype.kind not in "fiu":
            raise TypeError(f"{name} must be numeric, got dtype {arr.dtype}")
        if arr.shape != shape:
            raise ValueError(f"{name} must have shape {shape}{hint}, got {arr.shape}")
        if not np.isfinite(arr).all():
            raise ValueError(f"{name} contains NaN or infinity")
        if copy:
            return np.array(arr, dtype=self.dtype, order="C")
        return np.ascontiguousarray(arr, dtype=self.dtype)

    # ------------------------------------------------------------------ helpers
    def _problem(self, N: int) -> Problem:
        return Problem(N, self.D, self.M, self.cvtype, self.dtype.name)

    def _seed(self, data: Data, sample_weight=None) -> None:
        """Seed the missing parameters from the data (:mod:`asp_gmm.fit.seed`): means at events at
        even intervals of the (weighted) data, every covariance the data's (co)variance, equal
        weights. One pass (two for a callable source with random means) over a streamed source."""
        if self.means is not None and self.covars is not None and self.weights is not None:
            return
        M, cv = self.M, self._kcv  # seeded as the kernel type, then shaped as cvtype
        if data.kind == "host":
            X = data.X
            # an immutable array's moments are kept (a pass over 500 000 x 36 events: 15 ms on two cores)
            memo = default_runtime().moments_memo if sample_weight is None else None
            known = memo.get(X, {}) if memo is not None else {}
            if cv in known:
                var, cov = known[cv]
            else:
                with (
                    np.errstate(over="ignore", invalid="ignore"),
                    _small_blas(data.N * self.D * self.D if cv == "full" else 0),
                ):
                    var, cov = seed.host_moments(X, cv, sample_weight)
                if memo is not None:
                    var.flags.writeable = cov.flags.writeable = False
                    memo.put(X, {**known, cv: (var, cov)})
            self._check_variance(var)
            means = X[seed.event_index(data.N, M, self.seed, sample_weight)]
            covars = seed.covariances(cov, M, cv, self.reg_covar, symmetrise=False)
        elif data.kind == "device":
            n, _mean, cov = cuda_arrays.seed_stats(data.X, cv)
            self._check_variance(np.diag(cov) if cv == "full" else cov)
            means = cuda_arrays.rows(data.X, seed.event_index(n, M, self.seed))
            covars = seed.covariances(cov, M, cv, self.reg_covar)
        else:
            _n, means, covars = seed.seed(
                data.X, M, self.D, cv, self.dtype, self.reg_covar, self.seed, sources.as_weights(sample_weight)
            )
            self._check_variance((np.diagonal(covars[0]) if cv == "full" else covars[0]) - self.reg_covar)
        if self.means is None:
            self.means = np.asarray(means).astype(self.dtype)
        if self.covars is None:
            self.covars = covars.astype(self.dtype)
            seed.check_covariances(self.covars, cv)
            self.covars = seed.seeded_as(self.covars, self.cvtype)
        if self.weights is None:
            self.weights = seed.equal_weights(M, self.dtype)

    def _check_variance(self, var: np.ndarray) -> None:
        """Refuse data whose variance does not fit the working precision (finite float32 data of scale
        1e19 has a variance of 1e38 and more: no covariance of it can be stored), given the
        per-dimension variances (D,)."""
        top = float(np.max(var)) if var.size else 0.0
        big = float(np.finfo(self.dtype).max)
        if not np.isfinite(top) or top * (1.0 + 1e-6) >= big:
            how = (
                "scale the data (e.g. X / X.std(axis=0)) or use dtype=np.float64"
                if self.dtype == np.float32
                else "scale the data (e.g. X / X.std(axis=0))"
            )
            shown = f"{top:.3g}" if np.isfinite(top) else "beyond float64"
            raise ValueError(
                f"the data's scale overflows {self.dtype.name}: its variance reaches {shown}, more than "
                f"the largest {self.dtype.name} ({big:.3g}); {how}"
            )

    def _params64(self, method: str = "train"):
        if self.means is None or self.covars is None or self.weights is None:
            raise RuntimeError(
                "the model has no parameters yet: call train(X) first or pass means, covars and "
                f"weights ({method}() needs them)"
            )
        return (self.weights.astype(np.float64), self.means.astype(np.float64), self.covars.astype(np.float64))

    # ------------------------------------------------------------------ public API
    def train(
        self,
        X: ArrayLike,
        min_em_iters: int = 1,
        max_em_iters: int = 10,
        tol: float = 1e-3,
        progress: bool | None = None,
        sample_weight: ArrayLike | None = None,
    ) -> float:
        """Run EM on X; the first call seeds missing parameters, later calls warm-start.

        Parameters
        ----------
        X : array (N, D), or a chunk source
            In memory (a NumPy array; a PyTorch or CuPy CUDA array, or any ``__cuda_array_interface__``
            or CUDA DLPack producer, is used where it lies by the CUDA backend), or streamed one block at a time (never held whole, see
            :mod:`asp_gmm.streaming`): a ``numpy.memmap``, an h5py or zarr dataset (any array-like
            with ``shape`` and row slicing), or a callable returning a new iterable of (n_i, D) row
            chunks on each call. An in-memory X larger than the device budget
            (``ASP_GMM_DEVICE_BUDGET``) is streamed too; the results equal the in-memory ones.
        min_em_iters, max_em_iters : int
            EM iterations (M-step then E-step) run: at least ``min_em_iters``, at most
            ``max_em_iters``; in between, stop once the mean per-event log-likelihood changes by
            less than ``tol``. ``min_em_iters > max_em_iters`` is refused, except that
            ``max_em_iters=0`` with the default minimum only evaluates X.
        tol : float
        progress : bool, optional
            A progress bar per pass of a streamed fit (tqdm); default ``ASP_GMM_PROGRESS`` (auto: on a
            terminal, for passes of 10^7 events or more). Each pass is also logged at INFO.
        sample_weight : array (N,), optional
            Non-negative weight of each event: an event of integer weight ``k`` counts as ``k``
            copies of it (the same model as repeating the rows), weight 0 as a dropped event. For a
            streamed X: an (N,) array or memmap, or a callable returning a new iterable of (n_i,)
            weight chunks aligned with X's chunks. The weights are folded into the posteriors of
            every E-step: on CUDA in the session's own loop (in-memory X: the weights kept on the
            device), else by the pass loop (:mod:`asp_gmm.fit.passes`) through the backend's
            E-step (the C and CUDA kernels take them; the sums are added in float64).

        Returns
        -------
        float
            Total log-likelihood of X under the trained parameters.
        """
        for name, val in (("min_em_iters", min_em_iters), ("max_em_iters", max_em_iters)):
            if not isinstance(val, numbers.Integral) or val < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {val!r}")
        if min_em_iters > max(max_em_iters, 1):  # (1, 0), the default minimum, only evaluates
            raise ValueError(
                f"min_em_iters={min_em_iters} is larger than max_em_iters={max_em_iters}; "
                "pass min_em_iters <= max_em_iters"
            )
        if not (isinstance(tol, numbers.Real) and tol >= 0):
            raise ValueError(f"tol must be a number >= 0, got {tol!r}")
        if sample_weight is not None and cuda_arrays.is_cuda_array(X):
            X = cuda_arrays.to_host(X)  # weighted passes read host blocks
        data = as_data(
            X,
            self.backend,
            self.D,
            self.dtype,
            self.M,
            device_checks=sample_weight is None and self._device_checks(True),
        )
        if sample_weight is not None and data.kind != "stream":
            sample_weight = sources.require_positive(sources.check_weights(sample_weight, data.N), self.M)
        self._seed(data, sample_weight)
        X, N = data.X, data.N
        with _naming_call("train", X):
            res = self._specializer.train(
                X,
                *self._params64(),
                self._problem(N),
                self.reg_covar,
                int(min_em_iters),
                int(max_em_iters),
                float(tol),
                self.variant,
                progress,
                sample_weight=sample_weight,
            )
        N = res.n_events or N
        self.weights = res.weights.astype(self.dtype)
        self.means = res.means.astype(self.dtype)
        self.covars = res.covars.astype(self.dtype)
        self.loglik, self.n_events = res.loglik, N
        self.n_iter, self.converged, self.last_variant = res.iters, res.converged, res.variant
        self.last_train = res
        return res.loglik

    def _device_checks(self, seeding: bool = False) -> bool:
        """Whether the backend checks host data for NaN/inf itself (the CUDA backend, on the GPU,
        while uploading it): then the Face makes no host pass. Not while seeding, which reads X on
        the host first."""
        if self.backend != "cuda":
            return False
        return not seeding or (self.means is not None and self.covars is not None and self.weights is not None)

    def eval(self, X: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """Per-event log-likelihood and posteriors.

        Parameters
        ----------
        X : array (N, D)

        Returns
        -------
        logprob : ndarray (N,)
        posteriors : ndarray (N, M)
        """
        return self._evaluate(X, "eval", True)

    def score(self, X: ArrayLike) -> np.ndarray:
        """Per-event log-likelihood, ndarray (N,)."""
        return self._evaluate(X, "score", False)[0]

    def predict(self, X: ArrayLike) -> np.ndarray:
        """Most likely component of each event, ndarray (N,) of int."""
        return np.argmax(self._evaluate(X, "predict", True)[1], axis=1)

    def _evaluate(self, X, method: str, want_resp: bool):
        data = as_data(X, self.backend, self.D, self.dtype, method=method, device_checks=self._device_checks())
        with _naming_call(method, data.X):
            return self._specializer.evaluate(
                data.X, *self._params64(method), self._problem(data.N), self.reg_covar, want_resp
            )

    def __repr__(self):
        return f"GMM(M={self.M}, D={self.D}, cvtype={self.cvtype!r}, dtype={self.dtype.name}, backend={self.backend!r})"


#: Below this many multiply-adds a BLAS call runs on one thread: the first call of a threaded BLAS
#: starts its threads, which on a busy machine took 0.4-1.5 s for the 36 million of the data
#: covariance of 100 000 x 19 events (one thread: 0.07-0.19 s).
SMALL_BLAS_WORK = 1e9


@contextlib.contextmanager
def _small_blas(work: float):
    if work >= SMALL_BLAS_WORK:
        yield
        return
    with one_blas_thread():
        yield


def prepare(
    D: int, M, cvtype: str = "full", dtype: DTypeLike = np.float32, backend: str = "auto", N: int = 10_000
) -> int:
    """Compile, or load from the cache, what ``train``/``score`` of these shapes will run, so that
    the first real calls do not pay for it (e.g. before starting a clock, or before a batch of many
    small models of varying M).

    Parameters
    ----------
    D : int
    M : int or iterable of int
        Component counts to prepare.
    cvtype : {"full", "diag", "tied", "spherical"}
    dtype : {np.float32, np.float64}
    backend : {"auto", "c", "numpy", "cuda"}
    N : int
        Typical number of events: on the GPU, small problems share the binaries of their component
        class, and N decides what is small.

    Returns
    -------
    int
        Configurations (variant and tunables) ready, over all M.
    """
    Ms = [M] if isinstance(M, numbers.Integral) else list(M)
    for name, val in [("D", D), ("N", N)] + [("M", m) for m in Ms]:
        if not isinstance(val, numbers.Integral) or isinstance(val, bool) or val <= 0:
            raise ValueError(f"{name} must be a positive integer, got {val!r}")
    if cvtype not in CVTYPES:
        raise ValueError(f"cvtype must be one of {', '.join(map(repr, CVTYPES))}, got {cvtype!r}")
    spec = Specializer(backend)
    dt = _as_dtype(dtype).name
    # every module of every shape compiles at once, in parallel (one thread per core)
    return spec.prepare_many([Problem(int(N), int(D), int(m), cvtype, dt) for m in Ms])


def merged_model(gmm1: GMM, gmm2: GMM, n1: float, n2: float) -> GMM:
    """The untrained merge of two models of the same D and cvtype: their M1 + M2 components, the
    weights scaled by each model's share of the data (``n1``, ``n2`` events), a tied matrix pooled
    by those shares. What :func:`compute_distance_BIC` and its batched form train."""
    w = np.concatenate([gmm1.weights.astype(np.float64) * n1, gmm2.weights.astype(np.float64) * n2])
    if gmm1.cvtype == "tied":  # one shared matrix: the two models' matrices weighted by their data
        covars = (gmm1.covars.astype(np.float64) * n1 + gmm2.covars.astype(np.float64) * n2) / (n1 + n2)
    else:
        covars = np.concatenate([gmm1.covars, gmm2.covars])
    return GMM(
        gmm1.M + gmm2.M,
        gmm1.D,
        means=np.concatenate([gmm1.means, gmm2.means]),
        covars=covars,
        weights=w / w.sum(),
        cvtype=gmm1.cvtype,
        dtype=gmm1.dtype,
        reg_covar=gmm1.reg_covar,
        backend=gmm1.backend,
    )


def compute_distance_BIC(
    gmm1: GMM,
    gmm2: GMM,
    X: ArrayLike,
    X1: ArrayLike | None = None,
    X2: ArrayLike | None = None,
    min_em_iters: int = 1,
    max_em_iters: int = 10,
    tol: float = 1e-3,
) -> tuple[GMM, float]:
    """Merge two models and score the merge (the agglomerative-clustering distance).

    The merged model has ``M1 + M2`` components initialised from both models, their weights scaled
    by the share of the data each model was trained on; it is trained on ``X`` (normally the union
    of both models' data). Because the merged model has as many parameters as the two together, the
    BIC penalties cancel and the score is the log-likelihood difference.

    Parameters
    ----------
    gmm1, gmm2 : GMM
        Trained models of the same D, cvtype and dtype.
    X : array (N, D)
        Data of the merged cluster.
    X1, X2 : array (N1, D), (N2, D), optional
        Each model's own data. When given, ``L(gmm_i)`` is its log-likelihood on ``X_i`` and the
        weight shares are ``N_i / (N1 + N2)``; otherwise the log-likelihood and event count of
        each model's last :meth:`GMM.train` are used.
    min_em_iters, max_em_iters, tol
        As in :meth:`GMM.train` for the merged model.

    Returns
    -------
    merged : GMM
    score : float
        ``L(merged on X) - L(gmm1) - L(gmm2)``; positive favours merging.

    Examples
    --------
    >>> import numpy as np
    >>> from asp_gmm import GMM, compute_distance_BIC
    >>> rng = np.random.default_rng(0)
    >>> X1, X2 = rng.normal(0, 1, (400, 2)), rng.normal(8, 1, (400, 2))
    >>> a, b = GMM(1, 2, dtype=np.float64), GMM(1, 2, dtype=np.float64)
    >>> _ = a.train(X1); _ = b.train(X2)
    >>> merged, score = compute_distance_BIC(a, b, np.concatenate([X1, X2]))
    >>> merged.M, bool(score < 0)  # two separate clusters: the merge is not favoured
    (2, True)
    """
    if gmm1.D != gmm2.D or gmm1.cvtype != gmm2.cvtype:
        raise ValueError("the two models must have the same D and cvtype to be merged")
    parts = []
    for g, Xi, name in ((gmm1, X1, "gmm1"), (gmm2, X2, "gmm2")):
        if Xi is not None:
            parts.append((float(np.sum(g.score(Xi), dtype=np.float64)), np.asarray(Xi).shape[0]))
        elif g.loglik is None:
            raise ValueError(f"{name} has not been trained; train it or pass its data as X{name[-1]}")
        else:
            parts.append((g.loglik, g.n_events))
    (l1, n1), (l2, n2) = parts
    merged = merged_model(gmm1, gmm2, n1, n2)
    ll = merged.train(X, min_em_iters=min_em_iters, max_em_iters=max_em_iters, tol=tol)
    return merged, ll - l1 - l2
