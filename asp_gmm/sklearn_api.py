"""A scikit-learn drop-in: ``asp_gmm.GaussianMixture``, specialized underneath.

    from asp_gmm import GaussianMixture        # instead of: from sklearn.mixture import GaussianMixture
    gm = GaussianMixture(16, covariance_type="diag").fit(X)

Same parameters, methods and attributes as :class:`sklearn.mixture.GaussianMixture`, plus two keywords:

``backend`` : {"auto", "c", "cuda", "numpy"}
    Where the "full" and "diag" EM loops run (see :class:`asp_gmm.GMM`). "auto" takes the first of
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

"tied" and "spherical" covariances have no compiled variant: they run scikit-learn's loop on the
project's float64 NumPy reference (:mod:`asp_gmm.reference`, scikit-learn's formulas; correct, not
faster than scikit-learn). The initial parameters and every NumPy E- and M-step come from that
module too; the drop-in keeps no copies of scikit-learn's numerical helpers (it only reproduces
scikit-learn's starting covariances of one-event components, see ``_one_hot_params``).

Initialisation: as scikit-learn's, with k-means on a subsample of large data (see
:mod:`asp_gmm.fit.init`). Sample weights: ``fit(X, sample_weight=w)`` and ``partial_fit``.

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
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.utils import check_random_state
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
from .fit import init as fit_init
from .fit import numpy_em, online
from .fit.checks import _check_means, _check_precisions, _check_weights, _sample_weight, _working_dtype
from .fit import dropin
from .fit.dropin import _is_dask_array, fit_large
from .fit.init import KMEANS_SUBSAMPLE  # noqa: F401  (public: the k-means subsample's size)
from .fit.numpy_em import (  # noqa: F401  (the drop-in's numerics; tests call them by these names)
    ILL_DEFINED as _ILL_DEFINED,
    estep as _estep,
    estimate_params as _estimate_params,
    label_params as _label_params,
    precision_cholesky as _precision_cholesky,
)
from . import reference as ref
from .errors import BackendUnavailableError, NotPositiveDefiniteError, VariantNotApplicableError
from .problem import Problem

__all__ = ["GaussianMixture", "KMEANS_SUBSAMPLE"]

_COMPILED = ("full", "diag")


def _validate_data(est, X, reset, **kw):
    if cuda_arrays.is_cuda_array(X):  # PyTorch/CuPy CUDA arrays: the drop-in works on a host copy
        X = cuda_arrays.to_host(X)
    if _sk_validate_data is not None:
        return _sk_validate_data(est, X, reset=reset, **kw)
    return est._validate_data(X, reset=reset, **kw)  # pragma: no cover - scikit-learn < 1.6


# ---------------------------------------------------------------------------------------------------


class GaussianMixture(DensityMixin, BaseEstimator):
    """Gaussian mixture model trained by specialized EM: scikit-learn's ``GaussianMixture`` API.

    Parameters
    ----------
    n_components, covariance_type, tol, reg_covar, max_iter, n_init, init_params, weights_init,
    means_init, precisions_init, random_state, warm_start, verbose, verbose_interval
        As in :class:`sklearn.mixture.GaussianMixture`.
    backend : {"auto", "c", "cuda", "numpy"}, default="auto"
        Runtime of the "full" and "diag" EM loops ("tied" and "spherical" always run in NumPy).
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
    def fit(self, X, y=None, sample_weight=None) -> "GaussianMixture":
        """Estimate the parameters with the EM algorithm (see
        :meth:`sklearn.mixture.GaussianMixture.fit`).

        Parameters
        ----------
        X : array-like (N, D), or data never loaded whole
            In memory; or streamed one block at a time (:mod:`asp_gmm.streaming`): a
            ``numpy.memmap``, an h5py or zarr dataset, a callable returning a new iterable of
            (n_i, D) row chunks on each call; or a ``dask.array`` (distributed EM on the Dask
            workers, :mod:`asp_gmm.dask`). Streamed and Dask fits need "full" or "diag"
            covariance and run one initialisation. Unless ``*_init`` are given they start, on a
            source with ``init_params`` "kmeans" or "k-means++", from k-means on a uniform sample
            of :data:`KMEANS_SUBSAMPLE` events (as large in-memory data does; two passes), else
            (Dask arrays, other ``init_params``) from ``GMM.train``'s seeding: means at events
            spread evenly through X (random distinct events drawn from ``random_state`` where it is
            set), the data's covariance, equal weights.
        y : ignored
        sample_weight : array-like (N,), optional
            Non-negative weight of each event (scikit-learn's most requested GaussianMixture
            feature): integer weights give the model of the repeated rows, zero weights that of the
            dropped rows; initialisation (k-means, k-means++, random draws) weighs the events too.
            For a streamed X an aligned (N,) array or memmap, or a callable returning a new
            iterable of (n_i,) weight chunks.

        Returns
        -------
        self
        """
        if _is_dask_array(X) or (
            streaming.is_source(X) and (self.covariance_type in _COMPILED or not hasattr(X, "shape"))
        ):
            fit_large(self, X, sample_weight)
            return self
        self._fit(X, sample_weight)  # (a memmap or dataset for "tied" or "spherical": loaded, as scikit-learn does)
        return self

    @follows_input_namespace(fits=True)
    def partial_fit(self, X, y=None, sample_weight=None):
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

        Parameters
        ----------
        X : array-like (n, D)
            One batch.
        y : ignored
        sample_weight : array-like (n,), optional
            Non-negative weight of each event of the batch (see :meth:`fit`); the batch's
            statistics are per unit of weight.

        Returns
        -------
        self
        """
        if hasattr(self, "_validate_params"):
            self._validate_params()
        first = not hasattr(self, "_online_stats")
        X = _validate_data(self, X, first, dtype=[np.float64, np.float32], ensure_min_samples=1)
        cvtype, M, reg = self.covariance_type, self.n_components, float(self.reg_covar)
        n, D = X.shape
        sw = None if sample_weight is None else _sample_weight(sample_weight, n, M if first else 1)
        if first:
            if n < M:
                raise ValueError(
                    "Expected n_samples >= n_components in the first partial_fit batch but got "
                    f"n_components = {M}, n_samples = {n}"
                )
            dt = _working_dtype(self.dtype, X.dtype)
            inits = self._checked_inits(M, D)
            w, mu, cv = self._initial_params(X, check_random_state(self.random_state), inits, sw)
        else:
            dt = np.dtype(self.means_.dtype)
            w, mu, cv = self._params64()
        Xw = np.ascontiguousarray(X, dtype=dt)
        try:
            if cvtype in _COMPILED:
                prob = Problem(n, D, M, cvtype, dt.name)
                st = streaming.source_stats(self._specializer(prob), Xw, prob, w, mu, cv, reg, sample_weight=sw)
            else:  # tied, spherical: float64 NumPy statistics (full, diagonal), reduced in the M-step
                st = online.numpy_stats(X, w, mu, cv, cvtype, sw)
            st = st.scaled(1.0 / st.n)
            if first:
                self._online_stats, self._online_steps = st, 0
            else:
                self._online_steps += 1
                rho = (float(self.online_t0) + self._online_steps) ** -float(self.online_kappa)
                self._online_stats = self._online_stats.recentred(st.centre).scaled(1.0 - rho).add(st.scaled(rho))
            params = online.online_mstep(self._online_stats, mu, cv, reg, cvtype)
            _precision_cholesky(params[2], cvtype, D)
        except (NotPositiveDefiniteError, FloatingPointError) as exc:
            raise ValueError(f"{_ILL_DEFINED} ({exc})") from exc
        self._set_parameters(params, dt)
        self.converged_ = False
        self.n_iter_ = self._online_steps + 1
        self.lower_bound_ = st.loglik
        if first:
            self.lower_bounds_ = [st.loglik]
        else:
            self.lower_bounds_.append(st.loglik)
        return self

    @follows_input_namespace(fits=True)
    def fit_predict(self, X, y=None):
        """Fit, then return the most likely component of each event of X (always equal to
        ``fit(X).predict(X)``)."""
        X = self._fit(X)
        return np.argmax(self._estimate(X, want_resp=True)[1], axis=1)

    def _fit(self, X, sample_weight=None):
        if hasattr(self, "_validate_params"):
            self._validate_params()
        X = _validate_data(self, X, True, dtype=[np.float64, np.float32], ensure_min_samples=2)
        N, D = X.shape
        M = self.n_components
        if N < M:
            raise ValueError(f"Expected n_samples >= n_components but got n_components = {M}, n_samples = {N}")
        sw = None if sample_weight is None else _sample_weight(sample_weight, N, M)
        dt = _working_dtype(self.dtype, X.dtype)
        cvtype = self.covariance_type
        inits = self._checked_inits(M, D)

        do_init = not (self.warm_start and hasattr(self, "converged_"))
        n_init = self.n_init if do_init else 1
        random_state = check_random_state(self.random_state)
        compiled = cvtype in _COMPILED
        Xw = np.ascontiguousarray(X, dtype=dt) if compiled else None
        X64 = None if compiled else np.asarray(X, dtype=np.float64)
        spec = self._specializer(Problem(N, D, M, cvtype, dt.name)) if compiled else None

        max_lower_bound, best, best_n_iter, best_lbs, best_conv = -np.inf, None, 0, [], False
        for init in range(n_init):
            self._verbose_init_beg(init)
            if do_init:
                params = self._initial_params(X, random_state, inits, sw)
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
            if compiled:
                w, mu, cv, n_iter, lbs, conv = self._em_compiled(spec, Xw, params, lb_prev, sw)
            else:
                w, mu, cv, n_iter, lbs, conv = self._em_numpy(X64, params, lb_prev, sw)
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
        self._set_parameters(best, dt, from_precisions=(self.max_iter == 0 and do_init and inits[2] is not None))
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

    def _em_compiled(self, spec, Xw, params, lb_prev, sample_weight=None):
        return dropin.compiled_em(self, spec, Xw, params, lb_prev, sample_weight)

    def _em_numpy(self, X, params, lb_prev, sample_weight=None):
        """scikit-learn's loop in float64 NumPy (tied, spherical): :func:`asp_gmm.fit.numpy_em.em`."""
        return numpy_em.em(
            X,
            params,
            self.covariance_type,
            float(self.reg_covar),
            float(self.tol),
            self.max_iter,
            lb_prev,
            sample_weight,
        )

    # ------------------------------------------------------------------------------ initialisation
    def _initial_params(self, X, random_state, inits, sample_weight=None):
        """Initial (weights, means, covariances) in float64, as scikit-learn's ``_initialize``."""
        weights_init, means_init, precisions_init = inits
        N, M, cvtype, reg = X.shape[0], self.n_components, self.covariance_type, float(self.reg_covar)
        weights = means = cov = None
        if weights_init is None or means_init is None or precisions_init is None:
            nk, means, cov = self._init_from_data(X, random_state, N, M, cvtype, reg, sample_weight)
            weights = nk / (N if sample_weight is None else sample_weight.sum())
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

    def _init_from_data(self, X, random_state, N, M, cvtype, reg, sample_weight=None):
        return fit_init.from_data(X, random_state, M, cvtype, reg, self.init_params, sample_weight)

    def _checked_inits(self, M, D):
        """``(weights_init, means_init, precisions_init)`` checked with scikit-learn's messages
        (``None`` where not given)."""
        cvtype = self.covariance_type
        return (
            None if self.weights_init is None else _check_weights(self.weights_init, M),
            None if self.means_init is None else _check_means(self.means_init, M, D),
            None if self.precisions_init is None else _check_precisions(self.precisions_init, cvtype, M, D),
        )

    # ------------------------------------------------------------------------------ parameters
    def _set_parameters(self, params, dt, from_precisions=False):
        w, mu, cv = params
        cvtype = self.covariance_type
        if from_precisions:  # max_iter=0 with precisions_init: scikit-learn's factor of the precisions
            pc = ref.precision_cholesky_from_precisions(
                _check_precisions(self.precisions_init, cvtype, self.n_components, mu.shape[1]), cvtype
            )
        else:
            pc = _precision_cholesky(cv, cvtype, mu.shape[1])
        self.weights_ = np.asarray(w, dtype=dt)
        self.means_ = np.asarray(mu, dtype=dt)
        self.covariances_ = np.asarray(cv, dtype=dt)
        self.precisions_cholesky_ = np.asarray(pc, dtype=dt)
        self.precisions_ = np.asarray(ref.precisions_from_cholesky(pc, cvtype), dtype=dt)

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
        if cvtype in _COMPILED:
            Xw = np.ascontiguousarray(X, dtype=dt)
            prob = Problem(N, D, self.n_components, cvtype, dt.name)
            try:
                return self._specializer(prob).evaluate(Xw, *self._params64(), prob, float(self.reg_covar), want_resp)
            except (NotPositiveDefiniteError, FloatingPointError) as exc:
                raise ValueError(f"{_ILL_DEFINED} ({exc})") from exc
        w, mu, _ = self._params64()
        lpn, resp = _estep(np.asarray(X, np.float64), w, mu, np.asarray(self.precisions_cholesky_, np.float64), cvtype)
        return lpn.astype(dt, copy=False), (resp.astype(dt, copy=False) if want_resp else None)

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
