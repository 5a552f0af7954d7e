"""The drop-in under scikit-learn's array API convention (asp_gmm/array_api.py):
``sklearn.set_config(array_api_dispatch=True)`` with ``array_api_strict`` arrays gives fitted
attributes and results in that namespace and on that device, equal to the NumPy fit; scikit-learn's
own ``test_gaussian_mixture_array_api_compliance`` passes on the drop-in for every namespace present
here (PyTorch and CuPy cases run where those are installed); a CPU DLPack producer (NumPy itself,
behind an object that offers only the DLPack protocol) is accepted as X.

scikit-learn refuses array API dispatch unless SCIPY_ARRAY_API=1 was set before SciPy was first
imported, so the dispatch cases run in one fresh interpreter each."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("array_api_strict", reason="array-api-strict (the test extra) is not installed")

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str) -> dict:
    env = dict(os.environ, SCIPY_ARRAY_API="1", ASP_GMM_AUTOTUNE="0")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


STRICT = r"""
import json
import numpy as np, sklearn, array_api_strict as xp
from asp_gmm import GaussianMixture

rng = np.random.default_rng(0)
X = np.concatenate([rng.normal(c, 1.0, (150, 3)) for c in (-4.0, 0.0, 4.0)])
out = {}
for cv in ("full", "diag", "tied", "spherical"):
    ref = GaussianMixture(3, covariance_type=cv, random_state=0).fit(X)
    dev = xp.Device("device1")
    Xx = xp.asarray(X, device=dev)
    with sklearn.config_context(array_api_dispatch=True):
        g = sklearn.clone(ref).fit(Xx)
        res = {
            "predict": g.predict(Xx), "proba": g.predict_proba(Xx), "samples": g.score_samples(Xx),
            "fit_predict": sklearn.clone(ref).fit_predict(Xx), "sample": g.sample(5)[0],
        }
        scores = [g.score(Xx), g.bic(Xx), g.aic(Xx)]
    attrs = {k: getattr(g, k) for k in ("weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_")}
    ok_ns = all(type(v).__module__.startswith("array_api_strict") and v.device == dev
                for v in list(res.values()) + list(attrs.values()))
    host = {k: np.from_dlpack(xp.asarray(v, device=xp.Device("CPU_DEVICE"))) for k, v in attrs.items()}
    err = max(float(np.max(np.abs(host[k] - getattr(ref, k)))) for k in host)
    lab = np.from_dlpack(xp.asarray(res["predict"], device=xp.Device("CPU_DEVICE")))
    out[cv] = dict(ns=ok_ns, err=err, floats=all(isinstance(s, float) for s in scores),
                   same_labels=bool((lab == ref.predict(X)).all()),
                   score=abs(scores[0] - ref.score(X)))
print(json.dumps(out))
"""


def test_array_api_strict_fit_predict_score_stay_in_their_namespace_and_device():
    out = _run(STRICT)
    for cv, r in out.items():
        assert r["ns"], (cv, "results or fitted attributes left array_api_strict or its device")
        assert r["floats"], (cv, "score, bic and aic are Python floats")
        assert r["err"] <= 1e-12 and r["same_labels"] and r["score"] <= 1e-12, (cv, r)


SKLEARN_OWN = r"""
import itertools, json, traceback, unittest
import _pytest.outcomes
import sklearn.mixture.tests.test_gaussian_mixture as t
from sklearn.utils._array_api import yield_namespace_device_dtype_combinations
import asp_gmm

t.GaussianMixture = asp_gmm.GaussianMixture  # the drop-in under scikit-learn's own test
fn = getattr(t.test_gaussian_mixture_array_api_compliance, "__wrapped__", t.test_gaussian_mixture_array_api_compliance)
out = {"passed": 0, "skipped": 0, "failed": []}
for init, cv, (ns, dev, dt), ctor in itertools.product(
    ["random", "random_from_data"], ["full", "tied", "diag", "spherical"],
    list(yield_namespace_device_dtype_combinations()), [False, True]
):
    try:
        fn(init, cv, ns, dev, dt, ctor)
        out["passed"] += 1
    except (_pytest.outcomes.Skipped, unittest.SkipTest):  # (a library not installed, no GPU)
        out["skipped"] += 1
    except Exception:
        out["failed"].append([init, cv, ns, dev, dt, ctor, traceback.format_exc()[-1500:]])
print(json.dumps(out))
"""


def test_scikit_learns_own_array_api_compliance_cases_pass_on_the_drop_in():
    out = _run(SKLEARN_OWN)
    assert not out["failed"], out["failed"][:3]
    assert out["passed"] >= 48  # numpy (float64, float32) and array_api_strict (2 devices) x 16


class _DLPackOnly:
    """A CPU DLPack producer and nothing else (no __array__, no __array_namespace__)."""

    def __init__(self, a):
        self._a = a
        self.shape, self.ndim, self.dtype = a.shape, a.ndim, a.dtype

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_a_cpu_dlpack_producer_is_accepted_without_a_gpu():
    from asp_gmm import GaussianMixture

    rng = np.random.default_rng(1)
    X = np.concatenate([rng.normal(c, 1.0, (100, 2)) for c in (-3.0, 3.0)])
    P = _DLPackOnly(X)
    with pytest.raises(Exception):
        np.asarray(P, dtype=np.float64) + 0  # (NumPy itself cannot read it as an array-like)
    ref = GaussianMixture(2, covariance_type="diag", random_state=0).fit(X)
    g = GaussianMixture(2, covariance_type="diag", random_state=0).fit(P)
    # (equal up to rounding: the autotuner may run another variant for the second fit)
    np.testing.assert_allclose(g.means_, ref.means_, rtol=1e-12)
    np.testing.assert_array_equal(g.predict(P), ref.predict(X))
    np.testing.assert_allclose(g.score_samples(P), ref.score_samples(X), rtol=1e-12)
