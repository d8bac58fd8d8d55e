"""Tests generated from the op table, on every target (CUDA on Numba's
simulator unless a GPU is present): every primitive's forward against its
NumPy reference (f64 and f32), its VJP against central differences and the
dot-product test <J^T u, v> = <u, J v> in f64, and its second order, on
Hypothesis inputs including broadcasting.  Differences are taken of the
NumPy reference interpreter, so they are independent of the target.  And
every primitive with a source name is callable from `.grad` source."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

import dsl
from helpers import central_difference
from gradlang.compiler import autodiff, passes
from gradlang.compiler.builder import Builder
from gradlang.compiler.interpret import interpret
from gradlang.compiler.ir import TensorType, Var
from gradlang.compiler.ops import OPS
from gradlang.compiler.pipeline import build
from gradlang.runtime import target as targets

NP = {"f32": np.float32, "f64": np.float64, "bool": np.bool_, "i64": np.int64}
TARGETS = sorted(targets.TARGETS)

ELEMENTWISE = sorted(n for n, op in OPS.items() if op.kind == "elementwise"
                     and op.arity >= 1 and n not in ("cast", "stop_gradient"))
DIFFERENTIABLE = [n for n in ELEMENTWISE if OPS[n].differentiable]
CALLABLE = sorted(n for n, op in OPS.items() if op.source_name is not None)


def sample(rng, domain: str, shape, dtype: str = "f64"):
    if domain == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    if domain == "positive":
        x = rng.uniform(0.2, 3.0, shape)
    elif domain == "unit":
        x = rng.uniform(-1.0, 1.0, shape)
    elif domain == "nonzero":
        x = rng.uniform(0.2, 3.0, shape) * rng.choice([-1.0, 1.0], shape)
    else:
        x = rng.uniform(-3.0, 3.0, shape)
    return np.asarray(x).astype(NP[dtype])


def single_op(name: str, in_types, **params):
    b = Builder()
    xs = [Var(t, f"x{i}") for i, t in enumerate(in_types)]
    out = b.bind(name, *xs, **params)
    return b.function(name, xs, [out])


def types_of(arrays) -> list[TensorType]:
    names = {np.dtype(np.bool_): "bool", np.dtype(np.float32): "f32",
             np.dtype(np.float64): "f64", np.dtype(np.int32): "i32", np.dtype(np.int64): "i64"}
    return [TensorType(names[a.dtype], a.shape) for a in arrays]


def run(fn, target: str, *arrays) -> list[np.ndarray]:
    """`fn` compiled for `target`, run on host arrays, results on the host."""
    t = targets.get(target)
    results = build(fn, t)(*[t.accept(np.asarray(a), f"x{i}") for i, a in enumerate(arrays)])
    return [t.to_host(r) for r in results]


def reference(fn):
    """The NumPy reference interpreter of `fn`'s first output."""
    return lambda *xs: interpret(fn, *xs)[0]


shapes = st.sampled_from([(), (1,), (4,), (3, 4), (2, 3, 2)])


def broadcast_variants(draw, shape, arity):
    """Input shapes that broadcast to `shape`: itself, trailing parts, ones."""
    out = []
    for _ in range(arity):
        k = draw(st.integers(0, len(shape)))
        variant = list(shape[k:])
        for i in range(len(variant)):
            if draw(st.booleans()) and draw(st.booleans()):
                variant[i] = 1
        out.append(tuple(variant))
    out[draw(st.integers(0, arity - 1))] = shape
    return out


SPECIALS = [-0.0, 0.0, -0.4, 0.4, -0.5, 0.5, -2.5, 2.5, -1e30, 1e30, -np.inf, np.inf, np.nan]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["floor", "ceil", "round", "sign", "abs", "neg"])
@pytest.mark.parametrize("dtype", ["f64", "f32"])
def test_integral_and_sign_ops_keep_numpys_signed_zeros(name, target, dtype):
    # floor of -0.0, ceil and round of x in (-1, 0) are -0.0; sign of -0.0 is 0.0
    x = np.array(SPECIALS, NP[dtype])
    (got,) = run(single_op(name, types_of([x])), target, x)
    expected = OPS[name].ref(x)
    np.testing.assert_array_equal(got, expected)
    number = ~np.isnan(expected)  # (a NaN's sign is open: `assert_same_bits`)
    np.testing.assert_array_equal(np.signbit(got[number]), np.signbit(expected[number]))


