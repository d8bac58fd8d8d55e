"""Sums of embeds: each embedded value added in place into one buffer.

Contract: `as_embed_sums(fn)` returns fn with each `add(a, e)` (either
order), where `e = embed(x)` is read by that add alone and not returned,
and a, e and the sum have one type (no broadcasting), written as
`embed_add(a, x)`: x added into the region of a that the embed placed it
in.  The embed itself is gone; where both operands are such embeds the
first stays an `embed` (the one buffer filled with zeros).  A chain of
them, `e1 + e2 + ... + e9` (a strided slice's transpose summed over a
kernel's offsets: col2im in a convolution's or a pooling's backward
pass), becomes one zero-filled buffer and eight `embed_add`s, which the
driver adds in place (`ops.Op.adds_into_first`: it owns each partial
sum, which nothing else reads), where it was nine zero-filled arrays of
the full size and a loop reading all nine.  `a` need not be an embed:
`y + embed(x)` adds x into y (a copy of y where the driver does not own
it), touching only x's region where the loop read a whole array of zeros.
An `embed_add` whose region is disjoint from every region its base was
built of, from an `embed` (`compiler.regions`: proved from the static
slices, symbolic sizes included; where it cannot be, the add stays), is
marked `assign`: the region holds zeros, so x is written there, not added
(a 2x2 pooling's four stride-2 windows, which tile the buffer: NumPy's
strided add read what the zeros had just written, 2.5x as long as the
write).

Every target runs it (`fusion.fuse`), and only there: the transforms,
the Dask split and the interpreter never see `embed_add`.  The values are
the adds', in the same order, but for the sign of a zero: a -0.0 that
an embed places where no other one reaches stays -0.0 (the adds of the
other embeds' zeros made it 0.0).

Why here and not as a read of the embedded values inside the fused loop
(an element reads x where it lies in the region, else 0): a loop knows
its elements' flat index, not their coordinates, on any target (see
docs/internals.md on `iota`), and the in-place add needs no new loop
form: the zeros are written once, each region is added by one strided
pass, and the loop that summed nine full arrays is gone.
"""
from __future__ import annotations

from dataclasses import replace

from gradlang.compiler.ir import Eqn, Function, Var, use_counts
from gradlang.compiler.regions import disjoint


def as_embed_sums(fn: Function) -> Function:
    uses = use_counts(fn.eqns)
    returned = {a for a in fn.outputs if isinstance(a, Var)}
    embeds = {e.out: e for e in fn.eqns
              if e.op == "embed" and isinstance(e.inputs[0], Var) and uses.get(e.out) == 1
              and e.out not in returned}
    folded: set[Var] = set()  # the embeds now added in place
    eqns = [_into_embed_add(eqn, embeds, folded) or eqn for eqn in fn.eqns]
    if not folded:
        return fn
    return replace(fn, eqns=_assigning(
        [e for e in eqns if not (e.op == "embed" and e.out in folded)]))


def _assigning(eqns: list[Eqn]) -> tuple[Eqn, ...]:
    """eqns with each `embed_add` whose region provably holds only zeros
    (disjoint from every region its base was built of, from an `embed`)
    marked `assign`: x is written there, not added."""
    zero_outside: dict[Var, list[tuple]] = {}  # a value: zeros outside these regions
    out = []
    for eqn in eqns:
        if eqn.op == "embed":
            zero_outside[eqn.out] = [_region(eqn)]
        elif eqn.op == "embed_add" and eqn.inputs[0] in zero_outside:
            region, earlier = _region(eqn), zero_outside[eqn.inputs[0]]
            zero_outside[eqn.out] = earlier + [region]
            if all(disjoint(region, r) for r in earlier):
                eqn = replace(eqn, params=eqn.params + (("assign", True),))
        out.append(eqn)
    return tuple(out)


def _region(eqn: Eqn) -> tuple:
    p = eqn.p
    return p["starts"], p["stops"], p["steps"]


def _into_embed_add(eqn: Eqn, embeds: dict[Var, Eqn], folded: set[Var]) -> Eqn | None:
    """`eqn` as an `embed_add`, or None where it is not an add of one such
    embed to a value of its type."""
    if eqn.op != "add" or not all(isinstance(a, Var) for a in eqn.inputs):
        return None
    (out,) = eqn.outputs
    if any(a.type != out.type for a in eqn.inputs):
        return None
    base, added = eqn.inputs
    if added not in embeds or added == base:
        base, added = added, base
        if added not in embeds or added == base:
            return None
    folded.add(added)
    embed = embeds[added]
    params = tuple((k, v) for k, v in embed.params if k != "shape")
    return Eqn("embed_add", (base, embed.inputs[0]), eqn.outputs, params, eqn.span)
