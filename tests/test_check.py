"""The gradient checker: NaN/Inf gradients fail, f32 is checked against
f64, skipped rows say so, the table stays aligned, and `check_gradients`
returns a result that is falsy on failure."""

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest

import dsl
from dsl.check import MAX_ORDER, GradientCheckError, _where_failed
from dsl.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# The seed example of a bad gradient: exp(x) / (1 + exp(x)) is inf / inf
# once exp overflows (x >= 89 in f32, x >= 710 in f64).
NAIVE = "def softplus_naive(x):\n    return log(1 + exp(x))\n"
# d/dx sqrt(x * x) = 2x / (2 sqrt(x * x)) is 0 / 0 at x = 0.
SQRT_SQUARE = "def norm1(x):\n    return sqrt(x * x)\n"
LONG_NAME = "a_function_name_well_over_forty_characters_long"
LONG = f"""def {LONG_NAME}(x):
    e = exp(x)
    return log(1 + e)
grad(dy):
    return dy * (1 - 1 / (1 + e))

def g(x):
    return x * x
"""


def check(tmp_path: Path, name: str, text: str) -> tuple[int, list[str], str]:
    """`gradc check` on a file holding `text`: exit code, stdout lines, stderr."""
    path = tmp_path / name
    path.write_text(text)
    return run_check(path)


def run_check(path: Path) -> tuple[int, list[str], str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["check", str(path)])
    return code, out.getvalue().splitlines(), err.getvalue()


def rows_of(lines: list[str], function: str, dtype: str, wrt: str = "x") -> list[list[str]]:
    cells = [line.split() for line in lines]
    return [c for c in cells if c[:2] == [function, dtype] and c[3] == wrt]


def test_naive_log1pexp_fails_on_its_nan_gradient(tmp_path):
    x = np.array([100.0], np.float32)
    naive = dsl.loads(NAIVE).softplus_naive
    assert np.isnan(dsl.grad(naive)(x)).all()  # the bug the check must see
    code, out, err = check(tmp_path, "naive.grad", NAIVE)
    assert code == 1
    (f32,) = rows_of(out, "softplus_naive", "f32")
    assert f32[2] == "1" and f32[-2:] == ["yes", "FAIL"]
    assert ("error: softplus_naive(): the order-1 gradient w.r.t. x from automatic is NaN/Inf "
            "in f32") in err


def test_sqrt_of_square_fails_on_its_nan_gradient_at_zero(tmp_path):
    norm1 = dsl.loads(SQRT_SQUARE).norm1
    assert np.isnan(dsl.grad(norm1)(np.zeros(3))).all()
    code, out, err = check(tmp_path, "norm1.grad", SQRT_SQUARE)
    assert code == 1
    for dtype in ("f64", "f32"):
        first = [r for r in rows_of(out, "norm1", dtype) if r[2] == "1"]
        assert first and first[0][-2:] == ["yes", "FAIL"]
    assert ("norm1(): the order-1 gradient w.r.t. x from automatic has NaN/Inf where the "
            "function is finite") in err


def test_stable_log1pexp_passes_and_warns_of_its_f32_forward_overflow():
    code, out, err = run_check(EXAMPLES / "log1pexp.grad")
    assert code == 0, err
    (f32,) = rows_of(out, "log1pexp", "f32")
    assert f32[-2:] == ["no", "ok"]
    # log(1 + e) is inf in f32 at x = 100 (e overflows from 89), 100 in f64
    assert (f"{EXAMPLES / 'log1pexp.grad'}: warning: log1pexp(): the value overflows in f32 "
            "where it is finite in f64, at x = 100") in err.splitlines()
    # (a diagnostic's kind, not its text: the checkout's path may hold "error")
    assert ": error:" not in err


# softplus(x @ x + b), summed, with its gradient w.r.t. b written out,
# scaled by k: right at k = 1, 10% off at 0.9.  x and b are annotated f32,
# so differences are taken in f32; at x = b = 10 the value is about 1640
# (f32 rounds it to 1e-4).
F32_BLOCK = """
def f(x: const f32[n, n], b: f32[n], k: const f32):
    z = x @ x + b
    return sum(maximum(z, 0) + log1p(exp(-abs(z))))
grad(dy):
    return dy * sum(sigmoid(z), axis=0) * k
"""


