"""The runtime: loads generated kernel modules, runs drivers, and holds the
hand-written CPU kernels (reductions) the drivers call.

Importing it (`import dsl` does) sets `GOMP_SPINCOUNT=3000` unless the user
set it or `OMP_WAIT_POLICY`."""
import os

# Numba's OpenMP workers spin for a while after each parallel kernel (GNU
# libgomp: 300,000 rounds), and with few cores they then hold the cores that
# NumPy's BLAS threads need: the dense benchmark's matmuls ran at two-thirds
# speed after its kernel, a prange kernel and a 256 x 256 product called
# alternately took 8 ms for 0.7 of work (`benchmarks/bench_threads.py`).  A
# short spin still catches the next kernel of a driver; passive waiting (no
# spin) made 1e5-element kernels 40% slower.  libgomp reads this when it is
# first loaded: at Numba's first parallel kernel, or at `import torch`,
# which links it; so here, at `import dsl`, rather than at the first
# kernel.  A user's own setting (or wait policy) wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "3000")
