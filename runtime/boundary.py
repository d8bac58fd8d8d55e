"""Where a user's call enters gradlang: its errors leave showing the user's
frames, not the toolchain's.

Contract: a `GradError` (so also `ArgumentError`, `TapeError`) raised
inside a function decorated `@user_facing` leaves it with its traceback
cut at the decorator, so a user sees the line of their own code that made
the call and the message, not the 2-20 frames of binding, lowering and
code generation under it (as JAX filters its tracebacks), and without the
internal exceptions it was raised while handling.  Boundaries nest: the
outermost one a call passes through is the frame shown.
`GRADC_FULL_TRACEBACK=1` keeps everything, for work on gradlang itself.
"""
from __future__ import annotations

import functools
import os
from typing import Callable, TypeVar

from gradlang.runtime.errors import GradError

F = TypeVar("F", bound=Callable)


def full_tracebacks() -> bool:
    return os.environ.get("GRADC_FULL_TRACEBACK", "") not in ("", "0")


def leaving(err: GradError) -> GradError:
    """`err` made ready to leave a boundary: `raise leaving(err)` in the
    boundary's `except GradError` shows the frames from there up (for a hot
    entry point that cannot afford the decorator's extra call)."""
    if full_tracebacks():
        return err
    err.__cause__ = None
    err.__suppress_context__ = True
    return err.with_traceback(None)  # from the raise up: the caller's frames


def user_facing(fn: F) -> F:
    @functools.wraps(fn)
    def entry(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except GradError as err:
            raise leaving(err)
    return entry  # type: ignore[return-value]
