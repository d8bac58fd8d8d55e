"""Unusual runtime arguments: each is either computed with exactly as its
values say (checked against NumPy and finite differences) or refused with
an `ArgumentError` before any kernel runs, on every entry point (a call,
the transforms, params, `out=`, pullbacks)."""
import pickle
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from gradlang.compiler.values import ArgumentValue
from helpers import central_difference

M = dsl.loads("""
param w: f32[2]
param n: i64

def mul_sin(x, y):
    return x * y + sin(x)

def cube(x):
    return sum(x * x * x)

def halve(x: f32[k]):
    return x * 0.5

def times(x):
    return x * n

def twice(out):
    return out * 2.0

def shift(x, out=1.0):
    return x + out

def pool(v, ids, count: i64):
    return segment_sum(v, ids, count)

def rows(x, ids):
    return x[ids] * 2.0

def repeat(x, a: i64, b: i64, c: i64):
    s = x
    for i in range(a, b, c):
        s = s * 0.5 + x
    return s

def values(a: const i64, b: const i64):
    return arange(a, b) * 0.5

def fine(a: const i64):
    return arange(a, 0.5, -1e-300)

def literal(x):
    s = x
    for _ in range(9223372036854775807, -9223372036854775808, -1):
        s = s * 0.5 + x
    return s

def squares(x, a: i64, b: i64, c: i64):
    s = x
    for i in range(a, b, c):
        s = s * s * 0.5 + x
    return s
""")


def mul_sin(x, y):
    return x * y + np.sin(x)


def masked():
    return np.ma.masked_array([1.0, 2.0, 3.0], mask=[False, True, False])


@pytest.mark.parametrize("call", [
    lambda: M.mul_sin(masked(), np.ones(3)),
    lambda: M.mul_sin(np.ones(3), y=masked()),
    lambda: dsl.grad(M.mul_sin, wrt=1)(np.ones(3), masked()),
    lambda: dsl.hvp(M.cube)(np.ones(3), masked()),
    lambda: dsl.jvp(M.mul_sin, (np.ones(3), np.ones(3)), (masked(), None)),
    lambda: dsl.vjp(M.mul_sin, np.ones(3), np.ones(3))[1](masked()),
    lambda: M.params.__setitem__("w", np.ma.masked_array([1.0, 2.0], mask=[True, False])),
], ids=["call", "keyword", "grad", "hvp", "jvp", "pullback", "param"])
def test_masked_arrays_are_refused_not_computed_with_the_masked_values(call):
    """NumPy's asarray drops the mask: the values under it (2.0) were used."""
    with pytest.raises(dsl.ArgumentError, match="masked array.*filled"):
        call()


def test_a_masked_out_buffer_is_refused():
    buf = np.ma.masked_array(np.zeros(3), mask=[False, True, False])
    with pytest.raises(dsl.ArgumentError, match="out of mul_sin.*MaskedArray"):
        M.mul_sin(np.ones(3), np.ones(3), out=buf)
    assert buf.mask[1] and not buf.data.any()  # nothing ran


