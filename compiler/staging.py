"""Grad blocks as chained `custom_vjp` stages.

Contract: `lower_staged(lowerer, b, fdef, ns, inputs, span)` emits into
`b` a call of `fdef` (a function with grad blocks or a gradient
decorator) on `inputs` (its bound arguments, then the params it reads) and
returns its outputs.  The gradient `autodiff` later derives for the call
is the one its grad blocks define.

A function is a chain of *stages*: stage 0 is its body; stage k >= 1 is
its k-th grad block, the VJP of stage k-1, seen as a function of its
inputs I_k = (the block's upstream cotangents, then I_{k-1}); I_0 is the
function's parameters and the params it reads (`stage_inputs`).  A stage
followed by a grad block is lowered to one `custom_vjp` equation carrying
two sub-functions:

- `fwd(I_k arrays) -> (outputs..., residuals...)`: the stage, also
  returning the locals the next block reads;
- `bwd(I_k arrays, residuals, cotangents) -> one cotangent per input`: the
  next block.  When a further block follows, `bwd` is itself the next
  stage's `custom_vjp` (recomputing the locals it needs), so `autodiff`
  differentiates each block by the block after it, and the last written
  block by ordinary reverse mode through its residuals.

What block k may return: cotangents for `positional_cotangents(fdef, k)`
by position, and for `named_cotangents(fdef, ns, k)` by name; the rest are
zero.  A returned cotangent must have its input's shape, or one that
input broadcasts to (it is summed back), or size 1 (it spreads).

Every block must be linear in its upstream cotangents
(`compiler.linearity.check_linear`, run on its `bwd`).

`@recompute` stages keep no residuals: their `bwd` reruns the stage behind
a `recompute_barrier` so the split into forward and backward passes cannot
hoist it back.  `@pass_through` stages have the identity as their `bwd`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from gradlang.compiler import ast, autodiff, ops
from gradlang.compiler.builder import Builder, coerce, inline
from gradlang.compiler.ir import Atom, Function, Var
from gradlang.compiler.linearity import check_linear
from gradlang.compiler.namespace import Namespace, free_names, param_reads
from gradlang.compiler.shapes import broadcasts_to
from gradlang.compiler.values import (Value, as_atom, as_result, as_results, cast, is_static,
                                      weak_float_dtype, weak_number)
from gradlang.runtime.errors import GradError, Span

if TYPE_CHECKING:
    from gradlang.compiler.lower import Lowerer

Item = tuple[Optional[str], Value, Span]  # a returned value: (name or None, value, span)


def stage_inputs(fdef: ast.FuncDef, ns: Namespace, k: int) -> list[str]:
    """The names of I_k, in order."""
    if k == 0:
        return [p.name for p in fdef.params] + list(param_reads(fdef, ns))
    return list(fdef.grads[k - 1].upstream) + stage_inputs(fdef, ns, k - 1)


def positional_cotangents(fdef: ast.FuncDef, k: int) -> list[str]:
    """What block k (1-based) may return positionally, in order: the
    upstreams of block k-1, ..., then the function's differentiable
    parameters.  Module params are returned by name."""
    if k == 1:
        return [p.name for p in fdef.differentiable_params]
    return list(fdef.grads[k - 2].upstream) + positional_cotangents(fdef, k - 1)


def named_cotangents(fdef: ast.FuncDef, ns: Namespace, k: int) -> list[str]:
    """Everything block k may return a cotangent for."""
    float_params = [w for w in param_reads(fdef, ns)
                    if ns.params[w].type.dtype in ("f32", "f64")]
    return positional_cotangents(fdef, k) + float_params


def lower_staged(lowerer: "Lowerer", b: Builder, fdef: ast.FuncDef, ns: Namespace,
                 inputs: dict[str, Value], span: Span) -> list[Value]:
    inputs = dict(inputs)
    # A float number (or a weakly typed float: `one_hot(y, k)`) is f32 where
    # the call's float arrays are all f32, as a Python number passed to a
    # compiled function is: `logaddexp(x, 0.5)` stays f32 for f32 x.
    floats = weak_float_dtype(inputs.values())
    for p in fdef.differentiable_params:
        # Everything a custom gradient differentiates is an array.
        v = inputs[p.name]
        inputs[p.name] = as_atom(b, v, span, floats if isinstance(weak_number(v), float) else None)
    return Chain(lowerer, fdef, ns, span).stage(b, 0, inputs)


@dataclass
class Forward:
    """Stage k's forward half, `fwd`, and what its `bwd` is built from."""

    k: int
    arrays: list[str]               # the inputs passed as arrays, in order
    statics: dict[str, Value]       # the inputs known at compile time
    fwd: Function
    n_out: int
    env: dict[str, Value]           # fwd's final bindings
    residuals: list[str]            # array locals the next block reads
    static_residuals: dict[str, Value]

    def carries_gradients(self) -> bool:
        """Whether a gradient can flow back through the stage: a float
        input and a float output."""
        return (any(p.type.is_float for p in self.fwd.params)
                and any(o.type.is_float for o in self.fwd.outputs[:self.n_out]))


