"""`cumsum(x, axis=None)`, NumPy's `np.cumsum`: values (bit for bit, every
dtype, rank and axis, on every target), gradients and second order against
central differences, forward mode against reverse, vmap, a grad block
scanning its cotangent, Dask blocks, and the errors of bad axes.
(The op-table tests in tests/test_ops.py cover the primitive itself.)"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from helpers import central_difference, optional_module
from gradlang.runtime import target as targets

SOURCE = """
def along(x, k: const i64):
    return cumsum(x, axis=k)

def flat(x):
    return cumsum(x)

def loss(x, w):
    running = cumsum(x * w, axis=1)
    return sum(sin(running) * cumsum(x * x, axis=0)) + sum(cumsum(x))
"""

TARGETS = sorted(targets.TARGETS)


@pytest.fixture(scope="module")
def cpu():
    return dsl.loads(SOURCE, "scan.grad")


@pytest.fixture(scope="module", params=TARGETS)
def module(request, cpu):
    if request.param == "cpu":  # (one module: its programs compiled once)
        return cpu
    return dsl.loads(SOURCE, "scan.grad", target=request.param, host_results=True)


def sample(rng, shape, dtype):
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in ("int64", "int32"):
        return rng.integers(-50, 50, shape).astype(dtype)
    return rng.normal(size=shape).astype(dtype)


@settings(max_examples=12, deadline=None)
@given(shape=st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple),
       dtype=st.sampled_from(["float64", "float32", "int64", "int32", "bool"]),
       data=st.data(), seed=st.integers(0, 2**31))
def test_values_are_numpys_bit_for_bit(cpu, shape, dtype, data, seed):
    x = sample(np.random.default_rng(seed), shape, dtype)
    got, expected = cpu.flat(x), np.cumsum(x)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    if shape:
        k = data.draw(st.integers(-len(shape), len(shape) - 1))
        got, expected = cpu.along(x, k), np.cumsum(x, axis=k)
        assert got.dtype == expected.dtype  # ints and bools sum as int64, floats keep theirs
        np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8))


def test_every_target_and_the_gradient(module):
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64, np.int64):
        x = sample(rng, (3, 2, 4), np.dtype(dtype).name)
        for k in (0, 1, -1):
            np.testing.assert_array_equal(module.along(x, k), np.cumsum(x, axis=k))
        np.testing.assert_array_equal(module.flat(x), np.cumsum(x))
    x, w = rng.normal(size=(3, 4)), rng.normal(size=4)
    gx, gw = dsl.grad(module.loss, wrt=(0, 1))(x, w)
    for k, g in ((0, gx), (1, gw)):
        np.testing.assert_allclose(g, central_difference(module.loss, (x, w), k),
                                   rtol=1e-6, atol=1e-7)


def test_grad_of_grad_jvp_and_jacobians(cpu):
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(3, 4)), rng.normal(size=4)
    # second order: the Hessian against differences of the gradient
    # second order (jacfwd of the gradient: forward mode through the
    # reverse scan of the backward pass) against differences of the gradient
    h = dsl.hessian(cpu.loss, wrt=0)(x, w)
    grad = dsl.grad(cpu.loss, wrt=(0, 1))
    eps = 1e-5
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = eps
        fd = (grad(x + e, w)[0] - grad(x - e, w)[0]) / (2 * eps)
        np.testing.assert_allclose(h[(...,) + i], fd, rtol=1e-6, atol=1e-7)
    # forward mode: the jvp is jacrev times the tangent
    for k in (0, 1):
        reverse = dsl.jacrev(cpu.along)(x, k)
        np.testing.assert_array_equal(dsl.jacfwd(cpu.along)(x, k), reverse)
        t = rng.normal(size=x.shape)
        _, tangent = dsl.jvp(cpu.along, (x, k), (t, None))
        np.testing.assert_allclose(tangent, np.tensordot(reverse, t, 2), rtol=1e-12)
    np.testing.assert_array_equal(reverse.reshape(12, 12),
                                  np.kron(np.eye(3), np.tril(np.ones((4, 4)))))


def test_vmap(cpu):
    rng = np.random.default_rng(2)
    xs, w = rng.normal(size=(5, 3, 4)), rng.normal(size=4)
    for k in (0, -1):
        np.testing.assert_array_equal(dsl.vmap(cpu.along, in_axes=(0, None))(xs, k),
                                      np.cumsum(xs, axis=k % 2 + 1))
    per_example = dsl.vmap(dsl.grad(cpu.loss, wrt=0), in_axes=(0, None))(xs, w)
    for x, g in zip(xs, per_example):
        np.testing.assert_allclose(g, dsl.grad(cpu.loss, wrt=0)(x, w), rtol=1e-12)


BLOCK = """
def prefix(x):
    return cumsum(x)
