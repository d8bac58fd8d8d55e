import os
import sys

import pytest

# Every interpreter the tests start (a worker per core, and dozens of
# subprocesses that import numba, some torch or jax) reads bytecode where
# there is some and else compiles the sources it imports again: under
# PYTHONDONTWRITEBYTECODE (set on the CI machine), with the venv installed
# `--no-compile`, there never was any, and each paid again (a second per
# process for numba's modules, 2 s for torch's).
# The first process to import a module now writes it for the others.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# CPython's frame stack grows without a system call at every chunk's edge
# (see there: a tenth of a cold run's time).
from frame_stack import keep_frame_chunks  # noqa: E402

keep_frame_chunks()

# Verify the IR between every compiler stage during tests.
os.environ.setdefault("GRADC_VERIFY", "1")

# Numba keeps machine code beside each kernel module, in GRADC_CACHE_DIR,
# where the tests of the cache look for it (a fresh GRADC_CACHE_DIR is then
# a cold run).
os.environ.pop("NUMBA_CACHE_DIR", None)

# CUDA tests run on a real GPU when there is one, else on Numba's simulator
# (decided before anything imports numba).
if not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

# JAX on a GPU takes three quarters of its memory at its first array, in
# every worker: the CUDA tests' own allocations then fail.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    # The simulator runs a block as one Python thread per CUDA thread while
    # the launching thread polls them in a loop; handing the GIL over every
    # 0.5 ms instead of every 5 ms lets the block threads run instead of the
    # poll (a third off the time of a simulated launch).
    sys.setswitchinterval(5e-4)


@pytest.fixture
def gradc_parallel(monkeypatch):
    """`use(value)`: GRADC_PARALLEL=value from the next driver call on, for
    this test only.  Under the default (`auto`) a loop past its threshold
    takes its serial kernel whenever the machine is busy (as it is under
    two test workers), so a test of a parallel kernel pins `always`; the
    policy's last answer is restored with its recheck time, else a test's
    `never` kept the next test's loops serial for up to half a second."""
    from gradlang.runtime import parallelism

    def use(value: str) -> None:
        monkeypatch.setenv("GRADC_PARALLEL", value)
        monkeypatch.setattr(parallelism, "_scale", parallelism._scale)
        monkeypatch.setattr(parallelism, "_next_check", 0.0)
        # (nor does an earlier test's product make this one's loops serial)
        monkeypatch.setattr(parallelism, "_blas_until", 0.0)
    return use


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """An xdist worker ends here, without the interpreter's shutdown.

    By now the worker has sent the controller every report and its
    `workerfinished` (at sessionfinish, written and flushed to the pipe),
    and the controller waits for each worker's process to exit before it
    exits itself: a worker's shutdown (JAX's and torch's exit handlers,
    then freeing a million objects and every extension's globals) took
    2-5 s after the last test, 11 s of a cold run's wall time between its
    last test and its end.  Nothing the tests check runs then (the kernel
    cache and Hypothesis's database are written as they go).  Only in a
    worker: a single process (`-n 0`) exits as Python does."""
    if hasattr(config, "workerinput"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
