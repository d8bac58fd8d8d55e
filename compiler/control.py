"""Lowering of `for` loops and `if` statements (AST -> IR).

Contract:
- `lower_for(lowerer, b, stmt, env)` emits one `loop` equation (see
  `compiler.ops._loop_rule`) for `for v in range(...)`.  The bounds are
  compile-time integers or integer scalars known at run time (cast to
  i64); a constant step of 0 is a `GradError`.  The carried values are the
  names the body rebinds that are bound before the loop (a zero-trip loop
  leaves them as they were); each must keep its type (dtype and shape)
  through an iteration, else a `GradError` names both types at the
  statement that rebinds it.  One that starts as a compile-time number
  takes its dtype from the arrays it meets (`_start_dtypes`).  The body
  becomes a closed IR function: the outer values it reads are passed in
  as the loop's invariants; the body's work on invariants alone runs
  before the loop (`compiler.hoisting.hoist_body`), so that autodiff
  sees it outside (reading the loop's float values through a guard, where
  the trips may be none, that passes back no cotangent for none: `_guarded`).
  Names first bound in the body stay local to it; `env` gets the carried
  values' final values.
- `lower_if(lowerer, b, stmt, env)`: a condition known at compile time (a
  `const` argument, a size, `x.ndim`, arithmetic on them) lowers only the
  branch taken; a runtime scalar bool lowers both and selects each name
  either binds with `where` (so both run; the gradient flows only through
  the branch taken, as for `where`, and a run-time index in the branch not
  taken reads 0 rather than raise: `Lowerer.index_guard`).  Such a name
  must have the same type in both branches (a `GradError` otherwise); a
  name only some branches bind is dropped (the checker rejects reading it
  after the if; a grad block reading it is an error that names the if,
  `Lowerer.dropped`).
- In a grad block, a runtime condition that is no scalar bool and a bound
  that is no integer scalar are lowered anyway (a truth test, a cast,
  marked with their role) and their type errors held back
  (`Lowerer.defer_in_block`), so that the block's linearity check can
  name one that depends on the upstream at load.
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Sequence

from gradlang.compiler import ast
from gradlang.compiler.builder import Builder
from gradlang.compiler.hoisting import hoist_body
from gradlang.compiler.ir import FLOATS, INTS, Atom, Eqn, Function, Lit, TensorType, Var
from gradlang.compiler.loop_reads import stack_index_reads
from gradlang.compiler.shapes import NeedsConcrete, Sym, is_shortened
from gradlang.compiler.values import (RUN_TIME, RunTimeBool, Value, as_atom, cast, is_integer,
                                      is_static, literal_dtype, number_type, of_sizes_only,
                                      promote, run_time_atom, sequence_kind, unify,
                                      weak_number, weak_result)
from gradlang.runtime.common import range_length
from gradlang.runtime.errors import GradError, Span

if TYPE_CHECKING:
    from gradlang.compiler.lower import Lowerer

INDEX = TensorType("i64", ())
_PLACEHOLDER = "$checked"  # what a loop carrying nothing else carries (no name is this)


def lower_for(lw: "Lowerer", b: Builder, stmt: ast.For, env: dict[str, Value]) -> None:
    (start, stop, step), known = _bounds(lw, b, stmt, env)
    carried = [n for n in ast.assigned_names(stmt.body) if n in env and n != stmt.var]
    if not carried:
        # nothing it computes outlives it, but its trips may raise (`y =
        # x[i]` out of range, a step of 0), as Python's do: it carries a
        # number it leaves unchanged, which `passes.dce` reduces to the
        # loop's checks, or drops with the loop where it has none
        env = {**env, _PLACEHOLDER: 0}  # (a copy: the name leaks nowhere)
        carried = [_PLACEHOLDER]
    for name in carried:
        _not_a_sequence(name, env[name], stmt, before=True)
    dtypes: list["str | None"] = [None] * len(carried)
    for _ in range(len(carried) + 2):
        inits = [as_atom(Builder(), env[n], stmt.span, d) for n, d in zip(carried, dtypes)]
        sb, index, params, outs = _lower_body(lw, b, stmt, env, carried, inits)
        starts = _start_dtypes(sb, [env[n] for n in carried], inits, params, outs,
                               first=all(d is None for d in dtypes))
        if starts == [None if d is None else a.type.dtype for d, a in zip(starts, inits)]:
            break
        dtypes = starts
    for name, param, out in zip(carried, params, outs):
        if out.type != param.type:
            raise GradError(f"{name!r} changes type in the loop: {param.type} before an "
                            f"iteration, {out.type} after it; a carried value must keep "
                            "its dtype and shape", _last_binding(stmt.body, name) or stmt.span)
    inits = [as_atom(b, env[n], stmt.span, p.type.dtype) for n, p in zip(carried, params)]
    # (a segmented loop's inner loops would each need their part of the stacks)
    trip, slices, xs = (stack_index_reads(b, sb, [index] + params, known)
                        if lw.checkpoint is None else (None, [], []))
    body, invariants = close(sb, f"for_{stmt.var}", [index] + params, outs, slices)
    # (before autodiff sees it: the moved work's VJP then runs once, after the trips)
    moved, body, invariants = hoist_body(body, {"n_carry": len(carried),
                                                "n_inv": len(invariants)}, invariants)
    b.eqns += _guarded(b, moved, (start, stop, step), stmt.span)
    if lw.checkpoint is not None:
        results = _segments(b, (start, stop, step), inits, invariants, body, lw.checkpoint,
                            stmt.span)
    else:
        results = b.bind_multi("loop", start, stop, step, *inits, *invariants, *xs,
                               span=stmt.span, body=body, n_carry=len(carried),
                               n_inv=len(invariants), trip=trip, reverse=False)
    env.update(zip(carried, results))


def _guarded(b: Builder, moved: list[Eqn], bounds: Sequence[Atom], span: Span) -> list[Eqn]:
    """The work moved before a loop (`moved`), reading each float value of
    the loop's (not made by that work) as `where(runs, x, 0)`, bound in
    `b`, where the loop's trip count may be zero: x where the loop reads
    what the work makes, and a loop of no trips passes no cotangent back
    through the work.  Its VJP runs once whatever the trips, on a zero
    cotangent for none, and 0 * inf is NaN: log(w)'s slope at w = 0, which
    the loop as written never computes.  (Not stop_gradient(x) for the 0:
    a grad block must stay linear in its cotangents, `compiler.linearity`.)"""
    start, stop, step = bounds
    if not moved or (all(isinstance(a, Lit) for a in bounds)
                     and range_length(*(a.value for a in bounds)) > 0):
        return moved
    runs = _runs(b, start, stop, step, span)
    made = {o for e in moved for o in e.outputs}
    through: dict[Var, Var] = {}

    def guard(a: Atom) -> Atom:
        if not isinstance(a, Var) or a in made or a.type.dtype not in FLOATS:
            return a
        if a not in through:
            through[a] = b.bind("where", runs, a, b.lit(0, a.type.dtype), span=span)
        return through[a]

    return [Eqn(e.op, tuple(guard(a) for a in e.inputs), e.outputs, e.params, e.span)
            for e in moved]


def _runs(b: Builder, start: Atom, stop: Atom, step: Atom, span: Span) -> Atom:
    """Whether `range(start, stop, step)` has a trip, as a bool scalar."""
    if isinstance(step, Lit):
        return b.bind("lt" if step.value > 0 else "gt", start, stop, span=span)
    zero = Lit(0, INDEX)
    up = b.bind("logical_and", b.bind("gt", step, zero), b.bind("lt", start, stop))
    down = b.bind("logical_and", b.bind("lt", step, zero), b.bind("gt", start, stop))
    return b.bind("logical_or", up, down, span=span)


def _lower_body(lw: "Lowerer", b: Builder, stmt: ast.For, env: dict[str, Value],
                carried: list[str], inits: Sequence[Atom]
                ) -> tuple[Builder, Var, list[Var], list[Atom]]:
    """The loop's body lowered into a fresh builder (inside b's), its carried values
    starting as parameters of the inits' types: the builder, the index and
    carried parameters, and each carried value as the body leaves it."""
    sb = Builder(outer=b)
    index = Var(INDEX, stmt.var)
    params = [Var(a.type, n) for n, a in zip(carried, inits)]
    sb.starts = {id(p): env[n] for n, p in zip(carried, params)}  # (`Builder.computed_from`)
    inner = {**env, stmt.var: index, **dict(zip(carried, params))}
    lw.statements(sb, stmt.body, inner)
    for name in carried:
        _not_a_sequence(name, inner[name], stmt)
    outs = [as_atom(sb, inner[name], stmt.span, param.type.dtype if is_static(inner[name])
                    else None) for name, param in zip(carried, params)]
    return sb, index, params, outs


def _start_dtypes(sb: Builder, starts: Sequence[Value], inits: Sequence[Atom],
                  params: Sequence[Var], outs: Sequence[Atom],
                  first: bool) -> list["str | None"]:
    """The dtypes the carried values start with, given a lowering of the
    body (`sb`) from `inits` (the `first`, from their own dtypes): an array
    start keeps its own (None); a compile-time number (`s = 0.0`) takes the
    dtype of the arrays it meets, as a literal does without a loop (`s = s +
    sum(x)` keeps s f32 for f32 x).  Those are the float arrays the loop
    reads (its invariants and array starts), then whatever dtype the body
    leaves it with."""
    float_reads = [v.type.dtype for v in close(sb, "", list(params), [])[1]]
    float_reads += [a.type.dtype for v, a in zip(starts, inits) if weak_number(v) is None]
    float_reads = [d for d in float_reads if d in FLOATS]
    result = []
    for v, init, out in zip(starts, inits, outs):
        number = weak_number(v)  # (an `arange` start counts as a number)
        if number is None:
            result.append(None)
        elif out.type.shape != init.type.shape:
            result.append(init.type.dtype)  # an error, named by the caller
        elif first and isinstance(number, float) and float_reads:
            result.append(functools.reduce(promote, float_reads))
        else:
            result.append(literal_dtype(number, out.type.dtype))
    return result


def checkpoint_interval(fdef: ast.FuncDef) -> "int | str | None":
    """For a `@recompute` function with loops (and no grad block): how
    many trips its loops' segments run, `every=` or "sqrt"; else None."""
    if fdef.grads or not ast.has_loop(fdef.body):
        return None
    for d in fdef.decorators:
        if d.name == "recompute":
            return next((k.value.value for k in d.args if k.name == "every"), "sqrt")
    return None


