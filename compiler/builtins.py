"""The builtin functions of the surface language.

Contract: `BUILTINS[name]` is a `Builtin`: its signature (checked at load
time by `compiler.checker`) and how it lowers to primitives of the op table.
Every row of the table with a `source_name` is a builtin of that name,
taking its inputs positionally (unified like arithmetic operands) unless
`_LOWERINGS` gives it a lowering of its own; sugar (`mean`, `min`, `clip`,
`stack`, `*_like`) lowers to primitives here.  Only primitives carry
derivative rules.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from gradlang.compiler import convolution, ops, pooling, products
from gradlang.compiler.builder import Builder, coerce
from gradlang.compiler.ir import FLOATS, INTS, Atom, Lit, Var
from gradlang.compiler.shapes import NeedsConcrete, NeedsValue, Sym, prod, quotient
from gradlang.compiler.values import (RUN_TIME, NotCompileTime, Value, as_atom, cast,
                                      is_integer, is_static, naming_arguments, number_type,
                                      run_time_number, sequence_kind, unify, weak_result,
                                      weakly_typed)
from gradlang.runtime.errors import GradError, Span

if TYPE_CHECKING:
    from gradlang.compiler.lower import Lowerer

NONE_IS_NO_VALUE = ("None is not a value: it is an argument that means \"not given\" "
                    "(sum(x, axis=None)), or a new axis in an index (x[:, None])")


@dataclass(frozen=True)
class Builtin:
    """A function of the surface language: its signature (checked at load
    time) and how it lowers to primitives.  Its first `operands` parameters
    are taken by position only; `options` follow, by position or by name
    (as `sum(x, 1)` or `sum(x, axis=1)`); the first `required` parameters
    of all must be given.  `lower` gets the positional arguments and the
    keywords as written (`_kw` reads an option from either)."""

    operands: int
    options: tuple[str, ...]
    required: int
    lower: Callable[[Lowerer, Builder, list, dict, Span], Value]
    variadic: bool = False  # any number of positional arguments past `operands`
    # The parameters (by position among operands then options) that take
    # `None`, as NumPy's do: the same as leaving the option out (`_kw`).
    nullable: tuple[int, ...] = ()
    # How many of the last options are taken by name only (`initial=`,
    # which NumPy's positional order puts after options the language lacks).
    keyword_only: int = 0

    def refuses_none(self, name: str, position: int, keyword: Optional[str]) -> Optional[str]:
        """Why `None` cannot be this argument (by `position`, or by
        `keyword` when given), or None where it can (or where the argument
        is no parameter at all: `check` says so)."""
        if keyword is not None:
            if keyword not in self.options:
                return None
            position = self.operands + self.options.index(keyword)
        extra = position >= self.operands + len(self.options)
        if position in self.nullable or extra and not self.variadic:
            return None
        if position < self.operands or extra:
            return f"{name}() takes an array here, not None"
        return (f"{name}() does not take None for "
                f"{self.options[position - self.operands]!r}")

    def check(self, name: str, n_args: int, kwargs: dict | Sequence[str], span: Span) -> None:
        """Python's rules for a call of this signature: a GradError for too
        many or too few positional arguments, an unknown keyword, an option
        given twice or a required parameter missing."""
        most = self.operands + len(self.options) - self.keyword_only
        if self.variadic and n_args >= self.operands:
            most = n_args
        for k in kwargs:  # first, as Python: `clip(x, min=0)` names what is wrong
            if k not in self.options:
                raise GradError(f"{name}() got an unexpected keyword argument {k!r}"
                                f"{numpy_keyword(k, self.options)}", span)
        if not self.operands <= n_args <= most:
            takes = f"at least {_count(self.operands, self.operands)}" if self.variadic \
                else _count(self.required, most)
            raise GradError(f"{name}() takes {takes} but {n_args} "
                            f"{'was' if n_args == 1 else 'were'} given", span)
        for k in kwargs:
            if self.operands + self.options.index(k) < n_args:
                raise GradError(f"{name}() got multiple values for argument {k!r}", span)
        missing = [k for k in self.options[n_args - self.operands:self.required - self.operands]
                   if k not in kwargs]
        if missing:
            raise GradError(f"{name}() is missing its argument {missing[0]!r}", span)


def numpy_keyword(keyword: str, takes: Sequence[str]) -> str:
    """A hint for a keyword a call does not take that is torch's name for
    an option it takes by NumPy's (`sum(x, dim=1, keepdim=True)`), else ""."""
    numpy = {"dim": "axis", "keepdim": "keepdims"}.get(keyword)
    return f"; write {numpy}= (NumPy's name)" if numpy in takes else ""


def _count(least: int, most: int) -> str:
    """'1 positional argument', '2 to 3 positional arguments', as Python says."""
    if least == most:
        return f"{least} positional argument{'' if least == 1 else 's'}"
    return f"{least} to {most} positional arguments"


