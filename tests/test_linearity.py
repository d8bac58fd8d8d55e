"""Grad blocks must be linear in their upstream cotangents: checked at
`dsl.load`, with the offending operation's line and column (issue 11)."""
from pathlib import Path

import numpy as np
import pytest

import dsl
from gradlang.compiler import ops, staging
from gradlang.compiler.modules import STDLIB

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def block(ret: str, extra: str = "") -> str:
    return f"{extra}def f(x, y):\n    return x * y\ngrad(dy):\n    return {ret}\n"


def load_error(source: str) -> dsl.GradError:
    with pytest.raises(dsl.GradError) as info:
        dsl.loads(source, "lin.grad")  # at load: nothing is called
    return info.value


@pytest.mark.parametrize("ret,col,what", [
    ("dy * dy * y, dy * x", 12, "a product of two values that depend on them"),
    ("abs(dy), dy * x", 12, "abs() of a value"),
    ("where(dy > 0, dy, 0), dy * x", 18, "a comparison of a value"),
    ("exp(dy) * y, dy * x", 12, "exp() of a value"),
    ("dy + 1, dy * x", 12, "affine"),
    ("dy * y, y * 2", 20, "the cotangent for 'y' does not depend on them"),
    ("maximum(dy, 0) * y, dy * x", 12, "maximum() of a value"),
    ("dy * y, x / dy", 20, "a quotient"),
    # a value of another dtype is no index: a bool or integer one free of
    # the upstream was taken for zero (`x > 0` here was a gradient of 1)
    ("dy * y, x > 0", 20, "the cotangent for 'y' does not depend on them"),
    ("dy * y, (x > 0) + dy", 20, "affine"),
    ("dy * y, dy - x.shape[0] * (y > 0)", 20, "affine"),
    # (a run-time initial is the maximum of it and the reduction)
    ("dy * y, dy * x + max(x, initial=sum(dy))", 29, "maximum() of a value"),
])
def test_a_block_not_linear_in_its_upstream_is_an_error_at_load(ret, col, what):
    err = load_error(block(ret))
    assert "grad block 1 of f() (line 3) is not linear" in err.message
    assert what in err.message
    assert (err.file, err.line, err.col) == ("lin.grad", 4, col), str(err)
    assert str(err).splitlines()[-1].strip().startswith("^")


def test_the_issues_forms_are_rejected():
    body = "def g(x):\n    return x * x\ngrad(dy):\n    return {}\n"
    for ret in ("dy * dy * x", "abs(dy)", "where(dy > 0, dy, 0)"):
        assert "is not linear" in load_error(body.format(ret)).message


def test_a_nonlinear_use_through_a_called_function_points_into_it():
    helper = "def square(v):\n    return v * v\n\n"
    err = load_error(block("square(dy) * y, dy * x", helper))
    assert (err.line, err.col) == (2, 12), str(err)
    assert "grad block 1 of f() (line 6)" in err.message


def test_a_nonlinear_use_through_a_function_with_a_block_is_found_in_its_body():
    # found in std's body, and reported at the user's call of it, std's
    # place a note (it was at std.grad's line, which the user did not write)
    lines = (STDLIB / "std.grad").read_text().split("\n")
    line = lines.index("    return maximum(x, 0) + log1p(exp(-abs(x)))") + 1
    err = load_error(block("softplus(dy) * y, dy * x", "from std import softplus\n"))
    assert str(err) == (
        "lin.grad:5:12: error: grad block 1 of f() (line 4) is not linear in its upstream "
        "cotangents: maximum() of a value that depends on them\n"
        "        return softplus(dy) * y, dy * x\n"
        "               ^^^^^^^^^^^^\n"
        f"note: in std function softplus(), at std.grad:{line}:12")
    # through a function of the user's: its note first, as for an error in it
    err = load_error(block("h(dy) * y, dy * x", "from std import softplus\n"
                                                 "def h(v):\n    return softplus(v) * 2.0\n"))
    assert str(err) == (
        "lin.grad:3:12: error: grad block 1 of f() (line 6) is not linear in its upstream "
        "cotangents: maximum() of a value that depends on them\n"
        "        return softplus(v) * 2.0\n"
        "               ^^^^^^^^^^^\n"
        "note: in h(), called at lin.grad:7:12\n"
        f"note: in std function softplus(), at std.grad:{line}:12")


