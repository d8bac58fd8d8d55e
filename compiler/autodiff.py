"""Reverse-mode automatic differentiation as an IR -> IR transform.

Contract: `vjp(fn, wrt)` returns the *joint* function

    joint(params..., ct_1, ..., ct_k) -> (outputs..., grad_wrt_1, ...)

where `ct_i` is the cotangent of fn's i-th output and `grad_wrt_j` the
cotangent of parameter `wrt[j]` (zeros when nothing flows to it, cast to the
parameter's dtype).  It is an ordinary IR function: it can be
differentiated again, simplified, fused and printed.

Primitive derivatives come from the op table (`compiler.ops`): each row's
VJP rule, and how the where-mask applies to it (`Op.masking`).  The
gradient of `where(c, a, b)` takes nothing from the branch not selected,
even where that branch's derivative is inf or NaN.  A
`custom_vjp` call (a user function with a grad block) is differentiated by
its grad block: its `bwd` is inlined in the backward sweep, and the call
stays, returning the residuals too (`call_forward`), so that a second
differentiation takes its results through the block again and flows
through the residuals the block reads.  A `loop` is differentiated by a loop over
the same trips in reverse, whose body is the VJP of its body, reading
the states and small matrix products the forward loop stacks
(`loop_forward`, `loop_pull_back`); an invariant whose cotangent a trip is
an outer product of two vectors is summed after it, as one product of
their stacks.  Only float values carry cotangents; uses of one value sum.
"""
from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Optional, Sequence

from gradlang.compiler import ops, passes
from gradlang.compiler.builder import Builder, inline
from gradlang.compiler.fusion import FUSIBLE
from gradlang.compiler.ir import Atom, Eqn, Function, Lit, TensorType, Var, vars_in
from gradlang.compiler.shapes import Sym, broadcasts_to, made_up, prod
from gradlang.runtime.common import range_length
from gradlang.runtime.errors import GradError


# One step of the forward sweep: the equation as copied (its inputs renamed),
# the values standing for its outputs, and a custom call's residuals.
_Record = tuple[Eqn, list[Atom], Optional[list[Atom]]]


def vjp(fn: Function, wrt: Sequence[int], masked: Sequence[int] = (),
        seeded: Optional[int] = None) -> Function:
    """The joint function (see above).  With `masked` (output positions),
    it also takes a where-mask for those outputs' cotangents (bool, at the
    output's shape: where the cotangent may be nonzero), after the
    cotangents, and also returns the masks of the `wrt` parameters'
    cotangents, each at its parameter's shape: a loop's backward body
    carries them from trip to trip (`loop_pull_back`).  With `seeded`, it
    takes cotangents for the first `seeded` outputs only: the others are
    values alone, from the same forward sweep."""
    return _joint(fn, wrt, masked, with_masks=bool(masked), seeded=seeded)[0]


def _joint(fn: Function, wrt: Sequence[int], masked: Sequence[int], with_masks: bool,
           seeded: Optional[int] = None, given: Sequence[Var] = ()) -> tuple[Function, list[bool]]:
    """`vjp`'s joint function, returning the `wrt` parameters' masks where
    `with_masks` (also with no mask given: a where inside fn makes some),
    and for each of them whether it is one (False: everywhere).  `given`
    (values of fn, each one equation's only output) become parameters
    after all the others: their equations are not computed again, only
    differentiated (a loop's stacked products, `loop_pull_back`)."""
    b = Builder()
    params = [Var(v.type, v.hint) for v in fn.params]
    env: dict[Var, Atom] = dict(zip(fn.params, params))
    active: set[Var] = {params[i] for i in wrt if params[i].type.is_float}
    given_params = {v: Var(v.type, v.hint) for v in given}
    tape = _forward_sweep(b, fn, env, active, given_params)
    outputs = [env.get(a, a) if isinstance(a, Var) else a for a in fn.outputs]
    cts_in = [Var(a.type, f"d{i}") for i, a in enumerate(outputs[:seeded])]
    masks_in = {i: Var(TensorType("bool", outputs[i].type.shape), f"m{i}") for i in masked}
    cots = Cotangents(b, active)
    for i, (out, ct) in enumerate(zip(outputs, cts_in)):
        cots.accumulate(out, ct, masks_in.get(i))
    for record in reversed(tape):
        _pull_back(b, record, cots)
    grads = [cots.of(params[i]) for i in wrt]
    grads = [g if g is not None else ops.zeros_like(b, params[i].type)
             for i, g in zip(wrt, grads)]
    if not with_masks:
        return b.function(f"{fn.name}_vjp", params + cts_in + list(given_params.values()),
                          outputs + grads), []
    # a parameter nothing flows to has its zero cotangent nowhere
    found = [cots.mask(params[i]) if cots.of(params[i]) is not None
             else ops.full(b, False, params[i].type.shape, "bool") for i in wrt]
    masks_out = [_mask_at(b, m, params[i].type) for i, m in zip(wrt, found)]
    joint = b.function(f"{fn.name}_vjp", params + cts_in + list(masks_in.values())
                       + list(given_params.values()), outputs + grads + masks_out)
    return joint, [m is not None for m in found]


def _mask_at(b: Builder, mask: Optional[Var], t: TensorType) -> Var:
    """A where-mask as a bool value of type t's shape (None: everywhere)."""
    if mask is None:
        return ops.full(b, True, t.shape, "bool")
    if mask.type.shape != t.shape:
        return b.bind("broadcast_to", mask, shape=t.shape)
    return mask


def _forward_sweep(b: Builder, fn: Function, env: dict[Var, Atom], active: set[Var],
                   given: Optional[dict[Var, Var]] = None) -> list[_Record]:
    """Copies the primal into `b`, expanding custom calls into their fwd
    body (remembering the residuals their bwd will read); returns the tape
    of equations a cotangent flows through and grows `active` with the
    float values that depend on an active one.  An equation whose output
    `given` maps is taped on that value, not copied."""
    tape: list[_Record] = []
    for eqn in fn.eqns:
        inputs = tuple(env.get(a, a) if isinstance(a, Var) else a for a in eqn.inputs)
        op = ops.OPS[eqn.op]
        if given and len(eqn.outputs) == 1 and eqn.outputs[0] in given:
            outs = [given[eqn.outputs[0]]]
            record = (Eqn(eqn.op, inputs, tuple(outs), eqn.params, eqn.span), outs, None)
        elif op.kind == "loop" and any(a in active for a in vars_in(inputs)):
            record = loop_forward(b, eqn, inputs)
            outs = record[1]
        elif op.kind == "call":
            outs, residuals = call_forward(b, eqn, inputs)
            record = (Eqn(eqn.op, inputs, eqn.outputs, eqn.params, eqn.span), outs, residuals)
        else:
            copy = Eqn(eqn.op, inputs, tuple(Var(v.type, v.hint) for v in eqn.outputs),
                       eqn.params, eqn.span)
            b.eqns.append(copy)
            outs = list(copy.outputs)
            record = (copy, outs, None)
        env.update(zip(eqn.outputs, outs))
        if op.differentiable and any(a in active for a in vars_in(inputs)):
            active.update(o for o in vars_in(outs) if o.type.is_float)
            tape.append(record)
    return tape


