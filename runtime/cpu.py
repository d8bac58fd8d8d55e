"""The CPU target: its `Target` (`TARGET`, at the end) and the helpers that
generated drivers call (imported there as `R`).

Contract: every function takes and returns NumPy arrays; none modifies its
inputs.  Gathers and scatter-adds (`take`, ...) raise `ArgumentError` for an
index out of range before returning anything.  Reductions run over an
(outer, reduced, inner) view of a contiguous array, accumulating floats in
f64 and integers in i64: over rows (inner 1) in Numba kernels (sums with
`cpu_math.accumulate`, maxima with `cpu_math.greatest`, so that they
vectorize), over a middle axis in NumPy's ufunc reductions, which add whole
inner rows in order and vectorize as well, with no kernel to compile.
Cumulative sums (`cumsum`) add in order in the array's own dtype, as NumPy.
matmul calls NumPy's BLAS, which no loop written here would beat.
"""
from __future__ import annotations

import builtins
import hashlib
import math
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, Optional, Sequence

import numba
import numpy as np
from numba import prange

from gradlang.runtime import branch_free, common, cpu_math, memory
from gradlang.runtime.common import (  # noqa: F401 (drivers call R.size_mismatch, R.into)
    axis_runs,
    empty_axis,
    fillable,
    derived_size_mismatch,
    fixed_size_mismatch,
    iota,
    index_out_of_range,
    index_views,
    into,
    nonzero_divisor,
    shortened_size_mismatch,
    size_mismatch,
    size_too_small,
    slice_layout,
    Where,
)
from gradlang.runtime.errors import ArgumentError
from gradlang.runtime.loader import jit_in_kernel_cache
from gradlang.runtime.parallelism import (  # drivers call R.parallel_allowed
    blas_called, parallel_allowed)
from gradlang.runtime.target import Target, is_device_array, largest, smallest

# Below this many elements a reduction, or a loop of arithmetic, runs on one
# thread: waking the thread pool costs more than it saves below a few tens
# of thousands.
PARALLEL_THRESHOLD = 1 << 15
# ... and however costly each element, a loop this short is not worth it.
MIN_PARALLEL_THRESHOLD = 1 << 11


def flat(x: np.ndarray) -> np.ndarray:
    """A contiguous 1-d view (or copy) for a kernel argument.  A contiguous
    1-d array, the common case, is one already: returned as it is, which
    costs a third of the general case at small sizes."""
    if x.ndim == 1 and x.flags.c_contiguous:
        return x
    return np.ascontiguousarray(x).reshape(-1)


# Memory and layout, as the drivers of both targets name them.
empty = np.empty
pooled = memory.pooled
# The most bytes an array a driver makes may have (checked before anything
# runs: `codegen._Made.checks`).
ALLOCATABLE = common.HOST_MEMORY


def too_large(shape: tuple, dtype, where: Where) -> None:
    common.too_large(shape, dtype, where, ALLOCATABLE, common.HOST)


