"""Dtype kinds in annotations: `x: float[n, k]` names the sizes and takes
any float dtype (f32 or f64), `i: int[m]` any integer one (i32 or i64).

A function is compiled for the dtypes a call passes, as for an unannotated
parameter: f32 in, f32 out; parameters of one kind need not share a dtype
(f32 with f64 promotes to f64); equal size names still bind equal sizes. An
array of the other kind is an `ArgumentError` naming the function, the
parameter, the kind and the dtype, before any kernel runs, on every way in;
`-> float[n]` checks that the result is a float of those sizes, whatever
float the body gives.
"""
from __future__ import annotations

import numpy as np
import pytest

import dsl
from dsl.aot import compile_module
from dsl.cli import main
from helpers import central_difference, import_compiled, optional_module

torch = optional_module("torch", "torch")
jax = optional_module("jax", "jax")

FILE = "kinds.grad"
SOURCE = """\
def model(x: float[n, k], w: float[k], b: float) -> float[n]:
    return tanh(x @ w) * b + sum(x * x, axis=1)

def loss(x: float[n, k], w: float[k], b: float) -> float:
    return sum(model(x, w, b) ** 2)

def pick(x: float[n], i: int[m], c: const int = 2) -> float[m]:
    return take(x, i) * c
"""
# calls that their annotations refuse when compiled
REFUSED = """
def through(x: f32[n, k], w: i64[k]):
    return model(x, w, 1.0)

def ints(k: int[n]) -> float[n]:
    return k * 2
"""
RNG = np.random.default_rng(7)
X, W, B = RNG.normal(size=(3, 2)), RNG.normal(size=2), 0.7
KIND_ERROR = ("argument 'x' of {f} has dtype i64, but its annotation says float "
              "(f32 or f64)")


@pytest.fixture(scope="module")
def m():
    return dsl.loads(SOURCE + REFUSED, FILE)


def reference_loss(x, w, b):
    return np.sum((np.tanh(x @ w) * b + np.sum(x * x, axis=1)) ** 2)


