"""Loading generated code.

Contract: `load_kernels(source)` writes a kernel module to the cache
directory under a name derived from its content hash (atomically, so
concurrent processes never see a torn file) and imports it once per
process; Numba's `cache=True` then keeps the machine code beside it, so a
second process with the same kernels compiles nothing.  `make_driver`
turns a driver's source into a callable bound to that module.

The cache directory is `$GRADC_CACHE_DIR`, else `$XDG_CACHE_HOME/gradc`,
else `~/.cache/gradc`.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType
from typing import Callable

import numpy as np

_lock = threading.Lock()
_modules: dict[str, ModuleType] = {}


def cache_dir() -> Path:
    root = os.environ.get("GRADC_CACHE_DIR")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gradc"


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text() == text:
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".py")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def load_kernels(source: str) -> ModuleType:
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    with _lock:
        module = _modules.get(digest)
        if module is not None:
            return module
        name = f"gradk_{digest}"
        path = cache_dir() / "kernels" / f"{name}.py"
        _write_atomic(path, source)
        module = _modules[digest] = _import_file(name, path)
        return module


def load_kernel_file(path: str) -> ModuleType:
    """Import a kernel module that lives at `path` (a compiled module's
    sibling), once per process."""
    key = os.path.abspath(path)
    with _lock:
        module = _modules.get(key)
        if module is None:
            name = "gradk_aot_" + hashlib.sha256(key.encode()).hexdigest()[:16]
            module = _modules[key] = _import_file(name, key)
        return module


def _import_file(name: str, path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def make_driver(driver_source: str, kernels: ModuleType, helpers: ModuleType) -> Callable:
    namespace = {"np": np, "K": kernels, "R": helpers, "inf": np.inf, "nan": np.nan}
    exec(compile(driver_source, "<gradc driver>", "exec"), namespace)
    return namespace["run"]
