"""Compiled functions on Dask arrays: lazy results equal to the in-memory
call, for row-wise values, sums and maxima over the batch (a mean over
unequal blocks too), parameter gradients summed over blocks, matmuls
contracting the batch; functions that mix rows are a `GradError` at the
op that does."""
import os
import re
import pickle

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from helpers import load_example, optional_module

dask = optional_module("dask", "dask")
da = optional_module("dask.array", "dask")

RNG = np.random.default_rng(1)
X = RNG.normal(size=(800, 3))
Y = np.sign(RNG.normal(size=800))
W = RNG.normal(size=3)


@pytest.fixture(autouse=True)
def threads():
    with dask.config.set(scheduler="threads", num_workers=2):
        yield


def test_logistic_value_and_grad_over_8_blocks_equals_the_in_memory_call():
    loss = load_example("logistic").loss
    xs, ys = da.from_array(X, chunks=(100, 3)), da.from_array(Y, chunks=100)
    value, gw = dsl.value_and_grad(loss, wrt=2)(xs, ys, W)
    assert isinstance(value, da.Array) and isinstance(gw, da.Array)  # lazy
    value, gw = dask.compute(value, gw)
    expected_value, expected_gw = dsl.value_and_grad(loss, wrt=2)(X, Y, W)
    np.testing.assert_allclose(value, expected_value, rtol=1e-12)
    np.testing.assert_allclose(gw, expected_gw, rtol=1e-12, atol=1e-15)
    z = -Y * (X @ W)  # and the known value: mean(softplus(z))
    np.testing.assert_allclose(value, np.mean(np.logaddexp(0, z)), rtol=1e-12)


@settings(max_examples=8, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=6))
def test_a_mean_over_unequal_blocks_divides_by_all_rows(sizes):
    rows = sizes + [800 - sum(sizes)] if sum(sizes) < 800 else [800]
    loss = load_example("logistic").loss
    xs, ys = da.from_array(X, chunks=(tuple(rows), 3)), da.from_array(Y, chunks=(tuple(rows),))
    gx, gw = dask.compute(*dsl.grad(loss, wrt=(0, 2))(xs, ys, W))
    expected_gx, expected_gw = dsl.grad(loss, wrt=(0, 2))(X, Y, W)
    np.testing.assert_allclose(gx, expected_gx, rtol=1e-12, atol=1e-18)  # row-wise
    np.testing.assert_allclose(gw, expected_gw, rtol=1e-12, atol=1e-15)  # summed


def test_gradient_of_a_batch_argument_stays_in_its_row_blocks():
    loss = load_example("logistic").loss
    xs = da.from_array(X, chunks=(300, 3))
    gx = dsl.grad(loss, wrt=0)(xs, da.from_array(Y, chunks=300), W)
    assert gx.chunks == ((300, 300, 200), (3,))


def test_vjp_on_dask_arrays_gives_a_pullback_of_dask_arrays():
    loss = load_example("logistic").loss
    xs, ys = da.from_array(X, chunks=(200, 3)), da.from_array(Y, chunks=200)
    value, pullback = dsl.vjp(loss, xs, ys, W)
    gx, gy, gw = pullback(2.0)
    assert isinstance(gx, da.Array) and gx.chunks[0] == (200,) * 4
    _, expected_pullback = dsl.vjp(loss, X, Y, W)
    for got, expected in zip(dask.compute(value, gx, gy, gw),
                             (loss(X, Y, W), *expected_pullback(2.0))):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-18)
    m = dsl.loads("def f(x):\n    return x * x\n")  # a row-wise output's cotangent
    x = da.from_array(X, chunks=(200, 3))
    y, pullback = dsl.vjp(m.f, x)
    (g,) = pullback(da.ones_like(x))
    np.testing.assert_allclose(g.compute(), 2 * X, rtol=1e-15)


PULLED = """
def rows_and_columns(x, w):
    return tanh(x @ w), sum(x, axis=0) * w[:, 0]
"""


@pytest.mark.parametrize("blocks", [(4,), (1, 3), (0, 4, 0)])
def test_a_pullback_on_dask_takes_cotangents_as_the_in_memory_one(blocks):
    # a NumPy array or a number for a row-wise result is split as its rows
    # (it went whole to every block: an error without a location, or with
    # one block NumPy's ValueError); a Dask array of 4 rows for the column
    # sums, whose result is not row by row, goes whole to every block (it
    # was taken as rows: an error naming the cotangent 'd1'); a cotangent
    # of another shape says which (NumPy's broadcasting error, or 'd0')
    f = dsl.loads(PULLED).rows_and_columns
    x, w = RNG.normal(size=(4, 4)), RNG.normal(size=(4, 2))
    c_rows, c_columns = RNG.normal(size=(4, 2)), RNG.normal(size=4)
    _, in_memory = dsl.vjp(f, x, w)
    _, pullback = dsl.vjp(f, da.from_array(x, chunks=(blocks, 4)), w)
    for cts in [(c_rows, c_columns), (1.0, da.from_array(c_columns, chunks=2))]:
        got = dask.compute(*pullback(*cts))
        # (and as one tuple, the structure of the outputs, as JAX takes it)
        assert all(np.array_equal(a, b) for a, b in zip(dask.compute(*pullback(cts)), got))
        c = np.broadcast_to(cts[0], (4, 2)) * (1 - np.tanh(x @ w) ** 2)
        gw = x.T @ c  # by hand
        gw[:, 0] += x.sum(axis=0) * c_columns
        for g, e in zip(got, (c @ w.T + c_columns * w[:, 0], gw)):
            np.testing.assert_allclose(g, e, rtol=1e-12)
        for g, e in zip(got, in_memory(*(np.asarray(ct) for ct in cts))):
            np.testing.assert_allclose(g, e, rtol=1e-13)
    for ct, shape in [(np.ones(2), r"\[2\]"), (da.ones((4, 3)), r"\[4, 3\]")]:
        with pytest.raises(dsl.ArgumentError, match=rf"cotangent 0 of the pullback of "
                                                     rf"rows_and_columns\(\) has shape {shape}; "
                                                     r"the output has shape \[4, 2\]") as info:
            pullback(ct, 1.0)
        assert str(info.value).startswith(f"{f.span}: error:")  # (it had no place)


