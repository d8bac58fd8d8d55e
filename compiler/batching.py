"""Whether a function decomposes over the rows of its batch arguments, and
how: the split a data-parallel runner (`dsl.dask_bridge`) needs.

Contract: `split_rows(fn, n)` takes a function lowered with the symbol
`BATCH` as axis 0 of its batch parameters (and nowhere else), for a batch
of `n` rows, and returns a `RowSplit`:

- `block`: a function of fn's parameters, run on each block of rows, whose
  outputs are fn's row-wise outputs (row i depends only on row i of the
  batch arguments) and then the block's *partials*: reductions over the
  batch axis of row-wise values (`reduce_sum`, `reduce_max`, a matmul
  contracting the batch axis, `x.T @ y`, a sum over rows, and a
  scatter-add of rows into zeros, as `segment_sum` and an embedding's
  gradient make: a sum over rows of each row placed by its index);
- `partial_kinds`: how blocks' partials combine ("sum" or "max"), in any
  order (a tree);
- `combine`: a function of fn's non-batch parameters and then the combined
  partials that computes fn's other outputs (a mean is a sum divided by n);
- `row_outputs`: for each of fn's outputs, whether it is row-wise (taken
  from `block`, concatenated over blocks) or not (from `combine`);
- `elementwise`: whether fn is elementwise over its batch arguments (all of
  one shape, and every value of that shape, or a scalar, computed by
  elementwise ops), so that any block of any chunking, not only of rows,
  runs on its own.

The batch size is `n` everywhere (a mean divides by all the rows, not a
block's; `with_sizes` makes a function's sizes the whole array's).  A
value reduced over the batch that is then used row by row (`x - mean(x,
axis=0)`), an op that moves data between rows (a slice of the batch axis,
a reshape merging it, `x @ x.T`, a gather or scatter-add along it: `x[p]`
for row indices p, also in a loop's body), or a result a loop sums over
the rows inside it, raises `GradError` at the op's source
line, naming it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from gradlang.compiler.ir import Eqn, Function, Lit, Var, vars_in
from gradlang.compiler.ops import OPS, loop_groups
from gradlang.compiler.pipeline import optimize
from gradlang.compiler.shapes import Sym, evaluate
from gradlang.runtime.errors import GradError, Span

BATCH = Sym.named("batch")

# what each value is, for the split
CONST = "const"      # the same in every block (from non-batch arguments and n)
ROWS = "rows"        # axis 0 is the batch axis, row i from row i of the batch
COLS = "cols"        # a transposed rank-2 ROWS value: the batch axis is axis 1
PARTIAL = "partial"  # a reduction over the batch axis, per block
AFTER = "after"      # computed from combined partials (and CONSTs)
# what a loop on rows makes, in each block: its ROWS values of each trip stacked
# (the batch axis is axis 1), values the same in every block, and values that
# are not (a sum over a block's rows); only a loop may read them
STACKED = "stacked"
BLOCK = "block"
PER_BLOCK = "per block"

_KIND = {"reduce_sum": "sum", "reduce_max": "max", "matmul": "sum", "scatter_add": "sum"}


@dataclass(frozen=True)
class RowSplit:
    block: Function
    partial_kinds: tuple[str, ...]
    combine: Function
    row_outputs: tuple[bool, ...]
    elementwise: bool


def split_rows(fn: Function, n: int, span: Optional[Span] = None) -> RowSplit:
    fn = optimize(with_sizes(fn, {BATCH.factors[0]: n}))
    state: dict[Var, str] = {p: ROWS if _batch_axes(p) == [0] else CONST for p in fn.params}
    kinds: dict[Var, str] = {}
    origin: dict[Var, Optional[Span]] = {}  # the reduction a reduced value comes from
    zeros: set[Var] = set()  # values that are all 0 (a scatter-add into one sums rows)
    for eqn in fn.eqns:
        inputs = list(vars_in(eqn.inputs))
        reduced = next((origin[a] for a in inputs if a in origin), None)
        if eqn.op == "full" and eqn.p["value"] == 0:
            zeros.add(eqn.outputs[0])
        out_states = _states(eqn, inputs, [state[a] for a in inputs], reduced or span,
                             into_zeros=bool(eqn.inputs) and eqn.inputs[0] in zeros)
        for v, out_state in zip(eqn.outputs, out_states):
            state[v] = out_state
            if out_state == PARTIAL:
                kinds[v] = _KIND[eqn.op]
                origin[v] = eqn.span or reduced
            elif out_state == AFTER:
                origin[v] = reduced
    of = [state.get(a, CONST) if isinstance(a, Var) else CONST for a in fn.outputs]
    for a, s in zip(fn.outputs, of):
        if s in (STACKED, BLOCK, PER_BLOCK):
            loop = next(e for e in fn.eqns if a in e.outputs)
            raise _mixes(loop, "gives a result for each block, not row by row (a sum over "
                         "the rows inside a loop: a parameter's gradient through it)",
                         loop.span or span)
    after_eqns = [e for e in fn.eqns if state[e.outputs[0]] in (AFTER, CONST)]
    needed = {v for e in after_eqns for v in vars_in(e.inputs) if state[v] == PARTIAL}
    needed |= {a for a, s in zip(fn.outputs, of) if s == PARTIAL}
    partials = [v for e in fn.eqns for v in e.outputs if v in needed]
    row_outputs = tuple(s == ROWS for s in of)
    block = Function(f"{fn.name}_rows", fn.params,
                     tuple(e for e in fn.eqns if state[e.outputs[0]] != AFTER),
                     tuple(a for a, r in zip(fn.outputs, row_outputs) if r) + tuple(partials))
    fixed = tuple(p for p in fn.params if state[p] == CONST)
    combine = optimize(Function(f"{fn.name}_combine", fixed + tuple(partials),
                                tuple(after_eqns),
                                tuple(a for a, r in zip(fn.outputs, row_outputs) if not r)))
    return RowSplit(block, tuple(kinds[v] for v in partials), combine, row_outputs,
                    _elementwise(fn, state))


def _elementwise(fn: Function, state: dict[Var, str]) -> bool:
    shapes = {p.type.shape for p in fn.params if state[p] == ROWS}
    if len(shapes) != 1:
        return False
    (shape,) = shapes
    return all(v.type.shape in (shape, ()) for e in fn.eqns for v in e.outputs) \
        and all(OPS[e.op].kind == "elementwise" for e in fn.eqns) \
        and all(isinstance(a, Var) and a.type.shape == shape for a in fn.outputs)


def _batch_axes(v: Var) -> list[int]:
    """The axes of v whose size involves the batch size."""
    return [i for i, d in enumerate(v.type.shape)
            if isinstance(d, Sym) and BATCH.factors[0] in d.factors]


def _layout(v: Var) -> Optional[str]:
    """ROWS or COLS if v is laid out as one, None if it has no batch axis,
    "moved" if its batch axis is anything else (merged, repeated, sliced)."""
    axes, shape = _batch_axes(v), v.type.shape
    if not axes:
        return None
    if axes == [0] and shape[0] == BATCH:
        return ROWS
    if axes == [1] and len(shape) == 2 and shape[1] == BATCH:
        return COLS
    return "moved"


def _leading(v: Var) -> bool:
    """Whether only size-1 axes precede v's batch axis (so that a reshape
    keeps each row's elements together and in order)."""
    axis = _batch_axes(v)[0]
    return all(d == 1 for d in v.type.shape[:axis])


