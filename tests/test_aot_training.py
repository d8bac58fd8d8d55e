"""A gradc-compiled module as training code uses it, against the same
file loaded with dsl.load: calls leaving out defaulted parameters,
to_torch and to_jax of its functions (first order) and of their
gradients, clear errors for what needs the IR, a module missing a
function, and a compiled directory moved elsewhere keeping its machine
code.  One module, compiled once (its kernels compile when first run)."""

import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest

import dsl
from dsl.aot import compile_module
from helpers import central_difference, import_compiled, optional_module

SOURCE = """\
from std import logsumexp

def loss(w, x, t, scale=0.5):
    return sum((tanh(x * w) - t) ** 2) * scale

def lse(x, axis: const = -1):
    return logsumexp(x, axis)

def total(x, axis: const = None):
    return sum(x * x, axis)

def scaled(x, s=3.0):
    return x * s

def unused(x):
    return x

def weighted(x, s: f32):
    return x * s

def doubled(x: f64[n]):
    return x * 2.0

def anchored(x, a: f64 = 0.5):
    return x * a
"""
SIGNATURES = ["loss(f64[n], f64[n], f64[n])", "loss(f64[n], f64[n], f64[n], f64)",
              "lse(f64[:, :])", "total(f64[:], None)", "total(f64[:, :], 0)", "scaled(f64[:], f64)",
              "weighted(f32[:], f32)", "doubled(f64[:])", "anchored(f32[:])"]

W = np.array([0.3, -0.7, 1.1])
X = np.array([1.0, 2.0, -0.5])
T = np.array([0.2, -0.4, 0.1])


def numpy_loss(w, x=X, t=T, scale=0.5):
    return np.sum((np.tanh(x * w) - t) ** 2) * scale


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    directory = tmp_path_factory.mktemp("aot_training")
    (directory / "train.grad").write_text(SOURCE)
    compile_module(str(directory / "train.grad"), str(directory / "out"), SIGNATURES)
    return directory / "out"


@pytest.fixture(scope="module")
def aot(out):
    return import_compiled(out / "train.py")


@pytest.fixture(scope="module")
def loaded():
    return dsl.loads(SOURCE)


def test_a_call_leaving_out_a_default_runs_as_the_loaded_one(aot, loaded):
    np.testing.assert_allclose(aot.loss(W, X, T), loaded.loss(W, X, T), rtol=1e-14)
    np.testing.assert_allclose(aot.loss(W, X, T), numpy_loss(W), rtol=1e-14)
    np.testing.assert_allclose(aot.loss(W, X, T, 2.0), numpy_loss(W, scale=2.0), rtol=1e-14)
    value, grad = dsl.value_and_grad(aot.loss)(W, X, T)
    np.testing.assert_allclose(value, numpy_loss(W), rtol=1e-14)
    np.testing.assert_allclose(grad, central_difference(numpy_loss, [W], 0), rtol=1e-7)
    np.testing.assert_allclose(grad, dsl.grad(loaded.loss)(W, X, T), rtol=1e-14)


def test_a_const_default_given_or_left_out_runs_one_program(aot):
    m = np.array([[1.0, 2.0, 3.0], [0.0, -1.0, 4.0]])
    want = np.log(np.exp(m).sum(axis=-1))
    # compiled leaving axis out, called giving its default (and the other way round)
    for got in (aot.lse(m), aot.lse(m, -1), aot.lse(m, axis=-1)):
        np.testing.assert_allclose(got, want, rtol=1e-14)
    # a NumPy i32 axis is its value, as for dsl.load's total (it was another
    # signature, shown as "total(f64[2, 3], 0)", which no --sig could give)
    for got in (aot.total(m, np.int32(0)), aot.total(m, axis=np.int32(0))):
        np.testing.assert_array_equal(got, [1.0, 5.0, 25.0])
    for got in (aot.total(X), aot.total(X, None), aot.total(X, axis=None)):
        np.testing.assert_allclose(got, np.sum(X * X), rtol=1e-14)
    # (another value is another program: no note that the call passes axis,
    # which passing -1 satisfies)
    with pytest.raises(dsl.ArgumentError, match=r"lse\(\) was compiled for lse\(f64\[:, :\]\); "
                                                r"this call is lse\(f64\[2, 3\], 0\); add it "
                                                r"with gradc compile --sig$"):
        aot.lse(m, 0)


