"""What `inspect.signature` and `help()` say of the callables a user gets:
each was `(*args, **kwargs)` (IDEs, functools, argument binding and
help() learned nothing), and a function's `__doc__` only its parameter
names.  A signature must accept exactly the calls the callable accepts:
checked by binding good and bad calls both ways."""

import inspect
import pydoc
import sys

import numpy as np
import pytest

import dsl
from dsl.aot import compile_module
from dsl.bridge import Bridged, bind_foreign, bridged
from helpers import import_compiled

SOURCE = """param w: f64[2]

# Scales x by w and by k.
# (s is an axis, unused)
def scaled(x: f64[2], s: const = None,
           k: f64 = 2.0) -> f64[2]:  # (not this comment)
    return x * w * k

# The product.
@recompute
def pair(x, y):
    return x * y
"""

X, XS = np.array([3.0, 4.0]), np.ones((3, 2))


@pytest.fixture(scope="module")
def m():
    module = dsl.loads(SOURCE, "sig.grad")
    module.params["w"] = [1.0, 2.0]
    return module


def accepts(call, args, kwargs) -> bool:
    """Whether `call(*args, **kwargs)` binds: False on a TypeError (an
    ArgumentError is one)."""
    try:
        call(*args, **kwargs)
    except TypeError:
        return False
    return True


def assert_binds_as_called(f, calls, monkeypatch):
    """inspect.signature(f) takes exactly those of `calls` that f does, f
    stopped before it runs anything (its `call_bound`: nothing compiles)."""
    signature = inspect.signature(f)
    with monkeypatch.context() as patched:
        patched.setattr(f, "call_bound", lambda *a, **k: ("ran",))
        verdicts = [(args, kwargs, accepts(signature.bind, args, kwargs),
                     accepts(f, args, kwargs)) for args, kwargs in calls]
    assert [v for v in verdicts if v[2] != v[3]] == []
    return [v[2] for v in verdicts]


CALLS = [((X,), {}), ((X, None), {}), ((X, None, 3.0), {}), ((X,), {"k": 3.0}),
         ((), {"x": X}), ((X,), {"out": None}), ((X,), {"s": None, "k": 1.0}),
         ((), {}), ((X, None, 3.0, 4.0), {}), ((X,), {"q": 1}), ((X,), {"x": X}),
         ((X, None), {"s": None}), ((X,), {"w": X})]
GOOD = [True] * 7 + [False] * 6


def test_a_loaded_function_and_its_transforms_state_the_calls_they_take(m, monkeypatch):
    assert str(inspect.signature(m.scaled)) == "(x, s=None, k=2.0, *, out=None)"
    for f in (m.scaled, dsl.grad(m.scaled), dsl.value_and_grad(m.scaled, wrt="k"),
              dsl.jacfwd(m.scaled), dsl.jacrev(m.scaled, wrt=(0, 2)), dsl.hessian(m.scaled)):
        assert str(inspect.signature(f)) == "(x, s=None, k=2.0, *, out=None)", f
        assert assert_binds_as_called(f, CALLS, monkeypatch) == GOOD, f
    # a mapped argument is passed by position, and so is each before it
    mapped = dsl.vmap(m.pair, in_axes=(None, 0))
    assert str(inspect.signature(mapped)) == "(x, y, /, *, out=None)"
    assert assert_binds_as_called(mapped, [((X, XS), {}), ((X,), {"y": XS}), ((XS,), {"x": X}),
                                           ((X, XS), {"out": None}), ((X,), {})],
                                  monkeypatch) == [True, False, False, True, False]
    assert str(inspect.signature(dsl.vmap(m.pair))) == "(x, y, /, *, out=None)"
    assert str(inspect.signature(dsl.vmap(dsl.jacrev(m.scaled)))) == \
        "(x, /, s=None, k=2.0, *, out=None)"
    # the signature binds a call that runs: x * w * k
    bound = inspect.signature(m.scaled).bind(X, k=3.0)
    np.testing.assert_array_equal(m.scaled(*bound.args, **bound.kwargs), [9.0, 24.0])
    # No Python signature says these, so they keep (*args, **kwargs), which
    # is vague but not wrong: hvp's v is its last positional argument, after
    # f's defaulted ones (hvp(f)(x, v), hvp(f)(x, s, v)); a parameter named
    # like a Python keyword; one named `out` beside the out= buffers.
    assert str(inspect.signature(dsl.hvp(m.pair))) == "(*args, **kwargs)"
    # or by keyword, as a torch user passes it (it was "pair() has no
    # parameter 'v'"): the Hessian of sum(x * y) in x is 0, in y too
    hvp = dsl.hvp(m.pair, wrt=1)
    np.testing.assert_array_equal(hvp(X, XS, v=XS), hvp(X, XS, XS))
    cubed = dsl.hvp(dsl.loads("def c(x, w):\n    return sum(x * x * x * w)\n").c)
    v = np.array([1.0, -2.0])
    for call in (lambda: cubed(X, X, v=v), lambda: cubed(w=X, x=X, v=v)):
        np.testing.assert_array_equal(call(), 6 * X * X * v)  # (6 x w v)
    odd = dsl.loads("def f(x, lambda):\n    return x\n\ndef g(x, out):\n    return x\n")
    assert str(inspect.signature(odd.f)) == str(inspect.signature(odd.g)) == "(*args, **kwargs)"
    assert str(inspect.signature(type(m.scaled))).startswith("(module")  # the class's own


