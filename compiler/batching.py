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
block's; `with_sizes` makes a function's sizes the whole array's).  A loop
on rows runs in each block (a stacked input whose batch axis is axis 1, as
the columns `xs[:, i]` its index reads are stacked, gives each trip the
block's rows; the stack of their cotangents, transposed back, is rows
too).  Values it carries that each trip maps only
linearly, adding sums over the rows (`dw = dw + x.T @ g`: a parameter's
gradient through the loop, a loss summed over steps, a moving average of
means over the rows), are partials: each block's loop starts them from
zero, and what the values they start from make alone is added once,
after the blocks' sums are combined; a value it carries that is the same
in every block is computed by a loop of its own, usable anywhere.  A reshape may
merge each row's leading axes into the batch's (`(batch, seq, d)` to
`(batch * seq, d)`, as `x @ w` does for a batch of sequences): a block's
rows stay together, and its values are then rows of the block's; so may a
reshape keeping axis 0 of a value whose batch axis is axis 1 (an einsum's
operand with the batch merged into its columns, `(k, batch * n)`).  A value reduced
over the batch that is then used row by row (`x - mean(x, axis=0)`), an op
that moves data between rows (a slice of the batch axis, a reshape
moving it off axis 0, `x @ x.T`, a gather or scatter-add along it: `x[p]` for row
indices p, also in a loop's body; a cumulative sum or a concatenation along
it), a loop that
reads a value known only once the blocks are combined or runs a number of
trips computed from the rows, a result a loop computes otherwise from sums over the rows
inside it (a carried sum multiplied by a value of the rows, offset by a
constant, or read by the rows' computation), or a result whose columns
are the rows (`x.T`), raises `GradError` at the op's source line, naming
it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from gradlang.compiler.builder import Builder
from gradlang.compiler.ir import Eqn, Function, Lit, Var, vars_in
from gradlang.compiler.ops import OPS, loop_groups, zeros_like
from gradlang.compiler.pipeline import optimize
from gradlang.compiler.shapes import Sym, evaluate
from gradlang.runtime.errors import GradError, QuotesSource, Span

BATCH = Sym.named("batch")
# why a value reduced over the batch (a partial, or computed from the combined
# ones) cannot be read by a row's computation: its value needs every block
REDUCED_ROW_BY_ROW = "uses a value reduced over the batch row by row"

# what each value is, for the split
CONST = "const"      # the same in every block (from non-batch arguments and n)
ROWS = "rows"        # axis 0 is the batch axis, row i from row i of the batch
COLS = "cols"        # the batch axis is axis 1 (a transposed ROWS value; an einsum's
                     # operand with the batch merged into its columns, (k, batch * n))
PARTIAL = "partial"  # a reduction over the batch axis, per block
AFTER = "after"      # computed from combined partials (and CONSTs)
# what a loop on rows makes, in each block: its ROWS values of each trip stacked
# (the batch axis is axis 1), and values not the same in every block (a sum
# over a block's rows); only a loop may read them.  (Its values the same in
# every block are CONST: a loop of their own computes them, `_projected`.)
STACKED = "stacked"
PER_BLOCK = "per block"
# what a loop makes, at top level, of a value linear in sums over the rows and
# in starts some of which are the same in every block (`_Walk._summed_once`)
SUMMED = "summed"

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
    walk = _Walk({p: ROWS if _batch_axes(p) == [0] else CONST for p in fn.params}, span,
                 top=True)
    walk.run(fn.eqns)
    fn, state = replace(fn, eqns=tuple(walk.eqns)), walk.state
    of = [walk.state_of(a) for a in fn.outputs]
    for a, s in zip(fn.outputs, of):
        if s in (STACKED, PER_BLOCK):
            loop = next(e for e in fn.eqns if a in e.outputs)
            raise _mixes(loop, "gives a result for each block, not row by row (a sum over "
                         "the rows inside the loop, used other than in carried values that "
                         "it only maps linearly)", loop.span or span)
        if s == COLS:  # (a block's result is its rows, concatenated along axis 0)
            made = next(e for e in fn.eqns if a in e.outputs)
            raise _mixes(made, "gives a result whose columns are the rows of the batch (its "
                         "transpose, rows first, decomposes)", span)
    after_eqns = [e for e in fn.eqns if all(state[v] in (AFTER, CONST) for v in e.outputs)
                  and not _checks_rows(e, state)]
    needed = {v for e in after_eqns for v in vars_in(e.inputs) if state[v] == PARTIAL}
    needed |= {a for a, s in zip(fn.outputs, of) if s == PARTIAL}
    partials = [v for e in fn.eqns for v in e.outputs if v in needed]
    row_outputs = tuple(s == ROWS for s in of)
    block = Function(f"{fn.name}_rows", fn.params,
                     tuple(e for e in fn.eqns if any(state[v] != AFTER for v in e.outputs)
                           or _checks_rows(e, state)),
                     tuple(a for a, r in zip(fn.outputs, row_outputs) if r) + tuple(partials))
    fixed = tuple(p for p in fn.params if state[p] == CONST)
    combine = optimize(Function(f"{fn.name}_combine", fixed + tuple(partials),
                                tuple(after_eqns),
                                tuple(a for a, r in zip(fn.outputs, row_outputs) if not r)))
    return RowSplit(block, tuple(walk.kinds[v] for v in partials), combine, row_outputs,
                    _elementwise(fn, state))


def _checks_rows(eqn: Eqn, state: dict[Var, str]) -> bool:
    """Whether `eqn` is a check (no outputs) that runs in the blocks: one
    of values of each block's rows, or of values every block has (a
    function of row results alone may run no `combine`); a check of values
    reduced over the batch runs in `combine`."""
    return not eqn.outputs and not any(state[a] in (AFTER, PARTIAL)
                                       for a in vars_in(eqn.inputs))


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


def _rows(d) -> bool:
    """Whether a size is the batch's rows or a whole number of elements
    each: the batch size times sizes the blocks share (a reshape merging
    each row's leading axis into the batch's, `(batch, seq, d)` to
    `(batch * seq, d)`, keeps a block's rows together and in order; a
    concatenation along the rows, `2*batch`, does not: `_state`)."""
    return isinstance(d, Sym) and d.factors.count(BATCH.factors[0]) == 1


def _layout(v: Var) -> Optional[str]:
    """ROWS or COLS if v is laid out as one (its rows maybe groups of the
    batch's, `_rows`), None if it has no batch axis, "moved" if its batch
    axis is anything else (merged with another axis, repeated, sliced)."""
    axes, shape = _batch_axes(v), v.type.shape
    if not axes:
        return None
    if axes == [0] and _rows(shape[0]):
        return ROWS
    if axes == [1] and _rows(shape[1]):
        return COLS
    return "moved"


def _whole_rows(eqn: Eqn) -> bool:
    """Whether a region op (`slice`, or its VJPs `embed`, `embed_add`)
    takes every batch axis of the array it selects from whole, in order."""
    p = eqn.p
    shape = p["shape"] if eqn.op == "embed" else eqn.inputs[0].type.shape
    return all((p["starts"][k], p["stops"][k], p["steps"][k]) == (0, shape[k], 1)
               for k, d in enumerate(shape) if isinstance(d, Sym) and BATCH.factors[0] in d.factors)


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
    if eqn.op == "transpose" and states == [STACKED] and eqn.p["perm"][0] == 1 \
            and layout == ROWS:  # the trips moved behind the rows: each row's
        return ROWS  # (the cotangent of `x[:, i]` read by a loop's index)
    if {STACKED, PER_BLOCK} & set(states):  # (a loop's; only a loop reads them)
        raise _mixes(eqn, "uses a value that a loop on the rows of the batch computes in "
                     "each block", origin)
    if eqn.op == "iota" and layout is not None:
        raise _mixes(eqn, "numbers the rows of the batch (an arange over its length), and "
                     "a block does not know where its rows start", origin, "arange")
    if AFTER in states or PARTIAL in states:
        if batched or layout:
            raise _mixes(eqn, REDUCED_ROW_BY_ROW, origin)
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
        if eqn.op == "transpose":  # (the batch axis stays, or moves: a matrix transposed)
            fine = states == [layout if eqn.p["perm"][0] == 0 else other]
        elif eqn.op == "matmul" and out.type.rank > 2:  # batched: row by row (the
            # constant side's batch axis 0 is 1, broadcast)
            fine = layout == ROWS and batched <= {ROWS}
        elif eqn.op == "matmul":
            fine = states == ([ROWS, CONST] if layout == ROWS else [CONST, COLS])
        elif eqn.op == "reshape":  # each row's (or column's) elements stay together
            fine = _leading(out) and all(_leading(a) for a in inputs) or (
                layout == COLS and states == [COLS]
                and inputs[0].type.shape[0] == out.type.shape[0])
        elif OPS[eqn.op].kind == "reduction" and len(batched) == 1:  # over other axes: its
            # batch axis moves down by the reduced axes before it (a max over a
            # leading axis of windows stacked before the rows, as max_pool2d's)
            axis, axes = _batch_axes(inputs[0])[0], eqn.p["axes"]
            fine = axis not in axes and _batch_axes(out) == [axis - sum(a < axis for a in axes)]
        elif eqn.op in ("slice", "embed", "embed_add"):  # of other axes: each row's own
            # (`x[::-1]` of the batch axis keeps its size and moves its rows)
            fine = batched <= {layout} and _whole_rows(eqn)
        elif eqn.op == "concatenate":  # along another axis: each row's elements joined
            # (along the batch's, 2*batch rows, a block's rows would be apart)
            fine = batched <= {layout} and eqn.p["axis"] not in _batch_axes(out)
        elif OPS[eqn.op].kind in ("index", "scan"):  # not along the batch axis: a block
            # has its rows (a cumulative sum along it would need the blocks before)
            fine = batched <= {layout} and eqn.p["axis"] not in _batch_axes(eqn.inputs[0])
        else:  # elementwise, broadcasting, reductions over other axes, ...
            fine = batched <= {layout}
        if fine:
            return layout
    raise _mixes(eqn, "moves data between the rows of the batch", origin)


@dataclass(frozen=True)
class Accumulating:
    """The state, in a loop's body, of a value that is a linear map of the
    body's parameters `carries` (carried values that each trip only maps
    linearly, adding sums over the rows: `dw = dw + x.T @ g`, a parameter's
    gradient through the loop, `m = 0.9 * m + 0.1 * mean(x, axis=0)`) and
    of sums over the rows, by factors the same in every block.  Each
    block's loop then sums its own rows, and the blocks' results add up to
    the loop's on all the rows when the values they start from are
    counted once.  Any other use of it (a product with a value not the same
    in every block, a read by the rows' computation) is `_Spoiled`."""
    carries: frozenset  # the body's parameters


class _Spoiled(Exception):
    """An `Accumulating` value used other than linearly."""

    def __init__(self, carries: frozenset):
        super().__init__(carries)
        self.carries = carries


class _Walk:
    """The states of a function's or a loop body's values, equation by
    equation (`run`).  `sums` are the values that are sums over a block's
    rows: partials of kind "sum" and, in a body, linear maps of them
    (`Op.linear`) with factors the same in every block; `summed` those of
    the loops in the body too.  `eqns` are the equations walked,
    rewritten: a loop on rows less the inputs it never reads, its values of
    every block computed by a loop of their own (`_projected`), and (top
    level only) its sums that start from values of every block started
    from zero, what those starts make added once after the blocks' sums
    are combined (`_summed_once`)."""

    def __init__(self, state: dict, span: Optional[Span], top: bool):
        self.state: dict = state
        self.span, self.top = span, top
        self.kinds: dict[Var, str] = {}
        self.origin: dict[Var, Optional[Span]] = {}  # the reduction a reduced value comes from
        self.zeros: set[Var] = set()  # all 0 (a scatter-add into them sums rows)
        self.sums: set[Var] = set()
        self.summed: set[Var] = set()
        self.eqns: list[Eqn] = []

    def state_of(self, a) -> object:
        return self.state.get(a, CONST) if isinstance(a, Var) else CONST

    def run(self, eqns) -> None:
        for eqn in eqns:
            self.walk(eqn)

    def walk(self, eqn: Eqn) -> None:
        inputs = list(vars_in(eqn.inputs))
        states = [self.state[a] for a in inputs]
        if not eqn.outputs:  # a check: where it runs is its inputs' (`_checks_rows`)
            if {ROWS, COLS, STACKED, PER_BLOCK} & set(states) and {AFTER, PARTIAL} & set(states):
                raise _mixes(eqn, REDUCED_ROW_BY_ROW, self.span)
            self.eqns.append(eqn)
            return
        reduced = next((self.origin[a] for a in inputs if a in self.origin), None)
        origin = reduced or self.span
        accumulating = [s for s in states if isinstance(s, Accumulating)]
        added: list[Eqn] = []  # what runs after eqn
        if eqn.op == "loop" and ({ROWS, COLS, STACKED, PER_BLOCK} & set(states)
                                 or accumulating):
            eqn = _projected(eqn, list(range(len(eqn.outputs))))  # the inputs it reads
            out_states, summed_starts = self._loop_states(eqn, origin)
            fixed = [k for k, s in enumerate(out_states) if s == CONST]
            if len(fixed) == len(out_states):
                return self.walk(_projected(eqn, fixed))
            if fixed:  # computed from values of every block alone: by a loop of its own
                added.append(_projected(eqn, fixed))
                eqn = replace(eqn, outputs=tuple(Var(v.type, v.hint) if k in fixed else v
                                                 for k, v in enumerate(eqn.outputs)))
            if SUMMED in out_states:
                eqn, out_states, summed = self._summed_once(eqn, out_states, summed_starts)
                added += summed
        elif accumulating:
            carries = frozenset().union(*(s.carries for s in accumulating))
            if _layout(eqn.out) is not None or not self._linear(eqn, self._linear_value):
                raise _Spoiled(carries)
            out_states = [Accumulating(carries)]
        else:
            into_zeros = bool(eqn.inputs) and eqn.inputs[0] in self.zeros
            out_states = [_state(eqn, inputs, states, origin, into_zeros)] * len(eqn.outputs)
        if eqn.op == "full" and eqn.p["value"] == 0:
            self.zeros.add(eqn.out)
        for v, out_state in zip(eqn.outputs, out_states):
            self.state[v] = out_state
            if out_state == PARTIAL:
                self.kinds[v] = "sum" if eqn.op == "loop" else _KIND[eqn.op]
                self.origin[v] = eqn.span or reduced
                if self.kinds[v] == "sum":
                    self.sums.add(v)
            elif out_state == AFTER:
                self.origin[v] = reduced
        if not self.top and eqn.op != "loop" and not accumulating \
                and self._linear(eqn, lambda a: a in self.sums or self._zero(a)):
            self.sums.update(eqn.outputs)
        self.eqns.append(eqn)
        self.run(added)

    def _zero(self, a) -> bool:
        return a in self.zeros if isinstance(a, Var) else a.value == 0

    def _linear_value(self, a) -> bool:
        """Whether a is linear in accumulating values and sums over the rows."""
        return isinstance(self.state_of(a), Accumulating) or a in self.sums or self._zero(a)

    def _linear(self, eqn: Eqn, linear) -> bool:
        """Whether eqn's output is a linear map (`Op.linear`) of inputs for
        which `linear` holds, not all zero, its other inputs (and indices)
        the same in every block."""
        op = OPS[eqn.op]
        if eqn.op == "cast" and not eqn.out.type.is_float:
            return False  # a float's truncation is not linear
        domains = op.domain if isinstance(op.domain, tuple) else (op.domain,) * len(eqn.inputs)
        for slot in op.linear_slots(len(eqn.inputs)):
            mapped = [a for i, a in enumerate(eqn.inputs) if i in slot and domains[i] != "index"]
            held = [a for i, a in enumerate(eqn.inputs) if i not in slot or domains[i] == "index"]
            if mapped and all(map(linear, mapped)) and not all(map(self._zero, mapped)) \
                    and all(self.state_of(a) == CONST for a in held):
                return True
        return False

    def _loop_states(self, loop: Eqn, origin: Optional[Span]) -> tuple[list, set[int]]:
        """The states of the outputs of `loop`, some of whose inputs are of
        the batch: each block runs the loop on its rows, so the body must
        keep the rows apart (a gather of rows, a value reduced over the rows
        then used row by row: `GradError` at that op).  What a trip sums
        over the rows is each block's own: mapped linearly into carried
        values that are themselves only mapped linearly, the loop's results
        (carried or stacked) are linear in the sums and the values those
        start from: PARTIAL when they start from zero or from sums,
        SUMMED when some start from a value of every block (at top level),
        `Accumulating` when from an outer loop's accumulating values;
        otherwise PER_BLOCK (an error where it is used).  Returns the
        states, and the indices of the carried values starting from values
        of every block."""
        body, n_carry = loop.p["body"], loop.p["n_carry"]
        bounds, starts, inv, xs = loop_groups(list(loop.inputs), loop.p)
        carry = [self.state_of(a) for a in starts]
        inv, xs = [self.state_of(a) for a in inv], [self.state_of(a) for a in xs]
        for s in map(self.state_of, bounds):
            if isinstance(s, Accumulating):
                raise _Spoiled(s.carries)
            if s != CONST:  # each block would run its own number of trips
                raise _mixes(loop, "runs a number of trips computed from the rows of the "
                             "batch", origin)
        # (a stacked input of COLS, its trips first, gives each trip the rows:
        # as a loop's STACKED results do; `x[:, i]` by the loop's index reads so)
        if ROWS in xs or STACKED in carry + inv:  # a trip per row of the batch
            raise _mixes(loop, "loops over the rows of the batch", origin)
        if self.top and AFTER in carry + inv + xs:  # (in a body: a value of the block's)
            raise _mixes(loop, "reads a value computed from sums or maxima over all the "
                         "rows, in each block", origin)
        for s in inv + xs:
            if isinstance(s, Accumulating):
                raise _Spoiled(s.carries)
        starts_as = {k: how for k, a in enumerate(starts)
                     if (how := self._sum_start(a, carry[k])) is not None}
        params = body.params[1:1 + n_carry]
        while True:
            try:
                walk, results, entered = _body_states(loop, carry, inv, xs, set(starts_as),
                                                      loop.span or origin)
            except _Spoiled as spoiled:
                bad = [k for k in starts_as if params[k] in spoiled.carries]
                if not bad:  # an outer loop's
                    raise
            else:
                bad = [k for k in starts_as if not walk._linear_value(body.outputs[k])]
                if not bad:
                    break
            for k in bad:  # taken as any other carried value
                if isinstance(carry[k], Accumulating):
                    raise _Spoiled(carry[k].carries)
                del starts_as[k]
        self.summed |= walk.sums | walk.summed

        def read(state) -> set[int]:
            return {params.index(p) for p in state.carries} \
                if isinstance(state, Accumulating) else set()

        reads = {k: read(results[k]) for k in starts_as}
        made = []
        for j, (a, s) in enumerate(zip(body.outputs, results)):
            if j in starts_as or j >= n_carry and (isinstance(s, Accumulating)
                                                    or walk._linear_value(a)):
                # the starts it depends on, over any number of trips (none: its own)
                ks = ({j} if j < n_carry else set()) | read(s)
                while more := set().union(*(reads[k] for k in ks)) - ks:
                    ks |= more
                sources = [starts_as[k] for k in ks]
                outer = [c for c in sources if isinstance(c, Accumulating)]
                made.append(Accumulating(frozenset().union(*(c.carries for c in outer)))
                            if outer else SUMMED if SUMMED in sources else PARTIAL)
            elif j < n_carry:  # (a value the body makes the same in every block is its
                made.append(_made(AFTER if entered[j] == AFTER else s))  # start, no trip)
            else:  # stacked by trip
                made.append({ROWS: STACKED, CONST: CONST}.get(s, PER_BLOCK))
        return made, {k for k, how in starts_as.items() if how == SUMMED}

    def _sum_start(self, start, state) -> Optional[object]:
        """How a carried value starting from `start` (of `state`) can start
        a sum over the rows, if it can (else None): from an outer loop's
        accumulating value (that state), zero or sums (PARTIAL), a value of
        every block (SUMMED, at top level)."""
        if isinstance(state, Accumulating):
            return state
        if isinstance(start, Var) and start in self.sums or state == CONST and self._zero(start):
            return PARTIAL
        return SUMMED if state == CONST and self.top else None

    def _summed_once(self, loop: Eqn, out_states: list, starts: set[int]
                     ) -> tuple[Eqn, list, list[Eqn]]:
        """`loop` made to start the carried values at `starts` from zero:
        each block's loop then gives its rows' part of its SUMMED results
        (PARTIALs).  What those starts make alone, with every sum over the
        rows zero (a loop of its own, of values of every block), is added
        once to the combined parts: counted once, not once a block."""
        b = Builder()
        inputs, outputs = list(loop.inputs), list(loop.outputs)
        for k in starts:
            inputs[3 + k] = zeros_like(b, loop.inputs[3 + k].type)
        alone = list(loop.inputs)
        for k, start in enumerate(loop_groups(loop.inputs, loop.p)[1]):
            if isinstance(start, Var) and start in self.sums:  # in the blocks' parts
                alone[3 + k] = zeros_like(b, start.type)
        summed = [j for j, s in enumerate(out_states) if s == SUMMED]
        alone_outputs = tuple(Var(v.type, v.hint) for v in loop.outputs)
        added = [_projected(_with_body(replace(loop, inputs=tuple(alone), outputs=alone_outputs),
                                       _without(loop.p["body"], self.summed)), summed)]
        for j in summed:
            outputs[j] = Var(outputs[j].type, outputs[j].hint)
            added.append(Eqn("add", (alone_outputs[j], outputs[j]), (loop.outputs[j],), (),
                             loop.span))
            out_states[j] = PARTIAL
        self.run(b.eqns)
        return replace(loop, inputs=tuple(inputs), outputs=tuple(outputs)), out_states, added


def _without(fn: Function, sums: set) -> Function:
    """fn with each of its values in `sums` (and in its loops' bodies) zero."""
    eqns = []
    for eqn in fn.eqns:
        if eqn.op == "loop":
            eqn = _with_body(eqn, _without(eqn.p["body"], sums))
        zeroed = [v for v in eqn.outputs if v in sums]
        if len(zeroed) < len(eqn.outputs):  # (a loop's other outputs)
            eqns.append(replace(eqn, outputs=tuple(Var(v.type, v.hint) if v in sums else v
                                                   for v in eqn.outputs)))
        eqns += [Eqn("full", (), (v,), (("dtype", v.type.dtype), ("shape", v.type.shape),
                                         ("value", 0)), eqn.span) for v in zeroed]
    return replace(fn, eqns=tuple(eqns))


def _with_body(loop: Eqn, body: Function) -> Eqn:
    return replace(loop, params=tuple(sorted({**loop.p, "body": body}.items())))


def _projected(loop: Eqn, keep: list[int]) -> Eqn:
    """The loop computing `loop`'s outputs at `keep` (and the carried values
    they depend on) and nothing else, from the inputs they read (of all its
    outputs: `loop` less the invariants and stacked inputs it never reads)."""
    body, n_carry, n_inv = loop.p["body"], loop.p["n_carry"], loop.p["n_inv"]
    carried = {k for k in keep if k < n_carry}
    while True:  # until the kept carried values depend on no others
        kept = sorted(carried) + [k for k in keep if k >= n_carry]
        sliced = _sliced(body, [body.outputs[k] for k in kept])
        read = {a for e in sliced.eqns for a in vars_in(e.inputs)} | set(
            vars_in(sliced.outputs))
        more = {k for k in range(n_carry) if body.params[1 + k] in read} - carried
        if not more:
            break
        carried |= more
    used = [0] + [i for i in range(1, len(body.params))
                  if body.params[i] in read or i - 1 in carried]
    bounds, _, _, _ = loop_groups(loop.inputs, loop.p)
    inputs = bounds + tuple(loop.inputs[2 + i] for i in used[1:])
    outputs = tuple(loop.outputs[k] if k in keep else Var(loop.outputs[k].type)
                    for k in kept)
    params = {**loop.p, "n_carry": len(carried),
              "n_inv": sum(1 + n_carry <= i < 1 + n_carry + n_inv for i in used)}
    return _with_body(replace(loop, inputs=inputs, outputs=outputs,
                              params=tuple(sorted(params.items()))),
                      replace(sliced, params=tuple(body.params[i] for i in used)))


def _sliced(fn: Function, outputs: list) -> Function:
    """fn computing `outputs` and nothing else: its equations they need,
    each loop among them `_projected` on the outputs they read."""
    live = set(vars_in(outputs))
    kept = []
    for eqn in reversed(fn.eqns):
        read = [k for k, v in enumerate(eqn.outputs) if v in live]
        if read:
            kept.append(_projected(eqn, read) if eqn.op == "loop" else eqn)
            live.update(vars_in(kept[-1].inputs))
    return replace(fn, eqns=tuple(reversed(kept)), outputs=tuple(outputs))


def _body_states(loop: Eqn, carry: list, inv: list, xs: list, accumulating: set[int],
                 origin: Optional[Span]) -> tuple["_Walk", list, list]:
    """The walk of `loop`'s body and the states of its results, its carried
    values starting from states `carry` (those at `accumulating` each
    `Accumulating` in itself), and its invariants and stacked inputs of
    states `inv` and `xs`: iterated until the carried values come back in
    the states they entered with; and those states."""
    body, n_carry = loop.p["body"], loop.p["n_carry"]
    params = body.params[1:1 + n_carry]
    slices = [ROWS if s in (STACKED, COLS) else _in_body(s) for s in xs]
    carried = [Accumulating(frozenset([params[k]])) if k in accumulating else _in_body(s)
               for k, s in enumerate(carry)]
    while True:
        walk = _Walk(dict(zip(body.params, [CONST] + carried + [_in_body(s) for s in inv]
                              + slices)), origin, top=False)
        walk.run(body.eqns)
        results = [walk.state_of(a) for a in body.outputs]
        for k, s in enumerate(results[:n_carry]):  # kept in a value that is not a sum
            if isinstance(s, Accumulating) and k not in accumulating:
                raise _Spoiled(s.carries)
        back = [c if isinstance(c, Accumulating) or AFTER not in (_in_body(_made(s)), c)
                else AFTER for s, c in zip(results[:n_carry], carried)]
        if back == carried:
            return walk, results, carried
        carried = back


def _in_body(state: str) -> str:
    """How a loop's body sees an input of this state: a value that is not
    the same in every block as if reduced over the batch (AFTER)."""
    return {ROWS: ROWS, COLS: COLS, CONST: CONST}.get(state, AFTER)


def _made(state: str) -> str:
    """What a loop on rows makes of a result of its body of this state."""
    return {ROWS: ROWS, COLS: COLS, CONST: CONST}.get(state, PER_BLOCK)


def _mixes(eqn: Eqn, why: str, origin: Optional[Span], name: str = "") -> GradError:
    """The error for eqn, which does not decompose, naming it as the
    source wrote it (`QuotesSource`); else as `name` (what the source
    calls eqn's op), the loop, or "an operation" (the IR's name for it is
    no user's: `sub`, and `broadcast_to` in the gradient of a mean)."""
    unquoted = f"`{name}`" if name else "the loop" if eqn.op == "loop" else "an operation"
    rest = (f"{why}, so this function does not decompose over the rows of its Dask "
            "arguments; call it on in-memory arrays (compute them first)")
    if eqn.span is None:  # (`origin`'s text is another operation's, or the `def`'s)
        return GradError(f"{unquoted} {rest}", origin)
    return QuotesSource(unquoted, rest, eqn.span)


def with_sizes(fn: Function, sizes: dict[str, int],
               done: Optional[dict[int, tuple[Function, Function]]] = None) -> Function:
    """fn with every size computed from the symbols `sizes` binds (`dim`:
    a mean's count) a literal of the whole array's, not a block's; in the
    functions its equations carry too (a loop's body, a grad block's).
    `done` (by id, with the function, so its id stays its own): those
    rewritten so far, as a program holds one function in several places (a
    call's stages, shared by the calls alike: rewriting each place afresh
    took 2**n for a chain of n blocks each taking the previous grad)."""
    done = {} if done is None else done
    if id(fn) in done:
        return done[id(fn)][1]
    subst: dict[Var, Lit] = {}
    eqns = []
    for eqn in fn.eqns:
        value = eqn.p.get("value") if eqn.op == "dim" else None
        if isinstance(value, Sym) and any(f in sizes for f in value.factors):
            subst[eqn.out] = Lit(evaluate(value, sizes), eqn.out.type)
            if eqn.p.get("nonzero") and subst[eqn.out].value == 0:  # (`0.1 / n`)
                raise GradError("compile-time arithmetic failed: division by zero", eqn.span)
            continue
        params = tuple((k, with_sizes(v, sizes, done) if isinstance(v, Function) else v)
                       for k, v in eqn.params)
        eqns.append(replace(eqn, params=params,
                            inputs=tuple(subst.get(a, a) if isinstance(a, Var) else a
                                         for a in eqn.inputs)))
    outputs = tuple(subst.get(a, a) if isinstance(a, Var) else a for a in fn.outputs)
    done[id(fn)] = (fn, replace(fn, eqns=tuple(eqns), outputs=outputs))
    return done[id(fn)][1]
