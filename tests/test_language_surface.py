"""Python spellings a NumPy, JAX or PyTorch user writes, each checked
against NumPy and its gradient against central differences in f64."""
import numpy as np

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
