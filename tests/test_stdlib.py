"""Every function of the standard library (`compiler/stdlib/std.grad`),
found by loading the file, passes the gradient check in f64: its grad
block (or reverse mode) at order 1, and at order 2 both the derivative of
the gradient and the derivative through the upstream cotangent; and in f32
its gradient is finite where the f64 one is."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from gradlang.compiler.modules import STDLIB

STD = dsl.load(STDLIB / "std.grad")


@pytest.mark.parametrize("name", sorted(STD.functions))
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**31), scale=st.sampled_from([0.5, 3.0, 20.0]))
def test_stdlib_passes_the_gradient_check_at_orders_1_and_2(name, seed, scale):
    x = np.random.default_rng(seed).normal(size=(2, 3)) * scale
    checks = dsl.check_gradients(getattr(STD, name), x, order=2)
    # order 2: along x and upstream; order 1 in f32 against f64; forward mode: the
    # jvp in f64 and the dot-product test in both dtypes
    assert sorted((c.order, c.dtype, c.against) for c in checks) == [
        (1, "f32", "f64"), (1, "f32", "reverse"), (1, "f64", "differences"),
        (1, "f64", "differences"), (1, "f64", "reverse"), (2, "f64", "differences"),
        (2, "f64", "differences")]
    assert all(c.compared > 0 for c in checks), [str(c) for c in checks]
    assert all(c.ok for c in checks), [str(c) for c in checks if not c.ok]


def test_logsumexp_of_infinite_rows_is_numpys():
    # The shift by the row's max was inf - inf = NaN for a row holding +inf
    # or only -inf (a fully masked row of logits): NumPy's unshifted
    # log(sum(exp(x))) is inf and -inf there, and finite rows are unchanged.
    x = np.array([[np.inf, 1.0, 0.0], [-np.inf, -np.inf, -np.inf], [-np.inf, 0.0, 2.0],
                  [1000.0, 999.0, -5.0]])
    expected = [np.inf, -np.inf, np.log(1 + np.exp(2.0)), 1000 + np.log(1 + np.exp(-1.0))]
    np.testing.assert_allclose(STD.logsumexp(x, 1), expected, rtol=1e-15)
    np.testing.assert_allclose(STD.logsumexp(x.astype(np.float32), 1), expected, rtol=1e-6)


def test_softmax_and_log_softmax_are_numpys_without_overflow():
    # (x of the gradient check's shape and dtype: its programs serve)
    x = np.array([[1000.0, 0.0, -1000.0], [1.0, 2.0, 3.0]])
    shifted = x - x.max(axis=1, keepdims=True)
    expected = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(dsl.value_and_grad(STD.log_softmax)(x)[0], expected, rtol=1e-15)
    np.testing.assert_allclose(dsl.value_and_grad(STD.softmax)(x)[0], np.exp(expected),
                               rtol=1e-15)
