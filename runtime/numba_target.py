"""Numba's CPU target, prepared with only what gradc's generated code uses.

Contract: inside `lean_target()`, a compile prepares Numba's CPU target
with only the implementation modules that generated kernels and the
runtime's helpers call (scalars, tuples, ranges, slices, arrays, math),
not the others Numba loads: NumPy's array math and linear algebra
(`numba.np.arraymath`, which imports SciPy's BLAS bindings where SciPy is
installed), polynomials, random numbers, strings, typed containers,
lists, sets, dates, jitclasses, and third-party extensions (entry
points).  The context holds Numba's compiler lock, so no other thread
compiles meanwhile.  What the target holds is only ever added to: the
next compile outside the context (a user's own `numba.njit` function)
prepares the whole target, as Numba always does, so the rest of the
process sees all of Numba.

Why: Numba prepares its whole target before the first compile of a
process, 0.2-0.5 s of imports (most of it SciPy's linear algebra) and of
installing what they register (each method template refreshes the target
once more); in a cold process that was a fifth to a third of the time to
a first gradient.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

from numba.core.compiler_lock import global_compiler_lock
from numba.core.registry import cpu_target
from numba.core.runtime import rtsys

# The heaviest module of Numba's full preparation: once imported, the
# whole target has been prepared (or is being prepared).
_WHOLE_TARGET_MARK = "numba.np.arraymath"


def _prepare_lean(context) -> None:
    """`CPUContext.load_additional_registries` (numba/core/cpu.py) for what
    generated code calls: scalars, tuples, ranges, slices, arrays, math."""
    rtsys.initialize(context)
    from numba.core import inline_closurecall, optional  # noqa: F401
    from numba.cpython import (builtins, iterators, numbers, rangeobj,  # noqa: F401
                               slicing, tupleobj)
    from numba.np import arrayobj  # noqa: F401
    from numba.np.unsafe import ndarray  # noqa: F401 (Numba's fix for its issue 8940)

    from numba.cpython import mathimpl
    from numba.np import npyimpl
    for registry in (mathimpl.registry, npyimpl.registry):
        context.install_registry(registry)


@contextmanager
def lean_target() -> Iterator[None]:
    """Compiles inside prepare the CPU target lean (nothing changes once
    the whole target has been prepared)."""
    with global_compiler_lock:
        context = cpu_target.target_context
        # prepared whole already, or lean already: a compile inside another
        # (a kernel typing a call to a dispatcher not yet compiled), which
        # must leave the outer compile's preparation in place
        if sys.modules.get(_WHOLE_TARGET_MARK) is not None or \
                "load_additional_registries" in vars(context):
            yield
            return
        context.load_additional_registries = lambda: _prepare_lean(context)
        try:
            yield
        finally:
            del context.load_additional_registries