def test_big_endian_arrays_compute_with_their_values(tmp_path):
    """A '>f8' array (a file of big-endian data) is an f64 array: refused
    before as an "unsupported dtype >f8", and as a tangent of dtype >f8
    for an f64 primal."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(2, 3)), rng.normal(size=(2, 3))
    mapped = np.memmap(tmp_path / "x.be", dtype=">f8", mode="w+", shape=(2, 3))
    mapped[...] = x
    for big in (x.astype(">f8"), mapped):
        np.testing.assert_allclose(M.mul_sin(big, y.astype(">f8")), mul_sin(x, y), rtol=1e-14)
        gx, gy = dsl.grad(M.mul_sin, wrt=(0, 1))(big, y)
        np.testing.assert_allclose(gx, central_difference(mul_sin, [x, y], 0), rtol=1e-6)
        np.testing.assert_allclose(gy, central_difference(mul_sin, [x, y], 1), rtol=1e-6)
        _, tangent = dsl.jvp(M.mul_sin, (x, y), (big, None))
        np.testing.assert_allclose(tangent, x * (y + np.cos(x)), rtol=1e-14)
        np.testing.assert_allclose(dsl.hvp(M.cube)(x, big), 6 * x * x, rtol=1e-14)
    np.testing.assert_allclose(M.halve(np.arange(3, dtype=">f4")), [0.0, 0.5, 1.0])
    M.params["n"] = np.array(3, ">i8")
    np.testing.assert_allclose(M.times(np.arange(3.0)), [0.0, 3.0, 6.0])


@pytest.mark.parametrize("call", [
    lambda: M.halve([1.0, 1e39]),
    lambda: M.halve(x=-1e300),
    lambda: M.params.__setitem__("w", [1e39, 0.0]),
    lambda: M.params.__setitem__("w", np.array([0.0, -1e300])),
    lambda: dsl.jvp(M.halve, (np.ones(2, np.float32),), ([1e39, 0.0],)),
    lambda: dsl.hvp(M.cube)(np.ones(2, np.float32), np.array([1e300, 0.0])),
    lambda: dsl.vjp(M.halve, np.ones(2, np.float32))[1](np.array([0.0, 1e300])),
], ids=["list", "keyword", "param-list", "param-array", "jvp-tangent", "hvp-v", "cotangent"])
def test_finite_floats_beyond_f32_are_refused_not_made_infinite(call):
    with pytest.raises(dsl.ArgumentError, match="out of range for f32"):
        call()


def test_infinities_and_nan_stay_what_they_are_in_f32():
    got = M.halve([np.inf, -np.inf, np.nan, 3e38, -0.0])
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.array([np.inf, -np.inf, np.nan, 1.5e38, -0.0],
                                                np.float32))
    assert np.signbit(got[4])


@pytest.mark.parametrize("value, pattern", [
    (np.array(2**64 - 1, np.uint64), "out of range for i64"),
    (np.array(2**63, np.uint64), "out of range for i64"),
    # (it said "must hold i64 values" alone, not which value it was given)
    (np.array(2.5), r"must hold i64 values \(whole numbers\), not 2\.5"),
    (np.array([3.0, np.nan]), r"must hold i64 values \(whole numbers\), not nan"),
])
def test_param_arrays_that_an_integer_param_cannot_hold_are_refused(value, pattern):
    """A uint64 array wrapped to -1 as the i64 param."""
    with pytest.raises(dsl.ArgumentError, match=pattern):
        M.params["n"] = value
    M.params["n"] = np.array(2**63 - 1, np.uint64)
    assert M.params["n"] == 2**63 - 1 and M.params["n"].dtype == np.int64


def repeat(x, a, b, c):
    s = x
    for _ in range(a, b, c):
        s = s * 0.5 + x
    return s


@pytest.mark.parametrize("bounds", [(-2**63, 2**63 - 1, 1), (2**63 - 1, -2**63, -1)])
def test_a_trip_count_beyond_i64_is_an_argument_error(bounds):
    """len(range(...)) raised OverflowError for these."""
    with pytest.raises(dsl.ArgumentError, match="18446744073709551615 trips, more than"):
        M.repeat(np.ones(2), *bounds)


@pytest.mark.parametrize("call, error, message", [
    (lambda: M.values(-2**63, 2**63 - 1), dsl.SizeOverflowError,
     r"values\(\): a value of type i64\[18446744073709551615\] needs more memory"),
    (lambda: M.values(2**63 - 1, -2**63), None, None),
    (lambda: M.fine(2**62), dsl.SizeOverflowError, r"fine\(\): a value of type f64\[17976931"),
    (lambda: M.literal(np.ones(2)), dsl.ArgumentError, "18446744073709551615 trips, more than"),
    (lambda: dsl.grad(M.literal)(np.ones(2)), dsl.ArgumentError, "18446744073709551615"),
])
def test_a_length_beyond_i64_from_constant_bounds_is_an_argument_error(call, error, message):
    """arange of i64 consts and a loop of literal bounds: the compiler's
    len(range(...)) raised OverflowError for these, and math.ceil of the
    float count of an arange of a tiny step, inf, too."""
    if error is None:
        assert M.values(2**63 - 1, -2**63).shape == (0,)  # (no values, where NumPy
        assert M.fine(-2**62).shape == (0,)                 # raises ValueError)
        np.testing.assert_array_equal(M.values(-3, 2), np.arange(-3, 2) * 0.5)
        return
    with pytest.raises(error, match=message):
        call()


def test_an_arange_of_a_step_beyond_a_floats_integers_counts_as_python_does():
    """NumPy counts an integer arange as a float quotient, one value short
    for arange(-5, 2**62, 2**62); the type rule counts two, and the second
    was read past the end of the first (0 here)."""
    m = dsl.loads("def steps(a: const i64, b: const i64, c: const i64):\n"
                  "    return arange(a, b, c)\n")
    for bounds in [(-5, 2**62, 2**62), (2**63 - 1, -5, -2**62), (-2**63, 0, 2**63 - 1),
                   (0, 10, 3)]:
        got = m.steps(*bounds)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, list(range(*bounds)))


def test_trip_counts_near_the_limits_count_as_python_does():
    x = np.array([0.5, -1.0])
    for bounds in [(-2**63, 2**63 - 1, 2**62), (2**63 - 1, -2**63, -2**62), (5, 5, 1),
                   (7, -3, -4), (-3, 7, 4), (3, 0, 1)]:
        np.testing.assert_allclose(M.repeat(x, *bounds), repeat(x, *bounds), rtol=1e-15)
        np.testing.assert_allclose(
            dsl.grad(M.repeat)(x, *bounds),
            central_difference(lambda x: repeat(x, *bounds), [x], 0), rtol=1e-6)


@pytest.mark.parametrize("f", [dsl.grad(M.squares), dsl.hvp(M.squares)], ids=["grad", "hvp"])
def test_a_gradients_trips_beyond_addressable_memory_are_an_argument_error(f):
    """Keeping 2**62 trips of 16 bytes for the backward pass overflowed
    NumPy's size computation ("Maximum allowed dimension exceeded").  (Its
    loop squares s, so its backward pass reads each trip's s: `repeat`'s,
    linear in s, keeps none, and its gradient would run the 2**62 trips.)"""
    args = (np.ones(2), 0, 2**62, 1) + ((np.ones(2),) if "hvp" in f.name else ())
    with pytest.raises(dsl.ArgumentError, match="runs 4611686018427387904 trips and keeps"):
        f(*args)



def test_out_keyword_for_a_function_with_a_parameter_named_out_is_refused():
    """`out=` gives result buffers (README): a parameter named `out` is
    passed by position.  `twice(out=x)` said "missing argument 'out'", and
    `shift(x, out=y)` after plain calls wrote x + 1 into y."""
    x, y = np.array([1.0, -2.0]), np.array([0.5, 4.0])
    for _ in range(2):  # the second call is a fast one
        np.testing.assert_array_equal(M.shift(x), x + 1.0)
    for call in (lambda: M.twice(out=x), lambda: M.shift(x, out=y),
                 lambda: dsl.grad(M.twice)(out=x)):
        with pytest.raises(dsl.ArgumentError, match="parameter named 'out'.*by position"):
            call()
    assert list(y) == [0.5, 4.0]
    np.testing.assert_array_equal(M.shift(x, y), x + y)
    buf = np.empty(2)
    assert M.shift(x, y, out=buf) is buf  # by position, then out= is the buffer
    np.testing.assert_array_equal(buf, x + y)


def test_parameters_named_self_and_f_are_passed_by_keyword():
    """`__call__(self, *args, **kwargs)` and `vjp(f, *args, **kwargs)` took a
    `.grad` parameter named `self` or `f` passed by keyword for their own:
    `m.g(x, self=2.0)` was a TypeError (got multiple values for argument
    'self'), and so was `dsl.vjp(m.g, x, f=3.0)` ('f')."""
    m = dsl.loads("def g(x, self, f=1.0):\n    return sum(x * self * f)\n")
    x = np.array([1.0, -2.0])
    assert m.g(x, self=2.0, f=3.0) == -6.0
    with pytest.raises(dsl.ArgumentError, match="got two values for 'self'"):
        m.g(x, 2.0, self=2.0)
    # (bound as arguments, then refused as one: no second program compiled)
    for transform in (dsl.vjp, lambda g, *args, **kwargs: dsl.grad(g)(*args, **kwargs)):
        with pytest.raises(dsl.ArgumentError, match="argument 'f' of g\\(\\) is not numeric"):
            transform(m.g, x, self=2.0, f="3")


class Marked(np.ndarray):
    """A user's ndarray subclass."""


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix
@pytest.mark.parametrize("make", [
    lambda a: a.view(Marked), lambda a: a.astype(">f8"), lambda a: np.matrix(a),
], ids=["subclass", "big-endian", "matrix"])
def test_a_watched_array_that_a_call_would_copy_is_refused(make):
    """A call binds such an array as a converted copy, which the tape did
    not track: the gradient for it was None, as if z did not depend on it."""
    x, w = np.array([[1.0, 2.0]]), make(np.array([[3.0, 4.0]]))
    with dsl.Tape() as tape:
        with pytest.raises(dsl.ArgumentError, match="plain NumPy arrays in native byte order"):
            tape.watch(x, w)
        plain = np.asarray(w, float)
        tape.watch(x, plain)
        z = M.mul_sin(x, plain)
    gx, gw = tape.gradient(z, [x, plain])
    np.testing.assert_allclose(gx, plain + np.cos(x), rtol=1e-14)
    np.testing.assert_allclose(gw, x, rtol=1e-14)



