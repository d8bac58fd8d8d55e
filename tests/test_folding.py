"""Fewer, larger kernels: exact ops on constants fold at compile time to the
bits a kernel computes, a constant is never a kernel's work, a one-element
tail of exact ops (a mean's division) runs in the driver, a loop contained
in a larger one runs as its kernel, and a sum of a loop's sum is the
loop's."""
import itertools
import re
import warnings

import numpy as np
import pytest

import dsl
from dsl.cli import main
from gradlang.compiler.builder import Builder
from gradlang.compiler.fusion import Loop, fuse
from gradlang.compiler.interpret import interpret
from gradlang.compiler.ir import NUMPY_DTYPES, Eqn, TensorType, Var
from gradlang.compiler.ops import OPS, fold
from gradlang.compiler.passes import dce, simplify
from gradlang.compiler.pipeline import build, optimize
from helpers import EXAMPLES, central_difference, load_example

SPECIAL = [0.0, -0.0, 1.0, -1.5, 3.0, 1e-310, 1e308, -1e308, np.inf, -np.inf, np.nan]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "lt", "le", "gt", "ge", "eq", "ne"]
UNARY = ["neg", "abs", "sign"]


def kernels_of(f, *args) -> tuple[str, ...]:
    return f.program(f.bind(args, {})).generated.kernel_names