class _NumpyBridge(Bridged):
    """A bridge binding as the others do (`bind_foreign`), of NumPy's
    arrays: a bridge's signature is its base class's (no torch or jax
    imported for it)."""
    library = "numpy"

    def __call__(self, *args, **kwargs):
        return bind_foreign(self.f, self.name, args, kwargs, lambda value, where: (value, None))


def test_a_bridged_function_takes_module_params_by_keyword_and_no_out(m):
    f = _NumpyBridge(m.scaled)
    signature = inspect.signature(f)
    assert str(signature) == "(x, s=None, k=2.0, *, w=<the module's>)"

    calls = CALLS[:5] + [((X,), {"w": X}), ((X,), {"out": None})] + CALLS[7:-1]
    verdicts = [(accepts(signature.bind, a, k), accepts(f, a, k)) for a, k in calls]
    assert verdicts == [(good, good) for good in [True] * 6 + [False] * 6]
    assert str(inspect.signature(_NumpyBridge(bridged(dsl.jacfwd(m.pair), "?")))) == "(x, y)"


def test_help_shows_the_header_and_the_comments_above_it(m):
    doc = ("def scaled(x: f64[2], s: const = None, k: f64 = 2.0) -> f64[2]\n\n"
           "(defined at sig.grad:5)\n\nScales x by w and by k.\n(s is an axis, unused)")
    assert m.scaled.__doc__ == doc
    assert "    Scales x by w and by k." in pydoc.render_doc(m.scaled, renderer=pydoc.plaintext)
    assert m.pair.__doc__ == "def pair(x, y)\n\n(defined at sig.grad:11)\n\nThe product."
    assert dsl.grad(m.pair, wrt=1).__doc__ == (
        f"grad(pair): the gradient of pair() w.r.t. y; it takes the arguments of pair():\n\n"
        f"{m.pair.__doc__}")
    assert type(m.scaled).__doc__.startswith("A function of a loaded `.grad` module")


def test_a_compiled_modules_functions_state_their_calls_and_source(tmp_path, monkeypatch):
    (tmp_path / "sig.grad").write_text(SOURCE)
    compile_module(str(tmp_path / "sig.grad"), str(tmp_path), ["scaled(f64[2])"])
    compiled = import_compiled(tmp_path / "sig.py")
    compiled.params["w"] = [1.0, 2.0]
    f = compiled.scaled
    for g in (f, f.grad, f.value_and_grad, f.vjp, dsl.grad(f)):
        assert str(inspect.signature(g)) == "(x, s=None, k=2.0)", g  # (no out=: none taken)
    assert f.__doc__ == dsl.loads(SOURCE, str(tmp_path / "sig.grad")).scaled.__doc__
    assert "(defined at " in f.grad.__doc__ and "Scales x" in f.grad.__doc__
    # bad calls are refused by both before anything runs
    signature = inspect.signature(f)
    for args, kwargs in [c for c, good in zip(CALLS, GOOD) if not good] + [((X,), {"out": None})]:
        assert not accepts(signature.bind, args, kwargs) and not accepts(f, args, kwargs)
    bound = signature.bind(x=X)
    np.testing.assert_array_equal(f(*bound.args, **bound.kwargs), [6.0, 16.0])
