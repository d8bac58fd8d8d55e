"""The CUDA kernels compile for a real GPU (PTX for sm_90), without one.

Numba's simulator, which runs the other CUDA tests where there is no GPU,
runs kernels as Python: it accepts what CUDA compilation rejects (Python
objects, functions CUDA lacks, exceptions, recursion, mixed types).  This
test compiles with NVVM, which needs no GPU: (1) every elementwise op's
kernel in f32, f64 and i64 (where the op takes integers), from the codegen
and its kernel signatures; (2) every kernel a set of programs launches on
the simulator (examples and standard-library functions in value, gradient,
second-order and jvp forms, f32 and f64: matmul, gathers, scatter-adds,
loops, long sums), with the argument types of the launch, and the runtime's
own kernels among them.  The compiles run in a subprocess, which imports
Numba's real CUDA target instead of the simulator.

Skipped where NVVM is not installed (CI): `pip install 'numba-cuda[cu12]'`
installs it (~700 MB).  On a machine with a GPU the other CUDA tests
compile every kernel they launch, and this one is skipped.
"""
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dsl
from gradlang.compiler.modules import STDLIB

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def nvvm_missing() -> "str | None":
    """Why NVVM and libdevice cannot be used here, or None."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        return "not on the simulator: the CUDA tests compile every kernel for the GPU"
    try:
        from cuda import pathfinder
        pathfinder.load_nvidia_dynamic_lib("nvvm")
        pathfinder.find_bitcode_lib("device")
    except Exception as e:  # ImportError, or pathfinder's not-found errors
        return f"needs NVVM: pip install 'numba-cuda[cu12]' ({type(e).__name__})"
    return None


MISSING = nvvm_missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))

# Run without the simulator: CUDA's real compiler, for compute capability
# 9.0 (H100/H200).  There is no GPU, so the runtime's check for one and the
# device functions' query of the current device's capability are answered.
COMPILE = r"""
import pickle, sys, types
from numba import cuda
cuda.is_available = lambda: True
import numba.cuda.dispatcher
numba.cuda.dispatcher.get_current_device = lambda: types.SimpleNamespace(
    compute_capability=(9, 0))
import gradlang.runtime.cuda as runtime
from gradlang.compiler.builder import Builder
from gradlang.compiler.codegen import generate
from gradlang.compiler.ir import TensorType, Var
from gradlang.compiler.ops import OPS

launches, sources = pickle.load(open(sys.argv[1], "rb"))
failures, compiled = [], 0

def compile_ptx(fn, signature, what):
    global compiled
    try:
        cuda.compile_ptx(fn, signature, cc=(9, 0))
        compiled += 1
    except Exception as e:
        failures.append(f"{what} {signature}: {type(e).__name__}: {e}"[:2000])

modules = {"gradlang.runtime.cuda": runtime}
for module, kernel, signature in launches:
    if module not in modules:
        modules[module] = types.ModuleType(module)
        exec(compile(sources[module], module, "exec"), modules[module].__dict__)
    compile_ptx(getattr(modules[module], kernel).py_func, signature, f"{module}.{kernel}")

for name, op in sorted(OPS.items()):
    if op.kind != "elementwise" or op.arity < 1:
        continue
    for dtype in ("f32", "f64") + (() if op.float_only else ("i64",)):
        b = Builder()
        xs = [Var(TensorType("bool" if d == "bool" else dtype, (4,)), f"x{i}")
              for i, d in enumerate(op.domains)]
        try:
            out = b.bind(name, *xs)
        except Exception:  # an op that does not take these types
            continue
        generated = generate(b.function(name, xs, [out]), runtime.TARGET)
        namespace = {}
        exec(generated.kernel_source, namespace)
        for kernel, signature in generated.kernel_signatures:
            compile_ptx(namespace[kernel].py_func, f"void({signature})", f"{name} {dtype}")
print(compiled, "compiled")
print("\n".join(failures))
sys.exit(1 if failures else 0)
"""


def exercise(f, args, tangent_of: int = 0) -> None:
    """f's value, value and gradient, Hessian-vector product and jvp."""
    f(*args)
    dsl.value_and_grad(f)(*args)
    dsl.hvp(f, wrt=tangent_of)(*args, np.ones_like(args[tangent_of]))
    tangents = [np.ones_like(a) if i == tangent_of else None for i, a in enumerate(args)]
    dsl.jvp(f, args, tangents)


def launched_kernels(monkeypatch) -> dict:
    """(module, kernel, Numba argument types) of each launch from now on
    (the simulator's launch, recorded before it runs), and the sources of
    the generated kernel modules."""
    from numba import typeof
    from numba.cuda.simulator import kernel as simulated
    launches: dict = {"launches": {}, "sources": {}}
    launch = simulated.FakeCUDAKernel.__call__

    def recorded(self, *args):
        if not self._device and not simulated._kernel_context:
            module = self.fn.__module__
            types = tuple(getattr(a, "_numba_type_", None) or typeof(a) for a in args)
            launches["launches"][(module, self.fn.__name__, types)] = None
            if module.startswith("gradk_"):
                launches["sources"][module] = Path(sys.modules[module].__file__).read_text()
        return launch(self, *args)
    monkeypatch.setattr(simulated.FakeCUDAKernel, "__call__", recorded)
    return launches


