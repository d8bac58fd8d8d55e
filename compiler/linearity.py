"""Linear IR: the check that a grad block is linear in its upstream
cotangents, and the transposition of a linear function.

Contract:
- `check_linear(fn, upstream, where, span, names, calls)` raises a `GradError` unless
  every output of `fn` is a linear map of its parameters at the indices
  `upstream` (the rest held fixed): each path from an upstream parameter
  to an output goes only through ops that the op table declares linear in
  the inputs on that path (`Op.linear`: additions, negation, products and
  quotients with an upstream-free factor, sums, layout ops, matmul with
  one upstream-free side, `where` with an upstream-free condition; a loop
  whose body is linear in its carried values and inputs that depend on
  the upstream, each carried value depending on it on entry exactly when
  a trip makes it so), and
  an output (the cotangent for `names[i]`) that does not depend on
  the upstream is zero, and no equation carrying a `role` (an if
  condition, loop bound or index the lowering could not type,
  `Lowerer.defer_in_block`), read or not, depends on the upstream.  The error
  names the op at its own span (inside a called function's body too: a
  call carrying its own grad blocks is checked through its body), as a
  `NotLinear` error.  `calls` (kept by the caller across checks) holds
  what each called function's walk found, by the kinds of its inputs, so
  that a function called from many blocks is walked once per kinds.
- `transpose(b, fn, args, seeds)` emits into `b` the transpose of `fn`
  (linear in the parameters whose `args` entry is None, as checked
  above): given one seed per output (None for zero), it returns one
  cotangent per linear parameter (None where nothing flows).  The values
  `fn` computes from its other parameters are emitted as they are; a
  linear op is transposed by its VJP rule, which for an op linear in an
  input is exactly its transpose with respect to that input; a loop by
  its VJP (`autodiff.loop_pull_back`) on the states of a forward run with
  its linear inputs zero.  As in reverse mode, the cotangent of a branch
  of `where` keeps its where-mask through the rules after it, which
  re-select by it (`autodiff.select_by_mask`): the branch not taken
  contributes exactly 0, NaN or inf included.
"""
from __future__ import annotations

from typing import Optional, Sequence

from gradlang.compiler import ops
from gradlang.compiler.autodiff import (Cotangents, loop_forward, loop_outputs_reading,
                                       loop_pull_back, select_by_mask)
from gradlang.compiler.builder import Builder, inline
from gradlang.compiler.ir import Atom, Eqn, Function, Lit, Var
from gradlang.compiler.passes import inline_calls
from gradlang.runtime.errors import GradError, Span

# How a value relates to the upstream: it depends on it (linearly), it is
# zero, or (absent from the map) it is free of it.
LINEAR, ZERO = "linear", "zero"


class NotLinear(GradError):
    """A grad block that is not linear in its upstream cotangents."""


# id of a called function -> (the function, kept so that its id stays its
# own; its inputs' kinds -> its outputs' kinds)
CallKinds = dict[int, tuple[Function, dict[tuple, list]]]


def check_linear(fn: Function, upstream: Sequence[int], where: str, span: Span,
                 names: Sequence[str], calls: Optional[CallKinds] = None) -> None:
    kinds: dict[Var, str] = {fn.params[i]: LINEAR for i in upstream}
    out_kinds = _walk(fn, kinds, where, span, {} if calls is None else calls)
    for name, out, kind in zip(names, fn.outputs, out_kinds):
        if kind is None and out.type.is_float:
            raise NotLinear(
                f"{where} is not linear in its upstream cotangents: the cotangent for "
                f"{name!r} does not depend on them and is not zero (a vector-Jacobian "
                "product maps zero upstream to zero cotangents)", _defined_at(fn, out) or span)


def _kind(kinds: dict[Var, str], a: Atom) -> Optional[str]:
    if isinstance(a, Lit):
        return ZERO if a.value == 0 else None
    return kinds.get(a)


def _walk(fn: Function, kinds: dict[Var, str], where: str, span: Span,
          calls: CallKinds, n_live: Optional[int] = None) -> list[Optional[str]]:
    """Classifies every value of `fn` (kinds holds its parameters') that
    its first `n_live` outputs (default: all) read; returns the outputs'
    kinds.  A value nothing reads is no part of the map: `grad(h)(dy)` for
    h(v) = v * v is 2 * dy, linear, though its dead forward sweep computes
    dy * dy; nor is a residual that a called function's block reads,
    computed from its input."""
    # an if condition or loop bound whose type error is held back
    # (`Lowerer.defer_in_block`) is checked even where nothing reads it
    roles = [o for e in fn.eqns if _role(e) for o in e.outputs]
    live = _read_by(fn, list(fn.outputs[:n_live]) + roles)
    for eqn in fn.eqns:
        if not any(o in live for o in eqn.outputs):
            continue
        op = ops.OPS[eqn.op]
        in_kinds = [_kind(kinds, a) for a in eqn.inputs]
        if op.kind == "call":
            n_out = eqn.p["n_out"]
            outs = _call_kinds(eqn.p["fwd"], in_kinds, where, span, calls, n_out)[:n_out]
            kinds.update((v, k) for v, k in zip(eqn.outputs, outs) if k is not None)
            continue
        if op.kind == "loop":
            outs = _loop_kinds(eqn, in_kinds, where, span, calls)
            kinds.update((v, k) for v, k in zip(eqn.outputs, outs) if k is not None)
            continue
        kind = _eqn_kind(eqn, op, in_kinds, where, span)
        if kind is not None:
            kinds.update((v, kind) for v in eqn.outputs)
    return [_kind(kinds, a) for a in fn.outputs]


