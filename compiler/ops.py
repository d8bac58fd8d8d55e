"""The table of primitives: every op declared once.

Contract: `OPS[name]` is the `Op` row holding everything the rest of the
compiler, and the tests generated from the table, need to know about a
primitive (the fields are documented on `Op`).  Adding a primitive is
adding one row to `_TABLE`: a row with a `source_name` is callable from
`.grad` source with no other edit (`compiler.builtins` derives its
builtins from the rows), and the op-table tests pick it up.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence, Union

import numpy as np

from gradlang.compiler.ir import (FLOATS, INTS, NUMPY_DTYPES, NUMPY_NAMES, Atom, Eqn, Lit,
                                  TensorType, Var)
from gradlang.compiler.shapes import Sym, bound_of, region_size, shortened_by, step_of, total
from gradlang.runtime.common import (arange_length, empty_axis, index_out_of_range, iota,
                                     trip_count)
from gradlang.runtime.errors import GradError, Span

if TYPE_CHECKING:  # rules receive a builder; the builder consults this table
    from gradlang.compiler.builder import Builder

Cts = list[Optional[Atom]]
TypeRule = Callable[[list[TensorType], dict, Optional[Span]], list[TensorType]]
VjpRule = Callable[["Builder", Eqn, list[Atom], list[bool]], Cts]


# ------------------------------------------------------------- shape rules


def broadcast_shapes(shapes: Sequence[tuple[int, ...]], span: Optional[Span]) -> tuple[int, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(rank):
        dims = {s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0}
        dims.discard(1)
        if len(dims) > 1:
            pretty = " and ".join(str(list(s)) for s in shapes)
            raise GradError(f"shapes {pretty} do not broadcast", span)
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _same_dtype(types: Sequence[TensorType], span) -> str:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise GradError(f"internal: mixed dtypes {sorted(dtypes)} reached an op", span)
    return dtypes.pop()


def _elementwise_rule(result: str = "same"):
    def rule(types, params, span):
        shape = broadcast_shapes([t.shape for t in types], span)
        if result == "bool":
            _same_dtype(types, span)
            return [TensorType("bool", shape)]
        return [TensorType(_same_dtype(types, span), shape)]
    return rule


def _where_rule(types, params, span):
    cond, a, b = types
    if cond.dtype != "bool":
        raise GradError("where() needs a bool condition", span)
    shape = broadcast_shapes([cond.shape, a.shape, b.shape], span)
    return [TensorType(_same_dtype([a, b], span), shape)]


class AxisOutOfRange(GradError):
    """An axis beyond an array's rank; `axis` is the one given, which the
    lowering of a builtin's call points at where the call writes it.  (Made
    by `axis_out_of_range`: a GradError's arguments, so that it pickles.)"""

    axis: int = 0


def axis_out_of_range(axis: int, rank: int, span) -> AxisOutOfRange:
    err = AxisOutOfRange(f"axis {axis} is out of range for rank {rank}", span)
    err.axis = axis
    return err


def _normalize_axes(axes, rank: int, span) -> tuple[int, ...]:
    out = []
    for axis in axes:
        if not -rank <= axis < rank:
            raise axis_out_of_range(axis, rank, span)
        out.append(axis % rank)
    if len(set(out)) != len(out):
        raise GradError(f"repeated axis in {tuple(axes)}", span)
    return tuple(sorted(out))


def _reduce_rule(types, params, span):
    (x,) = types
    axes = _normalize_axes(params["axes"], x.rank, span)
    shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return [TensorType(x.dtype, shape)]


def _reshape_rule(types, params, span):
    (x,) = types
    shape = tuple(params["shape"])
    if math.prod(shape) != x.size:
        raise GradError(f"cannot reshape {list(x.shape)} ({x.size} elements) "
                        f"to {list(shape)}", span)
    return [TensorType(x.dtype, shape)]


def _transpose_rule(types, params, span):
    (x,) = types
    perm = tuple(params["perm"])
    if sorted(perm) != list(range(x.rank)):
        raise GradError(f"transpose axes {list(perm)} do not match rank {x.rank}", span)
    return [TensorType(x.dtype, tuple(x.shape[p] for p in perm))]


def _broadcast_to_rule(types, params, span):
    (x,) = types
    shape = tuple(params["shape"])
    if broadcast_shapes([x.shape, shape], span) != shape:
        raise GradError(f"cannot broadcast {list(x.shape)} to {list(shape)}", span)
    return [TensorType(x.dtype, shape)]


def _slice_rule(types, params, span):
    (x,) = types
    shape = tuple(_region_length(a, b, c, d, span) for a, b, c, d in
                  zip(params["starts"], params["stops"], params["steps"], x.shape))
    return [TensorType(x.dtype, shape)]


def _region_length(start, stop, step, axis, span):
    """How many elements start:stop:step selects of an axis of size
    `axis`: between symbolic bounds (the axis's end, one shortened,
    `x[1:-1]`, limited, `x[:3]`, or a start from the end, `x[::-1]`),
    `shapes.region_size` of them."""
    if isinstance(stop, Sym) or isinstance(start, Sym):
        if isinstance(stop, Sym) == (step < 0):
            raise GradError(f"internal: a slice {start}:{stop}:{step}", span)
        return region_size(start, stop, step, axis)
    return len(range(start, stop, step))


def _embed_rule(types, params, span):
    (x,) = types
    return [TensorType(x.dtype, tuple(params["shape"]))]


def _embed_add_rule(types, params, span):
    base, x = types
    region = _slice_rule([base], params, span)[0]
    if (x.dtype, x.shape) != (base.dtype, region.shape):
        raise GradError(f"internal: embed_add of {x} into the region {region} of {base}", span)
    return [base]


def _matmul_rule(types, params, span):
    """`matmul`: (B..., m, k) @ (C..., k, n) -> (broadcast(B, C)..., m, n),
    NumPy's for operands of one rank >= 2 (the lowering pads the ranks):
    the batch axes broadcast, the last two multiply as matrices."""
    a, b = types
    if a.rank < 2 or a.rank != b.rank:
        raise GradError("internal: matmul expects operands of one rank >= 2", span)
    if a.shape[-1] != b.shape[-2]:
        raise GradError(f"matmul shapes {list(a.shape)} and {list(b.shape)} do not "
                        f"match ({a.shape[-1]} != {b.shape[-2]})", span)
    batch = broadcast_shapes([a.shape[:-2], b.shape[:-2]], span)
    return [TensorType(_same_dtype([a, b], span), batch + (a.shape[-2], b.shape[-1]))]


def _full_rule(types, params, span):
    return [TensorType(params["dtype"], tuple(params["shape"]))]


def _arange_length(start, stop, step) -> Union[int, Sym]:
    """How many values `np.arange(start, stop, step)` has: a symbolic
    `stop` (`arange(x.shape[0])`, where start is 0 and step 1) is its own
    length; NumPy counts floats as ceil((stop - start) / step).  Integers
    are counted exactly at any size (len(range) overflowed beyond 2**63:
    `one_hot(y, 10**20)`), for the builder to refuse a length no array
    can have (`runtime.common.arange_length`)."""
    if isinstance(stop, Sym):
        return stop
    return arange_length(start, stop, step)  # (refused later where too large)


def _iota_rule(types, params, span):
    length = _arange_length(params["start"], params["stop"], params["step"])
    return [TensorType(params["dtype"], (length,))]


def _cast_rule(types, params, span):
    (x,) = types
    return [TensorType(params["dtype"], x.shape)]


def _concat_rule(types, params, span):
    axis = params["axis"]
    first = types[0]
    for t in types[1:]:
        if t.rank != first.rank or any(
                a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != axis):
            raise GradError(f"cannot concatenate shapes {[list(t.shape) for t in types]} "
                            f"along axis {axis}", span)
    shape = list(first.shape)
    shape[axis] = total(t.shape[axis] for t in types)
    return [TensorType(_same_dtype(types, span), tuple(shape))]


# Gathers and scatter-adds along one axis (`params["axis"]`, normalized):
# `take` reads x[..., idx[k...], ...] (the index's shape replaces the axis),
# `take_along_axis` reads x[o, idx[o, k, i], i] (the index has x's rank),
# and each `scatter_add*` adds `values` into a copy of `base` where its
# gather would read, so repeated indices accumulate.  Indices are i32 or
# i64; a negative one counts from the end, and one out of range is an
# `ArgumentError` at run time naming `params["what"]` (the index's source
# name), at the equation's span, before any result is returned.


def _check_index(idx: TensorType, span) -> None:
    if idx.dtype not in ("i32", "i64"):
        raise GradError(f"an index must be an integer array (i32 or i64), not {idx.dtype}",
                        span)