def _builtin(operands: int, lower, options: tuple[str, ...] = (),
             required: Optional[int] = None, variadic: bool = False,
             nullable: tuple[str, ...] = (), keyword_only: int = 0) -> Builtin:
    """A Builtin whose options are all optional unless `required` says; the
    options `nullable` names take None (as NumPy's: the default)."""
    return Builtin(operands, options, operands if required is None else required, lower,
                   variadic, tuple(operands + options.index(o) for o in nullable),
                   keyword_only)


def _kw(args: list, kwargs: dict, position: int, name: str, default=None):
    """An option, by position or by name; `default` where it is not given
    or is given as None (`Lowerer.expr_Call` let None through only for the
    options that take it)."""
    value = args[position] if len(args) > position else kwargs.get(name)
    return default if value is None else value


def _primitive(op: ops.Op) -> Builtin:
    """A row of the op table called by its source name."""
    def lower(L: Lowerer, b: Builder, args, kwargs, span) -> Value:
        if op.arity == 2:  # folds constants like arithmetic does
            return L.binary(b, op.name, args[0], args[1], span)
        try:
            folded = _folded(op, args)
        except NeedsConcrete as err:  # (sqrt of a size: a run-time number)
            return L.size_number(b, op.name, args, span, err)
        if folded is not None:
            return folded
        L.inexact_of_sizes(b, op.name, args)
        inputs = unify(b, args, span, float_result=op.float_only)
        # (abs(k) of an integer argument stands for it, as k + 1 does)
        return L.of_arguments(b.bind(op.name, *inputs, span=span, weak=weak_result(args)), args)
    return _builtin(op.arity, lower)


def _folded(op: ops.Op, args: Sequence[Value]) -> Optional[float | int]:
    """A function (`sqrt`, `exp`, ..., `abs`, `sign`) of one compile-time
    number, computed now by the op's reference (NumPy's, as a kernel's
    `math` may differ by an ulp: one value on every target): a compile-time
    number again, which takes the dtype of the arrays it meets as a literal
    does (`q / sqrt(d)` stays f32; it was an f64 array, which made the
    quotient f64), infinite or NaN as NumPy's (`log(0)`).  A float function
    computes in f64; one that keeps integers (`abs`, `sign`) gives an int
    of an int (`abs(-2.0) * x` was f64 for f32 x, `abs(-2) + k` i64 for i32
    k).  None for an integer beyond f64 (or, for those, beyond i64).  A
    symbolic size is used as a number, as in `1 / x.shape[0]`:
    NeedsConcrete, which `Lowerer.size_number` turns into a run-time number
    where it can (`sqrt(d)`), else the program is lowered for concrete
    sizes.  A by-value argument's number (`RunTimeInt`, `RunTimeFloat`)
    folds as the kernel computes it, in its dtype (`abs` of the least
    integer wraps); a float function of one is computed at run time
    (None), as it is where the argument is not taken by value."""
    (x,) = args
    if isinstance(x, RUN_TIME):
        if not op.exact or op.float_only and x.dtype in INTS + ("bool",):
            return None
        dtype = "i64" if x.dtype == "bool" else x.dtype  # (`abs(k == 1)`: on i64, as unify's)
        return run_time_number(ops.fold(op.name, [x], [dtype], dtype), dtype)
    if isinstance(x, Sym):
        raise NeedsConcrete(f"the size {x} is used as a number")
    if number_type(x) not in (int, float):
        return None
    if not op.float_only and number_type(x) is int:
        if not -2**63 < x < 2**63:   # (abs of the least i64 wraps in NumPy)
            return None
        return int(op.ref(np.int64(x)))
    try:
        number = np.float64(x)
    except OverflowError:  # an integer beyond f64: left to the kernels, as before
        return None
    with np.errstate(all="ignore"):
        return float(op.ref(number))


def _reverse_order(b: Builder, x: Atom, span) -> Atom:
    """A bijection that reverses the order of x's dtype, and is its own
    inverse: -x for floats; -x - 1 (~x) for integers, where -x wraps for
    the least value."""
    negated = b.bind("neg", x, span=span)
    if x.type.dtype in FLOATS:
        return negated
    return b.bind("sub", negated, b.lit(1, x.type.dtype), span=span)


