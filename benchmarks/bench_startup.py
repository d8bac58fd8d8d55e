"""Time to first gradient in a new process: cold (empty caches) and warm
(a second process on the same, unchanged file), JIT (`dsl.load`) and
ahead of time (`gradc compile --sig`, then import).

    python benchmarks/bench_startup.py [--repeats N]

Each sample is a fresh Python process that imports dsl (or the compiled
module), loads examples/dense.grad and computes the gradient of `loss`
once; the time is measured inside the process from before the import to
after the gradient.  Cold runs use empty GRADC_CACHE_DIR and NUMBA_CACHE_DIR
directories; warm runs reuse the directories a cold run filled.  Medians
over the repeats.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "dense.grad"

JIT = """
import time; t0 = time.perf_counter()
import numpy as np, dsl
m = dsl.load({example!r})
g = dsl.grad(m.loss, wrt=(0, 1, 2))(np.ones((8, 4)), np.ones((4, 3)), np.ones(3), np.zeros((8, 3)))
print(time.perf_counter() - t0)
"""
AOT = """
import time; t0 = time.perf_counter()
import sys; sys.path.insert(0, {out!r})
import numpy as np, dense
g = dense.loss.grad(np.ones((8, 4)), np.ones((4, 3)), np.ones(3), np.zeros((8, 3)))
print(time.perf_counter() - t0)
"""


def run(script: str, env: dict) -> float:
    result = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT,
                            capture_output=True, text=True, check=True)
    return float(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = {"jit cold": [], "jit warm": [], "aot import (after gradc compile --sig)": []}
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "GRADC_CACHE_DIR": f"{tmp}/gradc",
                   "NUMBA_CACHE_DIR": f"{tmp}/numba", "PYTHONPATH": str(ROOT)}
            rows["jit cold"].append(run(JIT.format(example=str(EXAMPLE)), env))
            rows["jit warm"].append(run(JIT.format(example=str(EXAMPLE)), env))
            out = f"{tmp}/aot"
            subprocess.run([sys.executable, "-m", "dsl.cli", "compile", str(EXAMPLE), "-o", out,
                            "--sig", "loss(f64[b, i], f64[i, o], f64[o], f64[b, o])"],
                           env=env, cwd=ROOT, check=True, capture_output=True)
            rows["aot import (after gradc compile --sig)"].append(run(AOT.format(out=out), env))
    print(f"time to first gradient of dense.grad's loss, median of {args.repeats} "
          f"({os.cpu_count()} cores)")
    for name, samples in rows.items():
        print(f"  {name:<40} {statistics.median(samples) * 1000:8.0f} ms")


if __name__ == "__main__":
    main()
