"""`dsl.to_jax`: compiled functions as JAX operations differentiated by
gradlang itself, under jit, vmap, and JAX's transforms of both modes.

Values equal the NumPy call; `check_grads` (reverse mode to order 2,
forward mode) passes on every example; jvps equal `dsl.jvp`, Hessians
central differences of `dsl.grad`; derivatives of three orders, and of a
grad block that is not the function's derivative, in both modes, equal
known ones; vmap of a reduction gives one value per example; f32 (JAX's
default) and f64."""
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from helpers import EXAMPLE_CALLS, EXAMPLES, SECOND_ORDER_CALLS
from helpers import load_example as load, optional_module

jax = optional_module("jax", "jax")
jnp = optional_module("jax.numpy", "jax")
jax_test_util = optional_module("jax.test_util", "jax")

RNG = np.random.default_rng(7)


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
    order = 2 if f"{example}.{name}" in SECOND_ORDER_CALLS else 1
    jax_test_util.check_grads(call, tuple(xs), order=order, modes=["rev"])


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


def test_to_jax_pickles_as_its_function_and_differentiates_where_unpickled(x64):
    g = pickle.loads(pickle.dumps(dsl.to_jax(load("log1pexp").log1pexp)))
    x = jnp.array([-1.5, 0.0, 0.7])
    s = sigmoid(np.asarray(x))
    np.testing.assert_allclose(g(x), np.log1p(np.exp(np.asarray(x))), rtol=1e-15)
    np.testing.assert_allclose(jax.grad(lambda x: g(x).sum())(x), s, rtol=1e-12)


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
    # forward mode per example, and of the batched function (block diagonal)
    jac = jax.jit(jax.vmap(jax.jacfwd(f), in_axes=(0, None)))(xs, jnp.array(2.0))
    np.testing.assert_array_equal(jac, 4 * np.arange(6.0).reshape(2, 3))
    jac = jax.jacfwd(jax.vmap(f, in_axes=(0, None)))(xs, jnp.array(2.0))
    np.testing.assert_array_equal(jac, np.einsum("bk,bc->bck", 4 * np.arange(6.0).reshape(2, 3),
                                                 np.eye(2)))


def program_runs(monkeypatch) -> list:
    """The names of the programs the bridge runs through Python from now
    on (eagerly, and under jit where no FFI handler runs them), in order."""
    from dsl import jax_bridge
    runs = []
    for method in ("run", "run_into"):
        run = getattr(jax_bridge.Call, method)
        monkeypatch.setattr(jax_bridge.Call, method,
                            lambda call, *a, run=run: (runs.append(call.f.name), run(call, *a))[1])
    return runs


def test_vmap_and_vmap_of_grad_run_one_stacked_program(x64, monkeypatch):
    # jax.vmap over f's own arguments ran f once per example (lax.map); it
    # is now the program dsl.vmap runs, per-example gradients included
    runs = program_runs(monkeypatch)
    rnn = load("rnn").rnn  # a loop, a runtime index, a matmul
    f = dsl.to_jax(rnn)
    rng = np.random.default_rng(5)
    xs, h, w = rng.normal(size=(4, 5, 3)), rng.normal(size=(4, 3)), rng.normal(size=(3, 3)) / 2
    per_example = np.stack([rnn(xs[i], h[i], w) for i in range(4)])
    grads = np.stack([dsl.grad(rnn, wrt=2)(xs[i], h[i], w) for i in range(4)])
    for transform, want in ((jax.vmap(f, (0, 0, None)), per_example),
                            (jax.jit(jax.vmap(jax.grad(lambda *a: f(*a).sum(), argnums=2),
                                              (0, 0, None))), grads)):
        runs.clear()
        np.testing.assert_allclose(transform(jnp.asarray(xs), jnp.asarray(h), jnp.asarray(w)),
                                   want, rtol=1e-12)
        assert len(runs) <= 2 and all(name.startswith("stacked") for name in runs), runs
    # the stacked call's own derivatives, each one program too: grad of a
    # batch's loss ran the backward pass once per example (4 of them here;
    # 64 runs for 64 examples took 0.9 ms against 0.2), jvp the jvp
    runs.clear()
    total = jax.jit(jax.grad(lambda w: jax.vmap(f, (0, 0, None))(xs, h, w).sum()))(
        jnp.asarray(w))
    np.testing.assert_allclose(total, grads.sum(axis=0), rtol=1e-12)
    assert runs == ["vjp(stacked rnn)"]  # (the value, unused, is left out)
    runs.clear()
    _, t = jax.jvp(lambda w: jax.vmap(f, (0, 0, None))(xs, h, w), (jnp.asarray(w),),
                   (jnp.ones((3, 3)),))
    np.testing.assert_allclose(t, [dsl.jvp(rnn, (xs[i], h[i], w), (None, None, np.ones((3, 3))))[1]
                                   for i in range(4)], rtol=1e-12)
    assert runs == ["stacked rnn", "jvp(stacked rnn)"]


def test_vmap_of_jvp_runs_one_stacked_jvp_program_and_its_derivatives_hold(x64, monkeypatch):
    # jax.vmap of jax.jvp with the primals and the tangents both batched ran
    # the jvp program once per example (64 runs, 1.4 ms for 64 examples of
    # dense; now one run, 0.15 ms)
    runs = program_runs(monkeypatch)
    dense = load("dense").dense  # a matmul, a broadcast, a grad block
    f = dsl.to_jax(dense)
    rng = np.random.default_rng(7)
    xs, txs = rng.normal(size=(2, 5, 4, 3))
    w, tw, b = rng.normal(size=(3, 2)), rng.normal(size=(3, 2)), rng.normal(size=2)

    def jvp_of(x, tx, tw):  # tangents along x and w, b held
        return jax.jvp(lambda x, w: f(x, w, b), (x, w), (tx, tw))[1]

    want = np.stack([dsl.jvp(dense, (xs[i], w, b), (txs[i], tw, None))[1] for i in range(5)])
    for in_axes in ((0, 0, None), (0, 0, 0)):  # tw shared, or one per example
        tws = np.broadcast_to(tw, (5, *tw.shape)) if in_axes[2] == 0 else tw
        runs.clear()
        batched = jax.jit(jax.vmap(jvp_of, in_axes))
        np.testing.assert_allclose(batched(xs, txs, tws), want, rtol=1e-12)
        assert runs == ["stacked jvp(dense)"], runs
        # its transpose (JAX's vmap of the unstacked call's), and the sum a
        # shared tangent's cotangent takes over the batch
        u = rng.normal(size=want.shape)
        _, pullback = jax.vjp(lambda txs, tws: batched(xs, txs, tws), txs, tws)
        ct_x, ct_w = pullback(u)
        # (the transpose of a jvp is the pullback at the same point)
        ct_xs, ct_ws = zip(*(dsl.vjp(dense, xs[i], w, b)[1](u[i])[:2] for i in range(5)))
        np.testing.assert_allclose(ct_x, np.stack(ct_xs), rtol=1e-12)
        np.testing.assert_allclose(ct_w, sum(ct_ws) if in_axes[2] is None else np.stack(ct_ws),
                                   rtol=1e-12)
    # forward over it: the tangent of the tangent along x, against differences
    sx = rng.normal(size=xs.shape)
    _, second = jax.jvp(lambda xs: jax.vmap(jvp_of, (0, 0, None))(xs, txs, tw), (xs,), (sx,))
    eps = 1e-6
    central = (np.asarray(jax.vmap(jvp_of, (0, 0, None))(xs + eps * sx, txs, tw))
               - np.asarray(jax.vmap(jvp_of, (0, 0, None))(xs - eps * sx, txs, tw))) / (2 * eps)
    np.testing.assert_allclose(second, central, rtol=1e-6, atol=1e-8)