def _reduction(op: str, negate: bool = False, mean: bool = False,
               pairwise: Optional[str] = None) -> Builtin:
    """sum, max, min (and, without `initial`, mean) as NumPy's: `initial`
    (`_initial`) is taken into the reduction (added to a sum; the max of
    it and the elements), and so the value over an empty axis.
    `pairwise` names the elementwise function that Python's max(a, b) is
    (`maximum`), which a second argument that cannot be an axis is taken
    for in the error."""
    def lower(L: Lowerer, b: Builder, args, kwargs, span):
        axis = _kw(args, kwargs, 1, "axis")
        if pairwise and len(args) > 1 and args[1] is not None and (
                isinstance(args[1], bool) or not isinstance(args[1], (int, tuple))):
            raise GradError(f"the second argument of {pairwise[:3]}() is an axis; for the "
                            f"elementwise {pairwise} of two values write {pairwise}(a, b)",
                            span)
        keepdims = _kw(args, kwargs, 2, "keepdims", False)
        initial = _kw(args, kwargs, 3, "initial")
        x = as_atom(b, args[0], span)
        if mean and x.type.dtype not in FLOATS:
            x = cast(b, x, "f64")
        elif op == "reduce_sum" and x.type.dtype == "i32":
            # NumPy's sum of i32 is i64 (as cumsum's here): in i32 the sum
            # of 70,000 values of 70,000 wrapped around to 605032704
            x = cast(b, x, "i64")
        if negate:
            if x.type.dtype == "bool":
                x = cast(b, x, "i64")
            x = _reverse_order(b, x, span)
        if initial is not None:
            initial = _initial(L, b, initial, "i64" if x.type.dtype == "bool" else x.type.dtype,
                               negate, span)
        out = L.reduce(b, op, x, axis, keepdims, span, initial)
        if negate:
            out = _reverse_order(b, out, span)
        if mean:
            reduced = L.reduced_axes(x, axis, span)
            count = prod(x.type.shape[a] for a in reduced)
            out = b.bind("div", out, as_atom(b, count, span, out.type.dtype), span=span)
        # of a weak value or a number: weak (`sum(arange(n) * 0.5)`), if a
        # float: an integer one meeting i32 would wrap around unchecked
        # (sum(arange(100000)) + k)
        if weakly_typed(args[:1]) and out.type.dtype in FLOATS:
            if out is x:  # (reduced over no axes: the value itself)
                return args[0]
            if isinstance(out, Var):
                out = b.weaken(out)  # (every path above ends in a bind, or gives x back)
        return out
    return _builtin(1, lower, ("axis", "keepdims") + (() if mean else ("initial",)),
                    nullable=("axis",), keyword_only=0 if mean else 1)


def _initial(L: Lowerer, b: Builder, v: Value, dtype: str, negate: bool, span: Span):
    """A reduction's `initial` as the reduction of `dtype` elements takes
    it (in reversed order for min, as `_reverse_order` reverses x): a
    compile-time number of `dtype`, or a scalar computed at run time
    (`initial=k * 0.5`) cast to it where the cast loses no range: any
    float to a float, as NumPy casts initial to the result's dtype; an
    integer to a float or a wider integer.  A run-time integer argument a
    narrower integer takes (an i64 `k` into a max of i32) is taken by
    value, so that a value out of range is an error, not wrapped."""
    if isinstance(v, Var) and v.type.rank == 0 and _casts_in_range(v.type.dtype, dtype):
        atom = cast(b, v, dtype, span)
        return _reverse_order(b, atom, span) if negate else atom
    by_value(L, v)
    if number_type(v) not in (int, float):
        raise NotCompileTime("initial must be a number known at compile time, or a float "
                             "or integer scalar that converts to the reduced dtype "
                             f"({dtype}) without loss of range", span, v)
    number = _fitted(v, dtype, span)
    if not negate:
        return number
    return -number - 1 if dtype in INTS else -number  # (as _reverse_order)


def _fitted(v, dtype: str, span: Span):
    """`coerce`'s number v of `dtype`, its error the caller's where v is
    an argument's value taken by value (`naming_arguments`)."""
    try:
        return coerce(v, dtype, span)
    except GradError as err:
        raise naming_arguments((v,), err.message, span) from None


def _casts_in_range(source: str, target: str) -> bool:
    """Whether a run-time scalar of `source` converts to `target` with no
    loss of range (a float may round, as NumPy's cast of initial does).  A
    bool is 0 or 1 in any dtype, and any number is a bool as NumPy takes
    one (nonzero is True: 256 too, no wraparound); of bools, asking an
    integer's width raised tuple.index's ValueError."""
    if target in FLOATS or "bool" in (source, target):
        return True
    return source in INTS and INTS.index(source) <= INTS.index(target)  # (INTS: by width)


def _where(L, b, args, kwargs, span):
    cond = L.as_bool(b, args[0], span, "where()'s condition")
    x, y = unify(b, args[1:], span, arithmetic=False)
    # a choice between weak values is one (a sinusoidal encoding's sin and cos)
    return b.bind("where", cond, x, y, span=span, weak=weakly_typed(args[1:]))


def _clip(L, b, args, kwargs, span):
    """NumPy's clip: a bound that is None is no bound."""
    x, low, high = args
    if low is not None:
        x = L.binary(b, "maximum", x, low, span)
    if high is not None:
        x = L.binary(b, "minimum", x, high, span)
    return x


def _static_shape(L, v, span, sizes: bool = True) -> tuple:
    """A compile-time shape: integers (an integer argument by value) and,
    where `sizes`, the symbolic sizes `x.shape` gives under symbolic
    lowering (so `reshape(dy, s.shape)` compiles for any size)."""
    shape = tuple(v) if isinstance(v, tuple) else (v,)
    for d in shape:
        by_value(L, d)
        if isinstance(d, Sym) and not sizes:
            raise NeedsConcrete(f"the size {d} is used as an axis")
        if not isinstance(d, Sym) and not is_integer(d):
            raise NotCompileTime("a shape must be a compile-time tuple or list of integers"
                                 f"{compile_time_hint(d)}", span, d)
    return shape


