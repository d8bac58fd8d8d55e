"""Reductions on the CPU: a sum fused with its producer vectorizes (its
adds, and only they, may be reordered: `cpu_math.accumulate`), and every
reduction (sum, mean, max, min; fused or not; with axis and keepdims; f32
and f64; sizes that are not a multiple of a vector's width) agrees with
NumPy, max and min propagating NaN.  A sum's result is the same on every
run."""
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from dsl.cli import main

SOURCE = """
def total(x):
    return sum(x * 2.0)
def rows(x):
    return sum(x * x, axis=1)
def row_means(x):
    return mean(exp(x), axis=-1, keepdims=True)
def columns(x):
    return sum(x, axis=0)
def column_means(x):
    return mean(x, axis=0, keepdims=True)
def row_max(x):
    return max(x, axis=1)
def column_min(x):
    return min(x, axis=0, keepdims=True)
def largest(x):
    return max(x)
def smallest(x):
    return min(x * 1.0)
"""

NUMPY = {
    "total": lambda x: np.sum(x * 2.0),
    "rows": lambda x: np.sum(x * x, axis=1),
    "row_means": lambda x: np.mean(np.exp(x), axis=-1, keepdims=True),
    "columns": lambda x: np.sum(x, axis=0),
    "column_means": lambda x: np.mean(x, axis=0, keepdims=True),
    "row_max": lambda x: np.max(x, axis=1),
    "column_min": lambda x: np.min(x, axis=0, keepdims=True),
    "largest": np.max,
    "smallest": np.min,
}
SUMS = ("total", "rows", "row_means", "columns", "column_means")


@pytest.fixture(scope="module")
def module():
    return dsl.loads(SOURCE)


def _llvm(capsys, tmp_path, source: str) -> str:
    path = tmp_path / "reduce.grad"
    path.write_text(source)
    assert main(["show", str(path), "--emit", "llvm"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("dtype,body,lanes", [
    ("f64", "x * x", "double"),
    # The dense benchmark's: a bias broadcast along rows, softplus (vector
    # math) and a sum in one loop.
    ("f32", "maximum(x + b, 0) + log1p(exp(-abs(x + b)))", "float"),
])
def test_a_fused_sum_loop_is_vectorized(capsys, tmp_path, dtype, body, lanes):
    """Before `accumulate`, `acc += summand` was an ordered float sum, which
    LLVM may not vectorize: the whole loop, body included, ran one element
    at a time.  Now the sum's add is a vector of partial sums, and nothing
    but that add may be reordered.  Neither may the loop read an element at
    a time: the bias (`i % m` per element) kept the loop scalar, and a
    loop counting from a start it could not prove non-negative gathered."""
    llvm = _llvm(capsys, tmp_path, f"def f(x: {dtype}[r, c], b: {dtype}[c]):\n"
                 f"    return sum({body}, axis=1)\n")
    assert re.search(r"fadd reassoc <\d+ x double>", llvm), "the sum is not vectorized"
    assert re.search(rf"<\d+ x {lanes}>", llvm), "the summed body is not vectorized"
    assert "gather" not in llvm, "the loop gathers its elements one at a time"
    other_flags = re.findall(r"= (?:fadd|fsub|fmul|fdiv) (?:fast|nnan|ninf|nsz|arcp|afn)", llvm)
    assert other_flags == [], "only the sum's adds may carry fast-math flags"


def _expected(name: str, x: np.ndarray) -> np.ndarray:
    want = NUMPY[name](x.astype(np.float64))
    return np.asarray(want, dtype=x.dtype)


def _check(name: str, got, x: np.ndarray) -> None:
    want = _expected(name, x)
    got = np.asarray(got)
    assert got.shape == want.shape and got.dtype == want.dtype
    if name in SUMS:
        # Sums are reordered (and f32's rounded once, from f64): bound the
        # error by the same reduction of the terms' magnitudes.
        scale = np.asarray(NUMPY[name](np.abs(x.astype(np.float64))))
        eps = 1e-6 if x.dtype == np.float32 else 2e-14
        assert np.all(np.abs(got.astype(np.float64) - want) <= eps * scale), (got, want)
    else:
        np.testing.assert_array_equal(got, want)  # max and min are exact, NaN where NumPy's


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(sorted(NUMPY)), dtype=st.sampled_from([np.float32, np.float64]),
       rows=st.integers(1, 5), cols=st.integers(1, 70), seed=st.integers(0, 2**31),
       nans=st.integers(0, 2))
def test_reductions_match_numpy(module, name, dtype, rows, cols, seed, nans):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, cols)).astype(dtype)
    if name not in SUMS:
        x[rng.integers(0, rows, nans), rng.integers(0, cols, nans)] = np.nan
        x[0, -1] = rng.choice([np.inf, -np.inf, x[0, -1]])
    _check(name, getattr(module, name)(x), x)


