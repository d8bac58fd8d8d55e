"""Where the `.grad` standard library lives, and the functions it defines.

Contract: `STDLIB` is the directory of the standard library's files (the
last place `import` looks, `compiler/modules.py`); `std_functions()` is the
set of function names `std.grad` defines, read once, for the checker's hint
at a call of one without its import (`softmax(x)` needs `from std import
softmax`); `in_library(file)` tells a span's file is one of them (its
errors are the user's call's: `compiler.lower`).
"""
from __future__ import annotations

import functools
from pathlib import Path

from gradlang.compiler.parser import parse

STDLIB = Path(__file__).resolve().parent / "stdlib"


@functools.lru_cache(maxsize=1)
def std_functions() -> frozenset[str]:
    std = STDLIB / "std.grad"
    return frozenset(f.name for f in parse(std.read_text(encoding="utf-8"), str(std)).funcs)


@functools.lru_cache(maxsize=64)
def in_library(file: str) -> bool:
    """Whether `file` (a span's) is a file of the standard library."""
    try:
        return Path(file).resolve().is_relative_to(STDLIB)
    except (OSError, ValueError):  # `<string>`, a name no file system holds
        return False
