"""Per-call overhead: `dsl.value_and_grad(m.log1pexp)(x)` on a small array,
against a raw Numba `@njit` call and NumPy doing the same work (and JAX and
PyTorch when importable, as `workloads` defines them).

    python benchmarks/bench_call.py [--n 16] [--rounds 31] [--sample-ms 20]

At n=16 the arithmetic costs a few nanoseconds, so this measures what a
call costs around its kernels: binding the arguments, finding the program,
the driver, and shaping the results.  "dsl" is a plain call, which takes
the fast path (`dsl.function.FastPath`); "dsl-kw" passes x by keyword,
which takes it too, reordered to a call by position (`by_keyword_order`;
it took the slow path, binding then the program cache, 8 us against 1.2
until 2026-11-26); "dsl-float"
calls it on a Python float (the fast path, converting it as binding
would; its one element is other work than x's, so it is not checked
against NumPy, only timed).  Every
implementation is checked against NumPy first, then timed in interleaved
rounds (`timing.compare`); the table gives microseconds per call (median
and min over the rounds) and the median over njit's.  Report the load
average printed with it: the machine may be shared.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import timing  # noqa: E402
import workloads  # noqa: E402


@numba.njit
def njit_log1pexp(x):
    v = np.empty_like(x)
    g = np.empty_like(x)
    for i in range(x.size):
        e = np.exp(x[i])
        v[i] = np.log1p(e)
        g[i] = 1.0 - 1.0 / (1.0 + e)
    return v, g


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--sample-ms", type=float, default=20.0)
    opts = parser.parse_args()

    # The suite's case (NumPy, and JAX and PyTorch when importable) on its
    # x; the dsl called directly, not through the suite's cached lookup.
    (case,) = workloads.log1pexp_cases([opts.n], [np.float64])
    x = np.random.default_rng(0).uniform(-20.0, 20.0, opts.n)  # the case's x
    dsl_fn = workloads.dsl_log1pexp()
    case.impls.update({"dsl": lambda: dsl_fn(x), "dsl-kw": lambda: dsl_fn(x=x),
                       "njit": lambda: njit_log1pexp(x)})
    workloads.check(case)
    case.impls["dsl-float"] = lambda: dsl_fn(0.5)

    load_start = timing.load_average()
    timings = timing.compare(case.impls, opts.rounds, opts.sample_ms / 1e3)
    print(f"value_and_grad(log1pexp), {case.label}, {opts.rounds} interleaved rounds; "
          f"load average {load_start} at start, {timing.load_average()} at end")
    base = timings["njit"].median
    print(f"{'impl':<10}{'median us':>12}{'min us':>10}{'/ njit':>8}")
    for name, t in timings.items():
        print(f"{name:<10}{t.median * 1e6:>12.2f}{t.low * 1e6:>10.2f}{t.median / base:>8.1f}")


if __name__ == "__main__":
    main()
