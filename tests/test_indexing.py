"""Indexing with run-time integers, from source, on every target (CUDA on
Numba's simulator unless a GPU is present): `x[i]` for an integer scalar,
`x[idx]`, `take`, `take_along_axis`, `scatter_add` and `segment_sum`
against NumPy (`np.take`, `np.take_along_axis`, `np.add.at`) on
Hypothesis index arrays with repeats and negatives; gradients (orders 1
and 2) against central differences in f64; the examples of issue 10; and
the errors: an out-of-range index is an `ArgumentError` naming the index
and its value, a non-integer or mis-shaped index a `GradError` at its
source position."""
import functools
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from gradlang.compiler.fusion import Loop, fuse
from gradlang.runtime.target import TARGETS
from helpers import central_difference

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

SOURCE = """\
def row(x, i: i64):
    return x[i] * 2.0

def col(x, i: i64):
    return x[:, i - 1]

def cell(x, i: i64, j: i64):
    return x[i, j]

def weighted_row(x, w, i: i64):
    return sum(x[i] * w)

def gather(x, idx):
    return x[idx]

def gather_cols(x, idx):
    return x[1:, idx]

def listed(x, w, i: i64):
    return sum((x[[2, -1, 0]] * 2.0 + sum(x[[[0, i], [1, 1], [3, 3]]], axis=1)) * w)

def take0(x, idx):
    return take(x, idx)

def take1(x, idx):
    return take(x, idx, axis=1)

def along(x, idx):
    return take_along_axis(x, idx, axis=1)

def scatter(base, idx, values):
    return scatter_add(base, idx, values)

def scatter1(base, idx, values):
    return scatter_add(base, idx, values, axis=1)

def scatter_then_reread(x, idx, values):
    base = x * 2.0
    return scatter_add(base, idx, values) - base

def segments(values, seg, m: const i64):
    return segment_sum(values, seg, m)

def segments_of_size(values, seg, like):
    return segment_sum(values, seg, like.shape[0])

def segments_counted(values, seg, m: i64):
    return sum(segment_sum(values, seg, m) ** 2)

def smooth(x, idx, values):
    return sum(sin(scatter_add(x * x, idx, values * x[idx])))

def new_axes(x, i: i64, idx):
    return x[:, None] * x[None, i], x[None, 1:, None, idx] ** 2

def every_other_axis(x, idx):
    return x[..., 0], x[1, ...], x[..., None, 1:], x[..., idx], x[0, ..., ::-2], x[...]

def language_model(tokens, h, emb, w):
    for i in range(tokens.shape[0]):
        h = tanh(h @ w + emb[tokens[i]])
    return sum(h * h)

def accumulate(acc, idx, values):
    for i in range(idx.shape[0]):
        acc = scatter_add(acc, idx[i], values[i])
    return acc

def accumulate_kept(x, idx, values):
    start = x * 2.0
    acc = start
    for i in range(idx.shape[0]):
        acc = scatter_add(acc, idx[i], values[i])
    return acc, start

def zeros_kept(a, idx, values):
    s = a * 1.0
    z = a * 0.0
    for i in range(idx.shape[0]):
        z = zeros_like(a)
        s = s + scatter_add(z, idx[i], values[i])
    y = zeros_like(a)
    return s + scatter_add(y, idx[0], values[0]), z, y

def table_loss(emb, ids):
    return sum(emb[ids] ** 2) + sum(emb * emb)

def table_loss_twice(emb, ids, other):
    return sum(emb * emb) + sum(emb[ids] ** 2) + sum(tanh(emb[other]))

def bigram(tokens, h, emb, w):
    for i in range(tokens.shape[0] - 1):
        h = tanh(h @ w + emb[tokens[i]] * emb[tokens[i + 1]])
    return sum(h * h)

def neighbours(x, n: i64):
    s = x[0] * 0
    for i in range(n):
        if i + 1 < n:
            s = s + x[i + 1] * x[i]
        else:
            s = s + take(x, 3 * i - 2 * n + 2) * 2.0
    return s
"""


each_target = pytest.mark.parametrize("target", list(TARGETS))


@functools.lru_cache(maxsize=None)
def module(target: str) -> dsl.Module:
    return dsl.loads(SOURCE, "indexing.grad", target=target, host_results=True)


@functools.lru_cache(maxsize=None)
def example(name: str, target: str) -> dsl.Module:
    return dsl.load(EXAMPLES / f"{name}.grad", target=target, host_results=True)


def indices(n: int, size: int):
    """Index arrays over [-n, n): negatives and repeats included."""
    return st.lists(st.integers(-n, n - 1), min_size=size, max_size=size).map(
        lambda xs: np.array(xs, np.int64))


# ------------------------------------------------------ scalar indices


@each_target
def test_runtime_scalar_index_reads_like_numpy(target):
    m = module(target)
    x = np.arange(12.0).reshape(4, 3)
    for i in (0, 3, -1, -4):
        np.testing.assert_array_equal(m.row(x, np.int64(i)), x[i] * 2)
        np.testing.assert_array_equal(m.cell(x, np.int64(i), np.int64(-2)), x[i, -2])
    np.testing.assert_array_equal(m.col(x, np.int64(3)), x[:, 2])
    np.testing.assert_array_equal(m.col(x, np.int64(0)), x[:, -1])