def same_bits(a, b) -> bool:
    """Equal as stored: NaN equals NaN, and 0.0 is not -0.0."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind != "f":
        return np.array_equal(a, b)
    return bool(np.all((a == b) & (np.signbit(a) == np.signbit(b)) | np.isnan(a) & np.isnan(b)))


# ---------------------------------------------------------------- counts


def test_dense_loss_value_and_grad_is_one_kernel():
    # the mean's 1 / n is worked out before the loop, which reads it as a
    # scalar; its division of the sum runs in the driver
    m = load_example("dense")
    rng = np.random.default_rng(0)
    x, w, b, t = rng.normal(size=(8, 4)), rng.normal(size=(4, 3)), rng.normal(size=3), \
        rng.normal(size=(8, 3))
    vg = dsl.value_and_grad(m.loss, wrt=(0, 1, 2))
    assert len(kernels_of(vg, x, w, b, t)) == 1

    def reference(x, w, b):
        return np.mean(np.sum((np.logaddexp(0, x @ w + b) - t) ** 2, axis=1))

    value, grads = vg(x, w, b, t)
    np.testing.assert_allclose(value, reference(x, w, b), rtol=1e-12)
    for k, g in enumerate(grads):
        np.testing.assert_allclose(g, central_difference(reference, [x, w, b], k),
                                   rtol=1e-5, atol=1e-7)


def test_dense_loss_at_fixed_sizes_is_one_kernel(capsys):
    # 1 / 8 folds; its reshapes and broadcasts fold with it (they were a
    # kernel computing 1 / 8 and a fill kernel)
    assert main(["show", str(EXAMPLES / "dense.grad"), "--fn", "loss", "--emit", "grad-kernels",
                 "--sig", "loss(f64[8,4], f64[4,3], f64[3], f64[8,3])"]) == 0
    driver = capsys.readouterr().out.split("def run(")[1]
    assert len(set(re.findall(r"K\.(k_[0-9a-f]+)", driver))) == 1
    assert "np.float64(8.0)" in driver  # the mean's division, in the driver


@pytest.mark.parametrize("transform", [dsl.value_and_grad, dsl.grad])
def test_checkpoint_plain_gradient_is_two_kernels(transform):
    # forward: tanh and its slope per layer; backward: the accumulation of
    # w's gradient and the next cotangent per layer; the first backward
    # step (no accumulation yet) and the last (no cotangent left) share
    # the backward kernel.  The gradient alone leaves the last layer's h
    # unread: its forward kernel computes the slope only.
    m = load_example("checkpoint")
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(4, 4)), rng.normal(size=(4, 4)) / 2
    f = transform(m.plain, wrt=(0, 1))
    names = kernels_of(f, x, w)
    assert len(names) >= 39 and len(set(names)) == (2 if transform is dsl.value_and_grad else 3)
    grads = f(x, w)[1] if transform is dsl.value_and_grad else f(x, w)

    def reference(x, w):
        h = x
        for _ in range(20):
            h = np.tanh(h @ w)
        return h

    for k, g in enumerate(grads):
        np.testing.assert_allclose(g, central_difference(reference, [x, w], k),
                                   rtol=1e-6, atol=1e-9)
    if transform is dsl.grad:  # w's gradient comes from a shared kernel, into out=
        bufs = (np.empty((4, 4)), np.empty((4, 4)))
        f(x, w, out=bufs)
        assert all(same_bits(a, b) for a, b in zip(bufs, grads))


def test_a_loop_shares_the_kernel_of_a_larger_one_that_contains_it():
    m = dsl.loads("def f(x, w):\n    a = x * w\n    b = a @ w\n    return b + x, b * w\n"
                  "\ndef g(x, w):\n    a = x * w\n    b = a @ w\n    return exp(b) * w\n")
    rng = np.random.default_rng(2)
    x, w = rng.normal(size=(3, 3)), rng.normal(size=(3, 3))
    # x * w runs as the kernel of (b + x, b * w), its add on scratch
    assert len(kernels_of(m.f, x, w)) == 2 and len(set(kernels_of(m.f, x, w))) == 1
    first, second = m.f(x, w)
    b = (x * w) @ w
    np.testing.assert_array_equal(first, b + x)
    np.testing.assert_array_equal(second, b * w)
    bufs = (np.empty((3, 3)), np.empty((3, 3)))
    assert all(a is b for a, b in zip(m.f(x, w, out=bufs), bufs, strict=True))
    np.testing.assert_array_equal(bufs[0], b + x)
    np.testing.assert_array_equal(bufs[1], b * w)
    # ... but not as one that would also compute exp on scratch
    assert len(set(kernels_of(m.g, x, w))) == 2
    np.testing.assert_allclose(m.g(x, w), np.exp(b) * w, rtol=1e-13)


# --------------------------------------------------- folding, bit for bit


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_folding_gives_the_kernels_bits(dtype):
    # each exact op compiled as one loop over every pair of special values,
    # against `fold` on the same pair
    pairs = [(a, b) for a in SPECIAL for b in SPECIAL]
    np_type = NUMPY_DTYPES[dtype]
    with np.errstate(all="ignore"):
        x = np.array([a for a, _ in pairs], np_type)
        y = np.array([b for _, b in pairs], np_type)
    bld = Builder()
    xv, yv = (Var(TensorType(dtype, x.shape), n) for n in "xy")
    outs = [bld.bind(op, xv, yv) for op in BINARY] + [bld.bind(op, xv) for op in UNARY]
    outs.append(bld.bind("where", bld.bind("lt", xv, yv), xv, yv))
    other = "f64" if dtype == "f32" else "f32"
    outs.append(bld.bind("cast", xv, dtype=other))
    fn = bld.function("ops", [xv, yv], outs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        results = build(fn)(x, y)
    names = BINARY + UNARY + ["where", "cast"]
    for name, result in zip(names, results):
        out_dtype = "bool" if name in ("lt", "le", "gt", "ge", "eq", "ne") else \
            other if name == "cast" else dtype
        for i, (a, b) in enumerate(zip(x.tolist(), y.tolist())):
            if name in UNARY or name == "cast":
                args, types = [a], [dtype]
            elif name == "where":
                args, types = [bool(np_type(a) < np_type(b)), a, b], ["bool", dtype, dtype]
            else:
                args, types = [a, b], [dtype, dtype]
            folded = fold(name, args, types, out_dtype)
            assert same_bits(folded, result[i]), (name, a, b, folded, result[i])


def test_integer_folding_wraps_like_the_kernel():
    big = np.iinfo(np.int32).max
    assert fold("add", [big, 1], ["i32", "i32"], "i32") == -2 ** 31
    assert fold("mul", [big, 2], ["i32", "i32"], "i32") == -2
    assert fold("neg", [-2 ** 31], ["i32"], "i32") == -2 ** 31


def test_casts_a_kernel_cannot_convert_are_left_to_it():
    assert fold("cast", [np.nan], ["f64"], "i32") is None
    assert fold("cast", [3e9], ["f64"], "i32") is None
    assert fold("cast", [-2.5], ["f64"], "i32") == -2
    assert fold("cast", [1e300], ["f64"], "f32") == np.inf


def test_math_functions_do_not_fold():
    # their kernel values come from the target's math module
    assert not OPS["exp"].exact and fold("exp", [1.0], ["f64"], "f64") is None
    assert not any(OPS[op].exact for op in ("log", "tanh", "pow", "sqrt", "sigmoid"))


# ------------------------------------------------- folding in programs


def constant_program(dtype: str):
    """f(x) = x + c, where c = (1 / 0 - 1 / 0) made of fills, and two more
    outputs of constants only: 1 / 0 (inf) and maximum(NaN, 1)."""
    b = Builder()
    x = Var(TensorType(dtype, (3,)), "x")
    one, zero = (b.bind("full", value=v, shape=(), dtype=dtype) for v in (1, 0))
    inf = b.bind("div", one, zero)
    nan = b.bind("sub", inf, inf)
    big = b.bind("maximum", b.bind("full", value=float("nan"), shape=(2,), dtype=dtype),
                 b.lit(1, dtype))
    return b.function("f", [x], [b.bind("add", x, nan), inf, big])


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_constants_fold_to_fills_with_no_warning(dtype):
    fn = constant_program(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NumPy's divide and invalid warnings
        folded = optimize(fn)
        program = build(fn)
        shifted, inf, nan = program(np.arange(3, dtype=NUMPY_DTYPES[dtype]))
    assert [e.op for e in folded.eqns if e.op != "full"] == ["add"]
    assert np.isnan(shifted).all() and shifted.dtype == NUMPY_DTYPES[dtype]
    assert inf == np.inf and inf.dtype == NUMPY_DTYPES[dtype] and inf.shape == ()
    assert np.isnan(nan).all() and nan.shape == (2,)
    # the fills are the driver's (np.full), not kernels: one loop, x + NaN
    assert len(program.generated.kernel_names) == 1


def test_simplify_folds_a_reshaped_and_broadcast_quotient():
    b = Builder()
    x = Var(TensorType("f64", (4, 2)), "x")
    q = b.bind("div", b.bind("full", value=1, shape=(), dtype="f64"), b.lit(8.0, "f64"))
    spread = b.bind("broadcast_to", b.bind("reshape", q, shape=(1, 1)), shape=(4, 2))
    fn = simplify(b.function("f", [x], [b.bind("mul", spread, x)]))
    full = [e for e in fn.eqns if e.op == "full" and e.out.type.shape == (4, 2)]
    assert full and full[0].p["value"] == 0.125
    np.testing.assert_array_equal(build(fn)(np.ones((4, 2)))[0], np.full((4, 2), 0.125))


def test_a_stacks_gradient_of_ones_is_a_constant_not_a_kernel_of_every_slice():
    # a stack's gradient slices its cotangent, ones for a sum: each slice
    # of the fill was an argument of one kernel adding them up, and Numba
    # compiles a kernel in time superlinear in its arguments (2000 stacked
    # x: about three minutes); a sliced or transposed fill is now a fill
    m = dsl.loads("def f(x):\n    return sum(stack([x, x, x, transpose(x)[::1]]))\n")
    x = np.arange(4.0).reshape(2, 2)
    gradient = dsl.grad(m.f)
    np.testing.assert_array_equal(gradient(x), np.full((2, 2), 4.0))
    assert kernels_of(gradient, x) == ()


@pytest.mark.parametrize("dtype", ["f64", "i32"])
def test_abs_of_a_negation_and_a_double_negation_drop_the_negations(dtype):
    # log_sigmoid(u) beside log_sigmoid(-u) computed exp(-abs(u)) twice: CSE
    # did not see abs(-u) as abs(u)
    b = Builder()
    x = Var(TensorType(dtype, (6,)), "x")
    minus = b.bind("neg", x)
    fn = dce(simplify(b.function("f", [x], [b.bind("abs", minus), b.bind("neg", minus),
                                            b.bind("abs", x)])))
    assert [e.op for e in fn.eqns] == ["abs", "abs"] and fn.outputs[1] is x
    values = np.array([-2.5, -0.0, 0.0, 3.0, np.inf, np.nan]) if dtype == "f64" else \
        np.array([-7, 0, 1, 2**31 - 1, -2**31, -1], np.int32)
    got = build(fn)(values)
    for result, expected in zip(got, [np.abs(values), values, np.abs(values)]):
        assert same_bits(result, expected)


def test_logical_identities_and_decided_wheres_drop_their_steps():
    # a gradient through both branches of a where(c, ...) had the where-mask
    # c | not c, always true, and selected every element by it
    b = Builder()
    x = Var(TensorType("f64", (len(SPECIAL),)), "x")
    y = Var(TensorType("f64", (len(SPECIAL),)), "y")
    one = Var(TensorType("f64", (1,)), "one")
    c = b.bind("gt", x, b.lit(0.0, "f64"))
    not_c = b.bind("logical_not", c)
    true, false = b.lit(True, "bool"), b.lit(False, "bool")
    selected = b.bind("where", c, x, y)
    c_one = b.bind("gt", one, b.lit(0.0, "f64"))
    widened = b.bind("where", c_one, one, x)  # (one's shape: [1])
    outputs = [
        b.bind("where", b.bind("logical_or", c, not_c), x, y),      # x
        b.bind("where", b.bind("logical_and", not_c, c), x, y),     # y
        b.bind("where", c, y, y),                                   # y
        b.bind("where", b.bind("logical_or", not_c, true), x, y),   # x
        b.bind("where", b.bind("logical_and", c, false), x, y),     # y
        b.bind("logical_not", not_c),                               # c
        b.bind("logical_and", b.bind("logical_or", c, false), c),   # c
        b.bind("logical_or", b.bind("logical_and", true, c), c),    # c
        b.bind("where", not_c, y, x),                               # where(c, x, y)
        b.bind("where", c, b.bind("where", c, x, one), b.bind("where", c, one, y)),  # ditto
        b.bind("where", c_one, widened, one),  # stays: where(c_one, one, one) is [1]
    ]
    fn = b.function("f", [x, y, one], [selected] + outputs)
    simple = dce(simplify(fn))
    assert [e.op for e in simple.eqns] == ["gt", "where", "gt", "where", "where", "where",
                                           "where"]
    c = simple.eqns[0].out
    assert list(simple.outputs[1:9]) == [x, y, y, x, y] + [c] * 3
    assert [e.inputs for e in simple.eqns if e.inputs[0] is c] == [(c, x, y)] * 3
    assert simple.eqns[-1].inputs[1] is simple.eqns[3].out  # (widened kept)
    values = np.array(SPECIAL)
    for u, v, w in [(values, values[::-1], [1.0]), (-values, values, [-0.0])]:
        for got, expected in zip(interpret(simple, u, v, w), interpret(fn, u, v, w)):
            assert same_bits(got, expected)


# A custom gradient through both branches of a where (`h`), and the
# standard library's two that are
BOTH_BRANCHES = """
from std import leaky_relu, log_softmax
def h(x):
    return x * 2
