"""The pool of large CPU arrays (`runtime.memory`): a block is reused only
once no array or view over it is alive, never twice at once (also across
threads), the free blocks kept stay under the limit, and compiled
functions' large results come from it with their values intact."""
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsl
from gradlang.runtime import memory

LARGE = memory.POOL_MIN // 8  # f64 elements of one pooled block


@pytest.fixture(autouse=True)
def empty_pool(monkeypatch):
    monkeypatch.delenv("GRADC_POOL_BYTES", raising=False)
    memory.release()
    yield
    memory.release()


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_a_freed_block_is_reused_and_a_live_one_never():
    a = memory.pooled(LARGE, np.float64)
    first = address(a)
    a[:] = 1.0
    view = a[::2]  # a view alone keeps the block
    del a
    b = memory.pooled(LARGE, np.float64)
    assert address(b) != first
    b[:] = 2.0
    np.testing.assert_array_equal(view, 1.0)
    del view
    c = memory.pooled((LARGE // 2, 2), np.float64)  # same bytes, any shape
    assert address(c) == first and c.shape == (LARGE // 2, 2)
    assert c.flags.c_contiguous and c.flags.writeable and c.dtype == np.float64


def test_small_arrays_are_plain_numpy_arrays():
    a = memory.pooled(16, np.float32)
    assert a.flags.owndata and a.shape == (16,) and a.dtype == np.float32


@given(st.lists(st.tuples(st.integers(1, 3), st.sampled_from(["f4", "f8", "i8", "i4"])),
                min_size=1, max_size=6), st.data())
@settings(max_examples=25, deadline=None)
def test_live_arrays_never_overlap(requests, data):
    live = []
    for blocks, dtype in requests:
        n = blocks * memory.POOL_MIN // np.dtype(dtype).itemsize
        a = memory.pooled(n, dtype)
        assert a.shape == (n,) and a.dtype == np.dtype(dtype) and a.flags.writeable
        assert not any(np.shares_memory(a, b) for b in live)
        live.append(a)
        if data.draw(st.booleans()):
            live.pop(data.draw(st.integers(0, len(live) - 1)))


def test_free_blocks_kept_stay_under_the_limit(monkeypatch):
    monkeypatch.setenv("GRADC_POOL_BYTES", str(3 * memory.POOL_MIN))
    arrays = [memory.pooled(LARGE, np.float64) for _ in range(5)]
    del arrays
    assert memory.release() == 3 * memory.POOL_MIN
    monkeypatch.setenv("GRADC_POOL_BYTES", "0")  # off: nothing kept
    a = memory.pooled(LARGE, np.float64)
    del a
    assert memory.release() == 0


def test_threads_never_share_a_block():
    errors = []

    def work(k: int) -> None:
        for _ in range(20):
            a = memory.pooled(LARGE, np.float64)
            a[:] = k
            if not (a == k).all():  # another thread wrote into it
                errors.append(k)
            del a

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_compiled_results_come_from_the_pool_with_their_values():
    m = dsl.loads("def f(x):\n    return exp(x), x * 2\n")
    x = np.random.default_rng(0).normal(size=LARGE)
    e1, d1 = m.f(x)
    kept = e1.copy()
    e2, d2 = m.f(x + 1)  # the first results are alive: fresh blocks
    assert not np.shares_memory(e1, e2) and not np.shares_memory(e1, d2)
    np.testing.assert_array_equal(e1, kept)
    np.testing.assert_allclose(e2, np.exp(x + 1), rtol=1e-15)
    np.testing.assert_array_equal(d2, (x + 1) * 2)
    old = {address(e1), address(d1)}
    del e1, d1
    e3, d3 = m.f(x)
    assert {address(e3), address(d3)} == old  # reused, and fully rewritten
    np.testing.assert_allclose(e3, np.exp(x), rtol=1e-15)
    np.testing.assert_array_equal(d3, x * 2)


def test_a_torch_tensor_over_a_result_keeps_its_block():
    torch = pytest.importorskip("torch")
    m = dsl.loads("def f(x):\n    return x * 3\n")
    f = dsl.to_torch(m.f)
    x = torch.arange(LARGE, dtype=torch.float64)
    y = f(x)  # a tensor over the kernel's output array, which is dropped
    expected = y.clone()
    z = f(x + 1)
    assert y.data_ptr() != z.data_ptr()
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(z, (x + 1) * 3)
