"""Content-addressed cache of compiled binaries, shared by every backend.

The key of an entry is the sha256 of everything that determines the binary: the rendered source, the
compiler command (flags included), the compiler's version, the target (platform, CPU or GPU
architecture) and this package's version. Entries are written atomically (a temporary file in the
same folder, then ``os.replace``), guarded by a per-key file lock so that two processes never compile
the same source twice, and carry a sidecar with the binary's digest so that a corrupt entry is
detected, reported with a warning and rebuilt.

The folder is ``$ASP_GMM_CACHE_DIR`` when set, else the user cache folder from platformdirs.

Trust (as ssh's StrictModes and pip's cache checks). A binary in the cache runs inside the process
that loads it, and the digest in its sidecar proves nothing when both can be written by someone
else. So before any binary is loaded (and before its sidecar is believed), the cache folder, the
entry's sub-folder, the binary and its sidecar must each be owned by the current user or root (or a
user named in ``$ASP_GMM_CACHE_TRUST``) and not writable by group or others; a folder with the
sticky bit (``/tmp``-like) may be writable by others, since its entries, owned as above, cannot be
replaced by them. Otherwise :class:`~asp_gmm.errors.UnsafeCacheError` names the path and the fix.
A missing cache folder is created 0700; sub-folders and files take the cache folder's read and
execute bits and never its group/other write bits (0700/0600 for a private cache, 0755/0644 in a
shared one an administrator created 0755).

A shared read-only cache (a lab's, filled by an administrator) is read without taking a lock or
writing anything. A binary it lacks is compiled into the user's private cache folder (platformdirs),
with one warning per process; when that cannot be written either, :class:`~asp_gmm.errors.CacheError`
says so.

Temporary files of compiles killed midway (``.<name>*.so``, ``.cubin``, ``.tmp``) are removed when
their folder is next compiled into: at once when their key's lock is free, else after
:data:`TEMP_MAX_AGE` seconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import stat
import subprocess
import tempfile
import threading
import time
import warnings
from pathlib import Path


from ._version import __version__
from .config import cache_root, default_cache_dir, settings
from .errors import CacheError, CompileError, UnsafeCacheError
from .runtime import default_runtime

log = logging.getLogger("asp_gmm.cache")

#: Seconds after which a temporary file left by a killed compile is removed by the next compile in
#: its folder (temporaries of the key being compiled are removed at once: their lock is free).
TEMP_MAX_AGE = 3600.0

_GO_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _configured() -> tuple:
    """(folder, where it comes from) of the cache: ``$ASP_GMM_CACHE_DIR`` or the user cache folder."""
    return cache_root()


def _private_dir() -> Path:
    return default_cache_dir()


def _describe(path: Path, origin: str) -> str:
    if origin == "ASP_GMM_CACHE_DIR":
        return f"the compile cache folder {path} (ASP_GMM_CACHE_DIR)"
    if origin == "private":
        return f"your private compile cache folder {path}"
    return f"the compile cache folder {path} (the default; ASP_GMM_CACHE_DIR is not set)"


def cache_dir() -> Path:
    """The cache folder: created 0700 on first use, and checked (owner, write bits) on every use.

    Raises
    ------
    CacheError
        It is not a folder or cannot be created (the message names ``ASP_GMM_CACHE_DIR``).
    UnsafeCacheError
        It is owned by another user or writable by group or others (and not sticky).
    """
    path, origin = _configured()
    _ensure_root(path, origin)
    return path


def _ensure_root(path: Path, origin: str) -> os.stat_result:
    fix = "set ASP_GMM_CACHE_DIR to a folder of yours (it is created if missing)"
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        st = None
    except OSError as exc:
        raise CacheError(f"{_describe(path, origin)} cannot be read ({exc.strerror}); {fix}") from None
    if st is None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
                os.chmod(path, 0o700)  # whatever the umask
            st = os.stat(path)
        except OSError as exc:
            raise CacheError(f"{_describe(path, origin)} cannot be created ({exc.strerror or exc}); {fix}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise CacheError(
            f"{_describe(path, origin)} is not a folder (a file is in its place); remove that file, or {fix}"
        )
    _require_safe(path, st)
    return st


# ------------------------------------------------------------------ trust
def _trusted_uids() -> set:
    """The current user, root, and the users named in ``$ASP_GMM_CACHE_TRUST`` (names or uids)."""
    return {os.geteuid(), 0} | _named_uids(settings().cache_trust)


@functools.lru_cache(maxsize=8)
def _named_uids(text: str) -> frozenset:
    uids = set()
    for part in text.replace(",", " ").split():
        if part.isdigit():
            uids.add(int(part))
            continue
        try:
            import pwd

            uids.add(pwd.getpwnam(part).pw_uid)
        except (ImportError, KeyError):
            log.warning("asp_gmm: ASP_GMM_CACHE_TRUST names %r, which is not a user here; ignored", part)
    return frozenset(uids)


def _user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def _user(uid: int) -> str:
    name = _user_name(uid)
    return f"uid {uid}" if name == str(uid) else f"{name!r} (uid {uid})"


def _require_safe(path: Path, st: os.stat_result) -> None:
    """Raise :class:`UnsafeCacheError` unless ``path`` (its ``st``) is owned by a trusted user and
    not writable by group or others (a sticky folder may be: see the module documentation)."""
    what = "folder" if stat.S_ISDIR(st.st_mode) else "file"
    private = "set ASP_GMM_CACHE_DIR to a private folder of yours (e.g. ~/.cache/asp_gmm), which is created 0700"
    if st.st_uid not in _trusted_uids():
        raise UnsafeCacheError(
            f"asp_gmm will not load compiled code from the compile cache: the {what} {path} is owned by "
            f"{_user(st.st_uid)}, not by you ({_user(os.geteuid())}) or root, so its binaries could be anyone's "
            f"code. Fix: {private}; or, if it is a shared cache kept by a user you trust, set "
            f"ASP_GMM_CACHE_TRUST={_user_name(st.st_uid)}"
        )
    if st.st_mode & _GO_WRITE and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        who = " and ".join(w for w, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit)
        raise UnsafeCacheError(
            f"asp_gmm will not load compiled code from the compile cache: the {what} {path} is writable by {who} "
            f"(mode {stat.S_IMODE(st.st_mode):04o}), so another user could plant a binary there that would run in "
            f"this process. Fix: chmod go-w {path}"
            + (" (and the files in it)" if what == "folder" else "")
            + f", or {private}"
        )


def _writable(path: Path, st: os.stat_result) -> bool:
    """Whether we may write into ``path``: by its mode bits (root included: a folder an administrator
    made read-only stays so) and by the operating system (read-only mounts, ACLs)."""
    mode = st.st_mode
    if st.st_uid == os.geteuid():
        bit = mode & stat.S_IWUSR
    elif st.st_gid == os.getegid() or st.st_gid in os.getgroups():
        bit = mode & stat.S_IWGRP
    else:
        bit = mode & stat.S_IWOTH
    return bool(bit) and os.access(path, os.W_OK)


def _modes(root_st: os.stat_result) -> tuple:
    """(folder mode, file mode) of what we create under a cache folder of ``root_st``: its read and
    execute bits for group and others, never their write bits."""
    shared = stat.S_IMODE(root_st.st_mode) & 0o055
    return 0o700 | shared, 0o600 | (shared & 0o044)


def digest(*parts) -> str:
    """sha256 of the parts, each converted to text and separated unambiguously."""
    h = hashlib.sha256()
    for p in parts:
        b = p if isinstance(p, bytes) else str(p).encode()
        h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()


def atomic_write(path: Path, data: bytes | str, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one (file mode
    ``mode``, else 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _locked(path: Path, mode: int = 0o600):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class CompileStats:
    """Counts of compiles and cache hits in this process, and the seconds spent compiling (tests and
    benchmarks read them)."""

    compiles = 0
    hits = 0
    seconds = 0.0


#: A compile still running after this many seconds prints a one-line notice on stderr (once per
#: process): a first call that compiles for longer would otherwise wait in silence.
NOTICE_AFTER = 3.0
#: Compiles are logged here at INFO (name, seconds, compiler, binary).
compile_log = logging.getLogger("asp_gmm")
_NOTICED = "compile-notice"  # in Runtime.warned once the notice was printed


def _noticed() -> bool:
    return _NOTICED in default_runtime().warned


class _Notice:
    """Prints, once per process, a line on stderr when compiles keep the process busy for longer than
    :data:`NOTICE_AFTER` seconds (one long compile, or several back to back or in parallel)."""

    _lock = threading.Lock()
    _active = 0
    _last_end = 0.0
    _timer = None

    def __init__(self, name: str):
        cls = type(self)
        with cls._lock:
            cls._active += 1
            cls._name = name
            if cls._timer is None and not _noticed() and NOTICE_AFTER is not None:
                cls._timer = threading.Timer(NOTICE_AFTER, cls._fire)
                cls._timer.daemon = True
                cls._timer.start()

    @classmethod
    def _fire(cls):
        with cls._lock:
            cls._timer = None
            busy = cls._active > 0 or time.monotonic() - cls._last_end < 0.5
            if not busy or _noticed():
                return
            default_runtime().warned.add(_NOTICED)
        import sys

        where, _ = _configured()
        print(
            f"asp_gmm: compiling specialized code on first use ({cls._name or 'kernel'}...); this takes a few "
            f"seconds once, the binaries are cached in {where}",
            file=sys.stderr,
            flush=True,
        )

    def cancel(self):
        cls = type(self)
        with cls._lock:
            cls._active -= 1
            cls._last_end = time.monotonic()


def build(source: str, suffix: str, command, key_parts, name: str = "", source_suffix: str = ".c", produce=None):
    """Return the path of the binary compiled from ``source``, compiling it only when not cached.

    Every binary returned has passed the trust checks of the module documentation (callers load it:
    ``dlopen``, ``module_from_file``).

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
    source_suffix : str
        File name ending of the kept source (".c", ".cu").
    produce : callable, optional
        ``produce(source, src_path) -> bytes``: compile in this process (NVRTC) instead of running
        ``command``, which then only describes the compile (recorded in the entry's sidecar and in
        errors). Raises :class:`CompileError` itself.

    Every compile is logged at INFO on ``logging.getLogger("asp_gmm")`` with its duration, and one
    that is still running after :data:`NOTICE_AFTER` seconds prints a one-line notice on stderr
    (once per process), so a user knows why a first call waits.

    Raises
    ------
    CompileError
        With the command, the compiler output and the path of the rendered source.
    CacheError, UnsafeCacheError
        The cache folder cannot be used, or holds an entry another user could have written.
    """
    key, stem = _key(source, key_parts, name)
    roots = _search_roots()
    for root, _ in roots:
        hit = _cached(root, key, stem, suffix)
        if hit is not None:
            CompileStats.hits += 1
            return hit
    root, root_st = _compile_root(roots)
    try:
        return _compile_into(root, root_st, key, stem, source, suffix, command, key_parts, name, source_suffix, produce)
    except (CompileError, CacheError):
        raise
    except OSError as exc:  # a sub-folder we cannot write, a full disk...
        primary, origin = _configured()
        where = _describe(root, origin if root == primary else "private")
        raise CacheError(
            f"a binary cannot be written into {where}: {exc.strerror or exc}"
            + (f" ({exc.filename})" if exc.filename else "")
            + "; make it writable for you (or free space), or set ASP_GMM_CACHE_DIR to a writable "
            "folder"
        ) from None


def _compile_into(
    root, root_st, key, stem, source, suffix, command, key_parts, name, source_suffix, produce=None
) -> Path:
    """Compile ``source`` into its entry under ``root`` (under the entry's lock) and return the binary."""
    dir_mode, file_mode = _modes(root_st)
    folder = root / key[:2]
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, dir_mode)
        os.chmod(folder, dir_mode)
    binary, meta, src_path = folder / (stem + suffix), folder / (stem + ".json"), folder / (stem + source_suffix)
    _require_safe(folder, os.stat(folder))
    with _locked(folder / (stem + ".lock"), file_mode):
        hit = _cached(root, key, stem, suffix)
        if hit is not None:  # another process finished it while we waited
            CompileStats.hits += 1
            return hit
        _remove_stale_temporaries(folder, stem)
        if binary.exists() or meta.exists():
            warnings.warn(
                f"asp_gmm: cache entry {binary} is corrupt or incomplete; rebuilding it", RuntimeWarning, stacklevel=3
            )
        atomic_write(src_path, source, file_mode)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + stem, suffix=suffix)
        os.close(fd)
        cmd = [str(c) for c in command(str(src_path), tmp)]
        t0 = time.perf_counter()
        notice = _Notice(name)
        try:
            try:
                with default_runtime().compiling():  # (a core taken: see Runtime.compiling)
                    if produce is not None:
                        data = produce(source, str(src_path))
                        with open(tmp, "wb") as f:
                            f.write(data)
                    else:
                        try:
                            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                        except OSError as exc:
                            raise CompileError(
                                cmd, f"could not start the compiler: {exc}", str(src_path), name
                            ) from None
                        if proc.returncode != 0 or os.path.getsize(tmp) == 0:
                            raise CompileError(cmd, proc.stdout, str(src_path), name)
                os.chmod(tmp, file_mode)  # the linker creates its output with the umask's mode
                os.replace(tmp, binary)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
        finally:
            notice.cancel()
        seconds = time.perf_counter() - t0
        compile_log.info(
            "asp_gmm: compiled %s in %.2f s with %s (%s)",
            name or stem,
            seconds,
            "NVRTC in-process" if produce is not None else os.path.basename(cmd[0]),
            binary,
        )
        CompileStats.seconds += seconds
        atomic_write(
            meta,
            json.dumps(
                {
                    "sha256": _file_sha256(binary),
                    "command": cmd,
                    "key_parts": [str(k) for k in key_parts],
                    "version": __version__,
                    "name": name,
                },
                indent=1,
            ),
            file_mode,
        )
        CompileStats.compiles += 1
    return binary