def assert_same_bits(got: np.ndarray, expected: np.ndarray, err_msg: str = "") -> None:
    """Bit for bit, but for a NaN's sign and payload, which IEEE 754 leaves
    open: a GPU's arithmetic gives 0x7fffffff where an x86 CPU's gives its
    default NaN, 0xffc00000 (seen on an H200)."""
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg=err_msg)
    bits = f"u{got.dtype.itemsize}"
    np.testing.assert_array_equal(got[~nan].view(bits), expected[~nan].view(bits),
                                  err_msg=err_msg)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ELEMENTWISE)
@settings(max_examples=6, deadline=None)
@given(data=st.data(), shape=shapes, seed=st.integers(0, 2**31),
       dtype=st.sampled_from(["f64", "f32"]))
def test_elementwise_forward_matches_numpy(name, target, data, shape, seed, dtype):
    op = OPS[name]
    rng = np.random.default_rng(seed)
    in_shapes = broadcast_variants(data.draw, shape, op.arity)
    arrays = [sample(rng, d, s, "bool" if d == "bool" else dtype)
              for d, s in zip(op.domains, in_shapes)]
    (got,) = run(single_op(name, types_of(arrays)), target, *arrays)
    expected = op.ref(*arrays)
    assert got.shape == np.shape(expected)
    if got.dtype == np.bool_:
        np.testing.assert_array_equal(got, expected)
    else:
        assert got.dtype == NP[dtype]
        rtol = 1e-12 if dtype == "f64" else op.tol
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol)


def _vjp_check(fn, target, arrays, wrt, rng, eps=1e-6, rtol=1e-6, atol=1e-7):
    """VJP of `fn` on `target` at `arrays` against central differences of
    <u, f(x)> and against the dot-product test, for each input in `wrt`."""
    forward = reference(fn)
    u = rng.normal(size=forward(*arrays).shape)
    grads = run(autodiff.vjp(fn, wrt), target, *arrays, u)[1:]
    for k, g in zip(wrt, grads):
        assert g.shape == arrays[k].shape
        x = arrays[k]
        fd = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            plus, minus = list(arrays), list(arrays)
            xp, xm = x.copy(), x.copy()
            xp[i] += eps
            xm[i] -= eps
            plus[k], minus[k] = xp, xm
            fd[i] = (np.sum(u * forward(*plus)) - np.sum(u * forward(*minus))) / (2 * eps)
        np.testing.assert_allclose(g, fd, rtol=rtol, atol=atol)
        # dot-product test: <J^T u, v> = <u, J v>, J v by a directional difference
        v = rng.normal(size=x.shape)
        plus, minus = list(arrays), list(arrays)
        plus[k], minus[k] = x + eps * v, x - eps * v
        jv = (forward(*plus) - forward(*minus)) / (2 * eps)
        lhs, rhs = np.sum(g * v), np.sum(u * jv)
        assert math.isclose(lhs, rhs, rel_tol=1e-5, abs_tol=1e-6), (lhs, rhs)


def _second_order_check(fn, target, arrays, k, eps=1e-5):
    """d/dx sum(grad sum(f)) w.r.t. input k on `target` (the Hessian times
    ones) against central differences of the gradient along ones."""
    first = autodiff.grad_of_sum(fn, [k], with_value=False)
    (h,) = run(autodiff.grad_of_sum(first, [k], with_value=False), target, *arrays)
    plus, minus = list(arrays), list(arrays)
    plus[k], minus[k] = arrays[k] + eps, arrays[k] - eps
    fd = (reference(first)(*plus) - reference(first)(*minus)) / (2 * eps)
    np.testing.assert_allclose(h, fd, rtol=1e-5, atol=1e-6)


