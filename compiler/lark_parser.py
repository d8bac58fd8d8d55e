"""Source text -> `compiler.ast.Module`, by lark: the half of the parser
that imports lark (`compiler/parser.py` is the other, which a process
whose modules are all stored uses alone).

Contract: `parse_with_lark(source, file)` returns a Module or raises
`GradError` with the span of the first problem; no other exception
escapes for any input text.  The grammar is `grammar/grad.lark` (LALR
with a Python-style indenter); the transformer below maps each rule to
one AST node and raises on anything it does not handle.
"""
from __future__ import annotations

import difflib
import functools
import hashlib
import io
import re
import sys
import unicodedata
from importlib import resources

import lark
from lark import Lark, Token, Transformer_NonRecursive, v_args
from lark.indenter import DedentError, Indenter

import gradlang.grammar
from gradlang.compiler import ast
from gradlang.compiler.ir import NUMPY_NAMES
from gradlang.compiler.source import integer_literal, lines_of, too_deep
from gradlang.grammar import grammar_text
from gradlang.runtime.args import KINDS, SUPPORTED
from gradlang.runtime.errors import GradError, Span
from gradlang.runtime.forking import ChildSafeLock
from gradlang.runtime.loader import cache_dir


class _GradIndenter(Indenter):
    NL_type = "_NL"
    OPEN_PAREN_types = ["LPAR", "LSQB"]
    CLOSE_PAREN_types = ["RPAR", "RSQB"]
    INDENT_type = "_INDENT"
    DEDENT_type = "_DEDENT"
    tab_len = 8


# The parser, its tables built once and shipped in the package behind the
# key they were built for (tests/test_import_and_cache.py keeps them current).
SHIPPED_TABLES = resources.files(gradlang.grammar).joinpath("grad.lark-tables")
_OPTIONS = dict(parser="lalr", postlex=_GradIndenter(), propagate_positions=True,
                maybe_placeholders=True)


