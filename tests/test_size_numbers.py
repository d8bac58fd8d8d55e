"""A float that compile-time arithmetic makes of a symbolic size (label
smoothing's `smoothing / k`, `1.0 / n`) is computed at run time, so the
program stays symbolic: a new batch size (a last, smaller batch) compiles
nothing.  Values and gradients as NumPy's (f64) at every size."""
import numpy as np
import pytest

import dsl
import dsl.function
from helpers import central_difference

# (the loss of log-probabilities: a log_softmax compiles more kernels)
SMOOTHING = """
def smoothed(p: f64[b, k], labels: i64[b], smoothing: const = 0.1):
    target = one_hot(labels, p.shape[1]) * (1.0 - smoothing) + smoothing / p.shape[1]
    return -mean(sum(target * log(p), axis=1))
"""


def counting_builds(monkeypatch) -> list:
    """The argument types of each program built from here on (one per
    program a callable compiles: its key's types)."""
    built = []
    build_stored = dsl.function.build_stored

    def counted(key, *args, **kwargs):
        built.append(key[2])
        return build_stored(key, *args, **kwargs)
    monkeypatch.setattr(dsl.function, "build_stored", counted)
    return built


def smoothed_reference(p, labels, smoothing=0.1):
    """NumPy's value and gradient (in p) of the label-smoothed loss."""
    b, k = p.shape
    target = np.eye(k)[labels] * (1 - smoothing) + smoothing / k
    return -np.mean(np.sum(target * np.log(p), axis=1)), -target / (p * b)


def test_label_smoothing_compiles_once_for_every_batch_size(monkeypatch):
    # `smoothing / k` made the program concrete in every size, so each
    # batch size (the last, smaller batch of an epoch) compiled it again
    built = counting_builds(monkeypatch)
    m = dsl.loads(SMOOTHING, "smoothed.grad")
    value_and_grad = dsl.value_and_grad(m.smoothed)
    rng = np.random.default_rng(0)
    for b, k in ((6, 4), (5, 4), (5, 3)):  # (a new class count too)
        p, labels = rng.uniform(0.1, 1, size=(b, k)), rng.integers(0, k, b)
        value, grad = value_and_grad(p, labels)
        want, want_grad = smoothed_reference(p, labels)
        np.testing.assert_allclose(value, want, rtol=1e-14)
        np.testing.assert_allclose(grad, want_grad, rtol=1e-14)
        np.testing.assert_allclose(  # (and the reference's, by central differences)
            want_grad, central_difference(lambda x: smoothed_reference(x, labels)[0], [p], 0),
            rtol=1e-7)
    assert len(built) == 1, built


def test_a_number_of_sizes_takes_the_arrays_dtype_as_the_folded_one_did(monkeypatch):
    # computed in f64 (as compile-time arithmetic folds it), then rounded
    # once to the f32 of the arrays it meets: the value a concrete program
    # had, bit for bit; an integer array makes it f64, as a float literal does
    built = counting_builds(monkeypatch)
    m = dsl.loads("def scaled(x):\n    return x * (0.3 / x.shape[0]) + x.shape[0] * 0.5\n"
                  "def ints(i):\n    return i * (1 / i.shape[0])\n", "scaled.grad")
    for n in (3, 7):
        x = np.linspace(-1, 1, n, dtype=np.float32)
        got = m.scaled(x)
        assert got.dtype == np.float32
        assert got.tobytes() == (x * np.float32(0.3 / n) + np.float32(n * 0.5)).tobytes()
        i = np.arange(n)
        assert m.ints(i).dtype == np.float64
        np.testing.assert_array_equal(m.ints(i), i * (1 / n))
    assert len(built) == 2, built  # (one program each)


def test_dividing_by_a_size_of_zero_is_an_error_at_the_division():
    # Python's 0.1 / 0 raises (the concrete lowering's compile-time
    # error): computed at run time it is checked, not an infinity
    m = dsl.loads("def f(x):\n    return sum(x) + 0.1 / x.shape[0]\n", "zero.grad")
    assert m.f(np.ones(4)) == pytest.approx(4.025, rel=1e-15)
    with pytest.raises(dsl.ArgumentError, match=r"zero.grad:2:21: error: division by zero: "
                                                "a size this divides by is 0 in this call"):
        m.f(np.ones(0))


