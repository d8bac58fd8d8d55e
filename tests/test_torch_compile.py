"""`dsl.to_torch` functions under `torch.compile`: one `gradlang::call`
operation in the graph (no graph break, so `fullgraph=True` compiles),
with the values and gradients of the eager call, grad blocks followed.

Most tests compile with the aot_eager backend (AOTAutograd traces the
forward and backward graphs, which is where the operation must hold up);
one with inductor."""

import re

import numpy as np
import pytest

import dsl
from gradlang.compiler import pipeline
from helpers import central_difference
from helpers import load_example as load, optional_module

torch = optional_module("torch", "torch")
functorch_compile = optional_module("functorch.compile", "torch")
dynamo_backends = optional_module("torch._dynamo.backends.common", "torch")


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


class Graphs:
    """A torch.compile backend (aot_eager, recording): the forward and
    backward graphs AOTAutograd traced."""

    def __init__(self):
        self.forward, self.backward = [], []
        self.backend = dynamo_backends.aot_autograd(fw_compiler=self._keep(self.forward),
                                    bw_compiler=self._keep(self.backward))

    @staticmethod
    def _keep(graphs):
        def compiler(gm, example_inputs):
            graphs.append(gm)
            return functorch_compile.make_boxed_func(gm.forward)
        return compiler

    def calls(self, graphs) -> list:
        """The keys of the `gradlang::call` operations in these graphs."""
        return [node.args[0] for gm in graphs for node in gm.graph.nodes
                if node.target is torch.ops.gradlang.call.default]


def compiled(fn, backend="aot_eager"):
    torch._dynamo.reset()
    return torch.compile(fn, backend=backend, fullgraph=True)


def test_log1pexp_is_one_operation_with_the_grad_block_as_its_backward():
    # the call was a graph break (fullgraph=True refused it): dynamo ran it
    # eagerly between two graphs
    f = dsl.to_torch(load("log1pexp").log1pexp)
    graphs = Graphs()
    torch._dynamo.reset()
    step = torch.compile(lambda x, w: f(x * w).sum(), backend=graphs.backend, fullgraph=True)
    x = torch.tensor([-3.0, 0.0, 2.0, 40.0], dtype=torch.float64, requires_grad=True)
    w = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    value = step(x, w)
    gx, gw = torch.autograd.grad(value, (x, w))
    xn = x.detach().numpy()
    np.testing.assert_allclose(value.item(), np.log1p(np.exp(0.5 * xn)).sum(), rtol=1e-14)
    eager_x, eager_w = torch.autograd.grad(f(x * w).sum(), (x, w))
    np.testing.assert_array_equal(gx.numpy(), eager_x.numpy())
    np.testing.assert_array_equal(gw.numpy(), eager_w.numpy())
    np.testing.assert_allclose(gx.numpy(), 0.5 * sigmoid(0.5 * xn), rtol=1e-14)
    np.testing.assert_allclose(gw.numpy(), central_difference(
        lambda w: np.log1p(np.exp(w * xn)), [0.5], 0), rtol=1e-8)
    # the forward graph runs f, the backward graph f's backward pass: both ours
    [forward], [backward] = graphs.calls(graphs.forward), graphs.calls(graphs.backward)
    assert forward != backward
    # keys are hashes: no user text reaches the graph's code
    assert all(re.fullmatch("[0-9a-f]{32}", k) for k in (forward, backward))


def test_a_multi_input_loss_with_a_const_target_equals_eager_and_finite_differences():
    loss = load("dense").loss
    tl = dsl.to_torch(loss)
    gen = np.random.default_rng(0)
    x, w, b, t = (gen.standard_normal(s) for s in [(4, 3), (3, 2), (2,), (4, 2)])
    ts = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
    step = compiled(lambda x, w, b, t: tl(x, w, b, t))
    value = step(*ts, torch.tensor(t))
    grads = torch.autograd.grad(value, ts)
    eager = tl(*ts, torch.tensor(t))
    assert value.item() == eager.item() == pytest.approx(loss(x, w, b, t), rel=1e-15)
    for i, (g, e) in enumerate(zip(grads, torch.autograd.grad(eager, ts))):
        np.testing.assert_array_equal(g.numpy(), e.numpy())
        np.testing.assert_allclose(g.numpy(), central_difference(
            lambda *a: loss(*a, t), [x, w, b], i), rtol=1e-6, atol=1e-9)
    # the target as a NumPy array the compiled function closes over:
    # nonstrict_trace refused it ("Invalid input type")
    value = compiled(lambda x, w, b: tl(x, w, b, t))(*ts)
    assert value.item() == eager.item()
    np.testing.assert_array_equal(torch.autograd.grad(value, ts[1])[0].numpy(), grads[1].numpy())


