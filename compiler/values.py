"""Values during lowering, and the dtype rules of language.md section 4.

Contract: a lowering-time `Value` is either an IR atom (`Var`/`Lit`) or a
compile-time Python value (int, float, bool, or a tuple of values; a list
literal is a `StaticList`, a tuple that remembers its spelling).
`unify` brings operands to one dtype: arrays promote (f32 with f64 gives
f64, any float beats any int), and a compile-time number takes the dtype
of the arrays it meets (`x * 0.2` stays f32), except that a float literal
turns an integer array into f64; so does a `WeakVar` (`arange`'s result).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Optional, Sequence, Union

from gradlang.compiler.builder import Builder, coerce
from gradlang.compiler.ir import FLOATS, Atom, Lit, Var, WeakVar
from gradlang.compiler.shapes import NeedsConcrete, Sym
from gradlang.runtime.common import arange_length
from gradlang.runtime.errors import ArgumentError, GradError, Span


class NotCompileTime(GradError):
    """A value a shape, an axis, a count or a static index or slice bound
    needs when the function is compiled, that is computed at run time
    (`value`).  In a grad block, one computed from the block's upstream
    cotangents is so at every signature (a cotangent is never known when
    compiling): the lowering marks it `of_upstream` (`Lowerer.expr`), and
    the load's check reports it (`pipeline.check_linearity`) where it takes
    other errors for its representative signature's and goes on."""

    def __init__(self, message: str, span: Optional[Span] = None, value: object = None) -> None:
        # (span and value optional: an unpickled error is built from its message, then
        # its attributes are set, as a process pool sends a worker's error back)
        super().__init__(message, span)
        self.value = value
        self.judged = False  # (by the innermost expression it left: its builder has the value)
        self.of_upstream = False


class StaticList(tuple):
    """The value of a list literal `[a, b]`.  Lists mean what tuples mean
    (`stack([a, b])`, shapes, axes, unpacking, indexing), so this is a
    tuple; the type only lets messages name what the user wrote."""


class ArgumentValue(int):
    """The value of an integer argument that the program is compiled for
    (by value, or `const`), as lowering sees it: the same number,
    remembering the argument it came from, so that a count it makes
    negative (`segment_sum(v, ids, k)` with k = -1), or an index it puts
    out of range (`x[i]` for `i: const i64`), is the caller's
    `ArgumentError`, not an error in the source.  Arithmetic on it gives a
    plain int, so only the argument passed on as it is counts as its
    value.  Code that tells numbers apart by their type asks
    `number_type`."""

    name: str

    def __new__(cls, value: int, name: str) -> "ArgumentValue":
        self = super().__new__(cls, value)
        self.name = name
        return self

    def __getnewargs__(self) -> tuple[int, str]:  # (pickle, copy: int's lacks the name)
        return int(self), self.name


class _RunTimeNumber:
    """What `RunTimeInt` and `RunTimeFloat` share: a number (the class's
    other base, `int` or `float`) that carries the dtype of the run-time
    scalar it stands for."""

    dtype: str

    def __new__(cls, value, dtype: str):
        self = super().__new__(cls, value)
        self.dtype = dtype
        return self

    def __getnewargs__(self) -> tuple:  # (pickle, copy: the number's own lack the dtype)
        return super().__getnewargs__() + (self.dtype,)


class RunTimeInt(_RunTimeNumber, int):
    """The value of an integer argument that the program is compiled for
    by value (`builtins.by_value`: one a shape or an axis takes, not
    declared `const`), or integer arithmetic on it, as lowering sees it: a
    compile-time integer standing for a run-time scalar of `dtype` (i64 or
    i32).  Arithmetic that folds it (`lower.Lowerer.run_time_arithmetic`)
    gives what the program computes on that scalar when the argument is
    not taken by value (it wraps around, `1 // k` is 0 for k = 0, `2 **
    -k` is 0), and where it meets arrays it is an array of its dtype, not
    a literal taking theirs: taking an argument by value changes no
    result.  Python's arithmetic on it (the compiler's own: `axis + 1`)
    gives a plain int."""


