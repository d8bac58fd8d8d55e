"""Parameter defaults and the annotation's dtype.

A dtype annotation fixes its parameter's dtype whichever way the value
comes: left out (the default), passed from Python, or written by a caller
in the language.  `def g(x, a: f64 = 1)` on f32 x is f64 every way; an f32
parameter's number is the nearest f32 (0.1 is 0.100000001...), as NumPy's
float32(0.1) is; `n: i64 = 2` is an i64 beside i32 arrays, and still a
number where a size wants one.  (An unannotated default stays weakly
typed, as a Python number passed for it is: f32 beside f32 arrays.)
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import dsl

SOURCE = """\
def g(x, a: f64 = 1):
    return x * a

def h(x):
    return g(x, 1.0)

def e(x, a: f32 = 0.1):
    return x * a

def e_in(x):
    return e(x, 0.1)

def c(x, s: const f64 = 0.1):
    return x * s
"""
X32 = np.array([1.5, -2.0], np.float32)
X64 = X32.astype(np.float64)
F32_TENTH = float(np.float32(0.1))


def test_a_float_annotation_fixes_the_dtype_of_a_default_and_of_a_caller_number():
    m = dsl.loads(SOURCE)
    # f32 x: a's annotation f64 wins, left out or given (`a` was weak, f32)
    for out in (m.g(X32), m.g(X32, 1.0), m.h(X32)):
        assert out.dtype == np.float64
        np.testing.assert_array_equal(out, [1.5, -2.0])
    # a const f64's default is an f64 too, as a passed 0.1 is
    assert m.c(X32).dtype == np.float64
    np.testing.assert_array_equal(m.c(X32), X64 * 0.1)
    # f64 x: `a: f32 = 0.1` is float32(0.1), left out, passed or written
    # (it was 0.1 exactly: the f32 literal kept the f64 value)
    for out in (m.e(X64), m.e_in(X64)):
        assert out.dtype == np.float64
        np.testing.assert_array_equal(out, X64 * F32_TENTH)


def test_transforms_of_a_call_leaving_out_an_annotated_default_agree():
    m = dsl.loads(SOURCE)
    value, gx = dsl.value_and_grad(m.g)(X32)
    assert value.dtype == np.float64
    np.testing.assert_array_equal(value, [1.5, -2.0])
    assert gx.dtype == np.float32  # (x's cotangent keeps x's dtype)
    np.testing.assert_array_equal(gx, [1.0, 1.0])
    mapped = dsl.vmap(m.g)(np.stack([X32, 2 * X32]))
    assert mapped.dtype == np.float64
    np.testing.assert_array_equal(mapped, [[1.5, -2.0], [3.0, -4.0]])
    y, ty = dsl.jvp(m.e, (X64,), (np.ones(2),))
    np.testing.assert_array_equal(y, X64 * F32_TENTH)
    np.testing.assert_array_equal(ty, [F32_TENTH, F32_TENTH])


INTEGERS = """\
def big(k, s: i64 = 1099511627776):
    return k * s

def size(k, n: i64 = 2):
    return k * n, broadcast_to(0.5, (n - 1,))

def written(k):
    return big(k, 3)