def test_an_f32_annotated_block_is_judged_with_f32_rounding_in_its_differences():
    # The f32 differences' rounding noise (up to 0.03 here) was held to f64's
    # epsilon: the right block failed (max abs err 0.011) at a point
    # `gradc check` samples; at f32's epsilon every direction was rejected.
    f = dsl.loads(F32_BLOCK).f
    x, b = np.full((4, 4), 10.0, np.float32), np.full(4, 10.0, np.float32)
    right, wrong = np.float32(1.0), np.float32(0.9)
    # z = 410 in every element, sigmoid(z) = 1 in f32: d/db_j = 4 (the rows)
    np.testing.assert_array_equal(dsl.grad(f, "b")(x, b, right), [4.0] * 4)
    result = dsl.check_gradients(f, x, b, right, order=1, upstream=False)
    # every direction compared: 3 random and the 4 unit ones; forward, the random
    assert [(r.wrt, r.dtype, r.compared, r.ok) for r in result] == [
        ("b", "f32", 7, True), ("jvp:b", "f32", 3, True)]
    result = dsl.check_gradients(f, x, b, wrong, order=1, upstream=False)
    assert [(r.wrt, r.compared, r.ok) for r in result] == [("b", 7, False), ("jvp:b", 3, False)]
    assert all(r.max_abs > 0.3 for r in result)  # 0.4 along a unit direction


def test_an_f32_max_of_ties_is_not_compared_at_a_step_that_hides_the_kink():
    # Every element tied at 1000: a kink at the point along any direction (a
    # max pool's windows at `gradc check`'s stress points).  f32's step there
    # is 1, so the one-sided test's curvature allowance (10 * step) let it
    # through, and the central difference, the mean of the largest and least
    # of v, failed the gradient, which shares the 1 among the ties (a
    # subgradient: the mean of v).
    f = dsl.loads("def f(x: f32[n]):\n    return max(x)\n").f
    x = np.full(5, 1000.0, np.float32)
    np.testing.assert_array_equal(dsl.grad(f)(x), np.full(5, 0.2, np.float32))
    result = dsl.check_gradients(f, x, order=1, upstream=False)
    assert [(r.wrt, r.compared, r.ok) for r in result] == [("x", 0, True), ("jvp:x", 0, True)]


def test_a_step_added_to_a_huge_intermediate_is_not_rounded_into_a_false_failure():
    # A bias of -1000 added to -1.2e10 (an MLP's logits at `gradc check`'s
    # stress point -1000): a step of 1e-3 was rounded to 524 units of
    # 2**-19, at step / 2 to 262, so both differences were 5.5e-4 low, agreed
    # with each other, and failed the right gradient cos(z + b).  A
    # power-of-two step along a direction of few bits adds exactly.
    f = dsl.loads("def f(z: i64[n], b):\n    return sum(sin(z + b))\n").f
    z, b = np.full(3, -12_000_000_000), np.full(3, -1000.0)
    result = dsl.check_gradients(f, z, b, order=1, upstream=False, f32=False)
    assert [(r.wrt, r.compared, r.ok) for r in result] == [("b", 6, True), ("jvp:b", 3, True)]
    assert max(r.max_rel for r in result) < 1e-6

def test_stable_grad_block_is_finite_at_large_magnitudes_in_both_dtypes():
    m = dsl.load(EXAMPLES / "log1pexp.grad")
    x = np.array([1000.0, -1000.0, 100.0, 0.0])
    for dtype in (np.float64, np.float32):
        np.testing.assert_array_equal(dsl.grad(m.log1pexp)(x.astype(dtype)), [1, 0, 1, 0.5])
    # order 1, the block; the second derivative through it, e / (1 + e)^2, is
    # inf / inf at 1000, where `gradc check` does not go (the f64 value is inf)
    result = dsl.check_gradients(m.log1pexp, x, order=1)
    assert result, [str(r) for r in result]
    f32 = [r for r in result if r.dtype == "f32"]
    assert [(r.order, r.wrt, r.ok, r.compared) for r in f32] == [
        (1, "x", True, 1), (1, "jvp/vjp:x", True, 3)]
    # the same point fails the naive forward, in f32 only (f64 finds 1000 inf too)
    naive = dsl.check_gradients(dsl.loads(NAIVE).softplus_naive, x, order=1)
    assert not naive
    assert [(r.order, r.dtype) for r in naive.failures] == [(1, "f32")]



def test_a_function_that_compiles_only_in_f64_is_checked_in_f64_with_a_warning():
    # x narrowed to f32 meets the f64 w in the loop, so h changes dtype: a
    # GradError from the f32 run made the whole check "could not be
    # checked", for a program that is right in f64, the dtype it is called in.
    m = dsl.loads("def g(x, w: f64, n: const i64 = 2):\n    h = x\n"
                  "    for i in range(n):\n        h = tanh(h) * w\n    return sum(h)\n")
    result = dsl.check_gradients(m.g, np.array([0.3, -0.8]), 1.5, order=1)
    assert result and len(result) and {r.dtype for r in result} == {"f64"}
    assert result.warnings == ["not checked in f32: it does not compile there (line 4: 'h' "
                               "changes type in the loop: f32[2] before an iteration, f64[2] "
                               "after it; a carried value must keep its dtype and shape)"]