def test_an_elementwise_function_on_a_2d_array_chunked_along_both_axes():
    m = dsl.loads("def f(x):\n    return x * sin(x)\n")
    x = RNG.normal(size=(40, 6))
    xs = da.from_array(x, chunks=(10, 3))
    g = dsl.grad(m.f)(xs)
    assert g.chunks == ((10, 10, 10, 10), (3, 3))  # kept: each block runs on its own
    np.testing.assert_allclose(g.compute(), np.sin(x) + x * np.cos(x), rtol=1e-12)
    two = dsl.loads("def f(x, y, a):\n    return x * y * a\n")  # chunks made the first's
    y = RNG.normal(size=(40, 6))
    value, (gx, gy) = dsl.value_and_grad(two.f, wrt=(0, 1))(xs, da.from_array(y, chunks=(20, 2)),
                                                            2.0)
    assert value.chunks == gx.chunks == gy.chunks == xs.chunks
    np.testing.assert_allclose(value.compute(), 2 * x * y, rtol=1e-15)
    np.testing.assert_allclose(gx.compute(), 2 * y, rtol=1e-15)
    np.testing.assert_allclose(gy.compute(), 2 * x, rtol=1e-15)


@pytest.mark.parametrize("header", ["def f(x: f64[n, 3]):", "def f(x) -> f64[n, 3]:"])
def test_an_elementwise_function_with_a_fixed_size_runs_on_blocks_of_rows(header):
    # a fixed size off the rows (a parameter's or the result's annotation)
    # cannot be a block's: the blocks hold whole rows (it raised the
    # compiler's NeedsConcrete at the user)
    m = dsl.loads(f"{header}\n    return x * sin(x)\n")
    x = RNG.normal(size=(40, 3))
    value = m.f(da.from_array(x, chunks=(10, 2)))
    assert value.chunks == ((10, 10, 10, 10), (3,))
    np.testing.assert_allclose(value.compute(), x * np.sin(x), rtol=1e-15)


def test_the_gradient_of_a_mean_divides_by_the_whole_array_not_a_block():
    """Its gradient w.r.t. the batch alone is elementwise (a constant over
    the count): each block runs on its own, still dividing by every
    element of the array, along both axes of a 2-d chunking too."""
    m = dsl.loads("def f(x):\n    return mean(x)\n\n"
                  "def g(x: f64[n, k]):\n    return sum(mean(x * x, axis=0))\n")
    x = RNG.normal(size=(10, 3))
    for chunks in (((2, 5, 3), (3,)), ((2, 5, 3), (1, 2))):
        xs = da.from_array(x, chunks=chunks)
        np.testing.assert_allclose(dsl.grad(m.f)(xs).compute(), np.full(x.shape, 1 / 30),
                                   rtol=1e-15)
        np.testing.assert_allclose(dsl.grad(m.g)(xs).compute(), 2 * x / 10, rtol=1e-15)
        # (blocks' partial sums, then NumPy's pairwise sum: a mean near 0 of
        # values near 1 differs in its last bits relative to itself, 2e-14
        # for one x the shared RNG gives under some xdist orders)
        np.testing.assert_allclose(m.f(xs).compute(), x.mean(), rtol=1e-15, atol=1e-15)


def test_the_number_of_rows_in_a_loop_body_or_a_grad_block_is_the_whole_arrays():
    # x.shape[0] in a loop's body, and in a function with a grad block (its
    # forward inlined), was a block's row count: wrong values, silently
    m = dsl.loads("def looped(x):\n    h = x\n    for i in range(2):\n"
                  "        h = h / x.shape[0]\n    return h\n\n"
                  "def scaled(x):\n    return x / x.shape[0]\ngrad(g):\n"
                  "    return g / x.shape[0]\n\n"
                  "def squared(x):\n    h = scaled(x)\n    return h * h\n", "rows.grad")
    x = RNG.normal(size=(10, 3))
    xs = da.from_array(x, chunks=((2, 5, 3), (3,)))
    np.testing.assert_allclose(m.looped(xs).compute(), x / 100, rtol=1e-15)
    np.testing.assert_allclose(m.squared(xs).compute(), (x / 10) ** 2, rtol=1e-15)
    np.testing.assert_allclose(dsl.grad(m.squared)(xs).compute(), 2 * x / 100, rtol=1e-15)


def test_max_and_a_matmul_contracting_the_batch_combine_over_blocks():
    m = dsl.loads("def f(x):\n    return max(x, axis=0) + mean(x)\n\n"
                  "def gram(x, w):\n    return sum((x.T @ x) * w)\n")
    xs = da.from_array(X, chunks=(250, 3))
    np.testing.assert_allclose(m.f(xs).compute(), X.max(axis=0) + X.mean(), rtol=1e-12)
    w = RNG.normal(size=(3, 3))
    value, (gx, gw) = dask.compute(*dsl.value_and_grad(m.gram, wrt=(0, 1))(xs, w))
    np.testing.assert_allclose(value, np.sum((X.T @ X) * w), rtol=1e-12)
    np.testing.assert_allclose(gw, X.T @ X, rtol=1e-12)
    np.testing.assert_allclose(gx, X @ (w + w.T), rtol=1e-12)


@pytest.mark.parametrize("body,column", [
    # (each named the IR's op: `sub`, `div`, `matmul`, `transpose`)
    ("x - mean(x, axis=0)", 12),
    ("x / sum(x * x)", 12),
    ("x @ x.T", 12),
    # a result with the rows along axis 1 (each block's columns): it leaked
    # the compiler's NeedsConcrete ("the size batch is used as a number")
    ("tanh(x).T", 12),
])
def test_a_function_that_mixes_rows_is_a_grad_error_at_the_op(body, column):
    m = dsl.loads(f"def f(x):\n    return {body}\n", "mix.grad")
    with pytest.raises(dsl.GradError, match=f"mix.grad:2:{column}: error: `{re.escape(body)}` "
                                            ".* does not "
                                            "decompose over the rows .* in-memory arrays"):
        m.f(da.from_array(X, chunks=(400, 3)))


