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

An array too large to make (`ArrayTooLarge`, which a driver raises
knowing the array but not the function's name) leaves each boundary named
as the call it passed through (`about`'s name: the outermost one's stays,
`jacfwd(f)` rather than its stacked program's), at the function's
definition where it has no place of its own.  A `MemoryError` leaving a
call (an allocation that failed: NumPy's, a device's) leaves as the
`AllocationError` that says so (`runtime.common.out_of_memory`); nothing
else is converted, so a bug of gradlang's is not passed off as the user's.

An `ArgumentError` leaving a boundary without a place gets the
definition of the function the call was about (its `span`), as such
errors point there.  An error leaving a boundary also gets the text of
the file its span names,
for its caret line, when it has none yet (a runtime argument error points
at a function's definition, and the runtime holds no source): from the
decorated call's first argument, a method's `self` or a transform's
function, when that defines `error_sources()`, its (file, text) pairs.
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable, TypeVar

from gradlang.runtime.common import out_of_memory
from gradlang.runtime.errors import (UNKNOWN_SPAN, ArgumentError, GradError, RaisedByDriver,
                                     called)

F = TypeVar("F", bound=Callable)


def full_tracebacks() -> bool:
    return os.environ.get("GRADC_FULL_TRACEBACK", "") not in ("", "0")


def leaving(err: GradError, about: Any = None) -> GradError:
    """`err` made ready to leave a boundary: `raise leaving(err)` in the
    boundary's `except GradError` shows the frames from there up (for a hot
    entry point that cannot afford the decorator's extra call).  `about`:
    what the call was about (see the module's contract), for the source."""
    name = getattr(about, "name", None)
    if isinstance(err, RaisedByDriver) and isinstance(name, str):
        err.about_call(called(name), getattr(about, "span", None))
    elif isinstance(err, ArgumentError) and err.span is UNKNOWN_SPAN:
        # (an argument error's place is the function's definition)
        err.span = getattr(about, "span", None) or UNKNOWN_SPAN
    if err.source is None:
        sources = getattr(about, "error_sources", None)
        if callable(sources):
            text = dict(sources()).get(err.span.file)
            if text is not None:
                err.with_source(text)
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
            raise leaving(err, args[0] if args else None)
        except MemoryError as err:
            raise leaving(out_of_memory(err), args[0] if args else None)
    return entry  # type: ignore[return-value]