@pytest.mark.parametrize("shape", [(9 * (1 << 12) + 5,), (3, 40_001)])
def test_large_fused_sums_count_every_element_once_and_repeat_exactly(module, shape,
                                                                     gradc_parallel):
    """Past the parallel threshold: the full sum in chunks of 2^12 (the last
    one short), and rows in parallel; run twice, bit for bit the same."""
    gradc_parallel("always")  # (a busy machine takes the serial kernels)
    x = np.random.default_rng(7).uniform(0.5, 1.5, size=shape)
    name = "total" if len(shape) == 1 else "rows"
    fn = getattr(module, name)
    got = fn(x)
    _check(name, got, x)
    np.testing.assert_array_equal(fn(x), got)


BROADCAST = """
def rows_of(x, b, c):
    return sum(exp(x * b) + c, axis=-1)
def scaled(x, b, c):
    return x * b + c
"""


@settings(max_examples=12, deadline=None)
@given(dtype=st.sampled_from([np.float32, np.float64]), rows=st.integers(1, 6),
       cols=st.integers(1, 40), seed=st.integers(0, 2**31))
def test_loops_over_broadcast_inputs_run_in_rows_and_match_numpy(dtype, rows, cols, seed):
    """b (cols,) repeats along each row, c (rows, 1) holds still along it:
    a loop over them runs in rows of `cols` elements (the serial, parallel
    and full-sum kernels), periods of 1 and sizes of every remainder."""
    module = _broadcast_module()
    rng = np.random.default_rng(seed)
    x, b = rng.normal(size=(rows, cols)).astype(dtype), rng.normal(size=cols).astype(dtype)
    c = rng.normal(size=(rows, 1)).astype(dtype)
    rtol = 1e-5 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(module.scaled(x, b, c), x * b + c, rtol=rtol)
    want = (np.exp(x.astype(np.float64) * b) + c).sum(axis=-1)
    np.testing.assert_allclose(module.rows_of(x, b, c), want, rtol=rtol * 10)


def test_large_loops_over_broadcast_inputs_match_numpy(gradc_parallel):
    gradc_parallel("always")  # (a busy machine takes the serial kernels)
    module = _broadcast_module()
    rng = np.random.default_rng(3)
    x, b, c = rng.normal(size=(70, 999)), rng.normal(size=999), rng.normal(size=(70, 1))
    np.testing.assert_allclose(module.scaled(x, b, c), x * b + c, rtol=1e-15)
    np.testing.assert_allclose(module.rows_of(x, b, c), (np.exp(x * b) + c).sum(axis=-1),
                               rtol=1e-13)
    whole = dsl.loads("def f(x, b):\n    return sum(x * b)\n").f
    np.testing.assert_allclose(whole(x, b), (x * b).sum(), rtol=1e-12)


_BROADCAST = []


def _broadcast_module():
    if not _BROADCAST:
        _BROADCAST.append(dsl.loads(BROADCAST))
    return _BROADCAST[0]