@pytest.mark.parametrize("transform", [dsl.grad, dsl.value_and_grad])
def test_a_derivative_that_does_not_decompose_says_the_function_does(transform):
    # a masked mean decomposes (two sums over the rows), its gradient not
    # (the count, reduced over every row, is read back in each row): the
    # message quoting the mean's op said "this function does not decompose"
    m = dsl.loads("def f(x, m):\n    return sum(where(m, x, 0.0)) / sum(float64(m))\n",
                  "masked.grad")
    xs, ms = da.from_array(X, chunks=(300, 3)), da.from_array(X > 0, chunks=(300, 3))
    np.testing.assert_allclose(m.f(xs, ms).compute(), X[X > 0].mean(), rtol=1e-12)
    with pytest.raises(dsl.GradError) as caught:
        transform(m.f)(xs, ms)
    assert str(caught.value).endswith(
        "note: f() itself decomposes over the rows; its derivative does not (it reads this "
        "value, reduced over every block's rows, back in each row, which one pass over the "
        "blocks cannot give it)")


@pytest.mark.parametrize("body", [
    "x[p]",  # (named `take`, the IR's op)
    "take(x.T, p, axis=1)",
    "take_along_axis(x, q, axis=0)",
    "scatter_add(zeros_like(x), p, x)",
    "scatter_add(x, p, x * 2.0)",
])
def test_indexing_the_batch_axis_by_row_indices_is_a_grad_error_at_the_op(body):
    # a block holds only its own rows, so row indices into the batch axis
    # (gathering row p[i], adding row i into row p[i]) read or write another
    # block's rows: indices within a block's size gave another row, silently
    m = dsl.loads(f"def f(x, p: i64[n], q: i64[n, 2]):\n    return {body}\n", "rows.grad")
    x, p = RNG.normal(size=(6, 2)), np.array([2, 1, 0, 2, 1, 0])
    args = (da.from_array(x, chunks=(3, 2)), da.from_array(p, chunks=3),
            da.from_array(np.stack([p, p], axis=1) % 2, chunks=(3, 2)))
    with pytest.raises(dsl.GradError, match=f"rows.grad:2:12: error: `{re.escape(body)}` "
                                            "moves data "
                                            "between the rows of the batch"):
        m.f(*args)


@pytest.mark.parametrize("body,column,op", [("h + x[i]", 17, "x[i]"),
                                           ("take(h, p, axis=0) + x", 13, "take(h, p, axis=0)")])
def test_a_loop_body_that_moves_data_between_rows_is_a_grad_error_at_the_op(body, column, op):
    # the split looked at the loop as one op, not inside it: x[i] read row
    # i of each block, silently
    m = dsl.loads("def f(x, p: i64[n]):\n    h = x\n    for i in range(2):\n"
                  f"        h = {body}\n    return h\n", "loop.grad")
    x, p = RNG.normal(size=(6, 2)), np.array([2, 1, 0, 2, 1, 0])
    with pytest.raises(dsl.GradError, match=f"loop.grad:4:{column}: error: "
                                            f"`{re.escape(op)}` .* does not "
                                            "decompose over the rows"):
        m.f(da.from_array(x, chunks=(3, 2)), da.from_array(p, chunks=3))
    # a row-wise body still runs block by block
    m = dsl.loads("def f(x, w):\n    h = x\n    for i in range(3):\n"
                  "        h = tanh(h @ w) + x\n    return h, sum(h * h)\n")
    w, xs = RNG.normal(size=(2, 2)) / 2, da.from_array(x, chunks=(3, 2))
    for got, expected in zip(dask.compute(*m.f(xs, w)), m.f(x, w)):
        np.testing.assert_allclose(got, expected, rtol=1e-12)
    np.testing.assert_allclose(dsl.grad(m.f)(xs, w).compute(), dsl.grad(m.f)(x, w), rtol=1e-12)
    # w's gradient sums over the rows inside the backward loop, each block
    # its own: summed over the blocks (it was refused; before that, taken as
    # row-wise, a wrong answer of the wrong shape)
    np.testing.assert_allclose(dsl.grad(m.f, wrt=1)(xs, w).compute(),
                               dsl.grad(m.f, wrt=1)(x, w), rtol=1e-12)
    # so in segments of a checkpointed loop (nested loops: NumPy's
    # broadcasting ValueError escaped, naming shapes of no one's)
    m = dsl.loads("@recompute(every=2)\ndef f(x, w):\n    h = x\n    for i in range(5):\n"
                  "        h = tanh(h * w) + x\n    return sum(h * h)\n")
    for wrt in (0, 1):
        np.testing.assert_allclose(dsl.grad(m.f, wrt=wrt)(xs, w[0]).compute(),
                                   dsl.grad(m.f, wrt=wrt)(x, w[0]), rtol=1e-12)


@pytest.mark.parametrize("start,body", [("x * 0.0 + 1.0", "s = s * 0.5"),
                                        ("0.0", "s = s + sum(x + s)")])
def test_a_loop_on_rows_of_trips_counted_over_the_rows_is_a_grad_error(start, body):
    # each block ran as many trips as its own rows counted: wrong values
    m = dsl.loads(f"def f(x, ids: i64[n]):\n    k = sum(ids)\n    s = {start}\n"
                  f"    for i in range(k):\n        {body}\n    return s\n", "trips.grad")
    x, ids = RNG.normal(size=6), np.array([1, 0, 1, 1, 0, 1])
    with pytest.raises(dsl.GradError, match=r"trips.grad:4:5: error: `for i in range\(k\)` "
                                            "runs a number of "
                                            "trips computed from the rows of the batch"):
        m.f(da.from_array(x, chunks=3), da.from_array(ids, chunks=3))