grad(dy):
    return where(x > 0, dy * 2, dy * 3)
def f(x):
    return sum(exp(h(x)))
def leaky(x):
    return sum(exp(leaky_relu(x)))
def log_softmax_of(x, w):
    return sum(log_softmax(x) * w)
def masked(x):
    return sum(where(x > 1, exp(h(x)), 0))
"""


@pytest.fixture(scope="module")
def both_branches():
    return dsl.loads(BOTH_BRANCHES)


def _ops_of(fn) -> list[Eqn]:
    """fn's equations, those in loop bodies too."""
    found = []
    for e in fn.eqns:
        found.append(e)
        if e.op == "loop":
            found += _ops_of(e.p["body"])
    return found


@pytest.mark.parametrize("name", ["f", "masked", "leaky", "log_softmax_of"])
def test_a_gradient_through_both_branches_of_a_where_has_no_always_true_mask(
        both_branches, name):
    f = getattr(both_branches, name)
    rng = np.random.default_rng(0)
    x = np.array([[-1.0, 0.0, -0.0, 0.5, 0.5, 2.0], [0.3, -0.2, 1.5, 1.5, -3.0, 0.1]])
    args = (x, rng.normal(size=x.shape)) if name == "log_softmax_of" else (x[0],)
    gradient = dsl.grad(f)
    eqns = _ops_of(gradient.ir(*args))
    negations = {e.out: e.inputs[0] for e in eqns if e.op == "logical_not"}
    assert not [e for e in eqns if e.op == "logical_or" and (
        negations.get(e.inputs[0]) is e.inputs[1] or negations.get(e.inputs[1]) is e.inputs[0])]
    if name != "log_softmax_of":  # (whose masks of a row's sums stay)
        assert not [e for e in eqns if e.op in ("logical_or", "logical_not")]
    if name in ("f", "masked"):  # (h's block is its own: 3 dy, not 2 dy, at x <= 0)
        expected = np.exp(2 * x[0]) * np.where(x[0] > 0, 2.0, 3.0)
        if name == "masked":
            expected = np.where(x[0] > 1, expected, 0.0)
            # the block's where-mask (x > 1) & (x > 0) | (x > 1) & not (x > 0)
            # is x > 1, by which its result was selected twice in turn
            assert sum(e.op == "where" for e in eqns) == 6
        np.testing.assert_allclose(gradient(*args), expected, rtol=1e-15)
        return
    # away from the kinks at 0 (central differences straddle them)
    smooth = (args[0] + np.where(args[0] == 0, 0.25, 0.0), *args[1:])
    expected = central_difference(f, smooth, 0)
    np.testing.assert_allclose(gradient(*smooth), expected, rtol=1e-6, atol=1e-8)