DELIBERATE = dsl.loads("def cube(x):\n    return x * x * x\n"
                       "grad(dy):\n    return dy * 2 * x\n", "deliberate.grad").cube


def test_a_grad_block_that_is_not_the_derivative_is_followed_under_compile():
    # cube's grad block says 2x, not 3x^2: the product's point is that the
    # compiled step follows it, as the eager call does
    f = dsl.to_torch(DELIBERATE)
    x = torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float64, requires_grad=True)
    value = compiled(lambda x: f(x).sum())(x)
    (g,) = torch.autograd.grad(value, x)
    assert value.item() == pytest.approx(-1.0 + 0.125 + 8.0, rel=1e-15)
    np.testing.assert_array_equal(g.numpy(), [-2.0, 1.0, 4.0])


@pytest.fixture
def trace_autograd_ops():
    """torch's opt-in to trace torch.autograd.grad into a compiled graph."""
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        yield


def test_second_order_inside_a_compiled_function(trace_autograd_ops):
    # torch.autograd.grad(create_graph=True) traced into the graph (torch's
    # opt-in trace_autograd_ops): each order is our backward differentiated
    # again, grad blocks included
    f = dsl.to_torch(load("log1pexp").log1pexp)
    g = dsl.to_torch(DELIBERATE)

    def orders(x):
        (d1,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
        (d2,) = torch.autograd.grad(d1.sum(), x, create_graph=True)
        (e1,) = torch.autograd.grad(g(x).sum(), x, create_graph=True)
        (e2,) = torch.autograd.grad(e1.sum(), x)
        return d1.detach(), d2.detach(), e2

    x = torch.tensor([-1.5, 0.0, 0.7, 3.0], dtype=torch.float64, requires_grad=True)
    d1, d2, e2 = compiled(orders)(x)
    s = sigmoid(x.detach().numpy())
    np.testing.assert_allclose(d1.numpy(), s, rtol=1e-14)
    np.testing.assert_allclose(d2.numpy(), s * (1 - s), rtol=1e-14)
    np.testing.assert_array_equal(e2.numpy(), [2.0] * 4)  # (2x)', not (3x^2)'' = 6x


def test_f32_params_and_new_sizes_in_a_compiled_module():
    # an nn.Module whose forward passes its Parameter as the module param;
    # f32 stays f32; other batch sizes recompile (dynamo then marks the size
    # dynamic, and the operation specializes to each)
    lp = dsl.to_torch(dsl.loads("param w: f32[2]\n\ndef poly(x: f32[n]):\n"
                                "    return sum(w[1] * x * x + w[0])\n", "poly.grad").poly)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor([0.5, -2.0]))

        def forward(self, x):
            return lp(torch.tanh(x), w=self.w)

    model = Model()
    step = compiled(model)
    for n in (3, 5, 7):
        x = torch.linspace(-1, 1, n, requires_grad=True)
        value = step(x)
        assert value.dtype == torch.float32
        gx, gw = torch.autograd.grad(value, (x, model.w))
        ex, ew = torch.autograd.grad(model(x), (x, model.w))
        assert value.item() == model(x).item()
        np.testing.assert_array_equal(gx.numpy(), ex.numpy())
        np.testing.assert_array_equal(gw.numpy(), ew.numpy())
        u = np.tanh(x.detach().numpy().astype(np.float64))
        np.testing.assert_allclose(gw.numpy(), [n, (u * u).sum()], rtol=1e-6)


def test_two_functions_of_one_name_from_two_files_stay_apart():
    a = dsl.to_torch(dsl.loads("def f(x):\n    return x * 2\n", "a.grad").f)
    b = dsl.to_torch(dsl.loads("def f(x):\n    return x * 3\n", "b.grad").f)
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    value = compiled(lambda x: a(x) + b(x) * b(x))(x)
    np.testing.assert_array_equal(value.detach().numpy(), [11.0, 40.0])
    (g,) = torch.autograd.grad(value.sum(), x)
    np.testing.assert_array_equal(g.numpy(), [2.0 + 18.0, 2.0 + 36.0])


