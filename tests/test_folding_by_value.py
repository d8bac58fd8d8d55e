"""Integer arithmetic on an integer argument taken by value (compiled for
its value because a shape, an axis or a count uses it) folds at compile
time, and must give what the program gives where the argument is passed
as a run-time scalar: NumPy's wraparound in the argument's dtype, 0 for
an integer `//` or `%` by 0, an integer to a negative power rounded
toward zero (docs/language.md), the kernels' inf and NaN for floats, and
the argument's dtype.  It gave Python's instead: `2 ** -k` was 0.25 for
k = 2, `1 // k` a GradError for k = 0, `-k` of the least i64 an error."""
import operator
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
import dsl.function

# `len((0,) * (k - k))` is 0 and repeats a tuple k - k times: a count, so
# the function is compiled for k's value, which then folds what follows.
FORCED = "    n = len((0,) * (k - k))\n"
DTYPES = {"i64": np.int64, "i32": np.int32}


def _wrap(value: int, dtype) -> int:
    """value wrapped around to `dtype`, as NumPy's integer arithmetic does."""
    bits = np.iinfo(dtype).bits
    return (value + 2 ** (bits - 1)) % 2 ** bits - 2 ** (bits - 1)


class LiteralNegativePower(Exception):
    """An integer to a negative literal power: an error at run time."""


def run_time(node, k: int, dtype) -> int:
    """The value of expression `node` (see `expressions`) at run time, by
    hand: integers of `dtype` that wrap around; `//` and `%` by 0 give 0
    (NumPy's); an integer to a negative power is 1, +-1 or 0."""
    if node[0] == "k":
        return k
    if node[0] == "lit":
        return node[1]
    if node[0] == "neg":
        return _wrap(-run_time(node[1], k, dtype), dtype)
    op, a, b = node[0], run_time(node[1], k, dtype), run_time(node[2], k, dtype)
    if op == "**" and node[2][0] == "lit" and b < 0:
        raise LiteralNegativePower
    if op in ("//", "%") and b == 0:
        return 0
    if op == "**":
        if b < 0:
            return 1 if a == 1 else (-1) ** (b & 1) if a == -1 else 0
        return _wrap(pow(a, b, 2 ** 64), dtype)
    exact = {"+": operator.add, "-": operator.sub, "*": operator.mul,
             "//": operator.floordiv, "%": operator.mod}[op](a, b)
    return _wrap(exact, dtype)  # (-2**63 // -1 wraps to -2**63)


def source(node) -> str:
    if node[0] == "k":
        return "k"
    if node[0] == "lit":
        return f"({node[1]})"
    if node[0] == "neg":
        return f"(-{source(node[1])})"
    return f"({source(node[1])} {node[0]} {source(node[2])})"


def _with_k(children):
    """Operations on subexpressions at least one of which reads k (an
    operation on literals alone folds as Python's, as documented)."""
    def reads_k(node):
        return node[0] == "k" or any(isinstance(c, tuple) and reads_k(c) for c in node[1:])
    ops = st.sampled_from(["+", "-", "*", "//", "%", "**"])
    return st.one_of(
        st.tuples(st.just("neg"), children).filter(reads_k),
        st.tuples(ops, children, children).filter(reads_k))


LITERALS = st.tuples(st.just("lit"), st.integers(-3, 3))
expressions = st.recursive(st.just(("k",)) | LITERALS, _with_k, max_leaves=5).filter(
    lambda node: node[0] != "lit")
EDGES = [0, 1, -1, 2, -2, 3, 2**31 - 1, -2**31, 2**62, 2**63 - 1, -2**63]


@settings(max_examples=40, deadline=None)
@given(expressions, st.sampled_from(EDGES) | st.integers(-2**63, 2**63 - 1),
       st.sampled_from(sorted(DTYPES)))
def test_integer_arithmetic_on_a_by_value_argument_folds_as_it_runs(node, k, dtype):
    np_dtype = DTYPES[dtype]
    k = _wrap(k, np_dtype)
    text = source(node)
    m = dsl.loads(f"def f(k: {dtype}):\n{FORCED}    return {text} + n\n", "folded.grad")
    try:
        want = run_time(node, k, np_dtype)
    except LiteralNegativePower:
        with pytest.raises(dsl.GradError, match="an integer to a negative power"):
            m.f(np_dtype(k))
        return
    got = m.f(np_dtype(k))
    assert got.dtype == np_dtype, (text, k, got.dtype)
    assert got == want, (text, k, got, want)