@pytest.mark.parametrize("chunks", [(3, 4, 3), (10,), (1, 9)])
def test_segment_sums_and_embedding_gradients_sum_their_blocks(chunks):
    # a scatter-add of rows into zeros (segment_sum, a gather's gradient) is
    # a sum over rows: each block's, summed
    rng = np.random.default_rng(3)
    x, seg = rng.normal(size=(10, 3)), rng.integers(0, 4, 10)
    pool = load_example("segment_pool").pool
    got = pool(da.from_array(x, chunks=(chunks, 3)), da.from_array(seg, chunks=chunks), 4)
    expected = np.zeros((4, 3))
    np.add.at(expected, seg, x)
    np.testing.assert_allclose(got.compute(), expected, rtol=1e-12, atol=1e-15)
    embed = load_example("embedding").embed
    table, ids = rng.normal(size=(6, 3)), rng.integers(-6, 6, 10)
    value, gt = dsl.value_and_grad(embed, wrt=0)(table, da.from_array(ids, chunks=chunks))
    value, gt = dask.compute(value, gt)
    counts = np.bincount(ids % 6, minlength=6)
    assert value == pytest.approx(np.sum(table[ids] ** 2), rel=1e-12)
    np.testing.assert_allclose(gt, 2 * table * counts[:, None], rtol=1e-12)
    # rows added into a base that is not zero: each block would add the base
    m = dsl.loads("def f(table, ids: i64[n]):\n"
                  "    return scatter_add(table, ids, table[ids] * 2.0)\n", "base.grad")
    with pytest.raises(dsl.GradError, match=r"base.grad:2:12: error: `scatter_add\(table, ids, "
                                            r"table\[ids\] \* 2.0\)` .* does "
                                            "not decompose over the rows"):
        m.f(table, da.from_array(ids, chunks=chunks))


def test_a_dask_array_of_another_length_goes_to_every_block():
    loss = load_example("logistic").loss
    ws = da.from_array(W, chunks=3)  # a parameter vector, itself a Dask array
    value, gw = dask.compute(*dsl.value_and_grad(loss, wrt=2)(
        da.from_array(X, chunks=(200, 3)), da.from_array(Y, chunks=200), ws))
    expected_value, expected_gw = dsl.value_and_grad(loss, wrt=2)(X, Y, W)
    np.testing.assert_allclose(value, expected_value, rtol=1e-12)
    np.testing.assert_allclose(gw, expected_gw, rtol=1e-12, atol=1e-15)


def test_batch_arguments_must_have_the_same_rows():
    m = dsl.loads("def f(x, y):\n    return sum(x) + sum(y)\n")
    with pytest.raises(dsl.ArgumentError, match="same number of rows; got shapes "
                                                "\\[800, 3\\], \\[10\\] \\(to pass 'y' whole "
                                                "to every block, give it one chunk along "
                                                "axis 0: y.rechunk\\({0: -1}\\)\\)"):
        m.f(da.from_array(X, chunks=(400, 3)), da.from_array(Y[:10], chunks=5))
    # as it says: then it goes to every block
    y = da.from_array(Y[:10], chunks=5).rechunk({0: -1})
    assert np.isclose(m.f(da.from_array(X, chunks=(400, 3)), y).compute(), X.sum() + Y[:10].sum())
    # a NumPy array of the batch's length is not a batch: it goes to every block
    with pytest.raises(dsl.GradError, match="rows.grad:2:12: error: shapes \\[batch\\] and "
                                            "\\[800\\] do not broadcast \\(on Dask arrays, "
                                            "`batch` is the rows of 'x'"):
        m_rows = dsl.loads("def f(x, y):\n    return x - y\n", "rows.grad")
        m_rows.f(da.from_array(Y, chunks=400), Y)


def test_an_error_of_the_function_itself_is_the_in_memory_one():
    # x @ x of (800, 3) fails in memory; on Dask arrays it said "f() on Dask
    # arrays: the size 3 meets the size batch ... call it on in-memory
    # arrays", and a type error got the note on the batch
    m = dsl.loads("def f(x):\n    return sum(x @ x)\ndef g(x):\n    return sum(x[:, 5])\n",
                  "own.grad")
    for f in (m.f, m.g):
        messages = []
        for x in (X, da.from_array(X, chunks=(400, 3))):
            with pytest.raises(dsl.GradError) as err:
                f(x)
            assert not isinstance(err.value, dsl.ArgumentError)
            messages.append(str(err.value))
        assert messages[1] == messages[0] and "batch" not in messages[1]


def test_a_dask_message_keeps_the_note_naming_the_call_into_a_helper():
    m = dsl.loads("def sub(x, y):\n    return x - y\n\ndef f(x, y):\n    return sub(x, y)\n",
                  "rows.grad")
    with pytest.raises(dsl.GradError) as info:
        m.f(da.from_array(Y, chunks=400), Y)
    assert "`batch` is the rows of 'x'" in info.value.message
    assert info.value.note == "in sub(), called at rows.grad:5:12"


def test_a_derived_function_is_named_once_in_a_dask_message():
    # "hvp(f)(): the Dask arguments ...": `f()` of a name already a call
    m = dsl.loads("def f(x, y):\n    return sum(x * y)\n")
    x, y = da.from_array(X, chunks=(400, 3)), da.from_array(X[:10], chunks=(5, 3))
    for derived, args in ((dsl.hvp(m.f), (x, y, x)), (dsl.grad(m.f), (x, y))):
        with pytest.raises(dsl.ArgumentError) as info:
            derived(*args)
        assert info.value.message.startswith(f"{derived.name}: the Dask arguments chunked "
                                             "along axis 0 are batches of rows")