class Cotangents:
    """The backward sweep's state: each active value's cotangent so far,
    and its where-mask: a bool value (broadcastable to it) where the
    cotangent may be nonzero, or None for everywhere.  Inside a branch of
    `where`, every contribution is re-selected by the mask (see
    `select_by_mask`), so the branch not taken contributes exactly 0 even
    where its local derivative is inf or NaN.  (Also the transposition's:
    `linearity.transpose_eqns`.)"""

    def __init__(self, b: Builder, active: set[Var]):
        self.b = b
        self.active = active
        self.cts: dict[Var, Atom] = {}
        self.masks: dict[Var, Optional[Var]] = {}

    def needs(self, a: Atom) -> bool:
        return isinstance(a, Var) and a in self.active

    def of(self, v: Atom) -> Optional[Atom]:
        return self.cts.get(v) if isinstance(v, Var) else None

    def mask(self, v: Atom) -> Optional[Var]:
        return self.masks.get(v) if isinstance(v, Var) else None

    def accumulate(self, v: Atom, ct: Optional[Atom], mask: Optional[Var]) -> None:
        """Adds a contribution to v's cotangent; uses of one value sum."""
        if ct is None or not self.needs(v):
            return
        if ct.type.dtype != v.type.dtype:
            ct = self.b.bind("cast", ct, dtype=v.type.dtype)
        if v in self.cts:
            self.cts[v] = self.b.bind("add", self.cts[v], ct)
            self.masks[v] = self._union(self.masks[v], mask)
        else:
            self.cts[v] = ct
            self.masks[v] = mask


    def _union(self, first: Optional[Var], second: Optional[Var]) -> Optional[Var]:
        """Where a sum of two contributions may be nonzero: each is zero
        outside its own mask (two wheres not taken give a sum of zeros)."""
        if first is None or second is None:
            return None
        if first is second:
            return first
        return self.b.bind("logical_or", first, second)


def _pull_back(b: Builder, record: _Record, cots: Cotangents) -> None:
    """Adds the contributions of one taped equation to its inputs'
    cotangents: the op's VJP rule (a custom call's bwd), selected by the
    where-mask and, for elementwise ops, un-broadcast.  Every equation it
    adds with no place of its own is at the taped one's: an error about
    it (a Dask split refusing it) names the source the gradient is of,
    where it named the function's `def` line."""
    start = len(b.eqns)
    _pull_back_at(b, record, cots)
    span = record[0].span
    if span is not None:
        b.eqns[start:] = [e if e.span is not None else replace(e, span=span)
                          for e in b.eqns[start:]]


def _pull_back_at(b: Builder, record: _Record, cots: Cotangents) -> None:
    """`_pull_back`'s equations, some with no place."""
    eqn, outs, residuals = record
    out_cts = [cots.of(o) for o in outs]
    if all(c is None for c in out_cts):
        return
    eqn = materialized(eqn, [c is not None for c in out_cts])
    if eqn.op == "loop":
        out_masks = [cots.mask(o) for o in outs]
        for a, ct, mask in loop_pull_back(b, eqn, out_cts, residuals, out_masks):
            cots.accumulate(a, ct, mask)
        return
    out_cts = [c if c is not None else ops.zeros_like(b, o.type)
               for c, o in zip(out_cts, outs)]
    needs = [cots.needs(a) for a in eqn.inputs]
    op = ops.OPS[eqn.op]
    # the equation on the values standing for its outputs here
    shadow = Eqn(eqn.op, eqn.inputs, tuple(outs), eqn.params, eqn.span)
    block_masks: list[Optional[Var]] = [None] * len(eqn.inputs)
    if op.kind == "call":
        start = len(b.eqns)
        in_cts = inline(b, eqn.p["bwd"], list(eqn.inputs) + residuals + out_cts)
        in_cts, block_masks = _masked_by_block(b, start, out_cts,
                                               [cots.mask(o) for o in outs], in_cts)
    else:
        in_cts = op.vjp(b, shadow, out_cts, needs)
    out_mask = _common_mask([cots.mask(o) for o in outs])
    for index, (a, need, ct) in enumerate(zip(eqn.inputs, needs, in_cts)):
        if need and ct is not None:
            ct, mask = select_by_mask(b, shadow, index, ct, out_mask)
            if op.kind == "elementwise":
                ct = ops.unbroadcast(b, ct, a.type.shape)
            cots.accumulate(a, ct, _both(b, mask, block_masks[index]))


def _masked_by_block(b: Builder, start: int, cts: Sequence[Atom],
                     ct_masks: Sequence[Optional[Var]], results: Sequence[Atom]
                     ) -> tuple[list[Atom], list[Optional[Var]]]:
    """A grad block's results (computed from the cotangents `cts` by
    `b.eqns[start:]`, its inlined body), each re-selected by the where-mask
    it has (None: none), and those masks: the block's wheres, and the
    cotangents' masks `ct_masks`, carried through its equations as forward
    mode carries a tangent's (`elementwise_mask`, `moved_positions_mask`).
    Without them, the cotangent of x through a block where(x > 0, d, 0)
    met sqrt's infinite slope before the call: grad of sum(r(sqrt(x))) was
    0 * inf = NaN at x = 0, and 0 with the where written without a block.
    As forward mode does a tangent, each value the mask of an elementwise
    op holds is re-selected by it where it is made (the equations after it
    read the selected value): a block `where(x > 0, d, 0) / sqrt(x) + d`
    was NaN at x <= 0 in reverse mode (the sum has no mask: d has none),
    where its transpose (forward mode) and the block without `+ d` give
    the finite value.  A loop's body is re-selected so too (`_masked_loop`)."""
    eqns = b.eqns[start:]
    del b.eqns[start:]
    masks = {c: m for c, m in zip(cts, ct_masks) if isinstance(c, Var) and m is not None}
    reached = {c for c in cts if isinstance(c, Var)}
    alias: dict[Var, Atom] = {}

    def sub(a: Atom) -> Atom:
        return alias.get(a, a) if isinstance(a, Var) else a

    for e in eqns:
        e = Eqn(e.op, tuple(sub(a) for a in e.inputs), e.outputs, e.params, e.span)
        op = ops.OPS[e.op]
        # (a token input, as `@recompute`'s barrier on its rerun's inputs
        # takes the cotangent, is no value taken from it: its rerun of x
        # was reached, and the block's masks lost at 0.5 / sqrt(x))
        on = [isinstance(a, Var) and a in reached and i not in op.token_inputs
              for i, a in enumerate(e.inputs)]
        if not any(on):
            b.eqns.append(e)
            continue
        reached.update(e.outputs)
        if op.kind == "loop":
            e, loop_masks = _masked_loop(b, e, on, [masks.get(a) if isinstance(a, Var) else None
                                                    for a in e.inputs])
            b.eqns.append(e)
            masks.update((o, m) for o, m in zip(e.outputs, loop_masks) if m is not None)
            continue
        b.eqns.append(e)
        from_cts = [a if o else None for a, o in zip(e.inputs, on)]
        in_masks = [masks.get(a) if isinstance(a, Var) else None for a in e.inputs]
        mask = None
        if op.kind == "elementwise":
            mask = elementwise_mask(b, e, from_cts, in_masks)
            if mask is not None and op.masking == "select" and e.out.type.is_float:
                alias[e.out] = zero_outside(b, mask, e.out)
                reached.add(alias[e.out])
                masks[alias[e.out]] = mask
        elif op.kind in MOVES_POSITIONS:
            mask = moved_positions_mask(b, e, from_cts, in_masks)
        if mask is not None:
            masks[e.out] = mask
    results = [sub(r) for r in results]
    found = [masks.get(r) if isinstance(r, Var) else None for r in results]
    return [zero_outside(b, m, r) for r, m in zip(results, found)], found