def test_check_gradients_result_is_falsy_on_failure_and_raises_when_asked():
    naive = dsl.loads(NAIVE).softplus_naive
    x = np.array([100.0, 1.0])
    result = dsl.check_gradients(naive, x)
    assert isinstance(result, list) and len(result) > 0 and not result
    assert all(isinstance(r.ok, bool) and r.order in (1, 2) for r in result)
    assert [r.ok for r in result] == [r not in result.failures for r in result]
    with pytest.raises(GradientCheckError) as info:
        dsl.check_gradients(naive, x, raise_on_failure=True)
    message = str(info.value)
    assert message.startswith(f"{len(result.failures)} of {len(result)} gradient checks failed")
    assert "softplus_naive: order 1 w.r.t. x [automatic] in f32 vs the f64 gradient" in message
    good = dsl.check_gradients(dsl.load(EXAMPLES / "log1pexp.grad").log1pexp, x,
                               raise_on_failure=True)
    # orders 1, 2 and upstream in f64, order 1 in f32; forward: jvp in f64, and the
    # dot-product test in both dtypes
    assert good and len(good) == 7
    # printed (or shown by a REPL) a line per check, not a list's repr of every field
    assert str(good).splitlines() == [str(r) for r in good] + [
        f"warning: {w}" for w in good.warnings]
    assert repr(result).splitlines()[0] == (
        f"<CheckResult: {len(result)} checks, {len(result.failures)} failed>")
    assert repr(result).splitlines()[1:] == str(result).splitlines()


def test_nothing_to_differentiate_is_an_empty_truthy_result():
    count = dsl.loads("def twice(n: i64):\n    return n * 2\n").twice
    result = dsl.check_gradients(count, np.int64(3))
    assert len(result) == 0 and result


def test_skipped_rows_do_not_say_ok():
    code, out, err = run_check(EXAMPLES / "straight_through.grad")
    assert code == 0, err
    skipped = [line for line in out if "pass_through" in line]
    # orders 1, 2, upstream and jvp, of quantize and quantized_loss
    assert len(skipped) == 8
    assert all(line.endswith("skipped: quantize() is @pass_through") for line in skipped)
    assert all(" - " in line and " ok" not in line for line in skipped)
    # f32 is still compared with f64: pass-through is no excuse for a NaN; and
    # forward and reverse mode must still agree
    assert rows_of(out, "quantize", "f32")[0][-1] == "ok"
    assert rows_of(out, "quantize", "f64", "jvp/vjp:x")[0][-1] == "ok"


def test_table_columns_align_with_long_names_and_block_labels(tmp_path):
    code, out, err = check(tmp_path, "long.grad", LONG)
    assert code == 0, err
    header = next(line for line in out if line.lstrip().startswith("function"))
    rows = [line for line in out if line.lstrip().startswith((LONG_NAME, "g "))]
    assert len(rows) == 14 and any("automatic through grad block 1 (line 4)" in r for r in rows)
    assert any("dy (of d/dx)" in r for r in rows)
    for column in ("dtype", "wrt", "gradient", "NaN/Inf", "verdict"):
        start = header.index(column)
        assert all(r[start - 2:start] == "  " and r[start] != " " for r in rows), column
    for column in ("order", "points", "max abs err"):  # numbers align right
        end = header.index(column) + len(column)
        assert all(r[end - 1] != " " and r[end] == " " for r in rows), column


WRONG_BLOCK = "def cube(x):\n    return x * x * x\ngrad(dy):\n    return dy * 2 * x * x\n"


def test_forward_rows_fail_a_wrong_block_and_pass_the_dot_product_test(tmp_path):
    code, out, err = check(tmp_path, "wrong.grad", WRONG_BLOCK)
    assert code == 1
    (jvp,) = rows_of(out, "cube", "f64", "jvp:x")
    assert jvp[-1] == "FAIL"  # the jvp follows the block, which is not the derivative
    assert "the order-1 gradient w.r.t. jvp:x from forward (grad block 1 (line 3))" in err
    # forward and reverse mode agree with each other: both are the block
    dots = rows_of(out, "cube", "f64", "jvp/vjp:x") + rows_of(out, "cube", "f32", "jvp/vjp:x")
    assert len(dots) == 2 and all(r[-1] == "ok" for r in dots)


def test_a_second_block_gets_the_order_2_dot_product_test():
    m = dsl.load(EXAMPLES / "stylegan_r1.grad")
    result = dsl.check_gradients(m.leaky_relu, np.array([-1.5, 0.5, 2.0]))
    (row,) = [r for r in result if (r.order, r.wrt) == (2, "jvp/vjp:x")]
    assert row.ok and row.compared == 3 and row.against == "reverse"
    assert row.source == "forward over reverse vs reverse (grad block 2 (line 14))"


