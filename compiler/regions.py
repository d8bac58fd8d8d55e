"""Strided regions of one array, compared at compile time.

Contract: a region is a slice's params `(starts, stops, steps)` of one
array (normalized as `slice.indices` makes them; a symbolic
stop is the axis's end or short of it, `x[1::2]`, `x[:-1]`, a start >= 0
and a step >= 1, as `ops._slice_rule` requires).  `disjoint(r, s)` is True only where
no element lies in both regions, for every value the symbolic sizes may
take; False where it cannot prove it (a symbolic start or step): the
caller then keeps the general path.

Along one axis a region's indices are an arithmetic progression, and two
regions meet only where they meet along every axis; two progressions meet
where a common residue (the Chinese remainder theorem) falls inside both
ranges.  A region to a symbolic stop is the progression from its start
with no end (a superset: disjoint from it is disjoint from the region).
"""
from __future__ import annotations

import math
from typing import Optional

from gradlang.compiler.shapes import Sym

Region = tuple[tuple, tuple, tuple]  # (starts, stops, steps)
# (first, last, step > 0) of an axis's indices in ascending order; None: none
Progression = Optional[tuple[int, float, int]]


def disjoint(r: Region, s: Region) -> bool:
    axes_r, axes_s = _progressions(r), _progressions(s)
    if axes_r is None or axes_s is None:
        return False
    return any(a is None or b is None or not _meet(a, b) for a, b in zip(axes_r, axes_s))


def _progressions(region: Region) -> Optional[list[Progression]]:
    """Each axis's progression, or None where a size it needs is symbolic."""
    out: list[Progression] = []
    for start, stop, step in zip(*region):
        if isinstance(start, Sym) or isinstance(step, Sym):
            return None
        if isinstance(stop, Sym):  # (to the end of an axis, or shortened: `x[1::2]`)
            if start < 0 or step < 1:
                return None
            out.append((start, math.inf, step))
            continue
        indices = range(start, stop, step)
        out.append((min(indices[0], indices[-1]), max(indices[0], indices[-1]), abs(step))
                   if indices else None)
    return out


def _meet(a: tuple, b: tuple) -> bool:
    """Whether two nonempty progressions share an index."""
    (f1, l1, s1), (f2, l2, s2) = a, b
    g = math.gcd(s1, s2)
    if (f2 - f1) % g:
        return False
    # x = f1 + k s1 with x = f2 (mod s2): k = (f2 - f1)/g * (s1/g)^-1 (mod s2/g)
    k = (f2 - f1) // g * pow(s1 // g, -1, s2 // g) % (s2 // g)
    first, period = f1 + k * s1, s1 // g * s2
    low = max(f1, f2)
    if first < low:
        first += -((first - low) // period) * period
    return first <= min(l1, l2)