def _tables_key() -> str:
    """What lark's tables depend on: the grammar, lark's and Python's versions."""
    text = f"{grammar_text()}\0{lark.__version__}\0{sys.version_info[:2]}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    """The LALR parser.  Building its tables takes ~0.1 s: the package
    ships them, and for another lark or Python lark keeps the ones it
    builds in the cache directory, in a file named by their key (lark
    checks its own hash of the grammar and options on load, rebuilds on
    any failure to read, and only logs a failure to write)."""
    key = _tables_key()
    shipped_key, _, tables = SHIPPED_TABLES.read_bytes().partition(b"\n")
    if shipped_key.decode() == key:
        return Lark.load(io.BytesIO(tables))
    table = cache_dir() / "parser" / f"grad-{key}.lark"
    try:
        table.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # lark fails to write the table, logs it, and parses all the same
    return Lark(grammar_text(), cache=str(table), **_OPTIONS)


def shipped_tables() -> bytes:
    """The text of `SHIPPED_TABLES` for this grammar, lark and Python."""
    tables = io.BytesIO()
    Lark(grammar_text(), **_OPTIONS).save(tables)
    return _tables_key().encode() + b"\n" + tables.getvalue()


# The language's keywords (the grammar's keyword terminals): never names.
KEYWORDS = frozenset({"def", "return", "for", "in", "if", "elif", "else", "and", "or",
                      "not", "import", "from", "True", "False", "None"})

# What a type may name: a dtype or a kind (the grammar's DTYPE); NumPy's
# names for them are spelled otherwise (a syntax error at one says how).
DTYPE_SPELLINGS = (*SUPPORTED.values(), *KINDS)
_NUMPY_SPELLINGS = {numpy: dtype for dtype, numpy in NUMPY_NAMES.items()}

# Friendly names for the terminals lark reports in "expected ..." messages.
_TERMINAL_NAMES = {
    "_NL": "end of line", "_INDENT": "an indented block",
    "_DEDENT": "end of block", "NAME": "a name", "INT": "an integer",
    "FLOAT": "a number", "LPAR": "'('", "RPAR": "')'", "LSQB": "'['",
    "RSQB": "']'", "COLON": "':'", "COMMA": "','", "EQUAL": "'='",
    "DTYPE": f"a dtype ({', '.join(DTYPE_SPELLINGS)})", "$END": "end of file", "GRAD": "'grad'",
    "AT": "'@'",
    "AUG_OP": "'+=', '-=', '*=', '/=', '//=', '%=', '**=' or '@='", "COMP_OP": "a comparison",
    "DOT": "'.'",
    "MORETHAN": "'>'", "LESSTHAN": "'<'", "EQUAL": "'='", "PLUS": "'+'", "MINUS": "'-'",
    "STAR": "'*'", "SLASH": "'/'", "_DEF": "'def'", "_RETURN": "'return'",
    "_IMPORT": "'import'", "_FROM": "'from'", "_PARAM": "'param'", "_NOT": "'not'",
    "_AND": "'and'", "_OR": "'or'", "_FOR": "'for'", "_IN": "'in'", "_IF": "'if'",
    "_ELIF": "'elif'", "_ELSE": "'else'", "CONST": "'const'", "ELLIPSIS": "'...'",
    "RARROW": "'->'", "TRUE": "'True'", "FALSE": "'False'", "NONE": "'None'",
    "__ANON_0": "'**'", "STRING": "a string",
}


# One parse at a time: the parser's indenter keeps the state of the parse
# under way (its indentation levels and open brackets), so two threads
# parsing at once read each other's (a syntax error, an AssertionError).
_PARSING = ChildSafeLock()


def parse_with_lark(source: str, file: str = "<string>") -> ast.Module:
    """`parser.parse`, never from the store."""
    try:
        _check_indentation(source, file)
        with _PARSING:
            tree = _parser().parse(source + "\n")
        return _ToAst(file, source).transform(tree)
    except GradError as err:
        raise err.with_source(source)
    except lark.exceptions.VisitError as err:
        if isinstance(err.orig_exc, GradError):
            raise err.orig_exc.with_source(source) from None
        if isinstance(err.orig_exc, RecursionError):
            raise too_deep(source, file) from None
        raise GradError(f"cannot parse: {err.orig_exc}",
                        Span(file, 1, 1), source) from None
    except lark.exceptions.UnexpectedInput as err:
        raise _syntax_error(err, file, source) from None
    except DedentError:
        line = _dedent_line(source)
        raise GradError("unindent does not match any outer indentation level",
                        Span(file, line, 1), source) from None
    except lark.exceptions.LarkError as err:
        raise GradError(f"cannot parse: {err}", Span(file, 1, 1),
                        source) from None
    except RecursionError:
        raise too_deep(source, file) from None


# What the lexer reads as one piece where brackets are counted: a string
# (the grammar's STRING), a comment, or a bracket.
_BRACKET_PIECES = re.compile(r'"[^"\\\n]*"|' + r"'[^'\\\n]*'|#.*|[()\[\]]")


def _continued(lines: list[str]) -> list[bool]:
    """Per line, whether it continues the line above (inside brackets, or
    after a backslash): its leading whitespace is no indentation, as in
    Python, which takes tabs there too.  A bracket in a string or a comment
    opens nothing (einsum("i(", x) took every later line for a continued
    one, unchecked: tabs, and blocks nested past MAX_INDENTATION_LEVELS)."""
    continued, depth, joined = [], 0, False
    for line in lines:
        continued.append(depth > 0 or joined)
        commented = False
        for piece in _BRACKET_PIECES.findall(line):
            depth += piece in ("(", "[")
            depth -= piece in (")", "]") and depth > 0
            commented = commented or piece.startswith("#")
        joined = not commented and line.rstrip(" \t\f").endswith("\\")  # (as LINE_CONT)
    return continued


# Blocks nest at most this deep, a function's body the first level: Python's
# own limit (its tokenizer's "too many levels of indentation"), which keeps
# the passes that recurse into nested blocks, and the Python the code
# generator writes (a loop per loop), within the stack and the tokenizer.
# An elif chain is no nesting (`ast.elif_chain`).
MAX_INDENTATION_LEVELS = 99


def _check_indentation(source: str, file: str) -> None:
    first = True
    lines = lines_of(source)
    levels = [0]
    for number, (line, continued) in enumerate(zip(lines, _continued(lines)), 1):
        if continued:
            continue
        stripped = line.lstrip(" \t\f")
        lead = line[:len(line) - len(stripped)]
        # a form feed (a page break) is no indentation, as in Python and to
        # the lexer, which counts the spaces and tabs
        indent = len(lead.replace("\f", ""))
        if line.strip() and not stripped.startswith("#"):
            while len(levels) > 1 and indent < levels[-1]:
                levels.pop()
            if indent > levels[-1]:
                levels.append(indent)
            if len(levels) > MAX_INDENTATION_LEVELS + 1:
                raise GradError(f"too many levels of indentation: blocks nest at most "
                                f"{MAX_INDENTATION_LEVELS} deep, as in Python",
                                Span(file, number, len(lead) + 1))
        if first and stripped and not stripped.startswith("#") and stripped.strip():
            first = False
            if indent:
                raise GradError("unexpected indent: top-level code starts in column 1",
                                Span(file, number, 1))
        if "\t" in lead and stripped and not stripped.startswith("#"):
            raise GradError("tabs are not allowed in indentation; use spaces",
                            Span(file, number, lead.index("\t") + 1))


def _dedent_line(source: str) -> int:
    # lark's DedentError carries no position; find the first line whose
    # indentation matches no open level.
    levels = [0]
    lines = lines_of(source)
    for number, (line, continued) in enumerate(zip(lines, _continued(lines)), 1):
        # (as `_check_indentation` and the lexer read it: a line of spaces,
        # tabs and form feeds is blank, and a form feed is no indentation;
        # a blank line with a tab or a form feed was a line at column 1,
        # and one indented past a form feed was counted one too deep)
        stripped = line.lstrip(" \t\f")
        if not stripped or stripped.startswith("#") or continued:
            continue
        indent = len(line[:len(line) - len(stripped)].replace("\f", ""))
        if indent > levels[-1]:
            levels.append(indent)
            continue
        while indent < levels[-1]:
            levels.pop()
        if indent != levels[-1]:
            return number
    return max(1, len(lines_of(source)))


# Python statements the language lacks: a syntax error on a line that starts
# with one names the statement, not the token lark tripped over after it.
_UNSUPPORTED_STATEMENTS = {
    "while": "loops are `for NAME in range(...)` with a trip count known when "
             "the loop starts",
    "break": "a loop runs all its trips; select values with `where` or `if`",
    "continue": "a loop runs all its trips; select values with `where` or `if`",
    "pass": "a block holds at least one assignment; leave out an empty branch",
    "print": "a function computes values; print them from Python (or `gradc run`)",
    "assert": "check arguments with annotations (`x: f64[n]`) or from Python",
    "raise": "a function computes values; check arguments from Python",
    "try": "a function raises no exceptions to catch",
    "with": "a function has no context to enter",
    "def": "functions are defined at the top level of the file (a function can call "
           "any other, defined before or after it)",
}


def _unsupported_statement(line_text: str, file: str, line: int, stopped: int,
                           source: str) -> GradError | None:
    """The error for a Python statement the language lacks, where the
    parse stopped (column `stopped`) at its keyword or at what follows
    it.  These keywords are names to the language (`print = x * 2.0` is an
    assignment): a syntax error further on in such a line (`print = x $ 2`)
    is its own, not "`print` is not supported"."""
    match = re.match(r"([ \t]*)([A-Za-z_][A-Za-z0-9_]*)([ \t]*)", line_text)
    if match is None or match.group(2) not in _UNSUPPORTED_STATEMENTS:
        return None
    keyword, col = match.group(2), len(match.group(1)) + 1
    if keyword == "def" and not match.group(1):
        return None  # (a function's header at the top level: its own error)
    if stopped not in (col, match.end() + 1):
        return None
    return GradError(f"`{keyword}` is not supported: {_UNSUPPORTED_STATEMENTS[keyword]}",
                     Span(file, line, col, line, col + len(keyword)), source)


# `x[i] = v` (or `+=`), as NumPy and torch write an update in place.
_ITEM_ASSIGNMENT = re.compile(r"([ \t]*)([A-Za-z_][A-Za-z0-9_]*)\[.*\]\s*(//|\*\*|[-+*/%@])?=(?!=)")


def _item_assignment(line_text: str, file: str, line: int, col: int,
                     source: str) -> GradError | None:
    """The error for an item assignment, where the parse stopped at its `[`."""
    match = _ITEM_ASSIGNMENT.match(line_text)
    if match is None or col != match.end(2) + 1:
        return None
    name = match.group(2)
    return GradError(f"arrays cannot be changed in place: `{name}[...] = ...` is not "
                     "supported; build a new array (where(), scatter_add(), concatenate())",
                     Span(file, line, match.end(1) + 1, line, col), source)


# Python spellings the language writes otherwise: a syntax error at one
# says how (NumPy users combine masks with & | ~, as `and` fails there).
_OPERATOR_HINTS = {
    "&": "write `and`, which is elementwise on bool arrays",
    "|": "write `or`, which is elementwise on bool arrays",
    "~": "write `not`, which is elementwise on bool arrays",
    "^": "write `!=` for the exclusive or of bools; `**` is the power",
}
# the names before an assignment's target that stopped the parse, and the
# `=` after it (`v, (gx, gw) = ...`, `*batch, n = x.shape`)
_TARGETS = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*\s*,\s*)*")
_ASSIGNED = re.compile(r"(?<![=!<>])=(?!=)")
# what `_assigned` reads: a string, a comment, a bracket, or an `=`
_ASSIGNMENT_PIECES = re.compile(_BRACKET_PIECES.pattern + "|" + _ASSIGNED.pattern)


def _assigned(text: str) -> bool:
    """Whether `text` (a statement from its first bracket on) assigns: an
    `=` outside its brackets.  One inside them is a keyword argument's
    (`[sum(x, axis=0)]`, an expression, was said to be a nested target)."""
    depth = 0
    for piece in _ASSIGNMENT_PIECES.findall(text):
        if piece == "=" and depth == 0:
            return True
        depth += piece in ("(", "[")
        depth -= piece in (")", "]") and depth > 0
    return False
_COMPARISON = re.compile(r"<=|>=|==|!=|<|(?<!-)>")
# a compound statement's header, up to its colon: `for i in range(3): s = ...`
_HEADER = re.compile(r"\s*(for\b.*|if\b.*|elif\b.*|else|def\b.*\)(\s*->.*)?|grad\b.*\))\s*:\s*$")


def _spelling_hint(err: lark.exceptions.UnexpectedInput, line_text: str,
                   col: int) -> str | None:
    """What to write instead, where the parse stopped at a Python spelling
    the language lacks: an operator, a chained comparison, a docstring, a
    comprehension, C's `else if` or a conditional expression."""
    if isinstance(err, lark.exceptions.UnexpectedCharacters):
        hint = _OPERATOR_HINTS.get(line_text[col - 1:col])
        return hint and f"`{line_text[col - 1]}` is not an operator here; {hint}"
    token = getattr(err, "token", None)
    before = line_text[:col - 1]
    if token is None:
        return None
    if token.type == "COMP_OP" and _COMPARISON.search(before):
        return ("comparisons do not chain: write `a < b and b < c` for `a < b < c`")
    if token.type == "STRING" and not before.strip():
        return ("a string is not a statement (a docstring is not supported): "
                "describe a function in # comments")
    if token.type == "_FOR" and before.strip():
        return ("comprehensions are not supported: list the items (stack([a, b])), or "
                "compute them in a `for` loop")
    if token.type == "NAME" and re.search(r"(^|[^\w.])lambda\s*$", before):
        return ("`lambda` is not supported: define the function with `def` at the top "
                "level of the file, and call it by its name")
    if token.value == "as" and re.match(r"\s*(import|from)\b", before):
        return ("`import ... as` is not supported: import a .grad module by its name "
                "(`import other`, then `other.f(x)`)")
    if token.value in ("(", "[", "*") and _TARGETS.fullmatch(before) \
            and _assigned(line_text[col - 1:]):
        if token.value == "*":
            return ("starred unpacking (`*batch, n = x.shape`) is not supported: slice the "
                    "tuple (`batch = x.shape[:-1]`, `n = x.shape[-1]`)")
        return ("nested or parenthesized targets are not supported: unpack one level at a "
                "time, names without brackets (`v, g = value_and_grad(f, wrt=(0, 1))(x, w)`, "
                "then `gx, gw = g`)")
    if token.type == "_IF" and before.strip() == "else":
        return "write `elif c:` for `else if c:`"
    if _HEADER.match(before):
        return ("a block's statements go on the lines after its `:`, indented (as the body "
                "of a `for` or `if` on the header's line is not supported)")
    if token.type == "_IF" and before.strip():
        return ("`a if c else b` is not supported: write where(c, a, b), or an `if` "
                "statement on a compile-time or scalar condition")
    return None