def _read_by(fn: Function, outputs: Sequence[Atom]) -> set[Var]:
    """The values of `fn` that `outputs` read, through its equations."""
    live = {a for a in outputs if isinstance(a, Var)}
    for eqn in reversed(fn.eqns):
        if any(o in live for o in eqn.outputs):
            live.update(a for a in eqn.inputs if isinstance(a, Var))
    return live


def _call_kinds(fn: Function, in_kinds: list[Optional[str]], where: str, span: Span,
                calls: CallKinds, n_out: int) -> list[Optional[str]]:
    """The kinds of the first `n_out` outputs (its results, not the
    residuals) of a call of `fn` on inputs of `in_kinds`:
    walked once per kinds (only a walk that raised nothing is kept, so
    the error of one that does names the block that made the call)."""
    known = calls.get(id(fn))
    if known is None or known[0] is not fn:
        known = calls[id(fn)] = (fn, {})
    key = tuple(in_kinds)
    if key not in known[1]:
        sub = {v: k for v, k in zip(fn.params, in_kinds) if k is not None}
        known[1][key] = _walk(fn, sub, where, span, calls, n_out)
    return known[1][key]


def _loop_kinds(eqn: Eqn, in_kinds: list[Optional[str]], where: str,
                span: Span, calls: CallKinds) -> list[Optional[str]]:
    """The kinds of a loop's results: its body walked with its carried
    values' kinds joined with what a trip makes of them, until they settle
    (a carried value free of the upstream on entry that a trip makes
    depend on it is affine, not linear)."""
    p = eqn.p
    body, n_carry = p["body"], p["n_carry"]
    _, carried, invariants, xs = ops.loop_groups(list(in_kinds), p)
    while True:
        param_kinds = [None] + carried + invariants + xs
        sub = {v: k for v, k in zip(body.params, param_kinds) if k is not None}
        outs = _walk(body, sub, where, span, calls)
        joined = [_join(a, b, where, eqn.span or span) for a, b in zip(carried, outs)]
        if joined == carried:
            return carried + outs[n_carry:]
        carried = joined


def _join(a: Optional[str], b: Optional[str], where: str, at: Span) -> Optional[str]:
    """The kind of a value that is one of two values of kinds a and b."""
    if a == b:
        return a
    if LINEAR in (a, b) and None in (a, b):
        raise NotLinear(f"{where} is not linear in its upstream cotangents: a loop carries "
                        "a value that depends on them in one trip and one that does not in "
                        "another (an affine map, not a linear one)", at)
    return LINEAR if LINEAR in (a, b) else None


def _eqn_kind(eqn: Eqn, op: ops.Op, in_kinds: list[Optional[str]], where: str,
              span: Span) -> Optional[str]:
    values = [i for i in range(len(in_kinds)) if i not in op.token_inputs]
    linear = {i for i in values if in_kinds[i] == LINEAR}
    # indices are held fixed; every other input is a value, whatever its
    # dtype (a bool or an integer one free of the upstream is no zero)
    slots = [frozenset(i for i in s if not _is_index(op, i))
             for s in op.linear_slots(len(in_kinds))]
    if not linear:
        if eqn.op == "full" and eqn.p["value"] == 0:
            return ZERO
        zero = any(all(in_kinds[i] == ZERO for i in s) for s in slots if s)
        return ZERO if zero else None
    at = eqn.span or span
    if _role(eqn):
        raise NotLinear(f"{where} is not linear in its upstream cotangents: {_role(eqn)} "
                        "depends on them (a linear map only scales and adds its input: it "
                        "cannot branch, loop or index by it)", at)
    fits = [s for s in slots if linear <= s]
    if op.linear == "each" and len(linear) > 1:
        raise NotLinear(f"{where} is not linear in its upstream cotangents: "
                        f"{_describe(eqn)} of two values that depend on them", at)
    if not fits or not all(o.type.is_float for o in eqn.outputs):
        raise NotLinear(f"{where} is not linear in its upstream cotangents: {_describe(eqn)} "
                        "of a value that depends on them", at)
    if not any(all(in_kinds[i] in (LINEAR, ZERO) for i in s) for s in fits):
        raise NotLinear(f"{where} is not linear in its upstream cotangents: {_describe(eqn)} "
                        "of a value that depends on them and one that does not (an affine "
                        "map, not a linear one)", at)
    return LINEAR


