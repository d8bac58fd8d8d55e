"""The CUDA target: its `Target` (`TARGET`, at the end), the helpers that
generated drivers call (imported there as `R`), and the host/device
boundary.

Contract: the same functions as `runtime.cpu` (ALLOCATABLE, too_large,
empty, scalar, copy, flat, reshape, transpose, slice, embed, concatenate,
matmul, reduce_sum, reduce_max, cumsum, size_mismatch, size_too_small, fixed_size_mismatch,
take, take_along_axis, scatter_add, scatter_add_along_axis), taking and
returning C-contiguous
Numba device arrays; layout operations materialize contiguous results with
a gather or scatter kernel, so every array a driver holds is contiguous.
`to_device` and `to_host` are the only places data crosses the bus (tests
count them).  On a GPU the arrays the helpers make come from a pool of
device memory whose arrays are gone (`_pooled_device_array`).
Reductions: over an (outer, reduced, inner) view, a thread per output, or,
where the outputs are too few to fill the grid, per run
of the reduced axis, whose results are reduced again (`_run_length`); for
long rows, a block-level tree in shared memory whose block results are
reduced again (no atomics: the bits do not depend on the blocks' order,
and a max keeps NaN); sums accumulate in f64 (floats) or i64.  Matmul is a
tiled shared-memory kernel over a stack of matrices (batch axes that
broadcast are gathered into the stack first).  `require()` raises a clear error when
numba-cuda or a GPU (or the simulator) is missing.
"""
from __future__ import annotations

import builtins
import importlib.util
import itertools
import math
import os
import sys
import weakref
from types import ModuleType
from typing import Any, Optional, Sequence

import numpy as np

from gradlang.runtime.target import Target, TargetError


def require() -> None:
    """Raise a clear error unless CUDA kernels can run here."""
    if importlib.util.find_spec("numba_cuda") is None:
        raise TargetError("target='cuda' needs the numba-cuda package: "
                        "pip install 'gradlang[cuda]'")
    from numba import config, cuda
    if config.ENABLE_CUDASIM:
        return
    if not cuda.is_available():
        raise TargetError("target='cuda': no CUDA GPU is available here; set "
                        "NUMBA_ENABLE_CUDASIM=1 to run on Numba's CUDA simulator")
    _require_kernel_compiler()


def _require_kernel_compiler() -> None:
    """Raise a clear error unless numba-cuda's code generation imports: it
    does so at a kernel's first compile, and numba-cuda 0.30.4 with NumPy
    2.5 failed there ("module 'numpy' has no attribute 'row_stack'"), an
    AttributeError at the user's first call on a GPU."""
    try:
        importlib.import_module("numba.cuda.cudaimpl")
    except Exception as err:
        from importlib.metadata import version
        raise TargetError(
            f"target='cuda': numba-cuda {version('numba-cuda')} cannot compile kernels "
            f"with NumPy {np.__version__} ({type(err).__name__}: {err}); install a "
            f"numba-cuda release that supports this NumPy, or an older NumPy") from err


require()

from numba import config, cuda, float64, int64  # noqa: E402  (after the check)

from gradlang.runtime.common import (  # noqa: E402,F401
    axis_runs,
    c_strides,
    empty_axis,
    fillable,
    derived_size_mismatch,
    fixed_size_mismatch,
    index_out_of_range,
    index_views,
    into,
    nonzero_divisor,
    shortened_size_mismatch,
    size_mismatch,
    size_too_small,
    slice_layout,
    stride_table,
    Where,
)
from gradlang.runtime import common, cuda_math  # noqa: E402
from gradlang.runtime import memory as block_pools  # noqa: E402 (`memory` says whose memory)
from gradlang.runtime.common import iota as host_iota  # noqa: E402
from gradlang.runtime.errors import ArgumentError  # noqa: E402
from gradlang.runtime.target import is_device_array  # noqa: E402,F401 (part of this module's API)

SIMULATOR = bool(config.ENABLE_CUDASIM)
if SIMULATOR:
    class CudaAPIError(Exception):
        """(The simulator's allocations are NumPy's: never raised.)"""
    _OUT_OF_MEMORY = None
else:  # (Numba's own test for it: `driver.NumbaCUDAMemoryManager._attempt_allocation`)
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba.cuda.cudadrv.driver import AutoFreePointer, CudaAPIError, binding
    _OUT_OF_MEMORY = binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY


def _shared_arrays_allocated_once() -> None:
    """The simulator's `cuda.shared.array` makes a block's array at the
    first thread's call with no lock (numba-cuda 0.30: a lookup, then a
    store): a thread that looked up before the first stored got an array
    of its own, so a block's threads staged matmul tiles and reduction
    trees in different memory and a result was wrong now and then (a
    batched matmul's gradient off by 6.6 in one full test run).  The same
    allocation, keyed by the caller's file and line as the simulator keys
    it, under a lock."""
    import threading
    from numba.core import types
    from numba.cuda.simulator.kernelapi import FakeCUDAShared
    from numba.np import numpy_support
    allocate, lock = FakeCUDAShared.array, threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:  # dynamic shared memory; refused
            return allocate(self, shape, dtype, alignment)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            if key not in self._allocations:
                if isinstance(dtype, types.Type):
                    dtype = numpy_support.as_dtype(dtype)
                self._allocations[key] = np.empty(shape, dtype)
            return self._allocations[key]
    FakeCUDAShared.array = array


