"""The one mutable helper of the IR: `Builder` accumulates equations while
a function is constructed, type-checking each through the op table, and
`inline` copies a function's body into a builder.

Contract: `Builder.bind(op, *inputs, **params)` appends one equation whose
output types come from the op table's type rule (`ops.output_types`,
raising `GradError` on a type error) and returns its output;
`function(...)` freezes what was bound into an immutable `Function`.  It
sits above both `ir` and `ops` so that neither imports the other's
dependents.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Union

from gradlang.compiler.ir import INTS, Atom, Eqn, Function, Lit, TensorType, Var, WeakVar
from gradlang.compiler.ops import output_types
from gradlang.runtime.args import MAX_RANK, NUMPY
from gradlang.runtime.common import MAX_SIZE, counted_bytes
from gradlang.runtime.errors import GradError, SizeOverflowError, Span


class Builder:
    """Accumulates equations; `bind` type-checks through the op table."""

    def __init__(self, outer: "Builder | None" = None) -> None:
        self.eqns: list[Eqn] = []
        self.outer = outer  # a loop body's: the builder of the values it reads from outside
        # a loop body's: what each carried parameter (by id) starts as
        self.starts: dict[int, object] = {}

    def defining(self, v: Var) -> "Eqn | None":
        """The equation that made v, here or in an outer builder (None for a
        parameter)."""
        b: "Builder | None" = self
        while b is not None:
            eqn = next((e for e in reversed(b.eqns) if any(o is v for o in e.outputs)), None)
            if eqn is not None:
                return eqn
            b = b.outer
        return None

    def computed_from(self, v: Var, sources: Iterable[object]) -> bool:
        """Whether v is one of `sources` or is computed (here or in an outer
        builder) from one: a loop body's carried parameter from what it
        starts as (what a later trip makes it is not known while its body
        is lowered)."""
        wanted = {id(s) for s in sources}
        made_from: dict[int, tuple] = {}
        b: "Builder | None" = self
        while b is not None:
            for eqn in b.eqns:
                made_from.update((id(o), eqn.inputs) for o in eqn.outputs)
            made_from.update((p, (start,)) for p, start in b.starts.items())
            b = b.outer
        seen: set[int] = set()
        stack: list[object] = [v]
        while stack:
            a = stack.pop()
            if id(a) in wanted:
                return True
            if id(a) in seen or id(a) not in made_from:
                continue
            seen.add(id(a))
            stack.extend(i for i in made_from[id(a)] if isinstance(i, Var))
        return False

    def bind(self, op: str, *inputs: Atom, span: Span | None = None,
             hint: str = "", weak: bool = False, **params: Any) -> Var:
        """`weak`: the output is a `WeakVar` (see there)."""
        (out,) = self.bind_multi(op, *inputs, span=span, hint=hint, weak=weak, **params)
        return out

    def bind_multi(self, op: str, *inputs: Atom, span: Span | None = None,
                   hint: str = "", weak: bool = False, **params: Any) -> tuple[Var, ...]:
        items = tuple(sorted((k, _plain(v)) for k, v in params.items()))
        out_types = output_types(op, [a.type for a in inputs], items, span)
        for t in out_types:
            _check_addressable(t, span)
        outs = tuple((WeakVar if weak else Var)(t, hint) for t in out_types)
        self.eqns.append(Eqn(op, tuple(inputs), outs, items, span))
        return outs

    def weaken(self, v: Var) -> WeakVar:
        """`v`, the one output of the equation bound last, as a WeakVar."""
        eqn = self.eqns[-1]
        if eqn.outputs != (v,):
            raise ValueError("internal: only the last equation's output can be weakened")
        weak = WeakVar(v.type, v.hint)
        self.eqns[-1] = Eqn(eqn.op, eqn.inputs, (weak,), eqn.params, eqn.span)
        return weak

    def lit(self, value: Union[int, float, bool], dtype: str,
            span: Span | None = None) -> Lit:
        return Lit(coerce(value, dtype, span), TensorType(dtype, ()))

    def function(self, name: str, params: Iterable[Var],
                 outputs: Iterable[Atom]) -> Function:
        return Function(name, tuple(params), tuple(self.eqns), tuple(outputs))


def _plain(value: Any) -> Any:
    """A param as the IR holds it: a compile-time number that lowering
    marks by its class (`values.RunTimeInt`, `ArgumentValue`: a shape or
    an axis from an integer argument) as the plain int or float it is, in
    tuples too, so that the IR's types and params hold no lowering's
    values (`type(d) is int` for a size, as the torch bridge asks)."""
    if type(value) is tuple:
        return tuple(_plain(v) for v in value)
    if isinstance(value, int) and not isinstance(value, bool) and type(value) is not int:
        return int(value)
    if isinstance(value, float) and type(value) is not float:
        return float(value)
    return value


def _check_addressable(t: TensorType, span: Span | None) -> None:
    """A value no memory could hold (`broadcast_to(x, [2**62, 3])`, a
    product broadcasting two long axes) is an error where the program makes
    it: NumPy's allocation of it, or a loop's index over it, would overflow.
    (A size given by an integer argument's value, as `segment_sum`'s count
    may be, is checked here too: the program is compiled for that value as
    for a `const` argument's.)  So is one of more axes than NumPy's arrays
    have (`reshape(x, (1,) * 100 + x.shape)`: NumPy's ValueError at run
    time).  The first is a `SizeOverflowError` (an `ArgumentError`), as
    the driver's refusal of such an array is: such a size almost always
    comes from an argument, its value (`segment_sum(v, ids, 2**62)`) or
    its shape, though one written in the source is refused the same way."""
    if len(t.shape) > MAX_RANK:
        raise GradError(f"a value of {len(t.shape)} axes: an array has at most {MAX_RANK} "
                        "(NumPy's limit)", span)
    if all(isinstance(d, int) for d in t.shape) and \
            counted_bytes(t.shape, NUMPY[t.dtype].itemsize) > MAX_SIZE:
        if t.size == 0:  # (NumPy multiplies its other axes all the same)
            raise SizeOverflowError(f"a value of type {t} is empty, but the sizes of its other "
                                    "axes multiply beyond what an array can count", span)
        raise SizeOverflowError(f"a value of type {t} needs more memory than can be addressed",
                                span)


_INT_BITS = {"i32": 32, "i64": 64}
_FLOAT_MAX = {"f32": 3.4028234663852886e38, "f64": 1.7976931348623157e308}


def fit_constant(value: Union[int, float, bool], dtype: str, what: str,
                 span: Span | None = None) -> Union[int, float, bool]:
    """A compile-time number as a value of `dtype`, as a parameter's default
    and an annotated function's compile-time result take it: an int is a
    value of every numeric dtype (`1` is 1.0 for f64), a float only of the
    floats, a bool only of bool.  Anything else is a `GradError` at `span`
    saying that `what` is not a value of the dtype; so is a value the
    dtype cannot hold (`coerce`)."""
    wanted = bool if dtype == "bool" else int if dtype in INTS else (int, float)
    if isinstance(value, bool) != (dtype == "bool") or not isinstance(value, wanted):
        raise GradError(f"{what} is not a value of its dtype {dtype}", span)
    return coerce(value, dtype, span)


def parameter_number(value: Union[int, float, bool], dtype: str, where: str,
                     span: Span | None = None) -> Union[int, float, bool]:
    """A compile-time number bound to a parameter annotated with `dtype`
    (its default, or a number a calling function writes) as a value of
    that dtype, taken as the same number passed from Python is
    (`runtime.args.bind`), so that a parameter takes the same numbers
    however its value comes: a bool takes 0 and 1 (1.0 too), an integer
    a whole float (2.0 is 2) but not a bool (NumPy refuses one as an
    axis or a size), a float any number (True is 1.0).  Anything else is
    a `GradError` at `span`, with the message `bind` gives (`where` names
    the value); so is a value the dtype cannot hold (`coerce`)."""
    if dtype in INTS and isinstance(value, bool):
        raise GradError(f"{where} is a bool ({value}), but its annotation says {dtype}: "
                        "pass an integer", span)
    if dtype not in INTS and dtype != "bool":
        return coerce(float(value) if isinstance(value, bool) else value, dtype, span)
    if isinstance(value, float) and not value.is_integer():  # (inf and NaN too)
        raise GradError(f"{where} must hold {dtype} values (whole numbers), not {value!r}",
                        span)
    if dtype == "bool" and value not in (0, 1):
        raise GradError(f"{where} must hold bool values (0 or 1), not {value!r}", span)
    return coerce(value, dtype, span)


def coerce(value: Union[int, float, bool], dtype: str,
           span: Span | None = None) -> Union[int, float, bool]:
    """A compile-time number as a Python scalar of `dtype` (for f32, the
    nearest f32); a `GradError` at `span` when it does not fit (an integer
    out of range, a NaN or infinity meant for an integer, a finite number
    beyond the float's range), since NumPy and Numba would raise on it or
    silently wrap or round it to inf."""
    if dtype == "bool":
        return bool(value)
    if dtype in INTS:
        bits = _INT_BITS[dtype]
        if isinstance(value, float) and not math.isfinite(value):
            raise GradError(f"{value} cannot be stored in {dtype}", span)
        result = int(value)
        if not -2 ** (bits - 1) <= result < 2 ** (bits - 1):
            raise GradError(f"the constant {_short(value)} does not fit in {dtype}", span)
        return result
    try:
        result = float(value)
    except OverflowError:
        result = math.inf
    finite = isinstance(value, int) or math.isfinite(value)
    if finite and abs(result) > _FLOAT_MAX[dtype]:
        raise GradError(f"the constant {_short(value)} is beyond the range of {dtype}", span)
    # an f32's value is the nearest f32 (0.1 is 0.100000001...): what a
    # cast of it to f64 then carries, as NumPy's float64(float32(0.1)) does
    return float(NUMPY[dtype].type(result)) if dtype == "f32" else result


def _short(value: Union[int, float]) -> str:
    # str() of a huge int is slow, and refused past 4300 digits
    if isinstance(value, int) and value.bit_length() > 200:
        return f"{'-' if value < 0 else ''}(about 10**{int(value.bit_length() * 0.30103)})"
    return str(value)


def inline(builder: Builder, fn: Function, args: Iterable[Atom]) -> list[Atom]:
    """Append a copy of `fn`'s body to `builder` with fresh output vars,
    substituting `args` for its parameters; return its outputs."""
    env: dict[Var, Atom] = dict(zip(fn.params, args, strict=True))

    def sub(a: Atom) -> Atom:
        return env.get(a, a) if isinstance(a, Var) else a

    for eqn in fn.eqns:
        outs = tuple(Var(v.type, v.hint) for v in eqn.outputs)
        env.update(zip(eqn.outputs, outs))
        builder.eqns.append(Eqn(eqn.op, tuple(sub(a) for a in eqn.inputs),
                                outs, eqn.params, eqn.span))
    return [sub(a) for a in fn.outputs]