def away_from_kinks(name, arrays) -> bool:
    """maximum and minimum are not differentiable where their inputs tie,
    remainder where x / y is an integer (it jumps there)."""
    if name in ("maximum", "minimum"):
        a, b = np.broadcast_arrays(*arrays)
        return bool(np.all(np.abs(a - b) > 1e-3))
    if name == "remainder":
        q = np.divide(*arrays)
        return bool(np.all(np.abs(q - np.round(q)) > 1e-3))
    return True


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", DIFFERENTIABLE)
@settings(max_examples=6, deadline=None)
@given(data=st.data(), shape=shapes, seed=st.integers(0, 2**31))
def test_elementwise_vjp_matches_finite_differences(name, target, data, shape, seed):
    op = OPS[name]
    rng = np.random.default_rng(seed)
    in_shapes = broadcast_variants(data.draw, shape, op.arity)
    arrays = [sample(rng, d, s) for d, s in zip(op.domains, in_shapes)]
    assume(away_from_kinks(name, arrays))
    wrt = [i for i, d in enumerate(op.domains) if d != "bool"]
    _vjp_check(single_op(name, types_of(arrays)), target, arrays, wrt, rng)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", DIFFERENTIABLE)
@settings(max_examples=3, deadline=None)
@given(shape=st.sampled_from([(1,), (3,), (2, 2)]), seed=st.integers(0, 2**31))
def test_elementwise_second_order_matches_finite_differences(name, target, shape, seed):
    op = OPS[name]
    rng = np.random.default_rng(seed)
    arrays = [sample(rng, d, shape) for d in op.domains]
    assume(away_from_kinks(name, arrays))
    first_float = next(i for i, d in enumerate(op.domains) if d != "bool")
    _second_order_check(single_op(name, types_of(arrays)), target, arrays, first_float)


def _zero_gradient_case(name):
    """`name` alone on arrays of 5 of its domains, and those arrays."""
    arrays = [sample(np.random.default_rng(0), d, (5,)) for d in OPS[name].domains]
    return single_op(name, types_of(arrays)), arrays


NON_DIFFERENTIABLE = [n for n in ELEMENTWISE if not OPS[n].differentiable
                      and "bool" not in OPS[n].domains]