def test_one_function_runs_in_f32_and_f64_with_gradients(m):
    value_and_grad = dsl.value_and_grad(m.loss, wrt=(0, 1, 2))
    value, grads = value_and_grad(X, W, B)
    assert value.dtype == np.float64 and all(g.dtype == np.float64 for g in grads)
    np.testing.assert_allclose(value, reference_loss(X, W, B), rtol=1e-13)
    # (the value of the same program: no other one to compile)
    for index, grad in enumerate(grads):
        np.testing.assert_allclose(
            grad, central_difference(lambda *a: value_and_grad(*a)[0], (X, W, B), index),
            rtol=1e-6, atol=1e-8)
    # (through vjp: to_torch's test runs the same f32 programs)
    value32, pullback = dsl.vjp(m.loss, X.astype(np.float32), W.astype(np.float32), B)
    grads32 = pullback(np.float32(1))
    assert value32.dtype == np.float32 and all(g.dtype == np.float32 for g in grads32)
    np.testing.assert_allclose(value32, value, rtol=1e-5)
    for g32, g in zip(grads32, grads):
        np.testing.assert_allclose(g32, g, rtol=1e-4, atol=1e-5)
    # a kind binds no dtype across parameters: f32 with f64 promotes, as
    # unannotated parameters do, and each gradient has its argument's dtype;
    # a Python number is weakly typed (f32 with the f32 arrays above)
    mixed, (gx, gw, gb) = value_and_grad(X.astype(np.float32), W, B)
    assert (mixed.dtype, gx.dtype, gw.dtype, gb.dtype) == (np.float64, np.float32,
                                                           np.float64, np.float64)
    np.testing.assert_allclose(mixed, value, rtol=1e-6)
    # (against the f64 gradients, which central differences checked above)
    np.testing.assert_allclose(gx, grads[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gw, grads[1], rtol=1e-5)
    np.testing.assert_allclose(gb, grads[2], rtol=1e-5)


def test_jvp_and_vmap_follow_the_dtype(m):
    tangents = (RNG.normal(size=X.shape), RNG.normal(size=W.shape), 0.3)
    primals32 = (X.astype(np.float32), W.astype(np.float32), np.float32(B))
    value, tangent = dsl.jvp(m.loss, primals32,
                             tuple(np.asarray(t, np.float32) for t in tangents))
    assert value.dtype == tangent.dtype == np.float32
    expected = sum(np.sum(central_difference(reference_loss, (X, W, B), i) * t)
                   for i, t in enumerate(tangents))
    np.testing.assert_allclose(tangent, expected, rtol=1e-4)
    xs = RNG.normal(size=(4, 3, 2))
    mapped = dsl.vmap(m.model, in_axes=(0, None, None))(xs, W, B)
    assert mapped.shape == (4, 3) and mapped.dtype == np.float64
    np.testing.assert_allclose(mapped, np.tanh(xs @ W) * B + np.sum(xs * xs, axis=2),
                               rtol=1e-13)
    with pytest.raises(dsl.ArgumentError, match="has dtype i64, but its annotation says float"):
        dsl.vmap(m.model, in_axes=(0, None, None))(xs.astype(np.int64), W, B)


def test_an_int_kind_takes_either_integer_dtype(m):
    x = np.array([0.5, -1.0, 2.0])
    np.testing.assert_array_equal(m.pick(x, np.array([2, 0], np.int32)), [4.0, 1.0])
    # (a list is i64, as for an unannotated integer)
    np.testing.assert_array_equal(m.pick(x.astype(np.float32), [1], 3), np.float32([-3.0]))
    with pytest.raises(dsl.ArgumentError, match=r"argument 'i' of pick\(\) has dtype f64, "
                       r"but its annotation says int \(i32 or i64\)"):
        m.pick(x, np.array([1.0]))


def test_the_other_kind_or_sizes_are_refused_before_anything_runs(m):
    x_int = X.astype(np.int64)
    calls = {"loss()": lambda: m.loss(x_int, W, B),
             "loss()#grad": lambda: dsl.grad(m.loss)(x_int, W, B),
             "loss()#vag": lambda: dsl.value_and_grad(m.loss)(x_int, W, B),
             "loss()#jvp": lambda: dsl.jvp(m.loss, (x_int, W, B), (X, W, 1.0))}
    for name, call in calls.items():
        with pytest.raises(dsl.ArgumentError) as info:
            call()
        assert info.value.message == KIND_ERROR.format(f=name.split("#")[0]), name
        assert (info.value.file, info.value.line) == (FILE, 4)
    with pytest.raises(dsl.ArgumentError, match=r"argument 'w' of loss\(\) has size 3 on axis "
                       r"0, but its annotation says k, which is 2 for 'x'"):
        m.loss(X, np.ones(3), B)
    # a call from another function is checked as the call is compiled
    with pytest.raises(dsl.GradError, match=r"argument 'w' of model\(\) has dtype i64; its "
                       r"annotation says float \(f32 or f64\)"):
        m.through(X.astype(np.float32), np.arange(2))
    with pytest.raises(dsl.GradError, match=r"the result of ints\(\) has dtype i64, but its "
                       r"annotation says float \(f32 or f64\)") as info:
        m.ints(np.arange(3))
    assert info.value.line == 13


def test_the_bridges_take_either_float_and_refuse_an_int(m):
    loss = dsl.to_torch(m.loss)
    x = torch.tensor(X, dtype=torch.float32, requires_grad=True)
    out = loss(x, torch.tensor(W, dtype=torch.float32), B)
    out.backward()
    assert out.dtype == x.grad.dtype == torch.float32
    np.testing.assert_allclose(out.item(), reference_loss(X, W, B), rtol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), central_difference(reference_loss, (X, W, B), 0),
                               rtol=1e-4, atol=1e-5)
    with pytest.raises(dsl.ArgumentError) as info:
        loss(torch.tensor(X).long(), torch.tensor(W), B)
    assert info.value.message == KIND_ERROR.format(f="loss()")
    jnp = jax.numpy
    with pytest.raises(dsl.ArgumentError) as info:
        dsl.to_jax(m.loss)(jnp.asarray(X.astype(np.int32)), jnp.asarray(W, jnp.float32), B)
    assert info.value.message == KIND_ERROR.format(f="loss()").replace("i64", "i32")


def test_gradc_run_and_compiled_modules_check_the_kind(tmp_path, capsys):
    path = tmp_path / FILE
    path.write_text(SOURCE)
    np.save(tmp_path / "x.npy", X.astype(np.int64))
    assert main(["run", str(path), "loss", str(tmp_path / "x.npy"), "[0, 1]", "1"]) == 1
    assert KIND_ERROR.format(f="loss()") in capsys.readouterr().err
    with pytest.raises(dsl.GradError, match=r"cannot read 'float\[n, k\]' in signature "
                       r"'loss\(float\[n, k\], f64\[k\], f64\)': a signature gives a dtype, "
                       r"not a kind; write f32 or f64 for float"):
        compile_module(str(path), str(tmp_path / "out"), ["loss(float[n, k], f64[k], f64)"])
    module = import_compiled(compile_module(str(path), str(tmp_path / "out")))
    # (its one signature: f64 for `float`)
    assert "loss(f64[n, k], f64[k], f64)" in module.SIGNATURES
    with pytest.raises(dsl.ArgumentError) as info:
        module.loss(X.astype(np.int64), W, B)
    assert info.value.message == KIND_ERROR.format(f="loss()")


def test_cuda_takes_an_f32_call(m):
    cuda = dsl.loads(SOURCE, FILE, target="cuda", host_results=True)
    x, w = X.astype(np.float32), W.astype(np.float32)
    out = cuda.model(x, w, B)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, np.tanh(X @ W) * B + np.sum(X * X, axis=1), rtol=1e-5)


def test_a_param_has_one_dtype():
    with pytest.raises(dsl.GradError, match="a param has one dtype: write f32 or f64 for "
                       "float") as info:
        dsl.loads("param w: float[3]\ndef f(x):\n    return x * w\n", FILE)
    assert (info.value.line, info.value.col) == (1, 10)
