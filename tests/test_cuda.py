"""The CUDA target (on Numba's simulator unless a GPU is present): the
same results as the CPU for every primitive and every example, values and
first and second order gradients; data stays on the device."""
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from gradlang.compiler import autodiff
from gradlang.compiler.builder import Builder
from gradlang.compiler.ir import TensorType, Var
from gradlang.compiler.ops import OPS
from gradlang.compiler.pipeline import build
from gradlang.runtime import cuda as rcuda

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NP = {"f32": np.float32, "f64": np.float64}
TOL = {"f64": dict(rtol=1e-12, atol=1e-12), "f32": dict(rtol=1e-5, atol=1e-6)}


def on_both(fn, *arrays):
    """Run one IR function on the CPU and on CUDA."""
    cpu = build(fn, "cpu")(*arrays)
    gpu = build(fn, "cuda")(*[rcuda.to_device(a) for a in arrays])
    return cpu, [rcuda.to_host(g) for g in gpu]


def assert_same(cpu, gpu, dtype):
    for c, g in zip(cpu, gpu):
        assert c.shape == g.shape and c.dtype == g.dtype
        np.testing.assert_allclose(g, c, **TOL[dtype])


def single(name, types, **params):
    b = Builder()
    xs = [Var(t) for t in types]
    return b.function(name, xs, [b.bind(name, *xs, **params)])


ELEMENTWISE = sorted(n for n, op in OPS.items() if op.kind == "elementwise" and op.arity >= 1
                     and n not in ("cast", "stop_gradient"))


def sample(rng, domain, shape, dtype):
    if domain == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    low, high = {"positive": (0.2, 3.0), "unit": (-1.0, 1.0)}.get(domain, (-3.0, 3.0))
    x = rng.uniform(low, high, shape)
    if domain == "nonzero":
        x = np.abs(x) + 0.2
    return np.asarray(x).astype(NP[dtype])


def domains(name):
    return {"where": ["bool", "real", "real"], "pow": ["positive", "real"],
            "div": ["real", "nonzero"]}.get(name, [OPS[name].domain] * OPS[name].arity)


@pytest.mark.parametrize("name", ELEMENTWISE)
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**31), dtype=st.sampled_from(["f64", "f32"]),
       shapes=st.sampled_from([((5,), (5,)), ((2, 3), (3,)), ((2, 3), (2, 1)), ((), (4,))]))
def test_elementwise_primitives_match_cpu(name, seed, dtype, shapes):
    rng = np.random.default_rng(seed)
    n = OPS[name].arity
    in_shapes = [shapes[i % 2] for i in range(n)]
    arrays = [sample(rng, d, s, dtype) for d, s in zip(domains(name), in_shapes)]
    types = [TensorType("bool" if a.dtype == np.bool_ else dtype, a.shape) for a in arrays]
    fn = single(name, types)
    assert_same(*on_both(fn, *arrays), dtype)
    floats = [i for i, a in enumerate(arrays) if a.dtype != np.bool_]
    if OPS[name].differentiable and fn.outputs[0].type.is_float:
        out_shape = fn.outputs[0].type.shape
        joint = autodiff.vjp(fn, floats)
        assert_same(*on_both(joint, *arrays, rng.normal(size=out_shape).astype(NP[dtype])),
                    dtype)
        second = autodiff.grad_of_sum(autodiff.grad_of_sum(fn, floats[:1], False), floats[:1],
                                      False)
        assert_same(*on_both(second, *arrays), dtype)


CASES = [("reduce_sum", [(40, 3)], {"axes": (0,)}), ("reduce_sum", [(2, 3, 4)], {"axes": (0, 2)}),
         ("reduce_sum", [(100,)], {"axes": (0,)}), ("reduce_max", [(3, 5)], {"axes": (1,)}),
         ("reduce_max", [(2, 3, 4)], {"axes": (1,)}),
         ("reduce_max", [(100,)], {"axes": (0,)}), ("reduce_max", [(2, 40)], {"axes": (1,)}), ("reshape", [(2, 6)], {"shape": (3, 4)}),
         ("transpose", [(2, 3, 4)], {"perm": (2, 0, 1)}),
         ("broadcast_to", [(3, 1)], {"shape": (2, 3, 4)}),
         ("slice", [(5, 4)], {"starts": (1, 0), "stops": (5, 4), "steps": (2, 1)}),
         ("embed", [(2, 4)], {"shape": (5, 4), "starts": (1, 0), "stops": (5, 4), "steps": (2, 1)}),
         ("concatenate", [(2, 3), (4, 3)], {"axis": 0}), ("matmul", [(3, 5), (5, 2)], {})]


