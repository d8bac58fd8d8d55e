"""`conv1d` / `conv2d` (PyTorch's, without bias, groups or dilation):
values against a NumPy reference and torch.nn.functional, f32 and f64;
gradients w.r.t. input and weight and an R1-like penalty (the gradient of
a gradient) against central differences in f64; jvp against jacrev,
jacfwd, the Hessian, vmap; a grad block written with convolutions (the
linearity check); the CUDA simulator; Dask blocks of images; every misuse
a GradError at its position."""
import importlib.util
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from helpers import central_difference, optional_module

# (function, spatial axes, stride, padding, input shape, weight shape)
CASES = [
    ("plain", 2, (1, 1), (0, 0), (2, 3, 6, 5), (4, 3, 3, 3)),
    ("strided", 2, (2, 2), (1, 1), (2, 3, 7, 6), (4, 3, 3, 2)),
    ("pairs", 2, (2, 1), (1, 2), (1, 2, 5, 4), (3, 2, 2, 3)),
    ("positional", 2, (3, 3), (2, 2), (2, 1, 8, 8), (2, 1, 4, 4)),
    ("pointwise", 2, (1, 1), (0, 0), (2, 3, 4, 4), (5, 3, 1, 1)),
    ("whole", 2, (1, 1), (1, 1), (1, 2, 3, 3), (2, 2, 5, 5)),  # kernel = padded input
    ("line", 1, (2,), (1,), (2, 3, 9), (4, 3, 3)),
    ("line_plain", 1, (1,), (0,), (3, 2, 6), (2, 2, 6)),
]

SOURCE = '''
from std import softplus

def plain(x, w):
    return conv2d(x, w)

def strided(x, w):
    return conv2d(x, w, stride=2, padding=1)

def pairs(x, w):
    return conv2d(x, w, stride=(2, 1), padding=[1, 2])

def positional(x, w):
    return conv2d(x, w, 3, 2)

def pointwise(x, w):
    return conv2d(x, w)

def whole(x, w):
    return conv2d(x, w, padding=1)

def line(x, w):
    return conv1d(x, w, stride=2, padding=1)

def line_plain(x, w):
    return conv1d(x, w)

def any_conv(x, w, sh: i64, sw: i64, ph: i64, pw: i64):
    return conv2d(x, w, stride=(sh, sw), padding=(ph, pw))

def by_argument(x, w, s: i64):
    return conv2d(x, w, stride=s, padding=s - 1)

def loss(x, w):
    return sum(sin(conv2d(x, w, stride=2, padding=1)))

# a discriminator's R1 penalty: the squared gradient w.r.t. its input
def discriminator(x, w):
    return sum(softplus(conv2d(x, w, stride=2, padding=1)))

def r1(x, w):
    g = grad(discriminator, wrt=0)(x, w)
    return sum(g * g)

# a grad block of convolutions (stride 1): linear in g
def same(x, w):
    return conv2d(x, w, padding=1)
grad(g):
    flipped = transpose(w[:, :, ::-1, ::-1], (1, 0, 2, 3))
    per_channel = conv2d(transpose(x, (1, 0, 2, 3)), transpose(g, (1, 0, 2, 3)), padding=1)
    return x=conv2d(g, flipped, padding=1), w=transpose(per_channel, (1, 0, 2, 3))

def same_loss(x, w):
    return sum(sin(same(x, w)))
'''

M = dsl.loads(SOURCE, "conv.grad")
RNG = np.random.default_rng(11)


def normal(*shapes):
    return [RNG.normal(size=s) for s in shapes]


def _kernel_slices(offset, stride, out):
    return (slice(None), slice(None)) + tuple(
        slice(o, o + s * (m - 1) + 1, s) for o, s, m in zip(offset, stride, out))


