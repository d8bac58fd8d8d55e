"""Arguments whose memory is not C-contiguous (Fortran order, transposed,
reversed, column slices, broadcasts): the same bits as the call on C-order
copies, nothing copied whole where a view would do, arguments untouched."""
import tracemalloc

import numpy as np
import pytest

import dsl
from gradlang.runtime import cpu

LOOPS = ("def rnn(xs, h, w, v):\n"
         "    for i in range(xs.shape[0]):\n"
         "        h = tanh(h @ w + xs[i] * sum(v, axis=0))\n"
         "    return sum(h)\n"
         "def carried(xs, h, w, v):\n"
         "    for i in range(xs.shape[0]):\n"
         "        h = tanh(h @ w + xs[i] * sum(v * h, axis=0))\n"
         "    return sum(h)\n"
         "def plain(xs, h, w):\n"
         "    for i in range(xs.shape[0]):\n"
         "        h = tanh(h @ w + xs[i])\n"
         "    return sum(h)\n")


def layouts(x: np.ndarray) -> list:
    """x's values in layouts that are not C-contiguous."""
    return [np.asfortranarray(x), x.T.copy().T, np.ascontiguousarray(x[::-1])[::-1],
            np.repeat(x, 2, axis=1)[:, ::2]]


def assert_same_bits(got, want) -> None:
    value, grads = got
    assert value.tobytes() == want[0].tobytes()
    assert all(g.tobytes() == w.tobytes() for g, w in zip(grads, want[1]))


@pytest.fixture
def copies(monkeypatch):
    """The shapes of the arrays not C-contiguous that a helper copied flat
    (`R.flat`, which a product in a loop and a fused loop read through)
    or reduced (`R.reduce_sum` makes its input contiguous)."""
    seen = []
    flat, reduce_sum = cpu.flat, cpu.reduce_sum

    def noted(helper):
        def call(x, *rest):
            if not x.flags.c_contiguous:
                seen.append(x.shape)
            return helper(x, *rest)
        return call
    monkeypatch.setattr(cpu, "flat", noted(flat))
    monkeypatch.setattr(cpu, "reduce_sum", noted(reduce_sum))
    return seen


def test_a_loop_reads_an_invariant_of_any_layout_in_c_order_copied_once(copies):
    # a loop's invariant that a step reads whole (a product's operand, a
    # sum) was copied C-contiguous by that step every trip where it was
    # not already (an RNN's Fortran-order weight: once per trip, the copy
    # costing as much as the trip's product); now once before the trips
    m = dsl.loads(LOOPS, "layouts.grad")
    rng = np.random.default_rng(0)
    xs, h = rng.normal(size=(24, 4)), rng.normal(size=4)
    w, v = rng.normal(size=(4, 4)) / 2, rng.normal(size=(5, 4)) / 4
    f = dsl.value_and_grad(m.rnn, wrt=(0, 1, 2))
    want = f(xs, h, w, v)
    for odd_w, odd_v in zip(layouts(w) + [np.broadcast_to(w[0], (4, 4))],
                            layouts(v) + [np.broadcast_to(v[0], (5, 4))]):
        copies.clear()
        got = f(xs, h, odd_w, odd_v)
        # (the backward's transpose of w is taken once too, in C order)
        assert copies.count((4, 4)) <= 2 and copies.count((5, 4)) <= 1, copies
        if odd_w.strides[0]:
            assert_same_bits(got, want)
    # no trips: a broadcast of more memory than there is is read by none
    # (here sum(v * h, axis=0): rnn's sum(v, axis=0) reads v alone, so it
    # runs once before the trips, `compiler.hoisting`, and v's copy is
    # refused whatever the trips)
    huge = np.broadcast_to(v[0], (2 ** 33, 4))
    value, grads = dsl.value_and_grad(m.carried, wrt=(0, 1, 2))(xs[:0], h, w, huge)
    assert value == h.sum() and np.array_equal(grads[1], np.ones(4)) and not grads[2].any()
    with pytest.raises(dsl.GradError, match="a contiguous copy of its argument 'v'"):
        f(xs[:0], h, w, huge)


PRODUCTS = ("def vm(v, a):\n"
            "    return sum(tanh(v @ a))\n"
            "def mv(a, v):\n"
            "    return sum(tanh(a @ v))\n"
            "def rows(x, a):\n"
            "    return sum(tanh(x @ transpose(a)))\n")