def _state(eqn: Eqn, inputs: list, states: list[str], origin: Optional[Span],
           into_zeros: bool = False) -> str:
    out = eqn.outputs[0]
    layout = _layout(out)
    batched = {s for s in states if s in (ROWS, COLS)}
    if {STACKED, BLOCK, PER_BLOCK} & set(states):  # (a loop's; only a loop reads them)
        raise _mixes(eqn, "uses a value that a loop on the rows of the batch computes in "
                     "each block", origin)
    if AFTER in states or PARTIAL in states:
        if batched or layout:
            raise _mixes(eqn, "uses a value reduced over the batch row by row", origin)
        return AFTER
    if layout is None:
        if not batched:
            return CONST
        if eqn.op in _KIND and eqn.op != "matmul" and states == [ROWS] \
                and 0 in eqn.p["axes"]:
            return PARTIAL
        if eqn.op in _KIND and eqn.op != "matmul" and states == [COLS] \
                and 1 in eqn.p["axes"]:
            return PARTIAL
        if eqn.op == "matmul" and states == [COLS, ROWS]:
            return PARTIAL
        if eqn.op == "scatter_add" and into_zeros and eqn.p["axis"] == 0 \
                and states == [CONST, ROWS, ROWS]:
            return PARTIAL  # each block's rows placed into zeros: blocks sum
        raise _mixes(eqn, "combines the rows of the batch other than by a sum or a max "
                     "over them", origin)
    if layout != "moved":
        other = COLS if layout == ROWS else ROWS
        if eqn.op == "transpose":
            fine = states == [other]
        elif eqn.op == "matmul":
            fine = states == ([ROWS, CONST] if layout == ROWS else [CONST, COLS])
        elif eqn.op == "reshape":
            fine = _leading(out) and all(_leading(a) for a in inputs)
        elif OPS[eqn.op].kind == "index":  # not along the batch axis: a block has its rows
            fine = batched <= {layout} and eqn.p["axis"] not in _batch_axes(eqn.inputs[0])
        else:  # elementwise, broadcasting, reductions over other axes, ...
            fine = batched <= {layout}
        if fine:
            return layout
    raise _mixes(eqn, "moves data between the rows of the batch", origin)


