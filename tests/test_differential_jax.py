"""Differential testing against JAX: random well-typed `.grad` programs,
each mirrored as a JAX function, must agree with it in f64 on values,
`value_and_grad`, `jvp`, `hessian`, `hvp`, `vmap` (over x, and over the
run-time indices), `jacfwd`/`jacrev` and `to_jax` under `jax.grad` (f32
loosely against f64, with the f32 dtype kept; a few on the CUDA target
against the CPU).

A program is generated together with its JAX twin from a `Chooser` (a
seeded `random.Random`, or Hypothesis's `data.draw`): compositions of the
elementwise builtins (domains guarded: `log(1 + a * a)`, `sqrt(1 + a *
a)`, an `exp` only of what a running magnitude bound keeps finite),
reductions with `axis`/`keepdims`, the standard library's `logsumexp`,
`softmax`, `norm` and `logaddexp`, `cumsum`, the layout ops (transpose,
reshape, slices with steps and negative indices, `None` axes,
`concatenate`, `stack`, `take` and `x[idx]` with compile-time and run-time
index arrays), `@`/`einsum`, `conv1d`/`conv2d` and 1-d and 2-d max and
average pools (the twin gathers the windows), `initial=` of sum, max and
min, `and`/`or`/`not` masks, `for` loops with run-time indices (`c = ...`
or `c += ...`), run-time `if`/`elif`/`else`, helper functions (plain,
`@recompute`, `@pass_through`, of two results unpacked, with grad blocks
whose twin is a `jax.custom_vjp`), a module param (and the gradient with
respect to it) and in-language `grad`, `value_and_grad` and `jvp`.

Inputs are uniform in [-2, 2] from a Hypothesis-drawn seed: a tie or a
kink is hit with probability zero, so every comparison is of smooth
functions. Compiling dominates, so the default run compiles one small
program from a fixed seed (value_and_grad, on the CPU and CUDA) and varies
only the inputs; `GRAD_FUZZ_SCALE=N` adds 4(N-1) fixed programs checked
every way and a Hypothesis search over 2N programs (a long hunt:
`GRAD_FUZZ_SCALE=50`, several seconds a program; `GRAD_FUZZ_SEED=k` picks
other fixed programs; `GRAD_FUZZ_LARGE=1` draws them at realistic sizes,
where the parallel kernels, the row loops' blocks, pooled memory and the
blocked products run; there a Hessian is compared as its product with a
vector and Jacobians only of small ones). One large program runs in every
run, on parallel kernels and a row loop of many blocks. A program's results
must outlive the calls after them, a second call must agree with the first,
and no call may write its arguments. Programs with a grad
block that is not the function's derivative (a straight-through estimator)
skip the second-order comparisons, where JAX differentiates a
`custom_vjp`'s body; JAX cannot jvp a `custom_vjp`, so their jvp is
compared with JAX's reverse-mode Jacobian times the tangent."""
from __future__ import annotations

import contextlib
import functools
import math
import os
import random
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dsl
from helpers import optional_module

jax = optional_module("jax", "jax")
jnp = optional_module("jax.numpy", "jax")

SCALE = max(1, int(os.environ.get("GRAD_FUZZ_SCALE", "1")))
# A hunt's other fixed programs: GRAD_FUZZ_SEED=k checks seeds from 1000 + 10000 k
SEED = int(os.environ.get("GRAD_FUZZ_SEED", "0"))

# GRAD_FUZZ_LARGE=1: programs at realistic sizes (x of A x B with A up to
# 33 and B up to 7000, the axes a program adds up to 7000 within LARGE_LIMIT
# elements an array), reaching the parallel kernels, the row loops' many
# blocks, pooled memory and blocked products; hessians and Jacobians are
# then compared as hvps only
LARGE = os.environ.get("GRAD_FUZZ_LARGE", "") == "1"
LARGE_ROWS, LARGE_COLS = (3, 17, 33), (17, 1025, 7000)
LARGE_EXTENTS = (17, 100, 1025, 7000)
LARGE_LIMIT = 1 << 18


def floats_of(rows: int, cols: int) -> dict:
    """The program's arguments: three float arrays (and an index array)."""
    return {"x": (rows, cols), "y": (cols,), "w": (cols, rows)}


def shapes_of(rows: int, cols: int) -> list:
    """The shapes a program's expressions take."""
    return [(), (2,), (rows,), (cols,), (rows, cols), (cols, rows), (2, rows), (1, cols),
            (rows, 1), (2, rows, 2)]


FLOATS = floats_of(3, 4)
IDS_LEN = 5
# A module param the programs may read (`param p: f64[4]`, of B elements at
# large sizes), and its value.
P_VALUE = np.array([0.5, -1.25, 0.75, 1.5])
SHAPES = shapes_of(3, 4)


def p_value(n: int) -> np.ndarray:
    return np.resize(P_VALUE, n)


class Chooser:
    """Random choices from a seeded generator or from Hypothesis."""

    def __init__(self, rng: random.Random | None = None, data=None):
        self.rng, self.data = rng, data

    def choice(self, seq):
        seq = list(seq)
        if self.data is not None:
            return self.data.draw(st.sampled_from(seq))
        return self.rng.choice(seq)

    def int(self, lo: int, hi: int) -> int:
        if self.data is not None:
            return self.data.draw(st.integers(lo, hi))
        return self.rng.randint(lo, hi)

    def coin(self, p: float = 0.5) -> bool:
        return self.int(0, 99) < p * 100


class E:
    """An expression: its `.grad` text, its JAX twin (env -> array), its
    shape and a bound on its magnitude (for keeping `exp` finite)."""

    def __init__(self, src: str, fn, shape: tuple, bound: float):
        self.src, self.fn, self.shape, self.bound = src, fn, tuple(shape), float(bound)


# a name that is an array (else an expression is a compile-time number)
_READS_ARRAY = re.compile(r"\b(x|y|w|p|ids|[tcuv]\d+|a|b)\b")


