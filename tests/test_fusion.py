"""Fusion: an elementwise chain is one loop; value and gradient together are
one pass that stores no residual; broadcasting never materializes."""
import numpy as np

import dsl
from dsl.function import jvp_function
from gradlang.compiler.codegen import access_kind
from gradlang.compiler.shapes import kept_runs
from gradlang.compiler.fusion import Loop, fuse


def steps_of(f, *args):
    return fuse(f.ir(*args))


def test_value_and_grad_of_elementwise_chain_is_one_loop():
    m = dsl.loads("def f(x):\n    e = exp(x)\n    return log(1 + e) * sin(x) / (x * x + 1)\n")
    vg = dsl.value_and_grad(m.f)
    steps = steps_of(vg, np.ones(10))
    assert len(steps) == 1 and isinstance(steps[0], Loop)
    assert len(steps[0].inputs) == 1 and len(steps[0].outputs) == 2
    program = vg.program(vg.bind((np.ones(10),), {}))
    assert len(program.generated.kernel_names) == 1


def test_loops_differing_only_in_a_constant_get_their_own_kernels():
    m = dsl.loads("def f(x):\n    return x * 2\n\ndef g(x):\n    return x * 3\n"
                  "\ndef h(x):\n    return x * 2\n")
    x = np.arange(4.0)
    np.testing.assert_array_equal(m.f(x), 2 * x)
    np.testing.assert_array_equal(m.g(x), 3 * x)
    kernels = [f.program(f.bind((x,), {})).generated.kernel_names for f in (m.f, m.g, m.h)]
    assert kernels[0] != kernels[1] and kernels[0] == kernels[2]


def test_custom_grad_block_value_and_grad_is_one_loop():
    m = dsl.load("examples/log1pexp.grad")
    steps = steps_of(dsl.value_and_grad(m.log1pexp), np.ones(10))
    assert len(steps) == 1 and len(steps[0].outputs) == 2


def test_vjp_keeps_only_what_backward_reads():
    m = dsl.loads("def f(x):\n    return sin(exp(x))\n")
    x = np.linspace(0, 1, 1000)
    out, pullback = dsl.vjp(m.f, x)
    # backward reads cos(exp(x)) and exp(x): two residuals the size of x,
    # not x itself and not sin(exp(x))
    assert pullback.residual_bytes == 2 * x.nbytes
    np.testing.assert_allclose(pullback(np.ones(1000))[0], np.cos(np.exp(x)) * np.exp(x))


def test_broadcast_inputs_are_read_in_place():
    m = dsl.loads("def f(x, b, c):\n    return x * b + c\n")
    x, b, c = np.ones((3, 4)), np.arange(4.0), np.arange(3.0).reshape(3, 1)
    steps = steps_of(m.f, x, b, c)
    assert len(steps) == 1
    np.testing.assert_allclose(m.f(x, b, c), x * b + c)
    gx, gb, gc = dsl.grad(m.f, wrt=(0, 1, 2))(x, b, c)
    np.testing.assert_allclose(gb, x.sum(axis=0))
    np.testing.assert_allclose(gc, [[4.0], [4.0], [4.0]])


def test_access_kinds():
    assert access_kind((3, 4), (3, 4)) == "full"
    assert access_kind((), (3, 4)) == "scalar"
    assert access_kind((4,), (3, 4)) == "suffix"
    assert access_kind((3, 1), (3, 4)) == "outer"
    # the others: the runs of the loop's axes each has (one term each)
    for shape, runs in (((2, 1, 4), [(0, 1), (2, 3)]), ((2, 1, 1, 4), [(0, 1), (3, 4)]),
                        ((3, 1, 1), [(1, 2)]), ((1, 3, 5, 1), [(1, 3)]),
                        ((2, 1, 5, 1), [(0, 1), (2, 3)])):
        loop = (2, 3, 4) if len(shape) == 3 and shape[0] == 2 else (2, 3, 5, 4)
        assert access_kind(shape, loop) == "general"
        assert kept_runs(shape, loop) == runs
    # a run of the loop's axes of size 1 alone has a term of 0 and is left
    # out: as the last run it made the rows one element long (a channel's
    # bias over (N, C, H, 1) read per element, 40x the time over (N, C, H))
    assert kept_runs((5, 1, 1), (3, 5, 4, 1)) == [(1, 2)]
    assert kept_runs((1, 5, 1, 1, 1), (3, 5, 1, 4, 1)) == [(1, 3)]
    assert kept_runs((3, 1, 4, 1), (3, 5, 4, 1)) == [(0, 1), (2, 4)]


