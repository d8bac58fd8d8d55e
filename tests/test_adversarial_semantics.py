"""Adversarial programs whose values or derivatives were wrong: each test
pins a bug found by comparing against NumPy, central differences in f64 and
the other modes of differentiation."""
from __future__ import annotations

import functools
import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

import dsl
from dsl.function import _types
from gradlang.compiler.interpret import interpret
from helpers import central_difference

# ------------------------------------------------- where: the branch not taken


WHERE_MASKS = """
def two_wheres(x):
    s = sqrt(x)
    return where(x > 0, s, 0.0) + where(x > 1, s * 2.0, 1.0)

def outside(x):
    s = sqrt(x)
    t = s * s
    return where(x > 0, t, 0.0)

def mixing(x):
    y = x * sum(x)
    return y
grad(dy):
    return dy * sum(x) + sum(dy * x)

def mixing_in_where(x):
    return where(x > 0, mixing(x), 0.0)

def transposed(x):
    y = x.T
    return y
grad(dy):
    return dy.T

def transposed_in_where(x):
    return where(x > 0, transposed(x), 0.0)

def scaled_root(x, w):
    s = sqrt(x) * w
    return s
grad(ds):
    return ds * w / (2.0 * sqrt(x)), ds * sqrt(x)

def scaled_root_in_where(x, w):
    return where(x > 0, scaled_root(x, w), 0.0)
"""


@pytest.fixture(scope="module")
def where_masks():
    return dsl.loads(WHERE_MASKS, "where_masks.grad")


def test_uses_in_two_wheres_not_taken_get_no_gradient(where_masks):
    # Each use of s sits in a where branch not taken at x <= 0, so nothing
    # flows into sqrt's infinite (x = 0) or NaN (x < 0) derivative there.
    # The two branches' masks differed, and their sum was treated as
    # unmasked: 0 / NaN reached the gradient.
    x = np.array([-1.0, 0.0, 0.5, 4.0])
    g = dsl.grad(where_masks.two_wheres)(x)
    np.testing.assert_allclose(g, [0.0, 0.0, 0.5 / np.sqrt(0.5), 0.25 + 0.5], rtol=1e-12)


def test_second_derivative_of_a_branch_not_taken_is_zero(where_masks):
    # d/dx where(x > 0, sqrt(x) ** 2, 0) is 1 or 0 and its derivative 0
    # everywhere; the gradient's own wheres masked its several uses of
    # sqrt(x) differently, so the hvp was NaN at x <= 0.
    x = np.array([-1.0, 0.0, 2.0])
    v = np.array([1.0, 1.0, 1.0])
    np.testing.assert_array_equal(dsl.grad(where_masks.outside)(x), [0.0, 0.0, 1.0])
    np.testing.assert_allclose(dsl.hvp(where_masks.outside)(x, v), [0.0, 0.0, 0.0], atol=1e-12)


def test_a_grad_block_that_mixes_positions_is_not_masked_by_the_where(where_masks):
    # mixing's block sends every dy[i] into every x[j]: the cotangent of x
    # under a where is nonzero where the branch was not taken, and was
    # re-selected by the where's condition as if the call were elementwise.
    x = np.array([-1.0, 0.5, 2.0])
    f = where_masks.mixing_in_where
    np.testing.assert_allclose(f(x), np.where(x > 0, x * x.sum(), 0.0))
    reference = lambda x: np.where(x > 0, x * x.sum(), 0.0)  # noqa: E731
    np.testing.assert_allclose(dsl.grad(f)(x), central_difference(reference, [x], 0),
                               rtol=1e-6)


# ----------------------------------------------------- pow at a zero base

POWERS = """
def constant_power(x):
    return x ** 0

def identity_power(x):
    return x ** 1

def power(x, y):
    return x ** y
"""


@pytest.fixture(scope="module")
def powers():
    return dsl.loads(POWERS, "powers.grad")


