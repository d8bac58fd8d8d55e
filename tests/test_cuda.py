"""The CUDA target (on Numba's simulator unless a GPU is present): the
same results as the CPU for every example, values and first and second
order gradients; data stays on the device.  (Every primitive runs on every
target in `tests/test_ops.py`.)"""
from pathlib import Path

import numpy as np
import pytest

import dsl
from gradlang.runtime import cuda as rcuda

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


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
