"""Every user error is a GradError with file, line, column and a caret;
bad runtime arguments are caught before any kernel runs."""
import re

import numpy as np
import pytest

import dsl

GOOD = "def f(x):\n    return x\n"


def load_error(source: str) -> dsl.GradError:
    with pytest.raises(dsl.GradError) as info:
        dsl.loads(source, "bad.grad")
    return info.value


def assert_at(err: dsl.GradError, line: int, col: int | None = None, text: str = ""):
    assert err.file == "bad.grad"
    assert err.line == line, str(err)
    if col is not None:
        assert err.col == col, str(err)
    assert text in err.message, str(err)
    rendered = str(err)
    assert rendered.startswith(f"bad.grad:{line}:{err.col}: error: ")
    assert "^" in rendered.splitlines()[-1]


@pytest.mark.parametrize("source,line,col,text", [
    ("def f(x)\n    return x\n", 1, 9, "syntax error"),
    ("def f(x):\nreturn x\n", 2, 1, "syntax error"),
    ("def f(x):\n    return x +\n", 2, 15, "syntax error"),
    ("def f(x):\n    y = (x\n", 2, None, "syntax error"),
    ("def f(x):\n    return x $ 2\n", 2, 14, "unexpected character"),
    ("def f(x):\n\treturn x\n", 2, 1, "tabs"),
    # NumPy's and torch's update in place (it was "unexpected '['; expected '+=', ...")
    ("def f(x):\n    x[0] = 1.0\n    return x\n", 2, 5,
     "arrays cannot be changed in place: `x[...] = ...` is not supported"),
    ("def f(x):\n    x[1:, 0] *= 2.0\n    return x\n", 2, 5, "changed in place"),
    # (`**=`, `@=` and an `=` ending the line were "unexpected '['")
    ("def f(x):\n    x[0] **= 2.0\n    return x\n", 2, 5, "changed in place"),
    ("def f(x):\n    x[0] @= x\n    return x\n", 2, 5, "changed in place"),
    ("def f(x):\n    x[0] =\n    return x\n", 2, 5, "changed in place"),
    ("def f(x):\n        y = x\n    return y\n", 3, None, "unindent"),
    # at the indented line, not the end of the one before ("unexpected an indented block")
    ("def f(x):\n    y = x\n      return y\n", 3, 7, "syntax error: unexpected indent"),
    ("def f(x):\n    y = x\n\n    # why\n        return y\n", 5, 9, "unexpected indent"),
    # Python spellings, each said how the language writes it (it was
    # "unexpected character '&'", "unexpected '<'", "unexpected '\"\"'", ...)
    ("def f(x):\n    return where((x > 0) & (x < 1), x, 0)\n", 2, 26, "write `and`"),
    ("def f(x):\n    return where((x > 0) | (x < 1), x, 0)\n", 2, 26, "write `or`"),
    ("def f(m):\n    return ~m\n", 2, 12, "write `not`"),
    ("def f(m):\n    return m ^ m\n", 2, 14, "write `!=`"),
    ("def f(x):\n    return where(0 < x < 1, x, 0)\n", 2, 24, "comparisons do not chain"),
    ('def f(x):\n    """The identity.\n    """\n    return x\n', 2, 5, "a docstring is not"),
    ('"A module."\ndef f(x):\n    return x\n', 1, 1, "a docstring is not"),
    ("def f(x):\n    return x if x.ndim == 1 else -x\n", 2, 14, "write where(c, a, b)"),
    # (not the conditional expression's hint)
    ("def f(x):\n    if x.ndim == 1:\n        y = x\n    else if x.ndim == 2:\n        y = -x\n"
     "    return y\n", 4, 10, "write `elif c:` for `else if c:`"),
    ("def f(x):\n    return stack([x * i for i in range(3)])\n", 2, 25,
     "comprehensions are not supported"),
    # Python's lambda, nested def and `import numpy as np`: each was
    # "unexpected 'y'" (or 'g', 'as') with nothing to say what to write
    ("def f(x):\n    g = lambda y: y * 2\n    return g(x)\n", 2, 16,
     "`lambda` is not supported: define the function with `def` at the top level"),
    ("def f(x):\n    def g(y):\n        return y\n    return g(x)\n", 2, 5,
     "`def` is not supported: functions are defined at the top level"),
    ("import numpy as np\ndef f(x):\n    return x\n", 1, 14,
     "`import ... as` is not supported"),
    ("import numpy\ndef f(x):\n    return x\n", 1, 1,
     "imports are of .grad files: NumPy's functions are builtins here"),
    # a type's misspelling says which dtype or kind was meant
    ("def f(x: floats):\n    return x\n", 1, 10,
     "expected 'const' or a dtype (f32, f64, i32, i64, bool, float, int); did you mean 'float'?"),
    ("def f(x: f31[n]):\n    return x\n", 1, 10, "did you mean 'f32'?"),
    ("def f(x) -> float64:\n    return x\n", 1, 13, "did you mean 'f64'?"),
    # "unexpected 's'; expected end of line"
    ("def f(x):\n    s = 0.0\n    for i in range(3): s = s + x[i]\n    return s\n", 3, 24,
     "a block's statements go on the lines after its `:`, indented"),
    ("def f(x):\n    if x.ndim == 1: return x\n    return -x\n", 2, 21,
     "a block's statements go on the lines after its `:`"),
])
def test_syntax_errors(source, line, col, text):
    assert_at(load_error(source), line, col, text)