def _segments(b: Builder, bounds: Sequence[Atom], inits: list[Atom], invariants: list[Var],
              body: Function, every: "int | str", span: Span) -> tuple[Var, ...]:
    """The loop as a loop over segments of `every` trips, each running an
    inner loop of the body.  Reverse mode then stacks only the state each
    segment starts from (the checkpoints), and the backward pass of a
    segment reruns its inner loop: about 2 sqrt(trips) states held instead
    of one per trip, for one more forward pass."""
    start, stop, step = bounds
    k = _interval(b, bounds, every)
    if isinstance(k, Lit) and isinstance(step, Lit):
        stride: Atom = Lit(k.value * step.value, INDEX)
    else:
        stride = b.bind("mul", k, step, span=span)
    ob = Builder()
    segment = Var(INDEX, "segment")
    params = [Var(a.type, a.hint if isinstance(a, Var) else "") for a in inits]
    end = ob.bind("add", segment, stride)
    if isinstance(step, Lit):
        seg_stop = ob.bind("minimum" if step.value > 0 else "maximum", end, stop)
    else:
        up = ob.bind("gt", step, Lit(0, INDEX))
        seg_stop = ob.bind("where", up, ob.bind("minimum", end, stop),
                           ob.bind("maximum", end, stop))
    inner = ob.bind_multi("loop", segment, seg_stop, step, *params, *invariants, span=span,
                          body=body, n_carry=len(params), n_inv=len(invariants), trip=None,
                          reverse=False)
    outer, outer_invariants = close(ob, f"{body.name}_segments", [segment] + params,
                                    list(inner))
    return b.bind_multi("loop", start, stop, stride, *inits, *outer_invariants, span=span,
                        body=outer, n_carry=len(inits), n_inv=len(outer_invariants),
                        trip=None, reverse=False)


