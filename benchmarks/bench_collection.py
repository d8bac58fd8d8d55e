"""What pausing Python's garbage collector while kernels compile saves
(`runtime/collection.py`): the figures in its docstring.

    python benchmarks/bench_collection.py [--rounds 4]

Each sample is a fresh process with empty caches that loads an example and
computes its first gradient (the bodies of `startup.py`), timed in CPU
seconds, with the time spent in collections counted by `gc.callbacks`;
then a next step that allocates 200,000 lists, whose collections are
counted too (so that a cost the pause only moved would show).  "paused"
is the runtime as it is; "unpaused" the same process with the loader's
pause replaced by a context that does nothing.  The two run interleaved,
`--rounds` times each; medians.
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
import gc, time
spent = [0.0, 0.0]
def count(phase, info):
    if phase == "start":
        spent[1] = time.process_time()
    else:
        spent[0] += time.process_time() - spent[1]
gc.callbacks.append(count)
{imports}
if {unpaused}:
    import contextlib
    from gradlang.runtime import loader
    loader.collection_paused = contextlib.nullcontext
start, before = time.process_time(), spent[0]
{work}
first, in_first = time.process_time() - start, spent[0] - before
junk = [[i] for i in range(200_000)]
del junk
print(first, in_first, spent[0] - before)
"""


def sample(body: str, unpaused: bool) -> tuple[float, float, float]:
    """(CPU s of the first gradient, of it in collections, in collections
    with the next step's)."""
    first, in_first, with_next = map(float, run_cold(MEASURED, body, unpaused=unpaused).split())
    return first, in_first, with_next


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    load_before = load_average()
    samples: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for _ in range(args.rounds):
        for name, (dsl_body, _) in FUNCTIONS.items():
            for unpaused in (False, True):
                key = (name, "unpaused" if unpaused else "paused")
                samples.setdefault(key, []).append(sample(dsl_body, unpaused))
    rows = []
    for (name, how), runs in samples.items():
        medians = [statistics.median(column) * 1e3 for column in zip(*runs)]
        rows.append([name, how] + [f"{m:.0f}" for m in medians])
    print(markdown_table(["function", "collector", "first gradient CPU ms",
                          "in collections ms", "in collections with the next step ms"], rows))
    print(f"\n{args.rounds} rounds; load average {load_before} at the start, "
          f"{load_average()} at the end")


if __name__ == "__main__":
    main()