def test_a_second_block_must_be_linear_in_its_own_upstream():
    src = ("def f(x):\n    return x * x\ngrad(dy):\n    return dy * 2 * x\n"
           "grad(ddx):\n    return dy=ddx * 2 * x, x=ddx * ddx\n")
    err = load_error(src)
    assert "grad block 2 of f() (line 5)" in err.message and (err.line, err.col) == (6, 30)


def test_a_block_may_take_the_gradient_of_a_quadratic_of_its_upstream():
    # grad(e)(dy) is dy: linear, though e's forward sweep computes dy * dy,
    # which nothing reads (it was refused, at e's line)
    m = dsl.loads(block("grad(e)(dy) * y, dy * x", "def e(v):\n    return 0.5 * v * v\n"))
    _, pullback = dsl.vjp(m.f, 2.0, 3.0)
    assert pullback(5.0) == (15.0, 10.0)
    assert dsl.jvp(m.f, (2.0, 3.0), (1.0, 7.0)) == (6.0, 17.0)


def test_a_tangent_in_a_block_not_linear_in_its_upstream_points_at_the_jvp():
    # the tangent 2 * dy * dy: its products, which the jvp's rules made, had
    # no place (the error fell back to the block's line), and the walk
    # stopped first at the forward value dy * dy, which nothing reads
    err = load_error(block("jvp(h)(dy, dy)[1] * y, dy * x", "def h(v):\n    return v * v\n"))
    assert "grad block 1 of f() (line 5) is not linear" in err.message
    assert (err.line, err.col) == (6, 12), str(err)


X, Y = np.array([-1.0, 2.0, 0.5]), np.array([0.5, 1.0, 3.0])


@pytest.mark.parametrize("ret,dx,dy", [
    ("dy * y, dy * x", Y, X),
    ("where(x > 0, dy, 0) * y + 0, -(dy * x) / 2", [0.0, 1.0, 3.0], -X / 2),
    # sums, broadcasts, products by free values
    ("sum(dy) * y - dy * y * 0, x * dy", 3 * Y, X),
    ("y=0, x=reshape(dy, x.shape) * y", Y, [0.0, 0.0, 0.0]),  # layout ops, named, zero
    ("where(x > y, dy, dy * 3), transpose(dy * x)", [3.0, 1.0, 3.0], X),
])
def test_linear_blocks_load_and_give_their_gradient(ret, dx, dy):
    m = dsl.loads(block(ret))
    _, pullback = dsl.vjp(m.f, X, Y)
    got = pullback(np.ones(3))
    np.testing.assert_allclose(got[0], dx, rtol=1e-12)
    np.testing.assert_allclose(got[1], dy, rtol=1e-12)


def test_a_second_blocks_upstream_may_meet_the_first_blocks_upstream():
    # block 2 is linear in ddx; dy is one of its inputs, held fixed
    m = dsl.loads("def c(x):\n    return x * x * x\ngrad(dy):\n    return dy * 3 * x * x\n"
                  "grad(ddx):\n    return dy=ddx * 3 * x * x, x=ddx * dy * 6 * x\n")
    # (x**3)'' = 6 x, through the second block
    np.testing.assert_allclose(dsl.grad(dsl.grad(m.c))(X), 6 * X, rtol=1e-15)


def test_recompute_and_param_blocks_load_and_give_their_gradients():
    m = dsl.loads("@recompute\ndef f(x):\n    return tanh(x)\ngrad(dy):\n"
                  "    return dy * (1 - tanh(x) * tanh(x))\n")
    np.testing.assert_allclose(dsl.grad(m.f)(X), 1 - np.tanh(X) ** 2, rtol=1e-14)
    m = dsl.loads("param w: f64[2]\ndef f(x):\n    return w[0] * x\ngrad(d):\n"
                  "    return d * w[0], w=stack([sum(d * x), 0 * sum(d)])\n")
    m.params["w"] = np.array([2.5, -2.0])
    dx, dw = dsl.grad(m.f, wrt=(0, "w"))(X)
    np.testing.assert_allclose(dx, [2.5] * 3, rtol=1e-15)
    np.testing.assert_allclose(dw, [np.sum(X), 0.0], rtol=1e-15)