def test_a_defaulted_parameter_no_signature_serves_is_an_argument_error(aot):
    np.testing.assert_array_equal(aot.scaled(X, 2.0), X * 2)
    with pytest.raises(dsl.ArgumentError, match=r"scaled\(\) was compiled for scaled\(f64\[:\], "
                       r"f64\); this call is scaled\(f64\[3\]\); add it with gradc compile "
                       r"--sig \(this call leaves out s: a signature serves only calls that "
                       r"pass the defaulted parameters it gives\)"):
        aot.scaled(X)
    with pytest.raises(dsl.ArgumentError, match=r"this call is loss\(f32\[3\], f32\[3\], "
                                                r"f32\[3\]\); add it with gradc compile --sig$"):
        aot.loss(*(a.astype(np.float32) for a in (W, X, T)))
    # loss(f64[n], f64[n], f64[n], f64) passes scale too: the call differs in
    # its dtype, and the note that it passes scale misled
    with pytest.raises(dsl.ArgumentError, match=r"this call is loss\(f64\[3\], f64\[3\], "
                                                r"f64\[3\], f32\); add it with gradc compile --sig$"):
        aot.loss(W, X, T, np.float32(2.0))


def test_a_left_out_default_takes_its_annotated_dtype_as_when_loaded(aot, loaded):
    # `a: f64 = 0.5` left out was a weakly typed 0.5: f32 x gave f32
    x = np.array([1.5, -3.0], np.float32)
    for out in (aot.anchored(x), loaded.anchored(x)):
        assert out.dtype == np.float64
        np.testing.assert_array_equal(out, [0.75, -1.5])


def test_to_torch_of_a_compiled_function_trains(aot):
    torch = optional_module("torch", "torch")
    w = torch.tensor(W, requires_grad=True)
    f = dsl.to_torch(aot.loss)
    optimizer = torch.optim.SGD([w], lr=0.1)
    want = W.copy()
    for _ in range(3):
        optimizer.zero_grad()
        f(w, torch.tensor(X), torch.tensor(T)).backward()
        optimizer.step()
        want -= 0.1 * central_difference(numpy_loss, [want], 0)
    np.testing.assert_allclose(w.detach().numpy(), want, rtol=1e-8)
    # no tensor requires grad: the call alone
    np.testing.assert_allclose(dsl.to_torch(aot.loss)(*map(torch.tensor, (W, X, T))).item(),
                               numpy_loss(W), rtol=1e-14)


def test_to_torch_of_a_compiled_gradient_and_what_needs_the_ir(aot, loaded):
    torch = optional_module("torch", "torch")
    args = [torch.tensor(W, requires_grad=True), torch.tensor(X), torch.tensor(T)]
    value, grad = dsl.to_torch(dsl.value_and_grad(aot.loss))(*args)
    np.testing.assert_allclose(value.item(), numpy_loss(W), rtol=1e-14)
    np.testing.assert_allclose(grad.detach().numpy(), dsl.grad(loaded.loss)(W, X, T),
                               rtol=1e-14)
    needs_ir = r"needs the IR of loss\(\).*load the .grad file with dsl.load"
    with pytest.raises(dsl.ArgumentError, match=r"differentiating to_torch\(value_and_grad\("
                                                r"loss\)\) \(a second derivative\) " + needs_ir):
        grad.sum().backward()
    out = dsl.to_torch(aot.loss)(*args)
    (first,) = torch.autograd.grad(out, args[0], create_graph=True)
    with pytest.raises(dsl.ArgumentError, match=r"differentiating the backward of to_torch\("
                                                r"loss\) \(a second derivative\) " + needs_ir):
        first.sum().backward()
    with pytest.raises(dsl.ArgumentError, match=r"torch.func transform .*" + needs_ir):
        torch.func.grad(dsl.to_torch(aot.loss))(*map(torch.tensor, (W, X, T)))


