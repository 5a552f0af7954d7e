"""CUDA source to cubin in this process, through NVRTC (NVIDIA's runtime compiler).

A compile through nvcc spawns a driver, a front end, ``cicc`` and ``ptxas`` (a second or more per
module, most of it process start-up and host-side work we never use); NVRTC runs the same device
front end and ``ptxas`` inside the process and needs no CUDA toolkit, only NVIDIA's ``cuda-bindings``
package and the NVRTC library (the ``nvidia-cuda-nvrtc`` wheel or the toolkit's ``libnvrtc``).
:func:`compile_cubin` is thread-safe and NVRTC releases the GIL while it compiles, so independent
modules compile in parallel from a thread pool (:func:`compile_many`).

Options are nvcc's device options (:data:`OPTIONS`: ``--use_fast_math -std=c++17``; device code is
optimised at ``-O3`` by default, nvcc's ``-O3`` is a host option). Headers: the rendered templates are
self-contained but for ``<climits>`` (NVRTC has it built in) and ``<cuda_pipeline.h>``, which is
searched as nvcc finds it: in the toolkit's ``include`` folder (``$CUDA_HOME``/``$CUDA_PATH``, the
folder above nvcc's ``bin``, ``/usr/local/cuda``) or in NVIDIA's pip wheels (through
``cuda.pathfinder``). A failed compile raises :class:`~asp_gmm.errors.CompileError` with the
options, NVRTC's log and the path of the source.

Nothing here imports pycuda or needs a GPU: NVRTC compiles for any ``sm_XY`` on any machine.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

from ..errors import CompileError

log = logging.getLogger("asp_gmm")

#: NVRTC options besides the architecture (the device options of the nvcc path's flags).
OPTIONS = ["--use_fast_math", "-std=c++17"]

#: What nvcc gives every translation unit and NVRTC does not: nvcc includes ``cuda_runtime.h`` (and
#: through it the host's ``math.h``: ``INFINITY``, ``NAN``) and compiles with the host's C++ headers
#: (``<climits>``). These in-memory headers supply the few names the templates use; the prelude is
#: included first into every program (``--pre-include``), ``<climits>`` when a template asks for it.
HEADERS = {
    "asp_gmm_nvrtc_prelude.h": (
        "#pragma once\n"
        "#ifndef INFINITY\n#define INFINITY __int_as_float(0x7f800000)\n#endif\n"
        "#ifndef NAN\n#define NAN __int_as_float(0x7fffffff)\n#endif\n"
        "#ifndef HUGE_VALF\n#define HUGE_VALF INFINITY\n#endif\n"
    ),
    "climits": (
        "#pragma once\n"
        "#define CHAR_BIT 8\n#define SCHAR_MIN (-128)\n#define SCHAR_MAX 127\n#define UCHAR_MAX 255\n"
        "#define SHRT_MIN (-32768)\n#define SHRT_MAX 32767\n#define USHRT_MAX 65535\n"
        "#define INT_MIN (-INT_MAX - 1)\n#define INT_MAX 2147483647\n#define UINT_MAX 4294967295U\n"
        "#define LLONG_MIN (-LLONG_MAX - 1LL)\n#define LLONG_MAX 9223372036854775807LL\n"
        "#define ULLONG_MAX 18446744073709551615ULL\n"
    ),
}
PRELUDE = "asp_gmm_nvrtc_prelude.h"


@functools.lru_cache(maxsize=1)
def _bindings():
    """``cuda.bindings.nvrtc`` loaded with its library, or the reason it cannot be (a string)."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        return f"cuda-bindings is not installed ({exc}); pip install 'cuda-bindings' 'nvidia-cuda-nvrtc'"
    except Exception as exc:  # noqa: BLE001 - a broken install raises what it likes
        return f"cuda-bindings cannot be imported ({exc})"
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # noqa: BLE001 - the library itself is missing or unloadable
        return (
            f"the NVRTC library cannot be loaded ({exc}); pip install 'nvidia-cuda-nvrtc' (matching the "
            "CUDA major version of cuda-bindings) or install the CUDA toolkit"
        )
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return f"the NVRTC library does not answer ({err})"
    return nvrtc