@each_target
def test_a_list_of_integers_indexes_as_numpys_does(target):
    # x[[0, 1]] was "expected a compile-time integer": a list is the
    # integer array it spells, as in NumPy (a run-time integer among them)
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(4, 3)), rng.normal(size=(3, 3))

    def reference(x, w, i=1):
        return np.sum((x[[2, -1, 0]] * 2.0 + x[[[0, i], [1, 1], [3, 3]]].sum(axis=1)) * w)
    m = module(target)
    for i in (1, -2):
        assert m.listed(x, w, np.int64(i)) == pytest.approx(reference(x, w, i), rel=1e-14)
    for got, k in zip(dsl.grad(m.listed, wrt=(0, 1))(x, w, np.int64(1)), (0, 1), strict=True):
        np.testing.assert_allclose(got, central_difference(reference, [x, w], k), rtol=1e-6,
                                   atol=1e-8)
    with pytest.raises(dsl.ArgumentError, match="index 4 is out of range"):
        m.listed(x, w, np.int64(4))


@each_target
def test_gradient_of_a_scalar_index_scatters_into_zeros(target):
    m = module(target)
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(4, 3)), rng.normal(size=3)
    for i in (2, -1):
        g = dsl.grad(m.weighted_row)(x, w, np.int64(i))
        expected = np.zeros_like(x)
        expected[i] = w
        np.testing.assert_array_equal(g, expected)


def test_none_inserts_an_axis_where_it_stands_as_numpy():
    """`x[:, None]` was "name 'None' is not defined"."""
    m = module("cpu")
    rng = np.random.default_rng(1)
    x, i, idx = rng.normal(size=(3, 2)), np.int64(-1), np.array([1, 0, 1])

    def new_axes(x):
        return x[:, None] * x[None, i], x[None, 1:, None, idx] ** 2
    for got, want in zip(m.new_axes(x, i, idx), new_axes(x), strict=True):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(dsl.grad(m.new_axes)(x, i, idx), central_difference(
        lambda x: sum(np.sum(r) for r in new_axes(x)), [x], 0), rtol=1e-8)
    for source, message in [("y = x[None, 0, 0, 0]", "too many indices (3)"),
                            ("y = (x, x)[None]", "a tuple takes one integer index"),
                            ("y = None", "None is not a value")]:
        with pytest.raises(dsl.GradError, match=re.escape(message)):
            dsl.loads(f"def f(x):\n    {source}\n    return x\n").f(x)


def test_a_number_and_a_tuple_index_read_as_numpy():
    # A number is a weakly typed 0-d array, as `broadcast_to(0.5, ())` of it
    # is: `None` and `...` index it (it was "cannot index a scalar literal",
    # at a broadcast_to() call too).  `x[(i, j)]` is `x[i, j]` and `x[()]`
    # is x (they were "too many indices (1)" and "expected a compile-time
    # integer").
    m = dsl.loads("def f(x, s):\n"
                  "    a = broadcast_to(sqrt(x.shape[0]) * 0.5, ())[None] + (2.0)[None, ...]\n"
                  "    return x * a + x[(1, 0)] * s[()] + x[()][(0,)][None]\n")
    x, s = np.arange(1.0, 5.0).reshape(2, 2).astype(np.float32), np.float32(3.0)
    got = m.f(x, s)
    assert got.dtype == np.float32   # (weak: the numbers take x's dtype)
    a = np.broadcast_to(np.sqrt(2) * 0.5, ())[None] + np.float64(2.0)[None, ...]
    np.testing.assert_allclose(got, x * a + x[(1, 0)] * s[()] + x[()][(0,)][None], rtol=1e-6)
    with pytest.raises(dsl.GradError, match=re.escape("too many indices (1) for an array of "
                                                      "rank 0")):
        dsl.loads("def f(x):\n    return x + (2.0)[0]\n").f(x)


@each_target
def test_ellipsis_stands_for_every_axis_no_other_item_indexes(target):
    """`x[..., 0]` was "syntax error: unexpected '...'"."""
    m = module(target)
    x, idx = np.random.default_rng(2).normal(size=(2, 3, 4)), np.array([3, -1, 0])

    def every_other_axis(x):
        return x[..., 0], x[1, ...], x[..., None, 1:], x[..., idx], x[0, ..., ::-2], x[...]
    for got, want in zip(m.every_other_axis(x, idx), every_other_axis(x), strict=True):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    if target != "cpu":
        return
    weights = tuple(np.random.default_rng(k).normal(size=r.shape)
                    for k, r in enumerate(every_other_axis(x)))
    _, pullback = dsl.vjp(m.every_other_axis, x, idx)
    np.testing.assert_allclose(pullback(*weights)[0], central_difference(
        lambda x: sum(np.sum(r * w) for r, w in zip(every_other_axis(x), weights)), [x], 0),
        rtol=1e-8)
    for source, message in [("y = x[..., ...]", "a single ellipsis ('...')"),
                            ("y = x[0, 0, 0, 0, ...]", "too many indices (4)"),
                            ("y = (x, x)[...]", "a tuple takes one integer index")]:
        with pytest.raises(dsl.GradError, match=re.escape(message)):
            dsl.loads(f"def f(x):\n    {source}\n    return x\n").f(x)


# ------------------------------------------------------- index arrays


@each_target
@settings(max_examples=4, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**31))
def test_gathers_match_numpy(target, data, seed):
    m = module(target)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(5, 4))
    idx = data.draw(indices(5, 6))
    np.testing.assert_array_equal(m.gather(x, idx), x[idx])
    np.testing.assert_array_equal(m.take0(x, idx), np.take(x, idx))
    cols = data.draw(indices(4, 3))
    np.testing.assert_array_equal(m.gather_cols(x, cols), x[1:, cols])
    np.testing.assert_array_equal(m.take1(x, cols.reshape(3, 1)),
                                  np.take(x, cols.reshape(3, 1), axis=1))
    picks = data.draw(indices(4, 10)).reshape(5, 2)
    np.testing.assert_array_equal(m.along(x, picks), np.take_along_axis(x, picks, axis=1))


