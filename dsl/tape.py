"""`dsl.Tape`: gradients through separately compiled calls made from Python.

Contract:

    with dsl.Tape() as tape:
        tape.watch(x)                  # x: a float NumPy array
        y = m.f(x); z = m.g(y, x)      # calls on watched arrays are recorded
    tape.gradient(z, x)                # d sum(z) / dx, same structure as sources

A call is recorded when one of its arguments is watched or was produced by
a recorded call; it then runs through its split forward pass and keeps a
pullback (the residuals only).  `gradient` sums cotangents over every path
and returns None for a source the target does not depend on.  A tape that
is not `persistent` gives one gradient.  Tapes nest: while an inner tape
computes a gradient inside an outer one, it runs its backward passes as
compiled functions of their own, which the outer tape records, so the outer
tape differentiates the inner gradient (second order, and so on: each
backward pass names its cotangent parameters apart from those of the pass
it differentiates).  Arrays are tracked by identity.

The tape sees only compiled calls.  So that NumPy work between them never
drops silently out of a gradient, float NumPy results of recorded calls
are `TapeArray`s (`runtime.recording`): NumPy operations on them give arrays
marked as derived, and passing one to a compiled call while its tape
records raises `TapeError`, as does modifying a tracked array in place.
NumPy can write past a `TapeArray` (a plain view, `y.base`, a method's
`out=`, a C routine), so while the tape records, the memory of every
array it tracks is read-only (`writeable` off along its chain of bases,
`runtime.recording.make_read_only`): NumPy refuses those writes itself,
and the flags it turned off come back as the `with` block ends (as the
last one's ends, for an array another recording tape tracks too).
Write such work in the `.grad` module, or pass `np.asarray(a)` to use a
value as a constant on purpose.  A watched array is the caller's own
ndarray, which cannot be marked: compute from it only through compiled
calls.  It must be one a call takes as itself (a plain ndarray in native
byte order, or a tape's result): `watch` refuses any other, of which a
call would take a converted copy that the tape could not see; and a view
of it (`x[::2]`) passed to a call while the tape records raises
`TapeError` (the tape would take it for a constant).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, Union

import numpy as np

from dsl.api import loads
from dsl.dask_bridge import is_dask_array
from dsl.function import Compiled, backward_function, flag_option
from gradlang.runtime import target as targets
from gradlang.runtime.boundary import user_facing
from gradlang.runtime.errors import ArgumentError, kind_of
from gradlang.runtime.recording import (TapeError, active_tapes, derived_from, make_read_only,
                                        memory_owner, restore_writeable)
from gradlang.runtime.target import Target, is_device_array


@dataclass
class _Record:
    function: Any  # dsl.function.Compiled
    bound: dict[str, np.ndarray]
    outs: tuple[np.ndarray, ...]
    pullback: Any


class Tape:
    def __init__(self, persistent: bool = False):
        # (Tape("yes") was persistent)
        self.persistent = flag_option(persistent, "Tape", "persistent")
        self._records: list[_Record] = []
        self._tracked: dict[int, np.ndarray] = {}  # id -> array (kept alive)
        # the tracked NumPy arrays by the id of their memory's owner (kept
        # alive by them): views sharing it are found without a scan
        self._by_owner: dict[int, list[np.ndarray]] = {}
        # the arrays this tape made read-only while it records (`_freeze`)
        self._frozen: list[np.ndarray] = []
        self._recording = False
        self._used = False

    def __enter__(self) -> "Tape":
        if self in active_tapes():
            # its calls would be recorded twice, doubling every gradient
            raise TapeError("this Tape is already recording: a `with` block of it is open; "
                            "nest another Tape for a higher order")
        active_tapes().append(self)
        self._recording = True
        for a in self._tracked.values():  # (watched before the `with`)
            self._freeze(a)
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        self._recording = False
        frozen, self._frozen = self._frozen, []
        restore_writeable(frozen)
        if self not in active_tapes():
            # (a tape records in its thread's list: ended elsewhere, it was
            # list.remove's ValueError, with the arrays it froze left so)
            raise TapeError("this Tape's `with` block began in another thread: a tape records "
                            "the calls of the thread it began in, and must end there")
        active_tapes().remove(self)
        if frozen and isinstance(exc, ValueError) and _refused_a_write(exc):
            # NumPy's own error names no tape (it comes from C, unwrapped)
            _add_note(exc, "while a dsl.Tape records, the arrays it tracks (those it "
                           "watches, the results of its calls, and the memory they are "
                           "views of) are read-only: a write into one would silently "
                           "change the gradient; write into a copy (np.array(y)), or "
                           "after the `with` block")

    @user_facing
    def watch(self, *arrays: np.ndarray) -> None:
        for a in arrays:
            if is_dask_array(a):
                raise ArgumentError("Tape.watch() takes float NumPy (or GPU) arrays, not Dask "
                                    "arrays: a call on Dask arrays is lazy, and no tape records "
                                    "it (dsl.grad, dsl.value_and_grad and dsl.vjp run on Dask)")
            if not (isinstance(a, np.ndarray) or is_device_array(a)) or \
                    np.dtype(a.dtype).kind != "f":
                got = f"an array of dtype {np.dtype(a.dtype)}" if _is_array(a) else kind_of(a)
                raise ArgumentError("Tape.watch() takes float NumPy (or GPU) arrays, got "
                                    f"{got}; convert Python numbers with np.asarray(x, "
                                    "dtype=float) first")
            if isinstance(a, np.ndarray) and not _bound_as_itself(a):
                raise ArgumentError("Tape.watch() takes plain NumPy arrays in native byte "
                                    f"order, got {type(a).__name__} of dtype {a.dtype}: a "
                                    "call would take a converted copy, which the tape does "
                                    "not track; watch and pass y = np.asarray(x, float)")
            self._track(a)

    def _track(self, a: Any) -> None:
        self._tracked[id(a)] = a
        if isinstance(a, np.ndarray):
            self._by_owner.setdefault(id(memory_owner(a)), []).append(a)
            if self._recording:
                self._freeze(a)

    def _freeze(self, a: Any) -> None:
        """Make the memory of tracked `a` read-only until the tape stops
        recording.  Why: a write into it (through a plain view, `y.base`,
        `out=`, a C routine: none of which a `TapeArray` sees) changed a
        value a recorded call read or made, and the gradient was silently
        that of the old value.  NumPy's flag refuses every such write
        without a copy; an array already read-only is left as it is, and
        one another recording tape froze (in this thread or another)
        stays read-only until the last tape holding it stops."""
        if isinstance(a, np.ndarray):
            self._frozen.extend(make_read_only(a))

    def tracks(self, a: Any) -> bool:
        # (a sentinel: `.get(id(None))` is None, so None, a const argument's
        # value or a pullback's cotangent, was tracked by every tape)
        return self._tracked.get(id(a), _UNTRACKED) is a

    def tracks_memory_of(self, a: np.ndarray) -> bool:
        """Whether writing into `a` writes into an array this tape tracks
        (a itself, or one sharing its memory: NumPy's view of it, such as
        np.ravel(y), has a base no tape knows)."""
        return any(np.shares_memory(a, b) for b in self._by_owner.get(id(memory_owner(a)), ()))

    def watches_memory_of(self, a: np.ndarray) -> bool:
        """Whether `a` shares memory with an array this tape watches (a
        plain ndarray: the outputs it tracks are `TapeArray`s, a plain view
        of which, `np.asarray(y)`, is a constant on purpose)."""
        return any(type(b) is np.ndarray and np.shares_memory(a, b)
                   for b in self._by_owner.get(id(memory_owner(a)), ()))

    def record(self, function, bound, outs, pullback) -> None:
        self._records.append(_Record(function, dict(bound), tuple(outs), pullback))
        for o in outs:
            if np.dtype(o.dtype).kind == "f":
                self._track(o)

    @user_facing
    def gradient(self, target: np.ndarray,
                 sources: Union[np.ndarray, Sequence[np.ndarray]]):
        single = _is_array(sources)
        if not single and not isinstance(sources, (list, tuple)):
            # (before the tape counts as used: a call with the sources fixed may follow)
            raise ArgumentError("Tape.gradient() takes its sources as an array or a list or "
                                f"tuple of arrays, got {kind_of(sources)}")
        for k, source in enumerate(() if single else sources):
            # (a nested tuple, or a number, was a source the target did not
            # depend on: its gradient None, silently)
            if not _is_array(source):
                raise ArgumentError(f"Tape.gradient()'s sources[{k}] is {kind_of(source)}, not "
                                    "an array: the sources are an array or a flat list or "
                                    "tuple of arrays")
        # (the target too before the tape counts as used: a wrong one, such
        # as the tuple of a call's results, made a non-persistent tape
        # refuse the right one after it)
        self._check_target(target)
        if self._used and not self.persistent:
            raise TapeError("a non-persistent Tape gives one gradient; use "
                            "Tape(persistent=True) for more")
        self._used = True
        source_list = [sources] if single else list(sources)
        outer = [t for t in active_tapes() if t is not self]
        cts: dict[int, np.ndarray] = {id(target): _filled(target, 1)}
        for rec in reversed(self._records):
            out_cts = [cts.get(id(o)) for o in rec.outs]
            if all(c is None for c in out_cts):
                continue
            out_cts = [c if c is not None else _filled(o, 0) for c, o in zip(out_cts, rec.outs)]
            # (a pullback's cotangents: one per argument but those a transform
            # adds, such as a Jacobian's one-hot tangents)
            names = [n for n in rec.bound if n not in getattr(rec.function, "hidden", ())]
            floats = rec.function.differentiable_names(rec.bound)
            if outer:
                # Run the backward pass as a recorded compiled call.
                vjp_fn = _vjp_function(rec.function, len(rec.outs))
                bound = dict(rec.bound)
                bound.update(zip(vjp_fn.ct_names, out_cts))
                grads = dict(zip(floats, vjp_fn.call_bound(bound)))
            else:
                grads = dict(zip(names, rec.pullback(*out_cts)))
            for name in floats:
                arg, g = rec.bound[name], grads.get(name)
                if g is None or not self.tracks(arg):
                    continue
                previous = cts.get(id(arg))
                cts[id(arg)] = g if previous is None else _add(previous, g, bool(outer))
        result = [cts.get(id(s)) for s in source_list]
        return result[0] if single else result

    def _check_target(self, target: Any) -> None:
        """A `TapeError` (an `ArgumentError` for a list or tuple) unless
        `target` is a float result of a call this tape recorded."""
        if self.tracks(target):
            return
        if isinstance(target, (list, tuple)):
            # (it said "not computed by a call recorded on this tape" of the
            # tuple of a function's results)
            raise ArgumentError(f"Tape.gradient() takes one target, an array, got a "
                                f"{type(target).__name__} of {len(target)}: differentiate "
                                "each result alone, or return their sum from the .grad module")
        if _integer_or_bool(target):
            # (a call's integer or bool result is not tracked: it has no gradient)
            raise TapeError(f"the target has dtype {np.dtype(target.dtype).name}: an "
                            "integer or bool result has no gradient; differentiate a float "
                            "result")
        if self in derived_from(target):
            raise TapeError("the target was computed with NumPy from arrays this tape "
                            "tracks (`a + b` of two results); the tape records only calls "
                            "of compiled functions, so its gradient would miss that "
                            "computation: write it in the .grad module")
        raise TapeError("the target was not computed by a call recorded on this tape")


_UNTRACKED = object()  # (`Tape.tracks`)


def _refused_a_write(err: ValueError) -> bool:
    """Whether NumPy's ValueError `err` refused to write into read-only
    memory (its messages: "assignment destination is read-only", "output
    array is read-only", "...must be contiguous, writable, ...", and
    `B.dot(v, out=y)`'s "output array is not acceptable")."""
    text = str(err)
    return any(words in text for words in ("read-only", "writable", "writeable",
                                           "output array is not acceptable"))


def _add_note(err: BaseException, note: str) -> None:
    """`err.add_note(note)` (Python 3.11 on; shown by 3.10's traceback only
    as the attribute it sets)."""
    if hasattr(err, "add_note"):
        err.add_note(note)
    else:
        err.__notes__ = [*getattr(err, "__notes__", ()), note]


def _is_array(value: Any) -> bool:
    """Whether `value` is an array a tape can track (NumPy's, a device's)."""
    return isinstance(value, np.ndarray) or is_device_array(value)


def _integer_or_bool(value: Any) -> bool:
    try:
        return np.dtype(getattr(value, "dtype", "f8")).kind in "biu"
    except TypeError:  # (a dtype NumPy does not know, a torch tensor's: not one of ours)
        return False


def _bound_as_itself(a: np.ndarray) -> bool:
    """Whether a call binds `a` as the object it is (`runtime.args`), so
    that the tape, tracking arrays by identity, sees it: an ndarray of
    native byte order, or a subclass that asks for it (a `TapeArray`)."""
    return a.dtype.isnative and (type(a) is np.ndarray or getattr(a, "bind_as_is", False))


def _vjp_function(f, n_outputs: int):
    if not isinstance(f, Compiled):
        raise TapeError(f"{f.name}() comes from a gradc-compiled module, whose gradients "
                        "are first order: a tape inside another tape cannot differentiate "
                        "them again; load the .grad file with dsl.load for that")
    return backward_function(f, n_outputs)


def _filled(like, value):
    """An array of `value` shaped like `like`, where `like` lives."""
    return _target_of(like).full(tuple(like.shape), value, like.dtype)


def _target_of(array) -> Target:
    """The target whose kernels take `array` where it lives."""
    if isinstance(array, np.ndarray) or not is_device_array(array):
        return targets.get(targets.DEFAULT)
    return next(t for t in map(targets.get, targets.TARGETS) if t.is_array(array))


_ADDERS: dict = {}


def _add(a, b, recorded: bool):
    """Sum of two cotangents; a compiled (so recordable) call inside an
    outer tape or on the GPU, plain NumPy otherwise."""
    target = _target_of(a)
    if not recorded and isinstance(a, np.ndarray):
        return a + b
    if target.name not in _ADDERS:
        _ADDERS[target.name] = loads("def add(a, b):\n    return a + b\n", "<tape>",
                                     target).add
    return _ADDERS[target.name](a, b)
