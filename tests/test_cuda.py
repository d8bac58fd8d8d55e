"""The CUDA target (on Numba's simulator unless a GPU is present): a clear
error without numba-cuda, and compiled modules.  Every primitive runs on
every target in `tests/test_ops.py`, every example in
`tests/test_examples.py`."""
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from gradlang.runtime import cuda as rcuda

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_missing_numba_cuda_is_one_clear_error(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "numba_cuda" else real(name, *a))
    with pytest.raises(dsl.GradError, match=r"needs the numba-cuda package: pip install "
                                            r"'gradlang\[cuda\]'"):
        dsl.load(EXAMPLES / "log1pexp.grad", target="cuda")


def test_a_numba_cuda_that_cannot_compile_with_this_numpy_is_one_clear_error(monkeypatch):
    # numba-cuda 0.30.4 under NumPy 2.5 (as on an H200 machine) raised
    # AttributeError: module 'numpy' has no attribute 'row_stack', from deep
    # inside its first kernel compile, at the user's first call.
    import importlib
    real = importlib.import_module

    def numpy_2_5(name, *args):
        if name == "numba.cuda.cudaimpl":
            raise AttributeError("module 'numpy' has no attribute 'row_stack'")
        return real(name, *args)
    monkeypatch.setattr(importlib, "import_module", numpy_2_5)
    with pytest.raises(dsl.GradError, match=r"numba-cuda \S+ cannot compile kernels with "
                                            r"NumPy .*row_stack.*an older NumPy"):
        rcuda._require_kernel_compiler()


def test_compiled_module_for_cuda(tmp_path, monkeypatch):
    from dsl.aot import compile_module
    compile_module(str(EXAMPLES / "log1pexp.grad"), str(tmp_path), ["log1pexp(f64[:])"],
                   target="cuda")
    monkeypatch.syspath_prepend(str(tmp_path))
    # not a `log1pexp` an earlier test on this worker imported (the .grad import hook)
    monkeypatch.delitem(sys.modules, "log1pexp", raising=False)
    import importlib
    compiled = importlib.import_module("log1pexp")
    x = np.linspace(-5, 100, 6)
    v, g = compiled.log1pexp.value_and_grad(x)
    cpu = dsl.load(EXAMPLES / "log1pexp.grad")
    v_c, g_c = dsl.value_and_grad(cpu.log1pexp)(x)
    np.testing.assert_allclose(rcuda.to_host(v), v_c, rtol=1e-12)
    np.testing.assert_allclose(rcuda.to_host(g), g_c, rtol=1e-12)


def test_const_integer_argument_is_static_on_cuda():
    # A const argument picks the program by its value, so it stays on the
    # host: copied to the device, it was no longer static, and an axis
    # given by it was "not a compile-time integer".
    m = dsl.loads("def f(x, axis: const i64):\n    return sum(x, axis=axis)\n",
                  target="cuda", host_results=True)
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(m.f(x, 1), x.sum(axis=1))
    np.testing.assert_array_equal(m.f(x, 0), x.sum(axis=0))


