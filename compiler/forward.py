"""Forward-mode automatic differentiation as an IR -> IR transform.

Contract: `jvp(fn, wrt)` returns the function

    jvp(params..., t_1, ..., t_k) -> (outputs..., output_tangents...)

where `t_j` is the tangent of parameter `wrt[j]` (of its type) and each
output tangent has its output's type (zeros where no tangent flows).  Like
`autodiff.vjp`'s result it is an ordinary IR function: it fuses (an
elementwise chain's value and tangent are one loop), prints, and can be
differentiated again in either mode.

No op carries a JVP rule: the JVP of an equation is the transpose of its
VJP, which is linear in the cotangents (`compiler.linearity.transpose`).
For a primitive, that is the transpose of the IR its op-table VJP rule
builds; for a call with grad blocks (`custom_vjp`), the call stays
(`autodiff.call_forward`) and its `bwd`, the first grad block (which the
compiler checked to be linear in its upstream cotangents), is transposed.  So forward mode runs
through hand-written blocks with nothing more written, and follows them
exactly: where a block differs from the derivative of its function's body,
the tangent is the block's.  `where(c, a, b)`'s tangent is
`where(c, t_a, 0) + where(c, 0, t_b)`: the branch not taken contributes
nothing, NaN or inf included; and as in reverse mode, a tangent keeps a
where-mask (where it may be nonzero) through the elementwise ops after
it, which re-select by it, so `sqrt(where(x > 0, x, 0))` (or of
`maximum(x, 0)`) has tangent 0 at x < 0 instead of 0 * inf = NaN; and
through ops that only move, sum or spread positions
(`autodiff.moved_positions_mask`); and through a call, whose block's
transpose keeps the masks of its inputs' tangents and of its own wheres
(`linearity.masked_transpose`).  A
`loop`'s JVP is a loop that also carries its carried values' tangents
(those that have one or become active), with the JVP of its body as its
body, into which the where-masks of its inputs' tangents go where every
trip keeps them (`_loop_jvp`).  Only float values
carry tangents.
"""
from __future__ import annotations

from typing import Optional, Sequence

from gradlang.compiler import ops
from gradlang.compiler.autodiff import (MOVES_POSITIONS, call_forward, elementwise_mask,
                                       materialized, moved_positions_mask, vjp, zero_outside)
from gradlang.compiler.builder import Builder, inline
from gradlang.compiler.ir import Atom, Eqn, Function, TensorType, Var
from gradlang.compiler.linearity import masked_transpose, transpose, transpose_eqns


def jvp(fn: Function, wrt: Sequence[int]) -> Function:
    return _jvp(fn, wrt, {})[0]