def _masked_loop(b: Builder, eqn: Eqn, on: Sequence[bool], in_masks: Sequence[Optional[Var]]
                 ) -> tuple[Eqn, list[Optional[Var]]]:
    """A loop of a grad block whose body re-selects, as `_masked_by_block`
    does, the values it computes from the loop's inputs that the
    cotangents reach (`on`, by input; a carried value also where a trip
    makes it reached), by the where-masks found in the body; and the masks
    of its results (None: none), by result.  A float carried value that
    the cotangents reach carries its mask beside it, from its input's
    (`in_masks`; nowhere for an input they do not reach, which a linear
    block starts at zero) while every trip keeps one: without it the
    cotangent of sqrt(x) through a block `acc = acc + where(x > 0, d, 0)`
    in a loop was 0 * inf = NaN at x = 0, and 0 without the loop."""
    p = eqn.p
    body, n_carry = p["body"], p["n_carry"]
    reached = _loop_reach(eqn, on)[0]
    # body parameter 1 + j is carried value j, the loop's input 3 + j
    kept = [j for j in range(n_carry) if reached[1 + j] and body.params[1 + j].type.is_float
            and (not on[3 + j] or in_masks[3 + j] is not None)]
    # an invariant's mask goes in as an invariant (one the loop reads may
    # be the block's where, hoisted out of the body)
    n_inv = p["n_inv"]
    inv = [k for k in range(1 + n_carry, 1 + n_carry + n_inv)
           if on[k + 2] and in_masks[k + 2] is not None]
    while True:
        bb = Builder()
        params = [Var(v.type, v.hint) for v in body.params]
        mask_params = {j: Var(TensorType("bool", params[1 + j].type.shape), "mask") for j in kept}
        inv_masks = {k: Var(TensorType("bool", params[k].type.shape), "mask") for k in inv}
        results = inline(bb, body, params)
        cts = [v for v, r in zip(params, reached) if r]
        ct_masks = [mask_params.get(k - 1) if 1 <= k <= n_carry else inv_masks.get(k)
                    for k, r in enumerate(reached) if r]
        selected, found = _masked_by_block(bb, 0, cts, ct_masks, results)
        still = [j for j in kept if found[j] is not None]
        if still == kept:
            break
        kept = still
    mask_outs = [_mask_at(bb, found[j], params[1 + j].type) for j in kept]
    groups = ops.loop_groups(list(params), p, lead=1)
    new_body = bb.function(body.name, [*groups[0], *groups[1], *mask_params.values(),
                                       *groups[2], *inv_masks.values(), *groups[3]],
                           selected[:n_carry] + mask_outs + selected[n_carry:])
    entry = []
    for j in kept:
        t = TensorType("bool", eqn.inputs[3 + j].type.shape)
        m = in_masks[3 + j] if on[3 + j] else ops.full(b, False, t.shape, "bool")
        entry.append(_mask_at(b, m, t))
    inv_in = [_mask_at(b, in_masks[k + 2], TensorType("bool", eqn.inputs[k + 2].type.shape))
              for k in inv]
    bounds, carried, invariants, xs = ops.loop_groups(list(eqn.inputs), p)
    outs = [Var(m.type, "mask") for m in entry]
    new = Eqn(eqn.op, (*bounds, *carried, *entry, *invariants, *inv_in, *xs),
              (*eqn.outputs[:n_carry], *outs, *eqn.outputs[n_carry:]),
              tuple({**p, "body": new_body, "n_carry": n_carry + len(kept),
                     "n_inv": n_inv + len(inv)}.items()), eqn.span)
    out_masks: list[Optional[Var]] = [None] * len(eqn.outputs)
    for j, m in zip(kept, outs):
        out_masks[j] = m
    return new, out_masks + [None] * len(outs)


def loop_outputs_reading(eqn: Eqn, on: Sequence[bool]) -> list[bool]:
    """By output of loop `eqn`: whether it reads an input `on` marks (a
    carried value also through the trips before)."""
    return _loop_reach(eqn, on)[1]


def _loop_reach(eqn: Eqn, on: Sequence[bool]) -> tuple[list[bool], list[bool]]:
    """By parameter of a loop's body, whether it reads an input `on` marks
    (a carried one also where a trip makes it read one), and by output."""
    n_carry = eqn.p["n_carry"]
    # body parameter k - 2 is the loop's input k (parameter 0 is the index)
    reached = [False] + list(on[3:])
    while True:
        outs = _read_from(eqn.p["body"], reached)
        grown = [r or (1 <= k <= n_carry and outs[k - 1]) for k, r in enumerate(reached)]
        if grown == reached:
            return reached, outs
        reached = grown


def _read_from(fn: Function, reached: Sequence[bool]) -> list[bool]:
    """By output of `fn`: whether it reads a parameter `reached` marks."""
    on = {v for v, r in zip(fn.params, reached) if r}
    for e in fn.eqns:
        if any(isinstance(a, Var) and a in on for a in e.inputs):
            on.update(e.outputs)
    return [isinstance(o, Var) and o in on for o in fn.outputs]


def elementwise_mask(b: Builder, eqn: Eqn, in_tangents: Sequence[Optional[Atom]],
                     in_masks: Sequence[Optional[Var]]) -> Optional[Var]:
    """Where the tangent of an elementwise equation's output may be
    nonzero: where one of its inputs' tangents may be (each term of the
    tangent is zero outside its input's), and for `where` (or maximum...)
    only where that input was taken.  None: anywhere.  (Forward mode's
    tangents, and a grad block's results from its cotangents here:
    `_masked_by_block`.)"""
    row = ops.OPS[eqn.op]
    parts: list[Var] = []
    for k, (t, mask) in enumerate(zip(in_tangents, in_masks)):
        if t is None:
            continue
        taken = None
        if row.masking == "branches" and k > 0 and not _both_branches_alike(in_tangents, in_masks):
            cond = eqn.inputs[0]
            taken = cond if k == 1 else b.bind("logical_not", cond)
        elif row.picked_when is not None:
            taken = b.bind(row.picked_when, eqn.inputs[k], eqn.inputs[1 - k])
            if eqn.inputs[k].type.is_float and not isinstance(eqn.inputs[k], Lit):
                # (a NaN input is the one picked: maximum(NaN, 1) is NaN)
                taken = b.bind("logical_or", taken, b.bind("ne", eqn.inputs[k], eqn.inputs[k]))
        if taken is not None:
            mask = taken if mask is None or mask is taken else \
                b.bind("logical_and", mask, taken)
        if mask is None:
            return None
        parts.append(mask)
    if not parts:
        return None
    union = parts[0]
    for mask in parts[1:]:
        if mask is not union:
            union = b.bind("logical_or", union, mask)
    return union if isinstance(union, Var) else None