def test_a_device_array_that_is_not_c_contiguous_is_an_argument_error():
    # device arrays are taken without a copy, and the drivers hold
    # C-contiguous arrays only: a scatter-add into a Fortran-ordered one
    # raised Numba's ValueError (on a GPU, any reshape of one would)
    from numba import cuda
    m = dsl.loads("def f(x, idx):\n    return scatter_add(x, idx, x[idx])\n", target="cuda",
                  host_results=True)
    x, idx = np.arange(6.0).reshape(3, 2), np.array([0, 2])
    expected = x.copy()
    np.add.at(expected, idx, x[idx])
    np.testing.assert_array_equal(m.f(cuda.to_device(x), idx), expected)
    np.testing.assert_array_equal(m.f(np.asfortranarray(x), idx), expected)  # host: copied
    for device in (cuda.to_device(np.asfortranarray(x)), cuda.to_device(np.ones((3, 4)))[:, ::2]):
        # (at f's definition, as every bad argument is: the target's check
        # raised the error with no file, line or caret)
        with pytest.raises(dsl.ArgumentError, match=r"<string>:1:5: error: argument 'x' of f\(\) "
                                                    r"is a device array that is not C-contiguous"
                                                    r"(.|\n)*\n    def f\(x, idx\):\n        \^"):
            m.f(device, idx)
        with pytest.raises(dsl.ArgumentError, match="<string>:1:5: .*not C-contiguous"):
            dsl.grad(m.f)(device, idx)
        # a tangent too, named as the caller knows it (not the jvp's own `$t0`)
        with pytest.raises(dsl.ArgumentError, match=r"<string>:1:5: error: the tangent for 'x' of "
                                                    r"f\(\) is a device array that is not "
                                                    r"C-contiguous"):
            dsl.jvp(m.f, (cuda.to_device(np.ones((3, 2))), idx), (device, None))
        # a Jacobian's argument as its caller named it (was 'stacked jvp(f)')
        with pytest.raises(dsl.ArgumentError, match=r"<string>:1:5: error: argument 'x' of "
                                                    r"jacfwd\(f\) is a device array"):
            dsl.jacfwd(m.f)(device, idx)


def test_long_f32_sums_accumulate_in_f64_on_cuda():
    # A row of 4 * THREADS or more sums by a tree whose accumulator started
    # as the Python float 0.0: under NumPy 2's promotion (and so on the
    # simulator) 0.0 + f32 stays f32, and 2e4 values of 0.1 summed to
    # 1999.9786 instead of the f64 accumulation's 2000.0.
    m = dsl.loads("def f(x):\n    return sum(x)\ndef g(x):\n    return max(x, axis=1)\n",
                  target="cuda", host_results=True)
    x = np.full(20_000, 0.1, np.float32)
    assert m.f(x) == np.float32(x.astype(np.float64).sum())
    rows = np.random.default_rng(0).normal(size=(2, 5000)).astype(np.float32)
    np.testing.assert_array_equal(m.g(rows), rows.max(axis=1))


def test_broadcasts_along_middle_axes_on_cuda():
    # (B, 1, D) read over (B, T, D) in runs (a term per run of the loop's
    # axes it has: `shapes.kept_runs`), the runs shorter than its period
    # where another input's is shorter
    m = dsl.loads("def f(x, y, z):\n    return x * y + z, sum(x * y)\n", target="cuda",
                  host_results=True)
    rng = np.random.default_rng(5)
    x, y, z = (rng.normal(size=s) for s in ((2, 3, 4, 5), (2, 1, 4, 5), (2, 3, 4, 1)))
    out, total = m.f(x, y, z)
    np.testing.assert_array_equal(out, x * y + z)
    np.testing.assert_allclose(total, np.sum(x * y), rtol=1e-13)
    # along both sides of its axes (a channel's bias), and with separate
    # runs of them (read on along a row, or held)
    for y, z in ((rng.normal(size=(3, 1, 1)), rng.normal(size=(1, 1, 4, 1))),
                 (rng.normal(size=(1, 3, 1, 5)), rng.normal(size=(2, 1, 4, 1)))):
        out, total = m.f(x, y, z)
        np.testing.assert_array_equal(out, x * y + z)
        np.testing.assert_allclose(total, np.sum(x * y), rtol=1e-13)


