"""Row loops (`compiler.rows`): a reduction along a contiguous last axis
and the elementwise work on the same rows run as one pass per row, on the
CPU.  Values against NumPy (rows of length 1, broadcast row inputs,
non-contiguous arguments, f32 and f64, NaN and empty rows, six nested
passes at the edges of blocks of rows), gradients,
jvp and vmap through them, parallel blocks of rows, and the attention
benchmark's kernel count.  (`tests/test_examples.py` runs cross_entropy,
whose value and gradient form row loops, and its grad of grad, on the CPU
against the CUDA target, which keeps the separate steps.)"""
from pathlib import Path

import numpy as np
import pytest

import dsl
from gradlang.compiler.fusion import fuse
from gradlang.compiler.rows import RowLoop

from helpers import central_difference

ROOT = Path(__file__).resolve().parent.parent

SOURCE = """
from std import softmax, log_softmax

def family(x):
    return softmax(x, axis=-1), log_softmax(x, axis=-1)

def layer_norm(x, g, b):
    mu = mean(x, axis=-1, keepdims=True)
    c = x - mu
    var = mean(c * c, axis=-1, keepdims=True)
    return c / sqrt(var + 1e-5) * g + b

def soft2(x):
    e = exp(x - max(x, axis=(1, 2), keepdims=True))
    return e / sum(e, axis=(1, 2), keepdims=True)

def top(x):
    return x - max(x, axis=-1, keepdims=True, initial=-1.5)

def loss(x, w):
    return sum(softmax(x, axis=-1) * w)

def part(x, w):
    return sum(softmax(x, axis=-1) * w, axis=(1, 2))

def reread(x, w):
    p = softmax(x, axis=-1)
    return sum(p * sum(p * w) * w, axis=-1)

def unit_sum(x):
    s = sum(x, axis=-1, keepdims=True)
    return x - sum(s, axis=(1, 2), keepdims=True)

def cross_entropy(x, w):
    return -sum(w * log_softmax(x, axis=-1)) / x.shape[0]

def nested(x):
    s = softmax(log_softmax(x, axis=-1), axis=-1)
    return s * sum(s * s, axis=-1, keepdims=True), min(x, axis=-1)
"""

M = dsl.loads(SOURCE)


def np_softmax(x, axes=-1):
    e = np.exp(x - x.max(axis=axes, keepdims=True))
    return e / e.sum(axis=axes, keepdims=True)


def np_layer_norm(x, g, b):
    c = x - x.mean(axis=-1, keepdims=True)
    return c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + 1e-5) * g + b


def row_loops(f, *args):
    return [s for s in fuse(f.ir(*args), reductions=True) if isinstance(s, RowLoop)]


def test_row_loops_form_for_softmax_log_softmax_layer_norm_and_two_axes():
    # catches: the grouping missing a family member (each would fall back to
    # separate passes), or a group over axes that are not trailing
    x = np.ones((3, 4))
    assert len(row_loops(M.family, x)) == 1  # both in one
    (norm,) = row_loops(M.layer_norm, x, np.ones(4), np.ones(4))
    assert len(norm.passes) == 3  # the mean, the variance, the output
    (two,) = row_loops(M.soft2, np.ones((2, 3, 4)))
    assert len(two.rows) == 1 and len(two.shape) == 3


def test_values_match_numpy():
    # catches: a pass indexing the wrong row (i0), a row value read before
    # its pass ends, a value of an earlier pass neither recomputed nor read
    # back, a broadcast row input (g, b) read per row instead of per column
    rng = np.random.default_rng(0)
    big = rng.normal(size=(9, 16)) * 30
    shapes = [big, big[:, :1], big[:, ::3], big.T, big[:1], big.reshape(2, 3, 24)[:, :, 5:]]
    for x in shapes:  # rows of 16, of 1, strided, transposed, one row, 3-d
        soft, lsm = M.family(x)
        np.testing.assert_allclose(soft, np_softmax(x), rtol=1e-12, atol=1e-300)
        want = x - x.max(axis=-1, keepdims=True)
        want = want - np.log(np.exp(want).sum(axis=-1, keepdims=True))
        np.testing.assert_allclose(lsm, want, rtol=1e-12, atol=1e-12)
    g, b = rng.normal(size=16), rng.normal(size=16)
    for x in (big, big[::2]):
        np.testing.assert_allclose(M.layer_norm(x, g, b), np_layer_norm(x, g, b),
                                   rtol=1e-12, atol=1e-12)
    # f32: the sums add in f64, the results are f32 (exp(x - logsumexp) of
    # an x - logsumexp near -36 carries its f32 rounding: 2e-6 relative)
    for x in (big[:, ::2], big[:, :1]):
        x = x.astype(np.float32)
        got = M.family(x)[0]
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, np_softmax(x.astype(np.float64)), rtol=2e-5,
                                   atol=1e-30)


