"""The tapes recording on this thread, and the arrays their calls return.

Contract: `active_tapes()` is the (mutable) stack `dsl.Tape` pushes on
entry and pops on exit (also `THREAD.tapes`, for a caller that reads it on
every call); `recording_tapes(arrays)` is the tapes that must
record a call on these arrays; `record(...)` records a call on them and
returns its float NumPy outputs as `TapeArray`s.  It lives in the
runtime, apart from `dsl.tape`, so that every compiled function (a loaded
one, or one of a `gradc compile` module, which never imports dsl) can ask
whether to record without importing the Tape, which itself builds on
compiled functions.

A tape sees only compiled calls, so NumPy work between them would drop out
of its gradient without a word.  A `TapeArray` is an ndarray that remembers
which tapes tracked the arrays it was computed from: every NumPy operation
on one (ufuncs, reductions, NumPy functions, indexing, views and methods)
returns a `TapeArray` again (a float scalar as a 0-d one), which no tape
tracks.  `recording_tapes` raises `TapeError` when such a derived float
array reaches a call while a tape it came from is still recording, and
NumPy writing into an array a recording tape tracks (`y += 1`, `y[0] = 0`,
through a view of it (`np.ravel(y)` included), by an in-place method such as `y.fill(0)`, a
function writing its first argument such as `np.copyto(y, v)` or `np.add.at(y, i, v)`, or
through `y.flat`), or writing
a derived value into a plain array (`out=`, `np.copyto(plain, y)`), raises
too.  A watched array is the caller's plain ndarray, which NumPy cannot
mark; a view of it (`x[::2]`, `x.reshape(...)`) reaching a call while the
tape records raises `TapeError` as a derived array does, and so does a
list or tuple holding an array a recording tape follows, where a call or
a module param would take a copy of it (`followed_by_a_tape`).
Leaving NumPy on purpose (`np.asarray(y)`, `float(y)`) makes a constant.
`make_read_only` and `restore_writeable` turn a tracked array's memory
read-only while its tape records (`dsl.Tape`), which stops the writes
NumPy makes past a `TapeArray` (through a plain view, a method's `out=`).
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Iterable, Sequence

import numpy as np

from gradlang.runtime.errors import GradError



class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.tapes: list[Any] = []


THREAD = _ThreadState()  # this thread's recording state


class TapeError(GradError, RuntimeError):
    """A Tape used out of order, or given what it cannot differentiate."""


def active_tapes() -> list[Any]:
    return THREAD.tapes


def followed_by_a_tape(value: Any) -> bool:
    """Whether a tape recording on this thread follows `value` (a float
    array): it tracks it (a watched array, a recorded call's result), or
    value was computed with NumPy from one it tracks (a derived
    `TapeArray`), or it is a view of one it watches.  A copy of its values
    (a list holding it, as a call converts it) is then a constant to the
    tape, which the gradient would silently not follow."""
    recording = [t for t in THREAD.tapes if t._recording]
    if not recording or not isinstance(value, np.ndarray) or value.dtype.kind != "f":
        return False
    if isinstance(value, TapeArray) and any(t in recording for t in _live(value._tapes)):
        return True
    return any(t.tracks(value) or t.watches_memory_of(value) for t in recording)


def recording_tapes(arrays: Iterable[Any]) -> list[Any]:
    tapes = active_tapes()
    if not tapes:
        return []
    arrays = list(arrays)
    for a in arrays:
        if isinstance(a, TapeArray) and a.dtype.kind == "f":
            for tape in _live(a._tapes):
                if tape._recording and not tape.tracks(a):
                    raise TapeError(
                        "an argument was computed with NumPy from arrays this tape tracks; "
                        "the tape records only calls of compiled functions, so its gradient "
                        "would miss that computation: write it in the .grad module, or pass "
                        "np.asarray(...) of it to make it a constant on purpose")
        elif type(a) is np.ndarray and a.dtype.kind == "f":
            # a view of a watched array (the caller's plain ndarray, which no
            # NumPy operation marks): a constant to the tape, so the gradient
            # through it would silently not reach the watched array
            for tape in tapes:
                if tape._recording and not tape.tracks(a) and tape.watches_memory_of(a):
                    raise TapeError(
                        "an argument is a view of an array this tape watches (such as "
                        "x[::2] or x.reshape(...) of a watched x), which the tape cannot "
                        "follow to it: pass the watched array and index or reshape it in the "
                        ".grad module, or pass np.array(...) of the view to make it a "
                        "constant on purpose")
    return [t for t in tapes if t._recording and any(t.tracks(a) for a in arrays)]


def record(tapes: Sequence[Any], function, bound: dict, outs: Sequence[Any],
           pullback) -> tuple:
    """Record a call on `tapes`; its outputs, float NumPy ones as
    `TapeArray`s remembering these tapes."""
    refs = frozenset(weakref.ref(t) for t in tapes)
    outs = tuple(_derived(o, refs) if isinstance(o, np.ndarray) and o.dtype.kind == "f"
                 else o for o in outs)
    for tape in tapes:
        tape.record(function, bound, outs, pullback)
    return outs


class TapeArray(np.ndarray):
    """An ndarray computed under a tape; see the module docstring."""

    _tapes: frozenset = frozenset()  # weak references to the tapes
    bind_as_is = True  # arguments stay themselves (`runtime.args.convert`)

    def __array_finalize__(self, obj) -> None:
        self._tapes = getattr(obj, "_tapes", frozenset())

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        tapes = _tapes_in(inputs)
        if out is not None:
            _check_write(out, tapes)
            kwargs["out"] = _plain(out)
        if method == "at":  # (`np.add.at(y, ids, v)` writes into its first input)
            _check_write(inputs[0], tapes)
        result = getattr(ufunc, method)(*_plain(inputs), **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _derived(result, tapes)

    def __array_function__(self, func, types, args, kwargs):
        tapes = _tapes_in((args, kwargs))
        out = kwargs.get("out")  # (out=None is no out: the result is derived)
        if out is not None:
            _check_write(out, tapes)
        if func in _WRITE_FIRST and args:
            _check_write(args[0], tapes)
        result = super().__array_function__(func, types, _plain(args), _plain(kwargs))
        if result is NotImplemented:
            return result
        if out is not None:
            # NumPy returns `out` itself, not the plain view it was given
            return out if isinstance(out, np.ndarray) else result
        return _derived(result, tapes)

    def __getitem__(self, index):
        return _derived(super().__getitem__(index), self._tapes)

    def __setitem__(self, index, value) -> None:
        _check_write(self, _tapes_in(value))
        super().__setitem__(index, _plain(value))

    # the methods that write into the array itself
    def fill(self, value) -> None:
        _check_write(self, _tapes_in(value))
        super().fill(_plain(value))

    def sort(self, *args, **kwargs) -> None:
        _check_write(self, self._tapes)
        super().sort(*args, **kwargs)

    def partition(self, *args, **kwargs) -> None:
        _check_write(self, self._tapes)
        super().partition(*args, **kwargs)

    def put(self, indices, values, *args, **kwargs) -> None:
        _check_write(self, _tapes_in(values))
        super().put(indices, _plain(values), *args, **kwargs)

    def setfield(self, value, *args, **kwargs) -> None:
        _check_write(self, _tapes_in(value))
        super().setfield(_plain(value), *args, **kwargs)

    def byteswap(self, inplace: bool = False):
        if inplace:
            _check_write(self, self._tapes)
        return super().byteswap(inplace)

    # NumPy's flat iterator writes past `__setitem__` (`y.flat[0] = 0`,
    # `y.flat = 0`): it changed y without a word, and its gradient
    @property
    def flat(self) -> "_CheckedFlat":
        return _CheckedFlat(self)

    @flat.setter
    def flat(self, value) -> None:
        _check_write(self, _tapes_in(value))
        self.view(np.ndarray).flat = _plain(value)


class _CheckedFlat:
    """`y.flat` of a `TapeArray` y: NumPy's iterator over y (reads, and
    its other attributes, as they are), its writes checked as `y[i] = v`."""
    __slots__ = ("_array", "_flat")

    def __init__(self, array: TapeArray):
        self._array = array
        self._flat = np.ndarray.flat.__get__(array)

    def __setitem__(self, index, value) -> None:
        _check_write(self._array, _tapes_in(value))
        self._flat[index] = _plain(value)

    def __getitem__(self, index):
        return self._flat[index]

    def __iter__(self):
        return self._flat

    def __next__(self):
        return next(self._flat)

    def __len__(self) -> int:
        return len(self._flat)

    def __array__(self, *args, **kwargs):
        return self._flat.__array__(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._flat, name)


# NumPy functions that write into their first argument
_WRITE_FIRST = frozenset({np.copyto, np.place, np.putmask, np.put, np.put_along_axis,
                          np.fill_diagonal})


def derived_from(a: Any) -> list[Any]:
    """The live tapes whose tracked arrays NumPy computed `a` from."""
    return _live(a._tapes) if isinstance(a, TapeArray) else []


def _live(refs: frozenset) -> list[Any]:
    return [t for t in (r() for r in refs) if t is not None]


def _tapes_in(obj) -> frozenset:
    if isinstance(obj, TapeArray):
        return obj._tapes
    if isinstance(obj, (tuple, list)):
        return frozenset().union(*map(_tapes_in, obj))
    if isinstance(obj, dict):
        return _tapes_in(list(obj.values()))
    return frozenset()


def _plain(obj):
    """`obj` with every TapeArray in it as a plain ndarray view."""
    if isinstance(obj, TapeArray):
        return obj.view(np.ndarray)
    if isinstance(obj, (tuple, list)):
        return type(obj)(map(_plain, obj))
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def _derived(result, tapes: frozenset):
    """NumPy's result, marked as computed from arrays of `tapes`."""
    if not tapes:
        return result
    if isinstance(result, np.ndarray):
        marked = result if isinstance(result, TapeArray) else result.view(TapeArray)
        marked._tapes = tapes
        return marked
    if isinstance(result, np.floating):
        return _derived(np.asarray(result), tapes)
    if isinstance(result, (tuple, list)):
        return type(result)(_derived(r, tapes) for r in result)
    return result