"""


def test_an_integer_annotation_fixes_the_dtype_of_a_default_and_of_a_caller_number():
    m = dsl.loads(INTEGERS)
    k = np.array([1, -2], np.int32)
    # left out, s was a weakly typed number meeting i32 k: "the constant
    # 1099511627776 does not fit in i32", where passing it gave i64
    for out, s in ((m.big(k), 2 ** 40), (m.big(k, 2 ** 40), 2 ** 40), (m.written(k), 3)):
        assert out.dtype == np.int64
        np.testing.assert_array_equal(out, [s, -2 * s])
    # a size (the function compiled for n's value): i64 however n comes
    # (left out, it was i32 k's dtype)
    for product, ones in (m.size(k), m.size(k, 2)):
        assert product.dtype == np.int64
        np.testing.assert_array_equal(product, [2, -4])
        np.testing.assert_array_equal(ones, [0.5])


def test_a_typed_integer_meets_another_annotation_as_an_array_of_its_dtype_does():
    # left out, n was a weak number that inner's i32 took; passed, it was an
    # i64 array that inner refused: both are refused now, at the call
    m = dsl.loads("def inner(k, n: i32):\n    return k * n\n\n"
                  "def outer(k, n: i64 = 2):\n    return inner(k, n)\n\n"
                  "def written(k):\n    return inner(k, 2)\n")
    k = np.array([1, -2], np.int32)
    for args in ((k,), (k, 2)):
        with pytest.raises(dsl.GradError) as info:
            m.outer(*args)
        assert info.value.message == "argument 'n' of inner() has dtype i64; its annotation says i32"
        assert (info.value.line, info.value.col) == (5, 12)
    out = m.written(k)  # (a number written in the call is weak: i32's)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [2, -4])


def test_an_int_kind_number_is_an_i64_as_a_python_int_passed_for_it_is():
    m = dsl.loads("def kind(k, n: int = 2):\n    return k * n\n\n"
                  "def const_kind(k, n: const int = 2):\n    return k * n\n\n"
                  "def axis(k, n: const = 2):\n    return k * n\n")
    k = np.array([1, -2], np.int32)
    # an `int` kind's number is an i64, as a Python int passed for it is
    # (left out, it was a weak number: i32 k's dtype); an array keeps its
    # own; a const integer is a literal, weakly typed given or left out
    cases = [(m.kind(k), np.int64), (m.kind(k, 2), np.int64), (m.kind(k, np.int32(2)), np.int32),
             (m.const_kind(k), np.int32), (m.const_kind(k, 2), np.int32),
             (m.axis(k), np.int32), (m.axis(k, 2), np.int32)]
    for out, dtype in cases:
        assert out.dtype == dtype
        np.testing.assert_array_equal(out, [2, -4])


def test_a_function_with_a_grad_block_is_lowered_apart_for_2_as_i32_and_as_i64():
    # its stages are reused by their inputs' values: a and b were both the
    # weak number 2, and f(k, b) gave i32 (`staging._exact` keys the dtype)
    m = dsl.loads("def f(x, n: const):\n    return x * n\ngrad(dy):\n    return dy * n\n\n"
                  "def g(k, a: i32 = 2, b: i64 = 2):\n    return f(k, a), f(k, b)\n")
    narrow, wide = m.g(np.array([1, -2], np.int32))
    assert (narrow.dtype, wide.dtype) == (np.int32, np.int64)
    np.testing.assert_array_equal(narrow, [2, -4])
    np.testing.assert_array_equal(wide, [2, -4])


def test_a_weakly_typed_array_takes_the_annotation_of_the_parameter_it_is_passed_to():
    m = dsl.loads("def g(x, a: f64[n]):\n    return x * a\n\n"
                  "def half_steps(x):\n    return g(x, arange(2) * 0.5)\n\n"
                  "def counts(x, k: i32[n]):\n    return x * k\n\n"
                  "def steps(x):\n    return counts(x, arange(2))\n")
    x = np.array([3.0, -2.0], np.float32)
    # arange(2) * 0.5 stayed weak in g, f32 beside x, where the same values
    # passed from Python as an f64 array give f64
    for out in (m.half_steps(x), m.g(x, np.arange(2) * 0.5)):
        assert out.dtype == np.float64
        np.testing.assert_array_equal(out, [0.0, -1.0])
    # arange's i64 was refused by `k: i32[n]`: a weak array takes it as a number would
    assert m.steps(x).dtype == np.float32
    np.testing.assert_array_equal(m.steps(x), [0.0, -2.0])


def test_a_number_for_a_bool_parameter_is_a_bool_as_from_python():
    m = dsl.loads("def pick(x, flag: bool = True):\n    return where(flag, x, -x)\n\n"
                  "def zero(x):\n    return pick(x, 0)\n\n"
                  "def two(x):\n    return pick(x, 2)\n")
    x = np.array([1.5, -2.0])
    # 0 written in the call was an i64 where() refused inside pick ("expected
    # a bool value"), where Python's 0 is False
    for out in (m.zero(x), m.pick(x, 0)):
        np.testing.assert_array_equal(out, [-1.5, 2.0])
    with pytest.raises(dsl.GradError) as info:
        m.two(x)
    assert info.value.message == "argument 'flag' of pick() must hold bool values (0 or 1), not 2"
    assert (info.value.line, info.value.col) == (8, 12)



TAKES = "def f(a: {dtype}{default}):\n    return a\n"
CALLS = "\ndef g():\n    return f({value})\n"


@pytest.mark.parametrize("dtype,value,want", [
    ("bool", "1.0", np.True_), ("bool", "0", np.False_), ("i32", "2.0", np.int32(2)),
    ("i64", "-3.0", np.int64(-3)), ("f32", "True", np.float32(1.0)),
    ("bool", "2", "must hold bool values (0 or 1)"),
    ("i64", "0.5", "must hold i64 values (whole numbers), not 0.5"),
    ("i32", "True", "is a bool (True), but its annotation says i32: pass an integer")])
def test_a_default_and_a_callers_number_are_taken_as_from_python(dtype, value, want):
    # A parameter takes the same numbers whichever way its value comes: its
    # default, a calling function's number, or a Python number.  `b: bool =
    # 1.0` and `n: i64 = 2.0` were refused at load ("not a value of its
    # dtype bool") though Python's 1.0 and 2.0 were taken; a calling
    # function's 2.0 for an i32, 0.5 for an i64 and True for an f32 were
    # passed on as they were (f64 2.0, f64 0.5, a bool).
    takes, default = TAKES.format(dtype=dtype, default=""), f" = {value}"
    ways = [lambda: dsl.loads(TAKES.format(dtype=dtype, default=default), "takes.grad").f(),
            lambda: dsl.loads(takes + CALLS.format(value=value), "takes.grad").g(),
            lambda: dsl.loads(takes, "takes.grad").f(eval(value))]
    for way in ways:
        if isinstance(want, str):
            with pytest.raises(dsl.GradError, match=re.escape(want)):
                way()
        else:
            got = way()
            assert got.dtype == want.dtype and got == want


AT_DEFAULT = """\
def p(x, a: f64 = 2.0, b = 3.0):
    return sum(x * a * a * b)