def _role(eqn: Eqn) -> Optional[str]:
    """What the equation stands for where its lowering held back a type
    error (`Lowerer.defer_in_block`): "an if condition", "a loop bound",
    "an index"."""
    return next((v for k, v in eqn.params if k == "role"), None)


def _is_index(op: ops.Op, i: int) -> bool:
    return i < len(op.domains) and op.domains[i] == "index"


_DESCRIPTIONS = {"mul": "a product", "div": "a quotient", "matmul": "a matrix product",
                 "add": "a sum", "sub": "a difference", "pow": "a power", "cast": "a cast",
                 "floor_divide": "a floor division (//)", "remainder": "a remainder (%)",
                 "reduce_max": "a max() or min() reduction",  # min is max of the negation
                 **{c: "a comparison" for c in ("lt", "le", "gt", "ge", "eq", "ne")}}


def _describe(eqn: Eqn) -> str:
    if eqn.op in _DESCRIPTIONS:
        return _DESCRIPTIONS[eqn.op]
    name = ops.OPS[eqn.op].source_name or eqn.op
    return f"{name}()"


def _defined_at(fn: Function, out: Atom) -> Optional[Span]:
    return next((e.span for e in fn.eqns if out in e.outputs and e.span), None)


# ------------------------------------------------------------ transposition


def transpose(b: Builder, fn: Function, args: Sequence[Optional[Atom]],
              seeds: Sequence[Optional[Atom]]) -> list[Optional[Atom]]:
    return masked_transpose(b, fn, args, seeds)[0]


def masked_transpose(b: Builder, fn: Function, args: Sequence[Optional[Atom]],
                     seeds: Sequence[Optional[Atom]],
                     seed_masks: Sequence[Optional[Var]] = ()
                     ) -> tuple[list[Optional[Atom]], list[Optional[Var]]]:
    """`transpose`, given the seeds' where-masks (`seed_masks`, by output;
    None or absent: none), also returning each cotangent's (None: none)."""
    fn = inline_calls(fn)  # a call's value is its fwd body's
    scratch = Builder()
    placeholders = [Var(p.type, p.hint) if a is None else a for p, a in zip(fn.params, args)]
    outputs = inline(scratch, fn, placeholders)
    linear_params = [v for v, a in zip(placeholders, args) if a is None]
    cts = transpose_eqns(b, scratch.eqns, set(linear_params), outputs, seeds, seed_masks)
    return [cts.of(v) for v in linear_params], [cts.mask(v) for v in linear_params]