@pytest.mark.parametrize("source,line,col,message", [
    ("def f(*x):\n    return x\n", 1, 7, "unexpected '*'; expected ')' or a name"),
    ("def f(x) -> :\n    return x\n", 1, 13,
     "unexpected ':'; expected a dtype (f32, f64, i32, i64, bool, float, int)"),
    ("def f(x):\n    a, b += x, x\n    return a\n", 2, 10, "unexpected '+='; expected ',' or '='"),
    ("def f(x):\n    if x.ndim == 1:\n    return x\n", 3, 5,
     "unexpected 'return'; expected an indented block"),
    # (the end of the file, which may come there too, is left out of the list)
    ("def f(x):\n    return x\nx = 1\n", 3, 1, "unexpected 'x'; expected '@' or 'def' or "
     "'from' or 'grad' or 'import' or 'param' or end of line"),
])
def test_a_syntax_error_expects_only_what_the_parse_takes_there(source, line, col, message):
    """The expected terminals were the lexer state's: an end of line,
    which every state accepts for the indenter, and lookaheads of merged
    LALR states: "expected ')' or a name or end of line" for `def f(*x):`,
    "expected ')' or ',' or '=' or end of line" for `a, b += x, x`, and
    "expected end of line" for a block with no indented body."""
    err = load_error(source)
    assert (err.line, err.col, err.message) == (line, col, f"syntax error: {message}"), str(err)


def test_a_function_named_range_is_refused_as_the_loops_range_is_not_it():
    """`def range(n)` loaded, and `for i in range(3):` iterated three times
    all the same, while `range(x)` elsewhere called the function."""
    err = load_error("def range(n):\n    return n * 2.0\ndef f(x):\n    y = x\n"
                     "    for i in range(3):\n        y = y * 2.0\n    return y + range(x)\n")
    assert (err.line, err.col, err.message) == (
        1, 5, "function 'range' shadows the range() a for loop iterates over "
              "(`for i in range(n):` would not call it)"), str(err)


@pytest.mark.parametrize("between", ["\t", "\f", "    \f"])
def test_an_unindent_is_reported_at_its_line_past_blank_lines_of_tabs_or_form_feeds(between):
    """The line of a mismatched unindent was found counting a blank line
    holding a tab or a form feed as code at column 1, and a form feed
    before a line's spaces as indentation: the error named line 6 (or 4)."""
    err = load_error(f"def f(x):\n    if True:\n        y = x\n{between}\n      z = x\n"
                     "    return y\n")
    assert (err.line, err.col, err.message) == (
        5, 1, "unindent does not match any outer indentation level"), str(err)
    err = load_error("def f(x):\n    if True:\n        y = x\n \f   z = x\n   return y\n")
    assert (err.line, err.col) == (5, 1), str(err)


@pytest.mark.parametrize("source,line,text", [
    ("param w: f64\nparam w: f64[2]  # again\n", 2, "param w: f64[2]"),
    ("import nothere\n", 1, "import nothere"),
    ("@recompute\n@recompute\ndef f(x):\n    return x\n", 2, "@recompute"),
])
def test_a_declarations_caret_underlines_it(source, line, text):
    """A declaration's span took the line break after it, so it ended on
    the next line, and its caret was a single `^` under the first letter."""
    err = load_error(source)
    assert (err.line, err.col) == (line, 1), str(err)
    assert str(err).splitlines()[-1] == "    " + "^" * len(text), str(err)


