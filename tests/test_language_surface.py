"""Python spellings a NumPy, JAX or PyTorch user writes, each checked
against NumPy and its gradient against central differences in f64."""
import numpy as np
import pytest

import dsl
from helpers import central_difference


def test_power_and_matmul_augmented_assignments_rebind_as_python():
    """`y **= 2` and `y @= w` were syntax errors ("expected '+=', '-=',
    ..."), where Python, NumPy and torch take them."""
    m = dsl.loads("def f(x, w):\n    y = x\n    y **= 2\n    y @= w\n    y **= 0.5\n"
                  "    y @= y\n    return y\n")
    x = np.array([[1.0, -2.0, 0.5], [3.0, 0.25, -1.5]])
    w = np.array([0.5, 1.25, 2.0])

    def numpy_f(x, w):
        y = np.sqrt((x ** 2) @ w)
        return y @ y

    np.testing.assert_allclose(m.f(x, w), numpy_f(x, w), rtol=1e-14)
    gx, gw = dsl.grad(m.f, wrt=(0, 1))(x, w)
    np.testing.assert_allclose(gx, central_difference(numpy_f, [x, w], 0), rtol=1e-6)
    np.testing.assert_allclose(gw, central_difference(numpy_f, [x, w], 1), rtol=1e-6)


@pytest.mark.parametrize("statement, col, text", [
    # JAX's `loss, (gx, gw) = value_and_grad(f, argnums=(0, 1))(x, w)`
    ("v, (gx, gw) = value_and_grad(g, wrt=(0, 1))(x, x)", 8,
     "nested or parenthesized targets are not supported: unpack one level at a time, names "
     "without brackets (`v, g = value_and_grad(f, wrt=(0, 1))(x, w)`, then `gx, gw = g`)"),
    ("[n, m] = x.shape", 5, "nested or parenthesized targets are not supported"),
    ("*batch, n = x.shape", 5, "starred unpacking (`*batch, n = x.shape`) is not supported: "
                               "slice the tuple (`batch = x.shape[:-1]`, `n = x.shape[-1]`)"),
])
def test_unpacking_python_takes_and_the_language_does_not_says_how(statement, col, text):
    """These were "syntax error: unexpected '('; expected 'for' or 'if' or
    'return' or a name or end of line", which does not say what to write."""
    with pytest.raises(dsl.GradError) as info:
        dsl.loads(f"def g(x, w):\n    return sum(x * w)\ndef f(x):\n    {statement}\n"
                  f"    return x\n", "bad.grad")
    err = info.value
    assert (err.file, err.line, err.col) == ("bad.grad", 4, col), str(err)
    assert err.message == f"syntax error: {text}" or text in err.message, str(err)


def test_numbers_grouped_by_underscores_read_as_python_reads_them():
    """`1_000` was "syntax error: unexpected '_000'"; a size in a type too."""
    literals = ["1_000", "2_0.5", "1e0_1", "0_0", ".5_0", "1_0e-1_0", "3_1.4_1e+0_2"]
    m = dsl.loads(f"def f(x: f64[1_0]):\n    return stack([{', '.join(literals)}]) + x[:7]\n")
    np.testing.assert_array_equal(m.f(np.zeros(10)), [eval(t) for t in literals])
    for bad, col in (("1__0", 17), ("1_.5", 17)):
        with pytest.raises(dsl.GradError) as info:
            dsl.loads(f"def f(x):\n    return x * {bad}\n")
        assert (info.value.line, info.value.col) == (2, col), str(info.value)
        assert info.value.message.startswith("syntax error: unexpected '_"), str(info.value)
