"""Pickling compiled functions: a loaded module's functions, the transforms
of them and the bridges' wrappers pickle as their module's sources, target
and params and the transforms on top, and are rebuilt where they are
unpickled (another process, with the .grad files gone); what cannot travel
is a clear TypeError."""
from __future__ import annotations

import copy
import io
import json
import pickle
import subprocess
import sys

import numpy as np
import pytest

import dsl
from dsl.function import GradFunction
from helpers import EXAMPLES, central_difference, optional_module

X = np.array([-1.5, 0.25, 2.0])
WEIGHTS = np.array([0.5, -2.0])


def round_trip(value):
    return pickle.loads(pickle.dumps(value))


def linear_poly() -> dsl.Module:
    """examples/linear_poly.grad (weights[1] * x + weights[0], a param and a
    grad block), loaded anew: its params are the test's own."""
    m = dsl.load(EXAMPLES / "linear_poly.grad")
    m.params["weights"] = WEIGHTS
    return m


def test_functions_and_their_transforms_round_trip_with_equal_values_and_gradients():
    m = linear_poly()
    f = m.linear_poly
    made = [f, dsl.grad(f), dsl.grad(f, wrt=("x", "weights")), dsl.value_and_grad(f),
            dsl.vmap(f), dsl.jacfwd(f), dsl.hessian(f)]
    back = round_trip(made)
    w0, w1 = WEIGHTS
    np.testing.assert_array_equal(back[0](X), w1 * X + w0)
    np.testing.assert_array_equal(back[1](X), np.full(3, w1))
    dx, dw = back[2](X)
    np.testing.assert_array_equal(dx, np.full(3, w1))
    np.testing.assert_allclose(dw, central_difference(
        lambda w: w[1] * X + w[0], [WEIGHTS], 0), rtol=1e-7)
    value, dx = back[3](X)
    np.testing.assert_array_equal(value, f(X))
    np.testing.assert_array_equal(dx, np.full(3, w1))
    xs = np.stack([X, 2 * X])
    np.testing.assert_array_equal(back[4](xs), w1 * xs + w0)
    np.testing.assert_array_equal(back[5](X), w1 * np.eye(3))
    np.testing.assert_array_equal(back[6](X), np.zeros((3, 3)))
    assert [type(b) for b in back] == [type(m) for m in made]
    # a transform comes back as the one `dsl` makes of the function there
    assert back[1] is dsl.grad(back[0])


def test_forward_mode_and_hvp_of_an_unpickled_function_match_the_closed_form():
    # log1pexp: d/dx = sigmoid(x), d2/dx2 = sigmoid(x) (1 - sigmoid(x))
    f = dsl.load(EXAMPLES / "log1pexp.grad").log1pexp
    s = 1 / (1 + np.exp(-X))
    g, hvp = round_trip((f, dsl.hvp(f)))
    outs, tangents = dsl.jvp(g, (X,), (np.ones(3),))
    np.testing.assert_allclose(outs, np.log1p(np.exp(X)), rtol=1e-15)
    np.testing.assert_allclose(tangents, s, rtol=1e-15)
    np.testing.assert_allclose(hvp(X, np.ones(3)), s * (1 - s), rtol=1e-14)
    np.testing.assert_allclose(dsl.grad(g)(X), central_difference(g, [X], 0), rtol=1e-7)


def test_params_travel_and_functions_of_one_module_share_it_again():
    m = linear_poly()
    m.params["weights"] = [1.0, 3.0]  # changed since load: the value pickled is this one
    m2, f2, g2 = round_trip((m, m.linear_poly, dsl.grad(m.linear_poly, wrt="weights")))
    np.testing.assert_array_equal(f2(X), 3.0 * X + 1.0)
    assert m2 is not m and m2.linear_poly is f2 and g2 is dsl.grad(f2, wrt="weights")
    m.params["weights"] = [0.0, 0.0]  # the copy's params are its own
    m2.params["weights"] = [2.0, -1.0]  # and its functions read them
    np.testing.assert_array_equal(f2(X), 2.0 - X)
    np.testing.assert_array_equal(g2(X), [3.0, X.sum()])
    twin = copy.deepcopy(m2)  # a module's deep copy has params of its own, read by its functions
    twin.params["weights"] = [0.0, 1.0]
    np.testing.assert_array_equal(twin.linear_poly(X), X)
    np.testing.assert_array_equal(f2(X), 2.0 - X)
    assert copy.deepcopy(f2) is f2 and copy.copy(f2) is f2
    two = dsl.loads("def a(x):\n    return x\n\ndef b(x):\n    return -x\n")
    a, b = round_trip((two.a, two.b))  # (pickle's memo: the module pickles once)
    assert a._module is b._module is not two and a._module.b is b