# (template, JAX twin, bound of the result from the argument's bound)
UNARY = [
    ("tanh({0})", lambda a: jnp.tanh(a), lambda b: 1),
    ("sigmoid({0})", lambda a: jax.nn.sigmoid(a), lambda b: 1),
    ("sin({0})", lambda a: jnp.sin(a), lambda b: 1),
    ("cos({0})", lambda a: jnp.cos(a), lambda b: 1),
    ("arctan({0})", lambda a: jnp.arctan(a), lambda b: 2),
    ("arcsinh({0})", lambda a: jnp.arcsinh(a), lambda b: math.log(2 * b + 2)),
    ("erf({0})", lambda a: jax.scipy.special.erf(a), lambda b: 1),
    ("erfc({0})", lambda a: jax.scipy.special.erfc(a), lambda b: 2),
    ("exp(-{0} * {0})", lambda a: jnp.exp(-a * a), lambda b: 1),
    ("log(1 + {0} * {0})", lambda a: jnp.log(1 + a * a), lambda b: math.log1p(b * b)),
    ("log1p({0} * {0})", lambda a: jnp.log1p(a * a), lambda b: math.log1p(b * b)),
    ("sqrt(1 + {0} * {0})", lambda a: jnp.sqrt(1 + a * a), lambda b: math.sqrt(1 + b * b)),
    ("abs({0})", lambda a: jnp.abs(a), lambda b: b),
    ("-{0}", lambda a: -a, lambda b: b),
    ("{0} ** 2", lambda a: a ** 2, lambda b: b * b),
    ("{0} * {0} * 0.5", lambda a: a * a * 0.5, lambda b: b * b),
    ("(abs({0}) + 0.5) ** 1.5", lambda a: (jnp.abs(a) + 0.5) ** 1.5,
     lambda b: (b + 0.5) ** 1.5),
    ("clip({0}, -1.0, 0.5)", lambda a: jnp.clip(a, -1.0, 0.5), lambda b: 1),
    ("clip({0}, None, 0.5)", lambda a: jnp.minimum(a, 0.5), lambda b: b),
    ("maximum({0}, 0.0)", lambda a: jnp.maximum(a, 0.0), lambda b: b),
    ("{0} % 1.5", lambda a: jnp.remainder(a, 1.5), lambda b: 1.5),
    # (+ 0.25: never 0, where abs' is 0 here and 1 in JAX: a convention at a kink)
    ("floor({0}) + 0.25", lambda a: jnp.floor(a) + 0.25, lambda b: b + 1),
    ("sign({0}) * {0}", lambda a: jnp.sign(a) * a, lambda b: b),
    ("stop_gradient({0})", lambda a: jax.lax.stop_gradient(a), lambda b: b),
    ("ceil({0}) - 0.25", lambda a: jnp.ceil(a) - 0.25, lambda b: b + 1),
    ("round({0}) + 0.25", lambda a: jnp.round(a) + 0.25, lambda b: b + 1),
    ("{0} // 0.75 + 0.25", lambda a: jnp.floor_divide(a, 0.75) + 0.25, lambda b: b * 2 + 1),
    ("{0} % -1.25", lambda a: jnp.remainder(a, -1.25), lambda b: 1.25),
    ("tan(0.5 * tanh({0}))", lambda a: jnp.tan(0.5 * jnp.tanh(a)), lambda b: 1),
    # the standard library's (imported where used)
    ("relu({0})", lambda a: jnp.maximum(a, 0.0), lambda b: b),
    ("leaky_relu({0}, 0.1)", lambda a: jnp.where(a >= 0, a, 0.1 * a), lambda b: b),
    ("gelu({0})", lambda a: jax.nn.gelu(a, approximate=False), lambda b: b),
    ("log_sigmoid({0})", lambda a: jax.nn.log_sigmoid(a), lambda b: b + 1),
]
# only where the bound keeps them finite
GROWING = [
    ("exp({0})", lambda a: jnp.exp(a), lambda b: math.exp(b), 30),
    ("sinh({0})", lambda a: jnp.sinh(a), lambda b: math.exp(b), 30),
    ("cosh({0})", lambda a: jnp.cosh(a), lambda b: math.exp(b), 30),
    ("expm1({0})", lambda a: jnp.expm1(a), lambda b: math.exp(b), 30),
    ("{0} ** 3", lambda a: a ** 3, lambda b: b ** 3, 1e3),
    ("tan(tanh({0}))", lambda a: jnp.tan(jnp.tanh(a)), lambda b: 2, 1e300),
]
BINARY = [
    ("{0} + {1}", lambda a, b: a + b, lambda p, q: p + q),
    ("{0} - {1}", lambda a, b: a - b, lambda p, q: p + q),
    ("{0} * {1}", lambda a, b: a * b, lambda p, q: p * q),
    ("{0} / (1 + {1} * {1})", lambda a, b: a / (1 + b * b), lambda p, q: p),
    ("maximum({0}, {1})", lambda a, b: jnp.maximum(a, b), max),
    ("minimum({0}, {1})", lambda a, b: jnp.minimum(a, b), max),
    ("where({0} > {1}, {0}, {1} * 0.5)", lambda a, b: jnp.where(a > b, a, b * 0.5), max),
    ("where({0} <= 0.25, sin({1}), {0})", lambda a, b: jnp.where(a <= 0.25, jnp.sin(b), a),
     lambda p, q: max(p, 1)),
    ("(1 + {0} * {0}) ** tanh({1})", lambda a, b: (1 + a * a) ** jnp.tanh(b),
     lambda p, q: 1 + p * p),
    ("arctan({0} * {1})", lambda a, b: jnp.arctan(a * b), lambda p, q: 2),
    ("logaddexp({0}, {1})", lambda a, b: jnp.logaddexp(a, b), lambda p, q: max(p, q) + 1),
    ("sigmoid_cross_entropy({0}, {1})",
     lambda a, b: jnp.maximum(a, 0) - a * b + jnp.log1p(jnp.exp(-jnp.abs(a))),
     lambda p, q: p + p * q + 1),
    ("where(({0} > 0.25) and ({1} < 0.5), {0}, {1})",
     lambda a, b: jnp.where((a > 0.25) & (b < 0.5), a, b), max),
    ("where(not ({0} > {1}) or {1} > 1.0, {1}, -{0})",
     lambda a, b: jnp.where(~(a > b) | (b > 1.0), b, -a), max),
]
REDUCTIONS = [
    ("sum", lambda a, ax, kd: jnp.sum(a, axis=ax, keepdims=kd), lambda b, n: b * n),
    ("mean", lambda a, ax, kd: jnp.mean(a, axis=ax, keepdims=kd), lambda b, n: b),
    ("max", lambda a, ax, kd: jnp.max(a, axis=ax, keepdims=kd), lambda b, n: b),
    ("min", lambda a, ax, kd: jnp.min(a, axis=ax, keepdims=kd), lambda b, n: b),
    ("logsumexp", lambda a, ax, kd: jax.scipy.special.logsumexp(a, axis=ax, keepdims=kd),
     lambda b, n: b + math.log(n)),
    ("norm", lambda a, ax, kd: jnp.linalg.norm(a, axis=ax, keepdims=kd)
     if not isinstance(ax, tuple) or len(ax) <= 2 else
     jnp.sqrt(jnp.sum(a * a, axis=ax, keepdims=kd)), lambda b, n: b * n),
]
STD = ("logsumexp", "softmax", "log_softmax", "norm", "logaddexp", "softplus", "relu",
       "leaky_relu", "gelu", "log_sigmoid", "sigmoid_cross_entropy")


def _std_used(template: str) -> set:
    """The standard-library functions a template calls."""
    return set(re.findall(r"\b([a-z_]+)\(", template)) & set(STD)


def _unbroadcast(g, shape):
    """A cotangent of a broadcast shape summed back to `shape`."""
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for axis, n in enumerate(shape):
        if n == 1 and g.shape[axis] != 1:
            g = g.sum(axis=axis, keepdims=True)
    return g


# while set, a twin's grad blocks trace as their plain functions, which JAX
# can jvp (where each block is its function's derivative, the same jvp)
_PLAIN_GRAD_BLOCKS = [False]


@contextlib.contextmanager
def _plain_grad_blocks():
    _PLAIN_GRAD_BLOCKS[0] = True
    try:
        yield
    finally:
        _PLAIN_GRAD_BLOCKS[0] = False


def _custom(fwd, bwd):
    """A `jax.custom_vjp` of `fwd` whose pullback is `bwd(args, dy)`."""
    f = jax.custom_vjp(fwd)
    f.defvjp(lambda *a: (fwd(*a), a),
             lambda a, dy: tuple(_unbroadcast(g, jnp.shape(x)) for x, g in zip(a, bwd(a, dy))))
    return lambda *a: fwd(*a) if _PLAIN_GRAD_BLOCKS[0] else f(*a)


# Functions with grad blocks: (source, twin factory, arity, the block is
# the derivative (else the program skips second order), bound)
CUSTOM = [
    ("""def softplus_c{k}(a):
    return maximum(a, 0.0) + log1p(exp(-abs(a)))
grad(dy):
    return dy * sigmoid(a)
""", lambda: _custom(lambda a: jnp.logaddexp(a, 0.0), lambda a, dy: (dy * jax.nn.sigmoid(a[0]),)),
     1, True, lambda b: b + 1),
    ("""def cube_c{k}(a):
    y = a * a * a
    return y
grad(dy):
    return dy * 3 * a * a
""", lambda: _custom(lambda a: a ** 3, lambda a, dy: (dy * 3 * a[0] * a[0],)), 1, True,
     lambda b: b ** 3),
    ("""def tanh_c{k}(a):
    t = tanh(a)
    return t
grad(dy):
    return dy * (1 - t * t)
""", lambda: _custom(jnp.tanh, lambda a, dy: (dy * (1 - jnp.tanh(a[0]) ** 2),)), 1, True,
     lambda b: 1),
    ("""def mul_c{k}(a, b):
    return a * b
grad(dy):
    return dy * b, dy * a
""", lambda: _custom(lambda a, b: a * b, lambda a, dy: (dy * a[1], dy * a[0])), 2, True,
     lambda p, q: p * q),
    ("""def hyp_c{k}(a, b):
    r = sqrt(1 + a * a + b * b)
    return r
grad(dr):
    return a=dr * a / r, b=dr * b / r
""", lambda: _custom(lambda a, b: jnp.sqrt(1 + a * a + b * b),
                     lambda a, dy: (dy * a[0] / jnp.sqrt(1 + a[0] ** 2 + a[1] ** 2),
                                    dy * a[1] / jnp.sqrt(1 + a[0] ** 2 + a[1] ** 2))),
     2, True, lambda p, q: 1 + p + q),
    ("""def ste_c{k}(a):
    return clip(a, -1.0, 1.0)
grad(dy):
    return dy
""", lambda: _custom(lambda a: jnp.clip(a, -1.0, 1.0), lambda a, dy: (dy,)), 1, False,
     lambda b: 1),
    ("""def sq_c{k}(a):
    return a * a
grad(dy):
    return dy * a
""", lambda: _custom(lambda a: a * a, lambda a, dy: (dy * a[0],)), 1, False, lambda b: b * b),
]


def _slice_for(rng: Chooser, d: int):
    """(text, slice, source size n) taking d elements of an axis of size n."""
    while True:
        step = rng.choice([1, 1, 2, -1, -2, 3])
        n = rng.int(d, 2 * d + 2)
        span = (d - 1) * abs(step) + 1
        if span > n:
            continue
        if step > 0:
            start = rng.int(0, n - span)
            stop = start + span
        else:
            start = rng.int(span - 1, n - 1)
            stop = start - span
        def show(v):   # from the end where it can be (0 <= v < n)
            if v is None:
                return ""
            return str(v - n) if 0 <= v < n and rng.coin(0.4) else str(v)
        lo = None if (step > 0 and start == 0 or step < 0 and start == n - 1) and rng.coin() \
            else start
        # (a stop before the first element has no index: Python's -1 is the last)
        hi = None if stop >= n and rng.coin(0.7) or stop < 0 else stop
        sl = slice(lo, hi, step)
        if len(range(n)[sl]) != d:
            continue
        text = f"{show(lo)}:{show(hi)}" + ("" if step == 1 and rng.coin() else
                                                        f":{step}")
        return text, sl, n


