"""Many evaluations of a function at once, along a new leading axis.

Contract: `vectorize(fn, stacked, outputs, k)` returns a function with
fn's parameters, except that each parameter in `stacked` (positions)
takes a leading axis of size k: k values of it, stacked.  Output j (for j in
`outputs`) of the result is fn's output j for each of the k values,
stacked the same way (computed once for all k where it does not depend on
them, then broadcast); the other outputs are fn's own.  Values that do not
depend on a stacked parameter are computed once.  Every op of the table
has a rule here except `dim`, and a loop whose trip count is stacked: for
those it raises `NotVectorizable`, and the caller evaluates one value at
a time instead.  (A stacked index array gathers or scatter-adds along
the axis with the index spread over the data's other axes.)
A loop's body is vectorized in turn (`_stacked_loop`), and so are a grad
block's passes (`_stacked_call`).

`stacked_elements(fn, stacked)` is how many elements the stacked values
hold for each of the k (what memory one more of the k costs).

`dsl.jacfwd` uses it to run every column of a Jacobian in one program: the
jvp program (fn, made by `compiler.forward`) with its tangent stacked over
the basis vectors; `dsl.jacrev` likewise stacks a backward pass's
cotangents.  Its rules mirror JAX's batching rules (`vmap`) for the
ops this language has: elementwise inputs line up by adding axes of size
1 after the leading one; axes in params (reductions, transposes, slices,
gathers, cumulative sums) shift by one; a 2-d matrix product folds the
leading axis into a row axis of the stacked side, and one of two stacked
sides multiplies them elementwise and sums (per-example products of small
matrices); a batched product takes the leading axis as one batch axis
more (of size 1, broadcast, on an unstacked side).
"""
from __future__ import annotations

from contextvars import ContextVar
from typing import Optional, Sequence

from gradlang.compiler import ops
from gradlang.compiler.builder import Builder, inline
from gradlang.compiler.ir import Atom, Eqn, Function, TensorType, Var
from gradlang.compiler.shapes import Dim, prod
from gradlang.runtime.errors import Span


class NotVectorizable(Exception):
    """fn has an op with no rule for stacked inputs here."""


# The functions vectorized so far in the outermost `vectorize` call, by
# (function id, stacked, outputs), each with the function (so its id stays
# its own): a program holds one function in several places (the stages of
# a call reused by calls alike, `compiler.staging`; a grad block's passes,
# kept by each derived call), and vectorizing each place afresh walked
# them all (a chain of blocks taking the previous function's grad: two
# copies per level, 2**n).
_DONE: ContextVar[Optional[dict]] = ContextVar("vectorized", default=None)


def vectorize(fn: Function, stacked: Sequence[int], outputs: Sequence[int], k: Dim
              ) -> Function:
    done = _DONE.get()
    if done is None:
        token = _DONE.set({})
        try:
            return vectorize(fn, stacked, outputs, k)
        finally:
            _DONE.reset(token)
    key = (id(fn), tuple(stacked), tuple(outputs), k)
    if key not in done:
        done[key] = (fn, _vectorized(fn, stacked, outputs, k))
    return done[key][1]


def _vectorized(fn: Function, stacked: Sequence[int], outputs: Sequence[int], k: Dim
                ) -> Function:
    b = Builder()
    params = [Var(TensorType(p.type.dtype, (k,) + p.type.shape), p.hint) if i in stacked else p
              for i, p in enumerate(fn.params)]
    env: dict[Var, Atom] = dict(zip(fn.params, params))
    lead: set[Var] = {params[i] for i in stacked}  # the values with the leading axis
    for eqn in fn.eqns:
        inputs = [env.get(a, a) if isinstance(a, Var) else a for a in eqn.inputs]
        tokens = ops.OPS[eqn.op].token_inputs  # read for no value: never stack the output
        if not any(isinstance(a, Var) and a in lead
                   for i, a in enumerate(inputs) if i not in tokens):
            outs = tuple(Var(v.type, v.hint) for v in eqn.outputs)
            b.eqns.append(Eqn(eqn.op, tuple(inputs), outs, eqn.params, eqn.span))
        elif eqn.op in ("loop", "custom_vjp"):
            rule = _stacked_loop if eqn.op == "loop" else _stacked_call
            outs, stacked_outs = rule(b, eqn, inputs, lead, k)
            lead.update(o for o, s in zip(outs, stacked_outs) if s)
        else:
            outs = (_stacked_eqn(b, eqn, inputs, lead, k),)
            lead.add(outs[0])
        env.update(zip(eqn.outputs, outs))
    results = []
    for j, a in enumerate(fn.outputs):
        a = env.get(a, a) if isinstance(a, Var) else a
        if j in outputs and a not in lead:
            a = _spread(b, a, k)
        results.append(a)
    return b.function(f"{fn.name}_stacked", params, results)


