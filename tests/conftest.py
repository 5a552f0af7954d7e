"""Shared fixtures: every test gets a private compile cache and tuning database unless it asks for the
session-wide compile cache (compiling is the slow part, so most tests share one)."""
import os
import tempfile

import numpy as np
import pytest

_SESSION_CACHE = tempfile.mkdtemp(prefix="asp_gmm_test_cache_")
os.environ.setdefault("ASP_GMM_CACHE_DIR", _SESSION_CACHE)
os.environ.setdefault("ASP_GMM_DB", "sqlite:///" + os.path.join(_SESSION_CACHE, "history.sqlite"))


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from the test's name so that a failure can be replayed,
    but different across tests (never zeros, never the same data twice)."""
    import zlib
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def make_blobs(rng, N, D, M, offset=0.0, dtype=np.float64):
    """Events from M anisotropic Gaussian clusters (an offset tests numerical robustness)."""
    centres = rng.normal(0.0, 3.0, (M, D))
    scales = rng.uniform(0.5, 1.5, (M, D))
    lab = rng.integers(0, M, N)
    X = centres[lab] + rng.standard_normal((N, D)) * scales[lab]
    if D > 1:  # correlate the dimensions
        X = X @ (np.eye(D) + 0.3 * rng.standard_normal((D, D)) / np.sqrt(D))
    return (X + offset).astype(dtype)


def init_params(rng, X, M, cvtype):
    """Initial parameters: distinct events as means, the data covariance, random weights."""
    N, D = X.shape
    means = X[rng.choice(N, M, replace=False)].astype(np.float64)
    cov = np.atleast_2d(np.cov(X.astype(np.float64), rowvar=False, bias=True)) + 1e-3 * np.eye(D)
    covars = np.repeat(cov[None], M, 0) if cvtype == "full" else np.repeat(np.diag(cov)[None], M, 0)
    w = rng.uniform(0.5, 1.5, M)
    return w / w.sum(), means, covars
