"""`arange` and `one_hot`: NumPy's values and dtypes, weak typing beside
f32 arrays, a cross-entropy and a causal mask with their gradients against
central differences, vmap, jvp, the CUDA target (the simulator), the Dask
bridge, a label out of range refused before any result, and the errors at
their positions."""
import numpy as np
import pytest

import dsl
from helpers import central_difference, optional_module

SOURCE = """\
def ranges(x):
    n = x.shape[0]
    return arange(n), arange(2, 9), arange(9, 2, -2), arange(0.5, 2.0, 0.25), \\
        arange(n - 1, -1, -1), arange(1, n, 3) * 0.5, arange(2, step=3, stop=n + 4)

def weak(x):
    n = x.shape[0]
    s = arange(n) * 0.0
    for i in range(2):
        s = s + x
    return exp(arange(n) * -0.5) * x, (1 - arange(n)[::-1]) * x, float32(arange(n)), s

# layout ops and reductions keep a weak type, as indexing does
def laid_out(x, labels):
    n = x.shape[0]
    return one_hot(labels, n).T @ x, reshape(arange(n) * 0.5, (2, -1)).T @ x[:2], \
        broadcast_to(arange(n), (2, n)) * x, concatenate([arange(n) * 0.5, arange(2)]) * x[0], \
        stack([arange(n), arange(n) * 2.0]) * x, \
        (sum(arange(n) * 0.5) + mean(arange(n)) + max(arange(n) * 0.5, axis=0)) * x

# so does where() between weak values: a sinusoidal encoding of f32 x is f32
def encoded(x):
    i = arange(x.shape[0])
    return x + where(i % 2 == 0, sin(i * 0.5), cos(i * 0.5)), where(x > 2, i, 0.5) * x

def xent(p, labels: i64[n]):
    return -sum(one_hot(labels, p.shape[1]) * log(p))

def causal(s):
    n = s.shape[0]
    return sum(log(sum(exp(where(arange(n)[:, None] >= arange(n)[None, :], s, -1e30)), axis=1)))

def count(x, n: i64):
    return sum(x) * arange(n)

def between(a: i64, b: i64):
    return arange(a, b)
"""

RNG = np.random.default_rng(7)
M = dsl.loads(SOURCE)


def test_arange_is_numpys_for_sizes_steps_and_floats():
    for n in (0, 1, 5, 7):
        got = M.ranges(np.zeros(n))
        expected = [np.arange(n), np.arange(2, 9), np.arange(9, 2, -2),
                    np.arange(0.5, 2.0, 0.25), np.arange(n - 1, -1, -1),
                    np.arange(1, n, 3) * 0.5, np.arange(2, n + 4, 3)]
        for g, e in zip(got, expected):
            assert g.dtype == e.dtype and g.shape == e.shape
            np.testing.assert_array_equal(g, e)
    # a run-time integer argument is compiled for its value, as a const one
    np.testing.assert_array_equal(M.count(np.ones(2), 4), 2.0 * np.arange(4))
    # two of them, each asked for in turn (one retry used to let the second escape)
    np.testing.assert_array_equal(M.between(2, 5), np.arange(2, 5))


@pytest.mark.parametrize("bounds", ["0.0, 1e-300, 1e300", "0.0, -1e-300, 1e300",
                                    "-1e-300, 0.0, -1e300", "1.0, 1.0, 1e300"])