def test_on_a_local_cluster_of_worker_processes():
    # the example: tasks pickled to fresh processes, each compiling
    # the block IR it is sent (one cluster for both functions: startup costs)
    distributed = pytest.importorskip("dask.distributed",
                                      reason="dask.distributed (the dask extra) is not installed")
    vg = dsl.value_and_grad(load_example("logistic").loss, wrt=2)
    x2 = RNG.normal(size=(40, 6))
    elementwise = dsl.grad(dsl.loads("def f(x):\n    return x * sin(x)\n").f)

    def compiled_here() -> tuple:  # run on each worker
        from dsl.dask_bridge import _PROGRAMS
        return os.getpid(), set(_PROGRAMS)

    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None)
    with distributed.Client(cluster) as client:
        lazy = vg(da.from_array(X, chunks=(100, 3)), da.from_array(Y, chunks=100), W)
        value, gw = dask.compute(*lazy)  # on the cluster: the Client is the default
        (g,) = dask.compute(elementwise(da.from_array(x2, chunks=(10, 3))))
        workers = client.run(compiled_here)
    expected_value, expected_gw = vg(X, Y, W)
    np.testing.assert_allclose(value, expected_value, rtol=1e-12)
    np.testing.assert_allclose(gw, expected_gw, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(g, np.sin(x2) + x2 * np.cos(x2), rtol=1e-12)
    assert len(workers) == 2 and all(pid != os.getpid() for pid, _ in workers.values())
    compiled_there = set().union(*(keys for _, keys in workers.values()))
    for transform in (vg, elementwise):  # compiled there, from the IR the tasks carry
        blocks = [plan.block for plan in transform.__dict__["_row_plans"].values()]
        assert {block.key for block in blocks} & compiled_there
        state = pickle.loads(pickle.dumps(blocks[0])).__dict__
        assert set(state) == {"fn", "target_name", "key", "sources"}  # never a compiled program
        assert all(isinstance(text, str) for _, text in state["sources"])  # (for caret lines)


def test_an_empty_row_block_is_left_out_of_a_max():
    # a block of no rows ran the block program's max over an empty axis
    # (an ArgumentError for an array that is not empty)
    m = dsl.loads("def f(x):\n    return max(x), sum(x, axis=1)\n")
    xs = da.from_array(X[:6], chunks=((0, 2, 0, 4), (3,)))
    top, rows = dask.compute(*m.f(xs))
    assert top == X[:6].max()
    np.testing.assert_allclose(rows, X[:6].sum(axis=1), rtol=1e-15)
    with pytest.raises(dsl.ArgumentError, match="max/min over an empty axis"):
        dask.compute(*m.f(da.from_array(X[:0], chunks=((0,), (3,)))))  # as in memory


def test_a_block_of_other_rows_than_its_chunks_say_is_an_argument_error():
    # (da.from_delayed told 400 rows of blocks holding 399: the mean summed
    # the rows it got and divided by the 800 the chunks say, silently wrong)
    loss = load_example("logistic").loss

    def first(array, rows):  # rows of array's first 400, as a Dask block of 400
        return da.from_delayed(dask.delayed(lambda: array[:rows])(), (400, *array.shape[1:]),
                               float)

    def value(rows):
        xs = da.concatenate([first(X, rows), da.from_array(X[400:], chunks=(400, 3))])
        ys = da.concatenate([first(Y, rows), da.from_array(Y[400:], chunks=400)])
        return dask.compute(*dsl.value_and_grad(loss, wrt=2)(xs, ys, W))[0]

    np.testing.assert_allclose(value(400), np.mean(np.logaddexp(0, -Y * (X @ W))), rtol=1e-12)
    message = (r"a block of argument '[xy]' of value_and_grad\(loss\) has 399 rows, but its "
               "Dask array's chunks say 400")
    with pytest.raises(dsl.ArgumentError, match=message):
        value(399)


def test_unknown_chunk_sizes_are_an_argument_error():
    xs = da.from_array(X, chunks=(400, 3))
    masked = xs[xs[:, 0] > 0]
    with pytest.raises(dsl.ArgumentError, match="unknown chunk sizes .* compute_chunk_sizes"):
        dsl.grad(load_example("logistic").loss, wrt=2)(masked, Y[:1], W)
    # it named neither the argument nor the function, and had no place (a
    # bad argument's error is at the function's definition), as a masked
    # Dask argument's and a jvp tangent's of unknown chunk sizes had neither
    f = dsl.loads("def f(x, w):\n    return tanh(x @ w)\n", "dask_args.grad").f
    with pytest.raises(dsl.ArgumentError, match=r"^dask_args.grad:1:5: error: argument 'x' of "
                                                r"f\(\) is a Dask array of unknown chunk sizes"):
        f(masked, W[:3])
    with pytest.raises(dsl.ArgumentError, match=r"^dask_args.grad:1:5: error: the tangent for "
                                                "'x' of f\\(\\) is a Dask array of unknown"):
        dsl.jvp(f, (xs, W[:3]), (masked, None))
    kept = X[X[:, 0] > 0]
    ys = da.from_array(Y[:len(kept)])
    np.testing.assert_allclose(
        dsl.grad(load_example("logistic").loss, wrt=2)(
            masked.compute_chunk_sizes(), ys, W).compute(),
        dsl.grad(load_example("logistic").loss, wrt=2)(kept, Y[:len(kept)], W), rtol=1e-12)


def test_jvp_on_dask_arrays_is_lazy_and_equals_the_in_memory_jvp():
    f = load_example("log1pexp").log1pexp
    x, t = X[:, 0], X[:, 1]
    expected = dsl.jvp(f, (x,), (t,))
    # Dask primal and tangent; a Dask primal with a NumPy tangent; and the other way
    for primal, tangent in ((da.from_array(x, chunks=100), da.from_array(t, chunks=100)),
                            (da.from_array(x, chunks=100), t),
                            (x, da.from_array(t, chunks=100))):
        y, ty = dsl.jvp(f, (primal,), (tangent,))
        assert is_lazy(y) and is_lazy(ty)
        np.testing.assert_allclose(y.compute(), expected[0], rtol=1e-15)
        np.testing.assert_allclose(ty.compute(), expected[1], rtol=1e-15)
    # a batch-wise mean: the tangent of w sums over blocks
    loss = load_example("logistic").loss
    tw = RNG.normal(size=W.shape)
    value, tangent = dsl.jvp(loss, (da.from_array(X, chunks=(100, 3)),
                                    da.from_array(Y, chunks=100), W), (None, None, tw))
    in_memory = dsl.jvp(loss, (X, Y, W), (None, None, tw))
    np.testing.assert_allclose(dask.compute(value, tangent), in_memory, rtol=1e-12)
    with pytest.raises(dsl.ArgumentError, match="has shape"):
        dsl.jvp(f, (da.from_array(x, chunks=100),), (da.from_array(t[:5], chunks=5),))


def is_lazy(value) -> bool:
    return type(value).__module__.startswith("dask.array")


@pytest.mark.parametrize("jacobian", [dsl.jacfwd, dsl.jacrev, dsl.hessian])
def test_jacobians_on_dask_arrays_are_lazy_and_equal_the_in_memory_ones(jacobian):
    f = load_example("log1pexp").log1pexp
    x = X[:6, 0]
    lazy = jacobian(f)(da.from_array(x, chunks=2))
    assert is_lazy(lazy)
    np.testing.assert_allclose(lazy.compute(), jacobian(f)(x), rtol=1e-14, atol=1e-15)
    # with respect to a parameter vector, over batches of rows
    loss = load_example("logistic").loss
    lazy = jacobian(loss, wrt=2)(da.from_array(X, chunks=(100, 3)),
                                 da.from_array(Y, chunks=100), W)
    np.testing.assert_allclose(lazy.compute(), jacobian(loss, wrt=2)(X, Y, W), rtol=1e-12)


@pytest.mark.parametrize("jacobian", [dsl.jacfwd, dsl.jacrev])
def test_jacobians_on_dask_arrays_take_an_empty_argument_and_name_dtypes_as_in_memory(jacobian):
    # as in memory: an empty argument has an empty Jacobian (it was an
    # error), and an integer one is refused naming its dtype `i64`
    m = dsl.loads("def f(x, y):\n    return sum(x) * y, x * 2.0\n")
    x, y = np.zeros((0, 2)), np.array([1.5, -2.0, 0.5])
    lazy = jacobian(m.f, wrt=(0, 1))(da.from_array(x, chunks=1), y)
    in_memory = jacobian(m.f, wrt=(0, 1))(x, y)
    for got, expected in zip(dask.compute(lazy)[0], in_memory):
        for g, e in zip(got, expected):
            assert (g.shape, g.dtype) == (e.shape, e.dtype)
            np.testing.assert_array_equal(g, e)
    for ints in (np.arange(3), da.arange(3, chunks=2)):
        with pytest.raises(dsl.ArgumentError) as info:
            jacobian(m.f)(ints, y)
        assert info.value.message.endswith("with respect to 'x': it has dtype i64")


@pytest.mark.parametrize("jacobian", [dsl.jacfwd, dsl.jacrev])
def test_jacobians_on_dask_arrays_of_one_output_and_of_a_python_number_are_as_in_memory(
        jacobian):
    # an empty argument gave a tuple of two Jacobians for f's one output (the
    # jvp's tangents were counted as outputs too), and a Python number `wrt`
    # names raised AttributeError ('float' object has no attribute 'dtype')
    m = dsl.loads("def f(x, y):\n    return x * y\n")
    lazy = jacobian(m.f)(da.zeros((0, 2), chunks=1), da.zeros((0, 2), chunks=1))
    assert is_lazy(lazy) and (lazy.shape, lazy.dtype) == ((0, 2, 0, 2), np.float64)
    x = np.array([0.5, -1.0, 2.0], np.float32)
    jx, jy = dask.compute(jacobian(m.f, wrt=(0, 1))(da.from_array(x, chunks=2), 2.0))[0]
    np.testing.assert_array_equal(jx, np.diag([2.0, 2.0, 2.0]).astype(np.float32))
    np.testing.assert_array_equal(jy, x)
    assert jy.dtype == np.float32  # 2.0 weakly typed, as for an in-memory x


@pytest.mark.parametrize("jacobian", [dsl.jacfwd, dsl.jacrev])
def test_jacobians_on_dask_arrays_of_integer_and_bool_outputs_have_the_argument_dtype(jacobian):
    # as in memory (zero, of x's dtype): they were the tangents' i64 and bool
    m = dsl.loads("def g(x):\n    return sum(where(x > 0, 1, 0)), x > 0\n")
    x = np.array([0.5, -1.0, 2.0], np.float32)
    lazy = jacobian(m.g)(da.from_array(x, chunks=2))
    for got, expected in zip(dask.compute(lazy)[0], jacobian(m.g)(x)):
        assert (got.shape, got.dtype) == (expected.shape, np.float32)
        np.testing.assert_array_equal(got, expected)


def test_hvp_on_dask_arrays_is_lazy_and_equals_the_in_memory_hvp():
    loss = load_example("logistic").loss
    v = RNG.normal(size=W.shape)
    lazy = dsl.hvp(loss, wrt=2)(da.from_array(X, chunks=(100, 3)),
                               da.from_array(Y, chunks=100), W, v)
    assert is_lazy(lazy)
    np.testing.assert_allclose(lazy.compute(), dsl.hvp(loss, wrt=2)(X, Y, W, v), rtol=1e-12)
    # along the batch: v is split as x is, whichever of them is the Dask
    # array, as jvp splits a primal and its tangent (an in-memory v went
    # whole to every block: shapes [batch, 3] and [800, 3] did not broadcast)
    vx = RNG.normal(size=X.shape)
    expected = dsl.hvp(loss, wrt=0)(X, Y, W, vx)
    for x, vs in ((da.from_array(X, chunks=(100, 3)), vx),
                  (X, da.from_array(vx, chunks=(100, 3))),
                  (da.from_array(X, chunks=(100, 3)), vx.tolist())):
        lazy = dsl.hvp(loss, wrt=0)(x, da.from_array(Y, chunks=100), W, vs)
        assert is_lazy(lazy)
        np.testing.assert_allclose(lazy.compute(), expected, rtol=1e-12, atol=1e-15)


def test_a_weight_vector_before_unsplit_data_goes_to_every_block():
    # neither split along its rows: the batch was the first Dask array, w,
    # whose 3 entries x @ w cannot take as rows ("the size 3 meets the size
    # batch"), where f(x, w) ran: the rows are now the first that f splits over
    f = dsl.loads("def f(w, x):\n    return sum(tanh(x @ w))\n").f
    value, (gw, gx) = dask.compute(*dsl.value_and_grad(f, wrt=(0, 1))(da.from_array(W),
                                                                      da.from_array(X)))
    expected_value, (expected_gw, expected_gx) = dsl.value_and_grad(f, wrt=(0, 1))(W, X)
    np.testing.assert_allclose(value, np.tanh(X @ W).sum(), rtol=1e-12)
    np.testing.assert_allclose(gw, expected_gw, rtol=1e-12)
    np.testing.assert_allclose(gx, expected_gx, rtol=1e-12)


def test_a_0d_dask_argument_goes_to_every_block():
    # the batch is the first Dask argument with rows: a 0-d one before it
    # was taken as the batch ("must have the same number of rows; got
    # shapes [], [6]"), and alone it says it has no rows to split over
    f = dsl.loads("def f(s, x):\n    return sum(x * s)\n").f
    s, x = da.from_array(np.array(2.0)), np.arange(6.0)
    value, (gs, gx) = dask.compute(*dsl.value_and_grad(f, wrt=(0, 1))(s, da.from_array(x)))
    assert value == 30.0 and gs == 15.0
    np.testing.assert_array_equal(gx, np.full(6, 2.0))
    with pytest.raises(dsl.ArgumentError, match=r"f\(\) on Dask arrays splits them by their rows "
                                                 r"\(axis 0\), and 's' has none"):
        f(s, x)


@pytest.mark.parametrize("make_v,x_is_dask", [(lambda: np.ones((6, 3)), True),
                                              (lambda: 1.0, True),
                                              (lambda: da.ones((4, 3)), False)])
def test_an_hvp_vector_of_another_shape_than_its_dask_argument_says_so(make_v, x_is_dask):
    # v (or its argument) was split as the other, whatever its shape:
    # Dask's "Chunks do not add up to shape" reached the caller
    f = dsl.loads("def f(x, w):\n    return tanh(x @ w)\n").f
    x, w = da.from_array(RNG.normal(size=(6, 4)), chunks=(3, 4)), RNG.normal(size=(4, 2))
    wrt, shapes = (0, r"\[[\d, ]*\], but 'x' has shape \[6, 4\]") if x_is_dask else (
        1, r"\[4, 3\], but 'w' has shape \[4, 2\]")
    with pytest.raises(dsl.ArgumentError, match=rf"hvp\(f\): v has shape {shapes}"):
        dsl.hvp(f, wrt=wrt)(x, w, make_v())


def test_an_argument_split_as_its_dask_tangent_or_vector_keeps_its_dtype():
    # a NumPy f64 primal beside a Dask f32 tangent was made f32 (values and
    # tangents 1.7e-7 off, where the in-memory jvp refuses the tangent); a
    # Dask tangent of another shape raised Dask's "Chunks do not add up";
    # an f32 Dask v is made wrt's f64 as a host v is (with a NumPy x, x was
    # made f32: an f32 hvp; with a Dask x, a GradError without a location)
    f = dsl.loads("def f(x, w):\n    return sum(tanh(x @ w) ** 2)\n").f
    x, w = RNG.normal(size=(6, 4)), RNG.normal(size=(4, 2))
    v = RNG.normal(size=(6, 4)).astype(np.float32)
    with pytest.raises(dsl.ArgumentError, match="the tangent for 'x' of f\\(\\) has dtype f32; "
                                                "its primal has dtype f64"):
        dsl.jvp(f, (x, w), (da.from_array(v, chunks=2), None))
    with pytest.raises(dsl.ArgumentError, match="the tangent for 'x' of f\\(\\) has shape "
                                                "\\[5, 4\\]; its primal has shape \\[6, 4\\]"):
        dsl.jvp(f, (x, w), (da.ones((5, 4), chunks=2), None))
    expected = dsl.hvp(f, wrt=0)(x, w, v)
    for x_given in (x, da.from_array(x, chunks=3)):
        got = dsl.hvp(f, wrt=0)(x_given, w, da.from_array(v, chunks=2)).compute()
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, expected, rtol=1e-13)


