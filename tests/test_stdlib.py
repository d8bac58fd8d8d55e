"""Every function of the standard library (`compiler/stdlib/std.grad`),
found by loading the file, passes the gradient check in f64: its grad
block (or reverse mode) at order 1, and at order 2 both the derivative of
the gradient and the derivative through the upstream cotangent; and in f32
its gradient is finite where the f64 one is."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from gradlang.compiler.modules import STDLIB

STD = dsl.load(STDLIB / "std.grad")


# The second argument of the functions taking two: broadcast along x's
# rows, and labels in [0, 1].
SECOND = {"logaddexp": lambda rng, scale: rng.normal(size=3) * scale,
          "sigmoid_cross_entropy": lambda rng, scale: rng.uniform(0.0, 1.0, size=(2, 3))}
# order 2: along each argument and upstream; order 1 in f32 against f64;
# forward mode: the jvp in f64 and the dot-product test in both dtypes
ROWS = [(1, "f32", "f64"), (1, "f32", "reverse"), (1, "f64", "differences"),
        (1, "f64", "differences"), (1, "f64", "reverse"), (2, "f64", "differences"),
        (2, "f64", "differences")]


@pytest.mark.parametrize("name", sorted(STD.functions))
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**31), scale=st.sampled_from([0.5, 3.0, 20.0]))
def test_stdlib_passes_the_gradient_check_at_orders_1_and_2(name, seed, scale):
    rng = np.random.default_rng(seed)
    args = (rng.normal(size=(2, 3)) * scale,) + ((SECOND[name](rng, scale),)
                                                  if name in SECOND else ())
    checks = dsl.check_gradients(getattr(STD, name), *args, order=2)
    assert sorted((c.order, c.dtype, c.against) for c in checks) == sorted(ROWS * len(args))
    assert all(c.compared > 0 for c in checks), [str(c) for c in checks]
    assert all(c.ok for c in checks), [str(c) for c in checks if not c.ok]


def test_logsumexp_of_infinite_rows_is_numpys():
    # The shift by the row's max was inf - inf = NaN for a row holding +inf
    # or only -inf (a fully masked row of logits): NumPy's unshifted
    # log(sum(exp(x))) is inf and -inf there, and finite rows are unchanged.
    x = np.array([[np.inf, 1.0, 0.0], [-np.inf, -np.inf, -np.inf], [-np.inf, 0.0, 2.0],
                  [1000.0, 999.0, -5.0]])
    expected = [np.inf, -np.inf, np.log(1 + np.exp(2.0)), 1000 + np.log(1 + np.exp(-1.0))]
    np.testing.assert_allclose(STD.logsumexp(x, 1), expected, rtol=1e-15)
    np.testing.assert_allclose(STD.logsumexp(x.astype(np.float32), 1), expected, rtol=1e-6)
    # An empty row is SciPy's log(0) = -inf (its max, without an initial
    # value, was "max/min over an empty axis" at std.grad, which the caller
    # cannot fix), and softmax and log_softmax along an empty axis are empty.
    empty = np.zeros((2, 0))
    np.testing.assert_array_equal(STD.logsumexp(empty, 1), [-np.inf, -np.inf])
    assert dsl.grad(STD.logsumexp)(empty, 1).shape == (2, 0)
    assert dsl.value_and_grad(STD.softmax)(empty)[0].shape == (2, 0)
    assert dsl.value_and_grad(STD.log_softmax)(empty)[0].shape == (2, 0)


def test_softmax_and_log_softmax_are_numpys_without_overflow():
    # (x of the gradient check's shape and dtype: its programs serve)
    x = np.array([[1000.0, 0.0, -1000.0], [1.0, 2.0, 3.0]])
    shifted = x - x.max(axis=1, keepdims=True)
    expected = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(dsl.value_and_grad(STD.log_softmax)(x)[0], expected, rtol=1e-15)
    np.testing.assert_allclose(dsl.value_and_grad(STD.softmax)(x)[0], np.exp(expected),
                               rtol=1e-15)


def test_logaddexp_is_numpys_and_its_gradient_is_finite_where_both_are_infinite():
    a = np.array([0.0, 1000.0, -np.inf, np.inf, 3.0, np.nan, -np.inf, 1e308])
    b = np.array([0.0, 999.0, -np.inf, np.inf, -np.inf, 1.0, 5.0, 1e308])
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(STD.logaddexp(a, b), np.logaddexp(a, b), rtol=1e-15)
    da, db = dsl.grad(STD.logaddexp, wrt=(0, 1))(a, b)
    sig = 1 / (1 + np.exp(-1.0))
    np.testing.assert_allclose(da, [0.5, sig, 0.5, 0.5, 1, np.nan, 0, 0.5], rtol=1e-15)
    np.testing.assert_allclose(db, [0.5, 1 - sig, 0.5, 0.5, 0, np.nan, 1, 0.5], rtol=1e-15)
    # second order at ties: sigmoid'(0) = 1/4 (not 0, as if a - b were held fixed there)
    ties = np.array([0.0, 1.0, -3.0])
    np.testing.assert_allclose(dsl.hessian(STD.logaddexp, wrt=0)(ties, ties),
                               np.diag([0.25] * 3), rtol=1e-15)


def test_norm_neither_overflows_nor_underflows_and_its_gradient_at_zero_is_zero():
    x = np.array([[3.0, 4.0], [0.0, 0.0], [1e200, 1e200], [-1e-200, 0.0]])
    np.testing.assert_allclose(STD.norm(x), [5.0, 0.0, np.sqrt(2) * 1e200, 1e-200],
                               rtol=1e-15)
    np.testing.assert_allclose(STD.norm(x, 0, True), [[1e200, 1e200]], rtol=1e-15)
    np.testing.assert_allclose(dsl.grad(STD.norm)(x), [[0.6, 0.8], [0, 0], [2**-0.5] * 2,
                                                       [-1, 0]], rtol=1e-15)
    assert STD.norm(np.array([np.inf, 1.0])) == np.inf
    # over an empty axis, NumPy's 0 (the program above, its sizes symbolic)
    for empty in (np.zeros((3, 0)), np.zeros((0, 2))):
        np.testing.assert_array_equal(STD.norm(empty), np.linalg.norm(empty, axis=-1))
        gradient = dsl.grad(STD.norm)(empty)
        assert gradient.shape == empty.shape and not gradient.any()


def test_sigmoid_cross_entropy_is_finite_for_every_logit():
    logits, labels = np.array([-1000.0, 0.0, 2.0, 1000.0]), np.array([1.0, 0.5, 0.0, 0.0])
    p = 1 / (1 + np.exp(-2.0))
    np.testing.assert_allclose(STD.sigmoid_cross_entropy(logits, labels),
                               [1000.0, np.log(2), -np.log(1 - p), 1000.0], rtol=1e-15)
    dl, dt = dsl.grad(STD.sigmoid_cross_entropy, wrt=(0, 1))(logits, labels)
    np.testing.assert_allclose(dl, [-1.0, 0.0, p, 1.0], rtol=1e-15)
    np.testing.assert_allclose(dt, -logits, rtol=1e-15)


def test_sigmoid_cross_entropy_at_infinite_logits_and_labels_near_1():
    # catches: max(z, 0) - z y + log1p(exp(-|z|)), which was inf * 0 = NaN at
    # a masked logit z = -inf with label 0 (and z = inf with label 1), where
    # the loss is 0, and cancelled at labels near 1: 7e-15 off a loss of 1e-4
    # at z = 100, y = 1 - 1e-6 (exactly 100 (1 - y) + log1p(e^-100)).
    # (the gradient check's shape: its programs serve)
    z = np.array([[-np.inf, np.inf, np.inf], [-np.inf, 100.0, -3.0]])
    y = np.array([[0.0, 1.0, 0.25], [0.25, 1 - 1e-6, 1.0]])
    want = [[0.0, 0.0, np.inf], [np.inf, 100 * (1 - y[1, 1]) + np.exp(-100.0),
                                 3 + np.log1p(np.exp(-3.0))]]
    np.testing.assert_allclose(STD.sigmoid_cross_entropy(z, y), want, rtol=1e-15)


def test_a_number_or_one_hot_beside_f32_arrays_keeps_the_two_argument_functions_f32():
    m = dsl.loads("from std import logaddexp, sigmoid_cross_entropy\n"
                  "def f(x, labels):\n"
                  "    return logaddexp(x, 0.5) + sigmoid_cross_entropy(x, one_hot(labels, 3))\n")
    x, labels = np.array([[-2.0, 0.0, 3.0]]), np.array([1])
    y = np.array([[0.0, 1.0, 0.0]])
    value, grad = dsl.value_and_grad(m.f)(x.astype(np.float32), labels)
    assert value.dtype == grad.dtype == np.float32  # as for a literal: not f64
    expected = np.logaddexp(x, 0.5) + np.maximum(x, 0) - x * y + np.log1p(np.exp(-abs(x)))
    np.testing.assert_allclose(value, expected, rtol=1e-6)
    np.testing.assert_allclose(grad, 1 / (1 + np.exp(0.5 - x)) + 1 / (1 + np.exp(-x)) - y,
                               rtol=1e-6)


def std_place(text: str, within: str, function: str = "") -> str:
    """'std.grad:LINE:COL' of the first `within` on std.grad's first line
    `text` (after `def function(`, where given)."""
    lines = (STDLIB / "std.grad").read_text().split("\n")
    start = next(i for i, t in enumerate(lines) if t.startswith(f"def {function}")) \
        if function else -1
    line = next(i for i, t in enumerate(lines) if i > start and t.strip() == text)
    return f"std.grad:{line + 1}:{lines[line].index(within) + 1}"


def test_an_error_inside_a_std_function_is_at_the_users_call():
    # The user's arguments caused it, and their line is the one to fix: it
    # was at std.grad's line, which the user did not write, with their call
    # in a note.  As for an error in their own callee, each function of
    # theirs the call is in adds its note ("in g(), called at ...").
    m = dsl.loads("from std import softmax, logaddexp\n\ndef f(x):\n"
                  "    return softmax(x, axis=3)\ndef g(a, b):\n    return logaddexp(a, b)\n"
                  "def h(x, y):\n    return sum(g(x, y)) + sum(grad(logaddexp)(x, y))\n",
                  "user.grad")
    with pytest.raises(dsl.GradError) as info:
        m.f(np.ones((2, 3)))
    top = std_place("top = max(x, axis=axis, keepdims=True, initial=-1e400)", "max(",
                    "softmax")
    assert str(info.value) == (
        "user.grad:4:12: error: axis 3 is out of range for rank 2\n"
        "        return softmax(x, axis=3)\n"
        "               ^^^^^^^^^^^^^^^^^^\n"
        f"note: in std function softmax(), at {top}")
    with pytest.raises(dsl.GradError) as info:
        m.h(np.ones((2, 3)), np.ones(2))
    where = std_place("s = where(a == b and abs(a) == 1e400, 0, a - b)", "a == b")
    assert str(info.value) == (
        "user.grad:6:12: error: shapes [2, 3] and [2] do not broadcast\n"
        "        return logaddexp(a, b)\n"
        "               ^^^^^^^^^^^^^^^\n"
        "note: in g(), called at user.grad:8:16\n"
        f"note: in std function logaddexp(), at {where}")
    # (and a derived gradient's: the call is the transform's)
    m = dsl.loads("from std import logaddexp\ndef h(x, y):\n"
                  "    return sum(grad(logaddexp)(x, y))\n", "user.grad")
    with pytest.raises(dsl.GradError) as info:
        m.h(np.ones((2, 3)), np.ones(2))
    assert str(info.value) == (
        "user.grad:3:16: error: shapes [2, 3] and [2] do not broadcast\n"
        "        return sum(grad(logaddexp)(x, y))\n"
        "                   ^^^^^^^^^^^^^^^^^^^^^\n"
        f"note: in std function logaddexp(), at {where}")


def test_softmax_and_log_softmax_keep_their_digits_at_large_logits():
    # catches: log_softmax as x - logsumexp(x), which rounds max + log(sum)
    # to an ulp of the max (3e-4 off at logits of 1e4 in float32, 5e-13 in
    # float64), and softmax as exp of that.  (x of the gradient check's
    # shape and dtypes: its programs serve)
    x = np.array([[1e4, 1e4, 1e4 - 1.0], [-1e4, -1e4 - 1.0, -1e4]])
    log_p = np.array([[0.0, 0.0, -1.0], [0.0, -1.0, 0.0]]) - np.log(2 + np.exp(-1.0))
    for dtype, rtol in ((np.float32, 1e-6), (np.float64, 1e-15)):
        value, slope = dsl.value_and_grad(STD.log_softmax)(x.astype(dtype))
        np.testing.assert_allclose(value, log_p, rtol=rtol)
        np.testing.assert_allclose(slope, 1 - 3 * np.exp(log_p), rtol=rtol)
        np.testing.assert_allclose(dsl.value_and_grad(STD.softmax)(x.astype(dtype))[0],
                                   np.exp(log_p), rtol=rtol)


def test_logsumexp_and_log_softmax_keep_their_digits_where_the_max_dominates():
    # catches: log(s) of the shifted sum s = 1 + e^-40 + e^-45, which rounds
    # to 1: logsumexp([0, -40, -45]) was 0 (it is 4.3e-18, as SciPy's and
    # logaddexp's log1p give) and log_softmax 0 at the max, in float32 too.
    # The second row's max is tied: both 1s count.  (the programs of the
    # gradient check and of the tests above serve)
    x = np.array([[0.0, -40.0, -45.0], [-30.0, 2.0, 2.0]])
    lse = np.array([np.log1p(np.exp(-40.0) + np.exp(-45.0)), 2 + np.log(2 + np.exp(-32.0))])
    for dtype, rtol in ((np.float32, 1e-6), (np.float64, 1e-15)):
        np.testing.assert_allclose(STD.logsumexp(x.astype(dtype), 1), lse, rtol=rtol)
        np.testing.assert_allclose(dsl.value_and_grad(STD.log_softmax)(x.astype(dtype))[0],
                                   x - lse[:, None], rtol=rtol)


def test_norm_gradient_where_the_norm_rounds_to_a_denormal_or_overflows_and_nan_rows():
    # catches: the gradient x / norm taken with the rounded norm: float32
    # [3e38, 3e38] (norm inf) gave 0, float64 [5e-324, 5e-324] (norm 5e-324)
    # gave 1; and a row holding NaN gave a gradient of 0.  (x of the
    # gradient check's shape and dtypes: its programs serve)
    half = np.sqrt(0.5)
    x = np.array([[3e38, -3e38, 0.0], [3.0, 0.0, 4.0]], np.float32)
    np.testing.assert_allclose(dsl.value_and_grad(STD.norm)(x)[1],
                               [[half, -half, 0.0], [0.6, 0.0, 0.8]], rtol=1e-6)
    x = np.array([[5e-324, 5e-324, 0.0], [np.nan, 1.0, 1.0]])
    slope = dsl.grad(STD.norm)(x)  # (the program of the test above)
    np.testing.assert_allclose(slope[0], [half, half, 0.0], rtol=1e-15)
    assert np.isnan(slope[1]).all()


def test_sigmoid_cross_entropy_gradient_does_not_cancel_at_labels_0_and_1():
    # catches: sigmoid(z) - labels, which is 0 in float32 from z = 17 at a
    # label of 1 (the slope is -sigmoid(-z), 4e-8) and 1e-12 off at 10 in
    # float64; the automatic gradient of the forward (JAX's) cancels too.
    # (the programs of the gradient check and of the test above serve)
    z = np.array([[10.0, 17.0, 30.0], [-17.0, -30.0, 0.0]])
    y = np.array([[1.0, 1.0, 1.0], [0.0, 0.0, 1.0]])
    expected = np.where(y == 1, -1 / (1 + np.exp(z)), 1 / (1 + np.exp(-z)))
    _, (got, _) = dsl.value_and_grad(STD.sigmoid_cross_entropy, wrt=(0, 1))(
        z.astype(np.float32), y.astype(np.float32))
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    got, _ = dsl.grad(STD.sigmoid_cross_entropy, wrt=(0, 1))(z.ravel(), y.ravel())
    np.testing.assert_allclose(got, expected.ravel(), rtol=1e-15)


def test_gelu_slope_at_infinities_is_its_limit():
    # catches: x phi(x) = inf * 0 = NaN at x = +-inf, where gelu' is 1 and 0,
    # and the value x Phi(x) = -inf * 0 = NaN at -inf, where its limit is 0
    x = np.array([np.inf, -np.inf, np.nan, -20.0])
    value, slope = dsl.value_and_grad(STD.gelu)(x)
    np.testing.assert_array_equal(value[:3], [np.inf, 0.0, np.nan])
    np.testing.assert_array_equal(slope[:3], [1.0, 0.0, np.nan])
    # Phi(-20) - 20 phi(-20), which 1 + erf cancels: JAX's is -1.10143605e-86
    np.testing.assert_allclose(slope[3], -1.1014360483133464e-86, rtol=1e-14)


def test_log_softmax_gradient_keeps_its_digits_at_a_confident_max():
    # catches: dy - softmax(x) * sum(dy), where softmax rounds to 1 at the
    # max of [0, -20, -30] in float32: its gradient there (a cross-entropy's
    # at a confident label) was 1 - 1 = 0, where it is 1 - p = 2.1e-9; the
    # tied row checks the max's ties still share it
    x = np.array([[0.0, -20.0, -30.0], [-30.0, 2.0, 2.0]])
    dy = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    e1, e2, s = np.exp(-20.0), np.exp(-30.0), 1 + np.exp(-20.0) + np.exp(-30.0)
    p = np.exp(-32.0) / (2 + np.exp(-32.0))
    expected = [[(e1 + e2) / s, -e1 / s, -e2 / s], [-p, 1 - (1 - p) / 2, -(1 - p) / 2]]
    for dtype, rtol in ((np.float32, 1e-6), (np.float64, 1e-15)):
        _, pullback = dsl.vjp(STD.log_softmax, x.astype(dtype))
        np.testing.assert_allclose(pullback(dy.astype(dtype))[0], expected, rtol=rtol)


def test_log_softmax_jvp_keeps_its_digits_at_a_confident_max():
    # catches: t - sum(p * t) (log_softmax's jvp, its block's transpose),
    # 1 - 1 = 0 at a max whose softmax rounds to 1: [0, -20, -30] in
    # float32 (1 - p is 2.1e-9) and [-45, 0, -40] in float64 too (4.3e-18).
    # The reference takes 1 - p as the sum of the others' p, which does not
    # cancel.  (x of the gradient check's shape and dtypes: its programs
    # serve.)  softmax's own slope there stays p * (dy - sum(dy * p)), 0,
    # as JAX's and PyTorch's (std.grad says why)
    x = np.array([[0.0, -20.0, -30.0], [-45.0, 0.0, -40.0]])
    at_max = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    z = np.exp(x - x.max(axis=1, keepdims=True))
    p = z / z.sum(axis=1, keepdims=True)
    q = np.where(at_max == 1, 0, p).sum(axis=1, keepdims=True)  # 1 - p at the max
    p_max = (p * at_max).sum(axis=1, keepdims=True)
    log_softmax_jvp = np.where(at_max == 1, q, -p_max)  # J e_max
    for dtype, rtol in ((np.float32, 1e-6), (np.float64, 2e-15)):
        xs, e = x.astype(dtype), at_max.astype(dtype)
        np.testing.assert_allclose(dsl.jvp(STD.log_softmax, (xs,), (e,))[1], log_softmax_jvp,
                                   rtol=rtol)