def test_derivatives_of_x_to_the_zero_and_first_power_at_zero(powers):
    # x ** 0 is 1 and x ** 1 is x, so their derivatives are 0 and 1 and
    # their second derivatives 0, at x = 0 too: the rule y * x ** (y - 1)
    # made 0 * 0 ** -1 = 0 * inf = NaN there.
    x = np.array([0.0, -0.0, 2.0])
    ones = np.ones(3)
    np.testing.assert_array_equal(dsl.grad(powers.constant_power)(x), [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(dsl.hvp(powers.identity_power)(x, ones), [0.0, 0.0, 0.0])
    y = np.array([0.0, 1.0, 2.0])
    np.testing.assert_array_equal(dsl.grad(powers.power)(np.zeros(3), y), [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(dsl.hvp(powers.power)(np.zeros(3), y, ones), [0.0, 0.0, 2.0])


def test_derivative_of_a_power_by_its_exponent_at_a_zero_base(powers):
    # d/dy 0 ** y = 0 for y > 0 (0 ** y is 0 there): log(0) * 0 was NaN.
    y = np.array([0.5, 1.0, 3.0])
    np.testing.assert_array_equal(dsl.grad(powers.power, wrt=1)(np.zeros(3), y), [0.0, 0.0, 0.0])
    x = np.array([0.5, 2.0, 3.0])
    np.testing.assert_allclose(dsl.grad(powers.power, wrt=1)(x, y), np.log(x) * x ** y,
                               rtol=1e-12)


def test_derivative_of_a_power_by_its_exponent_at_a_negative_base_is_zero(powers):
    # TensorFlow's convention (log(x) masked to 0 where x <= 0): a negative
    # base has a power only at integer exponents, and no derivative in them.
    # log(x)'s NaN made g(u, v) = u * v ** log1p(u - u) NaN in u at a negative
    # v, though g is u there (a Hypothesis draw of test_adversarial_front).
    y = np.array([0.0, 2.0, 3.0])
    x = np.array([-0.6, -2.0, -1.5])
    np.testing.assert_array_equal(dsl.grad(powers.power, wrt=1)(x, y), [0.0, 0.0, 0.0])
    np.testing.assert_allclose(dsl.grad(powers.power, wrt=0)(x, y), y * x ** (y - 1),
                               rtol=1e-12)
    # and 0 where the power is infinite or NaN there, as docs/language.md
    # says: log(1) * x ** y was 0 * inf = NaN at 0 ** -1 and (-2) ** 1e300
    x, y = np.array([0.0, -0.0, -2.0, -2.0, 0.0]), np.array([-1.0, -3.0, 1e300, 0.5, 2.0])
    np.testing.assert_array_equal(dsl.grad(powers.power, wrt=1)(x, y), [0.0] * 5)
    h = dsl.loads("def h(u, v):\n    return sum(u * v ** log1p(u - u))\n", "h.grad")
    u, v = np.array([0.3, -0.7, 1.1]), np.array([0.9, 0.4, -0.6])
    du, dv = dsl.grad(h.h, wrt=(0, 1))(u, v)
    np.testing.assert_allclose(du, [1.0, 1.0, 1.0], rtol=1e-15)  # h is sum(u)
    np.testing.assert_array_equal(dv, [0.0, 0.0, 0.0])


def test_a_grad_block_that_transposes_is_not_masked_by_the_where(where_masks):
    # x[0, 1] reaches the output at [1, 0], where the branch is taken: its
    # gradient is 1 although x[0, 1] > 0 is false (it was re-selected to 0).
    x = np.array([[1.0, -2.0], [3.0, 0.5]])
    np.testing.assert_array_equal(dsl.grad(where_masks.transposed_in_where)(x),
                                  [[1.0, 1.0], [0.0, 1.0]])


def test_a_grad_block_stays_masked_for_the_inputs_it_treats_elementwise(where_masks):
    # x's cotangent is elementwise in ds (selected by the where, so 0, not
    # 0 / (2 sqrt(x)) = NaN, where x <= 0), even though w's is summed over
    # the rows w was broadcast along.
    x = np.array([[-1.0, 4.0], [1.0, 0.0]])
    w = np.array([2.0, 3.0])
    gx = dsl.grad(where_masks.scaled_root_in_where)(x, w)
    np.testing.assert_allclose(gx, [[0.0, 0.75], [1.0, 0.0]], rtol=1e-12)


# ------------------------------------------------- compile-time values


@pytest.mark.parametrize("expr, value", [
    ("maximum(2, 3.5)", 3.5), ("maximum(3, 2.5)", 3.0), ("minimum(1e400, 2)", 2.0),
    ("minimum(-0.5, 1)", -0.5), ("clip(5, 0, 3)", 3.0), ("maximum(x.shape[0], 3)", 4.0),
    ("minimum(x.shape[0] - 1, 2) * 1.5", 3.0), ("maximum(1e400 - 1e400, 1.0)", np.nan),
])
def test_maximum_and_minimum_of_compile_time_values(expr, value):
    # Both operands known at compile time: folded like arithmetic, with
    # NumPy's result (a float if either is, NaN propagated).  They failed to
    # compile, "compile-time arithmetic failed: maximum".
    m = dsl.loads(f"def f(x):\n    return x * 0.0 + {expr}\n")
    np.testing.assert_array_equal(m.f(np.arange(4.0)), np.full(4, value))


def test_a_size_in_maximum_is_a_compile_time_index():
    m = dsl.loads("def f(x):\n    return x[minimum(x.shape[0], 3) - 1]\n")
    assert m.f(np.arange(5.0)) == 2.0
    assert m.f(np.arange(2.0)) == 1.0


# --------------------------------------------------------------- reductions


def test_min_of_integers_holds_the_dtypes_least_value():
    # min was -max(-x): -x wraps for the least integer, so min([-2**63, 5])
    # was 5.
    m = dsl.loads("def f(a):\n    return min(a)\n"
                  "def g(a: i32[n, m]):\n    return min(a, axis=0)\n"
                  "def h(a: i32[n, m]):\n    return min(a, axis=1, keepdims=True)\n")
    assert m.f(np.array([-2**63, 5])) == -2**63
    assert m.f(np.array([2**63 - 1, 7])) == 7
    a = np.array([[-2**31, 5], [3, -2**31], [2**31 - 1, 0]], np.int32)
    got = m.g(a)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, a.min(axis=0))
    np.testing.assert_array_equal(m.h(a), a.min(axis=1, keepdims=True))


def test_an_integer_array_to_a_negative_literal_power_is_an_error_at_it():
    # An integer result cannot hold 2 ** -1; the kernel truncated it to 0
    # and gave the least i64 for 0 ** -1.  NumPy refuses it too.
    m = dsl.loads("def f(a):\n    return a ** -1\n"
                  "def g(a, k: const i64):\n    return a ** k\n"
                  "def h(a):\n    return a ** -1.0 + 2 ** -1\n", "pow.grad")
    for call in (lambda: m.f(np.array([2, 0])), lambda: m.g(np.array([2, 0]), -2)):
        with pytest.raises(dsl.GradError, match="an integer to a negative power") as info:
            call()
        assert info.value.file == "pow.grad" and info.value.line in (2, 4)
    np.testing.assert_array_equal(m.h(np.array([2, 4])), [1.0, 0.75])


def test_an_integer_to_a_negative_run_time_power_is_rounded_toward_zero_on_every_target():
    # As docs/language.md says: 1, -1 or 0 (0 ** -k too, as an integer
    # division by 0 is 0).  Numba's i64 0 ** -1 was the least i64 (its
    # i32 one 0), and the reference interpreter raised NumPy's ValueError.
    from gradlang.compiler.ops import OPS
    src = "def f(a, b):\n    return a ** b\n"
    a = np.array([0, 0, 2, -2, 1, -1, -1, 3, 0, 5, -3])
    b = np.array([-1, -2, -1, -1, -5, -5, -4, -2, 5, 3, 3])
    want = np.array([0, 0, 0, 0, 1, -1, 1, 0, 0, 125, -27])
    np.testing.assert_array_equal(OPS["pow"].ref(a, b), want)
    for target in ("cpu", "cuda"):
        m = dsl.loads(src, target=target, host_results=True)
        for dtype in (np.int32, np.int64):
            got = m.f(a.astype(dtype), b.astype(dtype))
            assert got.dtype == dtype
            np.testing.assert_array_equal(got, want)


def test_an_integer_to_a_power_beyond_2_to_the_16_wraps_around_as_numpys():
    # Numba computes an integer power whose exponent passes 2**16 by
    # math.pow in float64: 3 ** 65537 was the least integer where NumPy's
    # wraps around, and (-1) ** (2**53 + 1) was 1 (the odd exponent rounded
    # to 2**53).  Exponents of each size of 16-bit digit.
    a = np.array([-1, -1, 1, 3, -3, 2, 0, 7, -5, 3])
    b = np.array([2**53 + 1, 2**62 + 3, 2**63 - 1, 2**63 - 1, 65537, 2**40, 2**62, 99999,
                  2**31 - 1, 65536])
    for target in ("cpu", "cuda"):
        m = dsl.loads("def f(a, b):\n    return a ** b\n", target=target, host_results=True)
        for dtype, exponents in ((np.int64, b), (np.int32, np.minimum(b, 2**31 - 1))):
            x, k = a.astype(dtype), exponents.astype(dtype)
            with np.errstate(all="ignore"):
                got = m.f(x, k)
            np.testing.assert_array_equal(got, np.power(x, k))


def test_integer_arithmetic_that_overflows_wraps_around_as_numpys():
    # Numba marks signed integer +, - and * "no signed wrap", and LLVM took
    # an overflow for impossible: `(y + 1) > y` was True at the greatest
    # i64, `(y - 1) < y` at the least, and `y + (least i64)` an `or` (-1
    # for y = -1, NumPy's greatest i64).  At the edges of each dtype.
    src = ("def f(y):\n"
           "    return (y + 1) > y, (y - 1) < y, (y * 2) > y, -y < 0, (y // -1) < 0\n"
           "def least(y: i64[n]):\n"
           "    return y + (-9223372036854775807 - 1)\n")
    for target in ("cpu", "cuda"):
        m = dsl.loads(src, target=target, host_results=True)
        for dtype in (np.int32, np.int64):
            info = np.iinfo(dtype)
            y = np.array([info.max, info.min, info.max // 2 + 1, -1, 0, 3], dtype)
            with np.errstate(all="ignore"):
                want = ((y + 1) > y, (y - 1) < y, (y * 2) > y, -y < 0, (y // -1) < 0)
            for got, expected in zip(m.f(y), want, strict=True):
                np.testing.assert_array_equal(got, expected)
        y = np.array([-1, -2, 0, 5, np.iinfo(np.int64).max])
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(m.least(y), y + np.int64(-2**63))


def test_integer_arithmetic_on_the_cuda_simulator_warns_of_no_overflow():
    # The simulator runs kernels on NumPy scalars; integer +, - and * in
    # unsigned 64-bit made NumPy warn "overflow encountered in scalar
    # subtract" for 2 - 3 (and for any negative operand of +), where
    # nothing overflows and the GPU says nothing
    m = dsl.loads("def f(y: i64[n], z: i32[n]):\n    return y - 3, -y, z * z + y\n",
                  target="cuda", host_results=True)
    y, z = np.array([2, -5, 7]), np.array([-2, 3, -4], np.int32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = m.f(y, z)
    for value, want in zip(got, (y - 3, -y, z.astype(np.int64) ** 2 + y), strict=True):
        np.testing.assert_array_equal(value, want)
    assert [str(w.message) for w in caught] == []


def test_an_integer_to_a_literal_power_wraps_around_as_numpys_where_compared():
    # Numba's integer power multiplies "no signed wrap", and LLVM took an
    # overflow for impossible: `(a ** 5) // a` was a ** 4 for every a (and
    # `(a ** 6) < 0` False), where NumPy's powers wrap around.
    m = dsl.loads("def f(a):\n    return (a ** 5) // a\n")
    a = np.array([3, 2**13 + 1, 2**20 + 3, 2**31 - 1, -(2**21 + 5), 46341])
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(m.f(a), (a ** 5) // a)


# ------------------------------------------- random expression programs
# Random trees of elementwise ops, where, broadcasting and reductions over
# axes (with keepdims), each with its NumPy transcription: the value and
# the gradient of the compiler's IR, run by the reference interpreter (no
# kernel to compile), against NumPy and central differences.

_SHAPES = [(2, 3), (3,), (2, 1), (1, 3), (), (2, 1, 3)]
_erf = np.vectorize(math.erf, otypes=[float])
_UNARY = [("tanh({})", np.tanh), ("sin({})", np.sin), ("abs({})", np.abs),
          ("sqrt({0} * {0} + 1.0)", lambda x: np.sqrt(x * x + 1)),
          ("log({0} * {0} + 0.5)", lambda x: np.log(x * x + 0.5)),
          ("exp(-({0} * {0}))", lambda x: np.exp(-x * x)), ("erf({})", _erf),
          ("sigmoid({})", lambda x: 1 / (1 + np.exp(-x))), ("({} ** 3)", lambda x: x ** 3),
          # NaN below -0.25, for where to mask (and finite at x - x = 0)
          ("sqrt({} + 0.25)", lambda x: np.sqrt(x + 0.25)),
          ("log({} + 0.25)", lambda x: np.log(x + 0.25))]
_BINARY = [("({} + {})", np.add), ("({} - {})", np.subtract), ("({} * {})", np.multiply),
           ("({0} / (1.0 + {1} * {1}))", lambda a, b: a / (1 + b * b)),
           ("maximum({}, {})", np.maximum), ("minimum({}, {})", np.minimum),
           ("where({0} > {1}, sqrt({0} - {1}), {1} * {1})",
            lambda a, b: np.where(a > b, np.sqrt(np.abs(a - b)), b * b)),
           ("where({1} > 0.0, sqrt({1}), {0})",
            lambda a, b: np.where(b > 0, np.sqrt(np.abs(b)), a))]
_REDUCTIONS = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


@st.composite
def _expression(draw, shapes: dict, depth: int):
    """(source, NumPy function of the inputs, shape)."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        name = draw(st.sampled_from(sorted(shapes)))
        return name, (lambda env: env[name]), shapes[name]
    kind = draw(st.sampled_from(["unary", "binary", "binary", "reduce"]))
    src, fn, shape = draw(_expression(shapes, depth - 1))
    if kind == "unary":
        template, op = draw(st.sampled_from(_UNARY))
        return template.format(src), (lambda env: op(fn(env))), shape
    if kind == "binary":
        src2, fn2, shape2 = draw(_expression(shapes, depth - 1))
        template, op = draw(st.sampled_from(_BINARY))
        out = np.broadcast_shapes(shape, shape2) if _broadcast(shape, shape2) else None
        if out is None:
            return src, fn, shape
        return template.format(src, src2), (lambda env: op(fn(env), fn2(env))), out
    name = draw(st.sampled_from(sorted(_REDUCTIONS)))
    if not shape:
        return f"{name}({src})", (lambda env: _REDUCTIONS[name](fn(env))), ()
    axes = tuple(draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1,
                               unique_by=lambda a: a % len(shape))))
    keep = draw(st.booleans())
    out = np.sum(np.zeros(shape), axis=axes, keepdims=keep).shape
    return (f"{name}({src}, axis={axes}, keepdims={keep})",
            (lambda env: _REDUCTIONS[name](fn(env), axis=axes, keepdims=keep)), out)


def _broadcast(a: tuple, b: tuple) -> bool:
    try:
        np.broadcast_shapes(a, b)
    except ValueError:
        return False
    return True


@st.composite
def _programs(draw):
    shapes = {f"x{k}": draw(st.sampled_from(_SHAPES)) for k in range(draw(st.integers(1, 2)))}
    # a local t that the result may read several times (in several wheres)
    t_src, t_fn, t_shape = draw(_expression(shapes, 3))
    src, fn, _ = draw(_expression({**shapes, "t": t_shape}, 4))
    source = f"def f({', '.join(shapes)}):\n    t = {t_src}\n    return {src}\n"

    def reference(*args):
        env = dict(zip(shapes, args))
        return fn({**env, "t": t_fn(env)})
    return source, reference, list(shapes.values())


def _interpreted(f, args):
    bound = f.bind(args, {})
    return interpret(f.lower(_types(bound)), *bound.values())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_programs(), st.integers(0, 2**31))
def test_random_programs_value_and_gradient_on_the_interpreter(program, seed):
    source, reference, shapes = program
    rng = np.random.default_rng(seed)
    args = [rng.normal(size=s) for s in shapes]
    f = dsl.loads(source, "random.grad").f
    (value,) = _interpreted(f, args)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(value, reference(*args), rtol=1e-12, atol=1e-12)
    wrt = tuple(range(len(args)))
    grads = _interpreted(dsl.grad(f, wrt=wrt), args)
    # A difference of sum(f) rounds at ~1e-16 of the sum's terms, over 1e-6:
    # a small derivative beside large elements (((t + t) ** 3) ** 3) is known
    # only that well.
    with np.errstate(all="ignore"):
        noise = 1e-9 * float(np.sum(np.abs(reference(*args))))
    for k, g in enumerate(grads):
        with np.errstate(all="ignore"):
            fine = central_difference(reference, args, k, eps=1e-6)
            coarse = central_difference(reference, args, k, eps=1e-4)
        smooth = np.isclose(fine, coarse, rtol=1e-3, atol=1e-4)  # no kink or tie near
        np.testing.assert_allclose(g[smooth], fine[smooth], rtol=1e-4, atol=max(1e-5, noise))


def test_forward_mode_takes_nothing_from_a_branch_not_taken_either():
    # The tangent of where(x > 0, x, 0) is 0 at x <= 0, so nothing flows
    # into sqrt's infinite derivative at 0 there: 0 / (2 sqrt(0)) was NaN
    # in jvp while grad (the where applied last) gave 0.
    m = dsl.loads("def f(x):\n    return sqrt(where(x > 0, x, 0.0)) * 2.0\n"
                  "def g(x, y):\n    return log(where(x > 0, x, 0.0) * y + where(x > 1, y, 0.0))\n")
    x, y = np.array([-1.0, 0.0, 4.0]), np.array([2.0, 3.0, 0.5])
    _, t = dsl.jvp(m.f, (x,), (np.ones(3),))
    np.testing.assert_array_equal(t, [0.0, 0.0, 0.5])
    np.testing.assert_array_equal(t, dsl.jacrev(m.f)(x) @ np.ones(3))
    _, t = dsl.jvp(m.g, (x, y), (np.ones(3), None))
    # d/dx log(x y + y) = y / (x y + y) where x > 1, and nothing where x <= 0
    np.testing.assert_allclose(t, [0.0, 0.0, y[2] / (x[2] * y[2] + y[2])], rtol=1e-15)
    np.testing.assert_allclose(t, dsl.jacrev(m.g)(x, y) @ np.ones(3), rtol=1e-15)


def test_forward_mode_through_maximum_takes_nothing_from_the_smaller_side():
    # maximum(x, 0)'s tangent is 0 where x < 0, so sqrt's infinite
    # derivative at 0 meets no tangent there (jvp was NaN, jacrev 0).
    m = dsl.loads("def f(x):\n    return sqrt(maximum(x, 0.0)) + sqrt(-minimum(x, 0.0))\n")
    x = np.array([-4.0, 4.0])
    _, t = dsl.jvp(m.f, (x,), (np.ones(2),))
    np.testing.assert_array_equal(t, [-0.25, 0.25])
    np.testing.assert_array_equal(t, dsl.jacrev(m.f)(x) @ np.ones(2))


BROADCAST_WHERE = """\
def root_or_y(x, y):
    return where(x > y, sqrt(x), y)

def shifted_root_or_y(x, y, z):
    return where(x > y, sqrt(x) + z, y)
"""


@pytest.mark.parametrize("x_shape, y_shape", [((3, 1), (4,)), ((1, 4), (3, 1)), ((3,), (2, 3))])
@given(data=st.data())
@settings(max_examples=15, deadline=None)
def test_a_branch_input_broadcast_by_the_where_gets_no_nan_where_no_branch_takes_it(
        x_shape, y_shape, data):
    # The condition has the broadcast shape and sqrt(x) x's own: the mask
    # was dropped for not fitting x, so an x that no position takes
    # (x < y everywhere it is broadcast) got 0 * sqrt's NaN derivative.
    m = _broadcast_where()
    values = st.floats(-2.0, 2.0).filter(lambda v: abs(v) > 1e-3)
    x = np.array(data.draw(st.lists(values, min_size=int(np.prod(x_shape)),
                                    max_size=int(np.prod(x_shape))))).reshape(x_shape)
    y = np.array(data.draw(st.lists(values, min_size=int(np.prod(y_shape)),
                                    max_size=int(np.prod(y_shape))))).reshape(y_shape)
    shape = np.broadcast_shapes(x_shape, y_shape)
    taken = np.broadcast_to(x, shape) > y
    with np.errstate(invalid="ignore", divide="ignore"):
        local = np.where(taken, 0.5 / np.sqrt(np.broadcast_to(x, shape)), 0.0)
    expected_x = _summed_to(local, x_shape)
    expected_y = _summed_to(np.where(taken, 0.0, 1.0), y_shape)
    gx, gy = dsl.grad(m.root_or_y, wrt=(0, 1))(x, y)
    np.testing.assert_allclose(gx, expected_x, rtol=1e-12)
    np.testing.assert_allclose(gy, expected_y, rtol=1e-12)
    z = np.ones(shape)
    gx, _, gz = dsl.grad(m.shifted_root_or_y, wrt=(0, 1, 2))(x, y, z)
    np.testing.assert_allclose(gx, expected_x, rtol=1e-12)
    np.testing.assert_allclose(gz, taken.astype(float), rtol=1e-12)


@functools.lru_cache(maxsize=None)
def _broadcast_where():
    return dsl.loads(BROADCAST_WHERE, "broadcast_where.grad")


def _summed_to(a: np.ndarray, shape: tuple) -> np.ndarray:
    lead = a.ndim - len(shape)
    a = a.sum(axis=tuple(range(lead))) if lead else a
    axes = tuple(i for i, d in enumerate(shape) if d == 1 and a.shape[i] != 1)
    return a.sum(axis=axes, keepdims=True) if axes else a


MOVED_WHERE = """\
def at_index(x, i: i64):
    s = sqrt(x)
    return where(x[i] > 0.0, s[i], 0.0)

def gathered(x, idx: i64[m]):
    s = sqrt(x)
    return sum(where(x[idx] > 0.0, s[idx], 0.0))

def sliced(x):
    s = sqrt(x)
    return sum(where(x[1:] > 0.0, s[1:], 0.0))

def row_sums(x: f64[n, k]):
    return sum(where(min(x, axis=1) > 0.0, sum(sqrt(x), axis=1), 0.0))

def transposed(x: f64[n, k]):
    s = sqrt(x)
    return sum(where(x.T > 0.0, s.T, 0.0))

def looped(x, n: i64):
    h = x
    for i in range(n):
        h = sqrt(h)
    return sum(where(x > 0.0, h, 0.0))
"""


@functools.lru_cache(maxsize=None)
def _moved_where():
    return dsl.loads(MOVED_WHERE, "moved_where.grad")


@given(x=st.lists(st.sampled_from([-1.0, 0.0, 0.25, 4.0]), min_size=2, max_size=4),
       data=st.data())
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_branch_read_through_an_index_slice_or_reduction_gets_no_nan(x, data):
    # The where-mask stopped at any op that moves positions (x[i], a
    # gather, a slice, a transpose, a sum over an axis) and at a loop: the
    # cotangent reached sqrt(x) as zeros, unmasked, and 0 * sqrt's inf
    # derivative at x = 0 made the gradient NaN where no branch taken reads x.
    m = _moved_where()
    x = np.array(x)
    n = len(x)
    with np.errstate(divide="ignore"):
        local = np.where(x > 0, 0.5 / np.sqrt(np.abs(x)), 0.0)
    i = data.draw(st.integers(-n, n - 1))
    np.testing.assert_array_equal(dsl.grad(m.at_index)(x, i), np.eye(n)[i] * local)
    idx = np.array(data.draw(st.lists(st.integers(-n, n - 1), max_size=5)), dtype=np.int64)
    counts = np.bincount(idx % n, minlength=n)
    np.testing.assert_array_equal(dsl.grad(m.gathered)(x, idx), counts * local)
    with np.errstate(divide="ignore"):
        curvature = np.where(x > 0, -0.25 / np.abs(x) ** 1.5, 0.0)
    np.testing.assert_allclose(dsl.hessian(m.gathered)(x, idx), np.diag(counts * curvature),
                               rtol=1e-15)
    np.testing.assert_array_equal(dsl.grad(m.sliced)(x), np.r_[0.0, local[1:]])
    grid = np.stack([x, x[::-1]])
    with np.errstate(divide="ignore"):
        grid_local = np.where(grid > 0, 0.5 / np.sqrt(np.abs(grid)), 0.0)
    rows = np.all(grid > 0, axis=1, keepdims=True)
    np.testing.assert_array_equal(dsl.grad(m.row_sums)(grid), np.where(rows, grid_local, 0.0))
    np.testing.assert_array_equal(dsl.grad(m.transposed)(grid), grid_local)
    # ... nor a loop: its backward loop carries the mask from trip to trip
    trips = data.draw(st.integers(0, 3))
    power = 0.5 ** trips
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(x > 0, power * np.abs(x) ** (power - 1), 0.0)
        bend = np.where(x > 0, power * (power - 1) * np.abs(x) ** (power - 2), 0.0)
    np.testing.assert_allclose(dsl.grad(m.looped)(x, trips), slope, rtol=1e-14)
    np.testing.assert_allclose(dsl.hessian(m.looped)(x, trips), np.diag(bend), rtol=1e-13)



LOOP_MASKS = """\
def looped(x, n: i64):
    s = sqrt(x)
    h = x
    t = x * 0.0
    for i in range(n):
        t = t * 0.5 + log(h) + s
        h = sqrt(h)
    return sum(where(x > 0.0, t * h, 0.0))
"""


@functools.lru_cache(maxsize=None)
def _loop_masks():
    return dsl.loads(LOOP_MASKS, "loop_masks.grad")


@given(x=st.lists(st.one_of(st.sampled_from([0.0, -0.0]), st.floats(0.25, 3.0),
                            st.floats(-3.0, -0.25)), min_size=3, max_size=3),
       trips=st.integers(0, 3))
# near x = 1 the second derivative is what is left of terms of order 1 that
# cancel (5.5e-5 at 0.99978 after one trip): the two ways of computing it
# agree to their rounding, 1.1e-16, not to 1e-12 of what is left
@example(x=[0.0, 0.0, 0.9997786636579067], trips=1)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_second_reverse_pass_through_a_loop_keeps_the_where_mask(x, trips):
    # grad(grad(f)) and hvp run the backward loop of the gradient backward:
    # the mask it carried was not found again there (each trip's starting
    # state, and a value nothing flows to, got zero cotangents unmasked),
    # so 0 * the inf derivative of sqrt or log at x = 0, off the side the
    # where takes, made them NaN where the Hessian (forward over reverse)
    # was right.  A loop invariant's cotangent (of s = sqrt(x), which the
    # loop reads) had no mask even in first order: grad was NaN there too.
    f = _loop_masks().looped
    x = np.array(x)
    hessian = dsl.hessian(f)(x, trips)
    np.testing.assert_array_equal(hessian, np.diag(np.diag(hessian)))  # f is elementwise
    bend, slope = np.diag(hessian), dsl.grad(f)(x, trips)
    np.testing.assert_array_equal(bend[x <= 0], 0.0)  # the where takes 0 there
    np.testing.assert_array_equal(slope[x <= 0], 0.0)
    rounding = 64 * np.finfo(np.float64).eps  # of the terms' size, about 1
    np.testing.assert_allclose(dsl.grad(dsl.grad(f))(x, trips), bend, rtol=1e-12,
                               atol=rounding)
    np.testing.assert_allclose(dsl.hvp(f)(x, trips, np.ones_like(x)), bend, rtol=1e-12,
                               atol=rounding)
    away = np.abs(x) >= 0.25  # differences there stay on one side of the edge
    by_differences = central_difference(lambda x: dsl.grad(f)(x, trips), [x], 0)
    np.testing.assert_allclose(bend[away], by_differences[away], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(slope[away], central_difference(f, [x, trips], 0)[away],
                               rtol=1e-6, atol=1e-7)


# ------------------------------------------------ derivatives in the tails

TAILS = """\
from std import softplus, gelu

def ge(x):
    return gelu(x)

def sig(x):
    return sigmoid(x)

def em1(x):
    return expm1(x)

def sp(x):
    return softplus(x)

def th(x):
    return tanh(x)

def ash(x):
    return arcsinh(x)

def atn(x):
    return arctan(x) + erf(x) + erfc(x * 0.5)

def er(x):
    return erf(x)
"""


@functools.lru_cache(maxsize=None)
def _tails():
    return dsl.loads(TAILS, "tails.grad")


def _sigmoid_slope(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))  # accurate: no cancellation anywhere
    return e / (1.0 + e) ** 2


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-14), (np.float32, 1e-6)])
@given(x=st.lists(st.floats(-80.0, 80.0), min_size=1, max_size=4))
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_sigmoid_and_expm1_slopes_keep_their_digits_in_the_tails(dtype, tol, x):
    # sigmoid' was s (1 - s), where 1 - s cancels: 0 from x = 37 on (17 in
    # float32; 0.9% off at x = 12 in float32) where the slope is a normal
    # number (now the op sigmoid_slope); expm1' was expm1(x) + 1, 0 below
    # x = -37.  softplus'' is sigmoid', and went with it.
    m = _tails()
    x = np.array(x + [40.0, -40.0, 20.0], dtype=dtype)
    wide = x.astype(np.float64)
    np.testing.assert_allclose(dsl.grad(m.sig)(x), _sigmoid_slope(wide), rtol=tol, atol=0)
    np.testing.assert_allclose(dsl.grad(m.em1)(x), np.exp(wide), rtol=tol, atol=0)
    if dtype == np.float64:
        np.testing.assert_allclose(np.diagonal(dsl.hessian(m.sp)(x)), _sigmoid_slope(x),
                                   rtol=1e-13, atol=0)
        # s'' = s' tanh(-x / 2), which cancels near 0 (s'(x) - s'(-x))
        far = np.abs(x) > 1e-3
        np.testing.assert_allclose(np.diagonal(dsl.hessian(m.sig)(x))[far],
                                   (_sigmoid_slope(x) * np.tanh(-x / 2))[far], rtol=1e-10)


def _tanh_slope(x: np.ndarray) -> np.ndarray:
    e = np.exp(-2.0 * np.abs(x))  # 1 / cosh^2, with no cancellation anywhere
    return 4.0 * e / (1.0 + e) ** 2


@pytest.mark.parametrize("dtype, tol", [(np.float64, 4e-15), (np.float32, 1e-6)])
@given(x=st.lists(st.floats(-400.0, 400.0), min_size=1, max_size=4))
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_tanh_slope_keeps_its_digits_in_the_tails(dtype, tol, x):
    # tanh' was 1 - tanh^2, which cancels: 2x too large at x = 9 in float32
    # and 0 from 9.01 on (0 from 19.1 in float64), where it is a normal number.
    # Its own slope -2 tanh' tanh went with it.  Past |x| = 354.9 (44.4 in
    # float32) the slope is below the smallest normal number: 0 is within it.
    m = _tails()
    x = np.array(x + [9.0, -9.0, 15.0, 20.0, 0.25, -0.5, 1e-30, 0.0], dtype=dtype)
    wide = x.astype(np.float64)
    tiny = np.finfo(dtype).tiny
    np.testing.assert_allclose(dsl.grad(m.th)(x), _tanh_slope(wide), rtol=tol, atol=tiny)
    if dtype == np.float64:
        # (up to twice the slope: a slope that came out 0 leaves under 2 tiny)
        np.testing.assert_allclose(np.diagonal(dsl.hessian(m.th)(x)),
                                   -2.0 * _tanh_slope(x) * np.tanh(x), rtol=1e-14, atol=2 * tiny)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_arcsinh_slope_is_one_over_x_where_x_squared_overflows(dtype):
    # arcsinh' was 1 / sqrt(1 + x^2): 0 past |x| = 1.3e154 (1.8e19 in
    # float32), where x^2 overflows and the slope, about 1 / |x|, is a normal
    # number.  (np.hypot does not overflow.)  At +-inf both are 0, their
    # limits (as JAX's and torch's): r / sqrt(r^2 + (x r)^2) was NaN there.
    m = _tails()
    x = np.array([1e20, -3e25, 1e30, 0.5, -2.0, 1.0, 1e-20, 0.0, np.inf, -np.inf]
                 + ([1e155, -1e300, 3e307] if dtype == np.float64 else []), dtype=dtype)
    wide = x.astype(np.float64)
    slope = 1.0 / np.hypot(1.0, wide)
    np.testing.assert_allclose(dsl.grad(m.ash)(x), slope, rtol=4 * np.finfo(dtype).eps, atol=0)
    if dtype == np.float64:  # arcsinh'' = -x / (1 + x^2)^1.5, finite everywhere
        finite = np.where(np.isinf(wide), 0.0, wide)  # (where the curvature is 0)
        curvature = -finite * (1.0 / np.hypot(1.0, finite)) ** 3
        np.testing.assert_allclose(dsl.hvp(m.ash)(x, np.ones_like(x)), curvature,
                                   rtol=1e-15, atol=np.finfo(dtype).tiny)


def _arctan_erf_erfc(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The slope and curvature of atn, arctan(x) + erf(x) + erfc(x / 2), in
    float64; +-inf as +-1e300, where every derivative is 0 too."""
    wide = np.where(np.isinf(x), np.sign(x) * 1e300, x.astype(np.float64))
    with np.errstate(over="ignore", under="ignore"):
        gauss = 2 / np.sqrt(np.pi) * (np.exp(-wide**2) - 0.5 * np.exp(-wide**2 / 4))
        slope = np.where(np.abs(wide) > 1e10, (1 / wide) ** 2, 1 / (1 + wide**2)) + gauss
        curvature = np.where(np.abs(wide) > 1e10, -2 / wide**3, -2 * wide / (1 + wide**2) ** 2)
        curvature += 2 / np.sqrt(np.pi) * wide * (0.25 * np.exp(-wide**2 / 4)
                                                   - 2 * np.exp(-wide**2))
    return slope, curvature


def test_arctan_slope_where_x_squared_overflows():
    # arctan' was 1 / (1 + x^2): 0 past |x| = 1.8e19 in float32 (1.3e154
    # in float64), where x^2 overflows and the slope 1 / x^2 is a denormal
    x = np.array([1e20, -3e19, 0.5, -2.0, 1.0, 0.0, np.inf, -np.inf, np.nan], np.float32)
    np.testing.assert_allclose(dsl.grad(_tails().atn)(x), _arctan_erf_erfc(x)[0],
                               rtol=16 * np.finfo(np.float32).eps, atol=3e-45)


def test_arctan_erf_and_erfc_curvatures_at_infinities():
    # arctan'' = -2x / (1 + x^2)^2 was inf / inf = NaN at +-inf, and erf''
    # and erfc'' (-2x exp(-x^2) by 2 / sqrt(pi)) 0 * inf = NaN there: all
    # three are 0, their limits (JAX's are NaN).  NaN stays NaN.
    x = np.array([1e155, -1e160, 0.5, -2.0, 1.0, 0.0, 30.0, np.inf, -np.inf, np.nan])
    curvature = dsl.hvp(_tails().atn)(x, np.ones_like(x))
    np.testing.assert_allclose(curvature, _arctan_erf_erfc(x)[1], rtol=1e-14, atol=0)


def test_erf_slope_and_curvature_keep_their_digits_in_the_tails():
    # catches: exp(-x^2) with x^2 rounded first, whose error (an ulp of x^2,
    # times x^2 in exp's argument) made erf' (and erfc', the same exp) 241
    # ulps off at x = 23.8 in float64 (50 at -13.5; 21 at 9 in float32),
    # and the curvature with it; x^2 is now taken in exact parts.
    # References: 2 / sqrt(pi) exp(-x^2) and its -2x multiple, by mpmath
    # at 40 digits.
    m = _tails()
    x = np.array([23.81904720885467, -25.636242351321357, 8.124862430201023,
                  -13.518903666558163])
    slope = np.array([4.5371101090416942e-247, 4.234210712526106e-286,
                      2.4165971753814999e-29, 4.7914512068585402e-80])
    eps = np.finfo(np.float64).eps
    np.testing.assert_allclose(dsl.grad(m.er)(x), slope, rtol=4 * eps, atol=0)
    np.testing.assert_allclose(dsl.hvp(m.er)(x, np.ones_like(x)),
                               [-2.1613927975807175e-245, 2.1709850398576068e-284,
                                -3.9269039198374125e-28, 1.2955033457706891e-78],
                               rtol=4 * eps, atol=0)
    x32 = np.array([8.978195190429688, 6.694380760192871], np.float32)  # (exactly)
    np.testing.assert_allclose(dsl.grad(m.er)(x32), [1.108792533e-35, 3.887438024e-20],
                               rtol=4 * np.finfo(np.float32).eps, atol=0)


def test_gelu_keeps_its_digits_below_zero():
    # gelu = x Phi(x) was 0.5 x (1 + erf(x / sqrt(2))), which cancels for
    # x < 0: 4% off at x = -5 in float32, 0 at x = -10 in float64 (and its
    # slope Phi + x phi lost Phi).  Phi(-5) and Phi(-10) are the normal
    # distribution's tabled tails.
    m = _tails()
    x = np.array([-5.0, -10.0])
    tail = np.array([2.866515718791939e-07, 7.619853024160527e-24])  # Phi(x)
    density = np.exp(-x * x / 2) / np.sqrt(2 * np.pi)
    np.testing.assert_allclose(m.ge(x), x * tail, rtol=1e-14)
    np.testing.assert_allclose(dsl.grad(m.ge)(x), tail + x * density, rtol=1e-14)
    x32 = x[:1].astype(np.float32)
    np.testing.assert_allclose(m.ge(x32), x[:1] * tail[:1], rtol=1e-5)
    np.testing.assert_allclose(dsl.grad(m.ge)(x32), tail[:1] + x[:1] * density[:1], rtol=1e-5)


def test_a_float_to_the_literal_power_one_half_is_numpys_square_root():
    # NumPy's `x ** 0.5` is np.sqrt (its power's fast path for a scalar
    # exponent): -0.0 at -0.0 and NaN at -inf.  The CPU kernels called pow,
    # whose values there are 0.0 and inf, and which was an ulp off at 2.
    m = dsl.loads("def f(x):\n    return x ** 0.5\n")
    for dtype in (np.float32, np.float64):
        x = np.array([-0.0, -np.inf, 2.0, 0.5, np.inf, -1.0, 1e-40], dtype)
        with np.errstate(invalid="ignore"):
            want = x ** 0.5
        got = m.f(x)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_max_and_min_with_initial_take_an_element_equal_to_it_as_numpys():
    # NumPy's reduction starts from `initial`, and `maximum` keeps its second
    # operand where neither is greater: max(zeros, initial=-0.0) is 0.0 and
    # min(-0.0s, initial=0.0) is -0.0.  They were maximum(reduction,
    # initial), which kept the initial's zero.
    m = dsl.loads("def f(x, y):\n"
                  "    return max(x, initial=-0.0), min(y, initial=0.0)\n")
    x, y = np.zeros(3), np.full(3, -0.0)
    got = m.f(x, y)
    for g, want in zip(got, (np.max(x, initial=-0.0), np.min(y, initial=0.0))):
        assert np.signbit(g) == np.signbit(want) and g == want


def test_a_choice_or_a_stack_of_bool_literals_is_a_bool_as_of_bool_values():
    # `where(m, True, False)` and `stack([True, False])` were i64, where
    # the same with a bool argument for True, and NumPy's, is a bool
    m = dsl.loads("def lit(x):\n    return where(x > 0, True, False), stack([True, False])\n"
                  "def arg(x, t: bool):\n    return where(x > 0, t, False), stack([t, False])\n",
                  "bools.grad")
    x = np.array([1.0, -1.0])
    for got, same, want in zip(m.lit(x), m.arg(x, True), [[True, False], [True, False]],
                               strict=True):
        assert got.dtype == same.dtype == np.bool_
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(same, want)