@pytest.mark.parametrize("name,shapes,params", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
@pytest.mark.parametrize("dtype", ["f64", "f32"])
def test_other_primitives_match_cpu(name, shapes, params, dtype):
    rng = np.random.default_rng(0)
    arrays = [sample(rng, "real", s, dtype) for s in shapes]
    fn = single(name, [TensorType(dtype, s) for s in shapes], **params)
    assert_same(*on_both(fn, *arrays), dtype)
    joint = autodiff.vjp(fn, list(range(len(arrays))))
    ct = rng.normal(size=fn.outputs[0].type.shape).astype(NP[dtype])
    assert_same(*on_both(joint, *arrays, ct), dtype)
    second = autodiff.grad_of_sum(autodiff.grad_of_sum(fn, [0], False), [0], False)
    assert_same(*on_both(second, *arrays), dtype)


def test_every_primitive_is_covered():
    covered = set(ELEMENTWISE) | {c[0] for c in CASES}
    assert set(OPS) - covered <= {"cast", "stop_gradient", "full", "custom_vjp",
                                  "recompute_barrier", "dim"}


def example_args(rng):
    x, w = np.array([-2.0, -0.5, 0.5, 3.0]), np.array([1.5, -1.0, 2.0, 0.7])
    return {
        "log1pexp": [("log1pexp", (np.linspace(-5, 5, 7),))],
        "bar": [("bar", (rng.normal(size=3), rng.normal(size=3)))],
        "leaky_relu": [("leaky_relu", (x,))],
        "stylegan_r1": [("r1_penalty", (x, w)), ("leaky_relu", (x,))],
        "dense": [("loss", tuple(rng.normal(size=s) for s in [(3, 4), (4, 2), (2,), (3, 2)]))],
        "linear_poly": [("linear_poly", (np.array([1.0, 2.0, 3.0]),))],
        "straight_through": [("quantized_loss", (rng.normal(size=4), np.zeros(4)))],
        "checkpoint": [("checkpointed", (rng.normal(size=(2, 3)), rng.normal(size=(3, 3)) / 3))],
    }


@pytest.mark.parametrize("example", sorted(example_args(np.random.default_rng(0))))
def test_examples_match_cpu(example):
    rng = np.random.default_rng(1)
    cpu = dsl.load(EXAMPLES / f"{example}.grad")
    gpu = dsl.load(EXAMPLES / f"{example}.grad", target="cuda", host_results=True)
    for m in (cpu, gpu):
        if "weights" in m.params._specs:
            m.params["weights"] = np.array([1.0, 1.0])
    for name, args in example_args(rng)[example]:
        f_cpu, f_gpu = getattr(cpu, name), getattr(gpu, name)
        np.testing.assert_allclose(f_gpu(*args), f_cpu(*args), rtol=1e-12, atol=1e-12)
        g_cpu, g_gpu = dsl.grad(f_cpu), dsl.grad(f_gpu)
        np.testing.assert_allclose(g_gpu(*args), g_cpu(*args), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(dsl.grad(g_gpu)(*args), dsl.grad(g_cpu)(*args),
                                   rtol=1e-10, atol=1e-12)


def test_tape_chain_copies_to_host_only_what_is_asked(monkeypatch):
    copies = []
    device_type = type(rcuda.to_device(np.zeros(1)))
    original = device_type.copy_to_host
    monkeypatch.setattr(device_type, "copy_to_host",
                        lambda self, *a, **k: copies.append(1) or original(self, *a, **k))
    m = dsl.load(EXAMPLES / "log1pexp.grad", target="cuda")
    b = dsl.load(EXAMPLES / "bar.grad", target="cuda")
    x = rcuda.to_device(np.array([0.5, -1.0, 2.0]))
    with dsl.Tape() as tape:
        tape.watch(x)
        y = m.log1pexp(x)
        z = b.bar(y, x)
        w = m.log1pexp(z)
    g = tape.gradient(w, x)
    assert copies == []
    host = g.copy_to_host()
    assert len(copies) == 1
    xs = np.array([0.5, -1.0, 2.0])
    cpu_m, cpu_b = dsl.load(EXAMPLES / "log1pexp.grad"), dsl.load(EXAMPLES / "bar.grad")
    with dsl.Tape() as tape:
        tape.watch(xs)
        expected = tape.gradient(cpu_m.log1pexp(cpu_b.bar(cpu_m.log1pexp(xs), xs)), xs)
    np.testing.assert_allclose(host, expected, rtol=1e-12)


def test_device_arrays_are_taken_without_a_copy(monkeypatch):
    sent = []
    monkeypatch.setattr(rcuda, "to_device", lambda a: sent.append(1) or rcuda.cuda.to_device(a))
    m = dsl.load(EXAMPLES / "log1pexp.grad", target="cuda")
    x = rcuda.cuda.to_device(np.array([1.0, 2.0]))
    m.log1pexp(x)
    assert sent == []
    m.log1pexp(np.array([1.0, 2.0]))
    assert sent == [1]


def test_missing_numba_cuda_is_one_clear_error(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "numba_cuda" else real(name, *a))
    with pytest.raises(dsl.GradError, match=r"needs the numba-cuda package: pip install "
                                            r"'gradlang\[cuda\]'"):
        dsl.load(EXAMPLES / "log1pexp.grad", target="cuda")


def test_every_transform_runs_on_the_device():
    rng = np.random.default_rng(4)
    args = [rng.normal(size=s) for s in [(3, 4), (4, 2), (2,), (3, 2)]]
    cpu = dsl.load(EXAMPLES / "dense.grad")
    gpu = dsl.load(EXAMPLES / "dense.grad", target="cuda")
    v_c, g_c = dsl.value_and_grad(cpu.loss, wrt=(0, 1, 2))(*args)
    v_g, g_g = dsl.value_and_grad(gpu.loss, wrt=(0, 1, 2))(*args)
    assert rcuda.is_device_array(v_g)
    np.testing.assert_allclose(rcuda.to_host(v_g), v_c, rtol=1e-12)
    for a, b in zip(g_g, g_c):
        np.testing.assert_allclose(rcuda.to_host(a), b, rtol=1e-12, atol=1e-14)
    out_c, pb_c = dsl.vjp(cpu.loss, *args)
    out_g, pb_g = dsl.vjp(gpu.loss, *args)
    for a, b in zip(pb_g(rcuda.to_device(np.array(2.0))), pb_c(np.array(2.0))):
        if b is None:
            assert a is None
        else:
            np.testing.assert_allclose(rcuda.to_host(a), b, rtol=1e-12, atol=1e-14)
    v = rng.normal(size=(4, 2))
    np.testing.assert_allclose(rcuda.to_host(dsl.hvp(gpu.loss, wrt=1)(*args, v)),
                               dsl.hvp(cpu.loss, wrt=1)(*args, v), rtol=1e-10, atol=1e-12)


def test_compiled_module_for_cuda(tmp_path, monkeypatch):
    from dsl.aot import compile_module
    compile_module(str(EXAMPLES / "log1pexp.grad"), str(tmp_path), ["log1pexp(f64[:])"],
                   target="cuda")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    compiled = importlib.import_module("log1pexp")
    x = np.linspace(-5, 100, 6)
    v, g = compiled.log1pexp.value_and_grad(x)
    cpu = dsl.load(EXAMPLES / "log1pexp.grad")
    v_c, g_c = dsl.value_and_grad(cpu.log1pexp)(x)
    np.testing.assert_allclose(rcuda.to_host(v), v_c, rtol=1e-12)
    np.testing.assert_allclose(rcuda.to_host(g), g_c, rtol=1e-12)
