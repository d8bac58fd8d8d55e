"""The per-call fast path (`dsl.function.FastPath`) never runs a program on
a call it does not fit: each test changes one thing between calls of the
same callable (dtype, size pattern, layout, const value, param, tape) and
checks every result against NumPy, and that bad arguments still raise
`ArgumentError` after the fast path has remembered good ones."""
import numpy as np
import pytest

import dsl

M = dsl.loads("""
param w: f64[m]

def mul_add(x, y):
    return x * y + x

def log1pexp(x):
    return log(1 + exp(x))

def typed(x: f64[n]):
    return x * 2.0

def take(x: f64[n], k: const i64):
    return x * k

def weighted(x):
    return sum(w) * x
""")


def mul_add(x, y):
    return x * y + x


def test_remembers_plain_calls():
    f = dsl.value_and_grad(M.log1pexp)
    x = np.linspace(-2.0, 2.0, 5)
    for _ in range(3):
        v, g = f(x)
        np.testing.assert_allclose(v, np.log1p(np.exp(x)), rtol=1e-12)
        np.testing.assert_allclose(g, 1 / (1 + np.exp(-x)), rtol=1e-12)
    assert len(f._fast._entries) == 1  # the calls after the first took the fast path


def test_dtype_changes_between_calls():
    x = np.linspace(-1.0, 1.0, 4)
    for dtype in (np.float64, np.float32, np.float64, np.int64, np.float32):
        a = x.astype(dtype) if dtype != np.int64 else np.arange(4)
        out = M.mul_add(a, a)
        assert out.dtype == a.dtype
        np.testing.assert_allclose(out, mul_add(a, a), rtol=1e-6)


@pytest.mark.parametrize("shapes", [
    [((3,), (3,)), ((3,), (1,)), ((3,), (3,)), ((1,), (3,)), ((2, 3), (3,)), ((3,), (3,))],
    [((4,), (4,)), ((4,), (5,)), ((5,), (5,)), ((2, 3), (2, 3)), ((2, 3), (3, 2))],
    [((), ()), ((), (3,)), ((3,), ()), ((1,), (1,)), ((), ())],
])
def test_size_pattern_changes_between_calls(shapes):
    """Equal sizes share a symbol, size 1 broadcasts, mismatches raise."""
    rng = np.random.default_rng(0)
    for xs, ys in shapes:
        x, y = rng.normal(size=xs), rng.normal(size=ys)
        try:
            want = mul_add(x, y)
        except ValueError:  # NumPy cannot broadcast them either
            with pytest.raises(dsl.GradError):
                M.mul_add(x, y)
            continue
        np.testing.assert_allclose(M.mul_add(x, y), want, rtol=1e-12)


def layouts():
    base = np.arange(24.0).reshape(4, 6) / 7
    return [base, np.asfortranarray(base), base[:, ::2].copy(), base[::-1],
            base[:, ::-1], np.asfortranarray(base)[::-1, ::2], base[:, ::2], base.T.copy().T,
            base, np.array(1.5), base.reshape(-1)[::-3], base.reshape(-1)[::3]]


def test_layout_changes_between_calls():
    f = dsl.grad(M.log1pexp)
    for x in layouts() + layouts()[::-1]:
        np.testing.assert_allclose(M.log1pexp(x), np.log1p(np.exp(x)), rtol=1e-12)
        np.testing.assert_allclose(f(x), 1 / (1 + np.exp(-x)), rtol=1e-12)
        y = x[..., ::-1] if x.ndim else x
        np.testing.assert_allclose(M.mul_add(x, y), mul_add(x, y), rtol=1e-12)


def test_const_value_changes_between_calls():
    x = np.array([1.0, -2.0, 3.0])
    for k in (2, 3, 2, -1, 3):
        np.testing.assert_array_equal(M.take(x, np.array(k)), x * k)
        np.testing.assert_array_equal(M.take(x, k), x * k)


def test_param_value_and_shape_change_between_calls():
    x = np.array([1.0, 2.0])
    for w in (np.ones(2), np.array([1.0, 4.0]), np.ones(3), np.array([0.5]), np.ones(2)):
        M.params["w"] = w
        np.testing.assert_allclose(M.weighted(x), w.sum() * x)
        np.testing.assert_allclose(dsl.grad(M.weighted)(x), np.full(2, w.sum()))


def test_tape_state_changes_between_calls():
    x = np.array([0.5, -1.0, 2.0])
    want = 1 / (1 + np.exp(-x))
    f = M.log1pexp
    for _ in range(2):
        np.testing.assert_allclose(f(x), np.log1p(np.exp(x)), rtol=1e-12)
        with dsl.Tape() as tape:
            tape.watch(x)
            y = f(x)  # the same array and key as the remembered call: must be recorded
            z = f(y)  # a tape's array (an ndarray subclass) as an argument
        np.testing.assert_allclose(tape.gradient(z, x), want / (1 + np.exp(-y)), rtol=1e-12)
        with dsl.Tape():  # a tape that watches nothing: plain results
            np.testing.assert_allclose(f(x), np.log1p(np.exp(x)), rtol=1e-12)


def test_bad_arguments_still_raise_after_good_calls():
    x = np.linspace(0.0, 1.0, 3)
    np.testing.assert_allclose(M.typed(x), 2 * x)
    entries = M.typed._fast._entries
    runs = []  # count the remembered driver's runs: a bad call must never reach it
    for key, run in entries.items():
        entries[key] = lambda *a, run=run: runs.append(1) or run(*a)
    np.testing.assert_allclose(M.typed(x), 2 * x)
    assert runs == [1]
    for bad, message in [(x.astype(np.float32), "has dtype f32, but its annotation"),
                         (x.reshape(3, 1), "has rank 2"),
                         (np.array(1.0), "has rank 0"),
                         (x.astype(np.complex128), "unsupported dtype"),
                         (x.astype(">f8"), "unsupported dtype")]:
        with pytest.raises(dsl.ArgumentError, match=message):
            M.typed(bad)
        np.testing.assert_allclose(M.typed(x), 2 * x)
    with pytest.raises(dsl.ArgumentError, match="takes 1 argument"):
        M.typed(x, x)
    with pytest.raises(dsl.ArgumentError, match="no parameter 'y'"):
        M.typed(x, y=x)
    assert len(runs) == 1 + 5  # the good call after each bad one


def test_big_endian_array_is_not_taken_for_a_native_one():
    f = M.mul_add
    x = np.linspace(0.0, 1.0, 3)
    f(x, x)
    f(x, x)
    with pytest.raises(dsl.ArgumentError, match="unsupported dtype"):
        f(x.astype(">f8"), x)


def test_cuda_target_calls_stay_correct():
    pytest.importorskip("numba_cuda")
    from gradlang.runtime import cuda as rcuda
    m = dsl.loads("def f(x, y):\n    return x * y + x\n", target="cuda")
    rng = np.random.default_rng(1)
    for shape in [(5,), (5,), (2, 3), (5,)]:
        x, y = rng.normal(size=shape), rng.normal(size=shape)
        out = m.f(x, y)
        out = out if isinstance(out, np.ndarray) else rcuda.to_host(out)
        np.testing.assert_allclose(out, mul_add(x, y), rtol=1e-12)
    assert not m.f._fast._entries  # host arrays are copied to the device: no fast path