@each_target
@settings(max_examples=4, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**31))
def test_scatter_adds_match_numpy_add_at(target, data, seed):
    m = module(target)
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(4, 3))
    idx = data.draw(indices(4, 7))
    values = rng.normal(size=(7, 3))
    expected = base.copy()
    np.add.at(expected, idx, values)
    np.testing.assert_allclose(m.scatter(base, idx, values), expected, rtol=1e-12)
    # a base the driver made is added into in place only if nothing reads it after
    np.testing.assert_allclose(m.scatter_then_reread(base, idx, values),
                               expected - base, rtol=1e-12, atol=1e-12)
    idx1 = data.draw(indices(3, 5))
    values1 = rng.normal(size=(4, 5))
    expected = base.copy()
    np.add.at(expected, (slice(None), idx1), values1)
    np.testing.assert_allclose(m.scatter1(base, idx1, values1), expected, rtol=1e-12)
    seg = np.abs(idx) % 3
    expected = np.zeros((3, 3))
    np.add.at(expected, seg, values)
    np.testing.assert_allclose(m.segments(values, seg, 3), expected, rtol=1e-12)
    np.testing.assert_allclose(m.segments_of_size(values, seg, np.zeros(3)), expected,
                               rtol=1e-12)


@each_target
def test_scatter_add_into_a_base_of_any_memory_layout(target):
    # a Fortran-ordered base was copied as Fortran-ordered, and the adds
    # went into a C-ordered copy of that copy: the base came back unchanged
    m = module(target)
    base = np.arange(12.0).reshape(4, 3)
    idx, values = np.array([0, 2, -2]), np.full((3, 3), 100.0)
    expected = base.copy()
    np.add.at(expected, idx, values)
    expected1 = base.copy()
    np.add.at(expected1, (slice(None), idx), values[:1].repeat(4, axis=0))
    for layout in (np.asfortranarray(base), np.ascontiguousarray(base.T).T, base[::-1][::-1],
                   np.ascontiguousarray(base[::-1])[::-1], np.repeat(base, 2, axis=1)[:, ::2]):
        np.testing.assert_array_equal(m.scatter(layout, idx, values), expected)
        np.testing.assert_array_equal(m.scatter1(layout, idx, values[:1].repeat(4, axis=0)),
                                      expected1)


def test_scatter_add_adds_in_place_only_into_a_base_nothing_else_reads():
    # x * 2.0 is made by the driver: added into in place unless it is read again
    m = module("cpu")
    args = (np.ones((4, 3)), np.array([0, 2]), np.ones((2, 3)))

    def driver(f):
        return f.program(f.bind(args, {})).generated.driver_source

    assert "owned=True" in driver(m.smooth)
    assert "owned=True" not in driver(m.scatter_then_reread)
    assert "owned=True" not in driver(m.scatter)  # base is the caller's


