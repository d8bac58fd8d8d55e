"""What the targets' helper modules share (drivers call them as `R`)."""
from __future__ import annotations

import math
import os
import sys
from typing import Optional, Union

import numpy as np

from gradlang.runtime.args import SUPPORTED
from gradlang.runtime.errors import (AllocationError, ArgumentError, ArrayTooLarge,
                                     SizeMismatchError, SizeOverflowError, Span)

# What a driver tells a runtime check about the source of what it checks:
# (text naming it, (file, line, col, end_line, end_col) of its place[, the
# call that reached it: `Span.via`]) as codegen writes it (repr'd), or the
# text alone (modules compiled before).
Where = Union[str, tuple]


def where_of(what: str, span: Optional[Span]) -> Where:
    """The `Where` of `what` at `span` (a plain literal: codegen repr()s it)."""
    if span is None:
        return what
    place = (span.file, span.line, span.col, span.end_line, span.end_col)
    return (what, place, span.via) if span.via else (what, place)


def placed(where: Where) -> tuple[str, Optional[Span]]:
    """`where`'s text and its place in the source (None if it has none)."""
    if isinstance(where, tuple):
        what, at, *via = where
        return what, Span(*at, *via)
    return where, None


def into(buffer, value, fresh: bool):
    """An output for the caller: `value` copied into the caller's `out=`
    buffer when there is one, else `value` (copied first unless `fresh`,
    so that no result is a view of an argument or of another result).
    Buffers are NumPy arrays: the dsl refuses out= on other targets."""
    if buffer is None:
        return value if fresh else np.array(value)
    np.copyto(buffer, value)
    return buffer


def axis_runs(axes: tuple[int, ...]) -> list[tuple[int, int]]:
    """Split sorted axes into maximal runs of consecutive axes, as
    (start, stop) pairs: each run is one (outer, reduced, inner) view."""
    runs: list[tuple[int, int]] = []
    for a in axes:
        if runs and runs[-1][1] == a:
            runs[-1] = (runs[-1][0], a + 1)
        else:
            runs.append((a, a + 1))
    return runs


def size_mismatch(symbol: str, first: str, first_axis: int, expected: int, argument: str,
                  axis: int, got: int) -> None:
    """Raised by a driver whose arguments disagree on a shared size: the
    axis that bound it first, and the one that differs."""
    raise SizeMismatchError(f"{argument} has size {got} on axis {axis}, but {first} has "
                            f"{expected} on axis {first_axis}, and this program takes them "
                            f"equal (both {symbol})")


def derived_size_mismatch(argument: str, axis: int, got: int, shown: str, expected: int,
                          base: str, first: str, first_axis: int, size: int) -> None:
    """Raised by a driver given an argument whose axis has not a slice's
    length (`shown`, `expected` elements: `compiler.shapes.derivation`, a
    gradient's cotangent of `x[1:]`, of `x[1::2]`, of `x[:3]`) of the size
    n (`base`) another argument's axis binds."""
    raise SizeMismatchError(f"{argument} has size {got} on axis {axis}, but this program "
                            f"takes it of size {shown} = {expected}, "
                            f"where {base} is {size} (axis {first_axis} of {first})")


def shortened_size_mismatch(argument: str, axis: int, got: int, base: str, less: int,
                            first: str, first_axis: int, size: int) -> None:
    """`derived_size_mismatch` of max(0, n - c), as the drivers of modules
    compiled before it was call it."""
    derived_size_mismatch(argument, axis, got, f"max(0, {base} - {less})",
                          max(0, size - less), base, first, first_axis, size)


def size_too_small(symbol: str, got: int, needed: int) -> None:
    """Raised by a driver compiled for a symbolic size (`gradc compile --sig
    'f(f64[n])'`) that selects a fixed part of an axis of that size
    (`t[0:2]`, `t[3]`), given an axis too short to hold it."""
    raise SizeMismatchError(f"size {symbol} is {got}, but this program selects elements of "
                            f"that axis up to position {needed - 1}, so it needs {symbol} >= "
                            f"{needed}")


