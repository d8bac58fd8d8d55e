"""The options JAX's transforms have: `grad(f, has_aux=True)` and
`value_and_grad(f, has_aux=True)`, the gradient of f's first output's sum
alone, f's other outputs returned beside it, from one program; `argnums=`,
JAX's and torch.func's name for `wrt`."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

import dsl
from helpers import central_difference, optional_module

jax = optional_module("jax", "jax")

SOURCE = """
def loss(x, w):
    z = x * w
    return sum(log(1 + z * z)), mean(z), z

def loss_and_mean(x, w):
    z = x * w
    return sum(log(1 + z * z)), mean(z)

def one(x):
    return sum(x * x)

def looped(x):
    y = x
    for i in range(3):
        y = sin(y) + y * 0.5
    return sum(y * y), mean(y)
"""


@pytest.fixture(scope="module")
def m():
    return dsl.loads(SOURCE, "aux.grad")


def first(x, w):
    z = x * w
    return np.sum(np.log1p(z * z))


vectors = arrays(np.float64, 4, elements=st.floats(-3, 3))


@settings(max_examples=25, deadline=None)
@given(x=vectors, w=vectors)
def test_the_gradient_is_of_the_first_output_alone_and_the_others_come_beside_it(m, x, w):
    # (the gradient of the sum of every output would add d mean(z) and d z)
    z = x * w
    exact_x, exact_w = 2 * z * w / (1 + z * z), 2 * z * x / (1 + z * z)
    (value, (mean, zs)), (gx, gw) = dsl.value_and_grad(m.loss, wrt=(0, 1), has_aux=True)(x, w)
    np.testing.assert_allclose(value, first(x, w), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(mean, np.mean(z), rtol=1e-14, atol=1e-15)
    np.testing.assert_array_equal(zs, z)
    np.testing.assert_allclose(gx, exact_x, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(gw, exact_w, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(gw, central_difference(first, (x, w), 1), rtol=1e-6, atol=1e-6)
    # one auxiliary output is itself, not a tuple; grad gives (gradient, aux)
    gradient, aux = dsl.grad(m.loss_and_mean, wrt=1, has_aux=True)(x, w)
    np.testing.assert_allclose(gradient, exact_w, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(aux, np.mean(z), rtol=1e-14, atol=1e-15)


def test_it_matches_jax_and_is_one_program(m):
    x, w = np.array([0.5, -1.0, 2.0]), np.array([1.5, 0.25, -0.75])
    f = dsl.value_and_grad(m.loss_and_mean, wrt=1, has_aux=True)
    (value, aux), gradient = f(x, w)
    jnp = jax.numpy

    def twin(w):
        z = jnp.asarray(x) * w
        return jnp.sum(jnp.log(1 + z * z)), jnp.mean(z)
    before = jax.config.jax_enable_x64  # (left as found: other tests in this worker read it)
    jax.config.update("jax_enable_x64", True)
    try:
        (j_value, j_aux), j_gradient = jax.value_and_grad(twin, has_aux=True)(w)
    finally:
        jax.config.update("jax_enable_x64", before)
    np.testing.assert_allclose([value, aux], [j_value, j_aux], rtol=1e-14)
    np.testing.assert_allclose(gradient, j_gradient, rtol=1e-14)
    assert len(f.program(f.bind((x, w), {})).generated.kernel_names) == 1


def test_a_loop_feeding_the_loss_and_the_aux_runs_forward_once(m):
    # the aux outputs were computed by a second copy of f, which CSE merged
    # except for loops: the forward loop ran twice
    def twin(x):
        y = x
        for _ in range(3):
            y = np.sin(y) + y * 0.5
        return np.sum(y * y), np.mean(y)
    x = np.array([0.5, -1.0, 2.0])
    f = dsl.value_and_grad(m.looped, has_aux=True)
    (value, aux), gradient = f(x)
    np.testing.assert_allclose([value, aux], twin(x), rtol=1e-14)
    np.testing.assert_allclose(gradient, central_difference(lambda x: twin(x)[0], (x,), 0),
                               rtol=1e-7)
    loops = [[e.op for e in g.program(g.bind((x,), {})).ir.eqns].count("loop")
             for g in (f, dsl.value_and_grad(m.looped))]
    assert loops == [2, 2]  # forward, backward


def test_a_transform_of_grad_with_aux_differentiates_what_it_returns(m):
    # grad's program returned f's first value too, which format dropped: the
    # gradient of grad(f, has_aux=True) added d value (the gradient itself),
    # and its pullback wanted 3 cotangents
    x, w = np.array([0.5, -1.0, 2.0]), np.array([1.5, 0.25, -0.75])

    def returned(x, w):  # the sum of (d first / dw, mean(z))
        z = x * w
        return np.sum(2 * z * x / (1 + z * z)) + np.mean(z)
    with_aux = dsl.grad(m.loss_and_mean, wrt=1, has_aux=True)
    exact = central_difference(returned, (x, w), 1)
    np.testing.assert_allclose(dsl.grad(with_aux, wrt=1)(x, w), exact, rtol=1e-7, atol=1e-9)
    _, pullback = dsl.vjp(with_aux, x, w)
    np.testing.assert_allclose(pullback(np.ones(3), 1.0)[1], exact, rtol=1e-7, atol=1e-9)


def test_bad_use_is_an_argument_error(m):
    with pytest.raises(dsl.ArgumentError, match=r"aux.grad:10:5: .*grad\(one\) with has_aux=True "
                                                r"needs a function of two or more results"):
        dsl.grad(m.one, has_aux=True)(np.ones(2))
    with pytest.raises(dsl.ArgumentError, match=r"aux.grad:2:5: .*has_aux is True or False, "
                                                "got 'yes'"):  # (it had no location)
        dsl.value_and_grad(m.loss, has_aux="yes")


def test_argnums_is_wrt(m):
    # (it was a TypeError, 'unexpected keyword argument')
    x, w = np.array([0.5, -1.0]), np.array([1.5, 0.25])
    pairs = [(dsl.grad(m.loss_and_mean, argnums=1), dsl.grad(m.loss_and_mean, wrt=1)),
             (dsl.value_and_grad(m.loss_and_mean, argnums=(0, 1)),
              dsl.value_and_grad(m.loss_and_mean, wrt=(0, 1))),
             (dsl.jacfwd(m.loss, argnums=1), dsl.jacfwd(m.loss, wrt=1)),
             (dsl.jacrev(m.loss, argnums="w"), dsl.jacrev(m.loss, wrt="w")),
             (dsl.hessian(m.loss_and_mean, argnums=1), dsl.hessian(m.loss_and_mean, wrt=1))]
    for by_argnums, by_wrt in pairs:
        got, expected = _leaves(by_argnums(x, w)), _leaves(by_wrt(x, w))
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)
    v = np.array([1.0, 2.0])
    np.testing.assert_array_equal(dsl.hvp(m.loss_and_mean, argnums=1)(x, w, v),
                                  dsl.hvp(m.loss_and_mean, wrt=1)(x, w, v))
    with pytest.raises(dsl.ArgumentError, match=r"aux.grad:2:5: .*give wrt or argnums .its "
                                                "other name., not both"):
        dsl.grad(m.loss, wrt=1, argnums=0)
    with pytest.raises(dsl.ArgumentError, match="not both: wrt=0, argnums=1"):
        dsl.grad(m.loss, 0, argnums=1)  # (a 0 written as wrt is not wrt's default)
    with pytest.raises(dsl.ArgumentError, match="argnums=5 is out of range"):
        dsl.jacfwd(m.loss, argnums=(0, 5))  # (the error named wrt, which the caller never wrote)


def _leaves(tree):
    return [leaf for item in tree for leaf in _leaves(item)] if isinstance(tree, tuple) \
        else [np.asarray(tree)]