def test_a_module_travels_as_its_sources_to_a_process_without_its_files(tmp_path):
    # a user's module imported by another, the stdlib, a param: the
    # sources travel, so the files may be gone where it is unpickled
    (tmp_path / "scaling.grad").write_text("param scale: f64\n\ndef scaled(x):\n"
                                           "    return scale * x\n")
    (tmp_path / "model.grad").write_text("from std import softplus\nimport scaling\n\n"
                                         "def model(x):\n"
                                         "    return softplus(scaling.scaled(x))\n")
    m = dsl.load(tmp_path / "model.grad")
    m.params["scale"] = 2.0
    f, g = m.model, dsl.grad(m.model)
    here = [f(X), g(X)]  # (compiled here: there, served from the kernel store)
    pickled = tmp_path / "model.pickle"
    pickled.write_bytes(pickle.dumps((f, g)))
    (tmp_path / "scaling.grad").unlink()
    (tmp_path / "model.grad").unlink()
    code = ("import json, pickle, sys, numpy as np\n"
            "f, g = pickle.load(open(sys.argv[1], 'rb'))\n"
            "x = np.array(json.loads(sys.argv[2]))\n"
            "print(json.dumps([f(x).tolist(), g(x).tolist()]))\n")
    run = subprocess.run([sys.executable, "-c", code, str(pickled), json.dumps(X.tolist())],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr
    values, gradient = json.loads(run.stdout)
    np.testing.assert_array_equal(values, here[0])
    np.testing.assert_array_equal(gradient, here[1])
    np.testing.assert_allclose(values, np.log1p(np.exp(2 * X)), rtol=1e-15)
    np.testing.assert_allclose(gradient, 2 / (1 + np.exp(-2 * X)), rtol=1e-15)


def test_to_torch_in_a_torch_module_survives_torch_save_and_load():
    torch = optional_module("torch", "torch")
    m = linear_poly()

    model = torch.nn.Module()  # (a plain one: a class of the test's own would not pickle)
    model.weights = torch.nn.Parameter(torch.tensor(WEIGHTS))
    model.poly = dsl.to_torch(m.linear_poly)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    model = torch.load(buffer, weights_only=False)
    x = torch.tensor(X, requires_grad=True)
    model.poly(x, weights=model.weights).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full(3, WEIGHTS[1]))
    np.testing.assert_array_equal(model.weights.grad.numpy(), [3.0, X.sum()])


def test_what_cannot_travel_is_a_clear_type_error():
    f = dsl.load(EXAMPLES / "log1pexp.grad").log1pexp
    _, pullback = dsl.vjp(f, X)
    with pytest.raises(TypeError, match=r"cannot pickle the pullback of log1pexp\(\): it holds "
                                        "one call's residuals"):
        pickle.dumps(pullback)
    # a callable class of its own (a transform to come) has its own recipe
    # or none: an inherited one would make its base class again
    class Subclass(GradFunction):
        pass
    with pytest.raises(TypeError, match="cannot pickle a Subclass: its class gives no recipe"):
        pickle.dumps(Subclass(f, 0, with_value=False))


def test_an_error_of_no_location_keeps_none_through_a_pickle():
    # a process pool sends a worker's error back pickled: the unknown place
    # came back a copy, which errors (telling it by identity) printed as
    # an invented `<unknown>:1:1:` location
    m = dsl.loads("param w: f64\n\ndef f(x):\n    return x * w\n")
    with pytest.raises(dsl.ArgumentError) as raised:
        m.params["v"] = 1.0
    text = str(raised.value)
    assert text.startswith("error: ") and "declares no param 'v'" in text
    assert str(pickle.loads(pickle.dumps(raised.value))) == text


def test_an_error_of_a_compile_time_value_in_a_grad_block_pickles():
    # (its class took the value as a required argument, which unpickling,
    # that passes the message only, did not give: a TypeError)
    with pytest.raises(dsl.GradError) as raised:
        dsl.loads("def f(x):\n    return x * x\ngrad(dy):\n"
                  "    return reshape(dy * x, (sum(dy > 0.0),))\n", "b.grad")
    text = str(raised.value)
    assert text.startswith("b.grad:4:12: error: a shape must be") and "upstream" in text
    assert str(pickle.loads(pickle.dumps(raised.value))) == text
