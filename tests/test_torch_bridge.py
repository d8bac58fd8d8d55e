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
from helpers import EXAMPLE_CALLS, EXAMPLES, SECOND_ORDER_CALLS, central_difference
from helpers import load_example as load, optional_module

torch = optional_module("torch", "torch")
fake_tensor = optional_module("torch._subclasses.fake_tensor", "torch")
functional_tensor = optional_module("torch._subclasses.functional_tensor", "torch")
proxy_tensor = optional_module("torch.fx.experimental.proxy_tensor", "torch")

def tensor(values, requires_grad=True, dtype=None):
    return torch.tensor(values, dtype=dtype or torch.float64, requires_grad=requires_grad)


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
    if f"{example}.{name}" in SECOND_ORDER_CALLS:
        # (cross_entropy.pick failed the reentrancy check at tolerance 0 in about
        # one of 60 runs with fresh random grad_outputs, since at least the
        # session's first commit: two backward passes of the same inputs differed
        # in the last bits, never by 1e-10; the cause is not found, see the
        # stop-20 note. Values are still checked against differences.)
        assert torch.autograd.gradgradcheck(call, tuple(xs), nondet_tol=1e-12)


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


def test_torch_holds_the_residuals_and_frees_them_after_backward():
    # the pullback held them on the graph's node, unseen by torch: kept
    # after the backward for as long as the output lived (a loss kept for
    # logging held every step's), and outside checkpoint's and
    # save_on_cpu's saved-tensor hooks, which never saw them
    f = dsl.to_torch(load("log1pexp").log1pexp)
    x = tensor([-1.0, 0.5, 2.0])
    s = sigmoid(x.detach().numpy())
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t.clone(),
                                                  lambda t: t):
        y = f(x)
    # x, and the residual the block reads: 1 - 1 / (1 + e), simplified to sigmoid(x)
    assert len(packed) == 2
    np.testing.assert_allclose(packed[1].numpy(), s, rtol=1e-15)
    (g,) = torch.autograd.grad(y.sum(), x, retain_graph=True)
    np.testing.assert_allclose(g.numpy(), s, rtol=1e-15)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), s, rtol=1e-15)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.sum().backward()
    from torch.utils.checkpoint import checkpoint
    w = tensor(1.5)
    (gx, gw) = torch.autograd.grad(checkpoint(lambda x: f(x * w), x, use_reentrant=False).sum(),
                                   (x, w))
    np.testing.assert_allclose(gx.numpy(), 1.5 * sigmoid(1.5 * x.detach().numpy()), rtol=1e-15)


def test_backward_reads_the_residual_tensor_torch_gives_back():
    # the backward reads the array a residual tensor was made over only
    # when torch gives back that very tensor; a saved-tensor hook's other
    # tensor (here: twice the residual, sigmoid(x)) is what it reads
    f = dsl.to_torch(load("log1pexp").log1pexp)
    x = tensor([-1.0, 0.5, 2.0])
    s = sigmoid(x.detach().numpy())
    for unpack, scale in [(lambda t: t, 1.0), (lambda t: 2 * t, 2.0), (lambda t: t, 1.0)]:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
            y = f(x)
        (g,) = torch.autograd.grad(y.sum(), x)
        np.testing.assert_allclose(g.numpy(), scale * s, rtol=1e-15)


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


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_half_precision_runs_in_float32_and_its_gradient_comes_back_in_its_dtype(dtype_name):
    # (refused: "a tensor of dtype torch.float16", under torch.autocast too)
    dtype = getattr(torch, dtype_name)
    f = dsl.to_torch(load("log1pexp").log1pexp)
    x = torch.tensor([-3.0, -0.5, 0.0, 2.0, 30.0], dtype=dtype, requires_grad=True)
    y = f(x)
    (g,) = torch.autograd.grad(y, x, torch.ones(5))
    wide = x.detach().double().numpy()
    assert y.dtype == torch.float32 and g.dtype == dtype
    np.testing.assert_allclose(y.detach().numpy(), np.logaddexp(0, wide), rtol=1e-6)
    np.testing.assert_array_equal(g.float().numpy(), torch.sigmoid(x.detach().float()).to(dtype)
                                  .float().numpy())
    with torch.autocast("cpu", dtype=dtype):  # a layer's output in autocast's dtype
        h = torch.nn.functional.linear(torch.ones(2, 3), torch.full((5, 3), 0.5))
        assert h.dtype == dtype and f(h).dtype == torch.float32


def test_half_precision_for_a_parameter_not_taking_float32_is_refused_in_its_dtype():
    # it was cast to float32 first, and refused as "'n' has dtype f32"
    m = dsl.loads("def g(x, n: i64):\n    return x * n\ndef h(x: f64):\n    return x * 2.0\n")
    half = torch.ones(2, dtype=torch.float16)
    for call, where in ((lambda: dsl.to_torch(m.g)(half, torch.tensor(2, dtype=torch.float16)),
                         "argument 'n' of to_torch.g."),
                        (lambda: dsl.to_torch(m.h)(half), "argument 'x' of to_torch.h.")):
        with pytest.raises(dsl.ArgumentError, match=where + " is a tensor of dtype torch.float16; "
                           ".* cast to float32 only for a parameter that takes float32"):
            call()


@pytest.mark.parametrize("dtype_name", ["complex128", "uint8"])
def test_other_dtypes_are_argument_errors(dtype_name):
    dtype = getattr(torch, dtype_name)
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


def _nested(requires_grad: bool):
    return torch.nested.nested_tensor([torch.zeros(3), torch.zeros(2)], dtype=torch.float64,
                                      requires_grad=requires_grad)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("make,message,dense", [
    (lambda rg: torch.zeros(3, dtype=torch.float64).to_sparse().requires_grad_(rg),
     "a tensor of layout torch.sparse_coo.*to_dense", lambda t: t.to_dense()),
    # a nested tensor's layout is strided: torch's "Internal error:
    # NestedTensorImpl doesn't support sizes" escaped from reading its view
    (_nested, "a nested tensor.*to_padded_tensor", lambda t: t.to_padded_tensor(0.0)),
], ids=["sparse", "nested"])
def test_a_tensor_without_dense_memory_is_an_argument_error(requires_grad, make, message,
                                                            dense):
    # torch's TypeError from reading a sparse tensor's NumPy view escaped the bridge
    f = dsl.to_torch(load("log1pexp").log1pexp)
    t = make(requires_grad)
    with pytest.raises(dsl.ArgumentError, match="log1pexp.grad:.*argument 'x' of "
                                                f"to_torch\\(log1pexp\\) is {message}"):
        f(t)
    np.testing.assert_allclose(f(dense(t)).detach(), np.full((2, 3)[-t.dim():], np.log(2.0)))