def fixed_size_mismatch(argument: str, axis: int, expected: int, got: int) -> None:
    """Raised by a driver compiled for a fixed size (`gradc compile --sig
    'f(f64[4])'`) given another."""
    raise SizeMismatchError(f"{argument} has size {got} on axis {axis}; this program was "
                            f"compiled for size {expected} there")


# The largest byte count (or size) an array can have: sizes are signed.
MAX_SIZE = int(np.iinfo(np.intp).max)


def counted_bytes(shape: tuple, itemsize: int) -> int:
    """The byte count NumPy checks against `MAX_SIZE` to make an array of
    `shape`: that of its nonzero axes (an empty array's other axes count
    too: np.empty((2**62, 0)) is 'array is too big')."""
    return math.prod(d for d in shape if d) * itemsize


def host_memory() -> tuple[int, str]:
    """The most bytes this process's arrays can take, and whose memory that
    is (as errors say it): the machine's RAM and swap together, or less
    where a cgroup (a container's, a batch job's) limits the process, since
    going past that limit gets the process killed rather than a MemoryError.
    An array larger than that cannot be made (every array a driver makes,
    its kernels write whole); `MAX_SIZE` where the system does not say."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # (no sysconf: Windows)
        return MAX_SIZE, "this machine's memory"
    if ram <= 0:
        return MAX_SIZE, "this machine's memory"
    swap = _meminfo_kib("SwapTotal") * 1024
    limited = cgroup_memory_limit(swap)
    if limited is not None and limited < ram + swap:
        return limited, "this process's memory limit (its cgroup's, with swap)"
    return min(ram + swap, MAX_SIZE), "this machine's memory (with swap)"


def _meminfo_kib(field: str) -> int:
    """`field` of /proc/meminfo in KiB (0 where it cannot be read)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def cgroup_memory_limit(host_swap: int, root: str = "/sys/fs/cgroup",
                        membership: str = "/proc/self/cgroup") -> Optional[int]:
    """The bytes of memory and swap together that this process's cgroup
    and its ancestors let it use (the tightest of them), under cgroup v2 or
    v1; None where none sets a limit or none can be read.  Swap the cgroup
    does not limit counts as `host_swap`, the machine's."""
    try:
        with open(membership) as lines:
            entries = [line.rstrip("\n").split(":", 2) for line in lines]
    except OSError:
        return None
    for hierarchy, controllers, path in (e for e in entries if len(e) == 3):
        if hierarchy == "0" and not controllers:  # v2: memory.max + memory.swap.max
            memory = _tightest(root, path, "memory.max")
            if memory is not None:
                swap = _tightest(root, path, "memory.swap.max")
                return memory + min(host_swap, swap if swap is not None else host_swap)
        elif "memory" in controllers.split(","):  # v1: memsw is memory and swap
            both = _tightest(os.path.join(root, "memory"), path, "memory.memsw.limit_in_bytes")
            if both is not None:
                return both
            memory = _tightest(os.path.join(root, "memory"), path, "memory.limit_in_bytes")
            if memory is not None:
                return memory + host_swap
    return None


def _tightest(mount: str, path: str, name: str) -> Optional[int]:
    """The least limit `name` gives in cgroup `path` and each of its
    ancestors under `mount` (a file missing where the cgroup is not
    visible, as in a container, is skipped); None if none sets one.  v1
    says "no limit" with a number near 2^63, v2 with "max"."""
    limits = []
    parts = [part for part in path.split("/") if part]
    for depth in range(len(parts), -1, -1):
        try:
            with open(os.path.join(mount, *parts[:depth], name)) as text:
                value = text.read().strip()
        except OSError:
            continue
        if value.isdigit() and int(value) < MAX_SIZE // 2:
            limits.append(int(value))
    return min(limits) if limits else None


