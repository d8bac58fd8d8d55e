"""Source text -> `compiler.ast.Module`.

Contract: `parse(source, file)` returns a Module or raises `GradError` with
the span of the first problem; no other exception escapes for any input
text.  A module parsed once is kept in the cache directory
(`runtime.loader.store`), keyed by its text, its file name and the
versions of the parser (the compiler's and the runtime's code, the
grammar, lark, Python), so that a later process skips lark altogether
(loading its tables and building its lexer cost more than parsing), and
does not import it either: lark's half of the parser
(`compiler/lark_parser.py`: the grammar's tables, the transformer to the
AST, the syntax errors) is imported on the first module not stored
(8-12 ms).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import pickle
import sys
from pathlib import Path

import gradlang.compiler
import gradlang.grammar
import gradlang.runtime
from gradlang.compiler import ast
from gradlang.compiler.source import universal_newlines
from gradlang.runtime.loader import source_stamp, store, stored


def code_stamp() -> tuple[str, ...]:
    """The source stamps of the compiler, the runtime and the grammar: what
    decides a stored parse or program besides its own key."""
    return tuple(source_stamp(p) for p in (gradlang.compiler, gradlang.runtime,
                                           gradlang.grammar))


@functools.lru_cache(maxsize=1)
def lark_stamp() -> str:
    """lark's version, without importing lark: a hash of its package's
    `__init__.py`, which spells the version."""
    return hashlib.sha256(Path(importlib.util.find_spec("lark").origin).read_bytes()
                          ).hexdigest()[:24]


def parse(source: str, file: str = "<string>") -> ast.Module:
    """Parse `.grad` source text; raise GradError on any malformed input.
    Its line endings are read as Python reads them (`universal_newlines`)."""
    source = universal_newlines(source)
    key = repr(("ast", *code_stamp(), lark_stamp(), sys.version, file, source))
    data = stored("ast", key)
    if data is not None:
        try:
            module = ast.unflatten(pickle.loads(data))
            if isinstance(module, ast.Module):
                return module
        except Exception:  # noqa: BLE001 (an entry of another layout: parse again)
            pass
    module = parse_with_lark(source, file)
    store("ast", key, pickle.dumps(ast.flatten(module)))
    return module


def parse_with_lark(source: str, file: str = "<string>") -> ast.Module:
    """`parse`, never from the store."""
    from gradlang.compiler import lark_parser
    return lark_parser.parse_with_lark(source, file)


def shipped_tables() -> bytes:
    """The text of `lark_parser.SHIPPED_TABLES` for this grammar, lark and
    Python (written there whenever the grammar changes)."""
    from gradlang.compiler import lark_parser
    return lark_parser.shipped_tables()
