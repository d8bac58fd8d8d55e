"""Reads by a loop's own index as stacked inputs (`compiler/loop_reads.py`):
`obs[i]` in `for i in range(obs.shape[0])` reads this trip's slice, the
RK4 fit runs in one kernel each way, and values and derivatives of every
transform match the same loop whose trips are known only at run time
(which still gathers), NumPy and central differences."""
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import dsl
from gradlang.compiler import autodiff
from gradlang.compiler.interpret import interpret
from gradlang.compiler.ir import Function, TensorType
from gradlang.compiler.pipeline import front_end, lower_entry
from gradlang.compiler.shapes import Sym
from gradlang.compiler.verify import verify
from helpers import central_difference

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import workloads  # noqa: E402 (the RK4 fit and its NumPy reference)

SOURCE = workloads.FIT_SOURCE + """
# the same loop, its trip count known only at run time: obs[i] gathers
def fit_n(y0, k, c, dt, obs, n: i64):
    y = y0
    loss = 0.0
    for i in range(n):
        y = rk4_step(y, k, c, dt)
        loss = loss + sum((y - obs[i]) ** 2)
    return loss

def reads(x: f64[8, 5], w: f64[5]):
    s = w
    for i in range(4, -1, -2):
        s = sin(s * x[i + 1] + x[:, i][1:6] + x[i + 3, 0] * w)
    return s

def over(x: f64[3]):
    s = 0.0
    for i in range(1, 4):
        s = s + x[i]
    return s

def rnn(emb, w, tokens):
    h = emb[tokens[:, 0]] * 0.0
    for i in range(tokens.shape[1]):
        h = tanh(emb[tokens[:, i]] + h @ w)
    return sum(h * h)
"""


def fit_numpy(*args):
    return workloads.numpy_fit(*args)[0]


def reads_numpy(x, w):
    s = w
    for i in range(4, -1, -2):
        s = np.sin(s * x[i + 1] + x[:, i][1:6] + x[i + 3, 0] * w)
    return s


@pytest.fixture(scope="module")
def m():
    return dsl.loads(SOURCE)


FRONT = front_end(SOURCE, "<string>")


def types_of(args) -> list[TensorType]:
    return [TensorType({"float64": "f64", "int64": "i64"}[np.asarray(a).dtype.name],
                       np.shape(a)) for a in args]


def lowered(name: str, args) -> Function:
    module, ns = FRONT
    fdef = module.func(name)
    return lower_entry(ns, fdef, dict(zip([p.name for p in fdef.params], types_of(args))))


def interpreted_value_and_grad(name: str, args, wrt) -> tuple:
    """The value and gradient (of the sum) by the reference interpreter of the IR (no
    kernels compiled: the rewrite is checked where it happens)."""
    value, *grads = interpret(autodiff.grad_of_sum(lowered(name, args), wrt, True), *args)
    return value, grads


def fit_args(t=12, seed=0):
    obs = np.random.default_rng(seed).normal(size=(t, 2))
    return (np.array([1.0, -0.5]), 4.0, 0.3, 0.05, obs)


def test_index_reads_become_stacked_inputs():
    # the loop reads slices: no gather left in its body, none by the
    # run-time-bounded twin's index lost
    module, ns = FRONT
    f64 = TensorType("f64", ())
    for t in (12, Sym.named("t")):
        types = {"y0": TensorType("f64", (2,)), "k": f64, "c": f64, "dt": f64,
                 "obs": TensorType("f64", (t, 2))}
        fit = lower_entry(ns, module.func("fit_loss"), types)
        verify(fit, "lower")
        (loop,) = [e for e in fit.eqns if e.op == "loop"]
        assert loop.p["trip"] == t and "take" not in {e.op for e in loop.p["body"].eqns}
    fit_n = lower_entry(ns, module.func("fit_n"), {**types, "n": TensorType("i64", ())})
    (loop,) = [e for e in fit_n.eqns if e.op == "loop"]
    assert "take" in {e.op for e in loop.p["body"].eqns}
    # backward, strided, shifted, by column, and sliced before the read
    reads = lower_entry(ns, module.func("reads"), {"x": TensorType("f64", (8, 5)),
                                                    "w": TensorType("f64", (5,))})
    (loop,) = [e for e in reads.eqns if e.op == "loop"]
    assert loop.p["trip"] == 3 and "take" not in {e.op for e in loop.p["body"].eqns}