def test_to_jax_of_a_compiled_function_under_jit(aot, loaded):
    jax = optional_module("jax", "jax")
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        jnp = jax.numpy
        args = [jnp.asarray(a) for a in (W, X, T)]
        value, grad = jax.jit(jax.value_and_grad(dsl.to_jax(aot.loss)))(*args)
        np.testing.assert_allclose(value, numpy_loss(W), rtol=1e-14)
        np.testing.assert_allclose(grad, central_difference(numpy_loss, [W], 0), rtol=1e-7)
        value, grad = jax.jit(dsl.to_jax(dsl.value_and_grad(aot.loss)))(*args)
        np.testing.assert_allclose(grad, dsl.grad(loaded.loss)(W, X, T), rtol=1e-14)
        with pytest.raises(dsl.ArgumentError, match=r"a second derivative \(or forward mode\) "
                                                    r"of to_jax\(loss\) needs the IR of loss"):
            jax.hessian(dsl.to_jax(aot.loss))(*args)
    finally:
        jax.config.update("jax_enable_x64", previous)


def test_to_jax_of_a_compiled_function_inside_shard_map(aot, loaded):
    # data-parallel: x and t sharded over the mesh axis, w replicated.  The
    # callbacks' results were typed replicated, so jax.grad was JAX's
    # "Custom VJP bwd rule must produce an output with the same type" error
    # (and its value, for out_specs=P(), device 0's loss for every device's)
    jax = optional_module("jax", "jax")
    if not hasattr(jax, "shard_map"):
        pytest.skip("jax.shard_map is JAX 0.7's")
    from jax.sharding import Mesh, PartitionSpec as P
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        mesh = Mesh(np.array(jax.devices()[:1]), ("d",))  # (the test process has one CPU device)
        f = dsl.to_jax(aot.loss)
        step = jax.jit(jax.shard_map(lambda w, x, t: jax.grad(f, argnums=(0, 1))(w, x, t),
                                     mesh=mesh, in_specs=(P(), P("d"), P("d")),
                                     out_specs=(P(), P("d"))))
        gw, gx = step(W, X, T)
        expected = dsl.grad(loaded.loss, wrt=(0, 1))(W, X, T)
        np.testing.assert_allclose(gw, expected[0], rtol=1e-14)
        np.testing.assert_allclose(gx, expected[1], rtol=1e-14)
    finally:
        jax.config.update("jax_enable_x64", previous)


def test_to_jax_of_a_compiled_function_takes_a_python_float_under_jit(aot):
    # with jax_enable_x64, jit makes 3.0 a weakly typed f64 tracer, which
    # was bound as an f64 array: "weighted() was compiled for weighted(f32[:],
    # f32); this call is weighted(f32[3], f64)", where the eager call ran
    jax = optional_module("jax", "jax")
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        f, x = dsl.to_jax(aot.weighted), jax.numpy.asarray([0.5, -2.0], jax.numpy.float32)
        for y in (f(x, 3.0), jax.jit(f)(x, 3.0)):
            assert y.dtype == np.float32
            np.testing.assert_array_equal(y, np.float32([1.5, -6.0]))
    finally:
        jax.config.update("jax_enable_x64", previous)