def grad_blocks(text: str) -> set[str]:
    """How the linearity check names each grad block of a source."""
    blocks, function, k = set(), None, 0
    for line, row in enumerate(text.splitlines(), 1):
        if row.startswith("def "):
            function, k = row[4:].split("(")[0], 0
        elif row.startswith("grad("):
            k += 1
            blocks.add(f"grad block {k} of {function}() (line {line})")
    return blocks


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.grad")) + [STDLIB / "std.grad"],
                         ids=lambda p: p.name)
def test_every_example_and_stdlib_block_loads(path, monkeypatch):
    # and each of its blocks was checked at load (a block no signature
    # lowers is checked only when called: a load that passed would say
    # nothing of it)
    checked = []
    check = staging.check_linear
    monkeypatch.setattr(staging, "check_linear",
                        lambda fn, upstream, where, *rest, **options: checked.append(where)
                        or check(fn, upstream, where, *rest, **options))
    dsl.load(path)
    assert grad_blocks(path.read_text()) <= set(checked), checked


def test_linearity_lives_in_the_op_table():
    linear = {name for name, op in ops.OPS.items() if op.linear}
    assert {"add", "sub", "neg", "mul", "div", "where", "reduce_sum", "reshape",
            "broadcast_to", "matmul", "concatenate"} <= linear
    assert not linear & {"exp", "abs", "maximum", "pow", "reduce_max", "gt", "sign"}
    # a linear op is transposed by its VJP rule, so it must have one
    assert all(ops.OPS[name].vjp is not None for name in linear)


def test_annotated_and_const_integer_parameters_are_checked_at_load():
    src = ("def f(x: f64[n, m], k: const i64):\n    return sum(x, axis=k)\n"
           "grad(dy):\n    return abs(reshape(dy, (1, x.shape[1]))) * x\n")
    err = load_error(src)
    assert "abs() of a value" in err.message and (err.line, err.col) == (4, 12)


def test_a_block_no_representative_signature_lowers_is_checked_at_first_call():
    # x.shape[0] == 4 holds for none of the representative shapes
    src = ("def f(x):\n    return x[3] * x\ngrad(dy):\n    return dy * dy * x\n")
    m = dsl.loads(src)
    with pytest.raises(dsl.GradError, match="a product of two values"):
        m.f(np.arange(4.0))


@pytest.mark.parametrize("reduction", ["max", "min"])
def test_a_max_or_min_of_the_upstream_is_named_as_the_source_does(reduction):
    # (a scalar dy, the representative signature, has nothing to reduce: the
    # vector's is checked at the call) the message named the IR's reduce_max
    m = dsl.loads(block(f"{reduction}(dy) * ones_like(x), dy * x"), "lin.grad")
    with pytest.raises(dsl.GradError) as info:
        m.f(np.ones(2), np.ones(2))
    assert "is not linear in its upstream cotangents: a max() or min() reduction of a " \
           "value that depends on them" in info.value.message
    assert (info.value.line, info.value.col) == (4, 12)


def test_gathers_and_scatters_of_the_upstream_are_linear():
    # (indices are held fixed; the data they move is the linear part)
    dsl.loads("def g(x, i: i64[k]):\n    return take(x, i)\ngrad(dy):\n"
              "    return scatter_add(zeros_like(x), i, dy)\n")
    dsl.loads("def g(x, i: i64[k]):\n    return x * 2\ngrad(dy):\n"
              "    return take(dy, i) * 0 + dy * 2\n")
    err = load_error("def g(x, i: i64[k]):\n    return take(x, i)\ngrad(dy):\n"
                     "    return scatter_add(ones_like(x), i, dy)\n")
    assert "affine" in err.message


