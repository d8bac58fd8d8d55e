"""`import name` for `.grad` files.

Contract: `install_import_hook()` (idempotent) adds a finder to
`sys.meta_path` that, for an `import name` (or `pkg.name`) no other finder
resolves to a module (a directory `name/`, which Python would import as
an empty namespace package, does not count), looks for `name.grad` in each
`sys.path` directory (in each of the package's directories for `pkg.name`,
so a package's `from .name import f` finds its `name.grad`).  The
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

from gradlang.runtime.params import ParamsModule

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
        module.__class__ = ParamsModule
        for name, function in loaded.functions.items():
            if name not in namespace and not (name.startswith("__") and name.endswith("__")):
                namespace[name] = function


class GradFinder(importlib.abc.MetaPathFinder):
    """Finds `name.grad` for an `import name` (or `pkg.name`) that no other
    finder resolves to a module.  It sits before Python's path finder,
    since that one answers a name it finds no module for but a directory
    of (`model/` of checkpoints beside `model.grad`) with an empty
    namespace package, which would hide the file, where `model.py` would
    win; so it asks the finders after it first, and yields to any module
    they find (a `json.grad` never shadows `json`)."""

    def find_spec(self, fullname, path=None, target=None):
        # a package's submodule (`import pkg.model`, `from .model import f`
        # in pkg) is looked for in the package's directories only
        candidate = _grad_file(fullname.rpartition(".")[2], sys.path if path is None else path)
        if candidate is None or self._found_elsewhere(fullname, path, target):
            return None
        return importlib.machinery.ModuleSpec(fullname, _GradLoader(candidate),
                                              origin=str(candidate))

    def _found_elsewhere(self, fullname, path, target) -> bool:
        """Whether a finder after this one finds a module (not a namespace
        package) named `fullname`."""
        finders = sys.meta_path[sys.meta_path.index(self) + 1:] if self in sys.meta_path else ()
        for finder in finders:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                return not _is_namespace(spec)
        return False


def _is_namespace(spec) -> bool:
    """Whether `spec` is a namespace package (directories, no file)."""
    return spec.origin is None and spec.submodule_search_locations is not None


def _grad_file(name: str, directories):
    """The first `name.grad` in `directories` (`sys.path`, or a package's
    `__path__`), or None.  A name holding a path separator names no
    module (importlib.import_module("sub/model") or ("/any/path/model")
    loaded that file, outside every directory searched, as Python's
    finder, which looks a name up among a directory's entries, never does)."""
    if not name or os.sep in name or (os.altsep and os.altsep in name):
        return None
    for entry in list(directories):
        try:
            candidate = Path(os.fsdecode(entry) or ".") / f"{name}.grad"
            if candidate.is_file():
                return candidate
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
        position = next((i for i, f in enumerate(sys.meta_path)
                         if f is importlib.machinery.PathFinder), len(sys.meta_path))
        sys.meta_path.insert(position, _installed)
    return _installed