def test_a_big_endian_or_masked_dask_argument():
    # binding made the stand-in of a big-endian array native, a new array
    # standing for no Dask array: w was taken as zeros (a wrong value), x
    # left no batch (an IndexError); a masked one reached the blocks (NumPy's
    # broadcasting error at compute time)
    f = dsl.loads("def f(x, w):\n    return tanh(x @ w)\n").f
    x, w = RNG.normal(size=(6, 4)), RNG.normal(size=(4, 2))
    for x_order in ("<f8", ">f8"):
        got = f(da.from_array(x.astype(x_order), chunks=2), da.from_array(w.astype(">f8")))
        np.testing.assert_allclose(got.compute(), np.tanh(x @ w), rtol=1e-14)
    with pytest.raises(dsl.ArgumentError, match=r"<string>:1:5: error: argument 'x' of f\(\) is "
                                                r"a masked Dask array \(shape \[6, 4\]\), which "
                                                "cannot be bound: its mask would be ignored"):
        f(da.ma.masked_array(da.from_array(x, chunks=2), mask=x > 1), w)


def test_a_size_needed_in_an_imported_function_is_an_error_at_the_call_leading_there(tmp_path):
    # the slice of the rows is in lib.grad: the error is at the line of
    # main.grad calling into it (it was at main's `def f`)
    # (x[2::-1]: from min(n - 1, 2) backwards, a start no program computes)
    (tmp_path / "lib.grad").write_text("def shifted(x):\n    return x[2::-1] * 2.0\n")
    path = tmp_path / "main.grad"
    path.write_text("from lib import shifted\n\ndef f(x):\n    return sum(shifted(x * 2.0))\n")
    with pytest.raises(dsl.ArgumentError, match=r"main.grad:4:16: error: f\(\) on Dask arrays: "
                                                "axis 0 of size batch is sliced to its end"):
        dsl.load(path).f(da.from_array(np.ones(10), chunks=3))