class Program:
    """One generated program: `.source` and its twin `.jax(x, y, w, ids)`."""

    def __init__(self, rng: Chooser, max_depth: int = 4, large: bool = False):
        self.rng = rng
        self.large = large
        self.rows, self.cols = (rng.choice(LARGE_ROWS), rng.choice(LARGE_COLS)) if large \
            else (3, 4)
        self.floats = floats_of(self.rows, self.cols)
        self.p = p_value(self.cols)
        self.shapes = shapes_of(self.rows, self.cols)
        self.helpers: list[str] = []
        self.twins: dict[str, object] = {}
        self.std: set[str] = set()
        self.second_order = True   # every grad block is the derivative
        self.custom = False        # has a grad block (JAX cannot jvp it)
        self.loop_leaves: list[E] = []
        self.locals: list[E] = []
        self.max_depth = max_depth
        self.params_only = False   # in a helper's body: its parameters are the leaves
        # (a product, cumsum, segment_sum or scatter_add of one, or one passed
        # to a grad block, is f64 by the rules of docs/language.md: the f32
        # check then compares values only)
        self.weak_constants = False
        self.uses_param = False    # reads the module param p
        body, steps = [], []
        for k in range(rng.int(0, 2)):
            e = self.gen(rng.choice(self.shapes), max_depth - 1)
            self._bind(body, steps, f"t{k}", e)
        if rng.coin(0.3):
            self._loop(body, steps)
        if rng.coin(0.25):
            self._branch(body, steps)
        if rng.coin(0.15):
            self._unpack(body, steps)
        outs = [self.gen(rng.choice(self.shapes), max_depth) for _ in range(1 + rng.coin(0.2))]
        for local in self.locals:   # each local reaches a result
            first = outs[0]
            outs[0] = E(f"{first.src} + sum({local.src}) * 0.25",
                        lambda env, f=first.fn, g=local.fn: f(env) + jnp.sum(g(env)) * 0.25,
                        first.shape, first.bound + local.bound)
        body.append("return " + ", ".join(o.src for o in outs))
        imports = f"from std import {', '.join(sorted(self.std))}\n\n" if self.std else ""
        if self.uses_param:
            imports += f"param p: f64[{self.cols}]\n\n"
        self.source = (imports + "".join(h + "\n" for h in self.helpers)
                       + "def f(x, y, w, ids):\n" + "".join(f"    {b}\n" for b in body))
        self.n_out = len(outs)

        def twin(x, y, w, ids, p=self.p):
            env = {"x": x, "y": y, "w": w, "ids": ids, "p": p}
            for step in steps:
                step(env)
            res = tuple(o.fn(env) for o in outs)
            return res if len(res) > 1 else res[0]
        self.jax = twin

    # ---------------------------------------------------------- statements
    def _bind(self, body, steps, name, e, indent=""):
        body.append(f"{indent}{name} = {e.src}")
        steps.append(lambda env, fn=e.fn: env.__setitem__(name, fn(env)))
        self.locals.append(E(name, lambda env: env[name], e.shape, e.bound))

    def _loop(self, body, steps):
        rng = self.rng
        shape = rng.choice(self.shapes)
        init = self.gen(shape, 2)
        name = f"c{len(self.locals)}"
        body.append(f"{name} = {init.src}")
        form = rng.choice(["up", "from1", "down"])
        trips = rng.int(0, 3 if form == "up" else 2)   # i indexes x's 3 rows
        if form == "up":
            header, idxs = f"range({trips})", list(range(trips))
        elif form == "from1":
            header, idxs = f"range(1, {trips + 1})", list(range(1, trips + 1))
        else:
            header, idxs = f"range({trips}, -1, -1)", list(range(trips, -1, -1))
        body.append(f"for i in {header}:")
        # (an augmented assignment, `c += tanh(...)`, grows by at most 1 a trip)
        augmented = rng.coin(0.3)
        acc = E(name, lambda env: env[name], shape, init.bound + 4 if augmented else 3)
        row = E("x[i]", lambda env: env["x"][env["i"]], (self.cols,), 2)
        col = E("w[i]", lambda env: env["w"][env["i"]], (self.rows,), 2)
        self.loop_leaves = [acc, row, col]
        step_e = self.gen(shape, 2)
        self.loop_leaves = []
        fn = step_e.fn
        if augmented:
            op = rng.choice(["+=", "-="])
            body.append(f"    {name} {op} tanh({step_e.src})")
            sign = 1 if op == "+=" else -1

            def update(env):
                return env[name] + sign * jnp.tanh(fn(env))
        else:
            body.append(f"    {name} = tanh({name} * 0.75 + {step_e.src})")

            def update(env):
                return jnp.tanh(env[name] * 0.75 + fn(env))

        def run(env):
            env[name] = init.fn(env)
            for i in idxs:
                env["i"] = i
                env[name] = update(env)
        steps.append(run)
        self.locals.append(E(name, lambda env: env[name], shape, acc.bound))

    def _branch(self, body, steps):
        rng = self.rng
        shape = rng.choice(self.shapes)
        cond = self.gen(rng.choice(self.shapes), 2)
        a, b = self.gen(shape, 2), self.gen(shape, 2)
        name = f"v{len(self.locals)}"
        threshold = rng.choice(["0.0", "0.5", "-1.0"])
        body += [f"if sum({cond.src}) > {threshold}:", f"    {name} = {a.src}"]
        t = float(threshold)
        if rng.coin(0.4):   # an elif between them
            cond2, c = self.gen(rng.choice(self.shapes), 2), self.gen(shape, 2)
            body += [f"elif mean({cond2.src}) < 0.25:", f"    {name} = {c.src}"]

            def otherwise(env):
                return jnp.where(jnp.mean(cond2.fn(env)) < 0.25, c.fn(env), b.fn(env))
            bound = max(a.bound, b.bound, c.bound)
        else:
            otherwise, bound = b.fn, max(a.bound, b.bound)
        body += ["else:", f"    {name} = {b.src}"]
        steps.append(lambda env: env.__setitem__(
            name, jnp.where(jnp.sum(cond.fn(env)) > t, a.fn(env),
                            otherwise(env)) * jnp.ones(shape)))
        self.locals.append(E(name, lambda env: env[name], shape, bound))

    def _unpack(self, body, steps):
        """`u1, u2 = h(...)`: a helper of two results, unpacked."""
        rng = self.rng
        shape = rng.choice(self.shapes)
        name, twin, arity, bound = self._new_helper(results=2)
        args = self._helper_args(shape, 2, arity)
        names = [f"u{len(self.locals)}", f"u{len(self.locals) + 1}"]
        body.append(f"{names[0]}, {names[1]} = {name}({', '.join(a.src for a in args)})")

        def run(env):
            outs = twin(*[a.fn(env) for a in args])
            for n, o in zip(names, outs):
                env[n] = jnp.broadcast_to(o, shape)
        steps.append(run)
        for n in names:
            self.locals.append(E(n, lambda env, n=n: env[n], shape, bound * 4 + 4))

    # --------------------------------------------------------- expressions
    def gen(self, shape: tuple, depth: int) -> E:
        shape = tuple(shape)
        e = self._gen(shape, depth)
        assert e.shape == shape, (e.src, e.shape, shape)
        if e.bound > 1e6:
            e = E(f"tanh({e.src})", lambda env, f=e.fn: jnp.tanh(f(env)), shape, 1)
        return e

    def _gen(self, shape, depth):
        rng = self.rng
        if depth <= 0 or rng.coin(0.15):
            return self.leaf(shape)
        if self.params_only:
            return getattr(self, "_" + rng.choice(["unary", "binary"]))(shape, depth - 1)
        kinds = ["unary", "unary", "binary", "binary", "reduce", "helper", "custom", "conv"]
        if shape:
            kinds += ["cumsum", "reshape", "slice", "concat", "gather", "broadcast", "softmax",
                      "along", "scatter", "segment"]
        if len(shape) >= 2:
            kinds += ["transpose", "transpose", "matmul", "einsum"]
        if len(shape) == 1:
            kinds += ["matmul", "outer_sum", "index"]
        if shape == ():
            kinds += ["matmul", "index", "ingrad", "injvp", "invg", "one_hot"]
        if any(n <= 3 for n in shape):
            kinds += ["stack"]
        if 1 in shape:
            kinds += ["newaxis"]
        kind = rng.choice(kinds)
        return getattr(self, "_" + kind)(shape, depth - 1)

    def leaf(self, shape):
        rng = self.rng
        if self.params_only:
            return rng.choice(self.loop_leaves)
        exact = [E(n, lambda env, n=n: env[n], s, 2) for n, s in self.floats.items()
                 if s == shape]
        exact += [e for e in self.locals + self.loop_leaves if e.shape == shape]
        if shape == self.floats["x"]:
            exact.append(E("w.T", lambda env: env["w"].T, shape, 2))
        if shape == self.floats["w"]:
            exact.append(E("x.T", lambda env: env["x"].T, shape, 2))
        if shape == self.floats["y"]:
            exact.append(E("p", lambda env: env["p"], shape, 2))
        if exact and rng.coin(0.8):
            e = rng.choice(exact)
            if e.src == "p":
                # (an f64 param makes an f32 call's results f64, as a constant does)
                self.uses_param = self.weak_constants = True
            return e
        if shape == () and rng.coin(0.3):
            c = rng.choice([0.5, -1.25, 2.0, 3.0])
            return E(repr(c), lambda env: jnp.float64(c), (), abs(c))
        if rng.coin(0.15):   # weakly typed constants: f32 beside f32 arrays
            self.weak_constants = True
            return self._constant(shape)
        if shape == () and rng.coin(0.3):
            i, j = rng.int(-3, 2), rng.int(-4, 3)
            return E(f"x[{i}, {j}]", lambda env: env["x"][i, j], (), 2)
        # a gather from a flattened input: reshape(take(reshape(v, -1), idx), shape)
        name = rng.choice(sorted(self.floats))
        size = math.prod(self.floats[name])
        p = math.prod(shape)
        a, b = rng.int(1, 5), rng.int(0, 7)
        idx = (np.arange(p) * a + b) % size
        if shape == ():
            return E(f"reshape({name}, (-1,))[{b % size}]",
                     lambda env: env[name].reshape(-1)[b % size], (), 2)
        src = f"take(reshape({name}, (-1,)), (arange({p}) * {a} + {b}) % {size})"
        if len(shape) > 1:
            src = f"reshape({src}, {shape})"
        return E(src, lambda env: jnp.take(env[name].reshape(-1), idx).reshape(shape), shape, 2)

    def _constant(self, shape):
        """A compile-time or weakly typed array: sizes as numbers, arange,
        full_like of an input."""
        rng = self.rng
        n = math.prod(shape)
        rows, cols = self.rows, self.cols
        step = 0.001 if self.large else 0.25   # (a long arange's values kept small)
        forms = [(f"reshape(arange({n}) * {step} - 0.5, {shape})",
                  lambda env: (jnp.arange(n) * step - 0.5).reshape(shape)),
                 (f"broadcast_to(sqrt(x.shape[0]) * 0.5, {shape})",
                  lambda env: jnp.full(shape, math.sqrt(rows) * 0.5)),
                 (f"broadcast_to(y.shape[0] / 8, {shape})",
                  lambda env: jnp.full(shape, cols / 8)),
                 (f"broadcast_to(x.size / 24 + w.ndim * 0.25, {shape})",
                  lambda env: jnp.full(shape, rows * cols / 24 + 0.5))]
        if shape == self.floats["x"]:
            forms.append(("full_like(x, 0.75)", lambda env: jnp.full(shape, 0.75)))
        if shape == self.floats["y"]:
            forms.append(("ones_like(y) * 2", lambda env: jnp.full(shape, 2.0)))
        src, fn = rng.choice(forms)
        return E(src, fn, shape, max(3, n * step, rows * cols / 24 + 0.5, cols / 8)
                 if self.large else 3)

    def extent(self, lo: int, hi: int, *shapes) -> int:
        """The size of an axis a program adds beside `shapes`: lo..hi, at
        large sizes maybe more, within LARGE_LIMIT elements."""
        if not self.large:
            return self.rng.int(lo, hi)
        room = LARGE_LIMIT // max([math.prod(s) for s in shapes] + [1])
        return self.rng.choice([n for n in range(lo, hi + 1)] +
                               [n for n in LARGE_EXTENTS if n <= room])

    def _unary(self, shape, depth):
        a = self.gen(shape, depth)
        options = [(t, f, b) for t, f, b in UNARY]
        options += [(t, f, b) for t, f, b, lim in GROWING if a.bound <= lim]
        t, f, b = self.rng.choice(options)
        self.std |= _std_used(t)
        return E(t.format(f"({a.src})"), lambda env: f(a.fn(env)), shape, b(a.bound))

    def _broadcastable(self, shape):
        """A shape that broadcasts to `shape`."""
        rng = self.rng
        choice = rng.choice(["same", "same", "suffix", "ones", "scalar"])
        if choice == "suffix" and shape:
            return shape[rng.int(1, len(shape)):]
        if choice == "ones" and shape:
            return tuple(1 if rng.coin() else n for n in shape)
        if choice == "scalar":
            return ()
        return shape

    def _binary(self, shape, depth):
        rng = self.rng
        a = self.gen(shape, depth)
        b = self.gen(self._broadcastable(shape), depth)
        if rng.coin():
            a, b = b, a
        t, f, bound = rng.choice(BINARY)
        self.std |= _std_used(t)
        # (a helper's body is elementwise: its parameters have any shape)
        out_shape = None if self.params_only else shape
        return E(t.format(f"({a.src})", f"({b.src})"),
                 lambda env: f(a.fn(env), b.fn(env)) if out_shape is None else
                 jnp.broadcast_to(f(a.fn(env), b.fn(env)), out_shape),
                 shape, bound(a.bound, b.bound))

    def _reduce(self, shape, depth):
        rng = self.rng
        name, f, bound = rng.choice(REDUCTIONS)
        keepdims = 1 in shape and rng.coin()
        if keepdims:
            axis = rng.choice([i for i, n in enumerate(shape) if n == 1])
            k = self.extent(2, 4, shape)
            src_shape = shape[:axis] + (k,) + shape[axis + 1:]
            axes = (axis,)
        else:
            n_axes = rng.choice([1, 1, 2]) if len(shape) < 2 else 1
            src_shape, axes = list(shape), []
            for _ in range(n_axes):
                axis = rng.int(0, len(src_shape))
                src_shape.insert(axis, self.extent(2, 4, src_shape))
                axes = [a + (a >= axis) for a in axes] + [axis]
            src_shape = tuple(src_shape)
            axes = tuple(sorted(axes))
        a = self.gen(src_shape, depth)
        rank = len(src_shape)
        shown = [ax - rank if rng.coin(0.3) else ax for ax in axes]
        if len(shown) == 1 and rng.coin(0.7):
            axis_src = str(shown[0])
        elif len(axes) == rank and not keepdims and rng.coin(0.5):
            axis_src = "None"
        else:
            axis_src = "(" + ", ".join(map(str, shown)) + ("," if len(shown) == 1 else "") + ")"
        jaxis = axes if len(axes) > 1 else axes[0]
        if name in STD:
            self.std.add(name)
            if keepdims:
                src = f"{name}({a.src}, {axis_src}, True)"
            else:
                src = f"{name}({a.src}, {axis_src})" if rng.coin() else \
                    f"{name}({a.src}, axis={axis_src})"
        else:
            src = f"{name}({a.src}, axis={axis_src}" + (", keepdims=True" if keepdims else "")
            if name in ("sum", "max", "min") and rng.coin(0.25):
                # NumPy's initial=: added to a sum, a bound taken into a max or min
                c = rng.choice([0.0, -0.5, 0.75])
                src += f", initial={c}"
                combine = {"sum": jnp.add, "max": jnp.maximum, "min": jnp.minimum}[name]
                f = lambda a, ax, kd, f=f, c=c, combine=combine: combine(f(a, ax, kd), c)  # noqa: E731,E501
            src += ")"
        n = math.prod(src_shape[ax] for ax in axes)
        return E(src, lambda env: f(a.fn(env), jaxis, keepdims), shape, bound(a.bound, n) + 1)

    def _softmax(self, shape, depth):
        rng = self.rng
        name = rng.choice(["softmax", "log_softmax", "softplus"])
        self.std.add(name)
        a = self.gen(shape, depth)
        if name == "softplus":
            return E(f"softplus({a.src})", lambda env: jax.nn.softplus(a.fn(env)), shape,
                     a.bound + 1)
        axis = rng.int(-len(shape), len(shape) - 1)
        f = jax.nn.softmax if name == "softmax" else jax.nn.log_softmax
        return E(f"{name}({a.src}, {axis})", lambda env: f(a.fn(env), axis=axis), shape,
                 1 if name == "softmax" else 2 * a.bound + 3)

    def _cumsum(self, shape, depth):
        rng = self.rng
        if len(shape) == 1 and rng.coin(0.3):
            src_shape = rng.choice([s for s in self.shapes if math.prod(s) == shape[0]] or [shape])
            a = self.gen(src_shape, depth)
            return E(f"cumsum({a.src})", lambda env: jnp.cumsum(a.fn(env)), shape,
                     a.bound * shape[0])
        axis = rng.int(-len(shape), len(shape) - 1)
        a = self.gen(shape, depth)
        return E(f"cumsum({a.src}, axis={axis})", lambda env: jnp.cumsum(a.fn(env), axis=axis),
                 shape, a.bound * shape[axis])

    def _transpose(self, shape, depth):
        rng = self.rng
        rank = len(shape)
        form = rng.choice(["T", "axes", "mT"] if rank > 2 else ["T", "axes"])
        if form == "T":
            perm = tuple(reversed(range(rank)))
        elif form == "mT":
            perm = tuple(range(rank - 2)) + (rank - 1, rank - 2)
        else:
            perm = tuple(rng.choice([p for p in __import__("itertools").permutations(range(rank))]))
        src_shape = [0] * rank
        for out_axis, in_axis in enumerate(perm):
            src_shape[in_axis] = shape[out_axis]
        a = self.gen(tuple(src_shape), depth)
        if form == "T":
            return E(f"({a.src}).T", lambda env: a.fn(env).T, shape, a.bound)
        if form == "mT":
            return E(f"({a.src}).mT", lambda env: jnp.swapaxes(a.fn(env), -1, -2), shape,
                     a.bound)
        return E(f"transpose({a.src}, {list(perm)})",
                 lambda env: jnp.transpose(a.fn(env), perm), shape, a.bound)

    def _reshape(self, shape, depth):
        rng = self.rng
        size = math.prod(shape)
        src_shape = rng.choice([s for s in self.shapes if math.prod(s) == size and s != shape]
                               or [(size,)])
        a = self.gen(src_shape, depth)
        shown = list(shape)
        if shown and rng.coin():
            shown[rng.int(0, len(shown) - 1)] = -1
        text = "(" + ", ".join(map(str, shown)) + ("," if len(shown) == 1 else "") + ")"
        return E(f"reshape({a.src}, {text})", lambda env: a.fn(env).reshape(shape), shape,
                 a.bound)

    def _slice(self, shape, depth):
        rng = self.rng
        axis = rng.int(0, len(shape) - 1)
        text, sl, n = _slice_for(rng, shape[axis])
        a = self.gen(shape[:axis] + (n,) + shape[axis + 1:], depth)
        index = (slice(None),) * axis + (sl,)
        prefix = ":, " * axis if axis < 2 or rng.coin() else "..., "
        if prefix == "..., ":
            index = (Ellipsis, sl) + (slice(None),) * 0
            if axis != len(shape) - 1:
                prefix, index = ":, " * axis, (slice(None),) * axis + (sl,)
        return E(f"({a.src})[{prefix}{text}]", lambda env: a.fn(env)[index], shape, a.bound)

    def _index(self, shape, depth):
        rng = self.rng
        axis = rng.int(0, len(shape))
        n = self.extent(2, 4, shape)
        k = rng.int(-n, n - 1)
        a = self.gen(shape[:axis] + (n,) + shape[axis:], depth)
        index = (slice(None),) * axis + (k,)
        return E(f"({a.src})[{':, ' * axis}{k}]", lambda env: a.fn(env)[index], shape, a.bound)

    def _newaxis(self, shape, depth):
        axis = self.rng.choice([i for i, n in enumerate(shape) if n == 1])
        a = self.gen(shape[:axis] + shape[axis + 1:], depth)
        index = (slice(None),) * axis + (None,)
        return E(f"({a.src})[{':, ' * axis}None]", lambda env: a.fn(env)[index], shape,
                 a.bound)

    def _concat(self, shape, depth):
        rng = self.rng
        axis = rng.int(0, len(shape) - 1)
        d = shape[axis]
        if d < 2:
            return self._unary(shape, depth)
        d1 = rng.int(1, d - 1)
        a = self.gen(shape[:axis] + (d1,) + shape[axis + 1:], depth)
        b = self.gen(shape[:axis] + (d - d1,) + shape[axis + 1:], depth)
        shown = axis - len(shape) if rng.coin(0.3) else axis
        return E(f"concatenate([{a.src}, {b.src}], axis={shown})",
                 lambda env: jnp.concatenate([a.fn(env), b.fn(env)], axis=axis), shape,
                 max(a.bound, b.bound))

    def _stack(self, shape, depth):
        rng = self.rng
        axis = rng.choice([i for i, n in enumerate(shape) if n <= 3])
        parts = [self.gen(shape[:axis] + shape[axis + 1:], depth) for _ in range(shape[axis])]
        return E(f"stack([{', '.join(p.src for p in parts)}], {axis})",
                 lambda env: jnp.stack([p.fn(env) for p in parts], axis=axis), shape,
                 max(p.bound for p in parts))

    def _gather(self, shape, depth):
        rng = self.rng
        axis = rng.int(0, len(shape) - 1)
        d = shape[axis]
        n = self.extent(2, 4, shape)
        a = self.gen(shape[:axis] + (n,) + shape[axis + 1:], depth)
        if d <= IDS_LEN and rng.coin(0.4):
            idx_src = "ids" if d == IDS_LEN else f"ids[:{d}]"

            def idx(env, d=d, n=n):   # ids are drawn in [-2, 1]: valid for n >= 2
                return env["ids"][:d] % n
        else:
            m, c = rng.int(1, 3), rng.int(0, 4)
            idx_src = f"(arange({d}) * {m} + {c}) % {n}"
            const = (np.arange(d) * m + c) % n
            if rng.coin(0.3):
                idx_src, const = f"{idx_src} - {n}", const - n

            def idx(env, const=const):
                return const % n
        if axis == 0 and rng.coin(0.4):
            src = f"({a.src})[{idx_src}]"
        elif axis == 1 and rng.coin(0.4):
            src = f"({a.src})[:, {idx_src}]"
        else:
            src = f"take({a.src}, {idx_src}, axis={axis})"
        return E(src, lambda env: jnp.take(a.fn(env), idx(env), axis=axis), shape, a.bound)

    def _along(self, shape, depth):
        """take_along_axis by a compile-time index array of the result's shape."""
        rng = self.rng
        axis = rng.int(0, len(shape) - 1)
        n = self.extent(2, 4, shape)
        a = self.gen(shape[:axis] + (n,) + shape[axis + 1:], depth)
        m, c = rng.int(1, 3), rng.int(0, 4)
        idx = (np.arange(math.prod(shape)) * m + c) % n
        idx_src = f"(arange({idx.size}) * {m} + {c}) % {n}"
        if len(shape) > 1:
            idx_src = f"reshape({idx_src}, {shape})"
        idx = idx.reshape(shape)
        return E(f"take_along_axis({a.src}, {idx_src}, axis={axis})",
                 lambda env: jnp.take_along_axis(a.fn(env), idx, axis=axis), shape, a.bound)

    def _scatter(self, shape, depth):
        """scatter_add(base, idx, values, axis): repeated indices accumulate."""
        rng = self.rng
        axis = rng.int(0, len(shape) - 1)
        d = self.extent(1, 5, shape)
        m, c = rng.int(0, 3), rng.int(0, 4)
        idx = (np.arange(d) * m + c) % shape[axis]
        base = self.gen(shape, depth)
        values = self.gen(shape[:axis] + (d,) + shape[axis + 1:], depth)
        idx_src = f"(arange({d}) * {m} + {c}) % {shape[axis]}"

        def value(env):
            moved = jnp.moveaxis(base.fn(env), axis, 0)
            out = moved.at[idx].add(jnp.moveaxis(values.fn(env), axis, 0))
            return jnp.moveaxis(out, 0, axis)
        return E(f"scatter_add({base.src}, {idx_src}, {values.src}, axis={axis})", value, shape,
                 base.bound + d * values.bound)

    def _segment(self, shape, depth):
        """segment_sum(values, ids, num_segments) along axis 0."""
        rng = self.rng
        d = self.extent(1, 5, shape)
        if d <= IDS_LEN and rng.coin():
            ids_src = f"ids[:{d}] % {shape[0]}"

            def seg(env, d=d):
                return env["ids"][:d] % shape[0]
        else:
            m, c = rng.int(0, 3), rng.int(0, 4)
            ids_src = f"(arange({d}) * {m} + {c}) % {shape[0]}"
            const = (np.arange(d) * m + c) % shape[0]

            def seg(env, const=const):
                return const
        values = self.gen((d,) + shape[1:], depth)
        return E(f"segment_sum({values.src}, {ids_src}, {shape[0]})",
                 lambda env: jax.ops.segment_sum(values.fn(env), seg(env), shape[0]), shape,
                 d * values.bound)

    def _one_hot(self, shape, depth):
        """sum(one_hot(ids % k, k) * e): a lookup by run-time labels."""
        k = self.rng.int(2, 4)
        a = self.gen((IDS_LEN, k), depth)
        return E(f"sum(one_hot(ids % {k}, {k}) * ({a.src}))",
                 lambda env: jnp.sum(jax.nn.one_hot(env["ids"] % k, k) * a.fn(env)), shape,
                 IDS_LEN * a.bound)

    def _broadcast(self, shape, depth):
        src_shape = self._broadcastable(shape)
        a = self.gen(src_shape, depth)
        return E(f"broadcast_to({a.src}, {shape})",
                 lambda env: jnp.broadcast_to(a.fn(env), shape), shape, a.bound)

    def _outer_sum(self, shape, depth):
        a = self.gen(shape + (2,), depth)
        return E(f"sum(({a.src}) * ({a.src}), axis=1)", lambda env: jnp.sum(a.fn(env) ** 2, axis=1),
                 shape, 2 * a.bound ** 2)

    def _matmul(self, shape, depth):
        rng = self.rng
        k = self.extent(1, 4, shape[:-1], shape[-1:])
        if len(shape) == 0:
            ls, rs = (k,), (k,)
        elif len(shape) == 1:
            ls, rs = ((k,), (k, shape[0])) if rng.coin() else ((shape[0], k), (k,))
        else:
            batch = shape[:-2]
            ls = batch + (shape[-2], k)
            rs = (k, shape[-1])
            if batch and rng.coin():
                rs = batch + rs
        a, b = self.gen(ls, depth), self.gen(rs, depth)
        op = "@" if rng.coin(0.7) else None
        src = f"({a.src}) @ ({b.src})" if op else f"matmul({a.src}, {b.src})"
        return E(src, lambda env: jnp.matmul(a.fn(env), b.fn(env)), shape,
                 a.bound * b.bound * k)

    def _einsum(self, shape, depth):
        rng = self.rng
        k = self.extent(1, 4, shape[:-1], shape[:-2] + shape[-1:])
        m, n = shape[-2], shape[-1]
        batch = shape[:-2]
        letters = "bcd"[:len(batch)]
        # each form's letters: i and k the result's axes' (j for k where it is
        # the last), the others contracted
        form, spec = rng.choice([("ij,jk->ik", {"i": m, "j": k, "k": n}),
                                 ("ik,jk->ij", {"i": m, "j": n, "k": k}),
                                 ("ji,jk->ik", {"i": m, "j": k, "k": n}),
                                 ("ij,j->ij", {"i": m, "j": n}),
                                 ("ij,ij->ij", {"i": m, "j": n})])
        lhs, rest = form.split("->")
        ops = lhs.split(",")
        shapes = [tuple(spec[c] for c in o) for o in ops]
        a = self.gen(batch + shapes[0], depth)
        b = self.gen(batch + shapes[1], depth) if len(shapes[1]) == 2 else self.gen(shapes[1],
                                                                                     depth)
        s = f"{letters}{ops[0]},{letters if len(ops[1]) == 2 else ''}{ops[1]}->{letters}{rest}"
        return E(f'einsum("{s}", {a.src}, {b.src})',
                 lambda env: jnp.einsum(s, a.fn(env), b.fn(env)), shape,
                 a.bound * b.bound * max(k, n))

    def _new_helper(self, results: int = 1):
        """A generated elementwise helper (maybe `@recompute`): its name,
        JAX twin (a tuple of its results where there are several), arity
        and the bound of its results."""
        rng = self.rng
        arity = rng.int(1, 2)
        params = ["a", "b"][:arity]
        saved = self.loop_leaves, self.params_only
        self.loop_leaves = [E(p, lambda env, p=p: env[p], (), 2) for p in params]
        self.params_only = True
        bodies = []
        for _ in range(results):
            body = self.gen((), rng.int(1, 3))
            if not re.search(r"\ba\b", body.src):   # the result has a's shape
                body = E(f"{body.src} + a", lambda env, f=body.fn: f(env) + env["a"], (),
                         body.bound + 2)
            bodies.append(body)
        self.loop_leaves, self.params_only = saved
        name = f"h{len(self.helpers)}"
        deco = rng.choice(["", "", "@recompute\n"])
        self.helpers.append(f"{deco}def {name}({', '.join(params)}):\n"
                            f"    return {', '.join(b.src for b in bodies)}\n")

        def twin(*args):
            env = dict(zip(params, args))
            outs = tuple(b.fn(env) for b in bodies)
            return outs if results > 1 else outs[0]
        return name, twin, arity, max(b.bound for b in bodies)

    def _helper_args(self, shape, depth, arity):
        # (a literal argument of a function with a grad block is f64 even
        # beside f32 arrays, as a Python number passed from Python is)
        args = []
        for i in range(arity):
            e = self.gen(shape if i == 0 else self._broadcastable(shape), depth)
            while not _READS_ARRAY.search(e.src):
                e = self.gen(e.shape, depth)
            args.append(e)
        return args

    def _helper(self, shape, depth):
        name, twin, arity, bound = self._new_helper()
        args = self._helper_args(shape, depth, arity)
        return E(f"{name}({', '.join(a.src for a in args)})",
                 lambda env: jnp.broadcast_to(twin(*[a.fn(env) for a in args]), shape), shape,
                 bound * 4 + 4)

    def _ingrad(self, shape, depth):
        """sum(grad(h)(a, ...)): the in-language gradient of a helper."""
        name, twin, arity, _ = self._new_helper()
        arg_shape = self.rng.choice(self.shapes[1:5])
        args = self._helper_args(arg_shape, depth, arity)

        def value(env):
            vals = [a.fn(env) for a in args]
            return jnp.sum(jax.grad(lambda a0: jnp.sum(twin(a0, *vals[1:])))(vals[0]))
        return E(f"sum(grad({name}, wrt=0)({', '.join(a.src for a in args)}))", value, (),
                 100)

    def _injvp(self, shape, depth):
        """sum of the tangent of jvp(h, wrt=0)(a, ..., t): forward mode in the language."""
        name, twin, arity, _ = self._new_helper()
        arg_shape = self.rng.choice(self.shapes[1:5])
        args = self._helper_args(arg_shape, depth, arity)
        t = self.gen(arg_shape, depth)

        def value(env):
            vals = [a.fn(env) for a in args]
            _, tangent = jax.jvp(lambda a0: twin(a0, *vals[1:]), (vals[0],), (t.fn(env),))
            return jnp.sum(tangent * jnp.ones(arg_shape))
        return E(f"sum(jvp({name}, wrt=0)({', '.join(a.src for a in args)}, {t.src})[1])",
                 value, (), 100)

    def _invg(self, shape, depth):
        """sum(v * g) of value_and_grad(h, wrt=0)(a, ...) in the language."""
        name, twin, arity, _ = self._new_helper()
        arg_shape = self.rng.choice(self.shapes[1:5])
        args = self._helper_args(arg_shape, depth, arity)
        call = f"value_and_grad({name}, wrt=0)({', '.join(a.src for a in args)})"

        def value(env):
            vals = [a.fn(env) for a in args]
            v = jnp.broadcast_to(twin(*vals), arg_shape)
            g = jax.grad(lambda a0: jnp.sum(twin(a0, *vals[1:])))(vals[0])
            return jnp.sum(v * g)
        return E(f"sum({call}[0] * {call}[1])", value, (), 100)

    def _conv(self, shape, depth):
        """conv1d/conv2d or a max or average pool (1-d or 2-d) of one
        example whose output, (1, O, *spatial) of shape's size, is
        reshaped to shape; the twin gathers the windows itself."""
        rng = self.rng
        size = math.prod(shape)
        out_c = rng.choice([d for d in range(1, size + 1) if size % d == 0])
        rest = size // out_c
        if rng.coin():
            rows = rng.choice([d for d in range(1, rest + 1) if rest % d == 0])
            spatial = (rows, rest // rows)
        else:
            spatial = (rest,)
        kind = rng.choice(["conv", "conv", "max_pool", "avg_pool"])
        kernel = tuple(rng.int(1, 5 if self.large else 3) for _ in spatial)
        stride = tuple(rng.int(1, 2) for _ in spatial)
        pad = tuple(rng.int(0, k // 2) for k in kernel)
        # input sizes whose floor((n + 2 pad - k) / stride) + 1 is the output's
        sizes = tuple((o - 1) * s + k - 2 * p + rng.int(0, s - 1)
                      for o, s, k, p in zip(spatial, stride, kernel, pad))
        if min(sizes) < 1:
            pad = (0,) * len(spatial)
            sizes = tuple((o - 1) * s + k for o, s, k in zip(spatial, stride, kernel))
        dims = f"{len(spatial)}d"

        def shown(v):
            return str(v[0]) if len(set(v)) == 1 and rng.coin() else str(v)
        if kind == "conv":
            chans = rng.choice([c for c in (1, 2, 16, 33) if c == 1 or c * max(
                math.prod(sizes), out_c * math.prod(kernel)) <= LARGE_LIMIT]) \
                if self.large else rng.int(1, 2)
            x = self.gen((1, chans) + sizes, depth)
            w = self.gen((out_c, chans) + kernel, depth)
            src = f"conv{dims}({x.src}, {w.src}, stride={shown(stride)}, padding={shown(pad)})"
            bound = x.bound * w.bound * chans * math.prod(kernel)
        else:
            x = self.gen((1, out_c) + sizes, depth)
            opts = [shown(kernel), shown(stride), shown(pad)]
            src = (f"{kind}{dims}({x.src}, {opts[0]}, {opts[1]}, {opts[2]})" if rng.coin() else
                   f"{kind}{dims}({x.src}, {opts[0]}, stride={opts[1]}, padding={opts[2]})")
            bound = x.bound

        def windows(v, fill):
            """v's windows: (N, C, *out spatial, *kernel)."""
            v = jnp.pad(v, [(0, 0), (0, 0)] + [(p, p) for p in pad], constant_values=fill)
            for d, (o, s, k) in enumerate(zip(spatial, stride, kernel)):
                idx = np.arange(o)[:, None] * s + np.arange(k)[None, :]
                # (axis 2 + d becomes (o, k); k goes last, after the earlier k's)
                v = jnp.moveaxis(jnp.take(v, idx, axis=2 + d), 3 + d, -1)
            return v

        n_sp = len(spatial)
        win_axes = tuple(range(2 + n_sp, 2 + 2 * n_sp))

        def value(env):
            if kind == "conv":
                wins = windows(x.fn(env), 0.0)
                sp = "ab"[:n_sp]
                ks = "ij"[:n_sp]
                out = jnp.einsum(f"nc{sp}{ks},oc{ks}->no{sp}", wins, w.fn(env),
                                 precision=jax.lax.Precision.HIGHEST)
            elif kind == "max_pool":
                out = jnp.max(windows(x.fn(env), -jnp.inf), axis=win_axes)
            else:
                out = jnp.sum(windows(x.fn(env), 0.0), axis=win_axes) / math.prod(kernel)
            return out.reshape(shape)
        if (1, out_c) + spatial != shape:
            src = f"reshape({src}, {shape})"
        return E(src, value, shape, bound)

    def _custom(self, shape, depth):
        rng = self.rng
        k = len(self.helpers)
        if rng.coin(0.2):   # a straight-through estimator
            self.helpers.append(f"@pass_through\ndef ste{k}(a):\n    return round(a) + 0.25\n")
            (a,) = self._helper_args(shape, depth, 1)
            return E(f"ste{k}({a.src})",
                     lambda env: (lambda v: v + jax.lax.stop_gradient(jnp.round(v) + 0.25 - v))(
                         a.fn(env)), shape, a.bound + 1)
        source, factory, arity, exact, bound = rng.choice(CUSTOM)
        name = source.split("(")[0][4:].format(k=k)
        self.helpers.append(source.format(k=k))
        self.custom = True
        self.second_order &= exact
        args = self._helper_args(shape, depth, arity)
        if name.startswith("cube") and args[0].bound > 1e3:
            args[0] = E(f"tanh({args[0].src})", lambda env, f=args[0].fn: jnp.tanh(f(env)),
                        shape, 1)
        twin = factory()
        return E(f"{name}({', '.join(a.src for a in args)})",
                 lambda env: jnp.broadcast_to(twin(*[a.fn(env) for a in args]), shape), shape,
                 bound(*[a.bound for a in args]))


# ------------------------------------------------------------------ checks

def _inputs(data_or_rng, floats: dict = FLOATS) -> list:
    """x, y, w uniform in [-2, 2] and ids in [-2, 1], from a generator or
    a Hypothesis-drawn seed (drawing the floats themselves, Hypothesis
    shrinks towards zeros, where every maximum is a tie and every clip at
    a kink: conventions, not bugs)."""
    r = data_or_rng
    if not isinstance(r, np.random.Generator):
        r = np.random.default_rng(r.draw(st.integers(0, 2**32 - 1), label="input seed"))
    return [r.uniform(-2, 2, s) for s in floats.values()] + [r.integers(-2, 2, IDS_LEN)]


@functools.lru_cache(maxsize=None)
def _module(source: str, target: str = "cpu"):
    m = dsl.loads(source, target=target, host_results=True) if target != "cpu" \
        else dsl.loads(source)
    if "param p" in source:
        m.params["p"] = p_value(int(re.search(r"^param p: f64\[(\d+)\]", source, re.M)[1]))
    return m


def _close(actual, expected, what, program, rtol=1e-9):
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale,
                               err_msg=f"{what}\n{program.source}")


def _tree(v):
    return v if isinstance(v, tuple) else (v,)


def _jax_total(program, ids, p=None):
    p = program.p if p is None else p
    return lambda x, y, w: sum(jnp.sum(o) for o in _tree(program.jax(x, y, w, ids, p)))


def _jax_jvp(program, args, tangents):
    ids = args[3]
    f = lambda x, y, w: program.jax(x, y, w, ids)   # noqa: E731
    if not program.custom:
        return jax.jvp(f, tuple(args[:3]), tuple(tangents))[1]
    if program.second_order:
        with _plain_grad_blocks():
            return jax.jvp(f, tuple(args[:3]), tuple(tangents))[1]
    # JAX cannot jvp a custom_vjp: contract its reverse-mode Jacobian
    jac = jax.jacrev(f, argnums=(0, 1, 2))
    jacs = jac(*args[:3])
    jacs = jacs if program.n_out > 1 else (jacs,)
    outs = [sum(jnp.tensordot(j, t, axes=t.ndim) for j, t in zip(js, tangents))
            for js in jacs]
    return tuple(outs) if program.n_out > 1 else outs[0]


def check_program(program: Program, args, checks=("value", "grad", "vjp", "jvp", "hessian",
                                                  "vmap", "jacobian", "bridge", "f32")) -> None:
    """Every comparison `checks` names, of `program` at `args` (f64)."""
    m = _module(program.source)
    x, y, w, ids = args
    before = [a.copy() for a in args]
    jargs = [jnp.asarray(a) for a in args]
    # (jitted once per program: JAX's op-by-op dispatch costs more than
    # compiling the whole function)
    # (not at large sizes, where XLA's compiled twin of seeds 107 and 129
    # disagreed with JAX's own op-by-op run, NaNs and a sum 5x too small,
    # and the dispatch costs little beside the work)
    jit = (lambda f: f) if program.large else jax.jit
    if not hasattr(program, "jitted"):
        program.jitted = (jit(program.jax), jit(jax.grad(
            lambda x, y, w, ids: _jax_total(program, ids)(x, y, w), argnums=(0, 1, 2))))
    expected = program.jitted[0](*jargs)
    held = ()
    if "value" in checks:
        held = _tree(m.f(*args))
        for a, e in zip(held, _tree(expected)):
            _close(a, e, "value", program)
    if "grad" in checks:
        jgrads = program.jitted[1](*jargs)
        # (twice: a second call finds the first's constants and memory as
        # they were)
        for call in ("", ", called again"):
            value, grads = dsl.value_and_grad(m.f, wrt=(0, 1, 2))(*args)
            for a, e in zip(_tree(value), _tree(expected)):
                _close(a, e, "value_and_grad's value" + call, program)
            for name, a, e in zip("xyw", grads, jgrads):
                _close(a, e, f"grad wrt {name}" + call, program)
        if program.uses_param:
            jgrad = jax.grad(lambda p: _jax_total(program, jargs[3], p)(*jargs[:3]))(
                jnp.asarray(program.p))
            _close(dsl.grad(m.f, wrt="p")(*args), jgrad, "grad wrt the param p", program)
    # (a Jacobian of a straight-through program, whose jvp JAX takes so, has
    # x.size columns at large sizes)
    if "vjp" in checks:   # a pullback called twice, a call of f between
        outs, pullback = dsl.vjp(m.f, *args)
        cotangents = [np.ones_like(o) for o in _tree(outs)]
        for call in ("", ", called again"):
            got = pullback(*cotangents)
            m.f(*args)
            for name, a, e in zip("xyw", got, program.jitted[1](*jargs)):
                _close(a, e, f"vjp's pullback wrt {name}" + call, program)
    if "jvp" in checks and not (program.large and program.custom and not program.second_order):
        tangents = [np.cos(3 * a + 1) for a in args[:3]]
        _, t_out = dsl.jvp(m.f, tuple(args), tuple(tangents) + (None,))
        expected_t = _jax_jvp(program, jargs, [jnp.asarray(t) for t in tangents])
        for a, e in zip(_tree(t_out), _tree(expected_t)):
            _close(a, e, "jvp", program)
    if "hessian" in checks and program.second_order and program.large:
        # (x's Hessian has x.size ** 2 elements: its product with v only)
        v = np.sin(np.arange(float(x.size))).reshape(x.shape)
        with _plain_grad_blocks():
            jhv = jax.jvp(jax.grad(_jax_total(program, jargs[3]), argnums=0), tuple(jargs[:3]),
                          (jnp.asarray(v), jnp.zeros_like(jargs[1]),
                           jnp.zeros_like(jargs[2])))[1]
        _close(dsl.hvp(m.f, wrt=0)(*args, v), jhv, "hvp wrt x", program, rtol=1e-8)
    elif "hessian" in checks and program.second_order:
        h = dsl.hessian(m.f, wrt=0)(*args)
        jh = jax.hessian(_jax_total(program, jargs[3]), argnums=0)(*jargs[:3])
        _close(h, jh, "hessian wrt x", program, rtol=1e-8)
        v = np.sin(np.arange(12.0)).reshape(3, 4)
        _close(dsl.hvp(m.f, wrt=0)(*args, v), np.tensordot(np.asarray(jh), v, axes=2),
               "hvp wrt x", program, rtol=1e-8)
    if "vmap" in checks:
        xs = np.stack([x, x[::-1] * 0.5, np.tanh(x)])
        got = dsl.vmap(m.f, in_axes=(0, None, None, None))(xs, y, w, ids)
        want = jax.vmap(program.jax, in_axes=(0, None, None, None))(jnp.asarray(xs), *jargs[1:])
        for a, e in zip(_tree(got), _tree(want)):
            _close(a, e, "vmap over x", program)
        got = dsl.vmap(dsl.grad(m.f, wrt=1), in_axes=(0, None, None, None))(xs, y, w, ids)
        want = jax.vmap(jax.grad(_jax_total(program, jargs[3]), argnums=1),
                        in_axes=(0, None, None))(jnp.asarray(xs), *jargs[1:3])
        _close(got, want, "vmap of grad wrt y over x", program)
        idss = np.stack([ids, ids[::-1], (ids + 1) % 2 - 1])   # run-time indices per example
        got = dsl.vmap(m.f, in_axes=(None, None, None, 0))(x, y, w, idss)
        want = jax.vmap(program.jax, in_axes=(None, None, None, 0))(*jargs[:3], jnp.asarray(idss))
        for a, e in zip(_tree(got), _tree(want)):
            _close(a, e, "vmap over ids", program)
    if "bridge" in checks:   # dsl.to_jax under JAX's own grad and vmap
        bridged = dsl.to_jax(m.f)
        total = lambda x_, y_, w_: sum(jnp.sum(o) for o in _tree(bridged(x_, y_, w_, jargs[3])))  # noqa: E731,E501
        for name, a, e in zip("xyw", jax.grad(total, argnums=(0, 1, 2))(*jargs[:3]),
                              program.jitted[1](*jargs)):
            _close(a, e, f"to_jax: jax.grad wrt {name}", program)
    out_size = sum(np.size(e) for e in _tree(expected))
    # (at large sizes a Jacobian costs w.size or out_size times the program's
    # work: of small ones only)
    if "jacobian" in checks and (not program.large or max(w.size, out_size) <= 64):
        f = lambda w_: program.jax(jargs[0], jargs[1], w_, jargs[3])   # noqa: E731
        for transform in (dsl.jacfwd, dsl.jacrev):
            for a, e in zip(_tree(transform(m.f, wrt=2)(*args)), _tree(jax.jacrev(f)(jargs[2]))):
                _close(a, e, f"{transform.__name__} wrt w", program)
    # (a result's memory is its own: the calls since, whose arrays may come
    # from the same pool, left it as it was)
    for a, e in zip(held, _tree(expected)):
        _close(a, e, "value, after the other calls", program)
    for name, a, b in zip(("x", "y", "w", "ids"), args, before):   # (nor an argument)
        np.testing.assert_array_equal(a, b, f"argument {name} written\n{program.source}")
    if "f32" in checks:
        args32 = [a.astype(np.float32) for a in args[:3]] + [ids]
        try:
            got = m.f(*args32)
        except dsl.GradError as err:   # (a loop's value made f64 so: documented)
            if program.weak_constants and "type" in str(err):
                return
            raise
        # a result that no input moves is a number's: f64 whatever the arrays
        moved = program.jitted[0](*[a + 0.5 for a in jargs[:3]], jargs[3])
        constant_outs = [bool(jnp.all(a == b)) for a, b in zip(_tree(moved), _tree(expected))]
        for a, e, constant in zip(_tree(got), _tree(expected), constant_outs):
            assert constant or program.weak_constants or np.asarray(a).dtype == np.float32, \
                f"an f32 call's result is " \
                f"{np.asarray(a).dtype}\n{program.source}"
            _close(a, e, "f32 against f64", program, rtol=2e-3)
        if "grad" in checks:
            for name, a, e in zip("xyw", dsl.grad(m.f, wrt=(0, 1, 2))(*args32), jgrads):
                assert program.weak_constants or a.dtype == np.float32, \
                    f"an f32 gradient is {a.dtype}\n{program.source}"
                _close(a, e, f"f32 grad wrt {name} against f64", program, rtol=2e-2)


def _program(seed: int, max_depth: int | None = None, large: bool = LARGE) -> Program:
    rng = random.Random(seed)
    return Program(Chooser(rng), max_depth=max_depth or rng.choice([2, 3, 3, 4]), large=large)


@pytest.fixture(autouse=True, scope="module")
def x64():
    """JAX in f64 (it makes every float f32 unless jax_enable_x64)."""
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)


# Fixed programs, compiled once each, checked on Hypothesis inputs.  The
# first is cheap to compile and reaches a loop, a grad block, a
# straight-through function, gathers, a product and the std library (a
# hunt's programs reach the rest).
FIXED_SEEDS = [(1048, 2)] + [(seed, None) for seed in
                            range(1000 + 10000 * SEED, 1000 + 10000 * SEED + 4 * (SCALE - 1))]
# Each check compiles programs of its own: by default value_and_grad only
# (the value comes with the gradient); the others in a hunt.
CHECKS = ("grad",) if SCALE == 1 else ("value", "grad", "vjp", "jvp", "hessian", "vmap",
                                        "jacobian", "bridge", "f32")


@pytest.mark.parametrize("seed,max_depth", FIXED_SEEDS)
@settings(max_examples=2 if SCALE == 1 else 3 * SCALE, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fixed_program_agrees_with_jax(seed, max_depth, data):
    program = _program(seed, max_depth)
    check_program(program, _inputs(data, program.floats), CHECKS)


# A large program in every run (a hunt's GRAD_FUZZ_LARGE=1 draws many):
# `stack([norm(x, axis=1)], 1)` at x of 33 x 1025, whose norm is a row loop
# over rows longer than a block's ROW_BLOCK_ELEMENTS (33 blocks of a row)
# and whose loops over x run their parallel kernels.
LARGE_SEED = 48


def test_a_large_program_agrees_with_jax_in_parallel_and_row_kernels(gradc_parallel,
                                                                       monkeypatch):
    from gradlang.compiler.codegen import ROW_BLOCK_ELEMENTS
    from gradlang.runtime import cpu
    gradc_parallel("always")
    ran = []
    allowed = cpu.parallel_allowed
    monkeypatch.setattr(cpu, "parallel_allowed",
                        lambda size, threshold: ran.append(allowed(size, threshold)) or ran[-1])
    program = _program(LARGE_SEED, 2, large=True)
    args = _inputs(np.random.default_rng(0), program.floats)
    check_program(program, args, ("grad",))
    assert any(ran), "no parallel kernel ran"
    f = dsl.value_and_grad(_module(program.source).f, wrt=(0, 1, 2))
    kernels = f.program(f.on_target(f.bind(tuple(args), {}))).generated.kernel_source
    assert "blocks = (rows + block - 1) // block" in kernels, "no row loop"
    assert program.cols > ROW_BLOCK_ELEMENTS and program.rows > 1, program.source


@pytest.mark.skipif(SCALE == 1, reason="a hunt: set GRAD_FUZZ_SCALE=N to compile ~2N random "
                                       "programs (each several seconds)")
@settings(max_examples=2 * SCALE, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_program_agrees_with_jax(data):
    program = Program(Chooser(data=data), large=LARGE)
    check_program(program, _inputs(np.random.default_rng(0), program.floats))


# The forms a hunt compiles that the default program may not reach, and
# depth-2 programs (seeds) that between them write each (and no
# stop_gradient or straight-through function, whose gradient is not the
# value's derivative).
FORMS = {"conv": r"\bconv[12]d\(", "pool": r"_pool[12]d\(", "unpack": r"\bu\d+, u\d+ = ",
         "param": r"^param p", "elif": r"^\s+elif ", "augmented": r"^\s+c\d+ [+-]= ",
         "initial": r"initial=", "value_and_grad": r"\bvalue_and_grad\(",
         "std": r"\b(relu|gelu|leaky_relu|log_sigmoid|sigmoid_cross_entropy)\(",
         "mask": r"\) and \(|\bnot \(", "size": r"\bx\.size\b"}
FORM_SEEDS = [256, 475, 0, 82]


def test_every_form_lowers_and_differentiates_on_the_interpreter():
    """Without compiling a kernel (CI's share of what a hunt compiles): the
    programs of FORM_SEEDS, which write every form, check, lower for
    their shapes, and their value_and_grad, run by the IR's reference
    interpreter, gives a gradient whose product with a random direction
    is the central difference of the interpreted value along it."""
    from dsl.function import _types
    from gradlang.compiler.interpret import interpret

    def interpreted(f, args):
        bound = f.bind(args, {})
        return interpret(f.lower(_types(bound)), *bound.values())
    written = set()
    for seed in FORM_SEEDS:
        program = _program(seed, 2, large=False)
        written |= {k for k, v in FORMS.items() if re.search(v, program.source, re.M)}
        m = dsl.loads(program.source)
        if program.uses_param:
            m.params["p"] = P_VALUE
        args = _inputs(np.random.default_rng(seed))
        outs = interpreted(dsl.value_and_grad(m.f, wrt=(0, 1, 2)), args)
        grads = outs[program.n_out:]
        rng = np.random.default_rng(seed + 1)
        direction = [rng.normal(size=a.shape) for a in args[:3]]

        def total(t):
            moved = [a + t * d for a, d in zip(args[:3], direction)] + [args[3]]
            return sum(float(np.sum(o)) for o in interpreted(m.f, moved))
        h = 1e-6
        difference = (total(h) - total(-h)) / (2 * h)
        along = sum(float(np.sum(g * d)) for g, d in zip(grads, direction))
        assert abs(along - difference) <= 1e-5 * max(1.0, abs(along)), program.source
    assert written == set(FORMS)


def check_cuda(program: Program, args) -> None:
    """The CUDA target's value and gradients equal the CPU's (f64)."""
    cpu, cuda = _module(program.source), _module(program.source, "cuda")
    value, grads = dsl.value_and_grad(cuda.f, wrt=(0, 1, 2))(*args)
    want_value, want_grads = dsl.value_and_grad(cpu.f, wrt=(0, 1, 2))(*args)
    for a, e in zip(_tree(value), _tree(want_value)):
        _close(a, e, "CUDA value", program, rtol=1e-12)
    for name, a, e in zip("xyw", grads, want_grads):
        _close(a, e, f"CUDA grad wrt {name}", program, rtol=1e-12)


# (the first is the CPU test's program: its CPU side is compiled already)
@pytest.mark.parametrize("seed,max_depth", FIXED_SEEDS[:1] + [
    (seed, None) for seed in range(2000 + 10000 * SEED, 2000 + 10000 * SEED + SCALE - 1)])
def test_fixed_program_on_cuda_matches_the_cpu(seed, max_depth):
    # (small under GRAD_FUZZ_LARGE too: the simulator runs a thread at a time)
    program = _program(seed, max_depth, large=False)
    check_cuda(program, _inputs(np.random.default_rng(seed)))
