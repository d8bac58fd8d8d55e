"""Integer scalar arguments where the compiler needs a compile-time
integer: an item of a shape, an axis, an index or slice bound of a
shape, a tuple's repetition count.  The function
is compiled for the argument's value (as for `arange(n)` and `one_hot`'s
count, and as if it were `const`); a float argument there is an error
naming the annotation that fixes it."""
import numpy as np
import pytest

import dsl
from helpers import central_difference

SOURCE = """\
def reshaped(x, rows: i64):
    return reshape(x, (rows, -1)) * broadcast_to(1.0, (rows, 1))

def moved(x, first: i64, second: i64):
    return transpose(x, (first, second))

def summed(x, axis: i64):
    return sum(x * x, axis=axis)

def joined(x, y, axis: i64):
    return concatenate([x, y], axis=axis), take(x, stack([1, 0]), axis)

def length(x, axis: i64):
    return x * x.shape[axis]

def lifted(x, k: i64):
    return reshape(x, (1,) * k + x.shape[:k] + (-1,))
"""


@pytest.fixture(scope="module")
def m():
    return dsl.loads(SOURCE, "by_value.grad")


def test_shapes_and_axes_take_integer_arguments_by_value(m):
    # each was "a shape must be a compile-time tuple" or "axis must be a
    # compile-time integer", where arange(n) and one_hot took the argument
    x = np.arange(12.0).reshape(3, 4)
    flat = x.ravel()
    for rows in (2, 3, 2):  # (a program per value: the second 2 is the first's)
        np.testing.assert_array_equal(m.reshaped(flat, rows), flat.reshape(rows, -1))
    np.testing.assert_array_equal(m.moved(x, 1, 0), x.T)
    np.testing.assert_array_equal(m.moved(x, 0, 1), x)
    np.testing.assert_array_equal(m.summed(x, -1), np.sum(x * x, axis=-1))
    for axis in (0, 1):
        np.testing.assert_array_equal(m.summed(x, axis), np.sum(x * x, axis=axis))
        joined, taken = m.joined(x, x + 100, axis)
        np.testing.assert_array_equal(joined, np.concatenate([x, x + 100], axis=axis))
        np.testing.assert_array_equal(taken, np.take(x, [1, 0], axis=axis))
        np.testing.assert_array_equal(m.length(x, axis), x * x.shape[axis])
    for k in (1, 2):  # a tuple repeated, and sliced, by the argument
        np.testing.assert_array_equal(m.lifted(x, k), x.reshape((1,) * k + x.shape[:k] + (-1,)))


def test_the_gradient_through_an_axis_given_by_value(m):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 4))
    for axis in (0, 1):
        g = dsl.grad(m.summed)(x, axis)
        np.testing.assert_allclose(g, 2 * x, rtol=1e-15)
        fd = central_difference(m.summed, (x, axis), 0)
        np.testing.assert_allclose(g, fd, rtol=1e-7, atol=1e-8)


def test_an_axis_out_of_range_or_a_float_is_an_error_at_it(m):
    x = np.ones((3, 4))
    with pytest.raises(dsl.GradError, match="axis 2 is out of range for rank 2") as err:
        m.summed(x, 2)
    assert "by_value.grad:8:12" in str(err.value)
    floats = dsl.loads("def f(x, axis):\n    return sum(x, axis=axis)\n"
                       "def g(x, k):\n    return reshape(x, (k, -1))\n", "floats.grad")
    for f, where in ((floats.f, "floats.grad:2:12"), (floats.g, "floats.grad:4:12")):
        with pytest.raises(dsl.GradError, match="annotate it `(axis|k): i64`") as err:
            f(x, 1)
        assert where in str(err.value) and "^" in str(err.value)
    # a tuple of axes passed from Python is an array: the error said only
    # "a compile-time integer or tuple of integers", of a tuple given
    with pytest.raises(dsl.GradError, match=r"\('axis' is an array here: a tuple or list "
                                            r"passed from Python is an array; pass its items"):
        floats.f(x, (0, 1))