def test_nested_passes_at_the_edges_of_blocks_of_rows():
    # catches: a block of rows (at most 16 rows, 1024 elements) that skips
    # a row where the rows do not fill it (17 rows of 65, 15 rows), or a
    # row longer than a block; in six passes, a value of an earlier pass
    # neither computed again (log_softmax's difference) nor stored and read
    # back (the softmax's exp), or a row's sum read before its pass ends
    (loop,) = row_loops(M.nested, np.ones((2, 3)))
    assert len(loop.passes) == 6 and any(p.reads_back for p in loop.passes)
    rng = np.random.default_rng(4)
    for shape in [(0, 5), (1, 1), (15, 64), (16, 64), (17, 65), (3, 1023), (2, 1025), (1, 5000)]:
        x = rng.normal(size=shape) * 3
        s = np_softmax(np.log(np_softmax(x)))
        got, low = M.nested(x)
        np.testing.assert_allclose(got, s * (s * s).sum(axis=-1, keepdims=True), rtol=1e-12,
                                   atol=1e-300)
        np.testing.assert_array_equal(low, x.min(axis=-1))


def test_nan_infinite_and_empty_rows():
    # catches: a running max that drops a NaN (NumPy's max keeps it), a
    # max's initial value used where the row is not empty, an empty row
    # reaching the kernel where it has no max
    x = np.array([[1.0, np.nan, 2.0], [-np.inf, -np.inf, -np.inf], [3.0, 1.0, -2.0]])
    with np.errstate(invalid="ignore"):
        want = np_softmax(x)
    np.testing.assert_allclose(M.family(x)[0], want)
    np.testing.assert_allclose(M.top(x[2:]), x[2:] - 3.0)
    assert M.top(np.ones((3, 0))).shape == (3, 0)
    low = np.full((2, 3), -4.0)
    np.testing.assert_allclose(M.top(low), low + 1.5)  # initial is in the max
    soft, log_soft = M.family(np.ones((3, 0)))  # std's: empty, as SciPy's
    assert soft.shape == log_soft.shape == (3, 0)
    with pytest.raises(dsl.ArgumentError, match="max/min over an empty axis"):
        M.soft2(np.ones((3, 0, 2)))


def test_gradient_jvp_and_vmap_through_row_loops():
    # catches: the backward's row loop (sum(p * g) then p * (g - s)) or a
    # transform's program reading a row value of the wrong pass
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(4, 5)), rng.normal(size=(4, 5))
    value, gx = dsl.value_and_grad(M.loss)(x, w)
    np.testing.assert_allclose(value, np.sum(np_softmax(x) * w), rtol=1e-13)
    np.testing.assert_allclose(gx, central_difference(lambda a: np.sum(np_softmax(a) * w),
                                                      [x], 0), rtol=1e-6, atol=1e-8)
    assert row_loops(dsl.value_and_grad(M.loss), x, w)
    t = rng.normal(size=x.shape)
    _, (tangent, _) = dsl.jvp(M.family, (x,), (t,))
    p = np_softmax(x)
    np.testing.assert_allclose(tangent, p * (t - np.sum(p * t, axis=-1, keepdims=True)),
                               rtol=1e-12, atol=1e-14)
    batch = rng.normal(size=(3, 4, 5))
    np.testing.assert_allclose(dsl.vmap(M.family)(batch)[1], np.log(np_softmax(batch)),
                               rtol=1e-12, atol=1e-14)


def test_a_sum_over_the_rows_and_more_is_summed_per_row_in_the_row_loop():
    # catches: a total (a loss's sum over every axis) of a row loop's work
    # ending the row loop, so that a softmax's value and gradient ran as
    # three kernels storing exp, p and p * w; the same product twice (CSE
    # blind to p * w = w * p), or its row sums twice; and a reader of the total
    # joining the row loop, which runs before the total exists (a KeyError
    # in the driver)
    rng = np.random.default_rng(4)
    x, w = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3, 4))
    vg = dsl.value_and_grad(M.loss)
    (loop,) = row_loops(vg, x, w)
    # the value's p * w and the gradient's w * p: one product, summed once
    # per row for both (not twice, nor once more over everything)
    assert [len(p.reductions) for p in loop.passes] == [1, 1, 1, 0]
    assert [e.op for e in loop.passes[2].eqns] == ["div", "mul"]
    assert len(vg.program(vg.bind((x, w), {})).generated.kernel_names) == 1
    p = np_softmax(x)
    cases = ((M.loss, lambda a: np.sum(np_softmax(a) * w)),
             (M.part, lambda a: np.sum(np_softmax(a) * w, axis=(1, 2))),
             (M.reread, lambda a: np.sum(np_softmax(a) * np.sum(np_softmax(a) * w) * w,
                                         axis=-1)))
    for f, want in cases:
        value, grad = dsl.value_and_grad(f)(x, w)
        np.testing.assert_allclose(value, want(x), rtol=1e-13)
        np.testing.assert_allclose(grad, central_difference(lambda a: np.sum(want(a)), [x], 0),
                                   rtol=1e-6, atol=1e-9)
    x32 = x.astype(np.float32)
    got = dsl.value_and_grad(M.loss)(x32, w.astype(np.float32))
    assert got[0].dtype == got[1].dtype == np.float32
    np.testing.assert_allclose(got[0], np.sum(p * w), rtol=1e-6)