def test_an_arange_whose_count_underflows_is_numpys(bounds):
    # (stop - start) / step underflowing to 0 counted no value; NumPy has
    # start, one value, where stop lies beyond start in step's direction
    m = dsl.loads(f"def f(x):\n    return arange({bounds}) + x\n")
    expected = np.arange(*map(float, bounds.split(", ")))
    got = m.f(0.0)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_arange_and_one_hot_are_weakly_typed_like_literals():
    x = np.arange(1.0, 5.0, dtype=np.float32)
    scaled, flipped, converted, carried = M.weak(x)  # carried: as from `s = 0.0`
    assert scaled.dtype == flipped.dtype == converted.dtype == carried.dtype == np.float32
    np.testing.assert_array_equal(carried, 2 * x)
    np.testing.assert_allclose(scaled, np.exp(np.arange(4) * -0.5) * x, rtol=1e-6)
    np.testing.assert_array_equal(flipped, (1 - np.arange(4)[::-1]) * x)
    np.testing.assert_array_equal(converted, np.arange(4))
    labels = np.array([3, 0, 0, 1])
    laid_out = M.laid_out(x, labels)
    expected = (np.eye(4)[labels].T @ x, (np.arange(4) * 0.5).reshape(2, 2).T @ x[:2],
                np.broadcast_to(np.arange(4) * x, (2, 4)), [0, 0.5, 1.0, 1.5, 0, 1], np.stack([np.arange(4.0)] * 2) *
                [[1], [2]] * x, (3.0 + 1.5 + 1.5) * x)
    for got, want in zip(laid_out, expected):
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
    i = np.arange(4)
    for got, want in zip(M.encoded(x), (x + np.where(i % 2 == 0, np.sin(i * 0.5),
                                                     np.cos(i * 0.5)).astype(np.float32),
                                        np.where(x > 2, i, 0.5) * x), strict=True):
        assert got.dtype == np.float32  # (it was f64: where gave its NumPy dtype)
        np.testing.assert_allclose(got, want, rtol=1e-6)
    m = dsl.loads("def f(x: i32[n]):\n    return arange(x.shape[0]) + x\n"
                  "def r(x) -> f32[n]:\n    return arange(x.shape[0]) * 0.5\n"
                  "def q(x) -> i64[n]:\n    return arange(x.shape[0]) * 0.5\n")
    assert m.f(np.arange(3, dtype=np.int32)).dtype == np.int32  # as x + 1
    np.testing.assert_array_equal(m.r(np.zeros(3)), np.arange(3, dtype=np.float32) * 0.5)
    with pytest.raises(dsl.GradError, match=r"<string>:5:13: error: the weakly typed f64 "
                                            r"result of q\(\) is not a value of its dtype i64"):
        m.q(np.zeros(3))


def test_weak_values_in_run_time_branches_and_ranges_beyond_the_dtype():
    m = dsl.loads("def f(x, t):\n"
                  "    if t > 0:\n"
                  "        s = arange(x.shape[0])\n"
                  "        c = 2.5\n"
                  "    else:\n"
                  "        s = x\n"
                  "        c = t\n"
                  "    return s, c\n"
                  "def big(k: i32[n]):\n"
                  "    return arange(2147483646, 2147483649) + k\n"
                  "def big_result(k) -> i32[3]:\n"
                  "    return arange(2147483646, 2147483649)\n"
                  "def masks(x):\n"
                  "    m = x > 0\n"
                  "    return m == arange(x.shape[0]), concatenate([m, arange(2)]), where(m, 2, m)\n")
    # a branch's arange takes the other's dtype, as a number does; a float
    # number against an i32 makes both f64 (as where does), not 2
    for t, expected in ((np.int32(1), ([0, 1, 2], 2.5)), (np.int32(-1), ([5, 6, 7], -1.0))):
        s, c = m.f(np.array([5, 6, 7], dtype=np.float32), t)
        assert s.dtype == np.float32 and c.dtype == np.float64
        np.testing.assert_array_equal(s, expected[0])
        assert c == expected[1]
    with pytest.raises(dsl.GradError, match=r"<string>:10:12: error: the constant 2147483648 "
                                            r"does not fit in i32"):
        m.big(np.zeros(3, dtype=np.int32))
    with pytest.raises(dsl.GradError, match=r"<string>:11:22: error: the constant 2147483648"):
        m.big_result(0)
    # an integer (number or arange) meeting bools is an integer, as in NumPy
    # 2, not a bool: 2 == True is False, and 2 stays 2
    x = np.array([1.0, -1.0, 1.0, 1.0])
    for got, expected in zip(m.masks(x), ((x > 0) == np.arange(4),
                             np.concatenate([x > 0, np.arange(2)]), np.where(x > 0, 2, x > 0)),
                             strict=True):
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("expression", [
    "reshape(arange(2 ** 31, 2 ** 31 + 6), (2, 3)) + reshape(k, (2, 3))",
    "broadcast_to(arange(2 ** 31, 2 ** 31 + 6), (2, 6)) + k",
    "concatenate([arange(3), arange(2 ** 31, 2 ** 31 + 3)]) + k",
    "stack([arange(2 ** 31, 2 ** 31 + 6)])[0] + k",
    "arange(2 ** 31, 2 ** 31 + 7)[1:] + k",
    "arange(2 ** 31, 2 ** 31 + 6)[5] + k",  # a slice, then a reshape: it wrapped around
    "arange(2 ** 31, 2 ** 31 + 6)[:, None][::2, 0] + k[:3]",
    "where(k > 0, arange(6), arange(2 ** 31, 2 ** 31 + 6)) + k"])