class RunTimeBool(RunTimeInt):
    """A comparison of by-value arguments' numbers (`k == 1`), as lowering
    sees it: the truth (1 or 0) of the run-time bool scalar it stands for
    (`dtype` "bool"), so that an `if` on it, `and`, `or` and `not` fold as
    a compile-time bool does (only the arm taken is lowered, as a shape
    the argument gives may need), but where it meets arrays or numbers
    it is that bool scalar, not a weakly typed Python bool: arithmetic on
    it is on i64 (`y * ((k == 1) + 1)` is i64 for i32 y), an f64
    parameter refuses it, a `where` between it and True is a bool.
    (Python's bool cannot be subclassed.)"""

    def __new__(cls, value, dtype: str = "bool"):
        return super().__new__(cls, bool(value), "bool")

    def __repr__(self) -> str:  # (as messages quote True)
        return repr(bool(self))


class RunTimeFloat(_RunTimeNumber, float):
    """A float that exact arithmetic on a `RunTimeInt` gave (`k * 0.5`, `k
    / 2`, `1 / k`): the value of the run-time scalar of `dtype` (f64) that
    the same arithmetic computes where the argument is not taken by value,
    as the kernel computes it (`ops.fold`: 1 / 0 is inf), and so a
    `RunTimeInt`'s kin: arithmetic on it folds as the run time's, and where
    it meets arrays it is an array of its dtype (f64 with f32 x); it stays
    a compile-time number (`full_like(x, k * 0.5)`)."""


# compile-time numbers that stand for run-time scalars
RUN_TIME = (RunTimeInt, RunTimeFloat)


def is_run_time(v: object) -> bool:
    """Whether compile-time v stands for a run-time scalar of a dtype: a
    `RunTimeInt` or `RunTimeFloat`, or a size that a by-value argument's
    number multiplied (`x.shape[0] * k`: a `Sym` with a dtype)."""
    return isinstance(v, RUN_TIME) or isinstance(v, Sym) and v.dtype is not None


def run_time_product(size: Union[int, Sym], dtype: str) -> Union[RunTimeInt, Sym]:
    """A size times a by-value argument's number (`x.shape[0] * k`), as
    the run-time scalar of `dtype` it stands for: still a size, where a
    shape takes it (`reshape(x, (x.shape[0] * k,))`), and, where it meets
    arrays or a float function (`sqrt`), the scalar of `dtype` that the
    product is where k is not taken by value; 0 (for k = 0) a `RunTimeInt`."""
    return replace(size, dtype=dtype) if isinstance(size, Sym) else RunTimeInt(size, dtype)


def run_time_number(value: Union[int, float], dtype: str) -> Union[RunTimeInt, RunTimeFloat]:
    """The compile-time number standing for a run-time scalar of `dtype`
    whose value is `value`."""
    if dtype == "bool":
        return RunTimeBool(value)
    return RunTimeFloat(value, dtype) if dtype in FLOATS else RunTimeInt(value, dtype)


class ByValueArgument(RunTimeInt):
    """An integer argument taken by value: a `RunTimeInt` that remembers
    its argument, as an `ArgumentValue` does (`is_argument`)."""

    def __new__(cls, value: int, dtype: str, name: str) -> "ByValueArgument":
        self = int.__new__(cls, value)
        self.dtype, self.name = dtype, name
        return self

    def __getnewargs__(self) -> tuple:
        return int(self), self.dtype, self.name


def is_argument(v: object) -> bool:
    """Whether v is an integer argument's value, passed on as it is
    (`ArgumentValue`, `ByValueArgument`), which has a `name`."""
    return isinstance(v, (ArgumentValue, ByValueArgument))


def naming_arguments(values: Sequence, message: str, span: Span) -> GradError:
    """The error `message` says about `values` (a shape, axes, a number):
    the caller's `ArgumentError`, naming the arguments whose values they
    hold as they are (`is_argument`: `reshape(x, (k, -1))` for `k: i64`
    that does not divide x's size), as an axis or index out of range is;
    else, with no argument among them, an error in the source."""
    names = list(dict.fromkeys(v.name for v in values if is_argument(v)))
    if not names:
        return GradError(message, span)
    if len(names) == 1:
        return ArgumentError(f"{message} (the value of argument {names[0]!r})", span)
    listed = ", ".join(repr(name) for name in names)
    return ArgumentError(f"{message} (the values of arguments {listed})", span)


