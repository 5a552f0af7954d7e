"""The Face: API round trips, bad input, numerics, agreement with scikit-learn, the compile cache."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import asp_gmm
from asp_gmm import GMM, CompileError, NotPositiveDefiniteError, compute_distance_BIC, registry
from asp_gmm.backends import get_backend
from asp_gmm.problem import Problem
from conftest import make_blobs

BACKENDS = ["c", "numpy"]


# ---------------------------------------------------------------------------------------- API
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cvtype", ["full", "diag"])
def test_round_trip_shapes(backend, cvtype, rng):
    N, D, M = 1500, 5, 4
    X = make_blobs(rng, N, D, M, dtype=np.float32)
    g = GMM(M, D, cvtype=cvtype, backend=backend, seed=1)
    ll = g.train(X)
    assert isinstance(ll, float) and np.isfinite(ll)
    assert g.means.shape == (M, D) and g.weights.shape == (M,)
    assert g.covars.shape == ((M, D, D) if cvtype == "full" else (M, D))
    assert g.means.dtype == np.float32
    assert g.weights.sum() == pytest.approx(1.0, abs=1e-5)
    s = g.score(X)
    assert s.shape == (N,) and s.sum() == pytest.approx(ll, rel=1e-5)
    logprob, post = g.eval(X)
    assert logprob.shape == (N,) and post.shape == (N, M)
    np.testing.assert_allclose(post.sum(1), 1.0, atol=1e-5)
    pred = g.predict(X)
    assert pred.shape == (N,) and pred.dtype.kind == "i" and set(np.unique(pred)) <= set(range(M))
    np.testing.assert_array_equal(pred, post.argmax(1))


def test_train_warm_starts_and_improves(rng):
    X = make_blobs(rng, 4000, 6, 5)
    g = GMM(5, 6, backend="c", dtype=np.float64, seed=2)
    l1 = g.train(X, max_em_iters=2, tol=0.0)
    means_after_first = g.means.copy()
    l2 = g.train(X, max_em_iters=2, tol=0.0)
    assert l2 >= l1 - 1e-6 * abs(l1)  # EM never decreases the likelihood
    assert not np.allclose(means_after_first, g.means)  # continued from the trained model


def test_convergence_stops_early_but_not_before_min(rng):
    X = make_blobs(rng, 3000, 3, 2)
    g = GMM(2, 3, backend="c", dtype=np.float64, seed=0)
    g.train(X, min_em_iters=1, max_em_iters=200, tol=1e-2)
    assert g.converged and g.n_iter < 200
    g2 = GMM(2, 3, backend="c", dtype=np.float64, seed=0)
    g2.train(X, min_em_iters=7, max_em_iters=200, tol=10.0)  # tol huge: stops at the minimum
    assert g2.n_iter == 7 and g2.converged


def test_max_iters_zero_only_evaluates(rng):
    X = make_blobs(rng, 500, 3, 2)
    g = GMM(2, 3, backend="c", dtype=np.float64, seed=0)
    ll = g.train(X, max_em_iters=0)
    assert g.n_iter == 0
    assert ll == pytest.approx(g.score(X).sum(), rel=1e-10)


def test_pinned_variant_is_used(rng):
    X = make_blobs(rng, 800, 4, 3, dtype=np.float32)
    g = GMM(3, 4, backend="c", variant="V2")
    g.train(X, max_em_iters=2)
    assert g.last_variant == "V2"
    with pytest.raises(ValueError, match="no variant 'V9'"):
        GMM(3, 4, backend="c", variant="V9").train(X)


def test_auto_backend_without_gpu_is_c():
    g = GMM(2, 2)
    assert g.backend in ("cuda", "c")


# ------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "X, exc, words",
    [
        (np.array([[1.0, np.nan, 2.0]] * 10), ValueError, "NaN or infinity"),
        (np.array([[1.0, np.inf, 2.0]] * 10), ValueError, "NaN or infinity"),
        (np.ones((10, 4)), ValueError, "4 dimensions but the model has D=3"),
        (np.ones((2, 3)), ValueError, "fewer than the M=4 components"),
        (np.ones((0, 3)), ValueError, "empty"),
        (np.ones(30), ValueError, "must be 2-D"),
        (np.ones((10, 3), dtype=np.int64), TypeError, "astype"),
        (np.ones((10, 3), dtype=bool), TypeError, "floating-point"),
        (None, TypeError, "None"),
    ],
)
def test_bad_data_is_named(X, exc, words):
    g = GMM(4, 3, backend="c")
    with pytest.raises(exc, match=words):
        g.train(X)


def test_float32_data_whose_variance_overflows_says_so(recwarn):
    """Finite float32 data of scale 4e19 has a variance beyond float32: say that and the fix (not
    "zero variance", and no numpy overflow warning)."""
    X = (np.random.default_rng(0).standard_normal((500, 4)) * 4e19).astype(np.float32)
    assert np.isfinite(X).all()
    for backend in ("c", "numpy"):
        with pytest.raises(ValueError, match=r"scale overflows float32.*scale the data.*dtype=np.float64") as info:
            GMM(2, 4, backend=backend).train(X)
        assert "zero variance" not in str(info.value)
    assert np.isfinite(GMM(2, 4, backend="c", dtype=np.float64).train(X, max_em_iters=2))
    big = np.random.default_rng(1).standard_normal((500, 4)) * 1e39  # finite float64, beyond float32
    with pytest.raises(ValueError, match=r"values beyond the float32 range.*dtype=np.float64") as info:
        GMM(2, 4, backend="c").train(big)
    assert "NaN" not in str(info.value)
    assert not [w for w in recwarn if "overflow" in str(w.message)]


def test_min_iterations_above_max_is_refused():
    X = np.random.default_rng(0).standard_normal((100, 2))
    with pytest.raises(ValueError, match="min_em_iters=5 is larger than max_em_iters=2"):
        GMM(2, 2, backend="c").train(X, min_em_iters=5, max_em_iters=2)
    with pytest.raises(ValueError, match="min_em_iters=2 is larger than max_em_iters=0"):
        GMM(2, 2, backend="c").train(X, min_em_iters=2, max_em_iters=0)


@pytest.mark.parametrize("method", ["score", "predict", "eval"])
def test_bad_data_to_score_predict_eval_names_the_method(method):
    X = np.random.default_rng(0).standard_normal((100, 2))
    g = GMM(2, 2, backend="c", seed=0)
    with pytest.raises(RuntimeError, match=rf"call train\(X\) first.*\({method}\(\) needs them\)"):
        getattr(g, method)(X)
    g.train(X, max_em_iters=1)
    with pytest.raises(TypeError, match=rf"{method}\(\) needs floating-point data") as info:
        getattr(g, method)(X.astype(np.int64))
    assert "training" not in str(info.value)
    Y = X.copy()
    Y[4, 0] = np.nan
    with pytest.raises(ValueError, match=rf"NaN or infinity.*{method}\(\)") as info:
        getattr(g, method)(Y)
    assert "training" not in str(info.value)


def test_auto_without_a_c_compiler_warns_once_naming_the_fix(monkeypatch):
    monkeypatch.setenv("ASP_GMM_CC", "no-such-compiler-asp")
    from asp_gmm import backends
    from asp_gmm.runtime import default_runtime

    monkeypatch.setattr(default_runtime(), "warned_slow", False)
    monkeypatch.delitem(default_runtime().backends, "c", raising=False)
    real_reason = backends.unavailable_reason  # a GPU machine: hide CUDA so "auto" falls past it
    monkeypatch.setattr(backends, "unavailable_reason", lambda n: "hidden" if n == "cuda" else real_reason(n))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert GMM(2, 2).backend == "numpy" and GMM(3, 2).backend == "numpy"
    msgs = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
    assert len(msgs) == 1
    assert "no-such-compiler-asp" in msgs[0] and "ASP_GMM_CC" in msgs[0] and "gcc" in msgs[0] and "slow" in msgs[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert GMM(2, 2, backend="numpy").backend == "numpy"  # chosen deliberately: no warning


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(M=0, D=3), "M must be a positive integer"),
        (dict(M=2, D=-1), "D must be a positive integer"),
        (dict(M=2.5, D=3), "M must be a positive integer"),
        (dict(M=2, D=3, cvtype="banded"), "cvtype"),
        (dict(M=2, D=3, reg_covar=-1), "reg_covar"),
        (dict(M=2, D=3, means=np.zeros((3, 3))), "means must have shape"),
        (dict(M=2, D=3, weights=[0.2, 0.2]), "sum to 1"),
        (dict(M=2, D=3, backend="tpu"), "unknown backend"),
    ],
)
def test_bad_construction_is_named(kwargs, words):
    with pytest.raises(ValueError, match=words):
        GMM(**kwargs)


def test_non_contiguous_and_other_precision_are_converted(rng):
    X = make_blobs(rng, 2000, 6, 3)  # float64
    Xnc = np.asfortranarray(X)[:, ::2]  # non-contiguous view, D = 3
    g = GMM(3, 3, backend="c", seed=0)
    ll = g.train(Xnc, max_em_iters=3, tol=0)
    g2 = GMM(3, 3, backend="c", seed=0)
    assert ll == pytest.approx(g2.train(np.ascontiguousarray(Xnc, np.float32), max_em_iters=3, tol=0), rel=1e-6)


def test_not_positive_definite_says_what_to_do(rng):
    X = make_blobs(rng, 200, 3, 2)
    bad = np.array([np.eye(3), -np.eye(3)])
    g = GMM(2, 3, means=X[:2], covars=bad, weights=[0.5, 0.5], backend="c")
    with pytest.raises(NotPositiveDefiniteError, match="(?i)component 1.*increase reg_covar"):
        g.train(X)


def test_collinear_data_without_regularisation_raises_cleanly(rng):
    """Data on a line in 3-D with reg_covar=0: the covariance becomes singular; the error names the
    fix and the model keeps its last good parameters (never NaN)."""
    t = rng.standard_normal(500)
    X = np.stack([t, 2 * t, -t], 1).astype(np.float32)
    cov0 = np.repeat(np.eye(3)[None], 2, 0)
    g = GMM(2, 3, means=X[[0, 1]], covars=cov0, weights=[0.5, 0.5], reg_covar=0.0, backend="c")
    with pytest.raises((NotPositiveDefiniteError, FloatingPointError), match="reg_covar"):
        g.train(X, max_em_iters=5)
    assert np.all(np.isfinite(g.covars))


def test_empty_component_is_kept_not_nan(rng):
    """A component far from all data gets no responsibility: it keeps its mean and covariance
    (documented rule), its weight becomes tiny, and nothing turns NaN."""
    X = make_blobs(rng, 1000, 2, 1, dtype=np.float64)
    means = np.array([X.mean(0), [1e4, 1e4]])
    covs = np.array([np.cov(X.T), np.eye(2)])
    for backend in BACKENDS:
        g = GMM(2, 2, means=means, covars=covs, weights=[0.5, 0.5], dtype=np.float64, backend=backend)
        ll = g.train(X, max_em_iters=3, tol=0)
        assert np.isfinite(ll)
        np.testing.assert_array_equal(g.means[1], [1e4, 1e4])
        np.testing.assert_array_equal(g.covars[1], np.eye(2))
        assert 0 <= g.weights[1] < 1e-12


def test_bic_merge_score(rng):
    D = 4
    A = make_blobs(rng, 1500, D, 2)
    B = make_blobs(rng, 1500, D, 2) + 8.0
    ga, gb = GMM(2, D, backend="c", dtype=np.float64, seed=0), GMM(2, D, backend="c", dtype=np.float64, seed=0)
    la, lb = ga.train(A), gb.train(B)
    merged, score = compute_distance_BIC(ga, gb, np.vstack([A, B]), max_em_iters=3)
    assert merged.M == 4
    assert score == pytest.approx(merged.loglik - la - lb)
    # the same two sources: merging costs (almost) nothing; different sources: scoring by parts
    A2 = make_blobs(np.random.default_rng(7), 1500, D, 2)
    merged2, score2 = compute_distance_BIC(ga, gb, np.vstack([A, A2]), X1=A, X2=A2, max_em_iters=0)
    w = np.concatenate([ga.weights * 1500, gb.weights * 1500])
    np.testing.assert_allclose(merged2.weights, w / w.sum(), rtol=1e-12)


# ------------------------------------------------------------------------- scikit-learn
@pytest.mark.parametrize("cvtype", ["full", "diag"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_agrees_with_scikit_learn(cvtype, backend, rng):
    sklearn = pytest.importorskip("sklearn.mixture")
    N, D, M, iters = 3000, 5, 3, 4
    X = make_blobs(rng, N, D, M)
    means = X[rng.choice(N, M, replace=False)]
    cov = np.cov(X.T) + 0.1 * np.eye(D)
    covars = np.repeat(cov[None], M, 0) if cvtype == "full" else np.repeat(np.diag(cov)[None], M, 0)
    w = np.full(M, 1 / M)
    prec = np.linalg.inv(covars) if cvtype == "full" else 1 / covars
    sk = sklearn.GaussianMixture(
        M,
        covariance_type=cvtype,
        max_iter=iters,
        tol=0.0,
        reg_covar=1e-6,
        weights_init=w,
        means_init=means,
        precisions_init=prec,
        init_params="random",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sk.fit(X)
    g = GMM(M, D, means=means, covars=covars, weights=w, cvtype=cvtype, dtype=np.float64, backend=backend)
    ll = g.train(X, min_em_iters=iters, max_em_iters=iters, tol=0.0)
    assert ll == pytest.approx(sk.score(X) * N, rel=1e-6)
    np.testing.assert_allclose(g.means, sk.means_, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(g.covars, sk.covariances_, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(g.weights, sk.weights_, rtol=1e-6)
    # sklearn's lower_bound_ is the E-step before its last M-step: our trace's second to last value
    assert g.last_train.loglik_trace[-2] / N == pytest.approx(sk.lower_bound_, rel=1e-6)


# ---------------------------------------------------------------------------- compile cache
def _run_child(code, env):
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


CHILD = """
    import json, warnings, numpy as np
    from asp_gmm import GMM
    from asp_gmm.cache import CompileStats
    warnings.simplefilter("always")
    X = np.random.default_rng(0).standard_normal((300, 3)).astype(np.float32)
    with warnings.catch_warnings(record=True) as w:
        GMM(2, 3, backend="c", variant="V3").train(X, max_em_iters=1)
    print(json.dumps({"compiles": CompileStats.compiles, "hits": CompileStats.hits,
                      "warnings": [str(x.message) for x in w]}))
