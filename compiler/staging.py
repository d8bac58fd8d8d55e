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

A stage is lowered once per `Lowerer` for what its lowering depends on
(`Chain.key`: the function, the order, its inputs' names and types and
compile-time values, and the lowerer's context), and reused by every call
alike: g's body calling f(x) and g's block calling `grad(f)(x)` share f's
stages.  Lowering each afresh doubled the work at every level of a chain
of blocks calling the previous function's `grad`, since every call lowers
its blocks whether or not its backward pass is ever taken.  A reused
stage takes the span of the call reusing it (`Lowered.at_site`), counts
its forward pass's operations again (`MAX_PROGRAM_SIZE`: each call still
inlines a copy of it), and is lowered afresh where that would raise a
recursion or depth error it escaped where first lowered (`Reach`).  So
reuse changes no program, only the work, and one error: a reused stage's
backward pass is not counted again, so a program that lowering every
stage afresh finds too big, by the blocks its calls repeat, may now pass
`MAX_PROGRAM_SIZE` (a bound against runaway lowering, which reuse stops).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Optional

from gradlang.compiler import ast, autodiff, ops
from gradlang.compiler.builder import Builder, coerce, inline
from gradlang.compiler.ir import Atom, Eqn, Function, Var, WeakVar
from gradlang.compiler.linearity import check_linear
from gradlang.compiler.namespace import Namespace, free_names, param_reads
from gradlang.compiler.shapes import Sym, broadcasts_to
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
    for p in fdef.params:
        # Everything a custom gradient differentiates is an array; a weakly
        # typed one the stages take as a parameter, which is not weak (a
        # `const` one given `0.3 / n`, a number of sizes, as the literal
        # that n's concrete value folds to)
        v = inputs[p.name]
        if p.differentiable or isinstance(v, WeakVar):
            inputs[p.name] = as_atom(b, v, span,
                                     floats if isinstance(weak_number(v), float) else None)
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
class Reach:
    """The calls made while one stage was lowered: the functions entered
    (by identity) and how far the call stack grew past the stage's own,
    `base` deep, at the deepest call's depth check.  Lowering the stage
    under another stack raises what `Lowerer.call` raises for a recursive
    call or one nested too deep exactly when `fits` is False there."""

    base: int
    entered: set[int] = field(default_factory=set)
    depth: int = 0

    def enter(self, fdef: ast.FuncDef, stack_len: int) -> None:
        """A call of fdef, checked at a stack `stack_len` deep."""
        self.entered.add(id(fdef))
        self.depth = max(self.depth, stack_len - self.base)

    def include(self, inner: "Reach", stack_len: int) -> None:
        """The calls of a stage lowered or reused inside this one, at a
        stack `stack_len` deep."""
        self.entered |= inner.entered
        self.depth = max(self.depth, inner.depth + stack_len - self.base)

    def fits(self, stack: list[ast.FuncDef], max_depth: int) -> bool:
        return not self.entered or (
            len(stack) + self.depth < max_depth and not any(id(f) in self.entered for f in stack))


@dataclass(frozen=True)
class Lowered:
    """What `Chain.stage` emits for one stage: a `custom_vjp` call of
    `fwd` and `bwd` on the `arrays` inputs, or (`bwd` None: no gradient
    flows through it) `fwd` inlined; its first `n_out` outputs are the
    stage's.  `size`: the operations of `fwd` with its calls inlined.
    `site`: the span of the call it was lowered for, which it carries
    (`at_site`)."""

    site: Span
    arrays: tuple[str, ...]
    fwd: Function
    bwd: Optional[Function]
    n_out: int
    size: int
    reach: Reach

    def at_site(self, span: Span) -> "Lowered":
        """The stage for a call at `span`.  The span of the call a stage
        is lowered for is on some of its equations (a later stage's
        `custom_vjp`, a size it returns): at the top level of its functions
        and of the later stages' functions those `custom_vjp`s hold, and
        nowhere else (every other function in it comes from a call in the
        called function's own text, where this call is not: it would be
        recursive)."""
        if span == self.site:
            return self
        bwd = None if self.bwd is None else _moved(self.bwd, self.site, span)
        return replace(self, site=span, fwd=_moved(self.fwd, self.site, span), bwd=bwd)