def test_a_column_reduction_spreads_over_the_grid(monkeypatch):
    # A sum or max over axis 0 ran one thread per column, each down the
    # whole column: a bias gradient over a batch of 10**6 rows and 10
    # columns used 10 threads of a GPU's thousands.  The column now splits
    # into runs of RUN rows, one thread each, whose results are reduced
    # again (each run's max keeps a NaN; int sums stay exact).
    launched = []
    launch = rcuda._launch
    monkeypatch.setattr(rcuda, "_launch", lambda k, n, *a: launched.append(n) or launch(k, n, *a))
    m = dsl.loads("def f(x):\n    return sum(x, axis=0), max(x, axis=0)\n", target="cuda",
                  host_results=True)
    rows = 2 * rcuda.THREADS * rcuda.MAX_BLOCKS * rcuda.RUN + 3
    x = np.random.default_rng(5).normal(size=(rows, 2))
    x[rows - 2, 1] = np.nan
    total, most = m.f(x)
    np.testing.assert_allclose(total[0], x[:, 0].sum(), rtol=1e-12)
    assert np.isnan(total[1])
    np.testing.assert_array_equal(most, x.max(axis=0))
    # threads, not the 2 columns: runs of a whole number of rows fill at
    # least half the grid (on an H200, 522,248 of its 524,288 threads)
    grid = rcuda.THREADS * rcuda.MAX_BLOCKS
    assert grid // 2 < max(launched) <= grid
    ints = np.arange(3 * rows, dtype=np.int64).reshape(rows, 3) * (2**40 + 1)
    np.testing.assert_array_equal(m.f(ints)[0], ints.sum(axis=0))


