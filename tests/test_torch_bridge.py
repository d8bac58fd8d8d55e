"""`dsl.to_torch`: compiled functions inside torch.autograd, to any order.

Values equal the NumPy call; first and second order gradients agree with
finite differences (gradcheck, gradgradcheck) on every example, and with
known derivatives; tensors reach the kernels without copies."""

import runpy
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from dsl import function as dsl_function
from helpers import EXAMPLE_CALLS, EXAMPLES, central_difference
from helpers import load_example as load

torch = pytest.importorskip("torch", reason="the torch extra is not installed")

def tensor(values, requires_grad=True, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype, requires_grad=requires_grad)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


@pytest.mark.parametrize("example,name,inputs,consts", EXAMPLE_CALLS,
                         ids=[f"{e}.{n}" for e, n, _, _ in EXAMPLE_CALLS])
def test_every_example_through_torch(example, name, inputs, consts):
    f = getattr(load(example), name)
    tf = dsl.to_torch(f)
    xs = [tensor(x) for x in inputs]
    y = tf(*xs, **consts)
    np.testing.assert_allclose(y.detach().numpy(), f(*inputs, **consts), rtol=1e-12, atol=0)
    grads = torch.autograd.grad(y.sum(), xs)
    expected = dsl.grad(f, wrt=list(range(len(inputs))))(*inputs, **consts)
    for g, e in zip(grads, expected):
        np.testing.assert_allclose(g.numpy(), e, rtol=1e-12, atol=1e-15)
    def call(*ts):
        return tf(*ts, **consts)
    assert torch.autograd.gradcheck(call, tuple(xs))
    assert torch.autograd.gradgradcheck(call, tuple(xs))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-30, 30), min_size=1, max_size=6),
       st.lists(st.floats(-3, 3), min_size=2, max_size=2))
def test_values_and_gradients_on_random_inputs(xs, ws):
    # the bar example: x * y; linear_poly with weights as a keyword tensor
    x, w = np.array(xs), np.array(ws)
    xt, wt = tensor(x), tensor(w)
    lp = dsl.to_torch(load("linear_poly").linear_poly)
    y = lp(xt, weights=wt)
    np.testing.assert_allclose(y.detach().numpy(), w[1] * x + w[0], rtol=1e-15, atol=1e-15)
    y.sum().backward()

    def f(w):
        return w[1] * x + w[0]

    np.testing.assert_allclose(wt.grad.numpy(), central_difference(f, [w], 0), rtol=1e-6,
                               atol=1e-6)
    np.testing.assert_allclose(xt.grad.numpy(), np.full_like(x, w[1]), rtol=1e-15)


def test_straight_through_gradient_is_the_grad_block_not_finite_differences():
    # quantize's gradient passes through by design, so gradcheck (finite
    # differences of a step function) cannot agree: compare with dsl.grad.
    f = load("straight_through").quantized_loss
    x, target = np.array([0.1, 0.52, 0.9]), np.array([0.0, 0.5, 1.0])
    xt = tensor(x)
    dsl.to_torch(f)(xt, target).backward()
    err = np.round(x * 255) / 255 - target
    np.testing.assert_allclose(xt.grad.numpy(), 2 * err, rtol=1e-12)


def test_backward_fills_grad_from_the_grad_block():
    x = tensor([-3.0, 0.0, 2.0, 100.0])
    f = load("log1pexp").log1pexp
    dsl.to_torch(f)(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), sigmoid(x.detach().numpy()), rtol=1e-12)
    np.testing.assert_array_equal(x.grad.numpy(), dsl.grad(f)(x.detach().numpy()))
    assert x.grad[3] == 1.0  # the grad block stays finite where exp overflows