def test_the_check_and_the_api_share_one_gradient_per_function_and_wrt():
    m = dsl.loads("def f(x, y):\n    return x * y\n")
    # by position or by name, from the API or from the checker: one
    # transform, so its programs compile once
    assert dsl.grad(m.f, wrt=0) is dsl.grad(m.f, wrt="x")
    assert dsl.grad(m.f, wrt=(0, 1)) is dsl.grad(m.f, wrt=["x", "y"])
    assert dsl.grad(m.f, wrt=(0,)) is not dsl.grad(m.f, wrt=0)  # a tuple of one gradient
    assert dsl.value_and_grad(m.f) is not dsl.grad(m.f)
    x, y = np.array([1.0, 2.0]), np.array([3.0, -1.0])
    assert dsl.check_gradients(m.f, x, y, order=1)
    gradient = dsl.grad(m.f, wrt="x")
    compiled = len(gradient._programs)
    assert compiled >= 1  # by the check
    np.testing.assert_array_equal(gradient(x, y), y)
    assert len(gradient._programs) == compiled  # reused here


def test_a_check_after_one_with_other_float_arguments_checks_the_right_gradient():
    """The upstream row's cotangent was picked by its position among the
    float arguments of the first check: with `a` an integer the second
    time, c's position 2 was out of range (IndexError), b's the wrong one."""
    m = dsl.loads("def g(a, b, c):\n    return sum(a * b * sin(c) + b * b * c)\n")
    x = np.array([0.5, 1.0, 2.0])
    # (f64 only: the position is the same in f32's rows, whose compiles
    # took half the test's time)
    assert dsl.check_gradients(m.g, x, x + 1, x - 1, f32=False)
    result = dsl.check_gradients(m.g, np.arange(3), x + 1, x - 1, f32=False)
    rows = {(row.order, row.wrt, row.dtype): row for row in result}
    assert result and rows[(2, "upstream (of d/dc)", "f64")].compared == 3
    assert not any(row.wrt.endswith("a") for row in result)


def test_empty_arguments_check_without_reducing_nothing():
    """max() of an empty difference raised NumPy's ValueError."""
    m = dsl.loads("def f(x, y):\n    return sum(x * y + sin(x))\n")
    result = dsl.check_gradients(m.f, np.zeros(0), np.zeros((0,)), f32=False)
    assert result and {row.wrt for row in result} >= {"x", "y"}


@pytest.mark.parametrize("order", [0, -1, MAX_ORDER + 1, True, 2.0, "2", None])
def test_an_order_outside_one_to_max_is_refused_before_anything_compiles(order):
    # each order triples the program, so order 99 would compile for days
    f = dsl.loads(NAIVE).softplus_naive
    with pytest.raises(dsl.ArgumentError, match=f"order from 1 to {MAX_ORDER}, got {order!r}"):
        dsl.check_gradients(f, np.ones(2), order=order)
    assert not f._programs  # refused before the value's program was built


@pytest.mark.parametrize("option, pattern", [
    (dict(eps=0.0), r"finite positive eps, got 0\.0"), (dict(eps=-1e-6), r"eps, got -1e-06"),
    (dict(eps=float("nan")), r"eps, got nan"), (dict(eps=float("inf")), r"eps, got inf"),
    (dict(eps="1e-6"), r"eps, got '1e-6'"), (dict(rtol=-1.0), r"non-negative rtol"),
    (dict(atol=float("nan")), r"non-negative atol, got nan"), (dict(seed=-1), r"seed .* got -1"),
    (dict(seed=1.5), r"seed .* got 1\.5"),
    (dict(eps=10 ** 400), r"finite positive eps, got <an integer of 1329 bits>"),
    (dict(rtol=-10 ** 400), r"non-negative rtol, got <a negative integer of 1329 bits>"),
    (dict(f32="no"), r"check_gradients\(\)'s f32 is True or False, got 'no'"),
    (dict(raise_on_failure=1), r"raise_on_failure is True or False, got 1"),
    (dict(upstream=None), r"upstream is True or False, got None"),
], ids=["eps0", "eps<0", "epsnan", "epsinf", "epsstr", "rtol", "atol", "seed<0", "seed1.5",
        "eps10**400", "rtol-10**400", "f32no", "raise1", "upstreamNone"])
def test_a_step_tolerance_or_seed_that_cannot_work_is_refused(option, pattern):
    """eps=0 compared no direction and passed every row ('not compared'),
    eps=nan raised a KeyError, a seed NumPy refuses its ValueError; an eps
    of 10**400 (an int, finite to Python) raised OverflowError as the step
    was computed; f32="no" or raise_on_failure=1 was taken as true."""
    f = dsl.loads(NAIVE).softplus_naive
    with pytest.raises(dsl.ArgumentError, match=pattern):
        dsl.check_gradients(f, np.ones(2), **option)
    assert not f._programs  # refused before the value's program was built

@pytest.mark.parametrize("order", ["0", "9", "99", "two"])
def test_gradc_check_refuses_an_order_beyond_max(order, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["check", str(EXAMPLES / "log1pexp.grad"), "--order", order])
    assert exit_.value.code == 2
    assert f"--order: expected an order from 1 to {MAX_ORDER}, got '{order}'" in \
        capsys.readouterr().err


