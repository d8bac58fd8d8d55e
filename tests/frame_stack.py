"""CPython's frame stack kept in the test processes, not handed back to the
kernel and taken again at every crossing of a chunk's edge.

Contract: `keep_frame_chunks()`, once per process (later calls do
nothing), on CPython 3.11 or later on 64-bit Linux on x86-64 or aarch64
(elsewhere it does nothing):
the memory CPython asks its arena allocator for comes from `mmap` and
goes back by `munmap`, as with CPython's own allocator, except that a
16 KiB block given back (a chunk of a thread's frame stack) is kept, up
to 256 of them (4 MiB), and handed out again for the next 16 KiB asked.
The allocator takes a spin lock around its cache, so that interpreters
or threads calling it at once (without one GIL) cannot race on it.

Why: from 3.11, CPython puts the frames of Python calls on a stack of
16 KiB chunks, which it maps with `mmap` when a call crosses a chunk's
end and unmaps as soon as that call returns.  Under pytest, xdist and
Hypothesis the tests call the compiler (and Numba's, hundreds of calls
deep) from a depth near such an edge: test_stdlib.py alone mapped and
unmapped a chunk 1.3 million times, a page fault or two each, 9.4 of its
39 s (the sys time); with the chunks kept, 0.3 of 27 s.  A whole cold run
took 240 s instead of 260-280.  What runs is unchanged: only where the
interpreter's frames live.
"""
from __future__ import annotations

import ctypes
import platform
import sys

from llvmlite import binding as llvm
from llvmlite import ir

CHUNK = 16 * 1024  # CPython's DATA_STACK_CHUNK_SIZE (Python/pystate.c)
KEPT = 256
# Linux's mmap flags on x86-64 and aarch64 (not on every architecture:
# MIPS's MAP_ANONYMOUS differs), and off_t, size_t as i64 there
PROT_READ_WRITE, MAP_PRIVATE_ANONYMOUS = 0x1 | 0x2, 0x02 | 0x20


class _ArenaAllocator(ctypes.Structure):
    """PyObjectArenaAllocator (Include/cpython/objimpl.h)."""
    _fields_ = [("ctx", ctypes.c_void_p), ("alloc", ctypes.c_void_p),
                ("free", ctypes.c_void_p)]


_installed: list = []  # the engine and the struct, alive as long as the process


def applies() -> bool:
    """Whether this process is one `keep_frame_chunks` installs in."""
    return (sys.implementation.name == "cpython" and sys.platform == "linux"
            and sys.version_info >= (3, 11) and platform.machine() in ("x86_64", "aarch64")
            and ctypes.sizeof(ctypes.c_void_p) == 8)


def keep_frame_chunks() -> None:
    if _installed or not applies():
        return
    engine, alloc, free = compiled_allocator()
    allocator = _ArenaAllocator(None, alloc, free)
    ctypes.pythonapi.PyObject_SetArenaAllocator(ctypes.byref(allocator))
    _installed.extend([engine, allocator])