HOST_MEMORY, HOST = host_memory()  # (HOST: whose memory that is, as errors say)


def require_host_room(shape: tuple, dtype, what: str, span: Optional[Span]) -> None:
    """Refuse (as `too_large`) an array of `shape` and `dtype` larger than
    this process can have (`HOST_MEMORY`), before it is made: one a call assembles on the
    host (a Jacobian)."""
    itemsize = np.dtype(dtype).itemsize
    if math.prod(shape) * itemsize > HOST_MEMORY or counted_bytes(shape, itemsize) > MAX_SIZE:
        too_large(shape, dtype, where_of(what, span), HOST_MEMORY, HOST)


def amount(nbytes: int) -> str:
    """A byte count as people read it: `7.28 TiB`, `512 bytes`."""
    if nbytes < 1024:
        return f"{nbytes} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):  # (PiB, however many)
        nbytes /= 1024
        if nbytes < 1024:
            break
    return f"{nbytes:.3g} {unit}" if nbytes < 1000 else f"{nbytes:.0f} {unit}"


def too_large(shape: tuple, dtype, where: Where, limit: int, memory: str,
              names_call: bool = False) -> None:
    """Raised by a driver (through its target's `too_large`, which gives
    `limit`, the bytes an array may have, and `memory`, whose memory that
    is) before it makes an array of `shape` and `dtype` that is larger:
    `SizeOverflowError` if no array's size can count it, else
    `AllocationError`.  `where`: the array, as the call's ("its result"),
    and the expression making it (`Where`); `names_call`: its text names
    the call already (`ArrayTooLarge.about_call` then adds no name)."""
    what, span = placed(where)
    dtype = np.dtype(dtype)
    elements = math.prod(shape)
    nbytes = elements * dtype.itemsize
    array = f"{SUPPORTED.get(dtype, str(dtype))}[{', '.join(map(str, shape))}]"
    if counted_bytes(shape, dtype.itemsize) > MAX_SIZE:  # (an empty one's axes count too)
        count = (f"{elements} elements of {dtype.itemsize} bytes, a byte count beyond the "
                 f"{MAX_SIZE} an array can have" if elements else "empty, but the sizes of its "
                 f"other axes multiply beyond the {MAX_SIZE} bytes an array can count")
        error: ArrayTooLarge = SizeOverflowError(f"{what} would be {array}: {count}", span)
    else:
        error = AllocationError(f"{what} would be {array}, {amount(nbytes)}, which cannot be "
                                f"allocated: {memory} has {amount(limit)}", span)
    error.names_call = names_call
    raise error


def out_of_memory(err: MemoryError) -> AllocationError:
    """A call's `MemoryError` from an allocation that failed (NumPy's
    says how much it asked for), as the `AllocationError` a user sees."""
    error = AllocationError(f"ran out of memory ({str(err) or 'an allocation failed'})")
    error.__cause__ = err  # (kept under GRADC_FULL_TRACEBACK: `boundary.leaving`)
    return error


def fillable(shape: tuple, dtype) -> tuple:
    """`shape`, for a driver's `full`: ArgumentError if an array of that
    shape and dtype could not be addressed (a size a program was compiled
    for by value, `segment_sum`'s count, too large), where NumPy would
    raise its own ValueError."""
    if counted_bytes(shape, np.dtype(dtype).itemsize) > MAX_SIZE:
        why = ("is empty, but the sizes of its other axes multiply beyond what an array can "
               "count" if 0 in shape else "needs more memory than can be addressed")
        raise ArgumentError(f"a value of shape {list(shape)} and dtype {np.dtype(dtype)} {why}: "
                            "a size an argument gives is too large")
    return shape