@pytest.mark.parametrize("f", [M.pool, dsl.grad(M.pool)], ids=["call", "grad"])
def test_a_segment_count_beyond_addressable_memory_is_an_argument_error(f):
    """NumPy's "array is too big" ValueError came out of the driver; and
    where no argument's shape is a factor (the sizes all the count's, for
    whose value the program is compiled) it was a plain GradError, not the
    SizeOverflowError (an ArgumentError) of rows of 4096."""
    ids = np.array([0, 1, 1])
    with pytest.raises(dsl.ArgumentError,
                       match="f64\\[1125899906842624, 4096\\]: .* a byte count beyond"):
        f(np.ones((3, 4096)), ids, 2**50)
    with pytest.raises(dsl.SizeOverflowError, match=rf"error: {re.escape(f.name)}(\(\))?: a "
                       r"value of type f64\[4611686018427387904\] needs more memory than can"):
        f(np.ones(3), ids, 2**62)
    got = f(np.arange(6.0).reshape(3, 2), ids, 3)
    want = [[0.0, 1.0], [6.0, 8.0], [0.0, 0.0]] if f is M.pool else np.ones((3, 2))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("f", [M.pool, dsl.grad(M.pool)], ids=["call", "grad"])
def test_a_negative_segment_count_from_an_argument_is_an_argument_error(f):
    """The count is the caller's value (the program compiled for it), so a
    negative one is a bad argument, as one beyond addressable memory is:
    it was a GradError, as if the source were wrong.  A negative count
    written in the source stays a GradError that is no ArgumentError."""
    with pytest.raises(dsl.ArgumentError, match=r"<string>:24:12: error: num_segments cannot "
                       r"be negative, got -1 \(the value of argument 'count'\)"):
        f(np.ones(3), np.array([0, 1, 1]), -1)
    np.testing.assert_array_equal(f(np.arange(3.0), np.array([0, 1, 1]), 2),
                                  [0.0, 3.0] if f is M.pool else np.ones(3))
    # a negative argument value is the number it is anywhere else, where
    # code told numbers apart by their type: a wrt position from the end was
    # refused, a number to differentiate was "not a float array", and one
    # of two branches' equal axes made the axis a run-time value
    m = dsl.loads("def f(x, y):\n    return sum(x * y * y)\n\n"
                  "def g(x, y, k: const):\n"
                  "    return grad(f, wrt=k)(x, y) + grad(f, wrt=1)(x, k)\n\n"
                  "def h(x, t, k: const):\n    a = -1\n    if t > 0.0:\n        a = k\n"
                  "    return sum(x, axis=a)\n")
    np.testing.assert_array_equal(m.g(np.array([1.0, 2.0]), np.array([3.0, 4.0]), -1),
                                  [0.0, 10.0])
    np.testing.assert_array_equal(m.h(np.arange(6.0).reshape(2, 3), 1.0, -1), [3.0, 12.0])
    value = pickle.loads(pickle.dumps(ArgumentValue(-1, "k")))  # (as an IR param may travel)
    assert (value, value.name) == (-1, "k")
    m = dsl.loads("def f(v, ids):\n    return segment_sum(v, ids, -1)\n")
    with pytest.raises(dsl.GradError, match="num_segments cannot be negative") as err:
        m.f(np.ones(3), np.array([0, 1, 1]))
    assert not isinstance(err.value, dsl.ArgumentError)