def partial_sums_fit(n: int, where: Where) -> None:
    """Refuse (`too_large`) a full sum of `n` elements whose `_all` kernel
    could not make its partial sums, one f64 for each chunk of
    `REDUCE_CHUNK` (`CpuTarget.render_reducing_loop`): the values summed
    are never stored, so no other check sees their size, and the
    kernel's own allocation would fail in the kernel, unplaced."""
    chunks = -(-n // REDUCE_CHUNK)
    if chunks * 8 > ALLOCATABLE:
        too_large((chunks,), np.float64, where)


def trip_count(start: int, stop: int, step: int, where: Where = "",
               stacked_bytes: int = 0) -> int:
    """`common.trip_count`, the loop's stacks refused past `ALLOCATABLE`."""
    return common.trip_count(start, stop, step, where, stacked_bytes, ALLOCATABLE,
                             common.HOST)


def reshape(x: np.ndarray, shape: tuple) -> np.ndarray:
    return x.reshape(shape)  # (np.reshape's dispatch costs a driver step more)


def transpose(x: np.ndarray, perm: tuple) -> np.ndarray:
    return x.transpose(perm)


# A loop's trips through its driver (each some microseconds of Python
# around its kernels) after which it runs as one compiled function
# (`loop_is_hot`): a loop compiles once its trips have cost about what
# the compile does (0.2-0.5 s), and a program run a few times never does.
LOOP_COMPILE_TRIPS = 50_000
# The most multiply-adds a product in such a loop takes (rows x inner x
# columns) where `cpu_math.matrix_product`, which the compiled form runs
# (and the driver's trips too, so that both give the same bits), is as
# fast as BLAS: a 64-vector times a 64 x 64 matrix; and up to WIDE_PRODUCT
# where its rows are at least WIDE_COLUMNS long (the loops run along them,
# vectorized): a 256-vector through a 256 x 256 matrix.  Since the backward
# trip stopped computing the forward's product again and adding a rank-one
# update (the stacked products, the trip sums), an RNN's gradient over
# 1,000 steps took 2.5 ms compiled against 9.7 in the driver at 96, 4.7
# against 11.4 at 128, 10.9 against 21.3 at 256 (scratch timings;
# `benchmarks/run.py --only loop` has 16, 64, 256 and 512).
SMALL_PRODUCT = 1 << 12
WIDE_PRODUCT = 1 << 16
WIDE_COLUMNS = 64
# A larger product is up to about twice as fast in BLAS, which only the
# driver calls; but the driver's trip pays some microseconds of Python for
# each of its steps, which the compiled form does not: about what BLAS
# saves on WIDE_PRODUCT multiply-adds of a product with narrow rows (64 x
# 32 times 32 x 32: 7 us by `matrix_product`, 3.5 by BLAS, single-
# threaded).  So a loop runs compiled while its larger products take no
# more than STEP_WORTH multiply-adds per step of its trip
# (`products_fit`).  Per product, an LSTM's backward trip (the gates'
# cotangents, 4n wide, times the weights' transpose: rows of n) ran in the
# driver at a batch of 4 and n = 32, 39 ms for 300 steps against 9 ms
# compiled; a batch of 64 rows of 32 through an RNN 149 ms for 1,000
# steps against 65 (scratch timings, single-threaded BLAS, a loaded
# machine).
STEP_WORTH = WIDE_PRODUCT


def loop_is_hot(counts: dict, loop: int, trips: int) -> bool:
    """Whether driver loop `loop` of a program (`counts`: the program's)
    runs this call's `trips` compiled: once the trips it ran through the
    driver reach `LOOP_COMPILE_TRIPS`."""
    total = counts.get(loop, 0)
    if total >= LOOP_COMPILE_TRIPS:
        return True
    counts[loop] = total + trips
    return False


def run_compiled(counts: dict, loop: int, function, *args) -> Optional[tuple]:
    """The carried values of `function(*args)`, loop `loop`'s compiled
    form (`loop_is_hot`), or None where it gives up (an index out of
    range), fails, or is given None (`loop_invariant`), so that the driver
    runs the trips, which raise any error of the program's own: a
    compiler's failure to compile it, a bug, is warned of once and the
    loop never runs compiled again."""
    if any(a is None for a in args):  # (`loop_invariant`: not copied)
        return None
    try:
        done, *carried = function(*args)
        return tuple(carried) if done else None
    except Exception as err:  # noqa: BLE001 (the trips run instead)
        counts[loop] = -math.inf
        warnings.warn(f"gradc: a loop's compiled form failed ({type(err).__name__}: "
                      f"{str(err).splitlines()[0] if str(err) else ''}); it runs trip by "
                      "trip", RuntimeWarning, stacklevel=2)
        return None


def contiguous(x: np.ndarray) -> np.ndarray:
    """x in C order: x itself where it is already."""
    return x if x.flags.c_contiguous else np.ascontiguousarray(x)


def c_order(x: np.ndarray) -> np.ndarray:
    """x C-contiguous, a copy where it is not, for a product that reads it
    (`codegen._read_by_products`: a matrix-vector product's bits depend on
    its operands' layout), unless that copy would be large and larger than
    the memory x spans (a broadcast: its bits are then its own)."""
    return x if x.flags.c_contiguous or not _copied_whole(x) else np.ascontiguousarray(x)


def _copied_whole(x: np.ndarray) -> bool:
    """Whether a C-order copy of x, where one is wanted, is taken: where it
    is small or no larger than the memory x's elements lie in (not a large
    broadcast)."""
    spanned = x.itemsize + sum((n - 1) * abs(s) for n, s in zip(x.shape, x.strides))
    return x.nbytes <= max(memory.POOL_MIN, spanned)


def loop_invariant(x: np.ndarray) -> Optional[np.ndarray]:
    """An invariant of a loop, flat for its compiled form (`run_compiled`),
    or None where that copy would be large and larger than the memory x
    spans (a broadcast: of a 2**33-row table, 192 GiB, where the driver's
    trips read it as a view)."""
    return flat(x) if x.flags.c_contiguous or _copied_whole(x) else None


def small_product(rows: int, inner: int, columns: int) -> bool:
    """Whether `matrix_product` is as fast as BLAS at a product of these sizes."""
    work = rows * inner * columns
    return work <= SMALL_PRODUCT or (work <= WIDE_PRODUCT and columns >= WIDE_COLUMNS)


def products_fit(steps: int, *products: tuple) -> bool:
    """Whether a loop whose trip runs `steps` steps in the driver, and
    makes `products` (each (rows, inner, columns)), runs compiled when hot:
    where the multiply-adds of its products BLAS is faster at (not
    `small_product`) come to at most STEP_WORTH per step, what the steps
    cost in the driver."""
    larger = sum(rows * inner * columns for rows, inner, columns in products
                 if not small_product(rows, inner, columns))
    return larger <= steps * STEP_WORTH


def loop_matmul(a: np.ndarray, b: np.ndarray, fits: bool = False) -> np.ndarray:
    """a @ b in the body of a loop that may run compiled (`fits`: where
    `products_fit` lets it): as the compiled loop computes it where the
    loop may run compiled or the product is small, so that the trips and
    the compiled form give the same bits; else BLAS's (the loop then never
    runs compiled).  (No `fits`: a driver `gradc compile` wrote before
    `products_fit`, whose loops ran compiled only where each product was
    small.)"""
    (n, k), m = a.shape, b.shape[1]
    if fits or small_product(n, k, m):
        return cpu_math.matrix_product(flat(a), flat(b), n, k, m).reshape(n, m)
    return matmul(a, b)


def scalar(value, dtype) -> np.ndarray:
    return np.asarray(value, dtype)


def full(shape: tuple, value, dtype) -> np.ndarray:
    """np.full's array, from the pool when large (`memory.pooled`): a
    table of zeros that a loop's gradient adds into row by row (an
    embedding's, 10,000 x 64) took a fresh mapping each call, its page
    faults then in the loop's scatters: an RNN reading such a table took
    4.3 ms a gradient in a plain script, 1.3 where the C library happened
    to reuse its heap (scratch timings)."""
    out = pooled(fillable(shape, dtype), dtype)
    out.fill(value)
    return out


def as_int(x: np.ndarray) -> int:
    return int(x)


def stack_read(xs: np.ndarray, t: int) -> np.ndarray:
    """Slot t of a loop's stacked values."""
    return xs[t]


def stack_write(ys: np.ndarray, t: int, y: np.ndarray) -> None:
    ys[t] = y


def loop_stacked(xs: np.ndarray) -> np.ndarray:
    """A loop's stacked input as (trips, elements) for its compiled form
    (`run_compiled`): its rows where they lie where each is C-contiguous
    and they lie forward evenly (`stacked_flat`: a broadcast's rows, a
    column slice's of a C-order table), else `stack_rows`' C-order copy."""
    if xs.flags.c_contiguous or xs.ndim < 2:
        return stack_rows(xs)
    row, step = stacked_flat(xs)
    if step == math.prod(xs.shape[1:]):
        return row.reshape(xs.shape[0], step)  # (a copy: C order)
    return np.lib.stride_tricks.as_strided(row, (xs.shape[0], math.prod(xs.shape[1:])),
                                           (step * xs.itemsize, xs.itemsize))


def stack_rows(xs: np.ndarray) -> np.ndarray:
    """A loop's stacked values as (trips, elements), C order (a view of a
    C-order stack: a compiled loop fills its stacked results through it)."""
    return np.ascontiguousarray(xs).reshape(xs.shape[0], math.prod(xs.shape[1:]))


def stacked_flat(xs: np.ndarray) -> tuple[np.ndarray, int]:
    """A loop's stacked input, (trips, ...), for a kernel that reads row t
    from element t * step of a flat array: (that array, step).  Where each
    row is C-contiguous and the rows lie forward in even steps (a
    broadcast's rows, step 0; a column slice of a C-order table's), a flat
    view of the memory they span; else a C-order copy, step a row's
    elements (a flat copy of a broadcast of a 1,000-vector to 100,000
    trips took 800 MB for its 8 KB)."""
    size = math.prod(xs.shape[1:])
    if xs.flags.c_contiguous or not xs.size or xs.strides[0] < 0 \
            or xs.strides[0] % xs.itemsize or not xs[0].flags.c_contiguous:
        return flat(xs), size
    step = xs.strides[0] // xs.itemsize
    extent = (xs.shape[0] - 1) * step + size
    return np.lib.stride_tricks.as_strided(xs, (extent,), (xs.itemsize,)), step


def copy(x: np.ndarray) -> np.ndarray:
    """x copied in C order, into pooled memory when large (`c_copy`)."""
    return c_copy(np.asarray(x))


def c_copy(x: np.ndarray) -> np.ndarray:
    """np.array(x, order="C"), from the pool when large (`memory.pooled`):
    a convolution's gradient's copies, products, im2col rows and padded
    buffers (2-18 MB each) took a fresh mapping each call, 2,600 page
    faults a call (scratch), each first touched by the helper filling it."""
    out = pooled(x.shape, x.dtype)
    np.copyto(out, x)
    return out


def slice(x: np.ndarray, where: tuple) -> np.ndarray:  # noqa: A001 (the op's name)
    return x[where]


_jit = jit_in_kernel_cache


@_jit()
def _sum_rows(x, out):
    for o in range(x.shape[0]):
        acc = out.dtype.type(0)
        for r in range(x.shape[1]):
            acc = cpu_math.accumulate(acc, x[o, r])
        out[o] = acc


@_jit(parallel=True)
def _sum_rows_parallel(x, out):
    for o in prange(x.shape[0]):
        acc = out.dtype.type(0)
        for r in range(x.shape[1]):
            acc = cpu_math.accumulate(acc, x[o, r])
        out[o] = acc


@_jit()
def _sum_chunk(x, chunk, c, acc):
    """acc plus chunk c of one long row."""
    left = x.shape[0] - c * chunk  # (Numba's min() would compile an overload)
    for r in range(chunk if chunk < left else left):  # from 0: see render_reducing_loop
        acc = cpu_math.accumulate(acc, x[c * chunk + r])
    return acc


@_jit(parallel=True)
def _sum_row_chunked(x, chunk, partial):
    # One long row: each thread sums a chunk, f64 partial sums.
    for c in prange(partial.shape[0]):
        partial[c] = _sum_chunk(x, chunk, c, partial.dtype.type(0))


@_jit()
def _sum_row_chunked_serial(x, chunk, partial):
    # _sum_row_chunked's chunks one after the other (the same bits), while
    # other work holds the cores
    for c in range(partial.shape[0]):
        partial[c] = _sum_chunk(x, chunk, c, partial.dtype.type(0))


@_jit()
def _max_rows(x, out):
    for o in range(x.shape[0]):
        acc = x[o, 0]
        for r in range(1, x.shape[1]):
            acc = cpu_math.greatest(acc, x[o, r])
        out[o] = acc


@_jit(parallel=True)
def _max_rows_parallel(x, out):
    for o in prange(x.shape[0]):
        acc = x[o, 0]
        for r in range(1, x.shape[1]):
            acc = cpu_math.greatest(acc, x[o, r])
        out[o] = acc


def _sum_middle(x: np.ndarray, out: np.ndarray) -> None:
    # NumPy adds the rows of a middle axis in order, a whole inner row at a
    # time (vectorized), as a loop here would: no kernel to compile.
    np.add.reduce(x, axis=1, dtype=out.dtype, out=out)


def _max_middle(x: np.ndarray, out: np.ndarray) -> None:
    np.maximum.reduce(x, axis=1, out=out)  # propagates NaN, as `greatest` does


def _reduce(x: np.ndarray, axes: tuple[int, ...], rows, rows_parallel, middle,
            is_sum: bool) -> np.ndarray:
    x = np.ascontiguousarray(x)
    out_dtype = x.dtype
    # Reduce the last run first so earlier axis numbers stay valid.
    for start, stop in reversed(axis_runs(axes)):
        shape = x.shape
        outer = math.prod(shape[:start])
        reduced = math.prod(shape[start:stop])
        inner = math.prod(shape[stop:])
        kept = shape[:start] + shape[stop:]
        if is_sum and (reduced == 0 or outer * inner == 0):
            x = np.zeros(kept, out_dtype)
            continue
        acc_dtype = np.float64 if out_dtype.kind == "f" else np.int64
        if inner == 1:
            view = x.reshape(outer, reduced)
            if is_sum and outer == 1 and reduced >= PARALLEL_THRESHOLD:
                # chunks of a fixed size, whatever the number of threads:
                # the partial sums, and so the bits of the sum, are the same
                chunk = REDUCE_CHUNK
                partial = np.empty(-(-reduced // chunk), acc_dtype)
                sum_chunks = (_sum_row_chunked if parallel_allowed(reduced, PARALLEL_THRESHOLD)
                              else _sum_row_chunked_serial)
                sum_chunks(view.reshape(-1), chunk, partial)
                result = np.array([partial.sum()], dtype=acc_dtype)
            else:
                result = np.empty(outer, acc_dtype if is_sum else out_dtype)
                if (outer > 1 and outer * reduced >= PARALLEL_THRESHOLD
                        and parallel_allowed(outer * reduced, PARALLEL_THRESHOLD)):
                    rows_parallel(view, result)  # (each row as the serial loop does it)
                else:
                    rows(view, result)
        else:
            view = x.reshape(outer, reduced, inner)
            result = np.empty((outer, inner), acc_dtype if is_sum else out_dtype)
            middle(view, result)
        x = result.astype(out_dtype, copy=False).reshape(kept)
    return x


def reduce_sum(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    return _reduce(x, axes, _sum_rows, _sum_rows_parallel, _sum_middle, True)


def reduce_max(x: np.ndarray, axes: tuple[int, ...], where: Where = "",
               empty=None) -> np.ndarray:
    if empty_axis(x.shape, axes, where, empty):
        return full(tuple(d for i, d in enumerate(x.shape) if i not in axes), empty, x.dtype)
    return _reduce(x, axes, _max_rows, _max_rows_parallel, _max_middle, False)


# The threads of Numba's pool, fixed once it is imported: a row loop
# whose passes keep values in scratch makes one for each (`render_row_loop`)
POOL_THREADS = numba.config.NUMBA_NUM_THREADS


# OpenBLAS runs a product on the calling thread below about this many
# multiply-adds (m n k; its GEMV's threshold, the lower of GEMV's and
# GEMM's): no workers then wake, to spin after it.
BLAS_THREADED_WORK = 9216


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    shape = _product_shape(a, b)
    if shape is not None and math.prod(shape) * 8 >= memory.POOL_MIN:
        # into pooled memory (`c_copy`), the same bits; not a small one,
        # whose out= cost more than the product (0.8 -> 2.3 us at 4x4)
        product = np.matmul(a, b, out=pooled(shape, np.result_type(a, b)))
    else:
        product = np.matmul(a, b)
    # (integer products are NumPy's own loops, not BLAS)
    if product.dtype.kind == "f" and a.size * b.shape[-1] >= BLAS_THREADED_WORK:
        blas_called()  # its workers now spin for a while (parallelism.BLAS_SPIN_SECONDS)
    return product


def _product_shape(a: np.ndarray, b: np.ndarray) -> Optional[tuple[int, ...]]:
    """The shape of a @ b for matrices or stacks of them (None for a vector)."""
    if a.ndim == 2 and b.ndim == 2:  # (the common case, without broadcasting)
        return (a.shape[0], b.shape[1])
    if a.ndim < 2 or b.ndim < 2:
        return None
    return np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])


def embed(x: np.ndarray, shape: tuple[int, ...], where: tuple) -> np.ndarray:
    """Zeros of `shape` with `x` written at `where` (the VJP of slicing)."""
    out = full(shape, 0, x.dtype)
    _into_region(out, where, x, False)
    return out


def _own(base: np.ndarray, owned: bool) -> np.ndarray:
    """The array an op adding into `base` in place writes: base itself
    where the driver owns it (`owned`: it made it, and nothing else reads
    it) and it is C-contiguous (a view of it in (outer, n, inner) form must
    not be a copy), else a C-order copy."""
    if owned and base.flags.c_contiguous and base.flags.writeable:
        return base
    return c_copy(base)


def embed_add(base: np.ndarray, x: np.ndarray, where: tuple, owned: bool = False,
              assign: bool = False) -> np.ndarray:
    """base with x added into its region `where` (Python slices: where
    `embed` would place x), or written there with `assign` (the compiler
    proved the region holds zeros).  `owned`: the driver made base and
    reads it no more: added in place."""
    out = _own(base, owned)
    _into_region(out, where, x, not assign)
    return out


def concatenate(xs: tuple, axis: int) -> np.ndarray:
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    out = pooled(tuple(shape), xs[0].dtype)
    start = 0
    for x in xs:
        stop = start + x.shape[axis]
        _into_region(out, (builtins.slice(None),) * axis + (builtins.slice(start, stop),), x,
                     False)
        start = stop
    return out


# The rank to which `_into_region` merges (or pads) a region's axes: the
# (N, H, W, C) windows of an (N, H + 2p, W + 2p, C) array have four that
# do not merge.
STRIDED_RANK = 4


def _into_region(out: np.ndarray, where: tuple, x: np.ndarray, add: bool) -> None:
    """out[where] = x, or += x with `add`; out C-contiguous.  By `_rows`
    where the region's last axis (its axes merged) runs in unit steps in
    both: NumPy's strided copy and add run an inner loop per innermost row,
    which for short rows (a channels-last convolution's 16 channels) took
    5-10x as long.  By `_strided_rows_add` an add whose last axis runs in
    other positive steps, in rows with gaps between them (an outer axis
    left): NumPy's took 1.5-1.8x as long there (a stride-2 pooling's
    windows), but 1.1x as short along one strided axis.  Other copies are
    NumPy's, which beat a kernel's on strided ones (1.1-1.2x on a
    pooling's windows)."""
    if not x.size:
        return
    where = where + (builtins.slice(None),) * (out.ndim - len(where))
    shape, offset, out_steps = slice_layout(out.shape, where)
    x_steps = [s // x.itemsize if s % x.itemsize == 0 else 0 for s in x.strides]
    axes = _merged_axes(shape, out_steps, x_steps)
    by_rows = bool(axes) and (axes[-1][1:] == (1, 1) or
                              (add and len(axes) > 1 and min(axes[-1][1:]) > 0))
    if not by_rows or len(axes) > STRIDED_RANK or \
            any(s < 0 or s % x.itemsize for s in x.strides):
        if add:
            region = out[where]
            region += x
        else:
            out[where] = x
        return
    axes = [(1, 0, 0)] * (STRIDED_RANK - len(axes)) + axes
    sizes, out_steps, x_steps = (tuple(column) for column in zip(*axes))
    extent = 1 + sum((n - 1) * s for n, s in zip(x.shape, x.strides)) // x.itemsize
    x_flat = x.reshape(-1) if x.flags.c_contiguous else \
        np.lib.stride_tricks.as_strided(x, (extent,), (x.itemsize,), writeable=False)
    if out_steps[-1] == x_steps[-1] == 1:
        _rows(out.reshape(-1), offset, out_steps, x_flat, x_steps, sizes, add)
    else:
        _strided_rows_add(out.reshape(-1), offset, out_steps, x_flat, x_steps, sizes)


def _merged_axes(shape, a_steps, b_steps) -> list[tuple[int, int, int]]:
    """(size, a's step, b's step) of the axes of two strided views of one
    shape, size-1 axes dropped and each axis merged into the one after it
    where both views step over it as over that axis's whole run."""
    axes: list[tuple[int, int, int]] = []
    for n, s, t in zip(shape, a_steps, b_steps):
        if n == 1:
            continue
        if axes and axes[-1][1] == s * n and axes[-1][2] == t * n:
            axes[-1] = (axes[-1][0] * n, s, t)
        else:
            axes.append((n, s, t))
    return axes


@_jit(inline="always")
def _row_starts(offset, out_steps, x_steps, a, b, c):
    # where row (a, b, c) of a region starts in out and in x, unsigned
    return (np.uint64(offset + a * out_steps[0] + b * out_steps[1] + c * out_steps[2]),
            np.uint64(a * x_steps[0] + b * x_steps[1] + c * x_steps[2]))


@_jit()
def _rows(out, offset, out_steps, x, x_steps, sizes, add):
    # out[offset + k . out_steps] (+)= x[k . x_steps] over the 4-d index
    # k < sizes, the last steps 1: each row indexed unsigned, which LLVM
    # knows needs no wraparound for negative indices, so that it vectorizes
    # (signed, it ran 10x slower on rows of 16).
    n0, n1, n2, n3 = sizes
    for a in range(n0):
        for b in range(n1):
            for c in range(n2):
                o, p = _row_starts(offset, out_steps, x_steps, a, b, c)
                if add:
                    for d in range(np.uint64(n3)):
                        out[o + d] += x[p + d]
                else:
                    for d in range(np.uint64(n3)):
                        out[o + d] = x[p + d]


@_jit()
def _strided_rows_add(out, offset, out_steps, x, x_steps, sizes):
    # `_rows`' add along last steps of any positive size, unsigned too
    # (signed, it ran 1.6x slower on rows of stride 2).  A kernel of its
    # own: steps of 1 in `_rows`' loop, known there, make its copies and
    # adds vectorize (with these in it, a convolution's ran 1.1x slower).
    so, sx = np.uint64(out_steps[3]), np.uint64(x_steps[3])
    for a in range(sizes[0]):
        for b in range(sizes[1]):
            for c in range(sizes[2]):
                o, p = _row_starts(offset, out_steps, x_steps, a, b, c)
                for d in range(np.uint64(sizes[3])):
                    out[o + d * so] += x[p + d * sx]


# ------------------------------------------------- gathers and scatter-adds
# The `index` ops of `compiler.ops`, over (outer, axis, inner) views (the
# gather and the scatter-add are `cpu_math.gather_rows` and `scatter_rows`,
# the `_along` ones `gather_along` and `scatter_along`, which a compiled
# loop calls too).  Each
# kernel checks every index as it goes and returns the position of the
# first out of range (or -1) where it stops: it writes only into the array
# it was given to fill, which the driver then never sees, so a bad index
# raises (`index_out_of_range`) before any result exists, and the check
# costs no pass of its own.  They run serially: on this 2-core machine the
# row-parallel gather took 3.5x as long as the serial one and a scatter-add
# parallel over disjoint column lanes 15x as long (variants indexed signed
# in 3-d, since replaced in `benchmarks/bench_indexing.py`); serial, repeated
# indices accumulate with no race, in index order.  Measured again there
# with rows copied as here (unsigned offsets, AVX-512):
# the gather in a chunk per thread 1.6x as long, the scatter-add split by
# the output rows each thread owns 1.8-2x, at load 5-9 on 2 cores, where an
# empty parallel kernel alone took 0.15 ms (its sleeping worker woken);
# PyTorch's `index_select` and `index_add_` on one thread took as long as
# these (their lead in the suite is their second thread).  Scratch timings.


def _checked(bad: int, idx: np.ndarray, n: int, where: str) -> None:
    """Raise for the index at flat position `bad` (a kernel's verdict)."""
    if bad >= 0:
        index_out_of_range(where, int(np.ravel(idx)[bad]), n)


def _flat_view(x: np.ndarray) -> np.ndarray:
    """x flat in C order, read-only (Numba compiles a helper once per
    readonly-ness of each argument: a user's read-only index array and a
    writable one compiled the gather twice)."""
    view = np.ascontiguousarray(x).reshape(-1).view()
    view.flags.writeable = False
    return view


def _view(x: np.ndarray, axis: int) -> np.ndarray:
    """x as (outer, n, inner) around `axis`, C-contiguous and read-only
    (as `_flat_view`)."""
    return _flat_view(x).reshape(index_views(x.shape, axis))


def _out_of_range(idx: np.ndarray, n: int) -> int:
    """The flat position of idx's first index outside [-n, n), or -1."""
    bad = np.flatnonzero((idx < -n) | (idx >= n))
    return int(bad[0]) if bad.size else -1


# A gather from an x that is not C-contiguous (a transposed or column-sliced
# table, a broadcast) reads x where it lies, through NumPy's indexing, after
# checking the indices: the kernels read x flat, and a flat copy of x whole
# each call made a loop that reads one row of a Fortran-order 10,000 x 64
# table per trip 80 times slower (and a broadcast one cost its full size).


def check_index(idx, n: int, where: str) -> None:
    """Raise (`index_out_of_range`) for idx's first index outside [-n, n),
    in C order, as the gather or scatter-add of this index would: the
    check that one leaves where nothing reads its result.  Two reductions
    where every index is in range (no array made)."""
    idx = np.asarray(idx)
    if idx.size and (idx.min() < -n or idx.max() >= n):
        _checked(_out_of_range(idx, n), idx, n, where)


def take(x: np.ndarray, idx: np.ndarray, axis: int, where: str) -> np.ndarray:
    """np.take(x, idx, axis), every index checked; x is not copied."""
    outer, n, inner = index_views(x.shape, axis)
    out = np.empty(x.shape[:axis] + np.shape(idx) + x.shape[axis + 1:], x.dtype)
    if x.flags.c_contiguous:
        bad = cpu_math.gather_rows(x.reshape(-1), flat(idx), flat(out), outer, n, inner)
    else:
        bad = _out_of_range(idx, n)
        if bad < 0:  # (one index array: NumPy's copy, C order as `out`)
            rows = np.reshape(idx, -1)
            out.reshape(x.shape[:axis] + rows.shape + x.shape[axis + 1:])[...] = \
                x[(builtins.slice(None),) * axis + (rows,)]
    _checked(bad, idx, n, where)
    return out


def take_along_axis(x: np.ndarray, idx: np.ndarray, axis: int, where: str) -> np.ndarray:
    """np.take_along_axis(x, idx, axis), every index checked; x is not
    copied."""
    out = np.empty(idx.shape, x.dtype)
    if x.flags.c_contiguous:
        bad = cpu_math.gather_along(_flat_view(x), _flat_view(idx), out.reshape(-1),
                                    *index_views(x.shape, axis))
    else:
        bad = _out_of_range(idx, x.shape[axis])
        if bad < 0:
            out[...] = np.take_along_axis(x, idx, axis)
    _checked(bad, idx, x.shape[axis], where)
    return out


def scatter_add(base: np.ndarray, idx: np.ndarray, values: np.ndarray, axis: int,
                where: str, owned: bool = False) -> np.ndarray:
    """base with values added where np.take(base, idx, axis) reads (repeated
    indices accumulate: np.add.at), every index checked.  `owned`: the
    driver made base (C-contiguous) and reads it no more: added in place."""
    out = _own(base, owned)
    outer, n, inner = index_views(out.shape, axis)
    _checked(cpu_math.scatter_rows(flat(out), flat(idx), flat(values), outer, n, inner), idx, n,
             where)
    return out


def scatter_add_along_axis(base: np.ndarray, idx: np.ndarray, values: np.ndarray, axis: int,
                           where: str, owned: bool = False) -> np.ndarray:
    """base with values added where np.take_along_axis(base, idx, axis)
    reads, every index checked (`owned` as for `scatter_add`)."""
    out = _own(base, owned)
    bad = cpu_math.scatter_along(out.reshape(-1), _flat_view(idx), _flat_view(values),
                                 *index_views(out.shape, axis))
    _checked(bad, idx, out.shape[axis], where)
    return out


# ------------------------------------------------------------------- scans
# A cumulative sum along an axis (`cumsum`), over an (outer, axis, inner)
# view: lane (o, i) adds its elements in order in the array's dtype, as
# np.cumsum does, so the bits are NumPy's (f32 sums in f32) on every path.
# Below PARALLEL_THRESHOLD elements by NumPy's own accumulate (no kernel to
# compile: small calls never compile one); from there by a kernel whose
# tasks are runs of SCAN_LANES lanes of one outer index, scanned a whole
# run at a time, in parallel where allowed: along a middle axis NumPy's
# accumulate took 13.6 ms for 2000 x 2000 f64 along axis 0, the kernel 5.9
# serially and 3.1 on 2 threads (11.5, 11.5 and 5.9 along axis 1).

SCAN_LANES = 256


@_jit()
def _scan_run(x, out, t, runs, reverse, lanes):
    """Task t: lanes [lo, hi) of outer index o, scanned along axis 1."""
    n, inner = x.shape[1], x.shape[2]
    o, lo = t // runs, (t % runs) * lanes
    hi = lo + lanes if lo + lanes < inner else inner
    for step in range(n):
        r = n - 1 - step if reverse else step
        if step == 0:
            for i in range(lo, hi):
                out[o, r, i] = x[o, r, i]
        else:
            before = r + 1 if reverse else r - 1
            for i in range(lo, hi):
                out[o, r, i] = out[o, before, i] + x[o, r, i]


@_jit()
def _scan_lanes(x, out, reverse, lanes):
    runs = (x.shape[2] + lanes - 1) // lanes
    for t in range(x.shape[0] * runs):
        _scan_run(x, out, t, runs, reverse, lanes)


@_jit(parallel=True)
def _scan_lanes_parallel(x, out, reverse, lanes):
    runs = (x.shape[2] + lanes - 1) // lanes
    for t in prange(x.shape[0] * runs):
        _scan_run(x, out, t, runs, reverse, lanes)


def cumsum(x: np.ndarray, axis: int, reverse: bool) -> np.ndarray:
    """np.cumsum(x, axis) in x's dtype; from the back where `reverse`."""
    outer, n, inner = index_views(x.shape, axis)
    out = np.empty(x.shape, x.dtype)
    if out.size == 0:
        return out
    view, lanes = _view(x, axis), out.reshape(outer, n, inner)
    if x.size >= PARALLEL_THRESHOLD:
        scan = (_scan_lanes_parallel if outer * inner > 1
                and parallel_allowed(x.size, PARALLEL_THRESHOLD) else _scan_lanes)
        scan(view, lanes, reverse, SCAN_LANES)
    elif reverse:
        np.add.accumulate(view[:, ::-1], axis=1, dtype=x.dtype, out=lanes[:, ::-1])
    else:
        np.add.accumulate(view, axis=1, dtype=x.dtype, out=lanes)
    return out


# ------------------------------------------------------------------ target

# Numba's cache would not notice a change to cpu_math inside a cached kernel,
# nor to branch_free, which translates cpu_math's helpers into it.
_CPU_MATH_VERSION = "cpu_math " + hashlib.sha256(b"".join(
    Path(module.__file__).read_bytes() for module in (cpu_math, branch_free))).hexdigest()[:12]

# Kernels are called from Python or from other kernels, never through a C
# function pointer: no C wrapper (which costs 5-15 ms of each compile).
# A compiled loop's function (`render_function`) may add into an argument
# in place; a kernel's arrays never overlap where it writes, so it is
# compiled with that known (`cpu_math.DisjointArrays`: else its sums'
# bits depended on where its arrays lay in memory).
_FUNCTION = "@numba.njit(cache=True, error_model='numpy', nogil=True, no_cfunc_wrapper=True)"
_PARALLEL = ("@numba.njit(parallel=True, cache=True, error_model='numpy', nogil=True, "
             "no_cfunc_wrapper=True, pipeline_class=DisjointArrays)")
_SERIAL = ("@numba.njit(cache=True, error_model='numpy', nogil=True, no_cfunc_wrapper=True, "
           "pipeline_class=DisjointArrays)")


def parallel_threshold(cost: int) -> int:
    """The size from which a loop costing `cost` per element (`ops.loop_cost`:
    a loop of arithmetic is 1) runs its `prange` variant.  Fork-join costs
    5-15 microseconds, so a costlier loop pays it back from fewer elements;
    measured (`benchmarks/bench_threshold.py`, 2 threads on 2 cores): a
    loop of arithmetic from 2^14 at load average 0.8 and from 2^15 at 2.5,
    an exp loop (with scalar libm calls) from 2^10 and 2^11.  The constants
    take the busy figures: a parallel loop suffers much more than a serial
    one when another process holds a core (at load 5-7 neither loop's
    parallel variant won at any size up to 2^20)."""
    return max(MIN_PARALLEL_THRESHOLD, PARALLEL_THRESHOLD // max(cost, 1))


# Elements per chunk of a parallel full sum (`render_reducing_loop`): few
# enough chunks that adding their partial sums costs nothing (a chunk takes
# microseconds), enough of them to share out evenly among threads (25 at
# 10^5 elements).
REDUCE_CHUNK = 1 << 12
# A full sum of at most this many elements has partial sums of at most
# 1 MiB: `partial_sums_fit` need not look.
SUMMED_UNCHECKED = REDUCE_CHUNK << 17


def _row(first: str, row: Sequence[str], body: list[str], inner: str) -> list[str]:
    """Lines running `body` over the row of `inner` elements from `first`."""
    return ([f"i0 = {first}"] + list(row) + [f"for j in range({inner}):", "    i = i0 + j"]
            + ["    " + line for line in body])


def _elements(first: str, count: str, row: Sequence[str], body: list[str],
              inner: Optional[str]) -> list[str]:
    """Lines running `body` over `count` elements from `first`: in rows of
    `inner`, when given, else as one row."""
    if inner is None:
        return _row(first, row, body, count)
    return ([f"for s in range({count} // {inner}):"]
            + ["    " + line for line in _row(f"{first} + s * {inner}", row, body, inner)])


def _pick(kname: str, size: str, cost: int, known: Optional[int] = None) -> str:
    """The driver's choice of a loop's kernel: parallel from its threshold
    (`known`: the size, when codegen knows it), if the cores are free
    (`parallel_allowed`, which a smaller loop never calls, so that small
    calls pay nothing for it)."""
    threshold = parallel_threshold(cost)
    if known is not None and known < threshold:
        return f"K.{kname}_serial"
    reached = "" if known is not None else f"{size} >= {threshold} and "
    return (f"(K.{kname} if {reached}R.parallel_allowed({size}, {threshold})"
            f" else K.{kname}_serial)")


class CpuTarget(Target):
    """`@njit` kernels, each in a `prange` variant and a serial one; the
    driver picks by size and cost per element (`parallel_threshold`).
    Arrays are NumPy's."""

    name = "cpu"
    fuses_reductions = True
    compiles_loops = True
    scalars_in_driver = True
    slices_are_views = True  # (NumPy's basic indexing and np.transpose)
    takes_out_buffers = True
    loop_block = 256  # 2 KiB per f64 value: a block's carried values stay in L1
    # Numba indexes an array at an unsigned integer with no wraparound
    # check (`fix_integer_index`), as at a view's j from 0.
    unsigned_index = "np.uintp"

    @property
    def header(self) -> str:
        """Kernels call `math.exp` and friends: `runtime.cpu_math`'s, which
        vectorize, or with GRADC_LIBM=1 libm's; sums add with cpu_math's
        `accumulate`, and kernels compile with its `DisjointArrays`.  The
        text names which (and cpu_math's version), so the content-hashed
        kernel cache never serves a kernel compiled against the other or
        an older one."""
        if os.environ.get("GRADC_LIBM") == "1":
            math_import = "import math  # libm (GRADC_LIBM=1)"
        else:
            math_import = "from gradlang.runtime import cpu_math as math"
        return (f"{math_import}\n"
                "from gradlang.runtime.cpu_math import "
                "DisjointArrays, accumulate, greatest, select"
                f"  # {_CPU_MATH_VERSION}\n"
                "import numpy as np\nimport numba\nfrom numba import prange\n")

    @property
    def helpers(self) -> ModuleType:
        return sys.modules[__name__]

    def render_loop(self, kname: str, args: list[str], pre: list[str], body: list[str],
                    row: Sequence[str] = (), inner: Optional[str] = None) -> str:
        """Rows (with `inner`) or elements in parallel, and a serial variant."""
        arglist = ", ".join(["n"] + args)
        out = []
        for suffix, deco, rng in (("", _PARALLEL, "prange"), ("_serial", _SERIAL, "range")):
            out += [deco, f"def {kname}{suffix}({arglist}):"]
            out += ["    " + line for line in pre]
            if inner is None:
                out.append(f"    for i in {rng}(n):")
                out += ["        " + line for line in body]
            else:
                out.append(f"    for s in {rng}(n // {inner}):")
                out += ["        " + line for line in _row(f"s * {inner}", row, body, inner)]
            out.append("")
        return "\n".join(out)

    def allocate(self, length: str, known: Optional[int], dtype: str, itemsize: int) -> str:
        """Large arrays from `runtime.memory`'s pool: the branch costs a
        small call one comparison, where the pool's bookkeeping would cost
        it a tenth of its time."""
        smallest_pooled = -(-memory.POOL_MIN // itemsize)
        if known is not None:
            helper = "pooled" if known >= smallest_pooled else "empty"
            return f"R.{helper}({length}, {dtype})"
        return f"(R.pooled if {length} >= {smallest_pooled} else R.empty)({length}, {dtype})"

    def render_function(self, name: str, args: list[str], lines: list[str]) -> str:
        # The products by name from cpu_math: the header's `math` is libm's
        # with GRADC_LIBM=1, which has none.
        return "\n".join(["from gradlang.runtime.cpu_math import add_outer, "
                          "first_out_of_range, gather_along, gather_rows, greatest, "
                          "matrix_product, matrix_transpose, scatter_along, scatter_rows",
                          "from gradlang.runtime.cpu import _sum_rows as sum_rows", _FUNCTION,
                          f"def {name}({', '.join(args)}):"]
                         + ["    " + line for line in lines]) + "\n"

    def sum_in_function(self, x: str, out: str, outer: str, reduced: str, inner: str,
                        give_up: str) -> list[str]:
        """A compiled loop's lines summing flat `x`, of (outer, reduced,
        inner) elements, over its middle axis into a new `out` as
        `reduce_sum` does (`_reduce`): in f64, then rounded to x's dtype;
        with inner 1 by `_sum_rows`, else each element's rows added in
        order to 0.0, as NumPy's `add.reduce` over a middle axis does (its
        bits on 792 shapes, f32 and f64, scratch; from 0.0, not the first
        row: a sum of -0.0s is 0.0 there).  `give_up`
        where the driver would sum otherwise: one row of
        `PARALLEL_THRESHOLD` elements or more (in chunks), or none."""
        return [f"if {outer} * {reduced} * {inner} == 0 or ({outer} == 1 and {inner} == 1 "
                f"and {reduced} >= {PARALLEL_THRESHOLD}):", f"    {give_up}",
                f"{out} = np.zeros({outer} * {inner}, np.float64)",
                f"if {inner} == 1:",
                f"    sum_rows({x}.reshape(({outer}, {reduced})), {out})",
                "else:",
                f"    for o in range({outer}):",
                f"        for r in range({reduced}):",
                f"            at = (o * {reduced} + r) * {inner}",
                f"            for e in range({inner}):",
                f"                {out}[o * {inner} + e] = {out}[o * {inner} + e] + {x}[at + e]",
                f"{out} = {out}.astype({x}.dtype)"]

    def launch(self, kname: str, size: str, known: Optional[int], args: list[str],
               cost: int) -> str:
        return f"{_pick(kname, size, cost, known)}({', '.join([size] + args)})"

    def launch_blocks(self, kname: str, size: str, blocks: str, args: list[str],
                      cost: int) -> str:
        return f"{_pick(kname, size, cost)}({', '.join([blocks] + args)})"

    def render_reducing_loop(self, kname: str, args: list[str], pre: list[str],
                             body: list[str], summands: Sequence[str], reduced: Sequence[str],
                             row: Sequence[str] = (), inner: Optional[str] = None) -> str:
        """A loop over (rows, row length) whose last step sums each of
        `summands` along each row into `reduced[k][row]`, in f64: `_rows`
        runs rows in parallel, `_all` one row (a full sum) in parallel
        chunks of about `REDUCE_CHUNK` elements whose partial sums are then
        added in order, so its result does not depend on the number of
        threads.  Every add is `accumulate`'s, which lets LLVM vectorize the
        loop with its sums."""
        arglist = ", ".join(["n", "rows"] + args)
        # acc, acc1, acc2, ...: one sum's kernel is as it was before there
        # could be more (the same text, so the same cached kernel)
        sums = ["" if k == 0 else str(k) for k in range(len(summands))]
        add = [f"acc{k} = accumulate(acc{k}, {summand})" for k, summand in zip(sums, summands)]
        start = [f"acc{k} = 0.0" for k in sums]
        out = []
        for suffix, deco, rng in (("", _PARALLEL, "prange"), ("_serial", _SERIAL, "range")):
            out += [deco, f"def {kname}{suffix}({arglist}):"]
            out += ["    " + line for line in pre]
            out.append("    length = n // rows if rows else 0")
            if inner is not None:  # both products of trailing sizes: the less divides
                out.append(f"    {inner} = {smallest(inner, largest('length', '1'))}")
            out += [f"    for o in {rng}(rows):"] + ["        " + line for line in start]
            out += ["        " + line
                    for line in _elements("o * length", "length", row, body + add, inner)]
            out += [f"        {r}[o] = acc{k}" for k, r in zip(sums, reduced)] + [""]
        step = (f"{REDUCE_CHUNK}" if inner is None
                else f"{largest(f'({REDUCE_CHUNK} // {inner})', '1')} * {inner}")
        # `_all_serial`: `_all`'s chunks one after the other (the same bits),
        # for a long row while other work holds the cores.  Both call one
        # compiled chunk (`_chunk`): a copy of its loop in each, vectorized
        # each its own way, added the summands in orders that differed in
        # the last bits, so a busy machine changed a result.
        chunk_args = ", ".join(["c", "step", "n", "rows"] + args)
        out += [_SERIAL, f"def {kname}_chunk({chunk_args}):"]
        out += ["    " + line for line in pre + start]
        out.append(f"    count = {smallest('step', '(n - c * step)')}")
        out += ["    " + line for line in _elements("c * step", "count", row, body + add, inner)]
        out += [f"    return {', '.join(f'acc{k}' for k in sums)}", ""]
        for suffix, deco, rng in (("_all", _PARALLEL, "prange"),
                                  ("_all_serial", _SERIAL, "range")):
            out += [deco, f"def {kname}{suffix}({arglist}):"]
            out += ["    " + line for line in pre]
            out += [f"    step = {step}", "    chunks = (n + step - 1) // step"]
            out += [f"    partial{k} = np.empty(chunks, np.float64)" for k in sums]
            out += [f"    for c in {rng}(chunks):",
                    f"        sums = {kname}_chunk({chunk_args})"]
            out += (["        partial[c] = sums"] if len(sums) == 1 else
                    [f"        partial{k}[c] = sums[{j}]" for j, k in enumerate(sums)])
            for k, r in zip(sums, reduced):
                out += ["    total = 0.0", "    for c in range(chunks):",
                        f"        total = accumulate(total, partial{k}[c])", f"    {r}[0] = total"]
            out.append("")
        return "\n".join(out)

    def render_row_loop(self, kname: str, args: list[str], pre: list[str],
                        body: list[str], per_thread: list[str]) -> str:
        """Blocks of rows in parallel, and a serial variant.  With
        `per_thread` lines (scratch), the last argument is `threads`
        (`POOL_THREADS`), and the parallel one runs that many runs of
        blocks, each after those lines: scratch made once per thread, not
        per block."""
        arglist = ", ".join(["n", "rows"] + args)
        out = []
        for suffix, deco in (("", _PARALLEL), ("_serial", _SERIAL)):
            out += [deco, f"def {kname}{suffix}({arglist}):", "    length = n // rows if rows else 0"]
            out += ["    " + line for line in pre]
            indent = "    "
            if suffix == "_serial":
                out += [indent + line for line in per_thread]
                out.append(f"{indent}for blk in range(blocks):")
            elif not per_thread:
                out.append(f"{indent}for blk in prange(blocks):")
            else:
                out += [f"{indent}parts = min(blocks, threads)",
                        f"{indent}for part in prange(parts):"]
                indent += "    "
                out += [indent + line for line in per_thread]
                out.append(f"{indent}for blk in range(part * blocks // parts, "
                           f"(part + 1) * blocks // parts):")
            out += [indent + "    " + line for line in body] + [""]
        return "\n".join(out)

    def launch_reducing(self, kname: str, size: str, rows: str, args: list[str],
                        cost: int) -> str:
        """Below the threshold `_serial`; from it, rows in parallel (`_rows`)
        or one row in chunks (`_all`), or, while other work holds the cores
        (`parallel_allowed`), their serial variants, whose bits are the same."""
        threshold = parallel_threshold(cost)
        kernel = (f"(K.{kname}_serial if {size} < {threshold} else "
                  f"(K.{kname}_all if {rows} == 1 else K.{kname}) "
                  f"if R.parallel_allowed({size}, {threshold}) else "
                  f"K.{kname}_all_serial if {rows} == 1 else K.{kname}_serial)")
        return f"{kernel}({', '.join([size, rows] + args)})"

    def reducing_checks(self, size: str, rows: str, where: Where) -> list[str]:
        # (the comparison first: a sum of a few elements calls nothing)
        return [f"if {size} > {SUMMED_UNCHECKED} and {rows} == 1: "
                f"R.partial_sums_fit({size}, {where!r})"]

    def reduce_in_function(self, kname: str, size: str, rows: str, args: list[str],
                           cost: int) -> list[str]:
        call = f"({', '.join([size, rows] + args)})"
        return [f"if {rows} == 1 and {size} >= {parallel_threshold(cost)}:",
                f"    {kname}_all_serial{call}", "else:", f"    {kname}_serial{call}"]

    def compiled_ir(self, kernels: ModuleType, kname: str, signature: str) -> str:
        cached = getattr(kernels, kname + "_serial")
        # A dispatcher that found machine code in Numba's cache has no LLVM
        # IR to show: compile a copy of it that has no cache.
        fresh = numba.jit(pipeline_class=cached._compiler.pipeline_class,
                          **cached.targetoptions)(cached.py_func)
        fresh.compile(signature)
        (llvm,) = fresh.inspect_llvm().values()
        return llvm

    def is_array(self, value: Any) -> bool:
        return isinstance(value, np.ndarray)

    def accept(self, value: Any, what: str) -> np.ndarray:
        if is_device_array(value):
            raise ArgumentError(f"{what} is a GPU array, but this function runs on the CPU; "
                                "load the module with a GPU target")
        return value

    def to_host(self, array: Any) -> np.ndarray:
        return array

    def full(self, shape: tuple, value, dtype) -> np.ndarray:
        return full(shape, value, dtype)


TARGET = CpuTarget()
