"""The benchmark workloads: the same computation written in the dsl, in
NumPy by hand, and (when importable) in JAX (`jit`, `custom_vjp`) and in
PyTorch (eager, `autograd.Function`) with the same backward rules.

Each builder returns `Case`s: zero-argument callables over inputs made
once, and NumPy's results to check every other implementation against
(`check`), so that a benchmark never compares different computations.
JAX gets its inputs as device arrays made up front and its outputs are
waited for; PyTorch wraps the NumPy inputs without copying.

    log1pexp_cases   value + gradient of examples/log1pexp.grad (grad block)
    r1_cases         StyleGAN's R1 penalty and its gradient w.r.t. the
                     weights (examples/stylegan_r1.grad; second order)
    per_example_cases the gradient of a logistic loss w.r.t. its weights for
                     each example (`dsl.vmap` of `dsl.grad`)
    dense_cases      sum(softplus(x @ w + b)) in f32, gradient w.r.t. w, b
                     (benchmarks/dense_f32.grad)
    attention_cases  sum(o * o) for o = softmax(q k^T * scale) v over a batch of
                     heads in f32 (einsum), gradient w.r.t. q, k, v
                     (benchmarks/attention.grad)
    conv_cases       sum(softplus(conv2d(x, k, padding=1))) in f32, gradient
                     w.r.t. x and k (benchmarks/conv.grad)
    fused_sum_cases  sum(x * x): one fused loop against NumPy's temporary
    out_cases        log1pexp value + gradient into reused buffers (`out=`)
                     against fresh results, and NumPy by hand with `out=`
    sincos_pow_cases sin(x) cos(x), x ** y, tanh(x) and gelu(x), value and gradient
    loop_cases       `steps` trips of u = u + kappa * u * (1 - u), then
                     sum(u * u): value + gradient w.r.t. u and kappa, one
                     forward and one backward kernel (issue 10)
    language_model_cases
                     an RNN whose inputs are rows of an embedding table
                     read by token (`emb[tokens[i]]`): value + gradient
                     w.r.t. h, emb, w; JAX by lax.scan, PyTorch by a loop
    fit_cases        an RK4 fit of a damped oscillator to observations read
                     by the loop's index (`obs[i]`): value + gradient w.r.t.
                     y0, k, c; JAX by lax.scan
    forward_cases    `dsl.jvp` of log1pexp against value_and_grad,
                     jvp(grad) against hvp, and jacfwd (issue 11)
    indexing_cases   gathers and scatter-adds (`runtime.cpu.take`,
                     `scatter_add`) against np.take, np.add.at
    torch_bridge_cases, jax_bridge_cases
                     `dsl.to_torch`, `dsl.to_jax` against the dsl called
                     directly (issue 12); to_torch under torch.compile
    dask_cases       the logistic loss and its gradient on Dask arrays

A case's `notes` are lines the report prints under its table (kernel
counts, residual bytes): figures that are not times.  A case's `paired`
names two of its implementations whose ratio is an acceptance figure: the
report measures it again with `timing.paired_ratio`.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np

import dsl

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DENSE = Path(__file__).resolve().parent / "dense_f32.grad"
ATTENTION = Path(__file__).resolve().parent / "attention.grad"
CONV = Path(__file__).resolve().parent / "conv.grad"
POOL = Path(__file__).resolve().parent / "pool.grad"
NORM = Path(__file__).resolve().parent / "norm.grad"
ALPHA = 0.2  # stylegan_r1.grad's leaky ReLU slope
TOLERANCE = {np.dtype(np.float64): dict(rtol=1e-9, atol=1e-12),
             np.dtype(np.float32): dict(rtol=2e-4, atol=1e-5)}


@dataclass
class Case:
    label: str
    impls: dict[str, Callable[[], object]]
    want: tuple[np.ndarray, ...]
    tolerance: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    paired: tuple[str, str] | None = None


def check(case: Case) -> None:
    """Raise AssertionError unless every implementation's results match
    NumPy's in shape, dtype and value."""
    for name, fn in case.impls.items():
        got = fn()
        got = flatten(got)
        assert len(got) == len(case.want), f"{case.label}: {name} gives {len(got)} results"
        for i, (a, b) in enumerate(zip(got, case.want)):
            a = np.asarray(a)
            where = f"{case.label}: {name}'s result {i}"
            assert a.shape == b.shape, f"{where} has shape {a.shape}, NumPy's {b.shape}"
            assert a.dtype == b.dtype, f"{where} is {a.dtype}, NumPy's {b.dtype}"
            tol = case.tolerance or TOLERANCE[b.dtype]
            np.testing.assert_allclose(a, b, err_msg=where, **tol)


def size_label(n: int) -> str:
    """1000 -> "1e3"; sizes that are not powers of ten as they are."""
    exponent = len(str(n)) - 1
    return f"1e{exponent}" if n == 10**exponent and n >= 1000 else str(n)


def flatten(results) -> list:
    out = []
    for r in results if isinstance(results, (tuple, list)) else (results,):
        out += flatten(r) if isinstance(r, (tuple, list)) else [r]
    return out


# ------------------------------------------------------------ frameworks


@lru_cache(maxsize=None)
def jax_modules():
    """(jax, jax.numpy) with float64 enabled, or None if not importable."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    jax.config.update("jax_enable_x64", True)
    return jax, jnp


@lru_cache(maxsize=None)
def torch_module():
    try:
        import torch
    except ImportError:
        return None
    return torch


def jax_call(fn, *args) -> Callable[[], object]:
    """fn(*args) on device copies of args made once, waited for."""
    jax, jnp = jax_modules()
    device_args = [jnp.asarray(a) for a in args]

    def run():
        return jax.block_until_ready(fn(*device_args))
    return run


# ------------------------------------------------------------ log1pexp


def numpy_log1pexp(x):
    e = np.exp(x)
    return np.log1p(e), 1 - 1 / (1 + e)


@lru_cache(maxsize=None)
def jax_log1pexp():
    jax, jnp = jax_modules()

    @jax.custom_vjp
    def log1pexp(x):
        return jnp.log1p(jnp.exp(x))

    def fwd(x):
        e = jnp.exp(x)
        return jnp.log1p(e), e

    def bwd(e, dy):
        return (dy * (1 - 1 / (1 + e)),)

    log1pexp.defvjp(fwd, bwd)

    @jax.jit
    def value_and_grad(x):
        v, pullback = jax.vjp(log1pexp, x)
        return v, pullback(jnp.ones_like(v))[0]
    return value_and_grad


@lru_cache(maxsize=None)
def torch_log1pexp():
    torch = torch_module()

    class Log1pexp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            e = torch.exp(x)
            ctx.save_for_backward(e)
            return torch.log1p(e)

        @staticmethod
        def backward(ctx, dy):
            (e,) = ctx.saved_tensors
            return dy * (1 - 1 / (1 + e))

    def value_and_grad(x):
        xt = torch.from_numpy(x).requires_grad_(True)
        v = Log1pexp.apply(xt)
        (g,) = torch.autograd.grad(v, xt, torch.ones_like(v))
        return v.detach().numpy(), g.numpy()
    return value_and_grad


@lru_cache(maxsize=None)
def dsl_log1pexp():
    return dsl.value_and_grad(dsl.load(EXAMPLES / "log1pexp.grad").log1pexp)


def log1pexp_cases(sizes, dtypes, seed: int = 0) -> list[Case]:
    rng = np.random.default_rng(seed)
    cases = []
    for dtype in dtypes:
        for n in sizes:
            # Both branches matter and nothing overflows in f32.
            x = rng.uniform(-20.0, 20.0, n).astype(dtype)
            impls = {"numpy": lambda x=x: numpy_log1pexp(x),
                     "dsl": lambda x=x: dsl_log1pexp()(x)}
            if jax_modules():
                impls["jax"] = jax_call(jax_log1pexp(), x)
            if torch_module():
                impls["torch"] = lambda x=x: torch_log1pexp()(x)
            label = f"{np.dtype(dtype).name} n={size_label(n)}"
            cases.append(Case(label, impls, numpy_log1pexp(x)))
    return cases


PARAMS = """
param w: f64[n, k]
param b: f64[k]

def loss(x, y):
    r = x @ w + b - y
    return sum(r * r)

def loss_of(x, y, weight, bias):
    r = x @ weight + bias - y
    return sum(r * r)