def test_tensors_of_torchs_legacy_vmap_are_argument_errors():
    # the backward (a batched cotangent), the jvp rule (a batched tangent)
    # and a call (a batched argument) read the NumPy view of a tensor that
    # has no memory: "Batching rule not implemented for aten::detach"
    from torch._vmap_internals import _vmap
    from torch.autograd import functional
    f = dsl.to_torch(load("log1pexp").log1pexp)
    x = torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float64)
    s = torch.sigmoid(x)
    np.testing.assert_allclose(functional.jacobian(f, x), torch.diag(s), rtol=1e-15)
    legacy = "log1pexp.grad:.*error: {} is batched by torch's legacy vmap.*use torch.func"
    for what, call in [
            ("a cotangent", lambda: functional.jacobian(f, x, vectorize=True)),
            ("a tangent", lambda: functional.jacobian(f, x, vectorize=True,
                                                      strategy="forward-mode")),
            # (its backward is vjp(log1pexp)'s, which had no source location)
            ("a cotangent", lambda: functional.hessian(lambda x: f(x).sum(), x,
                                                       vectorize=True)),
            ("argument 'x' of to_torch\\(log1pexp\\)", lambda: _vmap(f)(x[:, None]))]:
        with pytest.raises(dsl.ArgumentError, match=legacy.format(what)):
            call()
    np.testing.assert_allclose(torch.func.jacrev(f)(x), torch.diag(s), rtol=1e-15)


def _export(g, x):
    class Module(torch.nn.Module):
        def forward(self, x):
            return g(x)
    return torch.export.export(Module(), (x,), strict=False)


@pytest.mark.filterwarnings("ignore:`torch.jit")
@pytest.mark.parametrize("trace", [
    # jit.trace kept the results as constants (a TracerWarning, then the first
    # input's values for any input), or failed its sanity check
    lambda g, x: torch.jit.trace(g, (x,)),
    # make_fx kept them as constants silently
    lambda g, x: proxy_tensor.make_fx(g)(x),
    # export recursed until RecursionError (its non-strict mode is
    # compiling, and ignores torch.compiler.disable)
    lambda g, x: _export(g, x).module(),
], ids=["jit.trace", "make_fx", "export"])
def test_torch_tracers_record_the_call_as_one_operation(trace, recwarn):
    # then refused (an ArgumentError); now one `gradlang::call` operation
    # whose results follow the traced function's inputs, gradients included
    f = dsl.to_torch(load("log1pexp").log1pexp)
    y = torch.tensor([3.0, 4.0], dtype=torch.float64)
    for requires_grad in (False, True):
        x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=requires_grad)
        traced = trace(lambda x: f(x * y), x)
        other = tensor([-1.0, 0.5])
        value = traced(other)
        np.testing.assert_allclose(value.detach().numpy(), np.log1p(np.exp([-3.0, 2.0])),
                                   rtol=1e-13)
        (g,) = torch.autograd.grad(value.sum(), other)
        np.testing.assert_allclose(g.numpy(), [3.0, 4.0] * sigmoid(np.array([-3.0, 2.0])),
                                   rtol=1e-13)
    assert not [w for w in recwarn if issubclass(w.category, torch.jit.TracerWarning)]


SHIFT = dsl.loads("def shift(x, t: const f64[n]):\n    return x + t\n", "shift.grad").shift


def test_a_traced_call_keeps_the_constants_it_was_traced_with():
    # the registered call held the caller's array: changed in place after a
    # trace, it changed that graph's constant, and a graph traced anew with
    # the old values (the same key) ran with the new ones: [5, 6], not [1, 2]
    f = dsl.to_torch(SHIFT)
    x = tensor([0.0, 10.0], requires_grad=False)
    t = np.array([1.0, 2.0])
    first = proxy_tensor.make_fx(lambda x: f(x, t))(x)
    t[:] = [5.0, 6.0]
    again = proxy_tensor.make_fx(lambda x: f(x, np.array([1.0, 2.0])))(x)
    np.testing.assert_array_equal(again(x).numpy(), [1.0, 12.0])
    np.testing.assert_array_equal(first(x).numpy(), [1.0, 12.0])
    traced = proxy_tensor.make_fx(lambda x: f(x, t))(x)
    np.testing.assert_array_equal(traced(x).numpy(), [5.0, 16.0])


def test_fake_tensors_and_functionalization_run_the_operation():
    # FakeTensorMode: torch's RuntimeError from a FakeTensor's NumPy view
    # escaped; now shapes and dtypes from the function's IR, running nothing
    f = dsl.to_torch(load("dense").loss)
    with fake_tensor.FakeTensorMode():
        x, w = torch.empty(5, 3, dtype=torch.float64), torch.empty(3, 2, dtype=torch.float64)
        b, t = torch.empty(2, dtype=torch.float64), torch.empty(5, 2, dtype=torch.float64)
        value = f(x, w, b, t)
    assert value.shape == () and value.dtype == torch.float64
    g = dsl.to_torch(load("bar").bar)
    x, y = tensor([1.0, 2.0]), tensor([3.0, 4.0], requires_grad=False)
    with functional_tensor.FunctionalTensorMode():
        product = g(x, y)
    np.testing.assert_array_equal(product.detach().numpy(), [3.0, 8.0])
    (gx,) = torch.autograd.grad(product.sum(), x)
    np.testing.assert_array_equal(gx.numpy(), [3.0, 4.0])


def test_fake_tensors_take_a_slices_length_from_the_size_it_shortens():
    # the result's size max(0, n - 1) of x[1:] stayed a symbol (its factor
    # is no argument's): torch.empty refused the shape
    f = dsl.to_torch(dsl.loads("def f(x):\n    return x[1:] * x[:-1]\n", "diff.grad").f)
    with fake_tensor.FakeTensorMode():
        shapes = [tuple(f(torch.empty(n, dtype=torch.float64)).shape) for n in (4, 0)]
    assert shapes == [(3,), (0,)]


def test_a_tensor_with_the_negative_bit_computes_with_its_values():
    # `c.conj().imag` is an f64 tensor whose memory holds its values'
    # negation (torch's negative bit): it was refused as having "no memory
    # for compiled kernels to read", in the call and as a backward's
    # cotangent, where torch computes with it as with any tensor
    m = dsl.loads("def cube(x):\n    return x * x * x\n")
    c = torch.tensor([1 + 2j, 3 - 4j, -0.5 + 0.25j], dtype=torch.complex128, requires_grad=True)
    x = c.conj().imag
    assert x.is_neg()
    y = dsl.to_torch(m.cube)(x)
    np.testing.assert_array_equal(y.detach().numpy(), [-8.0, 64.0, -0.015625])
    (got,) = torch.autograd.grad(y, c, grad_outputs=c.conj().imag)  # a cotangent with it too
    (want,) = torch.autograd.grad(x ** 3, c, grad_outputs=c.conj().imag)
    torch.testing.assert_close(got, want, rtol=1e-14, atol=0)


