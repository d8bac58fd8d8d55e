"""What three savings leave out of a cold first gradient: the lean
compile context's (`runtime/numba_target.py`: typing refreshes that would
install nothing, function passes on declarations) and parsing only the
cpu_math helpers a kernel calls (`runtime/branch_free.py`, not all of
cpu_math): the figures in docs/internals.md.

    python benchmarks/bench_lean_compile.py [--rounds 6]

Each sample is a fresh process with empty caches that loads an example and
computes its first gradient (the bodies of `startup.py`), timed in CPU
seconds after the imports (CPU time: a 2-core machine shared with other
work stalls a process's wall clock far more than its CPU time).  "as is"
is the runtime as it is; "without" the same process with those two parts
of `lean_target` replaced by contexts that do nothing, and each helper
found among its whole file's definitions.  The two run interleaved,
`--rounds` times each; medians, and the median of the rounds' own
differences.  Each sample also reports a hash of its
optimized LLVM modules, which must agree between the two.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from startup import FUNCTIONS, run_cold  # noqa: E402
from timing import load_average, markdown_table  # noqa: E402

MEASURED = """
import hashlib, time
{imports}
if {without}:
    import contextlib
    from gradlang.runtime import numba_target
    numba_target._typing_refreshed_when_grown = contextlib.nullcontext
    numba_target._definitions_optimized = contextlib.nullcontext
    from gradlang.runtime import branch_free
    branch_free._definition = lambda fn: branch_free._definitions(
        fn.__code__.co_filename).get(fn.__code__.co_firstlineno)
from numba.core import codegen
modules = hashlib.sha256()
finalize = codegen.CPUCodeLibrary._finalize_final_module
def hashed(library):
    modules.update(str(library._final_module).encode())
    finalize(library)
codegen.CPUCodeLibrary._finalize_final_module = hashed
start = time.process_time()
{work}
print(time.process_time() - start, modules.hexdigest()[:12])
"""


def sample(body: str, without: bool) -> tuple[float, str]:
    """(CPU s of the first gradient after the imports, its modules' hash)."""
    seconds, modules = run_cold(MEASURED, body, without=without).split()
    return float(seconds), modules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    load_before = load_average()
    rows = []
    for name, (dsl_body, _) in FUNCTIONS.items():
        as_is, without, modules = [], [], set()
        for round_ in range(args.rounds):
            for leave_out in (round_ % 2 == 0, round_ % 2 == 1):  # alternating order
                seconds, hashed = sample(dsl_body, leave_out)
                (without if leave_out else as_is).append(seconds)
                modules.add(hashed)
        saved = [w - a for w, a in zip(without, as_is)]
        rows.append([name, f"{statistics.median(without) * 1e3:.0f}",
                     f"{statistics.median(as_is) * 1e3:.0f}",
                     f"{statistics.median(saved) * 1e3:.0f}",
                     "yes" if len(modules) == 1 else f"no ({len(modules)} hashes)"])
    print(markdown_table(["function", "without ms", "as is ms", "saved ms (median of rounds)",
                          "same optimized modules"], rows))
    print(f"\n{args.rounds} rounds; load average {load_before} at the start, "
          f"{load_average()} at the end")


if __name__ == "__main__":
    main()
