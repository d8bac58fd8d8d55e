"""A loop the driver runs trip by trip (its body holds a product) runs as
one compiled function once it is hot (`runtime.cpu.loop_is_hot`): the
same bits as the driver's trips, products small enough for it only."""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from gradlang.runtime import cpu
from helpers import central_difference

RNN = ("def rnn(xs: f64[t, d], h: f64[d], w: f64[d, d]):\n"
       "    for i in range(xs.shape[0]):\n"
       "        h = tanh(h @ w + xs[i])\n"
       "    return sum(h)\n")
# a 0-d carried value, a carried matrix (whose sizes no 1-d value gives),
# the loop's index read, a weight's transpose (an invariant step) and a
# `full`; its gradient's loop stacks the cotangents of xs
SCAN = ("def scan(xs, w):\n"
        "    acc = 0.0\n"
        "    v = w[0] * 0.0 + 1.0\n"
        "    m = w * 0.5\n"
        "    for i in range(xs.shape[0]):\n"
        "        v = tanh(v @ transpose(w) + xs[i] * i)\n"
        "        m = tanh(m @ w)\n"
        "        acc = acc + sum(v * v) * 0.5\n"
        "    return acc + sum(m)\n")


@pytest.fixture
def compile_from(monkeypatch):
    """Set the trips after which a loop runs compiled."""
    return lambda trips: monkeypatch.setattr(cpu, "LOOP_COMPILE_TRIPS", trips)


@pytest.fixture
def compiled_runs(monkeypatch) -> list:
    """What each compiled run of a loop returned since (None where it gave
    up and the driver ran the trips)."""
    ran, run = [], cpu.run_compiled
    monkeypatch.setattr(cpu, "run_compiled", lambda *a: ran.append(run(*a)) or ran[-1])
    return ran


@pytest.fixture
def driver_stacked(monkeypatch):
    """How many values drivers stacked since the last read (a trip stacks
    each of its loop's stacked values through `R.stack_write`; a compiled
    loop fills its stacks itself)."""
    count = [0]
    write = cpu.stack_write

    def counted(ys, t, y):
        count[0] += 1
        write(ys, t, y)
    monkeypatch.setattr(cpu, "stack_write", counted)

    def read() -> int:
        trips, count[0] = count[0], 0
        return trips
    return read


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_hot_loop_gives_the_driver_stacked_bits_and_the_gradient(compile_from, driver_stacked,
                                                                 dtype):
    m = dsl.loads(RNN.replace("f64", "f32" if dtype == np.float32 else "f64"), "rnn.grad")
    rng = np.random.default_rng(0)
    xs, h, w = (rng.normal(size=s).astype(dtype) for s in ((7, 5), (5,), (5, 5)))
    value_and_grad = dsl.value_and_grad(m.rnn, wrt=(0, 1, 2))
    compile_from(2 * len(xs))  # two calls in the driver, then compiled
    calls = [value_and_grad(xs, h, w) for _ in range(2)]
    # each call's forward loop stacks h and h @ w, its backward loop the cotangents of xs
    assert driver_stacked() == 2 * 3 * len(xs)
    calls += [value_and_grad(xs, h, w) for _ in range(2)]
    assert driver_stacked() == 0
    for value, grads in calls[1:]:
        assert value.tobytes() == calls[0][0].tobytes()
        assert all(g.tobytes() == g0.tobytes() for g, g0 in zip(grads, calls[0][1]))
    if dtype == np.float64:
        for k, g in enumerate(calls[-1][1]):
            args = [xs, h, w]
            np.testing.assert_allclose(g, central_difference(m.rnn, args, k),
                                       rtol=1e-7, atol=1e-9)


@settings(max_examples=6, deadline=None)
@given(trips=st.integers(0, 6), seed=st.integers(0, 2**16))
def test_a_compiled_loop_with_a_scalar_and_the_index_is_the_driver_s(trips, seed):
    m = dsl.loads(SCAN, "scan.grad")
    rng = np.random.default_rng(seed)
    xs, w = rng.normal(size=(trips, 3)), rng.normal(size=(3, 3))
    grad = dsl.value_and_grad(m.scan, wrt=(0, 1))
    saved, write, stacked = cpu.LOOP_COMPILE_TRIPS, cpu.stack_write, []
    try:  # (hypothesis takes no function-scoped fixture)
        cpu.stack_write = lambda ys, t, y: (stacked.append(t), write(ys, t, y))
        cpu.LOOP_COMPILE_TRIPS = 10**12
        driver = grad(xs, w)
        in_driver = len(stacked)  # a loop's trips stack values
        assert in_driver >= 2 * trips
        cpu.LOOP_COMPILE_TRIPS = 0
        compiled = grad(xs, w)
        assert len(stacked) == in_driver  # no more: both loops ran compiled
    finally:
        cpu.LOOP_COMPILE_TRIPS, cpu.stack_write = saved, write
    assert compiled[0].tobytes() == driver[0].tobytes()
    assert all(a.tobytes() == b.tobytes() for a, b in zip(compiled[1], driver[1]))
    v, acc, mat = np.ones(3), 0.0, w * 0.5  # and a reference: the loop in NumPy
    for i in range(trips):
        v = np.tanh(v @ w.T + xs[i] * i)
        mat = np.tanh(mat @ w)
        acc = acc + np.sum(v * v) * 0.5
    # (within the rounding of its terms: the sum of mat's may nearly cancel,
    # 1.7e-13 relative at trips=2, seed=0, though every bit is the driver's)
    np.testing.assert_allclose(compiled[0], acc + np.sum(mat), rtol=1e-13,
                               atol=1e-14 * (acc + np.sum(np.abs(mat))))


