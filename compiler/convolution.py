"""Convolutions (`conv1d`, `conv2d`), lowered to primitives.

Contract: `convolution(b, name, x, w, stride, padding, span)` is PyTorch's
`torch.nn.functional.conv{d}d(x, w, stride=stride, padding=padding)`
without bias, groups or dilation (a cross-correlation, as every deep
learning library's): x is (N, C, *spatial), w is (O, C, *kernel) with d
spatial axes, and the result is (N, O, *out), out_i = (spatial_i +
2 padding_i - kernel_i) // stride_i + 1.  `stride` and `padding` are
tuples of d Python ints (the builtin's lowering reads and checks the
arguments); x and w are float arrays of one dtype.  It builds only
primitives (`transpose`, `embed` for the zero padding, strided `slice`,
`concatenate`, `reshape`, `matmul`), so every transform (grad, grad of
grad, jvp, vmap), both targets and the linearity check of grad blocks
apply with no rule of their own.  Every misuse is a `GradError` at
`span` naming `name`; a symbolic spatial, channel or kernel size raises
`NeedsConcrete`.  The batch size may stay symbolic (the batch symbol of
a Dask split: the 2-d product's columns are groups of the batch's).
`windows` (a kernel's strided slices) and `padded` (a zero embedding)
serve pooling too (`compiler.pooling`).

The lowering is im2col, transposed (columns, not rows), batch second: x
is transposed to (C, N, *spatial) and zero padded; each of the
prod(kernel) kernel offsets is one strided slice, (C, N, *out); the
slices are stacked along the first axis to (prod(kernel) * C, N, *out)
and seen as columns (prod(kernel) * C, N * prod(out)), multiplied on
the left by the weight laid out as (O, prod(kernel) * C): one 2-d
product (one BLAS call on the CPU), whose (O, N, *out) result is
transposed to (N, O, *out).  The backward pass is two products too (the
columns' gradient `w^T @ g` and the weight's `g @ columns^T`), and the
columns' gradient goes back to x as one zero-embedding per offset,
summed (col2im).

Why columns: OpenBLAS runs a product with long result rows faster than
its transpose: `w^T @ g`, (144, 32768), took 2.8 ms of CPU on one thread
where the rows' `g @ w`, (32768, 144), took 5.4 (a 3x3 kernel over 16
channels, 32 outputs; the forward product 3.2 against 4.1).  And the
copies run along the last spatial axis, not the channels: each window's
copy into the stack, each col2im add and the padding (runs of 32 f32
against 16 in the benchmark, and the channels and batch axes of a window
merge into one), and the result's transpose to (N, O, *out) moves whole
planes of prod(out) elements.  Channels-last rows took 22-23 ms of CPU
a call for `benchmarks/conv.grad`'s value and gradient on one thread,
the columns 15; on two free cores 14 ms and 10 (JAX's jit 10.5-11).
Where other work holds the cores the columns can be slower: OpenBLAS
splits a product with long result rows between threads that wait for
each other (docs/internals.md, "Convolutions").  An output of one
position along its last axis is lowered by rows (`_by_rows`), whose
window copies run along the channels where the columns' would copy
element by element.
"""
from __future__ import annotations

import itertools

from gradlang.compiler.builder import Builder
from gradlang.compiler.ir import FLOATS, Atom
from gradlang.compiler.shapes import NeedsConcrete, Sym, prod
from gradlang.compiler.values import naming_arguments
from gradlang.runtime.errors import GradError, Span


def windows(b: Builder, x: Atom, first: int, kernel: tuple[int, ...],
            stride: tuple[int, ...], out: tuple[int, ...], span: Span) -> list[Atom]:
    """The windows of x along its axes first, first + 1, ...: for each
    kernel offset (row-major), the strided slice of `out` elements from the
    offset by `stride` along each of those axes, every other axis whole."""
    shape, rank = x.type.shape, x.type.rank
    axes = range(first, first + len(kernel))
    patches = []
    for offset in itertools.product(*(range(k) for k in kernel)):
        starts, stops, steps = [0] * rank, list(shape), [1] * rank
        for axis, o, st, m in zip(axes, offset, stride, out):
            starts[axis], stops[axis], steps[axis] = o, o + st * (m - 1) + 1, st
        if (starts, stops, steps) == ([0] * rank, list(shape), [1] * rank):
            patches.append(x)
        else:
            patches.append(b.bind("slice", x, starts=tuple(starts), stops=tuple(stops),
                                  steps=tuple(steps), span=span))
    return patches


def padded(b: Builder, x: Atom, first: int, padding: tuple[int, ...], span: Span) -> Atom:
    """x embedded in zeros, `padding` more on both sides of its axes first,
    first + 1, ... (x itself without padding)."""
    if not any(padding):
        return x
    shape = list(x.type.shape)
    starts, stops = [0] * len(shape), list(shape)
    for axis, p in zip(range(first, first + len(padding)), padding):
        starts[axis], stops[axis] = p, p + shape[axis]
        shape[axis] += 2 * p
    return b.bind("embed", x, shape=tuple(shape), starts=tuple(starts), stops=tuple(stops),
                  steps=(1,) * len(shape), span=span)