def test_an_arange_beyond_the_dtype_is_refused_through_layout_ops(expression):
    # its values reach the i32 result unchanged: an error, not a wraparound
    m = dsl.loads(f"def f(k: i32[6]):\n    return {expression}\n")
    with pytest.raises(dsl.GradError, match=r"<string>:2:12: error: the constant 2147483648 "
                                            r"does not fit in i32"):
        m.f(np.zeros(6, dtype=np.int32))


def test_an_integer_reduction_of_an_arange_is_not_weak():
    # its value is not known at compile time, so not checked as a weak
    # value's: as i32 the sum wrapped around to 704982705
    m = dsl.loads("def f(k: i32):\n    return sum(arange(100000)) + k, max(arange(2 ** 31, "
                  "2 ** 31 + 6)) + k, min(arange(-2 ** 31 - 6, -2 ** 31)) + k\n")
    total, top, bottom = m.f(np.int32(1))
    assert (total.dtype, top.dtype, bottom.dtype) == (np.int64,) * 3
    assert (total, top, bottom) == (4999950001, 2 ** 31 + 6, -2 ** 31 - 5)


def test_an_arange_beyond_the_dtype_is_refused_in_a_loop_and_at_an_annotation():
    # read in a loop's body (lowered by a builder of its own): it gave [0, 2, 4, ...]
    looped = dsl.loads("def h(k: i32[6]):\n    a = arange(2 ** 31, 2 ** 31 + 6)\n"
                       "    for i in range(2):\n        k = k + reshape(a, (6,))\n    return k\n")
    with pytest.raises(dsl.GradError, match=r"<string>:4:17: error: the constant 2147483648"):
        looped.h(np.zeros(6, dtype=np.int32))
    annotated = dsl.loads("def g() -> i32[2, 3]:\n"
                          "    return reshape(arange(2 ** 31 - 3, 2 ** 31 + 3), (2, 3))\n")
    with pytest.raises(dsl.GradError, match="the constant 2147483650 does not fit in i32"):
        annotated.g()


def _xent_reference(p, labels):
    return -np.sum(np.eye(p.shape[1])[labels] * np.log(p))


def _causal_reference(s):
    masked = np.where(np.tril(np.ones(s.shape, bool)), s, -1e30)
    return np.sum(np.log(np.sum(np.exp(masked), axis=1)))


P = RNG.uniform(0.1, 1.0, size=(6, 4))
LABELS = np.array([0, 3, 1, -1, 2, 3])