def _reshape(L, b, args, kwargs, span):
    x = as_atom(b, args[0], span)
    shape = list(_static_shape(L, _kw(args, kwargs, 1, "shape"), span))
    if shape.count(-1) > 1:
        raise naming_arguments(shape, f"invalid shape {shape}", span)
    for d in shape:
        if isinstance(d, int) and d < -1:
            raise naming_arguments((d,), f"invalid shape {shape}", span)
    if -1 in shape:
        known, size = prod(d for d in shape if d != -1), x.type.size
        # (symbolic sizes: `reshape(x, (-1, d))` of (n, t, d) is (n * t, d)
        # for every n; one the others do not divide needs the values)
        rest = quotient(size, known)
        if rest is None and (isinstance(size, Sym) or isinstance(known, Sym)):
            raise NeedsConcrete(f"the size {size} is divided by {known}")
        if rest is None:
            raise naming_arguments(shape, f"cannot reshape {list(x.type.shape)} to {shape}", span)
        shape[shape.index(-1)] = rest
    elif all(isinstance(d, int) for d in (*shape, x.type.size)) and prod(shape) != x.type.size:
        # (the op's shape rule says so too, but cannot tell an argument's
        # value from the source's number)
        raise naming_arguments(shape, f"cannot reshape {list(x.type.shape)} ({x.type.size} "
                               f"elements) to {shape}", span)
    shape = tuple(shape)
    if shape == x.type.shape:  # (a number stays one: `reshape(0.5, ())` is weak)
        return args[0] if is_static(args[0]) else x
    return b.bind("reshape", x, shape=shape, span=span, weak=weakly_typed(args[:1]))


def _broadcast_to(L, b, args, kwargs, span):
    x = as_atom(b, args[0], span)
    shape = _static_shape(L, _kw(args, kwargs, 1, "shape"), span)
    for d in shape:
        if isinstance(d, int) and d < 0:  # (a size is never negative)
            raise naming_arguments((d,), f"invalid shape {list(shape)}: sizes cannot be negative",
                                   span)
    if shape == x.type.shape:
        return args[0] if is_static(args[0]) else x
    return b.bind("broadcast_to", x, shape=shape, span=span, weak=weakly_typed(args[:1]))


def _transpose(L, b, args, kwargs, span):
    x = as_atom(b, args[0], span)
    axes = _kw(args, kwargs, 1, "axes")
    if axes is not None:
        axes = _static_shape(L, axes, span, sizes=False)
    return L.transpose(b, x, axes, span)


def _concatenate(L, b, args, kwargs, span, stack: bool = False):
    seq = args[0]
    if not isinstance(seq, tuple) or not seq:
        name = "stack" if stack else "concatenate"
        raise GradError(f"{name}() takes a non-empty list (or tuple) of arrays, e.g. "
                        f"{name}([a, b])", span)
    axis = _kw(args, kwargs, 1, "axis", 0)
    by_value(L, axis)
    if not is_integer(axis):
        raise NotCompileTime(f"axis must be a compile-time integer{compile_time_hint(axis)}",
                             span, axis)
    items, weak = unify(b, list(seq), span, arithmetic=False), weakly_typed(seq)
    rank = items[0].type.rank + (1 if stack else 0)
    if not -rank <= axis < rank or rank == 0:
        raise ops.axis_out_of_range(axis, rank, span)
    axis %= rank
    if stack:
        shapes = {a.type.shape for a in items}
        if len(shapes) != 1:
            raise GradError(f"stack() needs arrays of one shape, got "
                            f"{[list(s) for s in shapes]}", span)
        items = [b.bind("reshape", a, shape=a.type.shape[:axis] + (1,) + a.type.shape[axis:],
                        span=span, weak=weak) for a in items]
    if len(items) == 1:
        return items[0]
    return b.bind("concatenate", *items, axis=axis, span=span, weak=weak)


def _fill_like(value_pos: Optional[int], value=None):
    def lower(L, b, args, kwargs, span):
        x = as_atom(b, args[0], span)
        fill = args[value_pos] if value_pos is not None else value
        if not is_static(fill) and fill.type.rank == 0:
            # a run-time scalar, converted to x's dtype as NumPy's full_like
            # does: as a by-value argument's number is (`full_like(x, k)`,
            # `full_like(x, k * 0.5)`), which this refused where k is not;
            # but an integer argument x's dtype may not hold is taken by
            # value, so that one out of range is an error, as it is by
            # value and in NumPy, not wrapped around
            if not _casts_in_range(fill.type.dtype, x.type.dtype):
                by_value(L, fill)
            return b.bind("broadcast_to", cast(b, fill, x.type.dtype, span),
                          shape=x.type.shape, span=span)
        if not is_static(fill) or isinstance(fill, tuple):
            raise GradError("full_like() needs a scalar fill value", span)
        if isinstance(fill, Sym):
            raise NeedsConcrete("a size used as a fill value")
        return ops.full(b, _fitted(fill, x.type.dtype, span), x.type.shape, x.type.dtype)
    return lower


