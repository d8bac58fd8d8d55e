"""Sums into zeros: each embedded or scattered value added in place.

Contract: `as_in_place_sums(fn)` returns fn with each `add(a, e)` (either
order), where `e` is read by that add alone and not returned, and a, e
and the sum have one type (no broadcasting), written as an op that adds
into a (`ops.Op.adds_into_first`, which the driver does in place where
it owns a, which nothing else reads):
- `e = embed(x)` becomes `embed_add(a, x)`: x added into the region of a
  that the embed placed it in;
- `e = scatter_add(zeros, idx, v)` (or `scatter_add_along_axis`), with
  zeros a `full` of 0, becomes `scatter_add(a, idx, v)`: v added where
  idx points, touching only those elements; so does a scatter into such
  a scatter (each read by the next alone), as its scatters made into a
  in turn, at the add: two gathers' gradients summed first (`emb[i]`
  and `emb[j]` read on one trip) add two rows into a, where they filled
  a whole array of zeros with them and added it to a.

The embed or scatters are gone (and zeros nothing else reads nor fn
returns); where both operands are such values the first stays (the one
buffer filled with zeros), and a sum of two such scatters is one, the
second's scatters made into the first's.  A chain of embeds, `e1 + e2 + ... + e9` (a strided slice's
transpose summed over a kernel's offsets: col2im in a convolution's or a
pooling's backward pass), becomes one zero-filled buffer and eight
`embed_add`s, which the driver adds in place (it owns each partial sum,
which nothing else reads), where it was nine zero-filled arrays of the
full size and a loop reading all nine.  A gather's gradient summed into
another (`emb[i]` read on every trip of a loop: the embedding's
cotangent carried from trip to trip) is one scatter into the running
sum, in place, where each trip filled and added a whole array of the
embedding's size to add one row (`compiler.codegen` lets a loop's body
own such a carried value).  `a` need not be an embed or a scatter:
`y + embed(x)` adds x into y (a copy of y where the driver does not own
it).  An `embed_add` whose region is disjoint from every region its
base was built of, from an `embed` (`compiler.regions`: proved from the
static slices, symbolic sizes included; where it cannot be, the add
stays), is marked `assign`: the region holds zeros, so x is written
there, not added (a 2x2 pooling's four stride-2 windows, which tile the
buffer: NumPy's strided add read what the zeros had just written, 2.5x
as long as the write).

Every target runs it (`fusion.fuse`), and only there: the transforms,
the Dask split and the interpreter never see `embed_add`, nor a scatter
into a value that is not zeros of their making.  The values are the
adds' but for the sign of a zero (a -0.0 that an embed or scatter places
where no other one reaches stays -0.0: the add of the zeros made it
0.0) and, where a scatter's indices repeat, the rounding: each value is
added into a in turn (np.add.at(a, idx, v)) where their sum was added.

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
from gradlang.compiler.ops import same_value
from gradlang.compiler.regions import disjoint


SCATTERS = ("scatter_add", "scatter_add_along_axis")


def as_in_place_sums(fn: Function) -> Function:
    uses = use_counts(fn.eqns)
    returned = {a for a in fn.outputs if isinstance(a, Var)}
    zeros = {e.out for e in fn.eqns
             if e.op == "full" and same_value(e.p["value"], 0, e.out.type.dtype)}

    def summed_alone(v: Var) -> bool:  # read by one equation, not returned
        return uses.get(v) == 1 and v not in returned

    # each summand: the equations that make it, from zeros (an embed, or
    # scatters each into the last, the first into zeros), still in `out`
    chains: dict[Var, list[Eqn]] = {}
    out: list[Eqn] = []
    moved: set[int] = set()  # (ids of) equations now made at the add
    emptied: dict[Var, int] = {}  # zeros: how many folded scatters no longer read them
    for eqn in fn.eqns:
        folded = _into_in_place_add(eqn, chains, moved, emptied)
        if folded is not None:
            out += folded
            # (the sum of two scatters into zeros is one, to fold into the next)
            base = folded[0].inputs[0]
            if folded[0].op in SCATTERS and base in chains and chains[base][0].op in SCATTERS \
                    and summed_alone(eqn.out):
                chains[eqn.out] = chains.pop(base) + folded
            continue
        out.append(eqn)
        if len(eqn.outputs) != 1 or not summed_alone(eqn.out):
            continue
        if eqn.op == "embed" and isinstance(eqn.inputs[0], Var):
            chains[eqn.out] = [eqn]
        elif eqn.op in SCATTERS and eqn.inputs[0] in zeros:
            chains[eqn.out] = [eqn]
        elif eqn.op in SCATTERS and eqn.inputs[0] in chains \
                and chains[eqn.inputs[0]][0].op in SCATTERS:
            chains[eqn.out] = chains.pop(eqn.inputs[0]) + [eqn]
    if not moved:
        return fn
    # (zeros that fn returns stay: `uses` counts the equations' reads alone)
    gone = {v for v, n in emptied.items() if n == uses[v] and v not in returned}
    return replace(fn, eqns=_assigning([e for e in out if id(e) not in moved
                                        and not set(e.outputs) & gone]))


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


def _into_in_place_add(eqn: Eqn, chains: dict[Var, list[Eqn]], moved: set[int],
                       emptied: dict[Var, int]) -> list[Eqn] | None:
    """`eqn` as an `embed_add`, or as its summand's scatters made into its
    other operand (each into the last), or None where it is not an add of
    one such summand to a value of its type.  The summand's equations are
    `moved` (made here, not where they were)."""
    if eqn.op != "add" or not all(isinstance(a, Var) for a in eqn.inputs):
        return None
    (out,) = eqn.outputs
    if any(a.type != out.type for a in eqn.inputs):
        return None
    base, added = eqn.inputs
    if added not in chains or added == base:
        base, added = added, base
        if added not in chains or added == base:
            return None
    chain = chains.pop(added)
    moved.update(id(e) for e in chain)
    first = chain[0]
    if first.op == "embed":
        params = tuple((k, v) for k, v in first.params if k != "shape")
        return [Eqn("embed_add", (base, first.inputs[0]), eqn.outputs, params, eqn.span)]
    # (each keeps its span: where an index out of range is reported)
    emptied[first.inputs[0]] = emptied.get(first.inputs[0], 0) + 1
    made = [replace(first, inputs=(base,) + first.inputs[1:])] + [replace(e) for e in chain[1:]]
    made[-1] = replace(made[-1], outputs=eqn.outputs)
    return made