def test_kernels_gridded_by_rows_stride_past_the_grid_limit():
    # A grid holds at most 65535 blocks along y on every GPU, and the long-row
    # reductions and the matmul put rows there: (10**5, 1024) row sums could
    # not launch.  The kernels stride over rows; the simulator's cap of
    # MAX_GRID_Y blocks makes these few rows take the stride.
    assert rcuda.MAX_GRID_Y == (2 if rcuda.SIMULATOR else 65535)
    m = dsl.loads("def rows(x):\n    return sum(x, axis=1), max(x, axis=1)\n"
                  "def mm(a, b):\n    return a @ b\n", target="cuda", host_results=True)
    rng = np.random.default_rng(3)
    rows = 2 * rcuda.MAX_GRID_Y + 1
    x = rng.normal(size=(rows, 4 * rcuda.THREADS))
    x[1, 7] = np.nan  # a max keeps NaN, in the strided rows too
    total, most = m.rows(x)
    # (a sum near 0 is relative to the row's size: a GPU's tree and NumPy's
    # pairwise sum round differently, 2e-14 apart on an H200)
    np.testing.assert_allclose(total, x.sum(axis=1), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(most, x.max(axis=1))
    a = rng.normal(size=(rcuda.TILE * (2 * rcuda.MAX_GRID_Y + 1) - 1, 5))
    b = rng.normal(size=(5, rcuda.TILE + 3))
    np.testing.assert_allclose(m.mm(a, b), a @ b, rtol=1e-12, atol=1e-12)
    # and their gradients, which run the same kernels transposed
    ga, gb = dsl.grad(m.mm, wrt=(0, 1))(a, b)
    np.testing.assert_allclose(ga, np.ones((a.shape[0], b.shape[1])) @ b.T, rtol=1e-12)
    np.testing.assert_allclose(gb, a.T @ np.ones((a.shape[0], b.shape[1])), rtol=1e-12)


@pytest.mark.parametrize("host_results", [False, True])
def test_a_tape_records_calls_on_host_arrays(host_results):
    # A call copied the watched host array to the device and asked the tape
    # about the copy: nothing was recorded, and gradient() said "the target
    # was not computed by a call recorded on this tape".  With host_results
    # the tape tracked the device results, not the host copies returned.
    m = dsl.loads("def f(x):\n    return x * x\ndef g(y):\n    return sum(sin(y))\n",
                  target="cuda", host_results=host_results)
    x = np.array([0.5, 1.0])
    with dsl.Tape() as outer:
        outer.watch(x)
        with dsl.Tape() as inner:
            inner.watch(x)
            z = m.g(m.f(x))
        g = inner.gradient(z, x)
    h = outer.gradient(g, x)
    if not host_results:
        g, h = rcuda.to_host(g), rcuda.to_host(h)
    np.testing.assert_allclose(g, 2 * x * np.cos(x * x), rtol=1e-12)
    np.testing.assert_allclose(h, 2 * np.cos(x * x) - 4 * x * x * np.sin(x * x), rtol=1e-12)


def test_pullback_takes_device_cotangents_and_refuses_a_wrong_one():
    # a device array of the output's shape and dtype goes to the backward as
    # it is; one of another shape or dtype is an ArgumentError saying so,
    # and a host one is copied over (d/dx log(1 + e^x) = sigmoid(x))
    m = dsl.load(EXAMPLES / "log1pexp.grad", target="cuda")
    x = np.linspace(-2.0, 2.0, 4)
    _, pullback = dsl.vjp(m.log1pexp, x)
    want = 2 / (1 + np.exp(-x))
    for ct in (rcuda.as_device(np.full(4, 2.0)), np.full(4, 2.0), 2.0):
        (g,) = pullback(ct)
        np.testing.assert_allclose(rcuda.to_host(g), want, rtol=1e-12)
    # (saying what it is: it said only what it must be)
    for bad, what in ((np.ones(3), r"shape \[3\] and dtype f64"),
                      (np.ones(4, np.float32), r"shape \[4\] and dtype f32")):
        with pytest.raises(dsl.ArgumentError, match="cotangent 0 of the pullback of log1pexp"
                                                    rf"\(\) is a device array of {what}, but "
                                                    r"must have shape \[4\] and dtype f64"):
            pullback(rcuda.as_device(bad))


def test_a_device_array_of_an_unsupported_dtype_says_which_dtypes_are():
    # as a host array's error does (it said only "has unsupported dtype
    # uint64"); a device array is not cast, as a host one is not either
    from numba import cuda
    m = dsl.loads("def f(x, i: i64[n]):\n    return x[i]\n", target="cuda")
    for x, i, name in ((np.ones(3), cuda.to_device(np.array([1], np.uint64)), "'i'"),
                       (cuda.to_device(np.ones(3, np.float16)), np.array([1]), "'x'")):
        with pytest.raises(dsl.ArgumentError, match=rf"<string>:1:5: error: argument {name} of "
                                                    r"f\(\) is a device array of unsupported "
                                                    r"dtype \w+; use float32, float64, int32, "
                                                    r"int64 or bool \(convert it on the device"):
            m.f(x, i)


def test_out_buffers_are_refused_on_cuda_with_what_to_do():
    # results are device arrays the call allocates: a NumPy buffer and a
    # device array were both refused as "must be a NumPy array of the cuda
    # target", which neither reading could satisfy
    from numba import cuda
    m = dsl.load(EXAMPLES / "log1pexp.grad", target="cuda")
    x = np.linspace(-1.0, 1.0, 4)
    for buffer in (np.full(4, 7.0), cuda.to_device(np.full(4, 7.0))):
        with pytest.raises(dsl.ArgumentError, match=r"out of log1pexp\(\) is a buffer, but on "
                                                    r"the cuda target a call allocates its "
                                                    r"results itself: pass None"):
            m.log1pexp(x, out=buffer)
        assert (np.asarray(buffer if isinstance(buffer, np.ndarray) else rcuda.to_host(buffer))
                == 7.0).all()
    np.testing.assert_allclose(rcuda.to_host(m.log1pexp(x, out=None)), np.logaddexp(0.0, x),
                               rtol=1e-12)


def _same_bits_or_both_nan(got, expected) -> bool:
    # (a GPU's NaN has no sign bit set: its bits are not NumPy's)
    return bool(np.isnan(got) and np.isnan(expected)) or \
        np.asarray(got).tobytes() == np.asarray(expected).tobytes()


@settings(max_examples=400, deadline=None)
@given(dtype=st.sampled_from([np.float32, np.float64]), data=st.data())
def test_the_gpus_floor_division_is_numpys_for_every_divisor_and_finite_dividend(dtype, data):
    """On a GPU, x // y and x % y of floats call runtime.cuda_math (NVPTX
    lowers LLVM's frem inexactly: 1e17 % 3.0 was 0 or 4); its functions,
    run as Python on exact fmod as libdevice's is, against NumPy's, at
    quotients up to overflow.  (The kernels run them on the simulator too:
    test_ops' bit-for-bit tests.)"""
    from gradlang.runtime import cuda_math
    width = 32 if dtype is np.float32 else 64
    finite = st.floats(allow_nan=False, allow_infinity=False, width=width)
    x = dtype(data.draw(st.one_of(finite, st.sampled_from([1e17, -1e30, 7.0, -0.0]))))
    y = dtype(data.draw(st.one_of(finite, st.sampled_from([3.0, -3.0, 0.0, -0.0, 0.1, np.inf,
                                                          -np.inf, np.nan]))))
    with np.errstate(all="ignore"):
        for device, numpy in ((cuda_math.floor_quotient, np.floor_divide),
                              (cuda_math.floor_remainder, np.remainder)):
            got = dtype(device.py_func(x, y, dtype(1)))
            assert _same_bits_or_both_nan(got, numpy(x, y)), (device.__name__, x, y, got)


def test_cuda_kernels_divide_floats_through_cuda_math_and_cpu_kernels_do_not():
    source = "def f(x, y):\n    return x // y, x % y\n"
    x = np.array([1e17, -7.5, 2.0])
    for target, through in (("cuda", True), ("cpu", False)):
        f = dsl.loads(source, target=target).f
        kernels = f.program(f.on_target(f.bind((x, x), {}))).generated.kernel_source
        assert ("math.floor_quotient(" in kernels) is through
        assert ("math.floor_remainder(" in kernels) is through


@pytest.mark.skipif(not rcuda.SIMULATOR, reason="the simulator's shared arrays only")
def test_a_blocks_threads_share_one_shared_array_on_the_simulator(monkeypatch):
    # The simulator allocated a block's shared array at the first call with no
    # lock: a thread switch between its lookup and its store gave threads
    # arrays of their own (a matmul's tiles, a reduction's tree: wrong values
    # now and then).  A lookup that sleeps makes that switch certain.
    import time
    from numba.cuda.simulator import kernelapi

    class SlowFirstLookup(dict):
        def __contains__(self, key):
            found = super().__contains__(key)
            if not found:
                time.sleep(0.002)
            return found

        def get(self, key, default=None):  # (the simulator's own lookup)
            value = super().get(key, default)
            if value is None:
                time.sleep(0.002)
            return value

    made = kernelapi.FakeCUDAShared.__init__

    def slow(self, *args):
        made(self, *args)
        self._allocations = SlowFirstLookup()
    monkeypatch.setattr(kernelapi.FakeCUDAShared, "__init__", slow)
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 9, 9)), rng.normal(size=(2, 9, 9))
    np.testing.assert_allclose(rcuda.to_host(rcuda.matmul(a, b)), a @ b, rtol=1e-13)
    x = rng.normal(size=(2, 40))  # rows long enough for the shared-memory tree
    np.testing.assert_allclose(rcuda.to_host(rcuda.reduce_sum(x, (1,))), x.sum(axis=1),
                               rtol=1e-13)