def test_a_blocks_loop_result_free_of_the_upstream_is_computed_in_its_transpose():
    # k, carried beside the sum, is no linear value: the transpose (forward
    # mode) taped the loop whole, never computed k, and fusion raised a
    # KeyError on `acc * 2 / k`
    m = dsl.loads("def f(x: f64[n]):\n    return x * 2\ngrad(dy):\n    k = 0\n"
                  "    acc = zeros_like(dy)\n    for i in range(3):\n        k = k + 1\n"
                  "        acc = acc + dy\n    return acc * 2 / k\n")
    x, t = np.array([1.0, -2.0, 3.0]), np.array([0.5, 4.0, -1.0])
    np.testing.assert_allclose(dsl.jvp(m.f, (x,), (t,))[1], 2 * t, rtol=1e-12)
    np.testing.assert_allclose(dsl.vjp(m.f, x)[1](t)[0], 2 * t, rtol=1e-12)


_BRANCHES = {
    # a float condition or bound is a type error at any signature where it
    # depends on the upstream (a float): it was held for the first call
    "if": ("    g = dy * x\n    if sum(dy):\n        g = g * 2.0\n    return g\n",
           (5, 8), "an if condition depends on them"),
    "range": ("    g = dy * x\n    n = sum(dy)\n    for i in range(n):\n        g = g + dy\n"
              "    return g\n", (6, 20), "a loop bound depends on them"),
    "range start, loop dead": ("    h = x\n    for i in range(sum(dy), 3):\n        h = h * 2.0\n"
                               "    return dy * x\n", (5, 20), "a loop bound depends on them"),
    # the condition reads a carried value the first trip leaves free of dy
    "carried": ("    g = dy * x\n    s = 0.0\n    for i in range(3):\n        if s:\n"
                "            g = g * 2.0\n        s = s + sum(dy)\n    return g\n",
                (7, 12), "an if condition depends on them"),
    "not": ("    g = dy * x\n    if not sum(dy):\n        g = g * 2.0\n    return g\n",
            (5, 8), "an operand of `and`, `or` or `not` depends on them"),
    "where": ("    return where(dy, dy * x, 0.0)\n", (4, 12),
              "where()'s condition depends on them"),
    # an index is a type error too (it loaded and failed at the call)
    "index": ("    return dy * x[sum(dy)]\n", (4, 19), "an index depends on them"),
    "take": ("    return take(dy, dy) * 0.0 + dy\n", (4, 12), "an index depends on them"),
}


@pytest.mark.parametrize("case", list(_BRANCHES))
def test_a_branch_trip_count_or_index_chosen_by_the_upstream_is_an_error_at_load(case):
    body, at, what = _BRANCHES[case]
    err = load_error("def f(x: f64[n]):\n    return x * x\ngrad(dy):\n" + body)
    assert "grad block 1 of f() (line 3) is not linear in its upstream cotangents: " \
           + what in err.message
    assert (err.file, err.line, err.col) == ("lin.grad", *at), str(err)
    assert str(err).splitlines()[-1].strip().startswith("^")


def test_a_branch_on_the_upstream_in_a_later_block_or_a_called_body_is_found_at_load():
    err = load_error("def f(x: f64[n]):\n    return x * x * x\ngrad(dy):\n"
                     "    return dy * 3.0 * x * x\ngrad(ddx):\n    g = ddx * 6.0 * x * dy\n"
                     "    if sum(ddx):\n        g = g * 2.0\n    return ddx * 3.0 * x * x, g\n")
    assert "grad block 2 of f() (line 5)" in err.message and (err.line, err.col) == (7, 8)
    # in the body of a function with a block of its own, called by the block
    err = load_error("def pick(v, w):\n    r = w\n    if sum(v):\n        r = w * 2.0\n"
                     "    return r\ngrad(d):\n    return 0, d\n"
                     "def f(x: f64[n]):\n    return x * x\ngrad(dy):\n"
                     "    return pick(dy, dy * x)\n")
    assert "grad block 1 of f() (line 10)" in err.message and "an if condition" in err.message
    assert (err.line, err.col) == (3, 8), str(err)


