"""The backward half of a vjp, shared by loaded and ahead-of-time
compiled functions.

Contract: a `Pullback` holds the values its backward program reads (the
residuals of a split forward pass, or an AOT module's arguments) and maps
one cotangent per output (or a tuple of them) to one cotangent per argument (None for the
const and non-float ones); cotangents are validated against the outputs'
shapes and dtypes (`ArgumentError`) before the program runs, one given on
the host by `host_cotangent` (which the Dask pullback shares).  Output
types are anything with a `.shape` of ints and a `.dtype` name (`"f64"`):
the compiler's `TensorType`, or `OutType` here.  A pullback does not
pickle (a `TypeError`): its program is this process's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from gradlang.runtime.args import NUMPY, SUPPORTED, cast, numeric_array
from gradlang.runtime.boundary import user_facing
from gradlang.runtime.errors import ArgumentError, called
from gradlang.runtime.target import Target


@dataclass(frozen=True)
class OutType:
    shape: tuple[int, ...]
    dtype: str


class Pullback:
    """The backward half of `vjp`: holds the residuals, maps output
    cotangents to one cotangent per argument (None for non-float ones)."""

    def __init__(self, name: str, program: Callable, residuals: Sequence[np.ndarray],
                 out_types: Sequence, arg_names: Sequence[str],
                 float_args: Sequence[str], target: Target, host_results: bool = False,
                 about: Any = None):
        self.name = name
        # the function whose vjp it is: its definition is where a bad
        # cotangent's error points (`span`, `error_sources`)
        self._about = about
        self.target = target
        self.host_results = host_results  # a device target's cotangents come back to NumPy
        self._program = program
        self._residuals = tuple(residuals)
        self._out_types = tuple(out_types)
        self._arg_names = tuple(arg_names)
        self._float_args = tuple(float_args)

    def __reduce__(self):
        raise TypeError(f"cannot pickle the pullback of {called(self.name)}: it holds one call's "
                        "residuals and its compiled backward program, which stay in this "
                        "process; pickle the function and take its vjp where it is unpickled")

    @property
    def span(self):
        return getattr(self._about, "span", None)

    def error_sources(self) -> tuple:
        sources = getattr(self._about, "error_sources", None)
        return sources() if callable(sources) else ()

    @property
    def residual_bytes(self) -> int:
        return sum(r.nbytes for r in self._residuals)

    @property
    def residuals(self) -> tuple:
        """The arrays the backward program reads besides the cotangents."""
        return self._residuals

    def _accepted(self, residuals: Sequence) -> tuple:
        if not residuals:  # (a library holding them drops them from the pullback)
            return ()
        what = f"a residual of {called(self.name)}"
        return tuple(self.target.accept(r, what) for r in residuals)

    @user_facing
    def call_reading(self, residuals: Sequence, *cts):
        """This pullback's call, reading `residuals` (arrays equal to its
        own, this target's or any it accepts) in place of its own: a library
        whose autograd keeps the residuals (and frees them when its graph no
        longer needs them) holds them, not the pullback."""
        return self._run(self._accepted(residuals), cts)

    @user_facing
    def __call__(self, *cts):
        return self._run(self._residuals, cts)

    def _run(self, residuals: tuple, cts: tuple) -> tuple:
        cts = output_cotangents(self.name, cts, len(self._out_types))
        arrays = list(cts)
        for k, (ct, t) in enumerate(zip(cts, self._out_types)):
            if type(ct) is np.ndarray and ct.shape == t.shape and ct.dtype == NUMPY[t.dtype] \
                    and self.target.is_array(ct):
                continue  # (what host_cotangent and accept would make of it)
            arrays[k] = self._cotangent(k, ct, t)
        grads = self._program(*residuals, *arrays)
        if self.host_results:
            grads = [self.target.to_host(g) for g in grads]
        if len(self._float_args) == len(self._arg_names):
            return tuple(grads)
        grads = iter(grads)
        return tuple(next(grads) if n in self._float_args else None for n in self._arg_names)

    def _cotangent(self, k: int, ct: Any, out: Any) -> Any:
        """Cotangent `k` as the program takes it, for an output of type
        `out`: a target's array of its shape and dtype as it is (a device
        array that is not C-contiguous an `ArgumentError`, as an argument
        is), anything else as `host_cotangent` makes it, on the target."""
        where = f"cotangent {k} of the pullback of {called(self.name)}"
        if ct is None and out.dtype not in ("f32", "f64"):
            # (a bool or integer output takes no cotangent, JAX's float0:
            # None stands for its zeros, where an array was required)
            ct = 0
        if self.target.is_array(ct) and not isinstance(ct, np.ndarray):
            if tuple(ct.shape) != out.shape or np.dtype(ct.dtype) != NUMPY[out.dtype]:
                # (what it is, too: a host array's error says its shape or
                # dtype, and the caller has no other way to see which is off)
                given = SUPPORTED.get(np.dtype(ct.dtype), np.dtype(ct.dtype))
                raise ArgumentError(f"{where} is a device array of shape {list(ct.shape)} and "
                                    f"dtype {given}, but must have shape {list(out.shape)} "
                                    f"and dtype {out.dtype} (the output's: device arrays are "
                                    "taken as they are, without a copy)")
            # (taken without a copy, as an argument is, so refused where
            # not C-contiguous: the drivers' reshapes of one need a copy a
            # GPU's device arrays do not make)
            return self.target.accept(ct, where)
        array = host_cotangent(where, ct, out)
        array = array if array.shape == out.shape else np.full(out.shape, array)
        return self.target.accept(array, where)


def output_cotangents(name: str, cts: tuple, n_outputs: int) -> tuple:
    """A pullback's arguments as one cotangent per output: given so, or,
    for several outputs, as one tuple of them (the structure of the
    outputs, as a JAX user passes it); another count is an `ArgumentError`."""
    if n_outputs != 1 and len(cts) == 1 and type(cts[0]) is tuple \
            and len(cts[0]) == n_outputs:
        cts = cts[0]
    if len(cts) != n_outputs:
        raise ArgumentError(f"pullback of {called(name)} takes {n_outputs} cotangent(s), "
                            f"one per output (or a tuple of them), but {len(cts)} were given")
    return cts


def host_cotangent(where: str, ct: Any, out: Any) -> np.ndarray:
    """The cotangent `ct` (a number, a sequence, a NumPy array) of an
    output of type `out` (a `.shape`, a `.dtype` name) as an array of its
    dtype (a float output's refusing values beyond it) and shape, or a
    0-d one, which stands for every element (each caller fills it in its
    own arrays); another shape is an `ArgumentError` saying `where`."""
    floats = out.dtype in ("f32", "f64")
    # (as_float: a Python integer beyond 64 bits is a float's value, as it
    # is an argument's: 2**70 was "out of range")
    array = numeric_array(where, ct, as_float=floats)
    array = cast(where, array, out.dtype, None) if floats \
        else array.astype(np.dtype(NUMPY[out.dtype]), copy=False)
    if array.shape != tuple(out.shape) and array.ndim:
        raise ArgumentError(f"{where} has shape {list(array.shape)}; the output has shape "
                            f"{list(out.shape)}")
    return array
