"""CUDA: log1pexp value + gradient at 1e8 f32 elements, as a fraction of
the device-to-device copy bandwidth measured in the same run
(interleaved rounds, medians: timing.compare).

    python benchmarks/bench_cuda.py [--n 1e8] [--repeats 20]

The kernel reads x once and writes the value and the gradient (12 bytes
per element in f32); a device-to-device copy of x reads and writes 8 bytes
per element.  Achieved bandwidth = bytes moved / median time.  Needs a GPU
(the simulator is far too slow for these sizes).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import timing  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=float, default=1e8)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    from numba import config, cuda
    if config.ENABLE_CUDASIM or not cuda.is_available():
        sys.exit("bench_cuda: needs a CUDA GPU (not the simulator)")
    import dsl
    n = int(args.n)
    m = dsl.load(ROOT / "examples" / "log1pexp.grad", target="cuda")
    f = dsl.value_and_grad(m.log1pexp)
    x = cuda.to_device(np.linspace(-20, 20, n, dtype=np.float32))
    copy = cuda.device_array_like(x)

    def kernel():
        f(x)
        cuda.synchronize()

    def memcpy():
        copy.copy_to_device(x)
        cuda.synchronize()

    # One call per sample: at this size a call is far above the timer's grain.
    t = timing.compare({"kernel": kernel, "memcpy": memcpy}, args.repeats, sample_s=0.0)
    k, c = t["kernel"].median, t["memcpy"].median
    kernel_bw, copy_bw = 12 * n / k / 1e9, 8 * n / c / 1e9
    print(f"{cuda.get_current_device().name.decode()}: n = {n:,} f32, medians of {args.repeats}")
    print(f"  value+grad  {k * 1e3:8.2f} ms  {kernel_bw:7.1f} GB/s")
    print(f"  d2d copy    {c * 1e3:8.2f} ms  {copy_bw:7.1f} GB/s")
    print(f"  fraction of copy bandwidth: {kernel_bw / copy_bw:.2f}")


if __name__ == "__main__":
    main()
