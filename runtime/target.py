"""Targets: everything that differs between the places kernels run.

Contract: `get(name)` returns the `Target` registered under `name`,
importing its module on first use (so the CPU never imports numba-cuda),
and raises `TargetError` for an unknown name or a target that cannot run
here (`Target.require`).  A `Target` is at once:

- the helper module generated drivers call as `R` (`helpers`): memory,
  layout, reductions, matmul, size checks (`ALLOCATABLE`, the most bytes
  an array may have there, and `too_large`, which refuses one);
- the loop wrapper codegen renders kernels with (`header`, `render_loop`,
  `launch`, and, where a loop may end in a sum, `render_reducing_loop` and
  `launch_reducing`), and what a kernel compiles to (`compiled_ir`, for
  `gradc show --emit llvm`);
- the boundary with the host: `accept` (an argument as the target's array,
  or an `ArgumentError`), `to_host`, `full`, `is_array`.

`TARGETS` is the one table of target names; the code of each target lives
in its own module, and nothing else tests a target's name.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from gradlang.runtime.errors import GradError, shown

if TYPE_CHECKING:  # (common imports args, which imports this)
    from gradlang.runtime.common import Where


def smallest(a: str, b: str) -> str:
    """Generated code for the lesser of two integer expressions (each may
    be evaluated twice: pure and cheap ones, such as names, constants and
    their sums): a select, where Numba's `min` is an overload that compiles
    once per process and signature (20-40 ms).  Two only: nesting it would
    repeat its operands, doubling the code with each level (the least of
    many is a statement per operand, `least = smallest("least", e)`)."""
    return f"({a} if {a} < {b} else {b})"


def largest(a: str, b: str) -> str:
    """As `smallest`, the greater."""
    return f"({a} if {a} > {b} else {b})"


# name -> the module that defines `TARGET` for it
TARGETS = {"cpu": "gradlang.runtime.cpu", "cuda": "gradlang.runtime.cuda"}
DEFAULT = "cpu"


class TargetError(GradError, ValueError):
    """An unknown target, or one that cannot run on this machine."""


class Target:
    """The interface; `runtime.cpu.TARGET` and `runtime.cuda.TARGET` fill it."""

    name: str
    helpers: ModuleType
    header: str  # imports at the top of a kernel module
    fuses_reductions = False  # whether a loop may end in a sum (render_reducing_loop)
    # The most values a fused loop may read and make (its kernel's array
    # arguments, `compiler.fusion`): None for any number.
    max_kernel_arrays: Optional[int] = None
    # Kernel source converting a flat index to an unsigned integer type,
    # which its compiler indexes without a negative index's wraparound
    # (`codegen.render_kernel` reads rows with it), or None: rows read
    # through views starting at each row.
    unsigned_index: Optional[str] = None
    # Elements per iteration of a kernel that runs a whole loop (trips in
    # sequence): more than 1 runs each trip over a block of elements, an
    # inner loop the compiler vectorizes (launched by `launch_blocks`).
    loop_block = 1
    # Whether a driver may compute a loop of one element of exact arithmetic
    # (`compiler.ops.Op.exact`: a mean's division) itself, on NumPy scalars
    # read from its arrays, rather than launch a kernel (which would cost a
    # compile): only where the arrays are in host memory.
    scalars_in_driver = False
    # Whether a driver's slice and transpose are views of their input (the
    # size checks then count no array for them): a device target gathers
    # their elements into an array of its own.
    slices_are_views = False
    # Whether a call writes results into the caller's buffers (`out=`): only
    # where they are NumPy arrays; a device target allocates its own.
    takes_out_buffers = False
    # Whether its kernels' compiler lowers a float remainder (LLVM's frem,
    # under x % y and x // y) exactly, as fmod: else the op table's
    # `fmod_template`s call its kernel math's floor_quotient and
    # floor_remainder (NVPTX expands frem as x - trunc(x / y) * y).
    exact_float_remainder = True
    # Whether a loop the driver runs trip by trip also gets a compiled form
    # (`codegen.compiled_loop`, by `render_function`) for when it is hot.
    compiles_loops = False

    # -- codegen: kernels and how a driver launches them
    def render_function(self, name: str, args: list[str], lines: list[str]) -> str:
        """A compiled function `name(*args)` running `lines` once (a loop
        the driver would run trip by trip: `codegen`), which may call the
        kernels of its module by name, serially (`kname_serial`); for a
        target that `compiles_loops`."""
        raise NotImplementedError

    def reduce_in_function(self, kname: str, size: str, rows: str, args: list[str],
                           cost: int) -> list[str]:
        """Lines of a `render_function` function running `launch_reducing`'s
        kernel with the same bits, serially."""
        raise NotImplementedError

    def sum_in_function(self, x: str, out: str, outer: str, reduced: str, inner: str,
                        give_up: str) -> list[str]:
        """Lines of a `render_function` function summing flat `x`, of
        (outer, reduced, inner) elements, over its middle axis into `out`
        with the bits of the driver's `reduce_sum`, or running `give_up`
        where it cannot."""
        raise NotImplementedError

    def render_loop(self, kname: str, args: list[str], pre: list[str], body: list[str],
                    row: Sequence[str] = (), inner: Optional[str] = None) -> str:
        """Kernel `kname(n, *args)`: `pre` once, then `body` for each
        element i < n.  With `inner` (a name `pre` defines, dividing n),
        the elements run in rows of `inner`: `row` once per row, whose
        first element is i0, then `body` for each i = i0 + j, j < inner
        (how it reads broadcast inputs without dividing per element)."""
        raise NotImplementedError

    def allocate(self, length: str, known: Optional[int], dtype: str, itemsize: int) -> str:
        """A driver expression for a fresh 1-d array of `length` elements
        of `dtype` (its NumPy spelling; `known`: the length when fixed at
        compile time) that a kernel will fill."""
        return f"R.empty({length}, {dtype})"

    def launch(self, kname: str, size: str, known: Optional[int], args: list[str],
               cost: int) -> str:
        """A driver line running kernel `kname` over `size` elements
        (`known`: the size when fixed at compile time).  `cost`: the loop's
        work per element (`compiler.ops.loop_cost` of its ops: a loop of
        arithmetic is 1, one calling exp 17), for a target that picks
        between kernel variants by the total work (the CPU's serial and
        parallel ones)."""
        raise NotImplementedError

    def launch_blocks(self, kname: str, size: str, blocks: str, args: list[str],
                      cost: int) -> str:
        """As `launch`, for a kernel whose iterations are `blocks` blocks of
        `loop_block` of the `size` elements."""
        raise NotImplementedError

    def render_reducing_loop(self, kname: str, args: list[str], pre: list[str],
                             body: list[str], summands: Sequence[str],
                             reduced: Sequence[str], row: Sequence[str] = (),
                             inner: Optional[str] = None) -> str:
        """As `render_loop`, for `kname(n, rows, *args)`, summing each of
        `summands` over each of `rows` runs of n // rows elements into
        `reduced[k][run]` (one pass for all).
        `inner`, when given, also divides n // rows; with `row` and no
        `inner`, a row may be any run of elements."""
        raise NotImplementedError

    def render_row_loop(self, kname: str, args: list[str], pre: list[str],
                        body: list[str], per_thread: list[str]) -> str:
        """Kernel `kname(n, rows, *args)`: `length = n // rows` (0 for no
        rows), `pre` once (which defines `blocks`), then `body` for each
        blk < blocks (a row loop, `compiler.rows`: a block of rows), each
        thread running `per_thread` (its scratch) before its first; launched
        by `launch(kname, n, known, [rows] + args, cost)`.  Only a target
        that `fuses_reductions` has row loops."""
        raise NotImplementedError

    def launch_reducing(self, kname: str, size: str, rows: str, args: list[str],
                        cost: int) -> str:
        """As `launch`, for a loop of `render_reducing_loop` summing `size`
        elements into `rows` rows (`cost` as for `launch`)."""
        raise NotImplementedError

    def reducing_checks(self, size: str, rows: str, where: Where) -> list[str]:
        """Driver lines refusing, before `launch_reducing(..., size, rows,
        ...)` runs, the scratch its kernel would make that cannot be made
        (`where`: the sum it computes); none if it makes none."""
        return []

    def compiled_ir(self, kernels: ModuleType, kname: str, signature: str) -> str:
        """What kernel `kname` of a loaded kernel module compiles to for
        `signature` (argument types in Numba's notation), compiled now:
        never read from a cache, which keeps machine code only."""
        raise NotImplementedError

    def require(self) -> None:
        """Raise `TargetError` unless this target's kernels can run here."""

    # -- the host boundary
    def is_array(self, value: Any) -> bool:
        """Whether `value` already lives where this target's kernels run."""
        raise NotImplementedError

    def accept(self, value: Any, what: str) -> Any:
        """`value` (a bound, validated argument) as this target's array."""
        raise NotImplementedError

    def to_host(self, array: Any) -> np.ndarray:
        raise NotImplementedError

    def full(self, shape: tuple, value, dtype) -> Any:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<target {self.name}>"


def is_device_array(value: Any) -> bool:
    """An array in a device's memory: Numba's device arrays and anything
    exposing the CUDA array interface (CuPy, PyTorch CUDA tensors)."""
    return (hasattr(value, "__cuda_array_interface__")
            or type(value).__module__.startswith("numba.cuda"))


def get(name: "str | Target") -> Target:
    """The target called `name` (a `Target` is returned as it is)."""
    if isinstance(name, Target):
        return name
    if not isinstance(name, str) or name not in TARGETS:
        raise TargetError(f"unknown target {shown(name)}; the targets are "
                          f"{', '.join(map(repr, TARGETS))}")
    target = importlib.import_module(TARGETS[name]).TARGET
    target.require()  # asked on every use: what is installed can change
    return target
