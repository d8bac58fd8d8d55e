"""CUDA: log1pexp value + gradient at 1e8 f32 elements against PyTorch and
JAX on the same GPU (where installed) and the device-to-device copy
bandwidth, measured in one process (interleaved rounds, medians:
timing.compare); and its jvp against its value_and_grad.

    python benchmarks/bench_cuda.py [--n 1e8] [--repeats 20]

The kernel reads x once and writes the value and the gradient (12 bytes
per element in f32); a device-to-device copy of x reads and writes 8 bytes
per element.  Achieved bandwidth = bytes moved / median time.  PyTorch runs
eagerly (autograd of the same formula, log(1 + exp(x))); JAX runs
`jit` of the value and its vjp with ones.  Every result is checked against
the dsl's before anything is timed.  Needs a GPU (the simulator is far too
slow for these sizes).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import timing  # noqa: E402

# JAX takes three quarters of the GPU's memory at its first array otherwise.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def torch_case(x_host: np.ndarray):
    """PyTorch's value and gradient on the GPU, or None without a CUDA torch."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    x = torch.from_numpy(x_host).cuda().requires_grad_()
    ones = torch.ones_like(x)

    def run():
        y = torch.log(1 + torch.exp(x))
        g, = torch.autograd.grad(y, x, ones)
        torch.cuda.synchronize()
        return y, g

    return run, lambda out: (out[0].detach().cpu().numpy(), out[1].cpu().numpy())


def jax_case(x_host: np.ndarray):
    """JAX's jitted value and vjp on the GPU, or None without a GPU JAX."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        return None
    x = jax.device_put(x_host, gpus[0])

    @jax.jit
    def value_and_grad(x):
        y, pullback = jax.vjp(lambda x: jnp.log(1 + jnp.exp(x)), x)
        return y, pullback(jnp.ones_like(y))[0]

    def run():
        return jax.block_until_ready(value_and_grad(x))

    return run, lambda out: (np.asarray(out[0]), np.asarray(out[1]))


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
    x_host = np.linspace(-20, 20, n, dtype=np.float32)
    x = cuda.to_device(x_host)
    t = cuda.to_device(np.ones(n, np.float32))
    copy = cuda.device_array_like(x)

    def ours():
        out = f(x)
        cuda.synchronize()
        return out

    def jvp():
        out = dsl.jvp(m.log1pexp, (x,), (t,))
        cuda.synchronize()
        return out

    def memcpy():
        copy.copy_to_device(x)
        cuda.synchronize()

    value, grad = (a.copy_to_host() for a in ours())
    jvp_value, jvp_tangent = (a.copy_to_host() for a in jvp())
    np.testing.assert_array_equal(jvp_value, value)
    np.testing.assert_array_equal(jvp_tangent, grad)  # the tangent is 1
    impls = {"dsl": ours, "dsl jvp": jvp, "d2d copy": memcpy}
    for name, case in (("torch", torch_case(x_host)), ("jax", jax_case(x_host))):
        if case is None:
            print(f"  ({name}: not installed with a GPU here)")
            continue
        run, to_host = case
        their_value, their_grad = to_host(run())
        np.testing.assert_allclose(their_value, value, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(their_grad, grad, rtol=1e-5, atol=1e-6)
        impls[name] = run

    # One call per sample: at this size a call is far above the timer's grain.
    times = timing.compare(impls, args.repeats, sample_s=0.0)
    moved = {"d2d copy": 8 * n, "dsl jvp": 16 * n}  # jvp: x, t in; y, ty out
    name = cuda.get_current_device().name  # bytes in older Numba, str in numba-cuda
    print(f"{name.decode() if isinstance(name, bytes) else name}: n = {n:,} f32, "
          f"medians of {args.repeats} interleaved rounds")
    for name, took in times.items():
        gbs = moved.get(name, 12 * n) / took.median / 1e9
        print(f"  {name:9s} {took.median * 1e3:8.2f} ms  {gbs:7.1f} GB/s"
              + (f"  (dsl / {name}: {times['dsl'].median / took.median:.2f}x)"
                 if name in ("torch", "jax") else ""))
    copy_gbs = 8 * n / times["d2d copy"].median / 1e9
    print(f"  fraction of copy bandwidth (value+grad): "
          f"{12 * n / times['dsl'].median / 1e9 / copy_gbs:.2f}")
    print(f"  jvp / value_and_grad: {times['dsl jvp'].median / times['dsl'].median:.2f}x")


if __name__ == "__main__":
    main()
