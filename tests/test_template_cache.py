"""Jinja2's compiled templates kept in the compile cache (asp_gmm/template_cache.py): a second process
(here: a second environment) loads them instead of compiling; an entry another user could have
written is refused like a binary; a corrupt entry is compiled again and replaced."""

import os
import stat

import jinja2
import pytest

from asp_gmm import registry
from asp_gmm.errors import UnsafeCacheError
from asp_gmm.template_cache import FOLDER, template_code_cache


@pytest.fixture
def folder(tmp_path, monkeypatch):
    from asp_gmm.backends.cuda import compile as cuda_compile

    monkeypatch.setenv("ASP_GMM_CACHE_DIR", str(tmp_path / "cache"))
    # the CUDA backend keeps what it rendered in the process: these tests render through the cache
    monkeypatch.setattr(cuda_compile, "_RENDERED", {})
    return tmp_path / "cache" / FOLDER


def _env(tmp_path):
    if not (tmp_path / "t.j2").exists():
        (tmp_path / "t.j2").write_text("{% for i in range(n) %}{{ i }},{% endfor %}")
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(tmp_path)), bytecode_cache=template_code_cache())


def _compiles(env, monkeypatch):
    """How many times ``env`` compiles a template into Python while loading t.j2."""
    calls = []
    real = env.compile
    monkeypatch.setattr(env, "compile", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert env.get_template("t.j2").render(n=3) == "0,1,2,"
    return len(calls)


def test_a_second_process_loads_the_compiled_template(folder, tmp_path, monkeypatch):
    assert _compiles(_env(tmp_path), monkeypatch) == 1
    entries = list(folder.iterdir())
    assert len(entries) == 1 and stat.S_IMODE(entries[0].stat().st_mode) & 0o077 == 0
    assert _compiles(_env(tmp_path), monkeypatch) == 0  # loaded, not compiled
    # the template changed: its checksum no longer matches, compiled again
    (tmp_path / "t.j2").write_text("{{ n }}!")
    env = _env(tmp_path)
    assert env.get_template("t.j2").render(n=3) == "3!"


def test_an_entry_others_can_write_is_refused(folder, tmp_path, monkeypatch):
    _compiles(_env(tmp_path), monkeypatch)
    (entry,) = folder.iterdir()
    os.chmod(entry, 0o666)
    with pytest.raises(UnsafeCacheError, match="writable by group and others"):
        _env(tmp_path).get_template("t.j2")


def test_a_corrupt_entry_is_compiled_again_and_replaced(folder, tmp_path, monkeypatch):
    _compiles(_env(tmp_path), monkeypatch)
    (entry,) = folder.iterdir()
    good = entry.read_bytes()
    entry.write_bytes(good[: len(good) // 2])  # truncated
    assert _compiles(_env(tmp_path), monkeypatch) == 1
    assert entry.read_bytes() == good
    assert _compiles(_env(tmp_path), monkeypatch) == 0


def test_the_variants_render_the_same_through_the_cache(folder, monkeypatch):
    from asp_gmm.backends.cuda import compile as cuda_compile
    from asp_gmm.backends.cuda.compile import render_source
    from asp_gmm.problem import Problem

    p = Problem(1000, 19, 16, "diag", "float32")
    vs = [v for v in registry.variants("cuda") if v.template][:4]
    first = [render_source(v, v.default_tunables(), p) for v in vs]
    registry._environment.cache_clear()  # a new environment: the templates come from the cache
    monkeypatch.setattr(cuda_compile, "_RENDERED", {})  # ... and a new process's renders
    try:
        assert [render_source(v, v.default_tunables(), p) for v in vs] == first
    finally:
        registry._environment.cache_clear()
    assert any(folder.iterdir())


def _cuda_render(v, p):
    """The CUDA backend's render as a new process makes it (nothing kept in this one)."""
    from asp_gmm.backends.cuda import compile as cuda_compile

    cuda_compile._RENDERED.clear()
    return cuda_compile.render_source(v, v.default_tunables(), p)


def test_a_rendered_source_is_kept_and_read_without_jinja2(folder, monkeypatch):
    """A warm process finds its binaries by their sources' sha256: the sources rendered earlier are
    read back from the cache (no Jinja2 environment is made), and a changed input renders anew."""
    from asp_gmm.problem import Problem
    from asp_gmm.template_cache import SOURCES

    p = Problem(1000, 19, 16, "diag", "float32")
    v = next(v for v in registry.variants("cuda") if v.template)
    first = _cuda_render(v, p)
    kept = list((folder.parent / SOURCES).iterdir())
    assert len(kept) == 1 and stat.S_IMODE(kept[0].stat().st_mode) & 0o077 == 0

    def no_jinja(backend):
        raise AssertionError("rendered again although the source was kept")

    monkeypatch.setattr(registry, "_environment", no_jinja)
    assert _cuda_render(v, p) == first
    # another class of problem (here the dtype) is another source: rendered, not read
    with pytest.raises(AssertionError, match="rendered again"):
        _cuda_render(v, Problem(1000, 19, 16, "diag", "float64"))


def test_a_torn_or_altered_kept_source_is_rendered_again(folder, monkeypatch):
    from asp_gmm.problem import Problem
    from asp_gmm.template_cache import SOURCES

    p = Problem(1000, 19, 16, "diag", "float32")
    v = next(v for v in registry.variants("cuda") if v.template)
    first = _cuda_render(v, p)
    (entry,) = (folder.parent / SOURCES).iterdir()
    text = entry.read_text()
    for bad in (text[: len(text) // 2], text.replace("\n", "\n// altered\n", 3)):
        entry.write_text(bad)
        assert _cuda_render(v, p) == first
        assert entry.read_text() == text  # replaced by the good one
    os.chmod(entry, 0o666)
    with pytest.raises(UnsafeCacheError, match="writable by group and others"):
        _cuda_render(v, p)


def test_every_template_names_the_templates_it_reads_literally():
    """A kept source is found by the sha256 of its template and of every template that one names
    (registry._template_closure_sha256 follows literal names only): a name computed in a template
    would let an edit of the template it names go unnoticed, and the old source be used."""
    import re
    from pathlib import Path

    root = Path(registry.__file__).resolve().parents[1] / "variants"
    tag = re.compile(r"{%-?\s*(include|import|extends|from)\s+([^%]*?)-?%}")
    offenders, seen = [], 0
    for path in sorted(root.rglob("*.j2")):
        for kind, arg in tag.findall(path.read_text()):
            seen += 1
            if not re.match(r"""\s*(["'])[^"']+\1""", arg):
                offenders.append(f"{path.relative_to(root)}: {{% {kind} {arg.strip()} %}}")
    assert seen > 10 and not offenders, (seen, offenders)
    assert not re.match(r"""\s*(["'])[^"']+\1""", tag.findall("{% include name ~ '.h' %}")[0][1])
