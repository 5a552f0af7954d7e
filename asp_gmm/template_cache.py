"""Jinja2's compiled templates kept between processes (a :class:`jinja2.BytecodeCache`).

Every call looks its binaries up by the sha256 of their rendered source (:mod:`asp_gmm.cache`), so a
process renders the templates of what it runs even when every binary is cached. Rendering is quick;
compiling a template into Python is not: the CUDA templates (a core, E-steps, covariance variants,
their includes) took 3.2 s of a warm diarization process on the GPU host, 17 templates of 250 ms
each (1,094 calls of ``compile``). Jinja2 can keep the compiled code (marshal data, checked against
the template's source checksum and the Python version), and this module keeps it in the compile
cache's ``templates`` folder under the same rules as the binaries: a file is loaded only when it
and its folder pass :func:`asp_gmm.cache._require_safe` (owned by you or root, not writable by
group or others), it is written atomically, and an unreadable or stale entry is compiled again and
replaced. A read-only cache folder is read but never written.
"""

from __future__ import annotations

import contextlib
import hashlib
import os

from .cache import _modes, _require_safe, atomic_write, cache_dir
from .errors import CacheError

#: The sub-folder of the compile cache that holds the templates' compiled code.
FOLDER = "templates"


def _entry(folder: str, name: str):
    """The path of the kept entry ``<cache folder>/<folder>/<name>``, checked under the binaries'
    rules (:func:`asp_gmm.cache._require_safe`: an unsafe entry or folder raises), or ``None``
    when nothing is stored there."""
    try:
        sub = cache_dir() / folder  # (the cache folder: created 0700 when missing, owner and mode checked)
        path = sub / name
        st = os.stat(path)
    except (OSError, CacheError):
        return None
    _require_safe(sub, os.stat(sub))
    _require_safe(path, st)
    return path


def _keep(folder: str, name: str, data) -> None:
    """Store ``data`` as ``<cache folder>/<folder>/<name>`` atomically, with the cache folder's modes
    (nothing is stored in a read-only cache)."""
    with contextlib.suppress(OSError, CacheError):
        root = cache_dir()
        dmode, fmode = _modes(os.stat(root))
        with contextlib.suppress(FileExistsError):
            os.mkdir(root / folder, dmode)
        atomic_write(root / folder / name, data, fmode)


def template_code_cache():
    """A :class:`jinja2.BytecodeCache` over ``<cache folder>/templates`` (jinja2 is imported here:
    only a process that renders needs it). The cache folder is looked up on every load and store,
    so ``ASP_GMM_CACHE_DIR`` changed during a process is followed."""
    import jinja2

    class TemplateCodeCache(jinja2.BytecodeCache):
        def load_bytecode(self, bucket) -> None:
            path = _entry(FOLDER, f"{bucket.key}.jbc")
            if path is None:
                return  # nothing stored: compiled and stored below
            try:
                with open(path, "rb") as f:
                    bucket.load_bytecode(f)  # (a stale checksum or Python version leaves it empty)
            except Exception:  # a truncated or corrupt entry: compiled again and replaced
                bucket.reset()

        def dump_bytecode(self, bucket) -> None:
            _keep(FOLDER, f"{bucket.key}.jbc", bucket.bytecode_to_string())

    return TemplateCodeCache()


# ---------------------------------------------------------------- rendered sources

#: The sub-folder of the compile cache that holds rendered sources by what they were rendered from.
SOURCES = "sources"


def jinja_identity() -> str:
    """What identifies the installed Jinja2 without importing it (its package file's path, size and
    modification time: a reinstall or an upgrade changes them); "" when Jinja2 is missing."""
    from importlib.util import find_spec

    spec = find_spec("jinja2")
    if spec is None or not spec.origin:
        return ""
    try:
        st = os.stat(spec.origin)
    except OSError:
        return spec.origin
    return f"{spec.origin}:{st.st_size}:{st.st_mtime_ns}"


def load_source(key: str) -> str | None:
    """The source rendered earlier from the inputs whose digest is ``key``, or ``None``.

    A process whose binaries are all cached still needs each one's source, since binaries are found
    by the sha256 of their source; with the source kept here it neither imports Jinja2 nor renders
    (60 ms of a warm diarization run's start on two cores). An entry is read under the binaries'
    rules (owner and modes checked, an unsafe one raises); its first line is the sha256 of the rest,
    and one that does not match (a torn or altered file) is ignored and rendered again."""
    path = _entry(SOURCES, f"{key}.src")
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            head, text = f.readline().rstrip("\n"), f.read()
    except (OSError, UnicodeDecodeError):
        return None
    return text if head == hashlib.sha256(text.encode()).hexdigest() else None


def store_source(key: str, text: str) -> None:
    """Keep ``text`` for :func:`load_source` (atomically; nothing is stored in a read-only cache)."""
    _keep(SOURCES, f"{key}.src", hashlib.sha256(text.encode()).hexdigest() + "\n" + text)