@pytest.mark.parametrize("statement,col,message", [
    ("print = x $ 2.0", 15, "syntax error: unexpected character '$'"),
    ("pass = x * * 2.0", 16, "syntax error: unexpected '*'"),
    ("print(y)", 5, "`print` is not supported: a function computes values; print them from "
                    "Python (or `gradc run`)"),
    ("while y > 0:\n        y = y - 1.0", 5, "`while` is not supported: loops are `for NAME in "
     "range(...)` with a trip count known when the loop starts"),
    ("pass  # nothing yet", 5, "`pass` is not supported: a block holds at least one "
                               "assignment; leave out an empty branch"),
    # (a keyword argument's `=` makes no target of a bracket: it said "nested
    # or parenthesized targets are not supported")
    ("[sum(x, axis=0)]", 5, "syntax error: unexpected '['; expected 'for' or 'if' or 'return' "
                            "or a name or end of block"),
    ("(a, b) = y, sum(y, axis=0)", 5, "syntax error: nested or parenthesized targets are not "
     "supported: unpack one level at a time, names without brackets (`v, g = "
     "value_and_grad(f, wrt=(0, 1))(x, w)`, then `gx, gw = g`)"),
])
def test_a_python_statement_is_named_only_where_the_parse_stopped_at_it(statement, col, message):
    """`print`, `pass`, `while`, ... are names to the language, so a line
    assigning one with a syntax error further on (`print = x $ 2.0`) said
    "`print` is not supported" at the name, not what was wrong where."""
    err = load_error(f"def f(x):\n    y = x\n    {statement}\n    return y\n")
    assert (err.line, err.col, err.message) == (3, col, message), str(err)


@pytest.mark.parametrize("source,line,col,message", [
    ("def f(x):\n    y = exp(x\n    return y\n", 2, 12, "'(' was never closed"),
    ("def f(x):\n    y = stack([x, (x\n    return y\n", 2, 19, "'(' was never closed"),
    ("def f(x):\n    return [x,\n", 2, 12, "'[' was never closed"),
    # (a `]` closes no `(`: the `[` before it was said never closed)
    ("def f(x):\n    y = [x, (x\n    ]\n    return y\n", 2, 13, "'(' was never closed"),
    # (a bracket in a string or a comment opens nothing; one closed is no matter)
    ("def f(x):  # (\n    y = (x +\n         x) $\n    return y\n", 3, 13,
     "unexpected character '$'"),
])
def test_a_bracket_left_open_is_the_error_where_it_opens(source, line, col, message):
    """Python's "'(' was never closed": inside a bracket the line breaks
    are dropped, so the parse stopped at the next statement ("unexpected
    'return'", a line after the bracket), or at the end of the file
    ("unexpected end of block")."""
    err = load_error(source)
    assert (err.line, err.col, err.message) == (line, col, f"syntax error: {message}"), str(err)


