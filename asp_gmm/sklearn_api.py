"""A scikit-learn drop-in: ``asp_gmm.GaussianMixture``, specialized underneath.

    from asp_gmm import GaussianMixture        # instead of: from sklearn.mixture import GaussianMixture
    gm = GaussianMixture(16, covariance_type="diag").fit(X)

Same parameters, methods and attributes as :class:`sklearn.mixture.GaussianMixture`, plus two keywords:

``backend`` : {"auto", "c", "cuda", "numpy"}
    Where the EM loops run (see :class:`asp_gmm.GMM`). "auto" takes the first of
    CUDA, C and NumPy that has a variant for the problem.
``dtype`` : {None, "float32", "float64"}
    Working precision of the compiled code. ``None`` (default) follows scikit-learn: float32 data is
    worked on in float32, everything else in float64. Parameters are always accumulated in float64.

How the results relate to scikit-learn's
----------------------------------------
scikit-learn's EM loop is (E-step, M-step, check): its ``lower_bound_`` is the mean log-likelihood
of the parameters *before* the last M-step, and it stops once that value changes by less than
``tol``. The compiled core runs (M-step, E-step, check) and reports the log-likelihood of its final
parameters, checking the same difference one iteration earlier. So a fit runs the core for at most
``max_iter - 1`` iterations with scikit-learn's ``tol`` (the per-event change), then one more
iteration: the parameters, ``n_iter_``, ``converged_``, ``lower_bound_`` and ``lower_bounds_`` are
those scikit-learn computes from the same initial parameters (up to rounding).

All four covariance types run on the specialized backends ("tied" on the full kernels with one
shared precision factor, "spherical" on the diagonal ones with one variance per component). The
initial parameters and every NumPy E- and M-step come from the project's float64 reference
(:mod:`asp_gmm.reference`, scikit-learn's formulas); the drop-in keeps no copies of scikit-learn's numerical helpers (it only reproduces
scikit-learn's starting covariances of one-event components, see ``_one_hot_params``).

Initialisation
--------------
``weights_init``, ``means_init`` and ``precisions_init`` are used as scikit-learn uses them. The
``init_params`` methods are scikit-learn's, computed the same way while ``n_samples`` is at most
:data:`KMEANS_SUBSAMPLE`; beyond that, "kmeans" and "k-means++" run on a random subsample of
:data:`KMEANS_SUBSAMPLE` events (drawn from ``random_state``), every event is then labelled by its
nearest centre, and the initial parameters are computed from those hard labels on all events in
one pass (O(N D^2), not O(N M D^2)). So for large data the starting point differs from
scikit-learn's (it is a k-means solution of a subsample) and the fit costs a fraction of k-means on
all events. "random" computes one NumPy M-step from random responsibilities, as scikit-learn does.

scikit-learn is an optional dependency of this module only.
"""

from __future__ import annotations

import math
import numbers
import time
import warnings

import numpy as np

try:
    from sklearn.base import BaseEstimator, DensityMixin
    from sklearn.cluster import KMeans, kmeans_plusplus
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.utils import check_array, check_random_state
    from sklearn.utils.validation import check_is_fitted
except ImportError as exc:  # pragma: no cover - exercised only without scikit-learn
    raise ImportError(
        "asp_gmm.GaussianMixture is a drop-in for scikit-learn's GaussianMixture and needs "
        "scikit-learn: pip install scikit-learn (or pip install 'asp_gmm[sklearn]'). "
        "The rest of asp_gmm (GMM, compute_distance_BIC) works without it."
    ) from exc

try:  # scikit-learn >= 1.6
    from sklearn.utils.validation import validate_data as _sk_validate_data
except ImportError:  # pragma: no cover - older scikit-learn
    _sk_validate_data = None

try:  # scikit-learn >= 1.2: declarative parameter validation with scikit-learn's own messages
    from sklearn.utils._param_validation import Interval, StrOptions
except ImportError:  # pragma: no cover
    Interval = StrOptions = None

from . import cuda_arrays, streaming
from .array_api import follows_input_namespace
from . import reference as ref
from .errors import BackendUnavailableError, NotPositiveDefiniteError, VariantNotApplicableError
from .problem import Problem

__all__ = ["GaussianMixture", "KMEANS_SUBSAMPLE"]

#: Above this many events, "kmeans" and "k-means++" initialisation run on a random subsample of this
#: size (see the module docstring).
KMEANS_SUBSAMPLE = 10_000

_ILL_DEFINED = (
    "Fitting the mixture model failed because some components have ill-defined empirical covariance "
    "(for instance caused by singleton or collapsed samples). Try to decrease the number of "
    "components, increase reg_covar, or scale the input data."
)


def _validate_data(est, X, reset, **kw):
    if cuda_arrays.is_cuda_array(X):  # PyTorch/CuPy CUDA arrays: the drop-in works on a host copy
        X = cuda_arrays.to_host(X)
    if _sk_validate_data is not None:
        return _sk_validate_data(est, X, reset=reset, **kw)
    return est._validate_data(X, reset=reset, **kw)  # pragma: no cover - scikit-learn < 1.6


def _is_dask_array(X) -> bool:
    return type(X).__module__.split(".")[0] == "dask" and hasattr(X, "chunks") and hasattr(X, "to_delayed")


def _online_mstep(stats, means, covars, reg, cvtype):
    """The M-step of the running statistics (per component, of the "full" or "diag" kernels), reduced
    to ``cvtype`` as scikit-learn reduces its estimates: "tied" the count-weighted mean of the full
    covariances, "spherical" each diagonal's mean."""
    M, D = means.shape
    return streaming.reduced_mstep(stats, means, streaming.per_component(covars, cvtype, M, D), reg, cvtype)


