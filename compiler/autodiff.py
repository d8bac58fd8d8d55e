"""Reverse-mode automatic differentiation as an IR -> IR transform.

Contract: `vjp(fn, wrt)` returns the *joint* function

    joint(params..., ct_1, ..., ct_k) -> (outputs..., grad_wrt_1, ...)

where `ct_i` is the cotangent of fn's i-th output and `grad_wrt_j` the
cotangent of parameter `wrt[j]` (zeros when nothing flows to it, cast to the
parameter's dtype).  It is an ordinary IR function: it can be
differentiated again, simplified, fused and printed.

Primitive derivatives come from the op table (`compiler.ops`).  The
gradient of `where(c, a, b)` takes nothing from the branch not selected,
even where that branch's derivative is inf or NaN.  A
`custom_vjp` call (a user function with a grad block) is differentiated by
its grad block: its `fwd` is inlined, keeping the residuals, and its `bwd`
is inlined in the backward sweep, so a second differentiation flows through
the residuals the block reads.  Only float values carry cotangents; uses of
one value sum.
"""
from __future__ import annotations

from typing import Optional, Sequence

from gradlang.compiler import ops
from gradlang.compiler.builder import Builder, inline
from gradlang.compiler.ir import Atom, Eqn, Function, Var, vars_in
from gradlang.compiler.shapes import broadcasts_to


def vjp(fn: Function, wrt: Sequence[int]) -> Function:
    b = Builder()
    params = [Var(v.type, v.hint) for v in fn.params]
    env: dict[Var, Atom] = dict(zip(fn.params, params))

    def sub(a: Atom) -> Atom:
        return env.get(a, a) if isinstance(a, Var) else a

    # Forward sweep: copy the primal, expanding custom calls into their fwd
    # body and remembering the residuals their bwd will read.
    active: set[Var] = {params[i] for i in wrt if params[i].type.is_float}
    tape: list[tuple[Eqn, Optional[list[Atom]]]] = []
    for eqn in fn.eqns:
        inputs = tuple(sub(a) for a in eqn.inputs)
        if eqn.op == "custom_vjp":
            p = eqn.p
            results = inline(b, p["fwd"], inputs)
            outs = _own(b, results[:p["n_out"]], inputs)
            residuals = results[p["n_out"]:]
            env.update(zip(eqn.outputs, outs))
            record = (Eqn(eqn.op, inputs, eqn.outputs, eqn.params, eqn.span), outs, residuals)
        else:
            outs_vars = tuple(Var(v.type, v.hint) for v in eqn.outputs)
            new = Eqn(eqn.op, inputs, outs_vars, eqn.params, eqn.span)
            b.eqns.append(new)
            env.update(zip(eqn.outputs, outs_vars))
            outs = list(outs_vars)
            record = (new, outs, None)
        is_active = (any(a in active for a in vars_in(inputs))
                     and eqn.op not in ops.NON_DIFFERENTIABLE)
        if is_active:
            active.update(o for o in vars_in(outs) if o.type.is_float)
            tape.append(record)

    outputs = [sub(a) for a in fn.outputs]
    cts_in = [Var(a.type, f"d{i}") for i, a in enumerate(outputs)]

    # Backward sweep.  `masks[v]` is a bool value (broadcastable to v) where
    # v's cotangent may be nonzero: inside a branch of `where`, every
    # contribution is re-selected by it, so the branch not taken contributes
    # exactly 0 even where its local derivative is inf or NaN.
    cts: dict[Var, Atom] = {}
    masks: dict[Var, Optional[Var]] = {}

    def accumulate(v: Atom, ct: Optional[Atom], mask: Optional[Var]) -> None:
        if ct is None or not isinstance(v, Var) or v not in active:
            return
        if ct.type.dtype != v.type.dtype:
            ct = b.bind("cast", ct, dtype=v.type.dtype)
        if v in cts:
            cts[v] = b.bind("add", cts[v], ct)
            if masks.get(v) is not mask:
                masks[v] = None
        else:
            cts[v] = ct
            masks[v] = mask

    for out, ct in zip(outputs, cts_in):
        accumulate(out, ct, None)

    for eqn, outs, residuals in reversed(tape):
        out_cts = [cts.get(o) if isinstance(o, Var) else None for o in outs]
        if all(c is None for c in out_cts):
            continue
        out_cts = [c if c is not None else ops.zeros_like(b, o.type)
                   for c, o in zip(out_cts, outs)]
        needs = [isinstance(a, Var) and a in active for a in eqn.inputs]
        out_mask = _common_mask([masks.get(o) if isinstance(o, Var) else None for o in outs])
        selected_inside = False
        if eqn.op == "custom_vjp":
            in_cts = inline(b, eqn.p["bwd"], list(eqn.inputs) + residuals + out_cts)
        else:
            rule = ops.OPS[eqn.op].vjp
            shadow = Eqn(eqn.op, eqn.inputs, tuple(outs), eqn.params, eqn.span)
            if getattr(rule, "takes_mask", False):
                # elementwise rules select before un-broadcasting
                in_cts = rule(b, shadow, out_cts, needs, mask=out_mask)
                selected_inside = True
            else:
                in_cts = rule(b, shadow, out_cts, needs)
        for index, (a, need, ct) in enumerate(zip(eqn.inputs, needs, in_cts)):
            if not need or ct is None:
                continue
            mask = out_mask if out_mask is not None and _fits(out_mask, a) else None
            if mask is not None and not selected_inside and eqn.op != "where":
                ct = b.bind("where", mask, ct, ops.lit(b, 0, ct))
            if eqn.op == "where" and index > 0 and _fits(eqn.inputs[0], a):
                # a branch's cotangent is nonzero only where it was taken
                # (and, in a nested where, where the outer branch was too)
                cond = eqn.inputs[0]
                taken = cond if index == 1 else b.bind("logical_not", cond)
                if mask is not None:
                    taken = b.bind("logical_and", mask, taken)
                mask = taken
            accumulate(a, ct, mask)

    grads = []
    for i in wrt:
        p = params[i]
        grads.append(cts.get(p) if p in cts else ops.zeros_like(b, p.type))
    return b.function(f"{fn.name}_vjp", params + cts_in, outputs + grads)


