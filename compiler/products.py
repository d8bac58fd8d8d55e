"""Matrix products and `einsum`, lowered to primitives.

Contract: `matmul(b, x, y, span)` is NumPy's `np.matmul` of two arrays of
one dtype, of any ranks >= 1: a rank-1 operand is a row (on the left) or a
column (on the right) whose added axis the result drops, and the batch
axes (all but the last two) broadcast.  `einsum(b, subscripts, operands,
span)` is NumPy's `np.einsum` for subscripts of letters (explicit `->` or
implicit: the letters named once, in alphabetical order), size-1 axes
broadcasting; a letter repeated within one operand (a diagonal) and `...`
are refused.  Both build only primitives (`matmul`, `transpose`,
`reshape`, `broadcast_to`, `mul`, `reduce_sum`), so every transform
applies with no rule of their own; every misuse is a `GradError` at
`span` (einsum's subscript errors at the string), and a symbolic size
meeting a fixed one raises `NeedsConcrete`.

The IR's `matmul` multiplies operands of one rank with broadcasting batch
axes (NumPy's BLAS per matrix on the CPU).  Where the right operand has
no batch axes, the left one's are folded into its rows instead: one 2-d
product (one BLAS call) forward and backward, whose weight gradient is
one product too rather than a batch of them summed.
"""
from __future__ import annotations

from typing import Sequence

from gradlang.compiler import ast
from gradlang.compiler.builder import Builder
from gradlang.compiler.ir import Atom
from gradlang.compiler.shapes import Dim, NeedsConcrete, Sym, prod
from gradlang.runtime.errors import GradError, Span


def _same_size(a: Dim, b: Dim) -> bool:
    """Whether two sizes are equal; a symbol against a fixed size needs
    concrete sizes (distinct symbols are distinct sizes)."""
    if isinstance(a, Sym) != isinstance(b, Sym):
        raise NeedsConcrete(f"the size {a} meets the size {b}")
    return a == b


def _broadcast(dims: Sequence[Dim]) -> Dim | None:
    """The size that dims broadcast to (NumPy's rule for one axis), or None."""
    sizes: list[Dim] = []
    for d in dims:
        if d != 1 and not any(_same_size(d, s) for s in sizes):
            sizes.append(d)
    return None if len(sizes) > 1 else (sizes[0] if sizes else 1)


def _reshaped(b: Builder, x: Atom, shape: tuple, span: Span | None = None) -> Atom:
    return x if x.type.shape == tuple(shape) else b.bind("reshape", x, shape=tuple(shape),
                                                         span=span)


def _permuted(b: Builder, x: Atom, perm: Sequence[int], span: Span | None = None) -> Atom:
    perm = tuple(perm)
    return x if perm == tuple(range(len(perm))) else b.bind("transpose", x, perm=perm,
                                                           span=span)


# ------------------------------------------------------------------ matmul


def matmul(b: Builder, x: Atom, y: Atom, span: Span) -> Atom:
    xs, ys = x.type.shape, y.type.shape
    shapes = f"shapes {list(xs)} and {list(ys)}"
    if x.type.rank == 0 or y.type.rank == 0:
        raise GradError(f"@ needs arrays of rank 1 or more, got {shapes} (scale with *)", span)
    inner = ys[-2] if y.type.rank > 1 else ys[0]
    if not _same_size(xs[-1], inner):
        raise GradError(f"@ {shapes} do not match: the first's last axis ({xs[-1]}) against "
                        f"the second's {'next-to-last' if y.type.rank > 1 else 'only'} axis "
                        f"({inner})", span)
    x2 = x if x.type.rank > 1 else _reshaped(b, x, (1,) + xs, span)
    y2 = y if y.type.rank > 1 else _reshaped(b, y, ys + (1,), span)
    x_batch, y_batch = x2.type.shape[:-2], y2.type.shape[:-2]
    rank = max(len(x_batch), len(y_batch))
    lined = [(1,) * (rank - len(s)) + s for s in (x_batch, y_batch)]
    batch = tuple(_broadcast(dims) for dims in zip(*lined))
    if None in batch:
        raise GradError(f"@ {shapes}: the batch axes {list(x_batch)} and {list(y_batch)} "
                        f"do not broadcast", span)
    m, n = x2.type.shape[-2], y2.type.shape[-1]
    if not y_batch:  # the left side's batch folded into its rows: one 2-d product
        rows = _reshaped(b, x2, (prod(x_batch) * m, xs[-1]), span)
        out = b.bind("matmul", rows, y2, span=span)
    else:
        out = b.bind("matmul", _reshaped(b, x2, lined[0] + x2.type.shape[-2:], span),
                     _reshaped(b, y2, lined[1] + y2.type.shape[-2:], span), span=span)
    shape = batch + ((m,) if x.type.rank > 1 else ()) + ((n,) if y.type.rank > 1 else ())
    return _reshaped(b, out, shape, span)


# ------------------------------------------------------------------ einsum