COMPARISONS = [n for n in NON_DIFFERENTIABLE
               if _zero_gradient_case(n)[0].outputs[0].type.dtype == "bool"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", [n for n in NON_DIFFERENTIABLE if n not in COMPARISONS])
def test_non_differentiable_ops_have_zero_gradient(name, target):
    fn, arrays = _zero_gradient_case(name)
    results = run(autodiff.vjp(fn, list(range(len(arrays)))), target, *arrays, np.ones(5))
    for g in results[1:]:
        np.testing.assert_array_equal(g, np.zeros(5))


@pytest.mark.parametrize("name", COMPARISONS)
def test_a_comparison_passes_no_cotangent_to_its_operands(name):
    # (these cases of the test above returned before any assertion; the
    # IR's NumPy interpreter runs the VJP without compiling a kernel each)
    fn, arrays = _zero_gradient_case(name)
    results = interpret(autodiff.vjp(fn, [0, 1]), *arrays, np.ones(5))
    assert len(results) == 3
    for g in results[1:]:
        np.testing.assert_array_equal(g, np.zeros(5))


# ---------------------------------------------------------- non-elementwise

# The long axes reach the CUDA target's block-tree reductions.
REDUCE_CASES = [((5,), (0,)), ((3, 4), (0,)), ((3, 4), (1,)), ((3, 4), (0, 1)),
                ((2, 3, 4), (1,)), ((2, 3, 4), (0, 2)), ((2, 3, 4), (0, 1, 2)),
                ((2, 3, 4), (2,)), ((40, 3), (0,)), ((100,), (0,)), ((2, 40), (1,))]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", REDUCE_CASES, ids=str)
@pytest.mark.parametrize("name", ["reduce_sum", "reduce_max"])
@settings(max_examples=2, deadline=None)
@given(seed=st.integers(0, 2**31), dtype=st.sampled_from(["f64", "f32"]))
def test_reductions(name, case, target, seed, dtype):
    shape, axes = case
    rng = np.random.default_rng(seed)
    x = sample(rng, "real", shape, dtype)
    fn = single_op(name, [TensorType(dtype, shape)], axes=axes)
    (got,) = run(fn, target, x)
    rtol = 1e-12 if dtype == "f64" else 1e-5
    np.testing.assert_allclose(got, OPS[name].ref(x, axes), rtol=rtol, atol=rtol)
    if dtype == "f64":
        _vjp_check(fn, target, [x], [0], rng)
        _second_order_check(fn, target, [x], 0)


def test_large_sums_use_parallel_paths_and_stay_accurate(gradc_parallel):
    # CPU only: arrays this size are too slow for the CUDA simulator.
    gradc_parallel("always")  # (a busy machine takes the serial paths)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(1 << 17)).astype(np.float32)
    (got,) = run(single_op("reduce_sum", [TensorType("f32", x.shape)], axes=(0,)), "cpu", x)
    np.testing.assert_allclose(got, x.astype(np.float64).sum(), rtol=1e-6)
    y = rng.normal(size=(64, 1024))
    (rows,) = run(single_op("reduce_sum", [TensorType("f64", y.shape)], axes=(1,)), "cpu", y)
    np.testing.assert_allclose(rows, y.sum(axis=1), rtol=1e-12)


# Cumulative sums: (shape, axis, reverse); the long lane reaches CUDA's
# grid-stride loop over lanes.
SCAN_CASES = [((5,), 0, False), ((3, 4), 0, True), ((3, 4), 1, False), ((2, 3, 4), 1, True),
              ((2, 40), 0, False)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", SCAN_CASES, ids=str)
@settings(max_examples=2, deadline=None)
@given(seed=st.integers(0, 2**31), dtype=st.sampled_from(["f64", "f32", "i64"]))
def test_scans(case, target, seed, dtype):
    shape, axis, reverse = case
    rng = np.random.default_rng(seed)
    x = sample(rng, "real", shape, "f64")
    x = (x * 100).astype(np.int64) if dtype == "i64" else x.astype(NP[dtype])
    fn = single_op("cumsum", [TensorType(dtype, shape)], axis=axis, reverse=reverse)
    (got,) = run(fn, target, x)
    # the same additions in the same order, in the array's dtype: NumPy's bits
    np.testing.assert_array_equal(got, OPS["cumsum"].ref(x, axis, reverse))
    assert got.dtype == x.dtype
    if dtype == "f64":
        _vjp_check(fn, target, [x], [0], rng)
        _second_order_check(fn, target, [x], 0)


LAYOUT_CASES = [
    ("reshape", [(2, 6)], {"shape": (3, 4)}),
    ("reshape", [(6,)], {"shape": (1, 6, 1)}),
    ("transpose", [(2, 3, 4)], {"perm": (2, 0, 1)}),
    ("transpose", [(3, 4)], {"perm": (1, 0)}),
    ("broadcast_to", [(3, 1)], {"shape": (2, 3, 4)}),
    ("broadcast_to", [()], {"shape": (3,)}),
    ("slice", [(5, 4)], {"starts": (1, 0), "stops": (5, 4), "steps": (2, 1)}),
    ("slice", [(6,)], {"starts": (5,), "stops": (-1,), "steps": (-2,)}),
    ("embed", [(2, 4)], {"shape": (5, 4), "starts": (1, 0), "stops": (5, 4), "steps": (2, 1)}),
    ("embed_add", [(5, 4), (2, 2)], {"starts": (4, 3), "stops": (-1, -1), "steps": (-3, -2)}),
    ("concatenate", [(2, 3), (4, 3)], {"axis": 0}),
    ("concatenate", [(2, 1), (2, 3), (2, 2)], {"axis": 1}),
    ("matmul", [(3, 4), (4, 2)], {}),
    ("matmul", [(1, 5), (5, 1)], {}),
    ("matmul", [(2, 1, 3, 2), (1, 2, 2, 3)], {}),  # batch axes broadcast both ways
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name,in_shapes,params", LAYOUT_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(LAYOUT_CASES)])
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**31), dtype=st.sampled_from(["f64", "f32"]))
def test_layout_and_matmul(name, in_shapes, params, target, seed, dtype):
    rng = np.random.default_rng(seed)
    arrays = [sample(rng, "real", s, dtype) for s in in_shapes]
    fn = single_op(name, [TensorType(dtype, s) for s in in_shapes], **params)
    (got,) = run(fn, target, *arrays)
    expected = OPS[name].ref(*arrays, **params)
    rtol = 1e-12 if dtype == "f64" else OPS[name].tol
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol)
    assert got.dtype == NP[dtype]
    if dtype == "f64":
        _vjp_check(fn, target, arrays, list(range(len(arrays))), rng)
        _second_order_check(fn, target, arrays, 0)