def transpose_eqns(b: Builder, eqns: Sequence[Eqn], linear: set[Var],
                   outputs: Sequence[Atom], seeds: Sequence[Optional[Atom]],
                   seed_masks: Sequence[Optional[Var]] = (), masking: bool = True
                   ) -> Cotangents:
    """The transpose of straight-line `eqns` (no calls), linear in the
    values `linear`: the cotangent of each linear value reached from the
    seeded outputs (`.of(v)`), and its where-mask (`.mask(v)`: None for
    none), each seed having the mask `seed_masks` gives it, if any.
    Without `masking`, no cotangent is re-selected by a mask (one op's VJP
    rule, whose forward mode keeps its masks itself: `forward.py`).
    Equations free of `linear` are emitted into `b` first.
    A bool computed from linear values (reverse mode's mask of where a
    cotangent is nonzero) cannot be computed here: `where(mask, v, 0)` is
    taken as v and the mask cast to a number as 1 (`_unmasked`)."""
    linear = set(linear)
    alias: dict[Var, Atom] = {}
    taped: list[Eqn] = []
    # where-masks computed from the linear values (reverse mode's "where
    # the cotangent is nonzero", `autodiff.materialized`): unknown here
    value_masks: set[Var] = set()

    def sub(a: Atom) -> Atom:
        return alias.get(a, a) if isinstance(a, Var) else a

    for eqn in eqns:
        eqn = Eqn(eqn.op, tuple(sub(a) for a in eqn.inputs), eqn.outputs, eqn.params,
                  eqn.span)
        op = ops.OPS[eqn.op]
        reads = [i for i, a in enumerate(eqn.inputs) if a in linear]
        if any(a in value_masks for a in eqn.inputs) or (
                reads and all(o.type.dtype == "bool" for o in eqn.outputs)):
            unmasked = _unmasked(eqn, value_masks)
            if unmasked is not None:  # where(mask, v, 0): v, zero where the mask is
                alias[eqn.out] = unmasked
                continue
            if eqn.op == "cast" and eqn.inputs[0] in value_masks:  # as a factor: 1, as v
                alias[eqn.out] = ops.full(b, 1, eqn.out.type.shape, eqn.out.type.dtype)
                continue
            if all(o.type.dtype == "bool" for o in eqn.outputs):
                value_masks.update(eqn.outputs)
                continue
        if not reads:
            b.eqns.append(eqn)
        elif eqn.op == "loop":
            taped.append(eqn)
            reading = loop_outputs_reading(eqn, [a in linear for a in eqn.inputs])
            linear.update(o for o, r in zip(eqn.outputs, reading) if r)
            if not all(reading):
                # its results free of the linear values (a count carried
                # beside a sum: `acc / k`) are values the rules after it
                # read; they were never computed (an undefined value, a
                # KeyError in fusion)
                zeroed = [ops.zeros_like(b, a.type) if a in linear else a for a in eqn.inputs]
                b.eqns.append(Eqn("loop", tuple(zeroed), eqn.outputs, eqn.params, eqn.span))
        elif all(i in op.token_inputs for i in reads):
            alias[eqn.out] = eqn.inputs[0]  # a data dependency on the upstream only
        else:
            taped.append(eqn)
            linear.update(eqn.outputs)
    cts = _Cotangents(b, linear)
    masks = list(seed_masks) + [None] * (len(seeds) - len(seed_masks))
    for out, seed, mask in zip(outputs, seeds, masks):
        cts.accumulate(sub(out), seed, mask)
    for eqn in reversed(taped):
        if eqn.op == "loop":
            _transpose_loop(b, eqn, cts)
            continue
        ct = cts.of(eqn.out)
        if ct is None:
            continue
        op = ops.OPS[eqn.op]
        needs = [a in linear and i not in op.token_inputs for i, a in enumerate(eqn.inputs)]
        out_mask = cts.mask(eqn.out)
        for index, (a, need, c) in enumerate(zip(eqn.inputs, needs,
                                                 op.vjp(b, eqn, [ct], needs))):
            if need and c is not None:
                # re-selected by the tangent's where-mask, as reverse mode
                # does: the transpose of where(x > 0, d / sqrt(x), 0) takes
                # where(x > 0, t, 0) through the quotient, 0 / sqrt(x) = NaN
                # at x <= 0 where the block (and reverse mode) gives 0
                mask = None
                if masking:
                    c, mask = select_by_mask(b, eqn, index, c, out_mask)
                if op.kind == "elementwise":
                    c = ops.unbroadcast(b, c, a.type.shape)
                cts.accumulate(a, c, mask)
    return cts


def _unmasked(eqn: Eqn, value_masks: set[Var]) -> Optional[Atom]:
    """For `where(m, v, 0)` with m a mask computed from
    the linear values: v.  Such a mask only keeps a zero cotangent from
    meeting an infinite derivative (0 * inf = NaN) where the linear value
    it tests is zero, so that it selects v wherever v matters; the
    transpose, which cannot compute it, takes v.  None for anything else."""
    if eqn.op != "where" or eqn.inputs[0] not in value_masks:
        return None
    _, a, c = eqn.inputs
    return a if isinstance(c, Lit) and c.value == 0 and a not in value_masks else None


def _transpose_loop(b: Builder, eqn: Eqn, cts: _Cotangents) -> None:
    """A loop linear in its inputs that `cts` needs, transposed: its VJP, run
    on the states a forward loop stacks with those inputs zero (the rest of
    its state does not depend on them, and a linear body's derivative with
    respect to them does not depend on their values), its outputs'
    where-masks going in and its inputs' coming out."""
    out_cts = [cts.of(o) for o in eqn.outputs]
    if all(c is None for c in out_cts):
        return
    zeroed = [ops.zeros_like(b, a.type) if cts.needs(a) else a for a in eqn.inputs]
    back = {z: a for z, a in zip(zeroed, eqn.inputs) if cts.needs(a)}
    record, _, stacked = loop_forward(b, eqn, zeroed)
    out_masks = [cts.mask(o) for o in eqn.outputs]
    for z, ct, mask in loop_pull_back(b, record, out_cts, stacked, out_masks):
        if z in back:
            cts.accumulate(back[z], ct, mask)


class _Cotangents(Cotangents):
    """Reverse mode's cotangents and where-masks (`autodiff.Cotangents`) of
    the linear values, each cotangent also broadcast to its value's shape
    (a seed or a loop's cotangent may come smaller)."""

    def accumulate(self, v: Atom, ct: Optional[Atom], mask: Optional[Var]) -> None:
        if ct is not None and self.needs(v) and ct.type.shape != v.type.shape:
            ct = self.b.bind("broadcast_to", ct, shape=v.type.shape)
        super().accumulate(v, ct, mask)
