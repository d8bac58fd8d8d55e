"""`import name` for `.grad` files.

Contract: `install_import_hook()` (idempotent) adds a finder to
`sys.meta_path` that, for a top-level `import name` no other finder
resolves first, looks for `name.grad` in each `sys.path` directory.  The
module it makes holds `params`, `functions` (every function by name),
`grad_module` (the `dsl.load` module), `__file__`, and each function under
its own name unless the module uses that name itself (one of those, or a
dunder, which the import system reads: `def params(x)` cannot hide the
params, nor `def __getattr__(x)` become the module's attribute hook);
`from name import f` works, and `importlib.reload` replaces the functions
of the earlier load.  Errors in the file surface as `GradError` at import.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from pathlib import Path

_installed = None


class _GradLoader(importlib.abc.Loader):
    def __init__(self, path: Path):
        self.path = path

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module) -> None:
        from dsl.api import load
        from dsl.function import GradFn
        loaded = load(self.path)
        namespace = vars(module)
        for name in [n for n, value in namespace.items() if isinstance(value, GradFn)]:
            del namespace[name]  # an earlier load's (importlib.reload)
        namespace.update(__file__=str(self.path), params=loaded.params, grad_module=loaded,
                         functions=loaded.functions)
        for name, function in loaded.functions.items():
            if name not in namespace and not (name.startswith("__") and name.endswith("__")):
                namespace[name] = function


class GradFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if "." in fullname:
            return None
        for entry in sys.path:
            try:
                candidate = Path(os.fsdecode(entry) or ".") / f"{fullname}.grad"
                if candidate.is_file():
                    return importlib.machinery.ModuleSpec(
                        fullname, _GradLoader(candidate), origin=str(candidate))
            except (OSError, TypeError, ValueError):
                # (an entry no path names, as Python's own finder skips it: else
                # every failed import, a library's probe for an optional one
                # included, raised this TypeError instead of ImportError)
                continue
        return None


def install_import_hook() -> GradFinder:
    global _installed
    if _installed is None:
        _installed = GradFinder()
        sys.meta_path.append(_installed)
    return _installed
