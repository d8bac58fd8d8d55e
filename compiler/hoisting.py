"""Loop-invariant code motion: the work of a loop's body that reads only
values fixed for the whole loop, done once before it.

Contract:
- `hoist_invariants(fn)`: fn with every `loop` (at every depth, the inner
  ones first, so that what leaves an inner loop can leave the outer one
  too) running before it each body equation that `hoist_body` moves.
  The loops' results are the same bits: each moved equation is the same
  op on the same values, computed once instead of once per trip.
- `hoist_body(body, p, invariants)`: (the equations moved out, as they run
  before the loop, on `invariants`; the body without them; the loop's
  invariants after): a body equation moves when each of its inputs is an
  invariant, a literal or an output of an equation moved before it, it
  reads at least one such value, and it is `_movable`.  Its outputs that
  the rest of the body reads become invariants (after the loop's own,
  the ones the body still reads).  `p` is the loop's params (`n_carry`,
  `n_inv`); the result's `n_inv` is the length of the invariants returned.
  Equal moves (the same op, inputs and params, `passes.cse`'s key) move
  once: the body reads the first one's value for the others'.

Why the limits (`_movable`): a loop of zero trips runs none of its body,
so nothing that can raise at run time moves (a gather or scatter, whose
indices are checked; a max over an axis that may be empty; a nested loop
or call, which may hold either), and nothing moves that would allocate
more than its inputs hold (a broadcast the body's kernel reads in place,
an outer product), which a loop of no trips never allocates.

`lower_for` runs `hoist_body` on each loop as it lowers it, so that
autodiff sees the moved work outside (the cotangent of a moved value is
summed over the trips by the loop's VJP, then the moved equation's VJP
runs once; `control._guarded` keeps a loop of no trips from passing back
through it the NaN its VJP makes of a zero cotangent times an infinite
slope, log(w)'s at w = 0); the IR passes (`compiler.pipeline.IR_PASSES`) run
`hoist_invariants`, for the loops autodiff and vmap make.  `ENABLED`
switches both off (for a test to compare the bits of a loop as it was;
the program store does not key on it: tests build with GRADC_VERIFY, which
never reads the store).
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

from gradlang.compiler.ir import Atom, Eqn, Function, Var
from gradlang.compiler.ops import OPS, loop_groups
from gradlang.compiler.passes import cse_key

ENABLED = True

# Ops that never move: `broadcast_to` is read in place by the kernels that
# read it (moved out, the driver would make the broadcast C-contiguous once
# before the trips: more memory than there may be); a barrier marks where
# `@recompute`'s backward pass starts, and must stay where it is.
_STAYS = frozenset({"broadcast_to", "recompute_barrier"})
# Kinds that never move: a gather or scatter checks its indices at run
# time, and a check (`compiler.ops`) is one; a loop or call may hold one.
_KINDS_STAYING = frozenset({"index", "check", "loop", "call"})


def hoist_invariants(fn: Function) -> Function:
    """See the module's contract."""
    if not ENABLED or not any(e.op == "loop" for e in fn.eqns):
        return fn
    eqns: list[Eqn] = []
    for eqn in fn.eqns:
        if eqn.op == "loop":
            moved, eqn = _hoisted_loop(eqn)
            eqns += moved
        eqns.append(eqn)
    return Function(fn.name, fn.params, tuple(eqns), fn.outputs)


def _hoisted_loop(eqn: Eqn) -> tuple[list[Eqn], Eqn]:
    """A loop's invariant work, moved (its body's loops' first), and the
    loop without it."""
    p = eqn.p
    body = hoist_invariants(p["body"])
    bounds, carry, inv, xs = loop_groups(eqn.inputs, p)
    moved, body, inv = hoist_body(body, p, inv)
    params = {**p, "body": body, "n_inv": len(inv)}
    return moved, Eqn(eqn.op, (*bounds, *carry, *inv, *xs), eqn.outputs,
                      tuple((k, params[k]) for k, _ in eqn.params), eqn.span)