def _own(b: Builder, outs: list[Atom], inputs) -> list[Atom]:
    """A custom call's outputs as values of their own: an output that is
    one of its inputs (or a literal, or repeated) gets an identity equation,
    so the cotangent it receives is not confused with its input's."""
    owned, seen = [], set(vars_in(inputs))
    for out in outs:
        if not isinstance(out, Var) or out in seen:
            out = b.bind("cast", out, dtype=out.type.dtype)
        seen.add(out)
        owned.append(out)
    return owned


def _common_mask(masks: list[Optional[Var]]) -> Optional[Var]:
    first = masks[0] if masks else None
    return first if first is not None and all(m is first for m in masks) else None


def _fits(mask: Atom, v: Atom) -> bool:
    """Whether selecting by `mask` keeps v's shape."""
    return isinstance(mask, Var) and broadcasts_to(mask.type.shape, v.type.shape)


def grad_of_sum(fn: Function, wrt: Sequence[int], with_value: bool) -> Function:
    """(params...) -> ([outputs...,] grads...): the gradient of the sum of
    every output, seeded with ones."""
    joint = vjp(fn, wrt)
    b = Builder()
    params = [Var(v.type, v.hint) for v in fn.params]
    seeds = [ops.full(b, 1, t.shape, t.dtype) for t in fn.out_types]
    results = inline(b, joint, params + seeds)
    n_out = len(fn.outputs)
    outputs = (results if with_value else results[n_out:])
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
    # Constants (zeros, sizes) only the backward pass reads are made there,
    # not kept as residuals.
    fwd_reads = {a for e in fwd_eqns for a in vars_in(e.inputs)} | \
        set(vars_in(joint.outputs[:n_out]))
    moved = [e for e in fwd_eqns if not list(vars_in(e.inputs))
             and not any(o in fwd_reads for o in e.outputs)]
    fwd_eqns = [e for e in fwd_eqns if e not in moved]
    bwd_eqns = moved + bwd_eqns
    tainted.update(o for e in moved for o in e.outputs)
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
