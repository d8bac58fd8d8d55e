"""Large CPU arrays from a pool of memory blocks whose last user is gone.

Contract: `pooled(shape, dtype)` returns a writeable, C-contiguous array
like `np.empty(shape, dtype)`.  One of at least `POOL_MIN` bytes is carved
from the start of a block of its size class (`block_bytes`: its size
rounded up to an eighth of the power of two below it, at most 12.5% more)
that an earlier such array used and no array uses now, when the pool holds
one.  Why classes, not exact sizes: a loop whose sizes vary from call to
call (a batch of sequences of the length each batch has) freed blocks no
later call asked for, so the pool filled to its limit (512 MiB) with
blocks never taken again, and took none.  Why: the C library maps a large
allocation afresh each time (above 32 MiB always, and from 128 KiB often
enough: its heap is trimmed back as arrays are freed), so each call's
results cost a page fault and a zeroed page per 4 KiB, first touched by
the kernel that writes them: about 40% of `value_and_grad` of log1pexp at
1e7 elements, and 3 to 4 times the `out=` call's time from 5e4 to 5e5
(0.39 ms against 0.14 ms at 5e4, 6.4 ms against 1.5 ms at 5e5, when the
pool began at 4 MiB).  A loop that calls a function and drops its results gets the
same memory back, already mapped.

The array's `.base` chain ends at a `Lease` (an object exposing the block
through `__array_interface__`); when the last array or view over it is
freed, the lease's `__del__` returns the block to the free list.  At most
`pool_limit()` bytes of free blocks are kept (`GRADC_POOL_BYTES`, default
512 MiB; 0 turns the pool off; a text that is not a byte count warns and
keeps the default): a block freed beyond that takes the place of blocks of
the size given back longest ago, which are released to the system (so
sizes no longer asked for cannot fill the pool for good), and `release()`
releases them all.  Thread-safe: the free lists and their byte count change
only under one lock, so two threads never get the same block and the count
is the free lists' bytes (or more, after a step that an exception such as
a Ctrl-C cut short, until the lists are next empty: never less, and no
exception leaves them unusable); re-entrant, since the garbage collector may free
a lease in the middle of the pool's own work (such a give-back waits in a
queue until that work is done: `FreeBlocks`).  A fork waits for the lock,
so the child's pool is whole and its lock free.  A lease cannot be copied
or pickled (a copy would give its block back twice), and leases freed while
the interpreter exits give nothing back.
"""
from __future__ import annotations

import atexit
import functools
import os
import threading
import warnings
import weakref
from typing import Callable

import numpy as np

POOL_MIN = 256 << 10  # bytes: below, the C library reuses its heap (no page faults)
_DEFAULT_LIMIT = 512 << 20

_open = True  # False from the interpreter's exit on (and None once this module is torn down)


def pool_limit() -> int:
    """The most bytes of free blocks the pool keeps."""
    return limit_from_env("GRADC_POOL_BYTES", _DEFAULT_LIMIT)


def limit_from_env(name: str, default: int) -> int:
    """A pool's limit in bytes: the environment variable `name`, else `default`."""
    return _limit_of(name, os.environ.get(name, ""), default)


@functools.lru_cache(maxsize=None)  # read at every give-back; said once
def _limit_of(name: str, text: str, default: int) -> int:
    if not text:
        return default
    try:
        limit = int(text)
    except ValueError:
        limit = -1
    if limit < 0:
        warnings.warn(f"{name}={text!r} is not a number of bytes (0 turns the "
                      f"pool off); the pool keeps its default {default >> 20} MiB",
                      RuntimeWarning, stacklevel=3)
        return default
    return limit