def _states(eqn: Eqn, inputs: list, states: list[str], origin: Optional[Span],
            into_zeros: bool = False) -> list[str]:
    """The state of each of eqn's outputs (`_state`; a loop's each its own)."""
    if eqn.op == "loop" and {ROWS, COLS, STACKED, BLOCK, PER_BLOCK} & set(states):
        return _loop_states(eqn, states, origin)
    return [_state(eqn, inputs, states, origin, into_zeros)] * len(eqn.outputs)


def _in_body(state: str) -> str:
    """How a loop's body sees an input of this state: a value that is not
    the same in every block as if reduced over the batch (AFTER)."""
    return {ROWS: ROWS, COLS: COLS, CONST: CONST, BLOCK: CONST}.get(state, AFTER)


def _made(state: str) -> str:
    """What a loop on rows makes of a result of its body of this state."""
    return {ROWS: ROWS, COLS: COLS, CONST: BLOCK, BLOCK: BLOCK}.get(state, PER_BLOCK)


def _loop_states(loop: Eqn, states: list[str], origin: Optional[Span]) -> list[str]:
    """The states of the outputs of `loop`, whose Var inputs have `states`
    (some of the batch): each block runs the loop on its rows, so the body
    must keep the rows apart (a gather of rows, a value reduced over the
    rows then used row by row: `GradError` at that op), and what the loop
    reduces over the rows is each block's own (PER_BLOCK: an error where it
    is used; a gradient's loop accumulates such sums for the parameters)."""
    in_states = iter(states)
    body, n_carry = loop.p["body"], loop.p["n_carry"]
    _, carry, inv, xs = loop_groups([next(in_states) if isinstance(a, Var) else CONST
                                     for a in loop.inputs], loop.p)
    if {ROWS, COLS} & set(xs) or STACKED in carry + inv:  # a trip per row of the batch
        raise _mixes(loop, "loops over the rows of the batch", origin)
    slices = [ROWS if s == STACKED else _in_body(s) for s in xs]
    carried = [_in_body(s) for s in carry]
    while True:  # until the carried values' states are those they come back with
        state = dict(zip(body.params, [CONST] + carried + [_in_body(s) for s in inv] + slices))
        for eqn in body.eqns:
            inputs = list(vars_in(eqn.inputs))
            state.update(zip(eqn.outputs, _states(eqn, inputs, [state[a] for a in inputs],
                                                  eqn.span or origin)))
        results = [state.get(a, CONST) if isinstance(a, Var) else CONST for a in body.outputs]
        back = [AFTER if AFTER in (_in_body(_made(s)), c) else c
                for s, c in zip(results[:n_carry], carried)]
        if back == carried:
            break
        carried = back
    made = [_made(s) for s in results[:n_carry]]
    for s in results[n_carry:]:  # stacked by trip
        made.append({ROWS: STACKED, CONST: BLOCK}.get(s, PER_BLOCK))
    return made


def _mixes(eqn: Eqn, why: str, origin: Optional[Span]) -> GradError:
    return GradError(f"`{eqn.op}` {why}, so this function does not decompose over the "
                    "rows of its Dask arguments; call it on in-memory arrays "
                    "(compute them first)", eqn.span or origin)


def with_sizes(fn: Function, sizes: dict[str, int]) -> Function:
    """fn with every size computed from the symbols `sizes` binds (`dim`:
    a mean's count) a literal of the whole array's, not a block's."""
    subst: dict[Var, Lit] = {}
    eqns = []
    for eqn in fn.eqns:
        value = eqn.p.get("value") if eqn.op == "dim" else None
        if isinstance(value, Sym) and any(f in sizes for f in value.factors):
            subst[eqn.out] = Lit(evaluate(value, sizes), eqn.out.type)
            continue
        eqns.append(replace(eqn, inputs=tuple(subst.get(a, a) if isinstance(a, Var) else a
                                              for a in eqn.inputs)))
    outputs = tuple(subst.get(a, a) if isinstance(a, Var) else a for a in fn.outputs)
    return replace(fn, eqns=tuple(eqns), outputs=outputs)
