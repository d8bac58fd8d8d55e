"""Ctrl-C held back while Numba compiles.

Contract: inside `interrupts_deferred()`, entered on the main thread while
SIGINT's handler is a Python function (Python's default raises
`KeyboardInterrupt`), a SIGINT does not interrupt the block: the handler
runs when the block ends, once however many arrived.  Nested, the outermost
block decides.  On another thread (which a SIGINT never interrupts), or
under a handler that is no Python function (ignored, the system's), it
changes nothing.

Why: Numba's compiler reads its typing and target registries through
generators (its `RegistryLoader`'s streams).  A `KeyboardInterrupt` raised
while one of them runs ends it, and every later compile in the process
failed ("generator raised StopIteration"): Ctrl-C pressed during a first
call, in a notebook, left no function to call until the kernel restarted.
A Ctrl-C now waits for the kernel being compiled (a fraction of a second).
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

_pending: list[Any] = []  # the frame each deferred SIGINT arrived in


def _defer(signum: int, frame: Any) -> None:
    _pending.append(frame)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    handler = signal.getsignal(signal.SIGINT)
    if handler is _defer or not callable(handler) or \
            threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.signal(signal.SIGINT, _defer)
    try:
        yield
    finally:
        try:
            signal.signal(signal.SIGINT, handler)
        finally:
            # (taken even where a Ctrl-C pressed again interrupts the line
            # above: else a later block's end raised it a second time)
            frames = _pending[:]
            _pending.clear()
        if frames:
            handler(signal.SIGINT, frames[0])