def test_a_matrix_vector_product_gives_the_c_order_call_s_bits_for_any_layout():
    # NumPy's matrix-vector product (BLAS's gemv) runs along a row-major
    # and a column-major matrix in different orders: a Fortran-order,
    # transposed, reversed or column-sliced operand gave other bits than
    # its C-order copy (a torch weight's `.t()`, a Fortran-order Dask
    # array's blocks); the driver now takes such an argument in C order
    m = dsl.loads(PRODUCTS, "products.grad")
    rng = np.random.default_rng(1)
    v, a = rng.normal(size=30), rng.normal(size=(30, 20))
    calls = [(m.vm, v, a, 1), (m.mv, a.T.copy(), v, 0), (m.rows, v[None, :], a.T.copy(), 1)]
    for f, x, y, k in calls:
        f = dsl.value_and_grad(f, wrt=(0, 1))
        want = f(x, y)
        args = [x, y]
        for odd in layouts(args[k]):
            before = odd.copy()
            args[k] = odd
            assert_same_bits(f(*args), want)
            assert np.array_equal(odd, before)
    reversed_v = np.ascontiguousarray(v[::-1])[::-1]
    assert_same_bits(dsl.value_and_grad(m.vm, wrt=(0, 1))(reversed_v, a),
                     dsl.value_and_grad(m.vm, wrt=(0, 1))(v, a))


GATHERS = ("def row(x, i: i64):\n"
           "    return x[i] * 2.0\n"
           "def rows(x, idx):\n"
           "    return sum(x[idx] ** 2, axis=1)\n"
           "def columns(x, idx):\n"
           "    return take(x, idx, axis=1) + 1.0\n"
           "def along(x, idx):\n"
           "    return take_along_axis(x, idx, axis=1) * 3.0\n")


def test_a_gather_from_a_huge_broadcast_is_not_refused_as_a_copy_of_it():
    # a gather reads its table where it lies (`runtime.cpu.take`), but the
    # driver still refused, before anything ran, the table's contiguous
    # copy that the gather no longer makes: x[i] of a 2**33-row broadcast
    # was an AllocationError ("a contiguous copy of its argument 'x'")
    m = dsl.loads(GATHERS, "gathers.grad")
    row = np.array([1.5, -2.0, 0.25])
    huge = np.broadcast_to(row, (2 ** 33, 3))
    np.testing.assert_array_equal(m.row(huge, 2 ** 33 - 1), row * 2)
    np.testing.assert_array_equal(m.rows(huge, np.array([0, -1, 7])), [np.sum(row ** 2)] * 3)
    tall = np.broadcast_to(row[:, None], (3, 2 ** 33))
    np.testing.assert_array_equal(m.columns(tall, np.array([5, -1])),
                                  np.repeat(row[:, None] + 1, 2, axis=1))
    np.testing.assert_array_equal(m.along(tall, np.array([[0, -1]] * 3)),
                                  np.repeat(row[:, None] * 3, 2, axis=1))


SCAN = ("def scan(xs, h):\n"
        "    for i in range(xs.shape[0]):\n"
        "        h = tanh(h * 0.5 + xs[i])\n"
        "    return h\n")


def test_a_loop_in_one_kernel_reads_a_broadcast_stack_where_it_lies():
    # an elementwise loop runs in one kernel, which read its stacked input
    # flat: a broadcast of a row to every trip was copied whole each call
    # (8192 trips of a 64-vector: 4 MiB for 512 bytes; of a 1,000-vector
    # over 100,000 trips, 800 MB); its rows are now read where they lie,
    # as are a column slice's of a C-order table
    m = dsl.loads(SCAN, "scan.grad")
    rng = np.random.default_rng(2)
    row, h = rng.normal(size=64), rng.normal(size=64)
    table = rng.normal(size=(50, 80))
    for xs in (np.broadcast_to(row, (8192, 64)), table[:, 7:71], table[::2, 16:]):
        want = h
        for x in xs:
            want = np.tanh(want * 0.5 + x)
        m.scan(xs[:2], h)  # (compiled)
        tracemalloc.start()
        try:
            got = m.scan(xs, h)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 64 * 1024, peak
        np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)
        assert got.tobytes() == m.scan(np.ascontiguousarray(xs), h).tobytes()


def test_a_compiled_loop_reads_a_broadcast_stack_where_it_lies(monkeypatch):
    # a loop's compiled form took its stacked inputs as a C-order copy: a
    # broadcast of a row to every trip was copied whole (4096 x 16 here:
    # 512 KiB for 128 bytes); its rows are now read where they lie
    m = dsl.loads(LOOPS, "layouts.grad")
    rng = np.random.default_rng(3)
    row, h, w = rng.normal(size=16), rng.normal(size=16), rng.normal(size=(16, 16)) / 4
    xs = np.broadcast_to(row, (4096, 16))
    want = m.plain(np.ascontiguousarray(xs), h, w)  # (in the driver: not hot yet)
    monkeypatch.setattr(cpu, "LOOP_COMPILE_TRIPS", 0)
    monkeypatch.setattr(cpu, "stack_read", lambda *a: pytest.fail("a trip ran in the driver"))
    m.plain(xs[:2], h, w)
    tracemalloc.start()
    try:
        got = m.plain(xs, h, w)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.tobytes() == want.tobytes()
    assert peak < 64 * 1024, peak