@pytest.mark.parametrize("kernel,vector_op", [
    ("_sum_rows", r"fadd reassoc <\d+ x double>"),
    ("_max_rows", r"@llvm\.maximum\.v\d+f64"),
])
def test_the_runtime_row_reductions_are_vectorized(kernel, vector_op):
    """`R.reduce_sum` and `R.reduce_max` over a row: an ordered float sum,
    and a maximum that stopped at the first NaN, each ran an element at a
    time."""
    import numba

    from gradlang.runtime import cpu
    cached = getattr(cpu, kernel)
    fresh = numba.jit(**cached.targetoptions)(cached.py_func)  # the cache keeps no IR
    fresh.compile("(float64[:, ::1], float64[::1])")
    (llvm,) = fresh.inspect_llvm().values()
    assert re.search(vector_op, llvm), f"{kernel}'s loop is not vectorized"


def test_rows_are_the_least_period_and_divide_every_other():
    """A bias longer than the summed axis (rows of 4 within periods of 12),
    an outer input over two axes, and a general broadcast read at i."""
    m = dsl.loads("def f(x, b, c, g):\n    return sum(x * b + c + g, axis=-1)\n"
                  "def h(x, b, c, g):\n    return x * b + c + g\n")
    rng = np.random.default_rng(5)
    x, b = rng.normal(size=(2, 3, 4)), rng.normal(size=(3, 4))
    c, g = rng.normal(size=(2, 1, 1)), rng.normal(size=(2, 1, 4))
    np.testing.assert_allclose(m.h(x, b, c, g), x * b + c + g, rtol=1e-15)
    np.testing.assert_allclose(m.f(x, b, c, g), (x * b + c + g).sum(axis=-1), rtol=1e-14)


def test_full_sum_of_an_argument_is_the_same_bits_whatever_the_threads(gradc_parallel):
    # the runtime's chunked sum (an argument summed whole, from 2^15
    # elements) split its row by the thread count, so the bits changed
    gradc_parallel("always")  # (a busy machine sums serially, on one thread)
    import numba
    m = dsl.loads("def f(x):\n    return sum(x)\n")
    x = np.random.default_rng(5).normal(size=1 << 17)
    results = []
    before = numba.get_num_threads()
    try:
        for threads in sorted({1, 2, numba.config.NUMBA_NUM_THREADS}):
            if threads <= numba.config.NUMBA_NUM_THREADS:
                numba.set_num_threads(threads)
                results.append(m.f(x))
    finally:
        numba.set_num_threads(before)
    assert len(results) >= 2 and all(r.tobytes() == results[0].tobytes() for r in results)
    np.testing.assert_allclose(results[0], np.sum(x), rtol=1e-12)


INITIAL = """
def f(x):
    return max(x, axis=1, initial=-0.5) + min(x, 1, False, initial=0.25) + sum(x, axis=1, initial=3)
def row_max(x):
    return max(x, axis=1)
"""


def test_initial_is_numpys_and_the_value_over_an_empty_axis():
    # a max over an empty axis was an ArgumentError with no place
    from dsl.function import _types
    from gradlang.compiler import pipeline
    from gradlang.compiler.interpret import interpret

    m = dsl.loads(INITIAL, "initial.grad")

    def reference(x):
        return (np.max(x, axis=1, initial=-0.5) + np.min(x, axis=1, initial=0.25)
                + np.sum(x, axis=1, initial=3))

    x = np.array([[0.1, -2.0, 0.7], [-1.0, -3.0, -0.75], [0.5, 0.5, 0.2]])
    for value in (x, np.zeros((3, 0)), np.zeros((0, 2))):  # one program: sizes symbolic
        np.testing.assert_array_equal(m.f(value), reference(value))
    ints = np.array([[4, -7], [0, 0]])  # (from the IR: no second program to compile)
    (value,) = interpret(pipeline.optimize(m.f.lower(_types(m.f.bind((ints,), {})))), ints)
    np.testing.assert_array_equal(value, reference(ints))
    fn = m.f.lower(_types(m.f.bind((x,), {})))
    (gradient,) = interpret(pipeline.optimize(pipeline.grad_of_sum(fn, [0], False)), x)
    # each max/min's gradient goes to the element it picks (shared at a tie),
    # none where initial wins
    np.testing.assert_array_equal(gradient, [[1, 2, 2], [1, 2, 1], [1.5, 1.5, 2]])
    with pytest.raises(dsl.ArgumentError) as info:
        m.row_max(np.zeros((3, 0)))
    err = info.value
    assert (err.file, err.line, err.col) == ("initial.grad", 5, 12)
    assert err.message == ("max/min over an empty axis (shape [3, 0], axes [1]); give it an "
                           "initial value (max(x, axis, initial=v)) for that axis")
    with pytest.raises(dsl.GradError, match="initial must be a number known at compile time"):
        dsl.loads("def f(x):\n    return max(x, initial=x)\n").f(x)