RANK_ONE = ("def product_first(xs, ys, acc):\n"
            "    for i in range(xs.shape[0]):\n"
            "        acc = reshape(xs[i], [9, 1]) @ reshape(ys[i], [1, 8]) + acc\n"
            "    return acc\n"
            "def sum_first(xs, ys, acc):\n"
            "    for i in range(xs.shape[0]):\n"
            "        acc = acc + reshape(xs[i], [9, 1]) @ reshape(ys[i], [1, 8])\n"
            "    return acc\n")


@settings(max_examples=4, deadline=None)
@given(trips=st.integers(0, 5), seed=st.integers(0, 2**16),
       dtype=st.sampled_from([np.float64, np.float32]))
def test_a_rank_one_update_adds_into_the_running_sum_with_the_trips_bits(trips, seed, dtype):
    # an RNN's weight gradient: the running sum plus a column times a row,
    # added in place by the compiled loop (`cpu_math.add_outer`), either
    # operand first
    m = dsl.loads(RANK_ONE, "rank_one.grad")
    rng = np.random.default_rng(seed)
    xs, ys, acc = (rng.normal(size=s).astype(dtype) for s in ((trips, 9), (trips, 8), (9, 8)))
    before = acc.copy()
    want = before.astype(np.float64) + np.einsum("ti,tj->ij", xs, ys)
    for f in (m.product_first, m.sum_first):
        driver, compiled, in_driver = driver_and_compiled(f, xs, ys, acc)
        assert in_driver == 0 and compiled.tobytes() == driver.tobytes()
        np.testing.assert_array_equal(acc, before)  # (the caller's: added into a copy)
        np.testing.assert_allclose(compiled, want, rtol=1e-5 if dtype == np.float32 else 1e-13,
                                   atol=1e-5 if dtype == np.float32 else 1e-13)
        program = f.program(f.bind((xs, ys, acc), {}))
        (loop,) = [text for name, text in program.generated.kernels if name.startswith("l_")]
        assert "add_outer(" in loop and "matrix_product(" not in loop, loop


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_rank_one_update_keeps_the_first_operand_s_nan_as_the_trips_do(dtype):
    # where both the running sum and the product are NaNs, the fused add's
    # first operand's payload is the sum's, in either order (the CPU gives
    # the first's; the compiler may swap a commutative add's operands)
    m = dsl.loads(RANK_ONE, "rank_one.grad")
    bits = np.uint64 if dtype == np.float64 else np.uint32
    quiet = bits(0x7FF8 << 48) if dtype == np.float64 else bits(0x7FC0 << 16)
    xs, ys, acc = np.ones((2, 9), dtype), np.ones((2, 8), dtype), np.ones((9, 8), dtype)
    xs[0, :3] = (quiet | bits(1)).view(dtype)  # a product's NaN: the column's
    acc[:3, :4] = (quiet | bits(2) | ~(~bits(0) >> bits(1))).view(dtype)  # a negative one
    acc[3, 0] = (quiet | bits(3)).view(dtype)  # the sum's alone
    for f in (m.product_first, m.sum_first):
        driver, compiled, in_driver = driver_and_compiled(f, xs, ys, acc)
        assert in_driver == 0
        assert compiled.view(bits).tolist() == driver.view(bits).tolist(), f.__name__
    assert driver.view(bits)[0, 0] == acc.view(bits)[0, 0]  # (the sum's, first)