def test_a_one_element_value_spread_by_turns_is_read_as_a_scalar():
    # sum(x) reshaped to [1], broadcast to [n], reshaped to [n, 1] and
    # broadcast to [n, 3]: one loop reading the sum, no fill kernel
    b = Builder()
    x = Var(TensorType("f64", (5, 3)), "x")
    s = b.bind("reduce_sum", x, axes=(0, 1))
    wide = b.bind("broadcast_to", b.bind("reshape", b.bind(
        "broadcast_to", b.bind("reshape", s, shape=(1,)), shape=(5,)), shape=(5, 1)),
        shape=(5, 3))
    program = build(b.function("f", [x], [b.bind("mul", wide, x)]))
    data = np.arange(15.0).reshape(5, 3)
    np.testing.assert_array_equal(program(data)[0], data.sum() * data)
    assert len(program.generated.kernel_names) == 1


SUMS_OF_BROADCASTS = """
def outer(a, b):
    return sum(a[:, None] * b[None, :])

def spread(x):
    wide = broadcast_to(x, [3, x.shape[0]])
    return sum(wide, axis=1), sum(wide), sum(broadcast_to(x[None, :], [3, x.shape[0]]), axis=0)
"""


def test_a_sum_of_a_broadcast_sums_before_broadcasting():
    # The gradient of sum(a[:, None] * b[None, :]) w.r.t. a summed ones
    # times b over n x m elements, the ones a product's n x m operand
    # (`compiler.matvec`): 20 ms for n = m = 4000.  Now b is summed, once.
    m = dsl.loads(SUMS_OF_BROADCASTS, "broadcasts.grad")
    rng = np.random.default_rng(8)
    a, b = rng.normal(size=5), rng.normal(size=7)
    f = dsl.value_and_grad(m.outer, wrt=(0, 1))
    ir = f.ir(a, b)
    assert not [e for e in ir.eqns if e.op in ("matmul", "full")], ir
    assert [e.out.type.rank for e in ir.eqns if e.op == "mul"] == [2], ir  # the value's alone
    value, (ga, gb) = f(a, b)
    np.testing.assert_allclose(value, a.sum() * b.sum(), rtol=1e-13)
    np.testing.assert_allclose(ga, np.full(5, b.sum()), rtol=1e-13)
    np.testing.assert_allclose(gb, np.full(7, a.sum()), rtol=1e-13)
    # a sum along an axis a broadcast made counts each element that often
    x = rng.normal(size=4)
    per_row, total, per_column = m.spread(x)
    np.testing.assert_allclose(per_row, np.full(3, x.sum()), rtol=1e-13)
    np.testing.assert_allclose(total, 3 * x.sum(), rtol=1e-13)
    np.testing.assert_allclose(per_column, 3 * x, rtol=1e-13)
    np.testing.assert_allclose(dsl.grad(m.spread)(x), np.full(4, 3.0 + 3.0 + 3.0), rtol=1e-13)