def _key(source, key_parts, name) -> tuple:
    key = digest(source, __version__, *key_parts)
    return key, f"{(name or 'kernel').replace('/', '_')}-{key[:24]}"


def lookup(source: str, suffix: str, key_parts, name: str = "", source_suffix: str = ".c"):
    """Path of the cached binary for these arguments (as :func:`build` takes them), or ``None``
    when it would have to be compiled. Raises as :func:`build` for an untrusted cache."""
    key, stem = _key(source, key_parts, name)
    for root, _ in _search_roots():
        hit = _cached(root, key, stem, suffix)
        if hit is not None:
            return hit
    return None


def _search_roots() -> list:
    """[(folder, stat)] to look for binaries in: the cache folder, and when that is read-only for
    us, the private cache folder too (if it exists)."""
    primary, origin = _configured()
    st = _ensure_root(primary, origin)
    out = [(primary, st)]
    if not _writable(primary, st):
        private = _private_dir()
        if private != primary:
            try:
                pst = os.stat(private)
            except FileNotFoundError:
                pst = None
            if pst is not None:
                out.append((private, _ensure_root(private, "private")))
    return out


def _compile_root(roots: list) -> tuple:
    """(folder, stat) to compile into: the cache folder, or the private one when the cache folder is
    read-only for us (a shared cache), created if needed, with one warning per process."""
    primary, st = roots[0]
    if _writable(primary, st):
        return primary, st
    _, origin = _configured()
    private = _private_dir()
    if private == primary:
        raise CacheError(
            f"{_describe(primary, origin)} is read-only for you, so a binary it lacks cannot be "
            "compiled; make it writable (chmod u+w) or set ASP_GMM_CACHE_DIR to a writable folder"
        )
    pst = _ensure_root(private, "private")
    if not _writable(private, pst):
        raise CacheError(
            f"{_describe(primary, origin)} is read-only for you and so is {_describe(private, 'private')}, "
            "so a binary they lack cannot be compiled; set ASP_GMM_CACHE_DIR to a writable folder"
        )
    rt = default_runtime()
    with rt.lock:
        if ("cache-fallback", primary) not in rt.warned:
            rt.warned.add(("cache-fallback", primary))
            msg = (
                f"asp_gmm: {_describe(primary, origin)} is read-only for you (a shared cache?); binaries it "
                f"lacks are compiled into {_describe(private, 'private')}"
            )
            log.warning(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=4)
    return private, pst