def test_to_jax_of_a_compiled_function_takes_numbers_as_jit_does_without_x64(aot):
    # without x64, jit (or jnp.asarray) makes 3 a weakly typed i32, which was
    # bound as an i32 array ("this call is weighted(f32[3], i32)"), where the
    # call with 3 ran; and np.float64(3.0) for s: f32 was refused eagerly
    # ("has dtype f64, but its annotation says f32") where jit narrows it,
    # as to_jax of the loaded function takes it
    jax = optional_module("jax", "jax")
    assert not jax.config.jax_enable_x64
    f, x = dsl.to_jax(aot.weighted), jax.numpy.asarray([0.5, -2.0, 1.0], jax.numpy.float32)
    for y in (f(x, jax.numpy.asarray(3)), f(x, 3), f(x, np.float64(3.0))):
        assert y.dtype == np.float32
        np.testing.assert_array_equal(y, np.float32([1.5, -6.0, 3.0]))
    # a PRNG key (dtype key<fry>, no NumPy dtype) was NumPy's TypeError
    with pytest.raises(dsl.ArgumentError, match=r"argument 's' of to_jax\(weighted\) is a JAX "
                                                "array of dtype key<fry>"):
        f(x, jax.random.wrap_key_data(np.zeros(2, np.uint32)))


def test_to_jax_of_a_compiled_function_takes_half_precision_as_float32(aot):
    # (refused: "argument 0 of to_jax(weighted) is a JAX array of dtype
    # bfloat16", where to_jax of the loaded function and to_torch of this
    # one cast it to the float32 the signature was compiled for)
    jax = optional_module("jax", "jax")
    jnp = jax.numpy
    f, x = dsl.to_jax(aot.weighted), jnp.asarray([0.5, -2.0, 1.25], jnp.bfloat16)
    y = f(x, 3.0)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, np.float32([1.5, -6.0, 3.75]))
    g = jax.grad(lambda x: f(x, 3.0).sum())(x)
    assert g.dtype == jnp.bfloat16  # (through JAX's cast, in the array's dtype)
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.float32([3.0, 3.0, 3.0]))


def test_to_jax_of_a_compiled_function_refuses_a_symbolic_shape(aot):
    # (NumPy's TypeError "'_DimExpr' object cannot be interpreted as an integer")
    jax = optional_module("jax", "jax")
    f = dsl.to_jax(aot.weighted)
    x = jax.ShapeDtypeStruct(jax.export.symbolic_shape("n"), jax.numpy.float32)
    with pytest.raises(dsl.ArgumentError, match=r"argument 'x' of to_jax\(weighted\) has the "
                                                "symbolic shape"):
        jax.eval_shape(f, x, 3.0)
    out = jax.eval_shape(f, jax.ShapeDtypeStruct((4,), jax.numpy.float32), 3.0)
    assert out.shape == (4,) and out.dtype == np.float32


def test_to_jax_of_a_compiled_function_annotated_64_bit_says_to_enable_x64(aot):
    # a NumPy f64 array (which JAX makes f32) was refused as "dtype f32, but
    # its annotation says f64", which the caller had not passed, where to_jax
    # of the loaded function says why
    jax = optional_module("jax", "jax")
    assert not jax.config.jax_enable_x64
    for x in (np.ones(3), jax.numpy.ones(3)):
        with pytest.raises(dsl.ArgumentError, match=r"argument 'x' of doubled\(\) is annotated "
                                                    "f64, and without jax_enable_x64 JAX makes "
                                                    "every float array f32; enable it"):
            dsl.to_jax(aot.doubled)(x)
    np.testing.assert_array_equal(aot.doubled(np.ones(3)), [2.0, 2.0, 2.0])


def test_to_jax_of_a_compiled_function_refuses_a_masked_array(aot):
    """JAX's own ValueError reached the caller (the bridge made the NumPy
    array a JAX array before binding refused it)."""
    optional_module("jax", "jax")
    masked = np.ma.masked_array(X, mask=[False, True, False])
    with pytest.raises(dsl.ArgumentError, match=r"argument 'x' of to_jax\(scaled\) is a masked"):
        dsl.to_jax(aot.scaled)(masked, 2.0)

