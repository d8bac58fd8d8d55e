"""dsl.vmap against independent references where its rules meet their
edges: a mapped argument that a program uses as a size (each example its
own program), vmap of a vmap that runs one example at a time."""
from __future__ import annotations

import numpy as np
import pytest

import dsl
from gradlang.compiler.shapes import NeedsValue
from helpers import central_difference

SOURCE = """
def pooled(v, ids, n):
    return sum(segment_sum(v, ids, n) ** 2)

def segments(v, ids, n):
    return segment_sum(v, ids, n)
"""


@pytest.fixture(scope="module")
def m():
    return dsl.loads(SOURCE)


def test_a_mapped_size_runs_one_example_at_a_time(m):
    # n is num_segments: each example's program is compiled for its own n
    # (it used to raise "must be an integer on the host")
    v, ids = np.arange(12.0).reshape(3, 4), np.array([0, 1, 1, 0])
    ns = np.array([2, 3, 4])
    expected = [np.sum(np.bincount(ids, v[i], minlength=n) ** 2) for i, n in enumerate(ns)]
    np.testing.assert_allclose(dsl.vmap(m.pooled, in_axes=(0, None, 0))(v, ids, ns), expected,
                               rtol=1e-15)
    grads = dsl.vmap(dsl.grad(m.pooled), in_axes=(0, None, 0))(v, ids, ns)
    np.testing.assert_allclose(grads, [2 * np.bincount(ids, v[i])[ids] for i in range(3)],
                               rtol=1e-15)
    with pytest.raises(dsl.ArgumentError, match=r"vmap\(segments\) .*results of different "
                                                 r"shapes: \[2\] for example 0, \[3\] for "
                                                 "example 1"):
        dsl.vmap(m.segments, in_axes=(0, None, 0))(v, ids, ns)
    # what needs one program says why there is none (NotVectorizable escaped
    # from a pullback's or Dask's own retry by value)
    sized = r"argument 'n' of vmap\(pooled\) has a value for each example and gives a size"
    with pytest.raises(dsl.ArgumentError, match=sized):
        dsl.grad(dsl.vmap(m.pooled, in_axes=(0, None, 0)))(v, ids, ns)
    with pytest.raises(dsl.ArgumentError, match=sized):
        dsl.vmap(m.pooled, in_axes=(0, None, 0)).by_value(NeedsValue("n"), {})


def test_vmap_of_a_vmap_that_runs_one_example_at_a_time(m):
    # the inner vmap has no program (a mapped trip count): the outer one
    # runs it once per outer example (it raised "no program of its own")
    trips = dsl.loads("def trips(x, n: i64):\n    for i in range(n):\n        x = x * 2.0\n"
                      "    return sum(x)\n").trips
    x, ns = np.arange(24.0).reshape(2, 4, 3), np.array([0, 2, 1, 3])
    expected = [[2.0 ** ns[b] * x[a, b].sum() for b in range(4)] for a in range(2)]
    np.testing.assert_allclose(dsl.vmap(dsl.vmap(trips), in_axes=(0, None))(x, ns), expected,
                               rtol=1e-15)
    with pytest.raises(dsl.ArgumentError, match=r"vmap\(trips\) runs one example at a time "
                                                 r"here \(its op loop .*has no rule"):
        dsl.vmap(dsl.grad(dsl.vmap(trips)), in_axes=(0, None))(x, ns)


LOOPS = """
def chain(x, w, n: i64):
    a = 0.0
    b = 0.0
    c = 0.0
    kept = w
    for i in range(n):
        c = c + b * kept
        b = b + a
        a = where(i % 2 == 0, a + x, a * x)
        kept = kept * 0.5
    return c + kept

def products(a, b):
    return sum(sin(a @ b))
"""


@pytest.fixture(scope="module")
def loops():
    return dsl.loads(LOOPS)


def chain_reference(x: float, w: float, n: int) -> float:
    a = b = c = 0.0
    kept = w
    for i in range(n):
        c, b = c + b * kept, b + a
        a = a + x if i % 2 == 0 else a * x
        kept *= 0.5
    return c + kept