def test_a_tracer_under_a_torch_func_transform_is_refused():
    # linearize (make_fx over a jvp) recorded the operation, which has no
    # forward-mode rule: the jvp was zero, silently; make_fx over
    # torch.func.grad raised torch's RuntimeError (custom operations take no
    # torch.func transform: pytorch issue 168393)
    f = dsl.to_torch(load("bar").bar)
    y = torch.tensor([3.0, 4.0], dtype=torch.float64)
    x = torch.tensor([1.0, 2.0], dtype=torch.float64)
    for traced in (lambda: torch.func.linearize(lambda x: f(x, y), x)[1](torch.ones_like(x)),
                   lambda: proxy_tensor.make_fx(torch.func.grad(lambda x: f(x, y).sum()))(x)):
        with pytest.raises(dsl.ArgumentError, match="bar.grad:.*make_fx.* cannot record "
                                                    "to_torch\\(bar\\) under a torch.func"):
            traced()
    np.testing.assert_array_equal(torch.func.jvp(lambda x: f(x, y), (x,),
                                                 (torch.ones_like(x),))[1], [3.0, 4.0])


def test_tensor_subclasses_are_tensors():
    # a subclass from outside torch was a constant (its NumPy view): one
    # requiring grad raised torch's "Can't call numpy() on Tensor that
    # requires grad"; a FakeTensor, torch's "not supported for tensor subclasses"
    class Scaled(torch.Tensor):
        pass

    f = dsl.to_torch(load("bar").bar)
    x = torch.tensor([1.0, 2.0], dtype=torch.float64).as_subclass(Scaled).requires_grad_()
    y = torch.tensor([3.0, 4.0], dtype=torch.float64)
    (g,) = torch.autograd.grad(f(x, y).sum(), x)
    np.testing.assert_array_equal(g.detach().numpy(), [3.0, 4.0])
    with fake_tensor.FakeTensorMode():
        fake = torch.empty(2, dtype=torch.float64)
    with pytest.raises(dsl.ArgumentError, match="argument 'x' of to_torch\\(bar\\) is a "
                                                "FakeTensor, which has no memory"):
        f(fake, y)


def test_a_cpu_tensor_for_a_cuda_module_is_an_argument_error():
    # (CUDA tensors to the CUDA target need a GPU: not verified here)
    m = dsl.load(EXAMPLES / "log1pexp.grad", target="cuda")
    with pytest.raises(dsl.ArgumentError, match="on device cpu, but log1pexp\\(\\) runs on "
                                                "target 'cuda'"):
        dsl.to_torch(m.log1pexp)(torch.zeros(3, dtype=torch.float64))


def test_a_gradc_compiled_function_refuses_torch_func(tmp_path, monkeypatch):
    # (it runs first order: test_aot_training.py; torch.func needs the IR)
    from dsl.aot import compile_module
    compile_module(str(EXAMPLES / "bar.grad"), str(tmp_path), ["bar(f64[n], f64[n])"])
    monkeypatch.syspath_prepend(str(tmp_path))
    # not a `bar` an earlier test on this worker imported (the .grad import hook)
    monkeypatch.delitem(sys.modules, "bar", raising=False)
    import importlib
    compiled = importlib.import_module("bar")
    with pytest.raises(dsl.ArgumentError, match=r"torch.func transform .* needs the IR of "
                                                r"bar\(\), and a function of a gradc-compiled "
                                                "module"):
        torch.func.grad(dsl.to_torch(compiled.bar))(tensor([1.0]), tensor([2.0]))


SEGMENTS = dsl.loads("def f(x, seg, m: i64):\n    return segment_sum(x, seg, m)\n").f


def test_an_integer_used_as_a_size_compiles_for_its_value():
    f = dsl.to_torch(SEGMENTS)
    x = tensor([1.0, 2.0, 4.0])
    y = f(x, torch.tensor([1, 0, 1]), torch.tensor(2))
    np.testing.assert_array_equal(y.detach().numpy(), [2.0, 5.0])
    (y ** 2).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [10.0, 4.0, 10.0])


def test_vmap_over_a_size_stacks_equal_results_and_refuses_unequal_ones():
    # one call per example: results of sizes of their own were torch.stack's
    # RuntimeError ("stack expects each tensor to be equal size"), where
    # dsl.vmap's ArgumentError says why
    f = torch.func.vmap(dsl.to_torch(SEGMENTS), in_dims=(None, None, 0))
    x, seg = tensor([1.0, 2.0, 4.0], requires_grad=False), torch.tensor([1, 0, 1])
    y = f(x, seg, torch.tensor([2, 2]))
    np.testing.assert_array_equal(y.numpy(), [[2.0, 5.0], [2.0, 5.0]])
    with pytest.raises(dsl.ArgumentError, match=r"torch.func.vmap of f\(\) gives results of "
                                                r"different shapes: \[2\] for example 0, \[3\] "
                                                "for example 1"):
        f(x, seg, torch.tensor([2, 3]))


def test_vmap_over_a_batch_of_no_examples_runs_no_example():
    # one call per example (n gives a size): a batch of none ran f on
    # zeros of one example's shape for the results' shapes, 1 TiB here
    # (torch's allocator refused it); the shapes now come from f's IR
    m = dsl.loads("def g(x, n: i64):\n    return x * 2.0, arange(n) * 1.0\n")
    f = torch.func.vmap(dsl.to_torch(m.g), in_dims=(0, 0))
    doubled, counted = f(torch.zeros((), dtype=torch.float64).expand(0, 2**37),
                         torch.zeros(0, dtype=torch.long))
    assert (doubled.shape, doubled.dtype) == ((0, 2**37), torch.float64)
    assert (counted.shape, counted.dtype) == ((0, 0), torch.float64)


# A grad block that deliberately differs from the true derivative (d/dx
# is y * x, not y * cos x): every torch.func transform must follow it, in
# reverse and forward mode, to second order (d/dx of the block is y).
BENT = dsl.loads("def bent(x, y):\n    return sin(x) * y\n"
                 "grad(dz):\n    return dz * y * x, dz * sin(x)\n", "bent.grad").bent


def bent_inputs():
    return (torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64),
            torch.tensor([1.5, 0.5, -2.0], dtype=torch.float64))