@each_target
@settings(max_examples=3, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**31))
def test_gather_and_scatter_gradients_match_finite_differences(target, data, seed):
    # smooth() has a gather inside a scatter-add, so its gradient is a
    # scatter-add of a gather and its Hessian runs both again.
    m = module(target)
    rng = np.random.default_rng(seed)
    x, values = rng.normal(size=(4, 2)), rng.normal(size=(6, 2))
    idx = data.draw(indices(4, 6))

    def f(x, values):
        out = x * x
        np.add.at(out, idx, values * x[idx])
        return np.sum(np.sin(out))

    gx, gv = dsl.grad(m.smooth, wrt=(0, 2))(x, idx, values)
    np.testing.assert_allclose(gx, central_difference(f, [x, values], 0), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gv, central_difference(f, [x, values], 1), rtol=1e-6, atol=1e-8)
    v = rng.normal(size=x.shape)
    hv = dsl.hvp(m.smooth, wrt=0)(x, idx, values, v)
    eps = 1e-5
    fd = (dsl.grad(m.smooth)(x + eps * v, idx, values)
          - dsl.grad(m.smooth)(x - eps * v, idx, values)) / (2 * eps)
    np.testing.assert_allclose(hv, fd, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------- examples


@each_target
def test_cross_entropy_with_integer_labels(target):
    pick = example("cross_entropy", target).pick
    rng = np.random.default_rng(1)
    logits, labels = rng.normal(size=(5, 4)), np.array([0, 3, -1, 3, 2])

    def reference(logits):
        lp = logits - np.log(np.sum(np.exp(logits), axis=1, keepdims=True))
        return -np.mean(lp[np.arange(5), labels])

    np.testing.assert_allclose(pick(logits, labels), reference(logits), rtol=1e-12)
    g = dsl.grad(pick)(logits, labels)
    np.testing.assert_allclose(g, central_difference(reference, [logits], 0), rtol=1e-6,
                               atol=1e-9)
    softmax = np.exp(logits) / np.sum(np.exp(logits), axis=1, keepdims=True)
    onehot = np.eye(4)[labels]
    np.testing.assert_allclose(g, (softmax - onehot) / 5, rtol=1e-10, atol=1e-14)
    v = rng.normal(size=logits.shape)
    eps = 1e-5
    fd = (dsl.grad(pick)(logits + eps * v, labels)
          - dsl.grad(pick)(logits - eps * v, labels)) / (2 * eps)
    np.testing.assert_allclose(dsl.hvp(pick)(logits, labels, v), fd, rtol=1e-5, atol=1e-8)


@each_target
def test_embedding_gradient_accumulates_repeated_ids(target):
    m = example("embedding", target)
    rng = np.random.default_rng(2)
    table, ids = rng.normal(size=(5, 3)), np.array([1, 4, 1, -1, 0, 1])
    np.testing.assert_allclose(m.embed(table, ids), np.sum(table[ids] ** 2), rtol=1e-12)
    g = dsl.grad(m.embed)(table, ids)
    counts = np.bincount(ids % 5, minlength=5)[:, None]  # row 1 three times, row 4 twice
    np.testing.assert_allclose(g, 2 * counts * table, rtol=1e-12)
    np.testing.assert_allclose(g, central_difference(lambda t: np.sum(t[ids] ** 2), [table], 0),
                               rtol=1e-6, atol=1e-8)
    v = rng.normal(size=table.shape)
    np.testing.assert_allclose(dsl.hvp(m.embed)(table, ids, v), 2 * counts * v, rtol=1e-12)


def language_model_by_hand(tokens, h, emb, w):
    """The value of `language_model` and its gradients w.r.t. h, emb, w,
    by backpropagation written out in NumPy."""
    hs = [h]
    for t in tokens:
        hs.append(np.tanh(hs[-1] @ w + emb[t]))
    g, g_emb, g_w = 2 * hs[-1], np.zeros_like(emb), np.zeros_like(w)
    for k in range(len(tokens) - 1, -1, -1):
        d = g * (1 - hs[k + 1] ** 2)
        g_w += np.outer(hs[k], d)
        g_emb[tokens[k]] += d
        g = d @ w.T
    return np.sum(hs[-1] ** 2), g, g_emb, g_w


def last_loop_body(f, args) -> str:
    """The source of the driver's last loop body (the backward one)."""
    lines = f.program(f.bind(args, {})).generated.driver_source.splitlines()
    start = max(k for k, line in enumerate(lines) if line.lstrip().startswith("def body"))
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = next((k for k in range(start + 1, len(lines))
                if len(lines[k]) - len(lines[k].lstrip()) <= indent), len(lines))
    return "\n".join(lines[start:end])


@each_target
@settings(max_examples=4, deadline=None)
@given(tokens=st.lists(st.integers(-6, 5), max_size=7).map(lambda t: np.array(t, np.int64)),
       seed=st.integers(0, 2**31))
def test_an_embedding_read_in_a_loop_adds_its_gradient_row_by_row(target, tokens, seed):
    # The gradient of emb[tokens[i]] used to fill a whole table of zeros
    # on each trip, scatter one row into it and add it to the table's
    # running gradient: a cost of the table's size per token.  Now each
    # trip scatters its row into the running gradient in place.
    m = module(target)
    rng = np.random.default_rng(seed)
    h, emb, w = rng.normal(size=3), rng.normal(size=(6, 3)), rng.normal(size=(3, 3)) * 0.5
    args = (tokens, h, emb, w)
    value, *grads = language_model_by_hand(*args)
    got = dsl.value_and_grad(m.language_model, wrt=(1, 2, 3))(*args)
    np.testing.assert_allclose(got[0], value, rtol=1e-12)
    for g, want in zip(got[1], grads):
        np.testing.assert_allclose(g, want, rtol=1e-10, atol=1e-12)
    f = dsl.value_and_grad(m.language_model, wrt=(1, 2, 3))
    body = last_loop_body(f, args)
    assert "R.full" not in body and "owned=True" in body, body


def test_a_gather_reads_a_table_of_any_layout_where_it_lies():
    # The gathers read their table flat: one not C-contiguous was copied
    # whole each call, so a loop reading a row of a Fortran-order table per
    # trip copied the table every trip (80x the time at 10,000 x 64), and a
    # broadcast table cost its full size (here 256 GiB: an AllocationError)
    m = module("cpu")
    rng = np.random.default_rng(3)
    x = rng.normal(size=(5, 4))
    idx, cols, picks = np.array([4, -5, 0, 4]), np.array([[3], [-1]]), np.array([[0, -4]] * 5)
    for layout in (np.asfortranarray(x), x.T.copy().T, np.ascontiguousarray(x[::-1])[::-1],
                   np.repeat(x, 2, axis=1)[:, ::2]):
        assert not layout.flags.c_contiguous
        np.testing.assert_array_equal(m.gather(layout, idx), x[idx])
        np.testing.assert_array_equal(m.take1(layout, cols), np.take(x, cols, axis=1))
        np.testing.assert_array_equal(m.gather_cols(layout, cols[:, 0]), x[1:, cols[:, 0]])
        np.testing.assert_array_equal(m.along(layout, picks), np.take_along_axis(x, picks, 1))
        with pytest.raises(dsl.ArgumentError, match="index 5 in 'idx'"):
            m.gather(layout, np.array([0, 5]))
        with pytest.raises(dsl.ArgumentError, match="index -5 in 'idx'"):
            m.along(layout, picks - 1)
    tokens, h, w = np.array([2, 0, -1, 2]), rng.normal(size=3), rng.normal(size=(3, 3)) / 2
    table = np.tile(rng.normal(size=3), (3, 1))
    huge = np.broadcast_to(table[0], (2 ** 33, 3))
    got = dsl.value_and_grad(m.language_model, wrt=(1, 3))(tokens % 3, h, huge, w)
    value, g_h, g_emb, g_w = language_model_by_hand(tokens % 3, h, table, w)
    np.testing.assert_allclose(got[0], value, rtol=1e-12)
    for g, want in zip(got[1], (g_h, g_w)):
        np.testing.assert_allclose(g, want, rtol=1e-10, atol=1e-12)


@each_target
def test_a_loop_adds_in_place_only_into_a_carried_value_it_owns(target):
    m = module(target)
    rng = np.random.default_rng(6)
    base, idx, values = rng.normal(size=(4, 3)), np.array([1, -1, 1, 0]), rng.normal(size=(4, 3))
    expected = base.copy()
    np.add.at(expected, idx, values)
    # the caller's array starts the loop: a copy is added into
    for layout in (base.copy(), np.asfortranarray(base)):
        np.testing.assert_allclose(m.accumulate(layout, idx, values), expected, rtol=1e-14)
        np.testing.assert_array_equal(layout, base)
    # a value the driver made, read again after the loop: a copy too
    acc, start = m.accumulate_kept(base / 2.0, idx, values)
    np.testing.assert_allclose(start, base, rtol=1e-14)
    np.testing.assert_allclose(acc, expected, rtol=1e-14)
    g = dsl.grad(m.accumulate, wrt=(0, 2))(base, idx, values)
    np.testing.assert_array_equal(g[0], np.ones_like(base))
    np.testing.assert_array_equal(g[1], np.ones_like(values))


def test_a_gathers_gradient_added_to_another_scatters_into_it():
    m = module("cpu")
    rng = np.random.default_rng(7)
    emb, ids = rng.normal(size=(5, 3)), np.array([1, 4, 1, -1])
    grad = dsl.grad(m.table_loss)
    ops = [s.op for s in fuse(grad.ir(emb, ids)) if not isinstance(s, Loop)]
    assert "scatter_add" in ops and "full" not in ops, ops
    counts = np.bincount(ids % 5, minlength=5)[:, None]
    np.testing.assert_allclose(grad(emb, ids), 2 * counts * emb + 2 * emb, rtol=1e-14)


def test_two_gathers_gradients_added_to_another_scatter_into_it():
    # The two gradients summed first are a scatter into a scatter into
    # zeros: that too scatters into the value it is added to (it filled a
    # whole table of zeros, on every trip of a loop, to add two rows).
    m = module("cpu")
    rng = np.random.default_rng(9)
    emb, ids, other = rng.normal(size=(5, 3)), np.array([1, 4, 1, -1]), np.array([[0, 4], [4, 2]])
    grad = dsl.grad(m.table_loss_twice)
    ops = [s.op for s in fuse(grad.ir(emb, ids, other)) if not isinstance(s, Loop)]
    assert ops.count("scatter_add") == 2 and "full" not in ops, ops
    want = 2 * np.bincount(ids % 5, minlength=5)[:, None] * emb + 2 * emb
    np.add.at(want, other, 1 - np.tanh(emb[other]) ** 2)
    np.testing.assert_allclose(grad(emb, ids, other), want, rtol=1e-14)
    tokens, h, w = np.array([2, 0, -1, 2, 3]), rng.normal(size=3), rng.normal(size=(3, 3)) * 0.5
    f = dsl.value_and_grad(m.bigram, wrt=(2, 3))
    args = (tokens, h, emb, w)
    body = last_loop_body(f, args)
    assert "R.full" not in body and body.count("owned=True") == 2, body
    hs = [h]  # and by hand
    for a, b in zip(tokens, tokens[1:]):
        hs.append(np.tanh(hs[-1] @ w + emb[a] * emb[b]))
    g, g_emb, g_w = 2 * hs[-1], np.zeros_like(emb), np.zeros_like(w)
    for k in range(len(tokens) - 2, -1, -1):
        d = g * (1 - hs[k + 1] ** 2)
        g_w += np.outer(hs[k], d)
        g_emb[tokens[k]] += d * emb[tokens[k + 1]]
        g_emb[tokens[k + 1]] += d * emb[tokens[k]]
        g = d @ w.T
    value, (got_emb, got_w) = f(*args)
    np.testing.assert_allclose(value, np.sum(hs[-1] ** 2), rtol=1e-13)
    np.testing.assert_allclose(got_emb, g_emb, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got_w, g_w, rtol=1e-12, atol=1e-14)


def test_zeros_scattered_into_and_returned_stay():
    # `a + scatter_add(z, ...)` scatters into a in place, and z, now read
    # by nothing, went too: the loop body's (carried) and the function's
    # (returned) then had no value (a KeyError compiling them)
    m = module("cpu")
    rng = np.random.default_rng(8)
    a, idx, values = rng.normal(size=(4, 3)), np.array([2, -1, 2]), rng.normal(size=(3, 3))
    summed, z, y = m.zeros_kept(a, idx, values)
    want = a.copy()
    for i, v in zip(idx, values):
        want[i] += v
    want[idx[0]] += values[0]
    np.testing.assert_array_equal(summed, want)
    np.testing.assert_array_equal(z, np.zeros_like(a))
    np.testing.assert_array_equal(y, np.zeros_like(a))


@each_target
def test_embedding_bag(target):
    m = example("embedding", target)
    rng = np.random.default_rng(3)
    table, w = rng.normal(size=(6, 3)), rng.normal(size=3)
    ids, bag = np.array([5, 0, 5, 2, -6]), np.array([0, 0, 2, 1, 2])

    def reference(table, w):
        pooled = np.zeros((3, 3))
        np.add.at(pooled, bag, table[ids])
        return np.sum(np.tanh(pooled @ w))

    np.testing.assert_allclose(m.embedding_bag(table, ids, bag, w, 3), reference(table, w),
                               rtol=1e-12)
    g_table, g_w = dsl.grad(m.embedding_bag, wrt=(0, 3))(table, ids, bag, w, 3)
    np.testing.assert_allclose(g_table, central_difference(reference, [table, w], 0),
                               rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(g_w, central_difference(reference, [table, w], 1),
                               rtol=1e-6, atol=1e-8)


@each_target
def test_segment_pool_and_its_gather_gradient(target):
    pool = example("segment_pool", target).pool
    rng = np.random.default_rng(4)
    x, seg = rng.normal(size=(6, 2)), np.array([0, 2, 2, 1, 0, 2])
    expected = np.zeros((4, 2))
    np.add.at(expected, seg, x)
    np.testing.assert_allclose(pool(x, seg, 4), expected, rtol=1e-12)
    ct = rng.normal(size=(4, 2))
    out, pullback = dsl.vjp(pool, x, seg, 4)
    np.testing.assert_allclose(out, expected, rtol=1e-12)
    np.testing.assert_allclose(pullback(ct)[0], ct[seg], rtol=1e-12)


@each_target
def test_segment_count_given_at_run_time(target):
    # A run-time integer used as a size: each value gets its program, as
    # for a const argument, through calls, gradients and vjp.
    f = module(target).segments_counted
    rng = np.random.default_rng(6)
    values, seg = rng.normal(size=(5, 2)), np.array([0, 3, 3, 1, -1])

    def reference(values, m):
        out = np.zeros((m, 2))
        np.add.at(out, seg, values)
        return np.sum(out ** 2)

    for m in (4, 6):
        np.testing.assert_allclose(f(values, seg, np.int64(m)), reference(values, m),
                                   rtol=1e-12)
        np.testing.assert_allclose(dsl.grad(f)(values, seg, m),
                                   central_difference(reference, [values, m], 0), rtol=1e-6)
    out, pullback = dsl.vjp(f, values, seg, 5)
    np.testing.assert_allclose(out, reference(values, 5), rtol=1e-12)


def test_segment_count_at_run_time_cannot_be_compiled_ahead(tmp_path):
    from dsl.aot import compile_module
    source = tmp_path / "pool.grad"
    source.write_text("def pool(x, seg, m: i64):\n    return segment_sum(x, seg, m)\n")
    with pytest.raises(dsl.GradError, match="declare it `m: const i64`"):
        compile_module(str(source), str(tmp_path / "out"), ["pool(f64[:], i64[:], i64)"])


# ------------------------------------------------------------ errors


@each_target
@settings(max_examples=6, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**31))
def test_one_dimensional_scatters_and_segment_sums_match_numpy(target, data, seed):
    # one row of single elements (the runtime's flat scatter on the CPU)
    m = module(target)
    rng = np.random.default_rng(seed)
    idx = data.draw(indices(6, 40))  # negative ones too
    values, base = rng.normal(size=40), rng.normal(size=6)
    expected = base.copy()
    np.add.at(expected, idx, values)
    np.testing.assert_allclose(m.scatter(base, idx, values), expected, rtol=1e-12, atol=1e-15)
    seg = np.abs(idx) % 4
    np.testing.assert_allclose(m.segments(values, seg, 4), np.bincount(seg, values, 4),
                               rtol=1e-12, atol=1e-15)
    g = dsl.grad(m.segments_counted)(values, seg, 4)  # sum(segment_sum(...) ** 2)
    np.testing.assert_allclose(g, 2 * np.bincount(seg, values, 4)[seg], rtol=1e-12)
    for bad in (6, -7):
        with pytest.raises(dsl.ArgumentError, match=f"index {bad} in 'idx'"):
            m.scatter(base, np.array([0, bad, 1]), values[:3])


@each_target
def test_out_of_range_index_is_an_argument_error_naming_it(target):
    m = example("embedding", target)
    table = np.ones((5, 3))
    for bad in (5, -6, 1 << 40):
        with pytest.raises(dsl.ArgumentError) as info:
            m.embed(table, np.array([0, bad, 1]))
        text = str(info.value)
        assert f"index {bad} in 'ids'" in text and "axis of size 5" in text, text
        with pytest.raises(dsl.ArgumentError, match=f"index {bad} in 'ids'"):
            dsl.grad(m.embed)(table, np.array([bad]))
    with pytest.raises(dsl.ArgumentError, match="index 3 in 'labels'"):
        example("cross_entropy", target).pick(np.zeros((2, 3)), np.array([0, 3]))
    with pytest.raises(dsl.ArgumentError, match="index 4 in 'seg'"):
        example("segment_pool", target).pool(np.zeros((2, 1)), np.array([0, 4]), 4)
    with pytest.raises(dsl.ArgumentError, match="index -5 in 'i'"):
        module(target).row(np.zeros((4, 2)), np.int64(-5))
    with pytest.raises(dsl.ArgumentError, match="index 7 in 'idx'"):
        module(target).gather(np.zeros((3, 0)), np.array([0, 7]))  # nothing to read
    with pytest.raises(dsl.ArgumentError, match="index 4 in 'idx'"):
        module(target).scatter(np.zeros((3, 0)), np.array([4]), np.zeros((1, 0)))
    with pytest.raises(dsl.ArgumentError,
                       match=r"^indexing\.grad:5:12: error: index -3 is out of range"):
        module(target).col(np.zeros((4, 2)), np.int64(-2))


def test_a_const_index_out_of_range_is_an_argument_error_naming_it():
    # `x[i]` for `i: const i64` selects when compiled: out of range it was a
    # GradError ("index 3 is out of range for axis 1 of size 3"), not the
    # caller's ArgumentError naming 'i' that the same index gets at run time
    # (and `x[::k]` for k = 0 "slice step cannot be zero", a GradError too)
    m = dsl.loads("def f(x, i: const i64):\n    return x[:, i]\n"
                  "def g(x):\n    return x[:, 3]\n", "const.grad")
    for i in (3, -4):
        with pytest.raises(dsl.ArgumentError) as info:
            m.f(np.zeros((2, 3)), i)
        err = info.value
        assert err.message == (f"index {i} in 'i' is out of range for an axis of size 3 "
                               "(valid: -3 to 2)"), str(err)
        assert (err.line, err.col) == (2, 17)
    np.testing.assert_array_equal(m.f(np.arange(6.0).reshape(2, 3), -3), [0.0, 3.0])
    # a literal index is still an error in the source
    with pytest.raises(dsl.GradError) as info:
        m.g(np.zeros((2, 3)))
    assert not isinstance(info.value, dsl.ArgumentError)
    assert info.value.message == "index 3 is out of range for axis 1 of size 3"
    # and so is a slice's step of 0: the argument's, or the source's
    m = dsl.loads("def f(x, k: const i64):\n    return x[::k]\n"
                  "def g(x):\n    return x[::0]\n", "step.grad")
    with pytest.raises(dsl.ArgumentError) as info:
        m.f(np.zeros(3), 0)
    assert info.value.message == "slice step cannot be zero (the value of argument 'k')"
    assert (info.value.line, info.value.col) == (2, 14)
    with pytest.raises(dsl.GradError) as info:
        m.g(np.zeros(3))
    assert not isinstance(info.value, dsl.ArgumentError)
    assert info.value.message == "slice step cannot be zero"


@each_target
def test_an_index_in_the_branch_not_taken_is_no_error(target):
    # Both branches of a runtime if run: x[i + 1] at the last trip, and the
    # else branch's index (-6 at the first), were ArgumentErrors, though
    # the branch that reads them is not taken (Python, NumPy and jax run it)
    m = module(target)
    x = np.array([0.3, 0.7, -0.2, 1.1])

    def neighbours(x):
        return np.sum(x[1:] * x[:-1]) + 2.0 * x[-1]

    assert m.neighbours(x, 4) == pytest.approx(neighbours(x), rel=1e-12)
    np.testing.assert_allclose(dsl.grad(m.neighbours)(x, 4),
                               central_difference(neighbours, [x], 0), rtol=1e-8)
    t = np.array([1.0, -2.0, 0.5, 3.0])
    _, tangent = dsl.jvp(m.neighbours, (x, 4), (t, None))
    assert tangent == pytest.approx(central_difference(neighbours, [x], 0) @ t, rel=1e-8)
    # the branch taken still checks its index
    with pytest.raises(dsl.ArgumentError, match="index 4 is out of range"):
        m.neighbours(x, 5)


@pytest.mark.parametrize("source,line,col,text", [
    ("def f(x, idx: f64[n]):\n    return x[idx]\n", 2, 14,
     "an index must be an integer array (i32 or i64), but 'idx' is declared f64"),
    ("def f(x, idx: bool[n]):\n    return take(x, idx)\n", 2, 20, "is declared bool"),
])
def test_non_integer_index_parameter_is_an_error_at_load(source, line, col, text):
    with pytest.raises(dsl.GradError) as info:
        dsl.loads(source, "bad.grad")
    err = info.value
    assert (err.line, err.col) == (line, col) and text in err.message, str(err)
    assert str(err).splitlines()[-1].strip() == "^" * len("idx")


@pytest.mark.parametrize("source,args,line,col,text", [
    ("def f(x, idx):\n    return x[idx]\n", (np.zeros(3), np.zeros(2)), 2, 14,
     "an index must be an integer array (i32 or i64), not f64"),
    ("def f(x, i):\n    return x[0.5 * i]\n", (np.zeros(3), np.int64(1)), 2, 14,
     "not f64"),
    # a Python int for an unannotated parameter is a float: the message says so
    ("def f(x, i):\n    return x[i]\n", (np.zeros(3), 1), 2, 14,
     "not f64 ('i' is f64 here: a Python number passed for an unannotated parameter is "
     "a float; annotate it `i: i64`)"),
    ("def f(x, i):\n    return x[i]\n", (np.zeros(3, np.float32), 1), 2, 14,
     "not f32 ('i' is f32 here: a Python number passed"),
    # and a list of ints holds floats: said nothing of why
    ("def f(x, ids):\n    return take(x, ids)\n", (np.zeros(3), [0, 2]), 2, 12,
     "not f64 ('ids' is f64 here: a Python list or tuple passed for an unannotated parameter "
     "holds floats; pass a NumPy integer array, or annotate it `ids: i64[...]`)"),
    ("def f(v, seg, m):\n    return segment_sum(v, seg, m)\n",
     (np.zeros(3), np.zeros(3, np.int64), 2), 2, 12, "('m' is f64 here"),
    ("def f(x, idx):\n    return take_along_axis(x, idx, axis=0)\n",
     (np.zeros((3, 2)), np.zeros((2, 3), np.int64)), 2, 12, "does not fit an array"),
    # one label per row, of the wrong count: the shape given, not [2, 1]
    ("def f(x, idx):\n    return take_along_axis(x, idx, axis=1)\n",
     (np.zeros((3, 2)), np.zeros(2, np.int64)), 2, 12, "an index of shape [2] does not fit "
     "an array of shape [3, 2] along axis 1: one index per lane needs the array's shape "
     "without that axis, [3]"),
    ("def f(x, idx):\n    return x[idx, 0]\n", (np.zeros((3, 2)), np.zeros(2, np.int64)),
     2, 14, "only be combined with slices"),
    ("def f(b, idx, v):\n    return scatter_add(b, idx, v)\n",
     (np.zeros((3, 2)), np.zeros(2, np.int64), np.zeros((3, 2))), 2, 12,
     "expected shape [2, 2]"),
    ("def f(v, seg, m: i64):\n    return segment_sum(v, seg, sum(seg) + m)\n",
     (np.zeros(3), np.zeros(3, np.int64), np.int64(2)), 2, 12, "num_segments must be known"),
    ("def f(b, idx, v):\n    return scatter_add(b, idx, v)\n",
     (np.zeros(3, np.int64), np.zeros(2, np.int64), np.ones(2)), 2, 12,
     "f64 values into a i64 array"),
    # a mask's shape would depend on its values: the message says what to write
    ("def f(x):\n    return x[x > 0.0]\n", (np.zeros(3),), 2, 14,
     "a mask cannot index: the result's shape would depend on the mask's values; keep the "
     "shape with where(mask, x, 0.0), or sum what the mask selects with sum(where(mask, x, "
     "0.0))"),
    ("def f(x):\n    return take(x, x > 0.0)\n", (np.zeros(3),), 2, 12, "a mask cannot index"),
    ("def f(x):\n    return x[[True, False, True]]\n", (np.zeros(3),), 2, 14,
     "a list of bools is a mask, and a mask cannot index"),
    ("def f(x):\n    return x[[]]\n", (np.zeros(3),), 2, 14, "an empty list selects nothing"),
    ("def f(x):\n    return x[[0.5]]\n", (np.zeros(3),), 2, 14, "integer array (i32 or i64), "
     "not f64"),
    ("def f(x, idx):\n    return take(x, idx, axis=2)\n",
     (np.zeros((3, 2)), np.zeros(2, np.int64)), 2, 30, "axis 2 is out of range"),  # (at it)
    # a slice at a loop's index: it said only "expected a compile-time integer"
    ("def f(x):\n    s = 0.0\n    for i in range(2):\n        s = s + sum(x[i:i + 2])\n"
     "    return s\n", (np.zeros(4),), 4, 23, "known only at run time (a loop's index, an "
     "argument): gather a window of fixed length at a run-time start with take(x, i + "
     "arange(n), axis)"),
    # a slice's length an integer argument: the hint fitted only a window
    ("def f(x, k: i64):\n    return x[:k]\n", (np.zeros(4), 2), 2, 15,
     "for a bound that is an argument (x[:k]), declare it `k: const i64`"),
])
def test_bad_indices_are_errors_at_their_source(source, args, line, col, text):
    m = dsl.loads(source, "bad.grad")
    with pytest.raises(dsl.GradError) as info:
        m.f(*args)
    err = info.value
    assert not isinstance(err, dsl.ArgumentError)
    assert (err.line, err.col) == (line, col) and text in err.message, str(err)
    assert "^" in str(err).splitlines()[-1]


def test_a_float_local_as_an_index_is_not_said_to_want_an_annotation():
    # the hint for a Python number named the local: "annotate it `k: i64`"
    m = dsl.loads("def f(x, i):\n    k = i * 1.0\n    return x[k]\n", "bad.grad")
    with pytest.raises(dsl.GradError) as info:
        m.f(np.zeros(3), 1)
    assert (info.value.line, info.value.col) == (3, 14)
    assert info.value.message == "an index must be an integer array (i32 or i64), not f64"


def test_cpu_kernels_on_larger_arrays_with_repeated_indices():
    # Past the sizes the source-level tests use, indices heavily repeated,
    # every kernel of the CPU target against NumPy.
    from gradlang.runtime import cpu as R
    rng = np.random.default_rng(5)
    table, ids = rng.normal(size=(50, 40)), rng.integers(-50, 50, size=2000)
    np.testing.assert_array_equal(R.take(table, ids, 0, "ids"), table[ids])
    rows = rng.normal(size=(2000, 40))
    expected = np.zeros_like(table)
    np.add.at(expected, ids, rows)
    np.testing.assert_allclose(R.scatter_add(np.zeros_like(table), ids, rows, 0, "ids"),
                               expected, rtol=1e-12)
    picks = rng.integers(-40, 40, size=(50, 800))
    np.testing.assert_array_equal(R.take_along_axis(table, picks, 1, "picks"),
                                  np.take_along_axis(table, picks, 1))
    values = rng.normal(size=picks.shape)
    expected = np.zeros_like(table)
    np.add.at(expected, (np.arange(50)[:, None], picks), values)
    np.testing.assert_allclose(R.scatter_add_along_axis(np.zeros_like(table), picks, values, 1,
                                                        "picks"), expected, rtol=1e-12)
    seg, flat_values = rng.integers(0, 7, size=40000), rng.normal(size=40000)
    np.testing.assert_allclose(R.scatter_add(np.zeros(7), seg, flat_values, 0, "seg"),
                               np.bincount(seg, flat_values, minlength=7), rtol=1e-12)



def test_a_read_only_and_a_writable_index_share_one_compiled_gather():
    # Numba compiles once per readonly-ness of each argument: a user's
    # read-only index array (a JAX array's NumPy view) compiled the
    # along-axis helpers a second time
    # (a compiled loop calls them too, with arrays of its own: compiled once more)
    from gradlang.runtime import cpu, cpu_math
    m = module("cpu")
    x, picks = np.arange(15.0).reshape(5, 3), np.array([[0, -1]] * 5)
    frozen = picks.copy()
    frozen.flags.writeable = False
    want = np.zeros((5, 3))
    want[:, 0], want[:, 2] = x[:, 0], x[:, 1]
    helpers = (cpu_math.gather_along, cpu_math.scatter_along)
    for idx in (picks, frozen):
        np.testing.assert_array_equal(m.along(x, idx), np.take_along_axis(x, picks, 1))
        added = cpu.scatter_add_along_axis(np.zeros((5, 3)), idx, x[:, :2], 1, "idx")
        np.testing.assert_array_equal(added, want)
        if idx is picks:
            compiled = [list(helper.signatures) for helper in helpers]
    assert [list(helper.signatures) for helper in helpers] == compiled