SCALARS = """\
def {name}(k: i64):
{forced}    return 2 ** -k, 1 // k, 7 % k, k * k * k, -k, k // -1, abs(k), 1 / k, \\
        k * 1e308 * 10.0, k // 0.0, k % 0.0, k == 9007199254740992.0
"""


def test_a_by_value_argument_gives_the_run_time_values_and_dtypes():
    # One program with k a run-time scalar, one compiled for k's value:
    # each result NumPy's for an i64 k (where NumPy raises for a negative
    # integer power, by hand, as the docs say).  The floats were
    # GradErrors by value ("division by zero", "beyond the range of f64"),
    # and k == 2.0**53 compared exactly, not in f64 (False for 2**53 + 1).
    m = dsl.loads(SCALARS.format(name="scalar", forced="")
                  + SCALARS.format(name="by_value", forced=FORCED), "scalars.grad")
    for k in (0, 2, -1, -2**63, 2**53 + 1):
        i, x = np.int64(k), np.float64(k)
        with np.errstate(all="ignore"):
            want = [2 ** -k if -2**63 < k <= 0 else 0, 0 if k == 0 else 1 // k,
                    0 if k == 0 else 7 % k, i * i * i, -i, -i, np.abs(i), 1 / x,
                    x * 1e308 * 10.0, x // 0.0, x % 0.0, x == 2.0**53]
        by_value, scalar = m.by_value(i), m.scalar(i)
        for index, (got, same, value) in enumerate(zip(by_value, scalar, want, strict=True)):
            value = np.asarray(value, bool if index == 11 else
                               np.float64 if index > 6 else np.int64)
            np.testing.assert_array_equal(got, value, err_msg=f"k = {k}, result {index}")
            np.testing.assert_array_equal(same, value, err_msg=f"k = {k}, result {index}")
            assert got.dtype == same.dtype == value.dtype, (k, index)


def test_a_by_value_argument_meets_arrays_as_the_run_time_scalar_does():
    # Against NumPy's values and dtypes for an i64 scalar k (a kernel's
    # for k passed as such, which other tests check; compiled here only by
    # value, as each program costs a compile).  i32 y with an i64 k is i64:
    # by value, k took y's dtype as a literal does, also through a layout
    # op or a weakly typed arange; y ** k for k = -1 was the error of a
    # negative literal power, where at run time it rounds toward zero; k /
    # 4 was a Python float, which took f32 x's dtype (f64 at run time).  A
    # float made of k stays a compile-time number (`full_like`'s fill);
    # k ** 0.5 was an error for k = -1 ("negative base"): it is the
    # kernel's pow, computed at run time, as it may differ from NumPy's by
    # an ulp.
    m = dsl.loads(f"def f(y: i32[2], x: f32[2], k: i64):\n{FORCED}    return y * k, y ** k, "
                  "y * stack([k, 1]), y * where(y > 0, k, 0), y * (arange(2) * k), x * (k / 4), "
                  "x * (k ** 0.5), full_like(x, k * 0.25)\n", "arrays.grad")
    y, x, k = np.array([3, -1], np.int32), np.array([1.0, -3.0], np.float32), np.int64(-1)
    want = [y * k, np.array([0, -1]), y * np.array([k, 1]), np.array([3 * k, 0]),
            y * (np.arange(2) * k), x * np.float64(k / 4), np.array([np.nan] * 2),
            np.full_like(x, k * 0.25)]
    for index, (got, value) in enumerate(zip(m.f(y, x, k), want, strict=True)):
        assert got.dtype == value.dtype, index
        np.testing.assert_array_equal(got, value, err_msg=f"result {index}")


def test_a_float_of_a_size_and_a_by_value_argument_compiles_once_for_every_size(monkeypatch):
    # `x.shape[0] / k` went past `Lowerer.size_number` (k's arithmetic is
    # the run time's, which raised the size's NeedsConcrete): the program
    # was lowered for concrete sizes, one build per size.  Computed at run
    # time, in f64 as k's arithmetic is (not weak: f64 with f32 x)
    built = []
    build_stored = dsl.function.build_stored
    monkeypatch.setattr(dsl.function, "build_stored",
                        lambda key, *a, **kw: (built.append(key), build_stored(key, *a, **kw))[1])
    m = dsl.loads(f"def f(x: f32[s], k: i64):\n{FORCED}"
                  "    return x * (x.shape[0] / k + k * 0.5 / x.shape[0]) + n\n", "sizes.grad")
    for size in (4, 5, 6):
        if size == 5:
            known = len(built)
        x = np.arange(size, dtype=np.float32)
        got = m.f(x, np.int64(3))
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, x.astype(np.float64) * (size / 3 + 1.5 / size),
                                   rtol=1e-15)
    assert len(built) == known, built