RUN_TIME_INITIAL = """
def f(x, k: int, s):
    return max(x, axis=1, initial=k * 0.5) + min(x, axis=1, initial=s) + sum(x, 1, initial=s * s)
def counts(b: bool[n], k: int):
    return max(b, initial=k + 1), min(b, initial=k - 1), sum(b, initial=k * 3)
def small(y: i32[n], k: i32):
    return max(y, initial=k * 2), min(y, initial=k)
def wide(y: i32[n], k: int):
    return max(y, initial=k * 2)
"""


def test_initial_computed_at_run_time_is_numpys_with_its_gradient():
    # catches: initial had to be a compile-time number: `initial=k * 0.5`
    # of an integer argument k, or a float argument s, was "initial must be
    # a number known at compile time" (a bare k was compiled per value)
    m = dsl.loads(RUN_TIME_INITIAL, "initial.grad")
    x = np.array([[0.1, -2.0, 0.7], [-1.0, -3.0, -0.75], [0.5, 0.5, 0.2]])
    for value, k, s in ((x, 1, 0.25), (x, -3, -2.5), (np.zeros((2, 0)), 3, 0.5)):
        want = (np.max(value, axis=1, initial=k * 0.5) + np.min(value, axis=1, initial=s)
                + np.sum(value, axis=1, initial=s * s))
        np.testing.assert_allclose(m.f(value, k, s), want, rtol=1e-15)
    # initial takes row 1's max (k * 0.5 = 0.5) and row 2's min (s = 0.1):
    # the gradient to s is 1 from that min and 2 s from each sum; x's goes to
    # the elements picked and 1 to each from its sum
    x = np.array([[0.1, -2.0, 0.7], [-1.0, -3.0, -0.75], [0.6, 0.3, 0.2]])
    gx, gs = dsl.grad(m.f, wrt=(0, 2))(x, 1, 0.1)
    assert gs == 1 + 3 * 2 * 0.1
    np.testing.assert_array_equal(gx, [[1, 2, 2], [1, 2, 1], [2, 1, 1]])
    t = np.linspace(-1.0, 1.0, 9).reshape(3, 3)
    _, tangent = dsl.jvp(m.f, (x, 1, 0.1), (t, None, 0.5))
    np.testing.assert_allclose(tangent, (gx * t).sum(axis=1) + 0.5 * np.array([0.2, 0.2, 1.2]),
                               rtol=1e-15)
    for k in (2, -5):  # bools summed and compared as i64, as a literal initial is
        b = np.array([True, False])
        assert m.counts(b, k) == (max(1, k + 1), min(0, k - 1), 1 + 3 * k)
    y = np.array([3, -1], np.int32)
    top, least = m.small(y, np.int32(7))
    assert (top.dtype, least.dtype, top, least) == (np.int32, np.int32, 14, -1)
    # an i64 into an i32 reduction is no run-time cast (it could wrap):
    # compiled for k's value, which must fit
    assert m.wide(y, 4) == 8
    with pytest.raises(dsl.GradError, match="does not fit in i32"):
        m.wide(y, 2**31)