@pytest.mark.parametrize("n", [0, 1, 5])
def test_carried_values_that_become_mapped_trip_by_trip(loops, n):
    # a starts unmapped and is mapped after one trip, b after two, c after
    # three (the stacked loop's fixpoint); kept stays unmapped beside them
    x, w = np.array([0.5, -1.5, 2.0]), 0.75
    got = dsl.vmap(loops.chain, in_axes=(0, None, None))(x, w, n)
    np.testing.assert_allclose(got, [chain_reference(xi, w, n) for xi in x], rtol=1e-14)
    grads = dsl.vmap(dsl.grad(loops.chain, wrt=(0, 1)), in_axes=(0, None, None))(x, w, n)
    step = 1e-6
    for i, xi in enumerate(x):
        for j, (dx, dw) in enumerate([(step, 0.0), (0.0, step)]):
            fd = (chain_reference(xi + dx, w + dw, n) - chain_reference(xi - dx, w - dw, n))
            np.testing.assert_allclose(grads[j][i], fd / (2 * step), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("left,right", [((3,), (3, 2)), ((2, 3), (3,)), ((2, 3), (3, 4))])
def test_products_of_two_mapped_matrices_and_their_gradients(loops, left, right):
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(4,) + left), rng.normal(size=(4,) + right)
    np.testing.assert_allclose(dsl.vmap(loops.products)(a, b),
                               [np.sum(np.sin(a[i] @ b[i])) for i in range(4)], rtol=1e-14)
    ga, gb = dsl.vmap(dsl.grad(loops.products, wrt=(0, 1)))(a, b)
    for i in range(4):  # each example's own gradient (no stacking), checked once by differences
        ea, eb = dsl.grad(loops.products, wrt=(0, 1))(a[i], b[i])
        np.testing.assert_allclose(ga[i], ea, rtol=1e-14)
        np.testing.assert_allclose(gb[i], eb, rtol=1e-14)
    np.testing.assert_allclose(ga[2], central_difference(loops.products, (a[2], b[2]), 0),
                               rtol=1e-7)
    np.testing.assert_allclose(gb[2], central_difference(loops.products, (a[2], b[2]), 1),
                               rtol=1e-7)


@pytest.mark.parametrize("in_axes,shown", [(np.array([0, 0]), r"array\(\[0, 0\]\)"),
                                           (0.0, "0.0"), (np.bool_(False), r"(np\.)?False_?")])
def test_in_axes_entries_that_are_not_integers_are_refused(loops, in_axes, shown):
    # an array of axes reached `axis != 0` (NumPy's ambiguous truth value)
    with pytest.raises(dsl.ArgumentError, match=rf"in_axes entries are integers .* got {shown} for "
                                                 "argument 'a'"):
        dsl.vmap(loops.products, in_axes)


def test_a_batch_of_no_examples_makes_no_example_of_zeros():
    # the example bound (and lowered) for a batch of none was np.zeros of
    # one example's shape: 256 TiB here, an AllocationError where f of the
    # batch, and its vmap, are empty arrays
    f = dsl.vmap(dsl.loads("def f(x):\n    return x * 2.0 + 1.0\n").f)
    batch = np.empty((0, 2**45))
    got = f(batch)
    assert got.shape == (0, 2**45) and got.dtype == np.float64
    np.testing.assert_array_equal(f(np.arange(6.0).reshape(2, 3)), [[1, 3, 5], [7, 9, 11]])


def test_a_batch_of_no_examples_runs_no_example_one_at_a_time():
    # where f runs one example at a time (n gives a size), a batch of none
    # ran f once on the zero-stride example for its results' shapes: an
    # AllocationError of 1 TiB here, where the vmap is empty; now the shapes
    # come from f's IR, and nothing runs
    m = dsl.loads("def f(x, n):\n    return x * 2.0, arange(n) * 1.0\n")
    batch = np.broadcast_to(np.zeros(()), (0, 2**37))
    doubled, counted = dsl.vmap(m.f)(batch, np.zeros(0, np.int64))
    assert (doubled.shape, doubled.dtype) == ((0, 2**37), np.float64)
    assert (counted.shape, counted.dtype) == ((0, 0), np.float64)
    # a vmap of such a vmap has no program to read the shapes from: its
    # inner one's examples give them (that was a NotStacked error)
    twice = dsl.vmap(dsl.vmap(m.f, out_axes=(1, 0)), in_axes=1, out_axes=(2, 0))
    doubled, counted = twice(np.zeros((3, 0, 4)), np.zeros((3, 0), np.int64))
    assert (doubled.shape, counted.shape) == ((4, 3, 0), (0, 3, 0))