def hoist_body(body: Function, p: dict, invariants: Sequence[Atom]
               ) -> tuple[list[Eqn], Function, list[Atom]]:
    """See the module's contract."""
    index, carry, inv_params, slices = loop_groups(body.params, p, lead=1)
    if not ENABLED:
        return [], body, list(invariants)
    outside: dict[Var, Atom] = dict(zip(inv_params, invariants))  # body value -> outer
    moved: list[Eqn] = []
    made: list[Var] = []  # the moved equations' outputs, as the body named them
    kept: list[Eqn] = []
    # Why: a long body repeating `x * 0.5` made one invariant per repeat, so
    # autodiff one accumulator per repeat, and the kernels as many arrays
    # (Numba's compile superlinear in them); the first of equal moves serves.
    seen: dict[tuple, tuple[Var, ...]] = {}  # a moved equation's key -> its body outputs
    same: dict[Var, Var] = {}  # a body value -> the equal one the body reads instead
    for eqn in body.eqns:
        if same:
            eqn = Eqn(eqn.op, tuple(same.get(a, a) for a in eqn.inputs), eqn.outputs,
                      eqn.params, eqn.span)
        if _movable(eqn) and all(not isinstance(a, Var) or a in outside for a in eqn.inputs):
            inputs = tuple(outside.get(a, a) for a in eqn.inputs)
            key = cse_key(eqn, inputs)
            if key is not None and key in seen:
                same.update(zip(eqn.outputs, seen[key]))
                continue
            seen[key] = eqn.outputs
            outs = tuple(type(o)(o.type, o.hint) for o in eqn.outputs)
            moved.append(Eqn(eqn.op, inputs, outs, eqn.params, eqn.span))
            outside.update(zip(eqn.outputs, outs))
            made += eqn.outputs
        else:
            kept.append(eqn)
    if not moved:
        return [], body, list(invariants)
    outputs = tuple(same.get(a, a) for a in body.outputs)
    read = {a for e in kept for a in e.inputs if isinstance(a, Var)}
    read.update(a for a in outputs if isinstance(a, Var))
    new_params = [v for v in inv_params if v in read]
    new_params += [v for v in made if v in read]
    body = Function(body.name, (*index, *carry, *new_params, *slices), tuple(kept), outputs)
    return moved, body, [outside[v] for v in new_params]


def _movable(eqn: Eqn) -> bool:
    """Whether `eqn`, all of whose inputs are fixed for the loop, may run
    once before it (the module's "Why the limits")."""
    row = OPS[eqn.op]
    if eqn.op in _STAYS or row.kind in _KINDS_STAYING or row.adds_into_first:
        return False
    ins = [a for a in eqn.inputs if isinstance(a, Var)]
    if not ins:  # a constant (`full`) or a size: nothing to save, and
        return False  # simplify reads a body's constants where they are
    if eqn.op == "reduce_max" and eqn.p.get("empty") is None and not all(
            isinstance(d, int) and d > 0 for d in _reduced_sizes(eqn)):
        return False  # a max over an empty axis raises
    return all(_no_larger(o.type.shape, [a.type.shape for a in ins]) for o in eqn.outputs)


def _reduced_sizes(eqn: Eqn) -> list:
    shape = eqn.inputs[0].type.shape
    return [shape[a] for a in eqn.p["axes"]]


def _no_larger(shape: tuple, inputs: list[tuple]) -> bool:
    """Whether a value of `shape` surely holds no more elements than one of
    `inputs` holds: fewer when all are known, else where its sizes are
    some of one input's."""
    if all(isinstance(d, int) for s in [shape, *inputs] for d in s):
        return _count(shape) <= max(_count(s) for s in inputs)
    dims = Counter(shape)
    return any(not dims - Counter(s) for s in inputs)


def _count(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
