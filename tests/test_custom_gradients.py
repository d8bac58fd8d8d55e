"""Higher orders and the rest of custom-gradient semantics (issue: chained
grad blocks, params, recompute, pass-through, Tape, NaN-safe where)."""
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from helpers import central_difference

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

LEAKY_BODY = """
def leaky_relu(x, alpha: const = 0.2):
    y = maximum(x, x * alpha)
    return y
"""
BLOCK1 = "grad(dy):\n    return where(y >= 0, dy, dy * alpha)\n"
BLOCK2 = "grad(ddx):\n    return dy=where(y >= 0, ddx, ddx * alpha), x=0\n"
R1 = """
def discriminator(x, w):
    return sum(leaky_relu(x * w))

def r1_penalty(x, w):
    g = grad(discriminator, wrt=0)(x, w)
    return sum(g * g)
"""


@pytest.mark.parametrize("blocks", ["", BLOCK1, BLOCK1 + BLOCK2], ids=["none", "one", "two"])
def test_stylegan_r1_is_identical_with_zero_one_and_two_blocks(blocks):
    m = dsl.loads(LEAKY_BODY + blocks + R1)
    x = np.array([-2.0, -0.5, 0.5, 3.0])
    w = np.array([1.5, -1.0, 2.0, 0.7])
    np.testing.assert_allclose(dsl.grad(m.discriminator)(x, w), [0.3, -1.0, 2.0, 0.7])
    np.testing.assert_allclose(m.r1_penalty(x, w), 5.58)
    dx, dw = dsl.grad(m.r1_penalty, wrt=(0, 1))(x, w)
    np.testing.assert_allclose(dw, [0.12, -2.0, 4.0, 1.4])
    np.testing.assert_array_equal(dx, np.zeros(4))


def test_stylegan_example_passes_the_gradient_check():
    m = dsl.load(EXAMPLES / "stylegan_r1.grad")
    x, w = np.array([-2.0, -0.5, 0.5, 3.0]), np.array([1.5, -1.0, 2.0, 0.7])
    checks = dsl.check_gradients(m.r1_penalty, x, w) + dsl.check_gradients(m.leaky_relu, x)
    assert checks and all(c.ok for c in checks), [str(c) for c in checks]
    assert any(c.source.startswith("grad block 2") for c in checks)


def test_second_derivative_of_log1pexp_is_sigmoid_derivative():
    m = dsl.load(EXAMPLES / "log1pexp.grad")
    x = np.linspace(-30, 30, 61)
    s = 1 / (1 + np.exp(-x))
    np.testing.assert_allclose(dsl.grad(dsl.grad(m.log1pexp))(x), s * (1 - s), rtol=0, atol=1e-12)
    np.testing.assert_allclose(dsl.hvp(m.log1pexp)(x, np.ones_like(x)), s * (1 - s), atol=1e-12)


def test_a_block_with_no_symmetric_hessian_gives_hvp_its_transpose_product():
    # the block is no function's derivative: grad_i = x[0] for every i, so
    # H = hessian = [[1, 0, 0]] * 3; jvp(grad) is H v, hvp (reverse over
    # reverse) v^T H, as documented (language.md, forward mode)
    m = dsl.loads("def f(x):\n    return x * x\ngrad(dy):\n    return dy * x[0]\n")
    x, v = np.array([1.0, 2.0, 3.0]), np.array([1.0, 10.0, 100.0])
    h = dsl.hessian(m.f)(x)
    np.testing.assert_array_equal(h, [[1.0, 0.0, 0.0]] * 3)
    np.testing.assert_array_equal(dsl.jacrev(dsl.grad(m.f))(x), h)
    np.testing.assert_array_equal(dsl.jvp(dsl.grad(m.f), (x,), (v,))[1], h @ v)
    np.testing.assert_array_equal(dsl.hvp(m.f)(x, v), h.T @ v)


