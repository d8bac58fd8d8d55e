"""`dsl.vjp` and a tape's recorded calls build one pair of split programs
per size pattern (`dsl.function.vjp_entry`), not one per length: a
training loop over sequences of varying length compiles once.  The
backward binds the sizes none of its residuals carry from a residual of no
elements (`pipeline.carrying_sizes`); a function that needs its sizes
falls back to a program per signature, kept in a bounded cache.  Values
against NumPy, gradients against the closed form and central differences
(f64); the pullback keeps copies, never the caller's arrays."""
import numpy as np
import pytest

import dsl
from dsl import function
from gradlang.compiler import pipeline
from helpers import central_difference

# each function is used by one test alone: the tests count their builds
M = dsl.loads("""
def smooth(x, y):
    return sum(x * y) + mean(exp(x))

def scaled(x, y):
    return mean(x) * y + sum(x)

def row_norms(a):
    return sum(a * a, axis=1)

def taped(x, y):
    return mean(x) * y

def edited(x, y):
    return sum(x) * y + sum(x * x)

def total(x):
    return sum(x)

def summed(x):
    return sum(x)
""")

LENGTHS = (2, 4, 17, 5, 64, 2, 250, 9, 1000, 31)  # (not 3: a row_norms' (3, 3) is another pattern)


@pytest.fixture
def builds(monkeypatch):
    """The functions whose split programs were built, one entry a build."""
    built = []
    real = pipeline.vjp_programs

    def counting(fn, wrt, target):
        built.append(fn.name)
        return real(fn, wrt, target)
    monkeypatch.setattr(pipeline, "vjp_programs", counting)
    return built


def smooth(x, y):
    return np.sum(x * y) + np.mean(np.exp(x))


def scaled(x, y):
    return np.mean(x) * y + np.sum(x)