def memory_owner(a: np.ndarray) -> Any:
    """The object that owns `a`'s memory: the end of its chain of bases
    (an array, or the buffer an array was made from)."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a


def _tracked_by_recording(a: "TapeArray") -> bool:
    """Whether writing into `a` writes into an array a recording tape
    tracks: `a` itself or one it shares memory with (`y[:2]`, and
    `np.ravel(y)`, whose chain of bases passes through plain arrays)."""
    return any(t._recording and t.tracks_memory_of(a) for t in _live(a._tapes))


def _check_write(target, tapes: frozenset) -> None:
    """NumPy is about to write into `target` (values computed from arrays
    of `tapes`): refuse if a recording tape would not see it, else mark."""
    for o in target if isinstance(target, tuple) else (target,):
        if isinstance(o, TapeArray):
            if _tracked_by_recording(o):
                raise TapeError("an array a recording tape tracks was modified in place; "
                                "its recorded calls would give wrong gradients")
            o._tapes = o._tapes | tapes
        elif o is not None and any(t._recording for t in _live(tapes)):
            raise TapeError("NumPy wrote values computed from tracked arrays into a plain "
                            "array, where the tape cannot follow them")


# The arrays some recording tape made read-only, by id: [array, holds].  Why
# counted: memory is shared by every tape and thread, and a tape that found
# an array read-only because another tape froze it (an inner tape watching
# it first, or a tape in another thread) left it alone; the freezing tape's
# exit made it writeable while the other still recorded, and a write then
# silently changed its gradient.  The flag comes back with the last hold.
_READ_ONLY: dict[int, list] = {}
_READ_ONLY_LOCK = threading.Lock()


def make_read_only(a: np.ndarray) -> list[np.ndarray]:
    """Turn off `writeable` on `a` and on the arrays of its chain of bases;
    return those it holds read-only (for `restore_writeable`), views before
    their bases: those it changed, and those another recording tape holds.
    Why the chain:
    NumPy copies the flag into a view only as the view is made, so a write
    through `a`'s base (`y.base`, or a view of it) passed every check on
    `a`; with the chain read-only, every view made from now on
    (`np.ascontiguousarray(y)`, `y.__array__()`, an `out=` or a C routine
    given one) refuses writes with NumPy's own error.  Views made before
    (a sibling of `a` on the same base) keep their flag: no array knows
    its views.  The last array of a chain ending at an object that exports
    no writeable buffer (the runtime pool's `Lease`, which exports memory
    through `__array_interface__`; a torch tensor) stays writeable: NumPy
    cannot ask that object whether its memory is, so it would refuse to
    make that array writeable again, and the views over it only while it
    is writeable."""
    chain = []
    while isinstance(a, np.ndarray):
        chain.append(a)
        a = a.base
    if a is not None and not _exports_writeable_memory(a) and \
            not chain.pop().flags.writeable:
        return []  # (read-only already: nothing over it could be writeable again)
    held = []
    with _READ_ONLY_LOCK:
        for b in chain:
            hold = _READ_ONLY.get(id(b))  # (an id is unique while its array is held)
            if hold is not None:
                hold[1] += 1
            elif b.flags.writeable:
                b.flags.writeable = False
                _READ_ONLY[id(b)] = [b, 1]
            else:
                continue  # (the caller's own read-only array: left as it is)
            held.append(b)
    return held


def restore_writeable(arrays: Sequence[np.ndarray]) -> None:
    """Let go of the holds `make_read_only` gave; make writeable again the
    arrays no other tape holds (bases first: NumPy lets a view be
    writeable only over writeable memory)."""
    with _READ_ONLY_LOCK:
        for a in reversed(arrays):
            hold = _READ_ONLY[id(a)]
            hold[1] -= 1
            if hold[1]:
                continue
            del _READ_ONLY[id(a)]
            try:
                a.flags.writeable = True
            except ValueError:
                # (its memory made read-only since by the caller, through a base
                # the tape did not change: left as the caller made it, and the
                # rest restored, rather than an error hiding the block's own)
                pass


def _exports_writeable_memory(owner: Any) -> bool:
    """Whether `owner`, the end of an array's chain of bases, exports its
    memory as a writeable buffer (a `bytearray` does; the pool's `Lease`,
    exporting it only through `__array_interface__`, does not, nor does a
    torch tensor under its `.numpy()`)."""
    try:
        return not memoryview(owner).readonly
    except TypeError:
        return False