def test_double_and_triple_backward_through_the_grad_block():
    # log1pexp' = s, '' = s(1-s), ''' = s(1-s)(1-2s): each order is our
    # compiled backward differentiated again, not torch's.
    x = tensor([-1.5, 0.0, 0.7, 3.0])
    f = dsl.to_torch(load("log1pexp").log1pexp)
    (d1,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
    (d2,) = torch.autograd.grad(d1.sum(), x, create_graph=True)
    (d3,) = torch.autograd.grad(d2.sum(), x)
    s = sigmoid(x.detach().numpy())
    np.testing.assert_allclose(d1.detach().numpy(), s, rtol=1e-12)
    np.testing.assert_allclose(d2.detach().numpy(), s * (1 - s), rtol=1e-12)
    np.testing.assert_allclose(d3.numpy(), s * (1 - s) * (1 - 2 * s), rtol=1e-12, atol=1e-16)


def test_params_as_keyword_tensors_get_grad():
    lp = dsl.to_torch(load("linear_poly").linear_poly)
    x = tensor([1.0, 2.0, 4.0])
    w = tensor([0.5, -3.0])
    y = lp(x, weights=w)
    np.testing.assert_allclose(y.detach().numpy(), [-2.5, -5.5, -11.5], rtol=1e-15)
    y.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [3.0, 7.0], rtol=1e-15)  # [n, sum(x)]
    np.testing.assert_allclose(x.grad.numpy(), [-3.0] * 3, rtol=1e-15)
    assert torch.autograd.gradgradcheck(lambda x, w: lp(x, weights=w), (x, w))


def test_a_param_left_out_takes_the_module_value():
    m = dsl.load(EXAMPLES / "linear_poly.grad")
    m.params["weights"] = np.array([1.0, 2.0])
    x = tensor([1.0, 3.0])
    y = dsl.to_torch(m.linear_poly)(x)
    np.testing.assert_allclose(y.detach().numpy(), [3.0, 7.0])
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0])


def test_cpu_tensors_reach_the_kernels_and_come_back_without_copies(monkeypatch):
    f = load("bar").bar
    seen = {}
    real = dsl_function.Compiled.call_bound

    def spy(self, bound, args=(), out=None):
        seen.update({n: a.ctypes.data for n, a in bound.items()})
        outs = real(self, bound, args, out)
        seen["out"] = outs[0].ctypes.data
        return outs

    monkeypatch.setattr(dsl_function.Compiled, "call_bound", spy)
    x, y = torch.arange(4.0, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    out = dsl.to_torch(f)(x, y)
    assert seen["x"] == x.data_ptr() and seen["y"] == y.data_ptr()
    assert out.data_ptr() == seen["out"]
    np.testing.assert_array_equal(out.numpy(), [0.0, 1.0, 2.0, 3.0])


def test_calls_with_nothing_to_record_are_the_functions_own_call():
    m = dsl.loads("def two(x, y):\n    return x * y, sin(x)\n")
    f = dsl.to_torch(m.two)
    for n in (3, 3, 5):  # the second call of a signature takes the dsl's fast path
        x, y = torch.rand(n, dtype=torch.float64), torch.rand(n, dtype=torch.float64)
        p, s = f(x, y)
        assert p.grad_fn is None and s.grad_fn is None and p.shape == (n,)
        np.testing.assert_array_equal(p.numpy(), x.numpy() * y.numpy())
        np.testing.assert_array_equal(s.numpy(), m.two(x.numpy(), y.numpy())[1])
    with pytest.raises(dsl.GradError, match="shapes \\[5\\] and \\[4\\] do not broadcast"):
        f(x, torch.rand(4, dtype=torch.float64))  # checked as any call is


def test_f32_stays_f32_and_matches_the_numpy_call():
    f = load("log1pexp").log1pexp
    x = torch.linspace(-4, 4, 9, dtype=torch.float32, requires_grad=True)
    y = dsl.to_torch(f)(x)
    assert y.dtype == torch.float32
    y.sum().backward()
    assert x.grad.dtype == torch.float32
    xn = x.detach().numpy()
    np.testing.assert_array_equal(y.detach().numpy(), f(xn))
    np.testing.assert_array_equal(x.grad.numpy(), dsl.grad(f)(xn))


def test_several_outputs_and_a_transform():
    m = dsl.loads("def two(x, y):\n    return x * y, sin(x)\n")
    x, y = tensor([0.5, 1.0]), tensor([2.0, -1.0])
    p, s = dsl.to_torch(m.two)(x, y)
    s.sum().backward()  # no gradient flows into p: its cotangent is zero
    np.testing.assert_allclose(x.grad.numpy(), np.cos([0.5, 1.0]), rtol=1e-15)
    assert y.grad is None or not y.grad.any()
    g = dsl.to_torch(dsl.grad(m.two, wrt=0))
    x2 = tensor([0.5, 1.0])
    (h,) = torch.autograd.grad(g(x2, y.detach()).sum(), x2)  # d/dx (y + cos x) = -sin x
    np.testing.assert_allclose(h.numpy(), -np.sin([0.5, 1.0]), rtol=1e-15)


def test_the_torch_training_example_lowers_its_loss(capsys):
    run = runpy.run_path(str(EXAMPLES / "torch_training.py"))
    losses = run["losses"]
    assert losses[-1] < 0.1 * losses[0]
    z = run["model"](run["x"])[:, 0].detach().numpy()
    expected = np.mean(np.logaddexp(0, -run["y"].numpy() * z))
    assert run["loss"](torch.from_numpy(z), run["y"]).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.complex128,
                                   torch.uint8])