def test_a_bool_result_has_no_upstream_to_vary_at_order_2():
    # The order-2 row through the upstream cotangent drew a random bool
    # cotangent and tried to differentiate w.r.t. it: "cannot differentiate
    # w.r.t. '$ct0': not a float", naming an internal argument.
    m = dsl.loads("def positive(x):\n    return x > 0.0\n"
                  "def both(x):\n    return x * x * x, x > 0.0\n")
    x = np.array([0.5, -1.5])
    only_bool = dsl.check_gradients(m.positive, x, f32=False)
    assert only_bool and not [r for r in only_bool if "of d/d" in r.wrt]
    mixed = dsl.check_gradients(m.both, x, f32=False)
    assert mixed
    (through_upstream,) = [r for r in mixed if r.wrt == "upstream (of d/dx)"]
    assert through_upstream.ok and through_upstream.compared == 3


def test_integer_and_bool_params_get_values_of_their_dtype():
    # check_function set every unset param to normal floats: "param 'k'
    # must hold i64 values", and the function went unchecked
    from dsl.check import check_function
    m = dsl.loads("param k: i64\nparam on: bool\ndef f(x):\n"
                  "    return where(on, x * k, x)\n")
    params = m.params
    rows = check_function(m.f, params, order=1)
    assert rows and {(r.wrt, r.dtype) for r in rows} >= {("x", "f64"), ("x", "f32")}
    assert params["k"].dtype == np.int64 and params["on"].dtype == np.bool_


def test_an_argument_annotated_f32_is_checked_and_said_in_f32():
    # its rows said f64 (differences taken in f32); the row of its f32
    # gradient against the f64 program's (y in f64) is in f32 as well
    from dsl.check import check_function
    f = dsl.loads("def f(x: f32[3], y):\n    return x * y\n").f
    rows = check_function(f, order=1)
    assert sorted((r.wrt, r.dtype, r.against) for r in rows if r.wrt in "xy") == [
        ("x", "f32", "differences"),
        ("y", "f32", "f64"), ("y", "f64", "differences")]


def test_a_const_integer_that_is_an_axis_or_an_index_is_checked():
    # sampled as 3 (a size or a count) only: "axis 3 is out of range for
    # rank 1", and the function could not be checked at all
    from dsl.check import check_function
    m = dsl.loads("def s(x, axis: const i64):\n    return sum(x * x, axis)\n"
                  "def pick(x, i: const i64):\n    return x[i] * x[i]\n"
                  "def gather(x, labels: const):\n    return x[labels] * x[labels]\n")
    # (an unannotated const index, labels: const, was sampled as floats only:
    # "an index must be an integer array")
    for f in (m.s, m.pick, m.gather):
        rows = check_function(f, order=1)
        assert rows and {(r.wrt, r.dtype) for r in rows} >= {("x", "f64"), ("x", "f32")}


def test_an_f64_param_in_the_f32_pass_is_judged_at_f32_precision():
    # its forward-vs-reverse row was labelled f64 and held to 1e-9, though
    # x was f32 in that pass: a false FAIL (about 8e-8) on an R1-like penalty
    m = dsl.loads("param w: f64\ndef h(x):\n    return sum(sin(x * w))\n"
                  "def f(x):\n    g = grad(h, wrt=0)(x)\n    return sum(g * g)\n")
    m.params["w"] = np.float64(0.7)
    rows = dsl.check_gradients(m.f, np.linspace(-1.0, 1.0, 5), order=1)
    assert rows, str(rows)
    dot_rows = {r.dtype for r in rows if r.wrt == "jvp/vjp:w"}
    assert dot_rows == {"f32", "f64"}


def test_rows_come_by_argument_in_the_functions_order_then_by_kind():
    # they were sorted by the wrt column's text: 'dy (of d/dz)', 'jvp/vjp:z',
    # 'jvp:z', 'z', and the arguments alphabetically
    from dsl.check import check_function
    f = dsl.loads("def f(y, x):\n    return y * x\n").f
    rows = [(r.wrt, r.order, r.dtype) for r in check_function(f, order=2)]
    arguments = [w.split(":")[-1].split("d/d")[-1].rstrip(")") for w, _, _ in rows]
    assert arguments == sorted(arguments, key=["y", "x"].index)
    y_rows = [row for row, a in zip(rows, arguments) if a == "y"]
    assert y_rows == [("y", 1, "f64"), ("y", 1, "f32"), ("y", 2, "f64"),
                      ("upstream (of d/dy)", 2, "f64"), ("jvp:y", 1, "f64"),
                      ("jvp/vjp:y", 1, "f64"), ("jvp/vjp:y", 1, "f32")]