TRANSPOSE_ONLY = """
def log1pexp(x):
    e = exp(x)
    return log(1 + e)
grad(dy):
    return dy * (1 - 1 / (1 + e))
grad(ddx):
    return dy=ddx * (1 - 1 / (1 + e)), x=0
"""


SAFE_NORM = """
def norm(x):
    n = sqrt(sum(x * x))
    return n
grad(dy):
    return dy * x / where(n > 0.0, n, 1.0)

def scaled(x, y):
    return norm(x) * y

def cube(x):
    return x * x * x
grad(dy):
    return dy * 3.0
"""


def test_a_blocks_value_is_differentiated_by_the_block_at_second_order_too():
    # the gradient of norm(x) * y along y is norm(x): its derivative along
    # x is the block's, 0 at x = 0, as along the other path (the body's
    # x / sqrt(0) made H[y][x] NaN, an asymmetric Hessian); JAX's
    # custom_vjp takes the body there, this follows the block
    m = dsl.loads(SAFE_NORM)
    x, y = np.zeros(2), np.array(2.0)
    h = dsl.hessian(m.scaled, wrt=(0, 1))(x, y)
    np.testing.assert_array_equal(h[0][1], [0.0, 0.0])
    np.testing.assert_array_equal(h[1][0], [0.0, 0.0])
    np.testing.assert_array_equal(h[0][0], 2 * np.eye(2))  # d/dx of y * x / 1
    # reverse over reverse: the residual n, which no cotangent reaches,
    # is not differentiated (a zero cotangent through sqrt at 0 was NaN)
    np.testing.assert_array_equal(dsl.grad(dsl.grad(m.scaled, wrt=1), wrt=0)(x, y), [0.0, 0.0])
    # and nested tapes, whose backward pass also computes x's cotangent:
    # the residual's zero cotangent goes through the body where-masked
    with dsl.Tape() as outer:
        outer.watch(x)
        with dsl.Tape() as inner:
            inner.watch(y)
            z = m.scaled(x, y)
        norm_x = inner.gradient(z, y)
    np.testing.assert_array_equal(outer.gradient(norm_x, x), [0.0, 0.0])
    x = np.array([3.0, 4.0])
    h = dsl.hessian(m.scaled, wrt=(0, 1))(x, y)
    np.testing.assert_allclose(h[1][0], x / 5, rtol=1e-15)
    np.testing.assert_allclose(h[0][1], x / 5, rtol=1e-15)
    # a block that is not the body's derivative: cube' is 3 by decree, so
    # d2/dx2 cube(x) * x = d/dx (3 x + cube(x)) = 6 (not 3 + 3 x^2)
    c = dsl.loads(SAFE_NORM + "def g(x):\n    return cube(x) * x\n")
    np.testing.assert_array_equal(dsl.hessian(c.g)(np.array([2.0])), [[6.0]])
    np.testing.assert_array_equal(dsl.grad(dsl.grad(c.g))(np.array([2.0])), [6.0])
    np.testing.assert_array_equal(dsl.hvp(c.g)(np.array([2.0]), np.array([0.5])), [3.0])


def test_transpose_only_second_block_is_reported_and_autodiff_is_right():
    bad = dsl.loads(TRANSPOSE_ONLY)
    x = np.array([-1.0, 0.5, 2.0])
    checks = {c.order: c for c in dsl.check_gradients(bad.log1pexp, x)
              if c.wrt == "x" and c.dtype == "f64"}
    assert checks[1].ok
    assert not checks[2].ok and checks[2].source == "grad block 2 (line 7)"
    # Without the override, differentiating the first block is right.
    good = dsl.load(EXAMPLES / "log1pexp.grad")
    h = dsl.grad(dsl.grad(good.log1pexp))(x)
    fd = central_difference(lambda v: dsl.grad(good.log1pexp)(v), [x], 0)
    np.testing.assert_allclose(h, fd, rtol=1e-6)


