"""Bad or unusual `.grad` source, each case a hole found by an adversarial
pass over the front end: keywords bound as names, comparisons of
compile-time sequences, flags that must be known at compile time, checkpoint
intervals beyond i64, source files with a byte-order mark or not in UTF-8,
and a property over mutated programs: each loads and its gradient matches
central differences, or it raises a well-formed `GradError`."""
from __future__ import annotations

import re
import sys
import unicodedata

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import dsl
from dsl.function import _types
from gradlang.compiler.interpret import interpret
from helpers import central_difference

X = np.array([0.3, -0.7, 1.1])
Y = np.array([0.9, 0.4, -0.6])


def load_error(source: str, file: str = "bad.grad") -> dsl.GradError:
    with pytest.raises(dsl.GradError) as info:
        dsl.loads(source, file)
    return info.value


def assert_well_formed(err: dsl.GradError, source: str) -> None:
    """FILE:LINE:COL header, a position inside the source, the line and a
    caret, then any notes (the call that reached a called function's line)."""
    lines = source.split("\n")
    assert 1 <= err.line <= len(lines), str(err)
    assert 1 <= err.col <= len(lines[err.line - 1]) + 1, str(err)
    rendered = str(err).splitlines()
    while rendered[-1].startswith("note: "):
        rendered.pop()
    assert rendered[0].startswith(f"{err.file}:{err.line}:{err.col}: error: "), str(err)
    assert rendered[-1].strip() and set(rendered[-1].strip()) <= {"^"}, str(err)


# --------------------------------------------------- keywords are not names

@pytest.mark.parametrize("source,line,col,word", [
    ("def f(True):\n    return True\n", 1, 7, "True"),
    ("def f(x):\n    True = x * 2.0\n    return True\n", 2, 5, "True"),
    ("def f(x):\n    a, False = x, x\n    return a\n", 2, 8, "False"),
    ("def f(x):\n    True += 1\n    return x\n", 2, 5, "True"),
    ("def f(x):\n    for True in range(3):\n        x = x * 2.0\n    return x\n", 2, 9, "True"),
    ("def True(x):\n    return x\n", 1, 5, "True"),
    ("param False: f64\ndef f(x):\n    return x\n", 1, 7, "False"),
    ("def f(x):\n    return x\ngrad(True):\n    return True\n", 3, 6, "True"),
    ("def f(in):\n    return in\n", 1, 7, "in"),
    ("def f(x):\n    and = x\n    return and\n", 2, 5, "and"),
    ("def f(x):\n    b, in = x, x\n    return b\n", 2, 8, "in"),
])
def test_a_keyword_cannot_be_bound_as_a_name(source, line, col, word):
    # The lexer reads a keyword as a name where no keyword fits, so these
    # parsed; `True` then read the literal: `def f(True): return True`
    # returned True for any argument, with gradient 0.
    err = load_error(source)
    assert (err.line, err.col) == (line, col), str(err)
    assert f"{word!r} is a keyword and cannot be used as a name" in err.message
    assert_well_formed(err, source)


def test_names_that_only_start_with_a_keyword_are_names():
    m = dsl.loads("def f(Truex, index, iff, order):\n    return Truex * index + iff * order\n")
    np.testing.assert_allclose(m.f(2.0, 3.0, 4.0, 5.0), 26.0)


# ------------------------------------------- comparing compile-time values

SHAPE_BRANCH = """
def by_shape(x{ann}):
    if x.shape == (3,):
        y = x * 2.0
    else:
        y = -x
    return y
"""


@pytest.mark.parametrize("ann", ["", ": f64[n]", ": f64[...]"])
def test_a_shape_compares_with_a_tuple_item_by_item(ann):
    # x.shape held a symbolic size that NumPy's == compared as unequal, so
    # the else branch ran for every shape.
    m = dsl.loads(SHAPE_BRANCH.format(ann=ann))
    np.testing.assert_array_equal(m.by_shape(X), 2 * X)
    np.testing.assert_array_equal(m.by_shape(np.ones(2)), -np.ones(2))


@pytest.mark.parametrize("expr, value", [
    ("x.shape[0] * 0.5", 1.5), ("0.5 * x.size", 1.5), ("x.shape[0] * True", 3),
    ("x.shape[0] * (1 > 0)", 3), ("2 ** x.shape[0]", 8), ("0.5 ** x.shape[0]", 0.125),
    ("x.shape[0] * x.shape[0] * 0.25", 2.25),
])
def test_a_size_times_a_float_or_a_bool_is_that_number(expr, value):
    # A symbolic size refused a product with a float or a bool (and any
    # power of it) with Python's TypeError instead of asking for the
    # concrete size, as every other arithmetic on it does.
    m = dsl.loads(f"def f(x):\n    return x * ({expr})\n")
    np.testing.assert_allclose(m.f(X), X * value, rtol=1e-15)
    np.testing.assert_allclose(dsl.grad(m.f)(X), np.full(3, float(value)), rtol=1e-15)


def test_sequences_of_constants_compare_as_in_python():
    m = dsl.loads("def f(x):\n    if (1, 2) < (1, 3) and [2, 2] == (2, 2) and (3,) != 3:\n"
                  "        y = x\n    else:\n        y = -x\n    return y\n")
    np.testing.assert_array_equal(m.f(X), X)


@pytest.mark.parametrize("expr, value", [
    ("10**20 != True", True), ("True < 2**70", True), ("2**70 >= False", True),
    ("-(10**20) == 1", False), ("10**20 > 10**20 - 1", True), ("2**64 == 2.0**64", True),
])
def test_constants_beyond_i64_compare_exactly(expr, value):
    # NumPy's comparison, which folded these, raised OverflowError for a
    # constant no integer dtype holds compared with a bool.
    m = dsl.loads(f"def f(x):\n    if {expr}:\n        y = x\n    else:\n        y = -x\n"
                  "    return y\n")
    np.testing.assert_array_equal(m.f(X), X if value else -X)