def _jvp(fn: Function, wrt: Sequence[int], masked: dict[int, TensorType]
         ) -> tuple[Function, list[frozenset[int]]]:
    """`jvp`, where the tangent of parameter j (in wrt) has a where-mask
    for each j in `masked` (of that type; a parameter after the tangents,
    in order of j): a loop's body (`_loop_jvp`).  Also returns, by output,
    the j whose masks its tangent's lies within (zero wherever j's is)."""
    b = Builder()
    params = [Var(v.type, v.hint) for v in fn.params]
    tangents_in = [Var(params[i].type, f"t_{params[i].hint}") for i in wrt]
    env: dict[Var, Atom] = dict(zip(fn.params, params))
    tangents: dict[Var, Atom] = {params[i]: t for i, t in zip(wrt, tangents_in)
                                 if t.type.is_float}
    mask_params = {j: Var(masked[j], "mask") for j in sorted(masked)}
    # a tangent's where-mask, where it has one
    masks: dict[Var, Var] = {params[j]: m for j, m in mask_params.items()}

    def sub(a: Atom) -> Atom:
        return env.get(a, a) if isinstance(a, Var) else a

    for eqn in fn.eqns:
        inputs = tuple(sub(a) for a in eqn.inputs)
        in_tangents = [tangents.get(a) if isinstance(a, Var) else None for a in inputs]
        op = ops.OPS[eqn.op]
        active = op.differentiable and any(t is not None for t in in_tangents)
        if op.kind == "loop" and active:
            outs, out_tangents, out_masks = _loop_jvp(
                b, eqn, inputs, in_tangents,
                [masks.get(a) if isinstance(a, Var) else None for a in inputs])
            masks.update((o, m) for o, m in zip(outs, out_masks) if m is not None)
        elif op.kind == "call":
            outs, residuals = call_forward(b, eqn, inputs)
            out_tangents = []
            if active:
                out_tangents, out_masks = _call_jvp(
                    b, eqn, inputs, residuals, in_tangents,
                    [masks.get(a) if isinstance(a, Var) else None for a in inputs])
                masks.update((o, m) for o, m in zip(outs, out_masks) if m is not None)
        else:
            copy = Eqn(eqn.op, inputs, tuple(Var(v.type, v.hint) for v in eqn.outputs),
                       eqn.params, eqn.span)
            b.eqns.append(copy)
            outs = list(copy.outputs)
            out_tangents = _primitive_jvp(b, copy, in_tangents) if active else []
            if active and op.kind == "elementwise":
                mask = elementwise_mask(b, copy, in_tangents, [masks.get(a) for a in inputs])
                if mask is not None:
                    out_tangents = [_select(b, op, mask, t) for t in out_tangents]
                    masks[copy.out] = mask
            elif active and op.kind in MOVES_POSITIONS:
                mask = moved_positions_mask(b, copy, in_tangents, [masks.get(a) for a in inputs])
                if mask is not None:
                    masks[copy.out] = mask
        env.update(zip(eqn.outputs, outs))
        for out, t in zip(outs, out_tangents):
            if t is not None and isinstance(out, Var) and out.type.is_float:
                tangents[out] = t
    outputs = [sub(a) for a in fn.outputs]
    out_tangents = [tangents.get(o) if isinstance(o, Var) else None for o in outputs]
    out_tangents = [t if t is not None else ops.zeros_like(b, o.type)
                    for t, o in zip(out_tangents, outputs)]
    made = {e.out: e for e in b.eqns if e.op in ("logical_and", "logical_or")}
    out_masks = [frozenset(j for j, m in mask_params.items()
                           if isinstance(o, Var) and _within(masks.get(o), m, made))
                 for o in outputs]
    return (b.function(f"{fn.name}_jvp", params + tangents_in + list(mask_params.values()),
                       outputs + out_tangents), out_masks)


def _within(mask: Optional[Var], m: Var, made: dict[Var, Eqn]) -> bool:
    """Whether where-mask `mask` is false wherever m is: it is m, m and
    something (a `where` taken under it), or either of two such."""
    if mask is None:
        return False
    if mask is m:
        return True
    eqn = made.get(mask)
    if eqn is None:
        return False
    inside = [isinstance(a, Var) and _within(a, m, made) for a in eqn.inputs]
    return any(inside) if eqn.op == "logical_and" else all(inside)


def _select(b: Builder, op: ops.Op, mask: Var, t: Optional[Atom]) -> Optional[Atom]:
    """A tangent re-selected by its mask (`where`'s rule already selects)."""
    return zero_outside(b, mask, t) if op.masking == "select" else t