def np_conv(x, w, stride, padding):
    """The convolution by hand: one product per kernel offset."""
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    out = [(s - k) // st + 1 for s, k, st in zip(xp.shape[2:], w.shape[2:], stride)]
    y = np.zeros((x.shape[0], w.shape[0], *out), dtype=np.result_type(x, w))
    for offset in np.ndindex(*w.shape[2:]):
        patch = xp[_kernel_slices(offset, stride, out)]
        y += np.einsum("nc...,oc->no...", patch, w[(slice(None), slice(None)) + offset])
    return y


def np_conv_input_vjp(g, w, x_shape, stride, padding):
    """g's pullback to the input: each offset's patch gradient added back."""
    xp = np.zeros(x_shape[:2] + tuple(s + 2 * p for s, p in zip(x_shape[2:], padding)))
    for offset in np.ndindex(*w.shape[2:]):
        xp[_kernel_slices(offset, stride, g.shape[2:])] += np.einsum(
            "no...,oc->nc...", g, w[(slice(None), slice(None)) + offset])
    return xp[(slice(None), slice(None)) + tuple(slice(p, p + s)
                                                 for p, s in zip(padding, x_shape[2:]))]


def np_loss(x, w):
    return np.sum(np.sin(np_conv(x, w, (2, 2), (1, 1))))


def np_r1(x, w):
    y = np_conv(x, w, (2, 2), (1, 1))
    g = np_conv_input_vjp(1 / (1 + np.exp(-y)), w, x.shape, (2, 2), (1, 1))
    return np.sum(g * g)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_values_match_numpy_in_f64_and_f32(case):
    name, _, stride, padding, x_shape, w_shape = case
    x, w = normal(x_shape, w_shape)
    expected = np_conv(x, w, stride, padding)
    result = getattr(M, name)(x, w)
    assert result.shape == expected.shape and result.dtype == np.float64
    np.testing.assert_allclose(result, expected, rtol=1e-12, atol=1e-12)
    result = getattr(M, name)(x.astype(np.float32), w.astype(np.float32))
    assert result.dtype == np.float32
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)


def test_values_match_torch():
    if importlib.util.find_spec("torch") is None:
        pytest.skip("the torch extra is not installed: compared with NumPy only")
    import torch
    functional = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d}
    for name, d, stride, padding, x_shape, w_shape in CASES:
        x, w = normal(x_shape, w_shape)
        expected = functional[d](torch.from_numpy(x), torch.from_numpy(w), stride=stride,
                                 padding=padding).numpy()
        np.testing.assert_allclose(getattr(M, name)(x, w), expected, rtol=1e-12, atol=1e-12,
                                   err_msg=name)


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_any_shape_stride_and_padding_matches_numpy(data):
    # strides and paddings from integer arguments: a program per value
    n, c, o = (data.draw(st.integers(1, 3)) for _ in range(3))
    stride, padding = ([data.draw(st.integers(low, 3)) for _ in range(2)] for low in (1, 0))
    size = [data.draw(st.integers(1, 6)) for _ in range(2)]
    kernel = [data.draw(st.integers(1, s + 2 * p)) for s, p in zip(size, padding)]
    x, w = normal((n, c, *size), (o, c, *kernel))
    np.testing.assert_allclose(M.any_conv(x, w, *stride, *padding),
                               np_conv(x, w, stride, padding), rtol=1e-12, atol=1e-12)


def test_stride_from_an_integer_argument_is_compiled_for_its_value():
    x, w = normal((1, 2, 7, 7), (3, 2, 3, 3))
    for s in (1, 2):
        np.testing.assert_allclose(M.by_argument(x, w, s), np_conv(x, w, (s, s), (s - 1, s - 1)),
                                   atol=1e-12)


def test_gradients_match_central_differences():
    x, w = normal((2, 2, 5, 4), (3, 2, 3, 3))
    gx, gw = dsl.grad(M.loss, wrt=(0, 1))(x, w)
    np.testing.assert_allclose(gx, central_difference(np_loss, (x, w), 0), atol=1e-7)
    np.testing.assert_allclose(gw, central_difference(np_loss, (x, w), 1), atol=1e-7)


def test_the_products_are_of_columns_of_the_batch_and_output_positions_or_of_rows(monkeypatch):
    """The weight times the im2col columns, (O, taps) @ (taps, N * prod(out)),
    and the columns' gradient, (taps, O) @ (O, N * prod(out)): results with
    long rows, which OpenBLAS computes faster than their transposes
    (`compiler.convolution`)."""
    from gradlang.runtime import cpu
    products, matmul = [], cpu.matmul
    monkeypatch.setattr(cpu, "matmul",
                        lambda a, b: products.append((*a.shape, b.shape[1])) or matmul(a, b))
    x, w = normal((2, 2, 5, 4), (3, 2, 3, 3))  # (as above: the same program)
    dsl.grad(M.loss, wrt=(0, 1))(x, w)
    columns, taps = 2 * 3 * 2, 2 * 3 * 3  # (N * prod(out), C * KH * KW)
    assert sorted(products) == sorted([(3, taps, columns), (3, columns, taps),
                                       (taps, 3, columns)])
    # an output of one position along its last axis is rows, (N * prod(out),
    # taps) @ (taps, O), whose window copies run along the channels
    products.clear()
    x, w = normal((3, 2, 3, 3), (2, 2, 5, 5))  # (whole: the kernel is the padded input)
    dsl.grad(M.whole, wrt=(0, 1))(x, w)
    rows, taps = 3, 2 * 5 * 5  # (the gradient of a sum of it: no forward product)
    assert sorted(products) == sorted([(rows, 2, taps), (taps, rows, 2)])


