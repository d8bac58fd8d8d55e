"""Reads by a loop's own index as stacked inputs: `obs[i]` in `for i in
range(T)`, where obs is read from outside the loop, becomes this trip's
slice of a stacked input (the trips' slices of obs, made once before the
loop), as scan's xs are.  The forward loop then reads a slice instead of
gathering, so a small body can run on scalars in one kernel
(`scalar_loops`), and reverse mode gives the read a stacked output of
per-trip cotangents instead of a scatter-add into a carried array of obs's
shape every trip.

Contract: `stack_index_reads(outer, sb, params, bounds)` takes a loop body
being lowered (`sb`, a builder whose free values are read from `outer`;
`params` its index and carried values) and the loop's bounds as compile-time
values (an int, a size symbol, or None where known only at run time).  Each
`take(x, i + c, axis)` of the body (c a constant integer, 0 when absent)
whose x is read from outside, or made there by layout ops alone (`x[:, 0]`
slices inside the body before it gathers; those move to `outer`), and whose
every index the loop can run is provably within x's axis, is rewritten:
its output becomes a body parameter for that trip's slice, and the slices
of x along the axis, trips first, are bound in `outer`.  Provably: constant
bounds and an axis of fixed size whose range holds every index (from 0:
a negative index is left to the gather, which reads it as NumPy does), or
`range(n)` over an axis of size n (a size symbol).  Any other read stays
a gather, with its run-time bounds check.  Returns the loop's trip count
(None when nothing was rewritten), the new body parameters, and the loop's
stacked inputs, in order.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

from gradlang.compiler.builder import Builder
from gradlang.compiler.ir import Eqn, Lit, Var
from gradlang.compiler.shapes import Dim, Sym
from gradlang.runtime.common import range_length

Bound = Union[int, Sym, None]
# ops that cannot fail and read nothing but their input: moving one out of
# a loop (which may run no trips) changes nothing but when it runs
_MOVABLE = {"slice", "reshape", "transpose", "broadcast_to"}


def stack_index_reads(outer: Builder, sb: Builder, params: Sequence[Var],
                      bounds: Sequence[Bound]) -> tuple[Optional[Dim], list[Var], list[Var]]:
    index = params[0]
    trip = _trip(bounds)
    if trip is None:
        return None, [], []
    made = {o: e for e in sb.eqns for o in e.outputs}
    local = set(params) | set(made)
    offsets = _offsets(sb, index) if isinstance(trip, int) else {index: 0}
    slices, stacked, moved, rewritten = [], [], set(), set()  # (equations by id)
    for eqn in sb.eqns:
        if eqn.op != "take" or eqn.inputs[1] not in offsets:
            continue
        x, axis = eqn.inputs[0], eqn.p["axis"]
        chain = _movable_chain(x, made, local)
        reads = _range_read(bounds, offsets[eqn.inputs[1]], x.type.shape[axis])
        if chain is None or reads is None:
            continue
        moved.update(map(id, chain))
        rewritten.add(id(eqn))
        slices.append(eqn.out)  # now this trip's slice, a parameter of the body
        stacked.append((x, axis, reads, eqn))
    if not slices:
        return None, [], []
    outer.eqns.extend(e for e in sb.eqns if id(e) in moved)
    sb.eqns[:] = [e for e in sb.eqns if id(e) not in moved | rewritten]
    return trip, slices, [_trips_first(outer, *s) for s in stacked]


def _trip(bounds: Sequence[Bound]) -> Optional[Dim]:
    """The trip count, when the bounds give it at compile time: an int, or
    the size symbol n of `range(n)` (one factor: a driver variable)."""
    start, stop, step = bounds
    if all(isinstance(v, int) for v in bounds):
        return range_length(start, stop, step) or None
    if (start, step) == (0, 1) and isinstance(stop, Sym) and stop.coef == 1 \
            and len(stop.factors) == 1:
        return stop
    return None


def _offsets(sb: Builder, index: Var) -> dict[Var, int]:
    """The body's values that are the index plus a constant integer (i,
    i + 1, i - 1, 2 + i): value -> the constant."""
    offsets = {index: 0}
    for e in sb.eqns:
        if e.op not in ("add", "sub") or e.out.type != index.type:
            continue
        a, b = e.inputs
        if a in offsets and isinstance(b, Lit):
            offsets[e.out] = offsets[a] + (b.value if e.op == "add" else -b.value)
        elif e.op == "add" and b in offsets and isinstance(a, Lit):
            offsets[e.out] = offsets[b] + a.value
    return offsets


def _movable_chain(x, made: dict, local: set) -> Optional[list[Eqn]]:
    """The body's equations that make x from values outside it by `_MOVABLE`
    ops alone (none when x is itself from outside), in any order; None
    when x depends on the trip."""
    if isinstance(x, Lit) or x not in local:
        return []
    eqn = made.get(x)
    if eqn is None or eqn.op not in _MOVABLE:
        return None
    chain = [eqn]
    for a in eqn.inputs:
        sub = _movable_chain(a, made, local)
        if sub is None:
            return None
        chain += sub
    return chain


def _range_read(bounds: Sequence[Bound], offset: int, size) -> Optional[tuple[int, int, int]]:
    """(start, stop, step) of the slice along an axis of `size` that the
    trips' indices (the bounds' range shifted by `offset`) read in order,
    or None unless every one is provably within the axis."""
    start, stop, step = bounds
    if isinstance(size, Sym):
        return (0, size, 1) if stop == size and offset == 0 else None
    if not isinstance(stop, int):
        return None
    read = range(start + offset, stop + offset, step)
    if not read or min(read) < 0 or max(read) >= size:
        return None
    # (a negative stop: past the front, as `slice` takes it)
    return read.start, read[-1] + step, step


def _trips_first(b: Builder, x, axis: int, reads: tuple, eqn: Eqn) -> Var:
    """x's slices along `axis` that the trips read, the trips on axis 0."""
    shape = x.type.shape
    full = (0, shape[axis], 1)
    if reads != full:
        starts, stops, steps = zip(*[reads if k == axis else (0, d, 1)
                                     for k, d in enumerate(shape)])
        x = b.bind("slice", x, starts=starts, stops=stops, steps=steps, span=eqn.span)
    if axis != 0:
        perm = (axis,) + tuple(k for k in range(len(shape)) if k != axis)
        x = b.bind("transpose", x, perm=perm, span=eqn.span)
    return x
