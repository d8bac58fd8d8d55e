"""Locks that a fork leaves usable in the child.

Contract: `ChildSafeLock()` is a lock (a context manager; re-entrant with
`reentrant=True`) that a process forked while another thread held it
finds free, and that an exception raised by a signal's handler (a Ctrl-C)
as a `with` takes it never leaves held (`with lock as x` gives x no
meaning).  What one guards must be whole between any two steps of the
thread that holds it (an entry stored once it is complete): the child
sees it as that thread left it, and does the rest again itself.

Numba's compiler lock guards much more (its typing and target contexts,
changed all through a compile), so instead of freeing it in the child, a
fork waits for it: the forking thread takes it before the fork and
releases it after, in both processes.  A fork made while another thread
compiles therefore waits for that compile to end.  It is taken before
`memory`'s pool lock (whose hook `os.register_at_fork` runs later, having
registered it first), since a thread that compiles may free a pooled
array, while one inside the pool never compiles.

`cached_attribute` is `functools.cached_property` without its lock (as
Python 3.12 has it): on 3.10 and 3.11 that lock is one per property, for
every instance of the class, held while a value is worked out (a
program's IR, a call's compiled program), so a child forked meanwhile
waited for ever at its first use of the property on any instance.  Two
threads may work one value out at once; both get the one stored first.

Why: a forked child runs only the thread that forked, so a lock another
thread held at the fork is never released there.  A `multiprocessing`
worker or a PyTorch `DataLoader` worker forked while a thread of its parent
compiled waited for ever at its own first call.
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Callable

from numba.core.compiler_lock import global_compiler_lock

from gradlang.runtime import memory  # noqa: F401 (its fork hook registered before ours)

_LOCKS: "weakref.WeakSet[ChildSafeLock]" = weakref.WeakSet()


class ChildSafeLock:
    """A lock made anew in a forked child (module docstring)."""
    __slots__ = ("_lock", "_reentrant", "__weakref__")

    def __init__(self, reentrant: bool = False):
        self._reentrant = reentrant
        self._lock = threading.RLock() if reentrant else threading.Lock()
        _LOCKS.add(self)

    # `with` runs the lock's own (C) methods: no line of Python runs
    # between its taking the lock and the block's start, where a Ctrl-C's
    # handler could raise (as it did after a Python `__enter__`'s acquire:
    # `__exit__` never ran, and every other thread waited for ever).
    @property
    def __enter__(self) -> Callable[[], bool]:
        return self._lock.__enter__

    @property
    def __exit__(self) -> Callable[..., None]:
        return self._lock.__exit__


class cached_attribute:
    """A property worked out at its first use and stored on the instance
    (module docstring)."""

    def __init__(self, compute: Callable[[Any], Any]):
        self.compute = compute
        self.__doc__ = compute.__doc__
        self.name = compute.__name__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: "type | None" = None) -> Any:
        if instance is None:
            return self
        # (stored in the instance's __dict__, which Python reads before this)
        return instance.__dict__.setdefault(self.name, self.compute(instance))


def _after_fork_in_child() -> None:
    # the child's only thread is the one that forked, which holds none of
    # them (none is held across a call out of gradlang's own code)
    for lock in list(_LOCKS):
        lock._lock = threading.RLock() if lock._reentrant else threading.Lock()
    global_compiler_lock.release()


if hasattr(os, "register_at_fork"):  # (POSIX)
    os.register_at_fork(before=global_compiler_lock.acquire,
                        after_in_parent=global_compiler_lock.release,
                        after_in_child=_after_fork_in_child)