def test_a_negative_size_of_a_shape_from_an_argument_is_an_argument_error():
    """A shape's size that is an argument's value is the caller's, as a
    segment count is: broadcast_to's and reshape's negative sizes were a
    GradError, as if the source were wrong.  Written in the source, they
    stay GradErrors that are no ArgumentErrors."""
    m = dsl.loads("def fill(x, k: const):\n    return broadcast_to(x, (k,))\n\n"
                  "def rows(x, k: const):\n    return reshape(x, (k, 2))\n\n"
                  "def written(x):\n    return broadcast_to(x, (-2,))\n")
    for call, shape in [(lambda: m.fill(1.0, -1), r"\[-1\]"),
                        (lambda: m.rows(np.ones(4), -3), r"\[-3, 2\]")]:
        with pytest.raises(dsl.ArgumentError, match=rf"invalid shape {shape}.* \(the value of "
                           r"argument 'k'\)"):
            call()
    with pytest.raises(dsl.GradError, match=r"invalid shape \[-2\]") as err:
        m.written(1.0)
    assert not isinstance(err.value, dsl.ArgumentError)
    np.testing.assert_array_equal(m.rows(np.arange(4.0), -1), [[0.0, 1.0], [2.0, 3.0]])


def test_an_index_into_an_empty_axis_names_no_valid_range():
    """It said "(valid: 0 to -1)"."""
    with pytest.raises(dsl.ArgumentError) as info:
        M.rows(np.ones((0, 2)), np.array([0]))
    assert re.search(r"index 0 in 'ids' .* for an axis of size 0 \(an empty axis has none\)$",
                     info.value.message)
    # at the index, shown with its caret line
    assert str(info.value).endswith("\n        return x[ids] * 2.0\n               ^^^^^^")
    np.testing.assert_array_equal(M.rows(np.ones((0, 2)), np.zeros(0, np.int64)),
                                  np.ones((0, 2)))
    with pytest.raises(dsl.ArgumentError) as info:
        M.rows(np.ones((3, 2)), np.array([-4]))
    assert re.search(r"index -4 .* \(valid: -3 to 2\)$", info.value.message)