def iota(start, stop, step, dtype) -> np.ndarray:
    """`np.arange(start, stop, step)` in `dtype` (int64 or float64): the
    values of the language's `arange`, for the drivers of every target and
    for the reference interpreter (one definition, so the targets and the
    oracle agree to the bit: NumPy fills floats as start + i * delta)."""
    if _ascends_to(start, stop, step):  # (`arange_length` is not 0)
        if abs(step) < _INEXACT_STEP or np.dtype(dtype).kind == "f":
            return np.arange(start, stop, step, dtype=dtype)
        # NumPy counts integers as a float quotient too: arange(-5, 2**62,
        # 2**62) has one value for it, where the type rule counts two (and a
        # kernel read past the end).  Counted exactly; i64 wraps in between,
        # and the values themselves fit (`values.check_range_fits`).
        count = range_length(int(start), int(stop), int(step))
        return np.arange(count, dtype=np.int64) * np.int64(step) + np.int64(start)
    # NumPy's own count overflows for bounds far apart and the wrong way
    # round, arange(2**63 - 1, -2**63) or arange(2.0**62, 0.5, 1e-300):
    # "Maximum allowed size exceeded" for what has no values.  (By the
    # signs, not arange_length: a driver makes each arange at each call,
    # and counting its length doubled a small call's time.)
    return np.empty(0, dtype)


def _ascends_to(start, stop, step) -> bool:
    """Whether `np.arange(start, stop, step)` has any value: stop lies
    beyond start in step's direction (by the signs, not the quotient,
    which underflows to 0 for arange(0.0, 1e-300, 1e300): one value)."""
    return stop != start and (stop > start) == (step > 0)


# A step at which NumPy's float count of an integer range can be wrong:
# the range spans more than 2**53 (a float's exact integers) in fewer
# steps than 2**41 (any more are beyond memory).
_INEXACT_STEP = 2**12