def _check_axis(x: TensorType, axis: int, span) -> None:
    if not 0 <= axis < x.rank:
        raise axis_out_of_range(axis, x.rank, span)


def _taken_shape(x: TensorType, idx: TensorType, axis: int) -> tuple:
    return x.shape[:axis] + idx.shape + x.shape[axis + 1:]


def _take_rule(types, params, span):
    x, idx = types
    _check_index(idx, span)
    _check_axis(x, params["axis"], span)
    return [TensorType(x.dtype, _taken_shape(x, idx, params["axis"]))]


def _check_along(x: TensorType, idx: TensorType, axis: int, span) -> None:
    _check_index(idx, span)
    _check_axis(x, axis, span)
    if idx.rank != x.rank or any(a != b for k, (a, b) in enumerate(zip(x.shape, idx.shape))
                                 if k != axis):
        raise GradError(f"an index of shape {list(idx.shape)} does not fit an array of shape "
                        f"{list(x.shape)} along axis {axis}: it needs the array's shape "
                        f"on every other axis", span)


def _take_along_rule(types, params, span):
    x, idx = types
    _check_along(x, idx, params["axis"], span)
    return [TensorType(x.dtype, idx.shape)]


def _check_scatter(base: TensorType, values: TensorType, want: tuple, span) -> None:
    if base.dtype == "bool":
        raise GradError("scatter_add needs a numeric array, not bool", span)
    if values.shape != want:
        raise GradError(f"values of shape {list(values.shape)} do not match their indices: "
                        f"expected shape {list(want)}", span)
    _same_dtype([base, values], span)


def _scatter_add_rule(types, params, span):
    base, idx, values = types
    _check_index(idx, span)
    _check_axis(base, params["axis"], span)
    _check_scatter(base, values, _taken_shape(base, idx, params["axis"]), span)
    return [base]


def _scatter_along_rule(types, params, span):
    base, idx, values = types
    _check_along(base, idx, params["axis"], span)
    _check_scatter(base, values, idx.shape, span)
    return [base]


# A cumulative sum along one axis (`params["axis"]`, normalized), from the
# front, or from the back where `params["reverse"]` (its own transpose:
# y_i = sum_{j<=i} x_j makes dx_j = sum_{i>=j} dy_i).  Each output adds its
# lane's elements in order in the input's dtype, as np.cumsum does.


def _cumsum_rule(types, params, span):
    (x,) = types
    _check_axis(x, params["axis"], span)
    if x.dtype == "bool":
        raise GradError("internal: cumsum of bools (the builtin sums them as i64)", span)
    return [x]


# ------------------------------------------------- IR-building helpers


def full(b: Builder, value, shape: tuple[int, ...], dtype: str, span: Span | None = None) -> Var:
    return b.bind("full", value=value, shape=tuple(shape), dtype=dtype, span=span)


def same_value(value, identity: float, dtype: str) -> bool:
    """Whether a constant of `dtype` is `identity` (an op's row's): for a
    float, with the same sign of zero."""
    if value != identity:
        return False
    return dtype not in ("f32", "f64") or math.copysign(1.0, value) == math.copysign(
        1.0, identity)


def zeros_like(b: Builder, t: TensorType) -> Var:
    return full(b, 0, t.shape, t.dtype)


def lit(b: Builder, value, like: Atom) -> Lit:
    return b.lit(value, like.type.dtype)


def unbroadcast(b: Builder, ct: Atom, shape: tuple[int, ...]) -> Atom:
    """Sum `ct` over the axes along which a value of `shape` was broadcast."""
    if ct.type.shape == shape:
        return ct
    if isinstance(ct, Lit):
        return full(b, ct.value, shape, ct.type.dtype)
    lead = ct.type.rank - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(shape) if d == 1 and ct.type.shape[lead + i] != 1)
    summed = b.bind("reduce_sum", ct, axes=axes) if axes else ct
    if summed.type.shape != shape:
        summed = b.bind("reshape", summed, shape=shape)
    return summed


def expand_to(b: Builder, x: Atom, axes: tuple[int, ...], shape: tuple[int, ...]) -> Atom:
    """Inverse of a reduction over `axes`: reinsert them and broadcast."""
    kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
    if x.type.shape != kept:
        x = b.bind("reshape", x, shape=kept)
    if kept != shape:
        x = b.bind("broadcast_to", x, shape=shape)
    return x


def _cast_like(b: Builder, x: Atom, t: TensorType) -> Atom:
    return x if x.type.dtype == t.dtype else b.bind("cast", x, dtype=t.dtype)


# -------------------------------------------------------------- VJP rules
# Each takes (builder, eqn, cotangents of eqn's outputs, which inputs need a
# cotangent) and returns one cotangent (or None) per input.  An elementwise
# rule returns cotangents at the output's shape: `compiler.autodiff` selects
# them by the where-mask there and then undoes the broadcasting.  Any other
# rule returns them at the input's shape.


def _unary(rule: Callable[[Builder, Atom, Var, Atom], Atom]) -> VjpRule:
    """An elementwise VJP from `rule(b, x, out, ct)`."""
    def vjp(b, eqn, cts, needs):
        (x,) = eqn.inputs
        return [rule(b, x, eqn.out, cts[0]) if needs[0] else None]
    return vjp


def _binary(rule_x, rule_y) -> VjpRule:
    """An elementwise VJP from `rule_x(b, x, y, out, ct)` and `rule_y`."""
    def vjp(b, eqn, cts, needs):
        x, y = eqn.inputs
        return [rule(b, x, y, eqn.out, cts[0]) if need else None
                for need, rule in zip(needs, (rule_x, rule_y))]
    return vjp


def _mul(b, x, y):
    return b.bind("mul", x, y)


def _is_nan(b, x: Atom):
    """x != x: where x is NaN; False for a literal that is not, and for an
    integer (which has none), so that maximum(x, 0) costs no test."""
    if isinstance(x, Lit) and not (isinstance(x.value, float) and math.isnan(x.value)):
        return None
    if not x.type.is_float:
        return None
    return b.bind("ne", x, x)


def _max_vjp(pick_greater: bool):
    # The cotangent goes to the input the value is (maximum(NaN, 1) is NaN,
    # as NumPy's): a NaN input takes it all, two NaNs share it as a tie.  A
    # comparison with NaN is false both ways, so `x > y` and `x == y` alone
    # gave both inputs 0: `max(x, axis=1, initial=0)` (maximum(reduce_max,
    # 0)) dropped the gradient of a row holding NaN, which `max`'s rule
    # shares among its NaNs.  (JAX's is 0 there, PyTorch's 1 for both.)
    def rule_for(first: bool):
        def rule(b, x, y, out, ct):
            mine, other = (x, y) if first else (y, x)
            strict = b.bind("gt" if pick_greater else "lt", mine, other)
            tie = b.bind("eq", mine, other)
            mine_nan, other_nan = _is_nan(b, mine), _is_nan(b, other)
            if mine_nan is not None:
                alone = mine_nan if other_nan is None else \
                    b.bind("logical_and", mine_nan, b.bind("logical_not", other_nan))
                strict = b.bind("logical_or", strict, alone)
                if other_nan is not None:
                    tie = b.bind("logical_or", tie, b.bind("logical_and", mine_nan, other_nan))
            half = b.bind("mul", ct, lit(b, 0.5, ct))
            zero = lit(b, 0, ct)
            return b.bind("where", strict, ct, b.bind("where", tie, half, zero))
        return rule
    return _binary(rule_for(True), rule_for(False))


def _pow_a(b, x, y, out, ct):
    # y x ** (y - 1), but 0 where y is 0: x ** 0 is 1 even at x = 0, where
    # the product is 0 * inf (and so the second derivative of x ** 1).  A
    # literal exponent stays literal, so that the derivative of x ** 3 is
    # 3 x ** 2, which `compiler.passes.simplify` makes a product.
    if isinstance(y, Lit):
        if y.value == 0:
            return zeros_like(b, out.type)
        return b.bind("mul", ct, b.bind("mul", y, b.bind("pow", x, lit(b, y.value - 1, y))))
    slope = b.bind("mul", y, b.bind("pow", x, b.bind("sub", y, lit(b, 1, y))))
    zero = lit(b, 0, out)
    return b.bind("mul", ct, b.bind("where", b.bind("eq", y, zero), zero, slope))


def _pow_b(b, x, y, out, ct):
    # log(x) x ** y where x > 0, else 0 (log(1)), as TensorFlow's: 0 ** y is
    # 0 for y > 0, so its derivative there is 0, not log(0) * 0 = NaN; a
    # negative x ** y is a number only at integer y, where it has no
    # derivative in y, and log(x)'s NaN made even u * v ** (w - w) NaN in u
    # (JAX and PyTorch give NaN there).  A select, not log(1) x ** y: that
    # was 0 * inf = NaN where the power is infinite or NaN at x <= 0 (0 **
    # -1, (-2) ** 1e300, (-2) ** 0.5), where TensorFlow's is NaN too.
    zero = lit(b, 0, x)
    positive = b.bind("gt", x, zero)
    base = b.bind("where", positive, x, lit(b, 1, x))
    slope = b.bind("where", positive, b.bind("mul", b.bind("log", base), out), lit(b, 0, out))
    return b.bind("mul", ct, slope)


