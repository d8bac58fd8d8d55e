"""Numba's CPU target, prepared with only what gradc's generated code uses.

Contract: inside `lean_target()`, a compile prepares Numba's CPU target
with every implementation module Numba would load except those that
generated kernels and the runtime's helpers never call: NumPy's array math
and linear algebra (`numba.np.arraymath`, which imports SciPy's BLAS
bindings where SciPy is installed), NumPy's polynomials, and character
sequences (with Numba's whole unicode implementation), and third-party
extensions (entry points).  The context holds
Numba's compiler lock, so no other thread compiles meanwhile.  What the
target holds is only ever added to: the next compile outside the context
(a user's own `numba.njit` function) prepares the whole target, as Numba
always does, so the rest of the process sees all of Numba.

Why: Numba prepares its whole target before the first compile of a
process, 0.15-0.4 s of imports, most of it SciPy's linear algebra; in a
cold process that was a fifth of the time to a first gradient.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

from numba.core.compiler_lock import global_compiler_lock
from numba.core.registry import cpu_target
from numba.core.runtime import rtsys

# What Numba's full preparation imports and these skip (it imports them
# only to register what they implement; nothing of gradc's needs them).
UNUSED_MODULES = ("numba.np.arraymath", "numba.np.linalg", "numba.np.polynomial",
                  "numba.cpython.charseq", "numba.cpython.unicode")


def _prepare_lean(context) -> None:
    """`CPUContext.load_additional_registries` (numba/core/cpu.py), less the
    imports of UNUSED_MODULES and of third-party extensions."""
    rtsys.initialize(context)
    from numba.core import inline_closurecall, optional  # noqa: F401
    from numba.cpython import (builtins, enumimpl, hashing, heapq,  # noqa: F401
                               iterators, listobj, numbers, rangeobj, setobj, slicing,
                               tupleobj)
    from numba.experimental import function_type, jitclass  # noqa: F401
    from numba.misc import gdb_hook, literal  # noqa: F401
    from numba.np import arrayobj, npdatetime  # noqa: F401
    from numba.np.unsafe import ndarray  # noqa: F401 (Numba's fix for its issue 8940)
    from numba.np.random import generator_core, generator_methods, legacy  # noqa: F401
    from numba.np.types import datetime_registry  # noqa: F401
    from numba.typed import dictimpl, listobject, setobject  # noqa: F401
    from numba.typed import typeddict, typedlist, typedset  # noqa: F401

    from numba.cpython import cmathimpl, mathimpl, printimpl, randomimpl
    from numba.experimental.jitclass.base import ClassBuilder
    from numba.misc import cffiimpl
    from numba.np import npyimpl
    for registry in (cmathimpl.registry, cffiimpl.registry, mathimpl.registry,
                     npyimpl.registry, printimpl.registry, randomimpl.registry,
                     ClassBuilder.class_impl_registry):
        context.install_registry(registry)


@contextmanager
def lean_target() -> Iterator[None]:
    """Compiles inside prepare the CPU target without UNUSED_MODULES
    (nothing changes once the whole target has been prepared)."""
    with global_compiler_lock:
        if sys.modules.get(UNUSED_MODULES[0]) is not None:  # prepared whole already
            yield
            return
        context = cpu_target.target_context
        context.load_additional_registries = lambda: _prepare_lean(context)
        try:
            yield
        finally:
            del context.load_additional_registries
