"""Fusion: group elementwise equations into loop kernels.

Contract: `fuse(fn)` returns the function's work as an ordered list of
steps: `Loop`s (a fused chain of elementwise equations over one iteration
shape) and single non-elementwise equations (reductions, matmul, layout).
A value that only the members of one loop read never leaves the loop: it
lives in a register, so a value-and-gradient of an elementwise chain is one
pass that stores no residual.  `broadcast_to` joins loops as an elementwise
op (its input read with broadcast indexing), so broadcasting never
materializes an array.  A `full` is never a loop's work: loops read it as a
literal, and it is a step of its own (the driver fills an array) only where
a step that is not a loop reads it, or the function returns it.

On the CPU a loop may also end in float sums over trailing axes, each of
a value only that sum reads (`sum(x * x)`, `sum(err * err, axis=1)`), all
over the same axes (`sum(x * w, axis=1)` and its tangent `sum(tx * w,
axis=1)`: one pass over the rows for both): the loop accumulates them, and
the summed arrays are never stored.  A sum of a loop's only sum, which
nothing else reads, over trailing axes in all is the loop's sum instead
(`mean(sum(err * err, axis=1))`: one sum over both axes).

Greedy rule: an elementwise equation joins a loop of its shape when every
input it reads from outside that loop was defined before the loop starts
(preferring the loop that produces its inputs); the loop then runs where
its first member stood, which keeps the step order topological.  The
scalars that read no parameter come first (a mean's 1 / n), so that any
loop can read them.  A loop holds at most `MAX_LOOP_EQNS` equations, and
with `max_arrays` (a target's `max_kernel_arrays`) at most that many
values read from outside and made inside together (a bound on its kernel's
array arguments): past either the next one starts a loop of its own (see
there why).  Then a loop
whose values only one later loop of its shape reads sinks into that loop
(`_sink_loops`).  With `reductions` (the CPU), a product summed against
a vector is first a matrix-vector product (`compiler.matvec`).  On every
target a sum of embeds or of scatter-adds is one buffer that each adds into in
place (`compiler.in_place_sums`), and elementwise work between a transpose
and its inverse runs in the untransposed layout (`compiler.layouts`).
Last, with `reductions`, a reduction along trailing axes and the
elementwise work on the same rows (a softmax, its gradient, a layer norm)
run as one `RowLoop`, a pass per reduction over each row
(`compiler.rows`).

`print_steps(fn, steps)` prints them in the IR printer's notation, each
loop as a block naming its iteration shape, what it reads from outside
and what it writes.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Optional, Union

from gradlang.compiler.in_place_sums import as_in_place_sums
from gradlang.compiler.layouts import in_source_layout
from gradlang.compiler.ir import (Atom, Eqn, Function, Lit, Namer, TensorType, Var, print_eqns,
                                  signature_line, use_counts)
from gradlang.compiler.matvec import as_matvecs
from gradlang.compiler.ops import OPS
from gradlang.compiler.rows import RowLoop, fuse_rows

FUSIBLE = {name for name, op in OPS.items() if op.kind == "elementwise"} | {"broadcast_to"}

# Numba compiles a loop body in time superlinear in its length, the
# parallel kernel most (its parfor lowering): a chain of n additions took
# 6 s at n = 1,000, 27 s at 2,000 and 78 s at 3,000 (about n ** 2.5; a
# generated sum of 10,000 terms would take half an hour), the serial one
# 6.6 s at 1,000 and 78 s at 8,000.  Cut at this length, a loop is linear
# again in the number of kernels, for one array stored and read back per
# cut: nothing beside a thousand operations per element.
MAX_LOOP_EQNS = 1000


@dataclass
class Loop:
    shape: tuple[int, ...]
    start: int
    eqns: list[Eqn] = field(default_factory=list)
    produced: set = field(default_factory=set)
    inputs: list[Var] = field(default_factory=list)   # read from outside
    outputs: list[Var] = field(default_factory=list)  # needed outside
    # Float sums over the same trailing axes, each of a value only it
    # reads, accumulated in the loop itself (so those values are never
    # stored).
    reductions: list[Eqn] = field(default_factory=list)
    # Inputs standing in for an argument of a kernel the loop shares with
    # a larger loop (`compiler.sharing`): the value passed for each.
    stand_ins: dict[Var, Var] = field(default_factory=dict)
    # While fusing: the values its equations read from outside it (its
    # inputs, but for the literals `full`s become)
    reads: set = field(default_factory=set)


Step = Union[Loop, RowLoop, Eqn]


def fuse(fn: Function, reductions: bool = False,
         max_arrays: Optional[int] = None) -> list[Step]:
    """`reductions`: let a loop end in a sum over trailing axes, and run
    a product summed against a vector as a matrix-vector product
    (`compiler.matvec`); `max_arrays`: the most values a loop may read
    from outside and make together (None: any number)."""
    fn = in_source_layout(as_in_place_sums(fn))
    if reductions:
        fn = as_matvecs(fn)
    fulls = {e.out: e for e in fn.eqns if e.op == "full"}
    spread = _spread_values(fn)
    defined_at: dict[Var, int] = {v: -1 for v in fn.params}
    loop_of: dict[Var, Loop] = {}
    loops_of_shape: dict[tuple, list[Loop]] = {}  # those not full, in order of start
    steps: list[tuple[int, Step]] = []
    uses = use_counts(fn.eqns)
    outputs = {a for a in fn.outputs if isinstance(a, Var)}
    summed_in: dict[Var, Loop] = {}  # the sum a loop ends in -> that loop

    for index, eqn in enumerate(_constants_first(fn)):
        home = loop_of.get(eqn.inputs[0]) if eqn.inputs and isinstance(eqn.inputs[0], Var) \
            else None
        if reductions and home is not None and _absorbable(eqn, home, uses, outputs):
            # The sum exists only once the loop has finished: to every other
            # equation it is an outside value defined here.
            home.reductions.append(eqn)
            summed_in.update((o, home) for o in eqn.outputs)
            defined_at.update((o, index) for o in eqn.outputs)
            continue
        summer = summed_in.get(eqn.inputs[0]) if eqn.inputs else None
        widened = (_sum_of_sum(summer.reductions[0], eqn, uses, outputs)
                   if summer is not None and len(summer.reductions) == 1 else None)
        if widened is not None:
            # a loop's sum, summed again over the axes left: the loop sums
            # over both (a mean of row sums: no second reduction to run)
            summer.reductions[0] = widened
            summed_in.update((o, summer) for o in eqn.outputs)
            defined_at.update((o, index) for o in eqn.outputs)
            continue
        if eqn.op not in FUSIBLE or eqn.op == "full":
            steps.append((index, eqn))
            defined_at.update((o, index) for o in eqn.outputs)
            continue
        if eqn.out in spread:  # (its readers read its source)
            continue
        # Loops read constants as literals, whatever their declared shape,
        # and a one-element value spread by a broadcast as it is.
        eqn = Eqn(eqn.op, tuple(_as_constant(spread.get(a, a), fulls) for a in eqn.inputs),
                  eqn.outputs, eqn.params, eqn.span)
        shape = eqn.outputs[0].type.shape
        home = _pick_loop(eqn, loops_of_shape.setdefault(shape, []), loop_of, defined_at,
                          max_arrays)
        if home is None:
            home = Loop(shape, index)
            steps.append((index, home))
            loops_of_shape[shape].append(home)
        home.eqns.append(eqn)
        home.reads |= {a for a in eqn.inputs if isinstance(a, Var) and a not in home.produced}
        home.produced.update(eqn.outputs)
        if _full(home, max_arrays):  # (for good: a loop only grows)
            open_loops = loops_of_shape[shape]
            del open_loops[next(k for k, loop in enumerate(open_loops) if loop is home)]
        for o in eqn.outputs:
            loop_of[o] = home
            defined_at[o] = home.start  # the whole loop runs where it starts

    ordered = _sink_loops([s for _, s in sorted(steps, key=lambda p: p[0])], fn, max_arrays)
    needed = _wire(ordered, fn)

    def kept(step: Step) -> bool:
        if isinstance(step, Loop):
            return bool(step.outputs)
        return step.op != "full" or step.out in needed
    steps = [s for s in ordered if kept(s)]
    return fuse_rows(steps, fn) if reductions else steps


def _sink_loops(steps: list[Step], fn: Function, max_arrays: Optional[int]) -> list[Step]:
    """The steps with each loop whose values only one later loop of its
    shape reads (none returned) merged into that loop, its equations
    first: the greedy rule starts a loop where its first equation stands,
    so `-y` began a loop of its own before the row sums that the rest of
    its row's work waits for (`-y * (x @ w)`).  Its inputs exist before
    it, so before the later loop too; that loop reads them in place of
    its values, which are never stored."""
    readers: dict[Var, set[int]] = {}  # value -> the steps reading it
    for k, step in enumerate(steps):
        for eqn in step.eqns + step.reductions if isinstance(step, Loop) else [step]:
            for a in eqn.inputs:
                if isinstance(a, Var):
                    readers.setdefault(a, set()).add(k)
    returned = {a for a in fn.outputs if isinstance(a, Var)}
    merged: set[int] = set()
    for k, loop in enumerate(steps):
        if not isinstance(loop, Loop) or loop.reductions or loop.produced & returned:
            continue
        outside = set().union(*(readers.get(v, set()) for v in loop.produced)) - {k}
        if len(outside) != 1:
            continue
        (into,) = outside
        host = steps[into]
        reads = (host.reads - loop.produced) | loop.reads if isinstance(host, Loop) else set()
        if isinstance(host, Loop) and host.shape == loop.shape and \
                len(host.eqns) + len(loop.eqns) <= MAX_LOOP_EQNS and \
                (max_arrays is None
                 or len(reads) + len(host.produced) + len(loop.produced) <= max_arrays):
            host.eqns[:0] = loop.eqns
            host.produced |= loop.produced
            host.reads = reads
            merged.add(k)
            for eqn in loop.eqns:
                for a in eqn.inputs:
                    if isinstance(a, Var):
                        readers[a] = readers[a] - {k} | {into}
    return [s for k, s in enumerate(steps) if k not in merged]


def _constants_first(fn: Function) -> list[Eqn]:
    """fn's equations, the scalars that read no parameter (sizes and what
    they compute: a mean's 1 / n) first, so that they are defined before
    any loop starts and every loop can read them."""
    constant: set[Var] = set()
    first, rest = [], []
    for eqn in fn.eqns:
        if eqn.op not in ("loop", "custom_vjp") and all(
                d == 1 for o in eqn.outputs for d in o.type.shape) and all(
                a in constant for a in eqn.inputs if isinstance(a, Var)):
            constant.update(eqn.outputs)
            first.append(eqn)
        else:
            rest.append(eqn)
    return first + rest


def _absorbable(eqn: Eqn, loop: Loop, uses: dict, outputs: set) -> bool:
    """A float sum over trailing axes of a value only it reads, over the
    axes of the loop's sums so far."""
    if eqn.op != "reduce_sum":
        return False
    (x,) = eqn.inputs
    axes = tuple(eqn.p["axes"])
    if loop.reductions and axes != tuple(loop.reductions[0].p["axes"]):
        return False
    rank = x.type.rank
    return (x.type.shape == loop.shape and x.type.is_float and uses.get(x) == 1
            and x not in outputs and rank > 0 and axes == tuple(range(rank - len(axes), rank)))