def _interval(b: Builder, bounds: Sequence[Atom], every: "int | str") -> Atom:
    """Trips per segment: `every` (at most the trip count, so that a
    segment's end, its start plus `every` steps, stays within i64), or the
    integer square root of the trip count; at least 1, and computed at run
    time when the bounds are."""
    if all(isinstance(a, Lit) for a in bounds):
        trips = range_length(*(a.value for a in bounds))
        return Lit(max(1, math.isqrt(trips) if every == "sqrt" else min(every, trips)), INDEX)
    start, stop, step = (cast(b, a, "f64") for a in bounds)
    trips = b.bind("maximum", b.bind("ceil", b.bind("div", b.bind("sub", stop, start), step)),
                   Lit(0.0, TensorType("f64", ())))
    if every == "sqrt":
        k = b.bind("cast", b.bind("sqrt", trips), dtype="i64")
    else:
        k = b.bind("minimum", b.bind("cast", trips, dtype="i64"), Lit(every, INDEX))
    return b.bind("maximum", k, Lit(1, INDEX))


def _bounds(lw: "Lowerer", b: Builder, stmt: ast.For, env) -> tuple[list[Atom], list]:
    """range()'s start, stop and step as i64 scalars, and as what is known of
    them at compile time (an int, a size symbol; None: known at run time)."""
    atoms, known = [], []
    stop_at = 0 if len(stmt.args) == 1 else 1
    for k, arg in enumerate(stmt.args):
        v = lw.expr(b, arg, env)
        if k == stop_at and _clamps_stop(known):
            # (`range(n - 1)`: the trips of range(max(0, n - 1)), a size
            # that keeps the program symbolic, for a start >= 0 and a step
            # > 0, checked below)
            v = lw.shortened_bound(v)
        if lw.number_of_sizes(b, v):
            # (`range(n // 2)`: with its value known, reads by the index are
            # proven in range and become a stacked input, `loop_reads`)
            raise NeedsConcrete("a loop bound is a number made of sizes")
        known.append(v if is_static(v) else None)
        if is_static(v):
            if not isinstance(v, Sym) and not is_integer(v):
                what = "a float" if isinstance(v, float) else \
                    "a bool" if number_type(v) is bool else "a tuple"
                raise GradError(f"range() takes integers, got {what}", arg.span)
            atoms.append(as_atom(b, v, arg.span, "i64"))
            continue
        if v.type.dtype not in INTS or v.type.rank != 0:
            lw.defer_in_block(GradError(f"range() takes integer scalars, got {v.type}",
                                        arg.span))
            atoms.append(b.bind("cast", _scalar(b, v), dtype="i64", span=arg.span,
                                role="a loop bound"))
            continue
        atoms.append(cast(b, v, "i64"))
    if len(atoms) == 1:
        atoms, known = [Lit(0, INDEX)] + atoms, [0] + known
    if len(atoms) == 2:
        atoms.append(Lit(1, INDEX))
        known.append(1)
    step = atoms[2]
    if isinstance(step, Lit) and step.value == 0:
        raise GradError("range() step must not be zero", stmt.args[2].span)
    if is_shortened(known[1]) and not (isinstance(known[2], int) and known[2] > 0):
        raise NeedsConcrete("a loop bound is a number made of sizes")
    return atoms, known


