"""Python's cyclic garbage collector paused while gradlang compiles.

Contract: inside `collection_paused()` (which nests, and may be entered
from several threads at once) the collector does not run; when the last
one exits, it is enabled again if it was enabled when the first entered.
Reference counting frees what it always frees meanwhile; the cycles a
compile leaves (Numba's IR and typing objects point at each other) wait
for the next collection, which then runs over them once.

Why: a compile allocates a few hundred thousand objects, enough to start
several collections of the oldest generation, each of which walks every
object the process holds (NumPy's, Numba's, lark's and the user's), only
to find the compile's own objects still alive.  In a cold process, the
first gradient of examples/log1pexp.grad spent 52 ms of its 0.29 s of CPU
in collections, and 14 ms of 0.25 s with them paused; dense.grad's loss
53 of 0.42 s against 16 of 0.36, checkpoint.grad's plain 56 of 0.53
against 18 of 0.48 (medians of four interleaved processes, timed by
`gc.callbacks`).  The pause defers no cost: counting the collections of
a next step that allocates 200,000 lists, log1pexp's process spent 135 ms
in them where it spent 166 unpaused.  Only Numba's compiles of kernels
pause it (`loader`); pausing gradlang's own pipeline as well saved
nothing more that could be measured.  A collector the user disabled
stays disabled.
"""
from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

_lock = threading.Lock()
_depth = 0  # compiles inside collection_paused, across threads
_enable_after = False  # whether the collector ran before the first of them


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    global _depth, _enable_after
    with _lock:
        if _depth == 0:
            _enable_after = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _enable_after:
                gc.enable()
