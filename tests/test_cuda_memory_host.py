"""The CUDA backend's pool of idle device blocks (:meth:`DeviceMemory.acquire_bytes`), on a fake
driver: no GPU needed."""

import contextlib

import pytest

from asp_gmm.backends.cuda.memory import DeviceMemory, _capacity


class _Alloc:
    def __init__(self, drv, n):
        self.drv, self.n, self.ptr = drv, n, drv.next
        drv.next += n
        drv.live += 1

    def __int__(self):
        return self.ptr

    def free(self):
        self.drv.live -= 1
        self.drv.freed += 1


class _Drv:
    def __init__(self, limit=None):
        self.next, self.live, self.freed, self.limit = 4096, 0, 0, limit

    def mem_alloc(self, n):
        if self.limit is not None and self.live >= self.limit:
            raise MemoryError("out of device memory")
        return _Alloc(self, n)


class _Dev:
    def __init__(self, drv):
        self.drv = drv

    @contextlib.contextmanager
    def active(self):
        yield


def _memory(limit=None):
    dev = _Dev(_Drv(limit))
    return DeviceMemory(lambda: dev), dev.drv


def test_a_released_block_is_given_to_the_next_call_of_a_similar_size():
    mem, drv = _memory()
    a = mem.acquire_bytes(3_000_000)
    assert a.capacity == _capacity(3_000_000) >= 3_000_000
    mem.release(a)
    b = mem.acquire_bytes(2_900_000)
    assert b is a and drv.live == 1 and drv.freed == 0
    # a larger need, or one less than half the idle block, gets a block of its own
    mem.release(b)
    c = mem.acquire_bytes(4_000_000)
    d = mem.acquire_bytes(1_000_000)
    assert c is not a and d is not a and drv.live == 3


def test_idle_blocks_are_freed_when_an_allocation_fails():
    mem, drv = _memory(limit=2)
    a, held = mem.acquire_bytes(1 << 20), mem.acquire_bytes(1 << 21)
    mem.release(a)
    # a third live block fails once: the idle one is freed and the allocation tried again
    c = mem.acquire_bytes(1 << 23)
    assert c is not a and c is not held and drv.freed == 1 and drv.live == 2
    # with nothing idle left to free, the driver's error reaches the caller
    with pytest.raises(MemoryError):
        mem.acquire_bytes(1 << 24)
    assert drv.live == 2


def _closing_session(sync_fails):
    """A batched CUDA session holding one pooled block, on fakes (no GPU)."""
    from types import SimpleNamespace

    from asp_gmm.backends.cuda.batch import CudaBatchSession

    mem, drv = _memory()

    class Context:
        @staticmethod
        def synchronize():
            if sync_fails:
                raise RuntimeError("cuCtxSynchronize failed: an illegal memory access was encountered")

    drv.Context = Context
    s = CudaBatchSession.__new__(CudaBatchSession)
    s.dev, s.drv, s.backend = _Dev(drv), drv, SimpleNamespace(memory=mem)
    s._bufs = [mem.acquire_bytes(1 << 20)]
    return s, mem, drv


def test_a_closed_batch_session_gives_its_block_back_to_the_pool():
    s, mem, drv = _closing_session(sync_fails=False)
    blk = s._bufs[0]
    s.close()
    assert mem.acquire_bytes(1 << 20) is blk and drv.freed == 0


def test_a_block_of_a_failed_context_is_freed_not_pooled():
    """After a launch failed, the context cannot be synchronised: the block is freed, never given to
    the next session, and closing does not hide the launch's own error behind its own."""
    s, mem, drv = _closing_session(sync_fails=True)
    blk = s._bufs[0]
    s.close()
    assert drv.freed == 1 and drv.live == 0
    assert mem.acquire_bytes(1 << 20) is not blk