@pytest.mark.parametrize("expr,col,text", [
    # a ValueError (NumPy's truth value of an array) escaped
    ("x.shape < 3", 8, "cannot compare a tuple with a number using <"),
    # Var identity decided these at compile time, whatever the values
    ("(x,) == (x,)", 8, "cannot compare a tuple holding run-time values"),
    ("[x * 2.0] != [x]", 8, "cannot compare a list holding run-time values"),
])
def test_comparing_sequences_that_python_could_not_is_an_error_at_it(expr, col, text):
    source = f"def f(x):\n    if {expr}:\n        y = x\n    else:\n        y = -x\n    return y\n"
    m = dsl.loads(source, "bad.grad")
    with pytest.raises(dsl.GradError) as info:
        m.f(X)
    assert (info.value.line, info.value.col) == (2, col), str(info.value)
    assert text in info.value.message
    assert_well_formed(info.value, source)


# ------------------------------------ flags and constants at compile time

@pytest.mark.parametrize("call", ["sum(x, keepdims=x)", "mean(x, keepdims=sum(x) > 0.0)",
                                  "max(x, axis=0, keepdims=(1,))"])
def test_keepdims_must_be_known_at_compile_time(call):
    # A run-time array was truthy as a Python object: keepdims=True, silently.
    m = dsl.loads(f"def f(x):\n    return {call}\n", "bad.grad")
    with pytest.raises(dsl.GradError, match="keepdims must be True or False") as info:
        m.f(X)
    assert (info.value.line, info.value.col) == (2, 12)


def test_keepdims_from_a_const_argument_still_works():
    m = dsl.loads("def f(x, k: const bool = True):\n    return sum(x, keepdims=k)\n")
    np.testing.assert_allclose(m.f(X), np.sum(X, keepdims=True), rtol=1e-15)
    np.testing.assert_allclose(m.f(X, False), np.sum(X), rtol=1e-15)
    assert m.f(X).shape == (1,) and m.f(X, False).shape == ()


@pytest.mark.parametrize("expr", ["3.0 % 0.0", "3 % 0", "3 // 0", "2.5 // 0.0", "1 / 0"])
def test_a_compile_time_division_by_zero_says_so(expr):
    # 3.0 % 0.0 said "compile-time arithmetic failed: float modulo"
    m = dsl.loads(f"def f(x):\n    return x * ({expr})\n", "bad.grad")
    with pytest.raises(dsl.GradError) as info:
        m.f(X)
    assert info.value.message == "compile-time arithmetic failed: division by zero"
    assert (info.value.line, info.value.col) == (2, 17)


@pytest.mark.parametrize("body, col", [
    ("broadcast_to(x, [2**63 - 1, 3])", 12), ("sum(broadcast_to(x, [2**62, 3]))", 16),
    ("x * broadcast_to(x, [x.shape[0] * 2**61, 3])", 16),
    ("sum(segment_sum(x, stack([0, 1, 0]), 2**62))", 16),
    ("sum(broadcast_to(x, [2**31, 1, 3]) * broadcast_to(x, [2**31, 3]))", 16),
])
def test_a_value_no_memory_could_hold_is_an_error_where_it_is_made(body, col):
    # NumPy's "Maximum allowed dimension exceeded" (or "negative dimensions
    # not allowed", the element count having wrapped) came out of the driver.
    source = f"def f(x):\n    return {body}\n"
    m = dsl.loads(source, "bad.grad")
    for call in (m.f, dsl.grad(m.f)):
        with pytest.raises(dsl.GradError) as info:
            call(X)
        assert "needs more memory than can be addressed" in info.value.message
        assert (info.value.line, info.value.col) == (2, col)
        assert_well_formed(info.value, source)


def test_a_float_power_that_overflows_says_so():
    # The message was OverflowError's tuple: (34, 'Numerical result out of range').
    m = dsl.loads("def f(x):\n    return x * (10.0 ** 400)\n", "bad.grad")
    with pytest.raises(dsl.GradError) as info:
        m.f(X)
    assert info.value.message == ("compile-time arithmetic failed: the result is beyond "
                                  "the range of f64")
    assert (info.value.line, info.value.col) == (2, 17)


@pytest.mark.parametrize("wrt,got", [
    # a compile-time float or tuple was called "a value computed at run time"
    ("1.5", "got 1.5"), ("((0,),)", "got (0,)"), ("x.shape[0]", "got 3"),
    ("sum(x) > 0.0", "got a value computed at run time"),
])
def test_a_bad_wrt_is_named_as_it_is(wrt, got):
    m = dsl.loads(f"def h(x, y):\n    return sum(x * y)\ndef f(x):\n"
                  f"    return grad(h, wrt={wrt})(x, x)\n", "bad.grad")
    with pytest.raises(dsl.GradError) as info:
        m.f(X)
    assert info.value.message == (f"wrt must be parameter positions of h() (0 to 1, or -2 to -1 "
                                  f"from the end), {got}")
    assert (info.value.line, info.value.col) == (4, 12)


@pytest.mark.parametrize("wrt,col,got", [("2", 24, "2"), ("-3", 24, "-3"), ("(0, 2)", 28, "2")])
def test_a_written_wrt_position_out_of_range_is_an_error_at_it(wrt, col, got):
    # the error pointed at the whole grad(...) call, and only once lowered
    with pytest.raises(dsl.GradError) as info:
        dsl.loads(f"def h(x, y):\n    return sum(x * y)\ndef f(x):\n"
                  f"    return grad(h, wrt={wrt})(x, x)\n", "bad.grad")
    assert info.value.message == (f"wrt must be parameter positions of h() (0 to 1, or -2 to -1 "
                                  f"from the end), got {got}")
    assert (info.value.line, info.value.col) == (4, col)


