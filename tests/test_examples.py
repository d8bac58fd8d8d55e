"""The shipped examples and the acceptance figures of the spine."""
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from helpers import central_difference

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def log1pexp():
    return dsl.load(EXAMPLES / "log1pexp.grad").log1pexp


def test_log1pexp_gradient_is_exactly_one_at_100(log1pexp):
    for dtype in (np.float32, np.float64):
        g = dsl.grad(log1pexp)(np.array([100.0], dtype))
        assert g.dtype == dtype
        assert g[0] == 1.0


def test_log1pexp_grad_block_has_no_nan_on_wide_range(log1pexp):
    x = np.linspace(-100, 1000, 20001)
    value, g = dsl.value_and_grad(log1pexp)(x)
    assert not np.isnan(g).any()
    sigmoid = np.where(x >= 0, 1 / (1 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1 + np.exp(-np.abs(x))))
    # 1 - 1/(1+e) loses sigmoid(x) below 1e-16 (it rounds to 0), as written.
    np.testing.assert_allclose(g, sigmoid, rtol=1e-12, atol=1e-15)
    finite = x < 700
    np.testing.assert_allclose(value[finite], np.logaddexp(0, x[finite]), rtol=1e-12, atol=1e-15)


def test_automatic_gradient_of_unstable_forward_is_nan_at_1000():
    m = dsl.loads("def f(x):\n    e = exp(x)\n    return log(1 + e)\n")
    g = dsl.grad(m.f)(np.array([0.0, 1000.0]))
    assert g[0] == 0.5
    assert np.isnan(g[1])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-30, 30), min_size=1, max_size=8))
def test_log1pexp_gradient_matches_finite_differences(log1pexp, xs):
    x = np.array(xs)
    g = dsl.grad(log1pexp)(x)
    expected = central_difference(lambda v: np.logaddexp(0, v), [x], 0)
    np.testing.assert_allclose(g, expected, rtol=1e-6, atol=1e-8)


def test_bar_value_and_grad():
    bar = dsl.load(EXAMPLES / "bar.grad").bar
    value, (gx, gy) = dsl.value_and_grad(bar, wrt=(0, 1))(2.0, 3.0)
    assert value == 6.0 and gx == 3.0 and gy == 2.0
    out, pullback = dsl.vjp(bar, 2.0, 3.0)
    assert out == 6.0
    assert pullback(1.0) == (3.0, 2.0)
    assert pullback(2.0) == (6.0, 4.0)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 6), st.integers(0, 2**31))
def test_bar_broadcast_gradients_sum_over_broadcast_axes(n, seed):
    bar = dsl.load(EXAMPLES / "bar.grad").bar
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(n, 3)), rng.normal(size=3)
    gx, gy = dsl.grad(bar, wrt=(0, 1))(x, y)
    np.testing.assert_allclose(gx, np.broadcast_to(y, (n, 3)))
    np.testing.assert_allclose(gy, x.sum(axis=0))


def test_leaky_relu_first_order():
    m = dsl.load(EXAMPLES / "leaky_relu.grad")
    x = np.array([-2.0, -0.5, 0.5, 3.0])
    np.testing.assert_allclose(m.leaky_relu(x), [-0.4, -0.1, 0.5, 3.0])
    np.testing.assert_allclose(dsl.grad(m.leaky_relu)(x), [0.2, 0.2, 1.0, 1.0])
    np.testing.assert_allclose(dsl.grad(m.leaky_relu)(x, 0.1), [0.1, 0.1, 1.0, 1.0])


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 5), st.integers(1, 4), st.integers(1, 3), st.integers(0, 2**31))
def test_dense_loss_gradients_match_finite_differences(batch, n_in, n_out, seed):
    m = dsl.load(EXAMPLES / "dense.grad")
    rng = np.random.default_rng(seed)
    x, w = rng.normal(size=(batch, n_in)), rng.normal(size=(n_in, n_out))
    b, t = rng.normal(size=n_out), rng.normal(size=(batch, n_out))

    def reference(x, w, b):
        return np.mean(np.sum((np.logaddexp(0, x @ w + b) - t) ** 2, axis=1))

    value, grads = dsl.value_and_grad(m.loss, wrt=(0, 1, 2))(x, w, b, t)
    np.testing.assert_allclose(value, reference(x, w, b), rtol=1e-12)
    for k, g in enumerate(grads):
        np.testing.assert_allclose(g, central_difference(reference, [x, w, b], k),
                                   rtol=1e-5, atol=1e-7)


def test_f32_stays_f32():
    m = dsl.loads("def f(x):\n    return x * 0.2 + 1\n")
    x = np.arange(4, dtype=np.float32)
    assert m.f(x).dtype == np.float32
    assert dsl.grad(m.f)(x).dtype == np.float32
    y = m.f(x) + 0
    assert dsl.loads("def g(x, y):\n    return x * y\n").g(x, np.ones(4)).dtype == np.float64
    np.testing.assert_allclose(y, x * np.float32(0.2) + 1)
