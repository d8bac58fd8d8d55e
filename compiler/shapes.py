"""Array sizes that are not known until call time.

Contract: a dimension (`Dim`) is an `int` or a `Sym`, the product of a
coefficient and named factors (`n`, `n*m`, `3*n`).  Symbolic lowering gives
each distinct size of a call's arguments a symbol, so one lowered program
and one set of kernels serve every call whose sizes repeat the same
pattern; `gradc compile --sig 'f(f64[:])'` builds programs for any size.
Sizes multiply symbolically (up to `MAX_FACTORS` factors), and a slice's
length min(ceil(max(0, n - c) / s), k) (`x[1:]`, `x[:n - 1]`, `range(n -
1)`, `x[1::2]`, `x[-2:]`, `x[::-1]`) is a size of its own (`derivation`),
and a concatenation's length of multiples of one product is its multiple
(`total`); anything else a program does with a size (adding to it,
slicing a symbolic axis from a start counted from its end to a fixed
stop, comparing it with a fixed size) raises `NeedsConcrete`, and the
caller lowers again with concrete
sizes (or, ahead of time, reports that the signature needs them); but a
float that arithmetic makes of a size (`0.1 / k`) the lowerer computes at
run time instead (`compiler.lower.Lowerer.size_number`).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Iterable, Optional, Union


class NeedsConcrete(Exception):
    """A program used a symbolic size in a way that needs its value;
    `spans`: the expressions whose lowering raised it, innermost first (a
    call's lowering in another file's function, then the call)."""

    spans = ()

    def at(self, fallback):
        """Where to report it: its innermost expression in fallback's file
        (whose source the error shows: the call leading into another
        file's function), else fallback (a function's span)."""
        return next((s for s in self.spans if s.file == fallback.file), fallback)


class NeedsValue(Exception):
    """A program used a run-time integer argument as a size (`segment_sum`'s
    count): it must be compiled for the argument's value, as for a `const`
    one (`dsl.function.Compiled` does so and calls again)."""

    def __init__(self, name: str):
        super().__init__(f"argument {name!r} is used as a size")
        self.name = name


# The most factors a symbolic size has: no array's size needs more (one
# per axis), and a product past it is computed with concrete sizes, where
# compile-time arithmetic bounds the numbers (`compiler.lower._fold`).
MAX_FACTORS = 1024


@dataclass(frozen=True)
class Sym:
    factors: tuple[str, ...]
    coef: int = 1
    # The dtype of the run-time scalar this size stands for where a
    # by-value integer argument's number made it (`x.shape[0] * k`: i32 for
    # an i32 k, as that product is where k is not taken by value; see
    # `compiler.values.RunTimeInt`), else None: a size, weakly typed as a
    # literal is.  Not part of the size: equal sizes are equal whatever
    # made them, and arithmetic on sizes (`Sym.__mul__`) and a shape read
    # back (`plain_size`) drop it.
    dtype: Optional[str] = field(default=None, compare=False)

    @staticmethod
    def named(name: str) -> "Sym":
        return Sym((name,))

    def __mul__(self, other):
        if isinstance(other, Sym):
            if len(self.factors) + len(other.factors) > MAX_FACTORS:
                # (`a = a * a` repeated doubled the factors: 30 times, 2**30)
                raise NeedsConcrete(f"a size is a product of more than {MAX_FACTORS} sizes")
            return Sym(tuple(sorted(self.factors + other.factors)), self.coef * other.coef)
        if isinstance(other, int) and not isinstance(other, bool):
            return 0 if other == 0 else Sym(self.factors, self.coef * other)
        if isinstance(other, (bool, float)):  # `x.shape[0] * 0.5`: a number, not a size
            return self._concrete()
        return NotImplemented

    __rmul__ = __mul__

    def _concrete(self, *_):
        raise NeedsConcrete(f"the size {self} is used as a number")

    __add__ = __radd__ = __sub__ = __rsub__ = __floordiv__ = __rfloordiv__ = _concrete
    __mod__ = __rmod__ = __truediv__ = __rtruediv__ = __pow__ = __rpow__ = _concrete
    __neg__ = _concrete
    __lt__ = __le__ = __gt__ = __ge__ = __index__ = __int__ = __float__ = _concrete

    def __bool__(self) -> bool:
        return True

    def __str__(self) -> str:
        text = "*".join(map(shown, self.factors))
        return text if self.coef == 1 else f"{self.coef}*{text}"

    __repr__ = __str__


def made_up(stem: str, tag: object) -> Sym:
    """A size the compiler names itself (a loop's trip count, a param's
    size that no argument gives), apart from every size a user names: those
    are ASCII identifiers (the grammar's NAME, `gradc compile --sig`), and
    this one holds a middle dot, which none can.  A name shared by accident
    made one size of two (a --sig's size `trip0` was a trip count's, and
    the gradient of the argument of that size took the trip count's
    length).  Still an identifier, NFKC-stable, for the driver's
    `size_` variable (`codegen.size_variable`)."""
    return Sym.named(f"{stem}\u00b7{tag}")


Dim = Union[int, Sym]


# A size that a slice takes of an axis of size `n`: ceil(max(0, n - c) /
# s) (`x[1:]`, `x[:-1]`: s = 1; `x[1::2]`: c = 1, s = 2), clamped at 0 as
# NumPy's slice is, and at most k where the slice stops at k (`x[:k]`) or
# takes the last k (`x[-k:]`): min(ceil(max(0, n - c) / s), k).  A size
# of its own, named for how it is made (`n\u00b7less1`,
# `n\u00b7less1\u00b7every2`, `n\u00b7upto3`, apart from every name a user
# writes: `made_up`), so that any driver, kernel or caller that knows `n`
# computes it (`derivation`), in this process or in a module compiled
# ahead of time.  The family is closed under slicing (`sliced`,
# `limited`), and each size has one name: a slice a::t of ceil(max(0, n -
# c) / s) elements is ceil(max(0, n - c - a s) / (s t)), and of at most k
# elements at most ceil(max(0, k - a) / t) (the length is a nondecreasing
# function of the axis's), so `x[:3][1:]` and `x[1:][-2:]` are one size.
# Only of a lone symbol (coefficient 1): one of `2*n` or `n*m` needs
# concrete sizes.
_DERIVED = re.compile(
    r"(.+?)(?:\u00b7less([0-9]+)(?:\u00b7every([0-9]+))?)?(?:\u00b7upto([0-9]+))?")


def is_lone(d: Dim) -> bool:
    """Whether d is one symbol alone (`n`, not `2*n`, `n*m` or a number)."""
    return isinstance(d, Sym) and d.coef == 1 and len(d.factors) == 1


def derivation(factor: str) -> "tuple[str, int, int, Optional[int]] | None":
    """(n, c, s, k) for the factor of a size min(ceil(max(0, n - c) / s), k)
    (k None: no bound) made of the symbol n, else None (a symbol that an
    argument binds)."""
    match = _DERIVED.fullmatch(factor)
    root, less, every, upto = match.groups()
    if (less, upto) == (None, None):
        return None
    return root, int(less or 0), int(every or 1), None if upto is None else int(upto)


def _parts(d: Sym) -> "tuple[str, int, int, Optional[int]]":
    """`derivation` of a lone size, (d, 0, 1, None) for a symbol itself."""
    if not is_lone(d):
        raise NeedsConcrete(f"a slice of an axis of size {d}")
    return derivation(d.factors[0]) or (d.factors[0], 0, 1, None)


def _made(root: str, less: int, every: int, upto: Optional[int]) -> Dim:
    """The size min(ceil(max(0, root - less) / every), upto) (its one name)."""
    if upto == 0:
        return 0
    if (less, every, upto) == (0, 1, None):
        return Sym.named(root)
    name = root + (f"\u00b7less{less}" if (less, every) != (0, 1) else "")
    name += f"\u00b7every{every}" if every > 1 else ""
    return Sym.named(name + (f"\u00b7upto{upto}" if upto is not None else ""))


def slice_length(size: int, less: int, every: int) -> int:
    """ceil(max(0, size - less) / every): the elements of a slice less::every
    of `size` (NumPy's, for less >= 0, every >= 1)."""
    return -(-max(0, size - less) // every)


def sliced(d: Sym, start: int, step: int) -> Dim:
    """The length of the slice start::step (start >= 0, step >= 1) of an
    axis of a lone size d: ceil(max(0, d - start) / step), for d itself
    such a length of its base n, ceil(max(0, n - c) / s), that of n with
    c + start s and s step (the elements start s apart of those s apart
    are s step apart, from c + start s), and at most k where d is: at
    most that slice of k."""
    if (start, step) == (0, 1):
        return d
    if start < 0 or step < 1:
        raise NeedsConcrete(f"the size {d} is sliced {start}::{step}")
    root, less, every, upto = _parts(d)
    return _made(root, less + start * every, every * step,
                 None if upto is None else slice_length(upto, start, step))


def shortened(d: Sym, by: int) -> Dim:
    """The size max(0, d - by) of a lone symbol d, by >= 0: d's elements
    but its last `by` (of a size already shortened, shortened once by the
    sum: max(0, max(0, n - a) - b) is max(0, n - a - b); of one of every
    s-th element, by s steps of its base)."""
    if by < 0:
        raise NeedsConcrete(f"the size {d} is shortened by {by}")
    return sliced(d, by, 1)


def limited(d: Sym, k: int) -> Dim:
    """The size min(d, k) of a lone symbol d, k >= 0: the elements of
    `x[:k]` and of `x[-k:]` (of a size already limited, by the lesser k)."""
    if k < 0:
        raise NeedsConcrete(f"the size {d} is limited to {k}")
    root, less, every, upto = _parts(d)
    return _made(root, less, every, k if upto is None else min(upto, k))


def region_size(start: "int | Sym", stop: "int | Sym", step: int, axis: Dim) -> Dim:
    """How many elements start:stop:step selects of an axis of size
    `axis`, up to a symbolic stop: from an int start, ceil(max(0, stop -
    start) / step) (`sliced`); from a symbolic one, of the stop's last k
    (`x[-k:]`, `x[-k::2]`: a start of max(0, stop - k), `shortened`),
    ceil(min(stop, k) / step) (`limited`).  Of a negative step, from the
    element d + 1 from the axis's end (a start of max(0, axis - d - 1))
    down to an int stop (-1: past the front), ceil(max(0, axis - d - 1 -
    stop) / -step) (`sliced`)."""
    if step < 0:
        back = _distance(start, axis)
        return sliced(axis, back + stop, -step)
    if not isinstance(start, Sym):
        return sliced(stop, start, step)
    kept = limited(stop, _distance(start, stop))
    return sliced(kept, 0, step) if isinstance(kept, Sym) else kept


def _distance(start: Sym, axis: Sym) -> int:
    """d where start is the size `shortened(axis, d)`, d > 0."""
    (root, less, every, _), (axis_root, axis_less, axis_every, _) = map(_parts, (start, axis))
    back, apart = divmod(less - axis_less, every)
    if (root, every) != (axis_root, axis_every) or back <= 0 or apart \
            or shortened(axis, back) != start:
        raise NeedsConcrete(f"a slice from {start} of an axis of {axis}")
    return back


def shortened_by(d: Dim) -> int:
    """c for a size min(ceil(max(0, n - c) / s), k) (`derivation`), else 0."""
    made = derivation(d.factors[0]) if is_lone(d) else None
    return made[1] if made else 0


def step_of(d: Dim) -> int:
    """s for a size min(ceil(max(0, n - c) / s), k) (`derivation`), else 1."""
    made = derivation(d.factors[0]) if is_lone(d) else None
    return made[2] if made else 1


def bound_of(d: Dim) -> Optional[int]:
    """k for a size min(ceil(max(0, n - c) / s), k) (`derivation`), else
    None (no bound)."""
    made = derivation(d.factors[0]) if is_lone(d) else None
    return made[3] if made else None


def shown(factor: str) -> str:
    """A factor as a message shows it: a slice's length as what it is."""
    made = derivation(factor)
    if made is None:
        return factor
    root, less, every, upto = made
    text = f"max(0, {root} - {less})" if less else root
    text = text if every == 1 else f"ceil({text} / {every})"
    return text if upto is None else f"min({text}, {upto})"


def is_shortened(d) -> bool:
    """Whether d is a size min(ceil(max(0, n - c) / s), k) with c > 0: one
    that may be a number n - c clamped at 0 (`shortened`)."""
    return isinstance(d, Sym) and shortened_by(d) > 0


def base_of(factor: str) -> str:
    """The size a factor is computed from: the symbol n for a slice's
    length of n (`derivation`), else the factor itself."""
    made = derivation(factor)
    return factor if made is None else made[0]


def computable(d: Dim, names) -> bool:
    """Whether `evaluate` computes d from a binding of `names`: each
    factor bound, or a slice's length of a size bound."""
    return not isinstance(d, Sym) or all(f in names or base_of(f) in names for f in d.factors)


def derived_value(made: tuple, size: int) -> int:
    """A slice's length (`derivation`'s made: n, c, s, k) for n of `size`."""
    _, less, every, upto = made
    length = slice_length(size, less, every)
    return length if upto is None else min(length, upto)


def shortened_value(factor: str, binding: dict[str, int]) -> int:
    """A factor's value: bound, else a slice's length from its base's."""
    if factor in binding:
        return binding[factor]
    made = derivation(factor)
    if made is None:
        raise KeyError(factor)
    return derived_value(made, binding[made[0]])


def total(sizes: Iterable[Dim]) -> Dim:
    """The sum of sizes (a concatenation's length): of ints, an int; of
    multiples of one product of symbols, its multiple (n + n is 2*n, n*m +
    2*n*m is 3*n*m); anything else (n + m, n + 1) is no `Dim`, a sum of
    products: NeedsConcrete."""
    sizes = list(sizes)
    if not any(isinstance(d, Sym) for d in sizes):
        return sum(sizes)
    products = {d.factors if isinstance(d, Sym) else () for d in sizes}
    if len(products) != 1:
        raise NeedsConcrete(f"the sizes {' + '.join(map(str, sizes))} are added")
    return Sym(products.pop(), sum(d.coef for d in sizes))


def plain_size(d: Dim) -> Dim:
    """d as a size, weakly typed: a `Sym` without the dtype of the
    run-time scalar that made it (`x.shape[0]` of an array whose length
    is `n * k` is a size, as it is where that length is a number)."""
    return replace(d, dtype=None) if isinstance(d, Sym) and d.dtype is not None else d


def prod(dims: Iterable[Dim]) -> Dim:
    return math.prod(dims, start=1)


def quotient(a: Dim, b: Dim) -> "Dim | None":
    """a / b where that is a size for every value of their symbols (b's
    factors among a's and its coefficient dividing a's: `(n * t * d) / d`
    is `n * t`), else None (an int a not divisible, or one that needs the
    symbols' values)."""
    fa, ca = (a.factors, a.coef) if isinstance(a, Sym) else ((), a)
    fb, cb = (b.factors, b.coef) if isinstance(b, Sym) else ((), b)
    rest = list(fa)
    for f in fb:
        if f not in rest:
            return None
        rest.remove(f)
    if cb == 0 or ca % cb:
        return None
    return Sym(tuple(rest), ca // cb) if rest else ca // cb


def evaluate(d: Dim, binding: dict[str, int]) -> int:
    if isinstance(d, Sym):
        return d.coef * math.prod(shortened_value(f, binding) for f in d.factors)
    return d


def broadcasts_to(small, big) -> bool:
    """Whether a shape broadcasts to another (NumPy's rule, right-aligned)."""
    small, big = tuple(small), tuple(big)
    if len(small) > len(big):
        return False
    return all(s in (1, b) for s, b in zip(small[::-1], big[::-1]))


def access_kind(shape: tuple[int, ...], loop: tuple[int, ...]) -> str:
    """How a loop over `loop` reads an input of `shape` at flat index i:
    "full", "scalar", "suffix" (the loop's trailing axes, repeated),
    "outer" (its leading axes, each element held over the trailing ones),
    else "general" (runs of its axes, broadcast along the others:
    `kept_runs`)."""
    if shape == loop:
        return "full"
    if prod(shape) == 1:
        return "scalar"
    trimmed = shape[next((k for k, d in enumerate(shape) if d != 1), len(shape)):]
    if trimmed == loop[len(loop) - len(trimmed):]:
        return "suffix"
    padded = (1,) * (len(loop) - len(shape)) + shape
    j = next((k for k in range(len(loop), -1, -1) if padded[:k] == loop[:k]), 0)
    if all(d == 1 for d in padded[j:]):
        return "outer"
    return "general"


def kept_runs(shape: tuple, loop: tuple) -> list[tuple[int, int]]:
    """The runs [a, b) of the loop's axes that an input of `shape` (which
    broadcasts to `loop`) has, the longest runs of axes it has as the
    loop does, in order: an input broadcast elsewhere (size 1 where the
    loop is not) reads element sum over runs of ((i // S) % P) T at the
    loop's element i, S the product of the loop's axes after the run, P
    the run's, T the input's after the run.  A run of the loop's axes of
    size 1 alone is left out (its term is 0): as the last run it made the
    rows one element long, `(C, 1, 1)` over `(N, C, H, 1)` read per
    element (40x the time of the same data over `(N, C, H)`)."""
    padded = (1,) * (len(loop) - len(shape)) + tuple(shape)
    runs: list[tuple[int, int]] = []
    for k, (d, n) in enumerate(zip(padded, loop)):
        if d != n:
            continue
        if runs and runs[-1][1] == k:
            runs[-1] = (runs[-1][0], k + 1)
        else:
            runs.append((k, k + 1))
    # (an input with none but those is a scalar: "scalar" access, no runs)
    return [(a, b) for a, b in runs if prod(loop[a:b]) != 1] or runs


def broadcast_runs(shape: tuple, loop: tuple) -> list[tuple[int, int]]:
    """`kept_runs` of an input that broadcasts to the loop (NumPy's rule);
    none for one that does not (a row loop's value per row, of the rows'
    shape, which the row kernel reads per row)."""
    return kept_runs(shape, loop) if broadcasts_to(shape, loop) else []
