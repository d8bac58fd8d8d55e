"""The runtime: loads generated kernel modules, runs drivers, and holds the
hand-written CPU kernels (reductions) the drivers call.

Importing it (`import dsl` does) sets `GOMP_SPINCOUNT=3000` unless the user
set it or `OMP_WAIT_POLICY`, and notes in `OPENMP_SPINNING` whether another
library had loaded GNU OpenMP before, with neither set (then
`parallelism.prefer_sleeping_threads` steers Numba off it).  It imports
nothing heavy: `import dsl` stays cheap."""
import os


def _gnu_openmp_loaded() -> bool:
    """Whether libgomp is mapped into this process (Linux; False elsewhere)."""
    try:
        with open("/proc/self/maps") as maps:
            return any("/libgomp" in line for line in maps)
    except OSError:
        return False


# Numba's OpenMP workers spin for a while after each parallel kernel (GNU
# libgomp: 300,000 rounds), and with few cores they then hold the cores that
# NumPy's BLAS threads need: the dense benchmark's matmuls ran at two-thirds
# speed after its kernel, a prange kernel and a 256 x 256 product called
# alternately took 8 ms for 0.7 of work (`benchmarks/bench_threads.py`).  A
# short spin still catches the next kernel of a driver; passive waiting (no
# spin) made 1e5-element kernels 40% slower.  libgomp reads this when it is
# first loaded: at Numba's first parallel kernel, or at `import torch`,
# which links it; so here, at `import dsl`, rather than at the first
# kernel.  A user's own setting (or wait policy) wins.  Where libgomp is
# already loaded with neither (`import torch` came first), it is too late
# for this: noted here, before this process loads it itself.
OPENMP_SPINNING = not any(name in os.environ for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")) \
    and _gnu_openmp_loaded()
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "3000")