"""


def params_call_cases(batch: int, n: int, k: int, seed: int = 0) -> list[Case]:
    """A least-squares loss reading its weights as module params: value and
    gradient for them per call, at a training step's small size ("dsl");
    beside the same loss taking them as arguments ("dsl, as arguments")."""
    rng = np.random.default_rng(seed)
    m = dsl.loads(PARAMS, "params.grad")
    x, y = rng.normal(size=(batch, n)), rng.normal(size=(batch, k))
    w, b = rng.normal(size=(n, k)), rng.normal(size=k)
    m.params["w"], m.params["b"] = w, b
    by_params = dsl.value_and_grad(m.loss, wrt=("w", "b"))
    by_arguments = dsl.value_and_grad(m.loss_of, wrt=(2, 3))

    def numpy_loss(x, y, w, b):
        r = x @ w + b - y
        return np.sum(r * r), (2 * x.T @ r, 2 * r.sum(axis=0))
    impls = {"numpy": lambda: numpy_loss(x, y, w, b), "dsl": lambda: by_params(x, y),
             "dsl, as arguments": lambda: by_arguments(x, y, w, b)}
    if jax_modules():
        jax, jnp = jax_modules()
        grad = jax.jit(jax.value_and_grad(lambda w, b, x, y: jnp.sum((x @ w + b - y) ** 2),
                                          argnums=(0, 1)))
        impls["jax"] = jax_call(grad, w, b, x, y)
    if torch_module():
        torch = torch_module()
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)
        tw, tb = (torch.from_numpy(a.copy()).requires_grad_() for a in (w, b))

        def torch_loss():
            value = ((tx @ tw + tb - ty) ** 2).sum()
            gw, gb = torch.autograd.grad(value, (tw, tb))
            return value.detach().numpy(), (gw.numpy(), gb.numpy())
        impls["torch"] = torch_loss
    value, grads = numpy_loss(x, y, w, b)
    return [Case(f"params w, b of a least-squares loss, value and gradient, float64 "
                 f"{batch}x{n} @ {n}x{k}", impls, (np.asarray(value), *grads))]


def numpy_log1pexp_into(x, value, grad):
    """numpy_log1pexp writing into the caller's buffers (no temporaries)."""
    np.exp(x, out=grad)
    np.log1p(grad, out=value)
    np.add(grad, 1, out=grad)
    np.divide(1, grad, out=grad)
    np.subtract(1, grad, out=grad)
    return value, grad


def out_cases(sizes, dtypes, seed: int = 0) -> list[Case]:
    """log1pexp value + gradient called in a loop: "dsl" writes into the
    same two buffers every call (`out=`), "dsl fresh" allocates its
    results, whose pages the kernel then faults in (at 1e7, glibc maps
    blocks this big anew for every allocation)."""
    rng = np.random.default_rng(seed)
    cases = []
    for dtype in dtypes:
        for n in sizes:
            x = rng.uniform(-20.0, 20.0, n).astype(dtype)
            dsl_buffers = (np.empty_like(x), np.empty_like(x))
            numpy_buffers = (np.empty_like(x), np.empty_like(x))
            impls = {"dsl": lambda x=x, b=dsl_buffers: dsl_log1pexp()(x, out=b),
                     "dsl fresh": lambda x=x: dsl_log1pexp()(x),
                     "numpy": lambda x=x: numpy_log1pexp(x),
                     "numpy out=": lambda x=x, b=numpy_buffers: numpy_log1pexp_into(x, *b)}
            if jax_modules():
                impls["jax"] = jax_call(jax_log1pexp(), x)
            label = f"{np.dtype(dtype).name} n={size_label(n)}"
            cases.append(Case(label, impls, numpy_log1pexp(x)))
    return cases


# ------------------------------------------------------------ R1 penalty


def numpy_r1(x, w):
    """R1 = sum((d/dx sum(leaky_relu(x * w)))^2) and dR1/dw.  The slope s is
    piecewise constant in w, so dR1/dw = 2 s^2 w."""
    s = np.where(x * w >= 0, 1.0, ALPHA).astype(x.dtype)
    g = s * w
    return np.sum(g * g), 2 * s * g


@lru_cache(maxsize=None)
def jax_r1():
    jax, jnp = jax_modules()

    @jax.custom_vjp
    def leaky_relu(z):
        return jnp.maximum(z, z * ALPHA)

    def fwd(z):
        y = leaky_relu(z)
        return y, y

    def bwd(y, dy):
        return (jnp.where(y >= 0, dy, dy * ALPHA),)

    leaky_relu.defvjp(fwd, bwd)

    def r1(x, w):
        g = jax.grad(lambda x, w: jnp.sum(leaky_relu(x * w)))(x, w)
        return jnp.sum(g * g)
    return jax.jit(jax.value_and_grad(r1, argnums=1))


@lru_cache(maxsize=None)
def torch_r1():
    torch = torch_module()

    class LeakyRelu(torch.autograd.Function):
        # backward is written in differentiable torch ops, so that the
        # second-order pass differentiates it (as the grad block's second
        # block does: exact, zero w.r.t. y).
        @staticmethod
        def forward(ctx, z):
            y = torch.maximum(z, z * ALPHA)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, dy):
            (y,) = ctx.saved_tensors
            return torch.where(y >= 0, dy, dy * ALPHA)

    def value_and_grad(x, w):
        xt = torch.from_numpy(x).requires_grad_(True)
        wt = torch.from_numpy(w).requires_grad_(True)
        (g,) = torch.autograd.grad(LeakyRelu.apply(xt * wt).sum(), xt, create_graph=True)
        r1 = (g * g).sum()
        (gw,) = torch.autograd.grad(r1, wt)
        return r1.detach().numpy(), gw.numpy()
    return value_and_grad


@lru_cache(maxsize=None)
def dsl_r1():
    return dsl.value_and_grad(dsl.load(EXAMPLES / "stylegan_r1.grad").r1_penalty, wrt=1)


def r1_cases(sizes, seed: int = 0) -> list[Case]:
    rng = np.random.default_rng(seed)
    cases = []
    for n in sizes:
        x, w = rng.normal(size=n), rng.normal(size=n)
        impls = {"numpy": lambda x=x, w=w: numpy_r1(x, w),
                 "dsl": lambda x=x, w=w: dsl_r1()(x, w)}
        if jax_modules():
            impls["jax"] = jax_call(jax_r1(), x, w)
        if torch_module():
            impls["torch"] = lambda x=x, w=w: torch_r1()(x, w)
        v, gw = numpy_r1(x, w)
        cases.append(Case(f"float64 n={size_label(n)}", impls, (np.asarray(v), gw)))
    return cases


# ------------------------------------------------------------ per-example gradients

PER_EXAMPLE = """
def loss(x, y, w):
    return log(1 + exp(-y * sum(x * w)))
"""  # one example: features x, label y in {-1, 1}


def numpy_per_example(x, y, w):
    """d loss_i / dw for each row i: -y_i sigmoid(-y_i z_i) x_i."""
    slope = -y / (1 + np.exp(y * (x @ w)))
    return (slope[:, None] * x,)


@lru_cache(maxsize=None)
def jax_per_example():
    jax, jnp = jax_modules()

    def loss(x, y, w):
        return jnp.log1p(jnp.exp(-y * jnp.sum(x * w)))
    return jax.jit(jax.vmap(jax.grad(loss, argnums=2), in_axes=(0, 0, None)))


@lru_cache(maxsize=None)
def torch_per_example():
    torch = torch_module()

    def loss(x, y, w):
        return torch.log1p(torch.exp(-y * torch.sum(x * w)))
    per_example = torch.func.vmap(torch.func.grad(loss, argnums=2), in_dims=(0, 0, None))
    return lambda x, y, w: per_example(torch.from_numpy(x), torch.from_numpy(y),
                                       torch.from_numpy(w)).numpy()


@lru_cache(maxsize=None)
def dsl_per_example_module():
    return dsl.loads(PER_EXAMPLE)


@lru_cache(maxsize=None)
def dsl_per_example():
    return dsl.vmap(dsl.grad(dsl_per_example_module().loss, wrt=2), in_axes=(0, 0, None))


@lru_cache(maxsize=None)
def to_jax_per_example():
    """The same through `dsl.to_jax`: JAX's vmap of grad of the bridge."""
    jax, _ = jax_modules()
    loss = dsl.to_jax(dsl_per_example_module().loss)
    return jax.jit(jax.vmap(jax.grad(loss, argnums=2), in_axes=(0, 0, None)))