# Gathers and scatter-adds: (op, shapes of the inputs, axis); each index
# array is drawn by Hypothesis over the whole valid range, negatives and
# repeats included.
INDEX_CASES = [
    ("take", [(5, 3), (6,)], 0),
    ("take", [(2, 4), (2, 3)], 1),
    ("take", [(4,), ()], 0),
    ("take_along_axis", [(3, 4), (3, 5)], 1),
    ("take_along_axis", [(3, 2, 2), (4, 2, 2)], 0),
    ("scatter_add", [(4, 3), (6,), (6, 3)], 0),
    ("scatter_add", [(2, 3, 2), (4,), (2, 4, 2)], 1),
    ("scatter_add_along_axis", [(3, 4), (3, 6), (3, 6)], 1),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name,in_shapes,axis", INDEX_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(INDEX_CASES)])
@settings(max_examples=3, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**31), dtype=st.sampled_from(["f64", "f32"]),
       index_dtype=st.sampled_from(["i64", "i32"]))
def test_gathers_and_scatters(name, in_shapes, axis, target, data, seed, dtype, index_dtype):
    rng = np.random.default_rng(seed)
    n = in_shapes[0][axis]
    index_size = int(np.prod(in_shapes[1]))
    idx = np.array(data.draw(st.lists(st.integers(-n, n - 1), min_size=index_size,
                                      max_size=index_size)),
                   {"i64": np.int64, "i32": np.int32}[index_dtype]).reshape(in_shapes[1])
    arrays = [idx if d == "index" else sample(rng, d, s, dtype)
              for d, s in zip(OPS[name].domains, in_shapes)]
    params = {"axis": axis, "what": "'idx'"}
    fn = single_op(name, types_of(arrays), **params)
    (got,) = run(fn, target, *arrays)
    expected = OPS[name].ref(*arrays, **params)
    rtol = 1e-12 if dtype == "f64" else 1e-5
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol)
    assert got.dtype == NP[dtype]
    if dtype == "f64":
        floats = [k for k, d in enumerate(OPS[name].domains) if d != "index"]
        _vjp_check(fn, target, arrays, floats, rng)
        _second_order_check(fn, target, arrays, floats[-1])


# `iota` (arange): (start, stop, step, dtype), empty and negative steps too
IOTA_CASES = [(0, 5, 1, "i64"), (7, -6, -3, "i64"), (3, 3, 1, "i64"), (0.5, 2.0, 0.1, "f64"),
              (1.0, -1.0, -0.3, "f64")]


@pytest.mark.parametrize("target", TARGETS)
def test_iota_is_numpys_arange_to_the_bit(target):
    for start, stop, step, dtype in IOTA_CASES:
        fn = single_op("iota", [], start=start, stop=stop, step=step, dtype=dtype)
        (got,) = run(fn, target)
        expected = np.arange(start, stop, step, dtype=NP[dtype])
        assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes()
        assert interpret(fn)[0].tobytes() == expected.tobytes()