def _stream_kmeans_init(src, M, D, cvtype, dt, reg, method, random_state):
    """k-means initialisation of a streamed fit, as for large in-memory data: a uniform sample of
    :data:`KMEANS_SUBSAMPLE` events drawn in one pass (reservoir sampling from ``random_state``),
    k-means (or k-means++ seeding) on it, then every event labelled by its nearest centre and the
    hard-label parameters computed in a second pass. Returns ``(N, weights, means, covars)``."""
    k = KMEANS_SUBSAMPLE
    sample = np.empty((k, D))
    seen = 0
    for _start, blk in streaming.blocks(src, D, dt, 1 << 16):
        n = blk.shape[0]
        take = min(max(k - seen, 0), n)
        sample[seen : seen + take] = blk[:take]
        t = seen + np.arange(take, n)
        j = (random_state.random_sample(t.shape[0]) * (t + 1)).astype(np.int64)
        hit = np.nonzero(j < k)[0]
        sample[j[hit]] = blk[take + hit]  # in row order: a later row replaces an earlier one
        seen += n
    if seen < M:
        raise ValueError(f"Expected n_samples >= n_components but got n_components = {M}, n_samples = {seen}")
    sample = sample[: min(seen, k)]
    if method == "k-means++":
        centres, _ = kmeans_plusplus(sample, M, random_state=random_state)
    else:
        centres = KMeans(n_clusters=M, n_init=1, random_state=random_state).fit(sample).cluster_centers_
    centres = np.asarray(centres, np.float64)
    full = cvtype in ("full", "tied")
    st = streaming.SuffStats(M, D, "full" if full else "diag", centres)
    from .backends.base import BlockStats

    for _start, blk in streaming.blocks(src, D, dt, 1 << 16):
        x = blk.astype(np.float64)
        d2 = (x * x).sum(1)[:, None] - 2.0 * x @ centres.T + (centres * centres).sum(1)
        lab = np.argmin(d2, axis=1)
        nk = np.bincount(lab, minlength=M).astype(np.float64)
        sumx = np.zeros((M, D))
        np.add.at(sumx, lab, x)
        s2 = np.zeros((M, D, D) if full else (M, D))
        for c in np.unique(lab):
            y = x[lab == c] - centres[c]
            s2[c] = y.T @ y if full else (y * y).sum(0)
        st.add_block(BlockStats(x.shape[0], 0.0, nk, sumx, s2))
    prev = np.repeat((np.eye(D) if full else np.ones(D))[None], M, 0)
    w, mu, cv = streaming.reduced_mstep(st, centres, prev, reg, cvtype)
    return st.n, w, mu, cv


def _dask_seed(adask, X, M, cvtype, dt, reg, seed, backend):
    """``GMM.train``'s seeding of a Dask array: one pass with no iteration."""
    r = adask.fit(X, M, cvtype=cvtype, dtype=dt, reg_covar=reg, seed=seed, backend=backend, min_iters=0, max_iters=0)
    return r.weights, r.means, r.covars


# ---------------------------------------------------------------------------------------------------
# Parameter checks (scikit-learn's messages)


def _check_shape(param, shape, name):
    if param.shape != shape:
        raise ValueError("The parameter '%s' should have the shape of %s, but got %s" % (name, shape, param.shape))


def _check_weights(weights, M):
    weights = check_array(weights, dtype=[np.float64, np.float32], ensure_2d=False)
    _check_shape(weights, (M,), "weights")
    if np.any(weights < 0.0) or np.any(weights > 1.0):
        raise ValueError(
            "The parameter 'weights' should be in the range [0, 1], but got max value "
            "%.5f, min value %.5f" % (np.min(weights), np.max(weights))
        )
    atol = 1e-6 if weights.dtype == np.float32 else 1e-8
    if not np.allclose(np.abs(1.0 - np.sum(weights)), 0.0, atol=atol):
        raise ValueError("The parameter 'weights' should be normalized, but got sum(weights) = %.5f" % np.sum(weights))
    return weights


def _check_means(means, M, D):
    means = check_array(means, dtype=[np.float64, np.float32], ensure_2d=False)
    _check_shape(means, (M, D), "means")
    return means


def _check_precisions(precisions, cvtype, M, D):
    precisions = check_array(precisions, dtype=[np.float64, np.float32], ensure_2d=False, allow_nd=cvtype == "full")
    shapes = {"full": (M, D, D), "tied": (D, D), "diag": (M, D), "spherical": (M,)}
    _check_shape(precisions, shapes[cvtype], "%s precision" % cvtype)
    if cvtype in ("diag", "spherical"):
        if np.any(precisions <= 0.0):
            raise ValueError("'%s precision' should be positive" % cvtype)
    else:
        mats = precisions if cvtype == "full" else precisions[None]
        if not (np.allclose(mats, np.swapaxes(mats, -1, -2)) and np.all(np.linalg.eigvalsh(mats) > 0.0)):
            raise ValueError("'%s precision' should be symmetric, positive-definite" % cvtype)
    return precisions


def _working_dtype(dtype, X_dtype) -> np.dtype:
    if dtype is None:
        return np.dtype(np.float32) if X_dtype == np.float32 else np.dtype(np.float64)
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(
            f"The 'dtype' parameter of GaussianMixture must be None, 'float32' or 'float64'. Got {dtype!r} instead."
        )
    return dt


# ---------------------------------------------------------------------------------------------------
# Numerics: the float64 reference (asp_gmm/reference.py) with scikit-learn's conventions (upper
# Cholesky factor U of each precision, inv(cov) = U U^T) and scikit-learn's error rule and message