# --------------------------------------------------------------- defaults

@pytest.mark.parametrize("param,col,text", [
    # each of these loaded, and the default was used as written: x * 1.5
    # for an i64, 1e20 as a float for an i64
    # (a default is taken as the same number passed from Python is:
    # test_defaults.py::test_a_default_and_a_callers_number_are_taken_as_from_python)
    ("a: i64 = 1.5", 19, "the default of 'a' must hold i64 values (whole numbers), not 1.5"),
    ("a: bool = 2", 20, "the default of 'a' must hold bool values (0 or 1), not 2"),
    ("a: i64 = True", 19, "the default of 'a' is a bool (True), but its annotation says i64: "
                          "pass an integer"),
    ("a: i64 = 99999999999999999999", 19, "the constant 99999999999999999999 does not fit "
                                          "in i64"),
    ("a: const i32 = 3000000000", 25, "does not fit in i32"),
    ("a: f32 = 1e39", 19, "is beyond the range of f32"),
    # (this one loaded, and each call leaving a out was refused at the def)
    ("a: f64[3] = 1.0", 22, "the default 1.0 of 'a' is a number, but its annotation f64[3] "
                            "has rank 1"),
    ("a: const f64[n, 2] = 0", 31, "annotation f64[n, 2] has rank 2"),
])
def test_a_default_must_be_a_value_of_its_dtype(param, col, text):
    source = f"def f(x, {param}):\n    return x * a\n"
    err = load_error(source)
    assert (err.line, err.col) == (1, col), str(err)
    assert text in err.message
    assert_well_formed(err, source)


def test_an_integer_default_of_a_float_parameter_is_a_float():
    # `a: f64 = 2` was the integer 2: i64 * a gave an i64 array.
    m = dsl.loads("def f(n: i64[3], a: f64 = 2, k: const i64 = -3):\n    return n * a + k\n")
    out = m.f(np.array([1, 2, 3]))
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [-1.0, 1.0, 3.0])


# ------------------------------------------------------- checkpoint interval

EVERY = """
@recompute(every={every})
def saved(x, n: i64):
    for i in range(0, n, 4):
        x = sin(x) * 1.5
    return x

def plain(x, n: i64):
    for i in range(0, n, 4):
        x = sin(x) * 1.5
    return x
"""


def test_an_interval_beyond_i64_is_an_error_at_load():
    # The literal reached the driver's code: OverflowError at the first call.
    source = EVERY.format(every=10 ** 22)
    err = load_error(source)
    assert (err.line, err.col) == (2, 18) and "does not fit in i64" in err.message
    assert_well_formed(err, source)


def test_a_repeated_interval_is_an_error_at_the_second():
    # The first was used and the second ignored.
    source = EVERY.format(every="2, every=3")
    err = load_error(source)
    assert (err.line, err.col) == (2, 21) and "keyword argument 'every' repeated" in err.message
    assert_well_formed(err, source)


def test_an_interval_longer_than_the_loop_runs_it_as_one_segment():
    # every * step overflowed i64 (2**62 * 4): OverflowError at the call.
    m = dsl.loads(EVERY.format(every=2 ** 62))
    x = np.array([0.5, -1.0])
    value, grad = dsl.value_and_grad(m.saved)(x, 9)
    expected_value, expected_grad = dsl.value_and_grad(m.plain)(x, 9)
    np.testing.assert_allclose(value, expected_value, rtol=1e-15)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-15)


# ------------------------------------------------------------- source files

def test_a_file_with_a_byte_order_mark_loads_and_imports(tmp_path):
    # Python reads such files; the BOM was a syntax error at 1:1.
    (tmp_path / "marked.grad").write_bytes(b"\xef\xbb\xbfdef h(x):\n    return x * 3.0\n")
    (tmp_path / "user.grad").write_text("import marked\ndef g(x):\n    return marked.h(x)\n")
    assert dsl.load(tmp_path / "marked.grad").h(2.0) == 6.0
    assert dsl.grad(dsl.load(tmp_path / "user.grad").g)(2.0) == 3.0


@pytest.mark.parametrize("importer", [False, True])
def test_a_file_not_in_utf8_is_an_error_at_the_bad_byte(tmp_path, importer):
    # Was `cannot read ...: 'utf-8' codec can't decode ...` at 1:1 with no
    # source line, or, in another locale, text silently decoded otherwise.
    bad = tmp_path / "latin.grad"
    bad.write_bytes("def f(x):\n    # café\n    return x\n".encode("latin-1"))
    path = bad
    if importer:
        path = tmp_path / "user.grad"
        path.write_text("import latin\ndef g(x):\n    return x\n")
    with pytest.raises(dsl.GradError) as info:
        dsl.load(path)
    err = info.value
    assert (err.file, err.line, err.col) == (str(bad), 2, 10), str(err)
    assert "not UTF-8 text: byte 0xe9" in err.message
    assert str(err).splitlines()[-1] == " " * 13 + "^"