def is_integer(v: object) -> bool:
    """Whether compile-time v is an integer, as an axis, an index, a count
    or a shape takes one: not a bool, nor a `RunTimeBool`, which is an int
    only so that it folds (`k == 1` by value: `x[k == 1]` was x[1] and
    `sum(x, axis=k == 1)` a sum over axis 1, where True, and the bool
    scalar `k == 1` is when k is not taken by value, are refused)."""
    return number_type(v) is int


def number_type(v: object) -> type:
    """`type(v)`, where an `ArgumentValue` or a `RunTimeInt` is an int, a
    `RunTimeFloat` a float and a `RunTimeBool` a bool: what tells 1 from
    1.0 and True."""
    if isinstance(v, RunTimeFloat):
        return float
    if isinstance(v, RunTimeBool):
        return bool
    return int if isinstance(v, (ArgumentValue, RunTimeInt)) else type(v)


def run_time_atom(b: Builder, v: Value, span: Optional[Span]) -> Value:
    """v, where it is a `RunTimeInt` or `RunTimeFloat`, as the scalar it
    stands for: a literal of its dtype, which promotes as an array does
    (`y * k` is i64 for i32 y and an i64 k, as it is when k is not taken
    by value), and so a size that one multiplied (`is_run_time`), as the
    size's `dim` of that dtype; any other value as it is."""
    if isinstance(v, Sym) and v.dtype is not None:
        return _run_time_product(b, v, span)
    return b.lit(v, v.dtype, span) if isinstance(v, RUN_TIME) else v


def _run_time_product(b: Builder, v: Sym, span: Optional[Span]) -> Atom:
    """The run-time scalar that size v, a product of by-value numbers
    (`is_run_time`), stands for: its coefficient and each of its sizes in
    its dtype, multiplied there, so that it wraps around as the product
    at run time does (the `dim` of the whole product did not fit:
    `x.shape[0] * k` for an i32 k of 2**31 - 1 raised NumPy's
    OverflowError when the program ran)."""
    bits = {"i32": 32, "i64": 64}[v.dtype]
    coef = (v.coef + 2 ** (bits - 1)) % 2 ** bits - 2 ** (bits - 1)
    out: Atom = b.lit(coef, v.dtype, span)
    for factor in v.factors:
        size = b.bind("dim", value=Sym.named(factor), dtype=v.dtype, span=span)
        out = b.bind("mul", out, size, span=span)
    return out


def sequence_kind(v: tuple) -> str:
    """'list' or 'tuple', for messages about a compile-time sequence."""
    return "list" if isinstance(v, StaticList) else "tuple"


Static = Union[int, float, bool, tuple, Sym]
Value = Union[Var, Lit, int, float, bool, tuple, Sym]


def is_static(v: Value) -> bool:
    return not isinstance(v, (Var, Lit))


# ------------------------------------------------------------- dtype rules


def promote(a: str, b: str) -> str:
    if a == b:
        return a
    if a in FLOATS or b in FLOATS:
        return "f64" if "f64" in (a, b) else "f32"
    if "i64" in (a, b) or "bool" in (a, b) and "i32" not in (a, b):
        return "i64"
    return "i32"


def _weak_dtype(value: Static) -> str:
    if isinstance(value, RUN_TIME):
        return value.dtype
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "i64"
    return "f64"


def literal_dtype(value: Static, dtype: str) -> str:
    """The dtype a compile-time number takes where it meets an array of
    `dtype`: that dtype, except that a float turns an integer one into f64
    and an integer a bool one into i64 (NumPy 2's rule: `mask == 2` compares
    integers, where 2 as a bool would be True)."""
    if isinstance(value, float) and dtype not in FLOATS:
        return "f64"
    if dtype == "bool" and not isinstance(value, bool):
        return "i64"
    return dtype


def as_atom(b: Builder, v: Value, span: Optional[Span], dtype: Optional[str] = None) -> Atom:
    """A compile-time value becomes a literal (of `dtype` when given)."""
    if isinstance(v, (Var, Lit)):
        return cast(b, v, dtype) if dtype else v
    if isinstance(v, tuple):
        hint = "; build an array with stack([...])" if isinstance(v, StaticList) else ""
        raise GradError(f"a {sequence_kind(v)} cannot be used as an array here{hint}", span)
    if isinstance(v, Sym) and v.dtype is not None:  # (computed in its dtype, then converted)
        return as_atom(b, _run_time_product(b, v, span), span, dtype)
    if isinstance(v, Sym):
        return b.bind("dim", value=v, dtype=dtype or "i64", span=span)
    return b.lit(v, dtype or _weak_dtype(v), span)