def test_other_dtypes_are_argument_errors(dtype):
    with pytest.raises(dsl.ArgumentError, match=f"dtype {dtype}; gradlang takes float32"):
        dsl.to_torch(load("log1pexp").log1pexp)(torch.zeros(3, dtype=dtype))


def test_requires_grad_on_a_const_argument_is_an_argument_error():
    f = dsl.to_torch(load("leaky_relu").leaky_relu)
    with pytest.raises(dsl.ArgumentError, match="'alpha' has no gradient"):
        f(tensor([1.0, -1.0]), alpha=tensor(0.1))
    x = tensor([1.0, -1.0])  # detached, the const is fine
    np.testing.assert_allclose(f(x, alpha=tensor(0.1, requires_grad=False)).detach(),
                               [1.0, -0.1])


def test_a_tensor_on_another_device_is_an_argument_error():
    f = dsl.to_torch(load("log1pexp").log1pexp)
    with pytest.raises(dsl.ArgumentError, match="on device meta, but log1pexp\\(\\) runs on "
                                                "target 'cpu'"):
        f(torch.zeros(3, dtype=torch.float64, device="meta"))


@pytest.mark.parametrize("requires_grad", [False, True])
def test_a_sparse_tensor_is_an_argument_error(requires_grad):
    # torch's TypeError from reading its NumPy view escaped the bridge
    f = dsl.to_torch(load("log1pexp").log1pexp)
    sparse = torch.zeros(3, dtype=torch.float64).to_sparse().requires_grad_(requires_grad)
    with pytest.raises(dsl.ArgumentError, match="layout torch.sparse_coo.*to_dense"):
        f(sparse)
    np.testing.assert_allclose(f(sparse.to_dense()).detach(), np.full(3, np.log(2.0)))


@pytest.mark.parametrize("transform", [torch.func.grad, torch.func.vmap])
def test_a_torch_func_transform_is_an_argument_error(transform):
    # its wrapper tensors have no storage: reading them raised torch's own
    # RuntimeError from inside the bridge
    f = dsl.to_torch(load("log1pexp").log1pexp)
    with pytest.raises(dsl.ArgumentError, match="torch.func transform"):
        transform(lambda x: f(x).sum())(torch.zeros(2, 3, dtype=torch.float64))
    x = tensor([[0.0, 100.0]])  # plain autograd still differentiates
    f(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0.5, 1.0]])


def test_a_cpu_tensor_for_a_cuda_module_is_an_argument_error():
    # (CUDA tensors to the CUDA target need a GPU: not verified here)
    m = dsl.load(EXAMPLES / "log1pexp.grad", target="cuda")
    with pytest.raises(dsl.ArgumentError, match="on device cpu, but log1pexp\\(\\) runs on "
                                                "target 'cuda'"):
        dsl.to_torch(m.log1pexp)(torch.zeros(3, dtype=torch.float64))


def test_a_gradc_compiled_function_is_refused(tmp_path, monkeypatch):
    from dsl.aot import compile_module
    compile_module(str(EXAMPLES / "bar.grad"), str(tmp_path), ["bar(f64[n], f64[n])"])
    monkeypatch.syspath_prepend(str(tmp_path))
    # not a `bar` an earlier test on this worker imported (the .grad import hook)
    monkeypatch.delitem(sys.modules, "bar", raising=False)
    import importlib
    compiled = importlib.import_module("bar")
    with pytest.raises(dsl.ArgumentError, match="gradc-compiled module"):
        dsl.to_torch(compiled.bar)


def test_an_integer_used_as_a_size_compiles_for_its_value():
    m = dsl.loads("def f(x, seg, m: i64):\n    return segment_sum(x, seg, m)\n")
    f = dsl.to_torch(m.f)
    x = tensor([1.0, 2.0, 4.0])
    y = f(x, torch.tensor([1, 0, 1]), torch.tensor(2))
    np.testing.assert_array_equal(y.detach().numpy(), [2.0, 5.0])
    (y ** 2).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [10.0, 4.0, 10.0])