def test_python_integers_beyond_64_bits_are_floats_for_a_float():
    """2**70 for a float parameter was "an integer beyond 64 bits"."""
    assert M.mul_sin(2**70, 0.5) == 2.0**69 + np.sin(2.0**70)
    np.testing.assert_array_equal(M.halve([2**100, 3]), np.float32([2.0**99, 1.5]))
    assert dsl.grad(M.mul_sin, wrt=1)(2**70, 0.5) == 2.0**70
    with pytest.raises(dsl.ArgumentError, match="out of range for f64"):
        M.mul_sin(10**400, 1.0)
    with pytest.raises(dsl.ArgumentError, match="out of range for f32"):
        M.halve([2**200])
    with pytest.raises(dsl.ArgumentError, match=r"out of range for i64: its values must lie "
                                                r"in \[-9223372036854775808, "):
        M.pool(np.ones(2), np.array([0, 0]), 2**70)  # an integer parameter


def test_a_python_number_is_weakly_typed_as_in_numpy_2_and_jax():
    """f32 x times a Python float was f64 (a Python number was always f64),
    where NumPy 2, JAX and torch keep f32; a NumPy scalar keeps its dtype."""
    x = np.array([0.5, -2.0], np.float32)
    for y in (0.5, 2):
        got = M.mul_sin(x, y)
        assert got.dtype == (x * y).dtype == np.float32
        np.testing.assert_allclose(got, x * y + np.sin(x), rtol=1e-6)
        g = dsl.grad(M.mul_sin, wrt=1)(x, y)
        assert g.dtype == np.float32 and g == np.float32(-1.5)
    assert M.mul_sin(x, np.float64(0.5)).dtype == (x * np.float64(0.5)).dtype == np.float64
    assert M.mul_sin(x.astype(np.float64), 0.5).dtype == np.float64
    assert M.mul_sin(np.array([1, 2]), 0.5).dtype == np.float64  # no float array
    # (the number is f32 by the call's arrays, which the error says: y has no annotation)
    with pytest.raises(dsl.ArgumentError, match=r"argument 'y' of mul_sin\(\) \(a Python "
                                                r"number, f32 here\) is out of range for f32"):
        M.mul_sin(x, 1e300)


def test_a_python_bool_is_weakly_typed_as_a_python_number_is():
    """f32 x times True was f64 (a Python bool for a float was made f64),
    where NumPy 2 and JAX keep f32, as for the Python int 1."""
    x = np.array([0.5, -2.0], np.float32)
    for y in (True, False):
        got = M.mul_sin(x, y)
        assert got.dtype == (x * y).dtype == np.float32
        np.testing.assert_array_equal(got, x * np.float32(y) + np.sin(x))
        g = dsl.grad(M.mul_sin, wrt=1)(x, y)
        assert g.dtype == np.float32 and g == np.float32(-1.5)
    assert M.mul_sin(x.astype(np.float64), True).dtype == np.float64


def test_a_python_float_for_a_const_is_weakly_typed_as_its_default_is():
    """Passing a const's default explicitly (`smooth(x, 0.0)`) turned an f32
    loss f64: the default is weakly typed, the Python float passed was f64."""
    m = dsl.loads("def smooth(x, s: const = 0.0):\n    return sum(x * (1.0 - s))\n"
                  "def total(x, axis: const):\n    return sum(x, axis)\n")
    x = np.array([0.5, -2.0, 3.0], np.float32)
    assert m.smooth(x, 0.0).dtype == m.smooth(x).dtype == np.float32
    assert m.smooth(x, 0.1) == np.sum(x * np.float32(0.9))
    assert m.smooth(x.astype(np.float64), 0.1).dtype == np.float64
    np.testing.assert_array_equal(m.total(np.ones((2, 3), np.float32), 1), [3, 3])  # an axis


class _Foreign:
    """Another library's array as NumPy sees it (a JAX array, a CPU torch
    tensor): only `__array__`."""

    __module__ = "torch._tensor"  # (as torch's: its errors name to_torch)

    def __init__(self, array, requires_grad=False):
        self.array, self.requires_grad = array, requires_grad

    def __array__(self, dtype=None, copy=None):
        if self.requires_grad:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad.")
        return self.array


