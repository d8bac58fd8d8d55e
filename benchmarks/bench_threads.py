"""The dsl's multithreaded work in a process that has imported PyTorch.

Each configuration runs in a fresh process: the attention benchmark's
value and gradient (`benchmarks/attention.grad`, f32 8 x 8 heads, sequence
128, dim 64: BLAS products between Numba's parallel kernels), median of
25 calls after a warm-up, alone, after `import torch`, after `import dsl`
then `import torch` (dsl's spin count reaches libgomp then), and after
`import torch` with `OMP_WAIT_POLICY=PASSIVE` (libgomp's idle threads
sleep rather than spin).  Numba's `omp` threading layer shares libgomp with torch; the
figures show what a training script that imports torch pays.  Then the
cause without torch: a Numba `prange` kernel (exp of 2e5 f64) and a
256 x 256 f32 BLAS product, each alone and called alternately, by default
and with `OMP_WAIT_POLICY=PASSIVE`.

    python benchmarks/bench_threads.py [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BODY = """
import time, numpy as np
{imports}
import dsl, numba  # (after the configuration's imports)
m = dsl.load({path!r})
q, k, v = (np.random.default_rng(s).normal(size=(8, 8, 128, 64)).astype(np.float32)
           for s in range(3))
g = dsl.value_and_grad(m.attention_loss, wrt=(0, 1, 2))
g(q, k, v, 0.125)
times = []
for _ in range(25):
    t = time.perf_counter(); g(q, k, v, 0.125); times.append(time.perf_counter() - t)
print(sorted(times)[12] * 1e3, numba.threading_layer())
"""

ALTERNATING = """
import time, numpy as np, numba
@numba.njit(parallel=True)
def kernel(x, out):
    for i in numba.prange(x.size):
        out[i] = np.exp(x[i])
x, a = np.ones(200000), np.ones((256, 256), np.float32)
out = np.empty_like(x)
kernel(x, out); a @ a
def median_ms(run):
    times = []
    for _ in range(50):
        t = time.perf_counter(); run(); times.append(time.perf_counter() - t)
    return sorted(times)[25] * 1e3
print(median_ms(lambda: kernel(x, out)), median_ms(lambda: a @ a),
      median_ms(lambda: (kernel(x, out), a @ a)))
"""

CONFIGURATIONS = {"alone": ("", {}),
                  "after import torch": ("import torch", {}),
                  "import dsl, then torch": ("import dsl; import torch", {}),
                  "after import torch, OMP_WAIT_POLICY=PASSIVE": ("import torch",
                                                                  {"OMP_WAIT_POLICY": "PASSIVE"})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="processes per configuration")
    rounds = parser.parse_args().rounds
    samples: dict[str, list[float]] = {name: [] for name in CONFIGURATIONS}
    layer = "?"
    for _ in range(rounds):  # interleaved, a fresh process each
        for name, (imports, env) in CONFIGURATIONS.items():
            code = BODY.format(imports=imports, path=str(ROOT / "benchmarks" / "attention.grad"))
            done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                                  capture_output=True, text=True, check=True)
            ms, layer = done.stdout.split()
            samples[name].append(float(ms))
    print(f"attention value + gradient, median of 25 calls, {rounds} processes each "
          f"(numba threading layer: {layer})")
    for name, values in samples.items():
        print(f"  {name:45s} {statistics.median(values):7.2f} ms "
              f"({min(values):.2f}..{max(values):.2f})")
    print("a prange kernel and a BLAS product, median of 50 calls (kernel alone, "
          "product alone, both alternately), one process each:")
    for name, env in (("default", {}), ("OMP_WAIT_POLICY=PASSIVE", {"OMP_WAIT_POLICY": "PASSIVE"})):
        done = subprocess.run([sys.executable, "-c", ALTERNATING], env={**os.environ, **env},
                              capture_output=True, text=True, check=True)
        kernel, product, both = (float(v) for v in done.stdout.split())
        print(f"  {name:25s} {kernel:6.3f} ms, {product:6.3f} ms, alternately {both:6.3f} ms")


if __name__ == "__main__":
    main()