def test_torch_func_reverse_mode_follows_the_grad_block():
    x, y = bent_inputs()
    xn, yn = x.numpy(), y.numpy()
    f = dsl.to_torch(BENT)
    gx, gy = torch.func.grad(lambda x, y: f(x, y).sum(), argnums=(0, 1))(x, y)
    ex, ey = dsl.grad(BENT, wrt=(0, 1))(xn, yn)
    np.testing.assert_allclose(gx.numpy(), yn * xn, rtol=1e-15)  # the block's, not y cos x
    np.testing.assert_allclose(gx.numpy(), ex, rtol=1e-15)
    np.testing.assert_allclose(gy.numpy(), ey, rtol=1e-15)
    out, pullback = torch.func.vjp(f, x, y)
    np.testing.assert_allclose(out.numpy(), np.sin(xn) * yn, rtol=1e-15)
    ct = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    px, py = pullback(ct)
    np.testing.assert_allclose(px.numpy(), ct.numpy() * yn * xn, rtol=1e-15)
    np.testing.assert_allclose(py.numpy(), ct.numpy() * np.sin(xn), rtol=1e-15)
    jac = torch.func.jacrev(f)(x, y)
    np.testing.assert_allclose(jac.numpy(), dsl.jacrev(BENT)(xn, yn), rtol=1e-15)
    np.testing.assert_allclose(jac.numpy(), np.diag(yn * xn), rtol=1e-15)


def test_torch_func_forward_mode_follows_the_grad_block():
    x, y = bent_inputs()
    xn, yn = x.numpy(), y.numpy()
    f = dsl.to_torch(BENT)
    tx, ty = torch.tensor([1.0, 2.0, -1.0], dtype=torch.float64), torch.ones(3).double()
    out, tangent = torch.func.jvp(f, (x, y), (tx, ty))
    expected_out, expected = dsl.jvp(BENT, (xn, yn), (tx.numpy(), ty.numpy()))
    np.testing.assert_allclose(out.numpy(), expected_out, rtol=1e-15)
    np.testing.assert_allclose(tangent.numpy(), expected, rtol=1e-15)
    np.testing.assert_allclose(tangent.numpy(), yn * xn * tx.numpy() + np.sin(xn), rtol=1e-15)
    jac = torch.func.jacfwd(f, argnums=1)(x, y)
    np.testing.assert_allclose(jac.numpy(), dsl.jacfwd(BENT, wrt=1)(xn, yn), rtol=1e-15)
    np.testing.assert_allclose(jac.numpy(), np.diag(np.sin(xn)), rtol=1e-15)
    import torch.autograd.forward_ad as fwad  # forward mode outside torch.func too
    with fwad.dual_level():
        dual = fwad.unpack_dual(f(fwad.make_dual(x, tx), fwad.make_dual(y, ty)))
    np.testing.assert_allclose(dual.tangent.numpy(), expected, rtol=1e-15)


def test_torch_func_second_order_follows_the_grad_block():
    x, y = bent_inputs()
    xn, yn = x.numpy(), y.numpy()
    f = dsl.to_torch(BENT)
    expected = dsl.hessian(BENT)(xn, yn)
    np.testing.assert_allclose(expected, np.diag(yn), rtol=1e-15)  # d/dx (y x) = y
    for hessian in (torch.func.hessian,  # forward over reverse
                    lambda g: torch.func.jacrev(torch.func.jacrev(g))):
        h = hessian(lambda x: f(x, y).sum())(x)
        np.testing.assert_allclose(h.numpy(), expected, rtol=1e-15)
    # reverse over reverse through plain autograd still works
    xr = x.clone().requires_grad_()
    (d1,) = torch.autograd.grad(f(xr, y).sum(), xr, create_graph=True)
    (d2,) = torch.autograd.grad(d1.sum(), xr)
    np.testing.assert_allclose(d2.numpy(), yn, rtol=1e-15)


def _per_example_hessian(g):
    # vmap over a batch of one x, y shared
    hessian = torch.func.vmap(torch.func.hessian(g, argnums=(0, 1)), in_dims=(0, None))
    return lambda x, y: torch.utils._pytree.tree_map(lambda h: h[0], hessian(x[None], y))


@pytest.mark.parametrize("second", [
    lambda g: torch.func.hessian(g, argnums=(0, 1)),
    lambda g: torch.func.jacrev(torch.func.jacrev(g, argnums=(0, 1)), argnums=(0, 1)),
    lambda g: torch.func.jacfwd(torch.func.jacfwd(g, argnums=(0, 1)), argnums=(0, 1)),
    lambda g: torch.func.jacrev(torch.func.jacfwd(g, argnums=(0, 1)), argnums=(0, 1)),
    _per_example_hessian,
], ids=["hessian", "rev-rev", "fwd-fwd", "rev-fwd", "vmap-hessian"])
def test_every_second_order_composition_follows_the_grad_block(second):
    # the block's partials are not a gradient's: d/dy of its x part is x,
    # d/dx of its y part cos x (a true Hessian would be symmetric); every
    # order and mode of composition must give the block's, as dsl.hessian does
    x, y = bent_inputs()
    xn, yn = x.numpy(), y.numpy()
    f = dsl.to_torch(BENT)
    (hxx, hxy), (hyx, hyy) = second(lambda x, y: f(x, y).sum())(x, y)
    expected = [[np.diag(yn), np.diag(xn)], [np.diag(np.cos(xn)), np.zeros((3, 3))]]
    for got, want in zip((hxx, hxy, hyx, hyy), (w for row in expected for w in row)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-15, atol=0)
    np.testing.assert_allclose(hxy.numpy(), dsl.hessian(BENT, wrt=(0, 1))(xn, yn)[0][1],
                               rtol=1e-15)
    # and reverse over reverse through plain autograd
    xr, yr = x.clone().requires_grad_(), y.clone().requires_grad_()
    gx, gy = torch.autograd.grad(f(xr, yr).sum(), (xr, yr), create_graph=True)
    np.testing.assert_allclose(torch.autograd.grad(gx.sum(), yr, retain_graph=True)[0].numpy(),
                               xn, rtol=1e-15)
    np.testing.assert_allclose(torch.autograd.grad(gy.sum(), xr)[0].numpy(), np.cos(xn),
                               rtol=1e-15)


