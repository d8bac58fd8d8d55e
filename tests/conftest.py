import os
import sys

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
