"""`for` loops and `if` statements: values against NumPy loops, gradients
against central differences in f64 (orders 1 and 2), the reference
interpreter against the compiled code, and the errors they raise."""
import functools
import itertools
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from gradlang.compiler.interpret import interpret
from gradlang.compiler.ir import TensorType, print_function
from gradlang.compiler.pipeline import front_end, lower_entry
from gradlang.compiler.shapes import prod
from gradlang.compiler.verify import verify
from helpers import central_difference

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

SOURCE = """
def steps(u, kappa, start: i64, stop: i64, step: i64):
    for i in range(start, stop, step):
        u = u + kappa * u * (1 - u) + 0.01 * i
    return u

def nested(x, n: i64, m: i64):
    acc = x * 0
    for i in range(n):
        y = x
        for j in range(m):
            y = sin(y) + 0.5 * x
        acc = acc + y * i
    return sum(acc)

def two_carried(x, y, n: i64):
    for i in range(n):
        x, y = y * 0.9, x * y + 0.1
    return sum(x * y)

def branchy(x, flag: const):
    if flag > 1:
        z = x * 3
    elif flag > 0:
        z = x * 2
    else:
        z = exp(x)
    if x.ndim == 1:
        z = z + 1
    return sum(z * x)

def runtime_if(x, t):
    if t > 0.0:
        y = sin(x) * t
    else:
        y = x * x
    return sum(y)

def unrolled(x):
    for i in range(3):
        x = x * x + 1
    return x

@recompute
def grow_saved(u, kappa, n: i64):
    for step in range(n):
        u = u + kappa * (u * (1 - u))
    return sum(u * u)

@recompute(every=3)
def grow_every3(u, kappa, n: i64):
    for step in range(5, 5 + 2 * n, 2):
        u = u + kappa * (u * (1 - u))
    return sum(u * u)

def smooth(x) -> f64[...]:
    return sin(x)
grad(g):
    return g * cos(x) * 2

def uses_block(x, n: i64):
    for i in range(n):
        x = smooth(x)
    return sum(x)

def block_with_loop(x, n: i64):
    y = x
    for i in range(n):
        y = y * x
    return y
grad(g):
    d = g * 0
    p = g
    for i in range(n):
        d = d + p
        p = p * x
    return d
"""


@functools.lru_cache(maxsize=None)
def module(target: str = "cpu") -> dsl.Module:
    return dsl.loads(SOURCE, target=target, host_results=True)


def grow_numpy(u, kappa, n):
    for _ in range(n):
        u = u + kappa * u * (1 - u)
    return np.sum(u * u)


@functools.lru_cache(maxsize=None)
def grow():
    return dsl.load(EXAMPLES / "grow.grad").grow


