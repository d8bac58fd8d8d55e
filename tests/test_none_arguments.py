"""`None` as NumPy writes it: an argument that means "not given".

`sum(x, axis=None)` and every builtin option NumPy lets be None (the
reductions' and `cumsum`'s `axis`, `take`'s, `transpose`'s `axes`,
`arange`'s `stop` and `step`, either bound of `clip`) is the option left
out, as is a slice's bound (`x[None:2]`); a `const` parameter of no dtype takes it too (its default may be
None), so the standard library's axes take it, with SciPy's and NumPy's
meaning, every axis (`logsumexp(x, None)`, `norm(x, axis=None)`).
Anywhere else None is an error at the None (or at the name a `const`
parameter passed it on through), never "name 'None' is not defined".
From Python too: a call's None for a `const` parameter of no dtype is the
source's None (compiled for it, as for a const integer's value, through
every transform, the bridges, Dask and gradc's signatures), and None for
any other parameter is an `ArgumentError` naming it.
"""
import pickle

import numpy as np
import pytest
import scipy.special as sp

import dsl
from dsl.aot import _types as _aot_types, compile_module, parse_sig
from dsl.cli import main
from dsl.function import _types
from gradlang.compiler import pipeline
from gradlang.compiler.interpret import interpret
from gradlang.compiler.ir import StaticScalar
from helpers import central_difference, import_compiled

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


# ------------------------------------------- None passed from Python

FROM_PYTHON = """from std import norm, logsumexp, softmax, log_softmax
def f(x, axis: const = None):
    a = norm(x, axis=axis) + logsumexp(x, axis)
    return a + sum(softmax(x, axis) * x, axis=axis) + sum(log_softmax(x, axis=axis) * x, axis)

def g(x, lo: const = None):
    return clip(x, lo, 0.5) * x

def h(x, k: const i64 = 1, w: f64 = 2.0):
    return x * w
"""


def f_reference(x, axis=None):
    return (np.linalg.norm(x) if axis is None else np.linalg.norm(x, axis=axis)) \
        + sp.logsumexp(x, axis) + (sp.softmax(x, axis) * x).sum(axis) \
        + (sp.log_softmax(x, axis) * x).sum(axis)


@pytest.fixture(scope="module")
def m():
    return dsl.loads(FROM_PYTHON, "py.grad")


X = np.array([[0.3, -1.2, 2.0], [0.7, 0.1, -0.4]])


def test_none_from_python_is_the_sources_none_with_its_gradients(m):
    """`m.f(x, None)` is compiled for axis None, as `f(x, None)` in the
    source is."""
    expected = f_reference(X)
    for value in (m.f(X, None), m.f(X, axis=None), m.f(X)):
        np.testing.assert_allclose(value, expected, rtol=1e-13)
    value, gradient = dsl.value_and_grad(m.f, wrt=0)(X, None)
    np.testing.assert_allclose(value, expected, rtol=1e-13)
    np.testing.assert_allclose(gradient, central_difference(f_reference, [X, None], 0),
                               rtol=1e-6, atol=1e-8)
    again = pickle.loads(pickle.dumps(dsl.value_and_grad(m.f, wrt=0)))
    np.testing.assert_allclose(again(X, None)[1], gradient, rtol=1e-13)


def test_none_from_python_through_vmap_jvp_cuda_and_dask(m):
    # the value picks the program, as a const integer's does (None is not 0)
    np.testing.assert_allclose(m.g(X, None), np.clip(X, None, 0.5) * X, rtol=1e-15)
    np.testing.assert_allclose(m.g(X, 0), np.clip(X, 0, 0.5) * X, rtol=1e-15)
    xs = np.stack([X, -2.0 * X])
    # in_axes None passes it to every example; forward mode takes no tangent for it
    mapped = dsl.vmap(m.g, in_axes=(0, None))(xs, None)
    np.testing.assert_allclose(mapped, np.clip(xs, None, 0.5) * xs, rtol=1e-15)
    t = np.linspace(-1.0, 1.0, 6).reshape(2, 3)
    out, tangent = dsl.jvp(m.g, (X, None), (t, None))
    np.testing.assert_allclose(tangent, np.where(X < 0.5, 2 * X, 0.5) * t, rtol=1e-15)
    with pytest.raises(dsl.ArgumentError, match="the tangent for 'lo' of g\\(\\) must be None "
                                                "or zero"):
        dsl.jvp(m.g, (X, None), (t, np.ones(3)))
    cuda = dsl.loads(FROM_PYTHON, "py.grad", target="cuda", host_results=True)
    np.testing.assert_allclose(dsl.grad(cuda.g, wrt=0)(X, None), np.where(X < 0.5, 2 * X, 0.5),
                               rtol=1e-15)
    da = pytest.importorskip("dask.array")  # None goes to every block
    rows = np.vstack([X, -X, 2 * X])
    np.testing.assert_allclose(m.g(da.from_array(rows, chunks=(2, 3)), None).compute(),
                               np.clip(rows, None, 0.5) * rows, rtol=1e-15)


@pytest.mark.parametrize("args,kwargs,message", [
    ((None,), {}, "argument 'x' of h() is None, but only a `const` parameter of no dtype (such "
                  "as `axis: const`) takes None, and it is an array"),
    ((X, None), {}, "argument 'k' of h() is None, but only a `const` parameter of no dtype "
                    "(such as `axis: const`) takes None, and it is `const i64`"),
    ((X,), {"w": None}, "argument 'w' of h() is None, but only a `const` parameter of no dtype "
                        "(such as `axis: const`) takes None, and it is an array of dtype f64"),
])
def test_none_from_python_for_any_other_parameter_is_an_argument_error(m, args, kwargs,
                                                                       message):
    for call in (m.h, dsl.grad(m.h, wrt=0)):
        with pytest.raises(dsl.ArgumentError) as info:
            call(*args, **kwargs)
        assert info.value.message == message


def test_a_signature_gives_none_as_it_gives_a_const_integer(m, tmp_path, capsys):
    sig = "g(f64[m, n], None)"
    assert _aot_types(m.g, parse_sig(sig)[1], sig)["lo"] == StaticScalar("bool", (), None)
    (tmp_path / "py.grad").write_text(FROM_PYTHON)
    module = import_compiled(compile_module(str(tmp_path / "py.grad"), str(tmp_path), [sig]))
    np.testing.assert_allclose(module.g(X, None), np.clip(X, None, 0.5) * X, rtol=1e-15)
    np.testing.assert_allclose(module.g.grad(X, None), np.where(X < 0.5, 2 * X, 0.5),
                               rtol=1e-15)
    with pytest.raises(dsl.ArgumentError, match=r"g\(f64\[:, :\], None\); this call is "
                                                r"g\(f64\[2, 3\], 0\)"):
        module.g(X, 0)
    # and gradc run takes None as an argument
    assert main(["run", str(tmp_path / "py.grad"), "g", "[0.25, 1.0]", "None"]) == 0
    assert capsys.readouterr().out.splitlines() == ["g = [0.0625, 0.5   ]", "d/dx = [0.5, 0.5]"]