@pytest.mark.parametrize("expression", ["not k", "k and 3", "1 < 2 and k"])
def test_a_by_value_argument_is_no_bool_as_the_run_time_scalar_is_not(expression):
    # `not k` and `k and 3` folded as Python's by value (False, 3), where
    # with k a run-time i64 scalar they are an error: the same error, at
    # the same place, before any kernel is compiled.
    for forced in ("", FORCED):
        with pytest.raises(dsl.GradError, match=r"bool\.grad:\d+:\d+: .*expected a bool value, "
                                                 r"got i64"):
            dsl.loads(f"def f(y: i32[2], k: i64):\n{forced}    return y * ({expression})\n",
                      "bool.grad").f(np.array([3, -4], np.int32), np.int64(3))


def test_a_by_value_argument_is_no_if_condition_as_the_run_time_scalar_is_not():
    # `if k:` took the branch by value (Python's truth of 3), where with k
    # a run-time i64 scalar it is an error: the same error by value.
    for forced in ("", FORCED):
        with pytest.raises(dsl.GradError, match=r"if\.grad:\d+:8: .*an if condition must be "
                                                 r"known at compile time or be a scalar bool"):
            dsl.loads(f"def f(y: i32[2], k: i64):\n{forced}    r = y\n    if k:\n"
                      "        r = y * 2\n    return r\n", "if.grad").f(
                np.array([3, -4], np.int32), np.int64(3))


SIZE_TIMES_K = """
def {name}(x: f32[n], k: i32):
{forced}    return x * sqrt(x.shape[0] * k), x * (x.shape[0] * k * 0.5), x.shape[0] * k, \\
        x.shape[0] * k * x.shape[0]
"""


def test_a_size_times_a_by_value_argument_is_the_run_time_scalar_of_its_dtype():
    # `x.shape[0] * k` by value was a size (the program symbolic in n),
    # weakly typed: sqrt of it, and its product with 0.5, took f32 x's
    # dtype, and returned it was an i64, where with k an i32 scalar at run
    # time (or by value with concrete sizes) NumPy's rule gives f64 and i32.
    # The product wraps around in k's dtype, as at run time (2**31 - 1 times
    # 4 was NumPy's OverflowError, making the i32 scalar).
    m = dsl.loads(SIZE_TIMES_K.format(name="scalar", forced="")
                  + SIZE_TIMES_K.format(name="by_value", forced=FORCED), "sizes.grad")
    x = np.arange(1, 5, dtype=np.float32)
    for k in (np.int32(3), np.int32(2**31 - 1)):
        with np.errstate(over="ignore", invalid="ignore"):
            want = [x * np.sqrt(4 * k), x * (4 * k * 0.5), 4 * k, 4 * k * 4]
        for got, same, value in zip(m.by_value(x, k), m.scalar(x, k), want, strict=True):
            assert got.dtype == same.dtype == np.asarray(value).dtype
            np.testing.assert_array_equal(got, value)
            np.testing.assert_array_equal(same, value)


COMPARED = """
def {name}(y: i32[2], k: i64):
{forced}    return y * ((k == 1) + 1), where(y > 0, True, k < 0), maximum(k == 1, k > 5), \\
        -(k == 1), abs(k > 0) * y, (k == 1) and not (k < 0)
"""