def test_linear_poly_values_gradients_and_the_tf_block():
    m = dsl.load(EXAMPLES / "linear_poly.grad")
    m.params["weights"] = np.ones(2)
    x = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(m.linear_poly(x), [2.0, 3.0, 4.0])
    dx, dw = dsl.grad(m.linear_poly, wrt=(0, "weights"))(x)
    np.testing.assert_allclose(dx, [1.0, 1.0, 1.0])
    np.testing.assert_allclose(dw, [3.0, 6.0])
    assert all(c.ok for c in dsl.check_gradients(m.linear_poly, x))

    tf_doc = (EXAMPLES / "linear_poly.grad").read_text().replace(
        "stack([sum(dpoly), sum(dpoly * x)])", "stack([sum(dpoly * x), sum(dpoly)])")
    bad = dsl.loads(tf_doc, "tf_linear_poly.grad")
    bad.params["weights"] = np.ones(2)
    np.testing.assert_allclose(dsl.grad(bad.linear_poly, wrt="weights")(x), [6.0, 3.0])
    failed = [c for c in dsl.check_gradients(bad.linear_poly, x) if not c.ok]
    # reverse mode and forward mode (the block transposed) both follow the block
    assert [(c.order, c.wrt) for c in failed] == [(1, "weights"), (1, "jvp:weights")]
    assert failed[0].source == "grad block 1 (line 7)"


def test_a_block_of_several_results_that_sums_its_upstream():
    # w's cotangent sums dy over the rows: autodiff unpacked the call's
    # outputs as one when looking for a where-mask (a ValueError escaped)
    m = dsl.loads("""
def two(x, w):
    return x * w, sum(w * w)
grad(dy, dz):
    return x=dy * w, w=sum(dy * x, axis=0) + 2.0 * dz * w

def loss(x, w):
    a, b = two(x, w)
    return sum(a * a) + b
""")
    x, w = np.arange(6.0).reshape(3, 2) / 4, np.array([0.5, -1.5])
    np.testing.assert_allclose(dsl.grad(m.loss, wrt=1)(x, w), 2 * (x * x).sum(0) * w + 2 * w,
                               rtol=1e-15)


def test_unset_param_is_a_clear_error():
    m = dsl.load(EXAMPLES / "linear_poly.grad")
    # at the function's definition, as every other bad argument (it had no
    # position), for a call and for a transform alike
    for call in (m.linear_poly, dsl.jacfwd(m.linear_poly), dsl.grad(m.linear_poly)):
        with pytest.raises(dsl.ArgumentError, match=r"linear_poly.grad:\d+:\d+: error: "
                                                    "linear_poly\\(\\) reads param 'weights', "
                                                    "which is not set"):
            call(np.ones(3))
    with pytest.raises(dsl.ArgumentError, match="size 3 on axis 0, but its annotation says 2"):
        m.params["weights"] = np.ones(3)
    with pytest.raises(dsl.ArgumentError, match="no param 'bias'"):
        m.params["bias"] = 1.0


def test_params_flow_through_calls():
    m = dsl.loads("param s: f64\n\ndef inner(x):\n    return s * x\n\n"
                  "def outer(x):\n    return inner(x) * inner(x)\n")
    m.params["s"] = 3.0
    x = np.array([1.0, 2.0])
    np.testing.assert_allclose(m.outer(x), 9 * x * x)
    dx, ds = dsl.grad(m.outer, wrt=(0, "s"))(x)
    np.testing.assert_allclose(dx, 18 * x)
    np.testing.assert_allclose(ds, np.sum(2 * 3.0 * x * x))


