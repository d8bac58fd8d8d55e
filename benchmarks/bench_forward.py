"""Forward mode: `dsl.jvp` of log1pexp against `dsl.value_and_grad`, and
Hessian-vector products forward over reverse (`jvp(grad(f))`) against
reverse over reverse (`dsl.hvp`).

    python benchmarks/bench_forward.py [--n 10000000] [--rounds 11] [--sample-ms 200]

Both log1pexp programs read x once and write two arrays in one fused loop
(the jvp also reads the tangent); the kernel counts are printed and
checked.  Results are checked against each other first, then timed in
interleaved rounds (`timing.compare`): milliseconds per call, median and
min, and the median over value_and_grad's (or hvp's).  Report the load
average printed with it: the machine may be shared.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import timing  # noqa: E402

import dsl  # noqa: E402
from dsl.forward import jvp_function  # noqa: E402


def kernels(f, bound: dict) -> int:
    return len(f.program(f.on_target(bound)).generated.kernel_names)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--sample-ms", type=float, default=200.0)
    args = parser.parse_args(argv)
    m = dsl.load(ROOT / "examples" / "log1pexp.grad")
    rng = np.random.default_rng(0)
    x = rng.normal(size=args.n) * 10
    t = rng.normal(size=args.n)

    value_and_grad = dsl.value_and_grad(m.log1pexp)
    (v1, g), (v2, tangent) = value_and_grad(x), dsl.jvp(m.log1pexp, (x,), (t,))
    np.testing.assert_allclose(v2, v1, rtol=1e-14)
    np.testing.assert_allclose(tangent, g * t, rtol=1e-14)
    jf = jvp_function(m.log1pexp, ["x"])
    counts = (kernels(value_and_grad, {"x": x}), kernels(jf, {"x": x, jf.tangent_names[0]: t}))
    print(f"kernels: value_and_grad {counts[0]}, jvp {counts[1]}")
    assert counts[1] == 1, "the jvp of an elementwise chain is one fused loop"
    timings = timing.compare({
        "value_and_grad": lambda: value_and_grad(x),
        "jvp": lambda: dsl.jvp(m.log1pexp, (x,), (t,)),
    }, args.rounds, args.sample_ms / 1000)
    print(f"log1pexp, n = {args.n}, f64; {timing.load_average()}")
    for name, tm in timings.items():
        print(f"  {name:16s} {timing.ms(tm.median)} ms (min {timing.ms(tm.low)}), "
              f"{tm.median / timings['value_and_grad'].median:.2f}x value_and_grad")

    # Hessian-vector products of a reduction, for hvp's choice of mode
    n = max(args.n // 10, 1)
    y, v = x[:n], t[:n]
    grad = dsl.grad(m.log1pexp)
    hvp = dsl.hvp(m.log1pexp)
    np.testing.assert_allclose(dsl.jvp(grad, (y,), (v,))[1], hvp(y, v), rtol=1e-12,
                               atol=1e-300)
    timings = timing.compare({
        "hvp (rev-over-rev)": lambda: hvp(y, v),
        "jvp(grad) (fwd-over-rev)": lambda: dsl.jvp(grad, (y,), (v,)),
    }, args.rounds, args.sample_ms / 1000)
    print(f"Hessian-vector product of log1pexp, n = {n}, f64; {timing.load_average()}")
    base = timings["hvp (rev-over-rev)"].median
    for name, tm in timings.items():
        print(f"  {name:26s} {timing.ms(tm.median)} ms (min {timing.ms(tm.low)}), "
              f"{tm.median / base:.2f}x hvp")


if __name__ == "__main__":
    main()
