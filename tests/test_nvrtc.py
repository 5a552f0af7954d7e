"""In-process CUDA compiles through NVRTC (asp_gmm/backends/nvrtc.py): no GPU needed.

* NVRTC's cubins have the kernels, global symbols, parameter sizes and static shared memory of nvcc's
  for a module of each kind (EM core, covariance variant, E-step, a variant that includes
  <cuda_pipeline.h>): the nvcc compiles here are the suite's check that the nvcc path still works.
* Errors name the options, NVRTC's log and the source; a missing header names the fix.
* Independent modules compile in parallel threads, each into its own cubin.
* Every compile is logged at INFO on the "asp_gmm" logger with its duration.
"""

import logging
import re
import os
import shutil
import struct
from concurrent.futures import ThreadPoolExecutor

import pytest

from asp_gmm import cache, registry
from asp_gmm.backends import cuda as cu
from asp_gmm.backends import nvrtc
from asp_gmm.errors import CompileError
from asp_gmm.problem import Problem

pytestmark = pytest.mark.skipif(not nvrtc.available(), reason=str(nvrtc.unavailable_reason()))
NVCC = cu.nvcc_command()
HAVE_NVCC = shutil.which(NVCC[0]) is not None or os.path.exists(NVCC[0])


def elf_summary(data: bytes) -> dict:
    """What a cubin offers its loader: kernels (global functions) and ``__device__`` variables
    (``cuModuleGetGlobal`` finds them whatever their binding), and the sizes of the per-kernel parameter banks (``.nv.constant0.<kernel>``) and static
    shared memory (``.nv.shared.<kernel>``) sections. ELF64 little-endian, as every cubin."""
    assert data[:4] == b"\x7fELF" and data[4] == 2, "not an ELF64 image"
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def name_at(strtab, off):
        start = secs[strtab][4] + off
        return data[start : data.index(b"\0", start)].decode()

    out = {"symbols": set(), "sections": {}}
    for sh_name, sh_type, _, _, off, size, link, _, _, entsize in secs:
        name = name_at(shstrndx, sh_name)
        if name.startswith((".nv.constant0.", ".nv.shared.")):
            out["sections"][name] = size
        if sh_type == 2:  # SHT_SYMTAB
            for i in range(size // entsize):
                st_name, st_info, _, st_shndx = struct.unpack_from("<IBBH", data, off + i * entsize)
                bind, typ = st_info >> 4, st_info & 0xF
                sym = name_at(link, st_name)
                if typ == 2 and bind == 1:  # a GLOBAL FUNC: a kernel
                    out["symbols"].add((sym, "func"))
                elif (
                    typ == 1
                    and 0 < st_shndx < shnum
                    and name_at(shstrndx, secs[st_shndx][0]).startswith((".nv.global", ".nv.constant"))
                ):  # a __device__ or __constant__ variable
                    out["symbols"].add((sym, "object"))
    return out


def _source(name, D=19, M=16, cvtype="full"):
    v = registry.get("cuda", name)
    p = Problem(1000, D, M, cvtype, "float32")
    tun = v.default_tunables() if v.phase == "core" else v.first_allowed(p, extra=dict(cu._DEFAULT_LIMITS))
    assert tun is not None, name
    return cu.render_source(v, tun, p), cu.binary_name(v, tun, p)


@pytest.mark.skipif(not HAVE_NVCC, reason="nvcc (CUDA toolkit) is not installed")
@pytest.mark.parametrize("name", ["core", "V4", "estep_fast", "V8"])
def test_nvrtc_cubin_offers_what_nvcc_cubin_offers(name, tmp_path):
    src, binary = _source(name)
    ours = elf_summary(nvrtc.compile_cubin(src, "sm_90", binary))
    theirs = elf_summary(cu.cubin_path_nvcc(src, "sm_90", binary).read_bytes())
    # NVRTC also emits namespace-scope `static constexpr` constants (DIM, NCOMP...) as 4-byte device
    # objects, which nvcc folds away: extra, never missing, and only those
    assert theirs["symbols"] <= ours["symbols"]
    extra = ours["symbols"] - theirs["symbols"]
    assert all(kind == "object" and re.search(rf"static constexpr \w+ {sym}\b", src) for sym, kind in extra), extra
    kernels = {s for s, kind in ours["symbols"] if kind == "func"}
    assert kernels and all(f".nv.constant0.{k}" in ours["sections"] for k in kernels)
    if name == "core":
        assert ("asp_moments_geometry", "object") in ours["symbols"]
    # the parameter banks (same arguments) and the static shared memory of every kernel
    assert ours["sections"] == theirs["sections"]


def test_every_launch_kernel_is_in_the_nvrtc_cubin():
    for name in ("V1", "V2", "V3", "V5", "estep", "estep_tc"):
        src, binary = _source(name)
        syms = elf_summary(nvrtc.compile_cubin(src, "sm_90", binary))["symbols"]
        for spec in cu.launches(registry.get("cuda", name)):
            assert (spec.kernel, "func") in syms, (name, spec.kernel)


def test_compile_error_names_options_log_and_source():
    bad = 'extern "C" __global__ void k(float *x) { x[0] = undefined_name; }\n'
    with pytest.raises(CompileError) as err:
        nvrtc.compile_cubin(bad, "sm_90", "broken", "/somewhere/broken.cu")
    e = err.value
    assert e.command[0] == "nvrtc" and "--gpu-architecture=sm_90" in e.command and "--use_fast_math" in e.command
    assert "undefined_name" in e.output and e.source_path == "/somewhere/broken.cu"
    assert "undefined_name" in str(e) and "/somewhere/broken.cu" in str(e)


def test_missing_header_names_the_fix():
    with pytest.raises(CompileError) as err:
        nvrtc.compile_cubin("#include <no_such_header_asp.h>\n", "sm_90", "hdr")
    assert "no_such_header_asp.h" in str(err.value) and "ASP_GMM_NVRTC=0" in str(err.value)


def test_a_virtual_architecture_is_refused_with_a_reason():
    with pytest.raises(CompileError) as err:
        nvrtc.compile_cubin('extern "C" __global__ void k() {}\n', "compute_90", "virt")
    assert "compute_90" in str(err.value)


def test_independent_modules_compile_in_parallel_threads():
    srcs = [f'extern "C" __global__ void k{i}(float *x) {{ x[threadIdx.x] *= {i + 2}.0f; }}\n' for i in range(6)]
    with ThreadPoolExecutor(3) as ex:
        cubins = list(ex.map(lambda i: nvrtc.compile_cubin(srcs[i], "sm_90", f"k{i}"), range(6)))
    for i, c in enumerate(cubins):
        assert (f"k{i}", "func") in elf_summary(c)["symbols"]
    res = nvrtc.compile_many([(srcs[0], "sm_90", "a"), ("not C++ at all", "sm_90", "b")])
    assert isinstance(res[0], bytes) and isinstance(res[1], CompileError)


def test_compiles_through_the_cache_are_logged_at_info(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("ASP_GMM_CACHE_DIR", str(tmp_path / "cache"))
    src = 'extern "C" __global__ void logged(float *x) { x[0] = 1.0f; }\n'
    with caplog.at_level(logging.INFO, logger="asp_gmm"):
        path = nvrtc.build_cubin(src, "sm_90", "logged-kernel")
    assert path.read_bytes()[:4] == b"\x7fELF"
    msgs = [r.getMessage() for r in caplog.records if r.name == "asp_gmm" and r.levelno == logging.INFO]
    assert any("compiled logged-kernel in" in m and "NVRTC" in m for m in msgs), msgs
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="asp_gmm"):
        assert nvrtc.build_cubin(src, "sm_90", "logged-kernel") == path  # a hit: nothing compiled
        assert nvrtc.lookup_cubin(src, "sm_90", "logged-kernel") == path
    assert not [r for r in caplog.records if "compiled" in r.getMessage()]
    meta = path.with_suffix(".json").read_text()
    assert "nvrtc" in meta and "--use_fast_math" in meta


def test_a_long_compile_prints_one_notice_on_stderr(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("ASP_GMM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "NOTICE_AFTER", 0.05)
    from asp_gmm import runtime

    monkeypatch.setattr(runtime, "_default_runtime", runtime.Runtime())  # nothing noticed yet
    import time

    def slow(text, path):
        time.sleep(0.3)
        return nvrtc.compile_cubin(text, "sm_90", "slow", path)

    for i in range(2):
        cache.build(
            f'extern "C" __global__ void s{i}() {{}}\n',
            ".cubin",
            lambda s, o: ["nvrtc", s],
            ["test"],
            f"slow{i}",
            source_suffix=".cu",
            produce=slow,
        )
    err = capfd.readouterr().err
    assert err.count("asp_gmm: compiling specialized code") == 1 and str(tmp_path / "cache") in err