def test_a_slice_reversing_the_rows_is_refused_and_one_of_each_rows_columns_runs():
    # `x[::-1]` of the rows keeps their size (one program for every batch
    # size since 654c78f): each block ran it on its own rows, reversed
    # block by block
    m = dsl.loads("def f(x):\n    return x[::-1] * 2.0\n\n"
                  "def g(x):\n    return x[:, ::-1] * 2.0\n", "rows.grad")
    with pytest.raises(dsl.GradError, match=r"rows.grad:2:12: error: `x\[::-1\]` moves data "
                                            r"between the rows of the batch"):
        m.f(da.from_array(X[:12], chunks=(5, 3)))
    with dask.config.set(scheduler="sync"):
        got = m.g(da.from_array(X[:12], chunks=(5, 3))).compute()
    np.testing.assert_array_equal(got, X[:12, ::-1] * 2.0)


def test_a_broadcast_to_the_rows_size_runs_by_blocks():
    # (its shape's negative check compared the batch's symbol: "the size
    # batch is used as a number")
    m = dsl.loads("def f(x, b):\n    return x * broadcast_to(b, (x.shape[0], 3))\n")
    b = np.array([1.0, -2.0, 0.5])
    with dask.config.set(scheduler="sync"):
        value = m.f(da.from_array(X, chunks=(300, 3)), b).compute()
        grad = dsl.grad(m.f, wrt=1)(da.from_array(X, chunks=(300, 3)), b)
    np.testing.assert_array_equal(value, X * b)
    np.testing.assert_allclose(np.asarray(dask.compute(grad)[0]), X.sum(axis=0), rtol=1e-12)