def test_an_i32_sum_that_wraps_is_numpys_on_the_simulator():
    # The runtime's sums of i32 accumulate in i64 and are cast back: that
    # cast wraps on a GPU (and in NumPy), where the simulator's store raised
    # an internal OverflowError.  The language's sum of i32 is i64, as
    # NumPy's, and does not wrap.
    x = np.array([[2**30, -2**31, 2**31 - 1], [2**30, -1, 2**31 - 1]], np.int32)
    np.testing.assert_array_equal(rcuda.to_host(rcuda.reduce_sum(x, (0,))),
                                  x.sum(axis=0, dtype=np.int32))
    m = dsl.loads("def f(x):\n    return sum(x, axis=0)\n", target="cuda", host_results=True)
    assert m.f(x).dtype == np.int64
    np.testing.assert_array_equal(m.f(x), x.sum(axis=0))


def test_an_integer_matmul_is_exact_and_wraps_as_numpys():
    # The tiled kernel accumulated every dtype in f64: an i64 product past
    # 2**53 lost its low bits (...63 came out ...62), and an i32 one that
    # wraps in NumPy overflowed the cast back (saturating on a GPU, an
    # OverflowError on the simulator).  Integers now accumulate in i64.
    m = dsl.loads("def f(a, b):\n    return a @ b\n", target="cuda", host_results=True)
    a = np.array([[2**40 + 1, 2], [3, -5]], np.int64)
    b = np.array([[2**13 + 1, 7], [1, 2**31 - 1]], np.int64)
    np.testing.assert_array_equal(m.f(a, b), a @ b)
    a32, b32 = np.array([[2**20, 3]], np.int32), np.array([[2**12], [1]], np.int32)
    got = m.f(a32, b32)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, a32 @ b32)


