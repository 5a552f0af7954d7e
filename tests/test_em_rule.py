"""One iteration-argument order (min_iters, max_iters; keywords) and one convergence rule."""

from pathlib import Path

import numpy as np
import pytest

from asp_gmm import reference as ref
from asp_gmm.backends import get_backend
from asp_gmm.problem import Problem

ROOT = Path(__file__).resolve().parents[1]


def test_the_rule():
    assert ref.change_per_event(-90.0, -100.0, 5) == 2.0
    assert ref.converged(3, 3, -1e-4, 1e-3) and not ref.converged(2, 3, 0.0, 1e-3)
    assert not ref.converged(5, 1, 1e-3, 1e-3) and not ref.converged(5, 1, -0.5, 1e-3)


def test_the_rule_on_arrays_is_the_rule_element_by_element():
    rng = np.random.default_rng(0)
    change = rng.normal(0, 1e-3, 200)
    change[::7] = 0.0
    change[::11] = -5e-4
    for it in (0, 1, 3, 10):
        got = ref.converged_many(it, 3, change, 5e-4)
        assert got.dtype == bool and got.tolist() == [ref.converged(it, 3, float(c), 5e-4) for c in change]
    its = rng.integers(0, 6, 200)
    got = ref.converged_many(its, 3, change, 1e-3)
    assert got.tolist() == [ref.converged(int(i), 3, float(c), 1e-3) for i, c in zip(its, change)]


def test_the_compiled_loop_uses_the_shared_macro():
    core = (ROOT / "variants/c/core.c.j2").read_text()
    assert '{% include "em_rule.h.j2" %}' in core and "ASP_EM_CONVERGED(" in core and "fabs(change) <" not in core


@pytest.mark.parametrize("backend", ["numpy", "c"])
def test_em_takes_keywords_only(backend):
    rng = np.random.default_rng(1)
    X = np.concatenate([rng.normal(0, 1, (300, 2)), rng.normal(6, 1, (300, 2))]).astype(np.float32)
    prob = Problem(600, 2, 2, "diag", "float32")
    be = get_backend(backend)
    from asp_gmm import registry

    v = registry.variants(backend, "covariance")[0]
    kernel = be.kernel(v, be.tunables_for(v, prob), prob)
    with be.open(X, prob) as s:
        s.set_params([0.5, 0.5], X[[0, 599]].astype(np.float64), np.ones((2, 2)), 1e-6)
        run = s.em(kernel, min_iters=2, max_iters=50, tol=1e-3, reg_covar=1e-6)
    assert run.converged and 2 <= run.iters < 50
    with be.open(X, prob) as s:
        # the old positional order (max_iters, min_iters, tol, reg_covar) is gone: keywords only
        with pytest.raises(TypeError):
            s.em(kernel, 50, 2, 1e-3, 1e-6)