def test_a_function_no_sampled_rank_compiles_for_notes_the_sampling(tmp_path, capsys):
    # k and c are scalars, sampled as vectors of 3: the error at stack()
    # did not say that the checker had made the shapes up, nor how to
    # give them
    from dsl.cli import main
    path = tmp_path / "ode.grad"
    path.write_text("def rhs(y, k, c):\n    return stack([y[1], -k * y[0] - c * y[1]])\n")
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert "stack() needs arrays of one shape" in err
    assert ("note: gradc check sampled the unannotated parameters of rhs() (y, k, c) as f64 "
            "arrays of size 3") in err and "`k: f64` for a scalar" in err


# Two outputs whose cotangents the first block swaps: d(2x)/dx = 2 and
# d(3x)/dx = 3 give 2a + 3b, the block 3a + 2b, right only where a = b.
SWAPPED = """def two(x):
    return 2 * x, 3 * x
grad(a, b):
    return 3 * a + 2 * b

def two_right(x):
    return 2 * x, 3 * x
grad(a, b):
    return 2 * a + 3 * b
"""


def test_a_block_right_only_at_the_all_ones_cotangent_fails():
    """Order 1 compared the gradient of sum(f), J^T 1, with differences of
    sum(f), and forward mode is the block transposed: a block wrong off the
    all-ones cotangent passed every row (swapped outputs; softmax's
    y * (g - mean(g)), whose sum is constant)."""
    m = dsl.loads(SWAPPED)
    x = np.array([0.5, -1.0, 2.0])
    # J^T 1 is right, J^T u is not: the bug the check must see
    np.testing.assert_allclose(dsl.grad(m.two)(x), [5.0, 5.0, 5.0])
    np.testing.assert_allclose(dsl.vjp(m.two, x)[1]((np.ones(3), np.zeros(3)))[0], [3.0] * 3)
    rows = {r.wrt: r for r in dsl.check_gradients(m.two, x, order=1, f32=False)}
    assert not rows["x"].ok and rows["x"].compared == 6 and rows["x"].max_abs > 0.1
    assert not rows["jvp:x"].ok
    assert dsl.check_gradients(m.two_right, x, order=1, f32=False)


# d3/dx3 of x^3 through the second block: its x cotangent is ddx * 6x * dy,
# and dropping dy is right only where the first block's upstream is 1.
CUBE = """def cube(x):
    return x * x * x
grad(dy):
    return dy * 3 * x * x
grad(ddx):
    return dy=ddx * 3 * x * x, x=ddx * 6 * x{}
"""


def test_a_second_block_right_only_at_an_upstream_of_one_fails():
    x = np.array([0.5, -1.0, 2.0])
    wrong, right = dsl.loads(CUBE.format("")).cube, dsl.loads(CUBE.format(" * dy")).cube
    # the second derivative of sum(2 f) is 12 x; the wrong block gives 6 x
    scaled = dsl.loads(CUBE.format("") +
                       "def twice(x):\n    return 2 * cube(x)\n").twice
    np.testing.assert_allclose(dsl.grad(dsl.grad(scaled))(x), 6 * x)
    rows = {(r.order, r.wrt): r for r in dsl.check_gradients(wrong, x, order=2, f32=False,
                                                             upstream=False)}
    assert rows[(1, "x")].ok and not rows[(2, "x")].ok and rows[(2, "x")].compared == 3
    assert dsl.check_gradients(right, x, order=2, f32=False, upstream=False)


def test_an_f32_gradient_beyond_f32s_range_passes():
    """exp(100) overflows f32, and its gradient, exp(100), with it; the
    gradient of 1 / x^4 at 1e-8, -4e40, overflows where the value, 1e32,
    does not: the f32 row failed as 'NaN/Inf where the f64 gradient is
    finite', so that `gradc check` exited 1 on exp(x) itself (a NaN
    gradient still fails: the naive softplus's above)."""
    m = dsl.loads("def e(x):\n    return exp(x) + 1 / (x * x * x * x)\n")
    for x in (np.array([100.0, 1.0]), np.array([1e-8, 1.0])):
        assert np.isinf(dsl.grad(m.e)(x.astype(np.float32))[0])
        result = dsl.check_gradients(m.e, x, order=1, upstream=False)
        (f32,) = [r for r in result if r.dtype == "f32"]
        assert f32.ok and result, str(result)
    assert result.warnings == []  # at 1e-8: the value is finite in f32


# logsumexp with its max shift held by stop_gradient, and a first block
# that forgets to divide by the sum: softmax is e / s
LSE = """def lse(x):
    m = stop_gradient(max(x))
    e = exp(x - m)
    s = sum(e)
    return log(s) + m
grad(g):
    return g * e{}
"""


def test_stop_gradient_in_the_body_does_not_excuse_a_written_first_block():
    """gradc check skipped every difference row of a function using
    stop_gradient anywhere: the max shift in the body changes no value,
    and the first block is the gradient, so a wrong block passed."""
    from dsl.check import intentional_mismatch
    x = np.array([0.5, -1.0, 2.0])
    wrong = dsl.loads(LSE.format("")).lse
    # the block's e = exp(x - max(x)), where the gradient is softmax, e / s
    np.testing.assert_allclose(dsl.grad(wrong)(x), np.exp(x - 2.0))
    # what gradc check's summary excuses, by order: order 2 differentiates
    # the block through e, whose shift stop_gradient holds
    assert [intentional_mismatch(wrong, k) for k in (1, 2)] == ["", "lse() uses stop_gradient"]
    assert intentional_mismatch(wrong) == "lse() uses stop_gradient"


