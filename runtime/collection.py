"""Python's cyclic garbage collector paused while gradlang compiles.

Contract: inside `collection_paused()` (which nests, and may be entered
from several threads at once) the collector does not run; when the last
one exits, it is enabled again if it was enabled when the first entered
(so a `gc.disable()` made meanwhile, from another thread, is undone
then).  A child forked meanwhile keeps only its forking thread's pauses.
Reference counting frees what it always frees meanwhile; the cycles a
compile leaves (Numba's IR and typing objects point at each other) wait
for the next collection, which then runs over them once.

Why: a compile allocates a few hundred thousand objects, enough to start
several collections of the oldest generation, each of which walks every
object the process holds (NumPy's, Numba's, lark's and the user's), only
to find the compile's own objects still alive.  In a cold process, the
first gradient of examples/log1pexp.grad spent 50 ms of its 0.28 s of CPU
in collections, and 14 ms of 0.25 s with them paused; dense.grad's loss
50 of 0.39 s against 17 of 0.36, checkpoint.grad's plain 52 of 0.46
against 15 of 0.44 (`benchmarks/bench_collection.py --rounds 3`, medians).
The pause defers no cost: counting the collections of a next step that
allocates 200,000 lists too, log1pexp's process spent 127 ms in them
where it spent 165 unpaused.  Only Numba's compiles of kernels
pause it (`loader`); pausing gradlang's own pipeline as well saved
nothing more that could be measured.  A collector the user disabled
stays disabled.

`imports_unwalked()` does the same for the imports of the API (Numba,
the compiler: some 300,000 objects, all alive for good): their 130
collections, one of the oldest generation, took 45-60 ms of a warm
process's 270 ms of CPU.  After them, every object of the process joins
the oldest generation without a collection walking it (`gc.freeze()`
then `gc.unfreeze()`), where it would have gone anyway; unless the user
froze objects (Python's permanent generation is theirs then, and left
as it is).
"""
from __future__ import annotations

import contextlib
import gc
import os
import threading
from typing import Iterator

_lock = threading.Lock()
_depths: dict[int, int] = {}  # per thread (its ident), its pauses open now
_enable_after = False  # whether the collector ran before the first of them


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    global _enable_after
    me = threading.get_ident()
    with _lock:
        if not _depths:
            _enable_after = gc.isenabled()
            gc.disable()
        _depths[me] = _depths.get(me, 0) + 1
    try:
        yield
    finally:
        with _lock:
            _depths[me] -= 1
            if not _depths[me]:
                del _depths[me]
            _resume_if_last()


def _resume_if_last() -> None:
    if not _depths and _enable_after:
        gc.enable()


def _after_fork_in_child() -> None:
    """A forked child runs only the thread that forked: the other threads'
    pauses would never end there (nor would a lock one of them held be
    released)."""
    global _lock, _depths
    _lock = threading.Lock()
    me = threading.get_ident()
    _depths = {me: _depths[me]} if me in _depths else {}
    _resume_if_last()


if hasattr(os, "register_at_fork"):  # (not on Windows)
    os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def imports_unwalked() -> Iterator[None]:
    """Imports inside run with the collector paused, and every object the
    process holds then joins the oldest generation unwalked."""
    with collection_paused():
        yield
        if gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
