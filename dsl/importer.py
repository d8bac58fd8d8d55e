"""`import name` for `.grad` files.

Contract: `install_import_hook()` (idempotent) adds a finder to
`sys.meta_path` that, for a top-level `import name` no other finder
resolves first, looks for `name.grad` in each `sys.path` directory.  The
module it makes holds the file's functions (callable, differentiable with
`dsl.grad`), `params`, and `__file__`; `from name import f` works.  Errors
in the file surface as `GradError` at import.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
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
        loaded = load(self.path)
        module.__file__ = str(self.path)
        module.params = loaded.params
        module.grad_module = loaded
        for name, function in loaded.functions.items():
            setattr(module, name, function)


class GradFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if "." in fullname:
            return None
        for entry in sys.path:
            candidate = Path(entry or ".") / f"{fullname}.grad"
            try:
                if candidate.is_file():
                    return importlib.machinery.ModuleSpec(
                        fullname, _GradLoader(candidate), origin=str(candidate))
            except OSError:
                continue
        return None


def install_import_hook() -> GradFinder:
    global _installed
    if _installed is None:
        _installed = GradFinder()
        sys.meta_path.append(_installed)
    return _installed
