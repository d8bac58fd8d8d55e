"""XLA FFI targets that run a `dsl.to_jax` call's kernels under `jit` on
the CPU with no Python at all.

Contract: `ffi_target(program, arguments, traced, results)` returns a
`Plan`: the name of an XLA FFI target (typed FFI, `jax.ffi.ffi_call`)
whose handler, a Numba `cfunc`, launches the program's kernels on XLA's
buffers, and the operands the operation passes it besides its inputs
(the values of the arguments named `traced`, in that order): the call's
constants its kernels read, as bytes (XLA keeps them with the
executable, so nothing here must outlive it; at most `CONSTANT_BYTES`),
and the sizes the handler passes (the bytes of int64s).  Its results are
the program's, all of them, in order.  The handler's code names no size
and no address, so one handler serves every size of a program; it is a
module of the kernel cache, importing the kernels from theirs, and its
machine code is kept there as theirs is (compiling it costs what a small
kernel does, 0.05-0.2 s; loading it, about a millisecond).  None where a
kernel is no Numba dispatcher of a module of the kernel cache (kernels
are Python functions under NUMBA_DISABLE_JIT), or where the program is
not a straight sequence of serial kernel launches on those buffers,
temporaries and the call's constants (anything its
driver does besides allocating temporaries, taking views and launching
kernels: a matmul, a reduction or layout op of the driver's own, a
gather that checks its indices, a result copied or cast, a parallel
kernel, which the driver picks from the machine's load at each call,
pooled memory), which then keeps the Python callback.  The plan is found
once per call, by running the driver for C-contiguous arguments
(`Program.run_contiguous`'s source) on stand-ins that record what it
does: under `jit` the shapes are static.  Kernels raise nothing (only the
helpers that check indices do, and those are no kernels), so a handler
returns no error.  A handler holds nothing between calls (its
temporaries are its own), so XLA may run it on several threads at once.

A handler answers XLA's query of its metadata with the FFI version of
the installed jaxlib's `include/xla/ffi/api/c_api.h`, and reads buffers
at the offsets of that header's structs on a 64-bit host, which hold for
its major version 0 (a minor version adds fields at the ends of structs;
under another major version no handler is made): `XLA_FFI_CallFrame`
(`extension_start` at byte 8, `stage` at 32, `args.args` at 72,
`rets.rets` at 112) and `XLA_FFI_Buffer` (`data` at 24).  It saves the
two crossings into Python of each call of a fwd+bwd (log1pexp at n = 16
under `jit`: 0.035 ms -> 0.009 ms, JAX's own jitted version 0.008 ms;
`benchmarks/run.py --only interop`).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import itertools
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np
from numba import carray, types
from numba.core import cgutils, sigutils
from numba.core.ccallback import CFunc
from numba.core.registry import CPUDispatcher
from numba.extending import intrinsic

from gradlang.compiler.pipeline import Program
from gradlang.runtime.common import HOST_MEMORY
from gradlang.runtime.forking import ChildSafeLock
from gradlang.runtime.interrupts import interrupts_deferred
from gradlang.runtime.loader import (jit_in_kernel_cache, load_kernels, make_driver,
                                      manage_dispatcher)

# the call's constants an operation passes its handler, at most (XLA holds
# them in the executable: a larger one keeps the callback, which reads it)
CONSTANT_BYTES = 1 << 16
_HANDLERS: dict[tuple, tuple[str, Any]] = {}  # (source, kernels) -> (target name, cfunc)
_REGISTERING = ChildSafeLock()
_NAMES = itertools.count()  # (a name XLA knows is never registered again)


class Plan(NamedTuple):
    """What a call's operation under `jit` passes to its FFI target:
    `constants` (the call's arrays its kernels read, as bytes), then the
    handler's `numbers` (sizes, as the bytes of int64s), after the traced
    inputs."""
    target: str
    constants: tuple[np.ndarray, ...]
    numbers: np.ndarray


def ffi_target(program: Program, arguments: dict[str, Any], traced: Sequence[str],
               results: Sequence[tuple[tuple, np.dtype]]) -> Optional[Plan]:
    """The `Plan` running `program` on `arguments` (the call's bound
    values: stand-ins for the names `traced`, the operation's inputs),
    whose outputs are `results` (shape, dtype): see the module's
    contract.  None where the program is no straight sequence of kernels."""
    found = None if _api_version() is None else _plan(program, arguments, traced, results)
    if found is None:
        return None
    source, kernels, constants, numbers = found
    with _REGISTERING:  # (one handler per source and kernels, whatever the sizes)
        known = _HANDLERS.get((source, kernels))
        if known is None:
            handler = _compiled(source, kernels)
            if handler is None:
                return None
            import jax
            name = f"gradlang_call_{next(_NAMES)}"
            jax.ffi.register_ffi_target(
                name, jax.ffi.pycapsule(ctypes.cast(handler.address, ctypes.CFUNCTYPE(None))),
                platform="cpu")
            known = _HANDLERS[source, kernels] = (name, handler)
    return Plan(known[0], tuple(c.reshape(-1).view(np.uint8) for c in constants),
                np.asarray(numbers, np.int64).view(np.uint8))


def _compiled(source: str, kernels: tuple) -> Optional[CFunc]:
    """The handler `source` launching `kernels` (`kernel0`, ...), compiled
    as a module of the kernel cache importing them from theirs, its
    machine code cached there (under the loader's policy); None where a
    kernel is of no module of the kernel cache, or is no Numba dispatcher
    (under NUMBA_DISABLE_JIT, a Python function, which no handler calls)."""
    if not all(isinstance(kernel, CPUDispatcher) for kernel in kernels):
        return None
    homes = [(kernel.py_func.__module__, kernel.py_func.__name__) for kernel in kernels]
    if not all(module.startswith("gradk_") and module in sys.modules for module, _ in homes):
        return None
    imports = "".join(f"from {module} import {name} as kernel{k}\n"
                      for k, (module, name) in enumerate(homes))
    module = load_kernels(f"{_HANDLER_HEADER}{imports}\n\n{source}")
    handler = CFunc(module.handler, _SIGNATURE, locals={}, options={"nopython": True})
    handler.enable_caching()
    manage_dispatcher(handler)
    with interrupts_deferred():  # as a kernel's compile (loader._compile_lean): Ctrl-C waits
        handler.compile()
    return handler


_SIGNATURE = sigutils.normalize_signature(types.intp(types.intp))  # (XLA_FFI_CallFrame*)
# (with this module's hash: a handler's cached machine code holds its helpers')
_HANDLER_HEADER = ('"""An XLA FFI handler generated by gradlang (dsl.jax_ffi)."""\n'
                   "import numpy as np\nfrom numba import carray\n"
                   "from dsl.jax_ffi import answered_metadata, argument, pointer, result"
                   f"  # {hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]}\n")


class _Unplanned(Exception):
    """The driver did something a handler does not do."""


class _Helpers:
    """The driver's `R` while planning: temporaries (`empty`) and views
    of contiguous arrays (`flat`, `reshape`) alone; anything else is
    `_Unplanned`."""

    # the driver's size checks pass as the CPU's would (one that fails, at
    # `too_large`, is `_Unplanned`: the callback then raises its error)
    ALLOCATABLE = HOST_MEMORY

    def __init__(self) -> None:
        self.temporaries: list[np.ndarray] = []

    def empty(self, shape, dtype) -> np.ndarray:
        array = np.empty(shape, dtype)
        self.temporaries.append(array)
        return array

    @staticmethod
    def flat(x: np.ndarray) -> np.ndarray:
        if not x.flags.c_contiguous:
            raise _Unplanned("flat of a strided array")
        return x.reshape(-1)

    @staticmethod
    def reshape(x: np.ndarray, shape: tuple) -> np.ndarray:
        if not x.flags.c_contiguous:
            raise _Unplanned("reshape of a strided array")
        return x.reshape(shape)  # (a view: its kernels' launches read it by its memory)

    def __getattr__(self, name: str):
        raise _Unplanned(name)


class _Kernels:
    """The driver's `K` while planning: each launch recorded, none run."""

    def __init__(self, kernels: Any) -> None:
        self.kernels, self.launches = kernels, []

    def __getattr__(self, name: str):
        kernel = getattr(self.kernels, name)
        return lambda *args: self.launches.append((kernel, args))


def _plan(program: Program, arguments: dict[str, Any], traced: Sequence[str],
          results: Sequence[tuple[tuple, np.dtype]]) -> Optional[tuple]:
    """(the handler's source, the kernels it launches (`kernel0`, ...), the
    call's constants it reads, its numbers), or None."""
    if program.kernels is None or len(results) != len(program.out_types):
        return None
    stand_ins = {n: np.zeros(arguments[n].shape, arguments[n].dtype) for n in traced}
    values = [stand_ins.get(n, a) for n, a in arguments.items()]
    if not all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in values):
        return None
    outs = tuple(np.empty(shape, dtype) for shape, dtype in results)
    helpers, kernels = _Helpers(), _Kernels(program.kernels)
    try:
        run = make_driver(program.generated.contiguous_driver_source, kernels, helpers)
        made = run(*values, out=outs)
    except _Unplanned:
        return None
    if len(made) != len(outs) or any(m is not o for m, o in zip(made, outs)) or \
            not kernels.launches:
        return None
    # every array a kernel takes, by the memory it starts at: an input, a
    # result, a temporary or a constant of the call, whole
    sources: dict[int, tuple[str, np.ndarray]] = {}  # address -> (how to reach it, it)
    for k, n in enumerate(traced):
        sources.setdefault(_address(stand_ins[n]), (f"argument(frame, {k})", stand_ins[n]))
    for j, o in enumerate(outs):
        sources[_address(o)] = (f"result(frame, {j})", o)
    for t in helpers.temporaries:
        sources[_address(t)] = ("temporary", t)
    for a in arguments.values():
        if isinstance(a, np.ndarray) and a.size:
            sources.setdefault(_address(a), ("constant", a))
    numbers: list[int] = []  # the sizes, read from an operand: one handler serves all

    def number(value: int) -> str:
        numbers.append(value)
        return f"p[{len(numbers) - 1}]"
    named: dict[int, str] = {}
    constants: list[np.ndarray] = []
    lines, launches = [], []
    for k, (kernel, args) in enumerate(kernels.launches):
        spelled = []
        for a in args:
            if type(a) is int or isinstance(a, np.integer):
                spelled.append(number(int(a)))
                continue
            if not isinstance(a, np.ndarray) or a.ndim != 1 or not a.flags.c_contiguous or \
                    a.size == 0 or _address(a) not in sources:
                return None
            where, whole = sources[_address(a)]
            if whole.size != a.size or whole.dtype != a.dtype:
                return None  # part of an array, or another dtype's view of it
            if _address(a) not in named:
                var = named[_address(a)] = f"a{len(named)}"
                shape, dtype = f"({number(a.size)},)", f"np.{a.dtype.name}"
                if where == "temporary":
                    lines.append(f"    {var} = np.empty({shape}, {dtype})")
                else:
                    if where == "constant":  # an operand after the traced ones
                        constants.append(whole)
                        where = f"argument(frame, {len(traced) + len(constants) - 1})"
                    lines.append(f"    {var} = carray(pointer({where}), {shape}, {dtype})")
            spelled.append(named[_address(a)])
        launches.append(f"    kernel{k}({', '.join(spelled)})")
    if sum(c.nbytes for c in constants) > CONSTANT_BYTES:
        return None
    head = ["def handler(frame):",
            f"    if answered_metadata(frame, {_api_version()[1]}):", "        return 0",
            f"    p = carray(pointer(argument(frame, {len(traced) + len(constants)})), "
            f"({len(numbers)},), np.int64)"]
    source = "\n".join(head + lines + launches + ["    return 0", ""])
    return source, tuple(kernel for kernel, _ in kernels.launches), constants, numbers


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


@intrinsic
def pointer(typingctx, address):
    """The address (an integer) as a pointer, for `carray`."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)
    return types.voidptr(types.intp), codegen


@functools.cache
def _api_version() -> Optional[tuple[int, int]]:
    """The FFI version (major, minor) of the installed jaxlib's c_api.h,
    which a handler reports as its own; None unless its major version is 0,
    the layout the handlers read (a minor version only adds fields at the
    ends of structs), or where this JAX has no `jax.ffi` to register one
    and call it (before 0.4.38: the callback serves)."""
    import jax
    import jaxlib
    ffi = getattr(jax, "ffi", None)
    if not all(hasattr(ffi, name) for name in ("register_ffi_target", "ffi_call", "pycapsule")):
        return None
    header = Path(jaxlib.__file__).parent / "include/xla/ffi/api/c_api.h"
    try:
        text = header.read_text()
    except OSError:
        return None
    found = [re.search(rf"#define XLA_FFI_API_{part} (\d+)", text) for part in ("MAJOR", "MINOR")]
    if None in found or int(found[0].group(1)) != 0:
        return None
    return 0, int(found[1].group(1))


# c_api.h's layout, in 8-byte words and bytes (see the module's contract)
_EXTENSION_METADATA = 1  # XLA_FFI_Extension_Metadata
_API_VERSION_SIZE = 28  # XLA_FFI_Api_Version_STRUCT_SIZE
_STAGE_EXECUTE = 3  # XLA_FFI_ExecutionStage_EXECUTE


@jit_in_kernel_cache()
def answered_metadata(frame: int, minor_version: int) -> bool:
    """Whether the call is other than one to execute: XLA's query of the
    handler's metadata (a `XLA_FFI_Metadata_Extension` first among the
    frame's extensions), answered with the FFI version (0.`minor_version`)
    and no traits, or
    a stage before execution (none is registered), which has nothing to do."""
    words = carray(pointer(frame), (5,), np.int64)
    if words[1] != 0:
        base = carray(pointer(words[1]), (4,), np.int64)
        if (base[1] & 0xffffffff) == _EXTENSION_METADATA:
            metadata = carray(pointer(base[3]), (4,), np.int64)
            metadata[1] = _API_VERSION_SIZE  # api_version: struct_size,
            metadata[2] = 0  # extension_start,
            metadata[3] = minor_version << 32  # major (0), minor (int32s)
            carray(pointer(base[3] + 32), (1,), np.uint32)[0] = 0  # traits
            return True
    return (words[4] & 0xffffffff) != _STAGE_EXECUTE


@jit_in_kernel_cache()
def argument(frame: int, index: int) -> int:
    """The address of the data of the frame's input buffer `index`."""
    buffers = carray(pointer(frame), (15,), np.int64)[9]  # args.args
    buffer = carray(pointer(buffers), (index + 1,), np.int64)[index]
    return carray(pointer(buffer), (4,), np.int64)[3]  # XLA_FFI_Buffer.data


@jit_in_kernel_cache()
def result(frame: int, index: int) -> int:
    """The address of the data of the frame's result buffer `index`."""
    buffers = carray(pointer(frame), (15,), np.int64)[14]  # rets.rets
    buffer = carray(pointer(buffers), (index + 1,), np.int64)[index]
    return carray(pointer(buffer), (4,), np.int64)[3]
