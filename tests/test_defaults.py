"""Parameter defaults and the annotation's dtype.

A dtype annotation fixes its parameter's dtype whichever way the value
comes: left out (the default), passed from Python, or written by a caller
in the language.  `def g(x, a: f64 = 1)` on f32 x is f64 every way; an f32
parameter's number is the nearest f32 (0.1 is 0.100000001...), as NumPy's
float32(0.1) is.  (An unannotated default stays weakly typed, as a Python
number passed for it is: f32 beside f32 arrays.)
"""
from __future__ import annotations

import numpy as np

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