def test_an_axis_argument_out_of_range_is_an_argument_error_naming_it(m):
    # as an index argument out of range is: it was a GradError in the
    # source ("axis 2 is out of range for rank 1"), naming no argument
    def refused(call, message, at):
        with pytest.raises(dsl.ArgumentError) as err:
            call()
        assert (err.value.message, err.value.line, err.value.col) == (message, *at)
    x = np.ones((3, 4))
    refused(lambda: m.summed(x, 2), "axis 2 is out of range for rank 2 "
            "(the value of argument 'axis')", (8, 12))
    refused(lambda: m.joined(np.ones(3), np.ones(3), -2), "axis -2 is out of range for rank 1 "
            "(the value of argument 'axis')", (11, 12))
    const = dsl.loads("def a(x, k: const i64):\n    return sum(x, axis=k)\n"
                      "def t(x, k: i64):\n    return take(x, stack([0]), axis=k)\n", "const.grad")
    refused(lambda: const.a(np.zeros(3), 2), "axis 2 is out of range for rank 1 "
            "(the value of argument 'k')", (2, 12))
    refused(lambda: const.t(np.zeros(3), 1), "axis 1 is out of range for rank 1 "
            "(the value of argument 'k')", (4, 12))
    assert const.a(np.full(3, 2.0), -1) == 6.0
    # an axis the source writes is still the source's error
    with pytest.raises(dsl.GradError) as err:
        dsl.loads("def f(x):\n    return sum(x, axis=3)\n", "lit.grad").f(np.zeros(3))
    assert not isinstance(err.value, dsl.ArgumentError)
    assert (err.value.message, err.value.col) == ("axis 3 is out of range for rank 1", 24)


def test_a_shape_or_axes_argument_that_does_not_fit_is_an_argument_error_naming_it(m):
    # as an axis out of range is: each was a GradError in the source
    # ("cannot reshape [6] to [4, -1]"), naming no argument
    def refused(call, message, at):
        with pytest.raises(dsl.ArgumentError) as err:
            call()
        assert (err.value.message, err.value.line, err.value.col) == (message, *at)
    x = np.arange(6.0)
    refused(lambda: m.reshaped(x, 4), "cannot reshape [6] to [4, -1] "
            "(the value of argument 'rows')", (2, 12))
    refused(lambda: m.reshaped(x, -1), "invalid shape [-1, -1] "
            "(the value of argument 'rows')", (2, 12))
    refused(lambda: m.moved(np.ones((2, 3)), 0, 0), "transpose axes [0, 0] do not match "
            "rank 2 (the values of arguments 'first', 'second')", (5, 12))
    const = dsl.loads("def f(x, k: const i64):\n    return reshape(x, (k, 2))\n"
                      "def g(x):\n    return reshape(x, (4, 2))\n", "shapes.grad")
    refused(lambda: const.f(x, 4), "cannot reshape [6] (6 elements) to [4, 2] "
            "(the value of argument 'k')", (2, 12))
    assert const.f(x, -1).shape == (3, 2)
    # a shape the source writes is still the source's error
    with pytest.raises(dsl.GradError) as err:
        const.g(x)
    assert not isinstance(err.value, dsl.ArgumentError)
    assert (err.value.message, err.value.line) == ("cannot reshape [6] (6 elements) to [4, 2]", 4)