def _both_branches_alike(in_tangents: Sequence[Optional[Atom]],
                         in_masks: Sequence[Optional[Var]]) -> bool:
    """Whether both branches of a where have tangents, under one mask:
    then the where's is that mask, as c and not c cover every position.
    (Narrowing each by its branch built (m & c) | (m & not c), or c | not c
    for no mask, and selected every element by it: a grad block
    where(c, dy * 2, dy * 3), as std's leaky_relu and log_softmax have.)"""
    return in_tangents[1] is not None and in_tangents[2] is not None and \
        in_masks[1] is in_masks[2]


def moved_positions_mask(b: Builder, eqn: Eqn, in_tangents: Sequence[Optional[Atom]],
                         in_masks: Sequence[Optional[Var]]) -> Optional[Var]:
    """Where the tangent of an op that only moves, sums or spreads its
    inputs with positive weights (a layout op, a reduction, a gather or
    scatter, a scan) may be nonzero: where the op of its float inputs'
    masks as 0 and 1 (0 for an input without a tangent) is positive, the
    output gathers something from inside them.  None: anywhere (an input
    with a tangent and no mask).  Without it, sqrt(where(x > 0, x, 0)[0])
    (or of a slice, a transpose, a sum) was 0 * inf = NaN at x <= 0, where
    reverse mode moves the mask the other way (`_moved_mask`)."""
    if len(eqn.outputs) != 1 or ops.OPS[eqn.op].token_inputs:
        return None
    weights: list[Atom] = []
    for a, t, mask in zip(eqn.inputs, in_tangents, in_masks):
        if not a.type.is_float:
            weights.append(a)  # (an index: the same positions)
        elif t is None:
            weights.append(ops.lit(b, 0, a) if isinstance(a, Lit) else ops.zeros_like(b, a.type))
        elif mask is None:
            return None
        else:
            if mask.type.shape != a.type.shape:
                mask = b.bind("broadcast_to", mask, shape=a.type.shape)
            weights.append(b.bind("cast", mask, dtype=a.type.dtype))
    (moved,) = b.bind_multi(eqn.op, *weights, **dict(eqn.params))
    return b.bind("gt", moved, ops.lit(b, 0, moved))


def zero_outside(b: Builder, mask: Optional[Var], v: Optional[Atom]) -> Optional[Atom]:
    """v where `mask` holds and exactly 0 elsewhere, NaN or inf included
    (v itself where there is no mask, or no v)."""
    return v if mask is None or v is None else b.bind("where", mask, v, ops.lit(b, 0, v))


def _both(b: Builder, first: Optional[Var], second: Optional[Var]) -> Optional[Var]:
    """Where a value within two where-masks (None: anywhere) may be nonzero."""
    if first is None or second is None or first is second:
        return second if first is None else first
    if first.type.shape != second.type.shape:
        return first  # (not narrowed, to stay of one shape)
    return b.bind("logical_and", first, second)


_trip_symbols = itertools.count()


def loop_forward(b: Builder, eqn: Eqn, inputs: Sequence[Atom]) -> _Record:
    """The forward half of a loop: the loop itself, also stacking the
    carried values each trip starts from and the products it makes
    (`_products_to_stack`; one slot per trip, sized by the trip count when
    the loop runs): the residuals of its backward loop.  The record's
    `stacked_products` names the products, in the order of their stacks,
    which follow the states'."""
    p = eqn.p
    body, n_carry = p["body"], p["n_carry"]
    trip = p["trip"] if p["trip"] is not None else _trip_dim(inputs)
    products = _products_to_stack(body, n_carry, p["n_inv"])
    residuals = body.params[1:1 + n_carry] + tuple(products)
    # what the loop stacks already (a backward loop's reads, differentiated
    # again: the states and products of the forward loop of the first pass)
    # is read from that stack, not stacked twice
    ys = body.outputs[n_carry:]
    more = tuple(dict.fromkeys(v for v in residuals if v not in ys))
    stacking = Function(f"{body.name}_fwd", body.params, body.eqns, body.outputs + more)
    params = {**p, "trip": trip}
    results = b.bind_multi("loop", *inputs, span=eqn.span, **{**params, "body": stacking})
    n_out = len(eqn.outputs)
    stacks = {**dict(zip(ys, results[n_carry:n_out])), **dict(zip(more, results[n_out:]))}
    params["stacked_products"] = tuple(products)
    record = Eqn(eqn.op, inputs, eqn.outputs, tuple(sorted(params.items())), eqn.span)
    return record, list(results[:n_out]), [stacks[v] for v in residuals]


def _products_to_stack(body: Function, n_carry: int, n_inv: int) -> list[Var]:
    """The matrix products of a loop body that change from trip to trip
    and are at most as large as one of its carried float values.  The
    backward loop reads them from their stacks instead of multiplying
    again (an RNN's `h @ w`: a third of its backward trip's work), each
    no larger than a stacked state (`_joint_given_small` drops those larger
    than every state the backward trip reads); a larger product (a loop
    over the layers of a transformer: its scores, n x n against a state of
    n x d) is computed again, as the states are all it keeps."""
    carried = [prod(v.type.shape) for v in body.params[1:1 + n_carry] if v.type.is_float]
    invariant = set(body.params[1 + n_carry:1 + n_carry + n_inv])
    varying = set(body.params) - invariant
    products = []
    for e in body.eqns:
        if not any(a in varying for a in vars_in(e.inputs)):
            continue
        varying.update(e.outputs)
        if e.op != "matmul":  # (a check, `check_trips` of a dead inner loop, has no outputs)
            continue
        out = e.outputs[0]
        if out.type.is_float and _no_larger_than_one(out, carried):
            products.append(out)
    return products


def _no_larger_than_one(v: Var, sizes: list) -> bool:
    """Whether v's element count is known to be at most one of `sizes`."""
    return any(_at_most(prod(v.type.shape), size) for size in sizes)


def _at_most(size, bound) -> bool:
    """Whether an element count is known to be at most `bound` (both
    ints, or the same product of symbols with a coefficient at most the
    bound's)."""
    if isinstance(size, int) and isinstance(bound, int):
        return size <= bound
    if isinstance(size, Sym) and isinstance(bound, Sym):
        return size.factors == bound.factors and size.coef <= bound.coef
    return False


