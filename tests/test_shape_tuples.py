"""Compile-time tuples as Python's: a shape sliced (`x.shape[1:]`,
`x.shape[::-1]`), joined (`x.shape[:-1] + (k, m)`), repeated (`(1,) *
x.ndim`) and counted (`len(x.shape)`), as a NumPy or JAX user builds the
shape of a `reshape`; and a clear error, at the operand, for a bound known
only at run time or a tuple where an array is needed."""
import numpy as np
import pytest

import dsl

SOURCE = """
def f(x, w):
    a = reshape(x, x.shape[::-1])
    b = reshape(x, x.shape[:-1] + (2, 3))
    c = broadcast_to(w, (1,) * (len(x.shape) - 1) + x.shape[-1:])
    d = reshape(x, (1,) + x.shape[1:] + (x.shape[0], 5)[0:1:-1] + (x.shape[0],))
    e = reshape(x, x.shape[-1:-3:-1])
    g = reshape(x, [x.shape[0]] + [2, 3][::-1])
    return sum(a * a) + sum(b[:, 1, :] * 3.0) + sum(c * x) + sum(d[0, :, 1] * w) + e[5, 0] \
        + sum(g[:, 2, 0])
"""


def test_a_shape_slices_joins_and_repeats_as_a_python_tuple():
    """Each spelling was an error ("a tuple takes one integer index",
    "arithmetic on a tuple is not supported", "unknown function 'len'")."""
    m = dsl.loads(SOURCE)
    x = np.arange(24.0).reshape(4, 6) / 10
    w = np.linspace(-1.0, 1.0, 6)

    def numpy_f(x, w):
        a = x.reshape(x.shape[::-1])
        b = x.reshape(x.shape[:-1] + (2, 3))
        c = np.broadcast_to(w, (1,) * (len(x.shape) - 1) + x.shape[-1:])
        d = x.reshape((1,) + x.shape[1:] + (x.shape[0],))
        e = x.reshape(x.shape[-1:-3:-1])
        g = x.reshape([x.shape[0]] + [2, 3][::-1])
        return (a * a).sum() + (b[:, 1, :] * 3.0).sum() + (c * x).sum() \
            + (d[0, :, 1] * w).sum() + e[5, 0] + g[:, 2, 0].sum()

    np.testing.assert_allclose(m.f(x, w), numpy_f(x, w), rtol=1e-12)
    gx, gw = dsl.grad(m.f, wrt=(0, 1))(x, w)
    for got, arg in ((gx, 0), (gw, 1)):
        want = np.zeros_like((x, w)[arg])
        for i in np.ndindex(want.shape):  # central differences, exact here up to rounding
            h = np.zeros_like(want)
            h[i] = 1e-6
            args = [x, w]
            args[arg] = (x, w)[arg] + h
            up = numpy_f(*args)
            args[arg] = (x, w)[arg] - h
            want[i] = (up - numpy_f(*args)) / 2e-6
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("body, col, text", [
    ("return reshape(x, x.shape[:sum(x > 0.0)])", 32,  # (a run-time count)
     "a tuple's index and slice bounds must be known at compile time (a literal, x.shape[k], "
     "x.ndim, or arithmetic on them); this one is computed at run time (as a `for` loop's "
     "index is: a loop runs, it is not unrolled)"),
    ("return reshape(x, x.shape[::0])", 33, "slice step cannot be zero"),
    ("return reshape(x, (1,) * 10 ** 12 + x.shape)", 23,
     "a tuple of 1000000000000 items is too long (at most 100000)"),
    # (as repeating one is: `t = t + t` 40 times made 2**40 items)
    ("return reshape(x, (1,) * 70000 + (1,) * 70000 + x.shape)", 23,
     "a tuple of 140000 items is too long (at most 100000)"),
    # (NumPy's ValueError "maximum supported dimension ... 64" at run time)
    ("return reshape(x, (1,) * 63 + x.shape)", 12,
     "a value of 65 axes: an array has at most 64 (NumPy's limit)"),
    ("return reshape(x, x.shape[0, 1])", 23, "a tuple takes one integer index or one slice"),
    ("return x + x.shape", 16, "a tuple cannot be used as an array here: + joins two tuples "
                               "(x.shape + (1,)), and the other operand is an array "
                               "(f64[2, 3]); build an array with stack([...])"),
    ("return reshape(x, x.shape + 1)", 23, "and the other operand is a number"),
    ("return x.shape[:1] + x", 12, "a tuple cannot be used as an array here"),
    ("return reshape(x, x.shape + [1])", 23, "can only concatenate a tuple to a tuple, not a "
                                             "list (as in Python: write both as tuples"),
    ("return reshape(x, x.shape * 2.0)", 33, "a tuple can only be repeated (* n) a "
                                             "compile-time integer number of times, not by a "
                                             "number"),
    ("return reshape(x, (1,) * sum(x > 0.0) + x.shape)", 30, "not by an array"),
    ("return reshape(x, x.shape - (1,))", 23, "- does not apply to a tuple"),
    ("return x * len(x)", 16, "len() takes a compile-time tuple or list (len(x.shape) is "
                              "x.ndim); the length of an array's first axis is x.shape[0]"),
])
def test_a_tuple_misused_is_an_error_at_its_operand(body, col, text):
    m = dsl.loads(f"def f(x, n: i64):\n    {body}\n", "bad.grad")
    with pytest.raises(dsl.GradError) as info:
        m.f(np.ones((2, 3)), 1)
    err = info.value
    assert (err.file, err.line, err.col) == ("bad.grad", 2, col), str(err)
    assert text in err.message, str(err)
    assert str(err).splitlines()[-1].strip().startswith("^"), str(err)


@pytest.mark.parametrize("start, assign, text", [
    ("(1,)", "t + (1,)", "'t' is a tuple where a loop that assigns it starts"),
    ("0.0", "x.shape", "'t' is a tuple assigned in a loop"),
    ("[1, 2]", "sum(x)", "'t' is a list where a loop that assigns it starts"),
])
def test_a_tuple_a_loop_would_carry_is_an_error_at_its_assignment(start, assign, text):
    # it said "a tuple cannot be used as an array here", at the `for`
    m = dsl.loads(f"def f(x):\n    t = {start}\n    for i in range(3):\n"
                  f"        t = {assign}\n    return x\n", "loop.grad")
    with pytest.raises(dsl.GradError) as info:
        m.f(np.ones(2))
    err = info.value
    assert (err.line, err.col) == (4, 9), str(err)
    assert err.message.startswith(text + ": a loop runs, it is not unrolled"), str(err)
