"""Holes found by adversarial tests of `for` and `if`: Python statements the
language lacks are named in their errors, a bool given for an integer
loop bound binds like Python's `range(True)`, and `out=` takes NumPy
buffers under `host_results=True` on the CPU."""
import numpy as np
import pytest

import dsl
from dsl.function import _types
from gradlang.compiler import passes
from gradlang.compiler.interpret import interpret

GROW = """
def grow(u, kappa, n: i64):
    for s in range(n):
        u = u + kappa * (u * (1 - u))
    return sum(u * u)

def grown(u, kappa, n: i64):
    for s in range(n):
        u = u + kappa * (u * (1 - u))
    return u
"""


def grow_numpy(u, kappa, trips):
    for _ in range(trips):
        u = u + kappa * (u * (1 - u))
    return u


@pytest.mark.parametrize("body, line, col, keyword", [
    ("    for i in range(3):\n        if i > 1:\n            break\n        x = x + 1\n",
     4, 13, "break"),
    ("    for i in range(3):\n        continue\n", 3, 9, "continue"),
    ("    while True:\n        x = x + 1\n", 2, 5, "while"),
    # Python's other statements (they were "syntax error: unexpected '('" and the like)
    ("    print(x)\n", 2, 5, "print"),
    ("    if x.ndim == 1:\n        pass\n", 3, 9, "pass"),
    ("    assert x.ndim == 1\n", 2, 5, "assert"),
])
def test_unsupported_loop_statements_are_named(body, line, col, keyword):
    source = f"def f(x):\n{body}    return x\n"
    with pytest.raises(dsl.GradError) as info:
        dsl.loads(source)
    text = str(info.value)
    assert text.startswith(f"<string>:{line}:{col}: error: `{keyword}` is not supported")
    assert text.splitlines()[-1] == " " * (col + 3) + "^" * len(keyword)


def test_a_name_spelled_like_a_keyword_still_parses_its_own_errors():
    with pytest.raises(dsl.GradError, match="syntax error"):
        dsl.loads("def f(x):\n    breaks = (x\n    return x\n")


@pytest.mark.parametrize("flag, trips", [(True, 1), (False, 0)])
def test_a_bool_trip_count_is_refused_and_its_integer_binds(flag, trips):
    # a bool for an integer parameter is a slip (974dad4: as for an axis),
    # refused before the loop runs; the integer it stood for runs that many
    f = dsl.loads(GROW, host_results=True).grow
    u, kappa = np.array([0.2, 0.5]), 0.7
    with pytest.raises(dsl.ArgumentError, match=rf"argument 'n' of grow\(\) is a bool "
                                                rf"\({flag}\), but its annotation says i64"):
        f(u, kappa, flag)
    expected = grow_numpy(u, kappa, trips)
    np.testing.assert_allclose(f(u, kappa, trips), np.sum(expected * expected), rtol=1e-12)


def test_out_takes_numpy_buffers_when_results_are_numpy_anyway():
    # host_results=True on the CPU: results are NumPy arrays either way, so
    # the caller's NumPy buffer is the right kind (it was refused as "not a
    # NumPy array of the cpu target, got ndarray")
    f = dsl.loads(GROW, host_results=True).grown
    u, out = np.array([0.2, 0.5, 0.9]), np.full(3, np.nan)
    result = f(u, 0.7, 4, out=out)
    assert result is out
    np.testing.assert_allclose(out, grow_numpy(u, 0.7, 4), rtol=1e-12)


def test_the_gradient_of_deeply_nested_loops_is_simplified_in_polynomial_time(monkeypatch):
    # dead-code elimination read each nested loop's body once for every set
    # of carried values the loop around it tried, so the work doubled with
    # each level: 14 nested loops called read_by 130,000 times, 18 took 10 s
    depth = 16
    source = "def f(x, n: i64 = 2):\n    y = x\n" + "".join(
        "    " * (k + 1) + f"for i{k} in range(n):\n" for k in range(depth))
    source += "    " * (depth + 1) + "y = sin(y) * 0.999\n    return sum(y)\n"
    g = dsl.grad(dsl.loads(source, "nested.grad").f)
    calls = []
    read_by = passes.read_by
    monkeypatch.setattr(passes, "read_by", lambda *a: calls.append(1) or read_by(*a))
    x = np.array([0.3, -0.7])
    bound = g.bind((x, 1), {})  # one trip each: the body runs once
    (value,) = interpret(g.lower(_types(bound)), *bound.values())
    assert len(calls) < 2 * depth ** 3, len(calls)  # (1632; it was 2**depth and more)
    np.testing.assert_allclose(value, 0.999 * np.cos(x), rtol=1e-15)