def test_cross_entropy_stays_f32_and_its_gradient_matches_differences():
    value32, grad32 = dsl.value_and_grad(M.xent)(P.astype(np.float32), LABELS)
    assert value32.dtype == grad32.dtype == np.float32
    value, grad = dsl.value_and_grad(M.xent)(P, LABELS)
    expected = _xent_reference(P, LABELS % 4)
    np.testing.assert_allclose(value, expected, rtol=1e-12)
    np.testing.assert_allclose(value32, expected, rtol=1e-5)
    np.testing.assert_allclose(grad, central_difference(_xent_reference, (P, LABELS), 0),
                               rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(grad32, grad, rtol=1e-5)


def test_causal_mask_value_and_gradient_match_numpy_and_differences():
    s = RNG.normal(size=(5, 5))
    value, grad = dsl.value_and_grad(M.causal)(s)
    np.testing.assert_allclose(value, _causal_reference(s), rtol=1e-12)
    np.testing.assert_allclose(grad, central_difference(_causal_reference, (s,), 0), atol=1e-7)
    assert np.all(np.triu(grad, 1) == 0)  # the masked scores get nothing


def test_vmap_and_jvp_go_through_arange_and_one_hot():
    p, labels = RNG.uniform(0.1, 1.0, size=(3, 4, 5)), RNG.integers(-5, 5, size=(3, 4))
    grads = dsl.vmap(dsl.grad(M.xent))(p, labels)  # labels mapped: a stacked take
    np.testing.assert_allclose(grads, -np.eye(5)[labels] / p, rtol=1e-12)
    s, t = RNG.normal(size=(4, 4)), RNG.normal(size=(4, 4))
    value, tangent = dsl.jvp(M.causal, (s,), (t,))
    eps = 1e-6
    difference = (_causal_reference(s + eps * t) - _causal_reference(s - eps * t)) / (2 * eps)
    np.testing.assert_allclose(value, _causal_reference(s), rtol=1e-12)
    np.testing.assert_allclose(tangent, difference, rtol=1e-6)


def test_on_cuda_values_gradients_and_the_label_check_are_numpys():
    cuda = dsl.loads(SOURCE, target="cuda", host_results=True)
    s = RNG.normal(size=(4, 4))
    np.testing.assert_allclose(cuda.causal(s), _causal_reference(s), rtol=1e-12)
    p, labels = P[:3].astype(np.float32), np.array([3, -4, 0])
    np.testing.assert_allclose(dsl.grad(cuda.xent)(p, labels), -np.eye(4)[labels] / p,
                               rtol=1e-6)
    np.testing.assert_array_equal(cuda.ranges(np.zeros(5))[3], np.arange(0.5, 2.0, 0.25))
    with pytest.raises(dsl.ArgumentError, match=r"index 4 in 'labels'"):
        cuda.xent(p, np.array([0, 4, 1]))


def test_a_label_out_of_range_is_refused_before_any_result():
    line = SOURCE.splitlines().index("def xent(p, labels: i64[n]):") + 2
    for bad, value in ((np.array([0, 4, 1, 0, 0, 0]), 4), (np.array([0, 1, -5, 0, 0, 0]), -5)):
        with pytest.raises(dsl.ArgumentError, match=rf"<string>:{line}:17: error: index "
                                                    rf"{value} in 'labels' is out of range "
                                                    r"for an axis of size 4 \(valid: -4 to 3\)"):
            dsl.value_and_grad(M.xent)(P, bad)


ERRORS = [
    ("arange(sum(x))", "each argument of arange\\(\\) must be known when the function is "
     "compiled"),
    ("arange(0, 5, 0)", "arange\\(\\) step cannot be zero"),
    ("arange(0, 1e400)", "arange\\(\\) needs finite arguments"),
    ("arange(True)", "each argument of arange\\(\\) must be a number, not True"),
    ("one_hot(x, 3)", "an index must be an integer array \\(i32 or i64\\), not f64"),
    ("one_hot(k, -2)", "num_classes cannot be negative, got -2"),
    ("one_hot(k, 2.5)", "num_classes must be an integer, not 2.5"),
    ("one_hot(k, x[0])", "num_classes must be known when the function is compiled"),
    # (a count beyond 2**63 was an OverflowError from counting its range)
    ("one_hot(k, 10**20)", "f\\(\\): a value of type i64\\[100000000000000000000\\] needs more "
     "memory than can be addressed"),
]


@pytest.mark.parametrize("call,message", ERRORS, ids=[c for c, _ in ERRORS])
def test_misuse_is_an_error_at_the_call(call, message):
    m = dsl.loads(f"def f(x, k: i64[n]):\n    return sum(x) + sum({call})\n")
    with pytest.raises(dsl.GradError, match=rf"<string>:2:25: error: {message}"):
        m.f(np.ones(3), np.array([0, 1]))


def test_dask_blocks_take_one_hot_and_arange_but_refuse_numbering_the_rows():
    dask = optional_module("dask", "dask")
    da = optional_module("dask.array", "dask")
    m = dsl.loads("def f(x, labels):\n"
                  "    return sum(one_hot(labels, x.shape[1]) * x)\n"
                  "def g(x):\n"
                  "    return sum(x * arange(x.shape[0])[:, None])\n")
    x, labels = RNG.normal(size=(8, 4)), RNG.integers(0, 4, size=8)
    xs, ls = da.from_array(x, chunks=(3, 4)), da.from_array(labels, chunks=3)
    expected = np.sum(np.eye(4)[labels] * x)
    with dask.config.set(scheduler="synchronous"):
        np.testing.assert_allclose(m.f(xs, ls).compute(), expected, rtol=1e-12)
    with pytest.raises(dsl.GradError, match=r"<string>:4:20: error: `arange\(x.shape\[0\]\)` "
                                            r"numbers the rows "
                                            r"of the batch"):
        m.g(xs)


def test_the_bridges_compile_for_each_integer_giving_a_size_in_turn():
    # JAX's traced calls and Dask's split retried once: the second argument's
    # NeedsValue escaped (each bridge on a fresh function, which knows neither)
    jax, da = pytest.importorskip("jax"), pytest.importorskip("dask.array")
    source = "def g(x, a: i64, b: i64):\n    return x * sum(arange(a, b))\n"
    x = np.arange(4.0)
    g = dsl.to_jax(dsl.loads(source).g)
    got = jax.jit(lambda x: g(x, 2, 5))(jax.numpy.asarray(x))
    np.testing.assert_array_equal(np.asarray(got), 9.0 * x)
    got = dsl.loads(source).g(da.from_array(x, chunks=2), 2, 5)
    np.testing.assert_array_equal(np.asarray(got), 9.0 * x)
