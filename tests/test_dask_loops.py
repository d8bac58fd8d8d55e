"""Loops on Dask arrays: values a loop maps only linearly, adding sums
over the rows (a parameter's gradient through a loop: an RNN's weights, a
loss summed over steps, a moving average; in nested and checkpointed
loops too) are each block's sums, added over the blocks with what their
starts make counted once; a carried value the same in every block is
computed once; a carried sum used otherwise is still a `GradError`.
Values against the in-memory call, central differences and values by
hand."""
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from helpers import central_difference, optional_module

dask = optional_module("dask", "dask")
da = optional_module("dask.array", "dask")

N, T, D, K = 7, 3, 2, 3
RNG = np.random.default_rng(5)
XS = RNG.normal(size=(N, T, D))  # the batch is axis 0: rows, then steps
H0 = RNG.normal(size=(N, K))
W = RNG.normal(size=(K, K)) / 2
U = RNG.normal(size=(D, K))

SOURCE = """
def rnn_loss(xs, h0, W, U):
    h = h0
    for i in range(3):
        h = tanh(h @ W + xs[:, i] @ U)
    return sum(h * h)

def seq_loss(xs, h0, W, U):
    h = h0
    loss = 0.0
    for i in range(3):
        h = tanh(h @ W + xs[:, i] @ U)
        loss = loss + mean(h * h)
    return loss

@recompute(every=2)
def checkpointed(xs, h0, W, U, b):
    h = h0
    loss = 0.0
    for i in range(3):
        h = tanh(h @ W + xs[:, i] @ U + b)
        loss = loss + mean(h * h)
    return loss

def running(xs, w):
    s = w * w
    for i in range(3):
        s = s + (sum(xs[:, i] * w, axis=0) - sum(xs[:, i], axis=0)) * 0.5
    return s

def steps(xs, w, k: i64):
    s = w
    for i in range(k):
        t = s
        for j in range(2):
            t = t + sum(xs[:, i] * xs[:, j] * w, axis=0)
        s = t
    return s

def skipping(xs, w):
    s = w * w
    for i in range(3):
        if i != 1:
            s = s + sum(xs[:, i] * w, axis=0)
    return s

def reset(xs, w):
    s = w
    for i in range(3):
        if i == 1:
            s = sum(xs[:, i], axis=0)
        else:
            s = s + sum(xs[:, i], axis=0)
    return s

def ema(xs, w):
    m = w
    for i in range(3):
        m = 0.9 * m + 0.1 * mean(xs[:, i] * w, axis=0)
    return m

def coupled(xs, w):
    a = w
    b = sum(xs[:, 0], axis=0)
    for i in range(2):
        a = a + b * 0.5
        b = b + sum(xs[:, i + 1], axis=0)
    return a

def replaced(xs, w, k: i64):
    s = w
    for i in range(k):
        s = sum(xs[:, i], axis=0)
    return s

def offset(xs, w):
    s = w
    for i in range(3):
        s = s + sum(xs[:, i], axis=0) + 1.0
    return s

def scaled(xs, w):
    s = w
    for i in range(3):
        s = s * sum(xs[:, i], axis=0)
    return s

def fed_back(xs, w):
    s = w
    for i in range(3):
        s = s + sum(tanh(xs[:, i] * s), axis=0)
    return s

def decayed(xs, w):
    h = xs[:, 0] * 0.0
    c = w
    for i in range(3):
        h = h * c + xs[:, i]
        c = c * 0.5
    return h * c, c, sum(h, axis=0) * c
"""
M = dsl.loads(SOURCE, "loops.grad")


def line_of(text: str, function: str) -> int:
    """The line of `text` in the function named so, in SOURCE."""
    lines = SOURCE.splitlines()
    start = lines.index(next(line for line in lines if line.startswith(f"def {function}(")))
    return next(i for i in range(start, len(lines)) if text in lines[i]) + 1


@pytest.fixture(autouse=True)
def threads():
    with dask.config.set(scheduler="threads", num_workers=2):
        yield


def rows(x, blocks):
    """x as a Dask array of these row blocks (one chunk along other axes)."""
    return da.from_array(x, chunks=(tuple(blocks),) + x.shape[1:])


GRAD = dsl.grad(M.rnn_loss, wrt=(0, 1, 2, 3))
SEQ = dsl.value_and_grad(M.seq_loss, wrt=(1, 2, 3))