def range_length(start: int, stop: int, step: int) -> int:
    """`len(range(start, stop, step))` for any Python ints (`step` not 0),
    where `len` raises OverflowError beyond 2**63 - 1 (`range(-2**63,
    2**63 - 1)`: i64 bounds in the source or by value): such a length is
    then refused as too large by whoever asked."""
    return max(0, -((start - stop) // step))


def arange_length(start, stop, step) -> int:
    """How many values `np.arange(start, stop, step)` has, for finite
    numbers (`step` not 0): `range_length` of ints, else NumPy's
    ceil((stop - start) / step), where a quotient beyond the floats
    (`arange(2.0**62, 0.5, -1e-300)`, inf) counts as the largest float,
    a length refused as too large as any beyond memory is."""
    if all(isinstance(v, int) for v in (start, stop, step)):
        return range_length(start, stop, step)
    if not _ascends_to(start, stop, step):
        return 0
    # (at least one: a quotient that underflows to 0 has start, as NumPy's)
    return max(1, math.ceil(min((stop - start) / step, sys.float_info.max)))


def trip_count(start: int, stop: int, step: int, where: Where = "",
               stacked_bytes: int = 0, limit: int = MAX_SIZE, memory: str = HOST) -> int:
    """How many times `for i in range(start, stop, step)` runs; `where`: the
    loop's place in the source, for the error (`Where`, its text a suffix
    of the messages); `stacked_bytes`: what the
    loop keeps of each trip (for a backward pass), refused before it is
    allocated if the trips' total cannot be addressed (it overflowed
    NumPy's size computations: `ArgumentError`), or if it is more than
    `limit` bytes, `memory`'s (`AllocationError`, as `too_large`'s: a
    target's drivers pass theirs, since under a container's limit the
    stacks' allocation would not fail, the process would be killed as it
    filled them).  A count beyond i64 is refused too, as no kernel can
    count it."""
    where, span = placed(where)
    if step == 0:
        raise ArgumentError(f"range() step must not be zero{where}", span)
    trips = range_length(start, stop, step)
    if trips > MAX_SIZE:
        raise ArgumentError(f"range({start}, {stop}, {step}){where} runs {trips} trips, "
                            f"more than a loop counts (at most {MAX_SIZE})", span)
    if trips * stacked_bytes > MAX_SIZE:
        raise ArgumentError(f"the loop{where} runs {trips} trips and keeps {stacked_bytes} "
                            "bytes of each for its gradient: more memory than can be "
                            "addressed", span)
    if trips * stacked_bytes > limit:
        raise AllocationError(f"the loop{where} runs {trips} trips and keeps {stacked_bytes} "
                              f"bytes of each for its gradient, "
                              f"{amount(trips * stacked_bytes)}, which cannot be allocated: "
                              f"{memory} has {amount(limit)}", span)
    return trips


def empty_axis(shape, axes, where: Where, empty) -> bool:
    """Whether a max along `axes` of an array of `shape` is over an empty
    axis, where its value is `empty`; with no `empty` (None) that is an
    error: max/min over an empty axis has no value (NumPy raises too).
    `where`: the max's place in the source."""
    if not any(shape[a] == 0 for a in axes):
        return False
    if empty is None:
        where, span = placed(where)
        raise ArgumentError(f"max/min over an empty axis (shape {list(shape)}, axes "
                            f"{list(axes)}){where}; give it an initial value "
                            "(max(x, axis, initial=v)) for that axis", span)
    return True


def c_strides(shape) -> list:
    """Element strides of a C-contiguous array (sizes may be symbolic)."""
    strides, acc = [], 1
    for d in reversed(tuple(shape)):
        strides.append(acc)
        acc = acc * d
    return strides[::-1]


def slice_layout(shape, where: tuple) -> tuple[tuple, int, list]:
    """The region `where` (Python slices) of a C-contiguous array of
    `shape`: its shape, the flat offset of its first element and its
    element strides (negative for a negative step)."""
    bounds = [s.indices(d) for s, d in zip(where, shape)]
    strides = c_strides(shape)
    out_shape = tuple(len(range(*b)) for b in bounds)
    offset = sum(b[0] * s for b, s in zip(bounds, strides))
    return out_shape, offset, [b[2] * s for b, s in zip(bounds, strides)]


def stride_table(out_shape, src_strides) -> tuple:
    """(out stride, out size, source stride) per axis, flattened: how a
    kernel maps flat output index i to a source element, as
    sum(((i // out_stride) % out_size) * source_stride)."""
    table = []
    for s, d, t in zip(c_strides(out_shape), out_shape, src_strides):
        table += [s, d, t]
    return tuple(table)


def index_out_of_range(where: Where, index: int, size: int) -> None:
    """Raised by a gather or scatter-add whose index array holds `index`
    where an axis has `size` elements (before any result is returned);
    `where` names the index array (`Where`)."""
    what, span = placed(where)
    raise ArgumentError(index_out_of_range_message(index, what, size), span)


def index_out_of_range_message(index: int, what: str, size: int) -> str:
    """What an index out of range says, `what` naming the index ("" for
    none): at run time (`index_out_of_range`) and, for an argument's value
    that indexes when compiled (`x[i]` for a `const` i), at compile time."""
    return (f"index {index}{' in ' * bool(what)}{what} is out of range for an axis of size "
            f"{size} " + (f"(valid: {-size} to {size - 1})" if size else
                          "(an empty axis has none)"))


def nonzero_divisor(size: int, where: Where) -> int:
    """`size`, which a float divides by (`0.1 / k`, a number computed at
    run time: `compiler.lower.Lowerer.size_number`); 0 raises, as the
    division by zero of compile-time arithmetic does (and Python's
    `0.1 / x.shape[0]`), where an infinity would pass on silently.
    `where`: the division."""
    if size == 0:
        raise ArgumentError("division by zero: a size this divides by is 0 in this call",
                            placed(where)[1])
    return size


def index_views(shape: tuple, axis: int) -> tuple[int, int, int]:
    """(outer, size of `axis`, inner): the 3-d view a gather or scatter-add
    along `axis` works on."""
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
