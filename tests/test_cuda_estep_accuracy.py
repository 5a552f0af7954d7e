"""The CUDA backend's own diag E-step (estep_fast, what V4 and V5 run with) at float32 accuracy far from
the origin: one EM iteration from means that are events (exact in float32), data offset by +1000, the
covariances within 1e-5 of float64 EM (relative Frobenius norm), as V7 and V9 with their own E-steps.
Its former form p x - p mu rounded p mu at the magnitude of the data: 1.3e-5 here, 1.4e-5 on the peers' data."""

import numpy as np
import pytest

from asp_gmm import registry
from asp_gmm.backends import cuda as cu
from asp_gmm.problem import Problem
from conftest import make_blobs, session_vs_reference

REASON = cu.CudaBackend.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"CUDA backend unavailable: {REASON}")


@pytest.mark.parametrize("variant", ["V5", "V4"])
@pytest.mark.parametrize("offset", [10.0, 1000.0])
def test_diag_e_step_is_float32_accurate_far_from_the_origin(variant, offset):
    rng = np.random.default_rng(11)
    X = make_blobs(rng, 100_000, 36, 128, offset=offset, dtype=np.float32)
    tun = cu.CudaBackend().tunables_for(
        registry.get("cuda", variant, "covariance"), Problem(*X.shape, 128, "diag", "float32")
    )
    (_, _, covars), _, r = session_vs_reference(rng, X, 128, "diag", variant, tun, iters=1)
    err = float(np.linalg.norm(covars - r["covars"]) / np.linalg.norm(r["covars"]))
    assert err < 1e-5, err