def _one_simulated_launch_at_a_time() -> None:
    """The simulator runs one launch at a time (it asserts so), keeps a
    launch's grid on the kernel object between `kernel[grid, block]` and
    the call, and while a kernel runs swaps every global of its module
    that is `numba.cuda` (this module's `cuda`, a kernel module's) for a
    fake device API: calls from two host threads failed that assert, ran
    a kernel on the other thread's grid, or found `cuda.device_array`
    missing here.  Each launch now configures and runs its kernel under
    one lock, and the host API is bound below once."""
    import threading
    from numba.cuda.simulator.kernel import FakeCUDAKernel
    configure, lock = FakeCUDAKernel.__getitem__, threading.Lock()

    class Launch:
        def __init__(self, kernel, configuration):
            self.kernel, self.configuration = kernel, configuration

        def __call__(self, *args):
            with lock:
                return configure(self.kernel, self.configuration)(*args)
    FakeCUDAKernel.__getitem__ = lambda kernel, configuration: Launch(kernel, configuration)


if SIMULATOR:
    _shared_arrays_allocated_once()
    _one_simulated_launch_at_a_time()


# numba.cuda's host API that the helpers below use, bound at import: the
# name `cuda` here is a fake while the simulator runs a kernel of this
# module (`_one_simulated_launch_at_a_time`; the simulator has no
# as_cuda_array, and a GPU swaps nothing)
_device_array_api, _to_device_api = cuda.device_array, cuda.to_device
# The simulator runs each thread as a Python thread: keep blocks small there.
THREADS = 8 if SIMULATOR else 256
MAX_BLOCKS = 2 if SIMULATOR else 2048
TILE = 4 if SIMULATOR else 16
# A grid's y dimension holds at most 65535 blocks on every GPU, so kernels
# gridded by rows stride over them; the simulator's small cap makes every
# test run that stride.
MAX_GRID_Y = 2 if SIMULATOR else 65535


class _SimulatorMath:
    """What `math` means inside kernels under the simulator: the simulator
    runs kernels as Python, whose math.exp(1000.0) raises where the GPU
    returns inf; NumPy's function of the same name (NumPy 2 has every name
    `math` has for the ops' templates) gives the GPU's IEEE results.  The
    device functions of `runtime.cuda_math` run as themselves."""

    def __getattr__(self, name: str):
        if name in _DEVICE_FUNCTIONS:
            return getattr(cuda_math, name)
        function = getattr(np, name, None)
        if not isinstance(function, np.ufunc):
            return getattr(math, name)

        def ieee(*args):
            with np.errstate(all="ignore"):
                return function(*args)
        return ieee


_DEVICE_FUNCTIONS = ("floor_quotient", "floor_remainder", "select")
# Generated CUDA kernels import this as `math`: `runtime.cuda_math` on a GPU.
kernel_math = _SimulatorMath() if SIMULATOR else cuda_math


