"""Source text as the front end reads it.

Contract: `universal_newlines(source)` ends every line with '\n', as
Python reads source; `lines_of(source)` splits it as the lexer counts
lines; `too_deep(source, file)` is the `GradError` for nesting beyond
Python's recursion limit, at the line where the nesting must be.  Shared
by the parser (both its halves: `parser.py` and `lark_parser.py`), the
module loader and the lowering.
"""
from __future__ import annotations

from gradlang.runtime.errors import GradError, Span


def universal_newlines(source: str) -> str:
    """`source` with each line ending ('\\r\\n', or a lone '\\r' as old Mac
    editors write) as '\\n', as Python reads source: lines and columns, and
    the lines a caret is shown under, count the same whatever the editor."""
    return source.replace("\r\n", "\n").replace("\r", "\n")


def too_deep(source: str, file: str) -> GradError:
    """Nesting beyond Python's recursion limit in `file`, reported at the line
    with the most brackets and operators (where the nesting must be): by
    the parser, and by the checker and the lowering for the module whose
    code they were in."""
    lines = lines_of(source)
    score = [sum(line.count(c) for c in "([-+*/not") for line in lines]
    line = score.index(max(score)) + 1
    return GradError("expression is nested too deeply", Span(file, line, 1), source)


def lines_of(source: str) -> list[str]:
    """Lines as the lexer counts them (only \\n ends a line)."""
    return source.split("\n")