_OPENED_BY = {")": "(", "]": "["}


def _left_open(lines: list[str]) -> list[tuple[int, int, str]]:
    """(line, column, bracket) of each bracket open at the end of the
    file, innermost last; or at a closing bracket of another kind than the
    innermost open one (`[x, (x` then `]`), those open there: that `]`
    closes no `(`, which is the one never closed (popped, the `[` was
    said to be)."""
    open_at: list[tuple[int, int, str]] = []
    for number, text in enumerate(lines, 1):
        for match in _BRACKET_PIECES.finditer(text):
            piece = match.group()
            if piece in ("(", "["):
                open_at.append((number, match.start() + 1, piece))
            elif piece in _OPENED_BY and open_at:
                if open_at[-1][2] != _OPENED_BY[piece]:
                    return open_at
                open_at.pop()
    return open_at


def _never_closed(err: lark.exceptions.UnexpectedInput, lines: list[str], line: int,
                  col: int) -> tuple[int, int, str] | None:
    """(line, column, bracket) of the innermost bracket the file leaves
    open, where the parse stopped after it on a later line or at the end
    of the file, as Python's "'(' was never closed".  Inside a bracket
    the line breaks are dropped, so the parse stopped at the next
    statement: `y = (x + 1` said "unexpected 'return'" on the line after."""
    open_at = _left_open(lines)
    if not open_at or open_at[-1][:2] >= (line, col):
        return None
    token = getattr(err, "token", None)
    at_end = token is not None and token.type in ("$END", "_DEDENT")
    return open_at[-1] if at_end or open_at[-1][0] < line else None