def test_torch_autograd_through_a_torch_func_gradient_of_a_closure():
    # torch.func.grad in x of f closing over a weight y that requires grad,
    # then autograd of that gradient to y (a meta-learning step): the
    # backward's operation is set up at torch's level and at the transform's,
    # and the second left the first's residual refs empty (an internal
    # TypeError, "run() missing 6 required positional arguments")
    x, y = bent_inputs()
    xn, yn = x.numpy(), y.numpy()
    f = dsl.to_torch(BENT)
    y.requires_grad_()
    gx = torch.func.grad(lambda x: f(x, y).sum())(x)
    (gx * gx).sum().backward()
    np.testing.assert_allclose(gx.detach().numpy(), yn * xn, rtol=1e-15)  # the block's
    np.testing.assert_allclose(y.grad.numpy(), 2 * yn * xn * xn, rtol=1e-15)


TANH_DOT = dsl.loads("def tanh_dot(x, w):\n    return tanh(x * w) * x + sum(w * w)\n",
                     "tanh_dot.grad").tanh_dot


@settings(max_examples=10, deadline=None)
@given(st.lists(st.floats(-2, 2), min_size=3, max_size=3),
       st.lists(st.floats(-2, 2), min_size=3, max_size=3))
def test_torch_func_transforms_agree_with_central_differences(xs, ws):
    x, w = np.array(xs), np.array(ws)
    f = dsl.to_torch(TANH_DOT)
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)
    gx, gw = torch.func.grad(lambda x, w: f(x, w).sum(), argnums=(0, 1))(xt, wt)
    np.testing.assert_allclose(gx.numpy(), central_difference(TANH_DOT, [x, w], 0),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gw.numpy(), central_difference(TANH_DOT, [x, w], 1),
                               rtol=1e-6, atol=1e-6)
    h = torch.func.hessian(lambda x: f(x, wt).sum())(xt)
    gradient = dsl.grad(TANH_DOT)
    for i in range(3):  # row i: d/dx of the gradient's i-th element
        np.testing.assert_allclose(
            h[i].numpy(), central_difference(lambda x: gradient(x, w)[i], [x], 0),
            rtol=1e-5, atol=1e-5)
    jac = torch.func.jacfwd(f, argnums=1)(xt, wt)
    np.testing.assert_allclose(jac.numpy(), torch.func.jacrev(f, argnums=1)(xt, wt).numpy(),
                               rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(jac.sum(0).numpy(), central_difference(TANH_DOT, [x, w], 1),
                               rtol=1e-6, atol=1e-6)


MATMUL = dsl.loads("def mm(a, b):\n    return a @ b\n", "mm.grad").mm


@pytest.mark.parametrize("f,make,in_dims,stacked", [
    # stacked in one program: both arguments, one (batched along its axis 1),
    # a product of two stacked matrices, a grad block (its passes stacked)
    (TANH_DOT, lambda: (torch.rand(4, 3), torch.rand(4, 3)), (0, 0), True),
    (TANH_DOT, lambda: (torch.rand(3, 4), torch.rand(3)), (1, None), True),
    (MATMUL, lambda: (torch.rand(5, 2, 3), torch.rand(5, 3, 2)), (0, 0), True),
    (BENT, lambda: (torch.rand(4, 3), torch.rand(4, 3)), (0, 0), True),
    # a float const is a run-time value (with no gradient): it stacks
    (load("leaky_relu").leaky_relu, lambda: (torch.randn(3), torch.tensor([0.1, 0.3])),
     (None, 0), True),
], ids=["both", "axis1", "matmul", "grad-block", "float-const"])
def test_vmap_equals_a_loop(f, make, in_dims, stacked, monkeypatch):
    from dsl import torch_bridge
    args = [a.double() for a in make()]
    tf = dsl.to_torch(f)
    applied = []
    real_apply = torch_bridge.apply
    monkeypatch.setattr(torch_bridge, "apply",
                        lambda g, *a: applied.append(g) or real_apply(g, *a))
    out = torch.func.vmap(tf, in_dims=in_dims)(*args)
    monkeypatch.undo()
    size = next(a.shape[d] for a, d in zip(args, in_dims) if d is not None)
    loop = [f(*(a.numpy() if d is None else a.movedim(d, 0)[i].numpy()
                for a, d in zip(args, in_dims))) for i in range(size)]
    np.testing.assert_allclose(out.numpy(), np.stack(loop), rtol=1e-14)
    # the call, then one stacked program or one call per example
    assert len(applied) == (2 if stacked else 1 + size)
    # per-example gradients: vmap of grad, against dsl.grad one example at a time
    g = torch.func.vmap(torch.func.grad(lambda *a: tf(*a).sum()), in_dims=in_dims)(*args)
    each = [dsl.grad(f)(*(a.numpy() if d is None else a.movedim(d, 0)[i].numpy()
                          for a, d in zip(args, in_dims))) for i in range(size)]
    np.testing.assert_allclose(g.numpy(), np.stack(each), rtol=1e-13, atol=1e-15)


TRIPS = dsl.loads("def trips(x: f64[d], n: i64):\n"
                  "    for i in range(n):\n"
                  "        x = sin(x) * 1.5\n"
                  "    return sum(x * x)\n", "trips.grad").trips


@pytest.mark.parametrize("examples", [3, 0])
def test_vmap_over_a_trip_count_runs_each_example_and_no_example_is_empty(examples):
    # a mapped trip count runs one call per example; with none, the vmap
    # rule returned (), which grad took for a result: "Expected f(*args) to
    # return a Tensor, got <class 'tuple'>"
    tf, x = dsl.to_torch(TRIPS), np.array([0.3, -1.2, 2.0])
    ns = torch.arange(examples)
    values = torch.func.vmap(tf, in_dims=(None, 0))(torch.tensor(x), ns)
    grads = torch.func.vmap(torch.func.grad(tf), in_dims=(None, 0))(torch.tensor(x), ns)
    assert values.shape == (examples,) and grads.shape == (examples, 3)
    for n in range(examples):
        def reference(x):
            for _ in range(n):
                x = np.sin(x) * 1.5
            return np.sum(x * x)
        np.testing.assert_allclose(values[n].item(), reference(x), rtol=1e-14)
        np.testing.assert_allclose(grads[n].numpy(), central_difference(reference, [x], 0),
                                   rtol=1e-7, atol=1e-8)


def test_a_param_by_keyword_under_torch_func():
    lp = dsl.to_torch(load("linear_poly").linear_poly)
    x = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    w = torch.tensor([0.5, -3.0], dtype=torch.float64)
    gw = torch.func.grad(lambda w: lp(x, weights=w).sum())(w)
    np.testing.assert_allclose(gw.numpy(), [3.0, 7.0], rtol=1e-15)  # [n, sum(x)]
    jac = torch.func.jacfwd(lambda w: lp(x, weights=w))(w)
    np.testing.assert_allclose(jac.numpy(), np.stack([np.ones(3), x.numpy()], 1), rtol=1e-15)
    ws = torch.tensor([[0.5, -3.0], [1.0, 2.0]], dtype=torch.float64)  # a batch of weights
    ys = torch.func.vmap(lambda w: lp(x, weights=w))(ws)
    np.testing.assert_allclose(ys.numpy(), ws[:, 1:].numpy() * x.numpy() + ws[:, :1].numpy(),
                               rtol=1e-15)


def test_functional_call_of_a_module_using_the_bridge():
    f = dsl.to_torch(load("log1pexp").log1pexp)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 1).double()

        def forward(self, x):
            return f(self.linear(x)[:, 0])

    torch.manual_seed(0)
    model, x = Model(), torch.randn(5, 3, dtype=torch.float64)
    params = {k: v.detach() for k, v in model.named_parameters()}
    grads = torch.func.grad(lambda p: torch.func.functional_call(model, p, (x,)).sum())(params)
    model(x).sum().backward()  # plain autograd: d/dz log1pexp(z) = sigmoid(z)
    z = (x @ params["linear.weight"].T + params["linear.bias"])[:, 0].numpy()
    np.testing.assert_allclose(grads["linear.bias"].numpy(), [sigmoid(z).sum()], rtol=1e-14)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(grads[name].numpy(), p.grad.numpy(), rtol=1e-15)