@pytest.mark.parametrize("source,text", [
    ("param w: f64[2]\ndef f(x):\n    return w[0] * x\ngrad(d):\n    return d * w[0]\n",
     "missing the cotangent for 'w'"),
    ("def f(x):\n    return x * x\ngrad(d):\n    return d * 2 * x\ngrad(a, b):\n"
     "    return a, b\n", "takes 2 upstream cotangent(s), but there are 1"),
    ("def f(x):\n    return x * x\ngrad(d):\n    return d * 2 * x\ngrad(dd):\n"
     "    return dd * 2 * x, 2 * d * dd, dd\n", "returns 3 cotangent(s)"),
    ("@pass_through\ndef q(x):\n    return round(x)\ngrad(d):\n    return d\n",
     "cannot have a grad block"),
    ("param w: f64\ndef f(w):\n    return w\n", "shadow the module param 'w'"),
])
def test_custom_gradient_contract_errors_at_load(source, text):
    with pytest.raises(dsl.GradError) as info:
        dsl.loads(source, "bad.grad")
    assert text in info.value.message
    assert info.value.line > 1 and info.value.col >= 1


@pytest.fixture(scope="module")
def checkpoint():
    return dsl.load(EXAMPLES / "checkpoint.grad")


def test_recompute_equals_plain_and_keeps_only_inputs(checkpoint):
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(4, 8)), rng.normal(size=(8, 8)) / 3
    np.testing.assert_allclose(checkpoint.checkpointed(x, w), checkpoint.plain(x, w), rtol=1e-14)
    g_c = dsl.grad(checkpoint.checkpointed, wrt=(0, 1))(x, w)
    g_p = dsl.grad(checkpoint.plain, wrt=(0, 1))(x, w)
    for a, b in zip(g_c, g_p):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    for wrt in (0, 1):
        np.testing.assert_allclose(dsl.grad(dsl.grad(checkpoint.checkpointed), wrt=wrt)(x, w),
                                   dsl.grad(dsl.grad(checkpoint.plain), wrt=wrt)(x, w),
                                   rtol=1e-10)
    out_c, pb_c = dsl.vjp(checkpoint.checkpointed, x, w)
    out_p, pb_p = dsl.vjp(checkpoint.plain, x, w)
    activation = out_p.nbytes
    assert pb_c.residual_bytes <= x.nbytes + w.nbytes
    assert pb_p.residual_bytes >= 20 * activation
    for a, b in zip(pb_c(np.ones_like(out_c)), pb_p(np.ones_like(out_p))):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_a_recomputed_function_with_a_default_number_differentiates():
    # the stage's barrier on the default (a literal once inlined) reached
    # the driver, which has no code for one: NotImplementedError
    m = dsl.loads("@recompute\ndef f(x, k = 1.5):\n    return sin(x) * k\n")
    x = np.array([0.3, -1.2, 2.0])
    np.testing.assert_allclose(dsl.grad(m.f)(x), 1.5 * np.cos(x), rtol=1e-14)
    np.testing.assert_allclose(dsl.grad(m.f)(x), central_difference(m.f, [x], 0), rtol=1e-8)


def test_recomputed_layers_share_their_kernels(checkpoint):
    # 20 equal layers are 20 equal loops forward and about as many again
    # backward: they must run a handful of kernels (one Numba compile
    # each), and the checkpointed gradient the same ones as the plain one.
    x, w = np.ones((2, 3)), np.ones((3, 3))
    plain, checkpointed = (f.program(f.bind((x, w), {})).generated
                           for f in (dsl.grad(checkpoint.plain, wrt=(0, 1)),
                                     dsl.grad(checkpoint.checkpointed, wrt=(0, 1))))
    assert len(plain.kernel_names) >= 40 and len(plain.kernels) <= 4
    assert set(checkpointed.kernel_names) == set(plain.kernel_names)
    assert plain.kernel_modules == checkpointed.kernel_modules


def test_pass_through_rounds_forward_and_is_identity_backward():
    m = dsl.load(EXAMPLES / "straight_through.grad")
    x = np.array([0.1234, 0.5, -0.3])
    np.testing.assert_allclose(m.quantize(x), np.round(x * 255) / 255)
    np.testing.assert_array_equal(dsl.grad(m.quantize)(x), np.ones(3))
    t = np.zeros(3)
    np.testing.assert_allclose(dsl.grad(m.quantized_loss)(x, t), 2 * (np.round(x * 255) / 255))


