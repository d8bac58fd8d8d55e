"""Elementwise work in the layout of a transposed value, not the transpose's.

Contract: `in_source_layout(fn)` returns fn where, for `t = transpose(a,
perm)` read only by elementwise equations of t's shape, the region of
elementwise equations it reaches (each reading, besides values of the
region, only t, literals, constants (`full`, which loops read as
literals) and values of one element) computes in a's
layout instead, when every value the region hands out is either
transposed back (`transpose(v, inverse)`, which becomes v itself) or
summed over all its axes: the region's equations get outputs of a's
shape, read a in place of t, and the transposes at both ends are gone.
fn's outputs keep their names (the driver returns them): a value
transposed back is named as that transpose; a region where t itself
transposed back, or a second transpose back of one value, is returned
stays as it was.
Values are the same element for element; a full sum adds them in a's
order (the same value up to rounding).

Why: a convolution is a product, (O, N, H, W), transposed to (N, O, H,
W) for the caller (channels-last rows, (N, H, W, O), until the columns of
`compiler.convolution`); what follows it elementwise (an activation and
its gradient) then read the transposed product (a copy, since a loop
reads contiguous arrays) and wrote the gradient that the backward
product transposes back (a second copy).  Run by `fusion.fuse` on every
target, so the transforms never see it.
"""
from __future__ import annotations

from dataclasses import replace

from gradlang.compiler.ir import Atom, Eqn, Function, TensorType, Var, readers
from gradlang.compiler.ops import OPS

_ELEMENTWISE = {name for name, op in OPS.items() if op.kind == "elementwise"}


def in_source_layout(fn: Function) -> Function:
    readers_of = readers(fn.eqns)
    returned = {a for a in fn.outputs if isinstance(a, Var)}
    constants = {e.out for e in fn.eqns if e.op == "full"}  # loops read them as literals
    renamed: dict[Var, Atom] = {}  # old value -> its value in the source layout
    dropped: set[int] = set()  # ids of the transposes made needless

    def sub(a: Atom) -> Atom:
        return renamed.get(a, a) if isinstance(a, Var) else a
    for eqn in fn.eqns:
        if eqn.op == "transpose" and eqn.out not in renamed:
            plan = _region(eqn, readers_of, returned, constants)
            if plan is None:
                continue
            region, ends = plan
            source = sub(eqn.inputs[0])  # (an earlier region's end, maybe)
            names: dict[Var, Atom] = {eqn.out: source}
            backs = [end for end in ends if end.op == "transpose"]
            # A value transposed back is named as (the first) transpose back
            # of it, which has its type: a returned one keeps its name, as
            # the driver returns fn.outputs.
            for end in backs:
                names.setdefault(end.inputs[0], end.out)
            for e in region:
                for o in e.outputs:
                    names.setdefault(o, Var(TensorType(o.type.dtype, source.type.shape), o.hint))
            for end in backs:
                names[end.out] = names[end.inputs[0]]
            if any(names.get(a, a) != a for a in returned):
                continue  # (t transposed back, or a second transpose back, returned)
            renamed.update(names)
            dropped.update(id(e) for e in [eqn] + backs)
    if not renamed:
        return fn
    eqns = tuple(Eqn(e.op, tuple(map(sub, e.inputs)), tuple(renamed.get(o, o) for o in e.outputs),
                     e.params, e.span)
                 for e in fn.eqns if id(e) not in dropped)
    return replace(fn, eqns=eqns, outputs=tuple(map(sub, fn.outputs)))


def _region(transpose: Eqn, readers: dict[Var, list[Eqn]], returned: set[Var],
            constants: set[Var]) -> tuple[list[Eqn], list[Eqn]] | None:
    """The elementwise equations `transpose`'s output reaches and the
    equations that end the region (inverse transposes, full sums), or None
    where the region reads or hands out anything else."""
    perm = tuple(transpose.p["perm"])
    inverse = tuple(sorted(range(len(perm)), key=lambda i: perm[i]))
    shape = transpose.out.type.shape
    region: dict[int, Eqn] = {}
    ends: dict[int, Eqn] = {}
    produced = {transpose.out}
    frontier = [transpose.out]
    while frontier:
        value = frontier.pop()
        if value in returned:
            return None
        for reader in readers.get(value, []):
            if id(reader) in region or id(reader) in ends:
                continue
            if reader.op in _ELEMENTWISE and reader.out.type.shape == shape:
                region[id(reader)] = reader
                produced.update(reader.outputs)
                frontier.extend(reader.outputs)
            elif reader.op == "transpose" and tuple(reader.p["perm"]) == inverse:
                ends[id(reader)] = reader
            elif reader.op == "reduce_sum" and \
                    sorted(reader.p["axes"]) == list(range(len(shape))):
                ends[id(reader)] = reader
            else:
                return None
    if not region:
        return None
    for eqn in region.values():
        for a in eqn.inputs:
            if isinstance(a, Var) and a not in produced and a not in constants and \
                    any(d != 1 for d in a.type.shape):
                return None
    return list(region.values()), list(ends.values())