@pytest.mark.parametrize("newline", ["\r\n", "\r"])
def test_lines_end_as_python_reads_them(tmp_path, newline):
    # A lone '\r' (old Mac line ends) was no line end: a file starting with
    # a comment loaded as one comment line, with no functions; a '\r\n'
    # file's error printed its source line with the '\r'.
    good = "# twice x\ndef f(x):\n    return x * 2.0\n".replace("\n", newline)
    assert dsl.loads(good).f(1.5) == 3.0
    path = tmp_path / "bad.grad"
    path.write_bytes(good.replace("2.0", "zz").encode())
    with pytest.raises(dsl.GradError) as info:
        dsl.load(path)
    assert (info.value.line, info.value.col) == (3, 16)
    assert str(info.value).split("\n")[1:] == ["        return x * zz", " " * 19 + "^^"]
    path.write_bytes(f"# caf\xe9{newline}def f(x):".encode("latin-1"))
    with pytest.raises(dsl.GradError) as info:  # counted as the parser counts lines
        dsl.load(path)
    assert (info.value.line, info.value.col) == (1, 6)
    path.write_bytes(f"# x{newline}#{newline}  y = caf\xe9".encode("latin-1"))
    with pytest.raises(dsl.GradError) as info:
        dsl.load(path)
    assert (info.value.line, info.value.col) == (3, 10)
    assert str(info.value).splitlines()[-1] == " " * 13 + "^"


@pytest.mark.parametrize("source", [
    "def f(x):\n    return maximum(x,\n\t\tx * 2.0)\n",
    "def f(x):\n    y = [x * 2.0, # a comment (\n\t x]\n    return y[0]\n",
    "def f(x):\n    return x \\ \n\t* 2.0\n",
    # (a form feed after the backslash, as the lexer's LINE_CONT takes)
    "def f(x):\n    return x \\\f\n\t* 2.0\n",
])
def test_a_tab_that_continues_a_line_is_no_indentation(source):
    # "tabs are not allowed in indentation" at the continuation line, which
    # Python (and the lexer) take: it is inside brackets or after a backslash
    assert dsl.loads(source).f(1.5) == 3.0


@pytest.mark.parametrize("source", [
    "def g(x):\n    return x\n\f\ndef f(x):\n    return x * 2.0\n",  # a page break
    "\fdef f(x):\n    return x * 2.0\n",
    "def f(x):\n\f    y = x * 2.0\n    return y\n",
    "def f(x):\n    return x *\f2.0\n",
])
def test_a_form_feed_is_whitespace_as_in_python(source):
    # "unexpected character '\x0c'": Python takes a form feed (a page break,
    # as Emacs writes ^L between sections) as whitespace, and at a line's
    # start as no indentation
    import ast
    ast.parse(source)  # (Python's own parser takes each)
    assert dsl.loads(source).f(1.5) == 3.0


@pytest.mark.parametrize("source,line,col,text", [
    ('def g(x, y):\n        a = einsum("i,i(", x, y)\n\treturn a\n', 3, 1,
     "tabs are not allowed in indentation; use spaces"),
    ("def g(x, y):\n        a = einsum('i[,i', x, y)\n\treturn a\n", 3, 1,
     "tabs are not allowed in indentation; use spaces"),
    ('def g(x):\n    return einsum("i(", x)\ndef f(x):\n    s = x\n'
     + "".join("    " * k + f"for i{k} in range(1):\n" for k in range(1, 101))
     + "    " * 101 + "s = s + x\n    return s\n", 104, 401,
     "too many levels of indentation: blocks nest at most 99 deep, as in Python"),
])
def test_a_bracket_in_a_string_continues_no_line(source, line, col, text):
    # the indentation check took each line after einsum("i(", x) for one
    # continued inside brackets, so checked none of them: a tab indented
    # (the lexer counting it as 8 spaces), and blocks nested 100 deep loaded
    # and reached Python as a driver: IndentationError, a traceback
    err = load_error(source)
    assert (err.line, err.col, err.message) == (line, col, text), str(err)


def test_a_tab_after_a_form_feed_is_still_indentation_by_tab():
    # the indentation check skipped only form feeds that start the line,
    # then stopped at one: " \f\t" loaded, the lexer counting the tab as 8
    with pytest.raises(dsl.GradError, match="tabs are not allowed") as info:
        dsl.loads("def f(x):\n \f\treturn x\n")
    assert (info.value.line, info.value.col) == (2, 3)


@pytest.mark.parametrize("source,col,char", [
    ("def f(x):\n    return x * \u0663\n", 16, "\u0663"),            # Arabic-Indic 3
    ("def f(x):\n    return x[\uff11]\n", 14, "\uff11"),             # fullwidth 1
    ("def f(x):\n    return x * 1.\uff15e\uff11\n", 18, "\uff15"),  # 1.5e1, fullwidth
    ("def f(x: f64[\uff12]):\n    return x\n", 14, "\uff12"),
])
def test_a_digit_that_is_not_ascii_is_no_number(source, col, char):
    # the lexer's \d took any Unicode digit: `x * ٣` was x * 3 and `x[１]`
    # x[1] (as an IME's fullwidth digits type), where Python stops at them
    err = load_error(source)
    assert (err.col, err.message) == (col, f"syntax error: unexpected character {char!r} "
                                           f"(U+{ord(char):04X} {unicodedata.name(char)}): "
                                           f"{ASCII_NAMES}")
    assert_well_formed(err, source)


ASCII_NAMES = "names and numbers are written in ASCII letters, digits and underscores"


@pytest.mark.parametrize("source,col,said", [
    ("def f(x):\n    return \u0445 * 2.0\n", 12,
     f"'\u0445' (U+0445 CYRILLIC SMALL LETTER HA): {ASCII_NAMES}"),
    ("def f(x):\n    \uff59 = x\n    return \uff59\n", 5,
     f"'\uff59' (U+FF59 FULLWIDTH LATIN SMALL LETTER Y): {ASCII_NAMES}"),
    ("def f(x):\n    return x\u200b * 2.0\n", 13, "'\\u200b' (U+200B ZERO WIDTH SPACE)"),
])
def test_a_character_that_looks_like_another_is_named(source, col, said):
    # "unexpected character 'х'" at what reads as an x: a Cyrillic
    # confusable, a fullwidth letter or an invisible space is now named
    err = load_error(source)
    assert (err.line, err.col, err.message) == (2, col, f"syntax error: unexpected character "
                                                        f"{said}")
    assert_well_formed(err, source)