def test_a_comparison_of_a_by_value_argument_is_the_run_time_bool_scalar():
    # `k == 1` by value was a Python bool, weakly typed: `(k == 1) + 1`
    # took i32 y's dtype, `where(y > 0, True, k < 0)` was i64, maximum of
    # two such bools a bool and -(k == 1) False, where with k a run-time
    # i64 scalar each is NumPy's for a bool scalar with arithmetic on i64
    # (docs/language.md): i64, bool, i64, i64; and an f64 parameter took
    # it as 1.0 where it refuses the bool scalar.
    m = dsl.loads(COMPARED.format(name="scalar", forced="")
                  + COMPARED.format(name="by_value", forced=FORCED)
                  + f"def takes(a: f64):\n    return a\n\ndef passes(k: i64):\n{FORCED}"
                  "    return takes(k == 1)\n", "compared.grad")
    y, k = np.array([3, -1], np.int32), np.int64(1)
    t = np.int64(True)
    want = [y * (t + 1), np.array([True, False]), t, -t, t * y, np.True_]
    for got, same, value in zip(m.by_value(y, k), m.scalar(y, k), want, strict=True):
        assert got.dtype == same.dtype == np.asarray(value).dtype
        np.testing.assert_array_equal(got, value)
        np.testing.assert_array_equal(same, value)
    with pytest.raises(dsl.GradError, match=r"compared.grad:\d+:\d+: error: argument 'a' of "
                                             r"takes\(\) has dtype bool; its annotation says f64"):
        m.passes(k)


def test_a_run_time_scalar_fills_full_like_as_a_by_value_number_does():
    # full_like(y, k) and full_like(x, k * 0.5) compiled by value, but
    # with k a run-time scalar they were an error ("full_like() needs a
    # compile-time fill value"); a run-time fill is converted to the
    # array's dtype, as NumPy's full_like converts it, and its gradient
    # is the sum of the fill's cotangent: d/da sum(full_like(x, a*a) * x)
    # is 2 a sum(x).
    fills = "    return full_like(y, k), full_like(x, k * 0.5), full_like(x, k == 2)\n"
    m = dsl.loads(f"def scalar(y: i32[2], x: f32[2], k: i64):\n{fills}"
                  f"def by_value(y: i32[2], x: f32[2], k: i64):\n{FORCED}{fills}"
                  "def f(x, a):\n    return sum(full_like(x, a * a) * x)\n", "fills.grad")
    y, x, k = np.array([3, -1], np.int32), np.array([1.0, -3.0], np.float32), np.int64(3)
    want = [np.full(2, 3, np.int32), np.full(2, 1.5, np.float32), np.zeros(2, np.float32)]
    for got, same, value in zip(m.by_value(y, x, k), m.scalar(y, x, k), want, strict=True):
        assert got.dtype == same.dtype == value.dtype
        np.testing.assert_array_equal(got, value)
        np.testing.assert_array_equal(same, value)
    x64 = np.array([1.0, 2.0, 3.0])
    gx, ga = dsl.grad(m.f, wrt=(0, 1))(x64, 3.0)
    np.testing.assert_array_equal(gx, [9.0, 9.0, 9.0])
    assert ga == 2 * 3.0 * 6.0


def test_an_integer_argument_as_a_reductions_initial_is_taken_by_value():
    # max(y, initial=k) compiled for k's value was taken, but with k a
    # run-time scalar it was an error ("initial must be a number known at
    # compile time"): the argument is now taken by value, as for a shape
    m = dsl.loads("def f(y: i32[2], k: i64):\n    return max(y, initial=k), sum(y, initial=k)\n",
                  "initial.grad")
    y = np.array([3, -1], np.int32)
    for k in (5, -2):
        top, total = m.f(y, np.int64(k))
        assert (top.dtype, total.dtype) == (np.int32, np.int64)
        assert (top, total) == (np.max(y, initial=k), np.sum(y, initial=k))


def test_an_integer_argument_an_i32_fill_or_initial_cannot_hold_is_an_error_naming_it():
    # catches: full_like(y, k) of an i32 y and an i64 k beyond i32 wrapped
    # around at run time (2**31 filled -2**31) where by value it was an
    # error and NumPy raises; and min(y, initial=-2**31), which fits,
    # was "does not fit in i32" (its reversed order, 2**31, was checked)
    m = dsl.loads("def f(y: i32[2], k: i64):\n"
                  "    return full_like(y, k), max(y, initial=k), min(y, initial=k)\n", "fit.grad")
    y = np.array([3, -1], np.int32)
    for k in (-2**31, 2**31 - 1):
        got = m.f(y, k)
        want = (np.full_like(y, k), np.max(y, initial=k), np.min(y, initial=k))
        for g, w in zip(got, want):
            assert g.dtype == np.int32
            np.testing.assert_array_equal(g, w)
    for k in (2**31, -2**31 - 1):
        with pytest.raises(dsl.ArgumentError) as info:
            m.f(y, k)
        assert info.value.message == f"the constant {k} does not fit in i32 (the value of " \
                                     "argument 'k')"
        assert (info.value.line, info.value.col) == (2, 12)