def as_result(b: Builder, v: Value, dtype: Optional[str], span: Optional[Span]) -> Atom:
    """A function's result as an atom: a compile-time one as a literal of
    `dtype`, the one its return annotation names, if any (`Lowerer.body`
    made it a value of that dtype); an array as it is (its dtype was
    checked against the annotation: a result is never cast)."""
    return as_atom(b, v, span, dtype if is_static(v) else None)


class ReturnsSequence(GradError):
    """A function compiled on its own (called from Python, checked by
    `gradc check`) returns a compile-time tuple or list (a shape helper's
    `x.shape[:-1] + (2, 3)`): only another function can take that."""


def entry_results(b: Builder, name: str, outs: Sequence[Value], dtype: Optional[str],
                  spans: Sequence[Span]) -> list[Atom]:
    """`as_results` of a function compiled on its own, `name`: a
    compile-time tuple or list among them is a `ReturnsSequence` at its
    return item (it said "a tuple cannot be used as an array here")."""
    for v, span in zip(outs, spans):
        if isinstance(v, tuple):
            kind = sequence_kind(v)
            raise ReturnsSequence(
                f"{name}() returns a {kind} as a result, which only another function can "
                f"take (a shape for its reshape): a function called from Python returns "
                f"arrays (`return a, b` for several, stack([...]) for one)", span)
    return as_results(b, outs, dtype, spans)


def as_results(b: Builder, outs: Sequence[Value], dtype: Optional[str],
               spans: Sequence[Span]) -> list[Atom]:
    """A function's results by `as_result`, each at the span of the return
    item that gave it (one per result), where an error points."""
    return [as_result(b, v, dtype, span) for v, span in zip(outs, spans, strict=True)]


def cast(b: Builder, a: Atom, dtype: str, span: Optional[Span] = None) -> Atom:
    if a.type.dtype == dtype:
        return a
    if isinstance(a, Lit):
        return b.lit(a.value, dtype)
    return b.bind("cast", a, dtype=dtype, span=span)


def weak_float_dtype(values: Iterable[Value]) -> str:
    """The dtype a float number takes where it is made an array among a
    call's arguments `values`, as a Python number passed to a compiled
    function does: f32 where their float arrays are all f32, else f64."""
    floats = {v.type.dtype for v in values
              if not is_static(v) and not isinstance(v, WeakVar) and v.type.is_float}
    return "f32" if floats == {"f32"} else "f64"


def weak_number(v: Value) -> Optional[Value]:
    """What a weakly typed value counts as where it meets arrays: a
    compile-time value itself, a `WeakVar` a number of its kind (a float or
    an int), as a literal; None for an array of a dtype of its own."""
    if isinstance(v, WeakVar):
        return 0.0 if v.type.is_float else 0
    return v if is_static(v) else None


def _weak_static(v: Value) -> bool:
    """Whether v is a compile-time value that is weakly typed: not a
    `RunTimeInt` or `RunTimeFloat`, the array of its dtype it stands for."""
    return is_static(v) and not is_run_time(v)


def weak_result(values: Sequence[Value]) -> bool:
    """Whether arithmetic on `values` is weakly typed: some are `WeakVar`s
    and the others compile-time numbers (`arange(n) * 0.5`)."""
    return any(isinstance(v, WeakVar) for v in values) and all(
        _weak_static(v) or isinstance(v, WeakVar) for v in values)


def weakly_typed(values: Sequence[Value]) -> bool:
    """Whether a choice between `values`, or a layout op of them, is weakly
    typed: each is a compile-time number or a `WeakVar`, as JAX keeps
    `broadcast_to(2.0, s)`, `stack([a, 1.0])` and `where(m, 1.0, 0.0)` weak.
    (Arithmetic on numbers folds instead: see `weak_result`.)"""
    return all(isinstance(v, WeakVar) or _weak_static(v) and not isinstance(v, tuple)
               for v in values)


