import os

# Verify the IR between every compiler stage during tests.
os.environ.setdefault("GRADC_VERIFY", "1")

# CUDA tests run on a real GPU when there is one, else on Numba's simulator
# (decided before anything imports numba).
if not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