class Lease:
    """One array's claim on a block; its death frees the block."""
    __slots__ = ("_block", "__array_interface__")

    def __init__(self, block: np.ndarray, shape: tuple, dtype: np.dtype):
        self._block = block
        self.__array_interface__ = {"shape": shape, "typestr": dtype.str, "version": 3,
                                    "data": (block.ctypes.data, False)}

    def __del__(self):
        # (a Ctrl-C delivered as __init__ began leaves a lease of no block)
        block = getattr(self, "_block", None)
        if _open and block is not None:  # at exit, what _give_back uses may be gone
            _give_back(block)

    def __reduce__(self):
        raise TypeError("a pool lease cannot be copied or pickled (a copy would give "
                        "its block back twice); copy the array over it instead")


class FreeBlocks:
    """Free blocks by byte size, at most `limit()` bytes of them, the size
    given back longest ago evicted first; thread-safe, re-entrant and
    robust to an exception at any step (the module's contract).  A block
    is any object: the host pool's are byte arrays, the CUDA target's
    device allocations (`runtime.cuda`).

    Re-entrant: a block given back by the thread that is inside the
    pool's own bookkeeping (a garbage collection, which from Python 3.12
    runs at any bytecode's check of the eval loop, or a signal handler,
    freeing a lease there) is queued, and listed by that bookkeeping
    before it lets go of the lock (else by the next): listed there and
    then, it changed the lists and their count under the step it
    interrupted, which then raised (KeyError, IndexError) or left the
    count below the blocks kept.  A give-back while another thread holds
    the lock is queued too (`give_back`), never waiting."""

    def __init__(self, limit: Callable[[], int]):
        self._limit = limit
        # nbytes -> free blocks of that size, sizes in the order they were last given back
        self._free: dict[int, list] = {}
        self._free_bytes = 0
        self._queued: list = []  # (block, nbytes) given back within the bookkeeping
        self._lock = threading.RLock()

    def give_back(self, block, nbytes: int) -> None:
        """List `block` (of `nbytes`) as free, or drop it (its memory goes
        back to the system) where it is larger than the whole limit.  It
        never waits for the lock: where another thread holds it, the block
        is queued for that thread's bookkeeping to list (or the next's).
        A give-back runs wherever a collection frees a lease, which may be
        inside another pool's bookkeeping (the host's inside a GPU's, and
        the other way round, in two threads): waiting there could close a
        cycle of two threads each holding the lock the other waits for."""
        self._queued.append((block, nbytes))  # (one step: atomic, as the pops)
        del block
        if self._lock._is_owned():
            return  # (within this thread's bookkeeping: listed there)
        evicted: list = []  # dropped after the bookkeeping: dropping a device block runs
        try:  # Numba's code, which may collect garbage, which may give back
            if not self._lock.acquire(blocking=False):
                return  # (within another thread's)
            self._list_queued(evicted)
        finally:
            # This thread held no hold on entry, so one it has now is this
            # acquire's: let go of it even where a Ctrl-C came as acquire
            # returned (where the eval loop delivers a signal), before the
            # try began or a flag could say it was taken.
            if self._lock._is_owned():
                self._lock.release()

    def _list_queued(self, evicted: list) -> None:
        """List the queued blocks, those evicted to make room (and any
        larger than the whole limit) appended to `evicted`; under the lock."""
        while self._queued:
            block, nbytes = self._queued.pop()
            limit = self._limit()  # (a collection it sets off queues its give-backs)
            if nbytes > limit:
                evicted.append(block)
                continue
            # The size given back longest ago makes room.  Each step leaves
            # the free lists and their count consistent should an exception
            # (a Ctrl-C) end it anywhere: a list may be empty (never evicted
            # from) and the count high (which only evicts early, and is exact
            # again once the lists are empty), never low (past the limit).
            while self._free and self._free_bytes + nbytes > limit:
                oldest = next(iter(self._free))
                blocks = self._free[oldest]
                if blocks:
                    evicted.append(blocks.pop())
                    self._free_bytes -= oldest
                if not blocks:
                    self._free.pop(oldest, None)
            if not self._free:
                self._free_bytes = 0
            self._free_bytes += nbytes  # before the block is listed
            blocks = self._free.pop(nbytes, [])  # and this size is now the newest
            blocks.append(block)
            self._free[nbytes] = blocks

    def take(self, nbytes: int):
        """A free block of exactly `nbytes`, unlisted, or None (always
        None within the pool's own bookkeeping: a finalizer run there)."""
        if self._lock._is_owned():
            return None
        evicted: list = []
        with self._lock:  # (robust to an exception anywhere, as `give_back`)
            if not self._free.get(nbytes):  # (a block given back while another
                self._list_queued(evicted)  # thread held the lock, after its listing)
            blocks = self._free.get(nbytes)
            block = blocks.pop() if blocks else None
            if block is not None:
                self._free_bytes -= nbytes
            if blocks is not None and not blocks:
                del self._free[nbytes]
            self._list_queued(evicted)  # (given back meanwhile)
        return block

    def release(self) -> int:
        """Drop every free block; return the bytes dropped."""
        with self._lock:
            released, self._free_bytes = self._free_bytes, 0
            dropped, self._free = self._free, {}
            queued, self._queued = self._queued, []
        released += sum(nbytes for _, nbytes in queued)  # (given back, not yet listed)
        del dropped, queued  # (after the bookkeeping, as an eviction's)
        return released