def test_every_kernel_compiles_to_ptx_for_sm_90(tmp_path, monkeypatch):
    launches = launched_kernels(monkeypatch)
    rng = np.random.default_rng(0)
    std = dsl.load(STDLIB / "std.grad", target="cuda", host_results=True)
    x = rng.normal(size=(2, 3))
    for name in ("softplus", "logsumexp", "gelu", "leaky_relu", "norm"):
        for dtype in (np.float64, np.float32):
            exercise(getattr(std, name), (x.astype(dtype),))

    def example(name):
        return dsl.load(EXAMPLES / f"{name}.grad", target="cuda", host_results=True)
    exercise(example("dense").loss, tuple(rng.normal(size=s) for s in
                                          [(3, 4), (4, 2), (2,), (3, 2)]))
    exercise(example("embedding").embed, (rng.normal(size=(4, 2)), np.array([1, -1, 1, 0])))
    exercise(example("cross_entropy").pick, (rng.normal(size=(3, 4)), np.array([3, 0, -1])))
    exercise(example("segment_pool").pool, (rng.normal(size=(4, 2)), np.array([2, 0, 2, -3]),
                                            3))
    exercise(example("heat").heat, (rng.uniform(size=5), 0.2, 3))
    exercise(example("rnn").rnn, (rng.normal(size=(3, 2)), rng.normal(size=2),
                                  rng.normal(size=(2, 2)) / 2))
    # a row long enough for the block-level tree (4 * THREADS), and its max
    long = dsl.loads("def f(x):\n    return sum(x) + max(x)\n", target="cuda",
                     host_results=True)
    for dtype in (np.float64, np.float32):
        exercise(long.f, (rng.normal(size=40).astype(dtype),))

    # scans (forward and reversed), selects of mixed types, arange, one_hot
    scans = dsl.loads("def f(x, k: i32[n]):\n    c = cumsum(x * x, axis=0) + cumsum(k)\n"
                      "    h = one_hot(k, x.shape[0]) @ (x * arange(x.shape[0]))\n"
                      "    return where(x > 0, c, k) + h\n", target="cuda", host_results=True)
    for dtype in (np.float64, np.float32):
        exercise(scans.f, (rng.normal(size=6).astype(dtype), np.arange(6, dtype=np.int32)))

    # batched, broadcast products and einsum
    products = dsl.loads('def f(q, k):\n    s = einsum("bqd,bkd->bqk", q, k)\n'
                         '    return sum(s @ k) + sum(k @ transpose(q[0]))'
                         ' + sum(q[0] @ transpose(k, (0, 2, 1)))\n',
                         target="cuda", host_results=True)
    for dtype in (np.float64, np.float32):
        exercise(products.f, (rng.normal(size=(2, 3, 4)).astype(dtype),
                              rng.normal(size=(2, 3, 4)).astype(dtype)))

    # integer products accumulate in i64 (their own kernel)
    ints = dsl.loads("def f(a, b):\n    return a @ b\n", target="cuda", host_results=True)
    for dtype in (np.int64, np.int32):
        ints.f(np.arange(6, dtype=dtype).reshape(2, 3), np.arange(6, dtype=dtype).reshape(3, 2))

    # a convolution: padding, strided slices, the im2col product and its gradient
    conv = dsl.loads("def f(x, w):\n    return sum(conv2d(x, w, stride=2, padding=1))\n",
                     target="cuda", host_results=True)
    for dtype in (np.float64, np.float32):
        exercise(conv.f, (rng.normal(size=(2, 3, 5, 5)).astype(dtype),
                          rng.normal(size=(4, 3, 3, 3)).astype(dtype)))

    # pooling: tiled windows reduced, padded windows' -inf mask, stacked maxima
    pool = dsl.loads("def f(x):\n    return sum(max_pool2d(x, 2)) + sum(avg_pool2d(x, 3, 2, 1))"
                     " + sum(max_pool2d(x, 3, 2, 1))\n", target="cuda", host_results=True)
    for dtype in (np.float64, np.float32):
        exercise(pool.f, (rng.normal(size=(2, 3, 5, 5)).astype(dtype),))

    recorded = tmp_path / "launches.pkl"
    recorded.write_bytes(pickle.dumps((list(launches["launches"]), launches["sources"])))
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    done = subprocess.run([sys.executable, "-c", COMPILE, str(recorded)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-5000:]
    assert int(done.stdout.split()[0]) >= len(launches["launches"])