def _trip_dim(inputs: Sequence[Atom]):
    """The trip count of a loop on `inputs` as a dimension: an int when its
    bounds are constants, else a fresh symbol, bound when the loop runs
    (named apart from every size a user names: `shapes.made_up`)."""
    if all(isinstance(a, Lit) for a in inputs[:3]):
        return range_length(*(a.value for a in inputs[:3]))
    return made_up("trip", next(_trip_symbols))


def loop_pull_back(b: Builder, eqn: Eqn, out_cts: Sequence[Optional[Atom]],
                   stacked: Sequence[Atom], out_masks: Sequence[Optional[Var]] = ()
                   ) -> list[tuple[Atom, Atom, Optional[Var]]]:
    """A loop's VJP: a loop over the same trips in the other direction,
    carrying the carried values' cotangents and the sums of the
    invariants' ones, reading each trip's starting state from `stacked`
    (`loop_forward`'s residuals); its body is the VJP of the loop's body
    (so it differentiates again).  Where a cotangent of the loop's
    outputs has a where-mask (`out_masks`, by output), the backward loop
    carries the float carried values' masks too (a carried value with no
    cotangent: nowhere) and reads each trip's slice of the masks of the
    stacked outputs (ys), so that a derivative inside the body that is
    inf where nothing flows (sqrt at 0 in a loop whose result a where does
    not take) meets a selection, not a product with 0.  It stacks the
    masks its body finds for the slices it reads (xs) as well: a second
    reverse pass, through the backward loop of a first, finds the mask of
    each trip's starting state there, which the forward loop's VJP then
    reads as its stacked outputs' masks.  Returns (input, cotangent, mask)
    for each float input that an output with a cotangent depends on."""
    products = dict(zip(eqn.p.get("stacked_products", ()), stacked[eqn.p["n_carry"]:]))
    eqn, out_cts, out_masks, stacked = _with_cotangents_only(eqn, out_cts, out_masks, stacked)
    p = eqn.p
    body, n_carry, n_inv = p["body"], p["n_carry"], p["n_inv"]
    bounds, carry, inv, xs = ops.loop_groups(eqn.inputs, p)
    ys_types = [o.type for o in eqn.outputs[n_carry:]]
    # what carries a cotangent: the float carried values, invariants and xs
    floats = [[k for k, a in enumerate(group) if a.type.is_float] for group in (carry, inv, xs)]
    offsets = (1, 1 + n_carry, 1 + n_carry + n_inv)
    wrt = [off + k for off, group in zip(offsets, floats) for k in group]
    body, wide = _widened(body, n_carry, floats[1])
    made = {o for e in body.eqns for o in e.outputs}  # (what the pruning left)
    products = {v: stack for v, stack in products.items() if v in made}
    with_ct = [k for k, ct in enumerate(out_cts[n_carry:]) if ct is not None]
    ys_masked = [k for k in with_ct if out_masks[n_carry + k] is not None]
    nowhere = [k for k in floats[0] if out_cts[k] is None]
    masks_carried = bool(floats[0]) and (
        bool(ys_masked) or any(out_masks[k] is not None for k in floats[0] if k not in nowhere))
    masked = (floats[0] if masks_carried else []) + [n_carry + k for k in ys_masked]
    joint, found, products = _joint_given_small(body, n_carry, wrt, masked, products)
    n_c, n_i = len(floats[0]), len(floats[1])
    inv_masked = [j for j, real in enumerate(found[n_c:n_c + n_i]) if real]
    xs_masked = [j for j, real in enumerate(found[n_c + n_i:]) if real]
    bb = Builder()
    index = Var(body.params[0].type, "i")
    ct_carry = [Var(carry[k].type, "dc") for k in floats[0]]
    sums = [Var(wide.get(k, inv[k].type), "dsum") for k in floats[1]]
    inv_params = [Var(a.type, a.hint) for a in inv]
    starts = [Var(body.params[1 + k].type, "c") for k in range(n_carry)]
    x_slices = [Var(body.params[offsets[2] + k].type, "x") for k in range(len(xs))]
    y_cts = [Var(TensorType(ys_types[k].dtype, ys_types[k].shape[1:]), "dy") for k in with_ct]
    y_masks = [Var(TensorType("bool", ys_types[k].shape[1:]), "my") for k in ys_masked]
    product_slices = [Var(v.type, "p") for v in products]
    given = dict(zip(floats[0], ct_carry))
    body_cts = [given[k] if k in given else ops.zeros_like(bb, body.out_types[k])
                for k in range(n_carry)]
    given_y = dict(zip(with_ct, y_cts))
    body_cts += [given_y[k] if k in given_y else ops.zeros_like(bb, body.out_types[n_carry + k])
                 for k in range(len(ys_types))]
    inv_args = [bb.bind("broadcast_to", a, shape=wide[k].shape) if k in wide else a
                for k, a in enumerate(inv_params)]
    mask_carry = [Var(TensorType("bool", carry[k].type.shape), "mc")
                  for k in floats[0] if masks_carried]
    inv_mask_carry = [Var(TensorType("bool", sums[j].type.shape), "mi") for j in inv_masked]
    results = inline(bb, joint, [index] + starts + inv_args + x_slices + body_cts + mask_carry
                     + y_masks + product_slices)
    grads = results[len(body.outputs):len(body.outputs) + len(wrt)]
    masks = results[len(body.outputs) + len(wrt):]
    new_masks = masks[:n_c] if masks_carried else []
    # an invariant's cotangent, summed over the trips, may be nonzero where any trip's may
    new_masks += [bb.bind("logical_or", mi, masks[n_c + j])
                  for mi, j in zip(inv_mask_carry, inv_masked)]
    xs_masks = [masks[n_c + n_i + j] for j in xs_masked]
    inv_grads = grads[n_c:n_c + n_i]
    # an invariant whose cotangent is one product a trip is summed after the loop
    makers = {o: e for e in bb.eqns for o in e.outputs}
    outers = {j: f for j in range(n_i) if j not in inv_masked
              and (f := _outer_factors(makers, inv_grads[j], sums[j].type)) is not None}
    running = [j for j in range(n_i) if j not in outers]
    new_sums = [bb.bind("add", sums[j], inv_grads[j]) for j in running]
    xs_params = starts + x_slices + y_cts + y_masks + product_slices
    xs_b = list(stacked) + list(xs) + [out_cts[n_carry + k] for k in with_ct] + \
        [_mask_at(b, out_masks[n_carry + k], ys_types[k]) for k in ys_masked] + \
        list(products.values())
    ys_out = grads[n_c + n_i:] + xs_masks
    places, trip_values = _stacks_of_factors(outers, xs_params, ys_out)
    backward = bb.function(f"{body.name}_bwd", [index] + ct_carry + [sums[j] for j in running]
                           + mask_carry + inv_mask_carry + inv_params + xs_params,
                           grads[:n_c] + new_sums + new_masks + ys_out + trip_values)
    init = [out_cts[k] if out_cts[k] is not None else ops.zeros_like(b, carry[k].type)
            for k in floats[0]] + [ops.zeros_like(b, sums[j].type) for j in running]
    init += [ops.full(b, False, carry[k].type.shape, "bool") if k in nowhere
             else _mask_at(b, out_masks[k], carry[k].type) for k in floats[0] if masks_carried]
    init += [ops.full(b, False, m.type.shape, "bool") for m in inv_mask_carry]
    n_masks = len(mask_carry) + len(inv_mask_carry)
    n_run = len(running)
    outs = b.bind_multi("loop", *bounds, *init, *inv, *xs_b, span=eqn.span, body=backward,
                        n_carry=n_c + n_run + n_masks, n_inv=n_inv, trip=p["trip"],
                        reverse=not p["reverse"])
    end_masks = list(outs[n_c + n_run:n_c + n_run + len(mask_carry)]) or [None] * n_c
    inv_masks: list[Optional[Var]] = [None] * n_i
    for j, m in zip(inv_masked, outs[n_c + n_run + len(mask_carry):n_c + n_run + n_masks]):
        inv_masks[j] = m
    ys_stacks = outs[n_c + n_run + n_masks:]
    xs_cts = ys_stacks[:len(floats[2])]
    stacked_masks: list[Optional[Var]] = [None] * len(floats[2])
    for j, m in zip(xs_masked, ys_stacks[len(floats[2]):len(ys_out)]):
        stacked_masks[j] = m
    inv_cts = dict(zip(running, outs[n_c:n_c + n_run]))
    for j, pair in places.items():
        columns, rows = ((xs_b if where == "in" else ys_stacks)[k] for where, k in pair)
        inv_cts[j] = _summed_over_trips(b, columns, rows)
    outs = list(outs[:n_c]) + [inv_cts[j] for j in range(n_i)] + list(xs_cts)
    targets = [carry[k] for k in floats[0]] + [inv[k] for k in floats[1]] + \
        [xs[k] for k in floats[2]]
    masks = end_masks + inv_masks + stacked_masks
    return [(a, ops.unbroadcast(b, ct, a.type.shape), _narrowed(b, mask, a, ct))
            for a, ct, mask in zip(targets, outs, masks)]


