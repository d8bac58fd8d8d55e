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

Every target runs it (`fusion.fuse`), and only there: the transforms,
the Dask split and the interpreter never see `embed_add`.  The values are
the adds', in the same order, but for the sign of a zero: a -0.0 that
the first embed places where no later one reaches stays -0.0 (the adds
of the later embeds' zeros made it 0.0).

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
    return replace(fn, eqns=tuple(e for e in eqns if not (e.op == "embed" and e.out in folded)))


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
