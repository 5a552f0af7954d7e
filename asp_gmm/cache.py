"""Content-addressed cache of compiled binaries, shared by every backend.

The key of an entry is the sha256 of everything that determines the binary: the rendered source, the
compiler command (flags included), the compiler's version, the target (platform, CPU or GPU
architecture) and this package's version. Entries are written atomically (a temporary file in the
same folder, then ``os.replace``), guarded by a per-key file lock so that two processes never compile
the same source twice, and carry a sidecar with the binary's digest so that a corrupt entry is
detected, reported with a warning and rebuilt.

The folder is ``$ASP_GMM_CACHE_DIR`` when set, else the user cache folder from platformdirs.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import tempfile
import warnings
from pathlib import Path

import platformdirs

from . import __version__
from .errors import CompileError


def cache_dir() -> Path:
    """The cache folder (created on first use)."""
    env = os.environ.get("ASP_GMM_CACHE_DIR")
    path = Path(env) if env else Path(platformdirs.user_cache_dir("asp_gmm"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def digest(*parts) -> str:
    """sha256 of the parts, each converted to text and separated unambiguously."""
    h = hashlib.sha256()
    for p in parts:
        b = p if isinstance(p, bytes) else str(p).encode()
        h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class CompileStats:
    """Counts of compiles and cache hits in this process (tests and benchmarks read them)."""
    compiles = 0
    hits = 0


def build(source: str, suffix: str, command, key_parts, name: str = "", source_suffix: str = ".c"):
    """Return the path of the binary compiled from ``source``, compiling it only when not cached.

    Parameters
    ----------
    source : str
        Rendered source text.
    suffix : str
        File name ending of the binary (".so", ".cubin").
    command : callable
        ``command(src_path, out_path) -> list[str]``: the compiler command line.
    key_parts : sequence
        Everything besides the source that determines the binary (compiler version, flags, target).
    name : str
        Human-readable variant name, used in errors and file names.

    Raises
    ------
    CompileError
        With the command, the compiler output and the path of the rendered source.
    """
    folder, stem, binary, meta, src_path = _entry(source, suffix, key_parts, name, source_suffix)
    folder.mkdir(parents=True, exist_ok=True)
    if _valid(binary, meta):
        CompileStats.hits += 1
        return binary
    with _locked(folder / (stem + ".lock")):
        if _valid(binary, meta):  # another process finished it while we waited
            CompileStats.hits += 1
            return binary
        if binary.exists() or meta.exists():
            warnings.warn(f"asp_gmm: cache entry {binary} is corrupt or incomplete; rebuilding it",
                          RuntimeWarning, stacklevel=3)
        atomic_write(src_path, source)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + stem, suffix=suffix)
        os.close(fd)
        cmd = [str(c) for c in command(str(src_path), tmp)]
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except OSError as exc:
            os.unlink(tmp)
            raise CompileError(cmd, f"could not start the compiler: {exc}", str(src_path), name) from None
        if proc.returncode != 0 or os.path.getsize(tmp) == 0:
            os.unlink(tmp)
            raise CompileError(cmd, proc.stdout, str(src_path), name)
        os.replace(tmp, binary)
        atomic_write(meta, json.dumps({"sha256": _file_sha256(binary), "command": cmd,
                                       "key_parts": [str(k) for k in key_parts],
                                       "version": __version__, "name": name}, indent=1))
        CompileStats.compiles += 1
    return binary


def _entry(source, suffix, key_parts, name, source_suffix):
    key = digest(source, __version__, *key_parts)
    folder = cache_dir() / key[:2]
    stem = f"{(name or 'kernel').replace('/', '_')}-{key[:24]}"
    return folder, stem, folder / (stem + suffix), folder / (stem + ".json"), folder / (stem + source_suffix)


def lookup(source: str, suffix: str, key_parts, name: str = "", source_suffix: str = ".c"):
    """Path of the cached binary for these arguments (as :func:`build` takes them), or ``None``
    when it would have to be compiled."""
    _, _, binary, meta, _ = _entry(source, suffix, key_parts, name, source_suffix)
    return binary if _valid(binary, meta) else None


def _valid(binary: Path, meta: Path) -> bool:
    if not (binary.exists() and meta.exists()):
        return False
    try:
        return json.loads(meta.read_text())["sha256"] == _file_sha256(binary)
    except (ValueError, KeyError, OSError):
        return False


def invalidate(binary: Path) -> None:
    """Remove an entry (used when a binary that passed its digest check still fails to load)."""
    for p in (Path(binary), Path(binary).with_suffix(".json")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def tool_version(cmd) -> str:
    """First line of ``cmd --version`` (memoised per process)."""
    key = tuple(cmd)
    if key not in _versions:
        try:
            out = subprocess.run(list(cmd) + ["--version"], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True).stdout
        except OSError:
            out = "unavailable"
        _versions[key] = " | ".join(out.strip().splitlines()[:4])
    return _versions[key]


_versions: dict = {}
