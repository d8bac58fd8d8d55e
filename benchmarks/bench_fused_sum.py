"""A sum of an elementwise chain: sum(x * x) in the dsl (one fused loop
that never stores x * x) against NumPy's np.sum(x * x), in one process.

    python benchmarks/bench_fused_sum.py [--n 1e7] [--repeats 15]

Round-robin samples, medians; ratio = NumPy / dsl (> 1: the dsl is faster).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dsl  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=float, default=1e7)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    m = dsl.loads("def sumsq(x):\n    return sum(x * x)\n")
    x = np.random.default_rng(0).normal(size=int(args.n))
    assert np.isclose(m.sumsq(x), np.sum(x * x), rtol=1e-12)
    timings = {"dsl": [], "numpy": []}
    runs = {"dsl": lambda: m.sumsq(x), "numpy": lambda: np.sum(x * x)}
    for _ in range(args.repeats):
        for name, run in runs.items():
            t = time.perf_counter()
            run()
            timings[name].append(time.perf_counter() - t)
    dsl_ms = statistics.median(timings["dsl"]) * 1e3
    np_ms = statistics.median(timings["numpy"]) * 1e3
    print(f"sum(x * x), n = {int(args.n):,} f64: numpy {np_ms:.1f} ms, dsl {dsl_ms:.1f} ms, "
          f"ratio {np_ms / dsl_ms:.2f}x")


if __name__ == "__main__":
    main()