def _cached(root: Path, key: str, stem: str, suffix: str):
    """The trusted, intact binary of ``key`` under ``root``, or ``None``."""
    folder = root / key[:2]
    binary, meta = folder / (stem + suffix), folder / (stem + ".json")
    try:
        fst = os.stat(folder)
    except (FileNotFoundError, NotADirectoryError):
        return None
    _require_safe(folder, fst)
    try:
        bst, mst = os.stat(binary), os.stat(meta)
    except (FileNotFoundError, NotADirectoryError):
        return None
    _require_safe(binary, bst)
    _require_safe(meta, mst)
    return binary if _valid(binary, meta) else None


def _valid(binary: Path, meta: Path) -> bool:
    try:
        return json.loads(meta.read_text())["sha256"] == _file_sha256(binary)
    except (ValueError, KeyError, TypeError, OSError):
        return False


def _remove_stale_temporaries(folder: Path, stem: str) -> None:
    """Remove our temporary files in ``folder`` left by killed compiles or writes: those of ``stem``
    (whose lock the caller holds, so no one is writing them) and any older than TEMP_MAX_AGE."""
    now, me = time.time(), os.geteuid()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for e in entries:
        if not e.name.startswith(".") or e.name.endswith(".lock"):
            continue
        try:
            st = e.stat(follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != me:
                continue
            if e.name.startswith("." + stem) or now - st.st_mtime > TEMP_MAX_AGE:
                os.unlink(e.path)
                log.debug("removed the stale temporary file %s", e.path)
        except OSError:
            continue


def invalidate(binary: Path) -> None:
    """Remove an entry (used when a binary that passed its digest check still fails to load)."""
    for p in (Path(binary), Path(binary).with_suffix(".json")):
        with contextlib.suppress(FileNotFoundError, PermissionError):
            p.unlink()


def tool_version(cmd) -> str:
    """First lines of ``cmd --version`` (memoised per process; part of cache keys and device
    fingerprints, so its text must not change: :func:`short_version` is for display)."""
    key = tuple(cmd)
    if key not in _versions:
        try:
            out = subprocess.run(
                list(cmd) + ["--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            ).stdout
        except OSError:
            out = "unavailable"
        _versions[key] = " | ".join(out.strip().splitlines()[:4])
    return _versions[key]


def short_version(text: str) -> str:
    """One line of a :func:`tool_version` text for display: the first part that names a version
    (gcc's first line, nvcc's "release" line)."""
    import re

    parts = [p.strip() for p in str(text).split(" | ") if p.strip()]
    for p in parts:
        if re.search(r"\d+\.\d+", p) and not p.lower().startswith("copyright"):
            return p
    return parts[0] if parts else str(text)


_versions: dict = {}