def _conversion(dtype: str) -> Builtin:
    """`float32(x)`, `float64(x)`: x in that dtype, as NumPy's (a
    bool mask or an integer array too; a compile-time number becomes a
    value of the dtype, no longer a literal that takes another's), so that
    what meets it keeps it; its gradient is converted back."""
    return _builtin(1, lambda L, b, args, kwargs, span: as_atom(b, args[0], span, dtype))


def _stop_gradient(L, b, args, kwargs, span):
    v = args[0]
    return v if is_static(v) else b.bind("stop_gradient", v, span=span)


def _matmul_builtin(L, b, args, kwargs, span):
    return L.matmul(b, args[0], args[1], span)


def _arrays(name: str, operands: Sequence[Value], b: Builder, span) -> list[Atom]:
    """The operands of `name()`, arrays of one dtype (a list or tuple
    literal is an error)."""
    if any(isinstance(v, tuple) for v in operands):
        raise GradError(f"{name}() takes arrays, not sequences: build one with stack([...])",
                        span)
    return unify(b, operands, span)


def _einsum(L, b, args, kwargs, span):
    return products.einsum(b, args[0], _arrays("einsum", args[1:], b, span), span)


def _per_axis(L, name: str, d: int, v, what: str, least: int, span) -> tuple[int, ...]:
    """A convolution's or pooling's option: compile-time integers, one for
    every one of the d spatial axes or one per axis (a tuple)."""
    items = v if isinstance(v, tuple) else (v,) * d
    if len(items) != d:
        raise GradError(f"{name}() {what} takes one integer or {d} (one per spatial "
                        f"axis), got {len(items)}", span)
    numbers = tuple(compile_time_number(L, item, f"{name}() {what}", span) for item in items)
    if any(isinstance(k, Sym) for k in numbers):
        raise NeedsConcrete(f"a size used as the {what} of {name}()")
    if any(k < least for k in numbers):
        raise naming_arguments([k for k in numbers if k < least],
                               f"{name}() {what} must be {'positive' if least else 'non-negative'}"
                               f", got {list(numbers) if isinstance(v, tuple) else v}", span)
    return numbers


def _conv(d: int):
    """`conv1d`/`conv2d(x, w, stride=1, padding=0)`: PyTorch's, lowered by
    `convolution.convolution`."""
    name = f"conv{d}d"

    def lower(L, b, args, kwargs, span):
        x, w = _arrays(name, args[:2], b, span)
        stride = _per_axis(L, name, d, _kw(args, kwargs, 2, "stride", 1), "stride", 1, span)
        padding = _per_axis(L, name, d, _kw(args, kwargs, 3, "padding", 0), "padding", 0, span)
        return convolution.convolution(b, name, x, w, stride, padding, span)
    return _builtin(2, lower, ("stride", "padding"))


def _pool(kind: str, d: int):
    """`max_pool1d`/`max_pool2d`/`avg_pool1d`/`avg_pool2d(x, kernel_size,
    stride=kernel_size, padding=0)`: PyTorch's, lowered by
    `pooling.pooling`."""
    name = f"{kind}_pool{d}d"

    def lower(L, b, args, kwargs, span):
        if isinstance(args[0], tuple):
            raise GradError(f"{name}() takes an array, not a sequence", span)
        x = as_atom(b, args[0], span)
        kernel = _per_axis(L, name, d, _kw(args, kwargs, 1, "kernel_size"), "kernel_size", 1,
                           span)
        stride = _kw(args, kwargs, 2, "stride")
        stride = kernel if stride is None else _per_axis(L, name, d, stride, "stride", 1, span)
        padding = _per_axis(L, name, d, _kw(args, kwargs, 3, "padding", 0), "padding", 0, span)
        return pooling.pooling(b, name, x, kernel, stride, padding, span)
    return _builtin(1, lower, ("kernel_size", "stride", "padding"), required=2,
                    nullable=("stride",))


# ------------------------------------------------ gathers and scatter-adds


def index_label(idx: Atom) -> str:
    """How a run-time error names an index: its source name (a parameter
    or a local keeps one in the IR), else "" (the error's caret shows it)."""
    return repr(idx.hint) if isinstance(idx, Var) and idx.hint else ""


# What a boolean mask index says (NumPy's `x[x > 0]`).
MASK_HINT = ("the result's shape would depend on the mask's values; keep the shape with "
             "where(mask, x, 0.0), or sum what the mask selects with sum(where(mask, x, 0.0))")