def test_vmap_of_jvp_along_a_shared_direction_runs_one_stacked_program(x64, monkeypatch):
    # jax.vmap of jax.jvp with the primals batched and the tangent shared
    # (each example's derivative along one direction, and an hvp's) ran the
    # jvp program once per example (64 runs, 1.3 ms for 64 examples of
    # dense; now one run, 0.07 ms)
    runs = program_runs(monkeypatch)
    dense = load("dense").dense
    f = dsl.to_jax(dense)
    rng = np.random.default_rng(13)
    xs, w, b, v = rng.normal(size=(4, 3, 2)), rng.normal(size=(2, 2)), rng.normal(size=2), \
        rng.normal(size=(3, 2))

    def along_v(x):
        return jax.jvp(lambda x: f(x, w, b), (x,), (v,))[1]

    runs.clear()
    got = jax.jit(jax.vmap(along_v))(xs)
    assert runs == ["stacked jvp(dense)"], runs
    np.testing.assert_allclose(got, [dsl.jvp(dense, (x, w, b), (v, None, None))[1] for x in xs],
                               rtol=1e-12)
    # its transpose sums the examples' cotangents of the shared tangent
    u = rng.normal(size=got.shape)
    (ct_v,) = jax.linear_transpose(lambda v: jax.vmap(
        lambda x: jax.jvp(lambda x: f(x, w, b), (x,), (v,))[1])(xs), v)(u)
    np.testing.assert_allclose(ct_v, sum(dsl.vjp(dense, x, w, b)[1](ui)[0]
                                         for x, ui in zip(xs, u)), rtol=1e-12)
    # an hvp along one direction: the Hessian of each example's sum times v
    runs.clear()
    hvps = jax.jit(jax.vmap(lambda x: jax.jvp(jax.grad(lambda x: f(x, w, b).sum()), (x,),
                                              (v,))[1]))(xs)
    assert runs == ["stacked jvp(vjp(dense))"], runs
    np.testing.assert_allclose(hvps, [dsl.hvp(dense)(x, w, b, v) for x in xs], rtol=1e-12)


def test_a_twice_stacked_jvp_transposes(x64, monkeypatch):
    # jax.grad of jax.vmap of jax.vmap of jax.jvp was a NotImplementedError
    # ("JAX transposed stacked stacked jvp(jvp(dense)), which is not linear"):
    # a stacked call stacked again is linear where the call it stacks is
    runs = program_runs(monkeypatch)
    dense = load("dense").dense
    f = dsl.to_jax(dense)
    rng = np.random.default_rng(17)
    xs, ts = rng.normal(size=(2, 2, 3, 4, 2))
    w, b, v = rng.normal(size=(2, 2)), rng.normal(size=2), rng.normal(size=(4, 2))
    u = rng.normal(size=xs.shape[:2] + (4, 2))

    def jvp_of(x, t):
        return jax.jvp(lambda x: f(x, w, b), (x,), (t,))[1]

    for t, axes in ((ts, 0), (v, (0, None))):  # a tangent per example, or one shared
        batched = jax.vmap(jax.vmap(jvp_of, axes), axes)
        runs.clear()
        got = jax.jit(batched)(xs, t)
        assert runs == ["stacked stacked jvp(dense)"], runs
        ct_t = jax.linear_transpose(lambda t: batched(xs, t), t)(u)[0]
        # (the transpose of a jvp is the pullback at the same point)
        per_example = np.array([[dsl.vjp(dense, x, w, b)[1](ui)[0] for x, ui in zip(xr, ur)]
                                for xr, ur in zip(xs, u)])
        np.testing.assert_allclose(got, [[dsl.jvp(dense, (x, w, b), (tt, None, None))[1]
                                          for x, tt in zip(xr, tr)]
                                         for xr, tr in zip(xs, np.broadcast_to(t, xs.shape))],
                                   rtol=1e-12)
        np.testing.assert_allclose(ct_t, per_example if t is ts else per_example.sum((0, 1)),
                                   rtol=1e-12)
        grad_x = jax.jit(jax.grad(lambda xs: jnp.vdot(batched(xs, t), u)))(xs)
        eps, s = 1e-6, rng.normal(size=xs.shape)
        along = (jnp.vdot(batched(xs + eps * s, t), u) - jnp.vdot(batched(xs - eps * s, t), u))
        np.testing.assert_allclose(np.vdot(grad_x, s), along / (2 * eps), rtol=1e-6)


def test_vmap_of_a_jacobian_runs_one_program(x64, monkeypatch):
    # each example's Jacobian or Hessian ran the one-hot stacked program once
    # per example (64 runs); the backward pass computed every argument's
    # cotangent, w's and b's too, where JAX asked for x's alone
    runs = program_runs(monkeypatch)
    dense = load("dense").dense
    f = dsl.to_jax(dense)
    rng = np.random.default_rng(11)
    xs, w, b = rng.normal(size=(3, 5, 4)), rng.normal(size=(4, 2)), rng.normal(size=2)
    for transform, single, expect in (
            (jax.jacfwd, lambda x: f(x, w, b), "stacked stacked jvp(dense)"),
            (jax.jacrev, lambda x: f(x, w, b), "stacked stacked vjp(dense)"),
            (jax.hessian, lambda x: f(x, w, b).sum(), "stacked stacked jvp(vjp(dense))")):
        runs.clear()
        got = jax.jit(jax.vmap(transform(single)))(xs)
        assert runs == [expect], runs
        mine = {jax.jacfwd: dsl.jacfwd(dense), jax.jacrev: dsl.jacrev(dense),
                jax.hessian: dsl.hessian(dense)}[transform]
        np.testing.assert_allclose(got, [mine(x, w, b) for x in xs], rtol=1e-12, atol=1e-15)
    # every example's one-hot values beyond the bound: one stacked run each
    from dsl.function import stacked_jvp_function
    columns = stacked_jvp_function(dense, "x")
    one_example = 20 * columns.per_slice({"x": xs[0], "w": w, "b": b,
                                          columns.stacked[0]: xs[0]})
    monkeypatch.setattr("dsl.jax_bridge.STACKED_ELEMENTS", one_example)
    runs.clear()
    got = jax.jit(jax.vmap(jax.jacfwd(lambda x: f(x, w, b))))(xs)
    assert runs == ["stacked jvp(dense)"] * 3, runs
    np.testing.assert_allclose(got, [dsl.jacfwd(dense)(x, w, b) for x in xs], rtol=1e-12)


def test_a_gradient_through_jax_computes_only_the_cotangents_asked_for(x64, monkeypatch):
    from dsl import jax_bridge
    backward = []
    run_into = jax_bridge.Call.run_into
    monkeypatch.setattr(jax_bridge.Call, "run_into",
                        lambda call, *a: (backward.append(call), run_into(call, *a))[1])
    dense = load("dense").dense
    f = dsl.to_jax(dense)
    rng = np.random.default_rng(12)
    x, w, b = rng.normal(size=(5, 4)), rng.normal(size=(4, 2)), rng.normal(size=2)
    gw, gx = jax.jit(jax.grad(lambda x, w: f(x, w, b).sum(), argnums=(1, 0)))(x, w)
    want_x, want_w, _ = dsl.vjp(dense, x, w, b)[1](np.ones((5, 2)))
    np.testing.assert_allclose(gx, want_x, rtol=1e-13)
    np.testing.assert_allclose(gw, want_w, rtol=1e-13)
    (vjp_call,) = [c for c in backward if c.f.name == "vjp(dense)"]
    assert len(vjp_call.all_outs) == 2  # x's and w's, not b's
    backward.clear()
    jax.jit(jax.grad(lambda w: f(x, w, b).sum()))(w)
    (vjp_call,) = [c for c in backward if c.f.name == "vjp(dense)"]
    assert len(vjp_call.all_outs) == 1


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
    # an f64 param makes the program's result f64, which JAX refused to
    # take back without jax_enable_x64 (a Python float is weakly typed: f32
    # beside x, as in JAX)
    assert not jax.config.jax_enable_x64
    bar = dsl.to_jax(load("bar").bar)
    x = jnp.array([0.5, 2.0], jnp.float32)
    np.testing.assert_array_equal(bar(x, 3.0), np.float32([1.5, 6.0]))
    np.testing.assert_array_equal(jax.grad(lambda x: bar(x, 3.0).sum())(x), [3.0, 3.0])
    assert float(jax.grad(lambda y: bar(x, y).sum())(3.0)) == 2.5
    _, t = jax.jvp(lambda x, y: bar(x, y), (x, 3.0), (jnp.ones(2, jnp.float32), 2.0))
    assert t.dtype == jnp.float32
    np.testing.assert_array_equal(t, [4.0, 7.0])  # y tx + x ty
    m = dsl.load(EXAMPLES / "linear_poly.grad")  # weights: f64[2], the module's value
    m.params["weights"] = np.array([1.0, 2.0])
    lp = dsl.to_jax(m.linear_poly)
    g = jax.jit(jax.grad(lambda x: lp(x).sum()))(x)
    assert g.dtype == jnp.float32
    np.testing.assert_array_equal(g, [2.0, 2.0])
    np.testing.assert_array_equal(lp(x), np.float32([2.0, 5.0]))


