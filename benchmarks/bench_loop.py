"""A 1,000-step elementwise loop: value and gradient against JAX.

    python benchmarks/bench_loop.py [--steps 1000] [--size 100000] [--rounds 5]

The program is `u = u + kappa * (u * (1 - u))`, `steps` times, then
`sum(u * u)`; the gradient is with respect to u and kappa.  The dsl runs
the loop inside one forward and one backward kernel (the driver source is
checked for it); JAX runs `jit(value_and_grad)` of `lax.fori_loop` (a scan,
since the trip count is static).  Also prints the pullback's
`residual_bytes` with and without `@recompute` (checkpoints every
about sqrt(steps) trips).  Times: medians of interleaved rounds
(`benchmarks/timing.py`), with the load average.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402
import workloads  # noqa: E402

import dsl  # noqa: E402

SOURCE = """
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


def kernel_launches(driver_source: str) -> int:
    """How many kernel launches a driver's text holds (a loop in the
    driver would launch its body's once per trip, and shows as `for`)."""
    return len(re.findall(r"\(K\.k_\w+ if|K\.k_\w+\(", driver_source))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    m = dsl.loads(SOURCE)
    rng = np.random.default_rng(0)
    u, kappa, n = rng.uniform(0.1, 0.9, args.size), 0.001, args.steps
    value_and_grad = dsl.value_and_grad(m.grow, wrt=(0, 1))
    program = value_and_grad.program(value_and_grad.bind((u, kappa, n), {}))
    print(f"kernel launches in the value-and-gradient driver: "
          f"{kernel_launches(program.generated.driver_source)} (loops in the driver: "
          f"{program.generated.driver_source.count(' in range(')})")
    impls = {"dsl": lambda: value_and_grad(u, kappa, n)}
    if workloads.jax_modules():
        jax, jnp = workloads.jax_modules()

        def grow(u, kappa):
            u = jax.lax.fori_loop(0, n, lambda i, u: u + kappa * (u * (1 - u)), u)
            return jnp.sum(u * u)
        impls["jax"] = workloads.jax_call(jax.jit(jax.value_and_grad(grow, argnums=(0, 1))),
                                          u, kappa)
    want = value_and_grad(u, kappa, n)
    for name, fn in impls.items():
        got = workloads.flatten(fn())
        for a, b in zip(got, workloads.flatten(want)):
            np.testing.assert_allclose(np.asarray(a), b, rtol=1e-9, atol=1e-12)
    load_before = timing.load_average()
    results = timing.compare(impls, args.rounds, sample_s=0.2)
    for name, t in results.items():
        print(f"{name}: median {timing.ms(t.median)} ms (min {timing.ms(t.low)}, "
              f"max {timing.ms(t.high)})")
    if "jax" in results:
        print(f"dsl / jax: {results['dsl'].median / results['jax'].median:.2f}")
    print(f"load average: before {load_before}, after {timing.load_average()}")
    _, plain = dsl.vjp(m.grow, u, kappa, n)
    _, saved = dsl.vjp(m.grow_checkpointed, u, kappa, n)
    print(f"residual_bytes: plain {plain.residual_bytes:,}, @recompute "
          f"{saved.residual_bytes:,} ({plain.residual_bytes / saved.residual_bytes:.1f}x less); "
          "same gradient: "
          f"{np.allclose(plain(1.0)[0], saved(1.0)[0], rtol=1e-12)}")


if __name__ == "__main__":
    main()