def unavailable_reason() -> str | None:
    """``None`` when NVRTC can compile here, else why not (and how to fix it)."""
    b = _bindings()
    return b if isinstance(b, str) else None


def available() -> bool:
    return unavailable_reason() is None


def disabled() -> bool:
    """``ASP_GMM_NVRTC=0`` sends every compile to nvcc (comparisons, a broken NVRTC)."""
    from ..config import settings

    return not settings().nvrtc


@functools.lru_cache(maxsize=1)
def version() -> str:
    """``"nvrtc 13.5"`` (part of cache keys: a cubin from another NVRTC is another binary)."""
    nv = _require()
    _, major, minor = nv.nvrtcVersion()
    return f"nvrtc {major}.{minor}"


def _require():
    b = _bindings()
    if isinstance(b, str):
        from ..errors import BackendUnavailableError

        raise BackendUnavailableError(b)
    return b


@functools.lru_cache(maxsize=1)
def include_dirs() -> tuple:
    """Folders searched for headers (``-I``): the CUDA toolkit's ``include`` and NVIDIA's wheels'
    runtime headers, those that exist, in that order."""
    out = []
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        homes.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    homes.append("/usr/local/cuda")
    for h in homes:
        if h and os.path.isdir(os.path.join(h, "include")):
            out.append(os.path.join(h, "include"))
    try:
        from cuda import pathfinder

        found = pathfinder.find_nvidia_header_directory("cudart")
        if found:
            out.append(found)
    except Exception:  # noqa: BLE001 - optional helper; absent in old cuda-bindings
        pass
    seen, dirs = set(), []
    for d in out:
        r = os.path.realpath(d)
        if r not in seen:
            seen.add(r)
            dirs.append(d)
    return tuple(dirs)


def options(arch: str) -> list:
    """The full option list for ``arch`` (e.g. "sm_90"): architecture, :data:`OPTIONS`, includes."""
    return [f"--gpu-architecture={arch}", *OPTIONS, f"--pre-include={PRELUDE}"] + [f"-I{d}" for d in include_dirs()]


def compile_cubin(
    source: str, arch: str, name: str = "kernel", source_path: str = "", extra_options=(), with_log: bool = False
):
    """The cubin of ``source`` for ``arch``, compiled in this process.

    Parameters
    ----------
    source : str
        CUDA C++ source (a rendered template).
    arch : str
        Target, ``"sm_90"`` style.
    name : str
        Name of the program (appears in NVRTC's messages).
    source_path : str
        Where the source is kept for inspection (named in errors).
    extra_options : sequence of str
        More NVRTC options (e.g. ``--ptxas-options=--verbose`` for registers and spills in the log).
    with_log : bool
        Return ``(cubin, log)`` instead of the cubin.

    Returns
    -------
    bytes
        The cubin (an ELF image ``cuModuleLoadData`` takes); with ``with_log``, ``(cubin, log text)``.

    Raises
    ------
    CompileError
        NVRTC rejected the source: carries the options, NVRTC's log and ``source_path``.
    BackendUnavailableError
        cuda-bindings or the NVRTC library is missing (the message says what to install).
    """
    nv = _require()
    opts = options(arch) + list(extra_options)
    cmd = ["nvrtc", *opts]
    ok = nv.nvrtcResult.NVRTC_SUCCESS
    names = list(HEADERS)
    err, prog = nv.nvrtcCreateProgram(
        source.encode(),
        f"{name}.cu".encode(),
        len(names),
        [HEADERS[n].encode() for n in names],
        [n.encode() for n in names],
    )
    if err != ok:
        raise CompileError(cmd, f"nvrtcCreateProgram failed: {err}", source_path, name)
    try:
        t0 = time.perf_counter()
        (err,) = nv.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        logtext = _log(nv, prog)
        if err != ok:
            hint = ""
            if "cannot open source file" in logtext:
                hint = (
                    "\n(a header was not found in "
                    + (", ".join(include_dirs()) or "no CUDA include folder")
                    + ": set CUDA_HOME to the CUDA toolkit, pip install 'nvidia-cuda-runtime', or set "
                    "ASP_GMM_NVRTC=0 to compile with nvcc)"
                )
            raise CompileError(cmd, f"{err}\n{logtext}{hint}", source_path, name)
        e2, size = nv.nvrtcGetCUBINSize(prog)
        if e2 != ok or size == 0:
            raise CompileError(
                cmd,
                f"NVRTC produced no cubin ({e2}); is {arch!r} a real architecture (sm_XY, not compute_XY)?\n{logtext}",
                source_path,
                name,
            )
        buf = bytearray(size)
        (e3,) = nv.nvrtcGetCUBIN(prog, buf)
        if e3 != ok:
            raise CompileError(cmd, f"nvrtcGetCUBIN failed: {e3}", source_path, name)
        log.debug("asp_gmm: NVRTC compiled %s for %s in %.2f s", name, arch, time.perf_counter() - t0)
        return (bytes(buf), logtext) if with_log else bytes(buf)
    finally:
        nv.nvrtcDestroyProgram(prog)


