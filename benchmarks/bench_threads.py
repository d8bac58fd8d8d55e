"""The dsl's multithreaded work in a process that has imported PyTorch.

Each configuration runs in a fresh process and times two workloads,
median of 25 calls after a warm-up: the attention benchmark's value and
gradient (`benchmarks/attention.grad`, f32 8 x 8 heads, sequence 128, dim
64: BLAS products between Numba's parallel kernels), log1pexp's value and
gradient at 1e5 f64 (one parallel kernel, nothing else: what threads that
sleep between kernels cost), and, where torch is imported, `torch.exp` of
1e6 f64 (on libgomp's threads) then log1pexp's value and gradient at 1e6
(a training step's torch ops between ours).  Configurations: alone; `import dsl`
then `import torch` (dsl's spin count reaches libgomp then); after
`import torch` (libgomp's default 300,000-round spin); that on Numba's
workqueue layer (`NUMBA_THREADING_LAYER=workqueue`: threads of its own,
which sleep between kernels, but none shared with torch's ops); and on
libgomp with `OMP_WAIT_POLICY=PASSIVE`.  Then the cause without
torch: a Numba `prange` kernel (exp of 2e5 f64) and a 256 x 256 f32 BLAS
product, each alone and called alternately, by default and with
`OMP_WAIT_POLICY=PASSIVE`.

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
e = dsl.value_and_grad(dsl.load({log1pexp!r}).log1pexp)
x = np.random.default_rng(3).uniform(-20, 20, 100000)
def median_ms(run):
    run()
    times = []
    for _ in range(25):
        t = time.perf_counter(); run(); times.append(time.perf_counter() - t)
    return sorted(times)[12] * 1e3
import sys
if "torch" in sys.modules:  # a torch op (on libgomp's threads) before each of ours
    import torch
    big = np.random.default_rng(4).uniform(-20, 20, 1000000)
    big_t = torch.from_numpy(big)
    mixed = median_ms(lambda: (torch.exp(big_t), e(big)))
else:
    mixed = float("nan")
print(median_ms(lambda: g(q, k, v, 0.125)), median_ms(lambda: e(x)), mixed,
      numba.threading_layer())
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
                  "import dsl, then torch": ("import dsl; import torch", {}),
                  "after import torch": ("import torch", {}),
                  "after import torch, NUMBA_THREADING_LAYER=workqueue": (
                      "import torch", {"NUMBA_THREADING_LAYER": "workqueue"}),
                  "after import torch, OMP_WAIT_POLICY=PASSIVE": (
                      "import torch", {"OMP_WAIT_POLICY": "PASSIVE"})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="processes per configuration")
    rounds = parser.parse_args().rounds
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in CONFIGURATIONS}
    layers: dict[str, str] = {}
    for _ in range(rounds):  # interleaved, a fresh process each
        for name, (imports, env) in CONFIGURATIONS.items():
            code = BODY.format(imports=imports, path=str(ROOT / "benchmarks" / "attention.grad"),
                               log1pexp=str(ROOT / "examples" / "log1pexp.grad"))
            done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                                  capture_output=True, text=True, check=True)
            *figures, layers[name] = done.stdout.split()
            samples[name].append(tuple(map(float, figures)))
    print(f"value + gradient, median of 25 calls, median (min..max) of {rounds} processes: "
          "attention | log1pexp at 1e5 f64 | torch.exp then log1pexp at 1e6 f64 | "
          "Numba's threading layer")
    for name, values in samples.items():
        cells = []
        for column in zip(*values):
            cells.append(f"{statistics.median(column):7.2f} ms ({min(column):.2f}..{max(column):.2f})")
        print(f"  {name:50s} {' | '.join(cells)} | {layers[name]}")
    print("a prange kernel and a BLAS product, median of 50 calls (kernel alone, "
          "product alone, both alternately), one process each:")
    for name, env in (("default", {}), ("OMP_WAIT_POLICY=PASSIVE", {"OMP_WAIT_POLICY": "PASSIVE"})):
        done = subprocess.run([sys.executable, "-c", ALTERNATING], env={**os.environ, **env},
                              capture_output=True, text=True, check=True)
        kernel, product, both = (float(v) for v in done.stdout.split())
        print(f"  {name:25s} {kernel:6.3f} ms, {product:6.3f} ms, alternately {both:6.3f} ms")


if __name__ == "__main__":
    main()
