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
of a gradient, which nothing else reads) and, as a design measurement,
into zeros it never fills (each row's first value written, not added;
not adopted), in interleaved rounds, medians
(`timing.compare`).  Also the serial kernels against Numba `prange`
variants of them (the gather's rows in one chunk per thread; the
scatter-add split by the output rows each thread owns, every thread
reading every id, no atomics), the measurement behind running them
serially.  Prints
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


@numba.njit(nogil=True)
def take_chunk(x, idx, out, n, inner, lo, hi):
    # ids [lo, hi) of `R.take`'s rows (outer 1), offsets unsigned as its
    for k in range(lo, hi):
        j = idx[k] + n if idx[k] < 0 else idx[k]
        s, t = np.uint64(j * inner), np.uint64(k * inner)
        for i in range(np.uint64(inner)):
            out[t + i] = x[s + i]


@numba.njit(parallel=True, nogil=True)
def take_parallel(x, idx, out, n, inner, tasks):
    m = idx.shape[0]
    for c in prange(tasks):
        take_chunk(x, idx, out, n, inner, c * m // tasks, (c + 1) * m // tasks)


@numba.njit(nogil=True)
def scatter_rows_owned(out, idx, values, n, inner, lo, hi):
    # the adds into output rows [lo, hi), in the order of idx: no two
    # tasks meet, and each element's sum is the serial one's
    for k in range(idx.shape[0]):
        j = idx[k] + n if idx[k] < 0 else idx[k]
        if j >= lo and j < hi:
            s, t = np.uint64(k * inner), np.uint64(j * inner)
            for i in range(np.uint64(inner)):
                out[t + i] += values[s + i]


@numba.njit(parallel=True, nogil=True)
def scatter_parallel_rows(out, idx, values, n, inner, tasks):
    for c in prange(tasks):
        scatter_rows_owned(out, idx, values, n, inner, c * n // tasks, (c + 1) * n // tasks)


@numba.njit(nogil=True)
def scatter_unfilled(out, idx, values, n, inner):
    # the zeros never filled: out uninitialized, each row's first value
    # written as 0.0 + v (the bits an add into zeros gives: +0.0 for
    # -0.0), later ones added, rows no id names zeroed at the end
    seen = np.zeros(n, np.bool_)
    for k in range(idx.shape[0]):
        j = idx[k] + n if idx[k] < 0 else idx[k]
        s, t = np.uint64(k * inner), np.uint64(j * inner)
        if seen[j]:
            for i in range(np.uint64(inner)):
                out[t + i] += values[s + i]
        else:
            seen[j] = True
            for i in range(np.uint64(inner)):
                out[t + i] = 0.0 + values[s + i]
    for j in range(n):
        if not seen[j]:
            t = np.uint64(j * inner)
            for i in range(np.uint64(inner)):
                out[t + i] = 0.0


def variants() -> dict[str, dict]:
    d = workloads.indexing_inputs(10_000, 64, 20_000, 10**6, 100)
    table, ids, rows, values, seg = d["table"], d["ids"], d["rows"], d["values"], d["segment_ids"]
    tasks = numba.get_num_threads()
    return {
        "gather 20k rows of 64 (embedding)": {
            "ours": lambda: R.take(table, ids, 0, "ids"),
            # as ours: into a new array
            "unchecked": lambda: take_unchecked(table.reshape(1, -1, 64), ids,
                                                np.empty((1, 20_000, 64))),
            "check pass": lambda: first_out_of_range(ids, 10_000),
            "prange": lambda: take_parallel(table.reshape(-1), ids, np.empty(20_000 * 64),
                                            10_000, 64, tasks),
            "numpy": lambda: np.take(table, ids, axis=0),
        },
        "scatter-add 20k rows of 64 (its gradient)": {
            "ours": lambda: R.scatter_add(np.zeros_like(table), ids, rows, 0, "ids"),
            "in place": lambda: R.scatter_add(np.zeros_like(table), ids, rows, 0, "ids",
                                              owned=True),
            # the fill skipped (no check; "in place" checks): 0.82-0.86x of "in
            # place" here, but 1.5x for 100 ids into 100,000 rows of 64, memset's
            # streaming stores beating its zeroing loop (paired, scratch timings)
            "unfilled": lambda: scatter_unfilled(np.empty(10_000 * 64), ids, rows.reshape(-1),
                                                 10_000, 64),
            # as ours: zeros, then the copy of the base the result starts from
            "unchecked": lambda: scatter_unchecked(np.array(np.zeros((1, 10_000, 64))), ids,
                                                   rows.reshape(1, -1, 64)),
            "check pass": lambda: first_out_of_range(ids, 10_000),
            "prange": lambda: scatter_parallel_rows(np.array(np.zeros(10_000 * 64)), ids,
                                                    rows.reshape(-1), 10_000, 64, tasks),
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
    columns = ["ours", "in place", "unfilled", "unchecked", "check pass", "prange", "numpy"]
    rows = []
    for name, impls in variants().items():
        t = compare(impls, rounds)
        rows.append([name] + [ms(t[c].median) if c in t else "-" for c in columns])
    print(markdown_table(["workload (ms per call)"] + columns, rows))
    print(f"\nload average: {load_average()}; {numba.get_num_threads()} Numba threads")


if __name__ == "__main__":
    main()