def per_example_cases(rows: int, features: int, seed: int = 0) -> list[Case]:
    """The gradient of a logistic loss w.r.t. the weights for each example:
    `dsl.vmap(dsl.grad(...))` against JAX's and torch.func's vmap of grad,
    and JAX's vmap of grad of the loss through `dsl.to_jax`."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features))
    y = rng.choice([-1.0, 1.0], rows)
    w = rng.normal(size=features) / np.sqrt(features)
    impls = {"numpy": lambda: numpy_per_example(x, y, w),
             "dsl": lambda: dsl_per_example()(x, y, w)}
    if jax_modules():
        impls["jax"] = jax_call(jax_per_example(), x, y, w)
        impls["dsl through to_jax"] = jax_call(to_jax_per_example(), x, y, w)
    if torch_module():
        impls["torch"] = lambda: torch_per_example()(x, y, w)
    return [Case(f"float64 {rows} examples x {features} features", impls,
                 numpy_per_example(x, y, w)),
            per_example_jvp_case(x, y, w, rng.normal(size=x.shape))]


def numpy_per_example_jvp(x, y, w, tx):
    """(loss_i, d loss_i / dx_i . tx_i) for each row i."""
    z = x @ w
    return np.log1p(np.exp(-y * z)), -y / (1 + np.exp(y * z)) * (tx @ w)


def jax_per_example_jvp(loss):
    """jit(vmap(jvp)) of loss along x, each example with its own tangent."""
    jax, _ = jax_modules()

    def jvp_along_x(x, y, w, tx):
        return jax.jvp(lambda x: loss(x, y, w), (x,), (tx,))
    return jax.jit(jax.vmap(jvp_along_x, in_axes=(0, 0, None, 0)))


def per_example_jvp_case(x, y, w, tx) -> Case:
    """Each example's loss and its derivative along its own tangent of the
    features: `dsl.jvp` of `dsl.vmap(loss)` against JAX's and torch.func's
    vmap of jvp, and JAX's vmap of jvp through `dsl.to_jax` (the primals
    and the tangents both batched: one stacked program)."""
    loss = dsl_per_example_module().loss
    batched = dsl.vmap(loss, in_axes=(0, 0, None))
    impls = {"numpy": lambda: numpy_per_example_jvp(x, y, w, tx),
             "dsl": lambda: dsl.jvp(batched, (x, y, w), (tx, None, None))}
    if jax_modules():
        jax, jnp = jax_modules()
        impls["jax"] = jax_call(jax_per_example_jvp(
            lambda x, y, w: jnp.log1p(jnp.exp(-y * jnp.sum(x * w)))), x, y, w, tx)
        impls["dsl through to_jax"] = jax_call(jax_per_example_jvp(dsl.to_jax(loss)),
                                               x, y, w, tx)
    if torch_module():
        torch = torch_module()

        def torch_jvp(x, y, w, tx):
            return torch.func.jvp(lambda x: torch.log1p(torch.exp(-y * torch.sum(x * w))),
                                  (x,), (tx,))
        per_example = torch.func.vmap(torch_jvp, in_dims=(0, 0, None, 0))
        args = [torch.from_numpy(a) for a in (x, y, w, tx)]
        impls["torch"] = lambda: [r.numpy() for r in per_example(*args)]
    return Case(f"jvp along each example's x, float64 {len(x)} x {x.shape[1]}", impls,
                numpy_per_example_jvp(x, y, w, tx))


# ------------------------------------------------------------ dense layer


def numpy_dense(x, w, b):
    z = x @ w + b
    value = np.sum(np.maximum(z, 0) + np.log1p(np.exp(-np.abs(z))))
    dz = 1 / (1 + np.exp(-z))
    return value, (x.T @ dz, dz.sum(axis=0))


@lru_cache(maxsize=None)
def jax_dense():
    jax, jnp = jax_modules()

    @jax.custom_vjp
    def softplus(z):
        return jnp.maximum(z, 0) + jnp.log1p(jnp.exp(-jnp.abs(z)))

    def fwd(z):
        return softplus(z), z

    def bwd(z, dz):
        return (dz * jax.nn.sigmoid(z),)

    softplus.defvjp(fwd, bwd)

    def loss(x, w, b):
        return jnp.sum(softplus(x @ w + b))
    return jax.jit(jax.value_and_grad(loss, argnums=(1, 2)))


@lru_cache(maxsize=None)
def torch_dense():
    torch = torch_module()

    class Softplus(torch.autograd.Function):
        @staticmethod
        def forward(ctx, z):
            ctx.save_for_backward(z)
            return torch.clamp_min(z, 0) + torch.log1p(torch.exp(-torch.abs(z)))

        @staticmethod
        def backward(ctx, dz):
            (z,) = ctx.saved_tensors
            return dz * torch.sigmoid(z)

    def value_and_grad(x, w, b):
        wt = torch.from_numpy(w).requires_grad_(True)
        bt = torch.from_numpy(b).requires_grad_(True)
        value = Softplus.apply(torch.from_numpy(x) @ wt + bt).sum()
        gw, gb = torch.autograd.grad(value, (wt, bt))
        return value.detach().numpy(), (gw.numpy(), gb.numpy())
    return value_and_grad


@lru_cache(maxsize=None)
def dsl_dense():
    return dsl.value_and_grad(dsl.load(DENSE).dense_loss, wrt=(1, 2))


def dense_cases(batch: int, n_in: int, n_out: int, seed: int = 0) -> list[Case]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, n_in)).astype(np.float32)
    w = (rng.normal(size=(n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
    b = rng.normal(size=n_out).astype(np.float32)
    impls = {"numpy": lambda: numpy_dense(x, w, b), "dsl": lambda: dsl_dense()(x, w, b)}
    if jax_modules():
        impls["jax"] = jax_call(jax_dense(), x, w, b)
    if torch_module():
        impls["torch"] = lambda: torch_dense()(x, w, b)
    value, (gw, gb) = numpy_dense(x, w, b)
    # f32 sums over batch * n_out terms: orders of summation differ.
    return [Case(f"float32 {batch}x{n_in} @ {n_in}x{n_out}", impls,
                 (np.asarray(value), gw, gb), dict(rtol=1e-3, atol=1e-3))]


# ------------------------------------------------------------ attention


def numpy_attention(q, k, v, scale):
    s = np.matmul(q, k.swapaxes(-1, -2)) * scale
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    o = np.matmul(p, v)
    do = 2 * o
    dp = np.matmul(do, v.swapaxes(-1, -2))
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True)) * scale
    return np.sum(o * o), (np.matmul(ds, k), np.matmul(ds.swapaxes(-1, -2), q),
                           np.matmul(p.swapaxes(-1, -2), do))


@lru_cache(maxsize=None)
def jax_attention():
    jax, jnp = jax_modules()

    def loss(q, k, v, scale):
        p = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k) * scale, axis=-1)
        o = jnp.einsum("bhqk,bhkd->bhqd", p, v)
        return jnp.sum(o * o)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


@lru_cache(maxsize=None)
def torch_attention():
    torch = torch_module()

    def value_and_grad(q, k, v, scale):
        qkv = [torch.from_numpy(a).requires_grad_(True) for a in (q, k, v)]
        p = torch.softmax(torch.einsum("bhqd,bhkd->bhqk", qkv[0], qkv[1]) * scale, dim=-1)
        o = torch.einsum("bhqk,bhkd->bhqd", p, qkv[2])
        value = (o * o).sum()
        return value.detach().numpy(), tuple(g.numpy() for g in torch.autograd.grad(value, qkv))
    return value_and_grad


@lru_cache(maxsize=None)
def dsl_attention():
    return dsl.value_and_grad(dsl.load(ATTENTION).attention_loss, wrt=(0, 1, 2))


def attention_cases(batch: int, heads: int, seq: int, dim: int, seed: int = 0) -> list[Case]:
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=(batch, heads, seq, dim)).astype(np.float32) for _ in range(3))
    scale = np.float32(1 / math.sqrt(dim))
    impls = {"numpy": lambda: numpy_attention(q, k, v, scale),
             "dsl": lambda: dsl_attention()(q, k, v, scale)}
    if jax_modules():
        impls["jax"] = jax_call(jax_attention(), q, k, v, scale)
    if torch_module():
        impls["torch"] = lambda: torch_attention()(q, k, v, float(scale))
    value, grads = numpy_attention(q, k, v, scale)
    # f32 sums over seq * dim terms: orders of summation differ
    # (paired against NumPy's: both are BLAS-bound, and the machine's load
    # moves both alike)
    return [Case(f"float32 {batch}x{heads} heads, seq {seq}, dim {dim}", impls,
                 (np.asarray(value),) + grads, dict(rtol=2e-3, atol=2e-3),
                 paired=("dsl", "numpy"))]


# ------------------------------------------------------------ convolution


def numpy_conv_loss(x, kernel):
    """sum(softplus(conv2d(x, kernel, padding=1))) and its gradients by hand:
    im2col (one strided view per kernel offset, stacked), one product
    forward, two backward, the patches' gradient added back (col2im)."""
    n, c, h, w = x.shape
    o, _, kh, kw = kernel.shape
    xp = np.zeros((n, h + 2, w + 2, c), x.dtype)
    xp[:, 1:h + 1, 1:w + 1] = x.transpose(0, 2, 3, 1)
    ho, wo = h + 3 - kh, w + 3 - kw
    rows = np.stack([xp[:, i:i + ho, j:j + wo] for i in range(kh) for j in range(kw)],
                    axis=3).reshape(n * ho * wo, kh * kw * c)
    weights = kernel.transpose(0, 2, 3, 1).reshape(o, kh * kw * c)
    y = rows @ weights.T  # (n * ho * wo, o)
    value = np.sum(np.logaddexp(np.float32(0), y))
    dy = 1 / (1 + np.exp(-y))
    dkernel = (dy.T @ rows).reshape(o, kh, kw, c).transpose(0, 3, 1, 2)
    drows = (dy @ weights).reshape(n, ho, wo, kh * kw, c)
    dxp = np.zeros_like(xp)
    for i in range(kh):
        for j in range(kw):
            dxp[:, i:i + ho, j:j + wo] += drows[:, :, :, i * kw + j]
    return value, (dxp[:, 1:h + 1, 1:w + 1].transpose(0, 3, 1, 2), dkernel)


@lru_cache(maxsize=None)
def jax_conv():
    jax, jnp = jax_modules()

    def loss(x, kernel):
        y = jax.lax.conv_general_dilated(x, kernel, (1, 1), ((1, 1), (1, 1)))
        return jnp.sum(jax.nn.softplus(y))
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


@lru_cache(maxsize=None)
def torch_conv():
    torch = torch_module()

    def value_and_grad(x, kernel):
        inputs = [torch.from_numpy(a).requires_grad_(True) for a in (x, kernel)]
        y = torch.nn.functional.conv2d(inputs[0], inputs[1], padding=1)
        value = torch.nn.functional.softplus(y).sum()
        return value.detach().numpy(), tuple(g.numpy() for g in torch.autograd.grad(value, inputs))
    return value_and_grad


@lru_cache(maxsize=None)
def dsl_conv():
    return dsl.value_and_grad(dsl.load(CONV).discriminator_loss, wrt=(0, 1))