grad(dy):
    # the reverse cumulative sum of the cotangent, by flips
    return cumsum(dy[::-1])[::-1] * 0.5

def loss(x):
    return sum(prefix(x) * cos(x))
"""


def test_a_grad_block_scanning_its_cotangent_is_linear_and_transposed():
    m = dsl.loads(BLOCK, "block.grad")
    x = np.random.default_rng(3).normal(size=5)
    u = np.cos(x)
    block = np.cumsum(u[::-1])[::-1] * 0.5  # the block's half-gradient of prefix
    np.testing.assert_allclose(dsl.grad(m.loss)(x), block - np.cumsum(x) * np.sin(x),
                               rtol=1e-12)
    # forward mode follows the block: its transpose is half the forward scan
    t = np.random.default_rng(4).normal(size=5)
    _, tangent = dsl.jvp(m.prefix, (x,), (t,))
    np.testing.assert_allclose(tangent, np.cumsum(t) * 0.5, rtol=1e-12)
    with pytest.raises(dsl.GradError, match=r"block2.grad:6:12: .*not linear"):
        dsl.loads(BLOCK.replace("* 0.5", "+ 0.5"), "block2.grad")


@pytest.mark.parametrize("parallel", ["always", "never"])
def test_large_scans_run_kernels_with_numpys_bits(gradc_parallel, cpu, parallel):
    gradc_parallel(parallel)  # the parallel kernel, then the serial one
    x = np.random.default_rng(5).normal(size=(200, 300)).astype(np.float32)
    u = np.random.default_rng(6).normal(size=x.shape).astype(np.float32)
    for k in (0, 1):
        value, pullback = dsl.vjp(cpu.along, x, k)
        np.testing.assert_array_equal(value, np.cumsum(x, axis=k))
        # reverse: the cotangent's cumulative sum from the back
        np.testing.assert_array_equal(pullback(u)[0], np.flip(np.cumsum(np.flip(u, k), axis=k), k))


@pytest.mark.parametrize("call,message,column", [
    # (an axis written in the call: at it; it was at the call)
    ("cumsum(x, axis=2)", "axis 2 is out of range for rank 2", 27),
    ("cumsum(x, axis=-3)", "axis -3 is out of range for rank 2", 27),
    ("cumsum(x, axis=sum(x > 0.0))", "axis must be a compile-time integer", 12),
    ("cumsum(x, axis=1.0)", "axis must be a compile-time integer", 12),
    ("cumsum(x, 0, 1)", r"cumsum\(\) takes 1 to 2 positional arguments but 3", 12),
])
def test_bad_axes_are_errors_at_the_call(call, message, column):
    # (at load for a wrong signature, else where it is compiled for a call)
    with pytest.raises(dsl.GradError, match=f"bad.grad:2:{column}: error: {message}"):
        dsl.loads(f"def f(x, k: i64):\n    return {call}\n", "bad.grad").f(np.ones((2, 3)), 1)


def test_dask_blockwise_along_rows_and_refused_along_the_batch(cpu):
    da = optional_module("dask.array", "dask")
    x = np.random.default_rng(6).normal(size=(40, 6))
    xs = da.from_array(x, chunks=(10, 3))  # (made one chunk along the scanned axis)
    got = cpu.along(xs, 1)
    assert isinstance(got, da.Array) and got.chunks == ((10,) * 4, (6,))
    np.testing.assert_array_equal(got.compute(scheduler="sync"), np.cumsum(x, axis=1))
    with pytest.raises(dsl.GradError, match=r"scan.grad:3:12: error: `cumsum\(x, axis=k\)` moves "
                                            "data between the rows"):
        cpu.along(xs, 0)
