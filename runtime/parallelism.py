"""Whether a CPU loop past its size threshold runs its parallel (`prange`)
kernel now, or its serial one because other work holds the cores.

A parallel kernel ends by joining its threads, so when another process
(or another thread) holds a core, the call waits until the scheduler
gives its worker a turn there: on 2 cores with 2 busy processes, R1 at
n = 1e5 took 4x as long in parallel as serially (`benchmarks/bench_busy.py`;
Numba's OpenMP layer).  So a driver asks `parallel_allowed(size,
threshold)` once a loop's size reaches its threshold (`cpu.parallel_threshold`;
smaller loops never call it, so small calls pay nothing): yes when a
core is free for each of Numba's threads, else only for a loop so long
(`BUSY_FACTOR` times its threshold) that the wait costs less than its
threads gain.

"Free" is read from the number of tasks the kernel reports runnable now
(`/proc/loadavg`'s fourth field, less this process's own running
threads; where that file is missing, the 1-minute load average less
one), at most every `RECHECK_SECONDS`, and compared with the cores this
process may run on: the load average alone trails a job that starts or
stops by a minute.

For `BLAS_SPIN_SECONDS` after one of our BLAS products (`blas_called`,
from `cpu.matmul`, for a float product large enough that OpenBLAS threads
it) the machine counts as busy under `auto`: OpenBLAS's workers spin on
the cores meanwhile.

`GRADC_PARALLEL` overrides it (read at each recheck): `auto` (or unset)
as above, `always` the size threshold alone, `never` serial kernels only.

A process forked after this one ran a parallel kernel on Numba's OpenMP
layer runs serial kernels only: GNU OpenMP cannot run in such a child,
and Numba terminates it at its first parallel kernel (a `multiprocessing`
worker forked after one large call died, and a `Pool` waited for it for
ever).

Numba's `workqueue` threading layer (its fallback where no OpenMP runtime
loads, as on a Mac without one, or a user's `NUMBA_THREADING_LAYER`)
aborts the process when two threads launch parallel kernels at once
("Concurrent access has been detected"), so under it only the main thread
runs parallel kernels; other threads (Dask's workers, a user's pool) run
the serial ones, whose bits are the same.

Beside PyTorch imported first, libgomp's idle workers spin with its
default count (`runtime`'s GOMP_SPINCOUNT comes too late) and slow a BLAS
product that follows our kernels (the attention benchmark 16-24 ms,
against 7-9 with `import dsl` first: `benchmarks/bench_threads.py`).
Workqueue's workers sleep, which cured that (8-9 ms), but it shares no
threads with torch: an elementwise kernel right after a torch op then
waited for torch's spinning workers (1.6x slower than on libgomp's, which
torch's op had just left), the commoner case in a training step, so the
layer stays Numba's choice and the README says to import dsl first.

Numba's TBB threading layer waits far less (a worker that has not
started when the others finish does no share of the loop: R1 at 1e5 in
parallel took 1.3x its serial time where OpenMP's took 4x), and Numba
prefers it where it can load it; a user may install it (`docs/language.md`
says how), but gradlang neither needs nor loads it.
"""
from __future__ import annotations

import math
import os
import threading
import time
import warnings
from functools import lru_cache

import numba

RECHECK_SECONDS = 0.5
# Under load a loop runs in parallel only from this many times its threshold
# (about a millisecond of serial work): there its threads' wait for a turn
# on a shared core costs less than they gain, each thread taking its share
# of a core (`benchmarks/bench_busy.py`, 2 cores, 2 busy processes: the
# parallel variant 3-6x slower at 1.5-3x the threshold, level at 15x,
# 1.2x faster at 150x).
BUSY_FACTOR = 32
SETTINGS = ("auto", "always", "never")

# OpenBLAS's workers spin for 2^28 cycles (about 0.1 s) after a product
# before they sleep, each holding a core: a parallel loop right after one
# of our products (`blas_called`) waits for a turn there, as on a busy
# machine.  The jvp of a vmap'd logistic loss at 10000 x 64 f64 (two
# matrix-vector products, then a loop over the rows) took 295 us with its
# loop in parallel, 170 serially (2 cores).
BLAS_SPIN_SECONDS = 0.1

