"""The GPU through pycuda: the driver (imported lazily), the device's primary context, the probe
that says whether CUDA can run here, and the device fingerprint the tuning history keys timings by.

pycuda is imported lazily and CUDA initialised on first use (never at ``import asp_gmm``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from functools import lru_cache

from ...errors import BackendUnavailableError
from .compile import compiler_version, nvcc_command, use_nvrtc

#: limit context used when no GPU is present (compile-only checks): an H100
_DEFAULT_LIMITS = {"max_threads": 1024, "smem_per_block": 49152, "smem_optin": 232448, "sm_count": 132, "cc": 90}


def _driver():
    """pycuda.driver, imported on first use; raises BackendUnavailableError if missing."""
    try:
        import pycuda.driver as drv
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise BackendUnavailableError(f"pycuda is not installed ({exc}); pip install pycuda") from None
    return drv


class _Device:
    """The GPU and its primary context, pushed around each piece of work (thread-safe).

    Attributes
    ----------
    drv : module
        pycuda.driver.
    attrs : dict
        The device quantities variant limits and launch expressions may name: max_threads,
        smem_per_block, smem_optin, sm_count, cc (compute capability as 10 major + minor).
    arch : str
        nvcc's ``-arch`` for this device, e.g. ``"sm_90"``.
    """

    def __init__(self, ordinal: int):
        drv = _driver()
        drv.init()
        self.drv = drv
        self.dev = drv.Device(ordinal)
        self.ctx = self.dev.retain_primary_context()
        a = drv.device_attribute
        self.attrs = {
            "max_threads": self.dev.get_attribute(a.MAX_THREADS_PER_BLOCK),
            "smem_per_block": self.dev.get_attribute(a.MAX_SHARED_MEMORY_PER_BLOCK),
            "sm_count": self.dev.get_attribute(a.MULTIPROCESSOR_COUNT),
        }
        optin = getattr(a, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", None)
        self.attrs["smem_optin"] = self.dev.get_attribute(optin) if optin is not None else self.attrs["smem_per_block"]
        cc = self.dev.compute_capability()
        self.attrs["cc"] = 10 * cc[0] + cc[1]  # compute capability, e.g. 90 (limits: tensor-core variants)
        self.arch = f"sm_{cc[0]}{cc[1]}"
        self.name = self.dev.name()
        self.memory = self.dev.total_memory()

    @contextlib.contextmanager
    def active(self):
        self.ctx.push()
        try:
            yield
        finally:
            self.drv.Context.pop()

    def fingerprint(self) -> dict:
        """The device as the tuning history knows it (model, arch, SMs, memory, driver, nvcc)."""
        return {
            "backend": "cuda",
            "model": self.name,
            "arch": self.arch,
            "sm_count": self.attrs["sm_count"],
            "memory": self.memory,
            "driver": self.drv.get_driver_version(),
            "compiler": compiler_version(),
        }


@lru_cache(maxsize=1)
def _probe() -> str | None:
    """``None`` when pycuda, a GPU and nvcc are present, else why not (and what to install)."""
    try:
        drv = _driver()
    except BackendUnavailableError as exc:
        return str(exc)
    try:
        drv.init()
        count = drv.Device.count()
    except Exception as exc:  # noqa: BLE001 - pycuda raises its own error types
        return f"the CUDA driver could not be initialised ({exc}); is an NVIDIA GPU and driver present?"
    if count == 0:
        return "no CUDA GPU is present"
    nv = nvcc_command()
    if not use_nvrtc() and shutil.which(nv[0]) is None and not os.path.exists(nv[0]):
        return (
            "neither NVRTC (pip install cuda-bindings nvidia-cuda-nvrtc) nor nvcc (the CUDA compiler) was "
            "found; install one, or set ASP_GMM_NVCC"
        )
    return None