def test_another_librarys_array_keeps_its_dtype():
    """An f32 JAX array or torch tensor passed to a function was made f64,
    as a Python list is; a tensor requiring grad raised torch's own error."""
    x = np.array([0.5, -2.0], np.float32)
    got = M.mul_sin(_Foreign(x), _Foreign(x))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, x * x + np.sin(x), rtol=1e-6)
    with pytest.raises(dsl.ArgumentError, match=r"argument 'y' of mul_sin\(\) cannot be read "
                       r"as a NumPy array \(Can't call.*through dsl.to_torch\(f\)"):
        M.mul_sin(x, _Foreign(x, requires_grad=True))


class _Tracer:
    """A JAX tracer as NumPy sees it: `__array__` raises JAX's error, whose
    message is three lines."""

    __module__ = "jax._src.interpreters.partial_eval"

    def __array__(self, dtype=None, copy=None):
        raise TypeError("The numpy.ndarray conversion method __array__() was called on traced "
                        "array with shape float32[3]\nThe error occurred while tracing the "
                        "function <lambda> for jit.\nSee https://docs.jax.dev/errors.html")


def test_another_librarys_error_of_several_lines_is_one_line_of_the_message():
    # its line breaks were shown as U+FFFD in the message, which is one line
    with pytest.raises(dsl.ArgumentError) as caught:
        M.mul_sin(np.ones(3), _Tracer())
    first = str(caught.value).split("\n")[0]
    assert first.endswith("(The numpy.ndarray conversion method __array__() was called on "
                          "traced array with shape float32[3]; The error occurred while "
                          "tracing the function <lambda> for jit; See "
                          "https://docs.jax.dev/errors.html); call the function through "
                          "dsl.to_jax(f), which JAX transforms")
    assert "\ufffd" not in str(caught.value)


def test_another_librarys_array_set_as_a_param_takes_the_params_dtype():
    """A JAX array or CPU torch tensor set as a param was bound as an
    argument is, keeping its dtype: JAX's default f32 for an f64 param (or
    its i32 for i64) was refused, where the same NumPy array is converted."""
    M.params["n"] = _Foreign(np.array(3, np.int32))
    assert M.params["n"].dtype == np.int64
    np.testing.assert_array_equal(M.times(np.arange(3.0)), [0.0, 3.0, 6.0])
    given = np.array([1.5, -2.5])  # f64 for `param w: f32[2]`
    M.params["w"] = _Foreign(given)
    assert M.params["w"].dtype == np.float32
    np.testing.assert_array_equal(M.params["w"], [1.5, -2.5])
    given[0] = 7.0  # the store holds a copy of its own
    assert M.params["w"][0] == 1.5
    with pytest.raises(dsl.ArgumentError, match=r"param 'w' is out of range for f32"):
        M.params["w"] = _Foreign(np.array([1e300, 0.0]))
    with pytest.raises(dsl.ArgumentError, match=r"param 'w' cannot be read as a NumPy array"):
        M.params["w"] = _Foreign(given, requires_grad=True)

def test_wrt_takes_numpy_integers():
    x, y = np.array([0.5, 2.0]), np.array([-1.0, 3.0])
    for k in np.arange(2):
        np.testing.assert_allclose(dsl.grad(M.mul_sin, wrt=k)(x, y),
                                   central_difference(mul_sin, [x, y], int(k)), rtol=1e-6)
    gx, gy = dsl.jacrev(M.mul_sin, wrt=(np.int32(0), np.int64(1)))(x, y)
    np.testing.assert_allclose(np.diag(gy), x, rtol=1e-14)
    with pytest.raises(dsl.ArgumentError, match="positions or names"):
        dsl.grad(M.mul_sin, wrt=np.bool_(True))