@settings(max_examples=12, deadline=None)
@given(n=st.integers(0, 7), seed=st.integers(0, 2 ** 16))
def test_grow_value_and_gradient(n, seed):
    rng = np.random.default_rng(seed)
    u, kappa = rng.uniform(0.1, 0.9, size=3), rng.uniform(0.1, 1.0)
    f = grow()
    np.testing.assert_allclose(f(u, kappa, n), grow_numpy(u, kappa, n), rtol=1e-12)
    du, dk = dsl.grad(f, wrt=(0, 1))(u, kappa, n)
    np.testing.assert_allclose(du, central_difference(lambda u: grow_numpy(u, kappa, n), [u], 0),
                               rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(
        dk, central_difference(lambda k: grow_numpy(u, k, n), [np.float64(kappa)], 0),
        rtol=1e-6, atol=1e-9)


def test_gradient_check_passes_through_loops_far_from_fixed_points():
    # sum(u * u) is 1.8e8 here while its slope along u[0] is 0.01: the
    # checker must skip that direction (rounding swamps its differences),
    # not fail the exact gradient
    u, kappa = np.array([0.72319011, 2.60800009, 1.89416193]), -1.40747047
    result = dsl.check_gradients(grow(), u, kappa, 3, order=1)
    assert all(c.ok for c in result) and all(c.compared for c in result if c.dtype == "f64")


def test_grow_second_order_and_hvp():
    f = grow()
    u, kappa, n = np.array([0.2, 0.5, 0.7]), 0.8, 6
    first = dsl.grad(f)
    d_kappa = dsl.grad(f, wrt=1)
    second = dsl.grad(d_kappa, wrt=1)(u, kappa, n)
    fd = central_difference(lambda k: d_kappa(u, k, n), [np.float64(kappa)], 0)
    np.testing.assert_allclose(second, fd, rtol=1e-6)
    v = np.array([0.3, -1.0, 2.0])
    hv = dsl.hvp(f, wrt=0)(u, kappa, n, v)
    eps = 1e-6
    fd = (first(u + eps * v, kappa, n) - first(u - eps * v, kappa, n)) / (2 * eps)
    np.testing.assert_allclose(hv, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("n", [0, 1, 5])
def test_forward_mode_through_loops(n):
    f = grow()
    u, kappa = np.array([0.2, 0.5, 0.7]), 0.8
    eps = 1e-6
    for tu, tk in ((np.array([1.0, -2.0, 0.5]), 0.0), (np.zeros(3), 1.0)):
        value, tangent = dsl.jvp(f, (u, kappa, n), (tu, tk, None))
        fd = (grow_numpy(u + eps * tu, kappa + eps * tk, n)
              - grow_numpy(u - eps * tu, kappa - eps * tk, n)) / (2 * eps)
        np.testing.assert_allclose(value, grow_numpy(u, kappa, n), rtol=1e-12)
        np.testing.assert_allclose(tangent, fd, rtol=1e-7, atol=1e-9)
    # forward over reverse: through the forward loop's stacks and the
    # backward loop that reads them
    d_kappa = dsl.grad(f, wrt=1)
    _, second = dsl.jvp(d_kappa, (u, kappa, n), (None, 1.0, None))
    np.testing.assert_allclose(
        second, central_difference(lambda k: d_kappa(u, k, n), [np.float64(kappa)], 0),
        rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("bounds", [(0, 5, 1), (5, 0, -1), (7, -3, -3), (2, 9, 4), (3, 3, 1),
                                    (4, 1, 1)])
def test_range_bounds_as_python(bounds):
    u, kappa = np.array([0.3, 0.6]), 0.4
    expected = u.copy()
    for i in range(*bounds):
        expected = expected + kappa * expected * (1 - expected) + 0.01 * i
    f = module().steps
    np.testing.assert_allclose(f(u, kappa, *bounds), expected, rtol=1e-12)
    g = dsl.grad(f, wrt=(0, 1))(u, kappa, *bounds)

    def numpy_steps(u, k):
        for i in range(*bounds):
            u = u + k * u * (1 - u) + 0.01 * i
        return u
    np.testing.assert_allclose(g[0], central_difference(lambda u: numpy_steps(u, kappa), [u], 0),
                               rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(g[1], central_difference(lambda k: numpy_steps(u, k),
                                                        [np.float64(kappa)], 0),
                               rtol=1e-6, atol=1e-9)


def test_a_size_named_like_a_trip_count_is_kept_apart(monkeypatch):
    # sizes may take a user's names (`--sig`, annotations); the trip count
    # of the stacked states is a size symbol too, and must not be one of them
    from gradlang.compiler import autodiff
    from gradlang.compiler.shapes import Sym
    monkeypatch.setattr(autodiff, "_trip_symbols", itertools.count())
    m, ns = front_end("def f(u, n: i64):\n    for i in range(n):\n"
                      "        u = u * u + 0.5\n    return sum(u)\n", "t.grad")
    types = {"u": TensorType("f64", (Sym.named("trip0"),)), "n": TensorType("i64", ())}
    g = autodiff.grad_of_sum(lower_entry(ns, m.func("f"), types), [0], False)
    verify(g, "autodiff")
    # (named as no user names a size: `shapes.made_up`)
    assert "trip\u00b70" in print_function(g)
    u = np.array([0.3, -0.2, 0.9])
    (got,) = interpret(g, u, np.int64(2))
    np.testing.assert_allclose(got, 2 * (u * u + 0.5) * 2 * u, rtol=1e-12)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_runtime_step_zero_is_an_argument_error_at_its_loop(target):
    # the loop's place: SOURCE's line 3 (its first line is empty), column 5
    for run in (module(target).steps, dsl.grad(module(target).steps)):
        with pytest.raises(dsl.ArgumentError) as info:
            run(np.array([0.5]), 0.1, 0, 3, 0)
        assert str(info.value) == ("<string>:3:5: error: range() step must not be zero\n"
                                   "        for i in range(start, stop, step):\n"
                                   "        " + "^" * len("for i in range(start, stop, step)"))


def test_the_interpreter_names_a_zero_steps_loop_as_the_kernels_do():
    from dsl.function import _types
    f = module().steps
    bound = f.bind((np.array([0.5]), 0.1, 0, 3, 0), {})
    with pytest.raises(dsl.ArgumentError,
                       match=r"^<string>:3:5: error: range\(\) step must not be zero$"):
        interpret(f.lower(_types(bound)), *bound.values())


def test_nested_loops_values_and_gradients():
    x = np.array([0.3, -0.8])

    def ref(x, n=3, m=2):
        acc = x * 0
        for i in range(n):
            y = x
            for _ in range(m):
                y = np.sin(y) + 0.5 * x
            acc = acc + y * i
        return np.sum(acc)
    f = module().nested
    np.testing.assert_allclose(f(x, 3, 2), ref(x), rtol=1e-12)
    np.testing.assert_allclose(dsl.grad(f)(x, 3, 2), central_difference(ref, [x], 0), rtol=1e-6)
    h = dsl.hvp(f, wrt=0)(x, 3, 2, np.array([1.0, 0.0]))
    eps = 1e-6
    g = dsl.grad(f)
    fd = (g(x + [eps, 0], 3, 2) - g(x - [eps, 0], 3, 2)) / (2 * eps)
    np.testing.assert_allclose(h, fd, rtol=1e-6, atol=1e-8)


def test_grad_of_grad_of_nested_loops_whose_inner_loop_only_checks():
    # the first gradient's inner loop ran for its check alone (check_trips:
    # no outputs), and the second's search for products to stack read its
    # first output: IndexError, in grad of grad and hvp alike
    f = dsl.loads("def f(x, n: i64):\n    s = 0.0\n    for i in range(n):\n"
                  "        for j in range(n):\n            s = s + sin(x[j]) * x[i]\n"
                  "    return s\n", "nested_check.grad").f
    x, n = np.array([0.3, -0.2, 0.5, 0.9]), 3
    h = x[:n]  # f = sum(sin(h)) * sum(h); the gradient's sum's derivative:
    expected = np.append(np.sum(np.cos(h)) - np.sum(h) * np.sin(h) + n * np.cos(h), 0.0)
    np.testing.assert_allclose(dsl.grad(dsl.grad(f))(x, n), expected, rtol=1e-14)


def test_several_carried_values_swap_each_trip():
    x, y = np.array([0.5, 1.5]), np.array([-0.3, 0.2])

    def ref(x, y, n=4):
        for _ in range(n):
            x, y = y * 0.9, x * y + 0.1
        return np.sum(x * y)
    f = module().two_carried
    np.testing.assert_allclose(f(x, y, 4), ref(x, y), rtol=1e-12)
    gx, gy = dsl.grad(f, wrt=(0, 1))(x, y, 4)
    np.testing.assert_allclose(gx, central_difference(ref, [x, y], 0), rtol=1e-6)
    np.testing.assert_allclose(gy, central_difference(ref, [x, y], 1), rtol=1e-6)


DEAD_CARRY = """\
def f(x, n: i64):
    a = x
    b = x
    for i in range(n):
        b = sqrt(b) * a
        a = a * 2.0
    return sum(a)

@recompute(every=2)
def checkpointed(x, n: i64):
    a = x
    b = x
    for i in range(n):
        b = sqrt(b) * a
        a = a * 2.0
    return sum(a)

def accumulated(x, n: i64):
    t = x * 0.0
    for i in range(n):
        t = t + log(x)
        x = sqrt(x)
    return sum(t * x)
"""


@functools.lru_cache(maxsize=None)
def dead_carry():
    return dsl.loads(DEAD_CARRY)


def test_a_carried_value_no_result_depends_on_gets_no_cotangent():
    # b never reaches the result, but the backward loop pulled its zero
    # cotangent back through b's update: 0 * sqrt's inf derivative at
    # b = 0 was NaN, which b's update took to a's cotangent (JAX: 2 ** n);
    # checkpointed, the loop of segments holds a loop of trips, whose
    # reading b kept b in the outer one
    m = dead_carry()
    x = np.array([0.0, 0.5])
    for f, n in itertools.product((m.f, m.checkpointed), (1, 3)):
        np.testing.assert_array_equal(dsl.grad(f)(x, n), [2.0 ** n] * 2)
        np.testing.assert_array_equal(dsl.hessian(f)(x, n), np.zeros((2, 2)))
        np.testing.assert_array_equal(dsl.hvp(f)(x, n, np.ones(2)), [0.0, 0.0])


def test_a_gradient_stacks_only_the_states_its_backward_pass_reads():
    # the derivative of t + log(x) with respect to t reads no t: the
    # forward loop stacked t's starting states (trips x n) for nothing
    f, x = dead_carry().accumulated, np.array([0.5, 1.5])
    (forward,) = [e for e in dsl.grad(f).ir(x, 3).eqns if e.op == "loop" and not e.p["reverse"]]
    assert len(forward.outputs) == forward.p["n_carry"] + 1  # x's starting states alone
    np.testing.assert_allclose(dsl.grad(f)(x, 3), central_difference(f, [x, 3], 0), rtol=1e-7)


def test_rnn_example_gradients_match_finite_differences():
    # the RNN: the loop index is a runtime index into the inputs
    f = dsl.load(EXAMPLES / "rnn.grad").rnn
    rng = np.random.default_rng(3)
    xs, h, w = rng.normal(size=(5, 3)), rng.normal(size=3), rng.normal(size=(3, 3)) / 2

    def ref(xs, h, w):
        for i in range(xs.shape[0]):
            h = np.tanh(h @ w + xs[i])
        return h
    np.testing.assert_allclose(f(xs, h, w), ref(xs, h, w), rtol=1e-12)
    grads = dsl.grad(f, wrt=(0, 1, 2))(xs, h, w)
    for k, g in enumerate(grads):
        np.testing.assert_allclose(g, central_difference(ref, [xs, h, w], k), rtol=1e-6,
                                   atol=1e-9)
    t_xs, t_w = rng.normal(size=xs.shape), rng.normal(size=w.shape)
    _, tangent = dsl.jvp(f, (xs, h, w), (t_xs, None, t_w))
    eps = 1e-6
    fd = (ref(xs + eps * t_xs, h, w + eps * t_w) - ref(xs - eps * t_xs, h, w - eps * t_w)) \
        / (2 * eps)
    np.testing.assert_allclose(tangent, fd, rtol=1e-6, atol=1e-9)
    v = rng.normal(size=(3, 3))
    d_w = dsl.grad(f, wrt=2)
    fd = (d_w(xs, h, w + eps * v) - d_w(xs, h, w - eps * v)) / (2 * eps)
    np.testing.assert_allclose(dsl.hvp(f, wrt=2)(xs, h, w, v), fd, rtol=1e-6, atol=1e-8)


STACKED_PRODUCTS = """
def rnn(xs: f64[t, d], h: f64[d], w: f64[d, d]):
    for i in range(xs.shape[0]):
        h = tanh(h @ w + xs[i])
    return sum(h)

def rnn_left(xs: f64[t, d], h: f64[d], w: f64[d, d]):
    for i in range(xs.shape[0]):
        h = tanh(w @ h + xs[i]) * 1.5
    return sum(h * h)

def scrambled(xs: f64[t, d], h: f64[d], w: f64[d, d]):
    for i in range(xs.shape[0]):
        h = tanh(reshape(reshape(transpose(reshape(h, (2, 3))), (1, 6)) @ w, (6,)) + xs[i])
    return sum(h)

def mixer(x: f64[n, d], k: i64):
    for i in range(k):
        x = tanh((x @ transpose(x)) @ x * 0.1 + x)
    return sum(x * x)
"""


def _loops(ir):
    forward, backward = sorted((e for e in ir.eqns if e.op == "loop"), key=lambda e: e.p["reverse"])
    return forward, backward


def test_a_backward_loop_reads_the_products_its_forward_loop_stacked_and_sums_products_after():
    m = dsl.loads(STACKED_PRODUCTS, "products.grad")
    rng = np.random.default_rng(5)
    xs, h, w = rng.normal(size=(4, 3)), rng.normal(size=3), rng.normal(size=(3, 3)) / 2
    ir = dsl.grad(m.rnn, wrt=(0, 1, 2)).ir(xs, h, w)
    forward, backward = _loops(ir)
    # h and h @ w each trip: the backward trip multiplies d by w's transpose,
    # and does not compute h @ w again
    assert len(forward.outputs) == forward.p["n_carry"] + 2
    assert [e.op for e in backward.p["body"].eqns].count("matmul") == 1
    # w's gradient, the sum over the trips of outer(h, d), is no trip's running
    # sum (carried: dh alone) but one product after the loop, of h's stack and
    # d's (xs's gradient)
    assert backward.p["n_carry"] == 1
    assert [e.op for e in ir.eqns].count("matmul") == 1

    def rnn(xs, h, w):
        for x in xs:
            h = np.tanh(h @ w + x)
        return np.sum(h)
    # without xs's gradient, the backward loop stacks d for w's product alone
    d_w = dsl.grad(m.rnn, wrt=2)
    assert len(_loops(d_w.ir(xs, h, w))[1].outputs) == 1 + 1
    np.testing.assert_allclose(d_w(xs, h, w), central_difference(rnn, [xs, h, w], 2),
                               rtol=1e-6, atol=1e-9)

    def rnn_left(xs, h, w):
        for x in xs:
            h = np.tanh(w @ h + x) * 1.5
        return np.sum(h * h)
    args, eps = [xs, h, w], 1e-6
    grads = dsl.grad(m.rnn_left, wrt=(0, 1, 2))(*args)  # (w's: d h^T, h's stacked anew)
    for k, g in enumerate(grads):
        np.testing.assert_allclose(g, central_difference(rnn_left, args, k), rtol=1e-6,
                                   atol=1e-9)

    def scrambled(xs, h, w):
        for x in xs:
            h = np.tanh((h.reshape(2, 3).T.reshape(1, 6) @ w).reshape(6) + x)
        return np.sum(h)
    args = [rng.normal(size=(3, 6)), rng.normal(size=6), rng.normal(size=(6, 6)) / 3]
    # (outer(h scrambled, d): not h's stack, which is in another order)
    np.testing.assert_allclose(dsl.grad(m.scrambled, wrt=2)(*args),
                               central_difference(scrambled, args, 2), rtol=1e-6, atol=1e-9)
    v, d_w = rng.normal(size=w.shape), dsl.grad(m.rnn_left, wrt=2)
    fd = (d_w(xs, h, w + eps * v) - d_w(xs, h, w - eps * v)) / (2 * eps)
    np.testing.assert_allclose(dsl.hvp(m.rnn_left, wrt=2)(xs, h, w, v), fd, rtol=1e-6,
                               atol=1e-8)
    # x @ x^T is n x n, larger than the state x (n x d): computed again, not stacked
    x = rng.normal(size=(5, 2))
    forward, backward = _loops(dsl.grad(m.mixer).ir(x, 3))
    assert len(forward.outputs) == forward.p["n_carry"] + 2  # x, and x x^T @ x (n x d)
    # x x^T again, then two products for each product's two operands
    assert [e.op for e in backward.p["body"].eqns].count("matmul") == 1 + 4

    def mixer(x, k):
        for _ in range(k):
            x = np.tanh((x @ x.T) @ x * 0.1 + x)
        return np.sum(x * x)
    np.testing.assert_allclose(dsl.grad(m.mixer)(x, 3), central_difference(mixer, [x, 3], 0),
                               rtol=1e-7, atol=1e-10)
    v = rng.normal(size=x.shape)
    eps, d_x = 1e-6, dsl.grad(m.mixer)
    fd = (d_x(x + eps * v, 3) - d_x(x - eps * v, 3)) / (2 * eps)
    np.testing.assert_allclose(dsl.hvp(m.mixer)(x, 3, v), fd, rtol=1e-6, atol=1e-8)


def test_a_second_pass_reads_the_stacks_of_the_first_not_stacking_them_again():
    # the first pass's forward loop stacks h and h @ w for its backward
    # loop, which reads them: differentiated again, that loop keeps them for
    # the second backward pass too, once (they were stacked twice)
    m = dsl.loads(STACKED_PRODUCTS, "products.grad")
    rng = np.random.default_rng(7)
    xs, h, w = rng.normal(size=(4, 3)), rng.normal(size=3), rng.normal(size=(3, 3)) / 2
    first = next(e for e in dsl.hvp(m.rnn, wrt=2).ir(xs, h, w, w).eqns if e.op == "loop")
    assert len(first.outputs) == first.p["n_carry"] + 2


GRAM = """
def gram(xs, h, w):
    m = w * 0.0
    for i in range(xs.shape[0]):
        a = reshape(h, [h.shape[0], 1]) @ reshape(h, [1, h.shape[0]])
        m = m + maximum(a, 0.0)
        h = tanh(h @ w + xs[i])
    return sum(h) + sum(m * w)
"""


def test_a_product_larger_than_every_state_the_backward_loop_reads_is_not_stacked():
    # outer(h, h) is no larger than m, but m only adds it up: the backward
    # trip reads no state of m (none is kept), only h's, so the d x d
    # product (which maximum's derivative reads) is computed again, not
    # kept for every trip beside a d-vector (d times the memory)
    f = dsl.loads(GRAM, "gram.grad").gram
    rng = np.random.default_rng(6)
    xs, h, w = rng.normal(size=(3, 2)), rng.normal(size=2), rng.normal(size=(2, 2)) / 2
    forward, _ = _loops(dsl.grad(f, wrt=(0, 1, 2)).ir(xs, h, w))
    sizes = [prod(o.type.shape[1:]) for o in forward.outputs[forward.p["n_carry"]:]]
    assert sizes == [sizes[0]] * 2, sizes  # a d-vector each a trip: h, and h @ w

    def gram(xs, h, w):
        m = np.zeros_like(w)
        for x in xs:
            m = m + np.maximum(np.outer(h, h), 0.0)
            h = np.tanh(h @ w + x)
        return np.sum(h) + np.sum(m * w)
    for k, g in enumerate(dsl.grad(f, wrt=(0, 1, 2))(xs, h, w)):
        np.testing.assert_allclose(g, central_difference(gram, [xs, h, w], k), rtol=1e-7,
                                   atol=1e-9)


FACTORS = """
def factors(xs: f64[t, d], h: f64[d], v: f64[d], w1: f64[d, d], w2: f64[d, d],
            w3: f64[d, d], w4: f64[d, d]):
    for i in range(xs.shape[0] - 1, -1, -1):
        z = h @ w1
        h = tanh(z @ w2 + xs[i] @ w3 + h * (v @ w4))
    return sum(h * h)
"""


def test_each_kind_of_vector_a_weight_s_trip_sum_multiplies_is_paired_by_trip():
    # the vectors of the weights' outer products come from h's stack, the
    # stacked product z and xs (a stacked input): each pairs with its
    # trip's cotangent, the trips run backward, and none is a running sum
    # of the backward loop.  v @ w4 reads only invariants: it runs once
    # before the loop (`compiler.hoisting`), the backward loop sums its
    # cotangent over the trips, and w4's gradient is one outer product
    # with v after the loop (and v's one product with w4's transpose)
    f = dsl.loads(FACTORS, "factors.grad").factors
    rng = np.random.default_rng(8)
    grad = dsl.grad(f, wrt=tuple(range(7)))

    def factors(xs, h, v, *ws):
        for x in xs[::-1]:
            h = np.tanh(h @ ws[0] @ ws[1] + x @ ws[2] + h * (v @ ws[3]))
        return np.sum(h * h)
    for trips in (4, 0):
        args = [rng.normal(size=(trips, 3)), rng.normal(size=3), rng.normal(size=3)] + \
            [rng.normal(size=(3, 3)) / 2 for _ in range(4)]
        for k, g in enumerate(grad(*args)):
            np.testing.assert_allclose(g, central_difference(factors, args, k), rtol=1e-7,
                                       atol=1e-9)
        if trips:
            ir = grad.ir(*args)
            assert _loops(ir)[1].p["n_carry"] == 2  # h's cotangent and v @ w4's sum
            # v @ w4; three weights' trip sums; w4's and v's gradients
            assert [e.op for e in ir.eqns].count("matmul") == 6


def test_heat_equation_gradient_with_respect_to_diffusivity():
    f = dsl.load(EXAMPLES / "heat.grad").heat
    u, alpha, n = np.sin(np.linspace(0, 3, 7)) + 1, 0.2, 5

    def ref(u, alpha):
        for _ in range(n):
            lap = u[:-2] - 2 * u[1:-1] + u[2:]
            u = np.concatenate([u[:1], u[1:-1] + alpha * lap, u[-1:]])
        return np.sum(u * u)
    np.testing.assert_allclose(f(u, alpha, n), ref(u, alpha), rtol=1e-12)
    d_alpha = dsl.grad(f, wrt=1)
    np.testing.assert_allclose(d_alpha(u, alpha, n), central_difference(
        lambda a: ref(u, a), [np.float64(alpha)], 0), rtol=1e-7)
    np.testing.assert_allclose(dsl.grad(d_alpha, wrt=1)(u, alpha, n), central_difference(
        lambda a: d_alpha(u, a, n), [np.float64(alpha)], 0), rtol=1e-7)


def test_show_needs_concrete_sizes_for_the_heat_equation(capsys):
    # it slices its axis: the default signature falls back to concrete
    # sizes, and a symbolic --sig is an error saying so (not a traceback)
    from dsl.cli import main
    heat = str(EXAMPLES / "heat.grad")
    assert main(["show", heat, "--emit", "ir"]) == 0
    assert "func @heat(%u0: f64[4]" in capsys.readouterr().out
    assert main(["show", heat, "--emit", "ir", "--sig", "heat(f64[:], f64, i64)"]) != 0
    assert "cannot be compiled for any size" in capsys.readouterr().err


def test_static_branches_pick_one_body():
    x = np.array([0.5, -1.0])
    f = module().branchy
    for flag, z in [(2, x * 3), (1, x * 2), (0, np.exp(x))]:
        np.testing.assert_allclose(f(x, flag), np.sum((z + 1) * x), rtol=1e-12)
    np.testing.assert_allclose(dsl.grad(f)(x, 0), central_difference(
        lambda x: np.sum((np.exp(x) + 1) * x), [x], 0), rtol=1e-6)


def test_runtime_bool_branch_values_and_gradients():
    x = np.array([0.5, -1.0, 2.0])
    f = module().runtime_if
    for t in (0.7, -0.2):
        def ref(x, t):
            return np.sum(np.sin(x) * t) if t > 0 else np.sum(x * x)
        np.testing.assert_allclose(f(x, t), ref(x, t), rtol=1e-12)
        gx, gt = dsl.grad(f, wrt=(0, 1))(x, t)
        np.testing.assert_allclose(gx, central_difference(ref, [x, np.float64(t)], 0),
                                   rtol=1e-6)
        np.testing.assert_allclose(gt, central_difference(ref, [x, np.float64(t)], 1),
                                   rtol=1e-6, atol=1e-9)


def test_constant_bounds_second_order():
    f = module().unrolled
    x = np.array([0.3, -0.4])
    ref = lambda x: ((x * x + 1) ** 2 + 1) ** 2 + 1  # noqa: E731
    np.testing.assert_allclose(f(x), ref(x), rtol=1e-12)
    g = dsl.grad(f)
    np.testing.assert_allclose(dsl.grad(g)(x), central_difference(
        lambda x: g(x), [x], 0), rtol=1e-6)


def test_loop_body_uses_a_grad_block():
    # smooth's block says the derivative is 2 cos(x), twice the true one
    x = np.array([0.4, 1.1])
    n = 3
    expected, y = np.ones_like(x), x.copy()
    for _ in range(n):
        expected = expected * 2 * np.cos(y)
        y = np.sin(y)
    np.testing.assert_allclose(module().uses_block(x, n), np.sum(y), rtol=1e-12)
    np.testing.assert_allclose(dsl.grad(module().uses_block)(x, n), expected, rtol=1e-12)


def test_grad_block_with_a_loop_at_second_order():
    # the value is x**(n+1); the block returns sum_{k<n} x**k, not the true
    # derivative, so the results show it is the block that is differentiated
    x, n = np.array([0.7, 1.3]), 3
    f = module().block_with_loop
    np.testing.assert_allclose(f(x, n), x ** (n + 1), rtol=1e-12)
    block = lambda x: sum(x ** k for k in range(n))  # noqa: E731
    np.testing.assert_allclose(dsl.grad(f)(x, n), block(x), rtol=1e-12)
    np.testing.assert_allclose(dsl.grad(dsl.grad(f))(x, n),
                               central_difference(block, [x], 0), rtol=1e-6)


def test_forward_mode_follows_a_grad_block_with_a_loop():
    # jvp transposes the block (a loop): the tangent is the block's, not
    # the derivative of the body
    x, n, t = np.array([0.7, 1.3]), 3, np.array([1.0, -2.0])
    value, tangent = dsl.jvp(module().block_with_loop, (x, n), (t, None))
    np.testing.assert_allclose(value, x ** (n + 1), rtol=1e-12)
    np.testing.assert_allclose(tangent, sum(x ** k for k in range(n)) * t, rtol=1e-12)


def test_interpreter_agrees_with_compiled_code_and_ir_verifies():
    m, ns = front_end(SOURCE, "loops.grad")
    types = {"x": TensorType("f64", (2,)), "n": TensorType("i64", ()),
             "m": TensorType("i64", ())}
    fn = lower_entry(ns, m.func("nested"), types)
    verify(fn, "lower")
    text = print_function(fn)
    assert "= loop " in text and "func @for_j" in text
    x = np.array([0.3, -0.8])
    (value,) = interpret(fn, x, np.int64(3), np.int64(2))
    np.testing.assert_allclose(value, module().nested(x, 3, 2), rtol=1e-12)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 7, 10])
def test_checkpointed_loops_give_the_same_gradients(n):
    u, kappa = np.linspace(0.1, 0.9, 4), 0.3
    du, dk = dsl.grad(grow(), wrt=(0, 1))(u, kappa, n)
    for f in (module().grow_saved, module().grow_every3):
        np.testing.assert_allclose(f(u, kappa, n), grow_numpy(u, kappa, n), rtol=1e-12)
        g = dsl.grad(f, wrt=(0, 1))(u, kappa, n)
        np.testing.assert_allclose(g[0], du, rtol=1e-12)
        np.testing.assert_allclose(g[1], dk, rtol=1e-12)
    second = dsl.grad(dsl.grad(module().grow_saved, wrt=1), wrt=1)(u, kappa, n)
    expected = dsl.grad(dsl.grad(grow(), wrt=1), wrt=1)(u, kappa, n)
    np.testing.assert_allclose(second, expected, rtol=1e-10, atol=1e-12)


def test_a_checkpointed_loop_may_carry_a_literal_start():
    # `s = 0.0` carried: an AttributeError (a Lit has no hint) escaped
    m = dsl.loads("@recompute(every=2)\ndef f(x, n: i64):\n    s = 0.0\n"
                  "    for i in range(n):\n        s = s + sum(x * x) * i\n    return s\n")
    x = np.array([0.5, -1.5, 2.0])
    value, g = dsl.value_and_grad(m.f)(x, 5)
    assert value == pytest.approx(10 * np.sum(x * x), rel=1e-12)
    np.testing.assert_allclose(g, 20 * x, rtol=1e-12)


LITERAL_STARTS = """
def total(x, n: i64):
    s = 0.0
    for i in range(n):
        s = s + sum(x * x)
    return s

def damped(x, w, n: i64):
    s = 0.0
    c = 0
    for i in range(n):
        x = tanh(x * w + s)
        s = s + sum(x) * 0.5
        c = c + w
    return x * s + c
"""


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_literal_start_takes_the_dtype_of_the_arrays_it_meets(dtype):
    # `s = 0.0` carried was an f64 whatever the body did with it: an f32
    # accumulator came back f64, and one feeding another carried f32 value
    # was an error ("'x' changes type in the loop: f32[3] ... f64[3]"), where
    # the same code without the loop stays f32 (and jax's loops do too)
    m = dsl.loads(LITERAL_STARTS)
    x, w, n = np.array([0.5, -1.0, 0.25], dtype), dtype(0.75), 3

    def damped(x, w):
        s, c = 0.0, 0.0
        for _ in range(n):
            x = np.tanh(x * w + s)
            s, c = s + np.sum(x) * 0.5, c + w
        return x * s + c

    total = m.total(x, n)
    assert total.dtype == dtype and total == pytest.approx(n * np.sum(x.astype(float) ** 2))
    value = m.damped(x, w, n)
    assert value.dtype == dtype
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(value, damped(x.astype(float), float(w)), rtol=tol)
    gx, gw = dsl.grad(m.damped, wrt=(0, 1))(x, w, n)
    assert gx.dtype == gw.dtype == dtype
    x64 = x.astype(float)
    tol = 1e-4 if dtype == np.float32 else 1e-7
    np.testing.assert_allclose(gx, central_difference(damped, [x64, float(w)], 0), rtol=tol)
    np.testing.assert_allclose(gw, central_difference(damped, [x64, float(w)], 1), rtol=tol)


def test_recompute_keeps_only_checkpoints():
    # 400 trips: one stacked state per trip, against one per 20 (sqrt) or 3
    u, kappa, n = np.linspace(0.1, 0.9, 50), 0.01, 400
    _, plain = dsl.vjp(grow(), u, kappa, n)
    _, saved = dsl.vjp(module().grow_saved, u, kappa, n)
    _, every3 = dsl.vjp(module().grow_every3, u, kappa, n)
    state = u.nbytes
    assert plain.residual_bytes >= n * state
    assert saved.residual_bytes <= 21 * state + 1000
    assert 134 * state <= every3.residual_bytes <= 135 * state + 1000
    for pullback in (saved, every3):
        np.testing.assert_allclose(pullback(1.0)[0], plain(1.0)[0], rtol=1e-12)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_elementwise_loop_is_one_kernel_forward_and_one_backward(target):
    f = dsl.load(EXAMPLES / "grow.grad", target=target, host_results=True).grow
    value_and_grad = dsl.value_and_grad(f, wrt=(0, 1))
    u = np.linspace(0.1, 0.9, 5)
    bound = value_and_grad.on_target(value_and_grad.bind((u, 0.5, 7), {}))
    generated = value_and_grad.program(bound).generated
    loop_kernels = [name for name, source in generated.kernels
                    if "for tt in range(trips):" in source]
    assert len(loop_kernels) == 2
    for name in loop_kernels:
        assert len(re.findall(rf"K\.{name}\b", generated.driver_source)) == 1  # one launch
    assert "def body" not in generated.driver_source  # no loop in the driver
    value, (du, dk) = value_and_grad(u, 0.5, 7)
    np.testing.assert_allclose(value, grow_numpy(u, 0.5, 7), rtol=1e-12)
    np.testing.assert_allclose(du, central_difference(lambda u: grow_numpy(u, 0.5, 7), [u], 0),
                               rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(
        dk, central_difference(lambda k: grow_numpy(u, k, 7), [np.float64(0.5)], 0),
        rtol=1e-6, atol=1e-9)


def test_matmul_body_loops_in_the_driver_around_kernels():
    f = dsl.load(EXAMPLES / "rnn.grad").rnn
    args = (np.ones((3, 2)), np.zeros(2), np.eye(2))
    driver = f.program(f.bind(args, {})).generated.driver_source
    assert "def body0(" in driver and "for loop0_t in range(" in driver


SMALL_STATE = """
def rhs(y: f64[2], k: f64, c: f64):
    return stack([y[1], -k * y[0] - c * y[1]])

def rk4(y0: f64[2], k: f64, c: f64, dt: f64, n: i64):
    y = y0
    for i in range(n):
        k1 = rhs(y, k, c)
        k2 = rhs(y + 0.5 * dt * k1, k, c)
        k3 = rhs(y + 0.5 * dt * k2, k, c)
        k4 = rhs(y + dt * k3, k, c)
        y = y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return y

def linear(y0, a, n: i64):
    y = y0
    for i in range(n):
        y = y + 0.1 * (a @ y) - 0.01 * sum(y * y) * transpose(a)[0]
    return y

def spread(y: f32[3], n: i64):
    for i in range(n):
        y = y * 0.5 + sum(y)
    return y

def layers(y: f64[8], a: f64[8, 8], n: i64):
    for i in range(n):
        y = tanh(a @ y)
    return y

def squares(a: f64[8, 8], n: i64):
    for i in range(n):
        a = a @ a * 0.1
    return a
"""


def rk4_numpy(y0, k, c, dt, n):
    y = np.array(y0, dtype=np.float64)
    for _ in range(n):
        slopes = []
        for weight in (0.0, 0.5, 0.5, 1.0):
            z = y + weight * dt * slopes[-1] if slopes else y
            slopes.append(np.array([z[1], -k * z[0] - c * z[1]]))
        s1, s2, s3, s4 = slopes
        y = y + dt / 6 * (s1 + 2 * s2 + 2 * s3 + s4)
    return y


def linear_numpy(y0, a, n):
    y = np.array(y0, dtype=np.float64)
    for _ in range(n):
        y = y + 0.1 * (a @ y) - 0.01 * np.sum(y * y) * a.T[0]
    return y


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_small_array_loop_runs_on_scalars_in_one_kernel_each_way(target):
    # A body that slices, stacks, sums and multiplies matrices of a few
    # elements runs on its elements as scalars: forward and backward are
    # one kernel each, not a driver call per trip around tiny kernels.
    m = dsl.loads(SMALL_STATE, target=target, host_results=True)
    rng = np.random.default_rng(5)
    cases = [(m.rk4, rk4_numpy, (np.array([1.0, -0.5]), 4.0, 0.3, 0.05, 40), (0, 1, 2, 3)),
             (m.linear, linear_numpy, (rng.normal(size=2), rng.normal(size=(2, 2)), 9), (0, 1))]
    gradients = []
    for f, reference, args, wrt in cases:
        value_and_grad = dsl.value_and_grad(f, wrt=wrt)
        bound = value_and_grad.on_target(value_and_grad.bind(args, {}))
        generated = value_and_grad.program(bound).generated
        assert len([name for name, source in generated.kernels
                    if "for tt in range(trips):" in source]) == 2
        assert "def body" not in generated.driver_source
        value, grads = value_and_grad(*args)
        gradients.append(grads)
        np.testing.assert_allclose(value, reference(*args), rtol=1e-13)
        for index, g in zip(wrt, grads):
            np.testing.assert_allclose(g, central_difference(reference, args, index),
                                       rtol=1e-7, atol=1e-9)
    if target == "cpu":  # f32, and the Jacobian: the flow map, det = exp(-c t)
        args = cases[0][2]
        jacobian = dsl.jacfwd(m.rk4)(*args)
        np.testing.assert_allclose(jacobian.sum(axis=0), gradients[0][0], rtol=1e-12)
        np.testing.assert_allclose(np.linalg.det(jacobian), np.exp(-0.3 * 0.05 * 40), rtol=1e-5)
        y0, a, n = cases[1][2]
        got = m.linear(y0.astype(np.float32), a.astype(np.float32), n)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, linear_numpy(y0, a, n), rtol=1e-5)
        # an f32 sum adds in f64 and rounds once, as a kernel's sums do (the
        # rewrite added f32 to f32: 1e8 + 0.1 - 1e8 lost the 0.1)
        y = np.array([0.1, 1e8, -1e8], np.float32)
        assert "def body" not in m.spread.program(m.spread.bind((y, 3), {})).generated.driver_source
        expected = y
        for _ in range(3):
            expected = expected * np.float32(0.5) + np.float32(expected.sum(dtype=np.float64))
        np.testing.assert_array_equal(m.spread(y, 3), expected)
        # 72 elements carried and read: split one by one in the driver, they
        # cost more than a few trips save (0.6 ms against 0.05 at one trip)
        y, a = rng.normal(size=8), rng.normal(size=(8, 8)) * 0.3
        assert "def body0(" in m.layers.program(m.layers.bind((y, a, 3), {})).generated.driver_source
        np.testing.assert_allclose(m.layers(y, a, 3), np.tanh(a @ np.tanh(a @ np.tanh(a @ y))),
                                   rtol=1e-13)
        # 960 scalar operations a trip: too many to compile as one kernel
        a = rng.normal(size=(8, 8))
        assert "def body0(" in m.squares.program(m.squares.bind((a, 2), {})).generated.driver_source
        np.testing.assert_allclose(m.squares(a, 2), (a @ a * 0.1) @ (a @ a * 0.1) * 0.1,
                                   rtol=1e-13)


def test_small_loop_sums_run_from_zero_as_a_kernels_do():
    # On scalars, a sum of -0.0 terms is 0.0, as a kernel's sum (and BLAS's
    # product) from 0 gives unrewritten: the rewrite's -0.0 turned 1 / sum
    # into -inf.
    m = dsl.loads("""
def signed_zeros(y: f64[2], a: f64[2, 2], n: i64):
    for i in range(n):
        y = 1.0 / (a @ y) + 1.0 / sum(y * -0.0)
    return y
""", host_results=True)
    args = (np.array([1.0, 2.0]), np.array([[-0.0, -0.0], [1.0, 1.0]]), 1)
    assert "def body" not in m.signed_zeros.program(
        m.signed_zeros.bind(args, {})).generated.driver_source
    np.testing.assert_array_equal(m.signed_zeros(*args), [np.inf, np.inf])


# ------------------------------------------------------------------ errors


def error_of(source: str) -> dsl.GradError:
    with pytest.raises(dsl.GradError) as info:
        m = dsl.loads(source, file="bad.grad")
        m.f(np.array([1.0, 2.0]), 3)
    return info.value


def test_carried_value_changing_type_is_an_error_with_both_types():
    err = error_of("def f(x, n: i64):\n    s = 0.0\n    for i in range(n):\n"
                   "        s = s + x\n    return s\n")
    text = str(err)
    assert "'s' changes type in the loop: f64 before an iteration, f64[2] after it" in text
    assert err.line == 4 and "bad.grad:4:9" in text
    assert text.splitlines()[-1].strip() == "^" * len("s = s + x")


def test_branches_with_different_types_are_an_error():
    err = error_of("def f(x, n: i64):\n    if n > 0:\n        y = x\n    else:\n"
                   "        y = sum(x)\n    return y\n")
    assert "'y' is f64[2] after the if branch but f64 after the else branch" in str(err)
    assert err.line == 2 and "^^^^^^^^" in str(err)


def test_name_bound_in_one_branch_is_an_error_where_read():
    err = error_of("def f(x, n: i64):\n    if n > 0:\n        y = x\n    return y\n")
    assert "name 'y' is bound in only some branches of the if at line 2" in str(err)
    assert (err.line, err.col) == (4, 12)


def test_name_bound_only_in_a_loop_is_an_error_where_read():
    err = error_of("def f(x, n: i64):\n    for i in range(n):\n        y = x\n    return y\n")
    assert "name 'y' is bound only inside the for loop at line 2" in str(err)


def test_a_grad_block_reading_a_name_local_to_a_loop_is_an_error_at_load():
    # (the block sees the body's locals, but not a loop body's: it loaded,
    # and the call said "name 't' is not defined"); a later block likewise
    body = ("def f(x, n: i64):\n    y = x\n    for i in range(n):\n        t = sin(y)\n"
            "        y = t\n    return y\n")
    for blocks, at in [("grad(dy):\n    return dy * t\n", (8, 17)),
                       ("grad(dy):\n    for i in range(2):\n        u = dy\n    return dy\n"
                        "grad(d2):\n    return d2 * u, 0\n", (12, 17))]:
        with pytest.raises(dsl.GradError) as info:
            dsl.loads(body + blocks, file="bad.grad")
        name, line = ("t", 3) if at[0] == 8 else ("u", 8)
        assert f"name {name!r} is bound only inside the for loop at line {line}" \
            in info.value.message
        assert (info.value.line, info.value.col) == at, str(info.value)


@pytest.mark.parametrize("decorator", ["", "@recompute\n"])
def test_a_grad_block_reading_a_name_a_runtime_if_binds_in_one_branch_names_the_if(decorator):
    # (the checker lets a block read it, as a compile-time branch binds it;
    # the lowering said "name 't' is not defined")
    m = dsl.loads(decorator + "def f(x: f64[n]):\n    y = x\n    if sum(x) > 0.0:\n"
                  "        t = cos(x)\n        y = sin(x)\n    return y\ngrad(dy):\n"
                  "    return dy * t\n", file="bad.grad")
    with pytest.raises(dsl.GradError) as info:
        dsl.grad(m.f)(np.ones(2))
    assert "name 't' is bound in only some branches of the if at line " \
        f"{3 + decorator.count(chr(10))}, whose condition is known only at run time" \
        in info.value.message
    assert (info.value.line, info.value.col) == (8 + decorator.count("\n"), 17)


def test_loop_variable_read_after_the_loop_says_it_is_local_to_it():
    # (the language's documented rule, which Python's loops do not have)
    err = error_of("def f(x, n: i64):\n    for i in range(n):\n        x = x + 1.0\n"
                   "    return x * i\n")
    assert "name 'i' is the variable of the for loop at line 2 and local to it" in str(err)
    assert (err.line, err.col) == (4, 16)


@pytest.mark.parametrize("header, message, col", [
    ("for i in range(1.5):", "range() takes integers, got a float", 20),
    ("for i in range(0, 4, 0):", "range() step must not be zero", 26),
    ("for i in range(x):", "range() takes integer scalars, got f64[2]", 20),
    ("for i in [1, 2]:", "a for loop iterates over range(", 14),
    # (an OverflowError from counting the trips; at the loop, as the driver's
    # refusal of such bounds given at run time)
    ("for i in range(-2**63, 2**63 - 1):", "range(-9223372036854775808, 9223372036854775807, "
     "1) runs 18446744073709551615 trips, more than a loop counts", 5),
    ("for i in range(2**63 - 1, -2**63, -1):", "runs 18446744073709551615 trips", 5),
])
def test_bad_ranges_are_errors_at_the_argument(header, message, col):
    err = error_of(f"def f(x, n: i64):\n    {header}\n        x = x + 1\n    return x\n")
    assert message in str(err) and (err.line, err.col) == (2, col)


def test_return_inside_a_loop_is_an_error():
    err = error_of("def f(x, n: i64):\n    for i in range(n):\n        return x\n    return x\n")
    assert "return inside a for loop is not supported" in str(err) and err.line == 3


@pytest.mark.parametrize("decorator, message", [
    ("@recompute(every=0)", "every= takes a positive integer literal"),
    ("@recompute(often=2)", "@recompute takes no argument 'often' (only every=)"),
    ("@pass_through(every=2)", "@pass_through takes no argument 'every'"),
    # accepted silently: every= checkpoints loops, and f has none
    ("@recompute(every=2)", "@recompute(every=...) checkpoints a loop every so many trips, "
                            "and f() has no loop"),
    ("@recompute\n@recompute", "@recompute repeated on f()"),  # (said "one of ... @pass_through")
])
def test_bad_decorator_arguments(decorator, message):
    err = error_of(f"{decorator}\ndef f(x, n: i64):\n    return x\n")
    assert message in str(err) and err.line == decorator.count("\n") + 1


def test_every_on_a_function_with_a_grad_block_is_an_error_at_the_decorator():
    # the block is the gradient: no backward loop replays the trips, so
    # there is nothing to checkpoint (every= was accepted and ignored)
    with pytest.raises(dsl.GradError) as info:
        dsl.loads("def g(x):\n    return x\n\n@recompute(every=2)\ndef f(x, n: i64):\n"
                  "    for i in range(n):\n        x = sin(x)\n    return x\n"
                  "grad(dy):\n    return dy * cos(x)\n", file="bad.grad")
    err = info.value
    assert "@recompute(every=...) checkpoints a loop's trips for its automatic gradient, " \
           "and f() has a grad block (line 9)" in err.message
    assert (err.line, err.col) == (4, 12), str(err)
    assert str(err).splitlines()[-1].strip().startswith("^")


@pytest.mark.parametrize("start, update, message", [
    ("g * 0", "d = d + p * p", "a product of two values that depend on them"),
    ("g * 0", "d = d + x", "a sum of a value that depends on them and one that does not"),
    ("x", "d = p", "a loop carries a value that depends on them in one trip and one that "
                   "does not"),
])
def test_grad_block_with_a_loop_must_be_linear(start, update, message):
    # the block_with_loop block, made quadratic or affine in g
    err = error_of(f"def f(x, n: i64):\n    return x * x\ngrad(g):\n    d = {start}\n"
                   f"    p = g\n    for i in range(n):\n        {update}\n"
                   "        p = p * x\n    return d\n")
    assert "grad block 1 of f() (line 3) is not linear in its upstream cotangents" in str(err)
    assert message in str(err)


def test_elementwise_condition_points_to_where():
    err = error_of("def f(x, n: i64):\n    if x > 0.0:\n        x = x * 2\n    return x\n")
    assert "select elementwise with where()" in str(err) and err.line == 2


# ---------------------------------------------- loop-invariant code motion

INVARIANT_WORK = """
def f(xs, h, w):
    for i in range(xs.shape[0]):
        h = tanh(h * sum(w, axis=0) + xs[i])
    return sum(h * h)

def rnn(xs, h, w):
    for i in range(xs.shape[0]):
        h = tanh(h @ tanh(w) + xs[i])
    return sum(h)
"""


def _invariant_steps(loop) -> list[str]:
    """The ops of a loop's body (not of the loops in it) reading only the
    loop's invariants and literals: what `compiler.hoisting` moves out."""
    from gradlang.compiler.ir import Var
    body = loop.p["body"]
    n_carry, n_inv = loop.p["n_carry"], loop.p["n_inv"]
    fixed = set(body.params[1 + n_carry:1 + n_carry + n_inv])
    found = []
    for e in body.eqns:
        ins = [a for a in e.inputs if isinstance(a, Var)]
        if ins and all(a in fixed for a in ins):
            found.append(e.op)
            fixed.update(e.outputs)
    return found


def _loops_of(fn) -> list:
    return [e for e in fn.eqns if e.op == "loop"]


def _np_invariant_work(xs, h, w):
    for x in xs:
        h = np.tanh(h * w.sum(axis=0) + x)
    return np.sum(h * h)


def test_invariant_work_runs_once_before_the_loop_with_the_same_bits(monkeypatch):
    # sum(w, axis=0) and tanh(w) read only w: each runs once before the
    # loop, not once a trip, and their gradients once after the backward
    # loop, which sums their cotangents over the trips; the backward trip's
    # w^T (of rnn's tanh(w)) runs once before the backward loop
    from gradlang.compiler import hoisting, pipeline
    rng = np.random.default_rng(12)
    args = [rng.normal(size=(5, 3)), rng.normal(size=3), rng.normal(size=(3, 3)) / 2]
    namespace = front_end(INVARIANT_WORK, "inv.grad")[1]
    types = {n: TensorType("f64", a.shape) for n, a in zip("xs h w".split(), args)}
    lowered = {name: lower_entry(namespace, namespace.functions[name][0], types)
               for name in ("f", "rnn")}
    for name, moved in (("f", "reduce_sum"), ("rnn", "tanh")):
        text = print_function(lowered[name])
        top = [line.split(" = ")[1].split()[0] for line in text.splitlines()
               if line.startswith("  %")]  # the function's own steps, not its loop's body
        assert top[:2] == [moved, "loop"], text
        gradient = pipeline.optimize(pipeline.grad_of_sum(lowered[name], [0, 1, 2], True))
        assert [_invariant_steps(loop) for loop in _loops_of(gradient)] == [[], []]
    value, grads = dsl.value_and_grad(dsl.loads(INVARIANT_WORK, "inv.grad").f,
                                      wrt=(0, 1, 2))(*args)
    np.testing.assert_allclose(value, _np_invariant_work(*args), rtol=1e-14)
    for k, g in enumerate(grads):
        np.testing.assert_allclose(g, central_difference(_np_invariant_work, args, k),
                                   rtol=1e-7, atol=1e-9)
    # the loop as it was, each trip summing w: the same bits
    monkeypatch.setattr(hoisting, "ENABLED", False)
    as_was = dsl.loads(INVARIANT_WORK, "inv.grad").f
    assert _invariant_steps(_loops_of(as_was.ir(*args))[0]) == ["reduce_sum"]
    assert as_was(*args).tobytes() == value.tobytes()


REPEATED_WORK = """
def f(x, w):
    y = x
    for i in range(3):
        y = sin(y) + w * 0.5
        y = sin(y) * (w * 0.5 + 1.0) + x * 2.0
        y = cos(y) * (w * 0.5 + 1.0) + w * 0.5
    return sum(y)
"""


def _np_repeated_work(x, w):
    y = x
    for _ in range(3):
        y = np.sin(y) + w * 0.5
        y = np.sin(y) * (w * 0.5 + 1.0) + x * 2.0
        y = np.cos(y) * (w * 0.5 + 1.0) + w * 0.5
    return np.sum(y)


def test_equal_invariant_work_moves_out_once():
    # w * 0.5, four times in the body, moves out as one invariant, not
    # four, and w * 0.5 + 1.0 (the second reading the first's value) as
    # one: so the backward loop sums one cotangent for each, not one per
    # line (a body of hundreds of such lines made as many kernel arrays,
    # and Numba's compile grew faster than the body)
    rng = np.random.default_rng(37)
    args = [rng.normal(size=4), rng.normal(size=4)]
    m = dsl.loads(REPEATED_WORK, "repeated.grad")
    (forward,) = _loops_of(m.f.ir(*args))
    assert forward.p["n_inv"] == 3  # w * 0.5, w * 0.5 + 1.0 and x * 2.0
    assert _invariant_steps(forward) == []
    grad = dsl.value_and_grad(m.f, wrt=(0, 1))
    backward = [e for e in _loops_of(grad.ir(*args)) if e.p["reverse"]]
    assert [e.p["n_carry"] for e in backward] == [4]  # y's and the invariants' sums
    value, grads = grad(*args)
    np.testing.assert_allclose(value, _np_repeated_work(*args), rtol=1e-14)
    for k, g in enumerate(grads):
        np.testing.assert_allclose(g, central_difference(_np_repeated_work, args, k),
                                   rtol=1e-7, atol=1e-9)


def test_a_loop_kernel_reads_each_value_once():
    # the backward loop's three sums (y's cotangent's and the invariants')
    # start from one zero array: its kernel reads it once, not once a sum
    # (a body of hundreds of invariants passed it hundreds of times)
    from gradlang.compiler import pipeline
    from gradlang.runtime import target as targets
    args = [np.ones(4), np.ones(4)]
    grad = dsl.value_and_grad(dsl.loads(REPEATED_WORK, "repeated.grad").f, wrt=(0, 1))
    generated = pipeline.generate(grad.ir(*args), targets.get("cpu"))
    calls = [re.findall(r"R\.flat\((\w+)\)", line.split(")(", 1)[1])
             for line in generated.driver_source.splitlines() if "K.k_" in line]
    assert len(calls) == 4 and [len(c) for c in calls] == [len(set(c)) for c in calls]
    # and a blocked loop kernel's two sections (the starts', the trips')
    # assign no name twice: Numba rebuilt SSA once per such name, each a
    # pass over the whole kernel; the starts' section reads only the starts
    kernels = generated.kernel_source.split("\ndef ")[1:]
    loops = [k for k in kernels if "for tt in range(trips)" in k]
    assert len(loops) == 4  # each loop's parallel and serial kernels
    for kernel in loops:
        reads = re.findall(r"^ +(a\w*) = in\d+\[e\]$", kernel, re.M)
        assert len(reads) == len(set(reads)), kernel
        starts = kernel.split("for tt in range(trips)")[0]
        assert len(re.findall(r" = in\d+\[e\]", starts)) == (1 if "ys0" in kernel else 2)


GUARDED_WORK = """
def f(w, v, idx, n: i64):
    s = w * 0.0
    for i in range(n):
        s = s + w[idx] * max(v) + sum(w)
    return s
"""


def test_invariant_work_that_can_raise_stays_in_a_loop_of_no_trips():
    # w[idx] and max(v) read only invariants too, but a gather checks its
    # indices and a max of nothing has no value: a loop of no trips runs
    # neither, so neither moves (sum(w) does); the gradient's loops too
    m = dsl.loads(GUARDED_WORK, "guarded.grad")
    w, v = np.array([1.0, 2.0, 4.0]), np.array([0.5, -1.0])
    bad, empty = np.array([0, 5, 1]), np.zeros(0)
    np.testing.assert_array_equal(m.f(w, empty, bad, 0), np.zeros(3))
    grad = dsl.grad(m.f, wrt=(0, 1))
    for g, arg in zip(grad(w, empty, bad, 0), (w, empty)):
        np.testing.assert_array_equal(g, np.zeros_like(arg))
    (forward,), (backward,) = (_loops_of(fn.ir(w, empty, bad, 0))
                               for fn in (m.f, grad))  # (no states: s is linear)
    assert "reduce_sum" not in [e.op for e in forward.p["body"].eqns]
    assert _invariant_steps(forward) == ["take", "reduce_max", "mul"]
    # (and what reads the max: the mask of its gradient)
    assert _invariant_steps(backward)[:2] == ["take", "reduce_max"]
    good = np.array([2, 0, 0])
    np.testing.assert_allclose(m.f(w, v, good, 2), 2 * (w[good] * 0.5 + 7.0), rtol=1e-15)
    with pytest.raises(dsl.ArgumentError, match="index 5 in 'idx' is out of range for an "
                                                "axis of size 3") as info:
        m.f(w, v, bad, 1)
    assert (info.value.line, info.value.col) == (5, 17), str(info.value)  # at w[idx]
    with pytest.raises(dsl.ArgumentError, match="max/min over an empty axis") as info:
        m.f(w, empty, good, 1)
    assert (info.value.line, info.value.col) == (5, 26), str(info.value)  # at max(v)


NESTED_INVARIANT_WORK = """
def f(xs, h, w):
    for i in range(xs.shape[0]):
        x = xs[i]
        for j in range(2):
            h = tanh(h * sum(w, axis=0) + tanh(x))
    return sum(h)
"""


def test_nested_loops_move_invariant_work_as_far_out_as_it_goes():
    # sum(w, axis=0) leaves both loops; tanh(x) reads the outer trip's x,
    # invariant only in the inner loop: it runs once per outer trip
    m = dsl.loads(NESTED_INVARIANT_WORK, "nested_inv.grad")
    rng = np.random.default_rng(13)
    args = [rng.normal(size=(3, 4)), rng.normal(size=4), rng.normal(size=(4, 4)) / 2]
    ir = m.f.ir(*args)
    (outer,) = _loops_of(ir)
    # (of w as `where(the loop runs, w, 0)`: xs may have no rows, `control._guarded`)
    (guard,) = [e for e in ir.eqns if ir.params[2] in e.inputs]
    assert guard.op == "where"
    assert [e.op for e in ir.eqns if e.inputs == guard.outputs] == ["reduce_sum"]
    (inner,) = _loops_of(outer.p["body"])
    assert [e.op for e in outer.p["body"].eqns] == ["tanh", "loop"]
    assert [e.op for e in inner.p["body"].eqns] == ["mul", "add", "tanh"]

    def nested(xs, h, w):
        for x in xs:
            for _ in range(2):
                h = np.tanh(h * w.sum(axis=0) + np.tanh(x))
        return np.sum(h)
    np.testing.assert_allclose(m.f(*args), nested(*args), rtol=1e-14)
    for k, g in enumerate(dsl.grad(m.f, wrt=(0, 1, 2))(*args)):
        np.testing.assert_allclose(g, central_difference(nested, args, k), rtol=1e-7, atol=1e-9)



ZERO_TRIP_WORK = """
def f(w, x, n: i64, c: i64):
    s = x
    for i in range(n):
        s = s + log(w) * x
    for i in range(n, 0, c):
        s = s + sqrt(w - 0.5)
    return sum(s)

def block(w, n: i64):
    return w * 1.0
grad(g):
    d = g * 0.0
    for i in range(n):
        d = d + log(w) * g
    return d
"""


def test_work_moved_before_a_loop_of_no_trips_passes_no_cotangent_back():
    # log(w) * x and sqrt(w - 0.5) run before their loops, so their VJPs
    # run once whatever the trips: for none, on a zero cotangent, and 0 *
    # inf (log's slope at w = 0, x's factor log(0), sqrt's slope at 0) is
    # NaN, where the loops as written never compute them (the second's
    # step is known only at run time: range(2, 0, 1) has no trips)
    m = dsl.loads(ZERO_TRIP_WORK, "zero_trip_work.grad")
    grad = dsl.grad(m.f, wrt=(0, 1))
    x = np.array([1.0, 0.5])
    for c in (1, -1):
        for g, expected in zip(grad(np.array([0.0, 0.5]), x, 0, c), ([0, 0], [1, 1])):
            np.testing.assert_array_equal(g, expected)
    w = np.array([0.5, 2.0])
    gw, gx = grad(w, x, 2, 1)  # two trips of the first loop, none of the second
    np.testing.assert_allclose(gw, 2 * x / w, rtol=1e-15)
    np.testing.assert_allclose(gx, 1 + 2 * np.log(w), rtol=1e-15)
    gw, gx = grad(w + 0.5, x, 2, -1)  # two trips each
    np.testing.assert_allclose(gw, 2 * x / (w + 0.5) + 1 / np.sqrt(w), rtol=1e-15)
    np.testing.assert_allclose(gx, 1 + 2 * np.log(w + 0.5), rtol=1e-15)
    # a grad block's loop too (the guard keeps the block linear in g): its
    # gradient, n log(w), differentiated again is n / w
    second = dsl.grad(dsl.grad(m.block))
    np.testing.assert_array_equal(second(np.array([0.0, 2.0]), 0), [0, 0])
    np.testing.assert_allclose(second(w, 3), 3 / w, rtol=1e-15)
