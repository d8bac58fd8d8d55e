"""The tapes recording on this thread, innermost last.

Contract: `active_tapes()` is the (mutable) stack `dsl.Tape` pushes on
entry and pops on exit; `recording_tapes(arrays)` is the tapes that must
record a call on these arrays.  It lives apart from `dsl.tape` so that
compiled functions can ask whether to record without importing the Tape,
which itself builds on compiled functions.
"""
from __future__ import annotations

import threading
from typing import Any, Iterable

_state = threading.local()


def active_tapes() -> list[Any]:
    if not hasattr(_state, "tapes"):
        _state.tapes = []
    return _state.tapes


def recording_tapes(arrays: Iterable[Any]) -> list[Any]:
    tapes = active_tapes()
    if not tapes:
        return []
    arrays = list(arrays)
    return [t for t in tapes if t._recording and any(t.tracks(a) for a in arrays)]
