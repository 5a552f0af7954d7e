"""The drop-in's loops on the specializer, with scikit-learn's semantics (up to ``max_iter - 1``
iterations, then the final M-step): in memory on the compiled core (:func:`compiled_em`), and on
data never loaded whole (:func:`fit_large`): a chunk source (the pass loop of
:mod:`asp_gmm.fit.passes`) or a Dask array (:mod:`asp_gmm.dask`)."""

from __future__ import annotations

import warnings

import numpy as np

from .. import reference as ref
from ..errors import NotPositiveDefiniteError
from ..problem import KERNEL_CVTYPE, Problem
from . import init as fit_init
from . import sources
from .checks import _check_means, _check_precisions, _check_weights, _working_dtype  # noqa: F401
from .numpy_em import ILL_DEFINED as _ILL_DEFINED
from .seed import seed as stream_seed
from .seed import seeded_as


def _dask_seed(adask, X, M, cvtype, dt, reg, seed, backend):
    """``GMM.train``'s seeding of a Dask array: one pass with no iteration."""
    r = adask.fit(X, M, cvtype=cvtype, dtype=dt, reg_covar=reg, seed=seed, backend=backend, min_iters=0, max_iters=0)
    return r.weights, r.means, r.covars


def _is_dask_array(X) -> bool:
    return type(X).__module__.split(".")[0] == "dask" and hasattr(X, "chunks") and hasattr(X, "to_delayed")