def convolution(b: Builder, name: str, x: Atom, w: Atom, stride: tuple[int, ...],
                padding: tuple[int, ...], span: Span) -> Atom:
    d = len(stride)
    xs, ws = x.type.shape, w.type.shape
    x_axes, w_axes = ("L", "K") if d == 1 else ("H, W", "KH, KW")
    if x.type.rank != d + 2:
        raise GradError(f"{name}() takes an input of rank {d + 2} (N, C, {x_axes}), got "
                        f"shape {list(xs)}", span)
    if w.type.rank != d + 2:
        raise GradError(f"{name}() takes a weight of rank {d + 2} (O, C, {w_axes}), got "
                        f"shape {list(ws)}", span)
    if x.type.dtype not in FLOATS:
        raise GradError(f"{name}() needs float arrays (f32 or f64), got {x.type.dtype}; "
                        f"convert with float32() or float64()", span)
    if any(isinstance(s, Sym) for s in xs[1:] + ws):
        raise NeedsConcrete(f"{name}() of symbolic spatial, channel or kernel sizes")
    channels, spatial = xs[1], xs[2:]
    outs, kernel = ws[0], ws[2:]
    if channels != ws[1]:
        raise GradError(f"{name}() input of shape {list(xs)} has {channels} channels but "
                        f"the weight of shape {list(ws)} takes {ws[1]}", span)
    widths = tuple(s + 2 * p for s, p in zip(spatial, padding))
    if any(k > s for k, s in zip(kernel, widths)):
        raise naming_arguments(padding, f"{name}() kernel {list(kernel)} is larger than the "
                               f"padded input {list(widths)} (input {list(spatial)}, padding "
                               f"{list(padding)})", span)
    out = tuple((s - k) // st + 1 for s, k, st in zip(widths, kernel, stride))
    # the weight as (O, *kernel, C) rows: the order of the stacked taps
    wl = b.bind("transpose", w, perm=(0,) + tuple(range(2, d + 2)) + (1,), span=span)
    wl = b.bind("reshape", wl, shape=(outs, prod(kernel) * channels), span=span)
    lowering = _by_rows if out[-1] == 1 else _by_columns
    return lowering(b, x, wl, kernel, stride, padding, out, span)


def _by_columns(b: Builder, x: Atom, wl: Atom, kernel, stride, padding, out,
                span: Span) -> Atom:
    """The convolution as wl @ columns (the module's docstring)."""
    d, n, outs = len(stride), x.type.shape[0], wl.type.shape[0]
    # x channels first, then the batch, (C, N, *spatial), so that each
    # window's rows are runs along the last spatial axis and the product's
    # columns are (N, *out)
    batch_second = (1, 0) + tuple(range(2, d + 2))
    xl = padded(b, b.bind("transpose", x, perm=batch_second, span=span), 2, padding, span)
    patches = windows(b, xl, 2, kernel, stride, out, span)
    stacked = patches[0] if len(patches) == 1 else \
        b.bind("concatenate", *patches, axis=0, span=span)
    columns = b.bind("reshape", stacked, shape=(wl.type.shape[1], n * prod(out)), span=span)
    product = b.bind("matmul", wl, columns, span=span)
    result = b.bind("reshape", product, shape=(outs, n) + out, span=span)
    return b.bind("transpose", result, perm=batch_second, span=span)


def _by_rows(b: Builder, x: Atom, wl: Atom, kernel, stride, padding, out,
             span: Span) -> Atom:
    """The convolution as rows @ wl^T, channels last: x transposed to (N,
    *spatial, C), each window (N, *out, C), stacked to rows (N * prod(out),
    prod(kernel) * C).  For an output of one position along its last axis,
    where the columns' window copies would run element by element (a 4x4
    kernel over 64x512x4x4 took 1.5-1.8 ms of CPU by rows, 2.7-3.2 by
    columns): rows copy runs of C."""
    d, (n, channels), outs = len(stride), x.type.shape[:2], wl.type.shape[0]
    channels_last = (0,) + tuple(range(2, d + 2)) + (1,)  # (N, C, *s) -> (N, *s, C)
    xl = padded(b, b.bind("transpose", x, perm=channels_last, span=span), 1, padding, span)
    patches = [b.bind("reshape", patch, shape=(n,) + out + (1, channels), span=span)
               for patch in windows(b, xl, 1, kernel, stride, out, span)]
    stacked = patches[0] if len(patches) == 1 else \
        b.bind("concatenate", *patches, axis=d + 1, span=span)
    rows = b.bind("reshape", stacked, shape=(n * prod(out), wl.type.shape[1]), span=span)
    product = b.bind("matmul", rows, b.bind("transpose", wl, perm=(1, 0), span=span), span=span)
    result = b.bind("reshape", product, shape=(n,) + out + (outs,), span=span)
    return b.bind("transpose", result, perm=(0, d + 1) + tuple(range(1, d + 1)), span=span)
