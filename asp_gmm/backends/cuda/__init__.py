"""CUDA backend through pycuda: the whole EM loop on the GPU, covariance by the selected variant.

One module per job:

- :mod:`.device`: the driver (pycuda, imported lazily), the device context, the availability probe
  and the device fingerprint;
- :mod:`.compile`: template rendering and nvcc compilation through the compile cache
  (:func:`compile_cubin` is the one place a source becomes a cubin);
- :mod:`.launch`: the manifests' launch tables (how a variant plugs in) and launch plans;
- :mod:`.memory`: session buffers (pooled), resident immutable data (LRU) and upload;
- :mod:`.session`: :class:`CudaSession`, the EM loop issued from the host;
- :mod:`.backend`: :class:`CudaBackend`, which adapts the device to the Backend interface, and the
  component padding of small problems (:func:`binary_problem`).

pycuda is imported lazily and CUDA initialised on first use (never at ``import asp_gmm``).
"""

from __future__ import annotations

from .backend import PAD_BELOW_WORK, CudaBackend, binary_problem, component_class, estep_candidates, estep_variants
from .compile import (
    COND_LIMIT,
    NVCC_FLAGS,
    _class_problem,
    binary_name,
    compile_cubin,  # noqa: F401
    compile_variant,
    compiler_version,
    cubin_path,
    cubin_path_nvcc,
    nvcc_command,
    render_source,
    use_nvrtc,
)
from .device import _DEFAULT_LIMITS, _Device, _driver, _probe  # noqa: F401  (tests, scripts)
from .launch import ARG_TYPES, CORE_SIGNATURES, COV_ARGS, ESTEP_ARGS, Launch, _Module, launches, pluggable  # noqa: F401
from .memory import LDN_ALIGN, POOL_IDLE, POOL_IDLE_BYTES, RESIDENT_BYTES, DeviceMemory, _capacity  # noqa: F401
from .session import CudaSession

__all__ = [
    "ARG_TYPES",
    "COND_LIMIT",
    "CORE_SIGNATURES",
    "COV_ARGS",
    "ESTEP_ARGS",
    "LDN_ALIGN",
    "NVCC_FLAGS",
    "PAD_BELOW_WORK",
    "POOL_IDLE",
    "POOL_IDLE_BYTES",
    "RESIDENT_BYTES",
    "CudaBackend",
    "CudaSession",
    "DeviceMemory",
    "Launch",
    "binary_name",
    "binary_problem",
    "component_class",
    "compile_cubin",
    "compile_variant",
    "cubin_path",
    "estep_candidates",
    "estep_variants",
    "launches",
    "nvcc_command",
    "pluggable",
    "render_source",
]