def test_tape_chains_calls_and_nested_tapes_give_second_order():
    m = dsl.load(EXAMPLES / "log1pexp.grad")
    b = dsl.load(EXAMPLES / "bar.grad")
    x = np.array([0.5, -1.0, 2.0])
    unrelated = np.ones(3)
    with dsl.Tape(persistent=True) as tape:
        tape.watch(x, unrelated)
        z = b.bar(m.log1pexp(x), x)
    s = 1 / (1 + np.exp(-x))
    np.testing.assert_allclose(tape.gradient(z, x), s * x + np.logaddexp(0, x))
    assert tape.gradient(z, [x, unrelated])[1] is None
    with dsl.Tape() as outer:
        outer.watch(x)
        with dsl.Tape() as inner:
            inner.watch(x)
            y = b.bar(m.log1pexp(x), m.log1pexp(x))
        g = inner.gradient(y, x)
    h = outer.gradient(g, x)
    # y = softplus(x)**2: g = 2 softplus(x) s, h = 2 s**2 + 2 softplus(x) s (1 - s)
    softplus = np.logaddexp(0, x)
    np.testing.assert_allclose(g, 2 * softplus * s, rtol=1e-12)
    np.testing.assert_allclose(h, 2 * s * s + 2 * softplus * s * (1 - s), rtol=1e-12)
    with pytest.raises(dsl.GradError, match="one gradient"):
        inner.gradient(y, x)


def test_where_gradient_ignores_the_branch_not_taken():
    m = dsl.loads("def f(x):\n    return where(x > 0, sqrt(x), 0)\n"
                  "def g(x):\n    return where(x > 0, x * log(x), -x)\n")
    x = np.array([-1.0, 0.0, 4.0])
    np.testing.assert_array_equal(dsl.grad(m.f)(x), [0.0, 0.0, 0.25])
    np.testing.assert_allclose(dsl.grad(dsl.grad(m.f))(x), [0.0, 0.0, -1 / 32])
    np.testing.assert_allclose(dsl.grad(m.g)(x), [-1.0, -1.0, np.log(4) + 1])
    np.testing.assert_allclose(dsl.grad(dsl.grad(m.g))(x), [0.0, 0.0, 0.25])


def test_a_blocks_where_masks_the_cotangent_it_gives_as_the_where_itself_does():
    # r's block selects by x > 0, as where(x > 0, x, 0) would: the cotangent
    # of sqrt(x) at x = 0 took 0 from it and met sqrt's infinite slope,
    # 0 * inf = NaN (0 without the block); rr's second block, reached by
    # reverse over reverse, likewise
    m = dsl.loads("def r(x):\n    return where(x > 0, x, 0.0)\ngrad(d):\n"
                  "    return where(x > 0, d, 0.0)\ndef f(x):\n    return sum(r(sqrt(x)))\n"
                  "def rr(x):\n    return where(x > 0, x * x, 0.0)\ngrad(d):\n"
                  "    return where(x > 0, d * 2.0 * x, 0.0)\ngrad(dd):\n"
                  "    return x=where(x > 0, dd * 2.0 * d, 0.0), d=where(x > 0, dd * 2.0 * x, 0.0)\n"
                  "def g(x):\n    return sum(sqrt(rr(x)) * x)\n")
    np.testing.assert_array_equal(dsl.grad(m.f)(np.array([0.0, 4.0])), [0.0, 0.25])
    x = np.array([-1.0, 0.0, 4.0])
    np.testing.assert_array_equal(dsl.grad(dsl.grad(m.g))(x), [0.0, 0.0, 2.0])


