"""`max_pool1d`/`max_pool2d`/`avg_pool1d`/`avg_pool2d` (PyTorch's, no
dilation, floor mode, averages counting the padding): values against a
NumPy reference, f32 and f64, and torch.nn.functional; gradients against
central differences in f64 and torch's; the gradient of a maximum shared
equally among a window's ties; forward over reverse (second
derivatives), grad of grad of a 2x2 pool, vmap; the CUDA
simulator; Dask blocks of images; every misuse a GradError at its
position."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from helpers import central_difference, optional_module

SOURCE = '''
def pools(x, v):
    return max_pool2d(x, 2), max_pool2d(x, (3, 2), stride=(2, 1), padding=1), \\
        avg_pool2d(x, 3, 2, 1), avg_pool2d(x, kernel_size=2), max_pool1d(v, 3, stride=2), \\
        avg_pool1d(v, 2, padding=1)

def loss(x, v):
    a, b, c, d, e, f = pools(x, v)
    return sum(sin(a)) + sum(sin(b)) + sum(sin(c)) + sum(sin(d)) + sum(sin(e)) + sum(sin(f))

def any_pool(x, kh: i64, kw: i64, sh: i64, sw: i64, ph: i64, pw: i64):
    return max_pool2d(x, (kh, kw), (sh, sw), (ph, pw)), avg_pool2d(x, (kh, kw), (sh, sw), (ph, pw))
'''

M = dsl.loads(SOURCE, "pool.grad")
RNG = np.random.default_rng(3)
# (kind, kernel, stride, padding) of each of pools()'s results, and its input
SPECS = [("max", (2, 2), (2, 2), (0, 0), 0), ("max", (3, 2), (2, 1), (1, 1), 0),
         ("avg", (3, 3), (2, 2), (1, 1), 0), ("avg", (2, 2), (2, 2), (0, 0), 0),
         ("max", (3,), (2,), (0,), 1), ("avg", (2,), (2,), (1,), 1)]


def numpy_pool(x, kind, kernel, stride, padding):
    d = len(kernel)
    fill = -np.inf if kind == "max" else 0.0
    x = np.pad(x, [(0, 0)] * 2 + [(p, p) for p in padding], constant_values=fill)
    out = [(s - k) // st + 1 for s, k, st in zip(x.shape[2:], kernel, stride)]
    result = np.empty(x.shape[:2] + tuple(out), x.dtype)
    for index in itertools.product(*map(range, out)):
        window = x[(Ellipsis,) + tuple(slice(i * st, i * st + k)
                                       for i, st, k in zip(index, stride, kernel))]
        axes = tuple(range(2, 2 + d))
        result[(Ellipsis,) + index] = window.max(axis=axes) if kind == "max" else \
            window.sum(axis=axes) / np.prod(kernel)
    return result


def inputs(dtype=np.float64):
    return RNG.normal(size=(2, 3, 7, 6)).astype(dtype), RNG.normal(size=(2, 3, 9)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_values_match_numpy(dtype):
    args = inputs(dtype)
    for got, (kind, kernel, stride, padding, which) in zip(M.pools(*args), SPECS, strict=True):
        assert got.dtype == dtype
        np.testing.assert_allclose(got, numpy_pool(args[which], kind, kernel, stride, padding),
                                   rtol=1e-6 if dtype == np.float32 else 1e-15,
                                   atol=1e-7 if dtype == np.float32 else 1e-16)


@settings(max_examples=5, deadline=None)
@given(st.data())
def test_any_kernel_stride_and_padding_matches_numpy(data):
    kernel = tuple(data.draw(st.integers(1, 3)) for _ in range(2))
    stride = tuple(data.draw(st.integers(1, 3)) for _ in range(2))
    padding = tuple(data.draw(st.integers(0, k // 2)) for k in kernel)
    shape = tuple(data.draw(st.integers(max(k - 2 * p, 1), 6)) for k, p in zip(kernel, padding))
    x = RNG.normal(size=(1, 2) + shape)
    for got, kind in zip(M.any_pool(x, *kernel, *stride, *padding), ("max", "avg"), strict=True):
        np.testing.assert_allclose(got, numpy_pool(x, kind, kernel, stride, padding),
                                   rtol=1e-14, atol=1e-15)


def test_gradients_match_central_differences_and_torch():
    args = inputs()
    grads = dsl.grad(M.loss, wrt=(0, 1))(*args)
    for k in range(2):
        np.testing.assert_allclose(grads[k], central_difference(M.loss, args, k), atol=1e-7)
    expected = [np.zeros_like(a) for a in args]
    for out, (kind, kernel, stride, padding, which) in zip(M.pools(*args), SPECS, strict=True):
        expected[which] += numpy_pool_vjp(args[which], kind, kernel, stride, padding,
                                          np.cos(out))
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
    torch = optional_module("torch", "torch")
    F = torch.nn.functional
    tx, tv = (torch.from_numpy(a).requires_grad_() for a in args)
    made = [F.max_pool2d(tx, 2), F.max_pool2d(tx, (3, 2), stride=(2, 1), padding=1),
            F.avg_pool2d(tx, 3, 2, 1), F.avg_pool2d(tx, 2), F.max_pool1d(tv, 3, stride=2),
            F.avg_pool1d(tv, 2, padding=1)]
    for got, want in zip(M.pools(*args), made, strict=True):
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-15, atol=1e-15)
    sum(torch.sin(t).sum() for t in made).backward()
    np.testing.assert_allclose(grads[0], tx.grad.numpy(), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(grads[1], tv.grad.numpy(), rtol=1e-13, atol=1e-15)


def numpy_pool_vjp(x, kind, kernel, stride, padding, ct):
    """The gradient of <pool(x), ct>: each window's cotangent shared equally
    among its elements that attain its maximum, or by all for an average."""
    d = len(kernel)
    pad = [(0, 0)] * 2 + [(p, p) for p in padding]
    xp = np.pad(x, pad, constant_values=-np.inf if kind == "max" else 0.0)
    grad = np.zeros_like(xp)
    axes = tuple(range(2, 2 + d))
    for index in np.ndindex(ct.shape[2:]):
        at = (Ellipsis,) + tuple(slice(i * st, i * st + k)
                                 for i, st, k in zip(index, stride, kernel))
        window, c = xp[at], ct[(Ellipsis,) + index + (None,) * d]
        if kind == "max":
            hit = window == window.max(axis=axes, keepdims=True)
            grad[at] += c * hit / hit.sum(axis=axes, keepdims=True)
        else:
            grad[at] += c / np.prod(kernel)
    return grad[(Ellipsis,) + tuple(slice(p, p + s) for p, s in zip(padding, x.shape[2:]))]


def test_a_maximum_shares_its_gradient_among_a_windows_ties():
    # (PyTorch and JAX give it all to one element of the window: a choice,
    # documented; here every window of ones ties, and overlapping windows
    # and padding make the shares uneven)
    args = np.ones((1, 2, 4, 5)), np.ones((1, 1, 9))
    grads = dsl.grad(M.loss, wrt=(0, 1))(*args)
    expected = [np.zeros_like(a) for a in args]
    for out, (kind, kernel, stride, padding, which) in zip(M.pools(*args), SPECS, strict=True):
        expected[which] += numpy_pool_vjp(args[which], kind, kernel, stride, padding,
                                          np.cos(out))
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(got, want, rtol=1e-14)


def test_forward_over_reverse_and_vmap():
    x, v = inputs()
    x, v = x[:1, :2], v[:1, :1]
    t = RNG.normal(size=x.shape)
    # forward over reverse: the Hessian of the loss along t, against
    # central differences of its gradient
    gradient = dsl.grad(M.loss, wrt=0)
    _, hvp = dsl.jvp(gradient, (x, v), (t, None))
    eps = 1e-6
    np.testing.assert_allclose(hvp, (gradient(x + eps * t, v) - gradient(x - eps * t, v))
                               / (2 * eps), atol=1e-7)
    batched = dsl.vmap(M.loss, in_axes=(0, None))(np.stack([x, 2 * x]), v)
    np.testing.assert_allclose(batched, [M.loss(x, v), M.loss(2 * x, v)], rtol=1e-14)


def test_grad_of_grad_of_a_tiling_pool():
    # a 2x2 pool's four windows tile x: both orders of its gradient write
    # each window's share into the zeros, never add (compiler.in_place_sums);
    # a share written over another's, or over what is not zeros, is wrong here
    m = dsl.loads("def f(x):\n    return sum(sin(max_pool2d(x, 2)) * x[:, :, ::2, ::2])\n",
                  "tiled.grad")
    x = RNG.normal(size=(1, 2, 4, 6))
    first = dsl.grad(m.f)
    np.testing.assert_allclose(dsl.grad(first)(x), central_difference(first, [x], 0),
                               atol=1e-7)


def test_cuda_simulator_values_and_gradient():
    m = dsl.loads(SOURCE, "pool.grad", target="cuda")
    args = inputs()
    for got, want in zip(m.pools(*args), M.pools(*args), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-16)
    for got, want in zip(dsl.grad(m.loss, wrt=(0, 1))(*args), dsl.grad(M.loss, wrt=(0, 1))(*args),
                         strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-16)


def test_dask_blocks_of_images():
    dask = optional_module("dask", "dask")
    da = optional_module("dask.array", "dask")
    x = RNG.normal(size=(10, 3, 7, 6))
    v = RNG.normal(size=(10, 3, 9))
    blocks = [da.from_array(a, chunks=(4,) + a.shape[1:]) for a in (x, v)]
    with dask.config.set(scheduler="sync"):
        value, grads = dask.compute(*dsl.value_and_grad(M.loss, wrt=(0, 1))(*blocks))
    expected_value, expected = dsl.value_and_grad(M.loss, wrt=(0, 1))(x, v)
    np.testing.assert_allclose(value, expected_value, rtol=1e-12)
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-16)


@pytest.mark.parametrize("call,shape,message", [
    ("max_pool2d(x, 2)", (3, 4, 4), r"rank 4 \(N, C, H, W\), got shape \[3, 4, 4\]"),
    ("avg_pool1d(x, 2)", (1, 2, 3, 4), r"rank 3 \(N, C, L\)"),
    ("max_pool2d(x)", (1, 1, 4, 4), r"kernel_size"),
    ("max_pool2d(x, 3, padding=2)", (1, 1, 8, 8), r"padding \[2, 2\] is more than half "
                                                  r"the kernel \[3, 3\]"),
    ("avg_pool2d(x, 5)", (1, 1, 4, 4), r"kernel \[5, 5\] is larger than the padded input"),
    ("max_pool2d(x, 2, stride=0)", (1, 1, 4, 4), r"stride must be positive"),
    ("max_pool2d(x, (2, 2, 2))", (1, 1, 4, 4), r"kernel_size takes one integer or 2"),
    ("avg_pool2d(x, 2, padding=-1)", (1, 1, 4, 4), r"padding must be non-negative"),
    ("max_pool2d(x > 0, 2)", (1, 1, 4, 4), r"needs a float array \(f32 or f64\), got bool"),
])
def test_misuse_is_a_grad_error_at_its_position(call, shape, message):
    with pytest.raises(dsl.GradError, match=f"bad.grad:2:12: error: .*{message}"):
        dsl.loads(f"def f(x):\n    return {call}\n", "bad.grad").f(np.ones(shape))
