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