@pytest.mark.parametrize("source,col,width", [
    ("def f(x):\n    return x * 010\n", 16, 3),
    ("def f(x):\n    return x * -010\n", 17, 3),
    ("def f(x):\n    return x[01]\n", 14, 2),
    ("def f(x: f64[02]):\n    return x\n", 14, 2),
])
def test_an_integer_with_leading_zeros_is_an_error_as_in_python(source, col, width):
    # `x * 010` was x * 10, where C (and Python 2) read octal 8 and
    # Python 3 stops
    err = load_error(source)
    assert err.col == col and "leading zeros" in err.message
    assert str(err).splitlines()[-1].strip() == "^" * width


def test_zero_and_floats_with_leading_zeros_are_numbers_as_in_python():
    assert dsl.loads("def f(x):\n    return x * 00 + 0 + 010.5 + 007e1\n").f(1.0) == 80.5


def test_a_tab_that_indents_is_still_an_error_after_a_comment_ending_in_a_backslash():
    err = load_error("def f(x):\n    y = x  # \\\n\treturn y\n")
    assert (err.line, err.col) == (3, 1) and "tabs are not allowed" in err.message


def test_the_caret_under_a_line_with_tabs_lands_under_the_column():
    # the caret was padded with one space per tab: a terminal showed it
    # columns to the left of the '*'
    err = load_error("def f(x):\n    return x\t+\t* 2\n")
    assert (err.line, err.col) == (2, 16)
    assert str(err).split("\n")[1:] == ["        return x\t+\t* 2", " " * 16 + "\t \t^"]


def test_control_characters_in_a_shown_line_do_not_reach_the_terminal():
    # the line was printed as it is: an escape sequence in a file (here,
    # red text) acted on the terminal of whoever ran gradc on it
    err = load_error("def f(x):\n    return x * \x1b[31m2\x00\n")
    assert str(err).split("\n")[1:] == ["        return x * \ufffd[31m2\ufffd", " " * 19 + "^"]
    # nor do the format characters a terminal acts on: a bidirectional
    # override (U+202E) that displayed the rest of the line reversed, and a
    # zero-width space (U+200B) that shifted the caret one column left of
    # its place; a line separator (U+2028) in a comment broke the line
    err = load_error("def f(x):  # \u202e\u2028\n    return x\u200b * 2\n")
    assert str(err).split("\n")[1:] == ["        return x\ufffd * 2", " " * 16 + "^"]
    err = load_error("def f(x)  # \u202e:\n    return x\n")
    assert str(err).split("\n")[1] == "    def f(x)  # \ufffd:"


def test_control_characters_in_a_file_name_do_not_reach_the_terminal():
    # the file name heads the diagnostic as it is: an escape sequence in it
    # acted on the terminal, and a newline forged a diagnostic line
    with pytest.raises(dsl.GradError) as info:
        dsl.loads("def f(x):\n    return y\n", "a\x1b[2Jb\nc.grad:9:9: error: forged\r")
    assert str(info.value).split("\n")[0] == ("a\ufffd[2Jb\ufffdc.grad:9:9: error: "
                                              "forged\ufffd:2:12: error: name 'y' is not defined")
    # nor through a message or a note that names the file
    with pytest.raises(dsl.GradError) as info:
        dsl.load("no\x1b[2Jsuch.grad")
    info.value.add_note("in no\x1b[2Jsuch.grad")
    assert str(info.value) == ("no\ufffd[2Jsuch.grad:1:1: error: no such file: no\ufffd[2Jsuch.grad"
                               "\nnote: in no\ufffd[2Jsuch.grad")
    # a name that is not UTF-8 (os.fsdecode's lone surrogates): no UTF-8
    # stream could print the error
    with pytest.raises(dsl.GradError) as info:
        dsl.loads("def f(x):\n    return y\n", "bad\udcff.grad")
    assert str(info.value).startswith("bad\ufffd.grad:2:12: error:")
    str(info.value).encode("utf-8")


def test_a_byte_order_mark_counts_no_column(tmp_path):
    # A byte that is not UTF-8 in a file with the mark was reported at the
    # wrong place, as the wrong byte ('e' at 1:3 here).
    path = tmp_path / "marked.grad"
    path.write_bytes(b"\xef\xbb\xbfdef f\xe9(x):\n")
    with pytest.raises(dsl.GradError) as info:
        dsl.load(path)
    assert (info.value.line, info.value.col) == (1, 6)
    assert "byte 0xe9" in info.value.message
    assert str(info.value).splitlines()[1:] == ["    def f\ufffd(x):", " " * 9 + "^"]


@pytest.mark.parametrize("main,line,col,text", [
    # loaded; `relu(x)` then failed at the call: "'relu' is a value, not a function"
    ("param relu: f64\nfrom std import relu\ndef f(x):\n    return relu(x) * relu\n", 1, 1,
     "'relu' is already defined, as an imported function"),
    ("from a import g\ndef w(x):\n    return g(x)\n", 2, 5,
     "'w' is already defined, as a param of an imported module"),
    ("import a\nfrom b import w\ndef f(x):\n    return w(x)\n", 2, 1,
     "'w' is already defined, as a param of another imported module"),
])
def test_a_param_and_a_function_may_not_share_a_name_across_imports(tmp_path, main, line,
                                                                     col, text):
    (tmp_path / "a.grad").write_text("param w: f64\ndef g(x):\n    return x * w\n")
    (tmp_path / "b.grad").write_text("def w(x):\n    return x\n")
    (tmp_path / "main.grad").write_text(main)
    with pytest.raises(dsl.GradError) as info:
        dsl.load(tmp_path / "main.grad")
    err = info.value
    assert (err.file, err.line, err.col) == (str(tmp_path / "main.grad"), line, col), str(err)
    assert err.message == text
    assert_well_formed(err, main)


