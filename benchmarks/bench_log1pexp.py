"""Value and gradient of log1pexp: the dsl against NumPy (and JAX / PyTorch
when they are importable), in one process.

    python benchmarks/bench_log1pexp.py [--sizes 1e5 1e7] [--repeats N]
                                        [--dtypes float64 float32]

Every implementation computes, for an array x,
    v = log(1 + exp(x)),   g = 1 - 1 / (1 + exp(x))     (= d v / d x)
and returns both arrays.  The dsl one is `dsl.value_and_grad(m.log1pexp)`
on examples/log1pexp.grad; it is called once before timing (this compiles
the kernel for the signature) and its results are checked against NumPy's.

Timing: for each (dtype, size) every implementation is warmed, then the
implementations are run round-robin (the starting one rotates each repeat)
so that machine noise hits all of them alike.  One sample is a batch of
calls long enough to be well above the timer's resolution; the table gives
the median time per call and NumPy's median over the dsl's (the dsl's
speedup over NumPy; > 1 means the dsl is faster).  "dsl-1t" is the same dsl
call with Numba limited to one thread.  On a shared machine, parallel
kernels suffer most from other processes: compare min..max spreads.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numba  # noqa: E402

import dsl  # noqa: E402

EXAMPLE = ROOT / "examples" / "log1pexp.grad"
TOLERANCE = {np.float64: dict(rtol=1e-10, atol=1e-12),
             np.float32: dict(rtol=1e-5, atol=1e-6)}


# ------------------------------------------------------------ implementations


def make_numpy():
    def numpy_value_and_grad(x):
        e = np.exp(x)
        v = np.log1p(e)
        g = 1 - 1 / (1 + e)
        return v, g
    return numpy_value_and_grad


def make_dsl():
    m = dsl.load(EXAMPLE)
    return dsl.value_and_grad(m.log1pexp)


def single_threaded(fn):
    """fn with Numba's parallel kernels limited to one thread (shows how much
    of the dsl's time is thread-level parallelism)."""
    def run(x):
        threads = numba.get_num_threads()
        numba.set_num_threads(1)
        try:
            return fn(x)
        finally:
            numba.set_num_threads(threads)
    return run


