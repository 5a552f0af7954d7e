"""The compile cache's trust checks (a binary is loaded only from folders and files no other user
could have written), its modes, a shared read-only cache, unusable folders, and the temporary files
of killed compiles. Run as root, "another user" is an unused uid the files are chowned to."""

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

from asp_gmm import GMM, cache
from asp_gmm.errors import CacheError, UnsafeCacheError

OTHER_UID = 54321
ROOT_USER = os.geteuid() == 0
as_root = pytest.mark.skipif(not ROOT_USER, reason="needs root to chown files to another user")
CMD = lambda src, out: ["gcc", "-shared", "-fPIC", "-o", out, src]  # noqa: E731


def _src(i=0):
    return f"int asp_cache_test_{i}(void) {{ return {i}; }}\n"


@pytest.fixture
def cdir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("ASP_GMM_CACHE_DIR", str(d))
    from asp_gmm.runtime import default_runtime

    monkeypatch.setattr(default_runtime(), "warned", set())
    return d


def _mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


def test_a_new_cache_is_private_whatever_the_umask(cdir):
    old = os.umask(0o002)
    try:
        b = cache.build(_src(), ".so", CMD, ["k"], "t")
    finally:
        os.umask(old)
    assert _mode(cdir) == 0o700 and _mode(b.parent) == 0o700
    for p in b.parent.iterdir():
        assert _mode(p) == 0o600, p


@pytest.mark.parametrize("where", ["root", "sub", "binary", "sidecar"])
def test_writable_by_others_is_refused_with_the_fix(cdir, where):
    b = cache.build(_src(), ".so", CMD, ["k"], "t")
    target = {"root": cdir, "sub": b.parent, "binary": b, "sidecar": b.with_suffix(".json")}[where]
    os.chmod(target, _mode(target) | stat.S_IWOTH)
    for call in (lambda: cache.build(_src(), ".so", CMD, ["k"], "t"), lambda: cache.lookup(_src(), ".so", ["k"], "t")):
        with pytest.raises(UnsafeCacheError) as info:
            call()
        msg = str(info.value)
        assert str(target) in msg and "writable by others" in msg and f"chmod go-w {target}" in msg
        assert "ASP_GMM_CACHE_DIR" in msg
    assert isinstance(info.value, PermissionError) and isinstance(info.value, CacheError)
    os.chmod(target, (_mode(target) | stat.S_IWGRP) & ~stat.S_IWOTH)
    with pytest.raises(UnsafeCacheError, match="writable by group"):
        cache.build(_src(), ".so", CMD, ["k"], "t")


@as_root
def test_an_entry_owned_by_another_user_is_refused(cdir):
    b = cache.build(_src(), ".so", CMD, ["k"], "t")
    os.chown(b, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafeCacheError) as info:
        cache.build(_src(), ".so", CMD, ["k"], "t")
    msg = str(info.value)
    assert str(b) in msg and f"uid {OTHER_UID}" in msg and f"ASP_GMM_CACHE_TRUST={OTHER_UID}" in msg


@as_root
def test_a_trusted_owner_may_keep_the_cache(cdir, monkeypatch):
    b = cache.build(_src(), ".so", CMD, ["k"], "t")
    for p in (cdir, b.parent, b, b.with_suffix(".json")):
        os.chown(p, OTHER_UID, OTHER_UID)
    monkeypatch.setenv("ASP_GMM_CACHE_TRUST", f"nosuchuser, {OTHER_UID}")
    assert cache.build(_src(), ".so", CMD, ["k"], "t") == b


@as_root
def test_sticky_folder_serves_its_owners_entries_only(cdir):
    b = cache.build(_src(), ".so", CMD, ["k"], "t")
    os.chmod(cdir, 0o1777)  # like /tmp
    assert cache.build(_src(), ".so", CMD, ["k"], "t") == b
    os.chown(b.parent, OTHER_UID, OTHER_UID)  # a sub-folder someone else made there first
    with pytest.raises(UnsafeCacheError, match=f"uid {OTHER_UID}"):
        cache.lookup(_src(), ".so", ["k"], "t")


PLANTED = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(MARKER, "w"); if (f) { fputs("ran", f); fclose(f); }
}
int asp_abi(void) { return -1; }
"""

VICTIM = """
    import numpy as np
    from asp_gmm import GMM
    X = np.random.default_rng(0).standard_normal((200, 3)).astype(np.float32)
    GMM(2, 3, backend="c", variant="V3").train(X, max_em_iters=1)