def conv_cases(n: int, c: int, size: int, o: int, k: int, seed: int = 0) -> list[Case]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, c, size, size)).astype(np.float32)
    kernel = (rng.normal(size=(o, c, k, k)) / math.sqrt(c * k * k)).astype(np.float32)
    impls = {"numpy": lambda: numpy_conv_loss(x, kernel),
             "dsl": lambda: dsl_conv()(x, kernel)}
    if jax_modules():
        impls["jax"] = jax_call(jax_conv(), x, kernel)
    if torch_module():
        impls["torch"] = lambda: torch_conv()(x, kernel)
    value, grads = numpy_conv_loss(x, kernel)
    # f32 sums over n * size^2 terms (the value, the kernel's gradient)
    return [Case(f"float32 {n}x{c}x{size}x{size}, {o} kernels {k}x{k}, padding 1", impls,
                 (np.asarray(value),) + grads, dict(rtol=2e-3, atol=2e-3),
                 paired=("dsl", "numpy"))]


# ------------------------------------------------------------ pooling


def numpy_pool_loss(x, kernel: int, stride: int, padding: int):
    """sum(softplus(max_pool2d(x, kernel, stride, padding))) and its gradient
    by hand: the windows as strided views of the image padded with -inf,
    stacked; each window's gradient shared among the elements that attain
    its maximum (as the dsl does)."""
    n, c, h, w = x.shape
    xp = np.full((n, c, h + 2 * padding, w + 2 * padding), -np.inf, x.dtype)
    xp[:, :, padding:padding + h, padding:padding + w] = x
    ho, wo = (h + 2 * padding - kernel) // stride + 1, (w + 2 * padding - kernel) // stride + 1
    offsets = [(i, j) for i in range(kernel) for j in range(kernel)]
    windows = np.stack([xp[:, :, i:i + stride * (ho - 1) + 1:stride,
                           j:j + stride * (wo - 1) + 1:stride] for i, j in offsets], axis=-1)
    top = windows.max(axis=-1)
    value = np.sum(np.logaddexp(np.float32(0), top))
    hit = windows == top[..., None]
    share = (1 / (1 + np.exp(-top)) / hit.sum(axis=-1))[..., None] * hit
    dxp = np.zeros_like(xp)
    for k, (i, j) in enumerate(offsets):
        dxp[:, :, i:i + stride * (ho - 1) + 1:stride, j:j + stride * (wo - 1) + 1:stride] += \
            share[..., k]
    return value, dxp[:, :, padding:padding + h, padding:padding + w]


@lru_cache(maxsize=None)
def jax_pool(kernel: int, stride: int, padding: int):
    jax, jnp = jax_modules()

    def loss(x):
        top = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, kernel, kernel),
                                    (1, 1, stride, stride),
                                    ((0, 0), (0, 0), (padding, padding), (padding, padding)))
        return jnp.sum(jax.nn.softplus(top))
    return jax.jit(jax.value_and_grad(loss))


def torch_pool(x, kernel: int, stride: int, padding: int):
    torch = torch_module()
    image = torch.from_numpy(x).requires_grad_(True)
    top = torch.nn.functional.max_pool2d(image, kernel, stride, padding)
    value = torch.nn.functional.softplus(top).sum()
    return value.detach().numpy(), torch.autograd.grad(value, image)[0].numpy()


def pool_cases(n: int, c: int, size: int, seed: int = 0) -> list[Case]:
    """A 2x2 max pool and a 3x3 one at stride 2 with padding 1 (a ResNet
    stem's), value + gradient (benchmarks/pool.grad)."""
    x = np.random.default_rng(seed).normal(size=(n, c, size, size)).astype(np.float32)
    m = dsl.load(POOL)
    cases = []
    for name, (kernel, stride, padding) in (("tiled", (2, 2, 0)), ("stem", (3, 2, 1))):
        value_and_grad = dsl.value_and_grad(getattr(m, name))
        impls = {"numpy": lambda k=(kernel, stride, padding): numpy_pool_loss(x, *k),
                 "dsl": lambda f=value_and_grad: f(x)}
        if jax_modules():
            impls["jax"] = jax_call(jax_pool(kernel, stride, padding), x)
        if torch_module():
            impls["torch"] = lambda k=(kernel, stride, padding): torch_pool(x, *k)
        value, grad = numpy_pool_loss(x, kernel, stride, padding)
        cases.append(Case(f"max_pool2d {kernel}x{kernel}, stride {stride}, padding {padding}, "
                          f"float32 {n}x{c}x{size}x{size}", impls, (np.asarray(value), grad),
                          dict(rtol=1e-4, atol=1e-4), paired=("dsl", "numpy")))
    return cases


# ------------------------------------------------------------ batch norm


def numpy_norm_loss(x, gamma, beta):
    """sum(softplus(batch_norm(x) * gamma + beta)) over (N, C, H, W), per
    channel, and its gradients for x, gamma and beta by hand (in f64,
    returned in x's dtype)."""
    x64, g64 = x.astype(np.float64), gamma.astype(np.float64)[:, None, None]
    axes, count = (0, 2, 3), x.size // x.shape[1]
    d = x64 - x64.mean(axis=axes, keepdims=True)
    inv_std = 1 / np.sqrt((d * d).mean(axis=axes, keepdims=True) + 1e-5)
    xhat = d * inv_std
    y = g64 * xhat + beta.astype(np.float64)[:, None, None]
    value = np.sum(np.logaddexp(0, y))
    dy = 1 / (1 + np.exp(-y))
    dxhat = dy * g64
    dx = inv_std / count * (count * dxhat - dxhat.sum(axis=axes, keepdims=True)
                            - xhat * (dxhat * xhat).sum(axis=axes, keepdims=True))
    dtype = x.dtype
    return (np.asarray(value, dtype), dx.astype(dtype), (dy * xhat).sum(axis=axes).astype(dtype),
            dy.sum(axis=axes).astype(dtype))


@lru_cache(maxsize=None)
def jax_norm():
    jax, jnp = jax_modules()

    def loss(x, gamma, beta):
        d = x - x.mean(axis=(0, 2, 3), keepdims=True)
        var = (d * d).mean(axis=(0, 2, 3), keepdims=True)
        return jnp.sum(jax.nn.softplus(gamma[:, None, None] * d / jnp.sqrt(var + 1e-5)
                                       + beta[:, None, None]))
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def torch_norm(x, gamma, beta):
    torch = torch_module()
    xt, gt, bt = (torch.from_numpy(a).requires_grad_(True) for a in (x, gamma, beta))
    d = xt - xt.mean(dim=(0, 2, 3), keepdim=True)
    var = (d * d).mean(dim=(0, 2, 3), keepdim=True)
    value = torch.nn.functional.softplus(gt[:, None, None] * d / torch.sqrt(var + 1e-5)
                                         + bt[:, None, None]).sum()
    grads = torch.autograd.grad(value, (xt, gt, bt))
    return (value.detach().numpy(),) + tuple(g.numpy() for g in grads)


def norm_cases(n: int, c: int, size: int, seed: int = 0) -> list[Case]:
    """A batch norm over NCHW images (per-channel statistics, scale and
    shift read as (C, 1, 1)), softplus, summed: value + gradients for the
    images, the scale and the shift (benchmarks/norm.grad)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, c, size, size)).astype(np.float32)
    gamma, beta = (rng.normal(size=c).astype(np.float32) for _ in range(2))
    value_and_grad = dsl.value_and_grad(dsl.load(NORM).batch_norm_loss, wrt=(0, 1, 2))
    impls = {"numpy": lambda: numpy_norm_loss(x, gamma, beta),
             "dsl": lambda: value_and_grad(x, gamma, beta)}
    if jax_modules():
        impls["jax"] = jax_call(jax_norm(), x, gamma, beta)
    if torch_module():
        impls["torch"] = lambda: torch_norm(x, gamma, beta)
    # f32 sums over n * size^2 terms per channel (and the value's over all)
    return [Case(f"float32 {n}x{c}x{size}x{size}", impls, numpy_norm_loss(x, gamma, beta),
                 dict(rtol=1e-3, atol=1e-3), paired=("dsl", "numpy"))]


# ------------------------------------------------------------ broadcasts


BROADCAST = """
from std import softmax

def scaled(x, y):
    return x * y + 1.0

def masked_softmax(s, mask):
    z = where(mask, s, -1e30)
    e = exp(z - max(z, axis=-1, keepdims=True))
    return sum(e / sum(e, axis=-1, keepdims=True) * s)

def masked_std_softmax(s, mask):
    return sum(softmax(where(mask, s, -1e30)) * s)