def test_the_gradient_of_an_r1_penalty_matches_central_differences():
    x, w = normal((2, 2, 5, 5), (3, 2, 3, 3))
    np.testing.assert_allclose(M.r1(x, w), np_r1(x, w), rtol=1e-12)
    np.testing.assert_allclose(dsl.grad(M.r1, wrt=1)(x, w), central_difference(np_r1, (x, w), 1),
                               rtol=1e-6, atol=1e-6)


def test_forward_mode_jacobians_hessian_and_vmap():
    x, w, tx, tw = normal((1, 2, 5, 4), (3, 2, 3, 2), (1, 2, 5, 4), (3, 2, 3, 2))
    value, tangent = dsl.jvp(M.pairs, (x, w), (tx, tw))
    conv = lambda x, w: np_conv(x, w, (2, 1), (1, 2))  # noqa: E731
    np.testing.assert_allclose(value, conv(x, w), atol=1e-12)
    np.testing.assert_allclose(tangent, conv(tx, w) + conv(x, tw), atol=1e-12)
    jx, jw = dsl.jacrev(M.pairs, wrt=(0, 1))(x, w)
    out = value.shape
    via_jacobian = jx.reshape(out + (-1,)) @ tx.ravel() + jw.reshape(out + (-1,)) @ tw.ravel()
    np.testing.assert_allclose(tangent, via_jacobian, atol=1e-12)
    np.testing.assert_allclose(dsl.jacfwd(M.pairs, wrt=1)(x, w), jw, atol=1e-12)
    # the Hessian w.r.t. the weight against differences of the gradient
    x, w = normal((1, 2, 4, 4), (2, 2, 3, 3))
    hessian = dsl.hessian(M.loss, wrt=1)(x, w).reshape(w.size, w.size)
    gradient, eps = dsl.grad(M.loss, wrt=1), 1e-5
    for k in range(0, w.size, 5):
        step = np.zeros(w.size)
        step[k] = eps
        step = step.reshape(w.shape)
        numeric = (gradient(x, w + step) - gradient(x, w - step)) / (2 * eps)
        np.testing.assert_allclose(hessian[:, k], numeric.ravel(), atol=1e-7)
    xs, ws = normal((3, 2, 3, 7, 6), (3, 4, 3, 3, 2))
    np.testing.assert_allclose(dsl.vmap(M.strided, in_axes=(0, None))(xs, ws[0]),
                               np.stack([np_conv(x, ws[0], (2, 2), (1, 1)) for x in xs]),
                               atol=1e-12)
    np.testing.assert_allclose(dsl.vmap(M.strided)(xs, ws),
                               np.stack([np_conv(x, w, (2, 2), (1, 1)) for x, w in zip(xs, ws)]),
                               atol=1e-12)


def test_a_grad_block_of_convolutions_is_linear_and_used():
    x, w = normal((2, 2, 4, 5), (3, 2, 3, 3))
    value = lambda x, w: np.sum(np.sin(np_conv(x, w, (1, 1), (1, 1))))  # noqa: E731
    gx, gw = dsl.grad(M.same_loss, wrt=(0, 1))(x, w)
    np.testing.assert_allclose(gx, central_difference(value, (x, w), 0), atol=1e-7)
    np.testing.assert_allclose(gw, central_difference(value, (x, w), 1), atol=1e-7)
    # checked when the function is first compiled (a convolution needs its sizes)
    bad = dsl.loads("def f(x, w):\n    return conv2d(x, w)\ngrad(g):\n"
                    "    return x=x * sum(conv2d(g, g)), w=0\n", "bad.grad")
    with pytest.raises(dsl.GradError, match=r"bad.grad:4:22: error: .* not linear .*: "
                                            r"a matrix product of two values that depend"):
        bad.f(x, w)


