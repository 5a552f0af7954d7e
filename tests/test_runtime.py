"""Process state lives in asp_gmm.runtime.Runtime, made on first use: importing the package has no
side effect (no exit or fork hook, no file, no runtime)."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import atexit, os, sys
hooks = []   # the project's hooks (the standard library and dependencies register their own)
def ours(f):
    name = getattr(f, "__module__", "") or ""
    return name.split(".")[0] in ("asp_gmm", "tuning_db")
real_register, real_fork = atexit.register, getattr(os, "register_at_fork", None)
def register(f, *a, **k):
    if ours(f):
        hooks.append(f.__qualname__)
    return real_register(f, *a, **k)
def register_at_fork(**k):
    hooks.extend("fork:" + f.__qualname__ for f in k.values() if ours(f))
    return real_fork(**k)
atexit.register = register
if real_fork is not None:
    os.register_at_fork = register_at_fork
import asp_gmm
import asp_gmm.backends, asp_gmm.backends.c, asp_gmm.backends.cuda, asp_gmm.backends.numpy_ref
import asp_gmm.selection, asp_gmm.specializer, asp_gmm.tuning_db, asp_gmm.runtime, asp_gmm.cli
import asp_gmm.autotune
assert not hooks, f"hooks registered at import: {hooks}"
assert asp_gmm.runtime._default_runtime is None, "a runtime was created at import"
if sys.argv[1] == "use":
    # first use: the history opens and only now registers its exit hook
    import numpy as np
    X = np.random.default_rng(0).standard_normal((300, 2))
    asp_gmm.GMM(2, 2, backend="numpy").train(X, max_em_iters=2)
    asp_gmm.runtime.default_selector().history()
    assert asp_gmm.runtime._default_runtime is not None
    assert any("flush_all_at_exit" in h for h in hooks), hooks
print("ok")
"""


def _run(tmp_path, mode):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASP_GMM_", "XDG_"))}
    env.update(
        HOME=str(home),
        XDG_CACHE_HOME=str(home / "cache"),
        XDG_DATA_HOME=str(home / "data"),
        XDG_CONFIG_HOME=str(home / "config"),
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        ASP_GMM_DB=f"sqlite:///{home / 'db' / 'h.sqlite'}",
    )
    r = subprocess.run(
        [sys.executable, "-c", CHILD, mode], cwd=home, env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
    return sorted(p.relative_to(home).as_posix() for p in home.rglob("*"))


def test_importing_asp_gmm_registers_no_hook_and_creates_no_file(tmp_path):
    assert _run(tmp_path, "import") == []


def test_the_history_registers_its_exit_hook_when_it_opens(tmp_path):
    assert "db/h.sqlite" in _run(tmp_path, "use")


def test_a_runtime_holds_its_own_backends_selector_and_histories(tmp_path, monkeypatch):
    from asp_gmm.backends import get_backend
    from asp_gmm.runtime import Runtime, default_runtime
    from asp_gmm.selection import HistorySelector

    rt = Runtime()
    be = get_backend("numpy", rt)
    assert rt.backends == {"numpy": be} and get_backend("numpy", rt) is be
    assert default_runtime().backends.get("numpy") is not be
    assert isinstance(rt.selector, HistorySelector) and rt.selector is not default_runtime().selector
    monkeypatch.setenv("ASP_GMM_DB", f"sqlite:///{tmp_path / 'mine.sqlite'}")
    h = rt.selector.history()
    assert h is not None and list(rt.histories.values()) == [h]
    assert h not in default_runtime().histories.values()


def test_the_registry_memo_lives_on_the_runtime(monkeypatch):
    """What the registry derives from the declarations (variants per backend and phase, whether
    limits name N) is memoised in the default runtime, not in a module-level dict: a fresh runtime
    starts empty, a reload of the declarations is seen."""
    from asp_gmm import registry, runtime

    assert not hasattr(registry, "_memo")
    rt = runtime.Runtime()
    assert rt.declarations_memo == {}
    monkeypatch.setattr(runtime, "_default_runtime", rt)
    got = registry.variants("c", "covariance")
    assert got and all(v.backend == "c" and v.phase == "covariance" for v in got)
    every, answer = rt.declarations_memo[("variants", "c", "covariance")]
    assert every is registry.all_variants() and list(answer) == got
    registry.limits_name_n("cuda", "covariance")
    assert ("names_n", "cuda", "covariance") in rt.declarations_memo
    other = runtime.Runtime()
    monkeypatch.setattr(runtime, "_default_runtime", other)
    assert registry.variants("c", "covariance") == got and list(other.declarations_memo) == [
        ("variants", "c", "covariance")
    ]
    stale = ("variants", "numpy", None)
    other.declarations_memo[stale] = ((), ("stale",))  # declarations since reloaded: recomputed
    assert registry.variants("numpy") == [v for v in registry.all_variants() if v.backend == "numpy"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_inherit_the_parents_thread_pools():
    """The host threads' pool made in the parent (the seeding moments of a large array) has no
    threads in a forked child; a pool that believes it has idle threads never runs what it is given,
    so the child hung. The child gets pools of its own and the same moments."""
    import multiprocessing

    from asp_gmm.fit import seed

    X = np.random.default_rng(4).standard_normal((300_000, 8)).astype(np.float32)
    var, cov = seed.host_moments(X, "diag")  # the parent's pool is made and idle
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()

    def child():
        q.put(seed.host_moments(X, "diag")[1].tolist())

    p = ctx.Process(target=child)
    with warnings.catch_warnings():  # (Python 3.12 warns that forking a threaded process may deadlock:
        warnings.simplefilter("ignore", DeprecationWarning)  # that deadlock is what this test is about)
        p.start()
    p.join(60)
    if p.is_alive():
        p.kill()
        p.join()
        pytest.fail("the forked child hung on the parent's thread pool")
    assert p.exitcode == 0
    np.testing.assert_array_equal(np.array(q.get(timeout=10)), cov)


def test_host_imap_pipelines_in_order_and_leaves_nothing_running_when_closed(monkeypatch):
    """host_imap yields each result in order with at most ``threads`` items ahead of the consumer;
    closed early (PinnedRows' DMA loop raised), the items not started never run and those running
    have finished when close() returns (no host copy left writing into a page-locked buffer)."""
    import threading
    import time

    from asp_gmm.runtime import Runtime

    rt = Runtime()
    monkeypatch.setattr(rt, "host_threads", lambda: 4)
    started, finished, lock = [], [], threading.Lock()

    def work(i):
        with lock:
            started.append(i)
        time.sleep(0.02)
        with lock:
            finished.append(i)
        return i * i

    assert list(rt.host_imap(work, range(9), threads=2)) == [i * i for i in range(9)]
    started.clear(), finished.clear()
    it = rt.host_imap(work, range(20), threads=2)
    assert next(it) == 0
    with lock:
        assert len(started) <= 3  # the consumed item and at most two ahead
    it.close()
    with lock:
        done = sorted(finished)
        assert sorted(started) == done and len(done) <= 3
    time.sleep(0.1)
    assert sorted(finished) == done  # nothing ran after close() returned