"""


def test_second_process_does_not_recompile(tmp_path):
    env = dict(os.environ, ASP_GMM_CACHE_DIR=str(tmp_path / "cache"), ASP_GMM_AUTOTUNE="0")
    first = _run_child(CHILD, env)
    second = _run_child(CHILD, env)
    assert first["compiles"] == 2  # the EM core and V3
    assert second["compiles"] == 0 and second["hits"] == 2


def test_corrupt_entry_is_rebuilt_with_a_warning(tmp_path):
    env = dict(os.environ, ASP_GMM_CACHE_DIR=str(tmp_path / "cache"), ASP_GMM_AUTOTUNE="0")
    _run_child(CHILD, env)
    sos = sorted((tmp_path / "cache").rglob("*V3*.so"))
    assert len(sos) == 1
    sos[0].write_bytes(b"\x7fELF garbage")
    third = _run_child(CHILD, env)
    assert third["compiles"] == 1
    assert any("corrupt" in w for w in third["warnings"])


def test_compile_error_carries_command_output_and_source(monkeypatch, tmp_path):
    monkeypatch.setenv("ASP_GMM_CACHE_DIR", str(tmp_path))
    from asp_gmm.backends.c import CBackend

    backend = CBackend()  # its own kernel memory: train() in earlier tests may have loaded this configuration
    v = registry.get("c", "V1")
    monkeypatch.setattr(registry, "render", lambda *a, **k: "int asp_covariance(void) { return syntax error; }\n")
    with pytest.raises(CompileError) as info:
        backend.kernel(v, {"pairs_per_grab": 16}, Problem(10, 3, 2, "full", "float32"))
    err = info.value
    assert "gcc" in err.command[0] or err.command
    assert "error" in err.output
    assert os.path.exists(err.source_path) and "syntax error" in open(err.source_path).read()
    assert err.source_path in str(err)


def test_cache_key_changes_with_source(tmp_path, monkeypatch):
    from asp_gmm import cache

    monkeypatch.setenv("ASP_GMM_CACHE_DIR", str(tmp_path))
    cmd = lambda src, out: ["gcc", "-shared", "-fPIC", "-o", out, src]  # noqa: E731
    a = cache.build("int f(void){return 1;}\n", ".so", cmd, ["k"], "t")
    b = cache.build("int f(void){return 2;}\n", ".so", cmd, ["k"], "t")
    c = cache.build("int f(void){return 1;}\n", ".so", cmd, ["k"], "t")
    assert a != b and a == c


def test_run_time_failure_falls_back_and_is_recorded(rng, monkeypatch):
    """A variant that fails while running is recorded as launch-failed and another one finishes the
    call with the same result."""
    from asp_gmm import selection
    from asp_gmm.backends import c as cbackend
    from asp_gmm.runtime import default_runtime
    from asp_gmm.errors import KernelError

    recorded = []

    class Spy(selection.RuleSelector):
        def record(self, backend, problem, config, status, *a, **k):
            recorded.append((config.variant.name, status))

    real_em = cbackend.CSession.em

    def em(self, kernel, *a, **k):
        if kernel.variant.name == "V4":
            raise KernelError("simulated launch failure")
        return real_em(self, kernel, *a, **k)

    monkeypatch.setattr(cbackend.CSession, "em", em)
    monkeypatch.setattr(default_runtime(), "selector", Spy())
    X = make_blobs(rng, 1000, 4, 3)
    g = GMM(3, 4, backend="c", dtype=np.float64, seed=0)
    ll = g.train(X, max_em_iters=3, tol=0)
    assert ("V4", "launch-failed") in recorded and g.last_variant != "V4"
    ref_g = GMM(3, 4, backend="numpy", dtype=np.float64, seed=0)
    assert ll == pytest.approx(ref_g.train(X, max_em_iters=3, tol=0), rel=1e-10)


def test_small_problems_do_not_compile_to_explore(rng, monkeypatch):
    """On a backend whose binaries are specific to (D, M), a small problem explores only variants that
    are already compiled for its shape and compiles nothing to explore; a large one (and any problem
    elsewhere) explores the compiled ones too, never waiting, and starts the others compiling in the
    background for later calls."""
    from asp_gmm import selection
    from asp_gmm.runtime import default_runtime
    from asp_gmm.selection import Config, Plan

    backend = get_backend("c")
    cands = {v.name: Config.of(v) for v in backend.covariance_variants()}

    class Explorer(selection.RuleSelector):
        def plan(self, backend, problem, candidates, pinned=False):
            return Plan(cands["V4"], [cands["V1"], cands["V2"]], "test")

    monkeypatch.setattr(default_runtime(), "selector", Explorer())
    monkeypatch.setattr(type(backend), "shape_specific_binaries", True)
    monkeypatch.setattr(type(backend), "is_ready", lambda self, v, t, p: v.name != "V1")
    X = make_blobs(rng, 500, 3, 2)
    g = GMM(2, 3, backend="c", dtype=np.float64, seed=0)
    started = []
    monkeypatch.setattr(type(backend), "kernel_async", lambda self, v, t, p: started.append(v.name))
    g.train(X, max_em_iters=4, tol=0)
    assert g.last_train.explored == ["V2"] and started == []
    monkeypatch.setattr(selection.plan, "EXPLORE_COMPILE_WORK", 0)
    g.train(X, max_em_iters=4, tol=0)
    assert [e.split("(")[0] for e in g.last_train.explored] == ["V2"] and started == ["V1"]


def test_prepare_loads_what_runs_first_and_compiles_what_is_missing(monkeypatch):
    """prepare() loads, per shape, the configuration the selection runs first and compiles every
    candidate not compiled yet; a candidate already compiled is left on disk (a call that explores
    it loads it), so a warm process does not load every candidate of every shape."""
    from asp_gmm import selection
    from asp_gmm.runtime import default_runtime
    from asp_gmm.selection import Config, Plan
    from asp_gmm.specializer import Specializer

    backend = get_backend("c")
    cands = {v.name: Config.of(v) for v in backend.covariance_variants()}

    class FirstIsV2(selection.RuleSelector):
        def plan(self, backend, problem, candidates, pinned=False):
            return Plan(next(c for c in candidates if c.variant.name == "V2"), [], "test")

    monkeypatch.setattr(default_runtime(), "selector", FirstIsV2())
    missing = {"V3"}  # compiled: everything else
    monkeypatch.setattr(type(backend), "is_ready", lambda self, v, t, p: v.name not in missing)
    loaded = []
    real = type(backend).kernel_async
    monkeypatch.setattr(
        type(backend), "kernel_async", lambda self, v, t, p: (loaded.append((v.name, p.M)), real(self, v, t, p))[1]
    )
    spec = Specializer("c")
    problems = [Problem(10_000, 5, m, "full", "float64") for m in (2, 3)]
    n = spec.prepare_many(problems)
    v3 = sum(1 for c in spec.candidates(problems[0]) if c.variant.name == "V3")
    assert sorted(loaded) == sorted([("V2", 2), ("V2", 3)] + [("V3", m) for m in (2, 3)] * v3)
    assert n == sum(len(spec.candidates(p)) for p in problems) and "V4" in cands


def test_prepare_loads_every_candidate_and_checks_its_arguments():
    n = asp_gmm.prepare(5, [1, 3, 7], cvtype="diag", dtype=np.float64, backend="c")
    assert n >= 3  # at least one configuration per M
    assert asp_gmm.prepare(4, 2, backend="numpy") >= 1
    for bad in (dict(D=0, M=2), dict(D=3, M=[2, -1]), dict(D=3, M=2, N=0)):
        with pytest.raises(ValueError, match="positive integer"):
            asp_gmm.prepare(**bad)
    with pytest.raises(ValueError, match="cvtype"):
        asp_gmm.prepare(3, 2, cvtype="banded")


@pytest.mark.skipif(importlib.util.find_spec("pycuda") is not None, reason="pycuda is installed here")
def test_auto_without_pycuda_does_not_import_the_cuda_package():
    """A CPU process's start: "auto" learns that pycuda is missing without importing
    asp_gmm.backends.cuda (25-90 ms), and the reason names pycuda as the package's own probe does."""
    code = (
        "import sys, asp_gmm\n"
        "from asp_gmm.backends import get_backend, unavailable_reason\n"
        "be = get_backend('auto')\n"
        "assert be.name != 'cuda'\n"
        "assert 'asp_gmm.backends.cuda' not in sys.modules, sorted(m for m in sys.modules if 'cuda' in m)\n"
        "print(unavailable_reason('cuda'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    from asp_gmm.backends.cuda.device import _driver

    with pytest.raises(Exception) as exc:
        _driver()
    assert out.stdout.strip() == str(exc.value)