def test_two_functions_called_at_one_place_each_run_their_own():
    # dynamo guarded the call by the code of a closure every function shares:
    # the graph traced for the first layer's function ran it for the second
    class Layer(torch.nn.Module):
        def __init__(self, f):
            super().__init__()
            self.f = f

        def forward(self, x):
            return self.f(x)

    # (dynamo alone: backend="eager")
    first = compiled(Layer(dsl.to_torch(load("log1pexp").log1pexp)), backend="eager")
    second = torch.compile(Layer(dsl.to_torch(load("leaky_relu").leaky_relu)),
                           backend="eager", fullgraph=True)
    x = torch.tensor([-2.0, 3.0], dtype=torch.float64, requires_grad=True)
    np.testing.assert_allclose(first(x).detach().numpy(), np.logaddexp(0, [-2.0, 3.0]),
                               rtol=1e-15)
    value = second(x)
    np.testing.assert_array_equal(value.detach().numpy(), [-0.4, 3.0])
    (g,) = torch.autograd.grad(value.sum(), x)
    np.testing.assert_array_equal(g.numpy(), [0.2, 1.0])
    # one function wrapped again calls the same: no graph of its own
    from torch._dynamo.testing import CompileCounter
    counter = CompileCounter()
    step = torch.compile(lambda f, x: f(x), backend=counter, fullgraph=True)
    for _ in range(2):
        step(dsl.to_torch(load("leaky_relu").leaky_relu), x)
    assert counter.frame_count == 1


def test_inductor_runs_the_operation():
    # (the operation alone: a kernel inductor generates around it costs some
    # 12 s of C++ compilation on a cold cache)
    f = dsl.to_torch(load("log1pexp").log1pexp)
    x = torch.tensor([-3.0, 0.0, 2.0, 100.0], dtype=torch.float64, requires_grad=True)
    value = compiled(lambda x: f(x), backend="inductor")(x)
    (g,) = torch.autograd.grad(value, x, torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64))
    xn = x.detach().numpy()
    np.testing.assert_allclose(value.detach().numpy(), np.logaddexp(0, xn), rtol=1e-14)
    np.testing.assert_allclose(g.numpy(), [1.0, 2.0, 3.0, 4.0] * sigmoid(xn), rtol=1e-14)
    # a kernel's result in another layout than the fake rule's (a transpose:
    # F-ordered) failed inductor's check of the strides it traced
    # ("expected size 2==2, stride 1==3"), forward and backward alike
    tr = dsl.to_torch(dsl.loads("def tr(x: f64[n, k]):\n    return transpose(x)\n").tr)
    a = torch.arange(6.0, dtype=torch.float64).reshape(3, 2).requires_grad_()
    value = compiled(lambda a: tr(a), backend="inductor")(a)
    ct = torch.arange(6.0, dtype=torch.float64).reshape(2, 3) + 1
    (g,) = torch.autograd.grad(value, a, ct)
    np.testing.assert_array_equal(value.detach().numpy(), a.detach().numpy().T)
    np.testing.assert_array_equal(g.numpy(), ct.numpy().T)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_compiled_training_step_computes_the_forward_once(backend, dynamic, monkeypatch):
    # the backward was the operation of f's backward pass, which computed
    # the forward again: exp ran twice a step.  Now the forward operation
    # also returns the residuals the backward pass reads, which takes them.
    # (The operation alone, as in the inductor test above.)
    from torch._dynamo.testing import CompileCounterWithBackend
    ran = []
    run = pipeline.Program.__call__

    def counted(program, *arrays):
        ran.extend(e.op for e in program.ir.eqns)
        return run(program, *arrays)

    monkeypatch.setattr(pipeline.Program, "__call__", counted)
    # (with the fast path off: a call it knows runs the driver, not Program.__call__)
    monkeypatch.setattr("dsl.function.fast_key", lambda args: None)
    f = dsl.to_torch(load("log1pexp").log1pexp)
    counter = CompileCounterWithBackend(backend)
    torch._dynamo.reset()
    step = torch.compile(lambda x: f(x), backend=counter, fullgraph=True, dynamic=dynamic)
    for n in (3, 5):
        x = torch.linspace(-3.0, 40.0, n, dtype=torch.float64, requires_grad=True)
        ct = torch.arange(1.0, n + 1, dtype=torch.float64)
        ran.clear()
        value = step(x)
        (g,) = torch.autograd.grad(value, x, ct)
        assert ran.count("exp") == ran.count("log") == 1
        xn = x.detach().numpy()
        np.testing.assert_allclose(value.detach().numpy(), np.logaddexp(0, xn), rtol=1e-14)
        np.testing.assert_allclose(g.numpy(), ct.numpy() * sigmoid(xn), rtol=1e-14)
    assert counter.frame_count == (1 if dynamic else 2)