"""


def numpy_masked_softmax(s, mask):
    """sum(softmax(where(mask, s, -1e30)) * s) over the last axis, and its
    gradient for s by hand (in f64, returned in s's dtype)."""
    s64 = s.astype(np.float64)
    z = np.where(mask, s64, -1e30)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    # d/ds of sum(p * s): p + (the softmax's pullback of s) where the mask holds
    grad = p + p * (s64 - (p * s64).sum(axis=-1, keepdims=True)) * mask
    return np.asarray(np.sum(p * s64), s.dtype), grad.astype(s.dtype)


def broadcast_cases(seed: int = 0, scale: int = 1) -> list[Case]:
    """Inputs broadcast along middle axes of the loop (read per run of the
    loop's axes they have): x * y + 1.0 for y (B, 1, D) over (B, T, D), a
    channel's scale (C, 1, 1) over (N, C, H, W) and (B, 1, T, 1) over
    (B, H, T, D), values; and a softmax's value and gradient under a
    padding mask (B, 1, 1, T) and under a causal one (T, T).  `scale`
    divides the sizes (tests run them tiny)."""
    rng = np.random.default_rng(seed)
    m = dsl.loads(BROADCAST, "broadcast.grad")
    cases = []
    for label, xs, ys in (
            ("(B, 1, D) over (B, T, D)", (64, 128, 256), (64, 1, 256)),
            ("(C, 1, 1) over (N, C, H, W)", (32, 64, 32, 32), (64, 1, 1)),
            ("(B, 1, T, 1) over (B, H, T, D)", (16, 8, 128, 64), (16, 1, 128, 1))):
        xs, ys = tuple(max(1, d // scale) for d in xs), tuple(max(1, d // scale) for d in ys)
        x, y = rng.normal(size=xs), rng.normal(size=ys)
        impls = {"numpy": lambda x=x, y=y: x * y + 1.0, "dsl": lambda x=x, y=y: m.scaled(x, y)}
        if jax_modules():
            jax, _ = jax_modules()
            impls["jax"] = jax_call(jax.jit(lambda x, y: x * y + 1.0), x, y)
        if torch_module():
            torch = torch_module()
            impls["torch"] = lambda x=x, y=y: (torch.from_numpy(x) * torch.from_numpy(y)
                                               + 1.0).numpy()
        cases.append(Case(f"x * y + 1.0, y {label}, float64 {'x'.join(map(str, xs))}", impls,
                          (x * y + 1.0,)))
    b, h, t = (max(1, d // scale) for d in (16, 8, 128))
    s = rng.normal(size=(b, h, t, t)).astype(np.float32)
    padding = rng.random(size=(b, 1, 1, t)) < 0.9
    padding[..., 0] = True  # (no row wholly masked)
    causal = np.tril(np.ones((t, t), bool))
    value_and_grad = dsl.value_and_grad(m.masked_softmax)
    # (std's softmax has a grad block, as JAX's and PyTorch's have their
    # own rules: no gradient through the max it subtracts)
    with_std = dsl.value_and_grad(m.masked_std_softmax)
    for label, mask in (("padding (B, 1, 1, T)", padding), ("causal (T, T)", causal)):
        impls = {"numpy": lambda mask=mask: numpy_masked_softmax(s, mask),
                 "dsl": lambda mask=mask: value_and_grad(s, mask),
                 "dsl, std softmax": lambda mask=mask: with_std(s, mask)}
        if jax_modules():
            impls["jax"] = jax_call(jax_masked_softmax(), s, mask)
        if torch_module():
            impls["torch"] = lambda mask=mask: torch_masked_softmax(s, mask)
        cases.append(Case(f"softmax under a {label} mask, value and gradient, float32 "
                          f"{b}x{h}x{t}x{t}", impls, numpy_masked_softmax(s, mask),
                          dict(rtol=2e-3, atol=1e-5)))
    return cases


@lru_cache(maxsize=None)
def jax_masked_softmax():
    jax, jnp = jax_modules()

    def loss(s, mask):
        p = jax.nn.softmax(jnp.where(mask, s, -1e30), axis=-1)
        return jnp.sum(p * s)
    return jax.jit(jax.value_and_grad(loss))


def torch_masked_softmax(s, mask):
    torch = torch_module()
    st = torch.from_numpy(s).requires_grad_(True)
    p = torch.softmax(torch.where(torch.from_numpy(mask), st, -1e30), dim=-1)
    value = (p * st).sum()
    return value.detach().numpy(), torch.autograd.grad(value, st)[0].numpy()


# ------------------------------------------------------------ fused sum


@lru_cache(maxsize=None)
def dsl_sumsq():
    return dsl.loads("def sumsq(x):\n    return sum(x * x)\n").sumsq


def fused_sum_cases(sizes, seed: int = 0) -> list[Case]:
    """sum(x * x), value only: the dsl's one fused loop never stores x * x."""
    rng = np.random.default_rng(seed)
    cases = []
    for n in sizes:
        x = rng.normal(size=n)
        impls = {"numpy": lambda x=x: np.sum(x * x), "dsl": lambda x=x: dsl_sumsq()(x)}
        if jax_modules():
            jax, jnp = jax_modules()
            impls["jax"] = jax_call(jax.jit(lambda x: jnp.sum(x * x)), x)
        if torch_module():
            torch = torch_module()
            impls["torch"] = lambda x=x: torch.sum(torch.from_numpy(x) ** 2).numpy()
        cases.append(Case(f"float64 n={size_label(n)}", impls, (np.asarray(np.sum(x * x)),)))
    return cases


# ------------------------------------------------------------ sin, cos, pow

SINCOS_POW = """from std import gelu

def sincos(x):
    return sin(x) * cos(x)

def power(x, y):
    return x ** y

def th(x):
    return tanh(x)

def exact_gelu(x):
    return gelu(x)
"""


@lru_cache(maxsize=None)
def dsl_sincos_pow():
    module = dsl.loads(SINCOS_POW)
    return (dsl.value_and_grad(module.sincos), dsl.value_and_grad(module.power, wrt=(0, 1)),
            dsl.value_and_grad(module.th), dsl.value_and_grad(module.exact_gelu))


def numpy_sincos(x):
    s, c = np.sin(x), np.cos(x)
    return s * c, c * c - s * s


def numpy_power(x, y):
    v = x**y
    return v, (y * x ** (y - 1), np.log(x) * v)


def numpy_tanh(x):
    e = np.exp(-2 * np.abs(x))  # tanh' as 4 e / (1 + e)^2: 1 - tanh^2 cancels in the tails
    return np.tanh(x), 4 * e / ((1 + e) * (1 + e))


_ERFC = np.vectorize(math.erfc)  # NumPy has no erf: libm's, an element at a time


def numpy_gelu(x):
    """The exact GELU x Phi(x) and its slope Phi(x) + x phi(x), by erfc."""
    phi = (0.5 * _ERFC(x * -0.7071067811865476)).astype(x.dtype)
    return x * phi, phi + x * (0.3989422804014327 * np.exp(-0.5 * x * x))


@lru_cache(maxsize=None)
def jax_sincos_pow():
    jax, jnp = jax_modules()

    def value_and_grad(f, argnums):
        @jax.jit
        def run(*args):
            v, pullback = jax.vjp(f, *args)
            grads = pullback(jnp.ones_like(v))
            return v, grads if len(argnums) > 1 else grads[0]
        return run
    return (value_and_grad(lambda x: jnp.sin(x) * jnp.cos(x), (0,)),
            value_and_grad(lambda x, y: x**y, (0, 1)), value_and_grad(jnp.tanh, (0,)),
            value_and_grad(lambda x: jax.nn.gelu(x, approximate=False), (0,)))


def sincos_pow_cases(sizes, dtypes, seed: int = 0) -> list[Case]:
    """sin(x) cos(x), x ** y (x in [0.5, 2], y in [-8, 8]), tanh(x) and the
    exact gelu(x) (x in [-8, 8]): value and gradient, elementwise."""
    rng = np.random.default_rng(seed)
    cases = []
    for dtype in dtypes:
        for n in sizes:
            x = rng.uniform(-100, 100, n).astype(dtype)
            base, exponent = (rng.uniform(0.5, 2.0, n).astype(dtype),
                              rng.uniform(-8, 8, n).astype(dtype))
            t = rng.uniform(-8, 8, n).astype(dtype)
            sincos, power, th, gl = dsl_sincos_pow()
            label = f"{np.dtype(dtype).name} n={size_label(n)}"
            impls = {"numpy": lambda x=x: numpy_sincos(x), "dsl": lambda x=x: sincos(x)}
            pow_impls = {"numpy": lambda a=base, b=exponent: numpy_power(a, b),
                         "dsl": lambda a=base, b=exponent: power(a, b)}
            tanh_impls = {"numpy": lambda t=t: numpy_tanh(t), "dsl": lambda t=t: th(t)}
            gelu_impls = {"numpy": lambda t=t: numpy_gelu(t), "dsl": lambda t=t: gl(t)}
            if jax_modules():
                jax_sincos, jax_power, jax_tanh, jax_gelu = jax_sincos_pow()
                impls["jax"] = jax_call(jax_sincos, x)
                pow_impls["jax"] = jax_call(jax_power, base, exponent)
                tanh_impls["jax"] = jax_call(jax_tanh, t)
                gelu_impls["jax"] = jax_call(jax_gelu, t)
            cases.append(Case(f"sin(x) cos(x) {label}", impls, numpy_sincos(x)))
            cases.append(Case(f"x ** y {label}", pow_impls, tuple(flatten(
                numpy_power(base, exponent)))))
            cases.append(Case(f"tanh(x) {label}", tanh_impls, numpy_tanh(t)))
            cases.append(Case(f"gelu(x) {label}", gelu_impls, numpy_gelu(t)))
    return cases


# ------------------------------------------------------------ loop (issue 10)

LOOP_SOURCE = """
def grow(u, kappa, n: i64):
    for step in range(n):
        u = u + kappa * (u * (1 - u))
    return sum(u * u)

@recompute
def grow_checkpointed(u, kappa, n: i64):
    for step in range(n):
        u = u + kappa * (u * (1 - u))
    return sum(u * u)
"""


@lru_cache(maxsize=None)
def dsl_loop_module():
    return dsl.loads(LOOP_SOURCE)


def numpy_loop(u, kappa, steps):
    """grow's value and gradient w.r.t. u and kappa by hand, keeping every
    `segment`-th state and recomputing a segment's states backwards (all
    1,000 states of 1e5 would take 800 MB)."""
    segment = max(1, int(np.sqrt(steps)))
    checkpoints = []
    for step in range(steps):
        if step % segment == 0:
            checkpoints.append(u)
        u = u + kappa * (u * (1 - u))
    value, du, dkappa = np.sum(u * u), 2 * u, 0.0
    for start in reversed(range(0, steps, segment)):
        states = [checkpoints[start // segment]]
        for _ in range(start + 1, min(start + segment, steps)):
            v = states[-1]
            states.append(v + kappa * (v * (1 - v)))
        for v in reversed(states):
            dkappa += np.dot(du, v * (1 - v))
            du = du * (1 + kappa * (1 - 2 * v))
    return value, du, np.asarray(dkappa)


def kernel_launches(driver_source: str) -> int:
    """How many kernel launches a driver's text holds (a loop in the
    driver would launch its body's once per trip, and shows as `for`): a
    choice of kernels, which opens its line, or a kernel called by name."""
    return len(re.findall(r"^\s*\(K\.k_\w+ if|K\.k_\w+\(", driver_source, re.M))


def loop_cases(size: int, steps: int, seed: int = 0) -> list[Case]:
    m = dsl_loop_module()
    u = np.random.default_rng(seed).uniform(0.1, 0.9, size)
    kappa = 0.001
    value_and_grad = dsl.value_and_grad(m.grow, wrt=(0, 1))
    driver = value_and_grad.program(
        value_and_grad.bind((u, kappa, steps), {})).generated.driver_source
    impls = {"numpy": lambda: numpy_loop(u, kappa, steps),
             "dsl": lambda: value_and_grad(u, kappa, steps)}
    if jax_modules():
        jax, jnp = jax_modules()

        def grow(u, kappa):
            u = jax.lax.fori_loop(0, steps, lambda i, u: u + kappa * (u * (1 - u)), u)
            return jnp.sum(u * u)
        impls["jax"] = jax_call(jax.jit(jax.value_and_grad(grow, argnums=(0, 1))), u, kappa)
    _, plain = dsl.vjp(m.grow, u, kappa, steps)
    _, saved = dsl.vjp(m.grow_checkpointed, u, kappa, steps)
    np.testing.assert_allclose(saved(1.0)[0], plain(1.0)[0], rtol=1e-12)
    notes = [f"kernel launches in the value-and-gradient driver: {kernel_launches(driver)} "
             f"(loops in the driver: {driver.count(' in range(')})",
             f"residual_bytes: plain {plain.residual_bytes:,}, @recompute "
             f"{saved.residual_bytes:,} ({plain.residual_bytes / saved.residual_bytes:.1f}x "
             "less), same gradient"]
    return [Case(f"float64 n={size_label(size)}, {steps} steps", impls,
                 numpy_loop(u, kappa, steps), dict(rtol=1e-9, atol=1e-12), notes)]


# ------------------------------------------------------------ an RNN

RNN_SOURCE = """
def rnn(xs: f64[t, d], h: f64[d], w: f64[d, d]):
    for i in range(xs.shape[0]):
        h = tanh(h @ w + xs[i])
    return sum(h)
"""


def numpy_rnn(xs, h, w):
    """rnn's value and gradient w.r.t. xs, h and w by hand (backprop)."""
    hs = [h]
    for x in xs:
        hs.append(np.tanh(hs[-1] @ w + x))
    g, dw, dxs = np.ones_like(h), np.zeros_like(w), np.zeros_like(xs)
    for i in reversed(range(len(xs))):
        dxs[i] = g * (1 - hs[i + 1] ** 2)
        dw += np.outer(hs[i], dxs[i])
        g = dxs[i] @ w.T
    return np.sum(hs[-1]), (dxs, g, dw)


def hot_and_cold(value_and_grad) -> tuple[Callable, Callable]:
    """value_and_grad with its loops hot (run as one compiled function
    each once `runtime.cpu.LOOP_COMPILE_TRIPS` trips ran: here at once),
    and with them kept in the driver (the first calls' way)."""
    from gradlang.runtime import cpu

    def with_threshold(trips: int, *args):
        saved, cpu.LOOP_COMPILE_TRIPS = cpu.LOOP_COMPILE_TRIPS, trips
        try:
            return value_and_grad(*args)
        finally:
            cpu.LOOP_COMPILE_TRIPS = saved
    return (lambda *args: with_threshold(0, *args),
            lambda *args: with_threshold(10**18, *args))


def rnn_cases(steps: int, sizes, seed: int = 0) -> list[Case]:
    """An RNN's value and gradient: "dsl" once its loops are hot,
    "dsl, trips from Python" with them kept in the driver (`hot_and_cold`)."""
    hot, cold = hot_and_cold(dsl.value_and_grad(dsl.loads(RNN_SOURCE, "rnn.grad").rnn,
                                                wrt=(0, 1, 2)))
    rng = np.random.default_rng(seed)
    cases = []
    for d in sizes:
        xs, h, w = rng.normal(size=(steps, d)), rng.normal(size=d), rng.normal(size=(d, d)) / d
        impls = {"numpy": lambda a=(xs, h, w): numpy_rnn(*a),
                 "dsl": lambda a=(xs, h, w): hot(*a),
                 "dsl, trips from Python": lambda a=(xs, h, w): cold(*a)}
        if jax_modules():
            jax, jnp = jax_modules()

            def loss(xs, h, w):
                h, _ = jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + x), None), h, xs)
                return jnp.sum(h)
            impls["jax"] = jax_call(jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))),
                                    xs, h, w)
        if torch_module():
            torch = torch_module()

            def torch_rnn(xs, h, w):
                xs, h, w = (torch.from_numpy(a).requires_grad_(True) for a in (xs, h, w))
                state = h
                for x in xs:
                    state = torch.tanh(state @ w + x)
                value = state.sum()
                return value.detach().numpy(), tuple(
                    g.numpy() for g in torch.autograd.grad(value, (xs, h, w)))
            impls["torch"] = lambda a=(xs, h, w): torch_rnn(*a)
        value, grads = numpy_rnn(xs, h, w)
        cases.append(Case(f"rnn, {steps} steps of {d}, float64", impls,
                          (np.asarray(value),) + grads, dict(rtol=1e-9, atol=1e-12),
                          paired=("dsl", "dsl, trips from Python")))
    return cases


LANGUAGE_MODEL_SOURCE = """
def language_model(tokens: i64[t], h: f64[d], emb: f64[v, d], w: f64[d, d]):
    for i in range(tokens.shape[0]):
        h = tanh(h @ w + emb[tokens[i]])
    return sum(h)
"""


def numpy_language_model(tokens, h, emb, w):
    """language_model's value and gradient w.r.t. h, emb and w by hand:
    each step's row of emb's gradient added where its token points."""
    hs = [h]
    for token in tokens:
        hs.append(np.tanh(hs[-1] @ w + emb[token]))
    g, dw, demb = np.ones_like(h), np.zeros_like(w), np.zeros_like(emb)
    for i in reversed(range(len(tokens))):
        d = g * (1 - hs[i + 1] ** 2)
        demb[tokens[i]] += d
        dw += np.outer(hs[i], d)
        g = d @ w.T
    return np.sum(hs[-1]), (g, demb, dw)


def language_model_cases(steps: int, vocabulary: int, sizes, seed: int = 0) -> list[Case]:
    """An RNN reading its inputs from an embedding table by token
    (`emb[tokens[i]]`): value and gradient w.r.t. h, emb and w, whose
    table gradient gets one row per step ("dsl" and "dsl, trips from
    Python" as in `rnn_cases`)."""
    hot, cold = hot_and_cold(dsl.value_and_grad(
        dsl.loads(LANGUAGE_MODEL_SOURCE, "language_model.grad").language_model, wrt=(1, 2, 3)))
    rng = np.random.default_rng(seed)
    cases = []
    for d in sizes:
        tokens = rng.integers(0, vocabulary, steps)
        h, emb, w = (rng.normal(size=d), rng.normal(size=(vocabulary, d)),
                     rng.normal(size=(d, d)) / d)
        args = (tokens, h, emb, w)
        impls = {"numpy": lambda a=args: numpy_language_model(*a),
                 "dsl": lambda a=args: hot(*a),
                 "dsl, trips from Python": lambda a=args: cold(*a)}
        if jax_modules():
            jax, jnp = jax_modules()

            def loss(tokens, h, emb, w):
                h, _ = jax.lax.scan(lambda h, t: (jnp.tanh(h @ w + emb[t]), None), h, tokens)
                return jnp.sum(h)
            impls["jax"] = jax_call(jax.jit(jax.value_and_grad(loss, argnums=(1, 2, 3))), *args)
        if torch_module():
            torch = torch_module()

            def torch_language_model(tokens, h, emb, w):
                h, emb, w = (torch.from_numpy(a).requires_grad_(True) for a in (h, emb, w))
                state = h
                for token in torch.from_numpy(tokens):
                    state = torch.tanh(state @ w + emb[token])
                value = state.sum()
                return value.detach().numpy(), tuple(
                    g.numpy() for g in torch.autograd.grad(value, (h, emb, w)))
            impls["torch"] = lambda a=args: torch_language_model(*a)
        value, grads = numpy_language_model(*args)
        cases.append(Case(f"language model, {steps} steps of {d}, vocabulary "
                          f"{vocabulary:,}, float64", impls, (np.asarray(value),) + grads,
                          dict(rtol=1e-9, atol=1e-12), paired=("dsl", "dsl, trips from Python")))
    return cases


# ------------------------------------------------------------ fitting an ODE

FIT_SOURCE = """
def rhs(y, k, c):
    return stack([y[1], -k * y[0] - c * y[1]])

def rk4_step(y, k, c, dt):
    k1 = rhs(y, k, c)
    k2 = rhs(y + 0.5 * dt * k1, k, c)
    k3 = rhs(y + 0.5 * dt * k2, k, c)
    k4 = rhs(y + dt * k3, k, c)
    return y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)

def fit_loss(y0, k, c, dt, obs):
    y = y0
    loss = 0.0
    for i in range(obs.shape[0]):
        y = rk4_step(y, k, c, dt)
        loss = loss + sum((y - obs[i]) ** 2)
    return loss
"""


def numpy_fit(y0, k, c, dt, obs):
    """fit_loss's value and gradient w.r.t. y0, k and c by hand: RK4 steps
    of y' = (y1, -k y0 - c y1) forward, keeping every state, then the
    adjoint back through each step's four stages."""
    def f(z):
        return np.array([z[1], -k * z[0] - c * z[1]])

    def f_vjp(z, g):  # g . f(z) differentiated in z, k and c
        return np.array([-k * g[1], g[0] - c * g[1]]), -g[1] * z[0], -g[1] * z[1]

    states, loss = [np.array(y0, dtype=np.float64)], 0.0
    for target in obs:
        y = states[-1]
        k1 = f(y)
        k2 = f(y + 0.5 * dt * k1)
        k3 = f(y + 0.5 * dt * k2)
        k4 = f(y + dt * k3)
        states.append(y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4))
        loss += np.sum((states[-1] - target) ** 2)
    g, gk, gc = np.zeros(2), 0.0, 0.0
    for n in reversed(range(len(obs))):
        y, g = states[n], g + 2 * (states[n + 1] - obs[n])
        z2 = y + 0.5 * dt * f(y)
        z3 = y + 0.5 * dt * f(z2)
        z4 = y + dt * f(z3)
        # y_next = y + dt/6 (k1 + 2 k2 + 2 k3 + k4), k4 = f(z4), z4 = y + dt k3,
        # k3 = f(z3), z3 = y + dt/2 k2, k2 = f(z2), z2 = y + dt/2 k1, k1 = f(y)
        g1, g2, g3, g4 = dt / 6 * g, dt / 3 * g, dt / 3 * g, dt / 6 * g  # of k1 ... k4
        gz, dk, dc = f_vjp(z4, g4)
        g, gk, gc, g3 = g + gz, gk + dk, gc + dc, g3 + dt * gz
        gz, dk, dc = f_vjp(z3, g3)
        g, gk, gc, g2 = g + gz, gk + dk, gc + dc, g2 + 0.5 * dt * gz
        gz, dk, dc = f_vjp(z2, g2)
        g, gk, gc, g1 = g + gz, gk + dk, gc + dc, g1 + 0.5 * dt * gz
        gz, dk, dc = f_vjp(y, g1)
        g, gk, gc = g + gz, gk + dk, gc + dc
    return loss, g, np.asarray(gk), np.asarray(gc)