def _outer_factors(makers: dict[Var, Eqn], g: Atom, sum_type: TensorType
                   ) -> Optional[tuple[Var, Var]]:
    """(column, row): the two vectors whose outer product an invariant's
    cotangent on one trip, `g`, is (an RNN's weight: outer(h, d), the
    product of an m x 1 and a 1 x n matrix, each a reshape of its
    vector), at its sum's type; else None.  Summed over the trips that is
    one product of the vectors' stacks, after the loop
    (`_summed_over_trips`), with the trips for its inner dimension: BLAS,
    instead of a rank-one update of the whole sum on every trip (2 MB read
    and written a trip for a 512 x 512 weight).  (Not for a batch's
    states, n x d: their trips' products are full ones already, and a
    row-split Dask array keeps its rows apart.)  `makers`: the equation
    that made each value of the backward body."""
    made = makers.get(g)
    if made is None or made.op != "matmul" or g.type != sum_type or g.type.rank != 2:
        return None
    column, row = (_vector_of(makers, a) for a in made.inputs)
    if column is None or row is None or made.inputs[0].type.shape[1] != 1:
        return None
    return column, row


def _vector_of(makers: dict[Var, Eqn], v: Atom) -> Optional[Var]:
    """The vector v's elements are, in order, through reshapes and
    transposes of one axis longer than 1 (None if there is none)."""
    while isinstance(v, Var) and v.type.rank != 1:
        made = makers.get(v)
        if made is None or made.op not in ("reshape", "transpose") or (
                made.op == "transpose" and sum(d != 1 for d in made.inputs[0].type.shape) > 1):
            return None
        v = made.inputs[0]
    return v if isinstance(v, Var) else None


def _stacks_of_factors(factors: dict[int, tuple[Var, Var]], slices: list[Var],
                       stacked: list[Atom]) -> tuple[dict[int, tuple], list[Var]]:
    """Where the backward loop finds each trip's (column, row) of
    `factors` (by invariant, `_outer_factors`) stacked, as a pair of
    places: ("in", k), the stack of its k-th stacked input, whose slice
    is `slices[k]` (h's states, the cotangents of xs), or ("out", k), its
    k-th stacked output: `stacked`, then the vectors returned, which its
    body must stack as well (a vector that is neither: h in another order,
    an invariant), each once however many products read it."""
    anew: list[Var] = []

    def place(v: Var) -> tuple[str, int]:
        if v in slices:
            return "in", slices.index(v)
        if v not in stacked + anew:
            anew.append(v)
        return "out", (stacked + anew).index(v)
    return {j: (place(column), place(row)) for j, (column, row) in factors.items()}, anew


def _summed_over_trips(b: Builder, columns: Var, rows: Var) -> Var:
    """The sum over the trips of outer(column, row), from their stacks
    (trips x m, trips x n): columns^T rows."""
    return b.bind("matmul", b.bind("transpose", columns, perm=(1, 0)), rows)


def _joint_given_small(body: Function, n_carry: int, wrt: list[int], masked: list[int],
                       products: dict[Var, Atom]) -> tuple[Function, list[bool], dict]:
    """`_joint` of a loop's body (`loop_pull_back`'s), given those of its
    stacked `products` no larger than a carried float value whose
    starting state the backward trip reads, and those products.  A carried
    value of which it reads no state (an accumulator, `m = m + f(a)`:
    none is kept) bounds nothing: a product larger than every state kept
    is computed again (an outer(h, h) beside an RNN's states would keep
    d times their memory)."""
    joint, found = _joint(body, wrt, masked, with_masks=True, given=list(products))
    if not products:
        return joint, found, products
    # what the backward trip reads: the joint's results but the body's own
    read = passes.read_by(joint, joint.outputs[len(body.outputs):])
    kept = [prod(v.type.shape) for v in joint.params[1:1 + n_carry]
            if v in read and v.type.is_float]
    small = {v: stack for v, stack in products.items() if _no_larger_than_one(v, kept)}
    if len(small) < len(products):
        joint, found = _joint(body, wrt, masked, with_masks=True, given=list(small))
    return joint, found, small


def _with_cotangents_only(eqn: Eqn, out_cts: Sequence[Optional[Atom]],
                          out_masks: Sequence[Optional[Var]], stacked: Sequence[Atom]) -> tuple:
    """The loop `eqn` without its outputs that take no cotangent and the
    carried values only they depend on (`passes.without_dead_outputs`),
    with the cotangents, masks and stacked starting states of the rest.
    What is dropped has a zero cotangent on every trip: pulled back through
    its own updates it could only meet an inf derivative there (sqrt at 0:
    0 * inf = NaN) and bring the NaN to what its updates read."""
    live = {o for o, ct in zip(eqn.outputs, out_cts) if ct is not None}
    pruned = passes.without_dead_outputs(eqn, live)
    kept = set(pruned.outputs)
    keep = [j for j, o in enumerate(eqn.outputs) if o in kept]
    out_masks = list(out_masks) + [None] * (len(eqn.outputs) - len(out_masks))
    n_carry = eqn.p["n_carry"]
    return (pruned, [out_cts[j] for j in keep], [out_masks[j] for j in keep],
            [stacked[j] for j in keep if j < n_carry])


