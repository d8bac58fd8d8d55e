"""The test processes' arena allocator (`frame_stack`, installed by
conftest): frame-stack chunks given back are kept and handed out again,
and threads recursing at once each get chunks of their own."""
import ctypes
import sys
import threading

import pytest

import frame_stack

pytestmark = pytest.mark.skipif(
    sys.implementation.name != "cpython" or sys.platform != "linux"
    or sys.version_info < (3, 11), reason="the allocator is installed on CPython 3.11+ on Linux")


def _kept() -> int:
    engine = frame_stack._installed[2]
    return ctypes.c_int64.from_address(engine.get_global_value_address("count")).value


def _depth_sum(n: int, probe=None) -> int:
    """1 + 2 + ... + n, a frame per term (each frame holds its own n)."""
    if n == 0:
        return probe() if probe else 0
    return n + _depth_sum(n - 1, probe)


def test_conftest_installed_the_allocator_and_it_keeps_chunks():
    current = frame_stack._ArenaAllocator()
    ctypes.pythonapi.PyObject_GetArenaAllocator(ctypes.byref(current))
    assert current.alloc == frame_stack._installed[3].alloc
    assert current.free == frame_stack._installed[3].free
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
