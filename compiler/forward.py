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
builds; for a call with grad blocks (`custom_vjp`), its `fwd` is inlined
and its `bwd`, the first grad block (which the compiler checked to be
linear in its upstream cotangents), is transposed.  So forward mode runs
through hand-written blocks with nothing more written, and follows them
exactly: where a block differs from the derivative of its function's body,
the tangent is the block's.  `where(c, a, b)`'s tangent is
`where(c, t_a, 0) + where(c, 0, t_b)`: the branch not taken contributes
nothing, NaN or inf included.  Only float values carry tangents.
"""
from __future__ import annotations

from typing import Optional, Sequence

from gradlang.compiler import ops
from gradlang.compiler.autodiff import own_outputs
from gradlang.compiler.builder import Builder, inline
from gradlang.compiler.ir import Atom, Eqn, Function, Var
from gradlang.compiler.linearity import transpose, transpose_eqns


def jvp(fn: Function, wrt: Sequence[int]) -> Function:
    b = Builder()
    params = [Var(v.type, v.hint) for v in fn.params]
    tangents_in = [Var(params[i].type, f"t_{params[i].hint}") for i in wrt]
    env: dict[Var, Atom] = dict(zip(fn.params, params))
    tangents: dict[Var, Atom] = {params[i]: t for i, t in zip(wrt, tangents_in)
                                 if t.type.is_float}

    def sub(a: Atom) -> Atom:
        return env.get(a, a) if isinstance(a, Var) else a

    for eqn in fn.eqns:
        inputs = tuple(sub(a) for a in eqn.inputs)
        in_tangents = [tangents.get(a) if isinstance(a, Var) else None for a in inputs]
        op = ops.OPS[eqn.op]
        active = op.differentiable and any(t is not None for t in in_tangents)
        if op.kind == "call":
            results = inline(b, eqn.p["fwd"], inputs)
            outs = own_outputs(b, results[:eqn.p["n_out"]], inputs)
            out_tangents = (_call_jvp(b, eqn, inputs, results[eqn.p["n_out"]:], in_tangents)
                            if active else [])
        else:
            copy = Eqn(eqn.op, inputs, tuple(Var(v.type, v.hint) for v in eqn.outputs),
                       eqn.params, eqn.span)
            b.eqns.append(copy)
            outs = list(copy.outputs)
            out_tangents = _primitive_jvp(b, copy, in_tangents) if active else []
        env.update(zip(eqn.outputs, outs))
        for out, t in zip(outs, out_tangents):
            if t is not None and isinstance(out, Var) and out.type.is_float:
                tangents[out] = t
    outputs = [sub(a) for a in fn.outputs]
    out_tangents = [tangents.get(o) if isinstance(o, Var) else None for o in outputs]
    out_tangents = [t if t is not None else ops.zeros_like(b, o.type)
                    for t, o in zip(out_tangents, outputs)]
    return b.function(f"{fn.name}_jvp", params + tangents_in, outputs + out_tangents)


def _call_jvp(b: Builder, eqn: Eqn, inputs: Sequence[Atom], residuals: Sequence[Atom],
              in_tangents: Sequence[Optional[Atom]]) -> list[Optional[Atom]]:
    """The transpose of the call's first grad block: its `bwd` maps output
    cotangents to input cotangents, so its transpose maps input tangents
    to output tangents."""
    n_out = eqn.p["n_out"]
    args = list(inputs) + list(residuals) + [None] * n_out
    return transpose(b, eqn.p["bwd"], args, in_tangents)


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
    out_cts = transpose_eqns(b, scratch.eqns, set(cts), in_cts, seeds)
    return [out_cts.get(c) for c in cts]