_next_check = 0.0
_scale = 1.0  # parallel_from's last answer
_auto = True  # whether that was under GRADC_PARALLEL=auto
_blas_until = 0.0  # till when our last product's BLAS workers spin
_forked_from_openmp = False  # forked from a process whose OpenMP threads ran
# the one thread that may launch parallel kernels (workqueue's main thread),
# 0 for any, None until the first long loop asks (the layer is known then)
_launcher: "int | None" = None


def parallel_from(setting: str, others: float, cores: int, threads: int) -> float:
    """The multiple of a loop's threshold from which it runs in parallel when
    `others` other tasks are runnable on a machine of which this process
    may use `cores`, for a parallel kernel of `threads` threads, under
    GRADC_PARALLEL=`setting`: 1 when a core is free for every thread (or
    under `always`), `BUSY_FACTOR` when not, infinity under `never`."""
    if setting == "never":
        return math.inf
    if setting == "always" or others + threads <= cores:
        return 1.0
    return float(BUSY_FACTOR)


def parallel_allowed(size: int, threshold: int) -> bool:
    """Whether a loop of `size` elements, whose parallel kernel pays from
    `threshold` on a quiet machine (`size` >= `threshold`), runs it now."""
    global _next_check, _scale, _auto
    now = time.monotonic()
    if now >= _next_check:
        _next_check = now + RECHECK_SECONDS
        setting = "never" if _forked_from_openmp else \
            _setting(os.environ.get("GRADC_PARALLEL", ""))
        _auto = setting == "auto"
        _scale = parallel_from(setting, _runnable_others(), _cores(),
                               # (not get_num_threads(), which starts the pool)
                               numba.config.NUMBA_NUM_THREADS)
    if _auto and now < _blas_until:  # a core held by BLAS's spinning workers
        return size >= threshold * max(_scale, BUSY_FACTOR) and _may_launch()
    return size >= threshold * _scale and _may_launch()


def _may_launch() -> bool:
    """Whether this thread may launch a parallel kernel: any may on a
    thread-safe layer, only the main thread on workqueue."""
    global _launcher
    if _launcher is None:
        numba.get_num_threads()  # starts the pool, which settles the layer
        _launcher = (threading.main_thread().ident if numba.threading_layer() == "workqueue"
                     else 0)
    return _launcher == 0 or threading.get_ident() == _launcher


def blas_called() -> None:
    """Note a BLAS call of ours (`runtime.cpu.matmul`): for
    `BLAS_SPIN_SECONDS` loops run as on a busy machine."""
    global _blas_until
    _blas_until = time.monotonic() + BLAS_SPIN_SECONDS


@lru_cache(maxsize=None)  # read at each recheck; said once
def _setting(text: str) -> str:
    if text == "":
        return "auto"
    if text not in SETTINGS:
        warnings.warn(f"GRADC_PARALLEL={text!r} is not one of {', '.join(SETTINGS)}; "
                      "using auto", RuntimeWarning, stacklevel=2)
        return "auto"
    return text


def _runnable_others() -> float:
    """Tasks runnable now besides this process's own threads (the last
    kernel's workers may still be spinning); 0 where nothing tells."""
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
        return max(0, running - _own_running())
    except (OSError, IndexError, ValueError):
        pass
    try:
        return max(0.0, os.getloadavg()[0] - 1)
    except (AttributeError, OSError):
        return 0


def _own_running() -> int:
    """This process's threads running or runnable now (at least the caller)."""
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                # the state follows the command, which is in parentheses
                count += f.read().rpartition(")")[2].split()[0] == "R"
        except (OSError, IndexError):
            pass  # a thread that has just ended
    return max(1, count)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _after_fork_in_child() -> None:
    global _forked_from_openmp, _next_check, _launcher
    try:
        _forked_from_openmp = _forked_from_openmp or numba.threading_layer() == "omp"
    except ValueError:  # no parallel kernel has run: the child starts a pool of its own
        pass
    _next_check = 0.0  # decided again at the child's next long loop
    _launcher = None  # (its main thread is the one that forked)


if hasattr(os, "register_at_fork"):  # (POSIX)
    os.register_at_fork(after_in_child=_after_fork_in_child)