def _arcsinh_slope(b, x):
    # 1 / sqrt(1 + x^2) as r / sqrt(r^2 + (x r)^2) with r = 1 / max(|x|, 1):
    # x^2 overflows past |x| = 1.3e154 (1.8e19 in float32), which made the
    # slope 0 where it is 1 / |x|, a normal number.  Within [-1, 1], r is 1
    # and this is the textbook formula to the bit.  (The slope does not
    # depend on r: its derivatives through max and abs cancel.)  At x =
    # +-inf, r is 0 and x r NaN: the slope is 0 there, its limit (r itself).
    one = lit(b, 1, x)
    r = b.bind("div", one, b.bind("maximum", b.bind("abs", x), one))
    t = _mul(b, x, r)
    slope = b.bind("div", r, b.bind("sqrt", b.bind("add", _mul(b, r, r), _mul(b, t, t))))
    return b.bind("where", b.bind("eq", r, lit(b, 0, r)), r, slope)


def _arctan_slope(b, x):
    # 1 / (1 + x^2) as r^2 / (r^2 + (x r)^2) with r = 1 / max(|x|, 1), as
    # arcsinh's: x^2 overflowed past |x| = 1.3e154 (1.8e19 in float32),
    # which made the slope 0 where it is 1 / x^2, and the second
    # derivative -2x / (1 + x^2)^2 was inf / inf = NaN at x = +-inf, where
    # it is 0.  Within [-1, 1] this is the textbook formula to the bit; at
    # x = +-inf, r is 0 and so is the slope.
    one = lit(b, 1, x)
    r = b.bind("div", one, b.bind("maximum", b.bind("abs", x), one))
    t = _mul(b, x, r)
    rr = _mul(b, r, r)
    slope = b.bind("div", rr, b.bind("add", rr, _mul(b, t, t)))
    return b.bind("where", b.bind("eq", r, lit(b, 0, r)), r, slope)


def _gaussian(b, x):
    # exp(-x^2), erf's and erfc's slope but for 2 / sqrt(pi), of x taken
    # as 40 beyond |x| = 40: the same values (exp(-x^2) is 0 from |x| =
    # 27.3 in float64, 10.1 in float32), but a derivative of 0 there, where
    # exp(-x^2) (-2x) was 0 * inf = NaN at x = +-inf (their second
    # derivative; JAX's is NaN there too).  A select, not a clamp by
    # maximum and minimum, whose derivative at NaN is 0: NaN stays NaN.
    # x^2 is taken as h^2 + (x - h)(x + h), h = x's high half, as fdlibm's
    # erf does: x^2's rounding error, times x^2 in exp's argument, made
    # the slope 240 ulps off at x = 24 in float64 (21 at 9 in float32);
    # h^2 is exact and the second term small, so each exp is within an ulp.
    inside = b.bind("where", b.bind("gt", b.bind("abs", x), lit(b, 40, x)), lit(b, 40, x), x)
    high = _high_half(b, inside)
    low_part = _mul(b, b.bind("sub", inside, high), b.bind("add", inside, high))
    return _mul(b, b.bind("exp", b.bind("neg", _mul(b, high, high))),
                b.bind("exp", b.bind("neg", low_part)))


# Veltkamp's splitting constants, 2^ceil(p/2) + 1 for a p-bit significand:
# x C - (x C - x) is x rounded to its high p/2 bits, whose square is exact.
_SPLITTERS = {"f64": 134217729.0, "f32": 4097.0}


def _high_half(b, x):
    """x rounded to the high half of its significand (Veltkamp's split; x C
    must not overflow: |x| below 1e300 in float64, 8e34 in float32)."""
    scaled = _mul(b, x, lit(b, _SPLITTERS[x.type.dtype], x))
    return b.bind("sub", scaled, b.bind("sub", scaled, x))


def _where_vjp(b, eqn, cts, needs):
    cond = eqn.inputs[0]
    ct = cts[0]
    zero = lit(b, 0, ct)
    return [None, b.bind("where", cond, ct, zero) if needs[1] else None,
            b.bind("where", cond, zero, ct) if needs[2] else None]


def _cast_vjp(b, eqn, cts, needs):
    (x,) = eqn.inputs
    if not needs[0] or not x.type.is_float:
        return [None]
    return [_cast_like(b, cts[0], x.type)]


def _sum_vjp(b, eqn, cts, needs):
    (x,) = eqn.inputs
    axes = _normalize_axes(eqn.p["axes"], x.type.rank, eqn.span)
    return [expand_to(b, cts[0], axes, x.type.shape)]


def _max_reduce_vjp(b, eqn, cts, needs):
    # The cotangent is shared equally among the elements that attain the
    # max, and in a row holding NaN (whose max is NaN, as NumPy's) among its
    # NaNs, as PyTorch's: x == max is false all along such a row, which
    # made its gradient 0, silent where the loss is NaN (JAX's is NaN).
    (x,) = eqn.inputs
    axes = _normalize_axes(eqn.p["axes"], x.type.rank, eqn.span)
    peak = expand_to(b, eqn.out, axes, x.type.shape)
    hit = b.bind("logical_or", b.bind("eq", x, peak), b.bind("ne", x, x))
    count = b.bind("reduce_sum", b.bind("cast", hit, dtype=x.type.dtype), axes=axes)
    share = expand_to(b, b.bind("div", cts[0], count), axes, x.type.shape)
    return [b.bind("where", hit, share, lit(b, 0, share))]


def _power_ref(x, y):
    """pow: NumPy's, but an integer to a negative integer power is the power
    rounded toward zero (1 for a base of 1, +-1 for -1, else 0, as an
    integer division by 0 is 0), where NumPy raises."""
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype.kind == "f" or y.dtype.kind == "f" or not np.any(y < 0):
        return np.power(x, y)
    out = np.power(x, np.maximum(y, 0))
    odd = (y & 1).astype(out.dtype)
    rounded = (x == 1).astype(out.dtype) + (x == -1).astype(out.dtype) * (1 - 2 * odd)
    return np.where(y < 0, rounded, out)


def _max_ref(x, axes, empty=None):
    """reduce_max: the max along `axes`; where they are empty, `empty` (a
    static param: `max(x, initial=v)` lowers to maximum(this, v)), or with
    no `empty` an error, as NumPy's (the targets check at run time)."""
    kept = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    if empty is not None and any(x.shape[a] == 0 for a in axes):
        return np.full(kept, empty, x.dtype)
    return np.max(x, axis=tuple(axes))


def _reshape_vjp(b, eqn, cts, needs):
    (x,) = eqn.inputs
    return [b.bind("reshape", cts[0], shape=x.type.shape)]


def _transpose_vjp(b, eqn, cts, needs):
    perm = eqn.p["perm"]
    inverse = tuple(sorted(range(len(perm)), key=lambda i: perm[i]))
    return [b.bind("transpose", cts[0], perm=inverse)]


def _broadcast_to_vjp(b, eqn, cts, needs):
    (x,) = eqn.inputs
    return [unbroadcast(b, cts[0], x.type.shape)]


def _slice_vjp(b, eqn, cts, needs):
    (x,) = eqn.inputs
    p = eqn.p
    return [b.bind("embed", cts[0], shape=x.type.shape, starts=p["starts"],
                   stops=p["stops"], steps=p["steps"])]


def _embed_vjp(b, eqn, cts, needs):
    p = eqn.p
    return [b.bind("slice", cts[0], starts=p["starts"], stops=p["stops"], steps=p["steps"])]


def _embed_add_vjp(b, eqn, cts, needs):
    p = eqn.p
    return [cts[0], b.bind("slice", cts[0], starts=p["starts"], stops=p["stops"],
                           steps=p["steps"])]


def matrix_transpose(b: Builder, x: Atom) -> Var:
    """x with its last two axes swapped (each matrix of a batch transposed)."""
    rank = x.type.rank
    return b.bind("transpose", x, perm=tuple(range(rank - 2)) + (rank - 1, rank - 2))


def _matmul_vjp(b, eqn, cts, needs):
    # each side's cotangent is summed over the batch axes it was broadcast along
    x, y = eqn.inputs
    ct = cts[0]
    ct_x = unbroadcast(b, b.bind("matmul", ct, matrix_transpose(b, y)), x.type.shape) \
        if needs[0] else None
    ct_y = unbroadcast(b, b.bind("matmul", matrix_transpose(b, x), ct), y.type.shape) \
        if needs[1] else None
    return [ct_x, ct_y]