# ---------------------------------------------- scalar tails in the driver


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_scalar_tail_runs_in_the_driver_with_the_kernels_bits(dtype):
    # sum(x) / 3 and sum(x) / (sum(x) - sum(x)): no kernel, no warning, inf
    # or NaN as a kernel gives them
    b = Builder()
    x = Var(TensorType(dtype, (7,)), "x")
    s = b.bind("reduce_sum", x, axes=(0,))
    fn = b.function("f", [x], [s, b.bind("div", s, b.lit(3, dtype)),
                               b.bind("div", s, b.bind("sub", s, s))])
    program = build(fn)
    assert program.generated.kernel_names == ()
    t = NUMPY_DTYPES[dtype]
    data = np.linspace(0.1, 0.7, 7).astype(t)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        total, third, over_zero = program(data)
        again = program(data)
    assert third.dtype == t and same_bits(third, t(total) / t(3))
    assert over_zero == np.inf and over_zero.dtype == t
    assert all(same_bits(a, b) for a, b in zip(again, (total, third, over_zero)))
    out = tuple(np.empty((), t) for _ in range(3))
    program.run(data, out=out)
    assert all(same_bits(a, b) for a, b in zip(out, (total, third, over_zero)))



def _one_element_program(dtype: str, seed: int, count: int = 25):
    """`count` random chains of exact ops (selects, round-trip casts too)
    of three one-element arguments, one output each."""
    rng = np.random.default_rng(seed)
    b = Builder()
    params = [Var(TensorType(dtype, (1,)), name) for name in "xyz"]
    arithmetic = ["add", "sub", "mul", "maximum", "minimum"] + (["div"] if dtype[0] == "f"
                                                                else [])
    other = {"f32": "f64", "f64": "f32", "i32": "i64", "i64": "i32"}[dtype]
    outs = []
    for _ in range(count):
        pool = list(params)
        for _ in range(rng.integers(1, 5)):
            a, c = pool[rng.integers(len(pool))], pool[rng.integers(len(pool))]
            kind = rng.random()
            if kind < 0.5:
                pool.append(b.bind(arithmetic[rng.integers(len(arithmetic))], a, c))
            elif kind < 0.7:
                pool.append(b.bind(UNARY[rng.integers(len(UNARY))], a))
            elif kind < 0.85:
                test = BINARY[6 + rng.integers(6)]  # a comparison
                pool.append(b.bind("where", b.bind(test, a, c), a, c))
            else:
                pool.append(b.bind("cast", b.bind("cast", a, dtype=other), dtype=dtype))
        outs.append(pool[-1])
    return b.function("p", params, outs)


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32"])
def test_one_element_tails_in_the_driver_match_their_kernel_bit_for_bit(dtype, monkeypatch):
    from gradlang.runtime.cpu import CpuTarget
    fn = _one_element_program(dtype, seed=7)
    in_driver = build(fn)
    monkeypatch.setattr(CpuTarget, "scalars_in_driver", False)
    in_kernel = build(fn)
    assert in_driver.generated.kernel_names == () and in_kernel.generated.kernel_names
    t = NUMPY_DTYPES[dtype]
    values = SPECIAL if dtype[0] == "f" else [0, 1, -1, 7, 2 ** 31 - 1, -2 ** 31]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("error")
        for x, y, z in itertools.product(values, repeat=3):
            args = [np.array([v], t) for v in (x, y, z)]
            for k, (a, b) in enumerate(zip(in_driver(*args), in_kernel(*args))):
                assert a.dtype == b.dtype and same_bits(a, b), (k, x, y, z, a, b)


