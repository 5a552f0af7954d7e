"""The documentation cannot drift from the code: the site builds with warnings as errors (its gallery
executed), every public name has its page, and every example in a docstring or in the user guide
runs (doctest).

The site's build needs the ``docs`` extra (``./test.sh`` installs it); without Sphinx the build test
skips, except in CI, where it fails.
"""

from __future__ import annotations

import doctest
import importlib
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GUIDE_PAGES = sorted((DOCS / "guide").glob("*.rst"))
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

sys.path.insert(0, str(DOCS / "_ext"))
import apigen  # noqa: E402

import asp_gmm  # noqa: E402


def _modules() -> list[str]:
    """Every module of the package (asp_gmm.tuning_db is installed from its own folder)."""
    import asp_gmm.tuning_db

    names = ["asp_gmm", "asp_gmm.tuning_db"]
    for pkg in (asp_gmm, asp_gmm.tuning_db):
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
    return sorted(set(names))


def _need_sphinx():
    try:
        import numpydoc  # noqa: F401
        import sphinx  # noqa: F401
        import sphinx_gallery  # noqa: F401
    except ImportError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"the docs extra is not installed in CI ({exc}): ./test.sh installs test,examples,docs")
        pytest.skip(f"the docs extra is not installed ({exc}): pip install -e '.[docs]'")


# ---------------------------------------------------------------------------------------------- doctests
@pytest.mark.parametrize("name", _modules())
def test_docstring_examples_run(name):
    """``>>>`` examples in the package's docstrings (pytest --doctest-modules, module by module)."""
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    tests = [t for t in finder.find(module, name) if t.examples]
    for t in tests:
        runner.run(t)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) of {name} failed (output above)"


@pytest.mark.parametrize("page", GUIDE_PAGES, ids=[p.stem for p in GUIDE_PAGES])
def test_guide_examples_run(page, capsys):
    """``>>>`` examples in the user guide's pages."""
    result = doctest.testfile(str(page), module_relative=False, optionflags=FLAGS, encoding="utf-8")
    out = capsys.readouterr().out
    assert result.failed == 0, f"{result.failed} example(s) of {page.relative_to(ROOT)} failed:\n{out}"


def test_the_guide_has_examples_that_run():
    """The pages that teach the calls carry examples (so the test above cannot pass by having none)."""
    counts = {p.stem: len(doctest.DocTestParser().get_examples(p.read_text())) for p in GUIDE_PAGES}
    for stem in ("first_fit", "large_data", "sklearn", "troubleshooting"):
        assert counts.get(stem, 0) >= 3, f"docs/guide/{stem}.rst has {counts.get(stem, 0)} examples"


# ------------------------------------------------------------------------------- the generated pages
def test_reference_page_lists_every_public_name():
    page = apigen.public_page()
    listed = set(re.findall(r"^   (\S+)$", page, flags=re.M))
    assert listed == set(asp_gmm.__all__)


def test_cli_page_has_every_subcommand():
    from asp_gmm.cli import build_parser

    page = apigen.cli_page()
    progs = [p.prog for p in apigen._subcommands(build_parser())]
    assert len(progs) > 3  # the command and its sub-commands (tune, history ..., info)
    for prog in progs:
        assert f"``{prog}``" in page, prog
    assert "--N" in page and "--verbose" in page


def test_settings_table_has_every_setting():
    from asp_gmm.config import SETTINGS

    table = apigen.settings_page()
    for name in SETTINGS:
        assert f"``{name}``" in table


def test_every_note_is_a_page():
    """docs/*.md (docs/architecture.md, docs/performance.md and any note added later) are in the site."""
    page = apigen.notes_page(DOCS)
    notes = sorted(p.stem for p in DOCS.glob("*.md"))
    assert {"architecture", "performance"} <= set(notes)
    for stem in notes:
        assert f"   /{stem}" in page, stem


def test_troubleshooting_names_every_error_class():
    """The guide says what to do about every error the package defines (add a row to
    docs/guide/troubleshooting.rst for a new class)."""
    for name in _modules():
        importlib.import_module(name)
    seen, todo = set(), [asp_gmm.ASPGMMError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("asp_gmm") and sub not in seen:
                seen.add(sub)
                todo.append(sub)
    text = (DOCS / "guide" / "troubleshooting.rst").read_text()
    missing = sorted(c.__name__ for c in seen if f"``{c.__name__}``" not in text)
    assert len(seen) >= 10
    assert not missing, f"docs/guide/troubleshooting.rst does not say what to do about {missing}"


# ------------------------------------------------------------------------------------------ the site
@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built from scratch with -W (every warning an error), the gallery executed."""
    _need_sphinx()
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, ASP_GMM_DOCS_OFFLINE="1", ASP_GMM_DOCS_RERUN="1", MPLBACKEND="Agg")
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q"]
    cmd += ["-d", str(out / "doctrees"), str(DOCS), str(out / "html")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"sphinx-build failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    return out / "html"


def test_site_builds_with_warnings_as_errors(site):
    for page in ("index", "guide/index", "api/index", "api/cli", "api/config", "architecture", "performance"):
        assert (site / f"{page}.html").is_file(), page


def test_every_public_name_has_a_page(site):
    """asp_gmm.__all__ against the generated pages: one page per name, none for a name not public."""
    pages = {p.name[len("asp_gmm.") : -len(".html")] for p in (site / "api" / "generated").glob("asp_gmm.*.html")}
    assert pages == set(asp_gmm.__all__)
    index = (site / "api" / "public.html").read_text()
    for name in asp_gmm.__all__:
        assert f'href="generated/asp_gmm.{name}.html' in index, name
    gmm = (site / "api" / "generated" / "asp_gmm.GMM.html").read_text()
    for method in ("train", "score", "predict", "eval"):
        assert f'id="asp_gmm.GMM.{method}"' in gmm, method


def test_gallery_ran_with_figures(site):
    examples = sorted(p.stem for p in (DOCS / "gallery").glob("plot_*.py"))
    assert len(examples) >= 6
    for stem in examples:
        html = (site / "auto_examples" / f"{stem}.html").read_text()
        assert "sphx-glr-script-out" in html, f"{stem}: no output captured"
    for stem in ("plot_01_first_fit", "plot_05_bic_model_order", "plot_06_diarization"):
        assert (site / "_images" / f"sphx_glr_{stem}_001.png").is_file(), f"{stem}: no figure"


def test_submodules_are_documented(site):
    dask = (site / "api" / "dask.html").read_text()
    import asp_gmm.dask

    for name in asp_gmm.dask.__all__:
        assert f'id="asp_gmm.dask.{name}"' in dask, name
    errors = (site / "api" / "errors.html").read_text()
    for name in ("ASPGMMError", "CompileError", "UnsafeCacheError", "StreamError"):
        assert f'id="asp_gmm.errors.{name}"' in errors, name
    streaming = (site / "api" / "streaming.html").read_text()
    assert 'id="asp_gmm.streaming.ChunkSource"' in streaming