def fit_cases(steps: int, seed: int = 0) -> list[Case]:
    """The RK4 fit: `obs[i]` read by the loop's index is a stacked input,
    so the loop runs in one kernel each way; JAX by lax.scan under jit."""
    m = dsl.loads(FIT_SOURCE)
    rng = np.random.default_rng(seed)
    args = (np.array([1.0, -0.5]), 4.0, 0.3, 0.05, rng.normal(size=(steps, 2)))
    value_and_grad = dsl.value_and_grad(m.fit_loss, wrt=(0, 1, 2))
    driver = value_and_grad.program(value_and_grad.bind(args, {})).generated.driver_source
    impls = {"numpy": lambda: numpy_fit(*args), "dsl": lambda: value_and_grad(*args)}
    if jax_modules():
        jax, jnp = jax_modules()

        def fit_loss(y0, k, c, dt, obs):
            def f(z):
                return jnp.stack([z[1], -k * z[0] - c * z[1]])

            def step(y, target):
                k1 = f(y)
                k2 = f(y + 0.5 * dt * k1)
                k3 = f(y + 0.5 * dt * k2)
                k4 = f(y + dt * k3)
                y = y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
                return y, jnp.sum((y - target) ** 2)
            _, losses = jax.lax.scan(step, y0, obs)
            return jnp.sum(losses)
        impls["jax"] = jax_call(jax.jit(jax.value_and_grad(fit_loss, argnums=(0, 1, 2))), *args)
    notes = [f"kernel launches in the value-and-gradient driver: {kernel_launches(driver)} "
             f"(loops in the driver: {driver.count(' in range(')})"]
    return [Case(f"RK4 fit, {steps} steps", impls, numpy_fit(*args),
                 dict(rtol=1e-9, atol=1e-12), notes)]