# ------------------------------------------------------- sums of sums


def test_a_mean_of_row_sums_is_one_sum_in_the_loop():
    m = load_example("dense")
    x, w, b, t = np.ones((8, 4)), np.ones((4, 3)), np.ones(3), np.zeros((8, 3))
    steps = fuse(dsl.value_and_grad(m.loss).ir(x, w, b, t), reductions=True)
    sums = [r.p["axes"] for s in steps if isinstance(s, Loop) for r in s.reductions]
    assert sums == [(0, 1)]
    assert not any(isinstance(s, Eqn) and s.op == "reduce_sum" for s in steps)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sums_of_sums_match_numpy(dtype):
    m = dsl.loads("def f(x):\n    return mean(sum(x * x, axis=1))\n"
                  "\ndef g(x):\n    s = sum(x * x, axis=1)\n    return sum(s), s\n"
                  "\ndef h(x):\n    return sum(sum(x * x, axis=2), axis=0)\n")
    rng = np.random.default_rng(3)
    x, cube = rng.normal(size=(5, 7)).astype(dtype), rng.normal(size=(2, 3, 4)).astype(dtype)
    rtol = 1e-6 if dtype == np.float32 else 1e-14
    sq = x.astype(np.float64) ** 2
    np.testing.assert_allclose(m.f(x), sq.sum(axis=1).mean(), rtol=rtol)
    total, rows = m.g(x)  # the row sums are an output too: summed apart
    np.testing.assert_allclose(rows, sq.sum(axis=1), rtol=rtol)
    np.testing.assert_allclose(total, sq.sum(), rtol=rtol)
    # axes 2 then 0 are not trailing together: two sums
    np.testing.assert_allclose(m.h(cube), (cube.astype(np.float64) ** 2).sum(axis=(0, 2)),
                               rtol=rtol)