def fit_large(est, X, sample_weight=None):
    """:meth:`GaussianMixture.fit <asp_gmm.sklearn_api.GaussianMixture.fit>` of a chunk source or a
    Dask array (see there); sets the estimator's fitted attributes."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.utils import check_random_state

    if hasattr(est, "_validate_params"):
        est._validate_params()
    cvtype, M = est.covariance_type, est.n_components
    on_dask = _is_dask_array(X)
    if on_dask:
        src, D, kind = None, int(X.shape[1]), X.dtype
    else:
        src = sources.as_source(X)
        first = None if src.n_features is not None else next(iter(src.chunks()), None)
        D = src.n_features if first is None else np.asarray(first).shape[-1]
        kind = getattr(X, "dtype", None) if first is None else np.asarray(first).dtype
    dt = _working_dtype(
        est.dtype, np.dtype(kind) if kind is not None and np.dtype(kind).kind == "f" else np.dtype(np.float64)
    )
    inits = est._checked_inits(M, D)
    w, mu, cv = inits[0], inits[1], None
    if inits[2] is not None:
        cv = ref.covariances_from_precision_cholesky(ref.precision_cholesky_from_precisions(inits[2], cvtype), cvtype)
    if est.warm_start and hasattr(est, "converged_"):
        w, mu, cv = est._params64()
    seed = None if est.random_state is None else int(check_random_state(est.random_state).randint(2**31 - 1))
    reg, tol = float(est.reg_covar), float(est.tol)
    n = None
    if on_dask:
        from .. import dask as adask

        if w is None or mu is None or cv is None:
            s_w, s_mu, s_cv = _dask_seed(adask, X, M, cvtype, dt, reg, seed, est.backend)
            w, mu, cv = (s_w if w is None else w), (s_mu if mu is None else mu), (s_cv if cv is None else cv)
        kw = dict(cvtype=cvtype, dtype=dt, reg_covar=reg, backend=est.backend)
        if sample_weight is not None:  # (asp_gmm.dask takes the weights as an aligned Dask array)
            import inspect

            if "sample_weight" not in inspect.signature(adask.fit).parameters:
                raise NotImplementedError(
                    "sample_weight with a Dask array needs asp_gmm.dask.fit(sample_weight=), which this "
                    "version lacks; fit a NumPy array, a memmap or a chunk source with sample_weight instead"
                )
            kw["sample_weight"] = sample_weight
        r1 = adask.fit(
            X, M, weights=w, means=mu, covars=cv, min_iters=1, max_iters=max(est.max_iter - 1, 0), tol=tol, **kw
        )
        r2 = adask.fit(
            X,
            M,
            weights=r1.weights,
            means=r1.means,
            covars=r1.covars,
            min_iters=1,
            max_iters=1 if est.max_iter else 0,
            tol=0.0,
            **kw,
        )
        n = r1.n_events
    else:
        sw = sources.as_weights(sample_weight, src.n_rows)
        if (w is None or mu is None or cv is None) and est.init_params in ("kmeans", "k-means++"):
            n, k_w, k_mu, k_cv = fit_init.stream_kmeans(
                src, M, D, cvtype, dt, reg, est.init_params, check_random_state(est.random_state), sw
            )
            w, mu, cv = (k_w if w is None else w), (k_mu if mu is None else mu), (k_cv if cv is None else cv)
        elif w is None or mu is None or cv is None:
            # seeded as the kernel type ("full" for "tied", "diag" for "spherical"), shaped as cvtype
            n, s_mu, s_cv = stream_seed(src, M, D, KERNEL_CVTYPE[cvtype], dt, reg, seed, sw)
            w = np.full(M, 1.0 / M) if w is None else w
            mu = s_mu.astype(np.float64) if mu is None else mu
            cv = seeded_as(s_cv, cvtype) if cv is None else cv
        prob = Problem(n or src.n_rows or 0, D, M, cvtype, dt.name)
        spec = est._specializer(prob)
        try:
            r1 = spec.train(src, w, mu, cv, prob, reg, 1, max(est.max_iter - 1, 0), tol, sample_weight=sw)
            r2 = spec.train(
                src, r1.weights, r1.means, r1.covars, prob, reg, 1, 1 if est.max_iter else 0, 0.0, sample_weight=sw
            )
        except (NotPositiveDefiniteError, FloatingPointError) as exc:
            raise ValueError(f"{_ILL_DEFINED} ({exc})") from exc
        n = r1.n_events
    lbs = [float(v) / (getattr(r1, "weight_sum", 0.0) or n) for v in r1.loglik_trace]
    if not r1.converged and est.max_iter > 0:
        warnings.warn(
            "Best performing initialization did not converge. Try different init "
            "parameters, or increase max_iter, tol, or check for degenerate data.",
            ConvergenceWarning,
        )
    est._store((r2.weights, r2.means, r2.covars), dt)
    est.converged_ = bool(r1.converged)
    est.n_iter_ = int(r1.iters + 1) if est.max_iter else 0
    est.lower_bound_ = lbs[-1]
    est.lower_bounds_ = lbs
    est.n_features_in_ = D


def compiled_em(est, spec, Xw, params, lb_prev, sample_weight=None):
    """scikit-learn's loop on the compiled core: up to ``max_iter - 1`` core iterations with the
    same stopping rule (the core checks one iteration earlier), then the final M-step."""
    w, mu, cv = params
    sw = sample_weight
    N = Xw.shape[0]
    W = N if sw is None else float(sw.sum())  # the lower bound is per unit of weight
    prob = Problem(N, Xw.shape[1], est.n_components, est.covariance_type, Xw.dtype.name)
    reg, tol = float(est.reg_covar), float(est.tol)
    try:
        if np.isfinite(lb_prev):
            # warm start: scikit-learn's first check compares with the previous lower bound
            lp, _ = spec.evaluate(Xw, w, mu, cv, prob, reg, False)
            lp = np.asarray(lp, np.float64)
            l0 = float(np.sum(lp if sw is None else lp * sw, dtype=np.float64)) / W
            if abs(l0 - lb_prev) < tol:
                r = spec.train(Xw, w, mu, cv, prob, reg, 1, 1, 0.0, sample_weight=sw)
                return r.weights, r.means, r.covars, 1, [l0], True
        r1 = spec.train(Xw, w, mu, cv, prob, reg, 1, est.max_iter - 1, tol, sample_weight=sw)
        r2 = spec.train(Xw, r1.weights, r1.means, r1.covars, prob, reg, 1, 1, 0.0, sample_weight=sw)
    except (NotPositiveDefiniteError, FloatingPointError) as exc:
        raise ValueError(f"{_ILL_DEFINED} ({exc})") from exc
    trace = getattr(r1, "loglik_trace", None) or [r1.loglik]
    lbs = [float(v) / W for v in trace]
    lbs[-1] = r1.loglik / W
    return r2.weights, r2.means, r2.covars, r1.iters + 1, lbs, bool(r1.converged)
