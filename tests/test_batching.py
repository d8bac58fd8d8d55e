"""`compiler.batching.split_rows` alone (no Dask): the block function run on
each half of the rows by the IR interpreter, its partials merged, and the
combine function give the in-memory results; row-mixing functions are a
`GradError` at the op."""
import numpy as np
import pytest

import dsl
from gradlang.compiler.batching import BATCH, split_rows
from gradlang.compiler.interpret import interpret
from gradlang.compiler.ir import TensorType
from helpers import load_example

MERGE = {"sum": np.add, "max": np.maximum}


def run_split(fn, n, arrays, batch, pieces=2):
    """fn's outputs computed through its split, the rows in `pieces` blocks."""
    split = split_rows(fn, n)
    parts, rows = None, []
    for block in np.array_split(np.arange(n), pieces):
        args = [a[block] if i in batch else a for i, a in enumerate(arrays)]
        outs = interpret(split.block, *args)
        n_rows = sum(split.row_outputs)
        rows.append(outs[:n_rows])
        block_parts = outs[n_rows:]
        parts = block_parts if parts is None else [
            MERGE[k](a, b) for k, a, b in zip(split.partial_kinds, parts, block_parts)]
    fixed = [a for i, a in enumerate(arrays) if i not in batch]
    others = iter(interpret(split.combine, *fixed, *(parts or [])))
    row_outs = iter([np.concatenate(r) for r in zip(*rows)])
    return [next(row_outs) if r else next(others) for r in split.row_outputs], split


def test_logistic_value_and_gradients_through_the_split():
    rng = np.random.default_rng(0)
    x, y, w = rng.normal(size=(7, 3)), np.sign(rng.normal(size=7)), rng.normal(size=3)
    g = dsl.value_and_grad(load_example("logistic").loss, wrt=(0, 2))
    types = {"x": TensorType("f64", (BATCH, 3)), "y": TensorType("f64", (BATCH,)),
             "w": TensorType("f64", (3,))}
    outs, split = run_split(g.lower(types), 7, [x, y, w], batch={0, 1})
    assert split.row_outputs == (False, True, False)  # value, d/dx by rows, d/dw summed
    assert split.partial_kinds == ("sum", "sum") and not split.elementwise
    value, (gx, gw) = g(x, y, w)
    np.testing.assert_allclose(outs[0], value, rtol=1e-12)  # a mean over all 7 rows
    np.testing.assert_allclose(outs[1], gx, rtol=1e-12)
    np.testing.assert_allclose(outs[2], gw, rtol=1e-12)


def test_max_over_the_batch_combines_by_max_and_elementwise_is_recognised():
    m = dsl.loads("def f(x):\n    return max(x, axis=0) * 2\n\ndef e(x):\n    return x * x\n")
    x = np.random.default_rng(1).normal(size=(6, 2))
    t = {"x": TensorType("f64", (BATCH, 2))}
    outs, split = run_split(m.f.lower(t), 6, [x], batch={0}, pieces=3)
    assert split.partial_kinds == ("max",)
    np.testing.assert_array_equal(outs[0], 2 * x.max(axis=0))
    assert split_rows(m.e.lower(t), 6).elementwise


def test_a_reduction_over_axes_stacked_before_the_rows_is_row_by_row():
    # (max_pool2d's windows, stacked along a new first axis) the batch axis
    # moves from 1 back to 0: it was "moves data between the rows", as a
    # reduction whose output's batch axis is not its input's
    m = dsl.loads("def f(x):\n    s = stack([x, x * -2.0, x + 1.0])\n"
                  "    return max(s, axis=0) + sum(s, axis=0)\n")
    x = np.random.default_rng(2).normal(size=(6, 2))
    g = dsl.value_and_grad(m.f)
    outs, split = run_split(g.lower({"x": TensorType("f64", (BATCH, 2))}), 6, [x], batch={0},
                            pieces=3)
    value, gx = g(x)
    np.testing.assert_array_equal(outs[0], value)
    np.testing.assert_array_equal(outs[1], gx)
    assert split.row_outputs == (True, True) and not split.partial_kinds


@pytest.mark.parametrize("body", ["x - mean(x, axis=0)", "x / sum(x * x)", "x @ x.T"])
def test_row_mixing_is_a_grad_error_at_the_op(body):
    source = f"def f(x):\n    return {body}\n"
    m = dsl.loads(source, "mix.grad")
    with pytest.raises(dsl.GradError) as info:
        split_rows(m.f.lower({"x": TensorType("f64", (BATCH, 2))}), 6)
    # named as the source wrote it once its source is attached (the IR's op,
    # `sub`, `div`, `matmul`, is no user's name); "an operation" until then
    assert str(info.value).startswith("mix.grad:2:12: error: an operation "), str(info.value)
    assert str(info.value.with_source(source)).startswith(f"mix.grad:2:12: error: `{body}` ")