def test_a_numpy_64_bit_scalar_for_a_32_bit_annotation_is_narrowed_as_under_jit():
    # without x64, np.float64(2.5) for y: f32 (np.int64(3) for k: i32) was
    # refused eagerly ("dtype f64, but its annotation says f32") and taken
    # by jit of the same call, where JAX narrows it to an f32 tracer
    assert not jax.config.jax_enable_x64
    m = dsl.loads("def g(x: f32[n], y: f32, k: i32):\n    return x * y + k\n")
    g = dsl.to_jax(m.g)
    x = jnp.array([0.5, -2.0], jnp.float32)
    expected = np.float32([0.5 * 2.5 + 3, -2.0 * 2.5 + 3])
    for call in (g, jax.jit(g)):
        got = call(x, np.float64(2.5), k=np.int64(3))
        assert got.dtype == jnp.float32
        np.testing.assert_array_equal(got, expected)
    with pytest.raises(dsl.ArgumentError, match="'k' of g\\(\\) is out of range for i32"):
        g(x, np.float64(2.5), np.int64(2 ** 31))


@pytest.mark.parametrize("n", [3, 1, 0])
def test_under_jit_kernels_write_into_xlas_result_buffers(n, monkeypatch):
    # under jit every result was made by the kernels in an array of their
    # own, then copied into XLA's by jax.pure_callback; now they fill XLA's
    # buffers, and only a result JAX narrows (f64 without x64) is cast in
    from dsl import jax_bridge
    assert not jax.config.jax_enable_x64
    given = []
    made = jax_bridge.InPlace.__init__

    def watched(in_place, *args):  # the buffers each run hands the driver
        made(in_place, *args)
        run = in_place.run
        in_place.run = lambda *a, out: (given.append(out), run(*a, out=out))[1]
    monkeypatch.setattr(jax_bridge.InPlace, "__init__", watched)
    m = dsl.loads("def mixed(x, y):\n    return x * 2.0, x * y, sum(x)\n")
    x = jnp.arange(n, dtype=jnp.float32) - 0.5
    results = jax.jit(lambda x: dsl.to_jax(m.mixed)(x, np.float64(3.0)))(x)
    direct, narrowed, total = given[0]
    assert isinstance(direct, np.ndarray) and narrowed is None and isinstance(total, np.ndarray)
    expected = m.mixed(np.asarray(x), np.float64(3.0))  # x * y is f64, as NumPy's
    assert [r.dtype for r in results] == [jnp.float32] * 3
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, np.asarray(want, np.float32))


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
    # it said "or annotate i32", which NumPy's i64 arrays then fail: the kind
    # takes both (`n: i64`, as the docs' loops write it, failed under jit)
    with pytest.raises(dsl.ArgumentError, match="or annotate `int` \\(which takes either "
                                                "dtype\\) or i32"):
        pick(jnp.ones(3), np.array([0, 1]))
    # an i16 or f16 array is no 64-bit one JAX narrowed: refused as itself
    # (it was told to enable jax_enable_x64, which changes nothing for it)
    for ids, dtype in ((np.array([0, 1], np.int16), "int16"), (jnp.array([0, 1], jnp.uint8),
                                                                "uint8")):
        with pytest.raises(dsl.ArgumentError, match=f"'ids' of pick\\(\\) has unsupported "
                                                    f"dtype {dtype}"):
            pick(jnp.ones(3), ids)
    with pytest.raises(dsl.ArgumentError, match="'x' of dense\\(\\) has unsupported dtype "
                                                "float16"):
        f(*(jnp.ones(shape, jnp.float16) for shape in ((2, 3), (3, 2), (2,))))
    # an argument left out is no array given for it: hvp's v, after it, was
    # checked as if for the defaulted f64 c (refused, as narrowed)
    g = dsl.loads("def g(x: f32[n], w: f32[n], c: f64 = 1.0):\n    return sum(sin(x * w) * c)\n")
    x, w, v = jnp.array([0.5, -1.0]), jnp.array([1.5, 0.3]), jnp.array([1.0, -2.0])
    np.testing.assert_allclose(dsl.to_jax(dsl.hvp(g.g, wrt=1))(x, w, v),
                               -(x ** 2) * jnp.sin(x * w) * v, rtol=1e-6)