def test_a_blocks_where_masks_its_value_before_a_sum_and_in_a_loop():
    # the block's masked term 0 * (0.5 / sqrt(x)) (NaN at x <= 0) was
    # re-selected only as the block's result: `+ d` (which has no mask)
    # or a loop around it left NaN in reverse mode, where the transpose
    # (forward mode, `dsl.jvp`) and the block without them give d's part
    m = dsl.loads("def s(x):\n    return sqrt(where(x > 0, x, 0)) + x\ngrad(d):\n"
                  "    return where(x > 0, d, 0) * 0.5 / sqrt(x) + d\n"
                  "def l(x):\n    return sqrt(where(x > 0, x, 0))\ngrad(d):\n"
                  "    acc = zeros_like(d)\n    for i in range(2):\n"
                  "        acc = acc + where(x > 0, d, 0) * 0.25 / sqrt(x)\n    return acc\n")
    x, t = np.array([-1.0, 0.0, 4.0]), np.array([2.0, 3.0, 5.0])
    slope = np.array([0.0, 0.0, 0.25])
    np.testing.assert_array_equal(dsl.vjp(m.s, x)[1](t)[0], (slope + 1) * t)
    np.testing.assert_array_equal(dsl.vjp(m.l, x)[1](t)[0], slope * t)


def test_a_blocks_where_mask_comes_out_of_its_loop():
    # the mask of the where the loop sums (hoisted out of its body) stayed
    # in the loop: the cotangent of sqrt(x) at x = 0 was 0 * inf = NaN in
    # reverse mode, 0 without the loop and in forward mode
    m = dsl.loads("def r(x):\n    return where(x > 0, x, 0.0)\ngrad(d):\n"
                  "    acc = zeros_like(d)\n    for i in range(2):\n"
                  "        acc = acc + where(x > 0, d, 0.0) * 0.5\n    return acc\n"
                  "def f(x):\n    return sum(r(sqrt(x)))\n")
    np.testing.assert_array_equal(dsl.grad(m.f)(np.array([0.0, 4.0])), [0.0, 0.25])


def test_a_recomputed_blocks_where_masks_the_cotangent_it_gives():
    # @recompute's rerun of x takes the cotangent as a token (its barrier),
    # which was taken for a value computed from it: x > 0 then masked
    # nothing, and the cotangent of sqrt(x) at x = 0 was 0 * inf = NaN,
    # as was the block's own 0 * (0.5 / sqrt(x)) at x <= 0
    m = dsl.loads("@recompute\ndef r(x):\n    return where(x > 0, x, 0.0)\ngrad(d):\n"
                  "    return where(x > 0, d, 0.0)\ndef f(x):\n    return sum(r(sqrt(x)))\n"
                  "@recompute\ndef s(x):\n    return sqrt(where(x > 0, x, 0)) + x\ngrad(d):\n"
                  "    return where(x > 0, d, 0) * 0.5 / sqrt(x) + d\n")
    np.testing.assert_array_equal(dsl.grad(m.f)(np.array([0.0, 4.0])), [0.0, 0.25])
    x, t = np.array([-1.0, 0.0, 4.0]), np.array([2.0, 3.0, 5.0])
    np.testing.assert_array_equal(dsl.vjp(m.s, x)[1](t)[0], [2.0, 3.0, 6.25])


STD = dsl.loads("from std import softplus, log_sigmoid, logsumexp, relu, leaky_relu, gelu, "
                "sigmoid\n"
                "def lse_rows(x):\n    return logsumexp(x, axis=1)\n")
REFERENCE = {
    "softplus": lambda x: np.logaddexp(0, x),
    "log_sigmoid": lambda x: -np.logaddexp(0, -x),
    "relu": lambda x: np.maximum(x, 0),
    "leaky_relu": lambda x: np.where(x >= 0, x, 0.01 * x),
    "gelu": lambda x: 0.5 * x * (1 + np.vectorize(__import__("math").erf)(x / np.sqrt(2))),
}