@pytest.mark.parametrize("source,line,col,text", [
    ("param a: f64[2]\ndef a(x):\n    return x\n", 2, 5,
     "'a' is already defined, as a param at line 1"),
    ("def a(x):\n    return x\nparam a: f64[2]\n", 3, 1,
     "'a' is already defined, as a function at line 1"),
])
def test_a_param_and_a_function_of_one_file_may_not_share_a_name(source, line, col, text):
    # (it said "as an imported function", of a def in the same file)
    err = load_error(source)
    assert (err.line, err.col, err.message) == (line, col, text), str(err)
    assert_well_formed(err, source)


@pytest.mark.parametrize("main,line,col,text", [
    # loaded; f() was then refused until the param was set ("f() reads
    # param 'std', which is not set"), though it reads only the module
    ("import std\nparam std: f64\ndef f(x):\n    return std.relu(x)\n", 2, 1,
     "'std' is already defined, as an imported module"),
    ("from a import g\nimport std\ndef f(x):\n    return std.relu(x) + g(x)\n", 2, 1,
     "'std' is already defined, as a param of an imported module"),
])
def test_a_param_and_an_imported_module_may_not_share_a_name(tmp_path, main, line, col, text):
    (tmp_path / "a.grad").write_text("param std: f64\ndef g(x):\n    return x * std\n")
    (tmp_path / "main.grad").write_text(main)
    with pytest.raises(dsl.GradError) as info:
        dsl.load(tmp_path / "main.grad")
    err = info.value
    assert (err.file, err.line, err.col, err.message) == (str(tmp_path / "main.grad"), line,
                                                          col, text), str(err)
    assert_well_formed(err, main)


def test_one_name_imported_from_two_modules_is_an_error_as_a_def_after_it_is(tmp_path):
    # `from b import g` then `from c import g` once took c's silently,
    # where a `def g` after the import is "already imported"
    (tmp_path / "b.grad").write_text("def g(x):\n    return x + 1.0\n")
    (tmp_path / "c.grad").write_text("def g(x):\n    return x + 100.0\n")
    (tmp_path / "again.grad").write_text("from b import g\ndef h(x):\n    return g(x)\n")
    main = "from b import g\nfrom again import g, h\nfrom c import g\ndef f(x):\n    return g(x)\n"
    (tmp_path / "main.grad").write_text(main)
    with pytest.raises(dsl.GradError) as info:
        dsl.load(tmp_path / "main.grad")
    err = info.value  # (b's g through `again` is the same function: no error)
    assert (err.line, err.col) == (3, 1), str(err)
    assert err.message == f"function 'g' is already imported, from {tmp_path / 'b.grad'}"
    assert_well_formed(err, main)


def test_an_imported_param_without_a_namesake_is_still_set_from_the_importer(tmp_path):
    (tmp_path / "a.grad").write_text("param w: f64\ndef g(x):\n    return x * w\n")
    (tmp_path / "main.grad").write_text("from a import g\ndef f(x):\n    return g(x)\n")
    m = dsl.load(tmp_path / "main.grad")
    m.params["w"] = 3.0
    assert m.f(2.0) == 6.0 and dsl.grad(m.f, wrt=(0, "w"))(2.0) == (3.0, 2.0)


@pytest.mark.parametrize("main", [
    "import shp\n\ndef f(x):\n    return shp.g(x, stack([x, x, x], axis=1))\n",
    "from shp import g\n\ndef f(x):\n    return g(x, stack([x, x, x], axis=1))\n",
])
def test_an_error_in_an_imported_function_shows_that_files_line(tmp_path, main):
    # The caret line was the importer's line 2 (blank here) under shp.grad:2:12.
    (tmp_path / "shp.grad").write_text("def g(x, y):\n    return x + y\n")
    (tmp_path / "main.grad").write_text(main)
    m = dsl.load(tmp_path / "main.grad")
    with pytest.raises(dsl.GradError) as info:
        m.f(np.ones(2))
    err = info.value
    assert (err.file, err.line, err.col) == (str(tmp_path / "shp.grad"), 2, 12)
    assert str(err).splitlines()[1:] == ["        return x + y", " " * 15 + "^^^^^",
                                         f"note: in g(), called at {tmp_path / 'main.grad'}:4:12"]



def test_a_function_may_call_an_imported_namesake(tmp_path):
    # a call of lib.act inside act was refused as a recursive call of act()
    (tmp_path / "lib.grad").write_text("def act(x):\n    return x * x\n"
                                       "grad(dy):\n    return dy * 2.0 * x\n")
    (tmp_path / "main.grad").write_text("import lib\n\ndef act(x):\n"
                                        "    return sum(lib.act(x) * 3.0)\n")
    m = dsl.load(tmp_path / "main.grad")
    x = np.array([0.5, -1.0, 2.0])
    assert m.act(x) == 3.0 * np.sum(x * x)
    np.testing.assert_allclose(dsl.grad(m.act)(x), 6.0 * x, rtol=1e-15)

@pytest.mark.parametrize("transform,expected", [
    ("grad(lib.f)(x)", lambda x: 6.0 * x),
    ("value_and_grad(lib.f)(x)[1]", lambda x: 6.0 * x),
    ("jvp(lib.f)(x, x)[1]", lambda x: 6.0 * x * x)])