def test_a_channels_bias_in_nchw_reads_one_value_a_run():
    # (C, 1, 1) read over (N, C, H, W) (one run of its axes) took the stride
    # table's division per axis per element: x * b[:, None, None] + 1.0 at
    # 32 x 64 x 32 x 32 took 40 ms against NumPy's 1.7; it now reads one
    # value per run of H W, as an outer input does
    m = dsl.loads("def f(x, b, c):\n    return x * b[:, None, None] + c, sum(x * c)\n")
    rng = np.random.default_rng(6)
    x, b, c = rng.normal(size=(3, 5, 4, 6)), rng.normal(size=5), rng.normal(size=(1, 1, 4, 1))
    out, total = m.f(x, b, c)  # (runs of 6, c's, shorter than b's of 24)
    np.testing.assert_array_equal(out, x * b[:, None, None] + c)
    np.testing.assert_allclose(total, np.sum(x * c), rtol=1e-13)
    gb, gc = dsl.grad(m.f, wrt=(1, 2))(x, b, c)
    np.testing.assert_allclose(gb, x.sum(axis=(0, 2, 3)), rtol=1e-13)
    np.testing.assert_allclose(gc, (1 + x).sum(axis=(0, 1, 3), keepdims=True), rtol=1e-13)
    # and over (N, C, H, 1): b held along rows of H (`kept_runs` leaves out
    # the last axis of size 1 alone), c read on along them
    x = x[..., :1].copy()
    out, total = m.f(x, b, c)
    np.testing.assert_array_equal(out, x * b[:, None, None] + c)
    np.testing.assert_allclose(total, np.sum(x * c), rtol=1e-13)


def test_a_broadcast_along_a_middle_axis_reads_in_runs():
    # (B, 1, D) read over (B, T, D) took the stride table's division per
    # axis per element: 14x NumPy's time at 64 x 128 x 256; it is now read
    # in runs of D, as a suffix is (a max_pool2d's gradient reads its max
    # so, broadcast over the windows' axis)
    m = dsl.loads("def f(x, y, z):\n    return sum(x * y + z), x * y - z\n")
    rng = np.random.default_rng(4)
    # (the last: runs of 5, z's period, shorter than y's of 4 x 5)
    for shapes in (((5, 7, 3), (5, 1, 3), (1, 7, 3)), ((4, 6, 2, 3), (4, 1, 1, 3), (4, 6, 1, 1)),
                   ((2, 3, 4, 5), (2, 1, 4, 5), (2, 3, 4, 1))):
        x, y, z = (rng.normal(size=s) for s in shapes)
        total, rest = m.f(x, y, z)
        np.testing.assert_allclose(total, np.sum(x * y + z), rtol=1e-13)
        np.testing.assert_array_equal(rest, x * y - z)
        gx, gy = dsl.grad(m.f, wrt=(0, 1))(x, y, z)
        np.testing.assert_allclose(gx, 2 * np.broadcast_to(y, x.shape), rtol=1e-15)
        np.testing.assert_allclose(gy, 2 * x.sum(axis=tuple(
            k for k, d in enumerate(y.shape) if d == 1), keepdims=True), rtol=1e-13)
    # and a `for` loop's kernel reading them as invariants, element by element
    looped = dsl.loads("def f(x, y, z):\n    s = x\n    for i in range(3):\n"
                       "        s = s * y + z\n    return s\n")
    expected = x
    for _ in range(3):
        expected = expected * y + z
    np.testing.assert_allclose(looped.f(x, y, z), expected, rtol=1e-14)