def test_threads_calling_one_function_with_other_shapes_dtypes_and_sizes():
    """Six threads start at once on functions none has called: out=
    buffers, jvp, a segment count compiled for by value, a loop's
    gradient, in f32 and f64 and six shapes."""
    import threading
    m = dsl.loads("def mul_sin(x, y):\n    return x * y + sin(x)\n\n"
                  "def pool(v, ids, count: i64):\n    return segment_sum(v, ids, count)\n")
    shapes = [(3,), (2, 4), (), (1, 3), (0,), (5,)]
    failures, start = [], threading.Barrier(6)

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        start.wait()
        for k in range(12):
            dtype = (np.float64, np.float32)[(seed + k) % 2]
            x, y = (rng.normal(size=shapes[(seed + k) % 6]).astype(dtype) for _ in range(2))
            tol = dict(rtol=1e-5, atol=1e-6)
            try:
                if k % 4 == 0:
                    buf = np.empty(x.shape, dtype)
                    ok = m.mul_sin(x, y, out=buf) is buf and np.allclose(buf, mul_sin(x, y),
                                                                         **tol)
                elif k % 4 == 1:
                    value, tangent = dsl.jvp(m.mul_sin, (x, y), (y, x))
                    ok = np.allclose(tangent, y * (y + np.cos(x)) + x * x, **tol)
                elif k % 4 == 2:
                    count = int(rng.integers(1, 4))
                    ids = rng.integers(0, count, size=5)
                    values = rng.normal(size=5)
                    want = np.zeros(count)
                    np.add.at(want, ids, values)
                    ok = np.allclose(m.pool(values, ids, count), want)
                else:
                    ok = np.allclose(dsl.grad(m.mul_sin)(x, y), y + np.cos(x), **tol)
            except Exception as err:  # noqa: BLE001 (reported below)
                ok = repr(err)
            if ok is not True:
                failures.append((seed, k, ok))

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


# --------------------------------------------- any argument, by Hypothesis

_DTYPES = ["f8", "f4", "i8", "i4", "?", ">f8", ">f4", "<i4", "i1", "u8", "f2", "c16"]
_SUPPORTED = {np.dtype(d) for d in ("f8", "f4", "i8", "i4", "?")}


def _layouts(a: np.ndarray):
    """a, and views of the same values laid out otherwise."""
    yield a
    if a.ndim:
        yield np.asfortranarray(a)
        doubled = np.repeat(a, 2, axis=-1)[..., ::2]  # strided
        yield doubled
        yield a[..., ::-1][..., ::-1]  # negative strides twice: the same values
    if a.ndim == 2 and a.shape[0] == 1:
        yield np.broadcast_to(a, (1,) + a.shape[1:])  # a read-only view


@st.composite
def arguments(draw):
    """A value, and what a call must make of it: (dtype, ndarray) or None
    when it must be refused."""
    kind = draw(st.sampled_from(["python", "list", "array"]))
    shape = draw(st.sampled_from([(), (3,), (1, 3), (2, 3), (0,), (2, 0)]))
    halves = draw(st.lists(st.integers(-3, 3), min_size=6, max_size=6))
    values = np.array(halves, float)[:int(np.prod(shape))].reshape(shape) / np.array(2.0)
    if kind == "python":
        value = float(values.flat[0]) if values.size else 0.5
        return value, np.array(value)
    if kind == "list":
        return values.tolist(), values
    dtype = np.dtype(draw(st.sampled_from(_DTYPES)))
    array = (values * 2 if dtype.kind in "iu" else values).astype(dtype)
    layout = draw(st.sampled_from(list(_layouts(array))))
    native = np.dtype(dtype.newbyteorder("="))
    return layout, (array.astype(native) if native in _SUPPORTED else None)


def _float_result(x, y):
    """mul_sin's value by NumPy, in f64."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    return x * y + np.sin(x)


@settings(max_examples=40, deadline=None)
@given(arguments(), arguments(), st.booleans())
def test_any_pair_of_arguments_is_computed_with_or_refused(x, y, keyword):
    (xv, xa), (yv, ya) = x, y
    call = (lambda: M.mul_sin(xv, y=yv)) if keyword else (lambda: M.mul_sin(xv, yv))
    if xa is None or ya is None:
        with pytest.raises(dsl.ArgumentError, match="unsupported dtype"):
            call()
        return
    try:
        want = _float_result(xa, ya)
    except ValueError:  # shapes that do not broadcast: an error at the multiply
        with pytest.raises(dsl.GradError, match="do not broadcast"):
            call()
        return
    got = call()
    assert got.shape == want.shape and got.dtype.kind == "f"
    tight = got.dtype == np.float64 and xa.dtype.itemsize == 8 != 4
    np.testing.assert_allclose(got, want, rtol=1e-14 if tight else 1e-6, atol=1e-7)
    if xa.dtype.kind == "f" and xa.size and want.shape == xa.shape:
        gx = dsl.grad(M.mul_sin)(xv, yv)
        np.testing.assert_allclose(gx, ya + np.cos(xa.astype(np.float64)) + 0 * want,
                                   rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name, value, message", [
    ("w", np.ones(3), "param 'w' has size 3 on axis 0, but its annotation says 2"),
    ("w", "abc", "param 'w' is not numeric"),
    ("n", [1, 2], r"param 'n' has rank 1 \(shape \[2\]\)"),
    # (it said "only a `const` parameter of no dtype (such as `axis: const`) takes None")
    ("w", None, r"param 'w' cannot be set to None: a param holds an array; to unset it, "
                r"del module.params\['w'\]\n"),
])
def test_a_bad_param_value_is_named_as_the_param(name, value, message):
    """It was named "argument 'w' of param w()"; it is at the param's
    declaration (`test_errors.py`)."""
    with pytest.raises(dsl.ArgumentError, match=rf"^<string>:\d+:1: error: {message}"):
        M.params[name] = value


def test_deleting_a_param_not_declared_or_not_set_names_the_params():
    # a bare KeyError: 'z', where setting 'z' says which params there are
    store = dsl.loads("param w: f64[2]\n").params
    with pytest.raises(KeyError, match=r"error: <string> declares no param 'z' \(params: w\)"):
        del store["z"]
    with pytest.raises(KeyError, match=r"error: param 'w' is not set, so it cannot be deleted"):
        del store["w"]
    store["w"] = [1.0, 2.0]
    del store["w"]
    assert "w" not in store and store.get("w") is None


def test_an_update_of_params_that_refuses_one_value_sets_none():
    """MutableMapping's update set w before refusing n (or an undeclared
    name): a training step's `params.update(new)` left them half-updated."""
    M.params.update(w=[1.0, 2.0], n=3)
    for bad in ({"w": [5.0, 6.0], "n": [1, 2]}, {"w": [5.0, 6.0], "bias": 1.0}):
        with pytest.raises(dsl.ArgumentError, match="param 'n' has rank 1|declares no param"):
            M.params.update(bad)
        np.testing.assert_array_equal(M.params["w"], [1.0, 2.0])
        assert M.params["n"] == 3
    M.params.update([("w", [5.0, 6.0])], n=4)  # pairs and keywords, as dict.update takes
    assert M.params["w"].dtype == np.float32 and M.params["n"] == 4
    np.testing.assert_array_equal(M.params["w"], [5.0, 6.0])