def test_every_primitive_is_covered():
    covered = set(ELEMENTWISE) | {"reduce_sum", "reduce_max"} | {c[0] for c in LAYOUT_CASES}
    covered |= {c[0] for c in INDEX_CASES} | {"cumsum", "iota"}
    helpers = {"cast", "stop_gradient", "full", "custom_vjp", "recompute_barrier", "dim",
               "loop", "check_index", "check_nonempty", "check_trips"}
    # loop: tests/test_loops.py; the checks: tests/test_dead_checks.py
    assert set(OPS) - covered - helpers == set()


@pytest.mark.parametrize("name", sorted(n for n, op in OPS.items() if op.identity is not None))
def test_simplify_drops_the_identities_the_rows_declare(name):
    op = OPS[name]
    x = np.array([-1.5, 0.5, 2.0, -0.0, 0.0])  # (a sum's identity is -0.0, not 0.0)
    for identity_first in (False, True):
        b = Builder()
        param = Var(TensorType("f64", x.shape), "x")
        identity = b.lit(op.identity, "f64")
        operands = (identity, param) if identity_first else (param, identity)
        fn = b.function(name, [param], [b.bind(name, *operands)])
        simple = passes.simplify(fn)
        assert len(simple.eqns) == (1 if identity_first and not op.commutative else 0)
        expected = op.ref(*[op.identity if a is identity else x for a in operands])
        assert interpret(simple, x)[0].tobytes() == expected.tobytes()


# ------------------------------------------------------------ from source


