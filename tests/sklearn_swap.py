"""A pytest plugin (``-p sklearn_swap``) that makes ``sklearn.mixture.GaussianMixture`` the drop-in
before scikit-learn's own mixture tests import it (tests/test_sklearn_upstream.py runs them)."""

import sklearn.mixture

import asp_gmm

sklearn.mixture.GaussianMixture = asp_gmm.GaussianMixture