def test_a_const_argument_under_torch_func_grad_is_an_argument_error():
    f = dsl.to_torch(load("leaky_relu").leaky_relu)
    x = torch.tensor([1.0, -1.0], dtype=torch.float64)
    with pytest.raises(dsl.ArgumentError, match="'alpha' has no gradient"):
        torch.func.grad(lambda a: f(x, alpha=a).sum())(torch.tensor(0.1, dtype=torch.float64))



def test_forward_mode_along_a_const_argument_is_an_argument_error():
    # the jvp rule dropped the tangent of a const: jvp, jacfwd and a dual
    # tensor gave a derivative of 0 where d/d alpha is min(x, 0)
    f = dsl.to_torch(load("leaky_relu").leaky_relu)
    x = torch.tensor([1.0, -1.0], dtype=torch.float64)
    a, one = torch.tensor(0.1, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
    message = "with respect to 'alpha', which has no gradient"
    with pytest.raises(dsl.ArgumentError, match=message):
        torch.func.jvp(lambda a: f(x, alpha=a), (a,), (one,))
    with pytest.raises(dsl.ArgumentError, match=message):
        torch.func.jacfwd(lambda a: f(x, alpha=a))(a)
    with torch.autograd.forward_ad.dual_level():
        with pytest.raises(dsl.ArgumentError, match=message):
            f(x, alpha=torch.autograd.forward_ad.make_dual(a, one))
    # along x alone, alpha a tensor (torch.func gives it a tangent of zeros)
    _, t = torch.func.jvp(lambda x: f(x, alpha=a), (x,), (torch.ones(2, dtype=torch.float64),))
    np.testing.assert_allclose(t.numpy(), [1.0, 0.1], rtol=1e-15)
    jacobians = torch.func.vmap(torch.func.jacfwd(f), in_dims=(None, 0))(x, a * one.new_ones(2))
    np.testing.assert_allclose(jacobians.numpy(), [np.diag([1.0, 0.1])] * 2, rtol=1e-15)

def test_a_compiled_call_and_a_compiled_torch_func_transform():
    # dynamo traced into the bridge with FakeTensors: "argument 'z' of
    # loss() is a GPU array"; now the call is one operation in the graph
    # (tests/test_torch_compile.py)
    m = dsl.loads("def loss(z, y):\n    return mean(log1p(exp(-y * z)))\n", "loss.grad")
    loss = dsl.to_torch(m.loss)
    y = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)
    z = torch.tensor([0.5, 0.2, -1.0], dtype=torch.float64, requires_grad=True)
    value = torch.compile(lambda z: loss(z, y), backend="aot_eager")(z)
    expected = np.mean(np.log1p(np.exp(-y.numpy() * z.detach().numpy())))
    np.testing.assert_allclose(value.item(), expected, rtol=1e-15)
    value.backward()
    expected_grad = dsl.grad(m.loss)(z.detach().numpy(), y.numpy())
    np.testing.assert_allclose(z.grad.numpy(), expected_grad, rtol=1e-15)
    # a compiled torch.func transform: torch.func ran the forward in a frame
    # dynamo traced; now a graph break runs the eager bridge (torch's custom
    # operations take no torch.func transform)
    g = torch.compile(torch.func.grad(lambda z: loss(z, y)), backend="aot_eager")
    np.testing.assert_allclose(g(z.detach()).numpy(), expected_grad, rtol=1e-15)


def test_a_compiled_training_step_equals_eager():
    # forward, backward (through a grad block) and optimizer step compiled
    m = dsl.loads("def softplus(z):\n    return maximum(z, 0) + log1p(exp(-abs(z)))\n"
                  "grad(dz):\n    return dz * sigmoid(z)\n\n"
                  "def loss(z, y):\n    return mean(softplus(-y * z))\n", "softplus.grad")
    loss = dsl.to_torch(m.loss)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=gen, dtype=torch.float64)
    y = torch.sign(x @ torch.tensor([1.0, -2.0, 0.5, 0.0], dtype=torch.float64))

    def train(compiled: bool):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                    torch.nn.Linear(8, 1)).double()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step():
            opt.zero_grad()
            value = loss(model(x)[:, 0], y)
            value.backward()
            opt.step()
            return value
        if compiled:
            step = torch.compile(step, backend="aot_eager")
        return [step().item() for _ in range(3)], [p.detach() for p in model.parameters()]

    eager_losses, eager_params = train(False)
    compiled_losses, compiled_params = train(True)
    assert compiled_losses == eager_losses and eager_losses[2] < eager_losses[0]
    # (the parameters within an ulp: PyTorch 2.11's aot_eager rounds its own
    # update 1 ulp apart from eager with a loss of PyTorch's alone)
    for p, q in zip(compiled_params, eager_params):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-15, atol=1e-16)


LAYER_LOSS = dsl.loads("param w: f64[3, 2]\nparam b: f64[2]\n\n"
                       "def loss(x: f64[n, 3], t: const f64[n, 2]):\n"
                       "    d = tanh(x @ w + b) - t\n    return mean(d * d)\n", "layer.grad").loss


