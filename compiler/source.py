"""Source text as the front end reads it.

Contract: `universal_newlines(source)` ends every line with '\n', as
Python reads source; `lines_of(source)` splits it as the lexer counts
lines; `too_deep(source, file)` is the `GradError` for nesting beyond
Python's recursion limit, at the line where the nesting must be;
`integer_literal(text)` is the integer a literal spells, as the language
reads it (`INTEGER_LITERAL`, the grammar's INT).  Shared by the parser
(both its halves: `parser.py` and `lark_parser.py`), the module loader,
the lowering and `gradc --sig`.
"""
from __future__ import annotations

import re

from gradlang.runtime.errors import GradError, Span

# The grammar's INT (grammar/grad.lark): ASCII digits (re's \d would also
# take `１` or `٣`), grouped by single underscores between them, as Python's
INTEGER_LITERAL = re.compile(r"[0-9](_?[0-9])*", re.ASCII)


def integer_literal(text: str) -> int:
    """The integer a literal (`INTEGER_LITERAL`) spells; `ValueError`
    saying why it spells none: `010`, as in Python 3 (C and Python 2 read
    it as octal 8: taking it as 10 would be a silent surprise), while `0`
    and `00` are zero; or digits beyond Python's limit."""
    digits = text.replace("_", "")  # (`1_000`, grouped as Python's)
    if digits.startswith("0") and digits.strip("0"):
        raise ValueError(f"leading zeros in an integer literal are not allowed, as in Python: "
                         f"write {digits.lstrip('0')} (octal numbers are not supported)")
    try:
        return int(digits)
    except ValueError:  # beyond Python's digit limit
        raise ValueError("integer literal is too long") from None


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