def _sum_of_sum(first: Eqn, second: Eqn, uses: dict, outputs: set) -> Eqn | None:
    """One sum for `second` summing `first`'s result, which nothing else
    reads, over trailing axes of first's input; else None."""
    (y,) = first.outputs
    if second.op != "reduce_sum" or uses.get(y) != 1 or y in outputs:
        return None
    (x,) = first.inputs
    done = set(first.p["axes"])
    left = [axis for axis in range(x.type.rank) if axis not in done]
    axes = tuple(sorted(done | {left[axis] for axis in second.p["axes"]}))
    if axes != tuple(range(x.type.rank - len(axes), x.type.rank)):
        return None
    return Eqn("reduce_sum", (x,), second.outputs, (("axes", axes),), second.span)


def _full(loop: Loop, max_arrays: Optional[int]) -> bool:
    """Whether `loop` takes no more equations: it holds MAX_LOOP_EQNS, or
    one more (reading at most 3 values, making 1) might pass `max_arrays`
    values read from outside and made."""
    return len(loop.eqns) >= MAX_LOOP_EQNS or (
        max_arrays is not None and len(loop.reads) + len(loop.produced) + 4 > max_arrays)


def _pick_loop(eqn: Eqn, loops: list[Loop], loop_of: dict[Var, Loop],
               defined_at: dict[Var, int], max_arrays: Optional[int]) -> Loop | None:
    """The loop of `loops` (those of eqn's shape, in order of start) that
    `eqn` can join: one not full (`_full`: `loops` holds no full one), and
    every input it reads from outside the loop must exist before the loop
    runs.  Prefer the loop that
    produces most of its inputs (their values then stay in registers),
    else the earliest.

    Only the loops producing an input can hold one, so they are scored
    alone; any other loop qualifies iff it starts after every input is
    defined, and the earliest such is found by bisection.  (Scanning every
    loop made fusing an unrolled chain quadratic.)"""
    reads = [a for a in eqn.inputs if isinstance(a, Var)]
    shape = eqn.outputs[0].type.shape
    producers = {id(loop_of[a]): loop_of[a] for a in reads
                 if a in loop_of and loop_of[a].shape == shape
                 and not _full(loop_of[a], max_arrays)}
    best, best_score = None, 0
    for loop in sorted(producers.values(), key=lambda loop: loop.start):
        inside = sum(a in loop.produced for a in reads)
        ready = all(defined_at[a] < loop.start for a in reads if a not in loop.produced)
        if ready and inside > best_score:
            best, best_score = loop, inside
    if best is not None:
        return best
    last_input = max((defined_at[a] for a in reads), default=-1)
    k = bisect.bisect_right(loops, last_input, key=lambda loop: loop.start)
    return loops[k] if k < len(loops) else None


