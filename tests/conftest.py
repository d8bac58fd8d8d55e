import os
import sys

# Every interpreter the tests start (a worker per core, and dozens of
# subprocesses that import numba, some torch or jax) reads bytecode where
# there is some and else compiles the sources it imports again: under
# PYTHONDONTWRITEBYTECODE (set on the CI machine), with the venv installed
# `--no-compile`, there never was any, and each paid again (a second per
# process for numba's modules, 2 s for torch's).
# The first process to import a module now writes it for the others.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

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

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    # The simulator runs a block as one Python thread per CUDA thread while
    # the launching thread polls them in a loop; handing the GIL over every
    # 0.5 ms instead of every 5 ms lets the block threads run instead of the
    # poll (a third off the time of a simulated launch).
    sys.setswitchinterval(5e-4)