def test_a_sum_of_i32_is_i64_as_numpys_and_does_not_wrap_around():
    # a sum of i32 was i32: 70,000 values of 70,000 summed to 605032704
    # (cumsum's last element, already i64 as NumPy's, was 4900000000)
    m = dsl.loads("def f(k):\n    return sum(k), sum(k, axis=0, initial=1)\n")
    k = np.full((35000, 2), 70000, dtype=np.int32)
    total, columns = m.f(k)
    for got, want in ((total, np.sum(k)), (columns, np.sum(k, axis=0, initial=1))):
        assert got.dtype == want.dtype == np.int64
        np.testing.assert_array_equal(got, want)


def test_max_gradient_goes_to_the_nan_of_a_row_holding_one(module):
    # catches: the cotangent shared among the elements equal to the max,
    # none in a row holding NaN (its max is NaN): a gradient of 0 all along
    # it, silent where the loss is NaN; it goes to the NaNs, as PyTorch's,
    # and ties still share it
    x = np.array([[1.0, np.nan, 2.0], [3.0, 3.0, 1.0], [np.nan, 0.0, np.nan]])
    value, slope = dsl.value_and_grad(module.row_max)(x)
    np.testing.assert_array_equal(value, [np.nan, 3.0, np.nan])
    np.testing.assert_array_equal(slope, [[0, 1, 0], [0.5, 0.5, 0], [0.5, 0, 0.5]])


def test_a_max_with_initial_and_maximum_give_the_gradient_to_their_nan():
    # catches: maximum(a, b)'s derivative tested a > b and a == b, both
    # false at a NaN: maximum(NaN, 1) (NaN) gave both inputs 0, so
    # max(x, initial=0), maximum(reduce_max, 0), dropped the gradient of a
    # row holding NaN that max's rule gives its NaNs; forward mode too
    m = dsl.loads("""
def capped(x):
    return max(x, axis=1, initial=0)
def larger(a, b):
    return maximum(a, b)
""")
    x = np.array([[1.0, np.nan, 2.0], [np.nan, -1.0, np.nan], [-1.0, -2.0, 3.0]])
    np.testing.assert_array_equal(dsl.grad(m.capped)(x), [[0, 1, 0], [0.5, 0, 0.5], [0, 0, 1]])
    t = np.array([[1.0, 2.0, 4.0]] * 3)
    np.testing.assert_array_equal(dsl.jvp(m.capped, (x,), (t,))[1], [2.0, 2.5, 4.0])
    a, b = np.array([np.nan, 1.0, np.nan, 2.0]), np.array([1.0, np.nan, np.nan, 2.0])
    np.testing.assert_array_equal(dsl.grad(m.larger, wrt=(0, 1))(a, b),
                                  [[1, 0, 0.5, 0.5], [0, 1, 0.5, 0.5]])


@pytest.mark.parametrize("parallel", ["always", "never"])
def test_a_max_along_short_rows_runs_row_parallel_with_the_serial_bits(gradc_parallel, parallel):
    # (a max_pool2d's stacked windows: R.reduce_max over a last axis of 9,
    # its rows split among threads past the threshold) gives the serial
    # loop's bits in every row: NaN propagating, -0.0 against 0.0 as it picks
    from gradlang.runtime import cpu as R
    gradc_parallel(parallel)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(8, 16, 32, 9)).astype(np.float32)
    x[rng.random(x.shape) < 0.01] = np.nan
    x[0, 0, 0] = [-0.0, 0.0, -1, -2, -3, -4, -5, -6, -7]
    got = R.reduce_max(x, (3,))
    expected = np.empty(x.shape[:3], np.float32)
    R._max_rows(x.reshape(-1, 9), expected.reshape(-1))
    assert got.tobytes() == expected.tobytes()
    np.testing.assert_array_equal(got, np.max(x, axis=3))  # (NaN where a row holds one)
    assert np.isnan(got).sum() == np.isnan(x).any(axis=3).sum() > 0
