"""The CUDA batch support's host side, without a GPU: compiles of several batch configurations run
in parallel threads (only loading is serialised), and the module that uploads a frozen recording is
one per D, prepared with the classes."""

import contextlib
import shutil
import subprocess
import threading

import numpy as np
import pytest

from asp_gmm import registry
from asp_gmm.backends import batch_base
from asp_gmm.backends.cuda import batch as cb
from asp_gmm.backends.cuda import staging
from asp_gmm.problem import BatchProblem, Problem


class _Device:
    arch = "sm_90"
    drv = None

    @contextlib.contextmanager
    def active(self):
        yield


class _Backend:
    name = "cuda"

    def __init__(self):
        self.device = _Device()
        self.cores = []

    def limit_context(self):
        return {}

    def core(self, problem):
        self.cores.append((problem.D, problem.M, problem.cvtype, problem.dtype))


class _Module:
    def get_function(self, name):
        return type("Fn", (), {"prepare": lambda self, sig: None})()


def test_batch_configurations_compile_in_parallel(monkeypatch):
    """Two configurations asked for from two threads compile at the same time: each compile waits
    for the other to start (a barrier); with the compile under the support's lock the second
    never starts and the barrier breaks."""
    support = cb.CudaBatchSupport(_Backend())
    gb, gbs = registry.get("cuda", "GB", "batch"), registry.get("cuda", "GBS", "batch")
    bp = BatchProblem(10_000, 20, 8, "diag", "float32", B=4)
    barrier = threading.Barrier(2, timeout=10)
    compiled, lock = set(), threading.Lock()

    def compile_once(name):
        with lock:
            first = name not in compiled
            compiled.add(name)
        if first:
            barrier.wait()

    monkeypatch.setattr(cb, "cubin_path", lambda src, arch, name: compile_once(name), raising=False)
    monkeypatch.setattr(cb, "load_module", lambda dev, src, name: (compile_once(name), _Module())[1:] + ("cubin",))
    errors = []

    def ask(v):
        try:
            support.kernel(v, None, bp)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(v,)) for v in (gb, gbs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(compiled) == 2


@pytest.mark.parametrize("M", [1, 8, 16])
def test_upload_module_is_one_per_dimension(M):
    """Every float32 class of one D prepares the same upload module (M = 1, diagonal), whatever its
    M; a float64 class uploads nothing (its rows are gathered on the host)."""
    be = _Backend()
    support = cb.CudaBatchSupport(be)
    support.prepare_class(BatchProblem(50_000, 20, M, "full", "float32", B=8))
    support.prepare_class(BatchProblem(50_000, 20, M, "full", "float64", B=8))
    assert be.cores == [(20, 1, "diag", "float32")]
    p = cb.upload_problem(316_000, 20)
    assert isinstance(p, Problem) and (p.N, p.D, p.M, p.cvtype, p.dtype) == (316_000, 20, 1, "diag", "float32")


def test_a_class_found_in_the_compile_cache_is_remembered(monkeypatch):
    """is_ready looks a configuration's binary up in the compile cache once (a found entry stays:
    entries are only ever added or rebuilt); one not found is taken as absent for ABSENT_S seconds,
    then asked again (another process may have compiled it)."""
    support = cb.CudaBatchSupport(_Backend())
    gb = registry.get("cuda", "GB", "batch")
    bp = BatchProblem(10_000, 20, 8, "diag", "float32", B=4)
    tun = support.tunables_for(gb, bp)
    asked, cached, clock = [], {"now": False}, {"t": 1000.0}
    monkeypatch.setattr(cb, "is_cached", lambda src, arch, name: asked.append(name) or cached["now"])
    monkeypatch.setattr(batch_base.time, "monotonic", lambda: clock["t"])
    assert not support.is_ready(gb, tun, bp) and not support.is_ready(gb, tun, bp)
    assert len(asked) == 1  # not cached: remembered as absent
    cached["now"] = True
    assert not support.is_ready(gb, tun, bp) and len(asked) == 1
    clock["t"] += support.ABSENT_S
    assert support.is_ready(gb, tun, bp) and support.is_ready(gb, tun, bp) and support.is_ready(gb, tun, bp)
    assert len(asked) == 2  # asked again once the absence expired, found, then remembered


class _FakeStream:
    """A stream whose copies happen when it is synchronized (reading their source then, as a DMA
    reads a page-locked buffer after the call that queued it has returned)."""

    def __init__(self, drv):
        self.drv, self.queued = drv, []

    def synchronize(self):
        for dst, src in self.queued:
            self.drv.memcpy_htod(dst, src)
        self.queued = []


class _FakeDrv:
    """Device memory as one host byte array (a pointer is an offset into it); page-locked buffers
    as plain arrays, each allocation counted; asynchronous copies queued on their stream."""

    def __init__(self, nbytes):
        self.mem = np.zeros(nbytes, np.uint8)
        self.allocs, self.copies = [], []

    def pagelocked_empty(self, n, dtype):
        self.allocs.append(n)
        return np.full(n, 0xEE, dtype)  # garbage where no part writes

    def Stream(self):
        return _FakeStream(self)

    def memcpy_htod(self, dst, src):
        b = np.frombuffer(src, np.uint8)
        self.copies.append((dst, b.nbytes))
        self.mem[dst : dst + b.nbytes] = b

    def memcpy_htod_async(self, dst, src, stream):
        stream.queued.append((dst, src))


@pytest.mark.parametrize("turn_rows, piece_rows", [(None, None), (7, None), (None, 3), (8, 3)])
def test_pinned_rows_put_every_part_at_its_rows(turn_rows, piece_rows, monkeypatch):
    """PinnedRows copies the members' arrays (float32 or converted float64) into the page-locked
    buffer at their rows and sends the span up piece by piece (filled on the host threads, each
    sent as soon as it is filled), in turns when the span exceeds PINNED_MAX: every part's rows
    arrive intact, converted to float32, no turn overwrites the buffer before its copies have run,
    and the buffer is allocated once for many calls."""
    rng = np.random.default_rng(7)
    D = 3
    dev = _Device()
    dev.drv = _FakeDrv(4 * D * 200)
    if turn_rows is not None:
        monkeypatch.setattr(staging, "PINNED_MAX", turn_rows * 4 * D)
    if piece_rows is not None:
        monkeypatch.setattr(staging, "PINNED_PIECE", piece_rows * 4 * D)
    pinned = staging.PinnedRows(dev)
    parts = [rng.standard_normal((n, D)).astype(dt) for n, dt in ((5, np.float32), (11, np.float64), (1, np.float32))]
    starts = [21, 10, 40]  # rows 26..39 belong to no part (a joined member, written later); not in row order
    for _ in range(3):
        pinned.upload(0, D, starts, parts)
    X = dev.drv.mem.view(np.float32).reshape(-1, D)
    for s, p in zip(starts, parts):
        np.testing.assert_array_equal(X[s : s + len(p)], p.astype(np.float32))
    assert not X[:10].any() and not X[41:].any()  # nothing outside the span
    assert len(dev.drv.allocs) == 1  # kept between uploads
    most = min(turn_rows or 99, piece_rows or 99)
    assert all(n <= most * 4 * D for _, n in dev.drv.copies)
    turns = [(t, min(41, t + (turn_rows or 31))) for t in range(10, 41, turn_rows or 31)]
    pieces = sum(-(-(t1 - t0) // (piece_rows or 99)) for t0, t1 in turns)
    assert len(dev.drv.copies) == 3 * pieces


_NVCC = shutil.which("nvcc")


@pytest.mark.skipif(_NVCC is None, reason="nvcc is not installed (the host-side constants are read by a host program)")
@pytest.mark.parametrize(
    "D, M, cvtype, threads",
    [
        (19, 16, "full", 128),
        (19, 8, "full", 256),
        (2, 2, "full", 128),
        (48, 128, "full", 256),
        (1, 1, "diag", 128),
        (19, 16, "diag", 256),
        (300, 64, "diag", 128),
    ],
)
def test_host_sizes_match_the_template(D, M, cvtype, threads, tmp_path):
    """The session sizes the factor array and launches GBS's sums from cuda/batch_layout.py's
    prec_cells and msum_blocks; the template defines the same quantities (NCELLSP, NPG) for its
    kernels. A host program built from the rendered source prints the template's values: a
    disagreement would leave prec too small or sums of some (component, tile) pairs never run."""
    from asp_gmm.backends.cuda import batch_layout
    from asp_gmm.backends.cuda.compile import render_source

    gbs = registry.get("cuda", "GBS", "batch")
    tun = {**gbs.default_tunables(), "threads": threads}
    tun["ept"] = 2 if (cvtype == "full" and D <= 24) or (cvtype == "diag" and D <= 64) else 1
    src = render_source(gbs, tun, Problem(0, D, M, cvtype, "float32"))
    main = '\n#include <cstdio>\nint main() { std::printf("%d %d\\n", (int)(NCELLSP), (int)NPG); return 0; }\n'
    cu = tmp_path / "sizes.cu"
    cu.write_text(src + main)
    exe = tmp_path / "sizes"
    subprocess.run([_NVCC, "-arch=sm_90", "-o", str(exe), str(cu)], check=True, capture_output=True, timeout=300)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60).stdout.split()
    full = cvtype == "full"
    assert [int(v) for v in got] == [
        batch_layout.prec_cells(D, full),
        batch_layout.msum_blocks(D, M, full, threads),
    ]
