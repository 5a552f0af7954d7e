"""CUDA sources and binaries: render a variant's template for a problem class, compile it for a GPU
architecture, through the content-hashed compile cache (:mod:`asp_gmm.cache`): in this process by
NVRTC (:mod:`asp_gmm.backends.nvrtc`) where NVIDIA's cuda-bindings is installed, else with nvcc
(``ASP_GMM_NVRTC=0`` forces nvcc).

Sources depend on D, M, cvtype and dtype (rendered as constants with ``real``, ``cells``, the
variant's tunables and its ``[derived]`` quantities); N is a run-time argument (rendered as 0), so a
binary serves every N of its class. Nothing here needs pycuda or a GPU.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ... import cache, registry
from ...problem import Problem
from ..base import Kernel
from ..nvrtc import target_arch
from ...config import settings

#: Covariance condition limits (squared pivot ratio) by working precision (as the C backend).
COND_LIMIT = {"float32": 1e10, "float64": 1e15}
NVCC_FLAGS = ["--cubin", "-O3", "--use_fast_math", "-std=c++17"]


def nvcc_command() -> list:
    """The nvcc command: ``$ASP_GMM_NVCC``, else nvcc on PATH, else the toolkit's default place."""
    env = settings().nvcc
    if env:
        return env.split()
    found = shutil.which("nvcc")
    if found:
        return [found]
    for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc"):
        if os.path.exists(p):
            return [p]
    return ["nvcc"]


def _class_problem(problem: Problem) -> Problem:
    """Sources depend on D, M, cvtype and dtype; N is a run-time argument (rendered as 0)."""
    return Problem(0, problem.D, problem.M, problem.cvtype, problem.dtype)


#: rendered sources by (variant, its source hash, tunables, class): a render is deterministic, and
#: ``is_ready`` renders three templates per configuration asked (H200, a plan whose tunable search
#: proposed eight new combinations: 64 ms, 35 of them rendering the same core and E-step again)
_RENDERED: dict = {}
_RENDERED_MAX = 512


def render_source(variant: registry.Variant, tunables: dict | None, problem: Problem) -> str:
    """The CUDA source of ``variant`` for ``problem``'s class (no pycuda, no GPU needed)."""
    key = (
        repr(variant),  # the manifest as loaded
        variant.source_sha256,
        tuple(sorted((tunables or {}).items())),
        problem.D,
        problem.M,
        problem.cvtype,
        problem.dtype,
    )
    got = _RENDERED.get(key)
    if got is None:
        if len(_RENDERED) >= _RENDERED_MAX:
            _RENDERED.clear()
        got = _RENDERED[key] = _render(variant, tunables, problem)
    return got


def _render(variant: registry.Variant, tunables: dict | None, problem: Problem) -> str:
    real = "float" if problem.dtype == "float32" else "double"
    src = registry.render(variant, tunables, _class_problem(problem), real=real, cond_limit=COND_LIMIT[problem.dtype])
    # the launch description is part of what a binary means: keep it in the cached source
    launches = variant.extra.get("launch", [])
    return src + f"\n/* asp_gmm launch: {launches!r} scratch: {variant.extra.get('scratch', '')!r} */\n"


def _key_parts(arch: str) -> list:
    cmd = nvcc_command()
    return [cache.tool_version(cmd), " ".join(NVCC_FLAGS), arch]


_REJECTED = "nvrtc-cubin-rejected"  # in Runtime.warned: the driver refused an NVRTC cubin


def use_nvrtc() -> bool:
    """Whether cubins are compiled in-process by NVRTC (cuda-bindings installed, ``ASP_GMM_NVRTC``
    not 0, and the driver has not refused an NVRTC cubin in this process) rather than by nvcc."""
    from .. import nvrtc
    from ...runtime import default_runtime

    return not nvrtc.disabled() and nvrtc.available() and _REJECTED not in default_runtime().warned


def _nvcc_present() -> bool:
    nv = nvcc_command()
    return shutil.which(nv[0]) is not None or os.path.exists(nv[0])


def compiler_version() -> str:
    """The compiler that makes this process's cubins (part of the device fingerprint)."""
    if use_nvrtc():
        from .. import nvrtc

        return nvrtc.version()
    return cache.tool_version(nvcc_command())


