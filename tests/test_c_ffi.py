"""The C backend's parsed declarations (asp_gmm/backends/c_decls.py, written by scripts/gen_cffi.py):
up to date with the declarations, used without importing pycparser, and equal to parsing them."""

import re
import subprocess
import sys

import cffi
import pytest

from asp_gmm.backends import c as cbackend
from asp_gmm.backends import c_batch, c_decls
from asp_gmm.problem import Problem


@pytest.mark.parametrize("name", sorted(c_decls.MODULES))
def test_the_generated_module_was_made_from_the_current_declarations(name):
    import importlib

    mod = importlib.import_module(f"asp_gmm.backends.{name}")
    assert mod.CDEF_SHA256 == c_decls.cdef_sha256(c_decls.MODULES[name]), (
        f"asp_gmm/backends/{name}.py is stale: run python scripts/gen_cffi.py"
    )


def test_the_backends_use_them_and_never_import_pycparser():
    assert cbackend.ffi is __import__("asp_gmm.backends._ffi_c", fromlist=["ffi"]).ffi
    assert c_batch.ffi is __import__("asp_gmm.backends._ffi_c_batch", fromlist=["ffi"]).ffi
    code = "import sys, asp_gmm.backends.c, asp_gmm.backends.c_batch; assert 'pycparser' not in sys.modules"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_a_stale_module_is_not_used(monkeypatch):
    ffi = c_decls.load_ffi("_ffi_c", c_decls.CORE_CDEF + "int asp_new_function(void);\n")
    assert ffi is not cbackend.ffi and isinstance(ffi, cffi.FFI)


def test_generated_and_parsed_declarations_type_the_core_alike():
    """Both forms loaded on the compiled EM core: every declared function has the same C type."""
    from asp_gmm import registry
    from asp_gmm.backends.c import _class_problem

    be = cbackend.CBackend()
    p = Problem(1000, 3, 2, "diag", "float32")
    src = registry.render(registry.get("c", "core", "core"), None, _class_problem(p), **be._context(p))
    _, so = be._build(src, f"c-core-{p.cvtype}-{p.dtype}")
    parsed = cffi.FFI()
    parsed.cdef(c_decls.CORE_CDEF)
    names = re.findall(r"\b(asp_\w+)\s*\(", c_decls.CORE_CDEF)
    assert len(names) > 10
    a, b = cbackend.ffi.dlopen(so), parsed.dlopen(so)
    compared = 0
    for n in names:  # (the generated form names the opaque typedef by its struct)
        try:
            want = str(parsed.typeof(getattr(b, n)))
        except AttributeError:  # defined by the covariance variants' libraries, not the core
            continue
        got = str(cbackend.ffi.typeof(getattr(a, n))).replace("struct asp_state", "asp_state")
        assert got == want, n
        compared += 1
    assert compared >= 10