def test_a_zero_size_divided_by_raises_where_nothing_differentiated_reads_it():
    # the gradient of sum(x * 2) does not read 1 / n, so its division's
    # check went with it: grad returned an empty array where the call
    # raises (a check survives dead code as an index's does)
    m = dsl.loads("def g(x):\n    return sum(x * 2.0) + 1.0 / x.shape[0]\n", "dead.grad")
    np.testing.assert_array_equal(dsl.grad(m.g)(np.ones((2, 3))), np.full((2, 3), 2.0))
    x = np.ones((0, 3))
    for call in (m.g, dsl.grad(m.g), dsl.value_and_grad(m.g),
                 lambda x: dsl.jvp(m.g, (x,), (x,))):
        with pytest.raises(dsl.ArgumentError, match=r"dead.grad:2:27: error: division by zero"):
            call(x)
    # in a loop's body, where its trips run (a loop of no trips divides by nothing)
    m = dsl.loads("def h(x, n: i64):\n    for i in range(n):\n        t = 1.0 / x.shape[0]\n"
                  "    return sum(x)\n", "loop.grad")
    np.testing.assert_array_equal(dsl.grad(m.h)(x, 0), np.ones((0, 3)))
    with pytest.raises(dsl.ArgumentError, match=r"loop.grad:3:13: error: division by zero"):
        dsl.grad(m.h)(x, 2)


def test_attention_scaled_by_the_root_of_a_size_compiles_once(monkeypatch):
    # sqrt(d) made the program concrete in every size, so each batch size
    # compiled again; IEEE sqrt rounds as folding does: the same bits
    built = counting_builds(monkeypatch)
    m = dsl.loads("def scores(q, k):\n    return q * k / sqrt(q.shape[1])\n", "scores.grad")
    grad = dsl.grad(m.scores)
    rng = np.random.default_rng(1)
    for b, d in ((8, 3), (7, 3), (7, 5)):
        q, k = rng.normal(size=(b, d)).astype(np.float32), rng.normal(size=(b, d))
        got = m.scores(q, k.astype(np.float32))
        assert got.tobytes() == (q * k.astype(np.float32) / np.float32(np.sqrt(d))).tobytes()
        np.testing.assert_allclose(grad(q.astype(np.float64), k), k / np.sqrt(d), rtol=1e-15)
    assert len(built) == 2, built  # (one program each)


def test_a_size_divided_by_is_checked_where_nothing_reads_the_quotient():
    # grad in x does not read (1.0 / n) * sum(y): DCE dropped the size's
    # nonzero check with it, so at n = 0 the gradient returned values where
    # the call raises (and where folding 1.0 / 0 raised before)
    m = dsl.loads("def f(x, y):\n    return sum(x * x) + (1.0 / y.shape[0]) * sum(y)\n",
                  "dead_quotient.grad")
    x = np.array([1.0, 2.0])
    np.testing.assert_array_equal(dsl.grad(m.f)(x, np.ones(3)), 2 * x)  # (symbolic in n)
    for f in (m.f, dsl.grad(m.f)):
        with pytest.raises(dsl.ArgumentError, match="division by zero") as err:
            f(x, np.zeros(0))
        assert "dead_quotient.grad:2:26" in str(err.value)


def test_an_if_on_a_number_of_sizes_lowers_only_the_arm_taken():
    # `x.shape[0] / 2 > 1.0` was a run-time if once the quotient was a
    # run-time number, so the arm not taken ran too: max of an empty y
    # raised at n = 2, where the concrete program (one arm) returns sum(x)
    m = dsl.loads("def f(x, y):\n    r = sum(x)\n    if x.shape[0] / 2 > 1.0:\n"
                  "        r = sum(x) + max(y)\n    return r\n", "size_if.grad")
    assert m.f(np.ones(2), np.zeros(0)) == 2.0
    assert m.f(np.ones(4), np.array([1.0, 5.0])) == 9.0
    np.testing.assert_array_equal(dsl.grad(m.f)(np.ones(2), np.zeros(0)), np.ones(2))


