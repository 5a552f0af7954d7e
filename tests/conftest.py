"""Shared fixtures: every test gets a private compile cache and tuning database unless it asks for the
session-wide compile cache (compiling is the slow part, so most tests share one)."""

import atexit
import os
import re
import shutil
import tempfile

import numpy as np
import pytest

if "ASP_GMM_CACHE_DIR" not in os.environ or "ASP_GMM_DB" not in os.environ:
    # Made once, by the process that starts the session (pytest-xdist's workers inherit the
    # variables), and removed when that process ends: a test run leaves no compiled code behind.
    _SESSION_CACHE = tempfile.mkdtemp(prefix="asp_gmm_test_cache_")
    atexit.register(shutil.rmtree, _SESSION_CACHE, ignore_errors=True)
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


def scattered_blobs(rng, N, D, M, far):
    """Blobs whose components ``far`` are tight (scale 0.01) and 50 away from the data mean, alternately on
    either side, and the parameters of the true labelling: (X, weights, means, variances)."""
    centres = rng.normal(0.0, 2.0, (M, D))
    centres[far] = 50.0 * np.where(np.arange(far.size) % 2, 1.0, -1.0)[:, None] + rng.normal(0.0, 1.0, (far.size, D))
    scales = rng.uniform(0.5, 1.5, (M, D))
    scales[far] *= 0.01
    lab = rng.integers(0, M, N)
    X = (centres[lab] + rng.standard_normal((N, D)) * scales[lab]).astype(np.float32)
    w = np.bincount(lab, minlength=M) / N
    mu = np.stack([X[lab == c].mean(0) for c in range(M)]).astype(np.float64)
    cv = np.stack([X[lab == c].var(0) for c in range(M)]).astype(np.float64) + 1e-6
    return X, w, mu, cv


def init_params(rng, X, M, cvtype):
    """Initial parameters: distinct events as means, the data covariance (in the shape of ``cvtype``),
    random weights."""
    N, D = X.shape
    means = X[rng.choice(N, M, replace=False)].astype(np.float64)
    cov = np.atleast_2d(np.cov(X.astype(np.float64), rowvar=False, bias=True)) + 1e-3 * np.eye(D)
    covars = {
        "full": lambda: np.repeat(cov[None], M, 0),
        "tied": lambda: cov,
        "diag": lambda: np.repeat(np.diag(cov)[None], M, 0),
        "spherical": lambda: np.full(M, np.trace(cov) / D),
    }[cvtype]()
    w = rng.uniform(0.5, 1.5, M)
    return w / w.sum(), means, covars


def train_vs_reference(rng, X, M, cvtype, iters, **gmm_kw):
    """Train a GMM for exactly ``iters`` EM iterations from fresh :func:`init_params`, and run the
    float64 reference from the same parameters: ``(model, its log-likelihood, reference result)``.
    ``gmm_kw`` go to :class:`asp_gmm.GMM` (backend, variant, dtype...)."""
    from asp_gmm import GMM
    from asp_gmm import reference as ref

    w, mu, cv = init_params(rng, X, M, cvtype)
    r = ref.em(X.astype(np.float64), w, mu, cv, cvtype, 1e-6, iters, iters, 0.0)
    g = GMM(M, X.shape[1], means=mu, covars=cv, weights=w, cvtype=cvtype, **gmm_kw)
    ll = g.train(X, min_em_iters=iters, max_em_iters=iters, tol=0.0)
    return g, ll, r


def session_vs_reference(rng, X, M, cvtype, variant, tunables, iters=2):
    """``iters`` EM iterations through the CUDA session API with a variant pinned at ``tunables`` (what
    GMM cannot pin), and the float64 reference from the same fresh :func:`init_params`:
    ``((weights, means, covars), EMRun, reference result)``."""
    from asp_gmm import registry
    from asp_gmm import reference as ref
    from asp_gmm.backends import cuda as cu
    from asp_gmm.problem import Problem

    N, D = X.shape
    be = cu.CudaBackend()
    p = Problem(N, D, M, cvtype, "float32")
    v = registry.get("cuda", variant, "covariance")
    w, mu, cv = init_params(rng, X, M, cvtype)
    r = ref.em(X.astype(np.float64), w, mu, cv, cvtype, 1e-6, iters, iters, 0.0)
    s = be.open(X, p)
    try:
        s.set_params(w, mu, cv, 1e-6)
        run = s.em(be.kernel(v, tunables, p), min_iters=iters, max_iters=iters, tol=0.0, reg_covar=1e-6)
        params = s.params()
    finally:
        s.close()
    return params, run, r


def reference_estep(g, X):
    """The float64 reference E-step ``(logprob (N,), posteriors (N, M))`` under g's parameters."""
    from asp_gmm import reference as ref

    return ref.estep(
        X.astype(np.float64),
        g.weights.astype(np.float64),
        g.means.astype(np.float64),
        g.covars.astype(np.float64),
        g.cvtype,
    )


_NUMBER = re.compile(r"\b\d+(\.\d*)?([eE][-+]?\d+)?[fFuUlL]*\b")
_COND = re.compile(r"\s*#\s*(?:if|elif)\b(.*)")
_DEFINE = re.compile(r"\s*#\s*define\s+(\w+)")


def code_path(source: str) -> str:
    """The source with its numbers masked, except in the ``#define`` of every macro that a ``#if`` or
    ``#elif`` reads: two renderings of a template with the same code path have the same text (the
    compile tests compile one of them)."""
    lines = source.splitlines()
    conds = set()
    for line in lines:
        m = _COND.match(line)
        if m:
            conds.update(re.findall(r"[A-Za-z_]\w*", m.group(1)))
    out = []
    for line in lines:
        m = _DEFINE.match(line)
        out.append(line if m and m.group(1) in conds else _NUMBER.sub("#", line))
    return "\n".join(out)


def check_fit(covars, means, weights, ll, r, rtol=2e-4):
    """Trained parameters and log-likelihood against a reference result ``r`` (float32 tolerances)."""
    import pytest

    s = float(np.max(np.abs(r["covars"])))
    np.testing.assert_allclose(covars, r["covars"], rtol=rtol, atol=rtol * s)
    np.testing.assert_allclose(means, r["means"], rtol=rtol, atol=rtol * float(np.max(np.abs(r["means"]))))
    np.testing.assert_allclose(weights, r["weights"], rtol=rtol, atol=rtol)
    assert ll == pytest.approx(r["loglik"], rel=2e-3)


def pytest_sessionfinish(session, exitstatus):
    """Kill the multiprocessing children a failed test left running: the interpreter's exit joins
    them, and one hung child would hang the whole run (CI's limit, not a test failure, would end it)."""
    import multiprocessing

    for p in multiprocessing.active_children():
        p.kill()
        p.join(10)