@pytest.mark.parametrize("source,line,col,text", [
    ("def f(x):\n    return y\n", 2, 12, "name 'y' is not defined"),
    # a call of what a call returns, where the first is of a value or an
    # unknown function (each was "only named functions can be called")
    ("def f(x):\n    grad = x\n    return grad(g)(x)\ndef g(x):\n    return sum(x)\n", 3, 12,
     "'grad' is a value, not a function"),
    ("def f(x):\n    return zz(x)(x)\n", 2, 12, "unknown function 'zz'"),
    ("def f(x):\n    return foo(x)\n", 2, 12, "unknown function 'foo'"),
    # NumPy's, torch's and Python's spellings, and the standard library's
    # functions without their import, say what to write (they were "unknown
    # function 'softmax'", "only named functions can be called", "clip() takes
    # 3 positional arguments but 1 was given" for clip(x, min=0, max=1), ...)
    ("def f(x):\n    return softmax(x)\n", 2, 12, "`from std import softmax`"),
    ("def f(x):\n    return std.relu(x)\n", 2, 12, "'std' is not defined; import it first"),
    ("def f(x):\n    return x.astype(f32)\n", 2, 12, "write float32(x) or float64(x) for x.astype"),
    ("def f(x):\n    return x.clamp(0, 1)\n", 2, 12, "write clip(x, lo, hi)"),
    # a module's function: not "write clip(torch, lo, hi)", not "'np' is not defined" alone
    ("def f(x):\n    return torch.clamp(x, 0, 1)\n", 2, 12,
     "'torch' is not defined; write clip(x, lo, hi) for torch.clamp"),
    ("def f(x):\n    return np.zeros(3) + x\n", 2, 12,
     "'np' is not defined; write zeros_like(x)"),
    ("def f(x):\n    return F.softmax(x)\n", 2, 12, "`from std import softmax`"),
    ("def f(x):\n    return clip(x, min=0, max=1)\n", 2, 12, "unexpected keyword argument 'min'"),
    ("def f(x):\n    return eye(3) * x\n", 2, 12, "one_hot(arange(n), n)"),
    ("def f(x):\n    return square(x)\n", 2, 12, "unknown function 'square'; write x * x"),
    ("def f(x):\n    return jnp.power(x, 3)\n", 2, 12, "'jnp' is not defined; write x ** y"),
    ("def f(x):\n    return torch.cat([x, x])\n", 2, 12, "write concatenate([a, b], axis)"),
    ("def f(x):\n    return lax.fori_loop(0, 3, g, x)\n", 2, 12,
     "'lax' is not defined; loops are `for i in range(n):`"),
    ("def f(x):\n    return lax.scan(g, x, x)\n", 2, 12,
     "(a row per trip: `hs = scatter_add(hs, i, h)`)"),
    # a close misspelling names the function meant (it said "unknown function" alone)
    ("def f(x):\n    return sigmod(x)\n", 2, 12, "unknown function 'sigmod'; did you mean "
     "'sigmoid'?"),
    ("def f(x):\n    return softplsu(x)\n", 2, 12, "did you mean 'softplus'? (`from std "
     "import softplus`)"),
    ("def helper_fn(x):\n    return x\ndef f(x):\n    return helper_fun(x)\n", 4, 12,
     "did you mean 'helper_fn'?"),
    # and so does one in a module (it said "module 'std' has no function" alone)
    ("import std\ndef f(x):\n    return std.sofmax(x)\n", 3, 12,
     "module 'std' has no function 'sofmax'; did you mean 'softmax'?"),
    ("from std import sigmod\n", 1, 1, "no function 'sigmod'; did you mean 'sigmoid'?"),
    ("import std\ndef f(x):\n    return std.sigmoid(x)\n", 3, 12,
     "sigmoid is a builtin: call it without `std.`"),
    # an imported module called or read: it said "import it first" and
    # "name 'std' is not defined" of a module imported
    ("import std\ndef f(x):\n    return std(x)\n", 3, 12,
     "'std' is a module, not a function; call one of its functions: std.NAME(...)"),
    ("import std\ndef f(x):\n    return x + std\n", 3, 16,
     "module 'std' used as a value; call one of its functions: std.NAME(...)"),
    ("def f(x):\n    return clamp(x, 0, 1)\n", 2, 12, "write clip(x, lo, hi)"),
    ("def f(x):\n    return var(x)\n", 2, 12, "write mean((x - mean(x, axis, keepdims=True))"),
    ("def f(x):\n    return x.at[0].set(1.0)\n", 2, 12, "have no .at[...].set() as JAX's do"),
    ("def f(x):\n    return exp(x, x)\n", 2, 12, "exp() takes 1"),
    ("def g(a, b):\n    return a\ndef f(x):\n    return g(x)\n", 4, 12, "missing argument"),
    ("def g(a):\n    return a\ndef f(x):\n    return g(x, x)\n", 4, 12, "takes 1 argument"),
    ("def g(a):\n    return a\ndef f(x):\n    return g(x, b=x)\n", 4, 12, "no parameter 'b'"),
    ("def f(x):\n    return sum(x, axes=0)\n", 2, 12, "unexpected keyword argument 'axes'"),
    # an option given by position and by name: Python's error, not one dropped
    ("def f(x):\n    return sum(x, 0, axis=1)\n", 2, 12, "multiple values for argument 'axis'"),
    ("def f(x):\n    return transpose(x, [1, 0], axes=[0, 1])\n", 2, 12,
     "multiple values for argument 'axes'"),
    ("def f(x):\n    return sum(x, 0, False, 1)\n", 2, 12, "takes 1 to 3 positional"),
    ("def f(x, i: i64[n]):\n    return segment_sum(x, i)\n", 2, 12,
     "missing its argument 'num_segments'"),
    ("def f(x):\n    return reshape(x)\n", 2, 12, "missing its argument 'shape'"),
    ("def f(x):\n    return where(x > 0, x)\n", 2, 12, "where() takes 3 positional"),
    ("def f(x):\n    return x\ndef f(y):\n    return y\n", 3, 5, "already defined"),
    ("def f(x, x):\n    return x\n", 1, None, "duplicate parameter"),
    # a grad block's upstream name, at it (it was at the block's `grad`)
    ("def f(x):\n    return x, x\ngrad(d, d):\n    return d\n", 3, 9,
     "grad block 1 of f() (line 3) repeats an upstream name"),
    ("def f(x):\n    y = x * x\n    return y\ngrad(dy,\n     y):\n    return dy\n", 5, 6,
     "grad block 1 of f() (line 4): upstream name 'y' is already defined"),
    ("def f(a: f64 = 1.0, x):\n    return x * a\n", 1, 21,
     "parameter 'x' of f() has no default but follows one with a default"),
    ("def f(x):\n    return x\n    y = x\n", 3, 5, "unreachable"),
    ("def f(x):\n    y = x\n", 2, None, "no return"),
    ("@fast\ndef f(x):\n    return x\n", 1, 1, "unknown decorator"),
    # at the attribute's name (it was at the start of `x.sum`, of `x.T.T.zz`)
    ("def f(x):\n    return x.sum\n", 2, 14, "no attribute 'sum'"),
    ("def f(x):\n    return (x +\n      x).T.T.zz\n", 3, 14, "no attribute 'zz'"),
    # NumPy's, JAX's and torch's spellings say the language's (it was "only
    # named functions can be called")
    ("def f(x):\n    return x.sum()\n", 2, 12, "arrays have no methods; write sum(x) for "
     "x.sum()"),
    ("def f(x):\n    return (x * x).mean(axis=1)\n", 2, 12,
     "write mean(x, ...) for x.mean(...)"),
    ("def f(x):\n    return np.exp(x)\n", 2, 12,
     "'np' is not defined; builtins are called by their name alone: exp(...)"),
    # a method that is no builtin's name said "only named functions can be
    # called", which names neither the method nor what to write
    ("def f(x):\n    return x.foo()\n", 2, 12,
     "arrays have no methods (x.foo(...)), and there is no function 'foo'"),
    ("def f(x):\n    return x.unsqueeze(0)\n", 2, 12,
     "arrays have no methods (x.unsqueeze(...)); write x[None]"),
    ("def f(x):\n    return (x + 1.0).softmax(1)\n", 2, 12, "`from std import softmax`"),
    ("def f(x):\n    return x.flatten()\n", 2, 12, "write reshape(x, [-1])"),
    ("def f(x):\n    return squeeze(x)\n", 2, 12, "unknown function 'squeeze'; write reshape"),
    ("def f(x):\n    return dropout(x, 0.1)\n", 2, 12, "pass a mask from Python"),
    ("def f(x):\n    return x + 0.1 * torch.randn(3)\n", 2, 22,
     "'torch' is not defined; a function draws no random numbers"),
    # torch's keywords for NumPy's options, and NumPy's constants
    ("def f(x):\n    return sum(x, dim=1)\n", 2, 12,
     "unexpected keyword argument 'dim'; write axis= (NumPy's name)"),
    ("def f(x):\n    return mean(x, axis=1, keepdim=True)\n", 2, 12, "write keepdims="),
    ("from std import log_softmax\ndef f(x):\n    return log_softmax(x, dim=1)\n", 3, 12,
     "log_softmax() has no parameter 'dim'; write axis="),
    ("def f(x):\n    return maximum(x, -inf)\n", 2, 24,
     "name 'inf' is not defined; infinity is the number 1e400"),
    ("def f(x):\n    return x * np.pi\n", 2, 16,
     "name 'np' is not defined; write 3.141592653589793"),
    # (at the repeated keyword, named: it was "keyword argument repeated" at the call)
    ("def f(x):\n    return sum(x, axis=0, axis=0)\n", 2, 27, "keyword argument 'axis' repeated"),
    # the transform's own keywords too (the first wrt was taken, silently)
    ("def g(x, y):\n    return x * y\ndef f(x):\n    return grad(g, wrt=0, wrt=1)(x, x)\n",
     4, 27, "keyword argument 'wrt' repeated"),
    ("def g(x):\n    return x\ndef f(x):\n    return g(x=x, x=x)\n", 4, 19,
     "keyword argument 'x' repeated"),
])
def test_name_and_arity_errors(source, line, col, text):
    assert_at(load_error(source), line, col, text)


