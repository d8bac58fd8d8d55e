"""Fuzz the front end: `dsl.loads` on mutated sources.

Property: for any text, `dsl.loads(text)` either returns a module or raises
`dsl.GradError` whose position is 1-based and whose message starts with the
`<string>:LINE:COL: error:` header (or `PATH.grad:LINE:COL: error:` when the
problem is in a module the text imports).  No other exception may escape (no
IndexError, AttributeError, lark exceptions, RecursionError, ...).

Inputs are the example programs plus richer snippets below, mutated at the
token level (insert / delete / swap / repeat a token), the line level
(duplicate / delete / swap / re-indent a line), by truncation, and by
inserting unicode and control characters.  `loads` only parses and checks,
so each example is cheap.  Set GRAD_FUZZ_SCALE=N for N times more examples.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dsl

# Scale the example counts for a longer bug hunt, e.g. GRAD_FUZZ_SCALE=10.
SCALE = max(1, int(os.environ.get("GRAD_FUZZ_SCALE", "1")))

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

SNIPPETS = [
    # decorators, module params, tuple assignment, augmented assignment,
    # slicing, attributes, keyword arguments, named returns
    """\
param w: f64[2]

@recompute
def f(x: f64[n, 3], v, alpha: const = 0.2) -> f64:
    a, b = x, x * alpha
    a += 1
    s = x[1:, ::2, 0]
    t = x.T
    k = x.shape[0]
    u = sum(x, axis=(0, 1), keepdims=True)
    return sum(a * b) + mean(s) + sum(t) + k + sum(u)
grad(dy):
    return dy * x, v=0
""",
    # comparisons and boolean operators, named return for a later parameter
    """\
def g(x, y: f64[...], flag: const bool = True):
    m = (x > 0) and not (y <= 1.5e-3) or x == y
    c = where(m, x, -y)
    c -= 2
    c *= 0.5
    c /= 4.
    return c
grad(dc):
    return dc, y=-dc
""",
    # pass_through, calls between functions, negative literal defaults
    """\
@pass_through
def clamp(x, lo: const = -1, hi: const = 1.0):
    return maximum(minimum(x, hi), lo)

def h(x: f32[4, m], w: f32[m]) -> f32[4]:
    z = clamp(x @ w, lo=-2)
    p = z ** 2
    q = (p, z,)
    return p + z
""",
    # several results, several grad blocks, comments, blank lines, continuation
    """\
# a comment
def two(x, y):

    s = x + \\
        y   # trailing comment
    d = x - y
    return s, d
grad(ds, dd):
    # inside a grad block
    gx = ds + dd
    gy = ds - dd
    return gx, gy
grad(a, b):
    return a + b, a - b, 0, y=0
""",
    # indexing forms and numbers
    """\
def idx(x: f64[a, b, c], i: i64):
    y = x[0, 1:2, :]
    z = x[:, :, ::-1]
    v = x[-1]
    return y
""",
    """\
def idx2(x: f64[a, b]):
    y = x[:1, 0:] + x[0::1, 1] + x.size + x.ndim
    return +y, -y
grad(d1, d2):
    return d1 - d2
""",
]

# Imports: whether a module resolves depends on what is on the search path,
# so these seeds are not required to load, only to fail cleanly.
IMPORT_SNIPPETS = [
    """\
import std
from std import softplus, logsumexp

def u(x: f64[n]):
    return softplus(x) + std.relu(x)
""",
    """\
import foo
from bar import baz, qux

def v(x):
    return baz(x)
