"""List literals `[a, b]`: the NumPy spelling of a compile-time sequence,
taken wherever a tuple is (stack/concatenate, shapes, axes, unpacking,
indexing), and a clear error where an array is needed."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import dsl
from gradlang.compiler import ast
from gradlang.compiler.parser import parse
from helpers import central_difference

SOURCE = """
def stack0(a, b):
    return stack([a, b * 2.0])
def stack_last(a, b):
    return stack([a * b, b, a,], axis=-1)
def cat0(a, b):
    return concatenate([a, b, a * b], axis=0)
def cat1(a, b):
    return concatenate([a, exp(b)], axis=1)
def weighted(a, b, u):
    return sum(concatenate([stack([a, b], axis=1), reshape(a * b, [3, 1])], axis=1) * u)
def shapes(a):
    return reshape(transpose(broadcast_to(a, [2, 3]), [1, 0]), [2, 3])
def shapes_tuple(a):
    return reshape(transpose(broadcast_to(a, (2, 3)), (1, 0)), (2, 3))
def unpack(a, b):
    p, q = [a, b * 3.0]
    return p - q + [a, b][1]
"""


@pytest.fixture(scope="module")
def m():
    return dsl.loads(SOURCE, "lists.grad")


def test_a_list_parses_to_one_node_with_its_span():
    e = parse("def f(a):\n    return [a, a * 2,]\n").funcs[0].body[0].items[0].value
    assert isinstance(e, ast.ListExpr) and len(e.items) == 2
    assert (e.span.line, e.span.col, e.span.end_col) == (2, 12, 23)
    empty = parse("def f(a):\n    return []\n").funcs[0].body[0].items[0].value
    assert empty == ast.ListExpr((), empty.span)


def test_stack_and_concatenate_of_lists_match_numpy(m):
    a, b = np.array([[1.0, -2.0], [0.5, 3.0]]), np.array([[4.0, 0.25], [-1.0, 2.0]])
    np.testing.assert_allclose(m.stack0(a, b), np.stack([a, b * 2]))
    np.testing.assert_allclose(m.stack_last(a, b), np.stack([a * b, b, a], axis=-1))
    np.testing.assert_allclose(m.cat0(a, b), np.concatenate([a, b, a * b], axis=0))
    np.testing.assert_allclose(m.cat1(a, b), np.concatenate([a, np.exp(b)], axis=1))


@settings(max_examples=10, deadline=None)
@given(st.data())
def test_gradients_through_lists_match_central_differences(m, data):
    elems = st.floats(-3, 3)
    a = data.draw(arrays(np.float64, 3, elements=elems))
    b = data.draw(arrays(np.float64, 3, elements=elems))
    u = data.draw(arrays(np.float64, (3, 3), elements=elems))

    def reference(a, b):
        return np.sum(np.concatenate([np.stack([a, b], axis=1), (a * b)[:, None]],
                                     axis=1) * u)

    ga, gb = dsl.grad(m.weighted, wrt=(0, 1))(a, b, u)
    np.testing.assert_allclose(ga, central_difference(reference, [a, b], 0), atol=1e-6)
    np.testing.assert_allclose(gb, central_difference(reference, [a, b], 1), atol=1e-6)


def test_lists_are_shapes_and_axes_as_tuples_are(m):
    a = np.array([1.0, 2.0, 3.0])
    expected = np.broadcast_to(a, (2, 3)).T.reshape(2, 3)
    np.testing.assert_array_equal(m.shapes(a), expected)
    np.testing.assert_array_equal(m.shapes_tuple(a), expected)


def test_lists_unpack_and_index(m):
    a, b = np.array([1.0, 2.0]), np.array([5.0, 7.0])
    np.testing.assert_allclose(m.unpack(a, b), a - 3 * b + b)


def test_linear_poly_example_uses_a_list():
    from pathlib import Path
    source = (Path(__file__).resolve().parent.parent / "examples" / "linear_poly.grad")
    assert "weights=stack([sum(dpoly), sum(dpoly * x)])" in source.read_text()


def call_error(source: str, *args) -> dsl.GradError:
    mod = dsl.loads(source, "bad.grad")
    with pytest.raises(dsl.GradError) as info:
        mod.f(*args)
    return info.value


X = np.array([1.0, 2.0])


@pytest.mark.parametrize("body,col,text", [
    ("return x + [1.0, 2.0]", 16, "a list cannot be used as an array here: + joins two "
                                  "lists (x.shape + (1,)), and the other operand is an array "
                                  "(f64[2]); build an array with stack([...])"),
    ("return stack([])", 12, "stack() takes a non-empty list (or tuple) of arrays"),
    ("return concatenate(x)", 12, "concatenate() takes a non-empty list (or tuple)"),
    ("return -[x]", 12, "cannot negate a list"),
    ("return [x, x] * 2.0", 21, "a list can only be repeated (* n) a compile-time integer "
                                "number of times, not by a number"),
    ("return [x, x] - [x]", 12, "- does not apply to a list"),
    ("return [x][None]", 12, "a list takes one integer index or one slice"),
    ("return [x][3]", 16, "index 3 is out of range for a list of length 1"),
    ("return reshape(x, [2.5])", 12, "a shape must be a compile-time tuple or list"),
    ("return g([x, x])", 12, "argument 'a' of g() must be an array, not a list"),
])
def test_a_list_where_an_array_is_needed_is_an_error_at_its_span(body, col, text):
    err = call_error(f"def g(a: f64[n]):\n    return a\ndef f(x):\n    {body}\n", X)
    assert (err.file, err.line, err.col) == ("bad.grad", 4, col), str(err)
    assert text in err.message, str(err)
    assert "^" in str(err).splitlines()[-1]


def test_a_list_with_a_missing_bracket_is_a_syntax_error():
    with pytest.raises(dsl.GradError) as info:
        dsl.loads("def f(x):\n    return stack([x, x)\n", "bad.grad")
    assert (info.value.line, info.value.col) == (2, 23)
    assert "unexpected ')'; expected ',' or ']'" in info.value.message


def test_the_empty_tuple_is_no_axes_and_the_scalar_shape_as_in_numpy():
    """`()` was "syntax error: unexpected ')'": `sum(x, axis=())` reduces
    nothing, `reshape(x, ())` makes a scalar, `x.shape == ()` asks for one."""
    m = dsl.loads("def f(x):\n    return sum(x * x, axis=()), mean(x, axis=())\n"
                  "def g(x):\n    if x.shape == ():\n        y = x * 2.0\n    else:\n"
                  "        y = reshape(x, ())\n    return y\n")
    x = np.array([[1.0, -2.0, 3.0]])
    for got, want in zip(m.f(x), (np.sum(x * x, axis=()), np.mean(x, axis=())), strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(dsl.grad(m.f)(x), 2 * x + 1)
    assert m.g(np.array(2.5)) == 5.0 and m.g(np.array([4.0])).shape == ()
    with pytest.raises(dsl.GradError, match=r"f\(\) returns a tuple as a result, which only "
                                            "another function can take"):
        dsl.loads("def f(x):\n    return ()\n").f(x)