def _concat_vjp(b, eqn, cts, needs):
    axis = eqn.p["axis"]
    out, start = [], 0
    shape = eqn.out.type.shape
    if isinstance(shape[axis], Sym):
        return _symbolic_concat_vjp(b, eqn, cts, needs)
    for x, need in zip(eqn.inputs, needs):
        stop = start + x.type.shape[axis]
        if need:
            starts = tuple(start if i == axis else 0 for i in range(len(shape)))
            stops = tuple(stop if i == axis else d for i, d in enumerate(shape))
            out.append(b.bind("slice", cts[0], starts=starts, stops=stops,
                              steps=(1,) * len(shape)))
        else:
            out.append(None)
        start = stop
    return out


def _symbolic_concat_vjp(b, eqn, cts, needs):
    """The VJP of a concatenation along an axis of k M elements, pieces of
    c M (M a product of symbols, `shapes.total`: `concatenate([x, x])` of
    x of n is 2 n): the cotangent with that axis split in (k, M), each
    piece's rows of the k (fixed bounds, where M's would be offsets no
    slice has: n of 2 n) as its shape."""
    axis = eqn.p["axis"]
    shape = eqn.out.type.shape
    whole = shape[axis]
    each = Sym(whole.factors)
    rows = b.bind("reshape", cts[0], shape=shape[:axis] + (whole.coef, each) + shape[axis + 1:])
    out, start = [], 0
    for x, need in zip(eqn.inputs, needs):
        stop = start + x.type.shape[axis].coef
        if need:
            starts = tuple(start if i == axis else 0 for i in range(rows.type.rank))
            stops = tuple(stop if i == axis else d for i, d in enumerate(rows.type.shape))
            piece = b.bind("slice", rows, starts=starts, stops=stops, steps=(1,) * rows.type.rank)
            out.append(b.bind("reshape", piece, shape=x.type.shape))
        else:
            out.append(None)
        start = stop
    return out


def _gather_vjp(scatter: str) -> VjpRule:
    """A gather's VJP: its cotangent scatter-added into zeros of x's shape."""
    def vjp(b, eqn, cts, needs):
        x, idx = eqn.inputs
        if not needs[0]:
            return [None, None]
        zeros = zeros_like(b, x.type)
        return [b.bind(scatter, zeros, idx, cts[0], span=eqn.span, **eqn.p), None]
    return vjp


def _scatter_vjp(gather: str) -> VjpRule:
    """A scatter-add's VJP: the cotangent itself for `base`, and the
    cotangent gathered where the values went for `values`."""
    def vjp(b, eqn, cts, needs):
        _, idx, _ = eqn.inputs
        ct_values = b.bind(gather, cts[0], idx, span=eqn.span, **eqn.p) if needs[2] else None
        return [cts[0] if needs[0] else None, None, ct_values]
    return vjp


def _cumsum_vjp(b, eqn, cts, needs):
    return [b.bind("cumsum", cts[0], axis=eqn.p["axis"], reverse=not eqn.p["reverse"],
                   span=eqn.span)]


def _no_op_for_same_type(params: dict) -> bool:
    return True


def _is_identity_perm(params: dict) -> bool:
    return tuple(params["perm"]) == tuple(range(len(params["perm"])))


def _custom_vjp_rule(types, params, span):
    fwd = params["fwd"]
    if list(types) != list(fwd.in_types):
        raise GradError("internal: custom_vjp argument types do not match its body", span)
    return list(fwd.out_types[:params["n_out"]])


def loop_groups(seq, params, lead: int = 3) -> tuple:
    """A `loop`'s inputs (lead 3) or its body's parameters (lead 1), or
    anything laid out alike, in their groups: (the `lead` first: bounds or
    the index; carried values; invariants; stacked inputs or slices)."""
    carried_end = lead + params["n_carry"]
    invariants_end = carried_end + params["n_inv"]
    return (seq[:lead], seq[lead:carried_end], seq[carried_end:invariants_end],
            seq[invariants_end:])


def _loop_rule(types, params, span):
    """`loop`: inputs (start, stop, step, carried..., invariants..., xs...);
    outputs (carried..., ys...).  The body maps (i, carried, invariants,
    one slice of each xs) to (carried, one slice of each ys); the ys are
    stacked along a new leading axis of length `trip`, the trip count."""
    body, trip, n_carry = params["body"], params["trip"], params["n_carry"]
    bounds, carry, inv, xs = loop_groups(list(types), params)
    if any(t != TensorType("i64", ()) for t in bounds):
        raise GradError("internal: loop bounds must be i64 scalars", span)
    if any(x.rank == 0 or x.shape[0] != trip for x in xs):
        raise GradError("internal: loop inputs are not stacked by its trip count", span)
    slices = [TensorType(x.dtype, x.shape[1:]) for x in xs]
    if list(body.in_types) != [TensorType("i64", ())] + carry + list(inv) + slices:
        raise GradError("internal: loop body parameters do not match its inputs", span)
    if list(body.out_types[:n_carry]) != carry:
        raise GradError("internal: loop body results do not match its carried values", span)
    ys = body.out_types[n_carry:]
    if ys and trip is None:
        raise GradError("internal: a loop stacking results needs a trip count", span)
    return carry + [TensorType(y.dtype, (trip,) + y.shape) for y in ys]


def _check_index_rule(types, params, span):
    (idx,) = types
    _check_index(idx, span)
    return []


def _dim_rule(types, params, span):
    return [TensorType(params["dtype"], ())]


def _first_type_rule(types, params, span):
    return [types[0]]


# --------------------------------------------------------------- references


def python_slices(starts, stops, steps, whole=None) -> tuple[slice, ...]:
    """Slice params (normalized as by `slice.indices`) as Python slices: a
    negative stop there means "past the front", which Python spells None,
    and an empty range must stay empty whatever its start.  A symbolic
    bound is Python's for every size (`_python_bound`)."""
    out = []
    for k, (a, b, c) in enumerate(zip(starts, stops, steps)):
        if isinstance(a, Sym) or isinstance(b, Sym):
            axis = whole[k] if whole is not None else None
            start = _python_bound(a, axis) if isinstance(a, Sym) else a
            stop = _python_bound(b, axis) if isinstance(b, Sym) else None if b < 0 else b
            out.append(slice(start, stop, c))
        elif len(range(a, b, c)) == 0:
            out.append(slice(0, 0, 1))
        else:
            out.append(slice(a, None if b < 0 else b, c))
    return tuple(out)


def _python_bound(bound: Sym, axis) -> "int | None":
    """A symbolic bound of an axis (of size `axis`, or None: an argument's)
    as a Python slice spells it, for every size: the axis's end shortened
    (`x[:-1]`, `x[-2:]`'s start, `shapes.shortened`) is a negative bound:
    max(0, (n - a) - c) elements of an axis of max(0, n - a) are max(0, n
    - (a + c)), the bound's, for every n (of an axis of every s-th
    element, ceil(max(0, n - a) / s), the bound's c counts s apiece); one
    shortened by none is the axis's end (None), or a fixed stop k where
    it is at most k (`x[:3]`, `shapes.limited`)."""
    less = (shortened_by(bound) - shortened_by(axis)) // step_of(axis)
    if less:
        return -less
    return None if axis is not None and bound == axis else bound_of(bound)


def _embed_ref(x, shape, starts, stops, steps):
    out = np.zeros(shape, x.dtype)
    out[python_slices(starts, stops, steps)] = x
    return out


def _embed_add_ref(base, x, starts, stops, steps, assign=False):
    out = np.array(base)
    if assign:  # (where the region holds zeros: the same sum)
        out[python_slices(starts, stops, steps)] = x
    else:
        out[python_slices(starts, stops, steps)] += x
    return out


def _along_index(idx: np.ndarray, axis: int) -> tuple:
    """The NumPy index that reads x[o, idx[o, k, i], i] (as take_along_axis)."""
    grids: list = list(np.indices(idx.shape, sparse=True))
    grids[axis] = idx
    return tuple(grids)


def _scatter_add_ref(base, idx, values, axis, what):
    out = np.array(base, copy=True)
    np.add.at(out, (slice(None),) * axis + (idx,), values)
    return out


def _scatter_along_ref(base, idx, values, axis, what):
    out = np.array(base, copy=True)
    np.add.at(out, _along_index(idx, axis), values)
    return out


def _check_index_ref(idx, size, what, where):
    bad = np.flatnonzero((idx < -size) | (idx >= size))
    if bad.size:
        index_out_of_range(where, int(np.ravel(idx)[bad[0]]), size)


def _check_nonempty_ref(shape, axes, where):
    empty_axis(shape, axes, where, None)