def test_a_power_of_a_number_of_sizes_gives_the_folded_bits():
    # x ** (n / 2) at n = 6 folds to x ** 3.0, which simplify makes
    # products; computed at run time it was pow(x, 3.0), an ulp off
    m = dsl.loads("def f(x):\n    return x ** (x.shape[0] / 2)\n", "size_pow.grad")
    x = np.random.default_rng(0).uniform(0.5, 2, 6)
    assert m.f(x).tobytes() == (x * x * x).tobytes()


def test_a_number_of_sizes_given_a_const_of_a_function_with_a_block_stays_weak():
    # folded, 0.3 / n is a literal, weak in hk's stage (f32 x stays f32);
    # computed at run time it was an f64 parameter of the stage: f64 result
    m = dsl.loads("def hk(x, s: const):\n    return x * s\ngrad(d):\n    return d * s\n"
                  "def f(x):\n    return hk(x, 0.3 / x.shape[0])\n", "size_const.grad")
    x = np.linspace(-1, 1, 4, dtype=np.float32)
    got = m.f(x)
    assert got.dtype == np.float32
    assert got.tobytes() == (x * np.float32(0.3 / 4)).tobytes()


def test_a_number_of_sizes_given_a_transform_in_the_language_stays_weak():
    # value_and_grad(h)(x, 0.3 / n) and jvp(h)(...) took the run-time
    # number as an f64 parameter of h's sub-function: an f64 value where
    # the concrete program (the literal baked in, weak) gives f32
    m = dsl.loads("def h(x, s):\n    return sum(x * s)\n"
                  "def f(x):\n    v, g = value_and_grad(h)(x, 0.3 / x.shape[0])\n    return v\n"
                  "def lit(x):\n    v, g = value_and_grad(h)(x, 0.075)\n    return v\n",
                  "size_transform.grad")
    x = np.linspace(-1, 1, 4, dtype=np.float32) + np.float32(0.1)
    got = m.f(x)
    assert got.dtype == np.float32
    assert got.tobytes() == m.lit(x).tobytes()  # (0.3 / 4 is 0.075, as Python folds it)
    np.testing.assert_allclose(got, np.sum(x * np.float32(0.075)), rtol=1e-6)


INTEGERS_OF_SIZES = """
def variance(x):
    return sum((x - mean(x)) ** 2) / (x.shape[0] - 1)

def halves(x):
    return x * (x.shape[0] // 2) + (x.shape[0] % 2)

def folded(x):
    return x * (5 % (x.shape[0] - 4))
"""