def test_a_transform_of_an_imported_function_resolves_its_body_in_its_module(
        tmp_path, transform, expected):
    # grad(lib.f) lowered f's body in the importer's namespace: lib's own
    # helper was "unknown function 'helper'" (a plain call lib.f(x) worked)
    (tmp_path / "lib.grad").write_text("def helper(x):\n    return x * 3.0\n\n"
                                       "def f(x):\n    return helper(x) * x\n")
    (tmp_path / "main.grad").write_text(f"import lib\n\ndef g(x):\n    return {transform}\n")
    m = dsl.load(tmp_path / "main.grad")
    x = np.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(interpret(m.g.lower(_types(m.g.bind((x,), {}))), x)[0],
                               expected(x), rtol=1e-15)


def test_an_error_in_a_helper_of_the_same_file_names_the_call_that_reached_it():
    # a helper called twice: the error's line is the helper's, which both
    # calls share; only the note tells the second call (line 6) from the first
    source = ("def dense(x, w):\n    return x @ w\n\n"
              "def f(x, w1, w2):\n    h = dense(x, w1)\n    return sum(dense(h, w2))\n"
              "def outer(x, w1, w2):\n    return f(x, w1, w2) * 2.0\n")
    m = dsl.loads(source, "model.grad")
    args = (np.ones((2, 3)), np.ones((3, 4)), np.ones((5, 1)))
    for entry in (m.f, m.outer):  # the innermost call that holds it, at any depth
        with pytest.raises(dsl.GradError) as info:
            entry(*args)
        err = info.value
        assert (err.file, err.line, err.col) == ("model.grad", 2, 12)
        assert str(err).splitlines()[-1] == "note: in dense(), called at model.grad:6:16"
    with pytest.raises(dsl.GradError) as info:  # in the entry function's own text: no note
        dsl.loads("def f(x, w):\n    return x @ w\n", "model.grad").f(*args[1:])
    assert info.value.note is None


def test_an_error_at_run_time_in_a_helper_names_the_call_that_reached_it():
    # the same note as at load, for the checks a call makes of its values:
    # an index out of range (at the helper's second call), a loop's range
    # (in its body: a function the loop equation holds) and a max over an
    # empty axis; and in the gradient, whose equations a later pass made
    source = ("def pick(x, i: int):\n    return x[i]\n\n"
              "def f(x, i: int, j: int):\n    return pick(x, i) + pick(x, j)\n\n"
              "def steps(x, s: int):\n    for k in range(0, 4, s):\n        x = x * 2.0\n"
              "    return x\n\n"
              "def top(x):\n    return max(x, axis=1)\n\n"
              "def g(x, s: int):\n    return sum(steps(x, s)) + sum(top(x))\n")
    m = dsl.loads(source, "model.grad")
    x = np.array([1.0, 2.0, 4.0])
    assert m.f(x, 0, -1) == 5.0
    cases = [((m.f, (x, 0, 3)), (2, 12), "pick(), called at model.grad:5:25"),
             ((m.g, (x[None], 0)), (8, 5), "steps(), called at model.grad:16:16"),
             ((m.g, (np.ones((2, 0)), 1)), (13, 12), "top(), called at model.grad:16:35")]
    for (fn, args), place, note in cases:
        for call in (fn, dsl.grad(fn)):
            with pytest.raises(dsl.ArgumentError) as info:
                call(*args)
            assert (info.value.line, info.value.col) == place
            assert str(info.value).splitlines()[-1] == f"note: in {note}"


def test_nesting_too_deep_in_an_imported_file_is_reported_in_that_file(tmp_path):
    # Reported at the importer's line with the most brackets (here 5).
    # (A chain `x + x + ...` nests on the left and compiles at any length.)
    (tmp_path / "deep.grad").write_text("def g(x):\n    return " + "(x + " * 2000 + "x"
                                        + ")" * 2000 + "\n")
    for main in ("import deep\n\n\ndef f(x):\n    return deep.g(x) * (((x)))\n",
                 "from deep import g\ndef f(x):\n    return g(x) * (((x)))\n"):
        (tmp_path / "main.grad").write_text(main)
        with pytest.raises(dsl.GradError, match="nested too deeply") as info:
            dsl.load(tmp_path / "main.grad")
        assert (info.value.file, info.value.line) == (str(tmp_path / "deep.grad"), 2)
        assert_well_formed(info.value, (tmp_path / "deep.grad").read_text())


def test_nesting_too_deep_to_lower_is_reported_in_the_file_of_the_code(tmp_path):
    # Lowering recursion in an imported function was put on the entry module.
    (tmp_path / "flat.grad").write_text("def g(x):\n    return " + "x + (" * 150 + "x"
                                        + ")" * 150 + "\n")
    (tmp_path / "main.grad").write_text("import flat\n\n\ndef f(x):\n"
                                        "    return flat.g(x) * (((x)))\n")
    m = dsl.load(tmp_path / "main.grad")
    depth = 0
    frame = sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + 250)  # room to reach g, not to lower its nested sum
    try:
        with pytest.raises(dsl.GradError, match="nested too deeply") as info:
            m.f(X)
    finally:
        sys.setrecursionlimit(limit)
    assert (info.value.file, info.value.line) == (str(tmp_path / "flat.grad"), 2)
    assert info.value.note == f"in g(), called at {tmp_path / 'main.grad'}:5:12"
    np.testing.assert_allclose(m.f(X), 151 * X * X)  # with the usual limit, it lowers


# ---------------------------------- mutated programs: right or a clean error