def test_a_size_index_or_an_option_argument_out_of_range_is_an_argument_error_naming_it(m):
    # x.shape[k] out of range, a tuple's or arange()'s step of 0, a stride,
    # padding or kernel size below its least: each was a GradError in the
    # source ("index 1 is out of range for a tuple of length 1")
    def refused(call, message, at):
        with pytest.raises(dsl.ArgumentError) as err:
            call()
        assert (err.value.message, err.value.line, err.value.col) == (message, *at)
    refused(lambda: m.length(np.ones(3), 1), "index 1 is out of range for a tuple of length 1 "
            "(the value of argument 'axis')", (14, 24))
    options = dsl.loads("def c(x, w, s: i64, p: i64):\n    return conv1d(x, w, stride=s, padding=p)\n"
                        "def p(x, k: i64):\n    return max_pool1d(x, k)\n"
                        "def t(x, k: const i64):\n    return x * x.shape[::k][0]\n"
                        "def r(k: i64):\n    return arange(0, 4, k)\n", "options.grad")
    x, w = np.ones((1, 1, 5)), np.ones((1, 1, 2))
    refused(lambda: options.c(x, w, 0, 0), "conv1d() stride must be positive, got 0 "
            "(the value of argument 's')", (2, 12))
    refused(lambda: options.c(x, w, 1, -1), "conv1d() padding must be non-negative, got -1 "
            "(the value of argument 'p')", (2, 12))
    refused(lambda: options.p(x, 0), "max_pool1d() kernel_size must be positive, got 0 "
            "(the value of argument 'k')", (4, 12))
    refused(lambda: options.t(np.ones(3), 0), "slice step cannot be zero "
            "(the value of argument 'k')", (6, 26))
    refused(lambda: options.r(0), "arange() step cannot be zero (the value of argument 'k')",
            (8, 12))
    # a pooling's kernel, or a convolution's padding, that the input cannot
    # hold (a GradError in the source naming no argument)
    refused(lambda: options.p(x, 9), "max_pool1d() kernel [9] is larger than the padded input "
            "[5] (input [5], padding [0]) (the value of argument 'k')", (4, 12))
    refused(lambda: options.c(x, np.ones((1, 1, 9)), 1, 1), "conv1d() kernel [9] is larger than "
            "the padded input [7] (input [5], padding [1]) (the value of argument 'p')", (2, 12))


def test_a_bool_for_an_integer_argument_is_an_argument_error(m):
    # True was taken as 1 (the sum over axis 1), where NumPy and PyTorch
    # refuse a bool as an axis, the source refuses True as an i64 default
    # or an axis, and a NumPy bool was refused already; a list of bools
    # for indices would have been rows 1 and 0, not a mask
    x = np.ones((3, 4))
    for k in (True, False):
        with pytest.raises(dsl.ArgumentError, match=rf"argument 'axis' of summed\(\) is a bool "
                           rf"\({k}\), but its annotation says i64: pass an integer") as err:
            m.summed(x, k)
        assert "by_value.grad:7:5" in str(err.value)
    indexed = dsl.loads("def f(x, i: i64[n]):\n    return take(x, i)\n", "indexed.grad")
    with pytest.raises(dsl.ArgumentError, match="argument 'i' of f.. holds bools"):
        indexed.f(np.arange(3.0), [True, False])
    np.testing.assert_array_equal(indexed.f(np.arange(3.0), [1, 0]), [1.0, 0.0])

BLOCKS = """\
def squares(x, axis: i64):
    return sum(x * x, axis=axis)
grad(dy):
    return 2 * x * broadcast_to(reshape(dy, x.shape[:axis] + (1,) + x.shape[axis + 1:]), x.shape)

def ramp(x, n: i64):
    return x * sum(arange(n))
grad(dy):
    return dy * sum(arange(n))

def called(x, k: i64):
    return squares(x, k)
"""


def test_a_function_with_grad_blocks_takes_them_by_value_in_its_body_and_blocks():
    # a stage's parameters are values of their own: the argument was no
    # longer known as one inside them ("axis must be a compile-time
    # integer"; arange: "must be known when the function is compiled: ...
    # an integer argument"), and the load's linearity check, lowering the
    # function, would have met the NeedsValue
    m = dsl.loads(BLOCKS, "blocks.grad")
    x = np.arange(6.0).reshape(2, 3) - 2.5
    for axis in (0, 1):
        np.testing.assert_array_equal(m.squares(x, axis), np.sum(x * x, axis=axis))
        np.testing.assert_array_equal(m.called(x, axis), np.sum(x * x, axis=axis))
        np.testing.assert_array_equal(dsl.grad(m.called)(x, axis), 2 * x)
    np.testing.assert_array_equal(m.ramp(x[0], 4), x[0] * 6)
    np.testing.assert_array_equal(dsl.grad(m.ramp)(x[0], 4), np.full(3, 6.0))