def index_operand(L, b: Builder, v: Value, span: Span) -> Atom:
    """An integer index array (or scalar) of the language, lowered by `L`;
    where the branch of a runtime if the index is in is not taken
    (`Lowerer.index_guard`), 0.  In a grad block, an index that is no
    integer array is lowered as a cast one and its error held back, so
    that an index depending on the upstream is found not linear at load
    (`Lowerer.defer_in_block`)."""
    guard = L.index_guard(b)
    if isinstance(v, tuple):
        raise GradError(f"an index must be an integer array or scalar, not a "
                        f"{sequence_kind(v)}; build an array with stack([...])", span)
    if isinstance(v, Sym):
        raise NeedsConcrete("a size used as an index")
    idx = as_atom(b, v, span)
    if idx.type.dtype not in INTS:
        L.defer_in_block(GradError(
            f"a mask cannot index: {MASK_HINT}" if idx.type.dtype == "bool" else
            f"an index must be an integer array (i32 or i64), not "
            f"{idx.type.dtype}{python_values_hint(L, idx)}", span))
        idx = b.bind("cast", idx, dtype="i64", span=span, role="an index")
    if guard is None or isinstance(idx, Lit):
        return idx
    return b.bind("where", guard, idx, b.lit(0, idx.type.dtype), span=span,
                  hint=idx.hint if isinstance(idx, Var) else "")


def python_number_hint(v: Value) -> str:
    """Why a named float scalar may be one: a Python int passed for an
    unannotated parameter is a float, as for any differentiable parameter."""
    if isinstance(v, Var) and v.hint and v.type.rank == 0 and v.type.is_float:
        return (f" ({v.hint!r} is {v.type.dtype} here: a Python number passed for an "
                f"unannotated parameter is a float; annotate it `{v.hint}: i64`)")
    return ""


def python_values_hint(L, v: Value) -> str:
    """Why an index may be a float: it is an argument of the call (of the
    entry, `Lowerer.arguments`) for a parameter of no annotation, which
    takes Python numbers, lists and tuples as floats (`runtime.args`; a
    `const` one keeps their integers).  Said only of such an argument: a
    local of that name cannot be annotated, and `f(x, [0, 2])` said
    nothing of why its list of integers was f64."""
    name = L.arguments.get(v) if isinstance(v, Var) else None
    if name not in L.unannotated or not v.type.is_float:
        return ""
    if v.type.rank == 0:
        return (f" ({name!r} is {v.type.dtype} here: a Python number passed for an "
                f"unannotated parameter is a float; annotate it `{name}: i64`)")
    return (f" ({name!r} is {v.type.dtype} here: a Python list or tuple passed for an "
            "unannotated parameter holds floats; pass a NumPy integer array, or annotate it "
            f"`{name}: i64[...]`)")


def compile_time_hint(v: Value) -> str:
    """Why a named value where a compile-time integer is needed is not
    one: a Python number's (`python_number_hint`), or a tuple or list
    passed from Python, which is an array."""
    if isinstance(v, Var) and v.hint and v.type.rank > 0:
        return (f" ({v.hint!r} is an array here: a tuple or list passed from Python is an "
                "array; pass its items as integer arguments)")
    return python_number_hint(v)


def static_axis(L: Lowerer, axis, rank: int, span: Span) -> int:
    """An axis of an array of `rank`, known at compile time (an integer
    argument by value), as a non-negative integer."""
    by_value(L, axis)
    if not is_integer(axis):
        raise NotCompileTime(f"axis must be a compile-time integer{compile_time_hint(axis)}",
                             span, axis)
    if not -rank <= axis < rank:
        raise ops.axis_out_of_range(axis, rank, span)
    return axis % rank


def take(b: Builder, x: Atom, idx: Atom, axis: int, span: Span) -> Atom:
    """x gathered along `axis` (normalized) by `idx`, as np.take."""
    return b.bind("take", x, idx, axis=axis, what=index_label(idx), span=span)


def _flattened(b: Builder, x: Atom, span: Span) -> Atom:
    return x if x.type.rank == 1 else b.bind("reshape", x, shape=(x.type.size,), span=span)


def _take(L, b, args, kwargs, span):
    x = as_atom(b, args[0], span)
    idx = index_operand(L, b, args[1], span)
    axis = _kw(args, kwargs, 2, "axis")
    if axis is None:  # NumPy's default: the flattened array
        x, axis = _flattened(b, x, span), 0
    return _picked(b, args[0], take(b, x, idx, static_axis(L, axis, x.type.rank, span), span))


def _picked(b: Builder, x: Value, out: Atom) -> Atom:
    """A gather's result, weakly typed where x is, as `x[idx]` is
    (`take(arange(n) * 0.5, idx)` beside f32 arrays is f32)."""
    return b.weaken(out) if weakly_typed([x]) else out


def _take_along_axis(L, b, args, kwargs, span):
    x = as_atom(b, args[0], span)
    idx = index_operand(L, b, args[1], span)
    axis = _kw(args, kwargs, 2, "axis")
    if axis is None:
        x, axis = _flattened(b, x, span), 0
    axis = static_axis(L, axis, x.type.rank, span)
    # An index of rank one less picks one element per lane (labels of a
    # batch): it gains the axis, and the result loses it.
    picks = idx.type.rank == x.type.rank - 1
    if picks:
        lanes = x.type.shape[:axis] + x.type.shape[axis + 1:]
        if any(a != b for a, b in zip(idx.type.shape, lanes)):  # (said of the index given)
            raise GradError(f"an index of shape {list(idx.type.shape)} does not fit an array of "
                            f"shape {list(x.type.shape)} along axis {axis}: one index per lane "
                            f"needs the array's shape without that axis, {list(lanes)}", span)
        idx = b.bind("reshape", idx, shape=idx.type.shape[:axis] + (1,) + idx.type.shape[axis:],
                     span=span, hint=idx.hint if isinstance(idx, Var) else "")
    out = b.bind("take_along_axis", x, idx, axis=axis, what=index_label(idx), span=span)
    if picks:
        out = b.bind("reshape", out, shape=idx.type.shape[:axis] + idx.type.shape[axis + 1:],
                     span=span)
    return _picked(b, args[0], out)


