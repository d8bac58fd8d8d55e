"""Small loops as scalars: a `loop` whose body works on a few fixed-size
arrays (an ODE's state `[x, v]` sliced and stacked by a Runge-Kutta step,
a 3x3 matrix times a 3-vector) becomes a loop over their elements, one
scalar value per element, so that its body is elementwise over shape ()
and the loop runs inside one kernel (`kernel_loop_shape`) instead
of one driver call per trip around kernels of two elements each (RK4 of a
2-vector: 45 us a trip, against 0.05 us for its scalar form).

Contract: `scalar_loops(fn)` returns fn with each `loop` equation (at its
top level: codegen calls it on each function it renders, a loop body run
by the driver included) that carries a value, does not already run in
one kernel (`kernel_loop_shape`, here so that codegen and this module
share it) and whose body holds only values of fixed shape of at most `MAX_ELEMENTS` elements, made by
elementwise ops, `full`, the layout ops (`reshape`, `transpose`,
`broadcast_to`, `slice`, `embed`, `concatenate`), `reduce_sum` and
`matmul`, rewritten: the same results, a sum's terms added from 0 and
left to right as a CPU kernel's sums are (a float `reduce_sum` in f64,
rounded once), its carried values, invariants and stacked values split
into their elements before the loop and put back together after it.  (A
`matmul` unrewritten is BLAS's, whose order and fused multiply-adds are
its own, and the GPU's reductions add as a tree: their last bits can
differ from the rewritten loop's, as BLAS's differ between machines.)  A
rewritten body of more than `MAX_EQNS` equations is not used (Numba's
compile time grows faster than the body: see `fusion.MAX_LOOP_EQNS`).
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from gradlang.compiler.builder import Builder, coerce
from gradlang.compiler.fusion import FUSIBLE
from gradlang.compiler.ir import FLOATS, Atom, Eqn, Function, Lit, TensorType, Var
from gradlang.compiler.ops import OPS, loop_groups
from gradlang.compiler.shapes import broadcasts_to
from gradlang.compiler.values import cast

MAX_ELEMENTS = 64
# A body past this many scalar equations stays in the driver: Numba took
# 6.6 s to compile a serial loop of 1,000 (`fusion.MAX_LOOP_EQNS`), about
# n ** 2.5, so 500 is about 1 s; RK4 on a 2-vector has at most 231 (its
# second-order backward loop), a 4x4 matrix times a vector 28, an 8x8
# matrix squared 960 (too many).
MAX_EQNS = 500
# The driver splits each array element the loop reads or carries into a
# value of its own before the loop and joins its results after (a slice and
# a reshape each, in Python: some microseconds an element, forward and
# backward), which a loop of few trips does not win back: an 8-vector
# carried through an 8x8 matrix (72 elements) took 0.6 ms for a value and
# gradient at one trip against 0.05 unrewritten.  A loop whose carried
# and invariant arrays hold more elements stays as it was (its stacked
# values are split too, but a loop stacks per-trip values to run many).
MAX_SPLIT = 16
_LAYOUT = {"reshape", "transpose", "broadcast_to", "slice", "embed", "concatenate"}


def kernel_loop_shape(eqn: Eqn) -> Optional[tuple]:
    """The element shape of a `loop` that can run inside one kernel (its
    trips in sequence within each element, the elements in parallel), or
    None: its body must be elementwise, every carried value and stacked
    slice of one shape S, every invariant broadcasting to S."""
    p = eqn.p
    body, n_carry = p["body"], p["n_carry"]
    if n_carry == 0 or any(e.op not in FUSIBLE for e in body.eqns):
        return None
    shape = body.out_types[0].shape
    slices = loop_groups(body.params, p, lead=1)[3]
    if any(t.shape != shape for t in body.out_types) or \
            any(v.type.shape != shape for v in slices):
        return None
    invariants = loop_groups(eqn.inputs, p)[2]
    if not all(broadcasts_to(a.type.shape, shape) for a in invariants) or \
            not all(broadcasts_to(o.type.shape, shape) for e in body.eqns for o in e.outputs):
        return None
    return shape


def scalar_loops(fn: Function) -> Function:
    """fn with its small loops on scalars (see the module's docstring)."""
    if not any(e.op == "loop" for e in fn.eqns):
        return fn
    b = Builder()
    for eqn in fn.eqns:
        if eqn.op != "loop" or not _scalar_loop(b, eqn):
            b.eqns.append(eqn)
    return b.function(fn.name, fn.params, fn.outputs)


def _static(t: TensorType) -> bool:
    return all(isinstance(d, int) for d in t.shape) and t.size <= MAX_ELEMENTS


def _scalar_loop(b: Builder, eqn: Eqn) -> bool:
    """Whether `eqn` is such a loop; if so, the rewritten loop is added to b,
    defining eqn's results (the same vars), else b is unchanged."""
    p = eqn.p
    body = p["body"]
    values = [v.type for v in body.params] + [o.type for e in body.eqns for o in e.outputs]
    if p["n_carry"] == 0 or kernel_loop_shape(eqn) is not None or \
            not all(map(_static, values)) or not all(_supported(e) for e in body.eqns):
        return False
    bounds, carried, invariants, stacked = loop_groups(eqn.inputs, p)
    if sum(a.type.size for a in carried + invariants if a.type.shape != ()) > MAX_SPLIT:
        return False
    new_body = _scalar_body(body)
    if new_body is None or len(new_body.eqns) > MAX_EQNS:
        return False
    inputs = list(bounds)
    for a in carried + invariants:
        inputs += _elements(b, a)
    for a in stacked:
        inputs += _columns(b, a)
    n_carry = sum(a.type.size for a in carried)
    n_inv = sum(a.type.size for a in invariants)
    outs = list(b.bind_multi("loop", *inputs, span=eqn.span, body=new_body, n_carry=n_carry,
                             n_inv=n_inv, reverse=p["reverse"], trip=p["trip"]))
    at_loop = len(b.eqns) - 1
    sizes = [math.prod(v.type.shape[j >= p["n_carry"]:]) for j, v in enumerate(eqn.outputs)]
    starts = [sum(sizes[:j]) for j in range(len(sizes))]
    for v, at, size in zip(eqn.outputs, starts, sizes):
        if size == 1 and outs[at].type == v.type:
            outs[at] = v  # the loop's own result
    loop = b.eqns[at_loop]
    b.eqns[at_loop] = Eqn(loop.op, loop.inputs, tuple(outs), loop.params, loop.span)
    for j, (v, at, size) in enumerate(zip(eqn.outputs, starts, sizes)):
        if outs[at] is not v:
            _assemble(b, outs[at:at + size], v, lead=int(j >= p["n_carry"]))
    return True


def _supported(e: Eqn) -> bool:
    kind = OPS[e.op].kind
    return (kind == "elementwise" or e.op in _LAYOUT or e.op in ("reduce_sum", "matmul"))


def _elements(b: Builder, a: Atom) -> list[Atom]:
    """a's elements in C order, as scalars."""
    t = a.type
    if t.shape == ():
        return [a]
    flat = b.bind("reshape", a, shape=(t.size,))
    return [b.bind("reshape", b.bind("slice", flat, starts=(k,), stops=(k + 1,), steps=(1,)),
                   shape=()) for k in range(t.size)]


def _columns(b: Builder, a: Atom) -> list[Atom]:
    """A stacked value's (trip, *S) per-element stacks, each of shape (trip,)."""
    trip, size = a.type.shape[0], math.prod(a.type.shape[1:])
    if a.type.shape[1:] == ():
        return [a]
    flat = b.bind("reshape", a, shape=(trip, size))
    return [b.bind("reshape", b.bind("slice", flat, starts=(0, k), stops=(trip, k + 1),
                                     steps=(1, 1)), shape=(trip,)) for k in range(size)]


def _assemble(b: Builder, parts, result: Var, lead: int) -> None:
    """Define `result` from its elements (lead 0) or its per-element stacks
    along axis 0 (lead 1), `parts`, in C order."""
    pieces = [b.bind("reshape", x, shape=tuple(x.type.shape) + (1,)) for x in parts]
    joined = b.bind("concatenate", *pieces, axis=lead) if len(pieces) > 1 else pieces[0]
    b.bind("reshape", joined, shape=result.type.shape)
    eqn = b.eqns[-1]
    b.eqns[-1] = Eqn(eqn.op, eqn.inputs, (result,), eqn.params, eqn.span)


def _scalar_body(body: Function) -> Optional[Function]:
    """The body over scalars, or None where a value has no elements (its
    loop is left alone: there is nothing to carry)."""
    if any(v.type.size == 0 for v in body.params) or \
            any(o.type.size == 0 for e in body.eqns for o in e.outputs):
        return None
    b = Builder()
    arrays: dict[Var, np.ndarray] = {}
    params = []
    for v in body.params:
        cells = [Var(TensorType(v.type.dtype, ()), v.hint) for _ in range(v.type.size)]
        params += cells
        arrays[v] = _grid(cells, v.type.shape)

    def cells_of(a: Atom) -> np.ndarray:
        return arrays[a] if isinstance(a, Var) else _grid([a], ())

    for e in body.eqns:
        t = e.out.type if len(e.outputs) == 1 else None
        if t is None:
            return None
        ins = [cells_of(a) for a in e.inputs]
        if e.op == "full":
            out = _grid([Lit(coerce(e.p["value"], t.dtype), TensorType(t.dtype, ()))] * t.size,
                        t.shape)
        elif OPS[e.op].kind == "elementwise":
            out = _elementwise(b, e, ins, t)
        elif e.op == "reduce_sum":
            out = _reduce_sum(b, ins[0], tuple(e.p["axes"]), t)
        elif e.op == "matmul":
            out = _matmul(b, ins[0], ins[1], t)
        else:
            out = np.asarray(OPS[e.op].ref(*ins, **e.p), dtype=object)
            zero = Lit(coerce(0, t.dtype), TensorType(t.dtype, ()))
            out = _grid([c if isinstance(c, (Var, Lit)) else zero for c in out.flat], t.shape)
        arrays[e.out] = out
    outputs = []
    for a in body.outputs:
        outputs += list(cells_of(a).flat)
    return b.function(body.name, params, outputs)


def _grid(cells: list, shape: tuple) -> np.ndarray:
    out = np.empty(len(cells), dtype=object)
    out[:] = cells
    return out.reshape(shape)


def _elementwise(b: Builder, e: Eqn, ins: list, t: TensorType) -> np.ndarray:
    ins = [np.broadcast_to(x, t.shape) for x in ins]
    cells = [b.bind(e.op, *(x[idx] for x in ins), span=e.span, **e.p)
             for idx in np.ndindex(*t.shape)]
    return _grid(cells, t.shape)


def _total(b: Builder, terms: list, t: TensorType, dtype: str) -> Atom:
    """The sum of terms from 0, left to right, as a kernel's sums run (a
    float sum of -0.0 terms is 0.0 there, and so here), added in `dtype`
    and rounded once to t's."""
    total: Atom = Lit(coerce(0, dtype), TensorType(dtype, ()))
    for term in terms:
        total = b.bind("add", total, cast(b, term, dtype))
    return cast(b, total, t.dtype)


def _reduce_sum(b: Builder, x: np.ndarray, axes: tuple, t: TensorType) -> np.ndarray:
    """A float sum adds in f64, as a CPU kernel's sums do (`reduce_sum` in
    a kernel and in the driver): an f32 loop gives the bits it gave
    unrewritten."""
    kept = [k for k in range(x.ndim) if k not in axes]
    rows = np.transpose(x, kept + list(axes)).reshape(math.prod(x.shape[k] for k in kept), -1)
    dtype = "f64" if t.dtype in FLOATS else t.dtype
    return _grid([_total(b, list(row), t, dtype) for row in rows], t.shape)


def _matmul(b: Builder, x: np.ndarray, y: np.ndarray, t: TensorType) -> np.ndarray:
    """np.matmul's rule: a vector operand is a row (left) or a column
    (right) whose axis the result drops; batch axes broadcast."""
    xm = x[None, :] if x.ndim == 1 else x
    ym = y[:, None] if y.ndim == 1 else y
    batch = np.broadcast_shapes(xm.shape[:-2], ym.shape[:-2])
    xm = np.broadcast_to(xm, batch + xm.shape[-2:])
    ym = np.broadcast_to(ym, batch + ym.shape[-2:])
    rows, inner, cols = xm.shape[-2], xm.shape[-1], ym.shape[-1]
    cells = [_total(b, [b.bind("mul", xm[i + (r, k)], ym[i + (k, c)]) for k in range(inner)],
                    t, t.dtype)
             for i in np.ndindex(*batch) for r in range(rows) for c in range(cols)]
    return _grid(cells, t.shape)