def test_a_bool_array_filled_or_a_bool_initial_at_run_time_is_numpys():
    # full_like(b, k) of a bool b raised tuple.index's ValueError (a
    # traceback) for a run-time scalar k, asking how far an integer's range
    # reaches in a bool; NumPy's fill is k != 0 (256 and 2**40 too, no
    # wraparound).  A bool initial (flag: bool) was "initial must be a
    # number known at compile time", where a bool converts to any dtype
    m = dsl.loads("def f(b: bool[3], k: i64, v: f64):\n"
                  "    return full_like(b, k), full_like(b, v)\n"
                  "def g(y: i32[2], flag: bool):\n"
                  "    return sum(y, initial=flag), max(y * 0.5, initial=flag)\n", "flags.grad")
    b = np.array([True, False, True])
    for k, v in ((0, 0.0), (256, 0.5), (2**40, -np.inf), (-1, np.nan)):
        for got, want in zip(m.f(b, k, v), (np.full_like(b, k), np.full_like(b, v)), strict=True):
            assert got.dtype == np.bool_
            np.testing.assert_array_equal(got, want)
    y = np.array([-3, -1], np.int32)
    for flag in (True, False):
        total, top = m.g(y, flag)
        assert (total, top) == (np.sum(y, initial=flag), np.max(y * 0.5, initial=flag))
        assert (total.dtype, top.dtype) == (np.int64, np.float64)


@pytest.mark.parametrize("use,message", [
    ("x[k == 1]", "expected a compile-time integer"),
    ("sum(x, axis=k == 1)", "axis must be a compile-time integer"),
    ("reshape(x, (k == 1, 6))", "a shape must be a compile-time tuple or list of integers"),
    ("arange(k == 1) * 1.0", "each argument of arange() must be a number, not True"),
    ("x * len((0,) * (k == 1))", "a tuple can only be repeated (* n) a compile-time integer"),
    ("x * sum(x[0, :2] * 0.0, initial=k == 1)", "initial must be a number known at compile"),
])
def test_a_comparison_of_a_by_value_argument_is_no_integer_as_true_is_not(use, message):
    # `k == 1` by value is a `RunTimeBool`, an int only so that `if` and
    # `and` fold it: as an index, an axis, a shape, a count or `initial` it
    # was 1 (x[k == 1] was x[1], sum(x, axis=k == 1) a sum over axis 1),
    # where True is refused there, and so is the bool scalar `k == 1` is
    # where k is not taken by value
    m = dsl.loads(f"def f(x: f64[2, 3], k: i64):\n{FORCED}    return {use}\n", "compared.grad")
    with pytest.raises(dsl.GradError, match=re.escape(message)) as info:
        m.f(np.ones((2, 3)), np.int64(1))
    assert info.value.line == 3


SIZE_AND_COMPARED = """
def {name}(x: f32[n], k: i64):
{forced}    return x.shape[0] + (k == 1), x * (x.shape[0] * (k == 1)), sqrt(x.shape[0] * (k == 1))
"""


def test_a_size_with_a_by_value_comparison_is_on_i64_as_at_run_time():
    # arithmetic of a size and `k == 1` by value took the bool's dtype: the
    # sum was the bool True, and the product a size of dtype bool, which no
    # run-time scalar has (an internal KeyError 'bool'); at run time a
    # bool's arithmetic is on i64
    m = dsl.loads(SIZE_AND_COMPARED.format(name="scalar", forced="")
                  + SIZE_AND_COMPARED.format(name="by_value", forced=FORCED), "sized.grad")
    x = np.arange(1, 4, dtype=np.float32)
    want = [np.int64(4), x * np.float32(3), np.sqrt(np.int64(3))]  # (f32: a float beats an int)
    for got, same, value in zip(m.by_value(x, np.int64(1)), m.scalar(x, np.int64(1)), want,
                                strict=True):
        assert got.dtype == same.dtype == np.asarray(value).dtype
        np.testing.assert_array_equal(got, value)
        np.testing.assert_array_equal(same, value)
