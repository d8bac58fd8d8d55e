"""Per-call overhead: `dsl.value_and_grad(m.log1pexp)(x)` on a small array,
against a raw Numba `@njit` call and NumPy doing the same work (and JAX's
jitted value_and_grad when it is importable).

    python benchmarks/bench_call.py [--n 16] [--rounds 31] [--calls 2000]

At n=16 the arithmetic costs a few nanoseconds, so this measures what a
call costs around its kernels: binding the arguments, finding the program,
the driver, and shaping the results.  "dsl" is a plain call, which takes
the fast path (`dsl.function.FastPath`); "dsl-kw" passes x by keyword,
which takes the slow path (binding, then the program cache).  Every implementation is called once
first (compiling it) and checked against NumPy.  Then each round times a
batch of `--calls` calls of every implementation in turn (the starting one
rotates, so that machine noise hits all alike); the table gives each one's
median and min over the rounds, in microseconds per call.  Report the
`uptime` load with the numbers: the machine may be shared.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numba  # noqa: E402

import dsl  # noqa: E402

EXAMPLE = ROOT / "examples" / "log1pexp.grad"


def make_dsl() -> Callable:
    return dsl.value_and_grad(dsl.load(EXAMPLE).log1pexp)


@numba.njit(cache=False)
def _njit_value_and_grad(x):
    v = np.empty_like(x)
    g = np.empty_like(x)
    for i in range(x.size):
        e = np.exp(x[i])
        v[i] = np.log1p(e)
        g[i] = 1.0 - 1.0 / (1.0 + e)
    return v, g


def make_njit() -> Callable:
    return _njit_value_and_grad


def make_numpy() -> Callable:
    def numpy_value_and_grad(x):
        e = np.exp(x)
        return np.log1p(e), 1 - 1 / (1 + e)
    return numpy_value_and_grad


def make_jax() -> Callable | None:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    jax.config.update("jax_enable_x64", True)
    f = jax.jit(jax.value_and_grad(lambda x: jnp.sum(jnp.logaddexp(0.0, x))))

    def jax_value_and_grad(x):
        total, g = f(x)
        g.block_until_ready()
        return total, g
    return jax_value_and_grad


def per_call_us(fn: Callable, x: np.ndarray, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--calls", type=int, default=2000)
    opts = parser.parse_args()

    x = np.linspace(-3.0, 3.0, opts.n)
    dsl_fn = make_dsl()
    impls = {"dsl": dsl_fn, "dsl-kw": lambda x: dsl_fn(x=x),
             "njit": make_njit(), "numpy": make_numpy()}
    jax_fn = make_jax()
    if jax_fn is not None:
        impls["jax"] = jax_fn
    want_v, want_g = impls["numpy"](x)
    for name, fn in impls.items():
        v, g = fn(x)
        # jax differentiates a scalar function, so it returns sum(v)
        np.testing.assert_allclose(np.sum(v) if name != "jax" else float(v), np.sum(want_v),
                                   rtol=1e-12, err_msg=name)
        if name != "jax":
            np.testing.assert_allclose(v, want_v, rtol=1e-12, err_msg=name)
        np.testing.assert_allclose(np.asarray(g), want_g, rtol=1e-12, err_msg=name)

    names = list(impls)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(opts.rounds):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            samples[name].append(per_call_us(impls[name], x, opts.calls))

    load = os.getloadavg()
    print(f"value_and_grad(log1pexp), n={opts.n} f64, {opts.rounds} rounds x "
          f"{opts.calls} calls; load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'impl':<8}{'median us':>12}{'min us':>10}{'vs njit':>10}")
    base = statistics.median(samples["njit"])
    for name in names:
        med = statistics.median(samples[name])
        print(f"{name:<8}{med:>12.2f}{min(samples[name]):>10.2f}{med / base:>10.1f}x")


if __name__ == "__main__":
    main()