def _widened(body: Function, n_carry: int, float_invariants: list[int]
             ) -> tuple[Function, dict[int, TensorType]]:
    """An elementwise loop body whose float invariants are retyped to the
    shape S of its carried values (where they broadcast to it), and the new
    types by invariant.  Its VJP then sums their cotangents at S, with no
    reduction in the backward loop's body, which can run in one kernel; the
    sums are reduced once, after the loop.  The body unchanged (and no
    new types) when it is not elementwise, its results differ in shape, or
    the retyped body does not type-check."""
    shape = body.out_types[0].shape if body.outputs else ()
    elementwise = all(e.op in FUSIBLE for e in body.eqns)
    wide = {k: TensorType(body.params[1 + n_carry + k].type.dtype, shape)
            for k in float_invariants
            if body.params[1 + n_carry + k].type.shape != shape
            and broadcasts_to(body.params[1 + n_carry + k].type.shape, shape)}
    if not wide or not elementwise or any(t.shape != shape for t in body.out_types):
        return body, {}
    b = Builder()
    params = [Var(wide[k - 1 - n_carry], v.hint) if k - 1 - n_carry in wide else v
              for k, v in enumerate(body.params)]
    env: dict[Var, Atom] = dict(zip(body.params, params))
    try:
        for eqn in body.eqns:
            outs = b.bind_multi(eqn.op, *[env.get(a, a) if isinstance(a, Var) else a
                                          for a in eqn.inputs], span=eqn.span, **eqn.p)
            env.update(zip(eqn.outputs, outs))
    except GradError:
        return body, {}
    outputs = [env.get(a, a) if isinstance(a, Var) else a for a in body.outputs]
    if [a.type for a in outputs] != list(body.out_types):
        return body, {}
    return b.function(body.name, params, outputs), wide


def _keeps_positions(eqn: Eqn, index: int) -> bool:
    """Whether input `index`'s cotangent at a position comes only from the
    output cotangents at that position (or broadcast to it): so for an
    elementwise op, and for a call whose grad block computes it from them
    by elementwise ops only.  A reduction's, layout op's, gather's... or a
    block's that sums them (`sum(dy * x)`) sits at other positions."""
    op = ops.OPS[eqn.op]
    if op.kind != "call":
        return op.kind == "elementwise"
    bwd = eqn.p["bwd"]
    # bwd's parameters: the call's inputs, its residuals, then the cotangents
    from_cts = set(bwd.params[len(bwd.params) - len(eqn.outputs):])
    moved: set[Var] = set()  # values from the cotangents at other positions
    for e in bwd.eqns:
        read = set(vars_in(e.inputs))
        if read & moved or (read & from_cts and e.op not in FUSIBLE):
            moved.update(e.outputs)
        elif read & from_cts:
            from_cts.update(e.outputs)
    return bwd.outputs[index] not in moved


def select_by_mask(b: Builder, eqn: Eqn, index: int, ct: Atom,
                   out_mask: Optional[Var]) -> tuple[Atom, Optional[Var]]:
    """Input `index`'s cotangent `ct` (at the output's shape for an
    elementwise op, so before un-broadcasting) selected by the output's
    where-mask as `op.masking` says, and the mask that input carries on.
    (Also the transposition's, `linearity.transpose_eqns`, which is a
    reverse sweep through a linear function's VJP rules.)"""
    if not _keeps_positions(eqn, index):
        # the mask says nothing about other positions (re-selecting by it
        # when the shapes happened to fit zeroed the gradient of
        # transpose(x) inside a where wherever c.T != c): it moves with them
        return ct, _moved_mask(b, eqn, index, out_mask)
    op, inputs = ops.OPS[eqn.op], eqn.inputs
    a = inputs[index]
    if op.masking == "select" and out_mask is not None and _fits(out_mask, ct):
        ct = zero_outside(b, out_mask, ct)
    mask = out_mask if out_mask is not None and _fits(out_mask, ct) else None
    cond = inputs[0]
    if op.masking == "branches" and index > 0 and _fits(cond, ct):
        # a branch's cotangent is nonzero only where it was taken (and, in
        # a nested where, where the outer branch was too)
        taken = cond if index == 1 else b.bind("logical_not", cond)
        mask = taken if mask is None or mask is taken else b.bind("logical_and", mask, taken)
    return ct, _narrowed(b, mask, a, ct)


# Ops whose VJP only moves, sums and spreads the output's cotangent, with
# positive weights: layout ops, reductions, gathers and scatter-adds, scans.
MOVES_POSITIONS = ("layout", "reduction", "index", "scan")


def _moved_mask(b: Builder, eqn: Eqn, index: int, out_mask: Optional[Var]) -> Optional[Var]:
    """The where-mask of input `index` of an op that moves positions: the
    op's VJP applied to the output's mask as 0 and 1 is positive exactly
    where the input's cotangent gathers something from inside the mask.
    Without it, where(x[i] > 0, s[i], 0) for s = sqrt(x) (or s[1:], s.T,
    sum(s, axis=1) ...) had 0 * sqrt's inf derivative, NaN, at x = 0."""
    op = ops.OPS[eqn.op]
    if out_mask is None or op.kind not in MOVES_POSITIONS:  # (a call: maybe several outputs)
        return None
    (out,) = eqn.outputs
    if not _fits(out_mask, out):
        return None
    if out_mask.type.shape != out.type.shape:
        out_mask = b.bind("broadcast_to", out_mask, shape=out.type.shape)
    weights = b.bind("cast", out_mask, dtype=out.type.dtype)
    moved = op.vjp(b, eqn, [weights], [i == index for i in range(len(eqn.inputs))])[index]
    return None if moved is None else b.bind("gt", moved, ops.lit(b, 0, moved))


def _narrowed(b: Builder, mask: Optional[Var], a: Atom, ct: Atom) -> Optional[Var]:
    """The mask an input carries on, at its own shape: `mask` (which fits
    the output's cotangent `ct`) where it fits the input, else, for an input
    broadcast to `ct`'s shape, whether any position it was broadcast to is
    in the mask.  Dropping that mask left where(x > y, sqrt(x), y) with a
    NaN gradient for a column x that no branch taken reads: the sum of
    zeros times sqrt's inf derivative."""
    if mask is None or _fits(mask, a):
        return mask
    if not (isinstance(a, Var) and broadcasts_to(a.type.shape, ct.type.shape)):
        return None
    if mask.type.shape != ct.type.shape:
        mask = b.bind("broadcast_to", mask, shape=ct.type.shape)
    count = ops.unbroadcast(b, b.bind("cast", mask, dtype="i64"), a.type.shape)
    return b.bind("gt", count, b.lit(0, "i64"))