def compiled_allocator():
    """A new copy of the allocator, with a cache of its own: the engine
    holding it (keep it alive), and the addresses of chunk_alloc and
    chunk_free."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = llvm.parse_assembly(str(_allocator_module()))
    module.verify()
    machine = llvm.Target.from_default_triple().create_target_machine()
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    return (engine, engine.get_function_address("chunk_alloc"),
            engine.get_function_address("chunk_free"))


def _allocator_module() -> ir.Module:
    """chunk_alloc(ctx, size) and chunk_free(ctx, pointer, size): mmap and
    munmap, through a locked cache of KEPT blocks of CHUNK bytes."""
    return _AllocatorModule().module


class _AllocatorModule:
    """The allocator's LLVM module, built function by function."""

    i32, i64 = ir.IntType(32), ir.IntType(64)
    pointer = ir.IntType(8).as_pointer()

    def __init__(self) -> None:
        i32, i64, pointer = self.i32, self.i64, self.pointer
        self.module = ir.Module("frame_chunks")
        self.module.triple = llvm.get_default_triple()
        self.mmap = ir.Function(self.module, ir.FunctionType(
            pointer, [pointer, i64, i32, i32, i32, i64]), "mmap")
        self.munmap = ir.Function(self.module, ir.FunctionType(i32, [pointer, i64]), "munmap")
        self.cache = self._variable("cache", ir.ArrayType(pointer, KEPT))
        self.count, self.lock = self._variable("count", i64), self._variable("lock", i32)
        self._alloc()
        self._free()

    def _variable(self, name: str, typ) -> ir.GlobalVariable:
        g = ir.GlobalVariable(self.module, typ, name)
        g.linkage, g.initializer = "internal", ir.Constant(typ, None)
        return g

    def _by_size(self, name: str, result, args):
        """A function of `args` (its last the size) whose entry branches to
        a block for CHUNK bytes or one for any other size: the function,
        a builder at the first, the second."""
        function = ir.Function(self.module, ir.FunctionType(result, args), name)
        b = ir.IRBuilder(function.append_basic_block("entry"))
        chunk, other = function.append_basic_block("chunk"), function.append_basic_block("other")
        b.cbranch(b.icmp_unsigned("==", function.args[-1], ir.Constant(self.i64, CHUNK)),
                  chunk, other)
        b.position_at_end(chunk)
        return function, b, other

    def _locked(self, b: ir.IRBuilder, body) -> ir.Value:
        """body(b) with the lock held (a spin on an exchange); its value."""
        spin, held = b.append_basic_block("spin"), b.append_basic_block("held")
        b.branch(spin)
        b.position_at_end(spin)
        was = b.atomic_rmw("xchg", self.lock, ir.Constant(self.i32, 1), "acquire")
        b.cbranch(b.icmp_unsigned("!=", was, ir.Constant(self.i32, 0)), spin, held)
        b.position_at_end(held)
        value = body(b)
        b.store_atomic(ir.Constant(self.i32, 0), self.lock, "release", 4)
        return value

    def _slot(self, b: ir.IRBuilder, index: ir.Value) -> ir.Value:
        return b.gep(self.cache, [ir.Constant(self.i64, 0), index])

    def _alloc(self) -> None:
        """chunk_alloc: the last block kept, if it is a chunk that is asked
        for and one is kept; else a new mapping (null where mmap fails)."""
        i64, null = self.i64, ir.Constant(self.pointer, None)
        function, b, mapping = self._by_size("chunk_alloc", self.pointer,
                                             [self.pointer, i64])

        def take(b: ir.IRBuilder) -> ir.Value:
            n = b.load(self.count)
            some = b.icmp_unsigned("!=", n, ir.Constant(i64, 0))
            last = b.select(some, b.sub(n, ir.Constant(i64, 1)), n)
            b.store(last, self.count)
            return b.select(some, b.load(self._slot(b, last)), null)
        kept = self._locked(b, take)
        reuse = function.append_basic_block("reuse")
        b.cbranch(b.icmp_unsigned("!=", kept, null), reuse, mapping)
        b.position_at_end(reuse)
        b.ret(kept)
        b.position_at_end(mapping)
        mapped = b.call(self.mmap, [null, function.args[1],
                                    ir.Constant(self.i32, PROT_READ_WRITE),
                                    ir.Constant(self.i32, MAP_PRIVATE_ANONYMOUS),
                                    ir.Constant(self.i32, -1), ir.Constant(i64, 0)])
        failed = b.icmp_unsigned("==", b.ptrtoint(mapped, i64), ir.Constant(i64, 2**64 - 1))
        b.ret(b.select(failed, null, mapped))

    def _free(self) -> None:
        """chunk_free: a chunk kept while there is room, else unmapped."""
        i64 = self.i64
        function, b, unmapping = self._by_size("chunk_free", ir.VoidType(),
                                               [self.pointer, self.pointer, i64])
        _, block, size = function.args

        def put(b: ir.IRBuilder) -> ir.Value:
            n = b.load(self.count)
            room = b.icmp_unsigned("<", n, ir.Constant(i64, KEPT))
            with b.if_then(room):
                b.store(block, self._slot(b, n))
                b.store(b.add(n, ir.Constant(i64, 1)), self.count)
            return room
        stored = self._locked(b, put)
        done = function.append_basic_block("done")
        b.cbranch(stored, done, unmapping)
        b.position_at_end(unmapping)
        b.call(self.munmap, [block, size])
        b.branch(done)
        b.position_at_end(done)
        b.ret_void()