def _cumsum(L, b, args, kwargs, span):
    x = as_atom(b, args[0], span)
    axis = _kw(args, kwargs, 1, "axis")
    if axis is None:  # NumPy's default: the flattened array
        x, axis = _flattened(b, x, span), 0
    axis = static_axis(L, axis, x.type.rank, span)
    if x.type.dtype not in FLOATS:  # NumPy sums bools and integers as i64
        x = cast(b, x, "i64")
    return b.bind("cumsum", x, axis=axis, reverse=False, span=span)


def _scatter_add(L, b, args, kwargs, span):
    base = as_atom(b, args[0], span)
    idx = index_operand(L, b, args[1], span)
    (values,) = unify(b, [args[2]], span)
    if values.type.is_float and not base.type.is_float:
        raise GradError(f"scatter_add of {values.type.dtype} values into a "
                        f"{base.type.dtype} array would drop their fractions", span)
    values = cast(b, values, base.type.dtype)
    axis = static_axis(L, _kw(args, kwargs, 3, "axis", 0), base.type.rank, span)
    return b.bind("scatter_add", base, idx, values, axis=axis, what=index_label(idx), span=span)


def _segment_sum(L, b, args, kwargs, span):
    values = as_atom(b, args[0], span)
    ids = index_operand(L, b, args[1], span)
    count = _count_of(L, _kw(args, kwargs, 2, "num_segments"), "num_segments", span)
    if ids.type.shape != values.type.shape[:ids.type.rank]:
        raise GradError(f"segment_ids of shape {list(ids.type.shape)} do not match the "
                        f"leading axes of values of shape {list(values.type.shape)}", span)
    if values.type.dtype == "bool":
        values = cast(b, values, "i64")
    shape = (count,) + values.type.shape[ids.type.rank:]
    zeros = ops.full(b, 0, shape, values.type.dtype, span)
    return b.bind("scatter_add", zeros, ids, values, axis=0, what=index_label(ids), span=span)


def by_value(L: Lowerer, v: Value) -> None:
    """Raises `NeedsValue` where `v` is an integer scalar argument of the
    function compiled: one that a shape, an axis or a count takes, for
    whose value it is then compiled again, as if it were `const`."""
    if isinstance(v, Var) and v in L.arguments and v.type.rank == 0 \
            and v.type.dtype in INTS:
        raise NeedsValue(L.arguments[v])


def compile_time_number(L: Lowerer, v: Value, what: str, span: Span,
                        floats: bool = False):
    """`v` (`what`: how a message names it) as a compile-time integer, or
    a float where `floats`, or a size (a `Sym`).  A run-time integer
    argument makes the function compiled for its value, as if it were
    `const` (NeedsValue: one program per value); anything else that is not
    known when the function is compiled is a GradError at `span`."""
    by_value(L, v)
    if not is_static(v):
        raise NotCompileTime(f"{what} must be known when the function is compiled: a "
                             "literal, an integer argument or a size (x.shape[k])"
                             f"{compile_time_hint(v)}", span, v)
    if not isinstance(v, Sym) and number_type(v) not in ((int, float) if floats else (int,)):
        raise GradError(f"{what} must be {'a number' if floats else 'an integer'}, not "
                        f"{v!r}", span)
    return v


def _count_of(L: Lowerer, v: Value, what: str, span: Span):
    """A compile-time count (`segment_sum`'s segments, `one_hot`'s classes)."""
    count = compile_time_number(L, v, what, span)
    if isinstance(count, int) and count < 0:
        raise naming_arguments((count,), f"{what} cannot be negative, got {count}", span)
    return count


def _arange(L, b, args, kwargs, span):
    """`np.arange`: int64 for integer arguments, else float64, weakly
    typed (a `WeakVar`) so that it takes the dtype of the arrays it meets
    as a number does."""
    first, stop = args[0], _kw(args, kwargs, 1, "stop")
    # (`arange(n - 1)`: arange(max(0, n - 1)), the same, whose length is a
    # size; with a start or a step other than 0 and 1 it needs concrete
    # sizes, below)
    start, stop = (0, L.shortened_bound(first)) if stop is None else (first, stop)
    bounds = [compile_time_number(L, v, "each argument of arange()", span, floats=True)
              for v in (start, stop, _kw(args, kwargs, 2, "step", 1))]
    numbers = [v for v in bounds if not isinstance(v, Sym)]
    if any(not math.isfinite(v) for v in numbers):
        raise GradError(f"arange() needs finite arguments, got {', '.join(map(str, numbers))}",
                        span)
    start, stop, step = bounds
    if step == 0:
        raise naming_arguments((step,), "arange() step cannot be zero", span)
    if isinstance(start, Sym) or isinstance(step, Sym) or isinstance(stop, Sym) \
            and (start, step) != (0, 1):
        raise NeedsConcrete("a size used as a bound of arange() with a start or step")
    dtype = "f64" if any(isinstance(v, float) for v in numbers) else "i64"
    if dtype == "i64":
        start, step = coerce(start, dtype, span), coerce(step, dtype, span)
        stop = stop if isinstance(stop, Sym) else coerce(stop, dtype, span)
    return b.bind("iota", start=start, stop=stop, step=step, dtype=dtype, span=span, weak=True)


