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
    dense_cases      sum(softplus(x @ w + b)) in f32, gradient w.r.t. w, b
                     (benchmarks/dense_f32.grad)
    fused_sum_cases  sum(x * x): one fused loop against NumPy's temporary
    out_cases        log1pexp value + gradient into reused buffers (`out=`)
                     against fresh results, and NumPy by hand with `out=`
    sincos_pow_cases sin(x) cos(x) and x ** y, value and gradient
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np

import dsl

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DENSE = Path(__file__).resolve().parent / "dense_f32.grad"
ALPHA = 0.2  # stylegan_r1.grad's leaky ReLU slope
TOLERANCE = {np.dtype(np.float64): dict(rtol=1e-9, atol=1e-12),
             np.dtype(np.float32): dict(rtol=2e-4, atol=1e-5)}


@dataclass
class Case:
    label: str
    impls: dict[str, Callable[[], object]]
    want: tuple[np.ndarray, ...]
    tolerance: dict = field(default_factory=dict)


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

SINCOS_POW = """def sincos(x):
    return sin(x) * cos(x)

def power(x, y):
    return x ** y
"""


@lru_cache(maxsize=None)
def dsl_sincos_pow():
    module = dsl.loads(SINCOS_POW)
    return (dsl.value_and_grad(module.sincos), dsl.value_and_grad(module.power, wrt=(0, 1)))


def numpy_sincos(x):
    s, c = np.sin(x), np.cos(x)
    return s * c, c * c - s * s


def numpy_power(x, y):
    v = x**y
    return v, (y * x ** (y - 1), np.log(x) * v)


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
            value_and_grad(lambda x, y: x**y, (0, 1)))


def sincos_pow_cases(sizes, dtypes, seed: int = 0) -> list[Case]:
    """sin(x) cos(x) and x ** y (x in [0.5, 2], y in [-8, 8]): value and
    gradient, elementwise."""
    rng = np.random.default_rng(seed)
    cases = []
    for dtype in dtypes:
        for n in sizes:
            x = rng.uniform(-100, 100, n).astype(dtype)
            base, exponent = (rng.uniform(0.5, 2.0, n).astype(dtype),
                              rng.uniform(-8, 8, n).astype(dtype))
            sincos, power = dsl_sincos_pow()
            label = f"{np.dtype(dtype).name} n={size_label(n)}"
            impls = {"numpy": lambda x=x: numpy_sincos(x), "dsl": lambda x=x: sincos(x)}
            pow_impls = {"numpy": lambda a=base, b=exponent: numpy_power(a, b),
                         "dsl": lambda a=base, b=exponent: power(a, b)}
            if jax_modules():
                jax_sincos, jax_power = jax_sincos_pow()
                impls["jax"] = jax_call(jax_sincos, x)
                pow_impls["jax"] = jax_call(jax_power, base, exponent)
            cases.append(Case(f"sin(x) cos(x) {label}", impls, numpy_sincos(x)))
            cases.append(Case(f"x ** y {label}", pow_impls, tuple(flatten(
                numpy_power(base, exponent)))))
    return cases