# ------------------------------------------------------------ forward mode (issue 11)


def numpy_log1pexp_hvp(x, v):
    """H v of sum(log1pexp(x)): the second derivative sigmoid' = s (1 - s)."""
    s = 1 / (1 + np.exp(-x))
    return s * (1 - s) * v


def forward_cases(sizes, jacobian_size: int, seed: int = 0) -> list[Case]:
    """dsl.jvp of log1pexp ("dsl") against value_and_grad, with the tangent
    all ones so that both give (value, gradient); then jvp(grad) (forward
    over reverse, "dsl") against hvp (reverse over reverse) at a tenth of
    the size; then jacfwd at `jacobian_size`."""
    from dsl.forward import jvp_function
    m = dsl.load(EXAMPLES / "log1pexp.grad")
    value_and_grad, grad, hvp = (dsl.value_and_grad(m.log1pexp), dsl.grad(m.log1pexp),
                                 dsl.hvp(m.log1pexp))
    jf = jvp_function(m.log1pexp, ["x"])
    rng = np.random.default_rng(seed)
    cases = []
    for n in sizes:
        x, ones = rng.uniform(-20.0, 20.0, n), np.ones(n)
        kernels = len(jf.program(jf.on_target({"x": x, jf.tangent_names[0]: ones}))
                      .generated.kernel_names)
        assert kernels == 1, "the jvp of an elementwise chain is one fused loop"
        impls = {"numpy": lambda x=x: numpy_log1pexp(x),
                 "dsl": lambda x=x, t=ones: dsl.jvp(m.log1pexp, (x,), (t,)),
                 "dsl value_and_grad": lambda x=x: value_and_grad(x)}
        if jax_modules():
            jax, jnp = jax_modules()
            jvp = jax.jit(lambda x, t: jax.jvp(lambda x: jnp.log1p(jnp.exp(x)), (x,), (t,)))
            impls["jax"] = jax_call(jvp, x, ones)
        if torch_module():
            torch = torch_module()
            impls["torch"] = lambda x=x, t=ones: [r.numpy() for r in torch.func.jvp(
                lambda x: torch.log1p(torch.exp(x)), (torch.from_numpy(x),),
                (torch.from_numpy(t),))]
        cases.append(Case(f"jvp, float64 n={size_label(n)}", impls, numpy_log1pexp(x),
                          notes=[f"kernels in the jvp: {kernels}"] if not cases else [],
                          paired=("dsl", "dsl value_and_grad")))
        y, v = x[:max(n // 10, 1)], rng.normal(size=max(n // 10, 1))
        impls = {"numpy": lambda y=y, v=v: numpy_log1pexp_hvp(y, v),
                 "dsl": lambda y=y, v=v: dsl.jvp(grad, (y,), (v,))[1],
                 "dsl hvp": lambda y=y, v=v: hvp(y, v)}
        if jax_modules():
            jax, jnp = jax_modules()
            g = jax.grad(lambda x: jnp.sum(jnp.log1p(jnp.exp(x))))
            impls["jax"] = jax_call(jax.jit(lambda y, v: jax.jvp(g, (y,), (v,))[1]), y, v)
        cases.append(Case(f"jvp(grad), float64 n={size_label(len(y))}", impls,
                          (numpy_log1pexp_hvp(y, v),), dict(rtol=1e-9, atol=1e-14)))
    return cases + [jacobian_case(m, jacobian_size)]


def jacobian_case(m, n: int, seed: int = 0) -> Case:
    """jacfwd of log1pexp (n columns, one jvp each) against jacrev (n
    pullbacks), JAX's and PyTorch's jacfwd (batched: one pass) and the
    diagonal by hand."""
    x = np.random.default_rng(seed).uniform(-20.0, 20.0, n)
    impls = {"numpy": lambda: np.diag(numpy_log1pexp(x)[1]),
             "dsl": lambda: dsl.jacfwd(m.log1pexp)(x),
             "dsl jacrev": lambda: dsl.jacrev(m.log1pexp)(x)}
    if jax_modules():
        jax, jnp = jax_modules()
        impls["jax"] = jax_call(jax.jit(jax.jacfwd(lambda x: jnp.log1p(jnp.exp(x)))), x)
    if torch_module():
        torch = torch_module()
        impls["torch"] = lambda: torch.func.jacfwd(
            lambda x: torch.log1p(torch.exp(x)))(torch.from_numpy(x)).numpy()
    return Case(f"jacfwd, float64 n={size_label(n)}", impls, (np.diag(numpy_log1pexp(x)[1]),))


# ------------------------------------------------------------ indexing


def indexing_inputs(rows: int, width: int, lookups: int, values: int, segments: int,
                    seed: int = 0) -> dict[str, np.ndarray]:
    """An embedding table, ids into it (negative ones too) and rows to add
    back; values and their segment ids for a 1-d segment sum."""
    rng = np.random.default_rng(seed)
    return {"table": rng.normal(size=(rows, width)),
            "ids": rng.integers(-rows, rows, size=lookups),
            "rows": rng.normal(size=(lookups, width)),
            "values": rng.normal(size=values),
            "segment_ids": rng.integers(0, segments, size=values),
            "segments": np.zeros(segments)}


def indexing_cases(rows: int, width: int, lookups: int, values: int, segments: int,
                   seed: int = 0) -> list[Case]:
    from gradlang.runtime import cpu as R
    d = indexing_inputs(rows, width, lookups, values, segments, seed)
    table, ids, lookup_rows = d["table"], d["ids"], d["rows"]
    seg_values, seg_ids = d["values"], d["segment_ids"]

    def numpy_scatter(base, idx, v):
        out = np.zeros_like(base)
        np.add.at(out, idx, v)
        return out

    gather = {"numpy": lambda: np.take(table, ids, axis=0),
              "dsl": lambda: R.take(table, ids, 0, "ids")}
    # as a driver runs a gather's gradient: into zeros it made (`R.full`),
    # which it owns and adds into in place, with no copy
    scatter = {"numpy": lambda: numpy_scatter(table, ids, lookup_rows),
               "dsl": lambda: R.scatter_add(R.full(table.shape, 0, table.dtype), ids,
                                            lookup_rows, 0, "ids", owned=True)}
    segment = {"numpy": lambda: numpy_scatter(d["segments"], seg_ids, seg_values),
               "dsl": lambda: R.scatter_add(R.full((segments,), 0, np.float64), seg_ids,
                                            seg_values, 0, "segment_ids", owned=True)}
    if jax_modules():
        jax, jnp = jax_modules()
        gather["jax"] = jax_call(jax.jit(lambda t, i: jnp.take(t, i, axis=0)), table, ids)
        add_at = jax.jit(lambda base, i, v: jnp.zeros_like(base).at[i].add(v))
        scatter["jax"] = jax_call(add_at, table, ids, lookup_rows)
        segment["jax"] = jax_call(add_at, d["segments"], seg_ids, seg_values)
    if torch_module():
        torch = torch_module()
        tt, ti = torch.from_numpy(table), torch.from_numpy(ids % rows)
        tr, tv, ts = (torch.from_numpy(lookup_rows), torch.from_numpy(seg_values),
                      torch.from_numpy(seg_ids))
        gather["torch"] = lambda: torch.index_select(tt, 0, ti).numpy()
        scatter["torch"] = lambda: torch.zeros_like(tt).index_add_(0, ti, tr).numpy()
        segment["torch"] = lambda: torch.zeros(segments, dtype=torch.float64).index_add_(
            0, ts, tv).numpy()
    return [Case(f"gather {lookups} rows of {width} from {rows}", gather, (gather["numpy"](),)),
            Case(f"scatter-add {lookups} rows of {width} into {rows}", scatter,
                 (scatter["numpy"](),)),
            Case(f"segment sum of {size_label(values)} into {segments}", segment,
                 (segment["numpy"](),))]


# ------------------------------------------------------------ interop (issue 12)


def torch_bridge_cases(sizes, seed: int = 0) -> list[Case]:
    """log1pexp value + gradient through `dsl.to_torch` ("dsl") against the
    dsl called on NumPy arrays (`dsl.vjp` and its pullback); then as a
    torch.compile'd step (aot_eager), torch's softplus compiled so."""
    if torch_module() is None:
        return []
    torch = torch_module()
    f = dsl.load(EXAMPLES / "log1pexp.grad").log1pexp
    tf = dsl.to_torch(f)
    rng = np.random.default_rng(seed)
    cases = []
    for n in sizes:
        x, ones = rng.uniform(-20.0, 20.0, n), np.ones(n)
        xt, ones_t = torch.from_numpy(x.copy()).requires_grad_(), torch.from_numpy(ones)

        def through_torch(xt=xt, ones_t=ones_t):
            xt.grad = None
            y = tf(xt)
            y.backward(ones_t)
            return y.detach().numpy(), xt.grad.numpy()

        def direct(x=x, ones=ones):
            y, pullback = dsl.vjp(f, x)
            return y, pullback(ones)[0]
        forward = {"numpy": lambda x=x: np.log1p(np.exp(x)),
                   "dsl": lambda xt=xt: tf(xt.detach()).numpy(), "dsl direct": lambda x=x: f(x),
                   "torch": lambda x=x: torch.log1p(torch.exp(torch.from_numpy(x))).numpy()}
        cases.append(Case(f"to_torch log1pexp forward, float64 n={size_label(n)}", forward,
                          (np.log1p(np.exp(x)),)))
        impls = {"numpy": lambda x=x: numpy_log1pexp(x), "dsl": through_torch,
                 "dsl direct": direct, "torch": lambda x=x: torch_log1pexp()(x)}
        cases.append(Case(f"to_torch log1pexp fwd+bwd, float64 n={size_label(n)}", impls,
                          numpy_log1pexp(x)))
        # (aot_eager: AOTAutograd's forward and backward graphs run as traced,
        # with none of inductor's C++ compilation)
        ours = torch.compile(lambda x: tf(x), backend="aot_eager", fullgraph=True)
        theirs = torch.compile(torch.nn.functional.softplus, backend="aot_eager",
                               fullgraph=True)
        impls = {"numpy": lambda x=x: numpy_log1pexp(x),
                 "dsl": lambda xt=xt, ones_t=ones_t: compiled_step(ours, xt, ones_t),
                 "dsl direct": direct,
                 "torch": lambda xt=xt, ones_t=ones_t: compiled_step(theirs, xt, ones_t)}
        cases.append(Case(f"to_torch log1pexp fwd+bwd under torch.compile, float64 "
                          f"n={size_label(n)}", impls, numpy_log1pexp(x)))
    return cases


def compiled_step(step, x, ct) -> tuple:
    """A torch.compile'd function's value and gradient at x for the
    cotangent ct, as NumPy arrays."""
    y = step(x)
    (g,) = torch_module().autograd.grad(y, x, ct)
    return y.detach().numpy(), g.numpy()


def jax_bridge_cases(sizes, seed: int = 0) -> list[Case]:
    """log1pexp value + gradient through `dsl.to_jax` under `jax.jit`
    ("dsl": callbacks into the compiled kernels) against the dsl
    called directly and JAX's own `custom_vjp` version."""
    if jax_modules() is None:
        return []
    jax, jnp = jax_modules()
    f = dsl.load(EXAMPLES / "log1pexp.grad").log1pexp
    g = dsl.to_jax(f)

    @jax.jit
    def through_jax(x):
        v, pullback = jax.vjp(g, x)
        return v, pullback(jnp.ones_like(v))[0]
    rng = np.random.default_rng(seed)
    cases = []
    for n in sizes:
        x = rng.uniform(-20.0, 20.0, n)
        impls = {"numpy": lambda x=x: numpy_log1pexp(x), "dsl": jax_call(through_jax, x),
                 "dsl direct": lambda x=x: dsl_log1pexp()(x),
                 "jax": jax_call(jax_log1pexp(), x)}
        cases.append(Case(f"to_jax log1pexp fwd+bwd under jit, float64 n={size_label(n)}",
                          impls, numpy_log1pexp(x)))
    return cases


def numpy_logistic(x, y, w):
    z = -y * (x @ w)
    return np.mean(np.logaddexp(0, z)), x.T @ (-y / (1 + np.exp(-z))) / len(y)


@lru_cache(maxsize=None)
def dask_client(workers: int):
    """A dask.distributed client of a LocalCluster of `workers` processes
    (one thread each), made once per process; None without distributed."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        return None
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=None)
    return Client(cluster, set_as_default=False)


def dask_cases(rows: int, blocks: int, workers: int = 2, seed: int = 0) -> list[Case]:
    """value_and_grad(loss, wrt=2) of examples/logistic.grad on Dask arrays
    ("dsl", threaded scheduler), on a LocalCluster of `workers` processes
    (none: 0), in memory, and written with dask.array by hand."""
    try:
        import dask
        import dask.array as da
    except ImportError:
        return []
    m = dsl.load(EXAMPLES / "logistic.grad")
    rng = np.random.default_rng(seed)
    x, y, w = rng.normal(size=(rows, 8)), np.sign(rng.normal(size=rows)), rng.normal(size=8) / 3
    chunk = -(-rows // blocks)
    xs, ys = da.from_array(x, chunks=(chunk, 8)), da.from_array(y, chunks=chunk)
    vg = dsl.value_and_grad(m.loss, wrt=2)

    def by_hand():
        z = -ys * (xs @ w)
        return dask.compute(da.mean(da.logaddexp(0, z)),
                            xs.T @ (-ys / (1 + da.exp(-z))) / rows, scheduler="threads")

    impls = {"numpy": lambda: numpy_logistic(x, y, w),
             "dsl": lambda: dask.compute(*vg(xs, ys, w), scheduler="threads"),
             "dsl in memory": lambda: vg(x, y, w), "dask.array by hand": by_hand}
    client = dask_client(workers) if workers else None
    if client is not None:
        # the rows live on the workers, as data loaded there would: only the
        # block tasks, w and the partials move per call
        on_cluster = client.persist([xs, ys])
        impls[f"dsl, {workers} worker processes"] = lambda: client.compute(
            vg(*on_cluster, w), sync=True)
    value, grad = numpy_logistic(x, y, w)
    return [Case(f"logistic value_and_grad on Dask, {rows} x 8 f64 in {blocks} blocks", impls,
                 (np.asarray(value), grad), dict(rtol=1e-10, atol=1e-12))]