def _loop_jvp(b: Builder, eqn: Eqn, inputs: Sequence[Atom],
              in_tangents: Sequence[Optional[Atom]], in_masks: Sequence[Optional[Var]]
              ) -> tuple[list[Atom], list[Optional[Atom]], list[Optional[Var]]]:
    """A loop that also carries the tangents of its float carried values
    that have one or that a trip makes active (`_active_inputs`), and
    reads those of its invariants and stacked inputs that have one,
    stacking those of its stacked outputs; its body is the JVP of the
    loop's body.  A tangent's where-mask (`in_masks`) enters the body as
    an invariant, for an invariant, and for a carried value whose
    tangent every trip keeps under it (its tangent after the loop keeps
    it too): else sqrt of a carried where(x > 0, x, 0) in the body was
    0 * inf = NaN at x <= 0, where reverse mode (and straight-line forward
    mode) gives 0.  Returns the loop's results, their tangents and masks."""
    p = eqn.p
    body, n_carry, n_inv = p["body"], p["n_carry"], p["n_inv"]
    groups = ops.loop_groups(range(len(inputs)), p)[1:]
    # a value takes a tangent only where it has one, or (a carried value)
    # where a trip can give it one: a zero tangent made for one that stays
    # without was a NaN through an infinite slope (0 * inf: log(w)'s or
    # sqrt(w)'s at w = 0) and work every trip (h @ 0 for a weight); and a
    # stacked output only where it depends on one that takes one: a
    # stack of zero tangents was read by a later loop (a backward loop
    # reading the states its forward loop stacked) as if it had tangents
    active, ys_active = _active_inputs(body, n_carry, [t is not None for t in in_tangents])
    floats = [[k for k in group if inputs[k].type.is_float and active[k]] for group in groups]
    # body parameter k + 1 - 3 is the loop's input k (parameter 0 is the index)
    wrt = [k - 2 for group in floats for k in group]
    masked = {k: in_masks[k] for k in floats[0] + floats[1]
              if in_masks[k] is not None and in_tangents[k] is not None}
    while True:  # to the carried values whose masks every trip keeps
        inner, out_masks = _jvp(body, wrt, {k - 2: m.type for k, m in masked.items()})
        kept = {k: m for k, m in masked.items() if k not in floats[0] or k - 2 in out_masks[k - 3]}
        if kept == masked:
            break
        masked = kept
    mask_of = {k: Var(m.type, "mask") for k, m in sorted(masked.items())}
    tangent = {k: in_tangents[k] if in_tangents[k] is not None
               else ops.zeros_like(b, inputs[k].type) for group in floats for k in group}
    bb = Builder()
    index = Var(body.params[0].type, body.params[0].hint)
    params = {k: Var(inputs[k].type if k < 3 + n_carry + n_inv else body.params[k - 2].type,
                     body.params[k - 2].hint) for k in range(3, len(inputs))}
    t_params = {k: Var(params[k].type, "t") for group in floats for k in group}
    results = inline(bb, inner, [index] + [params[k] for k in range(3, len(inputs))]
                     + [t_params[k] for group in floats for k in group] + list(mask_of.values()))
    n_out = len(body.outputs)
    values, tangents = results[:n_out], results[n_out:]
    carried_t = [tangents[k - 3] for k in floats[0]]
    ys_t = [t for t, a in zip(tangents[n_carry:], ys_active) if a]
    order = [index] + [params[k] for k in groups[0]] + [t_params[k] for k in floats[0]] \
        + [params[k] for k in groups[1]] + [t_params[k] for k in floats[1]] \
        + list(mask_of.values()) + [params[k] for k in groups[2]] + [t_params[k] for k in floats[2]]
    stepped = bb.function(f"{body.name}_jvp", order,
                          values[:n_carry] + carried_t + values[n_carry:] + ys_t)
    outs = b.bind_multi("loop", *inputs[:3], *[inputs[k] for k in groups[0]],
                        *[tangent[k] for k in floats[0]], *[inputs[k] for k in groups[1]],
                        *[tangent[k] for k in floats[1]], *[masked[k] for k in mask_of],
                        *[inputs[k] for k in groups[2]],
                        *[tangent[k] for k in floats[2]], span=eqn.span,
                        **{**p, "body": stepped, "n_carry": n_carry + len(floats[0]),
                           "n_inv": n_inv + len(floats[1]) + len(mask_of)})
    n_c = n_carry + len(floats[0])
    t_of = dict(zip(floats[0], outs[n_carry:n_c]))
    n_ys = len(body.outputs) - n_carry
    stacked_t = iter(outs[n_c + n_ys:])
    out_tangents = [t_of.get(3 + j) for j in range(n_carry)] \
        + [next(stacked_t) if a else None for a in ys_active]
    masks = [masked.get(3 + j) for j in range(n_carry)] + [None] * n_ys
    return list(outs[:n_carry]) + list(outs[n_c:n_c + n_ys]), out_tangents, masks


def _active_inputs(body: Function, n_carry: int, has: Sequence[bool]
                   ) -> tuple[list[bool], list[bool]]:
    """By loop input (bounds first): whether it takes a tangent in the
    loop's JVP: it has one (`has`), or it is a carried value that a trip
    makes depend, through differentiable ops, on one that takes one (to a
    fixed point: a value may become active a trip after another).  A
    superset of where `jvp(body, ...)` makes a tangent (a loop or call in
    the body counts all its outputs active when one input is), so no
    tangent is dropped.  Also, by stacked output, whether it depends on
    one that takes a tangent."""
    active = list(has)
    while True:
        # body parameter k - 2 is the loop's input k (parameter 0 is the index)
        reached = _depends_differentiably(body, [False] + active[3:])
        grown = [a or (3 <= k < 3 + n_carry and reached[k - 3]) for k, a in enumerate(active)]
        if grown == active:
            return active, reached[n_carry:]
        active = grown