def test_differences_along_an_argument_that_reaches_no_stop_gradient_are_compared():
    """gradc check skipped every difference row of a function using
    stop_gradient or a @pass_through function, also along arguments whose
    values never reach them (a loss's target beside a quantized input):
    nothing of such a gradient was compared in f64."""
    from dsl.check import check_function
    held = dsl.loads("def held(x, t):\n    return x * stop_gradient(t)\n").held
    rows = {(r.wrt, r.dtype): r for r in check_function(held, order=1)}
    assert rows["x", "f64"].points == rows["jvp:x", "f64"].points == 12
    assert rows["x", "f64"].ok and rows["jvp:x", "f64"].ok
    assert [(rows[w, "f64"].points, rows[w, "f64"].skipped) for w in ("t", "jvp:t")] == [
        (0, "held() uses stop_gradient")] * 2


def test_a_function_that_takes_no_distinct_sizes_is_checked_at_equal_ones():
    # Each named size was sampled distinct (3, 4, ...): a conv2d's kernel of
    # 8 x 9 exceeded its padded image, and benchmarks/conv.grad "could not
    # be checked"; here a and b must be equal for x * y to broadcast
    from dsl.check import check_function
    f = dsl.loads("def f(x: f64[a], y: f64[b]):\n    return sum(x * y)\n").f
    rows = {(r.wrt, r.dtype): r for r in check_function(f, order=1)}
    assert {w for w, _ in rows} == {"x", "y", "jvp:x", "jvp:y", "jvp/vjp:x", "jvp/vjp:y"}
    assert all(r.ok for r in rows.values()) and rows["x", "f64"].points == 12


def test_what_reaches_a_straight_through_call_is_over_approximated():
    # through a loop's later trips, all of a callee's arguments, and a param
    from dsl.check import reaching_mismatch
    m = dsl.loads("param w: f64\n@pass_through\ndef ste(x):\n    return round(x)\n"
                  "def inner(a, b):\n    return ste(a) + b\n"
                  "def carried(x, t, u):\n    h = x\n    for i in range(2):\n"
                  "        h = ste(h) + t\n    return sum(h * u)\n"
                  "def through(x, t, u):\n    return inner(x * w, t) * u\n"
                  "def read(x, t):\n    v = x * t\n    return ste(v * w) + t\n")
    assert [reaching_mismatch(getattr(m, name), 1) for name in ("carried", "through", "read")] == [
        {"x", "t"}, {"x", "t", "w"}, {"x", "t", "w"}]
    assert reaching_mismatch(m.ste, 1) == {"x"}  # all of a @pass_through function's


def test_a_param_read_by_a_callee_or_a_transform_of_a_stop_gradient_function_reaches_it():
    # g(x) * t's rows along w are not f's derivative (g holds w), though f
    # never names w, nor stop_gradient(scale(x))'s; grad(sg)(x) is x, its
    # gradient 0 by design, while f names only t's stop_gradient: all were
    # compared and FAILed
    from dsl.check import intentional_mismatch, reaching_mismatch
    m = dsl.loads("param w: f64\ndef g(a):\n    return a * stop_gradient(w)\n"
                  "def viaparam(x, t):\n    return g(x) * t\n"
                  "def sg(a):\n    return a * stop_gradient(a)\n"
                  "def viagrad(x, t):\n    return grad(sg)(x) + x * stop_gradient(t)\n"
                  "def alone(x):\n    return value_and_grad(sg)(x)[1]\n"
                  "def scale(a):\n    return a * w\n"
                  "def nested(x):\n    h = scale(x)\n    return x * stop_gradient(h)\n")
    names = ("viaparam", "viagrad", "alone", "nested")
    assert [reaching_mismatch(getattr(m, name), 1) for name in names] == [
        {"x", "w"}, {"x", "t"}, {"x"}, {"x", "w"}]
    assert intentional_mismatch(m.alone) == "sg() uses stop_gradient"


# x y^2 with a second block whose x cotangent, d/dx of the y cotangent
# 2 g x y, is 5 times too large: a mixed partial, d2/dxdy
MIXED = """def bar(x, y):
    return x * y * y
grad(g):
    return g * y * y, g * 2 * x * y
grad(ddx, ddy):
    return g=ddx * y * y + ddy * 2 * x * y, x=ddy * 2 * y * g{}, y=(ddx * 2 * y * g +
                                                                  ddy * 2 * x * g)
"""


