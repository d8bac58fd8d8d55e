"""The test processes' arena allocator (`frame_stack`, installed by
conftest): frame-stack chunks given back are kept and handed out again,
other sizes are mapped and unmapped, threads recursing at once each get
chunks of their own, and its lock keeps callers without a GIL apart."""
import ctypes
import sys
import threading

import pytest

import frame_stack

pytestmark = pytest.mark.skipif(not frame_stack.applies(), reason=(
    "the allocator is installed on CPython 3.11+ on 64-bit Linux on x86-64 or aarch64"))


def _kept(engine=None) -> int:
    engine = engine or frame_stack._installed[0]
    return ctypes.c_int64.from_address(engine.get_global_value_address("count")).value


def _depth_sum(n: int, probe=None) -> int:
    """1 + 2 + ... + n, a frame per term (each frame holds its own n)."""
    if n == 0:
        return probe() if probe else 0
    return n + _depth_sum(n - 1, probe)


def test_conftest_installed_the_allocator_and_it_keeps_chunks():
    current = frame_stack._ArenaAllocator()
    ctypes.pythonapi.PyObject_GetArenaAllocator(ctypes.byref(current))
    assert current.alloc == frame_stack._installed[1].alloc
    assert current.free == frame_stack._installed[1].free
    # 600 frames span several chunks: returning keeps them, and the next
    # recursion as deep takes them back (fewer kept at its bottom)
    assert _depth_sum(600) == 600 * 601 // 2
    kept_after_return = _kept()
    assert kept_after_return >= 2
    at_bottom = []
    assert _depth_sum(600, probe=lambda: at_bottom.append(_kept()) or 0) == 600 * 601 // 2
    assert at_bottom[0] < kept_after_return


def test_threads_recursing_at_once_each_have_their_own_frames():
    results, errors = {}, []

    def run(k: int) -> None:
        try:
            for depth in range(300 + k, 900, 37):
                assert _depth_sum(depth) == depth * (depth + 1) // 2
            results[k] = True
        except BaseException as err:  # noqa: BLE001 (reported below)
            errors.append(err)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads mid-recursion, often
    try:
        threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors and len(results) == 8


def test_a_frame_larger_than_a_chunk_is_mapped_for_it_and_not_kept():
    # 5000 locals: a 40 KiB frame, in a chunk of its own size, never one of
    # the kept 16 KiB blocks (which it would overrun), nor kept after it
    namespace = {}
    exec("def big(n):\n" + "".join(f"    v{i} = n + {i}\n" for i in range(5000))
         + "    return " + " + ".join(f"v{i}" for i in range(0, 5000, 250)) + "\n", namespace)
    _depth_sum(600)
    before = _kept()
    assert before >= 2
    for _ in range(3):
        assert namespace["big"](7) == 20 * 7 + sum(range(0, 5000, 250))
    assert _kept() == before


def test_callers_without_the_gil_never_share_a_block():
    # ctypes releases the GIL for each call: four threads take and give back
    # blocks of a private copy of the allocator, each marking the blocks it
    # holds; a block handed to two at once shows as an overwritten mark
    # (without the lock some thousands were)
    engine, alloc_at, free_at = frame_stack.compiled_allocator()
    alloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(alloc_at)
    free = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(free_at)
    overwritten = []

    def run(k: int) -> None:
        held = []
        for i in range(30000):
            block = alloc(None, frame_stack.CHUNK)
            ctypes.c_int64.from_address(block).value = mark = k * 10**9 + i
            held.append((block, mark))
            if len(held) > 3 or i % 3 == 0:
                block, mark = held.pop(0)
                if ctypes.c_int64.from_address(block).value != mark:
                    overwritten.append((k, i))
                free(None, block, frame_stack.CHUNK)
        for block, mark in held:
            if ctypes.c_int64.from_address(block).value != mark:
                overwritten.append((k, -1))
            free(None, block, frame_stack.CHUNK)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overwritten == []
    assert 0 < _kept(engine) <= frame_stack.KEPT