def _moved(fn: Function, old: Span, new: Span) -> Function:
    """fn with `new` for the call's span `old` (see `Lowered.at_site`)."""
    eqns = []
    for e in fn.eqns:
        if e.span == old:
            params = tuple((key, _moved(v, old, new) if isinstance(v, Function) else v)
                           for key, v in e.params) if e.op == "custom_vjp" else e.params
            e = Eqn(e.op, e.inputs, e.outputs, params, new)
        eqns.append(e)
    if all(new_e is old_e for new_e, old_e in zip(eqns, fn.eqns)):
        return fn
    return replace(fn, eqns=tuple(eqns))


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
        lowered = self.lowered(k, inputs, recompute)
        args = [inputs[n] for n in lowered.arrays]
        if lowered.bwd is None:
            return inline(b, lowered.fwd, args)[:lowered.n_out]
        return list(b.bind_multi("custom_vjp", *args, span=self.span, fwd=lowered.fwd,
                                 bwd=lowered.bwd, n_out=lowered.n_out, name=self.fdef.name))

    def lowered(self, k: int, inputs: dict[str, Value], recompute: bool) -> Lowered:
        """Stage k on inputs like `inputs`, lowered now or reused."""
        lw = self.lowerer
        key = self.key(k, inputs)
        known = lw.stages.get(key) if key is not None else None
        if known is not None and lw.may_reuse(known.reach):
            if lw.reach is not None:
                lw.reach.include(known.reach, len(lw.call_stack))
            lw.grow(known.size, self.span)
            return known.at_site(self.span)
        outer, lw.reach = lw.reach, Reach(len(lw.call_stack))
        held = len(lw.deferred)
        try:
            fwd, bwd, n_out, arrays = self.lower_stage(k, inputs, recompute)
            reach = lw.reach
        finally:
            lw.reach = outer
        if len(lw.deferred) > held:
            # an error held back for a block checked later: a reused stage
            # would not hold it back again, and that block would pass
            key = None
        if outer is not None:
            outer.include(reach, len(lw.call_stack))
        made = Lowered(self.span, tuple(arrays), fwd, bwd, n_out, inlined_size(fwd, lw.sizes),
                       reach)
        if key is not None:
            lw.stages[key] = made
        return made

    def key(self, k: int, inputs: dict[str, Value]) -> Optional[tuple]:
        """What lowering stage k on `inputs` depends on (None: a
        compile-time input with no exact key; not reused): the function
        and namespace, the inputs by name (arrays by type: the stage's
        functions take them as parameters), and the lowerer's context,
        the namespace names resolve in, the checkpoint interval its loops
        take and the entry's file (which nested calls' notes name)."""
        lw = self.lowerer
        items = []
        for name, v in inputs.items():
            exact = ("array", v.type) if not is_static(v) else _exact(v)
            if exact is None:
                return None
            items.append((name, exact))
        return (id(self.fdef), id(self.ns), id(lw.namespace), k, tuple(items),
                lw.checkpoint, lw.call_spans[0].file)

    def lower_stage(self, k: int, inputs: dict[str, Value], recompute: bool
                    ) -> tuple[Function, Optional[Function], int, list[str]]:
        """Stage k lowered: (fwd, bwd or None, n_out, array inputs), as
        `Lowered` holds them."""
        stage = self.forward(k, inputs, keep_residuals=not recompute)
        if not stage.carries_gradients():
            # Integers and bools carry no gradient, so nothing flows back
            # through this call: the blocks, written for float cotangents,
            # do not apply (an integer upstream is no cotangent to be linear in).
            return stage.fwd, None, stage.n_out, stage.arrays
        lw = self.lowerer
        held = len(lw.deferred)
        bwd = self.backward(stage, inputs, recompute)
        if k < len(self.fdef.grads):
            block = self.fdef.grads[k]
            n = len(bwd.params)
            check_linear(bwd, range(n - stage.n_out, n),
                         f"grad block {k + 1} of {self.fdef.name}() (line {block.span.line})",
                         block.span, stage.arrays, lw.linear_kinds)
            lw.raise_deferred((id(self.fdef), k + 1), held)
        return stage.fwd, bwd, stage.n_out, stage.arrays

    def eval_stage(self, b: Builder, k: int,
                   inputs: dict[str, Value]) -> tuple[list[Value], dict[str, Value]]:
        """Stage k inline: the body, then blocks 1..k, each block's returned
        cotangents mapped onto its inputs.  Returns (outputs, final env)."""
        env = dict(inputs)
        lw = self.lowerer
        # (in the context it is called in: where a grad block calls it, an
        # error held back in its body is the block's, `Lowerer.defer_in_block`)
        outs = lw.body(b, self.fdef, env)
        for j in range(1, k + 1):
            block = self.fdef.grads[j - 1]
            upstream = [inputs[n] for n in block.upstream if n in inputs]
            with lw.block_context((id(self.fdef), j), upstream):
                items = lw.block_items(b, block.body, env)
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
        self.lowerer.alias_arguments(fparams, [inputs[n] for n in arrays])
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
        self.lowerer.alias_arguments(bargs, stage.fwd.params)
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
        with self.lowerer.block_context((id(fdef), k + 1), bcts):
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
        self.lowerer.alias_arguments(fparams, [inputs[n] for n in arrays])
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


def _exact(value: Value) -> Optional[tuple]:
    """A compile-time value as a key equal only for the same value of the
    same type (1, 1.0 and True are equal in Python, 0.0 and -0.0 too);
    None for a kind of value it does not know."""
    if isinstance(value, tuple):
        items = tuple(_exact(v) for v in value)
        return None if None in items else (type(value).__name__,) + items
    if isinstance(value, float):  # (a `RunTimeFloat` is an f64 array)
        return (type(value).__name__, repr(value))
    if isinstance(value, (bool, int, str, Sym)) or value is None:
        # (a by-value argument's `RunTimeInt` folds as its dtype computes)
        return (type(value).__name__, getattr(value, "dtype", None), value)
    return None


def inlined_size(fn: Function, sizes: dict[int, tuple[Function, int]]) -> int:
    """fn's operations with the `fwd` of each `custom_vjp` it calls
    inlined, as it runs (a loop's body counted once); `sizes` memoizes by
    function (holding it, so its id stays its own)."""
    known = sizes.get(id(fn))
    if known is not None:
        return known[1]
    n = 0
    for eqn in fn.eqns:
        n += 1
        if eqn.op == "custom_vjp":
            n += inlined_size(eqn.p["fwd"], sizes)
        elif eqn.op == "loop":
            n += inlined_size(eqn.p["body"], sizes)
    sizes[id(fn)] = (fn, n)
    return n
