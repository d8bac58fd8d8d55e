"""The runtime: loads generated kernel modules, runs drivers, and holds the
hand-written CPU kernels (reductions) the drivers call."""