def test_a_product_too_large_for_a_compiled_loop_stays_with_blas(compile_from, driver_stacked):
    m = dsl.loads(RNN, "rnn.grad")
    rng = np.random.default_rng(1)
    # a d-vector times a d x d matrix: more than the steps of a trip (fewer
    # than 16) are worth in the driver (`cpu.products_fit`)
    d = int(np.sqrt(16 * cpu.STEP_WORTH)) + 1
    xs, h, w = rng.normal(size=(3, d)), rng.normal(size=d), rng.normal(size=(d, d)) / d
    compile_from(0)
    dxs, dw = dsl.grad(m.rnn, wrt=(0, 2))(xs, h, w)
    assert driver_stacked() == 3 * len(xs)  # (h and h @ w, then the cotangents of xs)
    hs = [h]  # the gradient by hand
    for x in xs:
        hs.append(np.tanh(hs[-1] @ w + x))
    g, want_dw, want_dxs = np.ones(d), np.zeros((d, d)), np.zeros_like(xs)
    for i in reversed(range(len(xs))):
        want_dxs[i] = g * (1 - hs[i + 1] ** 2)
        want_dw += np.outer(hs[i], want_dxs[i])
        g = want_dxs[i] @ w.T
    np.testing.assert_allclose(dxs, want_dxs, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(dw, want_dw, rtol=1e-12, atol=1e-15)


BATCHED_RNN = ("def rnn(xs: f64[t, b, d], h: f64[b, d], w: f64[d, d]):\n"
               "    for i in range(xs.shape[0]):\n"
               "        h = tanh(h @ w + xs[i])\n"
               "    return sum(h)\n")


@pytest.mark.parametrize("source, shape, compiled", [
    (RNN, (80,), True),  # 6,400 multiply-adds along rows of 80
    # 8,192 along rows of 32: BLAS's is faster, by less than a driver's step
    # costs (as at an LSTM's backward trip: the gates' cotangents, 4n wide,
    # times the weights' transpose, rows of n)
    (BATCHED_RNN, (8, 32), True),
    (BATCHED_RNN, (2, 64), True),  # 8,192 along rows of 64
    (BATCHED_RNN, (8, 256), False)])  # 524,288: more than its few steps are worth
def test_a_wider_product_runs_compiled_where_its_rows_are_long(compile_from, driver_stacked,
                                                               source, shape, compiled):
    m = dsl.loads(source, "rnn.grad")
    rng = np.random.default_rng(4)
    d = shape[-1]
    xs, h, w = rng.normal(size=(3,) + shape), rng.normal(size=shape), rng.normal(size=(d, d)) / d
    value_and_grad = dsl.value_and_grad(m.rnn, wrt=(0, 1, 2))
    compile_from(10 ** 9)
    in_driver = value_and_grad(xs, h, w)
    assert driver_stacked() == 3 * len(xs)
    compile_from(0)
    assert_same(value_and_grad(xs, h, w), in_driver)
    assert driver_stacked() == (0 if compiled else 3 * len(xs))
    hs = [h]  # the value by hand
    for x in xs:
        hs.append(np.tanh(hs[-1] @ w + x))
    np.testing.assert_allclose(in_driver[0], np.sum(hs[-1]), rtol=1e-12)


def test_the_driver_transposes_an_invariant_once_not_every_trip(compile_from, driver_stacked,
                                                                monkeypatch):
    # the backward trip's d @ w^T reads w^T flat: a copy of the transposed view
    # (of 256 x 256: 75 us a trip, 5x the trip's other work); the transpose
    # reads only w, so it runs before the loop (`compiler.hoisting`), whose
    # driver makes it C-contiguous once (`R.contiguous`)
    copies = [0]
    for name in ("flat", "contiguous"):
        def counted(x, helper=getattr(cpu, name)):
            copies[0] += not x.flags.c_contiguous
            return helper(x)
        monkeypatch.setattr(cpu, name, counted)
    m = dsl.loads(RNN, "rnn.grad")
    rng = np.random.default_rng(6)
    xs, h, w = rng.normal(size=(7, 5)), rng.normal(size=5), rng.normal(size=(5, 5)) / 5
    compile_from(10 ** 9)
    value, grads = dsl.value_and_grad(m.rnn, wrt=(0, 1, 2))(xs, h, w)
    assert driver_stacked() == 3 * len(xs)
    assert copies[0] == 1
    for k, g in enumerate(grads):
        np.testing.assert_allclose(g, central_difference(m.rnn, [xs, h, w], k), rtol=1e-7,
                                   atol=1e-9)


SLICED = ("def f(xs, h, w, x):\n"
          "    for i in range(xs.shape[0]):\n"
          "        h = tanh(h @ w + transpose(x)[1, 0:4] + xs[i])\n"
          "    return sum(h)\n"
          "\n"
          "def nested(xs, h, w, x):\n"
          "    for i in range(xs.shape[0]):\n"
          "        xt = transpose(x)\n"
          "        for j in range(2):\n"
          "            h = tanh(h @ w + xt[1, 0:4] + xs[i])\n"
          "    return sum(h)\n")


def test_the_driver_leaves_a_transposed_invariant_only_sliced_a_view(driver_stacked):
    # x's transpose is only sliced (in a nested loop's trips too): a view of
    # x each trip, not a copy of x whole (of this zero-stride x, 8 TiB);
    # their gradients' trips slice it too
    m = dsl.loads(SLICED, "sliced.grad")
    rng = np.random.default_rng(7)
    xs, h, w = rng.normal(size=(3, 4)), rng.normal(size=4), rng.normal(size=(4, 4)) / 4
    huge, small = np.broadcast_to(0.5, (2 ** 20, 2 ** 20)), np.full((4, 4), 0.5)
    for fn, repeat in ((m.f, 1), (m.nested, 2)):
        value, grads = dsl.value_and_grad(fn, wrt=(1, 2))(xs, h, w, huge)
        assert driver_stacked() > 0
        assert_same((value, grads), dsl.value_and_grad(fn, wrt=(1, 2))(xs, h, w, small))
        hs = h  # the value by hand
        for x in np.repeat(xs, repeat, axis=0):
            hs = np.tanh(hs @ w + 0.5 + x)
        np.testing.assert_allclose(value, np.sum(hs), rtol=1e-12)
    for k, g in zip((1, 2), dsl.grad(m.f, wrt=(1, 2))(xs, h, w, huge)):
        np.testing.assert_allclose(g, central_difference(m.f, [xs, h, w, huge], k), rtol=1e-7,
                                   atol=1e-9)


def test_a_loop_s_large_stacks_come_from_the_pool():
    # (a fresh mapping each call: its page faults in the trips that fill it)
    from gradlang.runtime import memory
    m = dsl.loads(RNN, "rnn.grad")
    rng = np.random.default_rng(7)
    steps, d = memory.POOL_MIN // 8 // 64, 64
    xs, h, w = rng.normal(size=(steps, d)), rng.normal(size=d), rng.normal(size=(d, d)) / d
    dxs = dsl.grad(m.rnn, wrt=0)(xs, h, w)  # the backward loop's stack of xs's cotangents
    base = dxs
    while base is not None and not isinstance(base, memory.Lease):
        base = base.base
    assert base is not None
    hs, g = [h], np.ones(d)  # by hand
    for x in xs:
        hs.append(np.tanh(hs[-1] @ w + x))
    for i in reversed(range(steps)):
        want = g * (1 - hs[i + 1] ** 2)
        np.testing.assert_allclose(dxs[i], want, rtol=1e-9, atol=1e-12)
        g = want @ w.T


def test_a_compiled_form_that_fails_is_warned_of_once_and_the_trips_run(compile_from,
                                                                        driver_stacked):
    m = dsl.loads(RNN, "rnn.grad")
    rng = np.random.default_rng(2)
    xs, h, w = rng.normal(size=(4, 3)), rng.normal(size=3), rng.normal(size=(3, 3))
    grad = dsl.value_and_grad(m.rnn, wrt=(0, 1, 2))  # (the first test's program)
    want = grad(xs, h, w)
    program = grad.program(grad.bind((xs, h, w), {}))
    names = [name for name, _ in program.generated.kernels if name.startswith("l_")]
    assert names

    def fails(*args):
        raise TypeError("a compiler bug")
    for name in names:
        setattr(program.kernels, name, fails)
    compile_from(0)
    driver_stacked()
    with pytest.warns(RuntimeWarning, match="compiled form failed .*a compiler bug"):
        assert_same(grad(xs, h, w), want)
    assert driver_stacked() == 3 * len(xs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # never tried again
        assert_same(grad(xs, h, w), want)


def assert_same(got, want) -> None:
    (value, grads), (want_value, want_grads) = got, want
    assert value.tobytes() == want_value.tobytes()
    assert all(g.tobytes() == w.tobytes() for g, w in zip(grads, want_grads))


def test_a_compiled_loop_runs_with_libm_s_math(compile_from, driver_stacked, monkeypatch):
    """With GRADC_LIBM=1 the kernels' `math` is Python's, which has no
    products: the compiled loop takes them from cpu_math by name (else
    its first call fails, and the loop falls back to its trips, warned)."""
    monkeypatch.setenv("GRADC_LIBM", "1")
    m = dsl.loads(RNN.replace("rnn", "rnn_libm"), "rnn_libm.grad")
    rng = np.random.default_rng(2)
    xs, h, w = rng.normal(size=(4, 3)), rng.normal(size=3), rng.normal(size=(3, 3))
    compile_from(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value, _ = dsl.value_and_grad(m.rnn_libm, wrt=(0, 1, 2))(xs, h, w)
    assert driver_stacked() == 0  # both loops ran compiled
    for x in xs:
        h = np.tanh(h @ w + x)
    np.testing.assert_allclose(value, np.sum(h), rtol=1e-13)


def test_a_compiled_loop_runs_a_trip_count_known_at_run_time_zero_times(compile_from,
                                                                       driver_stacked):
    # its stacks (the carried values the gradient reads back) are empty
    m = dsl.loads("def f(h, w, n: int):\n    for i in range(n):\n"
                  "        h = tanh(h @ w)\n    return sum(h)\n", "trips.grad")
    rng = np.random.default_rng(3)
    h, w = rng.normal(size=3), rng.normal(size=(3, 3))
    compile_from(0)
    for n in (0, 3):
        value, (dh, dw) = dsl.value_and_grad(m.f, wrt=(0, 1))(h, w, n)
        assert driver_stacked() == 0
        states = [h]
        for _ in range(n):
            states.append(np.tanh(states[-1] @ w))
        np.testing.assert_allclose(value, np.sum(states[-1]), rtol=1e-14)
        if n == 0:
            np.testing.assert_array_equal(dh, np.ones(3))
            np.testing.assert_array_equal(dw, np.zeros((3, 3)))
        else:
            np.testing.assert_allclose(dh, central_difference(m.f, (h, w, n), 0), rtol=1e-7)


# gathers and scatter-adds: an embedding read by token (its gradient
# scatters into the table's, carried), a scatter into a carried value the
# caller gave, one into a carried value read again, one into a value
# every trip reads (made once, before the trips), one whose result is
# carried twice (as two values: the next trip adds into one of them), and
# one into a reshape of a value read again
GATHERS = ("def language_model(tokens, h, emb, w):\n"
           "    for i in range(tokens.shape[0]):\n"
           "        h = tanh(h @ w + emb[tokens[i]])\n"
           "    return sum(h)\n"
           "def accumulate(acc, idx, values):\n"
           "    for i in range(idx.shape[0]):\n"
           "        acc = scatter_add(acc, idx[i], values[i] * 2.0)\n"
           "    return acc\n"
           "def twice(acc, idx, values):\n"
           "    for i in range(idx.shape[0]):\n"
           "        acc = scatter_add(acc, idx[i], values[i]) + acc\n"
           "    return acc\n"
           "def lagging(acc, idx, values, w):\n"
           "    s = 0.0\n"
           "    other = acc * 1.0\n"
           "    for i in range(idx.shape[0]):\n"
           "        acc = scatter_add(acc, idx[i], values[i])\n"
           "        s = s + sum(other * w)\n"
           "        other = acc\n"
           "    return s\n"
           "def reshaped(x, idx, values):\n"
           "    s = 0.0\n"
           "    for i in range(idx.shape[0]):\n"
           "        a = x * i\n"
           "        c = scatter_add(reshape(a, [15]), idx[i], values[i])\n"
           "        s = s + sum(reshape(c, [5, 3]) * a)\n"
           "    return s\n"
           "def hoisted(w, idx, values):\n"
           "    s = 0.0\n"
           "    for i in range(idx.shape[0]):\n"
           "        s = s + sum(scatter_add(w * 2.0, idx[i], values[i]) * w)\n"
           "    return s\n")


def driver_and_compiled(f, *args) -> tuple:
    """f(*args) with its loops in the driver, then compiled, and how many
    trips the driver ran the second time."""
    saved, write, stacked = cpu.LOOP_COMPILE_TRIPS, cpu.stack_write, []
    try:  # (hypothesis takes no function-scoped fixture)
        cpu.stack_write = lambda ys, t, y: (stacked.append(t), write(ys, t, y))
        cpu.LOOP_COMPILE_TRIPS = 10**12
        driver = f(*args)
        in_driver = len(stacked)
        cpu.LOOP_COMPILE_TRIPS = 0
        compiled = f(*args)
        return driver, compiled, len(stacked) - in_driver
    finally:
        cpu.LOOP_COMPILE_TRIPS, cpu.stack_write = saved, write


def test_a_compiled_loop_copies_an_invariant_flat_unless_a_large_broadcast():
    # the compiled form reads its invariants flat: a copy of a broadcast
    # table of 2**33 rows (192 GiB) was an AllocationError where the
    # driver's trips read it as a view; a Fortran-order or small broadcast
    # table is still copied and run compiled
    m = dsl.loads(GATHERS, "gathers.grad")
    rng = np.random.default_rng(4)
    tokens, h, w = np.array([1, 0, -1, 1]), rng.normal(size=3), rng.normal(size=(3, 3)) / 2
    f = dsl.value_and_grad(m.language_model, wrt=(1, 3))
    row = rng.normal(size=3)
    want = f(tokens, h, np.tile(row, (2, 1)), w)
    for table, runs_compiled in ((np.broadcast_to(row, (2 ** 33, 3)), False),
                                 (np.broadcast_to(row, (8, 3)), True),
                                 (np.asfortranarray(np.tile(row, (40_000, 1))), True)):
        driver, compiled, trips = driver_and_compiled(f, tokens, h, table, w)
        assert (trips == 0) == runs_compiled
        assert_same(compiled, driver)
        assert_same(compiled, want)


@settings(max_examples=5, deadline=None)
@given(tokens=st.lists(st.integers(-5, 4), max_size=6).map(lambda t: np.array(t, np.int64)),
       seed=st.integers(0, 2**16))
def test_a_compiled_loop_gathers_and_scatters_as_the_driver_s_trips(tokens, seed):
    m = dsl.loads(GATHERS, "gathers.grad")
    rng = np.random.default_rng(seed)
    h, emb, w = rng.normal(size=3), rng.normal(size=(5, 3)), rng.normal(size=(3, 3)) * 0.5
    driver, compiled, trips = driver_and_compiled(
        dsl.value_and_grad(m.language_model, wrt=(1, 2, 3)), tokens, h, emb, w)
    assert trips == 0  # both loops ran compiled
    assert_same(compiled, driver)
    hs = [h]  # and by hand
    for t in tokens:
        hs.append(np.tanh(hs[-1] @ w + emb[t]))
    g, g_emb, g_w = np.ones(3), np.zeros_like(emb), np.zeros_like(w)
    for k in reversed(range(len(tokens))):
        d = g * (1 - hs[k + 1] ** 2)
        g_emb[tokens[k]] += d
        g_w += np.outer(hs[k], d)
        g = d @ w.T
    np.testing.assert_allclose(compiled[0], np.sum(hs[-1]), rtol=1e-13)
    for got, want in zip(compiled[1], (g, g_emb, g_w)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-13)
    # a scatter into the caller's array, carried: added into a copy
    acc, values = rng.normal(size=(5, 3)), rng.normal(size=(len(tokens), 3))
    before = acc.copy()
    driver, compiled, trips = driver_and_compiled(m.accumulate, acc, tokens, values)
    assert trips == 0 and compiled.tobytes() == driver.tobytes()
    want = before.copy()
    np.add.at(want, tokens, values * 2.0)
    np.testing.assert_array_equal(acc, before)
    np.testing.assert_allclose(compiled, want, rtol=1e-14)
    # a carried value read again after the scatter: added into a copy
    driver, compiled, trips = driver_and_compiled(m.twice, acc, tokens, values)
    assert trips == 0 and compiled.tobytes() == driver.tobytes()
    want = before.copy()
    for t, v in zip(tokens, values):
        want = 2 * want
        want[t] += v
    np.testing.assert_allclose(compiled, want, rtol=1e-13)
    w = rng.normal(size=(5, 3))
    driver, compiled, trips = driver_and_compiled(m.lagging, acc, tokens, values, w)
    assert trips == 0 and compiled.tobytes() == driver.tobytes()
    want, state = 0.0, before.copy()
    for t, v in zip(tokens, values):
        previous = state.copy()
        state[t] += v
        want += np.sum(previous * w)
    np.testing.assert_allclose(compiled, want, rtol=1e-13, atol=1e-13)
    flat_values = values[:, 0]
    driver, compiled, trips = driver_and_compiled(m.reshaped, acc, tokens * 3, flat_values)
    assert trips == 0 and compiled.tobytes() == driver.tobytes()
    want = 0.0
    for i, (t, v) in enumerate(zip(tokens * 3, flat_values)):
        scattered = (acc * i).reshape(15)
        scattered[t] += v
        want += np.sum(scattered.reshape(5, 3) * acc * i)
    np.testing.assert_allclose(compiled, want, rtol=1e-13, atol=1e-13)
    driver, compiled, trips = driver_and_compiled(m.hoisted, acc, tokens, values)
    assert trips == 0 and compiled.tobytes() == driver.tobytes()
    want = 0.0
    for t, v in zip(tokens, values):
        scattered = 2.0 * acc
        scattered[t] += v
        want += np.sum(scattered * acc)
    np.testing.assert_allclose(compiled, want, rtol=1e-13, atol=1e-13)


def test_a_compiled_loop_leaves_an_index_out_of_range_to_the_trips(compile_from, driver_stacked):
    # The compiled form gives up and the driver's trips report the index;
    # no warning that the compiled form failed, and the next call runs it.
    m = dsl.loads(GATHERS, "gathers.grad")
    rng = np.random.default_rng(4)
    h, emb, w = rng.normal(size=3), rng.normal(size=(5, 3)), rng.normal(size=(3, 3))
    grad = dsl.grad(m.language_model, wrt=(1, 2, 3))
    compile_from(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for bad in (5, -6):
            with pytest.raises(dsl.ArgumentError, match=f"index {bad} is out of range"):
                grad(np.array([0, 1, bad, 2]), h, emb, w)
        driver_stacked()
        grad(np.array([0, 1, 4, 2]), h, emb, w)
    assert driver_stacked() == 0


def test_a_carried_value_made_before_the_trips_is_no_later_trip_s_to_add_into():
    # `b = zeros_like(a)` reads nothing the trips change: the compiled form
    # makes it once, before them.  Carried, it is the next trip's to add
    # into in place, so each trip carries a copy (it carried the one
    # array, which every trip's scatter then added into).
    m = dsl.loads("def reset(a, idx, values):\n"
                  "    b = zeros_like(a)\n"
                  "    s = a * 0.0\n"
                  "    for i in range(idx.shape[0]):\n"
                  "        s = s + scatter_add(b, idx[i], values[i])\n"
                  "        b = zeros_like(a)\n"
                  "    return s\n", "reset.grad")
    rng = np.random.default_rng(5)
    a, idx, values = rng.normal(size=(4, 3)), np.array([0, 1, 2, 1, -1]), rng.normal(size=(5, 3))
    driver, compiled, _ = driver_and_compiled(m.reset, a, idx, values)  # (no stacks)
    assert compiled.tobytes() == driver.tobytes()
    want = np.zeros_like(a)
    np.add.at(want, idx, values)
    np.testing.assert_array_equal(compiled, want)



def test_programs_whose_loops_run_one_kernel_compile_it_once(monkeypatch):
    # A loop's compiled form is a module holding the text of each kernel
    # its trips run (to stand alone), and a program's kernels are one
    # namespace of its modules: the function's program and its gradient's,
    # each with a loop module of its own, each compiled the body's kernel
    # again, and ran their own.
    from numba.core import compiler
    compiled: list[tuple[str, str]] = []
    compile_extra = compiler.compile_extra

    def recording(typingctx, targetctx, func, args, *rest, **kwargs):
        compiled.append((func.__qualname__, str(args)))
        return compile_extra(typingctx, targetctx, func, args, *rest, **kwargs)
    monkeypatch.setattr(compiler, "compile_extra", recording)
    # a constant of this test's: kernels no cache holds
    c = 1.0 + np.random.default_rng().uniform()
    m = dsl.loads(RNN.replace("h @ w", f"h @ w * {c!r}"), "rnn.grad")
    rng = np.random.default_rng(0)
    xs, h, w = rng.normal(size=(6, 4)), rng.normal(size=4), rng.normal(size=(4, 4)) / 2
    value = m.rnn(xs, h, w)
    first = len(compiled)
    value_and_grad = dsl.value_and_grad(m.rnn, wrt=(0, 1, 2))
    driver, hot, trips = driver_and_compiled(value_and_grad, xs, h, w)
    assert trips == 0  # (the second call ran compiled)
    assert first and len(compiled) > first
    assert len(set(compiled)) == len(compiled), sorted(compiled)
    np.testing.assert_allclose(driver[0], value, rtol=1e-13)
    assert hot[0].tobytes() == driver[0].tobytes()
    assert all(g.tobytes() == g0.tobytes() for g, g0 in zip(hot[1], driver[1]))


def test_a_full_sum_s_kernels_are_one_in_every_module_defining_them():
    # A loop's compiled form holds the text of each kernel its trips run,
    # a full sum's among them, whose `_all` variants call its `_chunk`:
    # the function's and its gradient's loop modules each compiled the
    # sum's `_all_serial` and `_chunk` again.  A module reading libm's
    # `math` (GRADC_LIBM=1) defines kernels of its own.
    import secrets
    from gradlang.runtime import loader
    kname = "k_" + secrets.token_hex(8)  # a kernel no cache holds
    kernel = cpu.TARGET.render_reducing_loop(kname, ["in0", "out0"], [],
                                             ["v0 = math.exp(in0[i]) * 0.5"], ["v0"], ["out0"])
    header = cpu.TARGET.header
    own = loader.load_kernels(f"{header}\n\n{kernel}")
    loop = loader.load_kernels(f"{header}\n\n{kernel}\n\ndef l_{kname}():\n    pass\n")
    libm = loader.load_kernels(f"import math\n{header[header.index(chr(10)) + 1:]}\n\n{kernel}")
    assert libm.math is not own.math
    for variant in ("", "_serial", "_chunk", "_all", "_all_serial"):
        assert getattr(loop, kname + variant) is getattr(own, kname + variant), variant
        assert getattr(libm, kname + variant) is not getattr(own, kname + variant), variant
    x = np.random.default_rng(0).normal(size=10_000)
    sums = []
    for module in (own, loop):
        out = np.empty(1)
        getattr(module, kname + "_all_serial")(x.size, 1, x, out)
        sums.append(out)
    np.testing.assert_allclose(sums[0][0], np.exp(x).sum() * 0.5, rtol=1e-13)
    assert sums[1].tobytes() == sums[0].tobytes()


# a language model's step: its log-softmax over the vocabulary is a max
# (`reduce_max`) and a row loop, and a mean's divisor a size (`dim`),
# which had no compiled form, so the loop ran trip by trip however hot
# (scratch: 200 tokens of a vocabulary of 1,000, d = 64, value and
# gradient 168 ms at best, 43 ms compiled)
LM = ("from std import log_softmax\n"
      "def lm(emb, w, tokens: i64[t]):\n"
      "    h = zeros_like(emb[0])\n"
      "    total = 0.0\n"
      "    for i in range(tokens.shape[0] - 1):\n"
      "        h = tanh(emb[tokens[i]] + h @ w)\n"
      "        h = h - mean(h)\n"
      "        total = total - log_softmax(h @ transpose(emb))[tokens[i + 1]]\n"
      "    return total\n")


def test_a_hot_loop_with_a_log_softmax_runs_compiled_with_the_driver_s_bits(compiled_runs):
    m = dsl.loads(LM, "lm.grad")
    rng = np.random.default_rng(3)
    emb, w, tokens = rng.normal(size=(5, 3)), rng.normal(size=(3, 3)), np.array([1, 4, 0, 4, 2])
    driver, compiled, _ = driver_and_compiled(m.lm, emb, w, tokens)
    ran = compiled_runs
    assert len(ran) == 1 and ran[0] is not None  # the loop ran compiled
    assert compiled.tobytes() == driver.tobytes()
    h, total = np.zeros(3), 0.0  # and the loop in NumPy
    for i in range(len(tokens) - 1):
        h = np.tanh(emb[tokens[i]] + h @ w)
        h = h - np.mean(h)
        z = h @ emb.T
        total -= z[tokens[i + 1]] - z.max() - np.log(np.sum(np.exp(z - z.max())))
    np.testing.assert_allclose(compiled, total, rtol=1e-13)


def test_a_hot_loop_summing_over_a_batch_s_rows_runs_compiled_with_the_driver_s_bits(
        compiled_runs):
    # a sum over a leading axis (a bias's gradient over a batch's rows, here
    # in the forward pass) had no compiled form: a batched RNN's backward
    # loop ran trip by trip however hot (scratch: T = 50, B = 8, d = 16,
    # value and gradient 1.12 ms -> 0.27 ms)
    m = dsl.loads("def f(xs, w):\n"
                  "    h = xs[0]\n"
                  "    acc = xs[0, 0] * 0.0\n"
                  "    for i in range(xs.shape[0]):\n"
                  "        h = tanh(h @ w + xs[i])\n"
                  "        acc = acc + sum(h, axis=0) * 0.5\n"
                  "    return acc\n", "batch_sum.grad")
    rng = np.random.default_rng(4)
    xs = rng.normal(size=(4, 5, 3)) * 10.0 ** rng.integers(-3, 4, (4, 5, 3))
    w = rng.normal(size=(3, 3))
    driver, compiled, _ = driver_and_compiled(m.f, xs, w)
    ran = compiled_runs
    assert len(ran) == 1 and ran[0] is not None  # the loop ran compiled
    assert compiled.tobytes() == driver.tobytes()
    h, acc = xs[0], np.zeros(3)
    for i in range(len(xs)):
        h = np.tanh(h @ w + xs[i])
        acc = acc + np.sum(h, axis=0) * 0.5
    np.testing.assert_allclose(compiled, acc, rtol=1e-12)
    # a sum of -0.0s is 0.0 in NumPy's add.reduce (it adds to 0.0, not to
    # the first row), so acc = -0.0 + 0.0 * 0.5 is 0.0 each trip: the
    # compiled form started at the first row and kept -0.0 (h is -0.0 too,
    # a product of -0.0s and positive weights)
    zeros = -np.zeros_like(xs)
    driver, compiled, _ = driver_and_compiled(m.f, zeros, np.abs(w))
    assert len(ran) == 2 and ran[1] is not None
    assert compiled.tobytes() == driver.tobytes() == np.zeros(3).tobytes()


def test_a_hot_loop_slicing_gates_runs_compiled_with_the_driver_s_bits(compiled_runs):
    # an LSTM's gates are slices of one product: `slice` (and its VJPs
    # `embed`, `embed_add`) had no compiled form, so its loops ran trip by trip
    m = dsl.loads("def f(xs, w):\n"
                  "    h = xs[0, :, :2]\n"
                  "    for i in range(xs.shape[0]):\n"
                  "        z = h @ w + xs[i]\n"
                  "        h = sigmoid(z[:, 1::2]) * tanh(z[:, ::2])\n"
                  "    return sum(h[1:] * h[1:])\n", "gates.grad")
    rng = np.random.default_rng(5)
    xs, w = rng.normal(size=(3, 2, 4)), rng.normal(size=(2, 4))
    driver, compiled, _ = driver_and_compiled(dsl.value_and_grad(m.f, wrt=(0, 1)), xs, w)
    ran = compiled_runs
    assert ran and None not in ran  # the loops in the driver (the backward's) ran compiled
    assert compiled[0].tobytes() == driver[0].tobytes()
    assert all(a.tobytes() == b.tobytes() for a, b in zip(compiled[1], driver[1]))
    for k, g in enumerate(compiled[1]):
        np.testing.assert_allclose(g, central_difference(m.f, [xs, w], k), rtol=1e-7, atol=1e-9)


# a batch's cross-entropy picks each row's target (`take_along_axis`, whose
# VJP is `scatter_add_along_axis`), which had no compiled form: a batched
# language model's loops ran trip by trip however hot (scratch: 200 steps,
# a batch of 8, d = 32, 100 classes, log_softmax and all: 7.3 ms, 3.6
# compiled; JAX 2.2).  Here a pick alone, for few kernels to compile.
PICKS = ("def picks(xs, w, targets):\n"
         "    total = 0.0\n"
         "    h = xs[0] * 0.0\n"
         "    for i in range(xs.shape[0]):\n"
         "        h = tanh(h * w + xs[i])\n"
         "        total = total + sum(take_along_axis(h, targets[i][:, None], axis=1) ** 2)\n"
         "    return total\n")


def numpy_picks(xs, w, targets):
    h, total = np.zeros_like(xs[0]), 0.0
    for x, target in zip(xs, targets):
        h = np.tanh(h * w + x)
        total += np.sum(h[np.arange(len(h)), target] ** 2)
    return total


def test_a_batch_s_picks_run_compiled_with_the_driver_s_bits(compiled_runs, compile_from):
    m = dsl.loads(PICKS, "picks.grad")
    rng = np.random.default_rng(7)
    xs, w, targets = rng.normal(size=(3, 2, 4)), rng.normal(size=(2, 4)), np.array(
        [[0, 3], [-1, 1], [2, 2]])
    value_and_grad = dsl.value_and_grad(m.picks, wrt=(0, 1))
    driver, compiled, _ = driver_and_compiled(value_and_grad, xs, w, targets)
    ran = compiled_runs
    assert len(ran) == 2 and None not in ran  # the forward's loop and the backward's
    assert_same(compiled, driver)
    np.testing.assert_allclose(compiled[0], numpy_picks(xs, w, targets), rtol=1e-13)
    for k, g in enumerate(compiled[1]):
        np.testing.assert_allclose(g, central_difference(numpy_picks, [xs, w, targets], k),
                                   rtol=1e-6, atol=1e-8)
    # an index out of range: the compiled form gives up, the trips report it
    targets[1, 0] = 4
    compile_from(0)
    with pytest.raises(dsl.ArgumentError, match="index 4 is out of range"):
        value_and_grad(xs, w, targets)
    assert len(ran) == 3 and ran[-1] is None