def test_rk4_fit_runs_in_one_kernel_each_way_with_the_gathering_loops_derivatives(m):
    args = fit_args()
    wrt = (0, 1, 2)  # (the benchmark's program)
    value_and_grad = dsl.value_and_grad(m.fit_loss, wrt=wrt)
    generated = value_and_grad.program(value_and_grad.bind(args, {})).generated
    assert "def body" not in generated.driver_source
    assert len([n for n, source in generated.kernels if "for tt in range(trips):" in source]) == 2
    value, grads = value_and_grad(*args)
    np.testing.assert_allclose(value, fit_numpy(*args), rtol=1e-13)
    for g, by_hand in zip(grads, workloads.numpy_fit(*args)[1:]):
        np.testing.assert_allclose(g, by_hand, rtol=1e-11)
    # every argument's, obs's too, as the gathering loop's, by the interpreter
    everything = range(5)
    value_n, grads_n = interpreted_value_and_grad("fit_n", args + (np.int64(12),), everything)
    value_i, grads_i = interpreted_value_and_grad("fit_loss", args, everything)
    np.testing.assert_allclose([value, value_i], [value_n] * 2, rtol=1e-13)
    for g, g_i, g_n in zip(grads, grads_i, grads_n):
        np.testing.assert_allclose([g, g_i], [g_n] * 2, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(grads_i[4], central_difference(fit_numpy, args, 4), rtol=1e-6,
                               atol=1e-8)
    # second order (grad of grad: the Hessian's row sums in y0), by the
    # interpreter, against the gathering loop's and central differences
    second = [interpret(autodiff.grad_of_sum(autodiff.grad_of_sum(lowered(name, a), [0], False),
                                             [0], False), *a)[0]
              for name, a in (("fit_loss", args), ("fit_n", args + (np.int64(12),)))]
    np.testing.assert_allclose(second[0], second[1], rtol=1e-12)
    np.testing.assert_allclose(second[0], central_difference(
        lambda *a: value_and_grad(*a)[1][0], args, 0), rtol=1e-6)
    # forward mode, the tangent of obs included
    rng = np.random.default_rng(1)
    tangents = (rng.normal(size=2), 0.5, -1.0, 0.1, rng.normal(size=args[4].shape))
    value, tangent = dsl.jvp(m.fit_loss, args, tangents)
    np.testing.assert_allclose(tangent, sum(np.sum(g * t) for g, t in zip(grads_i, tangents)),
                               rtol=1e-11)
    # a batch of observations: one loop over the stacked examples
    batch = rng.normal(size=(3,) + args[4].shape)
    got = dsl.vmap(m.fit_loss, in_axes=(None, None, None, None, 0))(*args[:4], batch)
    np.testing.assert_allclose(got, [fit_numpy(*args[:4], o) for o in batch], rtol=1e-13)
    got = m.fit_loss(*(np.asarray(a, np.float32) for a in args))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, fit_numpy(*args), rtol=1e-5)


def test_strided_shifted_column_and_backward_reads(m):
    rng = np.random.default_rng(2)
    x, w = rng.normal(size=(8, 5)), rng.normal(size=5)
    np.testing.assert_allclose(m.reads(x, w), reads_numpy(x, w), rtol=1e-13)
    value, (gx, gw) = interpreted_value_and_grad("reads", (x, w), (0, 1))
    np.testing.assert_allclose(value, reads_numpy(x, w), rtol=1e-13)
    np.testing.assert_allclose(gx, central_difference(reads_numpy, (x, w), 0), rtol=1e-6,
                               atol=1e-8)
    np.testing.assert_allclose(gw, central_difference(reads_numpy, (x, w), 1), rtol=1e-6,
                               atol=1e-8)


def test_an_index_out_of_range_is_the_gathers_error(m):
    # range(1, 4) over 3 elements is not provably in range: the read stays
    # a gather, with its error at the read, as the run-time-bounded loop's
    said = "index 3 in 'i' is out of range for an axis of size 3 (valid: -3 to 2)"
    with pytest.raises(dsl.ArgumentError, match=re.escape(said)) as info:
        m.over(np.arange(3.0))
    assert "s = s + x[i]" in str(info.value)
    with pytest.raises(dsl.ArgumentError, match=re.escape(said)):
        m.fit_n(np.ones(2), 1.0, 1.0, 0.1, np.ones((3, 2)), 4)


def test_rnn_reads_each_steps_tokens_as_a_slice():
    rng = np.random.default_rng(3)
    emb, w = rng.normal(size=(10, 4)), rng.normal(size=(4, 4)) * 0.5
    tokens = rng.integers(0, 10, size=(4, 7))

    def reference(emb, w):
        h = emb[tokens[:, 0]] * 0.0
        for i in range(tokens.shape[1]):
            h = np.tanh(emb[tokens[:, i]] + h @ w)
        return np.sum(h * h)
    value, (g_emb, g_w) = interpreted_value_and_grad("rnn", (emb, w, tokens), (0, 1))
    np.testing.assert_allclose(value, reference(emb, w), rtol=1e-13)
    np.testing.assert_allclose(g_emb, central_difference(reference, (emb, w), 0), rtol=1e-6,
                               atol=1e-8)
    np.testing.assert_allclose(g_w, central_difference(reference, (emb, w), 1), rtol=1e-6,
                               atol=1e-8)
    (loop,) = [e for e in lowered("rnn", (emb, w, tokens)).eqns if e.op == "loop"]
    assert [x.type.shape for x in loop.inputs[3 + loop.p["n_carry"] + loop.p["n_inv"]:]] \
        == [(7, 4)]  # the tokens of each step, read as a slice


def test_rk4_fit_on_cuda():
    m = dsl.loads(SOURCE, target="cuda", host_results=True)
    args = fit_args(t=5)
    value, grads = dsl.value_and_grad(m.fit_loss, wrt=(1, 4))(*args)
    np.testing.assert_allclose(value, fit_numpy(*args), rtol=1e-13)
    np.testing.assert_allclose(grads[0], central_difference(fit_numpy, args, 1), rtol=1e-6)
    np.testing.assert_allclose(grads[1], central_difference(fit_numpy, args, 4), rtol=1e-6,
                               atol=1e-8)