def test_a_second_blocks_wrong_mixed_partial_fails():
    """The order-2 rows differentiated J^T u along one argument, its own
    cotangent only: d/dx of the y cotangent, a second block's x output
    for ddy, was never compared, and a wrong one passed every row."""
    x, y = np.array([0.5, -1.0, 2.0]), np.array([1.5, 0.3, -0.7])
    wrong = dsl.loads(MIXED.format(" * 5")).bar
    rows = {(r.order, r.wrt): r for r in dsl.check_gradients(wrong, x, y, order=2, f32=False,
                                                             upstream=False)}
    assert rows[(1, "x")].ok and rows[(1, "y")].ok and rows[(2, "y")].ok
    assert not rows[(2, "x")].ok and rows[(2, "x")].max_abs > 1.0


def test_a_failure_says_at_which_points_it_failed(tmp_path):
    # A row failed with only its largest error: a block wrong only past
    # x = 500 (or a difference swamped at one stress point) read as wrong
    # everywhere; the message now names the points, or says every point.
    text = ("def f(x):\n    return x * 3.0\ngrad(dy):\n"
            "    return where(x < 500.0, dy * 3.0, dy * 4.0)\n")
    path = tmp_path / "far.grad"
    path.write_text(text)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["check", str(path), "--order", "1"]) == 1
    assert ("f(): the order-1 gradient w.r.t. x from grad block 1 (line 3) disagrees with "
            "finite differences (max rel err 0.33), at x = 1000\n") in err.getvalue()
    # (the words for many points, without compiling another check)
    assert _where_failed(["a", "b", "c"], 3) == "at every point tried (3)"
    assert _where_failed(list("abcde"), 12) == "at a, b, c and 2 more"


def test_a_jvp_along_one_argument_is_not_failed_by_another_arguments_infinite_slope():
    # the forward rows ran one program with zero tangents for the other
    # arguments: d sqrt(w) = 0.5 / sqrt(0) * 0 = NaN at w = 0, so jvp:x
    # failed as NaN where the jvp along x alone (dsl.jvp's) is 4
    f = dsl.loads("def f(x, w):\n    return sum(x * 2.0 + sqrt(w))\n").f
    x, w = np.array([0.5, -1.0]), np.zeros(2)
    assert dsl.jvp(f, (x, w), {"x": np.ones(2)})[1] == 4.0
    result = dsl.check_gradients(f, x, w, order=1, upstream=False, f32=False)
    rows = {r.wrt: r for r in result}
    assert rows["jvp:x"].ok and rows["jvp:x"].compared == 3, rows["jvp:x"]


def test_a_shape_helper_returning_a_tuple_is_skipped_and_says_why_when_called(tmp_path):
    # `gradc check` failed the file (exit 1, "a tuple cannot be used as an
    # array here" under "none compiled: annotate them"); its caller is
    # checked in its place
    code, out, err = check(tmp_path, "heads.grad", "def heads(x):\n    return x.shape[::-1]\n")
    assert code == 0, err
    assert out[-1].split() == ["heads", "skipped:", "returns", "a", "compile-time", "tuple"]
    with pytest.raises(dsl.GradError) as info:
        dsl.load(tmp_path / "heads.grad").heads(np.ones((2, 3)))
    assert (info.value.line, info.value.col) == (2, 12)
    assert info.value.message.startswith("heads() returns a tuple as a result, which only "
                                         "another function can take"), str(info.value)


def test_an_integer_argument_used_as_a_count_or_an_axis_is_checked_at_its_value():
    # the checker ran the program directly, without compiling it for the
    # value of an argument used as a count or an axis: an internal
    # NeedsValue traceback ("argument 'k' is used as a size")
    m = dsl.loads("def f(x, k: i64):\n    return sum(x * x, axis=k) * sum(arange(k + 2))\n",
                  "counted.grad")
    x = np.array([[0.5, -2.0, 1.5], [1.0, 0.25, -0.75]])
    for k in (0, 1):
        result = dsl.check_gradients(m.f, x, k, raise_on_failure=True)
        assert any(row.order == 2 for row in result) and all(row.ok for row in result)
        np.testing.assert_allclose(dsl.grad(m.f)(x, k), 2 * x * sum(range(k + 2)), rtol=1e-15)


def test_an_axis_argument_is_sampled_as_a_valid_axis():
    # check_function sampled an integer argument as a random index of
    # -3..2 at each point, also one compiled by value: as an axis it was
    # out of range ("axis 2 is out of range for rank 2", seed 0); and where
    # the probe's random one fit (seed 2), the points took the layout's
    # const value, 3, never tried ("axis 3 is out of range for rank 1")
    from dsl.check import check_function
    for seed in (0, 2):
        m = dsl.loads("def f(x, k: i64):\n    return sum(x * x, axis=k)\n", "axis.grad")
        rows = check_function(m.f, order=1, seed=seed)
        assert {row.wrt for row in rows} >= {"x", "jvp:x"} and all(row.ok for row in rows)
