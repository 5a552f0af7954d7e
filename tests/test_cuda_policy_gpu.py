"""The CUDA E-step is chosen by the policy of the specializer that runs the call (an injected policy
governs it); skipped without a GPU."""

import numpy as np
import pytest

from conftest import make_blobs

cuda_mod = pytest.importorskip("asp_gmm.backends.cuda")
REASON = cuda_mod.CudaBackend.unavailable_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=f"CUDA backend unavailable: {REASON}")]


def test_the_specializers_policy_chooses_the_estep(rng, monkeypatch):
    from asp_gmm.backends import get_backend
    from asp_gmm.problem import Problem
    from asp_gmm.selection import Policy, RuleSelector
    from asp_gmm.specializer import Specializer

    monkeypatch.delenv("ASP_GMM_CUDA_ESTEP", raising=False)
    be = get_backend("cuda")
    X = make_blobs(rng, 4000, 6, 3).astype(np.float32)
    p = Problem(4000, 6, 3, "diag", "float32")
    w, mu, cv = np.full(3, 1 / 3), X[:3].astype(np.float64), np.ones((3, 6))
    from asp_gmm.backends.cuda.backend import binary_problem

    names = [v.name for v, tuns in be._estep_candidates(binary_problem(p)) if tuns]
    assert names
    asked = []
    for name in names[:3]:
        policy = Policy(RuleSelector(), estep_preference={"cuda": [name]})
        real = policy.choose_estep
        monkeypatch.setattr(policy, "choose_estep", lambda *a, _r=real, **k: asked.append(_r(*a, **k)) or asked[-1])
        Specializer(be, policy=policy).train(X, w, mu, cv, p, 1e-6, 2, 2, 0.0)
        assert asked and asked[-1][0].name == name  # this policy was asked, and its choice ran