def make_jax():
    """jit(vjp) of a custom_vjp log1pexp with the same backward rule, or
    None when JAX is not importable."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    jax.config.update("jax_enable_x64", True)

    @jax.custom_vjp
    def log1pexp(x):
        return jnp.log1p(jnp.exp(x))

    def fwd(x):
        e = jnp.exp(x)
        return jnp.log1p(e), e

    def bwd(e, dy):
        return (dy * (1 - 1 / (1 + e)),)

    log1pexp.defvjp(fwd, bwd)

    @jax.jit
    def value_and_grad(x):
        v, pullback = jax.vjp(log1pexp, x)
        (g,) = pullback(jnp.ones_like(v))
        return v, g

    def run(x):
        v, g = value_and_grad(x)
        v.block_until_ready()
        g.block_until_ready()
        return v, g

    run.backend = f"jax {jax.__version__} ({jax.default_backend()})"
    return run


def make_torch():
    """torch.autograd with a custom Function holding the same backward rule,
    or None when PyTorch is not importable.  NumPy in, NumPy out (both
    conversions are zero-copy)."""
    try:
        import torch
    except ImportError:
        return None

    class Log1pexp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            e = torch.exp(x)
            ctx.save_for_backward(e)
            return torch.log1p(e)

        @staticmethod
        def backward(ctx, dy):
            (e,) = ctx.saved_tensors
            return dy * (1 - 1 / (1 + e))

    def run(x):
        xt = torch.from_numpy(x).requires_grad_(True)
        v = Log1pexp.apply(xt)
        (g,) = torch.autograd.grad(v, xt, torch.ones_like(v))
        return v.detach().numpy(), g.numpy()

    run.backend = f"torch {torch.__version__} ({torch.get_num_threads()} threads)"
    return run


# -------------------------------------------------------------------- timing


def per_call(fn, x, number: int) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        fn(x)
    return (time.perf_counter() - t0) / number


def calibrate(fn, x, target_s: float) -> int:
    """Calls per sample so that a sample lasts about target_s."""
    t = per_call(fn, x, 1)
    if t < target_s / 4:
        t = per_call(fn, x, max(1, int(target_s / 4 / t)))
    return max(1, int(target_s / max(t, 1e-9)))


def bench_case(impls: dict, x: np.ndarray, repeats: int, target_s: float) -> dict:
    for fn in impls.values():  # warm: page in outputs, fill caches, pools
        fn(x)
    numbers = {name: calibrate(fn, x, target_s) for name, fn in impls.items()}
    samples: dict[str, list[float]] = {name: [] for name in impls}
    names = list(impls)
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            samples[name].append(per_call(impls[name], x, numbers[name]))
    return {name: (statistics.median(s), min(s), max(s), numbers[name])
            for name, s in samples.items()}


def check(name: str, got, want, dtype) -> None:
    v, g = (np.asarray(a) for a in got)
    v0, g0 = want
    for what, a, b in (("value", v, v0), ("gradient", g, g0)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise SystemExit(f"{name}: {what} is {a.dtype}{list(a.shape)}, NumPy's is "
                             f"{b.dtype}{list(b.shape)}")
        if not np.allclose(a, b, **TOLERANCE[dtype]):
            bad = int(np.argmax(np.abs(a - b)))
            raise SystemExit(f"{name}: {what} differs from NumPy's (worst at {bad}: "
                             f"{a[bad]!r} vs {b[bad]!r})")


# ---------------------------------------------------------------------- main


def _loadavg() -> str:
    try:
        return "/".join(f"{a:.2f}" for a in os.getloadavg())
    except (AttributeError, OSError):
        return "n/a"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", default=["1e5", "1e7"],
                   help="element counts (1e5, 100000, ...); default: 1e5 1e7")
    p.add_argument("--repeats", type=int, default=21,
                   help="round-robin samples per implementation and case (default 21)")
    p.add_argument("--dtypes", nargs="+", default=["float64", "float32"],
                   choices=["float64", "float32"])
    p.add_argument("--sample-ms", type=float, default=20.0,
                   help="minimum length of one sample; small sizes batch calls (default 20)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-single", action="store_true",
                   help="leave out the dsl-1t column (the dsl on one Numba thread)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    sizes = [int(float(s)) for s in args.sizes]
    start = time.perf_counter()
    load_before = _loadavg()

    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, numba {numba.__version__}")
    print(f"cores: os.cpu_count()={os.cpu_count()}, usable (affinity)={affinity}; "
          f"numba threads: get_num_threads()={numba.get_num_threads()}, "
          f"NUMBA_NUM_THREADS={numba.config.NUMBA_NUM_THREADS}")

    impls = {"numpy": make_numpy()}
    t0 = time.perf_counter()
    impls["dsl"] = make_dsl()
    load_s = time.perf_counter() - t0
    if numba.get_num_threads() > 1 and not args.no_single:
        impls["dsl-1t"] = single_threaded(impls["dsl"])
    for name, make in (("jax", make_jax), ("torch", make_torch)):
        fn = make()
        if fn is None:
            print(f"{name}: not importable, skipped")
        else:
            impls[name] = fn
            print(f"{name}: {fn.backend}")
    print(f"dsl.load: {load_s * 1e3:.1f} ms")

    rng = np.random.default_rng(args.seed)
    rows = []
    for dtype_name in args.dtypes:
        dtype = getattr(np, dtype_name)
        for n in sizes:
            # Values where both branches matter and nothing overflows in f32.
            x = rng.uniform(-20.0, 20.0, n).astype(dtype)
            want = impls["numpy"](x)
            first = {}
            for name, fn in impls.items():
                t0 = time.perf_counter()
                got = fn(x)
                first[name] = time.perf_counter() - t0
                if name != "numpy":
                    check(name, got, want, dtype)
            res = bench_case(impls, x, args.repeats, args.sample_ms / 1e3)
            rows.append((dtype_name, n, res, first))
            if dtype_name == args.dtypes[0] and n == sizes[0]:
                print(f"threading layer: {numba.threading_layer()}")

    names = list(impls)
    print()
    print(f"median ms per call (value + gradient), {args.repeats} round-robin samples each;"
          " speedup = numpy / dsl")
    head = f"{'dtype':<8}{'n':>11}" + "".join(f"{nm:>11}" for nm in names) + f"{'speedup':>10}"
    print(head)
    print("-" * len(head))
    for dtype_name, n, res, _ in rows:
        cells = "".join(f"{res[nm][0] * 1e3:>11.3f}" for nm in names)
        speedup = res["numpy"][0] / res["dsl"][0]
        print(f"{dtype_name:<8}{n:>11,}{cells}{speedup:>9.2f}x")
    print()
    print("spread (min..max ms) and calls per sample:")
    for dtype_name, n, res, first in rows:
        parts = [f"{nm} {res[nm][1] * 1e3:.3f}..{res[nm][2] * 1e3:.3f} (x{res[nm][3]})"
                 for nm in names]
        print(f"  {dtype_name} {n:,}: " + "; ".join(parts))
    print("first call (includes dsl compile / cache load for the signature), ms:")
    for dtype_name, n, _, first in rows:
        print(f"  {dtype_name} {n:,}: " + "; ".join(f"{nm} {first[nm] * 1e3:.1f}"
                                                    for nm in names))
    print(f"total {time.perf_counter() - start:.1f} s; load average before {load_before}, "
          f"after {_loadavg()} (other processes on the machine skew parallel timings)")


if __name__ == "__main__":
    main()