def blocks(n: int) -> int:
    return max(1, min(MAX_BLOCKS, -(-n // THREADS)))


# ------------------------------------------------------------ memory


def __getattr__(name: str):
    # ALLOCATABLE, worked out at a driver's first check (asking the GPU
    # its size opens its context: not at import), then a global
    if name == "ALLOCATABLE":
        value = globals()[name] = _device_memory()
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _device_memory() -> int:
    """The most bytes a device array may have: the GPU's memory (the
    simulator's arrays are the host's)."""
    if SIMULATOR:
        return common.HOST_MEMORY
    return int(cuda.current_context().get_memory_info().total)


def _limit() -> int:
    """ALLOCATABLE (which a bare name in this module would not find)."""
    return sys.modules[__name__].ALLOCATABLE


def memory() -> str:
    """Whose memory `ALLOCATABLE` is, as an error says it."""
    return common.HOST if SIMULATOR else "the GPU"


def too_large(shape: tuple, dtype, where: Where) -> None:
    common.too_large(shape, dtype, where, _limit(), memory())


def trip_count(start: int, stop: int, step: int, where: Where = "",
               stacked_bytes: int = 0) -> int:
    """`common.trip_count`, the loop's stacks (device arrays) refused past
    `ALLOCATABLE`."""
    return common.trip_count(start, stop, step, where, stacked_bytes,
                             _limit() if stacked_bytes else common.MAX_SIZE, memory())


def _device_array(shape, dtype):
    """An uninitialized C-contiguous device array, from the device pool on a
    GPU (`_pooled_device_array`); its failure for want of device memory a
    `MemoryError` (as a host allocation's: `boundary.user_facing` says it
    as an `AllocationError`), not Numba's CudaAPIError."""
    if _POOLED:
        return _pooled_device_array(shape, dtype)
    return _allocating(lambda: _device_array_api(shape, dtype), shape, dtype)


def _allocating(allocate, shape, dtype):
    """allocate(), tried again once the device pools are released should the
    GPU refuse it (Numba frees released blocks as it retries); refused
    again, a MemoryError."""
    for last in (False, True):
        try:
            return allocate()
        except CudaAPIError as err:
            if err.code != _OUT_OF_MEMORY:
                raise
            if last:
                raise MemoryError(f"the GPU could not allocate {_amount(shape, dtype)}") from err
            for pool in list(block_pools.POOLS):
                if pool is not block_pools.HOST:
                    pool.release()


# Device arrays come from a pool of allocations whose last array is gone
# (`runtime.memory.FreeBlocks`, one per GPU context), as PyTorch's and
# JAX's do: Numba allocates each with cuMemAlloc and frees it with
# cuMemFree, which waits for the GPU, and together they took half of
# `value_and_grad` of log1pexp at 1e8 f32 on an H200 (1.27 ms; pooled
# 0.68 ms, benchmarks/bench_cuda.py).  A block is reused in the order of
# the default stream, which every kernel here runs on, so a kernel still
# writing a block precedes the next one given it; with a default stream
# per thread (CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1, which
# numba-cuda reads; Numba's own setting too) that order would not hold,
# and the pool is off.  Free blocks are kept up to GRADC_CUDA_POOL_BYTES
# (default: a quarter of the GPU's memory); an allocation the GPU refuses
# releases them all and is tried again, and `memory.release()` releases
# them now.  The pool lives in its context's `extras`, so a context reset
# (`cuda.close()`), which frees its allocations, takes the pool with it.
_POOLED = not SIMULATOR and not (
    config.CUDA_PER_THREAD_DEFAULT_STREAM
    or os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM") == "1")
_lent: dict = {}  # key -> the pointer of a block that arrays use now (Numba's arrays
_lent_keys = itertools.count()  # hold weak proxies of it, as of its own allocations)


def device_pool_limit() -> int:
    """The most bytes of free device blocks a GPU's pool keeps."""
    return block_pools.limit_from_env("GRADC_CUDA_POOL_BYTES", _limit() // 4)


def _device_pool(context) -> "block_pools.FreeBlocks":
    pool = context.extras.get("gradlang pool")
    if pool is None:
        pool = context.extras.setdefault("gradlang pool",
                                         block_pools.FreeBlocks(device_pool_limit))
        block_pools.POOLS.add(pool)
    return pool


def _pooled_device_array(shape, dtype):
    dtype = np.dtype(dtype)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(map(int, shape))
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return _allocating(lambda: _device_array_api(shape, dtype), shape, dtype)
    context = cuda.current_context()
    pool = _device_pool(context)
    block = pool.take(nbytes)
    try:
        address = None if block is None else block.device_pointer
    except ReferenceError:  # freed by a `Context.reset()` of the context kept
        pool.release()
        address = None
    if address is None:
        block = _allocating(lambda: context.memalloc(nbytes), shape, dtype)
        address = block.device_pointer
    key = next(_lent_keys)

    def give_back():
        _lent.pop(key, None)
        if block_pools._open:  # (at exit, the pool may be gone)
            pool.give_back(block, nbytes)

    pointer = AutoFreePointer(weakref.proxy(context), address, nbytes, finalizer=give_back)
    _lent[key] = pointer
    strides = tuple(s * dtype.itemsize for s in c_strides(shape))
    return DeviceNDArray(shape, strides, dtype, gpu_data=pointer.own())


def _amount(shape, dtype) -> str:
    return common.amount(math.prod((shape,) if isinstance(shape, int) else shape)
                         * np.dtype(dtype).itemsize)


# ------------------------------------------------------------ host / device


def to_device(a: np.ndarray):
    """Copy a host array to the device (the one host-to-device path)."""
    a = np.require(a, requirements="C")
    return _allocating(lambda: _to_device_api(a), a.shape, a.dtype)  # keeps 0-d arrays 0-d


def to_host(d) -> np.ndarray:
    """Copy a device array to the host (the one device-to-host path); a
    host array is already there (a call a `dsl.Tape` recorded with
    `host_results` gives its results on the host, as the tape tracks them)."""
    return d if isinstance(d, np.ndarray) else d.copy_to_host()


def as_device(x):
    """A device array for x: device arrays as they are, any object with
    `__cuda_array_interface__` without a copy, host data copied once."""
    if is_device_array(x):
        return x
    if hasattr(x, "__cuda_array_interface__"):
        return cuda.as_cuda_array(x)
    return to_device(np.asarray(x))


# -------------------------------------------------------------- kernels


@cuda.jit
def _fill(out, value):
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = value


@cuda.jit(device=True)
def _source_index(i, offset, meta):
    # meta: a stride table (runtime.common.stride_table)
    j = offset
    for r in range(0, len(meta), 3):
        j += ((i // meta[r]) % meta[r + 1]) * meta[r + 2]
    return j


@cuda.jit
def _gather(out, src, offset, meta):
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = src[_source_index(i, offset, meta)]


@cuda.jit
def _scatter(out, src, offset, meta):
    for i in range(cuda.grid(1), src.size, cuda.gridsize(1)):
        out[_source_index(i, offset, meta)] = src[i]


@cuda.jit
def _scatter_add_strided(out, src, offset, meta):
    for i in range(cuda.grid(1), src.size, cuda.gridsize(1)):
        out[_source_index(i, offset, meta)] += src[i]


if SIMULATOR:
    @cuda.jit
    def _cast(out, src):
        # The GPU's conversion of an integer to a narrower one wraps, as
        # NumPy's astype does; the simulator's store of a value out of the
        # narrower type's range raised OverflowError (an i32 sum that
        # wrapped on the CPU).  The conversion's own type wraps it first.
        convert = out.dtype.type
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            out[i] = convert(src[i])
else:
    @cuda.jit
    def _cast(out, src):
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            out[i] = src[i]


@cuda.jit
def _sum_middle(src, n_outer, n_reduced, n_inner, per, out, zero):
    # one thread per output (o, c, i) of an (outer, chunks, inner) array:
    # the sum of src[o, r, i] over the c-th run of `per` rows r (one run
    # of them all: a thread per output); `zero` has the accumulator's type
    # (f64 for floats, i64 for integers)
    chunks = (n_reduced + per - 1) // per
    for k in range(cuda.grid(1), n_outer * chunks * n_inner, cuda.gridsize(1)):
        o, c, i = k // (chunks * n_inner), (k // n_inner) % chunks, k % n_inner
        base = o * n_reduced * n_inner + i
        acc = zero
        for r in range(c * per, min(c * per + per, n_reduced)):
            acc += src[base + r * n_inner]
        out[k] = acc


@cuda.jit
def _max_middle(src, n_outer, n_reduced, n_inner, per, out):
    chunks = (n_reduced + per - 1) // per
    for k in range(cuda.grid(1), n_outer * chunks * n_inner, cuda.gridsize(1)):
        o, c, i = k // (chunks * n_inner), (k // n_inner) % chunks, k % n_inner
        base = o * n_reduced * n_inner + i
        start = c * per
        acc = src[base + start * n_inner]
        for r in range(start + 1, min(start + per, n_reduced)):
            v = src[base + r * n_inner]
            if v > acc or v != v:
                acc = v
        out[k] = acc


@cuda.jit
def _tree_rows(src, n_rows, n_reduced, partials, is_max):
    # grid (chunks, rows, striding): a tree in shared memory per block and
    # row, whose result is partials[row, chunk]; floats only.  No atomics:
    # a float atomic add makes the sum's bits depend on the blocks' order,
    # and an atomic max skips a NaN, which NumPy's max keeps.
    shared = cuda.shared.array(THREADS, float64)
    tid = cuda.threadIdx.x
    start = cuda.blockIdx.x * cuda.blockDim.x + tid
    for row in range(cuda.blockIdx.y, n_rows, cuda.gridDim.y):
        # f64 from the start: 0.0 + an f32 value is f32 under NumPy 2's
        # promotion, and so on the simulator
        acc = float64(-np.inf) if is_max else float64(0.0)
        for r in range(start, n_reduced, cuda.gridDim.x * cuda.blockDim.x):
            v = src[row * n_reduced + r]
            if not is_max:
                acc += v
            elif v > acc or v != v:
                acc = v
        shared[tid] = acc
        cuda.syncthreads()
        step = cuda.blockDim.x // 2
        while step > 0:
            if tid < step:
                other = shared[tid + step]
                if not is_max:
                    shared[tid] += other
                elif other > shared[tid] or other != other:
                    shared[tid] = other
            cuda.syncthreads()
            step //= 2
        if tid == 0:
            partials[row * cuda.gridDim.x + cuda.blockIdx.x] = shared[0]
        # thread 0 reads shared[0] before any thread writes the next row's
        cuda.syncthreads()


def _tiled_matmul(acc_type, name: str):
    """The tiled matmul kernel accumulating in `acc_type` (a Numba type:
    f64 for floats, i64 for integers, whose products and sums then wrap
    as NumPy's do; through f64 an i64 product past 2**53 lost its low
    bits), named `name` (this module's name for it, as a kernel's
    `__name__` is elsewhere: tests/test_cuda_ptx.py finds it by that)."""
    def kernel(a, b, out):
        # (batch, n, k) @ (batch, k, m); grid (column tiles, row tiles,
        # batch), striding over row tiles and batches: each block computes
        # TILE x TILE outputs at a time from tiles staged in shared memory
        sa = cuda.shared.array((TILE, TILE), acc_type)
        sb = cuda.shared.array((TILE, TILE), acc_type)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        col = cuda.blockIdx.x * TILE + tx
        n, k, m = a.shape[1], a.shape[2], b.shape[2]
        zero = acc_type(0)
        for p in range(cuda.blockIdx.z, a.shape[0], cuda.gridDim.z):
            for row_tile in range(cuda.blockIdx.y, (n + TILE - 1) // TILE, cuda.gridDim.y):
                row = row_tile * TILE + ty
                acc = zero
                for t in range((k + TILE - 1) // TILE):
                    sa[ty, tx] = a[p, row, t * TILE + tx] if row < n and t * TILE + tx < k else zero
                    sb[ty, tx] = b[p, t * TILE + ty, col] if col < m and t * TILE + ty < k else zero
                    cuda.syncthreads()
                    for j in range(TILE):
                        acc += sa[ty, j] * sb[j, tx]
                    cuda.syncthreads()
                if row < n and col < m:
                    out[p, row, col] = acc
    kernel.__name__ = kernel.__qualname__ = name
    return cuda.jit(kernel)


_matmul = _tiled_matmul(float64, "_matmul")
_matmul_int = _tiled_matmul(int64, "_matmul_int")


@cuda.jit(device=True)
def _indexed(t, idx, n, m, inner, along, first_bad):
    # Element t of an (outer, m, inner) array of picks -> its flat position
    # in the indexed (outer, n, inner) array; idx is shaped as the picks
    # (along an axis) or (m,).  An index out of range gives -1, its
    # position kept in first_bad.
    r = t // inner
    k = t if along else r % m
    j = idx[k]
    if j < -n or j >= n:
        cuda.atomic.min(first_bad, 0, k)
        return -1
    return ((r // m) * n + (j + n if j < 0 else j)) * inner + t % inner


@cuda.jit
def _take(x, idx, out, n, m, inner, along, first_bad):
    for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        at = _indexed(t, idx, n, m, inner, along, first_bad)
        if at >= 0:
            out[t] = x[at]


@cuda.jit
def _scatter_add(out, idx, values, n, m, inner, along, first_bad):
    # atomics: repeated indices meet in one element
    for t in range(cuda.grid(1), values.size, cuda.gridsize(1)):
        at = _indexed(t, idx, n, m, inner, along, first_bad)
        if at >= 0:
            cuda.atomic.add(out, at, values[t])


@cuda.jit
def _scan_lanes(src, n_outer, n, n_inner, reverse, out):
    # one thread per lane (o, i) of an (outer, n, inner) array: its n
    # elements added in order, in the array's dtype (as np.cumsum)
    for k in range(cuda.grid(1), n_outer * n_inner, cuda.gridsize(1)):
        o, i = k // n_inner, k % n_inner
        at = o * n * n_inner + i + ((n - 1) * n_inner if reverse else 0)
        stride = -n_inner if reverse else n_inner
        acc = src[at]
        out[at] = acc
        for _ in range(1, n):
            at += stride
            acc = acc + src[at]
            out[at] = acc


def _launch(kernel, n: int, *args) -> None:
    kernel[blocks(n), THREADS](*args)


# ------------------------------------------------------- driver helpers


def empty(n, dtype):
    return _device_array(n, dtype)


def scalar(value, dtype):
    out = _device_array(1, dtype)
    _launch(_fill, 1, out, np.dtype(dtype).type(value))
    return out.reshape(())


def full(shape, value, dtype):
    out = _device_array(max(1, math.prod(fillable(shape, dtype))), dtype)
    _launch(_fill, out.size, out, np.dtype(dtype).type(value))
    return out[:math.prod(shape)].reshape(shape) if shape else out.reshape(())


def iota(start, stop, step, dtype):
    """`arange`'s values: made on the host (as many as one axis of what
    reads them) and copied over, the same bits as the CPU's."""
    return to_device(host_iota(start, stop, step, dtype))


def as_int(x) -> int:
    return int(to_host(x))


def stack_read(xs, t: int):
    """Slot t of a loop's stacked values, as a device array (a 0-d one
    for a stack of scalars, which indexing would copy to the host)."""
    return xs[t:t + 1].reshape(xs.shape[1:])


def stack_write(ys, t: int, y) -> None:
    if y.size:  # (an empty copy: nothing to move, see `copy`)
        ys[t:t + 1].reshape(ys.shape[1:]).copy_to_device(y)


def copy(x):
    out = _device_array(x.shape, x.dtype)
    if x.size:  # (the simulator compares an empty array's strides, which may differ)
        out.copy_to_device(x)
    return out


def flat(x):
    return x.reshape(x.size)


def stacked_flat(xs) -> tuple:
    """`cpu.stacked_flat`: a device array is C-contiguous, its rows a row's
    elements apart."""
    return flat(xs), math.prod(xs.shape[1:])


def reshape(x, shape):
    return x.reshape(shape) if tuple(shape) != tuple(x.shape) else x


def _gathered(x, out_shape, offset: int, src_strides):
    size = math.prod(out_shape)
    out = _device_array(max(size, 1), x.dtype)
    if size:
        _launch(_gather, size, out, flat(x), offset, stride_table(out_shape, src_strides))
    return out[:size].reshape(out_shape) if out_shape else out.reshape(())


def transpose(x, perm):
    strides = c_strides(x.shape)
    return _gathered(x, tuple(x.shape[p] for p in perm), 0, [strides[p] for p in perm])


def slice(x, where: tuple):  # noqa: A001 (the op's name)
    return _gathered(x, *slice_layout(x.shape, where))


def embed(x, shape, where: tuple):
    out = full(tuple(shape), 0, x.dtype)
    out_shape, offset, strides = slice_layout(tuple(shape), where)
    if x.size:
        _launch(_scatter, x.size, flat(out), flat(x), offset, stride_table(out_shape, strides))
    return out


def embed_add(base, x, where: tuple, owned: bool = False, assign: bool = False):
    """base with x added into its region `where`, or written there with
    `assign` (in place when owned: the driver made base and reads it no
    more)."""
    out = base if owned else copy(base)
    out_shape, offset, strides = slice_layout(tuple(out.shape), where)
    if x.size:  # (the region's elements are distinct: no two threads meet)
        _launch(_scatter if assign else _scatter_add_strided, x.size, flat(out), flat(x),
                offset, stride_table(out_shape, strides))
    return out


def concatenate(xs: tuple, axis: int):
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    out = full(tuple(shape), 0, xs[0].dtype)
    start = 0
    for x in xs:
        where = tuple(builtins.slice(start, start + x.shape[axis]) if k == axis
                      else builtins.slice(None) for k in range(len(shape)))
        out_shape, offset, strides = slice_layout(tuple(shape), where)
        if x.size:
            _launch(_scatter, x.size, flat(out), flat(x), offset, stride_table(out_shape, strides))
        start += x.shape[axis]
    return out


def _stacked(x, batch: tuple):
    """x's matrices broadcast over the batch axes `batch`, as a contiguous
    (batch size, rows, columns) array (a gather where x repeats)."""
    shape = (1,) * (len(batch) + 2 - x.ndim) + tuple(x.shape)
    rows, cols = shape[-2:]
    if shape[:-2] != batch:
        full = batch + (rows, cols)
        x = _gathered(x, full, 0, [s if d == want else 0  # (d is 1: repeated)
                                   for d, want, s in zip(shape, full, c_strides(shape))])
    return x.reshape((math.prod(batch), rows, cols))


def matmul(a, b):
    # the tiled kernels accumulate in f64 or i64; other dtypes round-trip
    wide = np.int64 if np.dtype(a.dtype).kind in "biu" else np.float64
    if a.dtype != wide:
        return _astype(matmul(_astype(a, wide), _astype(b, wide)), a.dtype)
    a_shape, b_shape = tuple(a.shape), tuple(b.shape)  # (the simulator's index no negatives)
    batch = tuple(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
    n, m = a_shape[-2], b_shape[-1]
    count = math.prod(batch)
    out = _device_array((count, n, m), wide)
    if out.size:
        grid = (max(1, -(-m // TILE)), max(1, min(MAX_GRID_Y, -(-n // TILE))),
                max(1, min(MAX_GRID_Y, count)))
        kernel = _matmul if wide == np.float64 else _matmul_int
        kernel[grid, (TILE, TILE)](_stacked(a, batch), _stacked(b, batch), out)
    return out.reshape(batch + (n, m))


def _astype(x, dtype):
    out = _device_array(x.shape, dtype)
    if x.size:
        _launch(_cast, x.size, flat(out), flat(x))
    return out


# A thread reduces a run of at least this many elements of an axis (few
# on the simulator, so that small tests reduce in runs)
RUN = 4 if SIMULATOR else 64


def _run_length(outputs: int, reduced: int) -> int:
    """How many elements of the reduced axis one thread reduces: all of
    them where the outputs alone give every thread of a full grid one,
    else runs of at least RUN, enough of them to fill the grid (a column
    sum of a tall array ran on as many threads as it has columns); the
    runs' results are reduced again."""
    threads = THREADS * MAX_BLOCKS
    if outputs >= threads or reduced <= RUN:
        return max(reduced, 1)
    runs = max(1, min(-(-reduced // RUN), threads // outputs))
    return -(-reduced // runs)


def _reduce(x, axes, is_max: bool):
    out_dtype = x.dtype
    for start, stop in reversed(axis_runs(axes)):
        shape = tuple(x.shape)
        outer, reduced = math.prod(shape[:start]), math.prod(shape[start:stop])
        inner = math.prod(shape[stop:])
        kept = shape[:start] + shape[stop:]
        if reduced == 0 or outer * inner == 0:
            x = full(kept, 0, out_dtype)
            continue
        acc_dtype = np.float64 if np.dtype(out_dtype).kind == "f" else np.int64
        if inner == 1 and reduced >= 4 * THREADS and np.dtype(out_dtype).kind == "f":
            chunks = max(1, min(MAX_BLOCKS, -(-reduced // (THREADS * 8))))
            partials = _device_array((outer, chunks), np.float64)
            grid = (chunks, min(MAX_GRID_Y, outer))
            _tree_rows[grid, THREADS](flat(x), outer, reduced, flat(partials), is_max)
            result = _reduce(partials, (1,), is_max)
        else:
            per = _run_length(outer * inner, reduced)
            chunks = -(-reduced // per)
            partials = _device_array(outer * chunks * inner,
                                     out_dtype if is_max else acc_dtype)
            if is_max:
                _launch(_max_middle, partials.size, flat(x), outer, reduced, inner, per,
                        partials)
            else:
                _launch(_sum_middle, partials.size, flat(x), outer, reduced, inner, per,
                        partials, acc_dtype(0))
            result = (partials if chunks == 1
                      else _reduce(partials.reshape((outer, chunks, inner)), (1,), is_max))
        x = reshape(_astype(result, out_dtype) if result.dtype != out_dtype else result, kept)
    return x


def reduce_sum(x, axes):
    return _reduce(x, axes, False)


def reduce_max(x, axes, where: Where = "", empty=None):
    if empty_axis(x.shape, axes, where, empty):
        return full(tuple(d for i, d in enumerate(x.shape) if i not in axes), empty, x.dtype)
    return _reduce(x, axes, True)


def cumsum(x, axis: int, reverse: bool):
    """np.cumsum(x, axis) in x's dtype; from the back where `reverse`.  A
    thread per lane, which scans its axis serially: enough lanes fill the
    grid; one long lane (a 1-d cumsum) runs on one thread."""
    outer, n, inner = index_views(tuple(x.shape), axis)
    out = _device_array(x.shape, x.dtype)
    if out.size:
        _launch(_scan_lanes, outer * inner, flat(x), outer, n, inner, reverse, flat(out))
    return out


# ------------------------------------------------- gathers and scatter-adds
# The kernels check every index as they go, skip one out of range and keep
# the least position of one (an atomic min); the driver reads that back (8
# bytes) and raises before the array filled is ever seen.  Scatter-adds use
# atomics.


def _checked(first_bad, idx, n: int, where: str, launched: bool) -> None:
    if not launched and idx.size:
        # nothing was read or written (an empty axis): the indices alone
        host = to_host(flat(idx))
        bad = np.flatnonzero((host < -n) | (host >= n))
        if bad.size:
            index_out_of_range(where, int(host[bad[0]]), n)
        return
    bad = int(to_host(first_bad)[0])
    if bad < idx.size:
        index_out_of_range(where, int(to_host(flat(idx)[bad:bad + 1])[0]), n)


@cuda.jit
def _check_indices(idx, n, first_bad):
    for t in range(cuda.grid(1), idx.size, cuda.gridsize(1)):
        j = idx[t]
        if j < -n or j >= n:
            cuda.atomic.min(first_bad, 0, t)


def check_index(idx, n: int, where: str) -> None:
    """Raise (`index_out_of_range`) for idx's first index outside [-n, n),
    in C order, as the gather or scatter-add of this index would: the
    check that one leaves where nothing reads its result (one launch, and
    8 bytes read back)."""
    if not is_device_array(idx):
        return common_check_index(np.asarray(idx), n, where)
    first_bad = full((1,), idx.size, np.int64)
    if idx.size:
        _launch(_check_indices, idx.size, flat(idx), n, first_bad)
    _checked(first_bad, idx, n, where, True)


def common_check_index(idx: np.ndarray, n: int, where: str) -> None:
    """`check_index` of a host index (a literal)."""
    bad = np.flatnonzero((idx < -n) | (idx >= n))
    if bad.size:
        index_out_of_range(where, int(np.ravel(idx)[bad[0]]), n)


def _gather_by(x, idx, axis: int, out_shape, along: bool, where: str):
    _, n, inner = index_views(tuple(x.shape), axis)
    size = math.prod(out_shape)
    out = _device_array(max(size, 1), x.dtype)
    first_bad = full((1,), idx.size, np.int64)
    if size:
        m = out_shape[axis] if along else idx.size
        _launch(_take, size, flat(x), flat(idx), out, n, m, inner, along, first_bad)
    _checked(first_bad, idx, n, where, size > 0)
    return out[:size].reshape(out_shape) if out_shape else out.reshape(())


def take(x, idx, axis: int, where: str):
    shape = tuple(x.shape)
    return _gather_by(x, idx, axis, shape[:axis] + tuple(idx.shape) + shape[axis + 1:], False,
                      where)


def take_along_axis(x, idx, axis: int, where: str):
    return _gather_by(x, idx, axis, tuple(idx.shape), True, where)


def _scatter_by(base, idx, values, axis: int, along: bool, where: str, owned: bool):
    out = base if owned else copy(base)
    outer, n, inner = index_views(tuple(base.shape), axis)
    first_bad = full((1,), idx.size, np.int64)
    if values.size:
        m = values.size // (outer * inner)
        _launch(_scatter_add, values.size, flat(out), flat(idx), flat(values), n, m, inner,
                along, first_bad)
    _checked(first_bad, idx, n, where, values.size > 0)
    return out


def scatter_add(base, idx, values, axis: int, where: str, owned: bool = False):
    """`owned`: the driver made base and reads it no more (added in place)."""
    return _scatter_by(base, idx, values, axis, False, where, owned)


def scatter_add_along_axis(base, idx, values, axis: int, where: str, owned: bool = False):
    return _scatter_by(base, idx, values, axis, True, where, owned)


# ------------------------------------------------------------------ target


class CudaTarget(Target):
    """`@cuda.jit` kernels with a grid-stride loop, launched on
    `blocks(n)` blocks of `THREADS` threads; arrays live on the device."""

    name = "cuda"
    header = ("import numpy as np\nfrom numba import cuda\n"
              "from gradlang.runtime.cuda import kernel_math as math\n"
              "select = math.select\n")
    exact_float_remainder = False  # NVPTX's frem: see runtime.cuda_math
    # A kernel's parameters hold at most 32764 bytes (sm_70 on, CUDA 12.1
    # on; NVVM refused 585 f64 arrays of 56 bytes each for sm_90), and
    # Numba passes a 1-d array in 56, a general read's stride table in 24
    # per axis: 128 arrays fit at up to 8 axes.  A gradient over 300 inputs
    # fused into one kernel of 601 arrays.
    max_kernel_arrays = 128

    @property
    def helpers(self) -> ModuleType:
        return sys.modules[__name__]

    def render_loop(self, kname: str, args: list[str], pre: list[str], body: list[str],
                    row: Sequence[str] = (), inner: Optional[str] = None) -> str:
        loop = ["for i in range(cuda.grid(1), n, cuda.gridsize(1)):"]
        if inner is not None:  # one thread per element: its row, then it
            loop += [f"    j = i % {inner}", "    i0 = i - j"]
            loop += ["    " + line for line in row]
        loop += ["    " + line for line in body]
        if SIMULATOR:
            # The simulator runs the body on NumPy scalars, which warn where
            # the GPU is silent: an integer +, - or * computes in unsigned
            # 64-bit (`ops._wrapping`), whose wraparound NumPy calls an
            # overflow (`2 - 3`); as `_SimulatorMath` and a driver's
            # scalars do, NumPy's warnings are silenced (per thread)
            loop = ["with np.errstate(all='ignore'):"] + ["    " + line for line in loop]
        lines = ["@cuda.jit", f"def {kname}({', '.join(['n'] + args)}):"]
        lines += ["    " + line for line in pre + loop]
        return "\n".join(lines) + "\n"

    def launch(self, kname: str, size: str, known: Optional[int], args: list[str],
               cost: int) -> str:
        return f"K.{kname}[R.blocks({size}), R.THREADS]({', '.join([size] + args)})"

    def compiled_ir(self, kernels: ModuleType, kname: str, signature: str) -> str:
        if SIMULATOR:
            raise TargetError("the CUDA simulator compiles nothing: the LLVM IR of CUDA "
                              "kernels needs a GPU")
        return getattr(kernels, kname).compile(signature).inspect_llvm()

    def require(self) -> None:
        require()

    def is_array(self, value: Any) -> bool:
        return is_device_array(value)

    def accept(self, value: Any, what: str) -> Any:
        if not is_device_array(value) and not hasattr(value, "__cuda_array_interface__"):
            value = np.asarray(value)  # (a host array: copied over, refused if too large)
            if value.nbytes > _limit():  # (`what` names the call already)
                common.too_large(value.shape, value.dtype, f"{what}, copied to the device,",
                                 _limit(), memory(), names_call=True)
        array = as_device(value)
        if not array.is_c_contiguous():
            # taken without a copy, and the drivers hold C-contiguous arrays
            # only: a scatter-add into a Fortran-ordered one failed inside
            # Numba, and a reshape of one cannot be a view on a GPU
            raise ArgumentError(f"{what} is a device array that is not C-contiguous; device "
                                "arrays are taken as they are, without a copy: pass a "
                                "contiguous one (cupy.ascontiguousarray(a), t.contiguous())")
        return array

    def to_host(self, array: Any) -> np.ndarray:
        return to_host(array)

    def full(self, shape: tuple, value, dtype) -> Any:
        return full(shape, value, dtype)


TARGET = CudaTarget()
