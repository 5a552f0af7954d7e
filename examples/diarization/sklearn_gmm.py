"""A thin adapter exposing asp_gmm's public API (``GMM``, ``compute_distance_BIC``) on top of
scikit-learn's ``GaussianMixture``, so that the diarizer's clustering code runs unchanged with
``--backend sklearn`` and the two implementations can be compared on the same audio.

Conventions copied from asp_gmm: ``train`` returns the total log-likelihood of X under the *final*
parameters; the first ``train`` seeds the model (unless means/covars/weights were given), later calls
warm-start from the current parameters; ``covars`` is (M, D, D) for "full" and (M, D) for "diag".
"""

from __future__ import annotations

import warnings

import numpy as np


class GMM:
    backend = "sklearn"

    def __init__(
        self,
        M,
        D,
        means=None,
        covars=None,
        weights=None,
        cvtype="full",
        dtype=np.float32,
        reg_covar=1e-6,
        backend="sklearn",
        variant=None,
        seed=None,
    ):
        if cvtype not in ("full", "diag"):
            raise ValueError(f"cvtype must be 'full' or 'diag', not {cvtype!r}")
        self.M, self.D, self.cvtype = int(M), int(D), cvtype
        self.dtype = np.dtype(dtype)
        self.reg_covar = float(reg_covar)
        self.seed = seed
        self._gm = None
        self._init = None
        self.loglik = None  # log-likelihood of the last train() (as asp_gmm.GMM)
        self.n_events = None  # events of the last train()
        if means is not None or covars is not None or weights is not None:
            if means is None or covars is None or weights is None:
                raise ValueError("give all of means, covars and weights, or none")
            self._init = (
                np.asarray(weights, np.float64),
                np.asarray(means, np.float64),
                np.asarray(covars, np.float64),
            )

    # -- parameters ---------------------------------------------------------------------------
    @property
    def weights(self):
        return self._gm.weights_ if self._gm is not None else (self._init[0] if self._init else None)

    @property
    def means(self):
        return self._gm.means_ if self._gm is not None else (self._init[1] if self._init else None)

    @property
    def covars(self):
        return self._gm.covariances_ if self._gm is not None else (self._init[2] if self._init else None)

    def _seed_params(self, X):
        """Seed as asp_gmm does: means at M distinct events (evenly spaced, or drawn with ``seed``),
        every covariance the data's (co)variance, equal weights."""
        n = len(X)
        if self.seed is None:
            idx = (np.arange(self.M) * n) // self.M
        else:
            idx = np.sort(np.random.default_rng(self.seed).choice(n, self.M, replace=False))
        means = X[idx].astype(np.float64)
        var = X.var(axis=0).astype(np.float64) + self.reg_covar
        if self.cvtype == "diag":
            covars = np.tile(var, (self.M, 1))
        else:
            c = np.atleast_2d(np.cov(X.astype(np.float64), rowvar=False, bias=True)) + self.reg_covar * np.eye(self.D)
            covars = np.tile(c, (self.M, 1, 1))
        return np.full(self.M, 1.0 / self.M), means, covars

    def _precisions(self, covars):
        if self.cvtype == "diag":
            return 1.0 / covars
        return np.linalg.inv(covars)

    # -- training -----------------------------------------------------------------------------
    def train(self, X, min_em_iters=1, max_em_iters=10, tol=1e-3):
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.mixture import GaussianMixture

        X = np.ascontiguousarray(X, dtype=self.dtype)
        if X.ndim != 2 or X.shape[1] != self.D:
            raise ValueError(f"X must be (N, {self.D}), got {X.shape}")
        if len(X) < self.M:
            raise ValueError(f"X has N={len(X)} events, fewer than the M={self.M} components")
        if self._gm is not None and getattr(self, "_scoring_only", False):
            self._gm, self._scoring_only = None, False  # made only to score: start a real fit
        if self._gm is None:
            w, m, c = self._init if self._init is not None else self._seed_params(X)
            self._gm = GaussianMixture(
                n_components=self.M,
                covariance_type=self.cvtype,
                reg_covar=self.reg_covar,
                weights_init=w / w.sum(),
                means_init=m,
                precisions_init=self._precisions(c),
                warm_start=True,
                random_state=self.seed,
            )
        gm = self._gm
        gm.max_iter = int(max_em_iters)
        # scikit-learn stops on |change of the mean log-likelihood| < tol; with min == max the
        # caller wants exactly that many iterations.
        gm.tol = 0.0 if min_em_iters >= max_em_iters else tol
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            gm.fit(X)
        self.loglik = float(gm.score_samples(X).sum())
        self.n_events = len(X)
        return self.loglik

    # -- evaluation ---------------------------------------------------------------------------
    def _fitted(self, X):
        if self._gm is None:
            if self._init is None:
                raise RuntimeError("GMM has not been trained yet and has no given parameters")
            self._gm = self._model_from_params(*self._init)
        return np.ascontiguousarray(X, dtype=self.dtype)

    def _model_from_params(self, w, m, c):
        """A GaussianMixture holding given parameters (to score before any training); its
        ``*_init`` are set too, so a later ``train`` starts from the same parameters."""
        from sklearn.mixture import GaussianMixture

        gm = GaussianMixture(
            n_components=self.M,
            covariance_type=self.cvtype,
            reg_covar=self.reg_covar,
            weights_init=w / w.sum(),
            means_init=m,
            precisions_init=self._precisions(c),
            warm_start=False,
            random_state=self.seed,
        )
        gm.weights_, gm.means_, gm.covariances_ = w / w.sum(), m, c
        if self.cvtype == "diag":
            gm.precisions_cholesky_ = 1.0 / np.sqrt(c)
        else:
            from scipy.linalg import solve_triangular

            chol = np.linalg.cholesky(c)
            eye = np.eye(self.D)
            gm.precisions_cholesky_ = np.stack([solve_triangular(L, eye, lower=True).T for L in chol])
        gm.precisions_ = self._precisions(c)
        gm.converged_, gm.n_iter_, gm.lower_bound_ = False, 0, -np.inf
        gm.n_features_in_ = self.D
        self._scoring_only = True
        return gm

    def score(self, X):
        X = self._fitted(X)
        return self._gm.score_samples(X)

    def eval(self, X):
        X = self._fitted(X)
        return self._gm.score_samples(X), self._gm.predict_proba(X)

    def predict(self, X):
        X = self._fitted(X)
        return self._gm.predict(X)