def _spread_values(fn: Function) -> dict[Var, Var]:
    """The broadcasts of a one-element value (a mean's cotangent `-1 / n`
    spread over the array: `simplify` makes each one broadcast of it) that
    only elementwise equations read, none returned: each one's source.
    Loops read the source in its place, a scalar each kernel loads once:
    placed in a loop as an equation of its own, the broadcast joined the
    first loop of its shape, which then stored the whole array for the
    loop of its readers (its value known only at run time where a size is
    symbolic; a constant's broadcast is a `full`, read as a literal)."""
    reads_elsewhere = {a for e in fn.eqns if e.op not in FUSIBLE or e.op == "full"
                       for a in e.inputs}
    reads_elsewhere |= {a for a in fn.outputs if isinstance(a, Var)}
    return {e.out: e.inputs[0] for e in fn.eqns
            if e.op == "broadcast_to" and isinstance(e.inputs[0], Var)
            and all(d == 1 for d in e.inputs[0].type.shape) and e.out not in reads_elsewhere}


def _as_constant(a: Atom, fulls: dict[Var, Eqn]) -> Atom:
    if isinstance(a, Var) and a in fulls:
        p = fulls[a].p
        return Lit(p["value"], TensorType(p["dtype"], ()))
    return a


def _wire(steps: list[Step], fn: Function) -> set[Var]:
    """Fill each loop's external inputs and the outputs others need;
    return the values needed outside the loop that makes them."""
    needed: set[Var] = {a for a in fn.outputs if isinstance(a, Var)}
    for step in steps:
        eqns = step.eqns if isinstance(step, Loop) else [step]
        for eqn in eqns:
            for a in eqn.inputs:
                if isinstance(a, Var) and not (isinstance(step, Loop) and a in step.produced):
                    needed.add(a)
    for step in steps:
        if not isinstance(step, Loop):
            continue
        seen: set[Var] = set()
        for eqn in step.eqns:
            for a in eqn.inputs:
                if isinstance(a, Var) and a not in step.produced and a not in seen:
                    seen.add(a)
                    step.inputs.append(a)
            step.outputs.extend(o for o in eqn.outputs if o in needed)
        for reduction in step.reductions:
            step.outputs.extend(o for o in reduction.outputs if o in needed)
    return needed