def unify(b: Builder, values: Sequence[Value], span: Optional[Span],
          float_result: bool = False, arithmetic: bool = True,
          spans: Optional[Sequence[Optional[Span]]] = None) -> list[Atom]:
    """Bring operands to one dtype: arrays promote (f32 with f64 gives f64),
    literals take the arrays' dtype (a float literal makes ints f64).  A
    constant that does not fit is an error at its own span in `spans` when
    given, else at `span`.  A `RunTimeInt` or `RunTimeFloat` is the array
    it stands for."""
    values = [run_time_atom(b, v, span) for v in values]
    arrays = [v for v in values if not is_static(v) and not isinstance(v, WeakVar)]
    weak = [v for v in values if isinstance(v, WeakVar)]
    if arrays or weak:
        dtype = (arrays or weak)[0].type.dtype
        for a in (arrays or weak)[1:]:
            dtype = promote(dtype, a.type.dtype)
        for v in values:
            if is_static(v) or arrays and isinstance(v, WeakVar):
                dtype = literal_dtype(weak_number(v), dtype)
    elif all(isinstance(v, bool) for v in values):
        # (a choice or a stack of bools is a bool, as NumPy's and as one of
        # bool arrays is: `where(m, True, False)` was an i64)
        dtype = "bool"
    else:
        dtype = "f64" if any(isinstance(v, float) for v in values) else "i64"
    if arithmetic and dtype == "bool":
        dtype = "i64"
    if float_result and dtype not in FLOATS:
        dtype = "f64"
    spans = spans or [span] * len(values)
    for v, at in zip(values, spans):
        if isinstance(v, WeakVar) and v.type.dtype != dtype:
            check_range_fits(b, v, dtype, at)
    return [as_atom(b, v, at, dtype) for v, at in zip(values, spans)]


def check_range_fits(b: Builder, v: Var, dtype: str, span: Optional[Span]) -> None:
    """An `arange` taking the dtype of the arrays it meets (or of a return
    annotation) must hold its values in it, as a literal must:
    `arange(2**40, 2**40 + 3) + k` for i32 k is an error at the constant,
    not a wraparound; so must one whose values reach v unchanged through
    ops that only move or pick them (`_PICKS`: `reshape(arange(...), s)`,
    a slice of it, a `where` between two).  (Arithmetic on one has no
    compile-time values, and is not checked.)  An integer made of sizes
    (`n - 1`, an i64 the driver computes: `Lowerer.size_number`) meeting
    i32 needs concrete sizes, where it folds and is checked as a literal
    is: `y * (y.shape[0] - 2**40)` for i32 y wrapped around silently."""
    if dtype == "i32" and v.type.dtype == "i64" and v.type.rank == 0 \
            and of_sizes_only(b, v):
        raise NeedsConcrete("an integer made of sizes meets an i32 array")
    eqn = b.defining(v)
    if eqn is not None and eqn.op in _PICKS:
        for a in _PICKS[eqn.op](eqn.inputs):
            # a plain Var too: an op on a weak value may bind its steps plain
            # and weaken only its result (`x[5]`: a slice, then a reshape)
            if isinstance(a, Var):
                check_range_fits(b, a, dtype, span)
    if eqn is None or eqn.op != "iota" or isinstance(eqn.p["stop"], Sym):
        return
    start, stop, step = eqn.p["start"], eqn.p["stop"], eqn.p["step"]
    count = arange_length(start, stop, step)
    for value in ((start, start + (count - 1) * step) if count else ()):
        coerce(value, dtype, span)


def of_sizes_only(b: Builder, value: Var) -> bool:
    """Whether run-time `value` is computed (in `b`) from symbolic sizes
    (`dim` ops: a number made of a size, `Lowerer.size_number`) and
    literals alone, so that it is known at compile time for concrete sizes."""
    need, sized = {value}, False
    for eqn in reversed(b.eqns):
        made = [o for o in eqn.outputs if o in need]
        if not made:
            continue
        need.difference_update(made)
        if any(o.type.rank for o in eqn.outputs):
            return False  # (an array's: a number of sizes is a scalar)
        if eqn.op == "dim":
            sized = sized or isinstance(eqn.p["value"], Sym)
        else:
            need.update(a for a in eqn.inputs if isinstance(a, Var))
        if not need:
            break
    return sized and not need


# ops whose result's values are some of the values of these inputs (or zeros)
_PICKS = {**dict.fromkeys(("reshape", "transpose", "broadcast_to", "slice", "embed", "take",
                           "take_along_axis"), lambda inputs: inputs[:1]),
          "concatenate": lambda inputs: inputs,
          "where": lambda inputs: inputs[1:]}