def test_integer_arithmetic_of_sizes_compiles_once_for_every_size(monkeypatch):
    # `x.shape[0] - 1` (and `//`, `%` of sizes) needed concrete sizes: one
    # program per length, and `gradc compile --sig 'variance(f64[:])'` said
    # "cannot be compiled for any size".  An integer computed at run time
    # (i64, weakly typed as the folded int was: f32 x stays f32), it needs
    # them only where a compile-time integer does (`x[:n // 2]`), or a
    # loop's bound (`range(n // 2)`, whose index then reads a stacked input).
    built = counting_builds(monkeypatch)
    m = dsl.loads(INTEGERS_OF_SIZES, "integers.grad")
    value_and_grad = dsl.value_and_grad(m.variance)
    for n in (3, 4, 5):
        x = np.linspace(-1.0, 2.0, n) ** 2
        value, grad = value_and_grad(x)
        np.testing.assert_allclose(value, np.var(x, ddof=1), rtol=1e-14)
        np.testing.assert_allclose(grad, central_difference(
            lambda x: np.var(x, ddof=1), [x], 0), rtol=1e-7)
        np.testing.assert_array_equal(m.halves(x), x * (n // 2) + n % 2)
    assert m.variance(np.ones(3, np.float32)).dtype == np.float32
    assert len(built) == 3, built  # (one program each, and one for f32)
    # a divisor made of sizes folds, as for concrete sizes: 0 is the error
    # compile-time arithmetic raises (the kernel's 5 % 0 gave 0)
    np.testing.assert_array_equal(m.folded(np.ones(7)), np.full(7, 2.0))
    with pytest.raises(dsl.GradError, match=r"integers.grad:9:17: error: compile-time "
                                             "arithmetic failed: division by zero"):
        m.folded(np.ones(4))


def test_an_integer_of_sizes_meeting_i32_is_checked_as_its_constant_is():
    # `y.shape[0] - 2**40`, an i64 the driver computed, was cast to i32 y's
    # dtype and wrapped around (y * 1 for n = 3), where the same number
    # written as a constant, and NumPy's, is an error; one that fits is
    # the product it is for concrete sizes
    m = dsl.loads("def f(y: i32[n]):\n    return y * (y.shape[0] - 2**40), y * (y.shape[0] - 1)\n"
                  "def g(y: i32[n]):\n    return y * (y.shape[0] - 1)\n", "i32.grad")
    y = np.array([1, -2, 3], np.int32)
    with pytest.raises(dsl.GradError, match=r"i32.grad:2:17: error: the constant "
                                             r"-1099511627773 does not fit in i32"):
        m.f(y)
    got = m.g(y)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, y * 2)


SLICES_OF_SIZES = """
def diff(x):
    return sum(sin(x[1:] - x[:-1]))

def inner(x):
    y = x[1:]
    return sum(y[:-1] * x[2:] * x[1:-1])

def grid(x: f64[n, m]):
    return sum((x[1:, :-2] - x[:-1, 2:]) ** 2)

def odd_diffs(x):
    y = x[1::2]
    return sum(sin(y[1:] - y[:-1]) * x[3::2] * x[2:-1:2])

def grid_steps(x: f64[n, m]):
    return sum(x[::2, 1:-1:3] ** 2) + sum(x[1:][::3, ::2]) + sum(x[-2:, :3] ** 2)

def ends(x):
    y = x[1:]
    return sum(sin(x[:3]) * x[-3:]) + sum(x[-3:-1] * x[1:3]) \
        + sum(y[-2:] * x[:3][1:]) + sum(x[::2][-2:] ** 2) * sum(x[:4][-2:]) \
        + sum(x[-4::2] * x[:4:2])

def flipped(x):
    return sum(x * x[::-1] * arange(x.shape[0])) + sum(x[-2::-2] * x[:0:-2]) \
        + sum(x[1:][::-1] * x[:-1])

def pushed(x):
    return sum(x[1::2] * x[:-1:2]) + sum(sin(x[-2:]) * x[:2]) + sum(concatenate([x, x]) ** 3) \
        + sum(x * x[::-1] ** 2)
"""

SLICE_REFERENCES = {"diff": lambda x: np.sum(np.sin(x[1:] - x[:-1])),
                    "inner": lambda x: np.sum(x[1:][:-1] * x[2:] * x[1:-1]),
                    "grid": lambda x: np.sum((x[1:, :-2] - x[:-1, 2:]) ** 2),
                    "odd_diffs": lambda x: np.sum(np.sin(x[1::2][1:] - x[1::2][:-1])
                                                  * x[3::2] * x[2:-1:2]),
                    "grid_steps": lambda x: np.sum(x[::2, 1:-1:3] ** 2)
                    + np.sum(x[1:][::3, ::2]) + np.sum(x[-2:, :3] ** 2),
                    "ends": lambda x: np.sum(np.sin(x[:3]) * x[-3:])
                    + np.sum(x[-3:-1] * x[1:3]) + np.sum(x[1:][-2:] * x[:3][1:])
                    + np.sum(x[::2][-2:] ** 2) * np.sum(x[:4][-2:])
                    + np.sum(x[-4::2] * x[:4:2]),
                    "flipped": lambda x: np.sum(x * x[::-1] * np.arange(len(x)))
                    + np.sum(x[-2::-2] * x[:0:-2]) + np.sum(x[1:][::-1] * x[:-1])}


def pushed(x):
    return np.sum(x[1::2] * x[:-1:2]) + np.sum(np.sin(x[-2:]) * x[:2]) \
        + np.sum(np.concatenate([x, x]) ** 3) + np.sum(x * x[::-1] ** 2)


@pytest.mark.parametrize("name", sorted(SLICE_REFERENCES))
def test_slices_with_constant_bounds_compile_once_for_every_length(name, monkeypatch):
    # `x[1:] - x[:-1]` (a finite difference) needed concrete sizes: one
    # program per length, and `gradc compile --sig` refused it.  Its
    # length is max(0, n - 1), a size computed from n where the driver
    # binds n, so it is one program, NumPy's slices to the empty ones
    # (lengths 0, 1 and 2 of `x[1:-1]`, `x[2:]`); a slice of step s
    # (`x[1::2]`, and its slices) takes ceil(max(0, n - c) / s) elements,
    # computed so too, and one to a fixed stop k or of the last k
    # (`x[:3]`, `x[-3:]`) min(n, k) of them, and one backwards from the end
    # (`x[::-1]`, `x[-2::-2]`) as many as forwards to it
    built = counting_builds(monkeypatch)
    m = dsl.loads(SLICES_OF_SIZES, "slices.grad")
    value_and_grad = dsl.value_and_grad(getattr(m, name))
    reference, rng = SLICE_REFERENCES[name], np.random.default_rng(1)
    for n in (0, 2, 3, 4, 1, 7):
        x = rng.normal(size=(n, n + 2) if name.startswith("grid") else n)
        value, grad = value_and_grad(x)
        np.testing.assert_allclose(value, reference(x), rtol=1e-13)
        np.testing.assert_allclose(grad, central_difference(reference, [x], 0),
                                   rtol=1e-6, atol=1e-9)
    # (an axis of length 1, which broadcasts, has a program of its own)
    assert len(built) == 2, built


def test_slices_and_concatenations_of_sizes_push_tangents_with_one_program(monkeypatch):
    # (forward mode through each kind of size: steps, ends, 2 n, backwards)
    built = counting_builds(monkeypatch)
    m = dsl.loads(SLICES_OF_SIZES, "slices.grad")
    rng = np.random.default_rng(3)
    for n in (0, 2, 5, 8):
        x, t = rng.normal(size=n), rng.normal(size=n)
        value, tangent = dsl.jvp(m.pushed, (x,), (t,))
        np.testing.assert_allclose(value, pushed(x), rtol=1e-13)
        np.testing.assert_allclose(tangent, central_difference(pushed, [x], 0) @ t,
                                   rtol=1e-6, atol=1e-9)
    assert len(built) == 1, built


JOINED = """
def joined(x: f64[n, m]):
    y = concatenate([x, sin(x)])
    z = concatenate([x, concatenate([x ** 2, exp(x)], axis=1)], axis=1)
    return sum(y ** 3) * sum(reshape(y, (2, x.shape[0], x.shape[1]))[1] * x) + sum(z * z)
"""


def joined(x):
    y = np.concatenate([x, np.sin(x)])
    z = np.concatenate([x, x ** 2, np.exp(x)], axis=1)
    return np.sum(y ** 3) * np.sum(y.reshape(2, *x.shape)[1] * x) + np.sum(z * z)


def test_a_concatenation_along_a_symbolic_axis_compiles_once_for_every_length(monkeypatch):
    # `concatenate([x, x])` of x of n needed concrete sizes (n + n): its
    # length is 2 n, a size (`shapes.total`), and its gradient splits the
    # cotangent's axis in (2, n), each piece's row (its tangent: `pushed`)
    built = counting_builds(monkeypatch)
    m = dsl.loads(JOINED, "joined.grad")
    rng = np.random.default_rng(4)
    for n in (0, 2, 3, 5):
        x = rng.normal(size=(n, n + 2))
        value, grad = dsl.value_and_grad(m.joined)(x)
        np.testing.assert_allclose(value, joined(x), rtol=1e-13)
        np.testing.assert_allclose(grad, central_difference(joined, [x], 0), rtol=1e-6,
                                   atol=1e-9)
    assert len(built) == 1, built


BOUNDS_OF_SIZES = """
def shift(tokens: i64[n], x: f64[n]):
    return sum(x[:tokens.shape[0] - 1] * x[1:] * arange(x.shape[0] - 1))

def pairs(x):
    s = 0.0
    for i in range(x.shape[0] - 1):
        s = s + x[i + 1] * x[i]
    return s

def far(x):
    return x[:x.shape[0] - 3]

def nested(x):
    y = x[1:]
    return sum(y[:y.shape[0] - 1] * y[1:])

def capped(x):
    return x[:x[:3].shape[0] - 1]

def countdown(x):
    s = 0.0
    for i in range(2, x[::2].shape[0] - 2, -1):
        s = s + i
    return s

def below(x):
    s = 0.0
    for i in range(0, x[-3:].shape[0] - 3, -1):
        s = s + i
    return s

def nested_steps(x):
    y = x[::2]
    return sum(y[:y.shape[0] - 1] * y[1:] * x[1:-1:2])
"""


def test_a_bound_of_a_size_less_a_constant_compiles_once_for_every_length(monkeypatch):
    # `x[:n - 1]`, `arange(n - 1)` and `range(n - 1)` needed concrete sizes
    # (one program per length).  Each clamps n - 1 at 0 as max(0, n - 1)
    # would, a size computed from n (`x[1:]`'s): one program
    built = counting_builds(monkeypatch)
    m = dsl.loads(BOUNDS_OF_SIZES, "bounds.grad")
    references = {"shift": lambda x: np.sum(x[:len(x) - 1] * x[1:] * np.arange(len(x) - 1)),
                  "pairs": lambda x: sum(x[i + 1] * x[i] for i in range(len(x) - 1)) + 0.0,
                  "nested": lambda x: np.sum(x[1:][:len(x[1:]) - 1] * x[2:]),
                  "nested_steps": lambda x: np.sum(x[::2][:len(x[::2]) - 1] * x[::2][1:]
                                                   * x[1:-1:2])}
    rng = np.random.default_rng(2)
    for n in (0, 2, 3, 5):
        x = rng.normal(size=n)
        for name, reference in references.items():
            args = (np.zeros(n, np.int64), x) if name == "shift" else (x,)
            value, grad = dsl.value_and_grad(getattr(m, name), wrt=len(args) - 1)(*args)
            np.testing.assert_allclose(value, reference(x), rtol=1e-13)
            np.testing.assert_allclose(grad, central_difference(reference, [x], 0),
                                       rtol=1e-7, atol=1e-10)
    assert [str(types[-1][1].shape) for types in built] == ["(s0,)"] * 4, built
    # NumPy reads x[:n - 3] of 2 elements as x[:-1]: not max(0, n - 3), so
    # it is compiled for the length
    np.testing.assert_array_equal(m.far(np.arange(2.0)), [0.0])
    # x[:3].shape[0] - 1 is min(n, 3) - 1 of x, not n - 1 (x[:-1])
    for n in (0, 1, 4, 6):
        np.testing.assert_array_equal(m.capped(np.arange(n + 0.0)), np.arange(min(n, 3) - 1.0))
    # a stop counted down to is not clamped at 0: range(2, -2, -1) has 4 trips
    for n in (0, 1, 6):
        assert m.countdown(np.ones(n)) == sum(range(2, (n + 1) // 2 - 2, -1))
    # nor one of the last 3 less 3, min(n, 3) - 3, which clamped is 0 for
    # every n: range(0, -3, -1) has 3 trips
    for n in (0, 2, 5):
        assert m.below(np.ones(n)) == sum(range(0, min(n, 3) - 3, -1))