def compute_distance_BIC(gmm1, gmm2, X, X1=None, X2=None, min_em_iters=1, max_em_iters=10, tol=1e-3):
    """Merge score of two clusters, as asp_gmm.compute_distance_BIC.

    The merged model has M1+M2 components initialised from both models, their weights scaled by
    each model's share of the data, and is trained on X (the union of both models' data). It has as
    many parameters as the two together, so the BIC penalties cancel (ICSI) and the score is
    ``L(merged on X) - L(gmm1) - L(gmm2)``, where ``L(gmm_i)`` is the log-likelihood of gmm_i on X_i
    when given, else the log-likelihood of its last ``train`` (and N_i its event count).
    """
    if gmm1.D != gmm2.D or gmm1.cvtype != gmm2.cvtype:
        raise ValueError("the two models must have the same D and cvtype to be merged")
    parts = []
    for g, Xi in ((gmm1, X1), (gmm2, X2)):
        if Xi is not None:
            parts.append((float(np.sum(g.score(Xi), dtype=np.float64)), len(Xi)))
        elif g.loglik is None:
            raise ValueError("a model has not been trained; train it or pass its data")
        else:
            parts.append((g.loglik, g.n_events))
    (l1, n1), (l2, n2) = parts
    w = np.concatenate([np.asarray(gmm1.weights, np.float64) * n1, np.asarray(gmm2.weights, np.float64) * n2])
    merged = GMM(
        gmm1.M + gmm2.M,
        gmm1.D,
        means=np.concatenate([gmm1.means, gmm2.means]),
        covars=np.concatenate([gmm1.covars, gmm2.covars]),
        weights=w / w.sum(),
        cvtype=gmm1.cvtype,
        dtype=gmm1.dtype,
        reg_covar=gmm1.reg_covar,
    )
    ll = merged.train(X, min_em_iters=min_em_iters, max_em_iters=max_em_iters, tol=tol)
    return merged, ll - l1 - l2