@pytest.mark.parametrize("jacobian", [dsl.jacrev, dsl.jacfwd])
def test_a_batch_of_no_examples_assembles_no_jacobian(jacobian):
    # the per-example Jacobians (n gives a size: they do not stack) of a
    # batch of none ran one example's Jacobian for their shapes: 8 TiB here
    m = dsl.loads("def f(x, n):\n    return sum(x) * x + sum(arange(n) * 1.0)\n")
    batch, ns = np.broadcast_to(np.zeros(()), (0, 2**20)), np.zeros(0, np.int64)
    got = dsl.vmap(jacobian(m.f))(batch, ns)
    assert (got.shape, got.dtype) == ((0, 2**20, 2**20), np.float64)
    got = dsl.vmap(dsl.vmap(jacobian(m.f)))(batch[None].repeat(2, 0), ns[None].repeat(2, 0))
    assert (got.shape, got.dtype) == ((2, 0, 2**20, 2**20), np.float64)
    # (and where there are examples: d(sum(x) x_i)/dx_j = x_i + sum(x) [i == j])
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(dsl.vmap(jacobian(m.f))(x, np.array([2, 3])),
                                  [x[i][:, None] + x[i].sum() * np.eye(3) for i in range(2)])


BLOCKS = """
from std import logsumexp

def soft(x, w):
    e = exp(x * w)
    return log(1.0 + e)
grad(dy):
    return x=dy * w * (1.0 - 1.0 / (1.0 + e)), w=dy * x * (1.0 - 1.0 / (1.0 + e))

def both(x, w):
    y = x * w
    return y * w, sum(w * w)
grad(dy, dz):
    return x=dy * w * w, w=dy * (y + x * w) + 2.0 * dz * w

def loss(x, w):
    y = x
    for i in range(2):
        y = soft(y, w) - 0.3
    a, b = both(y, w)
    return sum(a * a) + b + logsumexp(x * w)
"""


def test_a_grad_block_stacks_its_passes(monkeypatch):
    # vmap of a function calling ones with grad blocks (in a loop, and std's
    # logsumexp) is one program; its gradient runs the blocks stacked, the
    # unmapped w's cotangent the sum of the examples' (they ran one example
    # at a time, and grad of the vmap was refused); both's second result,
    # of w alone, is each example's, with its own cotangent (computed once,
    # its summed cotangent was counted once per example)
    loss = dsl.loads(BLOCKS).loss
    rng = np.random.default_rng(6)
    x, w = rng.normal(size=(3, 4)), rng.normal(size=4) * 0.5
    vf = dsl.vmap(loss, in_axes=(0, None))
    calls = []
    inner_call = type(loss).call_bound
    monkeypatch.setattr(type(loss), "call_bound",
                        lambda self, *a, **k: (calls.append(1), inner_call(self, *a, **k))[1])
    got = vf(x, w)
    monkeypatch.undo()
    assert calls == []
    np.testing.assert_allclose(got, [loss(x[i], w) for i in range(3)], rtol=1e-14)
    gx, gw = dsl.grad(vf, wrt=(0, 1))(x, w)
    each = [dsl.grad(loss, wrt=(0, 1))(x[i], w) for i in range(3)]
    np.testing.assert_allclose(gx, [e[0] for e in each], rtol=1e-13)
    np.testing.assert_allclose(gw, sum(e[1] for e in each), rtol=1e-13)
    np.testing.assert_allclose(gw, central_difference(lambda a, b: vf(a, b).sum(), (x, w), 1),
                               rtol=1e-7)