def _cumsum_ref(x, axis, reverse):
    if not reverse:
        return np.cumsum(x, axis=axis, dtype=x.dtype)
    return np.flip(np.cumsum(np.flip(x, axis), axis=axis, dtype=x.dtype), axis)


def _np_dtype(dtype: str):
    return NUMPY_DTYPES[dtype]


def _sigmoid_ref(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


def _sigmoid_slope_ref(x):
    e = np.exp(-np.abs(x))
    return (e / ((1 + e) * (1 + e))).astype(x.dtype)


def _tanh_slope_ref(x):
    e = np.exp(-2 * np.abs(x.astype(np.longdouble)))
    return (4 * e / ((1 + e) * (1 + e))).astype(x.dtype)


def _erf_ref(x):
    return np.vectorize(math.erf, otypes=[x.dtype])(x) if x.size else x.copy()


def _erfc_ref(x):
    return np.vectorize(math.erfc, otypes=[x.dtype])(x) if x.size else x.copy()


# ------------------------------------------------------------------ the row

_SAME = _elementwise_rule()
_BOOL_RESULT = _elementwise_rule("bool")


@dataclass(frozen=True)
class Op:
    """One primitive.  The defaults describe an elementwise op that keeps
    its inputs' dtype and has no derivative."""

    name: str
    # "elementwise" (fusable into a loop), "reduction", "layout" (shape
    # only: reshape, transpose, slicing, ...), "matmul", "index" (a gather
    # or scatter-add by an integer index array, checked at run time),
    # "scan" (a cumulative sum along an axis, lane by lane), "check" (an
    # op with no outputs, run for the `ArgumentError` it may raise: DCE
    # keeps it, and no pass moves it out of a loop),
    # "shape" (a value the driver makes from sizes alone: dim, iota),
    # "call" (a user function carrying its gradient) or "loop" (a
    # structured loop whose body is a sub-function)
    kind: str = "elementwise"
    # (in_types, params, span) -> out_types; elementwise inputs already
    # share one dtype (`compiler.lower` inserts the casts)
    type_rule: TypeRule = _SAME
    # (builder, eqn, cts, needs) -> input cotangents, built as IR (see "VJP
    # rules" above); None: no derivative flows through the op
    vjp: Optional[VjpRule] = None
    # the NumPy reference: the oracle of the op-table tests and what
    # `compiler.interpret` runs
    ref: Optional[Callable[..., Any]] = None
    # the scalar expression a fused loop evaluates ({0}, {1}: the inputs,
    # {T}: the output dtype's constructor), the same on every target (`math`
    # in a kernel is the target's math module)
    template: Optional[str] = None
    # the template for integer outputs where it differs (pow: Python's
    # exact integer power, not the float function)
    int_template: Optional[str] = None
    # the float template in kernels of a target whose compiler does not
    # lower a float remainder exactly (`Target.exact_float_remainder`):
    # through its kernel math's floor_quotient / floor_remainder, on fmod
    fmod_template: Optional[str] = None
    # the template in kernels, where it differs: a call of a function the
    # targets' kernel headers import (`select`: one instruction, not the
    # blocks Numba makes of a conditional expression)
    kernel_template: Optional[str] = None
    arity: int = 1  # -1: any number of inputs
    # where the op-table tests sample each input: real | positive | unit |
    # nonzero | bool | index (in range for the axis, repeats and negatives
    # included); one string for every input, or one per input
    domain: Union[str, tuple[str, ...]] = "real"
    float_only: bool = False  # integer inputs are cast to f64 first
    tol: float = 1e-5  # how close f32 must come to the reference
    # the name that calls the op from `.grad` source (None: not callable)
    source_name: Optional[str] = None
    # e with `x op e == x` for every x, in IEEE arithmetic too, the sign of
    # a zero included (`same_value`): a sum's is -0.0, since -0.0 + 0.0 is
    # 0.0; with `commutative`, `e op x == x` too.  There are no absorbing
    # elements: x * 0 is NaN, not 0, for x = inf.
    identity: Optional[float] = None
    commutative: bool = False
    # params -> whether the op returns its first input unchanged when the
    # output has the input's type (a cast to the same dtype, ...)
    no_op_if: Optional[Callable[[dict], bool]] = None
    # how `compiler.autodiff` applies the where-mask of the output (where
    # it may be nonzero): "select" re-selects every input cotangent by it,
    # so a branch not taken contributes exactly 0 even where the local
    # derivative is inf; "branches" is `where` itself, whose rule already
    # selects, and whose branch k narrows the mask to where it was taken.
    # (Through elementwise ops and calls; layout ops, reductions and
    # gathers move the mask to their inputs: see `autodiff.select_by_mask`.)
    masking: str = "select"
    # for an op that picks one of its two inputs (maximum, minimum): the
    # comparison of an input with the other under which it is picked (ties
    # included), outside which its tangent contributes nothing: forward
    # mode narrows a tangent's where-mask by it (`autodiff.elementwise_mask`)
    picked_when: Optional[str] = None
    # the work of one element of the op in a fused loop beyond that of the
    # loop itself (its loads and stores, and arithmetic, which vectorizes
    # and hides behind them): in units of a loop element (about 0.3 ns), so
    # 0 for arithmetic.  `loop_cost` sums it; the CPU target runs a costlier
    # loop in parallel from fewer elements (`CpuTarget.launch`).  Measured
    # (`benchmarks/bench_threshold.py --ops`) and rounded to a power of two:
    # the order matters, not the digits.  exp, log, log1p, expm1, tanh and
    # sigmoid were remeasured once the CPU kernels vectorized them (2.3, 2.8,
    # 3.6, 4.4-5.5, 7.2 and 5.7 loop elements, twice at load 5-6, against
    # 16-64 with scalar libm calls).
    cost: int = 0
    # How the op is linear, for grad blocks (which must be linear in their
    # upstream cotangents, `compiler.linearity`) and their transposition:
    # None: in no input; "jointly": in all its inputs together (add, layout
    # ops); "each": in any one input, the others held fixed (mul, matmul);
    # "first": in its first input, the others held fixed (div, gathers);
    # "branches": in inputs 1.. together, input 0 held fixed (where).
    # Integer inputs (indices) are always held fixed.  A linear op's
    # transpose with respect to those inputs is its VJP rule.
    linear: Optional[str] = None
    # inputs read only as a data dependency, never for their value (the
    # op is the identity on its first input)
    token_inputs: tuple[int, ...] = ()
    # the output is the first input with values added into it (a
    # scatter-add): the driver may add in place when it owns that input
    adds_into_first: bool = False
    # The template is IEEE arithmetic that NumPy scalars of the op's dtype
    # compute bit for bit as a kernel does (the basic operations, negation,
    # comparisons, selections, casts): never a math function, whose kernel
    # value comes from the target's math module and may differ from
    # NumPy's by an ulp.  `fold` evaluates such an op on constants at
    # compile time (`compiler.passes.simplify`), and a driver may evaluate
    # a one-element loop of them itself, with no kernel (`compiler.codegen`).
    exact: bool = False

    def linear_slots(self, n_inputs: int) -> list[frozenset[int]]:
        """The sets of inputs the op is linear in together: the output is a
        linear map of one set's inputs while the other inputs are held fixed."""
        everything = range(n_inputs)
        return {None: [],
                "jointly": [frozenset(everything)],
                "each": [frozenset([i]) for i in everything],
                "first": [frozenset([0])],
                "branches": [frozenset(range(1, n_inputs))]}[self.linear]

    @property
    def differentiable(self) -> bool:
        # a call's derivative is its grad block (see `compiler.autodiff`)
        return self.vjp is not None or self.kind in ("call", "loop")

    @property
    def domains(self) -> tuple[str, ...]:
        if isinstance(self.domain, tuple):
            return self.domain
        return (self.domain,) * max(self.arity, 0)


# ---------------------------------------------------------------- the table

_SQRT_2_OVER_PI = 2.0 / math.sqrt(math.pi)
# math.floor and friends return integers: beyond 2**52 (and for inf and NaN)
# a float is already integral, so it is returned as it is; below, the
# integer back as a float takes x's sign, which a zero result lost (floor
# of -0.0, ceil and round of x in (-1, 0) are -0.0, as NumPy's are).
_INTEGRAL = ("{0} if not (abs({0}) < 4503599627370496.0) "
             "else {T}(math.copysign({T}(%s({0})), {0}))")
# x // y and x % y of a float x = +-inf by a y neither 0 nor NaN: NumPy's
# NaN is fmod's invalid one, inf - inf, as `x - x` is.  Numba's is too but
# where y is a constant power of two >= 1, which LLVM's x86 backend lowers
# as copysign(x - trunc(x / y) * y, x): at x = +inf a NaN with the sign bit
# clear, NumPy's has it set.  (No `math.`: these ops are `exact`, run on
# NumPy scalars in drivers and folding too.)
_INFINITE_DIVIDEND = "{0} - {0} if abs({0}) == np.inf and {1} != 0 and {1} == {1} else "
# exp(-|x|) in both branches (it is exp(-x), then exp(x)): the same call as
# sigmoid_slope's, which LLVM then computes once where a kernel has both (a
# value and gradient: 0.76 ms against 1.53 at 1e6 f64, bit for bit the same)
_SIGMOID = ("{T}(1) / ({T}(1) + math.exp(-abs({0}))) if {0} >= 0 "
            "else math.exp(-abs({0})) / ({T}(1) + math.exp(-abs({0})))")
_SIGMOID_SLOPE = ("math.exp(-abs({0})) / "
                  "(({T}(1) + math.exp(-abs({0}))) * ({T}(1) + math.exp(-abs({0}))))")


# Integer +, - and * (and negation) in kernels: in unsigned 64-bit
# arithmetic, converted back to the output's dtype.  Numba marks signed
# integer arithmetic "no signed wrap" (nsw), and LLVM then takes an
# overflow for impossible and folds it away: `(y + 1) > y` was True at the
# greatest i64 and `y + (least i64)` an `or`, where NumPy's values wrap
# around.  Unsigned arithmetic wraps by definition, with the bits of the
# two's complement result, so the conversion back is NumPy's value; both
# conversions are no instructions, and the loops vectorize as before.
def _wrapping(symbol: str) -> str:
    return f"np.uint64({{0}}) {symbol} np.uint64({{1}})"


# tanh'(x) = 4 E / (1 + E)^2 with E = exp(-2|x|), as 4 q (1 - q) for
# q = 1 / (1 + exp(2|x|)) (E / (1 + E)): the exp the CPU kernels'
# `math.tanh` computes (the same argument, so LLVM computes it once where a
# kernel has both: the suite's value and slope at 1e6 float32 took 0.375 ms,
# 0.583 with fdlibm's tanh and an expm1), 0 where it overflows, and no
# cancellation: 1 - q is at least 1/2.  (1 - tanh^2, which JAX and PyTorch
# take, cancels: half the slope at x = 9 in float32, 0 from 9.01 on.)
_TANH_Q = "{T}(1) / ({T}(1) + math.exp({T}(2) * abs({0})))"
_TANH_SLOPE = f"{{T}}(4) * ({_TANH_Q}) * ({{T}}(1) - {_TANH_Q})"


_TABLE: tuple[Op, ...] = (
    # ---- elementwise, one input
    Op("neg", exact=True, linear="jointly", template="-{0}",
       int_template="np.uint64(0) - np.uint64({0})", ref=np.negative,
       vjp=_unary(lambda b, x, o, ct: b.bind("neg", ct))),
    Op("exp", template="math.exp({0})", ref=np.exp, float_only=True, source_name="exp",
       vjp=_unary(lambda b, x, o, ct: _mul(b, ct, o)), cost=2),
    Op("log", template="math.log({0})", ref=np.log, float_only=True, source_name="log",
       domain="positive", vjp=_unary(lambda b, x, o, ct: b.bind("div", ct, x)), cost=2),
    Op("log1p", template="math.log1p({0})", ref=np.log1p, float_only=True,
       source_name="log1p", domain="positive",
       vjp=_unary(lambda b, x, o, ct: b.bind("div", ct, b.bind("add", x, lit(b, 1, x)))), cost=4),
    # exp(x), not expm1(x) + 1: that cancels to 0 below x = -37 (-17 in
    # float32), where exp(x) is still a normal number
    Op("expm1", template="math.expm1({0})", ref=np.expm1, float_only=True,
       source_name="expm1",
       vjp=_unary(lambda b, x, o, ct: _mul(b, ct, b.bind("exp", x))), cost=4),
    Op("sqrt", template="math.sqrt({0})", ref=np.sqrt, float_only=True, source_name="sqrt",
       domain="positive",
       vjp=_unary(lambda b, x, o, ct: b.bind("div", ct, b.bind("mul", o, lit(b, 2, o)))), cost=1),
    Op("sin", template="math.sin({0})", ref=np.sin, float_only=True, source_name="sin",
       vjp=_unary(lambda b, x, o, ct: _mul(b, ct, b.bind("cos", x))), cost=32),
    Op("cos", template="math.cos({0})", ref=np.cos, float_only=True, source_name="cos",
       vjp=_unary(lambda b, x, o, ct: b.bind("neg", _mul(b, ct, b.bind("sin", x)))), cost=32),
    Op("tan", template="math.tan({0})", ref=np.tan, float_only=True, source_name="tan",
       domain="unit",
       vjp=_unary(lambda b, x, o, ct: _mul(b, ct, b.bind("add", lit(b, 1, o), _mul(b, o, o)))),
       cost=64),
    Op("tanh", template="math.tanh({0})", ref=np.tanh, float_only=True, source_name="tanh",
       vjp=_unary(lambda b, x, o, ct: _mul(b, ct, b.bind("tanh_slope", x))), cost=8),
    # tanh'' = -2 tanh' tanh
    Op("tanh_slope", template=_TANH_SLOPE, ref=_tanh_slope_ref, float_only=True,
       vjp=_unary(lambda b, x, o, ct: b.bind("neg", _mul(b, _mul(b, ct, o), _mul(
           b, lit(b, 2, x), b.bind("tanh", x))))), cost=8),
    Op("sinh", template="math.sinh({0})", ref=np.sinh, float_only=True, source_name="sinh",
       vjp=_unary(lambda b, x, o, ct: _mul(b, ct, b.bind("cosh", x))), cost=64),
    Op("cosh", template="math.cosh({0})", ref=np.cosh, float_only=True, source_name="cosh",
       vjp=_unary(lambda b, x, o, ct: _mul(b, ct, b.bind("sinh", x))), cost=32),
    Op("arctan", template="math.atan({0})", ref=np.arctan, float_only=True,
       source_name="arctan",
       vjp=_unary(lambda b, x, o, ct: _mul(b, ct, _arctan_slope(b, x))), cost=32),
    Op("arcsinh", template="math.asinh({0})", ref=np.arcsinh, float_only=True,
       source_name="arcsinh",
       vjp=_unary(lambda b, x, o, ct: _mul(b, ct, _arcsinh_slope(b, x))), cost=64),
    # sigmoid' is its own op, not s (1 - s): 1 - s cancels to 0 above x = 37
    # (17 in float32) and loses digits well before
    Op("sigmoid", template=_SIGMOID, ref=_sigmoid_ref, float_only=True, source_name="sigmoid",
       vjp=_unary(lambda b, x, o, ct: _mul(b, ct, b.bind("sigmoid_slope", x))), cost=4),
    # sigmoid(x) sigmoid(-x) = e / (1 + e)^2 with e = exp(-|x|): accurate
    # everywhere, for one exp (its copies are one value to LLVM).  Its own
    # derivative is itself times -tanh(x / 2), smooth at 0, where |x| is not.
    Op("sigmoid_slope", template=_SIGMOID_SLOPE, ref=_sigmoid_slope_ref, float_only=True,
       vjp=_unary(lambda b, x, o, ct: b.bind("neg", _mul(b, _mul(b, ct, o), b.bind(
           "tanh", _mul(b, x, lit(b, 0.5, x)))))), cost=4),
    Op("erf", template="math.erf({0})", ref=_erf_ref, float_only=True, source_name="erf",
       vjp=_unary(lambda b, x, o, ct: _mul(b, ct, _mul(b, lit(b, _SQRT_2_OVER_PI, x),
                                                      _gaussian(b, x)))), cost=32),
    # 1 - erf(x), with its digits where erf is near 1 (the normal's upper tail)
    Op("erfc", template="math.erfc({0})", ref=_erfc_ref, float_only=True, source_name="erfc",
       vjp=_unary(lambda b, x, o, ct: b.bind("neg", _mul(b, ct, _mul(
           b, lit(b, _SQRT_2_OVER_PI, x), _gaussian(b, x))))),
       cost=32),
    Op("abs", exact=True, template="abs({0})", ref=np.abs, source_name="abs", domain="nonzero",
       vjp=_unary(lambda b, x, o, ct: _mul(b, ct, b.bind("sign", x)))),
    # 0 for -0.0 as for 0.0 (NumPy's), NaN for NaN
    Op("sign", template=("{T}(1) if {0} > 0 else ({T}(-1) if {0} < 0 else "
                         "({T}(0) if {0} == 0 else {0}))"),
       ref=np.sign, source_name="sign", exact=True),
    Op("floor", template=_INTEGRAL % "math.floor", ref=np.floor, float_only=True,
       source_name="floor"),
    Op("ceil", template=_INTEGRAL % "math.ceil", ref=np.ceil, float_only=True,
       source_name="ceil"),
    # Python's round() rounds half to even, like np.rint, in Numba on every target.
    Op("round", template=_INTEGRAL % "round", ref=np.rint, float_only=True,
       source_name="round"),
    Op("logical_not", exact=True, template="not {0}", ref=np.logical_not, domain="bool"),
    Op("stop_gradient", template="{0}", ref=lambda x: x.copy(), source_name="stop_gradient",
       no_op_if=_no_op_for_same_type, exact=True),
    Op("cast", exact=True, linear="jointly", type_rule=_cast_rule, vjp=_cast_vjp, template="{0}",
       ref=lambda x, dtype: x.astype(_np_dtype(dtype)), no_op_if=_no_op_for_same_type),
    Op("full", type_rule=_full_rule, template="{value}", arity=0,
       ref=lambda value, shape, dtype: np.full(shape, value, _np_dtype(dtype))),
    # ---- elementwise, two inputs
    Op("add", template="{0} + {1}", int_template=_wrapping("+"), ref=np.add, arity=2,
       identity=-0.0, commutative=True, linear="jointly", exact=True,
       vjp=_binary(lambda b, x, y, o, ct: ct, lambda b, x, y, o, ct: ct)),
    Op("sub", linear="jointly", template="{0} - {1}", int_template=_wrapping("-"),
       ref=np.subtract, arity=2, identity=0, exact=True,
       vjp=_binary(lambda b, x, y, o, ct: ct, lambda b, x, y, o, ct: b.bind("neg", ct))),
    Op("mul", template="{0} * {1}", int_template=_wrapping("*"), ref=np.multiply, arity=2,
       identity=1, commutative=True, linear="each", exact=True,
       vjp=_binary(lambda b, x, y, o, ct: _mul(b, ct, y), lambda b, x, y, o, ct: _mul(b, ct, x))),
    Op("div", template="{0} / {1}", ref=np.divide, arity=2, identity=1, float_only=True,
       linear="first", exact=True,
       domain=("real", "nonzero"),
       vjp=_binary(lambda b, x, y, o, ct: b.bind("div", ct, y),
                   lambda b, x, y, o, ct: b.bind("neg", b.bind("div", _mul(b, ct, o), y)))),
    # Python's and NumPy's: the quotient rounded toward -inf, and the
    # remainder with the divisor's sign (x == (x // y) * y + x % y).  Numba
    # computes both as NumPy does, bit for bit, but two cases.  An integer
    # x // -1, which it makes 0 where x is the least integer (NumPy wraps to
    # x; negated as `_wrapping` says).  And a float x = +-inf by a nonzero y that is not NaN (see
    # _INFINITE_DIVIDEND).
    Op("floor_divide", template=_INFINITE_DIVIDEND + "{0} // {1}",
       int_template="{T}(np.uint64(0) - np.uint64({0})) if {1} == -1 else {0} // {1}",
       fmod_template=_INFINITE_DIVIDEND + "math.floor_quotient({0}, {1}, {T}(1))",
       ref=np.floor_divide, arity=2, exact=True, domain=("real", "nonzero"), cost=16),
    Op("remainder", template=_INFINITE_DIVIDEND + "{0} % {1}",
       int_template="{0} % {1}",
       fmod_template=_INFINITE_DIVIDEND + "math.floor_remainder({0}, {1}, {T}(1))",
       ref=np.remainder, arity=2, exact=True, domain=("real", "nonzero"), cost=16,
       vjp=_binary(lambda b, x, y, o, ct: ct, lambda b, x, y, o, ct: b.bind(
           "neg", _mul(b, ct, b.bind("floor_divide", x, y))))),
    # (`compiler.passes.simplify` turns small integer powers into products;
    # a negative integer exponent is spelled out: Numba's i64 0 ** -1 was
    # the least integer, its i32 one 0; and so is one beyond 2**16, which
    # Numba takes to math.pow in float64 and back: the least integer where
    # NumPy's wraps around (3 ** 65537), and an even power where 2**53 + 1
    # rounded to 2**53 ((-1) ** (2**53 + 1) was 1).  It is split into
    # 16-bit digits, each power of 2**16 a literal one, which Numba unrolls
    # into products that wrap as NumPy's do.)
    Op("pow", template="math.pow({0}, {1})",
       int_template="({0} ** {1} if {1} <= 65536 else ((({0} ** ({1} >> 48)) ** 65536 * "
                    "{0} ** (({1} >> 32) & 65535)) ** 65536 * {0} ** (({1} >> 16) & 65535)) "
                    "** 65536 * {0} ** ({1} & 65535)) if {1} >= 0 else {T}({0} == 1) + "
                    "{T}({0} == -1) * {T}(1 - 2 * ({1} & 1))", ref=_power_ref,
       arity=2, domain=("positive", "real"), identity=1, tol=1e-4,
       vjp=_binary(_pow_a, _pow_b), cost=64),
    Op("maximum", template="{0} if ({0} > {1} or {0} != {0}) else {1}", ref=np.maximum,
       exact=True, arity=2, commutative=True, source_name="maximum", vjp=_max_vjp(True),
       picked_when="ge"),
    Op("minimum", template="{0} if ({0} < {1} or {0} != {0}) else {1}", ref=np.minimum,
       exact=True, arity=2, commutative=True, source_name="minimum", vjp=_max_vjp(False),
       picked_when="le"),
    Op("lt", exact=True, type_rule=_BOOL_RESULT, template="{0} < {1}", ref=np.less, arity=2),
    Op("le", exact=True, type_rule=_BOOL_RESULT, template="{0} <= {1}", ref=np.less_equal,
       arity=2),
    Op("gt", exact=True, type_rule=_BOOL_RESULT, template="{0} > {1}", ref=np.greater, arity=2),
    Op("ge", exact=True, type_rule=_BOOL_RESULT, template="{0} >= {1}", ref=np.greater_equal,
       arity=2),
    Op("eq", exact=True, type_rule=_BOOL_RESULT, template="{0} == {1}", ref=np.equal, arity=2),
    Op("ne", exact=True, type_rule=_BOOL_RESULT, template="{0} != {1}", ref=np.not_equal, arity=2),
    Op("logical_and", exact=True, template="{0} & {1}", ref=np.logical_and, arity=2,
       domain="bool"),
    Op("logical_or", exact=True, template="{0} | {1}", ref=np.logical_or, arity=2,
       domain="bool"),
    # ---- elementwise, three inputs
    Op("where", exact=True, type_rule=_where_rule, vjp=_where_vjp, template="{1} if {0} else {2}",
       kernel_template="select({0}, {1}, {2})", linear="branches",
       ref=np.where, arity=3, domain=("bool", "real", "real"), source_name="where",
       masking="branches"),
    # ---- reductions, layout, matmul
    Op("reduce_sum", linear="jointly", kind="reduction", type_rule=_reduce_rule, vjp=_sum_vjp,
       ref=lambda x, axes: np.sum(x, axis=tuple(axes)).astype(x.dtype)),
    Op("reduce_max", kind="reduction", type_rule=_reduce_rule, vjp=_max_reduce_vjp,
       ref=_max_ref),
    Op("reshape", linear="jointly", kind="layout", type_rule=_reshape_rule, vjp=_reshape_vjp,
       ref=lambda x, shape: np.reshape(x, shape), no_op_if=_no_op_for_same_type),
    Op("transpose", linear="jointly", kind="layout", type_rule=_transpose_rule,
       vjp=_transpose_vjp,
       ref=lambda x, perm: np.transpose(x, perm), no_op_if=_is_identity_perm),
    Op("broadcast_to", kind="layout", type_rule=_broadcast_to_rule, vjp=_broadcast_to_vjp,
       linear="jointly",
       ref=lambda x, shape: np.broadcast_to(x, shape), no_op_if=_no_op_for_same_type),
    Op("slice", linear="jointly", kind="layout", type_rule=_slice_rule, vjp=_slice_vjp,
       ref=lambda x, starts, stops, steps: x[python_slices(starts, stops, steps)]),
    Op("embed", kind="layout", type_rule=_embed_rule, vjp=_embed_vjp, ref=_embed_ref,
       linear="jointly"),
    Op("concatenate", kind="layout", type_rule=_concat_rule, vjp=_concat_vjp, arity=-1,
       linear="jointly",
       ref=lambda *xs, axis: np.concatenate(xs, axis=axis)),
    Op("matmul", kind="matmul", type_rule=_matmul_rule, vjp=_matmul_vjp, ref=np.matmul,
       linear="each",
       arity=2, tol=1e-4),
    # ---- scans (see "A cumulative sum" above)
    Op("cumsum", kind="scan", type_rule=_cumsum_rule, vjp=_cumsum_vjp, ref=_cumsum_ref,
       linear="jointly"),
    # ---- gathers and scatter-adds (see "Gathers and scatter-adds" above)
    Op("take", kind="index", type_rule=_take_rule, vjp=_gather_vjp("scatter_add"),
       ref=lambda x, idx, axis, what: np.take(x, idx, axis=axis), arity=2,
       domain=("real", "index"), linear="first"),
    Op("take_along_axis", kind="index", type_rule=_take_along_rule,
       vjp=_gather_vjp("scatter_add_along_axis"),
       ref=lambda x, idx, axis, what: np.take_along_axis(x, idx, axis=axis), arity=2,
       domain=("real", "index"), linear="first"),
    Op("scatter_add", kind="index", type_rule=_scatter_add_rule, vjp=_scatter_vjp("take"),
       ref=_scatter_add_ref, arity=3, domain=("real", "index", "real"), linear="jointly",
       adds_into_first=True),
    Op("scatter_add_along_axis", kind="index", type_rule=_scatter_along_rule,
       vjp=_scatter_vjp("take_along_axis"), ref=_scatter_along_ref, arity=3,
       domain=("real", "index", "real"), linear="jointly", adds_into_first=True),
    # The checks (kind "check"): their references raise the drivers' errors
    # (`compiler.interpret` passes them `where`, the place and message).
    # What a gather or scatter-add checks, alone: that every index of its
    # input lies in [-size, size) (`params["size"]`, a `Dim`), else the
    # op's `ArgumentError` (naming `params["what"]`, at its span).  It has
    # no outputs: `compiler.passes.dce` leaves one in place of a gather or
    # scatter-add whose result nothing reads, and keeps it, so that an
    # index out of range is an error wherever it is written, whatever
    # reads the result (a gradient w.r.t. the scatter's base needs none).
    Op("check_index", kind="check", type_rule=_check_index_rule, ref=_check_index_ref,
       domain="index"),
    # What a max over axes that may be empty checks, alone (`params`: the
    # shape of its input and the axes, as `reduce_max`'s): that none of
    # them is, else its `ArgumentError`.  No inputs, no outputs.
    Op("check_nonempty", kind="check", type_rule=lambda types, params, span: [],
       ref=_check_nonempty_ref, arity=0),
    # What a loop checks of its bounds (start, stop, step), alone: a step
    # of zero, or more trips than a loop counts, is its `ArgumentError`.
    Op("check_trips", kind="check", type_rule=lambda types, params, span: [],
       ref=lambda start, stop, step, where: trip_count(int(start), int(stop), int(step), where)
       and None,
       arity=3),
    # ---- internal
    # A size known only at call time (a `Sym`), as a scalar: what `mean`
    # divides by when the reduced axes are symbolic.  The driver computes it.
    Op("dim", kind="shape", type_rule=_dim_rule, arity=0),
    # Identity on its first input, with a data dependency on its second (a
    # cotangent): what a `@recompute` backward reruns stays in the backward
    # pass.
    Op("recompute_barrier", kind="layout", type_rule=_first_type_rule, arity=2,
       linear="first", token_inputs=(1,),
       vjp=lambda b, eqn, cts, needs: [cts[0], None], ref=lambda x, token: x,
       no_op_if=_no_op_for_same_type),
    # `base + embed(x)`: x added into the strided region of base that the
    # params slice (as `embed` places it), in place where the driver owns
    # base; with `assign`, written there (the region holds zeros).  Only
    # fusion makes it (`compiler.in_place_sums`), of a sum of embeds.
    Op("embed_add", kind="layout", type_rule=_embed_add_rule, vjp=_embed_add_vjp,
       ref=_embed_add_ref, arity=2, linear="jointly", adds_into_first=True),
    # `np.arange(start, stop, step)` (int64 or float64), made by the driver
    # (see docs/internals.md, "The op table", why not inside fused loops);
    # `stop` may be a symbolic size where start is 0 and step 1.
    Op("iota", kind="shape", type_rule=_iota_rule, arity=0,
       ref=lambda start, stop, step, dtype: iota(start, stop, step, _np_dtype(dtype))),
    # A `for` loop (see `_loop_rule`); `compiler.autodiff` differentiates
    # it as a reverse loop over the states the forward one stacks.
    Op("loop", kind="loop", type_rule=_loop_rule, arity=-1),
    # A call to a user function with grad blocks; `compiler.autodiff` gives
    # it its gradient (the `bwd` sub-function) and
    # `compiler.passes.inline_calls` replaces it by its `fwd` body once no
    # more differentiation is to come.
    Op("custom_vjp", kind="call", type_rule=_custom_vjp_rule, arity=-1),
)

OPS: dict[str, Op] = {op.name: op for op in _TABLE}
FLOAT_ONLY = {name for name, op in OPS.items() if op.float_only}


def output_types(op: str, types: Sequence[TensorType], params: Sequence[tuple[str, Any]],
                 span: Optional[Span]) -> list[TensorType]:
    """`OPS[op].type_rule` of these input types and params (an equation's
    sorted items), remembered where the params are plain values: building
    a function and verifying it after each pass ask the same few questions
    again and again (a 1,200-term chain asked 310,000 of them).  A rule
    that raises is asked each time, so that its error names this span."""
    if not all(_plain(value) for _, value in params):  # a loop's body
        return OPS[op].type_rule(list(types), dict(params), span)
    # (the params' types are in the key, or True, 1 and 1.0 would share one)
    key = (op, tuple(types), tuple((name, type(value), value) for name, value in params))
    found = _REMEMBERED_TYPES.get(key)
    if found is None:
        found = tuple(OPS[op].type_rule(list(types), dict(params), span))
        if len(_REMEMBERED_TYPES) >= 4096:
            _REMEMBERED_TYPES.clear()
        _REMEMBERED_TYPES[key] = found
    return list(found)


_REMEMBERED_TYPES: dict[tuple, tuple[TensorType, ...]] = {}


def _plain(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return isinstance(value, (bool, int, float, str, Sym, type(None)))


def loop_cost(op_names: Iterable[str]) -> int:
    """The work of one element of a fused loop evaluating these ops, in the
    units of `Op.cost`: the loop's own (1) and its ops'."""
    return 1 + sum(OPS[name].cost for name in op_names)


def scalar_expression(op: str, args: Sequence[str], dtype: str,
                      spell: Callable[[str], str] = str, target=None) -> str:
    """Source text for `op` applied to scalars (the expressions `args`), as
    its template says, converted to its output's `dtype`: what a fused
    loop computes per element.  `spell(dtype)` names a dtype's scalar type
    (a kernel's `f64`, NumPy's `np.float64` in a driver).  `target`: the
    kernel's `runtime.target.Target` (None: Python on the host, a driver's
    or constant folding's)."""
    row = OPS[op]
    if row.int_template and dtype in INTS:
        template = row.int_template
    elif row.fmod_template and target is not None and not target.exact_float_remainder:
        template = row.fmod_template
    elif row.kernel_template and target is not None:
        template = row.kernel_template
    else:
        template = row.template
    return f"{spell(dtype)}({template.format(*args, T=spell(dtype))})"


def numpy_spelling(dtype: str) -> str:
    """A dtype's NumPy scalar type, as generated Python source names it."""
    return f"np.{NUMPY_NAMES[dtype]}"


@functools.lru_cache(maxsize=None)
def _folding_code(op: str, arity: int, dtype: str):
    return compile(scalar_expression(op, [f"x{k}" for k in range(arity)], dtype,
                                     numpy_spelling), f"<{op} folded>", "eval")


def fold(op: str, values: Sequence, in_dtypes: Sequence[str], dtype: str):
    """The value of `op` on constants (`values`, of `in_dtypes`) exactly as
    a kernel computes it, as a Python scalar of the output's `dtype`: its
    template run on NumPy scalars of those dtypes, with NumPy's warnings
    silenced as a kernel has none (1 / 0 is inf, NaN propagates).  None
    where that could differ from a kernel: an op that is not `exact`, or
    a cast of a float that the integer type does not hold (NaN, inf, out
    of range: a kernel's conversion is undefined there)."""
    if not OPS[op].exact:
        return None
    with np.errstate(all="ignore"):
        args = [NUMPY_DTYPES[d](v) for v, d in zip(values, in_dtypes)]
        if op == "cast" and dtype in INTS and in_dtypes[0] in FLOATS:
            limits, x = np.iinfo(NUMPY_DTYPES[dtype]), float(args[0])
            if not (math.isfinite(x) and limits.min <= math.trunc(x) <= limits.max):
                return None
        return eval(_folding_code(op, len(args), dtype), {"np": np},
                    {f"x{k}": a for k, a in enumerate(args)}).item()
