"""Where the parallel (`prange`) variant of a CPU kernel starts to beat the
serial one, for a cheap kernel and an exp-heavy one: the measurement behind
`CpuTarget`'s parallel thresholds and the op table's `cost` column.

    python benchmarks/bench_threshold.py [--repeats 9] [--min-exp 8] [--max-exp 18] [--ops]

Both kernels are rendered by `CpuTarget.render_loop`, as codegen renders a
fused loop, and loaded like generated kernels.  For each size the four
(kernel, variant) pairs are timed in interleaved rounds, each sample a batch
of calls long enough to time; medians (`timing.compare`).  Prints ns per
element, the parallel speedup, and the break-even size of each kernel: the
smallest size from which the parallel variant is faster at every measured
size.  Run it on an idle
machine: fork-join suffers when another process holds a core.

`--ops` first times the serial kernel of every float elementwise op of the
table (its template, in a loop of its own, in cache) against `add`'s and
prints the time it adds, in add loops, beside the op's `cost`: how that
column was measured.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gradlang.compiler.ops import OPS, loop_cost  # noqa: E402
from gradlang.runtime.cpu import TARGET  # noqa: E402
from gradlang.runtime.loader import load_kernels  # noqa: E402
from timing import calls_per_sample, compare, per_call  # noqa: E402

# name -> (loop body as codegen writes it, the ops it evaluates per element)
KERNELS = {
    "cheap (x * y + x)": (["a0 = in0[i]", "a1 = in1[i]", "v0 = f64(a0 * a1)",
                           "v1 = f64(v0 + a0)", "out0[i] = v1"], ["mul", "add"]),
    "exp-heavy (exp(x) * y)": (["a0 = in0[i]", "a1 = in1[i]", "v0 = f64(math.exp(a0))",
                                "v1 = f64(v0 * a1)", "out0[i] = v1"], ["exp", "mul"]),
}
SAMPLE_SECONDS = 2e-3  # a batch of calls at least this long makes one sample


def load() -> dict[str, tuple]:
    sources = [TARGET.header, "f64 = np.float64"]
    for k, (body, _) in enumerate(KERNELS.values()):
        sources.append(TARGET.render_loop(f"k{k}", ["in0", "in1", "out0"], [], body))
    module = load_kernels("\n".join(sources))
    return {name: (getattr(module, f"k{k}"), getattr(module, f"k{k}_serial"))
            for k, name in enumerate(KERNELS)}


def op_costs(repeats: int) -> None:
    ops = [op for op in OPS.values() if op.kind == "elementwise" and op.template
           and op.arity in (1, 2) and "bool" not in op.domains
           and op.type_rule is OPS["add"].type_rule]
    sources = [TARGET.header, "f64 = np.float64"]
    for op in ops:
        expr = op.template.format("a0", "a1", T="f64")
        sources.append(TARGET.render_loop(f"k_{op.name}", ["in0", "in1", "out0"], [],
                                          ["a0 = in0[i]", "a1 = in1[i]",
                                           f"out0[i] = f64({expr})"]))
    module = load_kernels("\n".join(sources))
    n = 1 << 14  # three arrays of it stay in L2
    x = np.random.default_rng(0).uniform(0.1, 2.0, n)  # in every op's domain
    y, out = x[::-1].copy(), np.empty(n)
    ns = {}
    for op in ops:
        kernel = getattr(module, f"k_{op.name}_serial")

        def run(kernel=kernel):
            kernel(n, x, y, out)
        calls = calls_per_sample(run, SAMPLE_SECONDS)
        ns[op.name] = statistics.median(per_call(run, calls)
                                        for _ in range(repeats)) / n * 1e9
    print(f"{'op':<14} {'ns/el':>7} {'extra':>7} {'cost':>5}")
    for op in ops:
        print(f"{op.name:<14} {ns[op.name]:>7.2f} {ns[op.name] / ns['add'] - 1:>7.1f} "
              f"{op.cost:>5}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--min-exp", type=int, default=8)
    parser.add_argument("--max-exp", type=int, default=18)
    parser.add_argument("--ops", action="store_true", help="time each op against add first")
    args = parser.parse_args()
    if args.ops:
        op_costs(args.repeats)
    kernels = load()
    rng = np.random.default_rng(0)
    load1, load5, _ = os.getloadavg()
    print(f"threads {numba.get_num_threads()}, cpus {os.cpu_count()}, "
          f"load average {load1:.2f} {load5:.2f}")
    for name, (_, ops) in KERNELS.items():
        print(f"{name}: loop cost {loop_cost(ops)} per element")
    sizes = [1 << e for e in range(args.min_exp, args.max_exp + 1)]
    faster: dict[str, list[bool]] = {name: [] for name in kernels}
    print(f"{'n':>8} {'kernel':<24} {'serial ns/el':>12} {'parallel ns/el':>14} "
          f"{'speedup':>8}")
    for n in sizes:
        x, y = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
        out = np.empty(n)
        variants = {f"{name}/{which}": (lambda kernel=kernel: kernel(n, x, y, out))
                    for name, pair in kernels.items()
                    for which, kernel in zip(("parallel", "serial"), pair)}
        timings = compare(variants, args.repeats, SAMPLE_SECONDS)
        for name in kernels:
            serial = timings[f"{name}/serial"].median
            parallel = timings[f"{name}/parallel"].median
            faster[name].append(parallel < serial)
            print(f"{n:>8} {name:<24} {serial / n * 1e9:>12.2f} {parallel / n * 1e9:>14.2f} "
                  f"{serial / parallel:>8.2f}")
    for name, wins in faster.items():
        # the smallest size from which parallel wins at every larger size
        first = len(wins)
        while first > 0 and wins[first - 1]:
            first -= 1
        where = f"2^{args.min_exp + first}" if first < len(wins) else "beyond the sizes measured"
        print(f"break-even {name}: {where}")
    load1, load5, _ = os.getloadavg()
    print(f"load average after: {load1:.2f} {load5:.2f}")


if __name__ == "__main__":
    main()