""",
]

KEYWORDS = ["def", "grad", "return", "param", "import", "from", "not", "and",
            "or", "True", "False", "const"]
NAMES = ["x", "y", "w", "b", "dy", "f", "g", "foo", "_", "n", "T", "shape",
         "f64", "f32", "i32", "i64", "bool", "recompute", "pass_through", "sum",
         "mean", "exp", "log", "where", "maximum", "softplus", "bar", "axis",
         "keepdims", "grad_", "def_", "constx", "Truex", "std",
         "examples", "tests", "__init__", "a" * 300]
NUMBERS = ["0", "1", "2", "0.2", "1.", ".5", "1e3", "2E-5", "007",
           "99999999999999999999999999", "1" * 5000, "1e999", "0x1F", "1_000"]
OPERATORS = ["+", "-", "*", "/", "@", "**", "<", "<=", "==", "!=", ">=", ">",
             "+=", "-=", "*=", "/=", "//=", "%=", "**=", "@=", "->", "...", ".", "=", "!",
             "%", "//",
             "&", "|", "~", "^", "$", "?", "`", "'", '"', ";", "\\"]
PUNCT = ["(", ")", "[", "]", "{", "}", ":", ",", "=", "@"]
LAYOUT = ["\n", "\n\n", " ", "    ", "  ", "        ", "\t", "\n\t", "\n    ",
          "#", "# comment", "\\\n", "\\", "\r\n", "\r"]
WEIRD = ["\x00", "\x01", "\x1b", "\x7f", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e",
         "\x85", "\u2028", "\u2029", "\ufeff", "\u00a0", "\u3000", "\u200b",
         "é", "λ", "𝑥", "ｘ", "٣", "²", "½", "\U0001F600", "\ud800", "\uffff",
         "\u0301", "ß", "ﬁ"]

TOKENS = KEYWORDS + NAMES + NUMBERS + OPERATORS + PUNCT + LAYOUT + WEIRD

_TOKEN_RE = re.compile(
    r"\r?\n|[ \t]+|#[^\n]*|[A-Za-z_][A-Za-z0-9_]*"
    r"|\d+\.\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|\d+(?:[eE][-+]?\d+)?"
    r"|\*\*|->|\.\.\.|[-+*/]=|[<>=!]=|.",
    re.S)


VALID_SEEDS = [p.read_text() for p in sorted(EXAMPLES.glob("*.grad"))] + SNIPPETS
SEEDS = VALID_SEEDS + IMPORT_SNIPPETS


def tokenize(text: str) -> list[str]:
    tokens = _TOKEN_RE.findall(text)
    assert "".join(tokens) == text
    return tokens


# ------------------------------------------------------------- mutations
# Each takes (data, text) and returns a new text.

def _pick_index(data, n: int, label: str, inclusive: bool = False) -> int:
    return data.draw(st.integers(0, n if inclusive else max(n - 1, 0)), label=label)


def insert_token(data, text):
    toks = tokenize(text)
    i = _pick_index(data, len(toks), "insert at", inclusive=True)
    tok = data.draw(st.sampled_from(TOKENS), label="token")
    sep = data.draw(st.sampled_from(["", " "]), label="sep")
    return "".join(toks[:i]) + sep + tok + sep + "".join(toks[i:])


def delete_token(data, text):
    toks = tokenize(text)
    if not toks:
        return text
    i = _pick_index(data, len(toks), "delete")
    return "".join(toks[:i] + toks[i + 1:])


def replace_token(data, text):
    toks = tokenize(text)
    if not toks:
        return text
    i = _pick_index(data, len(toks), "replace")
    toks[i] = data.draw(st.sampled_from(TOKENS), label="token")
    return "".join(toks)


def _swap(data, parts: list, label: str) -> list:
    i = _pick_index(data, len(parts), f"{label} i")
    j = _pick_index(data, len(parts), f"{label} j")
    parts[i], parts[j] = parts[j], parts[i]
    return parts


def swap_tokens(data, text):
    toks = tokenize(text)
    if len(toks) < 2:
        return text
    return "".join(_swap(data, toks, "swap"))


def repeat_token(data, text):
    # Deep nesting / long chains: `((((x`, `- - - x`, `not not x`, `x[0][0]`.
    toks = tokenize(text)
    if not toks:
        return text
    i = _pick_index(data, len(toks), "repeat")
    n = data.draw(st.sampled_from([2, 3, 10, 100, 1000, 3000]), label="times")
    tok = data.draw(st.sampled_from([toks[i], "(", "[", "-", "not ", "+", "x.T", "[0]",
                                     "x + ", "f(", "(x, ", "**x"]), label="what")
    return "".join(toks[:i]) + tok * n + "".join(toks[i:])


def _lines(text):
    return text.split("\n")


def duplicate_line(data, text):
    lines = _lines(text)
    i = _pick_index(data, len(lines), "dup line")
    lines.insert(i, lines[i])
    return "\n".join(lines)


def delete_line(data, text):
    lines = _lines(text)
    i = _pick_index(data, len(lines), "del line")
    del lines[i]
    return "\n".join(lines)


def swap_lines(data, text):
    return "\n".join(_swap(data, _lines(text), "swap line"))


def reindent_line(data, text):
    lines = _lines(text)
    i = _pick_index(data, len(lines), "reindent")
    indent = data.draw(st.sampled_from(["", " ", "  ", "   ", "    ", "     ", "        ",
                                        "\t", " \t", "\t    ", "\x0c", "    \x0c"]),
                       label="indent")
    lines[i] = indent + lines[i].lstrip(" \t")
    return "\n".join(lines)


def truncate(data, text):
    i = _pick_index(data, len(text), "truncate", inclusive=True)
    return text[:i]


def insert_char(data, text):
    i = _pick_index(data, len(text), "char at", inclusive=True)
    ch = data.draw(st.one_of(st.sampled_from(WEIRD + LAYOUT), st.characters()), label="char")
    return text[:i] + ch + text[i:]


def replace_char(data, text):
    if not text:
        return text
    i = _pick_index(data, len(text), "char at")
    ch = data.draw(st.one_of(st.sampled_from(WEIRD + LAYOUT + PUNCT), st.characters()),
                   label="char")
    return text[:i] + ch + text[i + 1:]


MUTATIONS = [insert_token, delete_token, replace_token, swap_tokens, repeat_token,
             duplicate_line, delete_line, swap_lines, reindent_line, truncate,
             insert_char, replace_char]


# --------------------------------------------------------------- property

def check_loads(text: str) -> None:
    """`loads` returns a module or raises a well-formed GradError."""
    try:
        module = dsl.loads(text)
    except dsl.GradError as err:
        assert isinstance(err.line, int) and err.line >= 1, (err.line, str(err))
        assert isinstance(err.col, int) and err.col >= 1, (err.col, str(err))
        # The error is in the text itself, or in a `.grad` file it imports.
        assert err.file == "<string>" or err.file.endswith(".grad"), (err.file, str(err))
        header = f"{err.file}:{err.line}:{err.col}: error:"
        assert str(err).startswith(header), (header, str(err))
    else:
        assert isinstance(module, dsl.Module)


@pytest.mark.parametrize("source", VALID_SEEDS, ids=lambda s: s.split("(")[0].split()[-1])
def test_seeds_load(source):
    # The unmutated seeds are valid programs, so mutations start from deep
    # inside the grammar and the checker.  Each of their definitions is a
    # function of the module (beside those it imports).
    defined = re.findall(r"^def (\w+)", source, re.MULTILINE)
    assert defined and set(defined) <= set(dsl.loads(source).functions), defined


@settings(max_examples=400 * SCALE, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_mutated_sources(data):
    text = data.draw(st.sampled_from(SEEDS), label="seed")
    n = data.draw(st.integers(1, 4), label="n mutations")
    for _ in range(n):
        mutate = data.draw(st.sampled_from(MUTATIONS), label="mutation")
        text = mutate(data, text)
    check_loads(text)


@settings(max_examples=150 * SCALE, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(tokens=st.lists(st.sampled_from(TOKENS + [" "] * 8 + ["\n"] * 4), max_size=40))
def test_token_soup(tokens):
    check_loads("".join(tokens))


@settings(max_examples=100 * SCALE, deadline=None)
@given(text=st.text(max_size=60))
def test_arbitrary_text(text):
    check_loads(text)


_IMPORT_NAMES = st.one_of(
    st.sampled_from(NAMES + KEYWORDS),
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,30}", fullmatch=True),
    st.builds(lambda c, n: c * n, st.sampled_from(["a", "_", "Z9"]), st.integers(1, 600)),
)


@settings(max_examples=100 * SCALE, deadline=None)
@given(module=_IMPORT_NAMES, names=st.lists(_IMPORT_NAMES, max_size=3),
       form=st.sampled_from(["import {m}\n", "from {m} import {n}\n",
                             "import {m}\ndef f(x):\n    return {m}.{n}(x)\n",
                             "from {m} import {n}\ndef f(x):\n    return {n}(x)\n"]))
def test_import_statements(module, names, form):
    # Imports look files up on disk (beside the importer, $GRAD_PATH, the
    # standard library): any name, however long, must fail cleanly.
    check_loads(form.format(m=module, n=", ".join(names) or "softplus"))


@pytest.mark.parametrize("depth", [50, 500, 5000])
@pytest.mark.parametrize("template", [
    "def f(x):\n    return {open}x{close}\n",
    "def f(x):\n    return {neg}x\n",
    "def f(x):\n    return x{chain}\n",
])
def test_deep_nesting(template, depth):
    text = template.format(open="(" * depth, close=")" * depth, neg="-" * depth,
                           chain=" + x" * depth)
    check_loads(text)