def stacked_elements(fn: Function, stacked: Sequence[int]) -> Dim:
    """The elements of fn's values that depend on the parameters `stacked`
    (those `vectorize` stacks), summed: for each of the k."""
    return sum(fn.params[i].type.size for i in stacked) + _computed_elements(fn, stacked)


def _computed_elements(fn: Function, stacked: Sequence[int]) -> Dim:
    """The elements of the values fn's equations compute from its
    parameters `stacked`: a call's are those of its `fwd`, which runs
    inlined (a derived program keeps the calls to functions with grad
    blocks: `autodiff.call_forward`)."""
    depends = {fn.params[i] for i in stacked}
    total: Dim = 0
    for eqn in fn.eqns:
        read = [i for i, a in enumerate(eqn.inputs) if isinstance(a, Var) and a in depends]
        if read:
            depends.update(eqn.outputs)
            total += (_computed_elements(eqn.p["fwd"], read) if eqn.op == "custom_vjp"
                      else sum(v.type.size for v in eqn.outputs))
    return total


def _stacked_eqn(b: Builder, eqn: Eqn, inputs: list[Atom], lead: set[Var], k: Dim) -> Var:
    """eqn on inputs of which some carry the leading axis (those in
    `lead`): its output, with the leading axis."""
    op, p = ops.OPS[eqn.op], eqn.p
    has = [isinstance(a, Var) and a in lead for a in inputs]
    span = eqn.span
    if op.kind == "elementwise":
        rank = eqn.outputs[0].type.rank
        lined = [_padded(b, a, rank) if h else a for a, h in zip(inputs, has)]
        return b.bind(eqn.op, *lined, span=span, **p)
    if eqn.op in ("reduce_sum", "reduce_max"):
        return b.bind(eqn.op, inputs[0], span=span,
                      **dict(p, axes=tuple(a + 1 for a in p["axes"])))
    if eqn.op == "reshape":
        return b.bind("reshape", inputs[0], shape=(k,) + tuple(p["shape"]), span=span)
    if eqn.op == "transpose":
        return b.bind("transpose", inputs[0], perm=(0,) + tuple(a + 1 for a in p["perm"]),
                      span=span)
    if eqn.op == "broadcast_to":
        shape = tuple(p["shape"])
        return b.bind("broadcast_to", _padded(b, inputs[0], len(shape)), shape=(k,) + shape,
                      span=span)
    if eqn.op in ("slice", "embed"):
        whole = {"starts": (0,), "stops": (k,), "steps": (1,)}
        params = {name: whole[name] + tuple(p[name]) for name in whole}
        if eqn.op == "embed":
            params["shape"] = (k,) + tuple(p["shape"])
        return b.bind(eqn.op, inputs[0], span=span, **params)
    if eqn.op == "cumsum":
        return b.bind("cumsum", inputs[0], axis=p["axis"] + 1, reverse=p["reverse"], span=span)
    if eqn.op == "concatenate":
        parts = [a if h else _spread(b, a, k) for a, h in zip(inputs, has)]
        return b.bind("concatenate", *parts, axis=p["axis"] + 1, span=span)
    if eqn.op == "matmul":
        return _matmul(b, inputs, has, k, span)
    if eqn.op == "recompute_barrier":  # (its first input is the stacked one)
        return b.bind(eqn.op, *inputs, span=span)
    if op.kind == "index":
        return (_stacked_index if has[1] else _index)(b, eqn, inputs, has, k)
    raise NotVectorizable(eqn.op)


def _stacked_loop(b: Builder, eqn: Eqn, inputs: list[Atom], lead: set[Var], k: Dim
                  ) -> tuple[tuple[Atom, ...], list[bool]]:
    """A `loop` with stacked inputs: one loop whose body is vectorized over
    the carried values, invariants and slices that are stacked (a stacked
    input's trips move to its first axis, so each trip's slice is stacked).
    A carried value is stacked from the start where its next value depends
    on a stacked one (until nothing more does).  Its outputs, and whether
    each is stacked (the ys of a trip move back behind the leading axis)."""
    p = eqn.p
    body, n_carry = p["body"], p["n_carry"]
    has = [isinstance(a, Var) and a in lead for a in inputs]
    bounds, carry, inv, xs = ops.loop_groups(inputs, p)
    stacked_bounds, stacked_carry, stacked_inv, stacked_xs = ops.loop_groups(has, p)
    if any(stacked_bounds):
        raise NotVectorizable("loop with a trip count of each example")
    stacked_carry = list(stacked_carry)
    while True:
        flags = [False] + stacked_carry + list(stacked_inv) + list(stacked_xs)
        depends = _depends(body, flags)
        grown = [s or d for s, d in zip(stacked_carry, depends[:n_carry])]
        if grown == stacked_carry:
            break
        stacked_carry = grown
    stacked_ys = depends[n_carry:]
    body = vectorize(body, [i for i, f in enumerate(flags) if f],
                     [j for j, s in enumerate(stacked_carry + stacked_ys) if s], k)
    init = [_spread(b, c, k) if s and not h else c
            for c, s, h in zip(carry, stacked_carry, has[3:3 + n_carry])]
    xs = [_trips_first(b, x) if s else x for x, s in zip(xs, stacked_xs)]
    outs = b.bind_multi("loop", *bounds, *init, *inv, *xs, span=eqn.span, **{**p, "body": body})
    ys = [_trips_first(b, y) if s else y for y, s in zip(outs[n_carry:], stacked_ys)]
    return tuple(outs[:n_carry]) + tuple(ys), stacked_carry + stacked_ys