def _depends_differentiably(fn: Function, flags: Sequence[bool]) -> list[bool]:
    """Which of fn's outputs are float values that depend, through
    differentiable ops only, on its parameters flagged.  A nested loop's
    outputs are those its JVP gives tangents (`_loop_outputs_active`):
    counting them all let a carried value that a segment's inner loop
    only passes along (`@recompute(every=k)`) take a zero tangent."""
    depends = {p for p, f in zip(fn.params, flags) if f and p.type.is_float}
    for eqn in fn.eqns:
        has = [isinstance(a, Var) and a in depends for a in eqn.inputs]
        if not ops.OPS[eqn.op].differentiable or not any(has):
            continue
        reached = _loop_outputs_active(eqn, has) if eqn.op == "loop" else \
            [True] * len(eqn.outputs)
        depends.update(o for o, r in zip(eqn.outputs, reached) if r and o.type.is_float)
    return [isinstance(o, Var) and o in depends for o in fn.outputs]


def _loop_outputs_active(eqn: Eqn, has: Sequence[bool]) -> list[bool]:
    """Which of a loop's outputs take a tangent in its JVP (`_loop_jvp`),
    given which of its inputs have one."""
    body, n_carry = eqn.p["body"], eqn.p["n_carry"]
    active, ys = _active_inputs(body, n_carry, has)
    return [a and eqn.inputs[k].type.is_float for k, a in enumerate(active[3:3 + n_carry], 3)] + ys


def _call_jvp(b: Builder, eqn: Eqn, inputs: Sequence[Atom], residuals: Sequence[Atom],
              in_tangents: Sequence[Optional[Atom]], in_masks: Sequence[Optional[Var]]
              ) -> tuple[list[Optional[Atom]], list[Optional[Var]]]:
    """The transpose of the call's first grad block: its `bwd` maps output
    cotangents to input cotangents, so its transpose maps input tangents
    to output tangents.  Also their where-masks (None: none), from the
    inputs' (`in_masks`) and the block's wheres: the tangent of a block
    where(x > 0, d, 0) keeps x > 0, so that sqrt of the call has tangent 0
    at x <= 0 (it was 0 * inf = NaN), as for the same where unwritten."""
    n_out = eqn.p["n_out"]
    bwd = materialized(eqn).p["bwd"]
    args = list(inputs) + list(residuals) + [None] * n_out
    tangents, masks = masked_transpose(b, bwd, args, in_tangents, in_masks)
    masks = [_mask_at(b, m, t) for m, t in zip(masks, bwd.params[len(args) - n_out:])]
    if _makes_calls(bwd):  # (the masks only, from that transpose: its tangents are dead)
        # a call of its own, which transposes the block with no masks:
        # its tangents re-selected by them (an input's where-mask too)
        tangents = [zero_outside(b, m, t) for t, m in
                    zip(_tangent_call(b, eqn, bwd, inputs, residuals, in_tangents), masks)]
    return tangents, masks


def _mask_at(b: Builder, mask: Optional[Var], v: Var) -> Optional[Var]:
    """A where-mask (None: none) at the shape of v, to which it broadcasts."""
    if mask is None or mask.type.shape == v.type.shape:
        return mask
    return b.bind("broadcast_to", mask, shape=v.type.shape)


def _makes_calls(fn: Function) -> bool:
    """Whether `fn` (a call's `bwd`) makes a `custom_vjp` call, in a loop's
    body too: a first grad block with a block after it (staging makes
    such a `bwd` the next stage's `custom_vjp`), a block calling a
    function with a grad block (`dy * g(x)`), or a `@recompute` body's
    rerun.  Transposing `fn` inlines its calls (`linearity.transpose`),
    so reverse mode over the transpose would differentiate their bodies,
    not their blocks: `_tangent_call` differentiates `fn` itself."""
    return any(e.op == "custom_vjp"
               or any(isinstance(v, Function) and _makes_calls(v) for _, v in e.params)
               for e in fn.eqns)


