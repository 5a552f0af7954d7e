"""Pages of the API reference written from the code itself, each time the site is built.

``docs/conf.py`` calls :func:`write_all` before Sphinx reads the sources, so that a name added to
``asp_gmm.__all__``, an option added to the ``asp-gmm`` parser or a setting added to
``asp_gmm.config.SETTINGS`` appears in the reference without editing a page. The pages written here
are not kept in git (``docs/.gitignore``); ``tests/test_docs.py`` compares them with the package.
"""

from __future__ import annotations

import argparse
import inspect
import os
from pathlib import Path

#: The page of ``asp_gmm.__all__`` (relative to docs/) and the folder of its per-name pages.
PUBLIC_PAGE = "api/public.rst"
GENERATED = "api/generated"
CLI_PAGE = "api/cli.rst"
SETTINGS_PAGE = "api/settings_table.rst"


def _write(path: Path, text: str) -> None:
    """Write ``text`` unless the file already holds it (an unchanged page is not rebuilt)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def _title(text: str, char: str = "=") -> str:
    return f"{text}\n{char * len(text)}\n"


def public_groups() -> dict:
    """``asp_gmm.__all__`` sorted into kinds: ``{heading: [(name, autosummary template), ...]}``."""
    import asp_gmm

    groups = {"Classes": [], "Functions": [], "Exceptions": [], "Other names": []}
    for name in asp_gmm.__all__:
        obj = getattr(asp_gmm, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            groups["Exceptions"].append((name, "exception.rst"))
        elif inspect.isclass(obj):
            groups["Classes"].append((name, "class.rst"))
        elif callable(obj):
            groups["Functions"].append((name, "function.rst"))
        else:
            groups["Other names"].append((name, "data.rst"))
    return {k: v for k, v in groups.items() if v}


def public_page() -> str:
    lines = [
        ".. This page is written by docs/_ext/apigen.py from asp_gmm.__all__ at every build; do not edit.",
        "",
        _title("The ``asp_gmm`` package"),
        ".. currentmodule:: asp_gmm",
        "",
        "Every name of ``asp_gmm.__all__``, the names ``from asp_gmm import *`` gives. "
        "(``GaussianMixture`` is listed only where scikit-learn is installed.)",
        "",
    ]
    for heading, items in public_groups().items():
        lines += [_title(heading, "-"), ""]
        for template in sorted({t for _, t in items}):
            # the templates are docs/_templates/autosummary/*.rst (members listed, troubleshooting linked)
            lines += [
                ".. autosummary::",
                f"   :toctree: {Path(GENERATED).name}",
                f"   :template: autosummary/{template}",
            ]
            lines += [""] + [f"   {name}" for name, t in items if t == template] + [""]
    return "\n".join(lines)


def _subcommands(parser: argparse.ArgumentParser):
    """``parser`` and every sub-command's parser below it, depth first."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
                yield from _subcommands(sub)


def cli_page() -> str:
    from asp_gmm.cli import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "80"  # argparse wraps its help to the terminal's width
    try:
        parsers = list(_subcommands(build_parser()))
        helps = [(p.prog, p.format_help()) for p in parsers]
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    lines = [
        ".. This page is written by docs/_ext/apigen.py from asp_gmm.cli.build_parser() at every build.",
        "",
        ".. _cli:",
        "",
        _title("The ``asp-gmm`` command"),
        "The command line of the tuning history and the compiled variants (installed with the package as "
        "``asp-gmm``; also ``python -m asp_gmm.cli``). Below: the ``--help`` of the command and of every "
        "sub-command, as its parser prints it.",
        "",
    ]
    for prog, text in helps:
        lines += [_title(f"``{prog}``", "-"), "", ".. code-block:: text", ""]
        lines += [("   " + line).rstrip() for line in text.rstrip().splitlines()]
        lines.append("")
    return "\n".join(lines)


def _rst_inline(text: str) -> str:
    """The settings table is written in Markdown's `code`; reStructuredText wants ``code``."""
    parts = text.split("`")
    return "".join(f"``{p}``" if i % 2 else p for i, p in enumerate(parts))


def settings_page() -> str:
    from asp_gmm.config import SETTINGS

    lines = [
        ".. This table is written by docs/_ext/apigen.py from asp_gmm.config.SETTINGS at every build.",
        "",
        ".. list-table::",
        "   :header-rows: 1",
        "   :widths: 25 45 30",
        "",
        "   * - variable",
        "     - meaning",
        "     - default",
    ]
    for name, (default, meaning) in SETTINGS.items():
        lines += [f"   * - ``{name}``", f"     - {_rst_inline(meaning)}", f"     - {_rst_inline(default)}"]
    lines.append("")
    return "\n".join(lines)


NOTES_PAGE = "notes/index.rst"
#: The notes that open the list; any other ``docs/*.md`` follows in name order.
FIRST_NOTES = ("architecture", "performance")


def notes_page(docs: Path) -> str:
    """The toctree of the lab notes: every ``docs/*.md``, so that a note added there is a page of the
    site (and not a document outside every toctree, which fails the -W build)."""
    stems = sorted(p.stem for p in Path(docs).glob("*.md"))
    stems = [s for s in FIRST_NOTES if s in stems] + [s for s in stems if s not in FIRST_NOTES]
    lines = [
        ".. This page is written by docs/_ext/apigen.py from the docs/*.md notes at every build.",
        "",
        _title("Developer notes"),
        "The notes the developers keep beside the code: how a call flows through the package and where "
        "each rule lives, what was tried and measured for speed (with the machine of every figure), and "
        "the other lab notes.",
        "",
        ".. toctree::",
        "   :maxdepth: 2",
        "",
    ]
    lines += [f"   /{s}" for s in stems] + [""]
    return "\n".join(lines)


def write_all(docs: Path) -> None:
    """Write the generated pages under ``docs``."""
    docs = Path(docs)
    _write(docs / NOTES_PAGE, notes_page(docs))
    _write(docs / PUBLIC_PAGE, public_page())
    _write(docs / CLI_PAGE, cli_page())
    _write(docs / SETTINGS_PAGE, settings_page())
