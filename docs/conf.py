"""Sphinx configuration of the asp_gmm site (build it with ./docs/build.sh)."""

from __future__ import annotations

import os
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

import apigen  # noqa: E402

import asp_gmm  # noqa: E402

# The pages written from the code (asp_gmm.__all__, the CLI's parser, the settings table).
apigen.write_all(DOCS)

project = "asp_gmm"
author = "the asp_gmm developers"
copyright = "2026, the asp_gmm developers"
release = asp_gmm.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
templates_path = ["_templates"]
exclude_patterns = ["_build", "_ext", "_templates", "gallery/GALLERY_HEADER.rst", "**.ipynb_checkpoints"]

# -- autodoc / autosummary / numpydoc ---------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "none"  # the numpydoc sections state every type and shape
numpydoc_show_class_members = False  # the class template lists members with :members:
numpydoc_class_members_toctree = False
numpydoc_validation_checks = set()


def _skip_member(app, what, name, obj, skip, options):
    """Leave out scikit-learn's generated metadata-routing methods (``set_fit_request``...): their
    docstrings point into scikit-learn's own glossary, and they are scikit-learn's, not ours."""
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_member)


# -- Markdown (docs/architecture.md, docs/performance.md) ------------------------------------------
myst_heading_anchors = 3
# The notes link to files of the repository (../README.md, asp_gmm/...), which are not pages here.
suppress_warnings = ["myst.xref_missing", "myst.header"]

# -- intersphinx: links to NumPy, scikit-learn, Dask and Python where their inventories can be had --
_INVENTORIES = {
    "python": "https://docs.python.org/3/",
    "numpy": "https://numpy.org/doc/stable/",
    "sklearn": "https://scikit-learn.org/stable/",
    "dask": "https://docs.dask.org/en/stable/",
    "distributed": "https://distributed.dask.org/en/stable/",
}


def _inventory(item):
    """``(url, location)`` of one inventory: a file ``docs/_inventories/NAME.inv`` where one is kept
    (copy them there for offline builds), else the site's own when it answers within 3 s, else None.
    Offline (or ``ASP_GMM_DOCS_OFFLINE=1``) the links are left out and the build still passes."""
    name, url = item
    local = DOCS / "_inventories" / f"{name}.inv"
    if local.is_file():
        return name, (url, str(local))
    if os.environ.get("ASP_GMM_DOCS_OFFLINE", "") not in ("", "0"):
        return name, None
    try:
        with urllib.request.urlopen(url + "objects.inv", timeout=3) as r:
            r.read(1)
    except Exception:
        return name, None
    return name, (url, None)


with ThreadPoolExecutor(len(_INVENTORIES)) as _pool:
    intersphinx_mapping = {name: v for name, v in _pool.map(_inventory, _INVENTORIES.items()) if v}
_missing = sorted(set(_INVENTORIES) - set(intersphinx_mapping))
if _missing:
    print(f"intersphinx: no inventory for {', '.join(_missing)} (offline?): links to them are left out")
intersphinx_timeout = 10

# -- the gallery (executed at every build, on the CPU) ----------------------------------------------
os.environ.setdefault("MPLBACKEND", "Agg")
sphinx_gallery_conf = {
    "examples_dirs": "gallery",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "within_subsection_order": "FileNameSortKey",
    "abort_on_example_error": True,
    "only_warn_on_example_error": False,
    "remove_config_comments": True,
    "download_all_examples": False,
    "min_reported_time": 0,
    "image_scrapers": ("matplotlib",),
    "show_memory": False,
    "plot_gallery": "True",
    # ASP_GMM_DOCS_RERUN=1 (the test suite) runs every example again, even where its output is there
    "run_stale_examples": os.environ.get("ASP_GMM_DOCS_RERUN", "") not in ("", "0"),
}

# -- HTML -----------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"asp_gmm {release}"
html_static_path = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_show_sourcelink = False