def _precision_cholesky(cov, cvtype, D):
    """scikit-learn's ``precisions_cholesky_`` of covariances, float64, same shape as ``cov``.

    As scikit-learn, only a failed factorisation (or a variance that is not positive) is an error:
    a ValueError with scikit-learn's message. ``D`` is the number of features."""
    try:
        return ref.precision_cholesky(cov, cvtype, cond_limit=None, n_features=D)[0]
    except ref.NotPositiveDefiniteError:
        raise ValueError(_ILL_DEFINED) from None


def _estimate_params(X, resp, reg, cvtype):
    """Counts ``nk`` (M,) (unnormalised weights), means (M, D) and covariances from soft
    responsibilities (N, M): scikit-learn's M-step (no empty-component rule)."""
    nk, _, means = ref.mstep_weights_means(X, resp)
    return nk, means, ref.covariance(X, resp, nk, means, cvtype, reg)


def _one_blas_thread():
    """Context in which BLAS runs on one thread: the hard-label statistics are M small products,
    where BLAS threading costs more than it gives (and much more on a loaded machine)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency of asp_gmm
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def _label_params(X, labels, M, reg, cvtype):
    """As :func:`_estimate_params` for 0/1 responsibilities (component k owns the events labelled
    k; any other label owns nothing), in O(N D^2) instead of O(N M D^2)."""
    with _one_blas_thread():
        return ref.mstep_from_labels(X, labels, M, cvtype, reg)


def _one_hot_params(X, idx, reg, cvtype):
    """Component k owns exactly event ``idx[k]`` (k-means++, random_from_data)."""
    idx = np.asarray(idx)
    M = len(idx)
    if np.unique(idx).size == M:
        labels = np.full(X.shape[0], -1, dtype=np.intp)
        labels[idx] = np.arange(M)
        nk, means, cov = _label_params(X, labels, M, reg, cvtype)
        # Start where scikit-learn starts. The exact variance of a one-event component is reg_covar;
        # scikit-learn's one-pass formula E[x^2] - mean^2 leaves about 10 eps x^2 in it, which next to a
        # reg_covar of 1e-6 steers the first iterations. Its "tied" formula counts every event's
        # scatter, owned or not (the total scatter of X over M, not reg_covar).
        if cvtype in ("diag", "spherical"):
            x = X[idx]
            cov = x * x / nk[:, None] - means**2 + reg
            cov = cov if cvtype == "diag" else cov.mean(axis=1)
        elif cvtype == "tied":
            cov = (X.T @ X - (nk * means.T) @ means) / nk.sum()
            cov.flat[:: X.shape[1] + 1] += reg
        return nk, means, cov
    resp = np.zeros((X.shape[0], M))  # an event drawn twice belongs to two components
    resp[idx, np.arange(M)] = 1.0
    return _estimate_params(X, resp, reg, cvtype)


# ---------------------------------------------------------------------------------------------------


class GaussianMixture(DensityMixin, BaseEstimator):
    """Gaussian mixture model trained by specialized EM: scikit-learn's ``GaussianMixture`` API.

    Parameters
    ----------
    n_components, covariance_type, tol, reg_covar, max_iter, n_init, init_params, weights_init,
    means_init, precisions_init, random_state, warm_start, verbose, verbose_interval
        As in :class:`sklearn.mixture.GaussianMixture`.
    backend : {"auto", "c", "cuda", "numpy"}, default="auto"
        Runtime of the EM loops.
    dtype : {None, "float32", "float64"}, default=None
        Working precision; ``None`` keeps float32 data in float32 and uses float64 otherwise.
    online_t0, online_kappa : float, default=2.0 and 0.6
        Step sizes of :meth:`partial_fit` (stepwise online EM): the t-th update (t = 1, 2, ...) after
        the first batch mixes the batch's statistics in with weight
        ``rho_t = (online_t0 + t) ** -online_kappa``; ``0.5 < online_kappa <= 1`` and
        ``online_t0 >= 0`` (Cappe & Moulines' conditions for convergence on a stationary stream).

    Attributes
    ----------
    weights_, means_, covariances_, precisions_, precisions_cholesky_, converged_, n_iter_,
    lower_bound_, lower_bounds_, n_features_in_, feature_names_in_
        As in :class:`sklearn.mixture.GaussianMixture` (arrays in the working precision).

    Notes
    -----
    ``verbose`` output of the compiled types is printed after each run of the compiled loop, from
    its log-likelihood trace (the per-iteration time shown is the run's average).

    Examples
    --------
    >>> import numpy as np
    >>> from asp_gmm import GaussianMixture
    >>> X = np.concatenate([np.random.default_rng(0).normal(m, 1, (200, 2)) for m in (0, 6)])
    >>> gm = GaussianMixture(n_components=2, random_state=0).fit(X)
    >>> np.sort(gm.means_[:, 0]).round().astype(int).tolist()
    [0, 6]
    >>> labels = gm.predict([[0.0, 0.0], [6.0, 6.0]])
    >>> bool(labels[0] != labels[1])
    True
    """

    if StrOptions is not None:
        _parameter_constraints: dict = {
            "n_components": [Interval(numbers.Integral, 1, None, closed="left")],
            "covariance_type": [StrOptions({"full", "tied", "diag", "spherical"})],
            "tol": [Interval(numbers.Real, 0.0, None, closed="left")],
            "reg_covar": [Interval(numbers.Real, 0.0, None, closed="left")],
            "max_iter": [Interval(numbers.Integral, 0, None, closed="left")],
            "n_init": [Interval(numbers.Integral, 1, None, closed="left")],
            "init_params": [StrOptions({"kmeans", "random", "random_from_data", "k-means++"})],
            "weights_init": ["array-like", None],
            "means_init": ["array-like", None],
            "precisions_init": ["array-like", None],
            "random_state": ["random_state"],
            "warm_start": ["boolean"],
            "verbose": ["verbose"],
            "verbose_interval": [Interval(numbers.Integral, 1, None, closed="left")],
            "backend": [StrOptions({"auto", "c", "cuda", "numpy"})],
            "online_t0": [Interval(numbers.Real, 0.0, None, closed="left")],
            "online_kappa": [Interval(numbers.Real, 0.5, 1.0, closed="right")],
            "dtype": "no_validation",  # checked in fit (None, float32 or float64)
        }

    def __init__(
        self,
        n_components: int = 1,
        *,
        covariance_type: str = "full",
        tol: float = 1e-3,
        reg_covar: float = 1e-6,
        max_iter: int = 100,
        n_init: int = 1,
        init_params: str = "kmeans",
        weights_init=None,
        means_init=None,
        precisions_init=None,
        random_state=None,
        warm_start: bool = False,
        verbose: int = 0,
        verbose_interval: int = 10,
        backend: str = "auto",
        dtype=None,
        online_t0: float = 2.0,
        online_kappa: float = 0.6,
    ) -> None:
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.tol = tol
        self.reg_covar = reg_covar
        self.max_iter = max_iter
        self.n_init = n_init
        self.init_params = init_params
        self.weights_init = weights_init
        self.means_init = means_init
        self.precisions_init = precisions_init
        self.random_state = random_state
        self.warm_start = warm_start
        self.verbose = verbose
        self.verbose_interval = verbose_interval
        self.backend = backend
        self.dtype = dtype
        self.online_t0 = online_t0
        self.online_kappa = online_kappa

    def __getstate__(self):
        """Pickled state without the cached Specializers (they hold compiled modules and device
        handles; a copy builds its own on first use)."""
        state = dict(super().__getstate__())
        state.pop("_specializers", None)
        return state

    # ------------------------------------------------------------------------------ fitting
    @follows_input_namespace(fits=True)
    def fit(self, X, y=None) -> "GaussianMixture":
        """Estimate the parameters with the EM algorithm (see
        :meth:`sklearn.mixture.GaussianMixture.fit`).

        Parameters
        ----------
        X : array-like (N, D), or data never loaded whole
            In memory; or streamed one block at a time (:mod:`asp_gmm.streaming`): a
            ``numpy.memmap``, an h5py or zarr dataset, a callable returning a new iterable of
            (n_i, D) row chunks on each call; or a ``dask.array`` (distributed EM on the Dask
            workers, :mod:`asp_gmm.dask`). Streamed and Dask fits run one initialisation ("tied"
            and "spherical" on the per-component statistics of "full" and "diag"). Unless ``*_init`` are given they start, on a
            source with ``init_params`` "kmeans" or "k-means++", from k-means on a uniform sample
            of :data:`KMEANS_SUBSAMPLE` events (as large in-memory data does; two passes), else
            (Dask arrays, other ``init_params``) from ``GMM.train``'s seeding: means at events
            spread evenly through X (random distinct events drawn from ``random_state`` where it is
            set), the data's covariance, equal weights.

        Returns
        -------
        self
        """
        self.__dict__.pop("_online_stats", None)  # a new fit: partial_fit starts again from its result
        self.__dict__.pop("_online_steps", None)
        if _is_dask_array(X) or streaming.is_source(X):
            self._fit_large(X)
            return self
        self._fit(X)
        return self

    def _fit_large(self, X):
        """:meth:`fit` of a chunk source or a Dask array (see :meth:`fit`)."""
        if hasattr(self, "_validate_params"):
            self._validate_params()
        cvtype, M = self.covariance_type, self.n_components
        on_dask = _is_dask_array(X)
        if on_dask:
            src, D, kind = None, int(X.shape[1]), X.dtype
        else:
            src = streaming.as_source(X)
            first = None if src.n_features is not None else next(iter(src.chunks()), None)
            D = src.n_features if first is None else np.asarray(first).shape[-1]
            kind = getattr(X, "dtype", None) if first is None else np.asarray(first).dtype
        dt = _working_dtype(
            self.dtype, np.dtype(kind) if kind is not None and np.dtype(kind).kind == "f" else np.dtype(np.float64)
        )
        inits = (
            None if self.weights_init is None else _check_weights(self.weights_init, M),
            None if self.means_init is None else _check_means(self.means_init, M, D),
            None if self.precisions_init is None else _check_precisions(self.precisions_init, cvtype, M, D),
        )
        w, mu, cv = inits[0], inits[1], None
        if inits[2] is not None:
            cv = ref.covariances_from_precision_cholesky(
                ref.precision_cholesky_from_precisions(inits[2], cvtype), cvtype
            )
        if self.warm_start and hasattr(self, "converged_"):
            w, mu, cv = self._params64()
        seed = None if self.random_state is None else int(check_random_state(self.random_state).randint(2**31 - 1))
        reg, tol = float(self.reg_covar), float(self.tol)
        n = None
        if on_dask:
            from . import dask as adask

            if w is None or mu is None or cv is None:
                s_w, s_mu, s_cv = _dask_seed(adask, X, M, cvtype, dt, reg, seed, self.backend)
                w, mu, cv = (s_w if w is None else w), (s_mu if mu is None else mu), (s_cv if cv is None else cv)
            kw = dict(cvtype=cvtype, dtype=dt, reg_covar=reg, backend=self.backend)
            r1 = adask.fit(
                X, M, weights=w, means=mu, covars=cv, min_iters=1, max_iters=max(self.max_iter - 1, 0), tol=tol, **kw
            )
            r2 = adask.fit(
                X,
                M,
                weights=r1.weights,
                means=r1.means,
                covars=r1.covars,
                min_iters=1,
                max_iters=1 if self.max_iter else 0,
                tol=0.0,
                **kw,
            )
            n = r1.n_events
        else:
            if (w is None or mu is None or cv is None) and self.init_params in ("kmeans", "k-means++"):
                n, k_w, k_mu, k_cv = _stream_kmeans_init(
                    src, M, D, cvtype, dt, reg, self.init_params, check_random_state(self.random_state)
                )
                w, mu, cv = (k_w if w is None else w), (k_mu if mu is None else mu), (k_cv if cv is None else cv)
            elif w is None or mu is None or cv is None:
                kcv = Problem(0, D, M, cvtype).kernel_cvtype
                n, s_mu, s_cv = streaming.seed(src, M, D, kcv, dt, reg, seed)
                w = np.full(M, 1.0 / M) if w is None else w
                mu = s_mu.astype(np.float64) if mu is None else mu
                cv = streaming.seeded_as(s_cv, cvtype) if cv is None else cv
            prob = Problem(n or src.n_rows or 0, D, M, cvtype, dt.name)
            spec = self._specializer(prob)
            try:
                r1 = spec.train(src, w, mu, cv, prob, reg, 1, max(self.max_iter - 1, 0), tol)
                r2 = spec.train(src, r1.weights, r1.means, r1.covars, prob, reg, 1, 1 if self.max_iter else 0, 0.0)
            except (NotPositiveDefiniteError, FloatingPointError) as exc:
                raise ValueError(f"{_ILL_DEFINED} ({exc})") from exc
            n = r1.n_events
        lbs = [float(v) / n for v in r1.loglik_trace]
        if not r1.converged and self.max_iter > 0:
            warnings.warn(
                "Best performing initialization did not converge. Try different init "
                "parameters, or increase max_iter, tol, or check for degenerate data.",
                ConvergenceWarning,
            )
        self._store((r2.weights, r2.means, r2.covars), dt)
        self.converged_ = bool(r1.converged)
        self.n_iter_ = int(r1.iters + 1) if self.max_iter else 0
        self.lower_bound_ = lbs[-1]
        self.lower_bounds_ = lbs
        self.n_features_in_ = D

    @follows_input_namespace(fits=True)
    def partial_fit(self, X, y=None):
        """One step of stepwise online EM on the batch X, for streams that cannot be read twice.

        The first call initialises the parameters from X as :meth:`fit` does (``init_params``,
        ``*_init``) and takes X's sufficient statistics (per-event averages of the posteriors'
        counts, first and second moments) as the running ones. Every later call computes X's
        statistics under the current parameters with the specialized kernels, mixes them into the
        running ones with weight ``rho_t = (online_t0 + t) ** -online_kappa`` (t = 1, 2, ... the
        updates so far; the running statistics are first re-centred on the current means), and
        replaces the parameters by the M-step of the result. This is an *approximation* of the
        batch EM fit: on a stationary stream it approaches a batch solution as the number of
        batches grows, with the noise of the last ~1/rho_t batches.

        After :meth:`fit` (which discards the running statistics), the next call continues from the
        fitted parameters: X's statistics under them become the running ones. Changing
        ``n_components`` or ``covariance_type`` between calls raises a ``ValueError``; call
        :meth:`fit` to start over.

        Parameters
        ----------
        X : array-like (n, D)
            One batch.

        Returns
        -------
        self
        """
        if hasattr(self, "_validate_params"):
            self._validate_params()
        cvtype, M, reg = self.covariance_type, self.n_components, float(self.reg_covar)
        fitted = hasattr(self, "means_")
        if fitted:
            M0, D0 = self.means_.shape
            want = {"full": (M, D0, D0), "diag": (M, D0), "tied": (D0, D0), "spherical": (M,)}[cvtype]
            if M0 != M or np.shape(self.covariances_) != want or getattr(self, "_fitted_cvtype", cvtype) != cvtype:
                what, was, now = ("n_components", M0, M) if M0 != M else ("covariance_type", "another", repr(cvtype))
                raise ValueError(
                    f"partial_fit(): {what} changed from {was} to {now} since the model was fitted; "
                    "call fit() to start over with the new value, or set it back"
                )
        first = not fitted
        X = _validate_data(self, X, first, dtype=[np.float64, np.float32], ensure_min_samples=1)
        n, D = X.shape
        if first:
            if n < M:
                raise ValueError(
                    "Expected n_samples >= n_components in the first partial_fit batch but got "
                    f"n_components = {M}, n_samples = {n}"
                )
            dt = _working_dtype(self.dtype, X.dtype)
            inits = (
                None if self.weights_init is None else _check_weights(self.weights_init, M),
                None if self.means_init is None else _check_means(self.means_init, M, D),
                None if self.precisions_init is None else _check_precisions(self.precisions_init, cvtype, M, D),
            )
            w, mu, cv = self._initial_params(X, check_random_state(self.random_state), inits)
        else:
            dt = np.dtype(self.means_.dtype)
            w, mu, cv = self._params64()
        Xw = np.ascontiguousarray(X, dtype=dt)
        try:
            # per-component statistics of the "full" or "diag" kernels ("tied", "spherical": reduced in
            # the M-step)
            prob = Problem(n, D, M, Problem(n, D, M, cvtype).kernel_cvtype, dt.name)
            cvk = streaming.per_component(cv, cvtype, M, D)
            st = streaming.source_stats(self._specializer(prob), Xw, prob, w, mu, cvk, reg)
            st = st.scaled(1.0 / n)
            if not hasattr(self, "_online_stats"):  # first batch, or first after fit(): X's statistics
                self._online_stats, self._online_steps = st, 0
            else:
                self._online_steps += 1
                rho = (float(self.online_t0) + self._online_steps) ** -float(self.online_kappa)
                self._online_stats = self._online_stats.recentred(st.centre).scaled(1.0 - rho).add(st.scaled(rho))
            params = _online_mstep(self._online_stats, mu, cv, reg, cvtype)
            _precision_cholesky(params[2], cvtype, D)
        except (NotPositiveDefiniteError, FloatingPointError) as exc:
            raise ValueError(f"{_ILL_DEFINED} ({exc})") from exc
        self._store(params, dt)
        self.converged_ = False
        self.n_iter_ = self._online_steps + 1
        self.lower_bound_ = st.loglik
        if self._online_steps == 0:
            self.lower_bounds_ = [st.loglik]
        else:
            self.lower_bounds_.append(st.loglik)
        return self

    @follows_input_namespace(fits=True)
    def fit_predict(self, X, y=None):
        """Fit, then return the most likely component of each event of X (always equal to
        ``fit(X).predict(X)``)."""
        self.__dict__.pop("_online_stats", None)
        self.__dict__.pop("_online_steps", None)
        X = self._fit(X)
        return np.argmax(self._estimate(X, want_resp=True)[1], axis=1)

    def _fit(self, X):
        if hasattr(self, "_validate_params"):
            self._validate_params()
        X = _validate_data(self, X, True, dtype=[np.float64, np.float32], ensure_min_samples=2)
        N, D = X.shape
        M = self.n_components
        if N < M:
            raise ValueError(f"Expected n_samples >= n_components but got n_components = {M}, n_samples = {N}")
        dt = _working_dtype(self.dtype, X.dtype)
        cvtype = self.covariance_type
        inits = (
            None if self.weights_init is None else _check_weights(self.weights_init, M),
            None if self.means_init is None else _check_means(self.means_init, M, D),
            None if self.precisions_init is None else _check_precisions(self.precisions_init, cvtype, M, D),
        )

        do_init = not (self.warm_start and hasattr(self, "converged_"))
        n_init = self.n_init if do_init else 1
        random_state = check_random_state(self.random_state)
        Xw = np.ascontiguousarray(X, dtype=dt)
        spec = self._specializer(Problem(N, D, M, cvtype, dt.name))

        max_lower_bound, best, best_n_iter, best_lbs, best_conv = -np.inf, None, 0, [], False
        for init in range(n_init):
            self._verbose_init_beg(init)
            if do_init:
                params = self._initial_params(X, random_state, inits)
            else:
                params = (
                    self.weights_.astype(np.float64),
                    self.means_.astype(np.float64),
                    np.asarray(self.covariances_, dtype=np.float64),
                )
            if self.max_iter == 0:
                best, best_n_iter = params, 0
                continue
            lb_prev = -np.inf if do_init else float(self.lower_bound_)
            t0 = time.perf_counter()
            w, mu, cv, n_iter, lbs, conv = self._em_compiled(spec, Xw, params, lb_prev)
            self._verbose_iters(lbs, lb_prev, time.perf_counter() - t0)
            self._verbose_init_end(lbs[-1], conv, time.perf_counter() - t0)
            lower_bound = lbs[-1]
            if lower_bound > max_lower_bound or max_lower_bound == -np.inf:
                max_lower_bound, best, best_n_iter = lower_bound, (w, mu, cv), n_iter
                best_lbs, best_conv = lbs, conv

        if not best_conv and self.max_iter > 0:
            warnings.warn(
                "Best performing initialization did not converge. Try different init "
                "parameters, or increase max_iter, tol, or check for degenerate data.",
                ConvergenceWarning,
            )
        self._store(best, dt, from_precisions=(self.max_iter == 0 and do_init and inits[2] is not None))
        self.converged_ = bool(best_conv)
        self.n_iter_ = int(best_n_iter)
        self.lower_bound_ = float(max_lower_bound)
        self.lower_bounds_ = [float(v) for v in best_lbs]
        return X

    def _specializer(self, problem):
        """The :class:`~asp_gmm.specializer.Specializer` that runs ``problem`` ("full" or "diag"): the
        one of ``backend``, or for "auto" the first backend with a variant for the problem.

        Each backend's Specializer is built once per estimator and kept in ``_specializers`` (not a
        parameter; left out of pickles and copies, see :meth:`__getstate__`), so that predict and
        score reuse its memoised candidates instead of building a new one on every call."""
        from . import backends
        from .specializer import Specializer

        specs = self.__dict__.setdefault("_specializers", {})

        def of(name):
            spec = specs.get(name)
            if spec is None:
                spec = specs[name] = Specializer(name)
            return spec

        if self.backend != "auto":
            return of(self.backend)
        last = None
        for name in backends.available():
            try:
                spec = of(name)
                spec.candidates(problem)
                backends.note_auto_choice(name)
                return spec
            except (BackendUnavailableError, VariantNotApplicableError) as exc:
                last = exc
        raise last  # pragma: no cover - the numpy backend runs everything

    def _em_compiled(self, spec, Xw, params, lb_prev):
        """scikit-learn's loop on the compiled core: up to ``max_iter - 1`` core iterations with the
        same stopping rule (the core checks one iteration earlier), then the final M-step."""
        w, mu, cv = params
        N = Xw.shape[0]
        prob = Problem(N, Xw.shape[1], self.n_components, self.covariance_type, Xw.dtype.name)
        reg, tol = float(self.reg_covar), float(self.tol)
        try:
            if np.isfinite(lb_prev):
                # warm start: scikit-learn's first check compares with the previous lower bound
                lp, _ = spec.evaluate(Xw, w, mu, cv, prob, reg, False)
                l0 = float(np.sum(lp, dtype=np.float64)) / N
                if abs(l0 - lb_prev) < tol:
                    r = spec.train(Xw, w, mu, cv, prob, reg, 1, 1, 0.0)
                    return r.weights, r.means, r.covars, 1, [l0], True
            r1 = spec.train(Xw, w, mu, cv, prob, reg, 1, self.max_iter - 1, tol)
            r2 = spec.train(Xw, r1.weights, r1.means, r1.covars, prob, reg, 1, 1, 0.0)
        except (NotPositiveDefiniteError, FloatingPointError) as exc:
            raise ValueError(f"{_ILL_DEFINED} ({exc})") from exc
        trace = getattr(r1, "loglik_trace", None) or [r1.loglik]
        lbs = [float(v) / N for v in trace]
        lbs[-1] = r1.loglik / N
        return r2.weights, r2.means, r2.covars, r1.iters + 1, lbs, bool(r1.converged)

    # ------------------------------------------------------------------------------ initialisation
    def _initial_params(self, X, random_state, inits):
        """Initial (weights, means, covariances) in float64, as scikit-learn's ``_initialize``."""
        weights_init, means_init, precisions_init = inits
        N, M, cvtype, reg = X.shape[0], self.n_components, self.covariance_type, float(self.reg_covar)
        weights = means = cov = None
        if weights_init is None or means_init is None or precisions_init is None:
            nk, means, cov = self._init_from_data(X, random_state, N, M, cvtype, reg)
            weights = nk / N
        if weights_init is not None:
            weights = weights_init
        if means_init is not None:
            means = means_init
        if precisions_init is not None:
            pc = ref.precision_cholesky_from_precisions(precisions_init, cvtype)
            cov = ref.covariances_from_precision_cholesky(pc, cvtype)
        else:
            _precision_cholesky(cov, cvtype, X.shape[1])  # scikit-learn's check (and message) at initialisation
        return (np.asarray(weights, np.float64), np.asarray(means, np.float64), np.asarray(cov, np.float64))

    def _init_from_data(self, X, random_state, N, M, cvtype, reg):
        X64 = np.asarray(X, dtype=np.float64)
        method = self.init_params
        if method == "random":
            resp = random_state.uniform(size=(N, M))
            resp /= resp.sum(axis=1)[:, None]
            return _estimate_params(X64, resp, reg, cvtype)
        if method == "random_from_data":
            idx = random_state.choice(N, size=M, replace=False)
            return _one_hot_params(X64, idx, reg, cvtype)
        sub = None
        if N > KMEANS_SUBSAMPLE:
            sub = np.sort(random_state.choice(N, size=KMEANS_SUBSAMPLE, replace=False))
        Xs = X if sub is None else X[sub]
        if method == "k-means++":
            _, idx = kmeans_plusplus(Xs, M, random_state=random_state)
            if sub is not None:
                idx = sub[idx]
            return _one_hot_params(X64, idx, reg, cvtype)
        km = KMeans(n_clusters=M, n_init=1, random_state=random_state).fit(Xs)
        labels = km.labels_ if sub is None else km.predict(X)
        return _label_params(X64, labels, M, reg, cvtype)

    # ------------------------------------------------------------------------------ parameters
    def _store(self, params, dt, from_precisions=False):
        """Set the fitted attributes from ``(weights, means, covariances)`` (float64) in ``dt``."""
        w, mu, cv = params
        cvtype = self.covariance_type
        if from_precisions:  # max_iter=0 with precisions_init: scikit-learn's factor of the precisions
            pc = ref.precision_cholesky_from_precisions(
                _check_precisions(self.precisions_init, cvtype, self.n_components, mu.shape[1]), cvtype
            )
        else:
            pc = _precision_cholesky(cv, cvtype, mu.shape[1])
        self._set_parameters(tuple(np.asarray(a, dtype=dt) for a in (w, mu, cv, pc)))

    def _get_parameters(self):
        """scikit-learn's hook: ``(weights_, means_, covariances_, precisions_cholesky_)``."""
        return (self.weights_, self.means_, self.covariances_, self.precisions_cholesky_)

    def _set_parameters(self, params, xp=None):
        """scikit-learn's hook (its tests call it): set ``(weights, means, covariances,
        precisions_cholesky)`` as given and ``precisions_`` from the last, in its dtype."""
        w, mu, cv, pc = params
        self.weights_, self.means_, self.covariances_, self.precisions_cholesky_ = w, mu, cv, pc
        dt = np.asarray(pc).dtype
        self.precisions_ = np.asarray(
            ref.precisions_from_cholesky(np.asarray(pc, np.float64), self.covariance_type), dt
        )
        self._fitted_cvtype = self.covariance_type

    def _initialize(self, X, resp):
        """scikit-learn's hook: the initial parameters from responsibilities ``resp`` (N, M) of X
        (N, D), with ``weights_init``, ``means_init`` and ``precisions_init`` where given, in X's dtype."""
        M, D, cvtype = resp.shape[1], X.shape[1], self.covariance_type  # M of resp, as scikit-learn's
        nk, means, cov = _estimate_params(
            np.asarray(X, np.float64), np.asarray(resp, np.float64), self.reg_covar, cvtype
        )
        weights = nk / X.shape[0] if self.weights_init is None else _check_weights(self.weights_init, M)
        means = means if self.means_init is None else _check_means(self.means_init, M, D)
        if self.precisions_init is None:
            pc = _precision_cholesky(cov, cvtype, D)
        else:
            pc = ref.precision_cholesky_from_precisions(_check_precisions(self.precisions_init, cvtype, M, D), cvtype)
            cov = ref.covariances_from_precision_cholesky(pc, cvtype)
        dt = X.dtype if X.dtype in (np.float32, np.float64) else np.dtype(np.float64)
        self._set_parameters(tuple(np.asarray(a, dtype=dt) for a in (weights, means, cov, pc)))

    def _params64(self):
        return (
            np.asarray(self.weights_, np.float64),
            np.asarray(self.means_, np.float64),
            np.asarray(self.covariances_, np.float64),
        )

    # ------------------------------------------------------------------------------ inference
    def _estimate(self, X, want_resp):
        """``(log p(x) (N,), responsibilities (N, M) or None)`` under the fitted parameters."""
        cvtype = self.covariance_type
        dt = np.dtype(self.means_.dtype) if self.means_.dtype == np.float32 else np.dtype(np.float64)
        N, D = X.shape
        Xw = np.ascontiguousarray(X, dtype=dt)
        prob = Problem(N, D, self.n_components, cvtype, dt.name)
        try:
            return self._specializer(prob).evaluate(Xw, *self._params64(), prob, float(self.reg_covar), want_resp)
        except (NotPositiveDefiniteError, FloatingPointError) as exc:
            raise ValueError(f"{_ILL_DEFINED} ({exc})") from exc

    @follows_input_namespace()
    def score_samples(self, X):
        """Log-likelihood of each event, (n_samples,)."""
        check_is_fitted(self)
        X = _validate_data(self, X, False)
        return self._estimate(X, want_resp=False)[0]

    @follows_input_namespace()
    def score(self, X, y=None):
        """Mean log-likelihood of the events of X, averaged in the working precision (as
        scikit-learn does: float32 for float32 models)."""
        return self.score_samples(X).mean()

    @follows_input_namespace()
    def predict(self, X):
        """Most likely component of each event, (n_samples,) of int."""
        check_is_fitted(self)
        X = _validate_data(self, X, False)
        return np.argmax(self._estimate(X, want_resp=True)[1], axis=1)

    @follows_input_namespace()
    def predict_proba(self, X):
        """Posterior probability of each component for each event, (n_samples, n_components)."""
        check_is_fitted(self)
        X = _validate_data(self, X, False)
        return self._estimate(X, want_resp=True)[1]

    @follows_input_namespace(of_fitted=True)
    def sample(self, n_samples=1):
        """Random events from the fitted mixture: ``(X (n_samples, n_features), y (n_samples,))``
        (scikit-learn's algorithm and random stream)."""
        check_is_fitted(self)
        if n_samples < 1:
            raise ValueError(
                "Invalid value for 'n_samples': %d . The sampling requires at least one sample." % (self.n_components)
            )
        _, D = self.means_.shape
        rng = check_random_state(self.random_state)
        counts = rng.multinomial(n_samples, self.weights_)
        if self.covariance_type == "full":
            X = np.vstack(
                [rng.multivariate_normal(m, c, int(s)) for m, c, s in zip(self.means_, self.covariances_, counts)]
            )
        elif self.covariance_type == "tied":
            X = np.vstack([rng.multivariate_normal(m, self.covariances_, int(s)) for m, s in zip(self.means_, counts)])
        else:
            X = np.vstack(
                [
                    m + rng.standard_normal(size=(s, D)) * np.sqrt(c)
                    for m, c, s in zip(self.means_, self.covariances_, counts)
                ]
            )
        y = np.concatenate([np.full(int(s), i, dtype=np.int64) for i, s in enumerate(counts)])
        return np.asarray(X, dtype=np.float64), y

    def _n_parameters(self):
        _, D = self.means_.shape
        M = self.n_components
        cov_params = {"full": M * D * (D + 1) / 2.0, "diag": M * D, "tied": D * (D + 1) / 2.0, "spherical": M}[
            self.covariance_type
        ]
        return int(cov_params + D * M + M - 1)

    @follows_input_namespace()
    def bic(self, X):
        """Bayesian information criterion of the model on X (lower is better)."""
        return -2 * self.score(X) * X.shape[0] + self._n_parameters() * math.log(X.shape[0])

    @follows_input_namespace()
    def aic(self, X):
        """Akaike information criterion of the model on X (lower is better)."""
        return -2 * self.score(X) * X.shape[0] + 2 * self._n_parameters()

    # ------------------------------------------------------------------------------ verbose output
    def _verbose_init_beg(self, n_init):
        if self.verbose >= 1:
            print("Initialization %d" % n_init)

    def _verbose_iters(self, lbs, lb_prev, seconds):
        if not self.verbose:
            return
        per = seconds / max(len(lbs), 1)
        prev = lb_prev
        for i, lb in enumerate(lbs, 1):
            if i % self.verbose_interval == 0:
                if self.verbose == 1:
                    print("  Iteration %d" % i)
                else:
                    print("  Iteration %d\t time lapse %.5fs\t ll change %.5f" % (i, per, lb - prev))
            prev = lb

    def _verbose_init_end(self, lb, converged, seconds):
        msg = "converged" if converged else "did not converge"
        if self.verbose == 1:
            print(f"Initialization {msg}.")
        elif self.verbose >= 2:
            print(f"Initialization {msg}. time lapse {seconds:.5f}s\t lower bound {lb:.5f}.")