def test_size_names_of_params_agree_with_each_other_and_with_the_arguments():
    """`param w: f64[d, h]` and `param b: f64[h]` of sizes 3 and 4 were
    taken (a broadcast error in the body, or none at all where b's and w's
    sizes never meet)."""
    m = dsl.loads("param w: f64[d, h]\nparam b: f64[h]\ndef f(x: f64[n, d]):\n"
                  "    return sum(x @ w) * sum(b)\n", "p.grad")
    m.params["w"], m.params["b"] = np.ones((2, 3)), np.ones(4)
    for call in (m.f, dsl.grad(m.f, wrt="w")):
        with pytest.raises(dsl.ArgumentError, match="param 'w' has size 3 on axis 1, but its "
                                                    "annotation says h, which is 4 for 'b'"):
            call(np.ones((5, 2)))
    m.params["b"] = np.ones(3)
    assert m.f(np.ones((5, 2))) == 5 * 3 * 2 * 3
    with pytest.raises(dsl.ArgumentError, match="param 'w' has size 2 on axis 0, but its "
                                                "annotation says d, which is 3 for 'x'"):
        m.f(np.ones((5, 3)))


def test_a_declared_params_value_is_a_copy_and_arguments_of_their_dtype_are_not_copied():
    from gradlang.runtime.args import cast
    m = dsl.loads("param w: f64[2]\ndef f(x):\n    return x * w\n")
    w = np.array([1.0, 2.0])
    m.params["w"] = w
    w[0] = 100.0  # the caller's array, not the module's
    np.testing.assert_array_equal(m.f(np.ones(2)), [1.0, 2.0])
    # an array already of the dtype passes through unchecked and uncopied
    # (an hvp's v was copied and scanned on every call)
    v = np.arange(3.0)
    assert cast("v", v, "f64", None) is v
    with pytest.raises(dsl.ArgumentError, match="out of range for f32"):
        cast("v", np.array([1e39]), "f32", None)


@pytest.mark.parametrize("call", [
    lambda a: dsl.vjp(M.mul_sin, np.ones(2), np.ones(2))[1](a),
    lambda a: dsl.jvp(M.mul_sin, (np.ones(2), np.ones(2)), (a, None)),
    lambda a: dsl.hvp(M.cube)(np.ones(2), a),
], ids=["pullback", "jvp", "hvp"])
def test_an_object_array_of_small_integers_is_refused_by_its_dtype(call):
    """A cotangent, tangent or v given as an object array was said to hold
    'an integer beyond 64 bits' (its 1s walked as Python integers)."""
    with pytest.raises(dsl.ArgumentError, match=r"has unsupported dtype object; use float32"):
        call(np.array([1, 2], dtype=object))
    with pytest.raises(dsl.ArgumentError, match=r"has unsupported dtype datetime64\[D\]"):
        call(np.array(["2020-01-01"] * 2, dtype="M8[D]"))