def _clamps_stop(known: list) -> bool:
    """Whether a stop of max(0, n - c) for n - c gives range() the same
    trips, after a start of `known` (none, or one known >= 0)."""
    return not known or (isinstance(known[0], (int, Sym)) and not isinstance(known[0], bool)
                         and (isinstance(known[0], Sym) or known[0] >= 0))


def _scalar(b: Builder, v: Atom) -> Atom:
    """A scalar that depends on each element of `v` (its sum), standing for
    an array where a scalar is needed, in a grad block whose error for it
    is held back (`Lowerer.defer_in_block`)."""
    if v.type.rank == 0:
        return v
    if v.type.dtype not in FLOATS:
        v = b.bind("cast", v, dtype="f64")
    return b.bind("reduce_sum", v, axes=tuple(range(v.type.rank)))


def _not_a_sequence(name: str, value: Value, stmt: ast.For, before: bool = False) -> None:
    """A value the loop `stmt` assigns and carries from trip to trip must
    be an array or number: a compile-time tuple or list (`t = t + (1,)`)
    cannot be carried, since a loop runs, it is not unrolled.  A GradError
    at the body's last binding of `name` (it said only "a tuple cannot be
    used as an array here", at the loop)."""
    if isinstance(value, tuple):
        kind = sequence_kind(value)
        what = (f"{name!r} is a {kind} where a loop that assigns it starts" if before
                else f"{name!r} is a {kind} assigned in a loop")
        raise GradError(f"{what}: a loop runs, it is not "
                        f"unrolled, so a {kind} (known at compile time) cannot change from "
                        f"trip to trip; build it before the loop, or give the loop's "
                        f"result another name", _last_binding(stmt.body, name) or stmt.span)


def _last_binding(body: Sequence[ast.Stmt], name: str) -> Span | None:
    """The span of the last statement of `body` that binds `name`."""
    for s in reversed(body):
        if name in ast.assigned_names((s,)):
            return s.span
    return None


def close(sb: Builder, name: str, params: list[Var], outputs: list[Atom],
          last: Sequence[Var] = ()) -> tuple[Function, list[Var]]:
    """What `sb` built, as a closed function: the outer values it reads
    become parameters after `params`, and `last` (a loop's slices of its
    stacked inputs) after those.  Returns it and those outer values."""
    defined: set[Var] = set(params) | set(last)
    free: dict[Var, Var] = {}

    def sub(a: Atom) -> Atom:
        if isinstance(a, Var) and a not in defined:
            return free.setdefault(a, Var(a.type, a.hint))
        return a

    eqns = []
    for eqn in sb.eqns:
        eqns.append(Eqn(eqn.op, tuple(sub(a) for a in eqn.inputs), eqn.outputs,
                        eqn.params, eqn.span))
        defined.update(eqn.outputs)
    outs = [sub(a) for a in outputs]
    fn = Function(name, tuple(params) + tuple(free.values()) + tuple(last), tuple(eqns),
                  tuple(outs))
    return fn, list(free)