def _stacked_call(b: Builder, eqn: Eqn, inputs: list[Atom], lead: set[Var], k: Dim
                  ) -> tuple[tuple[Atom, ...], list[bool]]:
    """A call with a grad block (`custom_vjp`) on stacked inputs: the same
    call, its `fwd` vectorized (every output stacked, and each residual
    that depends on a stacked input), its `bwd` over those and the outputs'
    cotangents.  So each of the k values has its own outputs and their own
    cotangents, as when called alone (an unstacked output, computed once,
    would take the sum of the k cotangents, which a block's sum over the k
    counted k times); an unstacked input is shared by the k values, so its
    cotangent is the sum of theirs.  Its outputs, and whether each is
    stacked.  (A call `autodiff.call_forward` marked returns its residuals
    too: its bwd takes the cotangents of its first `n_block` outputs.)"""
    p = eqn.p
    fwd, bwd, n_out = p["fwd"], p["bwd"], p["n_out"]
    n_block = p.get("n_block", n_out)
    has = [isinstance(a, Var) and a in lead for a in inputs]
    out_flags = [True] * n_out + _depends(fwd, has)[n_out:]
    stacked_fwd = vectorize(fwd, _flagged(has), _flagged(out_flags), k)
    # bwd's parameters: the inputs, the residuals, the block's outputs' cotangents
    bwd_flags = has + out_flags[n_block:] + out_flags[:n_block]
    stacked_bwd = _summed(vectorize(bwd, _flagged(bwd_flags), _flagged(has), k),
                          [None if h else t for h, t in zip(has, bwd.out_types)])
    outs = b.bind_multi("custom_vjp", *inputs, span=eqn.span,
                        **{**p, "fwd": stacked_fwd, "bwd": stacked_bwd})
    return tuple(outs), out_flags[:n_out]


def _flagged(flags: Sequence[bool]) -> list[int]:
    return [i for i, f in enumerate(flags) if f]


def _summed(fn: Function, types: Sequence[Optional[TensorType]]) -> Function:
    """fn with each output that is stacked where `types` gives its type
    unstacked summed over the leading axis (None: the output stays)."""
    b = Builder()
    params = [Var(p.type, p.hint) for p in fn.params]
    outs = [b.bind("reduce_sum", o, axes=(0,)) if t is not None and o.type != t else o
            for o, t in zip(inline(b, fn, params), types)]
    return b.function(fn.name, params, outs)


def _depends(fn: Function, flags: Sequence[bool]) -> list[bool]:
    """Which of fn's outputs depend on its parameters flagged."""
    depends = {p for p, f in zip(fn.params, flags) if f}
    for eqn in fn.eqns:
        tokens = ops.OPS[eqn.op].token_inputs
        if any(isinstance(a, Var) and a in depends
               for i, a in enumerate(eqn.inputs) if i not in tokens):
            depends.update(eqn.outputs)
    return [isinstance(o, Var) and o in depends for o in fn.outputs]


def _trips_first(b: Builder, a: Var) -> Var:
    """Its first two axes swapped: (k, trips, ...) <-> (trips, k, ...)."""
    return b.bind("transpose", a, perm=(1, 0) + tuple(range(2, a.type.rank)))


def _padded(b: Builder, a: Var, rank: int) -> Atom:
    """A stacked value of fewer than `rank` axes (besides the leading one)
    with axes of size 1 after the leading one, so that it broadcasts
    against unstacked values of rank `rank` as each of its k values does."""
    shape = a.type.shape
    missing = rank - (len(shape) - 1)
    if missing <= 0:
        return a
    return b.bind("reshape", a, shape=shape[:1] + (1,) * missing + shape[1:])


def _spread(b: Builder, a: Atom, k: Dim) -> Var:
    """An unstacked value, the same for each of the k: stacked."""
    shape = a.type.shape
    if not isinstance(a, Var):  # a literal
        return ops.full(b, a.value, (k,) + shape, a.type.dtype)
    return b.bind("broadcast_to", b.bind("reshape", a, shape=(1,) + shape), shape=(k,) + shape)