def test_cuda_simulator_values_and_gradient():
    cuda = dsl.loads(SOURCE, "conv.grad", target="cuda")
    x, w = normal((1, 2, 5, 4), (2, 2, 3, 2))
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-5)):
        result = np.asarray(cuda.strided(x.astype(dtype), w.astype(dtype)))
        assert result.dtype == dtype
        np.testing.assert_allclose(result, np_conv(x, w, (2, 2), (1, 1)), atol=tol)
    gx, gw = dsl.grad(cuda.loss, wrt=(0, 1))(x, w)
    np.testing.assert_allclose(gx, central_difference(np_loss, (x, w), 0), atol=1e-7)
    np.testing.assert_allclose(gw, central_difference(np_loss, (x, w), 1), atol=1e-7)


def test_dask_blocks_of_images():
    dask = optional_module("dask", "dask")
    da = optional_module("dask.array", "dask")
    x, w = normal((6, 2, 5, 4), (3, 2, 3, 3))
    with dask.config.set(scheduler="sync"):
        value, grads = dask.compute(*dsl.value_and_grad(M.loss, wrt=(0, 1))(
            da.from_array(x, chunks=(2, 2, 5, 4)), w))
    expected_value, expected = dsl.value_and_grad(M.loss, wrt=(0, 1))(x, w)
    np.testing.assert_allclose(value, expected_value, rtol=1e-12)
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(got, want, atol=1e-12)


SMALL = [(1, 1, 3, 3), (1, 1, 2, 2)]  # shapes a convolution takes


@pytest.mark.parametrize("call,shapes,message", [
    ("conv2d(a, b)", [(2, 3, 5, 5), (4, 2, 3, 3)],
     r"conv2d\(\) input of shape \[2, 3, 5, 5\] has 3 channels but the weight of shape "
     r"\[4, 2, 3, 3\] takes 2"),
    ("conv2d(a, b, padding=1)", [(1, 1, 3, 3), (1, 1, 6, 4)],
     r"kernel \[6, 4\] is larger than the padded input \[5, 5\] \(input \[3, 3\], padding "
     r"\[1, 1\]\)"),
    ("conv2d(a, b, stride=0)", SMALL, r"stride must be positive, got 0"),
    ("conv2d(a, b, stride=(1, -2))", SMALL,
     r"stride must be positive, got \[1, -2\]"),
    ("conv2d(a, b, padding=-1)", SMALL,
     r"padding must be non-negative, got -1"),
    ("conv2d(a, b, stride=(1, 2, 3))", SMALL,
     r"stride takes one integer or 2 \(one per spatial axis\), got 3"),
    ("conv2d(a, b, stride=1.5)", SMALL,
     r"stride must be an integer, not 1\.5"),
    ("conv2d(a, b, stride=sum(a))", SMALL,
     r"stride must be known when the function is compiled"),
    ("conv2d(a, b)", [(3, 5, 5), (1, 3, 2, 2)],
     r"conv2d\(\) takes an input of rank 4 \(N, C, H, W\), got shape \[3, 5, 5\]"),
    ("conv2d(a, b)", [(1, 3, 5, 5), (3, 2, 2)],
     r"conv2d\(\) takes a weight of rank 4 \(O, C, KH, KW\), got shape \[3, 2, 2\]"),
    ("conv1d(a, b)", [(1, 3, 5, 5), (1, 3, 2, 2)],
     r"conv1d\(\) takes an input of rank 3 \(N, C, L\), got shape \[1, 3, 5, 5\]"),
    ("conv2d(a > 0, b > 0)", SMALL,
     r"needs float arrays \(f32 or f64\), got i64"),
    ("conv2d(a, b, dilation=2)", SMALL,
     r"got an unexpected keyword argument 'dilation'"),
    ("conv2d([a], b)", SMALL, r"takes arrays, not sequences"),
])
def test_misuse_is_a_grad_error_at_its_position(call, shapes, message):
    source = f"def f(a, b):\n    return {call}\n"
    with pytest.raises(dsl.GradError) as info:
        dsl.loads(source, "bad.grad").f(*normal(*shapes))
    err = str(info.value)
    assert err.startswith("bad.grad:2:12: error: "), err
    assert re.search(message, err), err
    assert "^" in err.splitlines()[-1], err