def test_an_in_language_transform_takes_them_by_value():
    # grad(f)(x, k) and jvp in the language lower f as a function of its
    # own, whose parameters were no longer known as the entry's arguments:
    # "axis must be a compile-time integer", and for arange(k) "must be
    # known when the function is compiled: ... an integer argument"
    m = dsl.loads("def sq(y, k: i64):\n    return sum(y * y, axis=k) * sum(arange(k + 2))\n"
                  "def g(x, k: i64):\n    return grad(sq, wrt=0)(x, k)\n"
                  "def t(x, k: i64):\n    v, d = jvp(sq, wrt=0)(x, k, x)\n    return v, d\n",
                  "transform.grad")
    x = np.arange(6.0).reshape(2, 3) - 2.5
    np.testing.assert_array_equal(m.g(x, 1), 2 * x * 3)  # (sum(arange(3)))
    value, tangent = m.t(x, 0)
    np.testing.assert_array_equal(value, np.sum(x * x, axis=0))
    np.testing.assert_array_equal(tangent, np.sum(2 * x * x, axis=0))


def test_a_pass_through_function_takes_them_by_value():
    # @pass_through lowers its body on parameters of its own, which were
    # not known as the entry's arguments: arange(k) "must be known when the
    # function is compiled: ... an integer argument"
    m = dsl.loads("@pass_through\ndef shifted(x, k: i64):\n    return x + sum(arange(k))\n"
                  "def f(x, k: i64):\n    return sum(shifted(x, k) * x)\n", "through.grad")
    x = np.array([0.5, -1.0, 2.0])
    np.testing.assert_array_equal(m.shifted(x, 3), x + 3)
    # (shifted(x, 4) is x + 6, its gradient passed through: (x + 6) + x)
    np.testing.assert_array_equal(dsl.grad(m.f)(x, 4), 2 * x + 6)


def test_integer_arithmetic_on_them_is_taken_by_value_too():
    # `k + 2` is a value of its own, which was not known as standing for
    # the argument: arange(k + 2) was "must be known when the function is
    # compiled: a literal, an integer argument ..." (it compiled only where
    # k itself was taken by value elsewhere first), axis=k - 1 "axis must
    # be a compile-time integer"; a loop's index in it is still refused
    m = dsl.loads("def f(x, k: i64, j: i64):\n"
                  "    return sum(x, axis=k - 1) * sum(arange(-j + 2 * k))\n"
                  "def g(x, n: i64):\n    s = x\n    for i in range(n):\n"
                  "        s = s + sum(arange(i + 1))\n    return s\n", "derived.grad")
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(m.f(x, 2, 1), x.sum(axis=1) * sum(range(3)))
    np.testing.assert_array_equal(m.f(x, 1, -1), x.sum(axis=0) * sum(range(3)))
    with pytest.raises(dsl.GradError, match="arange.. must be known") as err:
        m.g(x, 2)
    assert "derived.grad:6:21" in str(err.value)


def test_abs_and_sign_of_them_are_taken_by_value_too():
    # abs(k) and sign(k) were values of their own, not known as standing
    # for the argument as k - 1 is: "axis must be a compile-time integer"
    m = dsl.loads("def f(x, k: i64):\n    return sum(x, axis=sign(k)) * sum(arange(abs(k) + 1))\n",
                  "signs.grad")
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(m.f(x, -2), x.sum(axis=-1) * 3)
    np.testing.assert_array_equal(m.f(x, 1), x.sum(axis=1) * 1)