def test_a_size_the_backward_reads_is_no_residual_of_a_dynamic_graph():
    # a mean over the static axis: where the program's sizes are symbols,
    # the forward pass kept the size (1 / 3) as a residual; where the fake
    # rule had 3 from torch, a literal, no residual.  Its lowerings disagreed
    # and it fell back to the concrete sizes: the marked size specialized
    # (ConstraintViolationError).  The backward pass now makes such values
    # itself.
    from torch._dynamo.testing import CompileCounterWithBackend
    f = dsl.to_torch(dsl.loads("def g(x):\n    return mean(x * x, axis=1)\n", "g.grad").g)
    counter = CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    step = torch.compile(lambda x: f(x), backend=counter, fullgraph=True)
    for n in (4, 6):
        x = torch.linspace(-1.0, 2.0, 3 * n, dtype=torch.float64).reshape(n, 3).requires_grad_()
        torch._dynamo.mark_dynamic(x, 0)
        value = step(x)
        (g,) = torch.autograd.grad(value, x, torch.ones(n, dtype=torch.float64))
        xn = x.detach().numpy()
        np.testing.assert_allclose(value.detach().numpy(), (xn * xn).mean(axis=1), rtol=1e-14)
        np.testing.assert_allclose(g.numpy(), 2 * xn / 3, rtol=1e-14)
    assert counter.frame_count == 1


def test_sizes_marked_dynamic_compile_once():
    # the fake rule made each size concrete: a size marked dynamic was a
    # ConstraintViolationError ("your code specialized it to be a constant")
    f = dsl.to_torch(load("log1pexp").log1pexp)
    loss = dsl.to_torch(load("dense").loss)
    graphs = Graphs()
    torch._dynamo.reset()
    step = torch.compile(lambda x, z, w, b, t: (f(x) * 2, loss(z, w, b, t)),
                         backend=graphs.backend, fullgraph=True)
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(3, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, generator=gen, dtype=torch.float64, requires_grad=True)
    for n in (3, 5, 7):
        x = torch.linspace(-2, 2, n, dtype=torch.float64, requires_grad=True)
        z = torch.randn(n, 3, generator=gen, dtype=torch.float64)
        t = torch.randn(n, 2, generator=gen, dtype=torch.float64)
        for a in (x, z, t):
            torch._dynamo.mark_dynamic(a, 0)
        y, value = step(x, z, w, b, t)
        assert y.shape == (n,)
        np.testing.assert_allclose(y.detach().numpy(), 2 * np.logaddexp(0, x.detach().numpy()),
                                   rtol=1e-14)
        grads = torch.autograd.grad(y.sum() + value, (x, w, b))
        eager = torch.autograd.grad((f(x) * 2).sum() + loss(z, w, b, t), (x, w, b))
        assert value.item() == loss(z, w, b, t).item()
        for g, e in zip(grads, eager):
            np.testing.assert_array_equal(g.numpy(), e.numpy())
    assert len(graphs.forward) == len(graphs.backward) == 1


def test_an_exported_program_saved_and_loaded_runs_the_call(tmp_path):
    f = dsl.to_torch(load("log1pexp").log1pexp)

    class Model(torch.nn.Module):
        def forward(self, x):
            return f(x) * 2

    x = torch.tensor([-1.0, 0.5, 3.0], dtype=torch.float64)
    torch.export.save(torch.export.export(Model(), (x,)), tmp_path / "model.pt2")
    loaded = torch.export.load(tmp_path / "model.pt2").module()
    np.testing.assert_allclose(loaded(x).numpy(), 2 * np.logaddexp(0, x.numpy()), rtol=1e-14)
    # a graph naming a call this process never traced: was a KeyError from
    # inside the operation
    with pytest.raises(dsl.ArgumentError, match="names no call this process has traced"):
        torch.ops.gradlang.call("0" * 32, [x])


NUMBERS = dsl.loads("def scaled(x: f32[n], a: f32):\n    return x * a\n\n"
                    "def power(x, k: const i64):\n    return x ** k\n\n"
                    "def repeated(x, n: i64):\n    return sum(x) * n\n", "numbers.grad")