def test_a_device_array_for_a_const_integer_is_an_argument_error():
    # A `const i64` picks the program by its value; a device array there
    # was no static value, and the axis it gave was "not a compile-time
    # integer", a GradError at the sum instead of the argument.
    from numba import cuda
    m = dsl.loads("def f(x, a: const i64):\n    return sum(x, axis=a)\n"
                  "def g(x, b: const bool):\n    return x\n", target="cuda", host_results=True)
    x = np.arange(6.0).reshape(2, 3)
    for call in (lambda k: m.f(x, k), lambda k: dsl.grad(m.f)(x, k)):
        with pytest.raises(dsl.ArgumentError, match=r"<string>:1:5: error: argument 'a' of .*f\(\) "
                                                    r"is a device array, but a `const i64` "
                                                    r".*\(a Python int\)"):
            call(cuda.to_device(np.array(1)))
    # what to pass instead is a bool there (it said "a Python int")
    with pytest.raises(dsl.ArgumentError, match=r"<string>:3:5: error: argument 'b' of g\(\) is a "
                                                r"device array, but a `const bool` .*on the host "
                                                r"\(a Python bool\)"):
        m.g(x, cuda.to_device(np.array(True)))
    np.testing.assert_array_equal(m.f(x, 1), x.sum(axis=1))  # on the host: as before


def test_a_device_array_set_as_a_param_of_a_cpu_module_is_named_as_the_param():
    # It was refused as "argument 'w' of f()", an argument nobody passed.
    from numba import cuda
    m = dsl.loads("param w: f64[3]\ndef f(x):\n    return sum(x * w)\n")
    m.params["w"] = cuda.to_device(np.ones(3))
    for call, name in ((m.f, "f\\(\\)"), (dsl.grad(m.f), "grad\\(f\\)")):
        with pytest.raises(dsl.ArgumentError, match=rf"<string>:2:5: error: param 'w' read by "
                                                    rf"{name} is a GPU array, but this function "
                                                    r"runs on the CPU"):
            call(np.ones(3))
    m.params["w"] = np.array([1.0, 2.0, 3.0])
    assert m.f(np.ones(3)) == 6.0


def test_a_device_array_set_as_a_param_of_a_compiled_module_is_named_as_the_param(tmp_path):
    # As of a loaded module's (above), a gradc-compiled one's said
    # "argument 'w' of f()", an argument nobody passed.
    from numba import cuda

    from dsl.aot import compile_module
    from helpers import import_compiled
    source = tmp_path / "with_param.grad"
    source.write_text("param w: f64[3]\n\ndef f(x: f64[3]):\n    return sum(x * w)\n")
    m = import_compiled(compile_module(str(source), str(tmp_path / "out"), ["f(f64[3])"]))
    m.params["w"] = cuda.to_device(np.ones(3))
    for call, name in ((m.f, "f"), (dsl.grad(m.f), "f"), (m.f.vjp, "f")):
        with pytest.raises(dsl.ArgumentError, match=rf"error: param 'w' read by {name}\(\) is a "
                                                    "GPU array, but this function runs on the "
                                                    "CPU"):
            call(np.ones(3))
    m.params["w"] = np.array([1.0, 2.0, 3.0])
    assert m.f(np.ones(3)) == 6.0