def _arch_flags(arch: str) -> list:
    """nvcc's target flags: ``-arch=sm_XY``, or for an arch-specific target the ``-gencode`` form (the
    ``-arch=sm_90a`` shorthand also runs a plain sm_90 pass, which rejects wgmma)."""
    if arch.endswith("a"):
        num = arch[len("sm_") :]
        return [f"-gencode=arch=compute_{num},code=sm_{num}"]
    return [f"-arch={arch}"]


def cubin_path(source: str, arch: str, name: str) -> Path:
    """Path of the cubin compiled from ``source`` for ``arch`` (e.g. "sm_90"), from the cache
    (compiled into it on a miss, by NVRTC in this process where it is installed, else by nvcc;
    raises :class:`asp_gmm.errors.CompileError`). Thread-safe: independent modules compile in
    parallel threads, the cache's per-entry lock keeps one source from compiling twice."""
    if use_nvrtc():
        from .. import nvrtc

        return nvrtc.build_cubin(source, arch, name)
    return cubin_path_nvcc(source, arch, name)


def cubin_path_nvcc(source: str, arch: str, name: str) -> Path:
    """:func:`cubin_path` through nvcc whatever is installed (tests compare the two compilers)."""
    cmd = nvcc_command()
    arch = target_arch(source, arch)
    return cache.build(
        source,
        ".cubin",
        lambda src, out: cmd + NVCC_FLAGS + _arch_flags(arch) + ["-o", out, src],
        _key_parts(arch),
        name,
        source_suffix=".cu",
    )


def compile_cubin(source: str, arch: str, name: str) -> bytes:
    """The cubin image of ``source`` compiled for ``arch`` (NVRTC or nvcc, through the compile cache).

    Parameters
    ----------
    source : str
        CUDA C++ source (a rendered template).
    arch : str
        Target architecture, e.g. ``"sm_90"``.
    name : str
        Human-readable name of the binary in the cache (not part of the key).

    Returns
    -------
    bytes
        The cubin, ready for ``cuModuleLoadData``.
    """
    return cubin_path(source, arch, name).read_bytes()


def is_cached(source: str, arch: str, name: str) -> bool:
    """Whether the cubin of ``source`` for ``arch`` is in the compile cache (nothing is compiled)."""
    if use_nvrtc():
        from .. import nvrtc

        return nvrtc.lookup_cubin(source, arch, name) is not None
    arch = target_arch(source, arch)
    return cache.lookup(source, ".cubin", _key_parts(arch), name, source_suffix=".cu") is not None


def load_module(dev, source: str, name: str):
    """``(pycuda module, cubin path)`` of ``source`` on device ``dev`` (a cached cubin the driver
    rejects is rebuilt once)."""
    path = cubin_path(source, dev.arch, name)
    with dev.active():
        try:
            return dev.drv.module_from_buffer(path.read_bytes()), path
        except dev.drv.Error as exc:
            cache.invalidate(path)
            if use_nvrtc() and _nvcc_present():
                # a driver older than the NVRTC that made the cubin: nvcc from now on in this process
                import logging
                from ...runtime import default_runtime

                default_runtime().warned.add(_REJECTED)
                logging.getLogger("asp_gmm").warning(
                    "asp_gmm: the CUDA driver refused a cubin compiled by NVRTC (%s); compiling with nvcc from now "
                    "on (install an nvidia-cuda-nvrtc matching the driver's CUDA version, or set ASP_GMM_NVRTC=0)",
                    exc,
                )
            path = cubin_path(source, dev.arch, name)
            return dev.drv.module_from_buffer(path.read_bytes()), path


def compile_variant(variant, tunables, problem: Problem, arch: str = "sm_90") -> Path:
    """Render and compile one variant (compile-only checks; no GPU needed); the cubin's path."""
    tun = variant.default_tunables()
    tun.update(tunables or {})
    src = render_source(variant, tun, problem)
    return cubin_path(src, arch, binary_name(variant, tun, problem))


def binary_name(variant, tun, problem) -> str:
    """The cache name of ``variant``'s binary for ``problem``'s class (labels the cache entry)."""
    label = Kernel(variant, tun).label
    return f"cuda-{label}-D{problem.D}-M{problem.M}-{problem.cvtype}-{problem.dtype}"