"""


@as_root
def test_a_planted_binary_with_its_own_digest_never_runs(tmp_path):
    """The attack: another user replaces a cached binary in a folder they can write and rewrites its
    sidecar with the new digest. The next trainer refuses it and the planted code never runs."""
    cdir = tmp_path / "cache"
    env = dict(os.environ, ASP_GMM_CACHE_DIR=str(cdir), ASP_GMM_AUTOTUNE="0")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(VICTIM)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (core,) = cdir.rglob("c-core-full-float32-*.so")
    marker = tmp_path / "planted-ran"
    evil_c = tmp_path / "evil.c"
    evil_c.write_text(PLANTED.replace("MARKER", json.dumps(str(marker))))
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(core), str(evil_c)], check=True)
    sidecar = core.with_suffix(".json")
    meta = json.loads(sidecar.read_text())
    meta["sha256"] = cache._file_sha256(core)
    sidecar.write_text(json.dumps(meta))
    os.chmod(core.parent, 0o777)  # the folder others could write...
    for p in (core, sidecar):
        os.chown(p, OTHER_UID, OTHER_UID)  # ...and did
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(VICTIM)], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "UnsafeCacheError" in r.stderr and str(core.parent) in r.stderr
    assert not marker.exists()
    os.chmod(core.parent, 0o700)  # the folder fixed, the planted files are still not ours
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(VICTIM)], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "UnsafeCacheError" in r.stderr and str(core) in r.stderr
    assert not marker.exists()


@as_root
def test_shared_read_only_cache_is_read_without_locks_and_extended_privately(cdir, tmp_path, monkeypatch):
    """An administrator's cache (root-owned, 0755 folders, 0644 files) read by a user: binaries load
    without a lock file or any write; a binary it lacks is compiled into the user's private cache,
    with one warning."""
    b = cache.build(_src(0), ".so", CMD, ["k"], "t")
    for p in [cdir, *cdir.rglob("*")]:
        if p.suffix == ".lock":
            p.unlink()
        else:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
    before = sorted(cdir.rglob("*"))
    private = tmp_path / "xdg" / "asp_gmm"
    private.mkdir(parents=True)
    os.chown(private, OTHER_UID, OTHER_UID)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    for name, value in (("geteuid", OTHER_UID), ("getegid", OTHER_UID)):
        monkeypatch.setattr(os, name, lambda v=value: v)
    monkeypatch.setattr(os, "getgroups", lambda: [OTHER_UID])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert cache.build(_src(0), ".so", CMD, ["k"], "t") == b
        assert sorted(cdir.rglob("*")) == before  # no lock file, nothing written
        assert w == []
        c1 = cache.build(_src(1), ".so", CMD, ["k"], "t")
        c2 = cache.build(_src(2), ".so", CMD, ["k"], "t")
    assert c1.is_relative_to(private) and c2.is_relative_to(private)
    assert sorted(cdir.rglob("*")) == before
    msgs = [str(x.message) for x in w]
    assert len(msgs) == 1 and str(cdir) in msgs[0] and "read-only" in msgs[0] and str(private) in msgs[0]
    assert cache.lookup(_src(1), ".so", ["k"], "t") == c1  # found again in the private cache


@as_root
def test_read_only_cache_as_its_owner_is_not_written_either(cdir, tmp_path, monkeypatch):
    cache.build(_src(0), ".so", CMD, ["k"], "t")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    os.chmod(cdir, 0o555)  # made read-only on purpose: root's bypass of modes does not count
    try:
        with pytest.warns(RuntimeWarning, match="read-only"):
            c1 = cache.build(_src(1), ".so", CMD, ["k"], "t")
        assert c1.is_relative_to(tmp_path / "xdg")
    finally:
        os.chmod(cdir, 0o700)


def test_unusable_cache_folder_names_the_variable(tmp_path, monkeypatch):
    f = tmp_path / "a-file"
    f.write_text("not a folder")
    X = np.random.default_rng(0).standard_normal((50, 2)).astype(np.float32)
    for where, what in ((f, "is not a folder"), (f / "cache", "cannot be created")):
        monkeypatch.setenv("ASP_GMM_CACHE_DIR", str(where))
        for call in (cache.cache_dir, lambda: cache.build(_src(), ".so", CMD, ["k"], "t")):
            with pytest.raises(CacheError) as info:
                call()
            msg = str(info.value)
            assert str(where) in msg and "ASP_GMM_CACHE_DIR" in msg and what in msg
    from asp_gmm.backends.c import CBackend

    with pytest.raises(CacheError, match="ASP_GMM_CACHE_DIR"):
        GMM(2, 2, backend=CBackend()).train(X)  # a fresh backend: nothing loaded yet
    monkeypatch.setenv("ASP_GMM_CACHE_DIR", str(tmp_path / "cache"))
    key, _ = cache._key(_src(), ["k"], "t")
    (tmp_path / "cache").mkdir(mode=0o700)
    (tmp_path / "cache" / key[:2]).write_text("a file where the entry's folder belongs")
    with pytest.raises(CacheError, match=r"cannot be written into the compile cache folder .*\(ASP_GMM_CACHE_DIR\)"):
        cache.build(_src(), ".so", CMD, ["k"], "t")


KILLED = """
    import sys
    from asp_gmm import cache
    cache.build(sys.argv[1], ".so", lambda src, out: ["sleep", "60"], ["k"], "t")
"""


def test_temporaries_of_a_killed_compile_are_removed(cdir):
    src = _src(7)
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(KILLED), src], env=dict(os.environ))
    try:
        deadline = time.monotonic() + 30
        temps = []
        while not temps and time.monotonic() < deadline:
            temps = list(cdir.rglob(".t-*.so"))
            time.sleep(0.05)
        assert temps, "the compile never started"
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    folder = temps[0].parent
    old = folder / ".other-0123456789abcdef01234567abcd.so"
    old.write_bytes(b"x")
    os.utime(old, (time.time() - 2 * cache.TEMP_MAX_AGE,) * 2)
    young = folder / ".other-0123456789abcdef01234567wxyz.so"
    young.write_bytes(b"x")
    b = cache.build(src, ".so", CMD, ["k"], "t")
    assert b.parent == folder and b.exists()
    assert not any(t.exists() for t in temps) and not old.exists()
    assert young.exists()  # maybe another process's compile in progress: kept
