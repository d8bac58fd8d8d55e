"""What the CPU gathers' and scatter-adds' bounds checks cost, and why they
run serially: the design measurement behind `runtime.cpu.take` and
`scatter_add` (the suite, `benchmarks/run.py --only indexing`, times them
against NumPy, JAX and PyTorch on the same inputs).

    python benchmarks/bench_indexing.py [--rounds 9]

Three workloads: an embedding lookup (gather rows of a 10,000 x 64 table
by 20,000 ids), its gradient (scatter-add the rows back, ids repeated),
and a 1-d segment sum (10^6 values into 100 segments).  For each: ours
(`R.take`, `R.scatter_add`: the kernel checks each index as it reads it),
the same kernel with the check taken out (copied here, into a new array
as ours), a separate check
pass (the other design: one serial pass over the ids before the kernel),
and NumPy (`np.take`, `np.add.at`); for a scatter-add also ours adding
into its base in place (`owned=True`: what a driver does with the zeros
of a gradient, which nothing else reads), in interleaved rounds, medians
(`timing.compare`).  Also the serial kernels against Numba `prange`
variants of them (rows of the gather; disjoint column lanes of the
scatter-add), the measurement behind running them serially.  Prints
milliseconds per call and the load average (timings on a shared machine
are noisy).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numba
import numpy as np
from numba import prange

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads  # noqa: E402
from timing import compare, load_average, markdown_table, ms  # noqa: E402

from gradlang.runtime import cpu as R  # noqa: E402


@numba.njit(nogil=True)
def take_unchecked(x, idx, out):
    n, inner = x.shape[1], x.shape[2]
    for k in range(idx.shape[0]):
        j = idx[k] + n if idx[k] < 0 else idx[k]
        for o in range(x.shape[0]):
            if inner == 1:
                out[o, k, 0] = x[o, j, 0]
            else:
                for i in range(inner):
                    out[o, k, i] = x[o, j, i]


@numba.njit(nogil=True)
def scatter_unchecked(out, idx, values):
    n, inner = out.shape[1], out.shape[2]
    for k in range(idx.shape[0]):
        j = idx[k] + n if idx[k] < 0 else idx[k]
        for o in range(out.shape[0]):
            if inner == 1:
                out[o, j, 0] += values[o, k, 0]
            else:
                for i in range(inner):
                    out[o, j, i] += values[o, k, i]


@numba.njit(nogil=True)
def first_out_of_range(idx, n):
    for k in range(idx.shape[0]):
        if idx[k] < -n or idx[k] >= n:
            return k
    return -1


@numba.njit(parallel=True, nogil=True)
def take_parallel(x, idx, out):
    n = x.shape[1]
    for k in prange(idx.shape[0]):
        j = idx[k] + n if idx[k] < 0 else idx[k]
        for o in range(x.shape[0]):
            for i in range(x.shape[2]):
                out[o, k, i] = x[o, j, i]


@numba.njit(parallel=True, nogil=True)
def scatter_parallel_lanes(out, idx, values, width):
    # lane c owns columns [c * width, (c + 1) * width): no two lanes meet
    n, inner = out.shape[1], out.shape[2]
    for c in prange(-(-inner // width)):
        for k in range(idx.shape[0]):
            j = idx[k] + n if idx[k] < 0 else idx[k]
            for i in range(c * width, min(inner, (c + 1) * width)):
                out[0, j, i] += values[0, k, i]


def variants() -> dict[str, dict]:
    d = workloads.indexing_inputs(10_000, 64, 20_000, 10**6, 100)
    table, ids, rows, values, seg = d["table"], d["ids"], d["rows"], d["values"], d["segment_ids"]
    lanes = max(1, 64 // (4 * numba.get_num_threads()))
    return {
        "gather 20k rows of 64 (embedding)": {
            "ours": lambda: R.take(table, ids, 0, "ids"),
            # as ours: into a new array
            "unchecked": lambda: take_unchecked(table.reshape(1, -1, 64), ids,
                                                np.empty((1, 20_000, 64))),
            "check pass": lambda: first_out_of_range(ids, 10_000),
            "prange": lambda: take_parallel(table.reshape(1, -1, 64), ids,
                                            np.empty((1, 20_000, 64))),
            "numpy": lambda: np.take(table, ids, axis=0),
        },
        "scatter-add 20k rows of 64 (its gradient)": {
            "ours": lambda: R.scatter_add(np.zeros_like(table), ids, rows, 0, "ids"),
            "in place": lambda: R.scatter_add(np.zeros_like(table), ids, rows, 0, "ids",
                                              owned=True),
            # as ours: zeros, then the copy of the base the result starts from
            "unchecked": lambda: scatter_unchecked(np.array(np.zeros((1, 10_000, 64))), ids,
                                                   rows.reshape(1, -1, 64)),
            "check pass": lambda: first_out_of_range(ids, 10_000),
            "prange": lambda: scatter_parallel_lanes(np.array(np.zeros((1, 10_000, 64))), ids,
                                                     rows.reshape(1, -1, 64), max(8, lanes)),
            "numpy": lambda: np.add.at(np.zeros_like(table), ids, rows),
        },
        "segment sum of 1e6 values into 100": {
            "ours": lambda: R.scatter_add(np.zeros(100), seg, values, 0, "seg"),
            "in place": lambda: R.scatter_add(np.zeros(100), seg, values, 0, "seg", owned=True),
            "unchecked": lambda: scatter_unchecked(np.array(np.zeros((1, 100, 1))), seg,
                                                   values.reshape(1, -1, 1)),
            "check pass": lambda: first_out_of_range(seg, 100),
            "numpy": lambda: np.add.at(np.zeros(100), seg, values),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    rounds = parser.parse_args().rounds
    columns = ["ours", "in place", "unchecked", "check pass", "prange", "numpy"]
    rows = []
    for name, impls in variants().items():
        t = compare(impls, rounds)
        rows.append([name] + [ms(t[c].median) if c in t else "-" for c in columns])
    print(markdown_table(["workload (ms per call)"] + columns, rows))
    print(f"\nload average: {load_average()}; {numba.get_num_threads()} Numba threads")


if __name__ == "__main__":
    main()