def test_a_list_holding_dask_arrays_is_an_argument_error_not_computed_in_memory():
    m = dsl.loads("def f(x, s):\n    return sum(s * x)\n", "lists.grad")
    xs = da.from_array(X, chunks=(400, 3))
    # NumPy would compute the Dask arrays whole and run in memory, eagerly
    for call in (lambda: m.f([xs, xs], 1.0), lambda: dsl.grad(m.f)(x=(xs,), s=1.0),
                 lambda: dsl.vjp(m.f, X, [[xs[0, 0]], 2.0])):
        with pytest.raises(dsl.ArgumentError, match="lists.grad:1:5: error: argument .* is a "
                                                    "(list|tuple) holding a Dask array.*da.stack"):
            call()
    # stacked, it runs block by block, as the in-memory call
    value = m.f(da.stack([xs, xs]), 1.0)
    assert isinstance(value, da.Array)
    np.testing.assert_allclose(value.compute(), 2 * X.sum(), rtol=1e-12)


def test_an_error_raised_in_a_block_shows_its_source_line_as_in_memory():
    m = dsl.loads("def f(x, labels: i64[n]):\n"
                  "    return sum(take_along_axis(x, labels, axis=1))\n", "blocks.grad")
    labels = np.full(800, 7)  # out of range for 3 columns
    messages = []
    for args in [(X, labels), (da.from_array(X, chunks=(300, 3)), da.from_array(labels, 300))]:
        with pytest.raises(dsl.ArgumentError, match="blocks.grad:2:16: error: index 7 in "
                                                    "'labels' is out of range") as err:
            dask.compute(m.f(*args))
        messages.append(str(err.value))
    assert messages[1] == messages[0]  # with the caret line under take_along_axis
    source, caret = messages[1].splitlines()[1:]
    assert source == "        return sum(take_along_axis(x, labels, axis=1))"
    assert caret.startswith(" " * 19 + "^^^") and set(caret.strip()) == {"^"}


def test_a_dask_array_for_a_const_parameter_is_an_argument_error_not_its_stand_in_zero():
    m = dsl.loads("def f(x, axis: const):\n    return sum(x * x, axis)\n", "const.grad")
    xs, axis = da.from_array(X, chunks=(300, 3)), da.from_array(np.array(1))
    np.testing.assert_allclose(m.f(xs, 1).compute(), np.sum(X * X, 1), rtol=1e-12)  # computed: ok
    # the stand-in bound for a Dask array is 0: the call summed over axis 0, shape (3,)
    for call in (lambda: m.f(xs, axis), lambda: dsl.grad(m.f)(xs, axis),
                 lambda: dsl.jvp(m.f, (xs, axis), (xs, None))):
        with pytest.raises(dsl.ArgumentError, match="const.grad:1:5: error: argument 'axis' of "
                                                    ".* is `const`.*pass it computed"):
            call()


def test_a_dask_array_for_an_argument_giving_a_size_is_an_argument_error_not_its_stand_in_zero():
    m = dsl.loads("def f(x, k: i64):\n    return sum(x, axis=1) + sum(arange(k) * 1.0)\n",
                  "size.grad")
    xs, k = da.from_array(X, chunks=(300, 3)), da.from_array(np.array(3))
    refused = "size.grad:1:5: error: argument 'k' of f\\(\\) gives a size.*pass it computed"
    # k's stand-in is 0: the call compiled arange(0), its sum 0.0, silently
    with pytest.raises(dsl.ArgumentError, match=refused):
        m.f(xs, k)
    np.testing.assert_allclose(m.f(xs, 3).compute(), np.sum(X, 1) + 3.0, rtol=1e-12)
    with pytest.raises(dsl.ArgumentError, match=refused):  # (k now compiled for by value)
        m.f(xs, k)


def test_a_tape_refuses_dask_arrays_rather_than_miss_their_calls():
    # a Dask call is lazy, so no tape records it: watch(dask array) said
    # "convert Python numbers with np.asarray", and a Dask call taking a
    # watched array ran unrecorded, its gradient then "not computed by a
    # call recorded on this tape"
    loss = load_example("logistic").loss
    xs, ys = da.from_array(X, chunks=(100, 3)), da.from_array(Y, chunks=100)
    with dsl.Tape() as tape:
        with pytest.raises(dsl.ArgumentError, match="not Dask arrays: a call on Dask arrays is "
                                                    "lazy, and no tape records it"):
            tape.watch(xs)
        w = W.copy()
        tape.watch(w)
        with pytest.raises(dsl.ArgumentError, match=r"loss\(\) on Dask arrays is not recorded "
                                                    "by the dsl.Tape watching one of its"):
            loss(xs, ys, w)
        value = loss(X, Y, w)  # (in memory, recorded as ever)
    np.testing.assert_allclose(tape.gradient(value, w), dsl.grad(loss, wrt=2)(X, Y, W),
                               rtol=1e-13)


def test_a_dask_array_of_const_labels_is_split_over_the_rows_as_data():
    # every const parameter was refused as if its value picked the program,
    # so a classifier's `labels: const i64[n]`, rows beside x, had to be
    # computed in memory first; only a const integer or bool scalar picks one
    m = dsl.loads("def f(x, w, labels: const i64[n]):\n"
                  "    return -mean(take_along_axis(x * w, labels[:, None], axis=1))\n",
                  "labels.grad")
    labels = RNG.integers(0, 3, 800)
    xs, ls = da.from_array(X, chunks=(300, 3)), da.from_array(labels, chunks=300)
    value, gw = dask.compute(*dsl.value_and_grad(m.f, wrt=1)(xs, W, ls))
    picked = X[np.arange(800), labels]
    np.testing.assert_allclose(value, -np.mean(picked * W[labels]), rtol=1e-12)
    expected = -np.bincount(labels, weights=picked, minlength=3) / 800
    np.testing.assert_allclose(gw, expected, rtol=1e-12)