@pytest.mark.parametrize("backend", ["aot_eager", "eager"])
def test_python_numbers_that_change_between_calls_compile_once_or_per_const_value(backend):
    # dynamo makes a number that changed since the last call a symbol: the
    # bridge refused a SymFloat or SymInt ('not numeric'), a torch
    # 'Unsupported output type' error under fullgraph.  A float or integer
    # argument is now an input of the operation (one graph for every value);
    # a const integer picks the program, so the graph is guarded on it.
    # (backend="eager" runs dynamo's graph untraced: the call gets its floats)
    from torch._dynamo.testing import CompileCounterWithBackend
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    xd = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64, requires_grad=True)
    cases = [(NUMBERS.scaled, x, (0.5, 0.25, 3.0, 0.5), lambda x, a: x * a, 2),
             (NUMBERS.power, xd, (1, 2, 3, 2, 4), lambda x, k: x ** k, 4),
             (NUMBERS.repeated, xd, (1, 2, 3, 2, 4), lambda x, n: x.sum() * n, 2)]
    for f, x, values, reference, compiles in cases:
        tf = dsl.to_torch(f)
        counter = CompileCounterWithBackend(backend)
        torch._dynamo.reset()
        step = torch.compile(lambda x, a: tf(x, a).sum(), backend=counter, fullgraph=True)
        for a in values:
            value = step(x, a)
            (g,) = torch.autograd.grad(value, x)
            expected = reference(x, a).sum()
            assert value.dtype == x.dtype and value.item() == expected.item()
            np.testing.assert_array_equal(g.numpy(), torch.autograd.grad(expected, x)[0].numpy())
        assert counter.frame_count == compiles  # (the first change marks it dynamic)


def test_a_bad_argument_under_fullgraph_is_the_argument_error():
    # dynamo made the ArgumentError raised where it traces the call a graph
    # break, which fullgraph=True reported as torch's 'Unsupported output
    # type for nonstrict_trace-ed function', the message lost
    loss = dsl.to_torch(load("dense").loss)
    x, w, t = torch.zeros(4, 3, dtype=torch.float64), torch.zeros(3, 2), torch.zeros(4, 2)
    step = compiled(lambda x, w, b, t: loss(x, w, b, t))
    with pytest.raises(dsl.ArgumentError, match=r"dense.grad:\d+:\d+: .*'b' of loss\(\) has size "
                       r"3 on axis 0, but its annotation says n_out, which is 2 for 'w'"):
        step(x, w.double(), torch.zeros(3, dtype=torch.float64), t.double())
    with pytest.raises(dsl.ArgumentError, match=r"argument 'w' of to_torch\(loss\) is a tensor of "
                       "dtype torch.complex64"):
        step(x, w.to(torch.complex64), torch.zeros(2, dtype=torch.float64), t.double())