@pytest.mark.parametrize("name", CALLABLE)
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**31), shape=st.sampled_from([(), (4,), (2, 3)]))
def test_every_callable_primitive_is_callable_from_source(name, seed, shape):
    # Source generated from the row alone: its source name and arity.
    op = OPS[name]
    params = ", ".join(f"x{i}" for i in range(op.arity))
    module = dsl.loads(f"def f({params}):\n    return {op.source_name}({params})\n")
    rng = np.random.default_rng(seed)
    arrays = [sample(rng, d, shape) for d in op.domains]
    np.testing.assert_allclose(module.f(*arrays), op.ref(*arrays), rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------- // and %

FLOOR_SOURCE = """
def fd(x, y):
    return x // y
def rem(x, y):
    return x % y
def both(i: i64[n], k: i64):
    j = i
    j //= k
    r = i
    r %= k
    return j, r
def folded(x):
    return x * (7 // 2) + (-7.5 % 2) + (7 // -2)
"""


@pytest.mark.parametrize("target", TARGETS)
def test_floor_division_and_remainder_are_numpys_bit_for_bit(target):
    m = dsl.loads(FLOOR_SOURCE, target=target, host_results=True)
    specials = [0.0, -0.0, 1.0, -1.0, 2.5, -7.0, 1e308, 5e-324, np.inf, -np.inf, np.nan, 0.1]
    x = np.repeat(specials, len(specials))
    y = np.tile(specials, len(specials))
    with np.errstate(all="ignore"):
        for dtype in (np.float64, np.float32):
            a, b = x.astype(dtype), y.astype(dtype)
            for f, ref in ((m.fd, np.floor_divide), (m.rem, np.remainder)):
                got = f(a, b)
                assert got.dtype == dtype
                assert_same_bits(got, ref(a, b), err_msg=f.__name__)
        least = np.iinfo(np.int64).min
        i = np.array([7, -7, 7, -7, 0, 5, least, least, 3, -3])
        for k in (2, -2, 3, -1, 1, 0):
            j, r = m.both(i, k)
            np.testing.assert_array_equal(j, np.floor_divide(i, k))  # least // -1 wraps
            np.testing.assert_array_equal(r, np.remainder(i, k))
            np.testing.assert_array_equal(j * k + r, i if k else np.zeros_like(i))
    # constants fold with Python's (and NumPy's) rules
    np.testing.assert_array_equal(m.folded(np.ones(2)), 3 + 0.5 - 4)


LITERAL_DIVISORS = (1.0, -1.0, 2.0, -4.0, 0.5, 3.0, 0.0)


@pytest.mark.parametrize("target", TARGETS)
def test_floor_division_and_remainder_by_a_literal_are_numpys_bit_for_bit(target):
    # LLVM lowers a float remainder by a constant power of two >= 1 as
    # copysign(x - trunc(x / c) * c, x): at x = +inf a NaN with the sign
    # bit clear, where NumPy's (fmod's invalid NaN, inf - inf) has it set.
    # (every literal in one function: one kernel per dtype, not one each)
    source = ("def by_literals(x):\n    return "
              + ", ".join(f"x // {c!r}, x % {c!r}" for c in LITERAL_DIVISORS) + "\n")
    m = dsl.loads(source + FLOOR_SOURCE, target=target, host_results=True)
    specials = [0.0, -0.0, 1.0, -1.0, 2.5, -7.0, 1e308, 5e-324, np.inf, -np.inf, np.nan, 0.1]
    with np.errstate(all="ignore"):
        for dtype in (np.float32, np.float64):
            x = np.array(specials, dtype)
            by_literals = m.by_literals(x)
            for k, c in enumerate(LITERAL_DIVISORS):
                divisor = np.full_like(x, c)
                for j, (name, ref) in enumerate((("fd", np.floor_divide), ("rem", np.remainder))):
                    expected = ref(x, divisor)
                    for got in (by_literals[2 * k + j], getattr(m, name)(x, divisor)):
                        assert got.dtype == dtype
                        assert_same_bits(got, expected, err_msg=f"x {name} {c!r}")


def test_remainder_gradients_and_a_runtime_index_modulo_a_size():
    m = dsl.loads("""
def rem(x, y):
    return sum(x % y)
def cycle(x, w: f64[3], steps: i64):
    s = zeros_like(x)
    for i in range(steps):
        s = s + sin(x * w[i % 3])
    return sum(s)
""")
    x, y = np.array([7.3, -7.3, 2.9, -0.4]), np.array([2.0, 2.0, -1.5, 3.0])
    gx, gy = dsl.grad(m.rem, wrt=(0, 1))(x, y)
    np.testing.assert_array_equal(gx, np.ones(4))
    np.testing.assert_array_equal(gy, -np.floor_divide(x, y))
    for k in (0, 1):
        np.testing.assert_allclose((gx, gy)[k], central_difference(m.rem, (x, y), k),
                                   rtol=1e-6, atol=1e-6)
    w = np.array([0.5, -1.0, 2.0])
    value, (gx, gw) = dsl.value_and_grad(m.cycle, wrt=(0, 1))(x, w, 5)
    scales = w[np.arange(5) % 3]
    assert value == pytest.approx(np.sum(np.sin(np.outer(scales, x))), rel=1e-12)
    np.testing.assert_allclose(gx, np.cos(np.outer(scales, x)).T @ scales, rtol=1e-12)
    for k, g in ((0, gx), (1, gw)):
        np.testing.assert_allclose(g, central_difference(m.cycle, (x, w, 5), k),
                                   rtol=1e-6, atol=1e-6)
    # forward mode through the remainder's transposed rule
    _, tangent = dsl.jvp(m.rem, (x, y), (np.ones(4), np.ones(4)))
    assert tangent == pytest.approx(np.sum(1 - np.floor_divide(x, y)), rel=1e-12)


def test_a_grad_block_taking_a_remainder_of_its_cotangent_is_not_linear():
    with pytest.raises(dsl.GradError, match=r"a remainder \(%\)") as info:
        dsl.loads("def f(x):\n    return x * 2.0\ngrad(dy):\n    return (dy % 2.0) * 2.0\n")
    assert (info.value.span.line, info.value.span.col) == (4, 13)