@settings(max_examples=6, deadline=None)
@given(st.lists(st.integers(1, N), min_size=1, max_size=N))
def test_rnn_gradients_on_row_blocks_equal_the_in_memory_ones(sizes):
    blocks = sizes + [N - sum(sizes)] if sum(sizes) < N else [N]
    xs, h0 = rows(XS, blocks), rows(H0, blocks)
    # W's and U's gradients are sums over the rows inside the backward loop:
    # each block's, summed (they were refused as giving a result per block);
    # xs's is each trip's stacked cotangent of xs[:, i], its rows the block's
    got = dask.compute(*GRAD(xs, h0, W, U))
    for g, expected in zip(got, GRAD(XS, H0, W, U)):
        np.testing.assert_allclose(g, expected, rtol=1e-12, atol=1e-14)
    assert [g.shape for g in got] == [(N, T, D), (N, K), (K, K), (D, K)]
    # a loss summed over the steps: a sum from zero (and the stack of its
    # trips, for the backward pass) of means over all the rows (the count
    # in the loop's body was a block's); its cotangent is the same in
    # every block
    value, grads = SEQ(xs, h0, W, U)
    expected_value, expected_grads = SEQ(XS, H0, W, U)
    assert value.compute() == pytest.approx(expected_value, rel=1e-12)
    for g, expected in zip(dask.compute(*grads), expected_grads):
        np.testing.assert_allclose(g, expected, rtol=1e-12, atol=1e-14)