def test_params_as_keyword_arrays_get_gradients(x64):
    lp = dsl.to_jax(load("linear_poly").linear_poly)
    x, w = jnp.array([1.0, 2.0, 4.0]), jnp.array([0.5, -3.0])
    np.testing.assert_allclose(lp(x, weights=w), [-2.5, -5.5, -11.5], rtol=1e-15)
    gx, gw = jax.grad(lambda x, w: lp(x, weights=w).sum(), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(gw, [3.0, 7.0], rtol=1e-15)
    np.testing.assert_allclose(gx, [-3.0] * 3, rtol=1e-15)
    jax_test_util.check_grads(lambda x, w: lp(x, weights=w), (x, w), order=2, modes=["rev"])


def test_under_jit_a_param_left_out_is_read_at_trace_and_a_keyword_one_at_each_call(x64):
    # (as the README says: a jitted function keeps what it closed over)
    m = dsl.load(EXAMPLES / "linear_poly.grad")  # its own params: the shared one's stay
    lp, x = dsl.to_jax(m.linear_poly), jnp.array([1.0, 2.0, 4.0])
    m.params["weights"] = np.array([0.5, 2.0])
    left_out = jax.jit(lambda x: lp(x).sum())
    by_keyword = jax.jit(lambda x, w: lp(x, weights=w).sum())
    assert left_out(x) == by_keyword(x, jnp.array([0.5, 2.0])) == 15.5
    m.params["weights"] = np.array([1.5, 2.0])
    assert left_out(x) == 15.5 and lp(x).sum() == 18.5
    assert by_keyword(x, jnp.array([1.5, 2.0])) == 18.5


def test_a_param_modified_in_place_then_set_back_is_read_as_set(x64):
    # the operation of a call is kept by the values of its constants, but it
    # held the param's array itself: modified in place, then set back to the
    # first values, the call found the first operation, reading the modified one
    m = dsl.loads("param w: f64[2]\n\ndef scaled(x):\n    return w * x\n")
    f = dsl.to_jax(m.scaled)
    x = jnp.array(2.0)
    m.params["w"] = np.array([0.5, 2.0])
    np.testing.assert_array_equal(f(x), [1.0, 4.0])
    m.params["w"][:] = 7.0
    np.testing.assert_array_equal(f(x), [14.0, 14.0])
    m.params["w"] = np.array([0.5, 2.0])
    np.testing.assert_array_equal(f(x), [1.0, 4.0])


def test_an_index_out_of_range_outside_jit_is_the_argument_error(x64):
    # the callback's ArgumentError reached the caller as JAX's
    # JaxRuntimeError("INTERNAL: CpuCallback error ...")
    embed = dsl.to_jax(load("embedding").embed)
    table = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    for call in (lambda: embed(table, ids=jnp.array([0, 2])),
                 lambda: jax.grad(lambda t: embed(t, ids=jnp.array([-3])))(table),
                 lambda: jax.jvp(lambda t: embed(t, ids=jnp.array([2])), (table,), (table,))):
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
    with pytest.raises(dsl.ArgumentError, match="unsupported dtype uint8"):
        dsl.to_jax(load("log1pexp").log1pexp)(jnp.ones(3, jnp.uint8))


def test_a_symbolic_shape_is_an_argument_error_and_a_concrete_one_is_traced(x64):
    # jax.export's shape polymorphism (jax.eval_shape, export, jit(f).trace
    # of symbolic_shape structs) reached NumPy: TypeError "'_DimExpr' object
    # cannot be interpreted as an integer"
    f = dsl.to_jax(load("dense").dense)
    n = jax.export.symbolic_shape("n")[0]
    x, w, b = (jax.ShapeDtypeStruct(s, jnp.float64) for s in ((n, 3), (3, 2), (2,)))
    with pytest.raises(dsl.ArgumentError, match=r"argument 'x' of to_jax\(dense\) has the "
                                                r"symbolic shape \(n, 3\) of jax.export's"):
        jax.eval_shape(f, x, w, b)
    out = jax.eval_shape(f, jax.ShapeDtypeStruct((5, 3), jnp.float64), w, b)
    assert out.shape == (5, 2) and out.dtype == jnp.float64


def test_a_prng_key_array_is_an_argument_error():
    # a typed PRNG key (dtype key<fry>, JAX's own, which NumPy has none for)
    # was an AttributeError ('KeyTy' object has no attribute 'kind') with
    # x64, and JAX's ValueError 'canonicalize_dtype called on extended
    # dtype' without, eagerly and under jit
    m = dsl.loads("param w: f32[n]\ndef f(x: f32[n]):\n    return x * w\n", "keys.grad")
    f, key = dsl.to_jax(m.f), jax.random.wrap_key_data(np.zeros(2, np.uint32))
    for call in (f, jax.jit(f)):
        with pytest.raises(dsl.ArgumentError, match=r"^keys.grad:2:5: error: argument 'x' of "
                                                    r"to_jax\(f\) is a JAX array of dtype key<fry>"):
            call(key, w=np.ones((), np.float32))
    with pytest.raises(dsl.ArgumentError, match=r"param 'w' of to_jax\(f\) is a JAX array of "
                                                "dtype key<fry>"):
        f(np.ones(2, np.float32), w=key)


def test_a_masked_array_is_an_argument_error_of_the_eager_call():
    """JAX's own ValueError ('masked arrays are not supported') reached the
    caller: the bridge made NumPy arrays JAX arrays before binding, whose
    refusal it is.  A keyword param is refused as an argument is."""
    m = dsl.loads("param w: f32[n]\ndef f(x: f32[n]):\n    return x * w\n")
    f = dsl.to_jax(m.f)
    masked = np.ma.masked_array(np.ones(2, np.float32), mask=[True, False])
    with pytest.raises(dsl.ArgumentError, match=r"argument 'x' of to_jax\(f\) is a masked array"):
        f(masked, w=np.ones(2, np.float32))
    with pytest.raises(dsl.ArgumentError, match=r"param 'w' of to_jax\(f\) is a masked array"):
        f(np.ones(2, np.float32), w=masked)
    np.testing.assert_array_equal(f(masked.filled(3.0), w=np.full(2, 2.0, np.float32)), [6, 2])


def test_differentiating_along_a_const_argument_is_an_argument_error(x64):
    # the jvp rule dropped the tangent of a const: grad, jacfwd, jacrev and
    # jvp gave a derivative of 0 where d/d alpha is min(x, 0)
    f = dsl.to_jax(load("leaky_relu").leaky_relu)
    x = jnp.array([1.0, -1.0])
    message = "with respect to 'alpha', which has no gradient"
    for transform in (jax.jacfwd, jax.jacrev, lambda g: jax.jit(jax.jacrev(g))):
        with pytest.raises(dsl.ArgumentError, match=message):
            transform(lambda a: f(x, alpha=a))(0.1)
    with pytest.raises(dsl.ArgumentError, match=message):
        jax.jvp(lambda a: f(x, alpha=a), (0.1,), (1.0,))
    # a tangent of zero (known, outside jit) is no derivative along it
    _, t = jax.jvp(lambda x, a: f(x, alpha=a), (x, 0.1), (jnp.ones(2), 0.0))
    np.testing.assert_allclose(t, [1.0, 0.1], rtol=1e-15)

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


# ------------------------------------------------ forward mode and second order
# (the bridge was a jax.custom_vjp, which JAX refuses to differentiate in
# forward mode: jax.jvp, jacfwd and hessian raised "can't apply
# forward-mode autodiff (jvp) to a custom_vjp function")

def _all_positional(f, inputs, consts):
    """inputs then consts, in the order of f's signature (dsl.jvp takes
    its primals by position)."""
    names = [s.name for s in f.specs]
    return (*inputs, *(consts[n] for n in names[len(inputs):] if n in consts))


@pytest.mark.parametrize("example,name,inputs,consts", EXAMPLE_CALLS,
                         ids=[f"{e}.{n}" for e, n, _, _ in EXAMPLE_CALLS])
def test_every_example_in_forward_mode_through_jax(x64, example, name, inputs, consts):
    f = getattr(load(example), name)
    jf = dsl.to_jax(f)
    xs = [jnp.asarray(x) for x in inputs]
    tangents = [np.linspace(-1.0, 2.0, x.size).reshape(x.shape) for x in inputs]

    def call(*args):
        return jf(*args, **consts)

    y, ty = jax.jit(lambda xs, ts: jax.jvp(call, xs, ts))(xs, [jnp.asarray(t) for t in tangents])
    primals = _all_positional(f, inputs, consts)
    expected_y, expected_ty = dsl.jvp(f, primals, [*tangents, *[None] * (len(primals) -
                                                                         len(inputs))])
    np.testing.assert_allclose(y, expected_y, rtol=1e-12, atol=0)
    np.testing.assert_allclose(ty, expected_ty, rtol=1e-12, atol=1e-15)
    # against central differences
    jax_test_util.check_grads(call, tuple(xs), order=1, modes=["fwd"])
    if f"{example}.{name}" not in SECOND_ORDER_CALLS:
        return
    # forward over reverse: H[i][j] = d grad_i / d arg_j, each along a
    # direction v against central differences of dsl's own gradient
    wrt = tuple(range(len(inputs)))
    h = jax.jit(jax.hessian(lambda *a: call(*a).sum(), argnums=wrt))(*xs)
    grad = dsl.grad(f, wrt=list(wrt))
    eps = 1e-6
    for j, v in enumerate(tangents):
        ahead, behind = list(inputs), list(inputs)
        ahead[j], behind[j] = inputs[j] + eps * v, inputs[j] - eps * v
        differences = [(a - b) / (2 * eps) for a, b in zip(grad(*ahead, **consts),
                                                            grad(*behind, **consts))]
        for i, difference in enumerate(differences):
            np.testing.assert_allclose(np.tensordot(h[i][j], v, v.ndim), difference,
                                       rtol=1e-6, atol=1e-6)


BLOCKED = ("def f(x, y):\n    return sin(x) * y\n"
           "grad(dz):\n    return dz * 2.0 * cos(x) * y, dz * 3.0 * sin(x)\n")


@pytest.mark.parametrize("transform", [lambda g: g, lambda g: jax.jit(g)],
                         ids=["eager", "jit"])
def test_both_modes_and_second_order_follow_a_grad_block(x64, transform):
    # the block is deliberately not f's derivative (cos(x) * y, sin(x)):
    # d/dx = 2 cos(x) y, d/dy = 3 sin(x), so its second derivatives are
    # d2/dx2 = -2 sin(x) y, d2/dxdy = 2 cos(x), d2/dydx = 3 cos(x): not symmetric
    m = dsl.loads(BLOCKED)
    f = dsl.to_jax(m.f)
    x, y = np.array([0.5, -1.0, 2.0]), np.array([2.0, 3.0, -0.5])
    tx, ty = np.array([1.0, -2.0, 0.5]), np.array([0.25, 1.0, -3.0])
    jx, jy = jnp.asarray(x), jnp.asarray(y)
    dx, dy = 2 * np.cos(x) * y, 3 * np.sin(x)

    _, t = transform(lambda *a: jax.jvp(f, a[:2], a[2:]))(jx, jy, jnp.asarray(tx),
                                                          jnp.asarray(ty))
    np.testing.assert_allclose(t, dx * tx + dy * ty, rtol=1e-14)
    np.testing.assert_allclose(t, dsl.jvp(m.f, (x, y), (tx, ty))[1], rtol=1e-14)
    for jacobian in (jax.jacfwd, jax.jacrev):
        jac_x, jac_y = transform(jacobian(f, argnums=(0, 1)))(jx, jy)
        np.testing.assert_allclose(jac_x, np.diag(dx), rtol=1e-14)
        np.testing.assert_allclose(jac_y, np.diag(dy), rtol=1e-14)

    (hxx, hxy), (hyx, hyy) = transform(jax.hessian(lambda *a: f(*a).sum(), (0, 1)))(jx, jy)
    for got, want in ((hxx, -2 * np.sin(x) * y), (hxy, 2 * np.cos(x)),
                      (hyx, 3 * np.cos(x)), (hyy, 0 * x)):
        np.testing.assert_allclose(got, np.diag(want), rtol=1e-14, atol=0)
    np.testing.assert_allclose(hxy, dsl.hessian(m.f, wrt=(0, 1))(x, y)[0][1], rtol=1e-14)
    # forward over forward: d/dx_k of the Jacobian, nonzero where i = j = k
    jac2 = transform(jax.jacfwd(jax.jacfwd(f)))(jx, jy)
    np.testing.assert_allclose(jac2, np.einsum("i,ij,ik->ijk", -2 * np.sin(x) * y,
                                               np.eye(3), np.eye(3)), rtol=1e-14, atol=0)
    # reverse over reverse of a scalar function, and reverse over forward
    d2 = transform(jax.grad(jax.grad(lambda x: f(x, jnp.asarray(y[0])))))(jx[0])
    np.testing.assert_allclose(d2, -2 * np.sin(x[0]) * y[0], rtol=1e-14)
    rev_fwd = transform(jax.grad(lambda x: jax.jvp(lambda x: f(x, jy), (x,), (jnp.asarray(tx),)
                                                   )[1].sum()))(jx)
    np.testing.assert_allclose(rev_fwd, -2 * np.sin(x) * y * tx, rtol=1e-14)
    # reverse over jacfwd's lax.map of forward-mode calls, which JAX transposes
    rev_jac = transform(jax.jacrev(lambda x: jnp.diag(jax.jacfwd(f)(x, jy))))(jx)
    np.testing.assert_allclose(rev_jac, np.diag(-2 * np.sin(x) * y), rtol=1e-14, atol=0)


def test_forward_mode_of_params_as_keyword_arrays(x64):
    m = load("linear_poly")
    lp = dsl.to_jax(m.linear_poly)
    x, w = np.array([1.0, 2.0, 4.0]), np.array([0.5, -3.0])
    tx, tw = np.array([1.0, 0.0, -1.0]), np.array([2.0, 0.5])

    def call(x, w):
        return lp(x, weights=w)

    _, t = jax.jit(lambda *a: jax.jvp(call, a[:2], a[2:]))(x, w, tx, tw)
    np.testing.assert_allclose(t, w[1] * tx + tw[1] * x + tw[0], rtol=1e-15)
    m.params["weights"] = w  # the value dsl's own transforms read
    np.testing.assert_allclose(t, dsl.jvp(m.linear_poly, (x,), {"x": tx, "weights": tw})[1],
                               rtol=1e-15)
    jac_w = jax.jacfwd(call, argnums=1)(x, w)
    np.testing.assert_array_equal(jac_w, np.stack([np.ones(3), x], axis=1))
    # sum(w1 x + w0): d/dx = w1, d/dw = (3, sum x), so d2/dxdw1 = d2/dw1dx = 1
    (hxx, hxw), (hwx, hww) = jax.hessian(lambda x, w: call(x, w).sum(), argnums=(0, 1))(x, w)
    np.testing.assert_array_equal(hxw, [[0.0, 1.0]] * 3)
    np.testing.assert_array_equal(hwx, [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    np.testing.assert_array_equal(hxx, np.zeros((3, 3)))
    np.testing.assert_array_equal(hww, np.zeros((2, 2)))
    jax_test_util.check_grads(call, (x, w), order=1, modes=["fwd"])


def test_linearize_transposes_to_the_backward_pass_and_f_itself_does_not(x64):
    g = dsl.to_jax(load("log1pexp").log1pexp)
    x = jnp.array([-2.0, 0.5, 3.0])
    y, lin = jax.linearize(g, x)
    s = sigmoid(np.asarray(x))
    np.testing.assert_allclose(lin(jnp.ones(3)), s, rtol=1e-14)
    ct, = jax.linear_transpose(lin, x)(jnp.array([1.0, 2.0, -1.0]))
    np.testing.assert_allclose(ct, s * [1.0, 2.0, -1.0], rtol=1e-14)
    with pytest.raises(NotImplementedError, match="transposed log1pexp\\(\\), which is not "
                                                  "linear"):
        jax.linear_transpose(g, x)(x)


def test_eager_vmap_compiles_nothing_again(x64, caplog):
    # under vmap outside jit, each call compiled a new jax.lax.map loop
    # (half a second for a vmap of grad of 10 rows)
    g = dsl.to_jax(load("log1pexp").log1pexp)
    per_row = jax.vmap(jax.grad(lambda x: g(x).sum()))
    xs = jnp.linspace(-3.0, 3.0, 6).reshape(3, 2)
    per_row(xs)
    with jax.log_compiles(), caplog.at_level("DEBUG"):
        caplog.clear()
        np.testing.assert_allclose(per_row(xs), sigmoid(np.asarray(xs)), rtol=1e-14)
        assert not [r for r in caplog.records if "ompil" in r.getMessage()]


def test_jacobians_run_one_stacked_program_or_one_per_column(x64, monkeypatch):
    # jacfwd, jacrev and hessian ran the jvp or backward pass once per
    # column or row (jax.lax.map): 45 ms for a hessian of 100 elements
    runs = program_runs(monkeypatch)
    g = dsl.to_jax(load("log1pexp").log1pexp)
    x = jnp.array([-2.0, -0.5, 0.0, 1.0, 4.0])
    s = sigmoid(np.asarray(x))
    expected = {jax.jit(jax.jacfwd(g)): (np.diag(s), ["stacked jvp(log1pexp)"]),
                jax.jacrev(g): (np.diag(s), ["log1pexp", "stacked vjp(log1pexp)"]),
                jax.jit(jax.hessian(lambda x: g(x).sum())): (np.diag(s * (1 - s)),
                                                            ["stacked jvp(vjp(log1pexp))"])}
    for jacobian, (value, ran) in expected.items():
        runs.clear()
        np.testing.assert_allclose(jacobian(x), value, rtol=1e-14, atol=1e-300)
        assert runs == ran
    # stacked values beyond the bound on their size: one jvp per column
    monkeypatch.setattr("dsl.jax_bridge.STACKED_ELEMENTS", 4 * x.size)
    runs.clear()
    np.testing.assert_allclose(jax.jit(jax.jacfwd(g))(x), np.diag(s), rtol=1e-14)
    assert runs == ["jvp(log1pexp)"] * 5
    # and an RNN's (a loop, which stacks, but not within this bound)
    r = load("rnn").rnn
    xs, h, w = RNG.normal(size=(3, 2)), RNG.normal(size=2), RNG.normal(size=(2, 2)) / 2
    runs.clear()
    np.testing.assert_allclose(jax.jit(jax.jacfwd(dsl.to_jax(r), argnums=2))(xs, h, w),
                               dsl.jacfwd(r, wrt=2)(xs, h, w), rtol=1e-14, atol=1e-15)
    assert runs == ["jvp(rnn)"] * 4


def test_a_jitted_training_loop_with_params_by_keyword_equals_jax(x64):
    m = dsl.loads("param w: f64[3, 2]\nparam b: f64[2]\n\n"
                  "def loss(x: f64[n, 3], t: const f64[n, 2]):\n"
                  "    d = tanh(x @ w + b) - t\n    return mean(d * d)\n", "layer.grad")
    loss = dsl.to_jax(m.loss)

    def reference(params, x, t):
        return jnp.mean((jnp.tanh(x @ params["w"] + params["b"]) - t) ** 2)

    def step(value_of):
        @jax.jit
        def update(params, x, t):
            value, grads = jax.value_and_grad(value_of)(params, x, t)
            return value, jax.tree_util.tree_map(lambda p, g: p - 0.5 * g, params, grads)
        return update

    ours = step(lambda params, x, t: loss(x, t, **params))
    theirs = step(reference)
    x, t = jnp.asarray(RNG.normal(size=(6, 3))), jnp.asarray(RNG.normal(size=(6, 2)))
    p = q = {"w": jnp.asarray(RNG.normal(size=(3, 2))), "b": jnp.zeros(2)}
    for _ in range(4):
        (value, p), (expected, q) = ours(p, x, t), theirs(q, x, t)
        np.testing.assert_allclose(value, expected, rtol=1e-13)
        for k in p:
            np.testing.assert_allclose(p[k], q[k], rtol=1e-12, atol=1e-15)
    # a param left out is read when JAX traces: a jitted function keeps the
    # value it was traced with, as it keeps any NumPy array it closes over
    m.params.update(w=np.asarray(p["w"]), b=np.asarray(p["b"]))
    traced = jax.jit(lambda x: loss(x, t))
    np.testing.assert_allclose(traced(x), reference(p, x, t), rtol=1e-13)
    m.params["b"] = np.ones(2)
    np.testing.assert_allclose(traced(x), reference(p, x, t), rtol=1e-13)
    np.testing.assert_allclose(loss(x, t), reference({**p, "b": jnp.ones(2)}, x, t), rtol=1e-13)


def test_a_params_gradient_has_the_dtype_of_the_array_passed(x64):
    # an f64 array for an f32 param is computed in f32; its gradient came
    # back f32, where JAX's is in the primal's dtype (as jnp's astype gives)
    m = dsl.loads("param v: f32[2]\n\ndef scaled(x):\n    return v[1] * x + v[0]\n", "v.grad")
    scaled = dsl.to_jax(m.scaled)
    x, v = jnp.array([1.0, 2.0], jnp.float32), jnp.array([0.5, 3.0])
    for transform in (jax.grad, lambda g: jax.jit(jax.grad(g))):
        g = transform(lambda v: scaled(x, v=v).sum())(v)
        assert g.dtype == jnp.float64
        np.testing.assert_array_equal(g, [2.0, 3.0])
    _, pullback = jax.vjp(lambda v: scaled(x, v=v), v)
    assert pullback(jnp.ones(2, jnp.float32))[0].dtype == jnp.float64
    reference = jax.jacrev(lambda v: v.astype(jnp.float32)[1] * x + v.astype(jnp.float32)[0])
    jac = jax.jacrev(lambda v: scaled(x, v=v))(v)
    assert jac.dtype == reference(v).dtype
    np.testing.assert_array_equal(jac, reference(v))


def test_a_call_made_without_x64_is_not_reused_with_it():
    # the operation kept per signature was kept across jax_enable_x64: made
    # without it (its f64 result made f32), it gave f32 with it too
    assert not jax.config.jax_enable_x64
    bar = dsl.to_jax(load("bar").bar)
    x = jnp.array([0.5, 2.0], jnp.float32)
    y64 = np.float64(3.0)  # (a Python float is weakly typed: f32 beside x)
    assert bar(x, y64).dtype == jnp.float32
    jax.config.update("jax_enable_x64", True)
    try:
        for y in (bar(x, y64), jax.jit(bar)(x, y64)):
            assert y.dtype == jnp.float64  # x * an f64, as in JAX with x64
            np.testing.assert_array_equal(y, [1.5, 6.0])
        assert jax.grad(lambda y: bar(x, y).sum())(3.0).dtype == jnp.float64
    finally:
        jax.config.update("jax_enable_x64", False)


def test_an_hvp_vector_of_another_dtype_is_converted_not_dropped(x64):
    # hvp makes v wrt's dtype, an array of its own: the JAX value no longer
    # stood for it, and v was taken as a constant of zeros (an hvp of 0,
    # and a gradient of 0 along v); the Hessian of sum(sin(x * w)) in w is
    # diag(-x^2 sin(x w))
    # (c, defaulted, left out: v is the third value given, for the fourth)
    f = dsl.loads("def f(x, w, c: f64 = 1.0):\n    return sum(sin(x * w) * c)\n").f
    hvp = dsl.to_jax(dsl.hvp(f, wrt=1))
    x, w = jnp.array([0.5, -1.0, 2.0]), jnp.array([1.5, 0.3, -0.7])
    v = jnp.array([1.0, -2.0, 0.5], jnp.float32)
    hessian = -np.asarray(x) ** 2 * np.sin(np.asarray(x * w))
    for run in (hvp, jax.jit(hvp)):
        np.testing.assert_allclose(run(x, w, v), hessian * np.asarray(v), rtol=1e-13)
    along_v = jax.grad(lambda v: hvp(x, w, v).sum())(v)
    assert along_v.dtype == jnp.float32
    np.testing.assert_allclose(along_v, hessian, rtol=1e-6)
    # transforms of it place v as it does (they placed it by position, for c)
    value, _ = dsl.to_jax(dsl.value_and_grad(dsl.hvp(f, wrt=1), wrt=1))(x, w, v)
    np.testing.assert_allclose(value, hessian * np.asarray(v), rtol=1e-13)
    vs = jnp.stack([v, 2 * v])
    mapped = dsl.to_jax(dsl.vmap(dsl.hvp(f, wrt=1), in_axes=(None, None, None, 0)))
    np.testing.assert_allclose(mapped(x, w, vs), hessian * np.asarray(vs), rtol=1e-13)


def test_a_small_call_under_jit_runs_its_kernels_with_no_python(x64, monkeypatch):
    # each call under jit crossed into Python twice (forward, backward), a
    # callback that cost 3 times JAX's own jitted log1pexp at n = 16; its
    # kernels now run from an XLA FFI handler on XLA's buffers
    from dsl import jax_ffi
    ran = program_runs(monkeypatch)
    f = load("log1pexp").log1pexp
    g = dsl.to_jax(f)
    step = jax.jit(lambda x: jax.value_and_grad(lambda x: g(x).sum())(x))
    x = np.linspace(-30.0, 40.0, 16).reshape(4, 4)  # a rank-2 buffer, read flat
    for x in (x, x[::-1] / 3):
        value, grad = step(x)
        np.testing.assert_allclose(value, np.logaddexp(0, x).sum(), rtol=1e-14)
        # (the grad block's 1 - 1 / (1 + e), as the direct call computes it)
        np.testing.assert_array_equal(grad, dsl.grad(f)(x))
        np.testing.assert_allclose(grad, 1 / (1 + np.exp(-x)), rtol=1e-12, atol=1e-16)
    assert ran == []
    assert jax_ffi._HANDLERS


def test_an_ffi_handler_reads_the_calls_constants_and_writes_each_result(x64, monkeypatch):
    # a constant (the Python float) is read where the call holds it; two
    # inputs, two results, each in its own buffer
    ran = program_runs(monkeypatch)
    m = dsl.loads("def two(x, y, c):\n    return x * y * c, sin(x) * c\n")
    f = dsl.to_jax(m.two)
    x, y = np.linspace(-2.0, 2.0, 5), np.arange(5.0)
    for c in (3.0, -0.5):
        got = jax.jit(lambda x, y: f(x, y, c))(x, y)
        np.testing.assert_allclose(got[0], x * y * c, rtol=1e-15)
        np.testing.assert_allclose(got[1], np.sin(x) * c, rtol=1e-15)
    assert ran == []


# A handler's cached machine code holds its kernels': a warm process
# loaded a sin kernel's handler without the huge-argument library it
# calls by name, and LLVM aborted the process at the next code it linked
# ("Symbol not found: gradc_huge_sin").
FFI_SIN = """
import sys, numpy as np, jax
jax.config.update("jax_enable_x64", True)
import dsl
f = dsl.to_jax(dsl.loads("def f(x, c):\\n    return sin(x) * c\\n").f)
x = np.linspace(-2.0, 2.0, 5)
error = np.abs(np.asarray(jax.jit(lambda x: f(x, 3.0))(x)) - 3.0 * np.sin(x)).max()
print(error, dsl.grad(dsl.load(sys.argv[1]).log1pexp)(np.array([100.0]))[0])
"""


def test_a_warm_process_links_what_a_cached_handlers_kernels_call(tmp_path):
    env = {**os.environ, "GRADC_CACHE_DIR": str(tmp_path)}
    for _ in ("cold", "warm"):
        run = subprocess.run([sys.executable, "-c", FFI_SIN, str(EXAMPLES / "log1pexp.grad")],
                             env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        error, slope = map(float, run.stdout.split())
        assert error < 1e-15 and slope == 1.0


def test_a_jax_without_its_ffi_module_keeps_the_callback(monkeypatch):
    # jax.ffi came in JAX 0.4.38 (the extra takes 0.4.35): an older one
    # raised AttributeError at the first jitted call instead of calling back
    from dsl import jax_ffi
    monkeypatch.delattr(jax, "ffi")
    jax_ffi._api_version.cache_clear()
    try:
        assert jax_ffi._api_version() is None
    finally:
        monkeypatch.undo()
        jax_ffi._api_version.cache_clear()
    assert jax_ffi._api_version() is not None


def test_a_call_an_ffi_handler_cannot_run_keeps_the_callback(x64, monkeypatch):
    # a matmul (a helper of the driver, not a kernel) and a size whose
    # kernel the driver may run in parallel: the Python callback runs them
    ran = program_runs(monkeypatch)
    x, w, b = RNG.normal(size=(3, 4)), RNG.normal(size=(4, 2)), RNG.normal(size=2)
    got = jax.jit(dsl.to_jax(load("dense").dense))(x, w, b)
    np.testing.assert_allclose(got, np.logaddexp(0, x @ w + b), rtol=1e-13)
    assert ran == ["dense"]
    big = np.linspace(-1.0, 1.0, 40_000)
    got = jax.jit(dsl.to_jax(load("log1pexp").log1pexp))(big)
    np.testing.assert_allclose(got, np.logaddexp(0, big), rtol=1e-14)
    assert ran == ["dense", "log1pexp"]


def test_kernels_run_as_python_keep_the_callback():
    # under NUMBA_DISABLE_JIT (which the runtime supports) a kernel is its
    # Python function, which no handler calls: the first jitted call raised
    # AttributeError ('function' object has no attribute 'py_func')
    from types import SimpleNamespace

    from dsl import jax_ffi
    f = dsl.loads("def cube(x):\n    return x * x * x\n").cube
    x = np.linspace(-2.0, 2.0, 5)
    program = f.program(f.on_target(f.bind((x,), {})))
    assert jax_ffi.ffi_target(program, {"x": x}, ("x",), [((5,), x.dtype)]) is not None
    as_python = SimpleNamespace(**{name: getattr(kernel, "py_func", kernel)
                                   for name, kernel in vars(program.kernels).items()})
    python = SimpleNamespace(kernels=as_python, out_types=program.out_types,
                             generated=program.generated)
    assert jax_ffi.ffi_target(python, {"x": x}, ("x",), [((5,), x.dtype)]) is None


def test_threads_run_one_ffi_handler_at_once(x64):
    # a handler keeps nothing between calls: its temporaries are its own
    from concurrent.futures import ThreadPoolExecutor
    f = load("log1pexp").log1pexp
    g = dsl.to_jax(f)
    step = jax.jit(jax.grad(lambda x: g(x).sum()))
    xs = [np.linspace(-5.0, 5.0, 16) * k for k in range(1, 9)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda x: np.asarray(step(x)), xs * 8))
    for x, grad in zip(xs * 8, got):
        np.testing.assert_array_equal(grad, dsl.grad(f)(x))


def test_one_ffi_handler_serves_every_size_of_a_program(x64, monkeypatch):
    # the sizes were constants of a handler's code: each shape JAX traced
    # compiled another (0.1-0.2 s, ten times the rest of a first call)
    from dsl import jax_ffi
    ran = program_runs(monkeypatch)
    f = load("log1pexp").log1pexp
    step = jax.jit(dsl.to_jax(f))
    step(np.linspace(-1.0, 1.0, 5))
    handlers = len(jax_ffi._HANDLERS)
    for n in (6, 7, 9):
        x = np.linspace(-3.0, 3.0, n)
        np.testing.assert_allclose(step(x), np.logaddexp(0, x), rtol=1e-14)
    assert len(jax_ffi._HANDLERS) == handlers and ran == []


def test_a_call_with_larger_constants_keeps_the_callback(x64, monkeypatch):
    # XLA holds an FFI call's constants in the executable: past
    # CONSTANT_BYTES the callback reads them where the call holds them
    monkeypatch.setattr("dsl.jax_ffi.CONSTANT_BYTES", 7)  # less than one f64
    ran = program_runs(monkeypatch)
    m = dsl.loads("def scaled(x, c):\n    return x * c\n")
    x = np.linspace(-2.0, 2.0, 5)
    np.testing.assert_array_equal(jax.jit(lambda x: dsl.to_jax(m.scaled)(x, 2.5))(x), x * 2.5)
    assert ran == ["scaled"]


def test_an_ffi_handler_is_loaded_from_the_kernel_cache(x64, monkeypatch):
    # every process compiled its handlers again (0.1-0.2 s each, beside
    # 0.04 s for the rest of a jitted step's first call); their machine
    # code is now kept in the kernel cache, as the kernels' is
    from dsl import jax_ffi
    source = "def cube(x):\n    return x * x * x\n"
    x = np.linspace(-2.0, 2.0, 5)
    jax.jit(dsl.to_jax(dsl.loads(source).cube))(x)  # compiled, or loaded
    monkeypatch.setattr(jax_ffi, "_HANDLERS", {})  # as a fresh process has
    np.testing.assert_array_equal(jax.jit(dsl.to_jax(dsl.loads(source).cube))(x), x ** 3)
    ((_, handler),) = jax_ffi._HANDLERS.values()
    assert handler.cache_hits == 1


def test_ctrl_c_during_an_ffi_handlers_compile_is_raised_after_it(x64, monkeypatch):
    # as during a kernel's (test_interrupts): a compile cut short by a
    # KeyboardInterrupt could leave Numba failing every later compile
    import signal

    from numba.core.ccallback import CFunc
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    compiled, compile_whole = [], CFunc.compile

    def pressing_ctrl_c(handler):
        signal.raise_signal(signal.SIGINT)
        compile_whole(handler)
        compiled.append(handler)
    monkeypatch.setattr(CFunc, "compile", pressing_ctrl_c)
    m = dsl.loads("def shifted(x):\n    return x * 2.25 - 7.0\n")  # a handler no test makes
    x = np.linspace(-2.0, 2.0, 5)
    try:
        with pytest.raises(KeyboardInterrupt):
            jax.jit(dsl.to_jax(m.shifted))(x)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(compiled) == 1  # the compile ran to its end
    monkeypatch.setattr(CFunc, "compile", compile_whole)
    np.testing.assert_array_equal(jax.jit(dsl.to_jax(m.shifted))(x), x * 2.25 - 7.0)


def test_a_list_holding_jax_arrays_is_an_argument_error_and_one_of_numpy_arrays_is_taken():
    # a traced one was "argument 'x' ... is not an array: The numpy.ndarray
    # conversion method __array__() was called on traced array ..."; a
    # NumPy array of a dtype gradlang does not take was JAX's own TypeError
    f = dsl.to_jax(load("log1pexp").log1pexp)
    for call in (lambda: jax.grad(lambda a: f([a, a]).sum())(jnp.ones(2)),
                 lambda: jax.jit(f)((jnp.ones(2),)), lambda: f([jnp.ones(2)])):
        with pytest.raises(dsl.ArgumentError, match=r"argument 'x' of to_jax\(log1pexp\) is a "
                                                    r"(list|tuple) holding an array.*stack"):
            call()
    with pytest.raises(dsl.ArgumentError, match="has unsupported dtype <U1"):
        f(np.array(["a"]))
    values = [np.array(0.0), np.array(1.0)]
    np.testing.assert_allclose(f(values), np.log1p(np.exp([0.0, 1.0])), rtol=1e-6)


def test_half_precision_runs_in_float32_and_its_gradient_comes_back_in_its_dtype():
    # (refused: "unsupported dtype bfloat16", where to_torch casts it); in
    # jax.grad x is a tracer, as under jit
    f = dsl.to_jax(load("log1pexp").log1pexp)
    x = jnp.array([-3.0, -0.5, 0.0, 2.0, 30.0], jnp.bfloat16)
    y, g = f(x), jax.grad(lambda x: jnp.sum(f(x)))(x)
    assert y.dtype == jnp.float32 and g.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y), np.logaddexp(0, np.asarray(x, np.float64)),
                               rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(
        jax.nn.sigmoid(x.astype(jnp.float32)).astype(jnp.bfloat16), np.float32))
    h = dsl.loads("def h(x: f64):\n    return x * 2.0\n").h
    with pytest.raises(dsl.ArgumentError, match="argument 'x' of h.. has unsupported dtype "
                                                "bfloat16"):
        dsl.to_jax(h)(x)


def _varying_axes(aval) -> frozenset:
    """The manual axes JAX's type of a value says it varies over (JAX 0.10's
    `mat.varying`, `vma` before)."""
    mat = getattr(aval, "mat", None)
    return frozenset(mat.varying if mat is not None else getattr(aval, "vma", ()))


def test_inside_shard_map_results_vary_and_a_replicated_weights_cotangent_is_summed(x64):
    # data-parallel training: x sharded over the mesh axis, w replicated.  The
    # call's results were typed replicated (out_specs=P() then took device 0's
    # local loss for every device's), and w's cotangent was not summed over
    # the devices (jax.grad gave the local gradient where JAX's own ops give
    # the full batch's), and x's was typed replicated: JAX's internal
    # "Expected cotangent type float64[4,2]{V:d} but got float64[4,2]"
    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:
        pytest.skip("jax.shard_map is JAX 0.7's")
    from jax.sharding import Mesh, PartitionSpec as P
    f = dsl.to_jax(dsl.loads("def loss(x, w):\n    return sum((x @ w) ** 2)\n").loss)
    mesh = Mesh(np.array(jax.devices()[:1]), ("d",))  # (the test process has one CPU device)
    x, w = np.arange(8.0).reshape(4, 2), np.array([1.0, -1.0])
    types = []

    def body(x, w):
        types.append(jax.typeof(f(x, w)))
        return jax.grad(f, argnums=(0, 1))(x, w)

    gx, gw = jax.jit(shard_map(body, mesh=mesh, in_specs=(P("d", None), P()),
                               out_specs=(P("d", None), P())))(x, w)
    assert _varying_axes(types[0]) == {"d"}
    np.testing.assert_allclose(gx, 2 * np.outer(x @ w, w), rtol=1e-15)
    np.testing.assert_allclose(gw, 2 * x.T @ (x @ w), rtol=1e-15)


def test_a_weakly_typed_number_is_taken_as_a_python_number(x64):
    # with jax_enable_x64, jit makes a Python float a weakly typed f64 tracer
    # (a weak value as jnp.asarray(0.5) is, used here: jit's first call
    # compiles an FFI handler, 0.5 s cold): it was taken as an f64 array, so
    # jit(f)(x, 0.5) of an f32 x computed in f64 (the eager call, and JAX's
    # own ops, in f32), and a parameter annotated f32 refused it ("has dtype
    # f64, but its annotation says f32") where the eager call took 0.5
    m = dsl.loads("def scaled(x, s):\n    return sum(tanh(x) * s)\n\n"
                  "def ann(x, s: f32):\n    return sum(tanh(x) * s)\n")
    x = jnp.asarray([0.25, -1.5, 3.0], jnp.float32)
    weak = jnp.asarray(0.5)
    assert weak.weak_type and weak.dtype == jnp.float64
    for f in (dsl.to_jax(m.scaled), dsl.to_jax(m.ann)):
        value, python = f(x, weak), f(x, 0.5)
        assert value.dtype == python.dtype == jnp.float32 and float(value) == float(python)
        np.testing.assert_allclose(float(value), np.sum(np.tanh(np.asarray(x)) * np.float32(0.5)),
                                   rtol=1e-6)
    ds = jax.grad(f, argnums=1)(x, weak)  # (ann's: one gradient program is enough)
    np.testing.assert_allclose(float(ds), np.sum(np.tanh(np.asarray(x, np.float64))), rtol=1e-6)
    # a Python int for a float parameter too (s / 3 of an i64 s is f64)
    third = dsl.to_jax(dsl.loads("def third(x, s):\n    return sum(x * (s / 3))\n").third)
    value, python = third(x, jnp.asarray(2)), third(x, 2)
    assert value.dtype == python.dtype == jnp.float32 and float(value) == float(python)
    np.testing.assert_allclose(float(value), 1.75 * 2 / 3, rtol=1e-6)
    # a weak i64 for a parameter annotated i32 ("has dtype i64, but its
    # annotation says i32", where the call with 2 ran)
    twice = dsl.to_jax(dsl.loads("def twice(x, k: i32):\n    return x * float32(k)\n").twice)
    value, python = twice(x, jnp.asarray(2)), twice(x, 2)
    assert value.dtype == python.dtype == jnp.float32
    np.testing.assert_array_equal(value, np.float32([0.5, -3.0, 6.0]))
    np.testing.assert_array_equal(python, np.float32([0.5, -3.0, 6.0]))


def test_a_weakly_typed_number_without_x64_is_bound_as_the_python_number():
    # without x64 JAX holds a Python number that jit or grad made a tracer
    # (as jnp.asarray(2) is) as i32 or f32: it was refused for an i64 or f64
    # annotation ("enable jax_enable_x64", jax.grad(f, argnums=2)(x, 3, 0.5)
    # too) where the call with the number ran, and an int for an unannotated
    # parameter was an i32 array: an i32 result for an integer x, where the
    # call with 3 gives f32 (3 is weakly a float, as in the language)
    assert not jax.config.jax_enable_x64
    m = dsl.loads("def scaled(x: f32[n], k: i64, s: f64):\n"
                  "    return sum(tanh(x) * float32(k)) * s\n\n"
                  "def times(x, s):\n    return x * s\n")
    scaled, times = dsl.to_jax(m.scaled), dsl.to_jax(m.times)
    x = jnp.asarray([0.25, -1.5, 3.0], jnp.float32)
    tanhs = np.sum(np.tanh([0.25, -1.5, 3.0]))
    python = scaled(x, 3, 0.5)
    for got in (scaled(x, jnp.asarray(3), 0.5), scaled(x, 3, jnp.asarray(0.5))):
        assert got.dtype == python.dtype == jnp.float32 and float(got) == float(python)
    np.testing.assert_allclose(float(python), 1.5 * tanhs, rtol=1e-6)
    ds = jax.grad(scaled, argnums=2)(x, 3, 0.5)  # (0.5: a weak f32 JVP tracer)
    assert ds.dtype == jnp.float32
    np.testing.assert_allclose(float(ds), 3 * tanhs, rtol=1e-6)
    ints = jnp.asarray([1, -2], jnp.int32)
    for got in (times(ints, jnp.asarray(3)), times(ints, 3)):
        assert got.dtype == jnp.float32
        np.testing.assert_array_equal(got, np.float32([3.0, -6.0]))