def _matmul(b: Builder, inputs: list[Atom], has: list[bool], k: Dim,
            span: Optional[Span]) -> Var:
    x, y = inputs
    if x.type.rank - has[0] > 2:  # batched: the leading axis is one batch axis more,
        # of size 1 (broadcast) on the side without it
        x, y = (a if h else b.bind("reshape", a, shape=(1,) + a.type.shape)
                for a, h in zip(inputs, has))
        return b.bind("matmul", x, y, span=span)
    if has[0] and has[1]:  # (k, m, n) @ (k, n, p): each pair's products summed over n,
        # which fusion computes in one loop (a per-example gradient's X_i^T r_i)
        _, m, n = x.type.shape
        p = y.type.shape[2]
        left = b.bind("reshape", x, shape=(k, m, n, 1))
        right = b.bind("reshape", y, shape=(k, 1, n, p))
        return b.bind("reduce_sum", b.bind("mul", left, right, span=span), axes=(2,), span=span)
    if has[0]:  # (k, m, n) @ (n, p): k * m rows
        _, m, n = x.type.shape
        rows = b.bind("reshape", x, shape=(k * m, n))
        out = b.bind("matmul", rows, y, span=span)
        return b.bind("reshape", out, shape=(k, m, y.type.shape[1]))
    # (m, n) @ (k, n, p): the k right-hand sides side by side, (n, k * p)
    _, n, p = y.type.shape
    sides = b.bind("reshape", b.bind("transpose", y, perm=(1, 0, 2)), shape=(n, k * p))
    out = b.bind("matmul", x, sides, span=span)
    m = x.type.shape[0]
    return b.bind("transpose", b.bind("reshape", out, shape=(m, k, p)), perm=(1, 0, 2))


def _stacked_index(b: Builder, eqn: Eqn, inputs: list[Atom], has: list[bool], k: Dim
                   ) -> Var:
    """A gather or scatter-add with a stacked index (a mapped index array,
    or a run-time index in the branch of an `if` on a mapped condition):
    each of the k reads (or adds) along the axis with its own index, which
    is a gather (scatter-add) along that axis of the stacked data with the
    index spread over the data's other axes; the indices keep their values,
    so the same out-of-range ones are refused."""
    p = eqn.p
    axis, span = p["axis"], eqn.span
    if eqn.op == "take" and not has[0]:  # one array: the k indices are one index array
        out = b.bind("take", *inputs, axis=axis, what=p["what"], span=span)
        rank = out.type.rank
        return b.bind("transpose", out, perm=(axis,) + tuple(a for a in range(rank)
                                                            if a != axis), span=span)
    # data, index (and values) each of the k: the stacked ones as they are
    data, idx, *values = (a if h else _spread(b, a, k) for a, h in zip(inputs, has))
    if eqn.op in ("take_along_axis", "scatter_add_along_axis"):
        return b.bind(eqn.op, data, idx, *values, axis=axis + 1, what=p["what"], span=span)
    # take / scatter_add: the index's axes become one axis of its m
    # elements, spread over the data's other axes: the same op along it
    lanes, shape = idx.type.shape[1:], data.type.shape
    before, after = shape[1:axis + 1], shape[axis + 2:]
    m = prod(lanes)
    along = (k,) + before + (m,) + after
    idx = b.bind("reshape", idx, shape=(k,) + (1,) * len(before) + (m,) + (1,) * len(after))
    idx = b.bind("broadcast_to", idx, shape=along)
    if eqn.op == "take":
        out = b.bind("take_along_axis", data, idx, axis=axis + 1, what=p["what"], span=span)
        return b.bind("reshape", out, shape=(k,) + before + lanes + after, span=span)
    v = b.bind("reshape", values[0], shape=along, span=span)
    return b.bind("scatter_add_along_axis", data, idx, v, axis=axis + 1, what=p["what"],
                  span=span)


def _index(b: Builder, eqn: Eqn, inputs: list[Atom], has: list[bool], k: Dim) -> Var:
    """A gather or scatter-add with stacked data and an unstacked index."""
    p = eqn.p
    axis = p["axis"] + 1
    if eqn.op == "take":
        return b.bind("take", *inputs, axis=axis, what=p["what"], span=eqn.span)
    if eqn.op == "take_along_axis":  # the index needs the data's every other axis
        return b.bind("take_along_axis", inputs[0], _spread(b, inputs[1], k), axis=axis,
                      what=p["what"], span=eqn.span)
    base, idx, values = (a if h or i == 1 else _spread(b, a, k)
                         for i, (a, h) in enumerate(zip(inputs, has)))
    if eqn.op == "scatter_add_along_axis":
        idx = _spread(b, idx, k)
    return b.bind(eqn.op, base, idx, values, axis=axis, what=p["what"], span=eqn.span)