def _tangent_call(b: Builder, eqn: Eqn, bwd: Function, inputs: Sequence[Atom],
                  residuals: Sequence[Atom], in_tangents: Sequence[Optional[Atom]]
                  ) -> list[Optional[Atom]]:
    """`_call_jvp` for a call whose `bwd` makes calls (`_makes_calls`),
    such as a function with a second grad block: the tangent
    J(x) t, the transpose of the first block (`bwd(x, r, c) = J^T c`), as a
    `custom_vjp` call whose own VJP differentiates `bwd` rather than its
    transpose, so that reverse mode over forward mode (`jacfwd(jacrev(f))`,
    `dsl.grad` of an in-language `jvp`) reaches the second block, as
    reverse over reverse does: d/dx <ct, J t> = d/dx <t, bwd(x, ct)> (the
    second block's x-cotangent, upstream t, dy = ct); along t it is
    bwd(x, ct).  The residuals are inputs with no cotangent: the VJP
    recomputes them from x, so that x's cotangent is the whole of it."""
    n_out = eqn.p["n_out"]
    n_x = len(inputs)
    active = [j for j, t in enumerate(in_tangents) if t is not None]
    out_types = [p.type for p in bwd.params[n_x + len(residuals):]]
    fb = Builder()
    xs = [Var(a.type, "x") for a in inputs]
    rs = [Var(r.type, "r") for r in residuals]
    ts = [Var(in_tangents[j].type, "t") for j in active]
    seeds: list[Optional[Atom]] = [None] * n_x
    for j, t in zip(active, ts):
        seeds[j] = t
    outs = transpose(fb, bwd, xs + rs + [None] * n_out, seeds)
    outs = [o if o is not None else ops.zeros_like(fb, t) for o, t in zip(outs, out_types)]
    fwd = fb.function(f"{eqn.p['name']}_tangent", xs + rs + ts, outs)
    back = _tangent_vjp(eqn, bwd, inputs, residuals, ts, active)
    return list(b.bind_multi("custom_vjp", *inputs, *residuals,
                             *[in_tangents[j] for j in active], span=eqn.span,
                             fwd=fwd, bwd=back, n_out=len(outs),
                             name=f"{eqn.p['name']}_tangent"))


def _tangent_vjp(eqn: Eqn, bwd: Function, inputs: Sequence[Atom], residuals: Sequence[Atom],
                 ts: Sequence[Var], active: Sequence[int]) -> Function:
    """`_tangent_call`'s bwd(x, r, t, ct) -> (x: <t, d bwd(x, ct)/dx>, with
    the residuals recomputed from x; r: zeros; t: bwd(x, r, ct))."""
    n_out, n_x = eqn.p["n_out"], len(inputs)
    out_types = [p.type for p in bwd.params[n_x + len(residuals):]]
    cb = Builder()
    cx = [Var(a.type, "x") for a in inputs]
    cc = [Var(t, "c") for t in out_types]
    recomputed = inline(cb, eqn.p["fwd"], cx)[n_out:]
    composite = cb.function(f"{eqn.p['name']}_block", cx + cc,
                            inline(cb, bwd, cx + recomputed + cc))
    wrt = [i for i, a in enumerate(inputs) if a.type.is_float]
    bb = Builder()
    xs = [Var(a.type, "x") for a in inputs]
    rs = [Var(r.type, "r") for r in residuals]
    ts2 = [Var(t.type, "t") for t in ts]
    cts = [Var(t, "ct") for t in out_types]
    upstream: list[Atom] = [ops.zeros_like(bb, a.type) for a in inputs]
    for j, t in zip(active, ts2):
        upstream[j] = t
    grads = dict(zip(wrt, inline(bb, vjp(composite, wrt), xs + cts + upstream)[n_x:]))
    x_cts = [grads.get(i, ops.zeros_like(bb, a.type)) for i, a in enumerate(inputs)]
    r_cts = [ops.zeros_like(bb, r.type) for r in residuals]
    along = inline(bb, bwd, xs + rs + cts)
    return bb.function(f"{eqn.p['name']}_tangent_bwd", xs + rs + ts2 + cts,
                       x_cts + r_cts + [along[j] for j in active])


def _primitive_jvp(b: Builder, eqn: Eqn, in_tangents: Sequence[Optional[Atom]]
                   ) -> list[Optional[Atom]]:
    """The transpose of the op's VJP rule, built on placeholder cotangents."""
    op = ops.OPS[eqn.op]
    needs = [t is not None for t in in_tangents]
    cts = [Var(o.type, "ct") for o in eqn.outputs]
    scratch = Builder()
    in_cts = op.vjp(scratch, eqn, cts, needs)
    if op.kind == "elementwise":
        in_cts = [ops.unbroadcast(scratch, c, a.type.shape) if c is not None else None
                  for c, a in zip(in_cts, eqn.inputs)]
    seeds = [t if need else None for t, need in zip(in_tangents, needs)]
    out_cts = transpose_eqns(b, scratch.eqns, set(cts), in_cts, seeds, masking=False)
    return [out_cts.of(c) for c in cts]
