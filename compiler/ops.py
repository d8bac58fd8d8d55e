"""The table of primitives: every op declared once.

Contract: `OPS[name]` is an `Op` holding everything the rest of the compiler
needs to know about a primitive:

- `kind`: "elementwise" (fusable into a loop), "reduction", "layout"
  (shape-only: reshape, transpose, slicing, ...), "matmul", or "call"
  (a user function carrying its own gradient);
- `type_rule(in_types, params, span) -> out_types` (shapes broadcast as in
  NumPy; elementwise inputs already share one dtype, `compiler.lower`
  inserts the casts);
- `vjp(builder, eqn, cts, needs) -> input cotangents`: builds IR for the
  vector-Jacobian product, returning None for inputs without a gradient;
- `template`: the scalar expression a fused loop evaluates (`{0}`, `{1}` are
  the inputs, `{T}` the output dtype's constructor), the same on every
  target (`math` in a kernel is the target's math module);
- `ref`: the NumPy reference, which is both the oracle of the op-table tests
  and the interpreter `compiler.interpret` runs;
- `domain` and `tol`: where the op-table tests sample inputs and how close
  f32 must come.

Adding a primitive is adding one row here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from gradlang.compiler.ir import NUMPY_DTYPES, Atom, Eqn, Lit, TensorType, Var
from gradlang.compiler.shapes import Sym
from gradlang.runtime.errors import GradError, Span

if TYPE_CHECKING:  # rules receive a builder; the builder consults this table
    from gradlang.compiler.builder import Builder

Cts = list[Optional[Atom]]


@dataclass(frozen=True)
class Op:
    name: str
    kind: str
    type_rule: Callable[[list[TensorType], dict, Optional[Span]], list[TensorType]]
    vjp: Optional[Callable[[Builder, Eqn, list[Atom], list[bool]], Cts]]
    ref: Optional[Callable[..., Any]] = None
    template: Optional[str] = None
    arity: int = 1
    domain: str = "real"  # real | positive | unit | nonzero | bool | any
    float_only: bool = False  # integer inputs are cast to f64 first
    tol: float = 1e-5
    differentiable: bool = True


OPS: dict[str, Op] = {}


def _register(op: Op) -> Op:
    OPS[op.name] = op
    return op


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


def _normalize_axes(axes, rank: int, span) -> tuple[int, ...]:
    out = []
    for axis in axes:
        if not -rank <= axis < rank:
            raise GradError(f"axis {axis} is out of range for rank {rank}", span)
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
    shape = tuple(b if isinstance(b, Sym) and (a, c) == (0, 1) else len(range(a, b, c))
                  for a, b, c in zip(params["starts"], params["stops"], params["steps"]))
    return [TensorType(x.dtype, shape)]


def _embed_rule(types, params, span):
    (x,) = types
    return [TensorType(x.dtype, tuple(params["shape"]))]


def _matmul_rule(types, params, span):
    a, b = types
    if a.rank != 2 or b.rank != 2:
        raise GradError("internal: matmul expects rank-2 operands", span)
    if a.shape[1] != b.shape[0]:
        raise GradError(f"matmul shapes {list(a.shape)} and {list(b.shape)} do not "
                        f"match ({a.shape[1]} != {b.shape[0]})", span)
    return [TensorType(_same_dtype([a, b], span), (a.shape[0], b.shape[1]))]


def _full_rule(types, params, span):
    return [TensorType(params["dtype"], tuple(params["shape"]))]


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
    shape[axis] = sum(t.shape[axis] for t in types)
    return [TensorType(_same_dtype(types, span), tuple(shape))]


# ------------------------------------------------- IR-building helpers


def full(b: Builder, value, shape: tuple[int, ...], dtype: str) -> Var:
    return b.bind("full", value=value, shape=tuple(shape), dtype=dtype)


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
# cotangent) and returns one cotangent (or None) per input.  Cotangents come
# out with the input's shape: broadcasting is undone here.


def _selected(b: Builder, mask: Optional[Var], ct: Atom) -> Atom:
    """Inside a branch of `where`: the contribution where the branch was
    taken, exactly 0 elsewhere (even where the local derivative is inf)."""
    return ct if mask is None else b.bind("where", mask, ct, lit(b, 0, ct))


def _unary(rule: Callable[[Builder, Atom, Var, Atom], Atom]):
    def vjp(b, eqn, cts, needs, mask=None):
        (x,) = eqn.inputs
        if not needs[0]:
            return [None]
        return [_selected(b, mask, rule(b, x, eqn.out, cts[0]))]
    vjp.takes_mask = True
    return vjp


def _binary(rule_a, rule_b):
    def vjp(b, eqn, cts, needs, mask=None):
        x, y = eqn.inputs
        ct = cts[0]
        out = []
        for need, rule, operand in ((needs[0], rule_a, x), (needs[1], rule_b, y)):
            if need and rule is not None:
                # select at the output's shape, before summing broadcast axes
                full_ct = _selected(b, mask, rule(b, x, y, eqn.out, ct))
                out.append(unbroadcast(b, full_ct, operand.type.shape))
            else:
                out.append(None)
        return out
    vjp.takes_mask = True
    return vjp


def _mul(b, x, y):
    return b.bind("mul", x, y)


def _one_minus_sq(b, out, ct):
    return b.bind("mul", ct, b.bind("sub", lit(b, 1, out), b.bind("mul", out, out)))


def _max_vjp(pick_greater: bool):
    def rule_for(first: bool):
        def rule(b, x, y, out, ct):
            mine, other = (x, y) if first else (y, x)
            strict = b.bind("gt" if pick_greater else "lt", mine, other)
            tie = b.bind("eq", mine, other)
            half = b.bind("mul", ct, lit(b, 0.5, ct))
            zero = lit(b, 0, ct)
            return b.bind("where", strict, ct, b.bind("where", tie, half, zero))
        return rule
    return _binary(rule_for(True), rule_for(False))


def _pow_a(b, x, y, out, ct):
    y_minus_1 = b.bind("sub", y, lit(b, 1, y))
    return b.bind("mul", ct, b.bind("mul", y, b.bind("pow", x, y_minus_1)))


def _pow_b(b, x, y, out, ct):
    return b.bind("mul", ct, b.bind("mul", b.bind("log", x), out))


def _where_vjp(b, eqn, cts, needs):
    cond, x, y = eqn.inputs
    ct = cts[0]
    zero = lit(b, 0, ct)
    ct_x = unbroadcast(b, b.bind("where", cond, ct, zero), x.type.shape) if needs[1] else None
    ct_y = unbroadcast(b, b.bind("where", cond, zero, ct), y.type.shape) if needs[2] else None
    return [None, ct_x, ct_y]


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
    # The cotangent is shared equally among the elements that attain the max.
    (x,) = eqn.inputs
    axes = _normalize_axes(eqn.p["axes"], x.type.rank, eqn.span)
    peak = expand_to(b, eqn.out, axes, x.type.shape)
    hit = b.bind("eq", x, peak)
    count = b.bind("reduce_sum", b.bind("cast", hit, dtype=x.type.dtype), axes=axes)
    share = expand_to(b, b.bind("div", cts[0], count), axes, x.type.shape)
    return [b.bind("where", hit, share, lit(b, 0, share))]


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


def _matmul_vjp(b, eqn, cts, needs):
    x, y = eqn.inputs
    ct = cts[0]
    ct_x = b.bind("matmul", ct, b.bind("transpose", y, perm=(1, 0))) if needs[0] else None
    ct_y = b.bind("matmul", b.bind("transpose", x, perm=(1, 0)), ct) if needs[1] else None
    return [ct_x, ct_y]


def _concat_vjp(b, eqn, cts, needs):
    axis = eqn.p["axis"]
    out, start = [], 0
    shape = eqn.out.type.shape
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


def _no_grad(b, eqn, cts, needs):
    return [None] * len(eqn.inputs)


# ------------------------------------------------------------------ the table

_SQRT_2_OVER_PI = 2.0 / math.sqrt(math.pi)


def _unary_op(name, template, rule, ref, domain="real", tol=1e-5,
              differentiable=True, float_only=True):
    _register(Op(name, "elementwise", _elementwise_rule(),
                 _unary(rule) if rule else _no_grad, ref, template,
                 1, domain, float_only=float_only, tol=tol,
                 differentiable=differentiable))


_unary_op("neg", "-{0}", lambda b, x, o, ct: b.bind("neg", ct), np.negative,
          float_only=False)
_unary_op("exp", "math.exp({0})", lambda b, x, o, ct: _mul(b, ct, o), np.exp, "real")
_unary_op("log", "math.log({0})",
          lambda b, x, o, ct: b.bind("div", ct, x), np.log, "positive")
_unary_op("log1p", "math.log1p({0})",
          lambda b, x, o, ct: b.bind("div", ct, b.bind("add", x, lit(b, 1, x))),
          np.log1p, "positive")
_unary_op("expm1", "math.expm1({0})",
          lambda b, x, o, ct: _mul(b, ct, b.bind("add", o, lit(b, 1, o))), np.expm1)
_unary_op("sqrt", "math.sqrt({0})",
          lambda b, x, o, ct: b.bind("div", ct, b.bind("mul", o, lit(b, 2, o))),
          np.sqrt, "positive")
_unary_op("sin", "math.sin({0})", lambda b, x, o, ct: _mul(b, ct, b.bind("cos", x)), np.sin)
_unary_op("cos", "math.cos({0})",
          lambda b, x, o, ct: b.bind("neg", _mul(b, ct, b.bind("sin", x))), np.cos)
_unary_op("tan", "math.tan({0})",
          lambda b, x, o, ct: _mul(b, ct, b.bind("add", lit(b, 1, o), _mul(b, o, o))),
          np.tan, "unit")
_unary_op("tanh", "math.tanh({0})", lambda b, x, o, ct: _one_minus_sq(b, o, ct), np.tanh)
_unary_op("sinh", "math.sinh({0})", lambda b, x, o, ct: _mul(b, ct, b.bind("cosh", x)), np.sinh)
_unary_op("cosh", "math.cosh({0})", lambda b, x, o, ct: _mul(b, ct, b.bind("sinh", x)), np.cosh)
_unary_op("arctan", "math.atan({0})",
          lambda b, x, o, ct: b.bind("div", ct, b.bind("add", lit(b, 1, x), _mul(b, x, x))),
          np.arctan)
_unary_op("sigmoid",
          "{T}(1) / ({T}(1) + math.exp(-{0})) if {0} >= 0 else math.exp({0}) / ({T}(1) + math.exp({0}))",
          lambda b, x, o, ct: _mul(b, ct, _mul(b, o, b.bind("sub", lit(b, 1, o), o))),
          lambda x: np.where(x >= 0, 1 / (1 + np.exp(-np.abs(x))),
                             np.exp(-np.abs(x)) / (1 + np.exp(-np.abs(x)))).astype(x.dtype))
_unary_op("erf", "math.erf({0})",
          lambda b, x, o, ct: _mul(b, ct, _mul(b, lit(b, _SQRT_2_OVER_PI, x),
                                             b.bind("exp", b.bind("neg", _mul(b, x, x))))),
          lambda x: np.vectorize(math.erf, otypes=[x.dtype])(x) if x.size else x.copy())
_unary_op("abs", "abs({0})", lambda b, x, o, ct: _mul(b, ct, b.bind("sign", x)), np.abs,
          "nonzero", float_only=False)
_unary_op("sign", "{T}(1) if {0} > 0 else ({T}(-1) if {0} < 0 else {0} * {T}(0))", None,
          np.sign, differentiable=False, float_only=False)
# math.floor and friends return integers: beyond 2**52 (and for inf and NaN)
# a float is already integral, so it is returned as it is.
_INTEGRAL = "{0} if not (abs({0}) < 4503599627370496.0) else {T}(%s({0}))"
_unary_op("floor", _INTEGRAL % "math.floor", None, np.floor, differentiable=False)
_unary_op("ceil", _INTEGRAL % "math.ceil", None, np.ceil, differentiable=False)
# Python's round() rounds half to even, like np.rint, in Numba on every target.
_unary_op("round", _INTEGRAL % "round", None, np.rint, differentiable=False)


def _binary_op(name, template, rule_a, rule_b, ref, result="same", domain="real",
               float_only=False, differentiable=True, tol=1e-5):
    vjp = _binary(rule_a, rule_b) if differentiable else _no_grad
    _register(Op(name, "elementwise", _elementwise_rule(result), vjp, ref, template,
                 2, domain, float_only=float_only, tol=tol,
                 differentiable=differentiable))


_binary_op("add", "{0} + {1}", lambda b, x, y, o, ct: ct, lambda b, x, y, o, ct: ct, np.add)
_binary_op("sub", "{0} - {1}", lambda b, x, y, o, ct: ct,
           lambda b, x, y, o, ct: b.bind("neg", ct), np.subtract)
_binary_op("mul", "{0} * {1}", lambda b, x, y, o, ct: _mul(b, ct, y),
           lambda b, x, y, o, ct: _mul(b, ct, x), np.multiply)
_binary_op("div", "{0} / {1}", lambda b, x, y, o, ct: b.bind("div", ct, y),
           lambda b, x, y, o, ct: b.bind("neg", b.bind("div", _mul(b, ct, o), y)),
           np.divide, domain="nonzero", float_only=True)
_binary_op("pow", "{0} ** {1}", _pow_a, _pow_b, np.power, domain="positive", tol=1e-4)
OPS["maximum"] = Op("maximum", "elementwise", _elementwise_rule(), _max_vjp(True),
                    np.maximum, "{0} if ({0} > {1} or {0} != {0}) else {1}", 2)
OPS["minimum"] = Op("minimum", "elementwise", _elementwise_rule(), _max_vjp(False),
                    np.minimum, "{0} if ({0} < {1} or {0} != {0}) else {1}", 2)
for _name, _sym, _ref in (("lt", "<", np.less), ("le", "<=", np.less_equal),
                          ("gt", ">", np.greater), ("ge", ">=", np.greater_equal),
                          ("eq", "==", np.equal), ("ne", "!=", np.not_equal)):
    _binary_op(_name, "{0} %s {1}" % _sym, None, None, _ref, result="bool",
               differentiable=False)
for _name, _sym, _ref in (("logical_and", "and", np.logical_and),
                          ("logical_or", "or", np.logical_or)):
    _binary_op(_name, "{0} %s {1}" % _sym, None, None, _ref, domain="bool",
               differentiable=False)
_register(Op("logical_not", "elementwise", _elementwise_rule(), _no_grad, np.logical_not,
             "not {0}", 1, "bool", differentiable=False))
_register(Op("where", "elementwise", _where_rule, _where_vjp, np.where,
             "{1} if {0} else {2}", 3))
_register(Op("stop_gradient", "elementwise", _elementwise_rule(), _no_grad,
             lambda x: x.copy(), "{0}", 1, differentiable=False))
_register(Op("cast", "elementwise", _cast_rule, _cast_vjp,
             lambda x, dtype: x.astype(_np_dtype(dtype)), "{0}", 1))
_register(Op("full", "elementwise", _full_rule, _no_grad,
             lambda value, shape, dtype: np.full(shape, value, _np_dtype(dtype)),
             "{value}", 0, differentiable=False))

_register(Op("reduce_sum", "reduction", _reduce_rule, _sum_vjp,
             lambda x, axes: np.sum(x, axis=tuple(axes)).astype(x.dtype), arity=1))
_register(Op("reduce_max", "reduction", _reduce_rule, _max_reduce_vjp,
             lambda x, axes: np.max(x, axis=tuple(axes)), arity=1))
_register(Op("reshape", "layout", _reshape_rule, _reshape_vjp,
             lambda x, shape: np.reshape(x, shape)))
_register(Op("transpose", "layout", _transpose_rule, _transpose_vjp,
             lambda x, perm: np.transpose(x, perm)))
_register(Op("broadcast_to", "layout", _broadcast_to_rule, _broadcast_to_vjp,
             lambda x, shape: np.broadcast_to(x, shape)))
def python_slices(starts, stops, steps) -> tuple[slice, ...]:
    """Slice params (normalized as by `slice.indices`) as Python slices: a
    negative stop there means "past the front", which Python spells None,
    and an empty range must stay empty whatever its start."""
    out = []
    for a, b, c in zip(starts, stops, steps):
        if isinstance(b, Sym):
            out.append(slice(a, None, c))
        elif len(range(a, b, c)) == 0:
            out.append(slice(0, 0, 1))
        else:
            out.append(slice(a, None if b < 0 else b, c))
    return tuple(out)


_register(Op("slice", "layout", _slice_rule, _slice_vjp,
             lambda x, starts, stops, steps: x[python_slices(starts, stops, steps)]))


def _embed_ref(x, shape, starts, stops, steps):
    out = np.zeros(shape, x.dtype)
    out[python_slices(starts, stops, steps)] = x
    return out


_register(Op("embed", "layout", _embed_rule, _embed_vjp, _embed_ref))
_register(Op("concatenate", "layout", _concat_rule, _concat_vjp,
             lambda *xs, axis: np.concatenate(xs, axis=axis), arity=-1))
_register(Op("matmul", "matmul", _matmul_rule, _matmul_vjp, np.matmul, arity=2, tol=1e-4))


def _np_dtype(dtype: str):
    return NUMPY_DTYPES[dtype]


# Ops that compute nothing a derivative can flow through.
NON_DIFFERENTIABLE = {name for name, op in OPS.items() if not op.differentiable}
FLOAT_ONLY = {name for name, op in OPS.items() if op.float_only}


def _custom_vjp_rule(types, params, span):
    fwd = params["fwd"]
    if [t for t in types] != list(fwd.in_types):
        raise GradError("internal: custom_vjp argument types do not match its body", span)
    return list(fwd.out_types[:params["n_out"]])


def _dim_rule(types, params, span):
    return [TensorType(params["dtype"], ())]


# A size known only at call time (a `Sym`), as a scalar: what `mean` divides
# by when the reduced axes are symbolic.  The driver computes it.
_register(Op("dim", "shape", _dim_rule, _no_grad, None, arity=0, differentiable=False))


def _barrier_rule(types, params, span):
    return [types[0]]


# Identity on its first input, with a data dependency on its second (a
# cotangent): what a `@recompute` backward reruns stays in the backward pass.
_register(Op("recompute_barrier", "layout", _barrier_rule,
             lambda b, eqn, cts, needs: [cts[0], None], lambda x, token: x, arity=2))

# A call to a user function with grad blocks; `compiler.autodiff` gives it
# its gradient (the `bwd` sub-function) and `compiler.passes.inline_calls`
# replaces it by its `fwd` body once no more differentiation is to come.
_register(Op("custom_vjp", "call", _custom_vjp_rule, None, arity=-1))