def test_calls_from_several_threads_on_the_simulator():
    # The simulator runs one launch at a time, keeps a launch's grid on the
    # shared kernel object, and while a kernel runs makes this module's
    # `cuda` a fake of the device API: calls from two threads failed its
    # assert, found no `cuda.device_array`, or reduced on another call's
    # grid.  Rows of different lengths launch the tree on different grids.
    import threading
    m = dsl.loads("def f(x):\n    return sum(x * x, axis=1)\n", target="cuda",
                  host_results=True)
    xs = [np.random.default_rng(n).normal(size=(2, n)) for n in (33, 70, 40)]
    start, results = threading.Barrier(len(xs)), {}

    def work(k):
        start.wait()
        try:
            results[k] = [m.f(xs[k])]
        except Exception as err:  # (a thread's error is otherwise only printed)
            results[k] = err
    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, x in enumerate(xs):
        assert not isinstance(results[k], Exception), results[k]
        for got in results[k]:
            np.testing.assert_allclose(got, (x * x).sum(axis=1), rtol=1e-12)


def test_a_fused_kernel_takes_at_most_max_kernel_arrays_arrays():
    # A kernel's parameters hold at most 32764 bytes and Numba passes a 1-d
    # array in 56: the gradient of a sum over n inputs fused into one
    # kernel of 2n + 1 arrays (601 for 300 inputs, which NVVM refuses for
    # sm_90; the simulator compiles nothing and ran it).  Fusion now cuts a
    # loop at the target's `max_kernel_arrays` values read and made.
    import re
    n = 70
    source = ("def f(" + ", ".join(f"a{i}" for i in range(n)) + "):\n    return "
              + " + ".join(f"sin(a{i}) * a{(i + 1) % n}" for i in range(n)) + "\n")
    m = dsl.loads(source, target="cuda", host_results=True)
    a = np.random.default_rng(0).normal(size=(n, 3))
    g = dsl.grad(m.f, tuple(range(n)))
    kernels = g.program(g.on_target(g.bind(tuple(a), {}))).generated.kernel_source
    widest = max(len(params.split(",")) for params in re.findall(r"\ndef k_\w+\(([^)]*)\)", kernels))
    assert widest - 1 <= 128 < 2 * n  # (the first is n; 128: CUDA's max_kernel_arrays)
    # d/da_i: cos(a_i) a_(i+1) + sin(a_(i-1))
    want = np.cos(a) * np.roll(a, -1, axis=0) + np.sin(np.roll(a, 1, axis=0))
    np.testing.assert_allclose(np.array(g(*a)), want, rtol=1e-13)


def test_a_loop_carrying_many_arrays_runs_in_the_driver_on_cuda():
    # An elementwise loop runs in one kernel, an argument per carried value
    # and per result: 70 carried arrays took 140 (past max_kernel_arrays,
    # 128; a few hundred would not compile).  Such a loop now runs its
    # trips in the driver, over kernels fused within the limit.
    import re
    n = 70
    names = ", ".join(f"a{i}" for i in range(n))
    source = (f"def f({names}, k: i64):\n    for i in range(k):\n        {names} = "
              + ", ".join(f"a{(i + 1) % n} * 0.5 + sin(a{i})" for i in range(n))
              + "\n    return " + " + ".join(f"a{i}" for i in range(n)) + "\n")
    f = dsl.loads(source, target="cuda", host_results=True).f
    a = np.random.default_rng(0).normal(size=(n, 3))
    kernels = f.program(f.on_target(f.bind((*a, 3), {}))).generated.kernel_source
    widest = max(len(params.split(",")) for params in re.findall(r"\ndef k_\w+\(([^)]*)\)", kernels))
    assert widest - 1 <= 128  # (the first is n; 128: CUDA's max_kernel_arrays)
    want = a
    for _ in range(3):
        want = np.roll(want, -1, axis=0) * 0.5 + np.sin(want)
    np.testing.assert_allclose(f(*a, 3), want.sum(axis=0), rtol=1e-13)


def _address(a) -> int:
    return a.__cuda_array_interface__["data"][0]