def _dtype_hint(name: str) -> str:
    """Did-you-mean for a name where a type stands: NumPy's name of a dtype
    (`float64`), or a close spelling of one (`f31`, `floats`)."""
    close = [_NUMPY_SPELLINGS[name]] if name in _NUMPY_SPELLINGS else \
        difflib.get_close_matches(name, DTYPE_SPELLINGS, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _syntax_error(err: lark.exceptions.UnexpectedInput, file: str,
                  source: str) -> GradError:
    line = max(1, getattr(err, "line", 1) or 1)
    col = max(1, getattr(err, "column", 1) or 1)
    lines = lines_of(source)
    if line > len(lines):
        line, col = len(lines), len(lines[-1]) + 1
    unclosed = _never_closed(err, lines, line, col)
    if unclosed is not None:
        at, start, bracket = unclosed
        return GradError(f"syntax error: {bracket!r} was never closed",
                         Span(file, at, start, at, start + 1), source)
    unsupported = (_unsupported_statement(lines[line - 1], file, line, col, source)
                   or _item_assignment(lines[line - 1], file, line, col, source))
    if unsupported is not None:
        return unsupported
    hint = _spelling_hint(err, lines[line - 1], col)
    if hint is not None:
        return GradError(f"syntax error: {hint}", Span(file, line, col, line, col + 1), source)
    if isinstance(err, lark.exceptions.UnexpectedCharacters):
        char = lines[line - 1][col - 1:col]
        message = f"unexpected character {char!r}{_named_character(char)}"
    elif isinstance(err, lark.exceptions.UnexpectedToken):
        token = err.token
        if token.type == "_INDENT" and token.end_line:
            # lark places an indent at the line break before it; the
            # indented line is where it is wrong (Python's "unexpected indent")
            line, col = token.end_line, token.end_column
            return GradError("syntax error: unexpected indent",
                             Span(file, line, col, line, col + 1), source)
        if token.type == "$END":
            found = "end of file"
        elif token.type in ("_NL", "_INDENT", "_DEDENT"):
            found = _TERMINAL_NAMES[token.type]
        else:
            found = repr(str(token))
        message = f"unexpected {found}"
        takes = _expected(err)
        # (the end of the file is no help where something else may come: at
        # the top level it would hide the list, one name too long)
        shown = takes - {"$END"} if takes - {"$END"} else takes
        expected = sorted(_TERMINAL_NAMES.get(t, repr(t.lower()) if t.isupper() and len(t) > 1
                                              else t)
                          for t in shown if not t.startswith("__"))
        if expected and len(expected) <= 7:
            message += "; expected " + " or ".join(expected)
        if token.type == "NAME" and "DTYPE" in takes:
            message += _dtype_hint(str(token))
    else:
        message = "unexpected end of file"
    end = col + 1
    return GradError(f"syntax error: {message}", Span(file, line, col, line, end), source)


def _expected(err: lark.exceptions.UnexpectedToken) -> set[str]:
    """The terminals the parse takes where it stopped.  lark's `expected`
    is what the contextual lexer's state accepts: with the end of line the
    indenter has every state accept, and the lookaheads LALR merged into
    the state, which the parse refuses once it reduces (`def f(*x):` said
    "expected ')' or a name or end of line", `a, b += 1` "expected ')' or
    ',' or '=' or end of line"); its interactive parser tries each."""
    parser = getattr(err, "interactive_parser", None)
    if parser is None:
        return set(err.expected)
    try:
        return parser.accepts()
    except lark.exceptions.LarkError:  # (a state it cannot copy: lark's own set)
        return set(err.expected)


def _named_character(char: str) -> str:
    """What a character that is not ASCII is, for a syntax error at it: a
    confusable looks like the letter it is not (Cyrillic 'х' is no x), a
    fullwidth digit like a digit, and a zero-width space like nothing."""
    if not char or char.isascii():
        return ""
    name = unicodedata.name(char, "")
    told = f" (U+{ord(char):04X}{' ' + name if name else ''})"
    if char.isalnum():  # (a letter or a digit of another script)
        told += ": names and numbers are written in ASCII letters, digits and underscores"
    return told


def _span(file: str, meta) -> Span:
    if getattr(meta, "empty", True):
        return Span(file, 1, 1)
    return Span(file, meta.line, meta.column, meta.end_line, meta.end_column)


def _given(part):
    """A slice's bound, None where it is left out or written `None`, as
    in Python (`x[None:2]` is `x[:2]`)."""
    return None if isinstance(part, ast.NoneLit) else part


def _tok_span(file: str, tok: Token) -> Span:
    return Span(file, tok.line or 1, tok.column or 1, tok.end_line or tok.line or 1,
                tok.end_column or (tok.column or 1) + len(tok))


@v_args(meta=True)
class _ToAst(Transformer_NonRecursive):
    """One method per grammar rule, each returning one AST node.  (lark's
    plain Transformer recurses once per level of the tree, and a generated
    sum of thousands of terms is thousands of levels deep on the left.)"""

    def __init__(self, file: str, source: str):
        super().__init__()
        self.file = file
        self.source = source

    def s(self, meta) -> Span:
        return _span(self.file, meta)

    def __default_token__(self, token: Token) -> Token:
        # The contextual lexer reads a keyword as a NAME where no keyword
        # fits (`True = x`, `def f(in):`); binding one could never be read
        # back (`True` reads the literal), so it is refused as Python does.
        if token.type == "NAME" and token in KEYWORDS:
            raise GradError(f"{str(token)!r} is a keyword and cannot be used as a name",
                            _tok_span(self.file, token))
        return token

    def __default__(self, data, children, meta):
        raise GradError(f"internal: unhandled grammar rule {data!r}",
                        self.s(meta))

    # ---------------------------------------------------------- top level
    def start(self, meta, children):
        imports = tuple(c for c in children if isinstance(c, ast.Import))
        params = tuple(c for c in children if isinstance(c, ast.ParamDecl))
        funcs = tuple(c for c in children if isinstance(c, ast.FuncDef))
        return ast.Module(self.file, self.source, imports, params, funcs)

    # A declaration's span ends at its last part (`header`): the rule's own
    # takes the line break after it, so it ended on the next line, and a
    # caret under it was one `^` (at `import`, `param` or `@`).
    def import_stmt(self, meta, children):
        return ast.Import(str(children[0]), None,
                          self.header(meta, _tok_span(self.file, children[0])))

    def from_import(self, meta, children):
        return ast.Import(str(children[0]), tuple(str(c) for c in children[1:]),
                          self.header(meta, _tok_span(self.file, children[-1])))

    def param_decl(self, meta, children):
        name, typ = children
        return ast.ParamDecl(str(name), typ, self.header(meta, typ.span))

    def funcdef(self, meta, children):
        decorators = tuple(c for c in children if isinstance(c, ast.Decorator))
        rest = [c for c in children if not isinstance(c, ast.Decorator)]
        name, params, ret, body, *grads = rest
        return ast.FuncDef(str(name), tuple(params or ()), ret, body,
                           tuple(grads), decorators, _tok_span(self.file, name))

    def decorator(self, meta, children):
        name, args = children
        args = args or ()
        span = self.header(meta, args[-1].span if args else _tok_span(self.file, name))
        if any(not isinstance(a, ast.Keyword) for a in args):
            raise GradError(f"@{name} takes keyword arguments only", span)
        return ast.Decorator(str(name), span, tuple(args))

    def params(self, meta, children):
        return tuple(c for c in children if c is not None)

    def param(self, meta, children):
        name, ann, default = children
        return ast.Param(str(name), ann, default, self.s(meta))

    def type(self, meta, children):
        dtype, dims = children
        if dims is None:
            dims = ()
        elif dims == "...":
            dims = None
        return ast.TypeAnn(str(dtype), dims, False, self.s(meta))

    def const_type(self, meta, children):
        return ast.TypeAnn(None, None, True, self.s(meta))

    def const_typed(self, meta, children):
        typ = children[1]
        return ast.TypeAnn(typ.dtype, typ.dims, True, self.s(meta))

    def dims(self, meta, children):
        return tuple(children)

    def any_rank(self, meta, children):
        return "..."

    def dim(self, meta, children):
        tok = children[0]
        return self._int(tok) if tok.type == "INT" else str(tok)

    def gradblock(self, meta, children):
        names = [c for c in children[1:-1] if c is not None]
        return ast.GradBlock(tuple(str(c) for c in names), children[-1],
                             _tok_span(self.file, children[0]),
                             tuple(_tok_span(self.file, c) for c in names))

    def body(self, meta, children):
        return tuple(children)

    # --------------------------------------------------------- statements
    def assign(self, meta, children):
        return ast.Assign((str(children[0]),), children[1], self.s(meta))

    def tuple_assign(self, meta, children):
        names = tuple(str(c) for c in children[:-1] if c is not None)
        return ast.Assign(names, children[-1], self.s(meta))

    def aug_assign(self, meta, children):
        name, op, value = children
        return ast.AugAssign(str(name), str(op)[:-1], value, self.s(meta))

    def return_stmt(self, meta, children):
        items = tuple(c for c in children if c is not None)
        if len(items) == 1 and items[0].name is None and isinstance(items[0].value, ast.TupleExpr) \
                and items[0].value.items:
            # `return (a, b)` is `return a, b`, as in Python
            items = tuple(ast.ReturnItem(None, e, e.span) for e in items[0].value.items)
        return ast.Return(items, self.s(meta))

    def ret_item(self, meta, children):
        return ast.ReturnItem(None, children[0], self.s(meta))

    def named_ret(self, meta, children):
        return ast.ReturnItem(str(children[0]), children[1], self.s(meta))

    def for_stmt(self, meta, children):
        name, iterable, body = children
        if not (isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name)
                and iterable.func.id == "range"):
            raise GradError("a for loop iterates over range(stop) or range(start, stop"
                            "[, step])", iterable.span)
        if iterable.kwargs or not 1 <= len(iterable.args) <= 3:
            raise GradError("range() takes 1 to 3 positional arguments", iterable.span)
        return ast.For(str(name), iterable.args, body, self.header(meta, iterable.span))

    def if_stmt(self, meta, children):
        cond, body, *rest = children
        orelse = rest.pop() if rest else None
        for clause in reversed(rest):  # elif chains nest: if a: .. else: (if b: ..)
            orelse = (ast.If(clause.cond, clause.body, orelse or (), clause.span),)
        return ast.If(cond, body, orelse or (), self.header(meta, cond.span))

    def elif_clause(self, meta, children):
        cond, body = children
        return ast.If(cond, body, (), self.header(meta, cond.span))

    def header(self, meta, last: Span) -> Span:
        """A compound statement's first line, from its keyword to `last`."""
        return Span(self.file, meta.line, meta.column, last.end_line, last.end_col)

    # -------------------------------------------------------- expressions
    def _bin(op):  # noqa: N805 - a rule-method factory, used at class level
        def rule(self, meta, children):
            return ast.BinOp(op, children[0], children[1], self.s(meta))
        return rule

    add, sub, mul, div = _bin("+"), _bin("-"), _bin("*"), _bin("/")
    matmul, pow, floordiv, mod = _bin("@"), _bin("**"), _bin("//"), _bin("%")

    def compare(self, meta, children):
        left, op, right = children
        return ast.Compare(str(op), left, right, self.s(meta))

    def or_op(self, meta, children):
        return ast.BoolOp("or", children[0], children[1], self.s(meta))

    def and_op(self, meta, children):
        return ast.BoolOp("and", children[0], children[1], self.s(meta))

    def not_op(self, meta, children):
        return ast.UnaryOp("not", children[0], self.s(meta))

    def neg(self, meta, children):
        return ast.UnaryOp("-", children[0], self.s(meta))

    def pos(self, meta, children):
        return children[0]

    def call(self, meta, children):
        func, args = children
        args = args or ()
        positional = tuple(a for a in args if not isinstance(a, ast.Keyword))
        keywords = tuple(a for a in args if isinstance(a, ast.Keyword))
        seen_kw = False
        for a in args:
            if isinstance(a, ast.Keyword):
                seen_kw = True
            elif seen_kw:
                raise GradError("positional argument follows keyword argument",
                                a.span)
        return ast.Call(func, positional, keywords, self.s(meta))

    def args(self, meta, children):
        return tuple(c for c in children if c is not None)

    def kwarg(self, meta, children):
        return ast.Keyword(str(children[0]), children[1], self.s(meta))

    def index(self, meta, children):
        # `None` among the items is NumPy's np.newaxis
        items = tuple(ast.NewAxis(i.span) if isinstance(i, ast.NoneLit) else i
                      for i in children[1])
        return ast.Index(children[0], items, self.s(meta))

    def subscripts(self, meta, children):
        return tuple(c for c in children if c is not None)

    def every_other_axis(self, meta, children):
        return ast.EveryOtherAxis(_tok_span(self.file, children[0]))

    def slice2(self, meta, children):
        return ast.Slice(*map(_given, children), None, self.s(meta))

    def slice3(self, meta, children):
        return ast.Slice(*map(_given, children), self.s(meta))

    def attr(self, meta, children):
        return ast.Attr(children[0], str(children[1]), self.s(meta))

    def name(self, meta, children):
        return ast.Name(str(children[0]), _tok_span(self.file, children[0]))

    def int_lit(self, meta, children):
        return ast.Num(self._int(children[0]), _tok_span(self.file, children[0]))

    def _int(self, token) -> int:
        """The integer a literal spells (`integer_literal`), else a
        `GradError` at it saying why it spells none (`010`)."""
        try:
            return integer_literal(str(token))
        except ValueError as err:
            raise GradError(str(err), _tok_span(self.file, token)) from None

    def float_lit(self, meta, children):
        return ast.Num(float(children[0]), _tok_span(self.file, children[0]))

    def neg_int_lit(self, meta, children):
        return ast.Num(-self._int(children[0]), self.s(meta))

    def neg_float_lit(self, meta, children):
        return ast.Num(-float(children[0]), self.s(meta))

    def true_lit(self, meta, children):
        return ast.Bool(True, _tok_span(self.file, children[0]))

    def false_lit(self, meta, children):
        return ast.Bool(False, _tok_span(self.file, children[0]))

    def none_lit(self, meta, children):
        return ast.NoneLit(_tok_span(self.file, children[0]))

    def str_lit(self, meta, children):
        return ast.Str(str(children[0])[1:-1], _tok_span(self.file, children[0]))

    def tuple_lit(self, meta, children):
        return ast.TupleExpr(tuple(c for c in children if c is not None), self.s(meta))

    def list_lit(self, meta, children):
        return ast.ListExpr(tuple(c for c in children if c is not None), self.s(meta))

    def literal(self, meta, children):
        return children[0]
