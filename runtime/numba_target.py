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

Two more things, inside the context, leave out work that changes nothing
(what is compiled is the same, bit for bit):

- Numba's typing context refreshes before each method template's first
  use (`_get_target_registry`: some 200 templates when a kernel first
  reads an array's attribute), importing and installing its registries
  every time.  Here a refresh is skipped while no registry it installed
  has gained a declaration since the last one ran (the registries are
  append-only lists, their loaders streams of what is new): 15-25 ms of
  CPU in a process's first compile.
- Numba runs its function passes on every function of a module it adds,
  with a pass builder each, declarations included (four fifths of a
  kernel's functions: the runtime's and the helpers' it calls); here on
  the definitions only, as a declaration has no body to optimize: 2-3 ms
  of CPU per kernel.
"""
from __future__ import annotations

import inspect
import sys
from contextlib import contextmanager
from typing import Iterator

from numba.core.codegen import CPUCodegen, JITCodeLibrary
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
    the whole target has been prepared), refresh its typing only when it
    has grown, and run function passes only where there is a body."""
    with global_compiler_lock, _typing_refreshed_when_grown(), _definitions_optimized():
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


# the number of declarations the typing context's registries held when its
# last refresh ended (None: none ended inside `lean_target` yet)
_typing_declarations_refreshed: "int | None" = None


def _typing_declarations(typing_context) -> int:
    return sum(len(registry.functions) + len(registry.attributes) + len(registry.globals)
               for registry in typing_context._registries)


@contextmanager
def _typing_refreshed_when_grown() -> Iterator[None]:
    """`typing_context.refresh()` runs only when a registry it installed
    has gained a declaration since the last run (under the compiler lock;
    nested, the outer one's stands).  A refresh can call itself (a method
    template it installs refreshes the target, which refreshes the typing
    context): the inner one runs too, until one has ended; what the outer
    one installs after that it took from its registries' streams before,
    which an inner one would not see again anyway."""
    typing_context = cpu_target.typing_context
    if "refresh" in vars(typing_context):
        yield
        return
    refresh_whole = typing_context.refresh

    def refresh() -> None:
        global _typing_declarations_refreshed
        # the same registries, no more declarations: nothing to install
        # (which registries `refresh` installs is fixed by its imports)
        if _typing_declarations(typing_context) == _typing_declarations_refreshed:
            return
        refresh_whole()
        _typing_declarations_refreshed = _typing_declarations(typing_context)
    typing_context.refresh = refresh
    try:
        yield
    finally:
        del typing_context.refresh


class _DefinitionsOptimized(JITCodeLibrary):
    """Numba's code library, its function passes (`add_ir_module`) run on
    the functions defined, not on the declarations (numba/core/codegen.py
    `CPUCodeLibrary._optimize_functions`, which builds a pass manager for
    each function of the module, declaration or not)."""

    def _optimize_functions(self, ll_module) -> None:
        ll_module.data_layout = self._codegen._data_layout
        for func in ll_module.functions:
            if not func.is_declaration:
                fpm, pb = self._codegen._function_pass_manager()
                with self._recorded_timings.record(f"Function passes on {func.name!r}", pb):
                    fpm.run(func, pb)


# Numba's function passes run through LLVM's new pass manager, which
# `_DefinitionsOptimized` drives (`_function_pass_manager()` gives the
# manager and its builder); a Numba on the legacy one (whose
# `_function_pass_manager(llvm_module)` takes the module) keeps its own.
_NEW_PASS_MANAGER = "llvm_module" not in inspect.signature(
    CPUCodegen._function_pass_manager).parameters


@contextmanager
def _definitions_optimized() -> Iterator[None]:
    """Libraries created inside (under the compiler lock) are
    `_DefinitionsOptimized`; nested, the outer one's setting stands."""
    codegen = cpu_target.target_context.codegen()
    if not _NEW_PASS_MANAGER or "_library_class" in vars(codegen):
        yield
        return
    codegen._library_class = _DefinitionsOptimized
    try:
        yield
    finally:
        del codegen._library_class