@pytest.mark.parametrize("fullgraph", [True, False])
def test_a_tensor_for_a_const_that_picks_the_program_is_the_argument_error(fullgraph):
    # the operation's refusal was a graph break: fullgraph=True reported
    # torch's 'Unsupported output type for nonstrict_trace-ed function', and
    # without it dynamo traced our Python, which called x 'a GPU array'
    m = dsl.loads("from std import logsumexp\ndef f(x, axis: const):\n"
                  "    return sum(logsumexp(x, axis))\ndef g(x, y):\n    return x * y\n",
                  "lse.grad")
    f = dsl.to_torch(m.f)
    torch._dynamo.reset()
    step = torch.compile(f, backend="aot_eager", fullgraph=fullgraph)
    x = torch.tensor([[0.0, 1.0], [2.0, 3.0]], dtype=torch.float64)
    with pytest.raises(dsl.ArgumentError, match=r"lse.grad:2:5: .*'axis' of f\(\) picks the "
                       "compiled program by its value .* not a tensor"):
        step(x, torch.tensor(1))
    np.testing.assert_allclose(step(x, 1).numpy(), np.log(np.exp(0) + np.exp(1))
                               + np.log(np.exp(2) + np.exp(3)), rtol=1e-15)
    # so is a program that does not compile its GradError (the same graph
    # break: 'Unsupported output type', or x 'a GPU array')
    with pytest.raises(dsl.GradError, match=r"lse.grad:3:16: error: axis 5 is out of range "
                       r"for rank 2(.|\n)*in std function logsumexp\(\), at std.grad:\d+:\d+"):
        step(x, 5)
    product = torch.compile(dsl.to_torch(m.g), backend="aot_eager", fullgraph=fullgraph)
    with pytest.raises(dsl.GradError, match=r"lse.grad:5:12: error: shapes \[2, 2\] and \[3\] "
                                            "do not broadcast"):
        product(x, torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("count", ["const i64", "i64"])
def test_a_size_argument_under_dynamic_shapes_gives_each_value_its_shape(count):
    # const: the shapes lowered with torch's symbols were cached by the
    # arguments' types as text, where a const integer is its dtype alone: n=4
    # got the result shape of n=3, and the backward failed on it ('The size of
    # tensor a (3) must match the size of tensor b (4)').  An integer found to
    # give a size only where torch traced it (a symbol, dynamic=True) was
    # refused as a tensor that 'picks the compiled program by its value'
    pooled = dsl.to_torch(dsl.loads(f"def pooled(x, ids: i64[k], n: {count}):\n"
                                    "    return segment_sum(x * x, ids, n)\n", "pooled.grad").pooled)
    ids = torch.tensor([0, 1, 0])
    step = torch.compile(lambda x, n: pooled(x, ids, n), backend="aot_eager", fullgraph=True,
                         dynamic=True)
    torch._dynamo.reset()
    x = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64, requires_grad=True)
    for n in (3, 4):
        value = step(x, n)
        np.testing.assert_array_equal(value.detach().numpy(), [17.0, 4.0] + [0.0] * (n - 2))
        (g,) = torch.autograd.grad(value, x, torch.arange(1.0, n + 1, dtype=torch.float64))
        np.testing.assert_array_equal(g.numpy(), [2.0, 8.0, 8.0])


def test_a_module_param_set_after_compiling_is_the_one_the_step_reads():
    # the param's value was a constant of the traced call: the compiled step
    # kept the value of its first call ([1, 2] after w = [10, 5]), and of two
    # loads of one source, the graph of the second read the first's params
    source = "param w: f64[2]\n\ndef line(x):\n    return x * w[0] + w[1]\n"
    first, second = dsl.loads(source, "line.grad"), dsl.loads(source, "line.grad")
    first.params["w"], second.params["w"] = np.array([1.0, 0.0]), np.array([10.0, 5.0])
    f, g = dsl.to_torch(first.line), dsl.to_torch(second.line)
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    step = compiled(lambda x: f(x) + 100 * g(x))
    np.testing.assert_array_equal(step(x).detach().numpy(), [1501.0, 2502.0])
    first.params["w"] = np.array([3.0, 1.0])
    second.params["w"][1] = 7.0  # (in place)
    value = step(x)
    np.testing.assert_array_equal(value.detach().numpy(), [1704.0, 2707.0])
    (gx,) = torch.autograd.grad(value.sum(), x)
    np.testing.assert_array_equal(gx.numpy(), [1003.0, 1003.0])


def test_the_operation_runs_a_call_it_knows_without_binding_it_again(monkeypatch):
    # each run of the operation in a compiled graph went through
    # Compiled.call_bound (the program looked up by its arguments' pattern
    # again: half the operation's own time at n = 16); the program the fast
    # path keeps for the arguments' dtypes, shapes and strides now runs them
    from dsl import function, torch_op
    from dsl.dask_bridge import placeholder
    f = load("log1pexp").log1pexp
    call = torch_op.op_call(f, {"x": placeholder((8,), np.float64)}, ("x",))
    slow = []
    call_bound = function.Compiled.call_bound
    monkeypatch.setattr(function.Compiled, "call_bound",
                        lambda g, *a, **k: (slow.append(g.name), call_bound(g, *a, **k))[1])
    y = torch.linspace(-3.0, 40.0, 16, dtype=torch.float64)
    for k, x in enumerate((y[:8], y[::2], y[8:], y[1::2])):  # contiguous, strided: twice each
        if k == 2:
            known = len(slow)
        (value,) = torch_op.operation()(call.key, [x])
        np.testing.assert_allclose(value.numpy(), np.logaddexp(0, x.numpy()), rtol=1e-14)
    assert len(slow) == known <= 2