def call_forward(b: Builder, eqn: Eqn, inputs: Sequence[Atom]
                 ) -> tuple[list[Atom], list[Atom]]:
    """A custom call's forward half in a derived program: its outputs and
    the residuals its bwd reads, computed by one call whose outputs are
    both, so that differentiating the derived program again differentiates
    the outputs by the call's bwd again, as the first time (the gradient of
    `ste(x) * y` along y is `ste(x)`, whose derivative is 1, not the 0 of
    the body `round`; a block written to be finite where the body's
    derivative is not stays so in a Hessian), and the residuals, which
    only the block reads, by the body.  The call marks with `n_block` how
    many of its outputs are the block's (`materialized` builds the bwd
    that a further differentiation needs, only then: built here, each
    call's would differentiate its body, and so on down every call it
    makes)."""
    fwd, n_out = eqn.p["fwd"], eqn.p["n_out"]
    params = eqn.p
    if len(fwd.outputs) > n_out:
        params = {**params, "n_out": len(fwd.outputs), "n_block": n_out}
    outs = b.bind_multi("custom_vjp", *inputs, span=eqn.span, **params)
    return list(outs[:n_out]), list(outs[n_out:])


def materialized(eqn: Eqn, flowing: Optional[Sequence[bool]] = None) -> Eqn:
    """A custom call with the bwd its outputs' cotangents go through: for
    one `call_forward` marked, the block's outputs' through its bwd, the
    residuals' through the reverse mode of the body that computes them;
    only the residuals `flowing` marks (one flag per output; default all)
    receive a cotangent: the others' would be zeros, which reverse mode
    through the body turns into 0 * inf = NaN where a block's residual has
    an infinite derivative (the norm's sqrt at 0).  Given `flowing` (for
    reverse mode; forward mode transposes this bwd, which must then be
    linear in the cotangents), a residual's cotangent goes through the
    body where-masked where it is nonzero, for the same reason: a block
    reading it inside `where(n > 0, n, 1)` sends it 0 where n = 0."""
    if "n_block" not in eqn.p:
        return eqn
    fwd, bwd, n_block = eqn.p["fwd"], eqn.p["bwd"], eqn.p["n_block"]
    b = Builder()
    args = [Var(p.type, p.hint) for p in fwd.params]
    cts = [Var(t, f"d{i}") for i, t in enumerate(fwd.out_types)]
    residuals = inline(b, fwd, args)[n_block:]
    in_cts = inline(b, bwd, args + residuals + cts[:n_block])
    live = [j for j in range(n_block, len(cts)) if flowing is None or flowing[j]]
    if live:
        wrt = [i for i, p in enumerate(fwd.params) if p.type.is_float]
        body = Function(f"{fwd.name}_residuals", fwd.params, fwd.eqns,
                        tuple(fwd.outputs[j] for j in live))
        masks = [] if flowing is None else \
            [b.bind("ne", cts[j], ops.lit(b, 0, cts[j])) for j in live]
        joint = vjp(body, wrt, range(len(masks)))
        grads = inline(b, joint, args + [cts[j] for j in live] + masks)[len(live):]
        for i, g in zip(wrt, grads):
            in_cts[i] = b.bind("add", in_cts[i], g)
    params = {**{k: v for k, v in eqn.params if k != "n_block"},
              "bwd": b.function(f"{eqn.p['name']}_bwd_exposed", args + cts, in_cts)}
    return Eqn(eqn.op, eqn.inputs, eqn.outputs, tuple(sorted(params.items())), eqn.span)


def _common_mask(masks: list[Optional[Var]]) -> Optional[Var]:
    first = masks[0] if masks else None
    return first if first is not None and all(m is first for m in masks) else None


def _fits(mask: Atom, v: Atom) -> bool:
    """Whether selecting by `mask` keeps v's shape."""
    return isinstance(mask, Var) and broadcasts_to(mask.type.shape, v.type.shape)


def grad_of_sum(fn: Function, wrt: Sequence[int], with_value: bool,
                first_only: bool = False) -> Function:
    """(params...) -> ([outputs...,] grads...): the gradient of the sum of
    every output, seeded with ones; with `first_only`, of the first
    output's sum, the others (values only, from the same forward sweep: a
    loop feeding both runs once) returned before the grads with or
    without `with_value`, which adds the first."""
    joint = vjp(fn, wrt, seeded=1 if first_only else None)
    b = Builder()
    params = [Var(v.type, v.hint) for v in fn.params]
    seeded = fn.out_types[:1] if first_only else fn.out_types
    seeds = [ops.full(b, 1, t.shape, t.dtype) for t in seeded]
    results = inline(b, joint, params + seeds)
    dropped = 0 if with_value else 1 if first_only else len(fn.outputs)
    outputs = results[dropped:]
    suffix = "value_and_grad" if with_value else "grad"
    return b.function(f"{fn.name}_{suffix}", params, outputs)


def split(joint: Function, n_params: int, n_out: int) -> tuple[Function, Function]:
    """Cut a joint function (see `vjp`) into

        fwd(params...) -> (outputs..., residuals...)
        bwd(residuals..., cts...) -> grads...

    Everything that does not depend on a cotangent runs in `fwd`; the values
    `bwd` reads from it are the residuals, the memory a pullback keeps."""
    cts = joint.params[n_params:]
    tainted: set[Var] = set(cts)
    fwd_eqns: list[Eqn] = []
    bwd_eqns: list[Eqn] = []
    for eqn in joint.eqns:
        if any(a in tainted for a in vars_in(eqn.inputs)):
            bwd_eqns.append(eqn)
            tainted.update(eqn.outputs)
        else:
            fwd_eqns.append(eqn)
    # Values that read no parameter, made by equations without inputs
    # (constants, zeros, a size: `dim`) and from those as scalars (a mean's
    # 1 / n), the backward pass makes itself (the forward's copies, if it
    # does not read them, DCE removes): they are not residuals, as they are
    # none (literals) where the sizes are known.
    free: set[Var] = set()
    made: list[Eqn] = []
    for eqn in fwd_eqns:
        inputs = list(vars_in(eqn.inputs))
        if eqn.op != "loop" and eqn.outputs and all(a in free for a in inputs) and (
                not inputs or all(o.type.rank == 0 for o in eqn.outputs)):
            free.update(eqn.outputs)
            made.append(eqn)
    bwd_eqns = made + bwd_eqns
    tainted.update(free)
    residuals: list[Var] = []
    seen: set[Var] = set()
    grads = joint.outputs[n_out:]
    for a in [a for e in bwd_eqns for a in e.inputs] + list(grads):
        if isinstance(a, Var) and a not in tainted and a not in seen:
            seen.add(a)
            residuals.append(a)
    fwd = Function(f"{joint.name}_fwd", joint.params[:n_params], tuple(fwd_eqns),
                   tuple(joint.outputs[:n_out]) + tuple(residuals))
    bwd = Function(f"{joint.name}_bwd", tuple(residuals) + tuple(cts), tuple(bwd_eqns),
                   tuple(grads))
    return fwd, bwd