def test_a_step_reading_only_the_total_leaves_the_gradients_rows_in_the_row_loop():
    # catches: the negation and the division of a loss's total
    # (-sum(w * log_softmax(x)) / n) ending the row loop at them, so that
    # its gradient's rows ran as three kernels storing n x k arrays
    rng = np.random.default_rng(5)
    x, w = rng.normal(size=(3, 4)), rng.uniform(size=(3, 4))
    vg = dsl.value_and_grad(M.cross_entropy)
    assert len(vg.program(vg.bind((x, w), {})).generated.kernel_names) == 1

    def want(a):
        shifted = a - a.max(axis=-1, keepdims=True)
        return -np.sum(w * (shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True)))) / 3

    value, grad = vg(x, w)
    np.testing.assert_allclose(value, want(x), rtol=1e-14)
    np.testing.assert_allclose(grad, central_difference(want, [x], 0), rtol=1e-6, atol=1e-9)


def test_a_row_values_sum_over_axes_of_one_element_is_no_total():
    # catches: a row value's sum over axes of one element (here a row axis
    # and the row's) split as a total, to run after the row loop, while the
    # row loop reads it (a KeyError in the driver)
    x = np.arange(10.0).reshape(2, 1, 5)
    np.testing.assert_array_equal(M.unit_sum(x), x - x.sum(axis=(1, 2), keepdims=True))


def test_attention_runs_two_row_loops_and_no_separate_reductions():
    # catches: the softmax and its gradient falling back to separate passes
    # (loop, reduce_max, loop, reduce_sum, loops: eight kernels before)
    attention = dsl.load(ROOT / "benchmarks" / "attention.grad").attention_loss
    vg = dsl.value_and_grad(attention, wrt=(0, 1, 2))
    q = np.ones((1, 2, 3, 4), np.float32)
    program = vg.program(vg.bind((q, q, q, np.float32(0.5)), {}))
    assert len(program.generated.kernel_names) == 3
    driver = program.generated.driver_source
    assert "R.reduce_max" not in driver and "R.reduce_sum" not in driver


def test_parallel_blocks_of_rows_give_the_serial_bits(gradc_parallel):
    # catches: blocks of rows that skip or repeat rows at a block's edge
    # (rows not a multiple of the block), or one thread's run of blocks
    # starting where the last one's did not end, where a later pass reads
    # back scratch (the softmax's exp, in its gradient's row loop); threads
    # sharing a row value or the scratch, at times (a race)
    rng = np.random.default_rng(3)
    x, g, b = rng.normal(size=(1001, 40)) * 10, rng.normal(size=40), rng.normal(size=40)
    w = rng.normal(size=(1001, 40))
    (loop,) = row_loops(dsl.value_and_grad(M.loss), x, w)
    assert loop.spilled and not set(loop.spilled) & set(loop.outputs)
    results = {}
    for setting in ("never", "always"):
        gradc_parallel(setting)
        results[setting] = M.layer_norm(x, g, b), *dsl.value_and_grad(M.loss)(x, w)
    for serial, parallel in zip(results["never"], results["always"]):
        np.testing.assert_array_equal(parallel, serial)
    norm, value, grad = results["always"]
    np.testing.assert_allclose(norm, np_layer_norm(x, g, b), rtol=1e-12, atol=1e-12)
    p = np_softmax(x)
    np.testing.assert_allclose(value, np.sum(p * w), rtol=1e-12)
    np.testing.assert_allclose(grad, p * (w - np.sum(p * w, axis=-1, keepdims=True)),
                               rtol=1e-10, atol=1e-14)


def test_a_mask_broadcast_along_runs_of_the_axes_joins_the_row_loop():
    # a padding mask (B, 1, 1, T) over attention scores (B, H, T, T): two
    # runs of the loop's axes, which kept the softmax out of a row loop (five
    # steps over whole arrays); it now reads a term per run, once a row
    m = dsl.loads("def f(s, mask, w):\n    z = where(mask, s, -1e30) * w\n"
                  "    e = exp(z - max(z, axis=-1, keepdims=True))\n"
                  "    return e / sum(e, axis=-1, keepdims=True)\n")
    rng = np.random.default_rng(9)
    s = rng.normal(size=(2, 3, 4, 5))
    mask = rng.random(size=(2, 1, 1, 5)) < 0.7
    mask[..., 0] = True  # (no row wholly masked)
    w = rng.normal(size=(1, 3, 1, 1)) + 2.0  # (one value a row, held)
    z = np.where(mask, s, -1e30) * w
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(m.f(s, mask, w), e / e.sum(axis=-1, keepdims=True), rtol=1e-13)
    # (the row loop reads the mask itself: z is not stored for it)
    assert any(v.type.shape[1:3] == (1, 1) for loop in row_loops(m.f, s, mask, w)
               for v in loop.inputs)
    g = dsl.grad(m.f, wrt=(0, 2))(s, mask, w)
    for k, want in enumerate((central_difference(m.f, (s, mask, w), 0),
                              central_difference(m.f, (s, mask, w), 2))):
        np.testing.assert_allclose(g[k], want, rtol=1e-6, atol=1e-9)