def test_a_differentiated_call_with_a_by_value_argument_keeps_its_residuals():
    # k, a size here, is compiled by value; its `values.RunTimeInt` went
    # into the IR's shapes, and the results' sizes (3, not `type(d) is
    # int`) read as known only at run time: the backward ran the forward
    # pass again instead of reading the residuals the forward kept
    from dsl import torch_op
    g = dsl.loads("def g(x: f32[n], k: i32):\n"
                  "    return broadcast_to(sum(x * x), (k + 1,)) * (k + 1)\n", "g.grad").g
    call = torch_op.op_call(g, {"x": np.arange(4, dtype=np.float32), "k": np.int32(2)}, ("x",))
    kept = call.keeping_residuals()
    assert kept is not call and kept.n_results == 1
    ((shape, dtype), *residuals) = kept._result_types()
    assert shape == (3,) and [type(d) for d in shape] == [int] and dtype == np.float32


def test_a_loop_over_every_other_row_trains_under_fullgraph():
    # range(1, n, 2) over an axis of size n: for the pattern of sizes the
    # program runs, its trips are no size of the arguments (as above)
    f = dsl.to_torch(dsl.loads("def g(x: f64[t, d], h: f64[d], w: f64[d, d]):\n"
                               "    for i in range(1, x.shape[0], 2):\n"
                               "        h = tanh(h @ w + x[i])\n"
                               "    return sum(h)\n", "g.grad").g)
    step = compiled(lambda x, h, w: f(x, h, w) * 2.0)
    h = torch.tensor([0.2, -0.4, 1.0], dtype=torch.float64)
    w = torch.tensor([[0.5, -0.3, 0.2], [0.1, 0.4, -0.6], [0.3, 0.2, 0.1]], dtype=torch.float64)
    for rows in (4, 5):
        xn = np.linspace(-1.0, 2.0, 3 * rows).reshape(rows, 3)
        x = torch.tensor(xn, requires_grad=True)
        step(x, h, w).backward()

        def reference(x):
            state = h.numpy()
            for i in range(1, len(x), 2):
                state = np.tanh(state @ w.numpy() + x[i])
            return 2.0 * np.sum(state)
        np.testing.assert_allclose(x.grad.numpy(), central_difference(reference, [xn], 0),
                                   rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("trips", [3, "tensor"])
def test_a_loop_whose_trip_count_is_an_argument_trains_under_fullgraph(trips):
    # its forward pass's residuals (the trips' stacked states) have a size
    # known only when it runs: the fake rule's sizes raised KeyError('trip0'),
    # which dynamo reported as "Unsupported output type for nonstrict_trace-ed
    # function".  Such a call's backward now recomputes the forward.
    f = dsl.to_torch(dsl.loads("def g(x: f64[d], n: i64):\n"
                               "    for i in range(n):\n"
                               "        x = sin(x) * 1.5\n"
                               "    return sum(x * x)\n", "g.grad").g)
    step = compiled(lambda x, n: f(x, n) * 2.0)
    for n in (3, 5):
        xn = np.array([0.3, -1.2, 2.0])
        x = torch.tensor(xn, requires_grad=True)
        value = step(x, torch.tensor(n) if trips == "tensor" else n)
        value.backward()

        def reference(x):
            for _ in range(n):
                x = np.sin(x) * 1.5
            return 2.0 * np.sum(x * x)
        np.testing.assert_allclose(value.item(), reference(xn), rtol=1e-14)
        np.testing.assert_allclose(x.grad.numpy(), central_difference(reference, [xn], 0),
                                   rtol=1e-7, atol=1e-8)


def test_a_loaded_function_called_itself_runs_eagerly_as_outside_torch_compile():
    # a model calling m.f, not dsl.to_torch(m.f): dynamo traced binding with
    # its fake tensors, an InternalTorchDynamoError ("Cannot interpret
    # 'torch.float32' as a data type"); the call is now a graph break, run as
    # outside torch.compile: here the ArgumentError saying to call it through
    # dsl.to_torch, as the tensor requires grad (one that does not is a
    # constant)
    f = dsl.loads("def f(x):\n    return sum(x * x)\n", "own.grad").f
    torch._dynamo.reset()
    step = torch.compile(lambda t: f(t * 2.0) + 1.0, backend="eager")
    with pytest.raises(dsl.ArgumentError, match=r"own.grad:1:5: error: argument 'x' of f\(\) "
                       r"cannot be read as a NumPy array \(.*\); call the function through "
                       r"dsl.to_torch\(f\)"):
        step(torch.arange(3.0, requires_grad=True))
