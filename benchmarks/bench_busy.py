"""Parallel kernels on a busy machine: log1pexp value + gradient and the R1
penalty, timed with and without processes that each keep a core busy.

    python benchmarks/bench_busy.py [--rounds 7] [--busy 0 2] [--modes ...]

A `prange` kernel joins its threads at the end, so when another process
holds a core the call waits until the scheduler gives its worker thread a
turn there: on 2 cores with 2 busy processes, R1 at 10^5 took 0.3-0.4 ms
in parallel against 0.09-0.14 serially (OpenMP layer; the benchmark
suite once saw 5 ms beside other test suites).
This script reproduces that: each round runs every `--busy` setting in
turn (who goes first rotating), starting that many spinning processes
(`while True: pass`), each pinned to one core, round robin, killed before
the next setting and on any exit; within a setting every (case, mode) is
timed once, a batch of calls at least `SAMPLE_SECONDS` long (as long on
a quiet machine), the modes of a case back to back in an order that
rotates.  The figures are medians over the rounds, in ms per call, with
the 1-minute load average read at the end of each setting's samples (the
median over the rounds); then, for each mode, the median over the rounds
of its time over `always`'s in the same round, which cancels load that
comes and goes between rounds.

Modes:
  auto      GRADC_PARALLEL=auto: the runtime's own choice
            (`runtime.parallelism.parallel_allowed`)
  never     GRADC_PARALLEL=never: every loop's serial kernel
  always    GRADC_PARALLEL=always: the driver's size threshold alone, as
            before the busy-machine policy
The first line printed names Numba's threading layer; to compare layers,
run it again with NUMBA_THREADING_LAYER=omp, workqueue or tbb (`pip
install tbb`) in the environment.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numba
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import workloads  # noqa: E402
from gradlang.runtime import parallelism  # noqa: E402
from timing import calls_per_sample, per_call  # noqa: E402

SAMPLE_SECONDS = 0.05
SETTLE_SECONDS = 0.3  # after starting spinners, before timing: they are running
MODES = ("auto", "never", "always")


@contextmanager
def spinners(count: int) -> Iterator[None]:
    """`count` busy processes, the k-th pinned to core k mod cores."""
    cores = sorted(os.sched_getaffinity(0))
    procs = []
    try:
        for k in range(count):
            proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            procs.append(proc)
            os.sched_setaffinity(proc.pid, {cores[k % len(cores)]})
        time.sleep(SETTLE_SECONDS if count else 0)
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def use(setting: str) -> None:
    """GRADC_PARALLEL=setting from the next call on (not at the next recheck)."""
    os.environ["GRADC_PARALLEL"] = setting
    parallelism._next_check = 0.0


def cases() -> dict[str, Callable[[], object]]:
    rng = np.random.default_rng(0)
    log1pexp, r1 = workloads.dsl_log1pexp(), workloads.dsl_r1()
    found = {}
    for n in (16, 10**4, 10**5, 3 * 10**5, 10**6):
        x = rng.uniform(-20, 20, n)
        found[f"log1pexp n={n:.0e}" if n > 16 else "log1pexp n=16"] = lambda x=x: log1pexp(x)
    x, w = rng.normal(size=10**5), rng.normal(size=10**5)
    found["r1 n=1e+05"] = lambda: r1(x, w)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 2],
                        help="numbers of spinning processes to compare")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    args = parser.parse_args()
    calls = cases()
    for fn in calls.values():  # compile every variant before any timing
        for name in args.modes:
            use(name)
            fn()
    print(f"threading layer {numba.threading_layer()}, numba threads "
          f"{numba.get_num_threads()}, usable cores {len(os.sched_getaffinity(0))}")
    batch = {label: calls_per_sample(fn, SAMPLE_SECONDS) for label, fn in calls.items()}
    samples: dict[tuple[str, int, str], list[float]] = {}
    loads: dict[int, list[float]] = {busy: [] for busy in args.busy}
    for r in range(args.rounds):
        first = r % len(args.busy)
        for busy in args.busy[first:] + args.busy[:first]:
            with spinners(busy):
                for label, fn in calls.items():
                    start = r % len(args.modes)
                    for name in args.modes[start:] + args.modes[:start]:
                        use(name)
                        samples.setdefault((label, busy, name), []).append(
                            per_call(fn, batch[label]))
                loads[busy].append(os.getloadavg()[0])
    header = f"{'case':<18} {'busy':>4} {'load':>5} " + " ".join(f"{m:>10}" for m in args.modes)
    print(header + "   (ms per call, medians)")
    for label in calls:
        for busy in args.busy:
            cells = " ".join(f"{statistics.median(samples[label, busy, m]) * 1e3:>10.4f}"
                             for m in args.modes)
            print(f"{label:<18} {busy:>4} {statistics.median(loads[busy]):>5.2f} {cells}")
    if "always" in args.modes:
        others = [m for m in args.modes if m != "always"]
        print(f"\n{'case':<18} {'busy':>4} " + " ".join(f"{m + '/always':>14}" for m in others)
              + "   (median of each round's ratio: samples taken back to back)")
        for label in calls:
            for busy in args.busy:
                cells = " ".join(f"{paired(samples, label, busy, m):>14.2f}" for m in others)
                print(f"{label:<18} {busy:>4} {cells}")


def paired(samples: dict, label: str, busy: int, mode: str) -> float:
    return statistics.median(a / b for a, b in zip(samples[label, busy, mode],
                                                   samples[label, busy, "always"]))

if __name__ == "__main__":
    main()