def _log(nv, prog) -> str:
    err, size = nv.nvrtcGetProgramLogSize(prog)
    if err != nv.nvrtcResult.NVRTC_SUCCESS or size <= 1:
        return ""
    buf = bytearray(size)
    nv.nvrtcGetProgramLog(prog, buf)
    return bytes(buf).rstrip(b"\0").decode(errors="replace")


def pool() -> ThreadPoolExecutor:
    """The pool of compile threads (one per core: NVRTC releases the GIL), owned by the default
    :class:`~asp_gmm.runtime.Runtime` (:meth:`~asp_gmm.runtime.Runtime.compile_pool`)."""
    from ..runtime import default_runtime

    return default_runtime().compile_pool()


def compile_many(jobs, fn=None) -> list:
    """Run ``fn(*job)`` for every job on :func:`pool` and return the results in order; an exception
    is returned in its job's place (the caller decides which failures matter). ``fn`` defaults to
    :func:`compile_cubin`."""
    fn = fn or compile_cubin
    futs = [pool().submit(fn, *job) for job in jobs]
    out = []
    for f in futs:
        try:
            out.append(f.result())
        except Exception as exc:  # noqa: BLE001 - handed back to the caller
            out.append(exc)
    return out


def key_parts(arch: str) -> list:
    """What besides the source determines an NVRTC cubin (the cache key's other parts)."""
    return [version(), " ".join(OPTIONS), arch, *(HEADERS[n] for n in sorted(HEADERS))]


def target_arch(source: str, arch: str) -> str:
    """The architecture ``source`` is compiled for: a source that uses a GPU generation's own instructions
    (wgmma: it defines ``ASP_ARCH_SPECIFIC``, ``variants/cuda/wgmma.cuh.j2``) takes the arch-specific
    target (sm_90 -> sm_90a), whose cubin runs on that compute capability only (the device whose
    architecture the caller names); NVRTC and nvcc both apply it."""
    if "#define ASP_ARCH_SPECIFIC" in source and not arch.endswith("a"):
        return arch + "a"
    return arch


def build_cubin(source: str, arch: str, name: str):
    """Path of the cubin of ``source`` for ``arch`` from the compile cache, compiled with NVRTC in this
    process when missing (the cache's lock, trust checks, logging and notice apply as for nvcc)."""
    from .. import cache

    arch = target_arch(source, arch)
    return cache.build(
        source,
        ".cubin",
        lambda src, out: ["nvrtc", *options(arch), src],
        key_parts(arch),
        name,
        source_suffix=".cu",
        produce=lambda text, path: compile_cubin(text, arch, name, path),
    )


def lookup_cubin(source: str, arch: str, name: str):
    """Path of the cached NVRTC cubin of ``source`` for ``arch``, or ``None``."""
    from .. import cache

    return cache.lookup(source, ".cubin", key_parts(target_arch(source, arch)), name, source_suffix=".cu")