def test_params_as_module_parameters_train_as_torch_does():
    # nn.Parameters passed as the module params, through torch.optim (whose
    # steps read .grad) and torch.func over functional_call, against the same
    # model written in torch, step by step
    loss = dsl.to_torch(LAYER_LOSS)

    class Model(torch.nn.Module):
        def __init__(self, ours: bool):
            super().__init__()
            gen = torch.Generator().manual_seed(0)
            self.w = torch.nn.Parameter(torch.randn(3, 2, generator=gen, dtype=torch.float64))
            self.b = torch.nn.Parameter(torch.randn(2, generator=gen, dtype=torch.float64))
            self.ours = ours

        def forward(self, x, t):
            if self.ours:
                return loss(x, t, w=self.w, b=self.b)
            return ((torch.tanh(x @ self.w + self.b) - t) ** 2).mean()

    gen = torch.Generator().manual_seed(1)
    x, t = torch.randn(6, 3, generator=gen).double(), torch.randn(6, 2, generator=gen).double()
    models = [Model(True), Model(False)]
    optimizers = [torch.optim.Adam(m.parameters(), lr=0.1) for m in models]
    for _ in range(4):
        values = []
        for model, opt in zip(models, optimizers):
            opt.zero_grad()
            value = model(x, t)
            value.backward()
            opt.step()
            values.append(value.item())
        assert values[0] == pytest.approx(values[1], rel=1e-13)
        for p, q in zip(*(m.parameters() for m in models)):
            np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-12)
    params = {k: v.detach() for k, v in models[0].named_parameters()}

    def per_example(model):
        return torch.func.vmap(torch.func.grad(
            lambda p, x, t: torch.func.functional_call(model, p, (x[None], t[None]))),
            in_dims=(None, 0, 0))(params, x, t)

    ours, theirs = per_example(models[0]), per_example(models[1])
    for k in params:
        np.testing.assert_allclose(ours[k].numpy(), theirs[k].numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("make_weights,message", [
    (lambda: torch.ones(3, dtype=torch.float64),
     "has size 3 on axis 0, but its annotation says 2"),
    (lambda: torch.ones(1, 2, dtype=torch.float64), "has rank 2"),
    (lambda: "abc", "is not numeric"),
], ids=["size", "rank", "text"])
def test_a_bad_param_by_keyword_is_an_argument_error_at_the_function(make_weights, message):
    # the error had no location: "error: param 'weights' has size 3 ..."
    lp = dsl.to_torch(load("linear_poly").linear_poly)
    with pytest.raises(dsl.ArgumentError, match="linear_poly.grad:\\d+:\\d+: error: param "
                                                f"'weights' {message}"):
        lp(tensor([1.0, 2.0]), weights=make_weights())


def test_no_grad_calls_keep_no_residuals(monkeypatch):
    # an evaluation loop under no_grad over parameters requiring grad ran the
    # split forward, keeping residuals nothing would read (the slow, recorded
    # path for nn.Parameters: 4 times the call's time for a small dense layer)
    from dsl import torch_bridge
    split = []
    real = torch_bridge.split_of_bound
    monkeypatch.setattr(torch_bridge, "split_of_bound", lambda *a: split.append(a) or real(*a))
    f = dsl.to_torch(load("dense").loss)
    x, t = torch.ones(4, 3, dtype=torch.float64), torch.zeros(4, 2, dtype=torch.float64)
    w = torch.nn.Parameter(torch.full((3, 2), 0.5, dtype=torch.float64))
    b = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    expected = load("dense").loss(x.numpy(), w.detach().numpy(), b.detach().numpy(), t.numpy())
    lp = dsl.to_torch(load("linear_poly").linear_poly)
    weights = torch.nn.Parameter(torch.tensor([1.0, 2.0], dtype=torch.float64))
    with torch.no_grad():
        value = f(x, w, b, t)
        poly = lp(x[0], weights=weights)
    assert split == [] and value.grad_fn is None and poly.grad_fn is None
    assert value.item() == pytest.approx(expected, rel=1e-15)
    np.testing.assert_array_equal(poly.numpy(), [3.0, 3.0, 3.0])
    f(x, w, b, t).backward()  # recording: the split forward, and gradients
    assert len(split) == 1 and w.grad is not None


def test_an_hvp_vector_of_another_dtype_is_converted_and_gets_its_gradient():
    # hvp makes v wrt's dtype, an array of its own: the tensor no longer
    # stood for it, so v got no gradient (None beside w's; "does not
    # require grad" alone); the Hessian of sum(sin(x * w)) in w is
    # diag(-x^2 sin(x w)), so d/dv sum(H v) is its diagonal
    # (c, defaulted, left out: v is the third value given, for the fourth)
    f = dsl.loads("def f(x, w, c: f64 = 1.0):\n    return sum(sin(x * w) * c)\n").f
    x, w = np.array([0.5, -1.0, 2.0]), tensor([1.5, 0.3, -0.7])
    v = tensor([1.0, -2.0, 0.5], dtype=torch.float32)
    dsl.to_torch(dsl.hvp(f, wrt=1))(torch.tensor(x), w, v).sum().backward()
    np.testing.assert_allclose(v.grad.numpy(), -x ** 2 * np.sin(x * w.detach().numpy()),
                               rtol=1e-6)
    assert w.grad is not None


_THREADS_TRACING = """
import threading
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
import dsl
f = dsl.to_torch(dsl.loads("def sq(x):\\n    return x * x\\n", "sq.grad").sq)
barrier, shapes = threading.Barrier(4), []
def trace():
    barrier.wait()
    with FakeTensorMode():
        shapes.append(tuple(f(torch.empty(3, dtype=torch.float64)).shape))
threads = [threading.Thread(target=trace) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(shapes)
"""


def test_threads_tracing_their_first_calls_at_once_each_get_the_operation():
    # each defined gradlang::call, and all but one got torch's
    # AssertionError('Library object has been destroyed').  (A process of its
    # own: this one's first trace is long past.)
    import subprocess
    run = subprocess.run([sys.executable, "-c", _THREADS_TRACING], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and "Error" not in run.stderr, run.stderr
    assert run.stdout.strip() == str([(3,)] * 4)


def test_repeated_calls_bind_by_layout_and_still_refuse_grad_without_gradient():
    # a recorded call of plain tensors binds as the last call of the same
    # dtypes, shapes and strides did (`TorchFunction._recorded_fast`): each
    # layout binds anew, a dtype against the annotation and a const's tensor
    # requiring grad are still refused after good calls
    f = dsl.to_torch(load("dense").loss)
    x, b, t = (torch.zeros(*shape, dtype=torch.float64) for shape in [(4, 3), (2,), (4, 2)])
    x += 1.0
    w0 = np.linspace(-1.0, 1.0, 6).reshape(3, 2)
    for w in [w0, w0, w0.T.copy().T, w0]:
        wt = torch.tensor(w, requires_grad=True) if w.flags.c_contiguous \
            else torch.tensor(w.T, requires_grad=True).T
        (grad,) = torch.autograd.grad(f(x, wt, b, t), wt)
        h = 1e-6
        want = [(load("dense").loss(x.numpy(), w0 + h * e, np.zeros(2), t.numpy())
                 - load("dense").loss(x.numpy(), w0 - h * e, np.zeros(2), t.numpy())) / (2 * h)
                for e in np.eye(6).reshape(6, 3, 2)]
        np.testing.assert_allclose(grad.numpy().ravel(), want, rtol=1e-7)
    assert len(f._bindings) == 2  # C- and F-ordered w
    with pytest.raises(dsl.ArgumentError, match="'x' of loss\\(\\) has dtype f32"):
        f(x.float(), *(a.float() for a in (wt, b, t)))
    with pytest.raises(dsl.ArgumentError, match="'target' has no gradient"):
        f(x, wt, b, t.requires_grad_())


def test_a_deep_copy_of_a_module_shares_the_function_and_copies_its_weights():
    # copy.deepcopy(model) (an average of its weights, a best-so-far copy)
    # raised "cannot pickle '_thread.RLock' object" from the compiled function
    import copy
    f = load("leaky_relu").leaky_relu
    model = torch.nn.Linear(2, 2, dtype=torch.float64)
    model.act = dsl.to_torch(f)
    twin = copy.deepcopy(model)
    assert twin.act is model.act and copy.deepcopy(f) is f
    assert twin.weight is not model.weight
    with torch.no_grad():
        twin.weight.mul_(2.0)
    z = twin(torch.tensor([1.0, -2.0], dtype=torch.float64))
    np.testing.assert_array_equal(twin.act(z).detach().numpy(),
                                  torch.where(z > 0, z, 0.2 * z).detach().numpy())


def test_backward_over_varying_lengths_builds_one_split(monkeypatch):
    # a training loop over sequences of varying length built a forward and
    # backward program per length (dsl/function.py `vjp_entry`); sum(x)'s
    # backward reads no value of x, only its length (a residual of no elements)
    from gradlang.compiler import pipeline
    built = []
    real = pipeline.vjp_programs
    monkeypatch.setattr(pipeline, "vjp_programs", lambda *a: built.append(a) or real(*a))
    m = dsl.loads("def loss(x, w):\n    return sum(x) * w + mean(x * x)\n")
    f = dsl.to_torch(m.loss)
    for n in (3, 5, 40, 7, 300, 5):  # (not 2: w has 2, another pattern)
        x = np.linspace(-1.0, 2.0, n)
        xt, wt = tensor(x), tensor([0.5, -2.0])
        y = f(xt, wt)
        np.testing.assert_allclose(y.detach().numpy(), x.sum() * np.array([0.5, -2.0])
                                   + np.mean(x * x), rtol=1e-12, atol=1e-15)
        (y * tensor([3.0, 1.0], requires_grad=False)).sum().backward()
        np.testing.assert_allclose(xt.grad.numpy(), (1.5 - 2.0) + 4.0 * 2 * x / n, rtol=1e-12)
        np.testing.assert_allclose(wt.grad.numpy(), [3.0 * x.sum(), x.sum()], rtol=1e-12)
    assert len(built) == 1


def test_a_list_holding_tensors_is_an_argument_error_and_one_of_numbers_is_taken():
    # NumPy read such a list as a constant: torch's RuntimeError ("Can't
    # call numpy() on Tensor that requires grad"), or, for tensors that
    # required none, a result whose gradient a later requires_grad missed
    f = dsl.to_torch(load("log1pexp").log1pexp)
    x = tensor([0.0, 1.0])
    refused = [lambda: f([x, x]), lambda: f((torch.zeros(2), [torch.ones(2)])),
               lambda: torch.func.grad(lambda t: f([t]).sum())(x.detach())]
    for call in refused:
        with pytest.raises(dsl.ArgumentError, match=r"argument 'x' of to_torch\(log1pexp\) is a "
                                                    r"(list|tuple) holding an array.*stack"):
            call()
    np.testing.assert_allclose(f([0.0, 1.0]).numpy(), np.log1p(np.exp([0.0, 1.0])), rtol=1e-15)


def test_forward_ad_takes_no_tangent_for_a_tensor_that_has_none():
    # torch materialized a zero tangent for w, which has none, and the jvp
    # took it as given: 0 * inf = NaN through sqrt(w) at w = 0, where
    # dsl.jvp and torch's own ops give (sqrt(w) + sqrt(w / 2)) t = 0.  The
    # backward, with the cotangent of the unused output w now None, makes
    # its zeros itself.
    import torch.autograd.forward_ad as fwad
    f = dsl.to_torch(dsl.loads("def f(x, w, n: i64):\n    s = x * 0.0\n    for i in range(n):\n"
                               "        s = s + sqrt(w) * x\n        w = w * 0.5\n    return s, w\n",
                               "untangented.grad").f)
    x, t = tensor([0.3, -0.7], requires_grad=False), tensor([1.0, 2.0], requires_grad=False)
    w, n = tensor([0.0, 1.0], requires_grad=False), torch.tensor(2)
    expected = (np.sqrt(w.numpy()) + np.sqrt(w.numpy() / 2)) * t.numpy()
    with fwad.dual_level():
        s, _ = f(fwad.make_dual(x, t), w, n)
        np.testing.assert_allclose(fwad.unpack_dual(s).tangent, expected, rtol=1e-15)
    _, tangent = torch.func.jvp(lambda x: f(x, w, n)[0], (x,), (t,))
    np.testing.assert_allclose(tangent, expected, rtol=1e-15)
    x, w = tensor([0.3, -0.7]), tensor([0.25, 1.0])
    s, _ = f(x, w, n)
    grads = torch.autograd.grad(s.sum(), (x, w))
    root = np.sqrt(w.detach().numpy())
    np.testing.assert_allclose(grads[0], root + root / np.sqrt(2), rtol=1e-15)
    np.testing.assert_allclose(grads[1], x.detach().numpy() * (1 + 1 / np.sqrt(2)) / (2 * root),
                               rtol=1e-14)


def test_an_hvp_of_torch_tensors_called_itself_binds_them_as_numpy_arrays():
    # (not through to_torch: constants) its Dask check asked NumPy for a
    # tensor's dtype: NumPy's TypeError "Cannot interpret 'torch.float32' as
    # a data type" where binding says what is wrong (no program compiled)
    f = dsl.loads("def f(x):\n    return sum(x * x * x)\n").f
    with pytest.raises(dsl.ArgumentError, match=r"hvp\(f\): v has shape \[3\], but 'x' has "
                                                r"shape \[2\]"):
        dsl.hvp(f)(torch.tensor([1.0, 2.0]), torch.tensor([1.0, -1.0, 0.0]))
