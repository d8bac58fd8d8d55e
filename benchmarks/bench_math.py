"""Time per element of `runtime.cpu_math`'s functions against libm's (the
standard `math` module in the same Numba loop, as `GRADC_LIBM=1` kernels
call it), one thread, float64 and float32: the figures in docs/internals.md.

    python benchmarks/bench_math.py [--rounds 7] [--n 100000] [--only sin cos pow]

Each function runs in a serial loop of its own over n inputs in its usual
range (sin, cos and tan over [-100, 100], erf and erfc over [-6, 6], pow
over x in [0.5, 2] and y in [-8, 8]); the two loops of a function are timed in interleaved rounds,
medians (`timing.compare`).  Prints ns per element and libm / ours.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gradlang.runtime import cpu_math  # noqa: E402
from timing import compare, load_average, markdown_table  # noqa: E402

UNARY = ("exp", "log", "log1p", "expm1", "tanh", "sin", "cos", "tan", "erf", "erfc")
NAMES = UNARY + ("pow",)


def inputs(name: str, n: int, dtype) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    if name == "pow":
        return rng.uniform(0.5, 2.0, n).astype(dtype), rng.uniform(-8, 8, n).astype(dtype)
    low, high = {"log": (1e-3, 1e3), "log1p": (-0.5, 1e3), "tanh": (-5, 5),
                 "sin": (-100, 100), "cos": (-100, 100), "tan": (-100, 100),
                 "erf": (-6, 6), "erfc": (-6, 6)}.get(name, (-20, 20))
    return (rng.uniform(low, high, n).astype(dtype),)


def loop(module, name: str):
    """A serial kernel applying module.<name> elementwise (kernel flags)."""
    f = getattr(module, name)
    if name == "pow":
        def body(x, y, out):
            for i in range(x.shape[0]):
                out[i] = f(x[i], y[i])
    else:
        def body(x, out):
            for i in range(x.shape[0]):
                out[i] = f(x[i])
    return numba.njit(error_model="numpy", nogil=True)(body)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--only", nargs="+", choices=NAMES, default=list(NAMES))
    args = parser.parse_args(argv)
    rows = []
    for name in args.only:
        ours, libm = loop(cpu_math, name), loop(math, name)
        for dtype in (np.float64, np.float32):
            ins = inputs(name, args.n, dtype)
            out = np.empty_like(ins[0])
            t = compare({"ours": lambda: ours(*ins, out), "libm": lambda: libm(*ins, out)},
                        args.rounds)
            per = {k: v.median / args.n * 1e9 for k, v in t.items()}
            rows.append([name, np.dtype(dtype).name, f"{per['ours']:.2f}", f"{per['libm']:.2f}",
                         f"{per['libm'] / per['ours']:.1f}x"])
    print(markdown_table(["function", "dtype", "ours ns/elem", "libm ns/elem", "libm / ours"],
                         rows))
    print(f"\nn = {args.n}, {args.rounds} rounds, load average {load_average()}")


if __name__ == "__main__":
    main()