def test_a_broadcast_with_separate_runs_reads_per_run_not_per_axis():
    # (B, 1, T, 1) over (B, H, T, D): the stride table's division per axis
    # per element took 19x NumPy's time at 16 x 8 x 128 x 64; each run of
    # the loop's axes the input has is now one term, per row: the last run
    # read on along a row where it ends the axes (y), else held (z)
    m = dsl.loads("def f(x, y, z):\n    return x * y + z, sum(x * z)\n"
                  "def g(x, y, z):\n    s = x\n    for i in range(2):\n"
                  "        s = s * y + z\n    return s\n")
    rng = np.random.default_rng(8)
    x, y, z = (rng.normal(size=s) for s in ((3, 4, 5, 6), (1, 4, 1, 6), (3, 1, 5, 1)))
    assert {access_kind(a.shape, x.shape) for a in (y, z)} == {"general"}
    out, total = m.f(x, y, z)
    np.testing.assert_array_equal(out, x * y + z)
    np.testing.assert_allclose(total, np.sum(x * z), rtol=1e-13)
    gy, gz = dsl.grad(m.f, wrt=(1, 2))(x, y, z)
    np.testing.assert_allclose(gy, x.sum(axis=(0, 2), keepdims=True), rtol=1e-13)
    np.testing.assert_allclose(gz, (1 + x).sum(axis=(1, 3), keepdims=True), rtol=1e-13)
    # (a `for` loop's kernel reads them element by element)
    np.testing.assert_allclose(m.g(x, y, z), (x * y + z) * y + z, rtol=1e-14)


def test_general_broadcast_matches_numpy():
    m = dsl.loads("def f(x, y):\n    return x * y + x\n")
    x, y = np.random.default_rng(0).normal(size=(2, 1, 4)), np.arange(12.0).reshape(1, 3, 4)
    np.testing.assert_allclose(m.f(x, y), x * y + x)
    gx = dsl.grad(m.f)(x, y)
    np.testing.assert_allclose(gx, (y + 1).sum(axis=1, keepdims=True) * np.ones((2, 1, 4)))


def test_large_arrays_take_the_parallel_kernel(gradc_parallel):
    gradc_parallel("always")  # (a busy machine takes the serial one)
    m = dsl.load("examples/log1pexp.grad")
    x = np.linspace(-50, 50, 1 << 16)
    v, g = dsl.value_and_grad(m.log1pexp)(x)
    np.testing.assert_allclose(g, 0.5 * (1 + np.tanh(x / 2)), rtol=1e-12, atol=1e-15)


def test_a_sum_of_an_elementwise_chain_never_stores_the_chain(gradc_parallel):
    m = dsl.loads("def sq(x):\n    return sum(x * x)\n"
                  "def rows(x):\n    return sum(exp(x) * 2, axis=1)\n"
                  "def two(x):\n    return sum(x * 2, axis=1) - sum(x * x, axis=1)\n")
    x = np.random.default_rng(0).normal(size=(300, 200))
    for f, expected in ((m.sq, (x * x).sum()), (m.rows, (np.exp(x) * 2).sum(axis=1))):
        steps = fuse(f.ir(x), reductions=True)
        assert len(steps) == 1 and steps[0].reductions
        np.testing.assert_allclose(f(x), expected, rtol=1e-12)
    # two sums over the same rows: one pass accumulates both (the second
    # was stored whole and summed after, as the tangent of a vmap's row sum)
    small = x[:7, :5]
    loop = fuse(m.two.ir(small), reductions=True)[0]
    assert [r.p["axes"] for r in loop.reductions] == [(1,), (1,)]
    np.testing.assert_allclose(m.two(small), (small * 2).sum(1) - (small * small).sum(1),
                               rtol=1e-12)
    big = np.random.default_rng(1).normal(size=1 << 16)  # the parallel full-sum kernel
    gradc_parallel("always")  # (a busy machine takes the serial one)
    np.testing.assert_allclose(m.sq(big), (big * big).sum(), rtol=1e-12)


def test_a_loop_over_many_broadcast_inputs_has_code_linear_in_them():
    """The rows' length is the least of the inputs' periods: one statement
    per input (a nested select repeated its operands, doubling the kernel's
    source with each input: 12 inputs took Numba seconds to compile)."""
    names = [f"b{k}" for k in range(12)]
    m = dsl.loads(f"def f(x, {', '.join(names)}):\n    return x * ({' + '.join(names)})\n")
    x = np.arange(12.0).reshape(4, 3)
    # rows of x's width and columns of its height: suffix and outer inputs
    rows = [np.full((4, 1) if k % 2 else (3,), float(k)) for k in range(12)]
    program = m.f.program(m.f.bind((x, *rows), {}))
    (kernel,) = [source for _, source in program.generated.kernels if "prange" in source]
    # (the kernel's source holds its parallel and its serial version)
    assert kernel.count("least = ") == 2 * len(names)
    assert len(kernel) < 12000
    np.testing.assert_array_equal(m.f(x, *rows), x * sum(rows))