def test_transforms_without_compiled_programs_say_to_load_the_file(aot):
    for transform in (dsl.vmap, dsl.jacfwd, dsl.hessian):
        with pytest.raises(dsl.ArgumentError, match=r"needs the IR of loss\(\).*dsl.load"):
            transform(aot.loss)
    with pytest.raises(dsl.ArgumentError, match=r"needs the IR of loss\(\).*dsl.load"):
        dsl.jvp(aot.loss, (W, X, T), (W, X, T))
    with pytest.raises(dsl.ArgumentError, match=r"grad\(\) needs the IR of loss\(\) to "
                                                r"differentiate grad\(loss\) \(a second"):
        dsl.grad(dsl.grad(aot.loss))


def test_a_function_no_signature_named_is_a_clear_attribute_error(aot):
    with pytest.raises(AttributeError, match=r"unused\(\) of \S+ was not compiled: no --sig of "
                                             r"gradc compile named it"):
        aot.unused
    assert not hasattr(aot, "nothing") and "unused" not in aot.functions


def test_bridged_compiled_functions_pickle_by_reference(aot, monkeypatch):
    torch = optional_module("torch", "torch")
    monkeypatch.setitem(sys.modules, aot.__name__, aot)
    f = pickle.loads(pickle.dumps(dsl.to_torch(dsl.value_and_grad(aot.loss))))
    assert f.f.f is aot.loss
    np.testing.assert_allclose(f(*map(torch.tensor, (W, X, T)))[0].item(), numpy_loss(W),
                               rtol=1e-14)


# A fresh process imports a compiled module from another working
# directory and says how many of its kernels' machine code Numba loaded
# from the cache beside it, and how many it compiled.
FRESH = """
import sys, warnings
import numpy as np
warnings.simplefilter("error")  # (a cache that cannot be read warns)
sys.path.insert(0, sys.argv[1])
import train
from gradlang.runtime import loader
assert np.allclose(train.total(np.array([1.0, 2.0])), 5.0)
stats = [v.stats for m in loader._modules.values() for v in vars(m).values()
         if hasattr(v, "stats")]
print(sum(sum(s.cache_hits.values()) for s in stats),
      sum(sum(s.cache_misses.values()) for s in stats))
"""


def test_a_moved_compiled_directory_keeps_its_machine_code(aot, out, tmp_path):
    aot.total(X)  # (compiled and cached beside the module)
    moved = tmp_path / "elsewhere"
    shutil.copytree(out, moved)
    for path in moved.rglob("*"):  # copied, as by cp or an installer: new mtimes
        os.utime(path, (1e9, 1e9))
    # (from another working directory: the module's own imports nothing from it)
    done = subprocess.run([sys.executable, "-c", FRESH, str(moved)], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    hits, misses = map(int, done.stdout.split())
    assert hits >= 1 and misses == 0


def test_a_compiled_functions_errors_are_at_its_definition(aot, out):
    # (they named no place: "error: doubled() was compiled for ...")
    where = str(out.parent / "train.grad")
    with pytest.raises(dsl.ArgumentError) as info:
        aot.doubled(X.astype(np.int64))
    assert str(info.value) == (f"{where}:21:5: error: argument 'x' of doubled() has dtype i64, "
                               "but its annotation says f64")
    with pytest.raises(dsl.ArgumentError) as info:
        aot.scaled(X.astype(np.float32), 2.0)
    assert str(info.value).startswith(f"{where}:12:5: error: scaled() was compiled for "
                                      "scaled(f64[:], f64); this call is scaled(f32[3], "), \
        str(info.value)
    with pytest.raises(dsl.ArgumentError) as info:
        dsl.grad(aot.weighted)(np.ones(2, np.float32), None)
    assert str(info.value).startswith(f"{where}:18:5: error: "), str(info.value)
    np.testing.assert_array_equal(dsl.grad(aot.doubled)(X), np.full(3, 2.0))