def test_one_program_over_many_lengths(builds):
    rng = np.random.default_rng(0)
    for n in LENGTHS:
        x, y = rng.normal(size=n), rng.normal(size=n)
        value, pullback = dsl.vjp(M.smooth, x, y)
        np.testing.assert_allclose(value, smooth(x, y), rtol=1e-12)
        gx, gy = pullback(2.5)
        np.testing.assert_allclose(gx, 2.5 * (y + np.exp(x) / n), rtol=1e-12)
        np.testing.assert_allclose(gy, 2.5 * x, rtol=1e-12)
        # a backward broadcasting its cotangent (sum, mean) to x's length,
        # which only the carried sizes give, and to y's, another length
        y = rng.normal(size=n + 1)
        w = rng.normal(size=n + 1)
        value, pullback = dsl.vjp(M.scaled, x, y)
        np.testing.assert_allclose(value, scaled(x, y), rtol=1e-12)
        gx, gy = pullback(w)
        np.testing.assert_allclose(gx, np.full(n, (w * y).sum() / n + w.sum()), rtol=1e-12)
        np.testing.assert_allclose(gy, w * x.mean(), rtol=1e-12)
        a = rng.normal(size=(n, 3))
        value, pullback = dsl.vjp(M.row_norms, a)
        np.testing.assert_allclose(value, (a * a).sum(axis=1), rtol=1e-12)
        (ga,) = pullback(w[:n])
        np.testing.assert_allclose(ga, 2 * a * w[:n, None], rtol=1e-12)
    assert sorted(builds) == ["row_norms", "scaled", "smooth"]
    # a cotangent is checked against its call's output shape, not the pattern's
    with pytest.raises(dsl.ArgumentError, match=r"shape \[4\]; the output has shape \[3\]"):
        dsl.vjp(M.row_norms, np.ones((3, 3)))[1](np.ones(4))
    for n in (2, 7):  # and against central differences (of the output's sum)
        x, y = rng.normal(size=n), rng.normal(size=n + 1)
        gx, gy = dsl.vjp(M.scaled, x, y)[1](np.ones(n + 1))
        np.testing.assert_allclose(gx, central_difference(scaled, (x, y), 0), rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(gy, central_difference(scaled, (x, y), 1), rtol=1e-6, atol=1e-9)


def test_f32_is_a_pattern_of_its_own(builds):
    for n in (4, 40):
        x = np.linspace(0.0, 1.0, n, dtype=np.float32)
        value, pullback = dsl.vjp(M.total, x)
        assert value.dtype == np.float32
        np.testing.assert_allclose(value, np.sum(x, dtype=np.float64), rtol=1e-6)
        (g,) = pullback(np.float32(3.0))
        assert g.dtype == np.float32
        np.testing.assert_array_equal(g, np.full(n, 3.0, np.float32))
        (g,) = dsl.vjp(M.total, x.astype(np.float64))[1](2.0)
        np.testing.assert_array_equal(g, np.full(n, 2.0))
    assert builds == ["total", "total"]


def test_a_tape_records_every_length_with_one_program(builds):
    for n in (3, 12, 40):
        x, y = np.linspace(0.0, 1.0, n), np.linspace(1.0, 2.0, n + 2)
        with dsl.Tape() as tape:
            tape.watch(x)
            tape.watch(y)
            z = M.taped(x, y)
        gx, gy = tape.gradient(z, [x, y])
        np.testing.assert_allclose(gx, np.full(n, y.sum() / n), rtol=1e-12)
        np.testing.assert_allclose(gy, np.full(n + 2, x.mean()), rtol=1e-12)
    assert builds == ["taped"]


def test_the_pullback_keeps_copies_and_sizes_not_the_arguments():
    for n in (4, 9):
        x, y = np.linspace(0.0, 1.0, n), np.linspace(1.0, 2.0, n + 1)
        want = 2.0 * (y.sum() + 2 * (n + 1) * x), np.full(n + 1, 2.0 * x.sum())
        value, pullback = dsl.vjp(M.edited, x, y)
        x[:] = 100.0  # edited in place after the forward
        y[:] = -7.0
        gx, gy = pullback(np.full(n + 1, 2.0))
        np.testing.assert_allclose(gx, want[0], rtol=1e-12)
        np.testing.assert_allclose(gy, want[1], rtol=1e-12)
        assert not any(np.may_share_memory(r, a) for r in pullback.residuals for a in (x, y))
    # sum(x)'s backward reads no value: it keeps x's length, in no bytes
    value, pullback = dsl.vjp(M.summed, np.arange(6.0))  # (total's builds are counted)
    assert pullback.residual_bytes == 0
    np.testing.assert_array_equal(pullback(1.5)[0], np.full(6, 1.5))


def test_a_function_needing_its_sizes_builds_per_length_in_bounded_caches(
        builds, monkeypatch):
    monkeypatch.setattr(function, "VJP_PROGRAMS", 3)
    monkeypatch.setattr(function, "PROGRAMS", 3)  # (grad's, read as a callable is made)
    # (a slice at half a symbolic axis needs concrete sizes; x[1:] and
    # x[::2] no longer do)
    f = dsl.loads("def halves(x):\n    h = x.shape[0] // 2\n"
                  "    return sum(x[:h]) * sum(x[h:])\n").halves

    def halves(v):
        return np.sum(v[:len(v) // 2]) * np.sum(v[len(v) // 2:])
    gradient = dsl.grad(f)
    lengths = (3, 4, 5, 6, 7, 3)
    for n in lengths:
        x = np.linspace(0.5, 2.0, n)
        value, pullback = dsl.vjp(f, x)
        np.testing.assert_allclose(value, halves(x), rtol=1e-12)
        np.testing.assert_allclose(pullback(1.0)[0], central_difference(halves, (x,), 0),
                                   rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(gradient(x), pullback(1.0)[0], rtol=1e-12)
        assert len(f.__dict__["_vjp_programs"]) <= 3 and len(gradient._programs) <= 3
    # one build per length (the repeated 3, dropped from the cache, is the
    # fast path's of its exact arguments, `_split_run`)
    assert builds == ["halves"] * 5


def test_answers_about_exact_shapes_are_kept_in_bounded_caches(monkeypatch):
    # the result types a tracer asks for, and the Jacobians' stacking
    # plans, were kept per shape for ever (a loop over lengths grew them)
    monkeypatch.setattr(function, "SHAPES", 4)  # (read as each cache is made)
    f = dsl.loads("def g(x):\n    return exp(x) * 2.0\n").g
    jacobian = dsl.jacfwd(f)
    for n in range(1, 11):
        x = np.linspace(-1.0, 1.0, n)
        assert function.result_types(f, f.bind((x,), {})) == (((n,), np.dtype(np.float64)),)
        np.testing.assert_allclose(jacobian(x), np.diag(2.0 * np.exp(x)), rtol=1e-15)
    assert len(f._result_types) == 4
    assert len(function.derived_if_made(f, ("stacked jvp", "x"))._plans) == 4