LOGISTIC = "def loss(x, y, w):\n    return log(1 + exp(-y * sum(x * w)))\n"


def _logistic_jvp_reference(x, y, w, tx):
    z = x @ w
    return np.log1p(np.exp(-y * z)), -y / (1 + np.exp(y * z)) * (tx @ w)


def test_a_product_summed_against_a_vector_runs_as_a_matrix_vector_product(gradc_parallel):
    """The jvp of a vmap'd logistic loss along each example's x: the row
    sums of x * w and tx * w are BLAS's x @ w and tx @ w (a loop summing
    64-element rows ran at half the memory's speed), and `-y`, which the
    greedy rule started as a loop of its own, sinks into the one loop that
    does the rest per row: one kernel (three before).  Values against
    NumPy and central differences, serial and parallel, f64 and f32."""
    loss = dsl.loads(LOGISTIC).loss
    batched = dsl.vmap(loss, in_axes=(0, 0, None))
    rng = np.random.default_rng(0)

    def args(n, d, dtype=np.float64):
        return [a.astype(dtype) for a in (rng.normal(size=(n, d)), rng.choice([-1.0, 1.0], n),
                                          rng.normal(size=d) / np.sqrt(d),
                                          rng.normal(size=(n, d)))]
    x, y, w, tx = args(7, 5)
    jf = jvp_function(batched, ["x"])
    program = jf.program({**batched.bind((x, y, w), {}), "t_x": tx})
    steps = fuse(program.ir, reductions=True)
    assert [s.op for s in steps if not isinstance(s, Loop)].count("matmul") == 2
    (loop,) = [s for s in steps if isinstance(s, Loop)]
    assert not loop.reductions and [e.op for e in loop.eqns][0] == "neg"
    assert len(program.generated.kernel_names) == 1
    for n, d, parallel in ((7, 5, "never"), (20000, 16, "always")):
        x, y, w, tx = args(n, d)
        gradc_parallel(parallel)  # the loop's parallel variant from 6553 rows
        value, tangent = dsl.jvp(batched, (x, y, w), (tx, None, None))
        ref_value, ref_tangent = _logistic_jvp_reference(x, y, w, tx)
        np.testing.assert_allclose(value, ref_value, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(tangent, ref_tangent, rtol=1e-10, atol=1e-13)
        h = 1e-6
        plus, minus = (batched(x + s * h * tx, y, w) for s in (1, -1))
        np.testing.assert_allclose(tangent, (plus - minus) / (2 * h), rtol=1e-6, atol=1e-8)
    x, y, w, tx = args(50, 6, np.float32)  # f32: the loop's sums (they add in f64)
    program = jf.program({**batched.bind((x, y, w), {}), "t_x": tx})
    assert "matmul" not in [s.op for s in fuse(program.ir, reductions=True)
                            if not isinstance(s, Loop)]
    value, tangent = dsl.jvp(batched, (x, y, w), (tx, None, None))
    assert value.dtype == tangent.dtype == np.float32
    ref = _logistic_jvp_reference(*(a.astype(np.float64) for a in (x, y, w, tx)))
    np.testing.assert_allclose(value, ref[0], rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(tangent, ref[1], rtol=2e-4, atol=1e-5)
    per_example = dsl.vmap(dsl.grad(loss, wrt=2), in_axes=(0, 0, None))
    x, y, w, _ = args(40, 9)
    program = per_example.program(per_example.bind((x, y, w), {}))
    assert len(program.generated.kernel_names) == 2  # the slope per row, then its x rows
    expected = (-y / (1 + np.exp(y * (x @ w))))[:, None] * x
    np.testing.assert_allclose(per_example(x, y, w), expected, rtol=1e-12, atol=1e-15)


def test_which_sums_of_products_become_matrix_vector_products():
    """Over trailing axes, against a vector the same for every row
    (size-1 axes before it allowed); not where another sum over the same
    rows reads the matrix (one loop then reads it once for both), nor a
    product of two values of the full shape, nor in f32."""
    m = dsl.loads("def rows3(x, v):\n    return sum(x * v, axis=2)\n"
                  "def both(x, w):\n    return sum(x * w, axis=1) + sum(x * x, axis=1)\n"
                  "def full(x, z):\n    return sum(x * z, axis=1)\n")
    rng = np.random.default_rng(3)
    x3, v = rng.normal(size=(4, 5, 6)), rng.normal(size=(1, 6))
    x, w = rng.normal(size=(9, 7)), rng.normal(size=7)
    z = rng.normal(size=(9, 7))
    for f, a, expected, matmuls in ((m.rows3, (x3, v), (x3 * v).sum(2), 1),
                                    (m.rows3, (x3.astype(np.float32), v.astype(np.float32)),
                                     (x3 * v).sum(2).astype(np.float32), 0),
                                    (m.both, (x, w), x @ w + (x * x).sum(1), 0),
                                    (m.full, (x, z), (x * z).sum(1), 0)):
        steps = fuse(f.ir(*a), reductions=True)
        ops = [s.op for s in steps if not isinstance(s, Loop)]
        assert ops.count("matmul") == matmuls, f.name
        np.testing.assert_allclose(f(*a), expected, rtol=1e-12 if expected.dtype == np.float64
                                   else 1e-5)
    steps = fuse(m.both.ir(x, w), reductions=True)
    assert [len(s.reductions) for s in steps if isinstance(s, Loop)] == [2, 0]  # then their sum
    gx, gv = dsl.grad(m.rows3, wrt=(0, 1))(x3, v)
    np.testing.assert_allclose(gx, np.broadcast_to(v, x3.shape), rtol=1e-12)
    np.testing.assert_allclose(gv, x3.sum(axis=(0, 1), keepdims=True)[0], rtol=1e-12)


def test_a_loop_only_one_later_loop_reads_sinks_into_it():
    """exp(x) began a loop before the sum the product waits for; it sinks
    into the product's loop: one kernel, exp(x) never stored."""
    m = dsl.loads("def f(x):\n    s = sum(x)\n    return exp(x) * (s / 2.0)\n")
    x = np.linspace(-1, 1, 11)
    steps = fuse(m.f.ir(x), reductions=True)
    (loop,) = [s for s in steps if isinstance(s, Loop) and s.shape != ()]
    assert [e.op for e in loop.eqns] == ["exp", "mul"] and len(loop.outputs) == 1
    np.testing.assert_allclose(m.f(x), np.exp(x) * x.sum() / 2, rtol=1e-14)


def test_a_scalar_spread_by_a_broadcast_is_read_where_it_is_used():
    """A mean's cotangent 1 / n, spread over the array: where n is symbolic
    it is a value, not a literal, and its broadcast joined the first loop
    of its shape, which then stored the whole array of it for the loop that
    read it (after a sum).  Each loop reads the one value instead."""
    m = dsl.loads("def f(z):\n    return mean(z * sum(exp(z)))\n")
    value_and_grad = dsl.value_and_grad(m.f)
    z = np.linspace(-1, 1, 7)
    fn = value_and_grad.ir(z)
    made = {o: e.op for e in fn.eqns for o in e.outputs}
    stored = [made.get(o) for s in fuse(fn, reductions=True) if isinstance(s, Loop)
              for o in s.outputs]
    assert "broadcast_to" not in stored and "broadcast_to" in made.values()
    value, grad = value_and_grad(z)
    s = np.exp(z).sum()
    np.testing.assert_allclose(value, np.mean(z * s), rtol=1e-14)
    np.testing.assert_allclose(grad, s / 7 + np.exp(z) * z.sum() / 7, rtol=1e-13)


def test_rows_index_whole_arrays_at_an_unsigned_index():
    """A CPU kernel running in rows (here a sum, and w broadcast along
    them) reads and writes each whole array at `iu`, i as an unsigned
    integer, with no view per array per row (each cost Numba and LLVM
    compile time): values and gradients are NumPy's on every row."""
    m = dsl.loads("def f(x, w, c):\n    return sum(tanh(x * w + c) * x)\n")
    rng = np.random.default_rng(0)
    x, w, c = rng.standard_normal((3, 5)), rng.standard_normal(5), 0.25
    vg = dsl.value_and_grad(m.f, wrt=(0, 1))
    value, (gx, gw) = vg(x, w, c)
    t = np.tanh(x * w + c)
    d = (1 - t * t) * x
    np.testing.assert_allclose(value, np.sum(t * x), rtol=1e-12)
    np.testing.assert_allclose(gx, t + d * w, rtol=1e-12)
    np.testing.assert_allclose(gw, np.sum(d * x, axis=0), rtol=1e-12)
    source = vg.program(vg.bind((x, w, c), {})).generated.kernel_source
    assert "in0[iu]" in source and "out0[iu] =" in source and "[i0:]" not in source
