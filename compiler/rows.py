"""Row loops: reductions along a row and the elementwise work on the same rows, in one pass per row.

Contract: `fuse_rows(steps, fn)` takes `fusion.fuse`'s steps and returns
them with some runs replaced by `RowLoop`s.  A row loop runs over the rows
of an element shape S (its leading axes; a row is S's trailing axes, one
contiguous run of the flat array): for each row in turn, one or more
passes over the row's elements, each pass ending in float sums and maxes
along the row (`reduce_sum`, `reduce_max` over S's trailing axes), then
the per-row scalar work that reads them (the row-shaped loops: values of
shape rows + (1, ...)), then the next pass, which reads those row values
as scalars.  So a softmax's max, its exp and sum, and its normalisation run
in three passes over a row that stays in cache, where they were five steps
over whole arrays (a loop, `R.reduce_max`, a loop, `R.reduce_sum`, a
loop).  Nothing is special to softmax: any run of such steps (log_softmax,
a cross-entropy, a layer norm's mean and variance, a softmax's gradient
`p * (g - sum(p * g))`) forms one.

A value of an earlier pass that a later one reads is computed again there
when that takes arithmetic only (a few ops, `RECOMPUTE_LENGTH`), else
stored in its own pass and read back (from cache) in the later one: into
the kernel's scratch for a block of rows (`RowLoop.spilled`), or, for a
value the steps after the row loop read, which is always stored, into its
array.

Grouping is greedy, as `fusion.fuse`'s: from a loop of shape S (or a
reduction of an S-shaped value), later steps join while everything they
read from outside existed before the group's first step, which is where
the row loop runs; row-shaped work after the last pass is left out (as a
loop of its own it vectorizes across rows, where here it would run once
per row).  A sum over the row's axes and leading ones next to them (a
loss's total, `sum(softmax(x) * w)`) joins too: the row loop sums each
row, and the sum of those row sums over the axes left is a step after it;
nothing in the group reads that total.  A group is kept only when it
replaces two or more steps.
CPU only (`fuse(reductions=True)`): CUDA runs the steps as they were.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from gradlang.compiler.ir import Eqn, TensorType, Var
from gradlang.compiler.ops import OPS
from gradlang.compiler.shapes import access_kind, broadcast_runs

# A later pass computes an earlier pass's value again when its chain is
# at most this many equations, all of cost 0 (arithmetic); else it is
# stored and read back.  (exp costs 16: an array read from cache is cheaper.)
RECOMPUTE_LENGTH = 8
# How many steps that cannot join a group its growth looks past.
LOOKAHEAD = 8
# The most equations a row loop holds (as fusion.MAX_LOOP_EQNS: Numba's
# compile time grows superlinearly in a kernel's length).
MAX_ROW_EQNS = 1000


@dataclass
class Pass:
    """One pass over a row: `before`, row-scalar equations first (their
    inputs are the previous passes' reductions), then `eqns` per element
    (recomputations of earlier passes' values included), `reads_back`
    values of earlier passes read from their arrays, and `reductions` along
    the row."""
    before: list[Eqn] = field(default_factory=list)
    eqns: list[Eqn] = field(default_factory=list)
    reads_back: list[Var] = field(default_factory=list)
    reductions: list[Eqn] = field(default_factory=list)


@dataclass
class RowLoop:
    shape: tuple  # the element shape S
    rows: tuple  # S's leading axes: one value per row has this many elements
    passes: list[Pass]
    after: list[Eqn]  # row-scalar equations after the last pass
    inputs: list[Var] = field(default_factory=list)
    outputs: list[Var] = field(default_factory=list)  # stored: read outside the loop
    # stored only for a later pass to read back: the kernel's own scratch,
    # a block of rows long
    spilled: list[Var] = field(default_factory=list)
    empty_checks: list[Eqn] = field(default_factory=list)  # maxes with no value for an empty row

    @property
    def element_eqns(self) -> list[Eqn]:
        return [e for p in self.passes for e in p.eqns + p.reductions]


def _is_row_shaped(shape: tuple, rows: tuple) -> bool:
    return tuple(shape[:len(rows)]) == rows and all(d == 1 for d in shape[len(rows):])


def _trailing(axes, rank: int) -> Optional[int]:
    """How many trailing axes `axes` are (None if not all trailing, or all)."""
    axes = tuple(axes)
    if axes and axes == tuple(range(rank - len(axes), rank)) and len(axes) < rank:
        return len(axes)
    return None


def _is_reduction(eqn: Eqn) -> bool:
    return eqn.op in ("reduce_sum", "reduce_max") and eqn.inputs[0].type.is_float


def _outputs(step) -> list[Var]:
    if isinstance(step, Eqn):
        return list(step.outputs)
    return [o for e in step.eqns + step.reductions for o in e.outputs]


def _reads(step) -> set[Var]:
    if isinstance(step, Eqn):
        return {a for a in step.inputs if isinstance(a, Var)}
    return set(step.inputs)


class _Group:
    """A group being grown: its element shape, row axes (once a reduction
    fixes them), the values its members produce and their equations' count."""

    def __init__(self, shape: tuple):
        self.shape = shape
        self.k: Optional[int] = None  # trailing axes per row
        self.element: set[Var] = set()
        self.row: set[Var] = set()
        self.totals: set[Var] = set()  # sums a step after the row loop ends (`splits`)
        self.eqns = 0

    @property
    def rows(self) -> tuple:
        return tuple(self.shape[:len(self.shape) - self.k])

    def fix_axes(self, axes) -> bool:
        k = _trailing(axes, len(self.shape))
        if k is None or (self.k is not None and k != self.k):
            return False
        self.k = k
        return True

    def splits(self, reduction: Eqn) -> bool:
        """Whether `reduction`, of an element-shaped value, sums over the
        row's axes and leading ones next to them (a loss's total): the
        row loop sums each row, and a sum of the row sums follows it
        (`_split`)."""
        axes, rank = tuple(reduction.p["axes"]), len(self.shape)
        return (reduction.op == "reduce_sum" and self.k is not None and len(axes) > self.k
                and axes == tuple(range(rank - len(axes), rank)))

    def element_reads_ok(self, inputs) -> bool:
        for v in inputs:
            if v in self.element:
                continue
            if v in self.row:
                if tuple(v.type.shape) != self.rows + (1,) * self.k:
                    return False  # broadcast from the right: not one value per row
            elif access_kind(v.type.shape, self.shape) == "general" and not broadcast_runs(
                    v.type.shape, self.shape):
                return False  # (a broadcast along runs of the axes is read per run)
        return True

    def classify(self, step) -> Optional[str]:
        """'element', 'row' or 'reduction' if `step` can join, else None
        (fixing the row axes where it is the first reduction)."""
        if _reads(step) & self.totals:
            return None  # (they exist only after the row loop)
        if not isinstance(step, Eqn):  # a fused loop (`fusion.Loop`)
            if step.stand_ins:
                return None
            if tuple(step.shape) == self.shape:
                if any(not self.fix_axes(r.p["axes"]) and not self.splits(r)
                       for r in step.reductions):
                    return None
                return "element" if self.element_reads_ok(step.inputs) else None
            if self.k is None or not _is_row_shaped(step.shape, self.rows):
                return None
            if any(v in self.element or (v not in self.row and access_kind(
                    v.type.shape, tuple(step.shape)) not in ("full", "scalar"))
                   for v in step.inputs):
                return None
            if any(step.shape[a] != 1 for r in step.reductions for a in r.p["axes"]):
                return None
            return "row"
        if step.op == "reshape" and step.inputs[0] in self.row and self.k is not None \
                and _is_row_shaped(step.outputs[0].type.shape, self.rows):
            return "row"
        if not _is_reduction(step):
            return None
        (x,) = step.inputs
        if x in self.row and all(x.type.shape[a] == 1 for a in step.p["axes"]):
            return "row"  # over axes of one element: the value itself
        if tuple(x.type.shape) != self.shape or x in self.row:
            return None
        return "reduction" if self.fix_axes(step.p["axes"]) or self.splits(step) else None


def _start(step) -> Optional[_Group]:
    if not isinstance(step, Eqn) and len(step.shape) >= 2 and not step.stand_ins:
        group = _Group(tuple(step.shape))
    elif isinstance(step, Eqn) and _is_reduction(step) and step.inputs[0].type.rank >= 2:
        group = _Group(tuple(step.inputs[0].type.shape))
    else:
        return None
    return group if group.classify(step) in ("element", "reduction") else None


def _grow(steps: list, start: int, taken: set[int]
          ) -> Optional[tuple[list[tuple[int, str]], int, set[Var]]]:
    """The members (index, kind) of the group starting at steps[start], its
    trailing axes per row and its totals (`_Group.totals`), or None where
    none worth running forms."""
    group = _start(steps[start])
    if group is None:
        return None
    members: list[tuple[int, str]] = []
    blocked: set[Var] = set()  # made after the group's start by steps outside it
    misses = 0

    def join(k: int, kind: str) -> None:
        step = steps[k]
        members.append((k, kind))
        made = set(_outputs(step))
        (group.element if kind == "element" else group.row).update(made)
        sums = [step] if kind == "reduction" else \
            step.reductions if kind == "element" and not isinstance(step, Eqn) else []
        for r in sums:  # (a loop's own sums too) row values, or totals
            group.element.difference_update(r.outputs)
            group.row.difference_update(r.outputs)
            (group.totals if group.splits(r) else group.row).update(r.outputs)
        group.eqns += len(step.eqns) + len(step.reductions) if not isinstance(step, Eqn) else 1

    join(start, group.classify(steps[start]))
    for k in range(start + 1, len(steps)):
        if misses >= LOOKAHEAD:
            break
        step = steps[k]
        reads = _reads(step)
        size = len(step.eqns) + len(step.reductions) if not isinstance(step, Eqn) else 1
        kind = None
        if k not in taken and not reads & blocked and group.eqns + size <= MAX_ROW_EQNS:
            saved = group.k
            kind = group.classify(step)
            if kind is None:
                group.k = saved
        if kind is None:
            if reads & (group.element | group.row):
                break  # a reader that cannot join: the group ends before it
            # (a reader of its totals alone is looked past: it runs after the
            # row loop and the totals' sums, as every step left out does,
            # so that `-sum(...)`'s negation of the total, or a mean's
            # division, does not end the loop its gradient's rows join)
            if k not in taken:
                blocked.update(_outputs(step))
            misses += 1
            continue
        join(k, kind)
        misses = 0
    # row work after the last pass runs better as a loop across rows
    while members and members[-1][1] == "row":
        members.pop()
    # (a total alone is no reason for a row loop: one row, say, ran in
    # parallel chunks as a loop, where a row loop's blocks of rows are one)
    work = [m for m in members if not (isinstance(steps[m[0]], Eqn) and (
        steps[m[0]].op == "reshape" or group.totals.issuperset(steps[m[0]].outputs)))]
    reduces = any(kind == "reduction" or (kind == "element" and steps[k].reductions)
                  for k, kind in members)
    return (members, group.k, group.totals) if reduces and len(work) >= 2 else None


def fuse_rows(steps: list, fn) -> list:
    """`steps` with each group (see the module's docstring) as one
    `RowLoop` where its first member stood."""
    taken: set[int] = set()
    groups: dict[int, tuple[list[tuple[int, str]], int, set[Var]]] = {}
    for start in range(len(steps)):
        if start not in taken:
            grown = _grow(steps, start, taken)
            if grown:
                groups[start] = grown
                taken.update(k for k, _ in grown[0])
    if not groups:
        return steps
    reads = [_reads(s) for s in steps]
    returned = {a for a in fn.outputs if isinstance(a, Var)}
    result = []
    for k, step in enumerate(steps):
        if k in groups:
            members, per_row, group_totals = groups[k]
            mine = {m for m, _ in members}
            needed = returned.union(*(r for j, r in enumerate(reads) if j not in mine))
            split, totals = list(steps), []
            row_sums = {r.inputs[0]: r.outputs[0] for m in sorted(mine) for r in _sums(steps[m])
                        if r.op == "reduce_sum" and len(r.p["axes"]) == per_row}
            for m in mine:
                split[m] = _split(steps[m], per_row, group_totals, row_sums, totals)
            needed.update(t.inputs[0] for t in totals)
            members = [(m, kind) for m, kind in members if split[m] is not None]
            result.append(_build(split, members, needed))
            result += totals
        elif k not in taken:
            result.append(step)
    return result


def _sums(step) -> list[Eqn]:
    """A step's reductions: itself, or a loop's own."""
    if isinstance(step, Eqn):
        return [step] if _is_reduction(step) else []
    return step.reductions


def _split(step, per_row: int, group_totals: set[Var], row_sums: dict[Var, Var],
           totals: list[Eqn]):
    """`step` with each of the group's totals (`group_totals`: its sums
    over more than a row's `per_row` trailing axes, `_Group.splits`)
    summing each row instead, or dropped where the group sums that value
    per row already (`row_sums`: value -> its row sums; None for a step
    that was only such a sum); the sums of those row sums over the axes
    left, which run after the row loop, appended to `totals`.  Any other
    sum stays (a row value's over its axes of one element may be over more
    than `per_row` axes, and is read in the row loop)."""
    def row_sum(eqn: Eqn) -> Optional[Eqn]:
        (x,), (total,) = eqn.inputs, eqn.outputs
        rank, axes = x.type.rank, tuple(eqn.p["axes"])
        if total not in group_totals:
            return eqn
        rest = (("axes", tuple(range(rank - len(axes), rank - per_row))),)
        if x in row_sums:
            totals.append(replace(eqn, inputs=(row_sums[x],), params=rest))
            return None
        partial = Var(TensorType(total.type.dtype, tuple(x.type.shape[:rank - per_row])),
                      total.hint)
        totals.append(replace(eqn, inputs=(partial,), params=rest))
        return replace(eqn, outputs=(partial,), params=(
            ("axes", tuple(range(rank - per_row, rank))),))
    if isinstance(step, Eqn):
        return row_sum(step) if _is_reduction(step) else step
    sums = [row_sum(r) for r in step.reductions]
    return replace(step, reductions=[r for r in sums if r is not None]) if sums else step


def _build(steps: list, members: list[tuple[int, str]], needed: set[Var]) -> RowLoop:
    """The RowLoop of a group: its passes, inputs and outputs."""
    first = steps[members[0][0]]
    shape = tuple(first.inputs[0].type.shape) if isinstance(first, Eqn) else tuple(first.shape)
    # items in order: (kind, eqn); kind element, row or reduction
    items: list[tuple[str, Eqn]] = []
    for k, kind in members:
        step = steps[k]
        if isinstance(step, Eqn):
            items.append((kind, step))
            continue
        items += [(kind, e) for e in step.eqns]
        items += [("reduction" if kind == "element" else "row", r) for r in step.reductions]
    axes = next(e.p["axes"] for kind, e in items if kind == "reduction")
    rows = shape[:len(shape) - len(axes)]
    producer: dict[Var, int] = {}
    level: dict[Var, int] = {}
    element: set[Var] = set()
    for n, (kind, eqn) in enumerate(items):
        reads = [a for a in eqn.inputs if isinstance(a, Var) and a in level]
        lev = max((level[a] for a in reads), default=0)
        for o in eqn.outputs:
            producer[o] = n
            level[o] = lev + 1 if kind == "reduction" else lev
            if kind == "element":
                element.add(o)
    n_passes = 1 + max(level[e.inputs[0]] if e.inputs[0] in level else 0
                       for kind, e in items if kind == "reduction")
    n_passes = max([n_passes] + [level[e.outputs[0]] + 1 for kind, e in items
                                 if kind == "element"])
    outputs = [o for _, e in items for o in e.outputs if o in needed]
    stored = set(outputs)
    spilled: list[Var] = []
    # values a later pass reads: computed again, or stored
    crossing = {a for kind, e in items for a in e.inputs
                if isinstance(a, Var) and a in element
                and (level[e.outputs[0]] - (1 if kind == "reduction" else 0)) > level[a]}
    chains: dict[Var, list[int]] = {}

    def chain(v: Var) -> list[int]:
        """The items that compute v again in a later pass."""
        if v in stored:
            return []
        if v not in chains:
            n = producer[v]
            found = {n}
            for a in items[n][1].inputs:
                if isinstance(a, Var) and a in element:
                    found.update(chain(a))
            chains[v] = sorted(found)
        return chains[v]
    for n, (kind, eqn) in enumerate(items):
        for v in eqn.outputs:
            if v in crossing:
                mine = chain(v)
                if len(mine) > RECOMPUTE_LENGTH or any(OPS[items[m][1].op].cost
                                                       for m in mine):
                    stored.add(v)
                    spilled.append(v)
    chains.clear()  # (those cached before a value in them was stored are stale)
    passes = [Pass() for _ in range(n_passes)]
    after: list[Eqn] = []
    for n, (kind, eqn) in enumerate(items):
        if kind == "row":
            lev = level[eqn.outputs[0]]
            (passes[lev].before if lev < n_passes else after).append(eqn)
        elif kind == "reduction":
            x = eqn.inputs[0]
            passes[level[x] if x in level else 0].reductions.append(eqn)
    for p_index, pass_ in enumerate(passes):
        wanted: set[int] = set()
        back: list[Var] = []
        for n, (kind, eqn) in enumerate(items):
            if kind == "element" and level[eqn.outputs[0]] == p_index:
                wanted.add(n)
        uses = [items[n][1] for n in wanted] + pass_.reductions
        for eqn in uses:
            for a in eqn.inputs:
                if isinstance(a, Var) and a in element and level[a] < p_index:
                    if a in stored:
                        if a not in back:
                            back.append(a)
                    else:
                        for m in chain(a):
                            for b in items[m][1].inputs:
                                if isinstance(b, Var) and b in stored and b in element \
                                        and level[b] < p_index and b not in back:
                                    back.append(b)
                            wanted.add(m)
        pass_.eqns = [items[n][1] for n in sorted(wanted)]
        pass_.reads_back = back
    made = set(producer)
    inputs: list[Var] = []
    for _, eqn in items:
        for a in eqn.inputs:
            if isinstance(a, Var) and a not in made and a not in inputs:
                inputs.append(a)
    checks = [e for kind, e in items if kind == "reduction" and e.op == "reduce_max"
              and e.p.get("empty") is None]
    return RowLoop(shape, tuple(rows), passes, after, inputs, outputs, spilled, checks)