@pytest.mark.parametrize("call,col,axis", [("sum(x, axis=(0, 7))", 28, 7), ("mean(x, -3)", 20, -3),
                                           ("sum(sum(x, axis=3))", 28, 3)])
def test_an_axis_out_of_range_is_an_error_at_the_axis(call, col, axis):
    # it was at the call (the `sum` of sum(x, axis=(0, 7))); an axis the
    # call does not write (a name, or written twice) stays there
    with pytest.raises(dsl.GradError) as info:
        dsl.loads(f"def f(x):\n    return {call}\n", "bad.grad").f(np.ones(2))
    assert_at(info.value, 2, col, f"axis {axis} is out of range for rank 1")


@pytest.mark.parametrize("call,text", [("max(x, 0.0)", "the elementwise maximum of two values "
                                                      "write maximum(a, b)"),
                                       ("min(x, x)", "write minimum(a, b)")])
def test_max_of_two_values_says_maximum(call, text):
    # Python's max(a, b) (it was "axis must be a compile-time integer")
    with pytest.raises(dsl.GradError) as info:
        dsl.loads(f"def f(x):\n    return {call}\n", "bad.grad").f(np.ones(2))
    assert_at(info.value, 2, 12, text)


@pytest.mark.parametrize("source,line,text", [
    # too many cotangents
    ("def f(x, y):\n    return x * y\ngrad(dz):\n    return dz, dz, dz\n", 4,
     "grad block 1 of f() (line 3) returns 3 cotangent(s); expected one cotangent for each of x, y"),
    # too few
    ("def f(x, y):\n    return x * y\ngrad(dz):\n    return dz * y\n", 4,
     "missing the cotangent for 'y'"),
    # a setting given a default, as a Python keyword argument is written
    ("def f(x, d=1.0):\n    return x * d\ngrad(dz):\n    return dz * d\n", 4,
     "missing the cotangent for 'd'; expected one cotangent for each of x, d (a setting with "
     "no gradient is declared const: `d: const = ...`)"),
    # misnamed
    ("def f(x, y):\n    return x * y\ngrad(dz):\n    return dz * y, z=dz\n", 4,
     "'z', which is not a parameter of f()"),
    # const parameters get no cotangent
    ("def f(x, a: const):\n    return x * a\ngrad(dz):\n    return dz * a, a=0\n", 4,
     "'a', which is const"),
    # None for labels, as PyTorch's backward writes it (it was "None is not a
    # value: it is an argument that means 'not given'")
    ("def f(x, labels: i64[n]):\n    return x[labels]\ngrad(dz):\n"
     "    return scatter_add(zeros_like(x), labels, dz), None\n", 4,
     "grad block 1 of f() (line 3) returns None: a block returns a cotangent for each of x "
     "(0 for a zero one), and nothing for other parameters"),
    # duplicated
    ("def f(x, y):\n    return x * y\ngrad(dz):\n    return dz * y, x=dz\n", 4, "twice"),
    # wrong number of upstream cotangents
    ("def f(x):\n    return x, x\ngrad(dz):\n    return dz\n", 3, "takes 1 upstream"),
    # grad block reads an undefined name
    ("def f(x):\n    return x\ngrad(dz):\n    return dz * q\n", 4, "name 'q' is not defined"),
    ("@pass_through\ndef f(x):\n    return x\ngrad(dz):\n    return dz\n", 4, "pass_through"),
    # a float param a @pass_through function reads, itself or through a
    # call, got a zero gradient, silently (its gradient is x's identity)
    ("param w: f64\n@pass_through\ndef f(x):\n    return x * w\n", 3,
     "@pass_through function f() reads the param 'w', which its identity gradient gives no "
     "cotangent; compute what needs the param outside it (ste(x / w) * w)"),
    ("param w: f64\ndef g(x):\n    return x * w\n@pass_through\ndef f(x):\n    return g(x)\n",
     5, "@pass_through function f() reads the param 'w'"),
    # a size named as a parameter or a module param: two unrelated values
    # (f(ones(3), 5) was [5, 5, 5])
    ("def f(x: f64[n], n: i64):\n    return x * n\n", 1,
     "the size 'n' of this annotation is also a parameter of f(), a value unrelated to it; "
     "rename one (the size is x.shape[k] in the body)"),
    ("param n: i64\ndef f(x) -> f64[n]:\n    return x\n", 2,
     "the size 'n' of this annotation is also a module param"),
    # a positional cotangent after a named one: "the cotangent for 'x' twice"
    ("def f(x, y):\n    return x * y\ngrad(d):\n    return x=d, d\n", 4,
     "grad block 1 of f() (line 3) returns a positional cotangent after a named one (x=...): "
     "positional ones come first"),
    # a value named range: its for loop iterated over the builtin all the same
    ("def f(x, range):\n    for i in range(3):\n        x = x * 2.0\n    return x + range\n", 2,
     "'range' is a value here, not the range() a for loop iterates over; rename it"),
])
def test_grad_block_contract_is_checked_at_load(source, line, text):
    assert_at(load_error(source), line, None, text)