HOST = FreeBlocks(pool_limit)
# every pool there is, the host's and each GPU's (`runtime.cuda`), for `release`
POOLS: "weakref.WeakSet[FreeBlocks]" = weakref.WeakSet([HOST])


def _give_back(block: np.ndarray) -> None:
    HOST.give_back(block, block.nbytes)


def block_bytes(nbytes: int) -> int:
    """The bytes of the block an array of `nbytes` (at least `POOL_MIN`) is
    carved from: `nbytes` rounded up to a multiple of an eighth of the
    largest power of two below it (and of a page)."""
    step = 1 << max((nbytes - 1).bit_length() - 4, 12)
    return -(-nbytes // step) * step


def pooled(shape, dtype) -> np.ndarray:
    """An uninitialized array of `shape` and `dtype`, from the pool when large
    (and of a dtype without fields, a subarray or objects)."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    nbytes = dtype.itemsize
    for d in shape:
        nbytes *= d
    # (a lease's typestr names no fields nor subarray, and an object array
    # over a reused block would hold its old bytes as pointers, where
    # np.empty's holds None: those dtypes, which no driver asks for, are
    # NumPy's own)
    if nbytes < POOL_MIN or dtype.fields is not None or dtype.subdtype is not None \
            or dtype.hasobject:
        return np.empty(shape, dtype)
    size = block_bytes(nbytes)
    block = HOST.take(size)
    if block is None:
        block = np.empty(size, np.uint8)  # (pages past nbytes are never touched)
    # A view of the array over the lease, not that array: NumPy cannot
    # make an array over a lease writeable again once it is read-only (the
    # lease exports no writeable buffer), so a recording `dsl.Tape` leaves
    # the last array of such a chain writeable; a result watched by a later
    # tape was that array, and a write into it silently changed the
    # gradient.  Its view can be made read-only, and writeable again.
    return np.asarray(Lease(block, shape, dtype))[...]


def release() -> int:
    """Release every free block of every pool (the host's and each GPU's) to
    the system; return the bytes released."""
    return sum(pool.release() for pool in list(POOLS))


def _close() -> None:
    global _open
    _open = False


# Every pool's lock is held across a fork (by the forking thread), so no
# other thread is inside a pool's bookkeeping then; the child, where that
# thread's hold would never end, gets fresh locks.
_held_across_fork: list[FreeBlocks] = []


def _before_fork() -> None:
    _held_across_fork[:] = list(POOLS)
    for pool in _held_across_fork:
        pool._lock.acquire()


def _after_fork_in_parent() -> None:
    for pool in _held_across_fork:
        pool._lock.release()
    _held_across_fork.clear()


def _after_fork_in_child() -> None:
    for pool in _held_across_fork:
        pool._lock = threading.RLock()
    _held_across_fork.clear()


atexit.register(_close)
if hasattr(os, "register_at_fork"):  # (POSIX)
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
