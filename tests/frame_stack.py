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
    i32, i64, byte = ir.IntType(32), ir.IntType(64), ir.IntType(8)
    pointer = byte.as_pointer()
    module = ir.Module("frame_chunks")
    module.triple = llvm.get_default_triple()
    mmap = ir.Function(module, ir.FunctionType(pointer, [pointer, i64, i32, i32, i32, i64]),
                       "mmap")
    munmap = ir.Function(module, ir.FunctionType(i32, [pointer, i64]), "munmap")

    def variable(name: str, typ) -> ir.GlobalVariable:
        g = ir.GlobalVariable(module, typ, name)
        g.linkage, g.initializer = "internal", ir.Constant(typ, None)
        return g
    cache = variable("cache", ir.ArrayType(pointer, KEPT))
    count, lock = variable("count", i64), variable("lock", i32)

    def locked(b: ir.IRBuilder, body) -> ir.Value:
        """body(b) with the lock held (a spin on an exchange); its value."""
        spin = b.append_basic_block("spin")
        held = b.append_basic_block("held")
        b.branch(spin)
        b.position_at_end(spin)
        was = b.atomic_rmw("xchg", lock, ir.Constant(i32, 1), "acquire")
        b.cbranch(b.icmp_unsigned("!=", was, ir.Constant(i32, 0)), spin, held)
        b.position_at_end(held)
        value = body(b)
        b.store_atomic(ir.Constant(i32, 0), lock, "release", 4)
        return value

    alloc = ir.Function(module, ir.FunctionType(pointer, [pointer, i64]), "chunk_alloc")
    _, size = alloc.args
    b = ir.IRBuilder(alloc.append_basic_block("entry"))
    from_cache, from_kernel = alloc.append_basic_block("cache"), alloc.append_basic_block("map")
    b.cbranch(b.icmp_unsigned("==", size, ir.Constant(i64, CHUNK)), from_cache, from_kernel)
    b.position_at_end(from_cache)

    def take(b: ir.IRBuilder) -> ir.Value:
        n = b.load(count)
        some = b.icmp_unsigned("!=", n, ir.Constant(i64, 0))
        last = b.select(some, b.sub(n, ir.Constant(i64, 1)), n)
        b.store(last, count)
        kept = b.load(b.gep(cache, [ir.Constant(i64, 0), last]))
        return b.select(some, kept, ir.Constant(pointer, None))
    kept = locked(b, take)
    reuse = alloc.append_basic_block("reuse")
    b.cbranch(b.icmp_unsigned("!=", kept, ir.Constant(pointer, None)), reuse, from_kernel)
    b.position_at_end(reuse)
    b.ret(kept)
    b.position_at_end(from_kernel)
    mapped = b.call(mmap, [ir.Constant(pointer, None), size, ir.Constant(i32, PROT_READ_WRITE),
                           ir.Constant(i32, MAP_PRIVATE_ANONYMOUS), ir.Constant(i32, -1),
                           ir.Constant(i64, 0)])
    failed = b.icmp_unsigned("==", b.ptrtoint(mapped, i64), ir.Constant(i64, 2**64 - 1))
    b.ret(b.select(failed, ir.Constant(pointer, None), mapped))

    free = ir.Function(module, ir.FunctionType(ir.VoidType(), [pointer, pointer, i64]),
                       "chunk_free")
    _, block, size = free.args
    b = ir.IRBuilder(free.append_basic_block("entry"))
    to_cache, to_kernel = free.append_basic_block("cache"), free.append_basic_block("unmap")
    b.cbranch(b.icmp_unsigned("==", size, ir.Constant(i64, CHUNK)), to_cache, to_kernel)
    b.position_at_end(to_cache)

    def put(b: ir.IRBuilder) -> ir.Value:
        n = b.load(count)
        room = b.icmp_unsigned("<", n, ir.Constant(i64, KEPT))
        slot = b.select(room, n, ir.Constant(i64, 0))
        with b.if_then(room):
            b.store(block, b.gep(cache, [ir.Constant(i64, 0), slot]))
            b.store(b.add(n, ir.Constant(i64, 1)), count)
        return room
    stored = locked(b, put)
    done = free.append_basic_block("done")
    b.cbranch(stored, done, to_kernel)
    b.position_at_end(to_kernel)
    b.call(munmap, [block, size])
    b.branch(done)
    b.position_at_end(done)
    b.ret_void()
    return module