def test_rnn_gradients_on_row_blocks_equal_central_differences():
    args = (XS, H0, W, U)
    for fn, grad, wrt in ((M.rnn_loss, GRAD, (0, 1, 2, 3)),
                          (M.seq_loss, dsl.grad(M.seq_loss, wrt=(1, 2, 3)), (1, 2, 3))):
        got = dask.compute(*grad(rows(XS, (3, 2, 2)), rows(H0, (3, 2, 2)), W, U))
        for index, g in zip(wrt, got):
            np.testing.assert_allclose(g, central_difference(fn, args, index),
                                       rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("blocks", [(7,), (2, 3, 2), (1, 1, 1, 1, 1, 1, 1)])
def test_a_sum_started_from_a_weight_counts_it_once_over_the_blocks(blocks):
    # s starts at w * w, the same in every block: each block sums its rows
    # from zero and w * w is added once (once a block gave 3 w * w in 3);
    # what a trip adds is a linear map of sums over the rows
    w = np.array([0.5, -2.0])
    xs = rows(XS, blocks)
    expected = w * w + (np.sum(XS * w, axis=(0, 1)) - np.sum(XS, axis=(0, 1))) * 0.5
    np.testing.assert_allclose(M.running(xs, w).compute(), expected, rtol=1e-12)
    # its stack of trips too (the backward pass's), from zero, w * w added
    value, g = dask.compute(*dsl.value_and_grad(M.running, wrt=1)(xs, w))
    np.testing.assert_allclose(value, expected, rtol=1e-12)
    np.testing.assert_allclose(g, 2 * w + np.sum(XS, axis=(0, 1)) / 2, rtol=1e-12)


def test_a_sum_added_to_on_some_trips_counts_its_start_once():
    # an `if` on the trip: a choice between the sum and the sum added to
    w = np.array([0.5, -2.0])
    picked = np.sum(XS[:, [0, 2]], axis=(0, 1))
    value, g = dask.compute(*dsl.value_and_grad(M.skipping, wrt=1)(rows(XS, (2, 2, 3)), w))
    np.testing.assert_allclose(value, w * w + picked * w, rtol=1e-12)
    np.testing.assert_allclose(g, 2 * w + picked, rtol=1e-12)


def test_a_sum_scaled_or_replaced_on_a_trip_counts_its_start_once():
    # linear in its start and the sums: each block's loop from zero gives
    # its rows' part, and what the start makes alone (by a loop of its own,
    # the sums zero) is added once: 0.9 ** 3 w for a moving average of
    # means over all the rows, nothing for a sum replaced on a trip
    w = np.array([0.5, -2.0])
    xs = rows(XS, (3, 1, 3))
    means = np.mean(XS, axis=0)
    decay = 0.1 * 0.9 ** np.arange(2, -1, -1)[:, None]
    value, g = dask.compute(*dsl.value_and_grad(M.ema, wrt=1)(xs, w))
    np.testing.assert_allclose(value, 0.729 * w + np.sum(decay * means, axis=0) * w,
                               rtol=1e-12)
    np.testing.assert_allclose(g, 0.729 + np.sum(decay * means, axis=0), rtol=1e-12)
    np.testing.assert_allclose(M.reset(xs, w).compute(), np.sum(XS[:, 1:], axis=(0, 1)),
                               rtol=1e-12)
    # one sum added into another: b starts from a sum (each block's), a
    # from w (once): what w makes alone leaves b's start out
    sums = np.sum(XS, axis=0)
    np.testing.assert_allclose(M.coupled(xs, w).compute(), w + sums[0] + sums[1] / 2,
                               rtol=1e-12)


@pytest.mark.parametrize("k", [0, 2])
def test_a_value_replaced_by_a_sum_each_trip_is_its_start_after_no_trip(k):
    # its last trip's sum, or w: each block gave w after no trip (3 w in 3)
    w = np.array([0.5, -2.0])
    expected = np.sum(XS[:, k - 1], axis=0) if k else w
    np.testing.assert_allclose(M.replaced(rows(XS, (2, 2, 3)), w, k).compute(), expected,
                               rtol=1e-12)


@pytest.mark.parametrize("k", [0, 2])
def test_a_sum_through_nested_loops_of_run_time_trips_counts_its_start_once(k):
    # the inner loop starts from the outer one's sum; no trip leaves w,
    # once (the blocks' loops sum from zero)
    w = np.array([0.5, -2.0])
    expected = w * (1 + np.sum(XS[:, :k, None] * XS[:, None, :2], axis=(0, 1, 2)))
    value, g = dask.compute(*dsl.value_and_grad(M.steps, wrt=1)(rows(XS, (4, 3)), w, k))
    np.testing.assert_allclose(value, expected, rtol=1e-12)
    np.testing.assert_allclose(g, expected / w, rtol=1e-12)


@pytest.mark.parametrize("fn,text,column,op,why", [
    # multiplied by a sum over the rows each trip: the blocks' products do
    # not add up to the rows' product
    ("scaled", "for i", 5, "for i in range(3)", "gives a result for each block, not row by row"),
    # read by the rows' computation: each block would see its own sum
    ("fed_back", "tanh", 26, "xs[:, i] * s", "uses a value reduced over the batch row by row"),
    # a constant added each trip: each block would add it
    ("offset", "for i", 5, "for i in range(3)", "gives a result for each block, not row by row"),
])
def test_a_carried_sum_used_non_linearly_is_still_a_grad_error(
        fn, text, column, op, why):
    w = np.array([0.5, -2.0])
    line = line_of(text, fn)
    with pytest.raises(dsl.GradError,
                       match=f"loops.grad:{line}:{column}: error: `{re.escape(op)}` {why}"):
        getattr(M, fn)(rows(XS, (4, 3)), w)


def test_a_value_of_every_block_carried_beside_the_rows_is_computed_once():
    # c is the same in every block (a loop of its own computes it); it was
    # refused as a value each block's loop computes, wherever it was used
    w = np.array([0.5, -2.0])
    h = np.zeros((N, D))
    for i in range(3):
        h = h * (w * 0.5 ** i) + XS[:, i]
    c = w / 8
    got = dask.compute(*M.decayed(rows(XS, (3, 4)), w))
    for g, expected in zip(got, (h * c, c, np.sum(h, axis=0) * c)):
        np.testing.assert_allclose(g, expected, rtol=1e-12)
    # w's gradient is carried back scaled by 0.5 each trip, a sum over the
    # rows added, from a sum over all the rows (known once the blocks are
    # combined): no block can start from it (the block's loop read an
    # undefined value: an internal IRVerificationError)
    line = line_of("for i", "decayed")
    with pytest.raises(dsl.GradError, match=f"loops.grad:{line}:5: error: `for i in "
                                            r"range\(3\)` reads a value "
                                            "computed from sums or maxima over all the rows"):
        dsl.grad(M.decayed, wrt=1)(rows(XS, (1, 6)), w)


def test_rnn_hessian_vector_product_on_row_blocks():
    # forward over reverse: the tangent of W's gradient is carried through
    # the backward loop, a sum over the rows too
    v = np.random.default_rng(6).normal(size=W.shape)
    hvp = dsl.hvp(M.rnn_loss, wrt=2)
    got = hvp(rows(XS, (2, 5)), rows(H0, (2, 5)), W, U, v).compute()
    np.testing.assert_allclose(got, hvp(XS, H0, W, U, v), rtol=1e-12, atol=1e-14)
    eps = 1e-6
    by_difference = (GRAD(XS, H0, W + eps * v, U)[2] - GRAD(XS, H0, W - eps * v, U)[2]) / (
        2 * eps)
    np.testing.assert_allclose(got, by_difference, rtol=1e-6, atol=1e-8)


def test_a_checkpointed_rnn_with_a_bias_on_row_blocks():
    # segments of a loop (nested loops): the weights' gradients are summed
    # in the inner backward loop, started from the outer one's sums
    b = np.array([0.1, -0.2, 0.3])
    grad = dsl.value_and_grad(M.checkpointed, wrt=(2, 3, 4))
    value, grads = grad(rows(XS, (3, 4)), rows(H0, (3, 4)), W, U, b)
    expected_value, expected_grads = grad(XS, H0, W, U, b)
    assert value.compute() == pytest.approx(expected_value, rel=1e-12)
    for g, expected in zip(dask.compute(*grads), expected_grads):
        np.testing.assert_allclose(g, expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(expected_grads[2], central_difference(
        M.checkpointed, (XS, H0, W, U, b), 4), rtol=1e-6, atol=1e-8)
