"""A compile running in the process (a candidate compiled in the background) keeps a core busy:
short calls of the C backend leave that core to it (``Runtime.compiling``,
``asp_gmm.backends.c.threads_for``)."""

import threading

import pytest

from asp_gmm import cache
from asp_gmm.backends import c as cbackend
from asp_gmm.problem import Problem
from asp_gmm.runtime import default_runtime


def running():
    return default_runtime().compiles_running


def test_a_compile_is_counted_while_it_runs_and_not_after(tmp_path, monkeypatch):
    monkeypatch.setenv("ASP_GMM_CACHE_DIR", str(tmp_path / "cache"))
    seen = []

    def produce(text, path):
        seen.append(running())
        return b"\x7fbinary"

    before = running()
    cache.build("int x;\n", ".so", lambda s, o: ["cc", s, "-o", o], ["test"], "counted", produce=produce)
    assert seen == [before + 1] and running() == before

    def failing(text, path):
        raise RuntimeError("the compiler crashed")

    with pytest.raises(RuntimeError):
        cache.build("int y;\n", ".so", lambda s, o: ["cc", s, "-o", o], ["test"], "fails", produce=failing)
    assert running() == before


def test_short_calls_leave_a_core_to_each_running_compile(monkeypatch):
    monkeypatch.setattr(cbackend, "_omp_threads", lambda: 4)
    small = Problem(1, 1, 1, "diag", "float32")  # below SERIAL_WORK: one thread anyway
    short = Problem(20_000, 19, 16, "diag", "float32")
    long = Problem(2_000_000, 19, 16, "diag", "float32")
    assert small.work < cbackend.SERIAL_WORK <= short.work < cbackend.SHORT_WORK <= long.work
    assert [cbackend.threads_for(p) for p in (small, short, long)] == [1, 4, 4]
    monkeypatch.setattr(default_runtime(), "compiles_running", 1)
    assert [cbackend.threads_for(p) for p in (small, short, long)] == [1, 3, 4]
    monkeypatch.setattr(default_runtime(), "compiles_running", 9)
    assert cbackend.threads_for(short) == 1


def test_the_count_holds_under_concurrent_compiles(tmp_path, monkeypatch):
    monkeypatch.setenv("ASP_GMM_CACHE_DIR", str(tmp_path / "cache"))
    inside = threading.Barrier(4, timeout=30)
    seen = []

    def produce(text, path):
        inside.wait()  # all four compiles running at once
        seen.append(running())
        inside.wait()
        return b"\x7fbinary"

    before = running()
    threads = [
        threading.Thread(
            target=cache.build,
            args=(f"int v{i};\n", ".so", lambda s, o: ["cc", s, "-o", o], ["test"], f"c{i}"),
            kwargs={"produce": produce},
        )
        for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert seen == [before + 4] * 4 and running() == before
