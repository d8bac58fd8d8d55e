"""`dsl.to_jax`: compiled functions as JAX custom-VJP functions, under
jit, grad (to any order) and vmap.

Values equal the NumPy call; `check_grads` (reverse mode, order 2) passes
on every example; derivatives of three orders equal known ones; vmap of a
reduction gives one value per example; f32 (JAX's default) and f64."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from helpers import EXAMPLE_CALLS, EXAMPLES
from helpers import load_example as load

jax = pytest.importorskip("jax", reason="the jax extra is not installed")
import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402


@pytest.fixture
def x64():
    """JAX with f64 (it makes every float f32 unless jax_enable_x64)."""
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


@pytest.mark.parametrize("example,name,inputs,consts", EXAMPLE_CALLS,
                         ids=[f"{e}.{n}" for e, n, _, _ in EXAMPLE_CALLS])
def test_every_example_through_jax(x64, example, name, inputs, consts):
    f = getattr(load(example), name)
    jf = dsl.to_jax(f)
    xs = [jnp.asarray(x) for x in inputs]

    def call(*args):
        return jf(*args, **consts)

    np.testing.assert_allclose(call(*xs), f(*inputs, **consts), rtol=1e-12, atol=0)
    grads = jax.jit(jax.grad(lambda *a: call(*a).sum(), argnums=tuple(range(len(xs)))))(*xs)
    expected = dsl.grad(f, wrt=list(range(len(inputs))))(*inputs, **consts)
    for g, e in zip(grads, expected):
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-15)
    check_grads(call, tuple(xs), order=2, modes=["rev"])


def test_three_orders_under_jit_from_the_grad_block(x64):
    # log1pexp' = s, '' = s(1-s), ''' = s(1-s)(1-2s), each a compiled VJP
    g = dsl.to_jax(load("log1pexp").log1pexp)
    d1 = jax.grad(lambda x: g(x).sum())
    d2 = jax.grad(lambda x: d1(x).sum())
    d3 = jax.jit(jax.grad(lambda x: d2(x).sum()))
    x = jnp.array([-1.5, 0.0, 0.7, 3.0, 100.0])
    s = sigmoid(np.asarray(x))
    np.testing.assert_allclose(jax.jit(d1)(x), s, rtol=1e-12)
    assert jax.jit(d1)(x)[4] == 1.0  # the grad block stays finite where exp overflows
    np.testing.assert_allclose(d2(x), s * (1 - s), rtol=1e-12, atol=1e-30)  # e^-100 at 100
    np.testing.assert_allclose(d3(x), s * (1 - s) * (1 - 2 * s), rtol=1e-12, atol=1e-30)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-30, 30), min_size=1, max_size=6))
def test_gradients_on_random_inputs(xs):
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        x = np.array(xs)
        g = jax.grad(lambda x: dsl.to_jax(load("log1pexp").log1pexp)(x).sum())(jnp.asarray(x))
        np.testing.assert_allclose(g, sigmoid(x), rtol=1e-12, atol=1e-15)
        np.testing.assert_array_equal(g, dsl.grad(load("log1pexp").log1pexp)(x))
    finally:
        jax.config.update("jax_enable_x64", before)


def test_vmap_runs_the_function_per_example(x64):
    # a reduction: vmap must give one sum per row, not the sum of the batch
    m = dsl.loads("def f(x, w):\n    return sum(x * x) * w\n")
    f = dsl.to_jax(m.f)
    xs = jnp.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(jax.vmap(f, in_axes=(0, None))(xs, 2.0), [10.0, 100.0])
    grads = jax.jit(jax.vmap(jax.grad(f), in_axes=(0, None)))(xs, jnp.array(2.0))
    np.testing.assert_array_equal(grads, 4 * np.arange(6.0).reshape(2, 3))
    # vmap over a gradient taken with respect to the unbatched argument
    gw = jax.vmap(jax.grad(f, argnums=1), in_axes=(0, None))(xs, jnp.array(2.0))
    np.testing.assert_array_equal(gw, [5.0, 50.0])


def test_f32_is_jax_default_and_matches_the_numpy_call():
    assert not jax.config.jax_enable_x64
    f = load("log1pexp").log1pexp
    x = jnp.linspace(-4, 4, 9)
    assert x.dtype == jnp.float32
    y = dsl.to_jax(f)(x)
    g = jax.jit(jax.grad(lambda x: dsl.to_jax(f)(x).sum()))(x)
    assert y.dtype == g.dtype == jnp.float32
    np.testing.assert_array_equal(y, f(np.asarray(x)))
    np.testing.assert_array_equal(g, dsl.grad(f)(np.asarray(x)))


def test_an_f64_result_reaches_jax_as_f32_without_x64():
    # a Python float (f64 to gradlang) or an f64 param makes the program's
    # result f64, which JAX refused to take back without jax_enable_x64
    assert not jax.config.jax_enable_x64
    bar = dsl.to_jax(load("bar").bar)
    x = jnp.array([0.5, 2.0], jnp.float32)
    np.testing.assert_array_equal(bar(x, 3.0), np.float32([1.5, 6.0]))
    np.testing.assert_array_equal(jax.grad(lambda x: bar(x, 3.0).sum())(x), [3.0, 3.0])
    assert float(jax.grad(lambda y: bar(x, y).sum())(3.0)) == 2.5
    m = dsl.load(EXAMPLES / "linear_poly.grad")  # weights: f64[2], the module's value
    m.params["weights"] = np.array([1.0, 2.0])
    lp = dsl.to_jax(m.linear_poly)
    g = jax.jit(jax.grad(lambda x: lp(x).sum()))(x)
    assert g.dtype == jnp.float32
    np.testing.assert_array_equal(g, [2.0, 2.0])
    np.testing.assert_array_equal(lp(x), np.float32([2.0, 5.0]))


def test_a_64_bit_annotation_without_x64_says_to_enable_it():
    # a NumPy f64 array (made f32 by JAX) was refused as "dtype f32, but
    # its annotation says f64", which the caller had not passed
    assert not jax.config.jax_enable_x64
    f = dsl.to_jax(load("dense").dense)
    for x in (np.ones((2, 3)), jnp.ones((2, 3))):
        with pytest.raises(dsl.ArgumentError, match="'x' of dense\\(\\) is annotated f64.* "
                                                    "jax_enable_x64"):
            f(x, np.ones((3, 2)), np.ones(2))
    pick = dsl.to_jax(dsl.loads("def pick(x, ids: i64[b]):\n    return x[ids]\n").pick)
    with pytest.raises(dsl.ArgumentError, match="'ids' of pick\\(\\) is annotated i64, and "
                                                "without jax_enable_x64 JAX makes every "
                                                "integer array i32"):
        pick(jnp.ones(3), np.array([0, 1]))


def test_params_as_keyword_arrays_get_gradients(x64):
    lp = dsl.to_jax(load("linear_poly").linear_poly)
    x, w = jnp.array([1.0, 2.0, 4.0]), jnp.array([0.5, -3.0])
    np.testing.assert_allclose(lp(x, weights=w), [-2.5, -5.5, -11.5], rtol=1e-15)
    gx, gw = jax.grad(lambda x, w: lp(x, weights=w).sum(), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(gw, [3.0, 7.0], rtol=1e-15)
    np.testing.assert_allclose(gx, [-3.0] * 3, rtol=1e-15)
    check_grads(lambda x, w: lp(x, weights=w), (x, w), order=2, modes=["rev"])


def test_an_index_out_of_range_outside_jit_is_the_argument_error(x64):
    # the callback's ArgumentError reached the caller as JAX's
    # JaxRuntimeError("INTERNAL: CpuCallback error ...")
    embed = dsl.to_jax(load("embedding").embed)
    table = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    for call in (lambda: embed(table, ids=jnp.array([0, 2])),
                 lambda: jax.grad(lambda t: embed(t, ids=jnp.array([-3])))(table)):
        with pytest.raises(dsl.ArgumentError, match="index .* in 'ids' .* out of range for an "
                                                    "axis of size 2"):
            call()
    g = jax.grad(lambda t: embed(t, ids=jnp.array([1, -1, 0])))(table)
    np.testing.assert_array_equal(g, [[2.0, 4.0], [12.0, 16.0]])


def test_several_outputs(x64):
    m = dsl.loads("def two(x, y):\n    return x * y, sin(x)\n")
    f = dsl.to_jax(m.two)
    x, y = jnp.array([0.5, 1.0]), jnp.array([2.0, -1.0])
    gx, gy = jax.grad(lambda x, y: f(x, y)[1].sum(), argnums=(0, 1))(x, y)
    np.testing.assert_allclose(gx, np.cos([0.5, 1.0]), rtol=1e-15)
    np.testing.assert_array_equal(gy, [0.0, 0.0])


def test_bad_arguments_are_argument_errors_at_trace_time(x64):
    f = dsl.to_jax(load("dense").dense)
    with pytest.raises(dsl.ArgumentError, match="argument 'x' of dense\\(\\) has rank 1"):
        jax.jit(f)(jnp.ones(3), jnp.ones((3, 2)), jnp.ones(2))
    with pytest.raises(dsl.ArgumentError, match="unsupported dtype bfloat16"):
        dsl.to_jax(load("log1pexp").log1pexp)(jnp.ones(3, jnp.bfloat16))


def test_an_integer_used_as_a_size_must_be_a_python_int(x64):
    # m is a run-time integer the program uses as a size (NeedsValue)
    m = dsl.loads("def f(x, seg, m: i64):\n    return segment_sum(x, seg, m)\n")
    f = dsl.to_jax(m.f)
    x, seg = jnp.array([1.0, 2.0, 4.0]), jnp.array([1, 0, 1])
    np.testing.assert_array_equal(f(x, seg, 2), [2.0, 5.0])
    np.testing.assert_array_equal(jax.grad(lambda x: (f(x, seg, 2) ** 2).sum())(x),
                                  [10.0, 4.0, 10.0])
    fresh = dsl.to_jax(dsl.loads("def f(x, seg, m: i64):\n    return segment_sum(x, seg, m)\n").f)
    for g in (f, fresh):  # m already compiled by value, or not yet
        with pytest.raises(dsl.ArgumentError, match="argument 'm' of f\\(\\) picks the program "
                                                    "by its value .* pass a Python int"):
            g(x, seg, jnp.array(3))
    lr = dsl.to_jax(load("leaky_relu").leaky_relu)
    np.testing.assert_allclose(lr(jnp.array([-1.0, 2.0]), alpha=0.5), [-0.5, 2.0])


def test_eager_calls_of_one_signature_compile_once_and_keep_constants_apart(x64, caplog):
    f = dsl.to_jax(load("leaky_relu").leaky_relu)
    x = jnp.asarray([1.0, -1.0, -2.0])
    np.testing.assert_allclose(f(x, alpha=0.1), [1.0, -0.1, -0.2], rtol=1e-15)
    y = x * 2
    with jax.log_compiles(), caplog.at_level("DEBUG"):
        caplog.clear()
        np.testing.assert_array_equal(f(y, alpha=0.1), [2.0, -0.2, -0.4])
        assert not [r for r in caplog.records if "ompil" in r.getMessage()]
    # another constant is another program, never the first one's value
    np.testing.assert_allclose(f(x, alpha=0.3), [1.0, -0.3, -0.6], rtol=1e-15)
    np.testing.assert_allclose(f(x, alpha=0.1), [1.0, -0.1, -0.2], rtol=1e-15)
