"""Pooling (`max_pool1d`/`max_pool2d`, `avg_pool1d`/`avg_pool2d`), lowered
to primitives.

Contract: `pooling(b, name, x, kernel, stride, padding, span)` is PyTorch's
`torch.nn.functional.{max,avg}_pool{d}d(x, kernel, stride, padding)` with
its defaults otherwise (no dilation, floor mode; an average counts the
padding, `count_include_pad=True`): x is (N, C, *spatial) with d spatial
axes, a float array, and the result is (N, C, *out), out_i = (spatial_i +
2 padding_i - kernel_i) // stride_i + 1.  `kernel`, `stride` and
`padding` are tuples of d Python ints (the builtin's lowering reads
them); a padding is at most half its kernel, as PyTorch requires.  A
maximum pads with -inf (a window of padding alone cannot occur), an
average with zeros.  Every misuse is a `GradError` at `span` naming
`name`; a symbolic spatial size raises `NeedsConcrete` (the batch and
channels may be symbolic).

Only primitives are built, so every transform applies with no rule of its
own; the gradient of a maximum is `reduce_max`'s, shared equally among the
elements of a window that attain it (as `max` does everywhere in the
language; PyTorch and JAX give it all to one of them).  The windows are
the kernel's offsets as strided slices (`convolution.windows`): an
average sums them (elementwise, one fused pass), a maximum stacks them
along a new first axis and reduces it: each window is copied whole into
its plane, and the reductions and the gradient's masks run over whole
planes (stacked along a last axis, each window was scattered into every
k-th element, and each row of k reduced alone: the stem's value and
gradient took 1.5x the time).  Dask's row split follows the batch axis
from the second axis back to the first (`compiler.batching`).  (Windows
that tile the input, seen as a reshape to (N, C, Ho, KH, Wo, KW) reduced
over the kernel axes, took ten times as long: a reduction over
interleaved axes is NumPy's.)
"""
from __future__ import annotations

import math

from gradlang.compiler.builder import Builder
from gradlang.compiler.convolution import padded, windows
from gradlang.compiler.ir import FLOATS, Atom
from gradlang.compiler.ops import full
from gradlang.compiler.shapes import NeedsConcrete, Sym
from gradlang.compiler.values import naming_arguments
from gradlang.runtime.errors import GradError, Span


def pooling(b: Builder, name: str, x: Atom, kernel: tuple[int, ...], stride: tuple[int, ...],
            padding: tuple[int, ...], span: Span) -> Atom:
    d, shape = len(kernel), x.type.shape
    if x.type.rank != d + 2:
        axes = "L" if d == 1 else "H, W"
        raise GradError(f"{name}() takes an input of rank {d + 2} (N, C, {axes}), got shape "
                        f"{list(shape)}", span)
    if x.type.dtype not in FLOATS:
        raise GradError(f"{name}() needs a float array (f32 or f64), got {x.type.dtype}; "
                        "convert with float32() or float64()", span)
    spatial = shape[2:]
    if any(isinstance(s, Sym) for s in spatial):
        raise NeedsConcrete(f"{name}() of symbolic spatial sizes")
    if any(2 * p > k for p, k in zip(padding, kernel)):
        raise GradError(f"{name}() padding {list(padding)} is more than half the kernel "
                        f"{list(kernel)}", span)
    widths = tuple(s + 2 * p for s, p in zip(spatial, padding))
    if any(k > w for k, w in zip(kernel, widths)):
        raise naming_arguments(kernel + padding, f"{name}() kernel {list(kernel)} is larger "
                               f"than the padded input {list(widths)} (input {list(spatial)}, "
                               f"padding {list(padding)})", span)
    out = tuple((w - k) // st + 1 for w, k, st in zip(widths, kernel, stride))
    maximum = name.startswith("max")
    if maximum and any(padding):
        source = padded_with_minus_infinity(b, x, 2, padding, span)
    else:
        source = padded(b, x, 2, padding, span)
    patches = windows(b, source, 2, kernel, stride, out, span)
    if not maximum:
        total = patches[0]
        for patch in patches[1:]:
            total = b.bind("add", total, patch, span=span)
        return b.bind("div", total, b.lit(math.prod(kernel), x.type.dtype), span=span)
    if len(patches) == 1:
        return patches[0]
    window_shape = patches[0].type.shape
    stacked = b.bind("concatenate", *(b.bind("reshape", p, shape=(1,) + window_shape, span=span)
                                      for p in patches), axis=0, span=span)
    return b.bind("reduce_max", stacked, axes=(0,), span=span)


def padded_with_minus_infinity(b: Builder, x: Atom, first: int, padding: tuple[int, ...],
                               span: Span) -> Atom:
    """x between borders of -inf, `padding` wide on both sides of its axes
    first, first + 1, ...: a concatenation per axis, whose gradient is a
    slice (an embedding in zeros masked to -inf by `where` took three more
    passes over the padded array, and its gradient a fourth)."""
    for axis, p in zip(range(first, first + len(padding)), padding):
        if p:
            border = full(b, -math.inf, x.type.shape[:axis] + (p,) + x.type.shape[axis + 1:],
                          x.type.dtype, span)
            x = b.bind("concatenate", border, x, border, axis=axis, span=span)
    return x