def print_steps(fn: Function, steps: list[Step]) -> str:
    name = Namer()
    lines = [signature_line(fn, name)]
    loops = 0
    for step in steps:
        if isinstance(step, RowLoop):
            lines += _print_row_loop(step, name, loops)
            loops += 1
            continue
        if not isinstance(step, Loop):
            lines += print_eqns([step], name, "  ")
            continue
        shape = ", ".join(str(d) for d in step.shape)
        reads = ", ".join(name(v) for v in step.inputs) or "nothing"
        body = print_eqns(step.eqns, name, "    ")
        body += print_eqns(step.reductions, name, "    ")
        sums = {o for reduction in step.reductions for o in reduction.outputs}
        writes = ", ".join(name(v) + (" (summed in the loop)" if v in sums else "")
                           for v in step.outputs)
        lines.append(f"  loop {loops} over [{shape}] reads {reads} writes {writes} {{")
        lines += body + ["  }"]
        loops += 1
    lines.append(f"  return {', '.join(name(a) for a in fn.outputs)}")
    lines.append("}")
    return "\n".join(lines)


def _print_row_loop(step: RowLoop, name, number: int) -> list[str]:
    """A row loop as a block per pass (`compiler.rows`)."""
    shape = ", ".join(str(d) for d in step.shape)
    rows = ", ".join(str(d) for d in step.rows)
    reads = ", ".join(name(v) for v in step.inputs) or "nothing"
    writes = ", ".join(name(v) for v in step.outputs)
    lines = [f"  loop {number} over [{shape}] by rows of [{rows}] reads {reads} "
             f"writes {writes} {{"]
    for k, pass_ in enumerate(step.passes):
        lines += print_eqns(pass_.before, name, "    ")
        back = "".join(f", reads back {name(v)}" for v in pass_.reads_back)
        lines.append(f"    pass {k} along each row{back} {{")
        lines += print_eqns(pass_.eqns + pass_.reductions, name, "      ") + ["    }"]
    lines += print_eqns(step.after, name, "    ")
    return lines + ["  }"]