@pytest.mark.skipif(rcuda.SIMULATOR, reason="a GPU's allocations (the simulator's are NumPy's)")
def test_a_gpu_reuses_the_memory_of_results_nobody_holds(monkeypatch):
    # Each result was a cuMemAlloc, freed by a cuMemFree that waits for the
    # GPU: half the time of value_and_grad at 1e8 f32 on an H200.  A result
    # dropped gives its block back; one still held, or a view of one, keeps it.
    m = dsl.load(EXAMPLES / "log1pexp.grad", target="cuda")
    x = rcuda.to_device(np.linspace(-5, 5, 10_001))
    expected = np.log(1 + np.exp(np.linspace(-5, 5, 10_001)))  # (the example's formula)
    first = _address(m.log1pexp(x))  # dropped at once
    again = m.log1pexp(x)
    assert _address(again) == first
    tail = again[1:]  # a view: the block stays lent
    del again
    other = m.log1pexp(x)
    assert _address(other) != first
    np.testing.assert_allclose(tail.copy_to_host(), expected[1:], rtol=1e-13)
    np.testing.assert_allclose(other.copy_to_host(), expected, rtol=1e-13)
    both = {first, _address(other)}
    del tail, other  # both blocks free now
    assert _address(m.log1pexp(x)) in both
    from numba import cuda

    from gradlang.runtime import memory
    pool = rcuda._device_pool(cuda.current_context())
    assert pool._free and memory.release() > 0 and not pool._free
    monkeypatch.setenv("GRADC_CUDA_POOL_BYTES", "0")  # the pool off: nothing kept
    kept = m.log1pexp(x)
    del kept
    assert not pool._free


def test_a_device_array_for_a_size_after_a_host_one_is_an_argument_error():
    # An integer argument that gives a size compiles for its value; once it
    # had (a host 3), a device array for it reached the compiler again, and
    # its internal NeedsValue escaped instead of the ArgumentError that the
    # first call with a device array gives.
    from numba import cuda
    m = dsl.loads("def f(v, i, n: i64):\n    return segment_sum(v, i, n)\n", target="cuda",
                  host_results=True)
    v, ids = np.arange(6.0).reshape(3, 2), np.array([0, 2, 0])
    np.testing.assert_array_equal(m.f(v, ids, 3), [[4.0, 6.0], [0.0, 0.0], [2.0, 3.0]])
    for call in (m.f, dsl.grad(m.f)):
        call(v, ids, 3)  # (grad's own program, compiled for 3 too)
        with pytest.raises(dsl.ArgumentError, match=r"<string>:1:5: error: argument 'n' of "
                                                    r"(grad\()?f\)?(\(\))? is a device array, "
                                                    r"but its value sets a shape, an axis or a "
                                                    r"count, .*: pass it on the host"):
            call(v, ids, cuda.to_device(np.int64(3)))
    # an axis so too (it said "gives a size", and nothing of a device array)
    m = dsl.loads("def g(x, axis: const = None):\n    return sum(x, axis=axis)\n",
                  target="cuda", host_results=True)
    with pytest.raises(dsl.ArgumentError, match=r"<string>:1:5: error: argument 'axis' of g\(\) "
                                                r"is a device array, but its value sets a shape, "
                                                r"an axis or a count"):
        m.g(np.ones((2, 3)), cuda.to_device(np.array(1)))


def test_a_pullbacks_device_cotangent_that_is_not_c_contiguous_is_an_argument_error():
    # A device cotangent of the output's shape and dtype was taken as it is,
    # with no check of its layout (an argument's and a tangent's have one):
    # the simulator's reshape copies, so the values came out right here,
    # but a GPU's device array cannot be reshaped without a copy.
    from numba import cuda
    m = dsl.loads("def f(x):\n    return x * 2.0\n", target="cuda", host_results=True)
    ct = np.arange(6.0).reshape(2, 3)
    _, pullback = dsl.vjp(m.f, np.ones((2, 3)))
    for device in (cuda.to_device(np.asfortranarray(ct)), cuda.to_device(np.ones((2, 6)))[:, ::2]):
        with pytest.raises(dsl.ArgumentError, match=r"<string>:1:5: error: cotangent 0 of the "
                                                    r"pullback of f\(\) is a device array that "
                                                    r"is not C-contiguous"):
            pullback(device)
    np.testing.assert_array_equal(pullback(cuda.to_device(ct))[0], 2 * ct)  # C order: as it is
