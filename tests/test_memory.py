"""The pool of large CPU arrays (`runtime.memory`): a block is reused only
once no array or view over it is alive, never twice at once (also across
threads), the free blocks kept stay under the limit, and compiled
functions' large results come from it with their values intact."""
import copy
import ctypes
import functools
import gc
import os
import pickle
import sys
import threading
import time
import warnings

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


def test_a_large_full_reuses_a_freed_block_filled():
    # a table of zeros that a loop's gradient adds into (`R.full`): a fresh
    # mapping each call, its page faults in the loop, took 3x the gradient
    from gradlang.runtime import cpu
    a = cpu.full((LARGE // 4, 4), 0.0, np.float64)
    first = address(a)
    a[:] = np.nan
    del a
    b = cpu.full((LARGE // 4, 4), 0.0, np.float64)
    assert address(b) == first and isinstance(_lease_of(b), memory.Lease)  # (the pool's)
    np.testing.assert_array_equal(b, 0.0)
    flags = cpu.full((LARGE,), True, np.bool_)
    assert flags.all() and flags.dtype == np.bool_
    assert cpu.full((2, 3), 1, np.int32).tolist() == [[1, 1, 1]] * 2


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


# A fork's `before` hooks run in the reverse order of their registration:
# this one (registered after the pool's) runs first, while the test's
# holder thread still holds the pool's lock, which the pool's hook then
# waits for.
_FORK_HOOK_ON, _FORK_BEGUN = threading.Event(), threading.Event()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=lambda: _FORK_HOOK_ON.is_set() and _FORK_BEGUN.set())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")
def test_a_forked_child_frees_a_lease_while_a_thread_held_the_lock():
    """os.fork while another thread is inside the pool's bookkeeping (the
    lock held) must not leave the child a lock nobody can release: the
    child's next freed lease would hang it (multiprocessing and PyTorch's
    DataLoader fork by default on Linux)."""
    kept = memory.pooled(LARGE, np.float64)
    held = threading.Event()

    def hold_the_lock() -> None:
        with memory.HOST._lock:
            held.set()
            # until the fork has begun (the hooks run before the pool's,
            # which waits for this lock): a sleep of 0.3 s let a busy
            # machine fork after the release, testing nothing, and waiting
            # for the fork's return waited for ever (the fork waits for us)
            _FORK_BEGUN.wait(60)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    held.wait()
    _FORK_BEGUN.clear()
    _FORK_HOOK_ON.set()
    pid = os.fork()
    if pid == 0:  # the child: free the lease, then leave at once
        del kept
        os._exit(0)
    _FORK_HOOK_ON.clear()
    assert _FORK_BEGUN.is_set()  # (the holder held the lock until the fork began)
    holder.join()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        finished, status = os.waitpid(pid, os.WNOHANG)
        if finished:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the child hung freeing a lease (the pool's lock held at the fork)")
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("duplicate", ["copy", "deepcopy", "pickle"])
def test_a_lease_cannot_be_duplicated(duplicate):
    """A copy of a lease would give its block back a second time (two live
    arrays over one block) or expose the block's address without keeping
    it; arrays over a lease copy and pickle as any array does."""
    a = memory.pooled(LARGE, np.float64)
    a[:] = 1.5
    copies = {"copy": copy.copy, "deepcopy": copy.deepcopy,
              "pickle": lambda lease: pickle.loads(pickle.dumps(lease))}
    with pytest.raises(TypeError, match="lease"):
        copies[duplicate](_lease_of(a))
    twin = copies[duplicate](a[::2])
    assert not np.shares_memory(twin, a)
    np.testing.assert_array_equal(twin, 1.5)
    del a
    b, c = memory.pooled(LARGE, np.float64), memory.pooled(LARGE, np.float64)
    assert not np.shares_memory(b, c)


def kept_bytes() -> int:
    """The bytes of the blocks on the free lists, counted from the lists."""
    return sum(block.nbytes for blocks in memory.HOST._free.values() for block in blocks)


def test_a_release_while_a_block_is_taken_keeps_the_limit(monkeypatch):
    """release() between another thread's taking a block and its counting
    it must not leave the count below the blocks kept (the pool would then
    keep more than its limit for ever)."""
    monkeypatch.setenv("GRADC_POOL_BYTES", str(2 * memory.POOL_MIN))
    memory.pooled(LARGE, np.float64)  # dropped: one free block
    taken = []

    def take() -> None:
        taken.append(memory.pooled(LARGE, np.float64))

    with memory.HOST._lock:  # this thread releases the pool while the other takes
        taker = threading.Thread(target=take)
        taker.start()
        time.sleep(0.2)
        memory.release()
    taker.join()
    del taken
    arrays = [memory.pooled(LARGE, np.float64) for _ in range(3)]
    del arrays
    kept = kept_bytes()
    assert kept <= 2 * memory.POOL_MIN and memory.release() == kept


def test_a_lease_freed_within_a_give_back_keeps_the_limit(monkeypatch):
    """The garbage collector may free a lease while another is being given
    back (the lock is re-entrant): the two together keep to the limit."""
    monkeypatch.setenv("GRADC_POOL_BYTES", str(memory.POOL_MIN))
    inner = [memory.pooled(LARGE, np.float64)]
    limit = memory.pool_limit

    def limit_with_a_collection() -> int:  # a collection frees `inner` here
        inner.clear()
        return limit()

    monkeypatch.setattr(memory, "pool_limit", limit_with_a_collection)
    memory.pooled(LARGE, np.float64)  # dropped: given back
    assert kept_bytes() <= memory.POOL_MIN


def test_leases_freed_while_the_interpreter_exits_say_nothing():
    """A result kept by a module that is torn down after the pool's helpers
    (here `os`) is freed at exit without a traceback on stderr."""
    import subprocess
    import sys
    script = ("import os\nimport numpy as np\nfrom gradlang.runtime import memory\n"
              f"os.kept = memory.pooled({LARGE}, np.float64)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stderr == ""


def test_a_size_no_longer_asked_for_makes_room(monkeypatch):
    """Blocks of sizes freed long ago give way to the size a loop frees now
    (an epoch's short last batch, then the next epoch's full ones): a full
    pool of stale sizes would otherwise refuse every block from then on."""
    step = memory.POOL_MIN // 8  # three sizes of three size classes
    old, new, size = memory.POOL_MIN, memory.POOL_MIN + 1, memory.POOL_MIN + step + 1
    monkeypatch.setenv("GRADC_POOL_BYTES", str(2 * memory.POOL_MIN + 3 * step + 64))
    older, newer = (memory.pooled(n, np.uint8) for n in (old, new))
    del older, newer  # in this order: the pool is full of these two sizes
    memory.pooled(size, np.uint8)  # dropped: kept, the oldest size evicted
    assert old not in memory.HOST._free and len(memory.HOST._free[old + 2 * step]) == 1
    assert kept_bytes() == 2 * memory.POOL_MIN + 3 * step == memory.release()
    monkeypatch.setenv("GRADC_POOL_BYTES", str(memory.POOL_MIN - 1))
    memory.pooled(memory.POOL_MIN, np.uint8)  # larger than the whole pool: dropped
    assert kept_bytes() == 0


@pytest.mark.parametrize("text", ["1e9", "512MiB", "-1", "0x100000", "lots"])
def test_a_limit_that_is_not_a_byte_count_is_said_once(monkeypatch, text):
    """A GRADC_POOL_BYTES the pool cannot read keeps the default limit and
    says so, once, rather than silently (1e9 is not a billion here)."""
    monkeypatch.setenv("GRADC_POOL_BYTES", text)
    with pytest.warns(RuntimeWarning, match=f"GRADC_POOL_BYTES={text!r}.*512 MiB"):
        assert memory.pool_limit() == 512 << 20
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert memory.pool_limit() == 512 << 20


@pytest.mark.parametrize("text, limit", [("0", 0), ("8388608", 8 << 20), (" 4096 ", 4096),
                                         ("", 512 << 20)])
def test_a_byte_count_is_the_limit(monkeypatch, text, limit):
    monkeypatch.setenv("GRADC_POOL_BYTES", text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert memory.pool_limit() == limit


@pytest.mark.parametrize("dtype", [np.dtype([("a", "f8"), ("b", "i4")]), np.dtype(("f8", (2,))),
                                   np.dtype(">f8"), np.dtype("M8[s]")])
def test_any_dtype_is_the_dtype_asked_for(dtype):
    """As np.empty gives it: a structured or subarray dtype too, which an
    `__array_interface__` typestr alone would make raw bytes."""
    n = memory.POOL_MIN // dtype.itemsize + 1
    a, expected = memory.pooled(n, dtype), np.empty(n, dtype)
    assert a.dtype == expected.dtype and a.shape == expected.shape


def test_an_object_array_holds_none_not_a_freed_blocks_bytes():
    """As np.empty's: an object array over a reused block held its old
    bytes as pointers (here a live list's address; other bytes crash at
    the first read, and a write decrefs whatever they point at)."""
    sentinel = ["not None"]
    a = memory.pooled(LARGE, np.int64)
    a[:] = id(sentinel)
    del a  # free, every word the sentinel's address
    objects = memory.pooled(LARGE, object)
    assert objects.shape == (LARGE,) and objects[0] is None and objects[-1] is None


def test_a_count_left_high_heals_at_the_next_give_back(monkeypatch):
    """Should an interrupted step (a KeyboardInterrupt between a pop and its
    count) leave the count above the blocks kept, the next give-back finds
    nothing left to evict, and starts counting afresh (no error from a
    lease's __del__)."""
    import sys
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    monkeypatch.setenv("GRADC_POOL_BYTES", str(memory.POOL_MIN))
    monkeypatch.setattr(memory.HOST, "_free_bytes", memory.POOL_MIN)  # no block kept
    memory.pooled(LARGE, np.float64)  # dropped: given back
    assert unraisable == [] and kept_bytes() == memory.POOL_MIN == memory.release()


HOLDERS = {  # what NumPy, the buffer protocol and ctypes make over an array
    "a view of a view": lambda a: a[1:][::2][3:],
    "a reshape's .T": lambda a: a.reshape(2, -1).T,
    "view(dtype)": lambda a: a.view(np.int32),
    "memoryview": memoryview,
    "np.frombuffer": lambda a: np.frombuffer(memoryview(a).cast("B"), np.float64),
    "as_strided": lambda a: np.lib.stride_tricks.as_strided(a, (8, 8), (8, 8)),
    "sliding_window_view": lambda a: np.lib.stride_tricks.sliding_window_view(a, 3),
    "np.ctypeslib.as_ctypes": lambda a: np.ctypeslib.as_ctypes(a),
    "a ctypes array from_buffer": lambda a: (ctypes.c_double * 8).from_buffer(a),
    "np.from_dlpack": np.from_dlpack,
    "a masked array": lambda a: np.ma.masked_array(a, copy=False),
    "a pickle-5 buffer": lambda a: pickle.PickleBuffer(a),
    "the lease itself": lambda a: _lease_of(a),
}


@pytest.mark.parametrize("hold", list(HOLDERS.values()), ids=list(HOLDERS))
def test_whatever_refers_to_the_memory_keeps_the_block(hold):
    a = memory.pooled(LARGE, np.float64)
    first, a[:] = address(a), 7.0
    holder = hold(a)
    del a
    others = [memory.pooled(LARGE, np.float64) for _ in range(3)]
    assert first not in {address(o) for o in others}
    del others, holder
    assert address(memory.pooled(LARGE, np.float64)) == first  # and its end gives it back


LOOP = """
def energy(x, n: i64):
    s = x
    for i in range(n):
        s = s * s * 0.5 + x
    return sum(s * s)
"""


def _energy(x, n):
    """LOOP's energy and its gradient in NumPy (its backward pass reads
    the state each trip started from: the stack)."""
    s, states = x, []
    for _ in range(n):
        states.append(s)
        s = s * s * 0.5 + x
    ds, dx = 2 * s, np.zeros_like(x)
    for state in reversed(states):
        dx, ds = dx + ds, ds * state
    return np.sum(s * s), dx + ds


def test_a_loop_writes_all_it_takes_from_the_pool(monkeypatch):
    """A loop kernel's carried values and its stacked trips (kept for the
    gradient) come from the pool, which hands back old values: taken full
    of NaN here, every element must be written (zero trips too)."""
    from gradlang.runtime import cpu
    taken = []

    def poisoned(shape, dtype):
        a = memory.pooled(shape, dtype)
        a.fill(np.nan)
        taken.append(a.size)
        return a

    monkeypatch.setattr(cpu, "pooled", poisoned)
    energy = dsl.value_and_grad(dsl.loads(LOOP).energy)
    x = np.random.default_rng(1).normal(size=LARGE)
    for n in (0, 1, 3):
        value, gradient = energy(x, n)
        want_value, want_gradient = _energy(x, n)
        np.testing.assert_allclose(value, want_value, rtol=1e-12)
        np.testing.assert_allclose(gradient, want_gradient, rtol=1e-12)
    assert 3 * LARGE in taken  # the three trips' stack


def _interrupted_at(code, k: int, action) -> bool:
    """Run `action`, a KeyboardInterrupt raised at the `k`th bytecode that
    `code` runs (as a Ctrl-C may be); whether it was raised."""
    def interrupt():
        raise KeyboardInterrupt

    try:
        _run_reentered({code}, k, action, interrupt)
    except KeyboardInterrupt:
        return True
    finally:
        # Raised at the opcodes that call a `with _lock:`'s __exit__ on
        # the way out, it leaves this thread holding the lock: no Python
        # code can shield those, and no real Ctrl-C lands there (signals
        # are delivered at the eval loop's checks, which a call makes only
        # once it returns).  Let go of it, as its __exit__ would have, so
        # that another thread can take it (a later test in this process
        # waited for it for ever).
        while memory.HOST._lock._is_owned():
            memory.HOST._lock.release()
    return False


@pytest.mark.parametrize("step", ["give back", "listing", "take"])
def test_a_ctrl_c_anywhere_in_the_pools_bookkeeping_leaves_it_usable(monkeypatch, step):
    """A KeyboardInterrupt at any bytecode of a give-back or a take: the
    pool goes on working (an empty free list left by a take cut short made
    every later eviction raise IndexError in a lease's __del__) and never
    counts fewer bytes than it keeps (so it never keeps more than its limit)."""
    import sys
    unraisable = []  # what a lease's __del__ raised
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    sizes = [memory.POOL_MIN + 8 * k for k in range(3)]
    limit = sizes[0] + sizes[1]
    monkeypatch.setenv("GRADC_POOL_BYTES", str(limit))
    code = {"give back": memory.FreeBlocks.give_back, "listing": memory.FreeBlocks._list_queued,
            "take": memory.FreeBlocks.take}[step].__code__
    if step == "listing":  # (a give-back's: its evictions)
        step = "give back"
    # (Python 3.12 reports no opcode of a code object's first traced call:
    # one traced call first, interrupted nowhere)
    first = (functools.partial(memory._give_back, np.empty(sizes[2], np.uint8))
             if step == "give back" else functools.partial(memory.pooled, sizes[0], np.uint8))
    _interrupted_at(code, 0, first)
    for k in range(1, 10_000):
        memory.release()
        for n in sizes[:2]:  # dropped: both kept, the pool is full
            memory.pooled(n, np.uint8)
        if step == "give back":  # a third size: both evicted to make room
            action = functools.partial(memory._give_back, np.empty(sizes[2], np.uint8))
        else:
            action = functools.partial(memory.pooled, sizes[0], np.uint8)
        if not _interrupted_at(code, k, action):
            break  # past the last bytecode
        assert memory.HOST._free_bytes >= kept_bytes()
        for n in sizes * 2:  # takes and give-backs of each size, and evictions
            memory.pooled(n, np.uint8)
            assert memory.HOST._free_bytes >= kept_bytes() and kept_bytes() <= limit
        assert unraisable == []
    assert k > 20
    taken = []  # and another thread takes a block
    taker = threading.Thread(target=lambda: taken.append(memory.pooled(sizes[0], np.uint8)),
                             daemon=True)  # (should it wait for ever)
    taker.start()
    taker.join(10)
    assert len(taken) == 1 and taken[0].nbytes == sizes[0]


def _run_reentered(codes, k: int, action, reenter, at_offset: "int | None" = None) -> bool:
    """Run `action`, calling `reenter` (once) before the `k`th bytecode
    that frames of `codes` run (with `at_offset`, before the first at that
    bytecode offset instead); whether it was called."""
    import sys
    seen, called = 0, []

    def each_opcode(frame, event, arg):
        nonlocal seen
        if event == "opcode":
            seen += 1
            here = seen == k if at_offset is None else frame.f_lasti == at_offset
            if here and not called:
                called.append(True)
                reenter()
        return each_opcode

    def calls(frame, event, arg):
        if frame.f_code not in codes:
            return None
        frame.f_trace_opcodes = True
        return each_opcode

    sys.settrace(calls)
    try:
        action()
    finally:
        sys.settrace(None)
    return bool(called)


@pytest.mark.parametrize("step", ["give back", "take"])
def test_a_block_given_back_within_the_pools_bookkeeping_waits_for_it(step):
    """This thread gives a block back at any bytecode of a give-back or a
    take (a lease freed by a collection, which from Python 3.12 runs at
    any bytecode, or by a signal handler), the pool full, so that it
    evicts: listed there and then, it changed the lists and their count
    under the step it interrupted, which raised (KeyError, IndexError,
    RuntimeError: in a take, out of the call that asked for memory) or
    left the count below the blocks kept.  Queued, it is listed after."""
    sizes = [memory.POOL_MIN + 8 * k for k in range(4)]
    limit = sizes[0] + sizes[1]
    pool = memory.FreeBlocks(lambda: limit)
    codes = {memory.FreeBlocks._list_queued.__code__,
             (memory.FreeBlocks.give_back if step == "give back" else memory.FreeBlocks.take
              ).__code__}
    taken = []
    if step == "give back":
        def action():
            pool.give_back(np.empty(sizes[3], np.uint8), sizes[3])
    else:
        def action():
            taken.append(pool.take(sizes[0]))

    within = []  # whether the bookkeeping held the lock then (before it, a plain give-back)

    def reenter():
        within.append(pool._lock._is_owned())
        pool.give_back(np.empty(sizes[2], np.uint8), sizes[2])
    _run_reentered(codes, 0, action, reenter)  # (3.12 reports no opcode of a first traced call)
    for k in range(1, 10_000):
        pool.release()
        taken.clear()
        within.clear()
        for n in sizes[:2]:  # both kept, the pool full, sizes[0] given back longest ago
            pool.give_back(np.empty(n, np.uint8), n)
        if not _run_reentered(codes, k, action, reenter):
            break  # past the last bytecode
        kept = sum(n * len(b) for n, b in pool._free.items())
        assert pool._free_bytes >= kept and kept <= limit
        if step == "take" and within[0]:  # (the block was there before that give-back)
            assert taken[0] is not None and taken[0].nbytes == sizes[0]
        for n in sizes * 2:  # and the pool goes on working
            block = pool.take(n)
            pool.give_back(np.empty(n, np.uint8) if block is None else block, n)
        assert not pool._queued  # (listed by the next step, where not by this one)
    assert k > 20


def _lease_of(a: np.ndarray):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a.base


def test_the_drivers_large_copies_products_and_buffers_reuse_freed_blocks():
    # a convolution's gradient made its im2col rows, its products, its
    # padded buffers and its copies in fresh mappings (2,600 page faults a
    # call): each comes from the pool now, a freed block reused whole
    from gradlang.runtime import cpu
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(LARGE // 64, 64)), rng.normal(size=(64, 64))
    x = rng.normal(size=(2, LARGE // 16, 8))
    region = (slice(0, 2), slice(1, 1 + LARGE // 16), slice(0, 8))
    made = {"matmul": lambda: cpu.matmul(a, b),
            "batched matmul": lambda: cpu.matmul(a.reshape(2, -1, 64), b),
            "concatenate": lambda: cpu.concatenate((x, x[:, ::-1]), 2),
            "embed": lambda: cpu.embed(x, (2, LARGE // 16 + 2, 8), region),
            "embed_add": lambda: cpu.embed_add(np.ones((2, LARGE // 16 + 2, 8)), x, region),
            "copy": lambda: cpu.copy(x.transpose(2, 0, 1))}
    expected = {"matmul": a @ b, "batched matmul": a.reshape(2, -1, 64) @ b,
                "concatenate": np.concatenate((x, x[:, ::-1]), 2),
                "embed": np.pad(x, [(0, 0), (1, 1), (0, 0)]),
                "embed_add": 1 + np.pad(x, [(0, 0), (1, 1), (0, 0)]),
                "copy": x.transpose(2, 0, 1)}
    for name, make in made.items():
        first = make()
        assert isinstance(_lease_of(first), memory.Lease), name
        at = address(first)
        first[...] = np.nan  # a block is reused as it was left
        del first
        again = make()
        assert address(again) == at and again.flags.c_contiguous, name
        np.testing.assert_array_equal(again, expected[name], err_msg=name)  # the same bits


class _Block:
    """A block whose drop runs code, as a GPU block's does (Numba's
    finalizer, which may collect garbage, which may free a pooled array)."""

    def __init__(self, on_drop=None):
        self.on_drop = on_drop

    def __del__(self):
        if self.on_drop:
            self.on_drop()


def test_a_block_whose_drop_gives_back_another_leaves_the_lists_and_count_whole():
    # The eviction dropped each block inside its loop: a give-back from that
    # drop emptied the list being evicted from (KeyError, the outer block
    # lost) and left the count below the blocks kept.
    pool = memory.FreeBlocks(lambda: 100)
    pool.give_back(_Block(lambda: pool.give_back(_Block(), 40)), 60)
    pool.give_back(_Block(), 30)
    pool.give_back(_Block(), 50)  # evicts the 60 block: its drop gives back 40, evicting 30
    assert {n: len(b) for n, b in pool._free.items()} == {50: 1, 40: 1}
    assert pool._free_bytes == 90


def test_release_releases_every_pool():
    # (a GPU's pool too: `memory.release()` freed only the host's)
    device_like = memory.FreeBlocks(lambda: 100)
    memory.POOLS.add(device_like)
    device_like.give_back(_Block(), 64)
    memory.pooled(LARGE, np.float64)  # dropped: kept by the host pool
    assert memory.release() == 64 + LARGE * 8
    assert not device_like._free and not memory.HOST._free


def test_two_pools_giving_back_into_each_other_from_two_threads_never_wait_on_each_other():
    # A collection inside one pool's bookkeeping may free a lease of the
    # other's (the host's inside a GPU's, and the other way round): each
    # thread, holding its pool's lock, waited for the other's, held by the
    # other thread waiting for the first: a deadlock.  A give-back now
    # queues its block where another thread holds the lock.
    inside = threading.Barrier(2, timeout=5)

    def limit_giving_back_into(other: list):
        def limit() -> int:
            if threading.current_thread().name == other[1]:
                other[1] = None  # (once)
                inside.wait()  # both threads hold their own pool's lock
                other[0].give_back(_Block(), 8)
            return 100
        return limit

    to_b, to_a = [None, "a"], [None, "b"]
    a, b = memory.FreeBlocks(limit_giving_back_into(to_b)), memory.FreeBlocks(
        limit_giving_back_into(to_a))
    to_b[0], to_a[0] = b, a
    threads = [threading.Thread(target=pool.give_back, args=(_Block(), 16), name=name,
                                daemon=True)  # (deadlocked, they would hold the exit)
               for pool, name in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    for pool in (a, b):  # each block listed, by its holder or by the next call
        pool.take(0)
        assert {n: len(blocks) for n, blocks in pool._free.items()} == {16: 1, 8: 1}
        assert pool._free_bytes == 24 and not pool._queued


def test_a_ctrl_c_as_a_give_back_takes_the_lock_leaves_it_free():
    # A Ctrl-C is delivered where the eval loop checks, as a call returns:
    # right after a give-back's acquire(blocking=False) took the lock, and
    # before its try, the lock was kept for good: every later give-back of
    # this thread queued its block (never listed), and another thread's
    # take waited for ever.
    import dis
    pool = memory.FreeBlocks(lambda: 100)
    code = memory.FreeBlocks.give_back.__code__
    ops = list(dis.get_instructions(code))
    at = next(k for k, op in enumerate(ops) if op.argval == "acquire")
    call = next(k for k in range(at, len(ops)) if ops[k].opname.startswith("CALL"))
    given = []

    def action():
        for _ in range(2):  # (Python 3.12 traces no opcode of a code's first traced call)
            given.append(_Block())
            try:
                pool.give_back(given[-1], 16)
            except KeyboardInterrupt:
                break

    def interrupt():
        raise KeyboardInterrupt
    assert _run_reentered({code}, 0, action, interrupt, at_offset=ops[call + 1].offset)
    owned = pool._lock._is_owned()
    while pool._lock._is_owned():  # (let go, so that the checks below end)
        pool._lock.release()
    assert not owned
    pool.take(0)  # lists the block queued before the interrupt
    assert pool._free_bytes == 16 * len(given) and not pool._queued
    assert {id(pool.take(16)) for _ in given} == {id(b) for b in given}


def test_a_block_queued_while_another_thread_held_the_lock_is_taken_and_released():
    # A give-back while another thread holds the lock, after that thread
    # listed the queue, waits for the pool's next call: a take of its size
    # missed it (listing after taking), and release() dropped it uncounted
    pool = memory.FreeBlocks(lambda: 100)
    block = _Block()
    pool._queued.append((block, 16))  # (as that give-back leaves it)
    assert pool.take(16) is block and not pool._queued and pool._free_bytes == 0
    pool._queued.append((_Block(), 24))
    pool.give_back(_Block(), 8)  # (listed with the queued one)
    pool._queued.append((_Block(), 32))
    assert pool.release() == 8 + 24 + 32
    assert not pool._free and not pool._queued and pool._free_bytes == 0


def test_sizes_that_vary_from_call_to_call_reuse_blocks_of_their_class(monkeypatch):
    """Blocks were of exactly the bytes asked for: a loop whose batch sizes
    vary (sequences of each batch's length) freed blocks no later call
    took, and the pool filled to its limit (512 MiB beside a model of a
    few MiB) while taking none.  A block now serves any size of its class,
    at most an eighth larger."""
    monkeypatch.setenv("GRADC_POOL_BYTES", str(64 * memory.POOL_MIN))
    memory.release()
    first = memory.pooled(LARGE + 4000, np.float64)
    at = address(first)
    del first
    kept = set()
    for n in range(LARGE + 8, LARGE + 200, 3):  # 64 sizes, every one new
        a = memory.pooled(n, np.float64)
        a[...] = n  # the whole array is writeable memory of its own
        assert a.shape == (n,) and (a == n).all()
        kept.add(address(a))
        del a
    assert kept == {at} and kept_bytes() == memory.POOL_MIN * 9 // 8 == memory.release()
    for n in (memory.POOL_MIN, memory.POOL_MIN + 1, 3 << 20, (3 << 20) + 5, 10**9 + 7):
        got = memory.block_bytes(n)
        assert n <= got <= n + max(n // 8, 4096) and got % 4096 == 0


def test_a_ctrl_c_as_a_lease_is_made_gives_no_internal_traceback(monkeypatch):
    # delivered at the first line of Lease.__init__ (a call's start is
    # where the eval loop checks), before its block was set: the half-made
    # lease's __del__ printed an ignored AttributeError under the Ctrl-C
    unraised = []
    monkeypatch.setattr(sys, "unraisablehook", unraised.append)
    code = memory.Lease.__init__.__code__

    def interrupting(frame, event, arg):
        if frame.f_code is code:
            raise KeyboardInterrupt
    sys.settrace(interrupting)
    try:
        with pytest.raises(KeyboardInterrupt):
            memory.pooled(memory.POOL_MIN, np.uint8)
    finally:
        sys.settrace(None)
    gc.collect()
    assert unraised == []
    again = memory.pooled(memory.POOL_MIN, np.uint8)
    again[:] = 7
    np.testing.assert_array_equal(again, np.full(memory.POOL_MIN, 7, np.uint8))
