"""`None` as NumPy writes it: an argument that means "not given".

`sum(x, axis=None)` and every builtin option NumPy lets be None (the
reductions' and `cumsum`'s `axis`, `take`'s, `transpose`'s `axes`,
`arange`'s `stop` and `step`, either bound of `clip`) is the option left
out, as is a slice's bound (`x[None:2]`); a `const` parameter of no dtype takes it too (its default may be
None), so the standard library's axes take it, with SciPy's and NumPy's
meaning, every axis (`logsumexp(x, None)`, `norm(x, axis=None)`).
Anywhere else None is an error at the None (or at the name a `const`
parameter passed it on through), never "name 'None' is not defined".
"""
import numpy as np
import pytest
import scipy.special as sp

import dsl
from dsl.function import _types
from gradlang.compiler import pipeline
from gradlang.compiler.interpret import interpret
from helpers import central_difference

SOURCE = """from std import norm, logsumexp, softmax, log_softmax
def g(x, axis: const = None):
    return sum(x * x, axis=axis)

def f(x):
    a = sum(x, axis=None) + mean(x, None) + max(x, axis=None) + min(x, None, False)
    b = sum(cumsum(x, axis=None) * arange(6, None, None)) + sum(take(x, 4, axis=None) * x)
    c = norm(x, axis=None) + logsumexp(x, None) + sum(softmax(x, None) * x)
    d = sum(log_softmax(x, axis=None) * x) + sum(clip(x, None, 0.5) + clip(x, -0.25, None))
    e = sum(x[None:1, ::None] * x[1:None:None])  # a slice's bound: left out
    return a + b + c + d + e + sum(transpose(x, None)[0] * x[:, 0]) + g(x) + sum(g(x, 1))
"""


def reference(x):
    flat = x.ravel()
    a = x.sum() + x.mean() + x.max() + x.min()
    b = (np.cumsum(x) * np.arange(6)).sum() + (flat[4] * x).sum()
    c = np.linalg.norm(x) + sp.logsumexp(x) + (sp.softmax(x, axis=None) * x).sum()
    d = (sp.log_softmax(x, axis=None) * x).sum() + (np.clip(x, None, 0.5)
                                                    + np.clip(x, -0.25, None)).sum()
    e = (x[:1] * x[1:]).sum()
    return a + b + c + d + e + (x.T[0] * x[:, 0]).sum() + 2 * (x * x).sum()


def test_none_arguments_mean_what_they_mean_in_numpy_with_their_gradients():
    f = dsl.loads(SOURCE, "none.grad").f
    x = np.array([[0.3, -1.2, 2.0], [0.7, 0.1, -0.4]])
    np.testing.assert_allclose(f(x), reference(x), rtol=1e-13)
    # the gradient from the IR (no second program to compile)
    fn = f.lower(_types(f.bind((x,), {})))
    (gradient,) = interpret(pipeline.optimize(pipeline.grad_of_sum(fn, [0], False)), x)
    np.testing.assert_allclose(gradient, central_difference(reference, [x], 0),
                               rtol=1e-6, atol=1e-8)


def error(source: str) -> dsl.GradError:
    with pytest.raises(dsl.GradError) as info:
        dsl.loads(source, "bad.grad").f(np.ones(3))
    return info.value


NO_VALUE = ('None is not a value: it is an argument that means "not given" '
            "(sum(x, axis=None)), or a new axis in an index (x[:, None])")


@pytest.mark.parametrize("source,line,col,width,message", [
    ("def f(x):\n    return None\n", 2, 12, 4, NO_VALUE),
    ("def f(x):\n    return x + None\n", 2, 16, 4, NO_VALUE),
    ("def f(x):\n    y = None\n    return x\n", 2, 9, 4, NO_VALUE),
    ("def f(x):\n    if None:\n        x = x * 2.0\n    return x\n", 2, 8, 4, NO_VALUE),
    ("def f(x):\n    return reshape(x, (None, 3))\n", 2, 24, 4, NO_VALUE),
    ("def f(x):\n    return exp(None)\n", 2, 16, 4, "exp() takes an array here, not None"),
    ("def f(x):\n    return einsum(\"i,i,i->\", x, x, None)\n", 2, 36, 4,
     "einsum() takes an array here, not None"),
    ("def f(x):\n    return sum(x, keepdims=None)\n", 2, 28, 4,
     "sum() does not take None for 'keepdims'"),
    ("def f(x):\n    return stack([x, x], axis=None)\n", 2, 31, 4,
     "stack() does not take None for 'axis'"),
    ("def g(x, a):\n    return x\ndef f(x):\n    return g(x, None)\n", 4, 17, 4,
     "None can only be passed to a `const` parameter of no dtype (such as `axis: const`); "
     "'a' of g() is not one"),
    ("def g(x, a: const i64):\n    return x\ndef f(x):\n    return g(x, a=None)\n", 4, 19, 4,
     "None can only be passed to a `const` parameter of no dtype (such as `axis: const`); "
     "'a' of g() is `const i64`"),
    ("def f(x, a=None):\n    return x\n", 1, 12, 4, "a default of None needs a `const` "
     "parameter of no dtype (`a: const = None`), as None is no array"),
    # passed on through a const parameter: at the name, when compiled
    ("def g(x, axis: const = None):\n    return x + axis\ndef f(x):\n    return g(x)\n",
     2, 16, 4, "'axis' is None here, which is not a value (None is an argument that means "
     "\"not given\": pass it on as one, sum(x, axis=axis))"),
    ("def g(x, k: const = None):\n    return sum(x, keepdims=k)\ndef f(x):\n    return g(x)\n",
     2, 28, 1, "sum() does not take None for 'keepdims'"),
])
def test_none_anywhere_else_is_an_error_at_it(source, line, col, width, message):
    err = error(source)
    assert (err.file, err.line, err.col, err.message) == ("bad.grad", line, col, message)
    assert str(err).splitlines()[2] == " " * (col + 3) + "^" * width