def test_options_of_builtins_by_name_mean_what_they_do_by_position():
    m = dsl.loads("def a(x):\n    return reshape(x, shape=[3, 2])\n"
                  "def b(x):\n    return reshape(x, [3, 2])\n"
                  "def c(x):\n    return sum(x, keepdims=True, axis=1)\n"
                  "def d(x):\n    return transpose(x, axes=[1, 0])\n"
                  "def e(x, i: i64[n]):\n    return segment_sum(x, i, num_segments=4)\n")
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(m.a(x), x.reshape(3, 2))
    np.testing.assert_array_equal(m.a(x), m.b(x))
    np.testing.assert_array_equal(m.c(x), x.sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(m.d(x), x.T)
    np.testing.assert_array_equal(m.e(np.arange(3.0), np.array([3, 0, 3])), [1.0, 0, 0, 2.0])


def test_named_cotangents_in_any_order_are_accepted():
    m = dsl.loads("def f(x, y):\n    return x * y\ngrad(dz):\n    return y=dz * x, x=dz * y\n")
    assert dsl.grad(m.f, wrt=(0, 1))(2.0, 5.0) == (5.0, 2.0)
    m = dsl.loads("def f(x, y):\n    return x * y\ngrad(dz):\n    return dz * y, y=0\n")
    assert dsl.grad(m.f, wrt=(0, 1))(2.0, 5.0) == (5.0, 0.0)


def test_load_missing_file():
    with pytest.raises(dsl.GradError, match="no such file"):
        dsl.load("/nonexistent/x.grad")


@pytest.mark.parametrize("path", [None, 3, ["bar.grad"]])
def test_load_takes_a_path_and_says_so(path):
    # pathlib's "expected str, bytes or os.PathLike object" came from inside Path()
    with pytest.raises(TypeError, match="^error: load\\(\\) takes a path to a .grad file, got "):
        dsl.load(path)


def test_load_takes_a_bytes_path_as_open_does():
    from pathlib import Path
    bar = Path(__file__).resolve().parent.parent / "examples" / "bar.grad"
    m = dsl.load(bytes(bar))
    assert m.bar(2.0, 3.0) == 6.0 and m.__file__ == str(bar)


# ------------------------------------------------------------- call-time

ANNOTATED = """
def f(x: f64[n], y: f64[n, 3], k: const i64 = 2):
    return sum(x) + sum(y)
def g(a, b):
    return a + b
"""


@pytest.fixture(scope="module")
def m():
    return dsl.loads(ANNOTATED, "ann.grad")


@pytest.mark.parametrize("args,text", [
    ((np.zeros(2, np.float32), np.zeros((2, 3))), "dtype f32, but its annotation says f64"),
    ((np.zeros((2, 1)), np.zeros((2, 3))), "rank 2"),
    ((np.zeros(2), np.zeros((2, 4))), "size 4 on axis 1, but its annotation says 3"),
    ((np.zeros(2), np.zeros((5, 3))),
     "argument 'y' of f() has size 5 on axis 0, but its annotation says n, which is 2 for 'x'"),
    ((np.zeros(2),), "missing argument 'y'"),
    ((np.zeros(2), np.zeros((2, 3)), 1, 4), "takes 3 argument"),
    ((np.zeros(2, np.complex128), np.zeros((2, 3))), "unsupported dtype"),
    (("abc", np.zeros((2, 3))), "not numeric"),
])
def test_bad_arguments_are_caught_before_kernels(m, args, text):
    with pytest.raises(dsl.ArgumentError, match=re.escape(text)) as info:
        m.f(*args)
    # at the function's definition, shown with its caret line
    assert str(info.value).startswith("ann.grad:2:5: error: ")
    assert str(info.value).endswith("\n    def f(x: f64[n], y: f64[n, 3], k: const i64 = 2):"
                                    "\n        ^")


def test_shapes_that_do_not_broadcast_point_at_the_expression(m):
    with pytest.raises(dsl.GradError) as info:
        m.g(np.zeros(3), np.zeros(4))
    assert "shapes [3] and [4] do not broadcast" in str(info.value)
    assert info.value.line == 5 and info.value.col == 12
    assert "return a + b" in str(info.value)


def test_grad_wrt_errors(m):
    with pytest.raises(dsl.ArgumentError, match="'k': it is const") as info:
        dsl.grad(m.f, wrt="k")
    assert str(info.value).endswith("\n    def f(x: f64[n], y: f64[n, 3], k: const i64 = 2):"
                                    "\n        ^")
    with pytest.raises(dsl.ArgumentError, match="out of range"):
        dsl.grad(m.f, wrt=7)
    with pytest.raises(dsl.ArgumentError, match="no parameter 'z'"):
        dsl.grad(m.f, wrt="z")


def test_pullback_checks_its_cotangents():
    # each error at f's definition, with its line (they had no place)
    m = dsl.loads("def f(x):\n    return x * 2\n", "pulled.grad")
    _, pullback = dsl.vjp(m.f, np.ones(3))
    for cts, text in [((np.ones(3), np.ones(3)), "takes 1 cotangent"),
                      ((np.ones(4),), "has shape \\[4\\]"), (("a",), "is not numeric")]:
        with pytest.raises(dsl.ArgumentError, match=text) as info:
            pullback(*cts)
        assert str(info.value).startswith("pulled.grad:1:5: error:")
        assert "\n    def f(x):\n        ^" in str(info.value)
    np.testing.assert_array_equal(pullback(np.ones(3))[0], [2.0, 2.0, 2.0])


def test_pullback_of_several_outputs_takes_them_as_a_tuple_too():
    """As JAX's pullback takes the outputs' structure: `pullback((ca, cb))`
    was "takes 2 cotangent(s), one per output, but 1 were given"."""
    m = dsl.loads("def f(x):\n    return x * 2.0, sum(x * x)\n")
    x = np.array([1.0, -2.0, 3.0])
    _, pullback = dsl.vjp(m.f, x)
    ca, cb = np.array([0.5, 1.0, -1.0]), 3.0
    for cts in [(ca, cb), ((ca, cb),)]:
        np.testing.assert_array_equal(pullback(*cts)[0], 2 * ca + 6 * x)
    for cts in [((ca,),), ([ca, cb],), ((ca, cb, cb),)]:
        with pytest.raises(dsl.ArgumentError, match="takes 2 cotangent.*or a tuple of them"):
            pullback(*cts)


def test_mis_shaped_cotangent_is_an_error_at_first_call():
    m = dsl.loads("def f(x):\n    return sum(x)\ngrad(d):\n    return stack((d, d, d, d))\n",
                  "bad.grad")
    with pytest.raises(dsl.GradError, match=r"cotangent of shape \[4\] for 'x', which has "
                                            r"shape \[3\]"):
        dsl.grad(m.f)(np.ones(3))


RETURNS_A_SEQUENCE = """def pair(x):
    return x, x * 2.0
def shape_of(x):
    return x.shape
def forwards(x):
    return pair(x)
def shape(x):
    return sum(x), x.shape
def listed(x):
    return [x, x]
grad(dy):
    return dy
@pass_through
def passed(x):
    return x.shape
def fine(x):
    return x * shape_of(x)[0]
"""


@pytest.mark.parametrize("fn, line, col, text", [
    ("forwards", 6, 12, "forwards() returns a tuple as a result, which only another function "
                        "can take (a shape for its reshape): a function called from Python "
                        "returns arrays (`return a, b` for several, stack([...]) for one)"),
    ("shape", 8, 20, "shape() returns a tuple as a result"),
    ("listed", 10, 12, "a list cannot be used as an array here"),
    ("passed", 15, 12, "a tuple cannot be used as an array here"),
])
def test_a_sequence_returned_as_a_result_is_an_error_at_the_return(fn, line, col, text):
    # A called function may return a tuple (its caller unpacks or indexes
    # it); a function called from Python returns arrays, and the error
    # points at the returned item, not at the def.
    m = dsl.loads(RETURNS_A_SEQUENCE, "bad.grad")
    with pytest.raises(dsl.GradError) as info:
        m.functions[fn](np.ones(2))
    assert_at(info.value, line, col, text)
    assert np.array_equal(m.fine(np.ones(2)), [2.0, 2.0])


def test_a_parenthesized_tuple_returned_is_several_results_as_in_python():
    """`return (a, b)` (PyTorch's backward() spelling) was "a tuple cannot
    be used as an array here"; in a grad block too.  `(x,)` is one result."""
    m = dsl.loads("def f(x, w):\n    return (x * w, sum(x))\ngrad(da, db):\n"
                  "    return (da * w + db, da * x)\n"
                  "def g(x, w):\n    a, b = f(x, w)\n    return (sum(a * a) + b,)\n")
    x, w = np.array([1.0, -2.0, 3.0]), np.array([0.5, 2.0, -1.0])
    a, b = m.f(x, w)
    np.testing.assert_array_equal(a, x * w)
    assert b == x.sum()
    gx, gw = dsl.grad(m.g, wrt=(0, 1))(x, w)
    np.testing.assert_array_equal(gx, 2 * x * w * w + 1)
    np.testing.assert_array_equal(gw, 2 * x * w * x)


def test_a_python_function_given_to_a_transform_says_it_is_not_traced():
    # as jax.grad(lambda x: ...) is written; it said only "got function"
    m = dsl.loads("def f(x):\n    return sum(x * x)\n")
    for transform in (dsl.grad, dsl.value_and_grad, dsl.jacrev):
        with pytest.raises(TypeError, match="got function; Python code is not traced: write "
                                            "it in the .grad module, or chain .* dsl.Tape"):
            transform(lambda x: m.f(x) * 2.0)
    with pytest.raises(TypeError, match=r"got int$"):
        dsl.grad(3)


def test_a_param_value_refused_is_reported_at_the_params_declaration():
    """`m.params[name] = value` that the param cannot take (a rank, a
    dtype's range) raised an ArgumentError with no place at all (`error:
    param 'b' has rank 2 ...`), where every other refused input points at
    the source: it is now at the `param` line, with the caret."""
    m = dsl.loads("def f(x):\n    return x * w + sum(b)\nparam w: f32\nparam b: f64[2]\n",
                  "bad.grad")
    with pytest.raises(dsl.ArgumentError) as info:
        m.params["b"] = np.ones((2, 1))
    assert_at(info.value, 4, 1, "param 'b' has rank 2")
    with pytest.raises(dsl.ArgumentError) as info:
        m.params["w"] = 1e39
    assert_at(info.value, 3, 1, "param 'w' is out of range for f32")
    m.params.update(w=0.5, b=[1.0, 2.0])  # values it takes are still set
    assert m.params["w"].dtype == np.float32 and m.params["w"] == 0.5
    np.testing.assert_array_equal(m.params["b"], [1.0, 2.0])
