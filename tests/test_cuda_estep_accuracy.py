"""The CUDA backend's own diag E-step (estep_fast, what V4 and V5 run with) at float32 accuracy far from
the origin: one EM iteration from means that are events (exact in float32), data offset by +1000, the
covariances within 1e-5 of float64 EM (relative Frobenius norm), as V7 and V9 with their own E-steps.
Its former form p x - p mu rounded p mu at the magnitude of the data: 1.3e-5 here, 1.4e-5 on the peers' data."""

import numpy as np
import pytest

from asp_gmm import reference as ref
from asp_gmm import registry
from asp_gmm.backends import cuda as cu
from asp_gmm.problem import Problem
from conftest import init_params, make_blobs

REASON = cu.CudaBackend.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"CUDA backend unavailable: {REASON}")


def one_iteration_error(variant, X, params):
    N, D = X.shape
    M = params[0].shape[0]
    be = cu.CudaBackend()
    p = Problem(N, D, M, "diag", "float32")
    v = registry.get("cuda", variant, "covariance")
    r = ref.em(X.astype(np.float64), *params, "diag", 1e-6, 1, 1, 0.0)["covars"]
    s = be.open(X, p)
    try:
        s.set_params(*params, 1e-6)
        s.em(be.kernel(v, be.tunables_for(v, p), p), min_iters=1, max_iters=1, tol=0.0, reg_covar=1e-6)
        c = s.params()[2]
    finally:
        s.close()
    return float(np.linalg.norm(c - r) / np.linalg.norm(r))


@pytest.mark.parametrize("variant", ["V5", "V4"])
@pytest.mark.parametrize("offset", [10.0, 1000.0])
def test_diag_e_step_is_float32_accurate_far_from_the_origin(variant, offset):
    rng = np.random.default_rng(11)
    X = make_blobs(rng, 100_000, 36, 128, offset=offset, dtype=np.float32)
    params = init_params(rng, X, 128, "diag")
    err = one_iteration_error(variant, X, params)
    assert err < 1e-5, err