@dataclass
class Chain:
    """The stages of one call of `fdef`."""

    lowerer: "Lowerer"
    fdef: ast.FuncDef
    ns: Namespace
    span: Span

    @property
    def recompute(self) -> bool:
        return any(d.name == "recompute" for d in self.fdef.decorators)

    def stage(self, b: Builder, k: int, inputs: dict[str, Value]) -> list[Value]:
        """Stage k on `inputs` (I_k): a `custom_vjp` when a block follows
        it (or it is recomputed), else inline."""
        recompute = k == 0 and self.recompute
        if k == 0 and any(d.name == "pass_through" for d in self.fdef.decorators):
            return self.pass_through(b, inputs)
        if k == len(self.fdef.grads) and not recompute:
            return self.eval_stage(b, k, inputs)[0]
        stage = self.forward(k, inputs, keep_residuals=not recompute)
        if not stage.carries_gradients():
            # Integers and bools carry no gradient, so nothing flows back
            # through this call: the blocks, written for float cotangents,
            # do not apply (an integer upstream is no cotangent to be linear in).
            return inline(b, stage.fwd, [inputs[n] for n in stage.arrays])[:stage.n_out]
        bwd = self.backward(stage, inputs, recompute)
        if k < len(self.fdef.grads):
            block = self.fdef.grads[k]
            n = len(bwd.params)
            check_linear(bwd, range(n - stage.n_out, n),
                         f"grad block {k + 1} of {self.fdef.name}() (line {block.span.line})",
                         block.span, stage.arrays)
        return list(b.bind_multi("custom_vjp", *[inputs[n] for n in stage.arrays],
                                 span=self.span, fwd=stage.fwd, bwd=bwd,
                                 n_out=stage.n_out, name=self.fdef.name))

    def eval_stage(self, b: Builder, k: int,
                   inputs: dict[str, Value]) -> tuple[list[Value], dict[str, Value]]:
        """Stage k inline: the body, then blocks 1..k, each block's returned
        cotangents mapped onto its inputs.  Returns (outputs, final env)."""
        env = dict(inputs)
        outs = self.lowerer.body(b, self.fdef, env)
        for j in range(1, k + 1):
            block = self.fdef.grads[j - 1]
            items = self.lowerer.block_items(b, block.body, env)
            cts = self.map_cotangents(b, j, items, inputs)
            outs = [cts[n] for n in named_cotangents(self.fdef, self.ns, j)]
        return outs, env

    def forward(self, k: int, inputs: dict[str, Value], keep_residuals: bool) -> Forward:
        """`fwd` of stage k: its outputs, then the residuals block k+1 reads."""
        fdef = self.fdef
        arrays = [n for n, v in inputs.items() if not is_static(v)]
        statics = {n: v for n, v in inputs.items() if is_static(v)}
        fb = Builder()
        fparams = [Var(inputs[n].type, n) for n in arrays]
        initial = {**statics, **dict(zip(arrays, fparams))}
        outs, env = self.eval_stage(fb, k, dict(initial))
        if k == 0:
            outs = as_results(fb, outs, fdef.result_dtype, fdef.result_spans)
        else:  # block k's cotangents: as they are
            outs = [as_result(fb, o, None, self.span) for o in outs]
        res_names: list[str] = []
        if keep_residuals and k < len(fdef.grads):
            # the block sees the body's final bindings, parameters rebound
            # in the body included
            block = fdef.grads[k]
            reads = free_names(block.body, set(block.upstream))
            res_names = [n for n in env if n in reads
                         and (n not in initial or env[n] is not initial[n])]
        residuals = [n for n in res_names if not is_static(env[n])]
        fwd = fb.function(f"{fdef.name}_fwd{k}", fparams,
                          outs + [env[n] for n in residuals])
        return Forward(k, arrays, statics, fwd, len(outs), env, residuals,
                     {n: env[n] for n in res_names if is_static(env[n])})

    def backward(self, stage: Forward, inputs: dict[str, Value], recompute: bool) -> Function:
        """`bwd` of stage k: (I_k arrays, residuals, cotangents) -> one
        cotangent per I_k array."""
        k, fdef = stage.k, self.fdef
        bb = Builder()
        bargs = [Var(p.type, p.hint) for p in stage.fwd.params]
        bres = [Var(stage.env[n].type, n) for n in stage.residuals]
        block = fdef.grads[k] if k < len(fdef.grads) else None
        outs = stage.fwd.outputs[:stage.n_out]
        upstream = block.upstream if block else tuple(f"d{i}" for i in range(len(outs)))
        bcts = [Var(o.type, u) for o, u in zip(outs, upstream)]
        if recompute:
            # The rerun depends on a cotangent, so it stays in the backward pass.
            bargs_used = [bb.bind("recompute_barrier", a, bcts[0]) for a in bargs]
        else:
            bargs_used = list(bargs)
        base = {**stage.statics, **dict(zip(stage.arrays, bargs_used))}
        if block is None:
            cts = self.rerun_vjp(bb, stage, bargs, bargs_used, bcts)
        else:
            by_name = self.block_cotangents(bb, stage, base, bres, bcts, inputs, recompute)
            cts = [by_name[n] if n in by_name else ops.zeros_like(bb, a.type)
                   for n, a in zip(stage.arrays, bargs)]
        cts = [as_atom(bb, c, self.span) for c in cts]
        return bb.function(f"{fdef.name}_bwd{k + 1}", bargs + bres + bcts, cts)

    def rerun_vjp(self, bb: Builder, stage: Forward, bargs: list[Var],
                  bargs_used: list[Atom], bcts: list[Var]) -> list[Atom]:
        """@recompute without a grad block: differentiate the rerun body."""
        fwd = stage.fwd
        floats = [i for i, a in enumerate(bargs) if a.type.is_float]
        primal = Function(fwd.name, fwd.params, fwd.eqns, fwd.outputs[:stage.n_out])
        grads = iter(inline(bb, autodiff.vjp(primal, floats), bargs_used + bcts)[stage.n_out:])
        return [next(grads) if a.type.is_float else ops.zeros_like(bb, a.type) for a in bargs]

    def block_cotangents(self, bb: Builder, stage: Forward, base: dict[str, Value],
                         bres: list[Var], bcts: list[Var], inputs: dict[str, Value],
                         recompute: bool) -> dict[str, Value]:
        """Block k+1 on the backward pass's inputs, as {name: cotangent}:
        through the next stage's `custom_vjp` when a further block follows."""
        k, fdef = stage.k, self.fdef
        block = fdef.grads[k]
        if k + 1 < len(fdef.grads):
            next_inputs = {**dict(zip(block.upstream, bcts)), **base}
            outs_next = self.stage(bb, k + 1, next_inputs)
            return dict(zip(named_cotangents(fdef, self.ns, k + 1), outs_next))
        if recompute:
            _, benv = self.eval_stage(bb, k, base)
        else:
            benv = {**base, **stage.static_residuals, **dict(zip(stage.residuals, bres))}
        benv.update(zip(block.upstream, bcts))
        items = self.lowerer.block_items(bb, block.body, benv)
        return self.map_cotangents(bb, k + 1, items, inputs)

    def pass_through(self, b: Builder, inputs: dict[str, Value]) -> list[Value]:
        """Forward runs the body; the gradient is the identity."""
        fdef, span = self.fdef, self.span
        arrays = [n for n, v in inputs.items() if not is_static(v)]
        (target,) = [p.name for p in fdef.differentiable_params]
        if target not in arrays:
            raise GradError(f"@pass_through function {fdef.name}() needs an array for "
                            f"{target!r}", span)
        fb = Builder()
        fparams = [Var(inputs[n].type, n) for n in arrays]
        statics = {n: v for n, v in inputs.items() if is_static(v)}
        outs, _ = self.eval_stage(fb, 0, {**statics, **dict(zip(arrays, fparams))})
        (out,) = as_results(fb, outs, fdef.result_dtype, fdef.result_spans)
        x_type = inputs[target].type
        if not broadcasts_to(x_type.shape, out.type.shape):
            raise GradError(f"@pass_through function {fdef.name}() returns shape "
                            f"{list(out.type.shape)}, which {target!r} (shape "
                            f"{list(x_type.shape)}) does not broadcast to", span)
        fwd = fb.function(f"{fdef.name}_fwd0", fparams, [out])
        bb = Builder()
        bargs = [Var(p.type, p.hint) for p in fparams]
        ct = Var(out.type, "d0")
        cts = []
        for n, a in zip(arrays, bargs):
            if n == target and a.type.is_float:
                cts.append(cast(bb, ops.unbroadcast(bb, ct, a.type.shape), a.type.dtype))
            else:
                cts.append(ops.zeros_like(bb, a.type))
        bwd = bb.function(f"{fdef.name}_bwd1", bargs + [ct], cts)
        return list(b.bind_multi("custom_vjp", *[inputs[n] for n in arrays], span=span,
                                 fwd=fwd, bwd=bwd, n_out=1, name=fdef.name))

    def map_cotangents(self, b: Builder, k: int, items: list[Item],
                       inputs: dict[str, Value]) -> dict[str, Atom]:
        """Block k's returned items as {name: cotangent} for every name in
        `named_cotangents(fdef, ns, k)`, shape-checked against the inputs."""
        fdef = self.fdef
        block = fdef.grads[k - 1]
        where = f"grad block {k} of {fdef.name}() (line {block.span.line})"
        given: dict[str, tuple[Value, Span]] = {}
        positional = [it for it in items if it[0] is None]
        for name, (_, value, sp) in zip(positional_cotangents(fdef, k), positional):
            given[name] = (value, sp)
        for name, value, sp in items:
            if name is not None:
                given[name] = (value, sp)
        out: dict[str, Atom] = {}
        for name in named_cotangents(fdef, self.ns, k):
            t = inputs[name].type
            if name not in given or not t.is_float:
                out[name] = ops.zeros_like(b, t)
                continue
            value, sp = given[name]
            out[name] = self.fit_cotangent(b, value, t, name, where, sp)
        return out

    @staticmethod
    def fit_cotangent(b: Builder, value: Value, t, name: str, where: str, sp: Span) -> Atom:
        """A returned cotangent as an array of its input's type `t`."""
        if is_static(value):
            if isinstance(value, tuple):
                raise GradError(f"{where} returns a tuple as the cotangent for {name!r}", sp)
            return ops.full(b, coerce(value, t.dtype, sp), t.shape, t.dtype)
        if value.type.shape != t.shape:
            # A cotangent of the shape the input was broadcast to is
            # summed back, as derived gradients are; a size-1 one spreads.
            if broadcasts_to(t.shape, value.type.shape):
                value = ops.unbroadcast(b, value, t.shape)
            elif value.type.size == 1 and value.type.rank <= t.rank:
                value = b.bind("broadcast_to", value, shape=t.shape, span=sp)
            else:
                raise GradError(
                    f"{where} returns a cotangent of shape {list(value.type.shape)} "
                    f"for {name!r}, which has shape {list(t.shape)}", sp)
        return cast(b, value, t.dtype, sp)