def _one_hot(L, b, args, kwargs, span):
    """1.0 where a label's class is, in a new last axis of `num_classes`:
    a comparison of the labels with arange(num_classes), after a `take`
    from it that checks each label as every index is checked (an
    `ArgumentError` naming it; a negative one counts from the end).
    Weakly typed f64 (a `WeakVar`), so that `one_hot(y, k) * logp` is
    f32 for f32 logp."""
    labels = index_operand(L, b, args[0], span)
    count = _count_of(L, _kw(args, kwargs, 1, "num_classes"), "num_classes", span)
    classes = b.bind("iota", start=0, stop=count, step=1, dtype="i64", span=span)
    checked = take(b, classes, labels, 0, span)
    column = b.bind("reshape", checked, shape=labels.type.shape + (1,), span=span)
    hot = b.bind("eq", column, classes, span=span)
    return b.bind("cast", hot, dtype="f64", span=span, weak=True)


# In-language transforms, `grad(f, wrt=k)(args)`: lowered by
# `Lowerer.transform_call`, since their first argument is a function.
TRANSFORMS = ("grad", "value_and_grad", "jvp")


def _len(L, b, args, kwargs, span):
    """Python's `len` of a compile-time tuple or list (`len(x.shape)`, the
    rank, as x.ndim); an array's is refused, since NumPy's `len(x)` is the
    length of the first axis, which the language writes x.shape[0]."""
    (v,) = args
    if isinstance(v, tuple):
        return len(v)
    raise GradError("len() takes a compile-time tuple or list (len(x.shape) is x.ndim); the "
                    "length of an array's first axis is x.shape[0]", span)


def jvp_layout(name: str, count: int) -> str:
    """What the language's `jvp(f, wrt=...)(...)` takes, for its errors."""
    return f"jvp({name}) takes {name}()'s arguments, then {count} tangent(s), one per wrt"


# Primitives whose lowering is not `_primitive`'s.
_LOWERINGS: dict[str, Builtin] = {
    "where": _builtin(3, _where),
    "stop_gradient": _builtin(1, _stop_gradient),
}

# Sugar, and primitives called with compile-time arguments (shapes, axes).
_SUGAR: dict[str, Builtin] = {
    "clip": Builtin(3, (), 3, _clip, nullable=(1, 2)),
    "float32": _conversion("f32"),
    "float64": _conversion("f64"),
    "sum": _reduction("reduce_sum"),
    "mean": _reduction("reduce_sum", mean=True),
    "max": _reduction("reduce_max", pairwise="maximum"),
    "min": _reduction("reduce_max", negate=True, pairwise="minimum"),
    "matmul": _builtin(2, _matmul_builtin),
    "einsum": _builtin(2, _einsum, variadic=True),
    "conv1d": _conv(1),
    "conv2d": _conv(2),
    **{f"{kind}_pool{d}d": _pool(kind, d) for kind in ("max", "avg") for d in (1, 2)},
    "transpose": _builtin(1, _transpose, ("axes",), nullable=("axes",)),
    "reshape": _builtin(1, _reshape, ("shape",), required=2),
    "broadcast_to": _builtin(1, _broadcast_to, ("shape",), required=2),
    "stack": _builtin(1, lambda L, b, a, k, s: _concatenate(L, b, a, k, s, True), ("axis",)),
    "concatenate": _builtin(1, _concatenate, ("axis",)),
    "zeros_like": _builtin(1, _fill_like(None, 0)),
    "ones_like": _builtin(1, _fill_like(None, 1)),
    "full_like": _builtin(2, _fill_like(1)),
    "cumsum": _builtin(1, _cumsum, ("axis",), nullable=("axis",)),
    "take": _builtin(2, _take, ("axis",), nullable=("axis",)),
    "take_along_axis": _builtin(2, _take_along_axis, ("axis",), nullable=("axis",)),
    "scatter_add": _builtin(3, _scatter_add, ("axis",)),
    "segment_sum": _builtin(2, _segment_sum, ("num_segments",), required=3),
    "arange": _builtin(1, _arange, ("stop", "step"), nullable=("stop", "step")),
    "one_hot": _builtin(1, _one_hot, ("num_classes",), required=2),
    "len": _builtin(1, _len),
}

BUILTINS: dict[str, Builtin] = {
    **{op.source_name: _LOWERINGS.get(op.name) or _primitive(op)
       for op in ops.OPS.values() if op.source_name is not None},
    **_SUGAR,
}