@pytest.mark.parametrize("name", sorted(REFERENCE))
@settings(max_examples=10, deadline=None)
@given(st.lists(st.floats(-20, 20).filter(lambda v: abs(v) > 1e-3), min_size=1, max_size=6))
def test_stdlib_values_and_gradients(name, xs):
    f = getattr(STD, name)
    x = np.array(xs)
    np.testing.assert_allclose(f(x), REFERENCE[name](x), rtol=1e-12, atol=1e-14)
    fd = central_difference(REFERENCE[name], [x], 0)
    np.testing.assert_allclose(dsl.grad(f)(x), fd, rtol=1e-6, atol=1e-8)


def test_stdlib_is_stable_at_extremes():
    x = np.array([-1000.0, 1000.0])
    sig = dsl.loads("from std import sigmoid\ndef s(x):\n    return sigmoid(x)\n").s
    np.testing.assert_array_equal(sig(x), [0.0, 1.0])
    np.testing.assert_array_equal(dsl.grad(sig)(x), [0.0, 0.0])
    np.testing.assert_array_equal(dsl.grad(STD.softplus)(x), [0.0, 1.0])
    np.testing.assert_array_equal(dsl.grad(STD.log_sigmoid)(x), [1.0, 0.0])
    np.testing.assert_array_equal(STD.log_sigmoid(x), [-1000.0, 0.0])
    rows = np.array([[1000.0, 1000.0, -5.0], [1.0, 2.0, 3.0]])
    np.testing.assert_allclose(STD.lse_rows(rows), [1000 + np.log(2), np.log(np.exp([1, 2, 3]).sum())])
    g = dsl.grad(STD.lse_rows)(rows)
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g.sum(axis=1), [1.0, 1.0])


def test_hvp_matches_finite_differences_of_the_gradient():
    m = dsl.load(EXAMPLES / "dense.grad")
    rng = np.random.default_rng(2)
    x, w, b, t = (rng.normal(size=s) for s in [(3, 4), (4, 2), (2,), (3, 2)])
    v = rng.normal(size=w.shape)
    h = dsl.hvp(m.loss, wrt=1)(x, w, b, t, v)
    grad_w = dsl.grad(m.loss, wrt=1)
    eps = 1e-5
    fd = (grad_w(x, w + eps * v, b, t) - grad_w(x, w - eps * v, b, t)) / (2 * eps)
    np.testing.assert_allclose(h, fd, rtol=1e-6, atol=1e-8)


INTEGER_CALLS = dsl.loads("""
from std import relu
def bar(x, y):
    return x * y
grad(u):
    return u * y, u * x
def square(x):
    return x * x
grad(dy):
    return 2 * x * dy
grad(ddx):
    return dy=2 * x * ddx, x=2 * dy * ddx
@recompute
def cube(x):
    return x * x * x
grad(dy):
    return 3 * x * x * dy
def uses(x, y):
    return sum(bar(x, y)) + sum(relu(x - 2))
""")


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_])
def test_a_function_with_grad_blocks_computes_on_integers_and_bools(dtype):
    # Its blocks are written for floats; on integers nothing flows back (an
    # integer carries no gradient), so they do not apply: no upstream
    # cotangent to be linear in, and no error saying it is not.
    x, y = np.array([1, 3, 0], dtype), np.array([2, 1, 1], dtype)
    m = INTEGER_CALLS
    want = x * y  # NumPy's bool; the language's i64, as Python's True * True
    assert np.array_equal(m.bar(x, y), want)
    assert m.bar(x, y).dtype == (want.dtype if dtype is not np.bool_ else np.int64)
    assert np.array_equal(m.square(x), x * x) and np.array_equal(m.cube(x), x * x * x)
    assert m.uses(x, y) == np.sum(x * y) + np.sum(np.maximum(x - 2, 0))
    value, tangent = dsl.jvp(m.bar, (x, y), (None, None))
    assert np.array_equal(value, want) and not np.any(tangent)
    # an integer with a float still goes through the block
    assert np.array_equal(dsl.grad(m.uses, wrt=1)(x, y * 1.0), x)