def in_language(x):
    ga, gb = grad(p, wrt=(1, 2))(x)
    return ga, gb
"""


def test_a_transform_differentiates_at_a_default_the_call_leaves_out():
    # dsl.grad(p, wrt=1)(x) was an ArgumentError ("cannot differentiate p()
    # with respect to 'a': no value was passed for it"), and so were
    # jacfwd/jacrev/hessian's, where the language's grad(p, wrt=1)(x)
    # differentiates at the default.  d/da sum(x a^2 b) = 2 a b sum(x);
    # d/db = a^2 sum(x); b, unannotated, weakly typed as when passed: f32
    # for f32 x, but f64 beside a's f64, as in the language.
    m = dsl.loads(AT_DEFAULT, "at_default.grad")
    x = np.array([1.0, 2.0], np.float32)
    da, db = 2 * 2.0 * 3.0 * 3.0, 2.0 * 2.0 * 3.0
    for ga, gb in (dsl.grad(m.p, wrt=("a", 2))(x), m.in_language(x)):
        assert (ga.dtype, gb.dtype) == (np.float64, np.float64)
        assert (ga, gb) == (da, db)
    gb = dsl.grad(m.p, wrt=2)(x)
    assert gb.dtype == np.float32 and gb == db
    # (one of each binding: value_and_grad binds as grad does, jacrev as jacfwd)
    assert dsl.jacfwd(m.p, wrt=1)(x) == da
    assert dsl.hessian(m.p, wrt=1)(x) == 2 * 3.0 * 3.0
    assert dsl.grad(dsl.grad(m.p, wrt=1), wrt=0)(x).tolist() == [2 * 2.0 * 3.0] * 2
