"""Holes found by adversarial tests of `for` and `if`: Python statements the
language lacks are named in their errors, and a bool given for an integer
loop bound binds like Python's `range(True)`."""
import numpy as np
import pytest

import dsl

GROW = """
def grow(u, kappa, n: i64):
    for s in range(n):
        u = u + kappa * (u * (1 - u))
    return sum(u * u)
"""


@pytest.mark.parametrize("body, line, col, keyword", [
    ("    for i in range(3):\n        if i > 1:\n            break\n        x = x + 1\n",
     4, 13, "break"),
    ("    for i in range(3):\n        continue\n", 3, 9, "continue"),
    ("    while True:\n        x = x + 1\n", 2, 5, "while"),
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
def test_a_bool_trip_count_binds_as_an_integer(flag, trips):
    f = dsl.loads(GROW, host_results=True).grow
    u, kappa = np.array([0.2, 0.5]), 0.7
    expected = u.copy()
    for _ in range(trips):
        expected = expected + kappa * (expected * (1 - expected))
    np.testing.assert_allclose(f(u, kappa, flag), np.sum(expected * expected), rtol=1e-12)