def einsum(b: Builder, subscripts, operands: Sequence[Atom], span: Span) -> Atom:
    if not isinstance(subscripts, ast.Str):
        raise GradError('einsum() takes its subscripts as a string literal first, as in '
                        'einsum("ij,jk->ik", a, b)', span)
    at = subscripts.span
    terms, output = _parse(subscripts.value, len(operands), at)
    sizes: dict[str, Dim] = {}
    for k, (term, x) in enumerate(zip(terms, operands)):
        if len(term) != x.type.rank:
            raise GradError(f"einsum operand {k} has rank {x.type.rank} (shape "
                            f"{list(x.type.shape)}) but its subscripts {term!r} name "
                            f"{len(term)} axes", at)
        for letter, d in zip(term, x.type.shape):
            size = _broadcast([sizes.get(letter, 1), d])
            if size is None:
                raise GradError(f"einsum: {letter!r} is {sizes[letter]} long in one operand "
                                f"and {d} in operand {k} (shape {list(x.type.shape)})", at)
            sizes[letter] = size
    # size-1 axes broadcast as NumPy's einsum does, then letters that only
    # one operand names and the output does not are summed at once
    named = [letter for term in terms for letter in term]
    values = []
    for term, x in zip(terms, operands):
        full = tuple(sizes[letter] for letter in term)
        if x.type.shape != full:
            x = b.bind("broadcast_to", x, shape=full, span=span)
        alone = [i for i, letter in enumerate(term)
                 if named.count(letter) == 1 and letter not in output]
        if alone:
            x = b.bind("reduce_sum", x, axes=tuple(alone), span=span)
        values.append((tuple(c for i, c in enumerate(term) if i not in alone), x))
    letters, value = values[0]
    for k in range(1, len(values)):
        later = set(output).union(*(term for term, _ in values[k + 1:]))
        letters, value = _pair(b, (letters, value), values[k], later, sizes, span)
    return _permuted(b, value, [letters.index(letter) for letter in output], span)


def _pair(b: Builder, first: tuple, second: tuple, later: set, sizes: dict, span: Span
          ) -> tuple[tuple, Atom]:
    """Two operands (letters, value) as one whose letters are those `later`
    (the output and the operands still to come) reads: the letters both
    name and none later reads are contracted by a (batched) `matmul` over
    the letters both name and later reads; with none to contract, a
    broadcast `mul` (an outer product)."""
    (a, x), (c, y) = first, second
    batch = [k for k in a if k in c and k in later]
    summed = [k for k in a if k in c and k not in later]
    rows, cols = [k for k in a if k not in c], [k for k in c if k not in a]
    dims = lambda letters: tuple(sizes[k] for k in letters)  # noqa: E731
    if not summed:
        x = _reshaped(b, _permuted(b, x, [a.index(k) for k in batch + rows], span),
                     dims(batch + rows) + (1,) * len(cols), span)
        y = _reshaped(b, _permuted(b, y, [c.index(k) for k in batch + cols], span),
                     dims(batch) + (1,) * len(rows) + dims(cols), span)
        return tuple(batch + rows + cols), b.bind("mul", x, y, span=span)
    x = _reshaped(b, _permuted(b, x, [a.index(k) for k in batch + rows + summed], span),
                 dims(batch) + (prod(dims(rows)), prod(dims(summed))), span)
    y = _reshaped(b, _permuted(b, y, [c.index(k) for k in batch + summed + cols], span),
                 dims(batch) + (prod(dims(summed)), prod(dims(cols))), span)
    out = b.bind("matmul", x, y, span=span)
    return tuple(batch + rows + cols), _reshaped(b, out, dims(batch + rows + cols), span)


def _parse(text: str, n: int, at: Span) -> tuple[list[str], str]:
    """The operands' subscripts and the output's (implicit: the letters
    named once, in order)."""
    text = text.replace(" ", "")
    if "..." in text:
        raise GradError("einsum() does not take '...': name every axis with a letter", at)
    left, arrow, output = text.partition("->")
    if "->" in output:
        raise GradError("einsum subscripts hold one '->'", at)
    terms = left.split(",")
    for char in left.replace(",", "") + output:
        if not (char.isascii() and char.isalpha()):
            raise GradError(f"einsum subscripts are letters, ',' and '->', not {char!r}", at)
    if len(terms) != n:
        raise GradError(f"einsum subscripts {text!r} name {len(terms)} operand"
                        f"{'s' * (len(terms) != 1)}, but {n} {'was' if n == 1 else 'were'} "
                        f"given", at)
    for term in terms:
        for letter in term:
            if term.count(letter) > 1:
                raise GradError(f"einsum subscripts {term!r} repeat {letter!r} within one "
                                f"operand (a diagonal), which is not supported", at)
    named = "".join(terms)
    if not arrow:
        return terms, "".join(sorted(c for c in set(named) if named.count(c) == 1))
    for letter in output:
        if output.count(letter) > 1:
            raise GradError(f"einsum output {output!r} repeats {letter!r}", at)
        if letter not in named:
            raise GradError(f"einsum output letter {letter!r} is in no operand's subscripts",
                            at)
    return terms, output