# Differentiable programs without grad blocks (a mutated hand-written block
# may be a wrong VJP on purpose; an automatic gradient never may).
SEEDS = [
    """def f(x, y):
    a = x * y + sin(x)
    b = exp(-a * a) / (1.0 + y * y)
    return sum(a * b) + mean(tanh(x - y))
""",
    """def g(u, v):
    return u * v + log1p(u * u)

def f(x, y):
    s = g(x, y)
    t, r = x + y, x - y
    t += 2.0
    r *= 0.5
    return sum(s * t) - sum(r ** 2)
""",
    """def f(x, y):
    h = x
    for i in range(3):
        h = tanh(h * y + x[i])
    return sum(h)
""",
    """def f(x, y):
    if sum(x) > 100.0:
        z = x * y
    else:
        z = sin(x) * y
    return sum(z) + x[0] * y[2] + sum(x[1:] * y[:2])
""",
    """def f(x, y):
    m = stack([x, y])
    c = concatenate([x, y], axis=0)
    return sum((m @ x) ** 2) + sum(c * c) + sum(x @ m.T) + sum(sqrt(x * x + 1.0))
""",
    """def f(x, y):
    z = reshape(stack([x, y], axis=1), [2, 3])
    p = sum(z, axis=0, keepdims=True)
    return sum(broadcast_to(p, [2, 3]) * z) / x.shape[0] + sum(sigmoid(z) * erf(z))
""",
    """def sq(x):
    return x * x
def f(x, y):
    v, d = value_and_grad(sq)(y)
    return sum(grad(sq)(x * y) * cosh(x)) + sum(v) + sum(d * x)
""",
]

_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+\.?\d*(?:e-?\d+)?|\*\*|//|[-+*/@%]|\s+|.",
                    re.S)
# A token is swapped for one of its kind, so that most mutants still parse
# and the property reaches the checker, the lowering and the gradients.
_KINDS = [
    ["sin", "cos", "tanh", "exp", "sigmoid", "erf", "cosh", "arctan", "log1p", "abs",
     "sqrt", "log", "floor", "sum", "mean", "max", "stack", "reshape", "range", "g", "sq",
     "grad", "f"],
    ["x", "y", "a", "b", "h", "z", "m", "i", "x[1:]", "y.T", "(x * y)", "sum(x)", "x.shape[0]",
     "(x, y)", "[x]", "True", "2.0", "0"],
    ["+", "-", "*", "/", "**", "@", "//", "%", "<", "==", ","],
    ["0", "1", "2", "0.5", "3", "1e-3", "2.0", "100.0", "-1.0", "x.shape[0]", "x"],
]


def _kind(token: str) -> list[str] | None:
    """The tokens `token` may be swapped for (None: punctuation, kept)."""
    if token[0].isdigit():
        return _KINDS[3]
    return next((kind for kind in _KINDS if token in kind),
                _KINDS[1] if token.isidentifier() else None)


@st.composite
def mutated(draw) -> str:
    tokens = _TOKEN.findall(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 3))):
        # Layout and brackets stay (test_fuzz.py mutates those; its mutants
        # are mostly syntax errors); one mutation in ten deletes or repeats.
        what = draw(st.sampled_from(["swap"] * 8 + ["delete", "duplicate"]))
        if what == "swap":
            i = draw(st.sampled_from([i for i, t in enumerate(tokens) if _kind(t)]))
            tokens[i] = draw(st.sampled_from(_kind(tokens[i])))
            continue
        i = draw(st.sampled_from([i for i, t in enumerate(tokens) if not t.isspace()]))
        if what == "delete":
            del tokens[i]
        else:
            tokens.insert(i, tokens[i])
    return "".join(tokens)


def _interpreted(f, args) -> tuple[np.ndarray, ...]:
    """f on args by the IR's NumPy interpreter: no kernels compiled."""
    bound = f.bind(args, {})
    with np.errstate(all="ignore"):
        return interpret(f.lower(_types(bound)), *bound.values())


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(source=mutated())
@example(source=SEEDS[1].replace("g(x, y)", "g((x, y), y)"))  # an error in g(), then a note
def test_a_mutated_program_is_right_or_a_clean_error(source):
    try:
        m = dsl.loads(source, "mutated.grad")
        f = m.f
        value = _interpreted(f, (X, Y))
        grads = _interpreted(dsl.grad(f, wrt=(0, 1)), (X, Y))
    except dsl.ArgumentError:
        return  # f's signature changed: the arguments do not fit it
    except IndexError:
        return  # an index out of range (the interpreter is NumPy's; kernels check)
    except AttributeError:
        assert "f" not in dsl.loads(source, "mutated.grad").functions
        return
    except dsl.GradError as err:
        assert err.file == "mutated.grad"
        assert_well_formed(err, source)
        return
    if len(value) != 1 or np.ndim(value[0]) != 0 or not abs(value[0]) < 1e8:
        return  # not a finite scalar of a size differences in f64 resolve

    def scalar(x, y):
        return float(_interpreted(f, (x, y))[0])
    for k, g in enumerate(grads):
        coarse, fine = (central_difference(scalar, (X, Y), k, eps) for eps in (1e-4, 1e-5))
        if not np.allclose(coarse, fine, rtol=1e-4, atol=1e-6):
            continue  # a kink or a jump near the point: differences say nothing
        if not np.all(np.isfinite(g)) and ("sqrt" in source or "**" in source):
            continue  # a derivative infinite at the point (sqrt(0 * x) at 0 is
            # 0 * inf, NaN, as in JAX and PyTorch): differences see a constant
        np.testing.assert_allclose(g, fine, rtol=1e-4, atol=1e-5, err_msg=source)


def test_a_newline_in_a_file_name_forges_no_line_of_a_note():
    # the note naming the call that reached a helper holds the file name;
    # notes are lines, so its newline began a line no "note:" headed
    source = "def dense(x, w):\n    return x @ w\n\ndef f(x, w):\n    return dense(x, w)\n"
    m = dsl.loads(source, "a\nnote: forged.grad")
    with pytest.raises(dsl.GradError) as info:
        m.f(np.ones((2, 3)), np.ones((4, 1)))
    assert (info.value.line, info.value.col) == (2, 12)
    assert str(info.value).splitlines()[-1] == \
        "note: in dense(), called at a\ufffdnote: forged.grad:5:12"