def lower_if(lw: "Lowerer", b: Builder, stmt: ast.If, env: dict[str, Value]) -> None:
    """The if and its elif arms (`ast.elif_chain`), in a loop: an arm whose
    condition is known at compile time is taken (ending the chain) or
    skipped; one known at run time lowers its body into a copy of the env
    under its condition and the rest of the chain into another copy under
    the condition's negation.  The names are then selected arm by arm from
    the last back, as the nested `if ... else: if ...` the chain means."""
    arms, orelse = ast.elif_chain(stmt)
    outer = guards = lw.branches
    runtime = {}  # per arm decided at run time: its condition, its env, the rest's env
    level = env  # where the rest of the chain is lowered
    chosen = orelse
    try:
        for k, arm in enumerate(arms):
            cond = lw.expr(b, arm.cond, level)
            if isinstance(cond, RunTimeBool):
                # (`if k == 1:` by value: the arm the run time takes, and only
                # it lowered, as a shape k gives in the other may need)
                cond = bool(cond)
            elif isinstance(cond, RUN_TIME):  # (`if k:` by value: the run time's error, no truth)
                cond = run_time_atom(b, cond, arm.cond.span)
            if is_static(cond):
                if isinstance(cond, Sym):
                    raise NeedsConcrete("a size is an if condition")
                if isinstance(cond, tuple):
                    raise GradError("an if condition cannot be a tuple", arm.cond.span)
                if cond:
                    chosen = arm.body
                    break
                continue
            if cond.type.dtype != "bool" or cond.type.rank != 0:
                lw.defer_in_block(GradError(
                    f"an if condition must be known at compile time or be a scalar bool, "
                    f"got {cond.type}; select elementwise with where()", arm.cond.span))
                scalar = _scalar(b, cond)
                cond = b.bind("ne", scalar, Lit(0, TensorType(scalar.type.dtype, ())),
                              span=arm.cond.span, role="an if condition")
            if lw.numbers_of_sizes and of_sizes_only(b, cond):
                # (`n / 2 > 1.0`: compile-time for concrete sizes, so only
                # the arm taken is lowered; run at run time, the arm not
                # taken would run too, and raise what the call does not)
                raise NeedsConcrete("a number made of a size is an if condition")
            taken, rest = dict(level), dict(level)
            lw.branches = guards + ((cond, True),)
            lw.statements(b, arm.body, taken)
            lw.branches = guards = guards + ((cond, False),)
            runtime[k] = (cond, taken, rest)
            level = rest
        lw.statements(b, chosen, level)
    finally:
        lw.branches = outer
    # Back from the last arm: `later` holds the names the arm or a later
    # one binds, in order of first binding.
    later = dict.fromkeys(ast.assigned_names(orelse))
    envs = [env] + [rest for _, _, rest in runtime.values()]  # the env each arm writes into
    for k in range(len(arms) - 1, -1, -1):
        later = dict.fromkeys(ast.assigned_names(arms[k].body) + list(later))
        if k not in runtime:
            continue
        cond, taken, rest = runtime[k]
        envs.pop()
        for name in later:
            if name not in taken or name not in rest:
                envs[-1].pop(name, None)
                # (the checker lets a grad block read it: a branch known at
                # compile time binds it; this one is not known then)
                lw.dropped[lw.current_function(), name] = stmt.span.line
                continue
            envs[-1][name] = _select(b, cond, taken[name], rest[name], name, arms[k])


def _select(b: Builder, cond: Atom, x: Value, y: Value, name: str, stmt: ast.If) -> Value:
    if x is y or (is_static(x) and is_static(y) and number_type(x) is number_type(y)
                      and x == y):
        return x
    weak = weak_result([x, y])
    if weak_number(x) is not None or weak_number(y) is not None:
        # a number (or a weakly typed `arange`) takes the other side's dtype
        # as a literal does, as `where` selects: 2.5 against an i32 is f64
        x, y = unify(b, [x, y], stmt.span, arithmetic=False)
    if x.type != y.type:
        raise GradError(f"{name!r} is {x.type} after the if branch but {y.type} after the "
                        "else branch; both branches must bind it with the same type",
                        stmt.span)
    return b.bind("where", cond, x, y, span=stmt.span, hint=name, weak=weak)