def test_one_sum_of_both_axes_is_the_same_bits_whatever_the_threads(gradc_parallel):
    import numba
    gradc_parallel("always")  # (a busy machine runs the serial kernel, on one thread)
    m = dsl.loads("def f(x):\n    return mean(sum(x * x, axis=1))\n")
    x = np.random.default_rng(4).normal(size=(300, 200))  # the parallel kernel's size
    results = []
    before = numba.get_num_threads()
    try:
        for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(threads)
            results += [m.f(x), m.f(x)]
    finally:
        numba.set_num_threads(before)
    assert all(same_bits(r, results[0]) for r in results)
    np.testing.assert_allclose(results[0], (x * x).sum(axis=1).mean(), rtol=1e-13)


def test_a_one_element_value_spread_to_fewer_axes_keeps_the_ir_well_typed():
    # (1, 1) -> (1,) -> (4,): merged into one broadcast, that broadcast
    # dropped an axis, which the verifier (on in tests) refused
    m = dsl.loads("def f(x, s):\n    return x * broadcast_to(reshape(s, [1]), [4])\n")
    x, s = np.arange(4.0), np.array([[2.5]])
    np.testing.assert_array_equal(m.f(x, s), x * 2.5)
    np.testing.assert_array_equal(dsl.grad(m.f, wrt=1)(x, s), [[np.sum(x)]])


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_adding_a_zero_keeps_numpys_sign_of_zero(dtype):
    # x + 0.0 is 0.0 at x = -0.0 (IEEE's identity of a sum is -0.0), so
    # simplify may drop only `+ -0.0` and `- 0.0`: dropping `x + 0.0` made
    # 1 / (x + 0.0) -inf at -0.0, and (x + 0.0) // 1.0 -0.0
    m = dsl.loads(f"def f(x: {dtype}[n]):\n"
                  "    a, b, c = 1.0 / (x + 0.0), 1.0 / (0.0 + x), 1.0 / (x - -0.0)\n"
                  "    d, e, f = 1.0 / (x + zeros_like(x)), 1.0 / (x + -0.0), 1.0 / (x - 0.0)\n"
                  "    return a, b, c, d, e, f\n")
    x = np.array([-0.0, 0.0, -2.5], NUMPY_DTYPES[dtype])
    with np.errstate(divide="ignore"):
        expected = [1 / (x + 0.0), 1 / (0.0 + x), 1 / (x + 0.0), 1 / (x + 0.0), 1 / x, 1 / x]
    for got, want in zip(m.f(x), expected, strict=True):
        assert got.tobytes() == want.astype(x.dtype).tobytes(), (got, want)


def test_common_subexpressions_tell_a_negative_zero_from_a_zero():
    # 0.0 == -0.0, so a key of values merged x * -0.0 into x * 0.0 (and a
    # fill of -0.0 into one of 0.0): 1 / (x * -0.0) was inf, NumPy's -inf
    m = dsl.loads("def f(x):\n    return 1.0 / (x * 0.0), 1.0 / (x * -0.0), "
                  "zeros_like(x) * 1.0, zeros_like(x) * -1.0\n")
    x = np.array([1.0, 2.0])
    with np.errstate(divide="ignore"):
        expected = (1.0 / (x * 0.0), 1.0 / (x * -0.0), np.zeros(2), np.zeros(2) * -1.0)
    for got, want in zip(m.f(x), expected, strict=True):
        assert got.tobytes() == want.tobytes(), (got, want)