def test_a_float_condition_free_of_the_upstream_is_still_the_calls_type_error():
    # x could be an integer at another signature: the type error is the call's
    m = dsl.loads("def f(x):\n    return x * x\ngrad(dy):\n    g = dy * x\n    if sum(x):\n"
                  "        g = g * 2.0\n    return g\n", "lin.grad")
    with pytest.raises(dsl.GradError, match="an if condition must be known at compile time "
                                            "or be a scalar bool, got f64") as info:
        dsl.grad(m.f)(np.array([1.0, 2.0]))
    assert (info.value.line, info.value.col) == (5, 8)


_COMPILE_TIME = {
    # a value a shape, an axis, a count or a static index needs when the
    # function is compiled, computed from the upstream: no signature
    # compiles it (a cotangent is known only at run time), yet it loaded
    # and failed at the first call
    "axis": ("    return dy * sum(x, axis=sum(dy > 0.0))\n", (4, 17),
             "axis must be a compile-time integer or tuple of integers"),
    "take axis": ("    return take(dy * x, 0, axis=sum(dy > 0.0))\n", (4, 12),
                  "axis must be a compile-time integer"),
    "arange": ("    return dy * x + sum(arange(sum(dy > 0.0)))\n", (4, 25),
               "each argument of arange() must be known when the function is compiled"),
    "reshape": ("    return reshape(dy * x, (sum(dy > 0.0),))\n", (4, 12),
                "a shape must be a compile-time tuple or list of integers"),
    "slice": ("    return dy * x[0:sum(dy > 0.0)]\n", (4, 21), "expected a compile-time integer"),
    "tuple index": ("    return dy * x.shape[sum(dy > 0.0)]\n", (4, 25),
                    "a tuple's index and slice bounds must be known at compile time"),
    "tuple repeat": ("    return dy * x * len((1,) * sum(dy > 0.0))\n", (4, 32),
                     "a tuple can only be repeated (* n) a compile-time integer"),
    "keepdims": ("    return dy * x + sum(x, keepdims=sum(dy) > 0.0)\n", (4, 21),
                 "keepdims must be True or False, known at compile time"),
    # through a loop's result, a called function, a function with a block
    "loop": ("    s = dy\n    for i in range(2):\n        s = s * 2.0\n"
             "    return reshape(dy * x, (sum(s > 0.0),))\n", (7, 12), "a shape must be"),
    # in a loop's body, from the value a carried one starts as
    "loop body": ("    s = dy\n    for i in range(2):\n        s = s + sum(x, axis=sum(s > 0.0))\n"
                  "    return s\n", (6, 17), "axis must be"),
    "call": ("    return dy * pick(dy, x)\ndef pick(v, w):\n    return sum(w, axis=sum(v > 0.0))\n",
             (6, 12), "axis must be"),
    "later block": ("    return dy * 2.0 * x\ngrad(ddx):\n"
                    "    return ddx * 2.0 * x, sum(ddx * dy, axis=sum(ddx > 0.0))\n",
                    (6, 27), "axis must be"),
}


@pytest.mark.parametrize("case", list(_COMPILE_TIME))
def test_a_compile_time_value_computed_from_the_upstream_is_an_error_at_load(case):
    body, at, what = _COMPILE_TIME[case]
    err = load_error("def f(x):\n    return x * x\ngrad(dy):\n" + body)
    assert err.message.startswith(what), str(err)
    assert (err.file, err.line, err.col) == ("lin.grad", *at), str(err)
    assert "computed from the grad block's upstream cotangents" in err.note
    assert "^" in str(err)


def test_a_compile_time_value_free_of_the_upstream_is_still_the_calls_error():
    # x may be an integer argument at another signature: the call's error
    m = dsl.loads("def f(x):\n    return x * x\ngrad(dy):\n"
                  "    return dy * sum(x, axis=sum(x > 0.0))\n", "lin.grad")
    with pytest.raises(dsl.GradError, match="axis must be a compile-time integer") as info:
        dsl.grad(m.f)(np.array([1.0, 2.0]))
    assert (info.value.line, info.value.col) == (4, 17) and not info.value.note
