"""`runtime.cpu_math`: the vectorizable exp, log, log1p, expm1, tanh, sin,
cos, pow, erf and erfc CPU kernels call.

Accuracy is measured in ulps of the result's dtype against NumPy in long
double, over 10^6 points per function and dtype, each sweep one jitted loop;
the bounds are those docs/internals.md states.  Special values are exact.
And a real kernel's LLVM IR must have no scalar libm call left in it."""
import math
import os
import re
import subprocess
import sys
import textwrap

from hypothesis import given, settings, strategies as st
import numba
import numpy as np
import pytest

from dsl.cli import main
from gradlang.runtime import cpu_math

# The largest error in ulps, per function and dtype (docs/internals.md).
MAX_ULP = {("exp", np.float64): 1.0, ("exp", np.float32): 1.1,
           ("log", np.float64): 1.0, ("log", np.float32): 1.0,
           ("log1p", np.float64): 1.0, ("log1p", np.float32): 1.0,
           ("expm1", np.float64): 1.3, ("expm1", np.float32): 1.3,
           ("tanh", np.float64): 1.2, ("tanh", np.float32): 1.1,
           ("sin", np.float64): 1.0, ("sin", np.float32): 0.501,
           ("cos", np.float64): 1.0, ("cos", np.float32): 0.501,
           ("pow", np.float64): 1.0, ("pow", np.float32): 0.51,
           ("tan", np.float64): 2.5, ("tan", np.float32): 0.501,
           ("erf", np.float64): 1.0, ("erfc", np.float64): 1.1}
REFERENCES = {"exp": np.exp, "log": np.log, "log1p": np.log1p, "expm1": np.expm1,
              "tanh": np.tanh, "sin": np.sin, "cos": np.cos}
POINTS = 10**6


@numba.njit(error_model="numpy")
def _all_functions(x, out):
    # One kernel for all of them: one compile per dtype keeps the file fast.
    for i in range(x.shape[0]):
        out[0, i] = cpu_math.exp(x[i])
        out[1, i] = cpu_math.log(x[i])
        out[2, i] = cpu_math.log1p(x[i])
        out[3, i] = cpu_math.expm1(x[i])
        out[4, i] = cpu_math.tanh(x[i])
        out[5, i] = cpu_math.sin(x[i])
        out[6, i] = cpu_math.cos(x[i])


MORE = {"tan": np.tan}


@numba.njit(error_model="numpy")
def _more_functions(x, out):
    # (its own kernel: the sweeps above stay one compile per dtype)
    for i in range(x.shape[0]):
        out[0, i] = cpu_math.tan(x[i])


def apply_more(name: str, x: np.ndarray) -> np.ndarray:
    out = np.empty((len(MORE), x.size), x.dtype)
    with np.errstate(all="ignore"):
        _more_functions(x, out)
    return out[list(MORE).index(name)]


@numba.njit(error_model="numpy")
def _pow(x, y, out):
    for i in range(x.shape[0]):
        out[i] = cpu_math.pow(x[i], y[i])


def power(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    _pow(x, y, out)
    return out


def apply(name: str, x: np.ndarray) -> np.ndarray:
    out = np.empty((len(REFERENCES), x.size), x.dtype)
    _all_functions(x, out)
    return out[list(REFERENCES).index(name)]


def sweep_points(name: str, dtype) -> np.ndarray:
    """For exp-like functions, uniform over the whole range where the result
    is neither 0, -1, 1 nor inf, over [-1, 1], and log-uniform down to
    1e-20; for log, floats with uniformly random bits (every exponent,
    denormals included) and many points near 1, where log is smallest;
    log1p is log's sweep less 1, and near 0."""
    rng = np.random.default_rng(7)
    quarter = POINTS // 4
    tiny = np.sign(rng.uniform(-1, 1, quarter)) * 10.0 ** rng.uniform(-20, 0, quarter)
    if name in ("sin", "cos"):
        return trig_points(rng, dtype)
    if name in ("exp", "expm1", "tanh"):
        low, high = (-746.0, 710.0) if dtype == np.float64 else (-104.0, 89.0)
        low, high = {"exp": (low, high), "expm1": (-40.0, high), "tanh": (-20.0, 20.0)}[name]
        x = np.concatenate([rng.uniform(low, high, POINTS - 2 * quarter),
                            rng.uniform(-1, 1, quarter), tiny])
        return x.astype(dtype)
    bits, finite_top = ((np.int64, 0x7FF0000000000000) if dtype == np.float64
                        else (np.int32, 0x7F800000))
    any_positive = rng.integers(1, finite_top, POINTS - quarter, dtype=bits).view(dtype)
    if name == "log":
        return np.concatenate([any_positive, rng.uniform(0.5, 2.0, quarter).astype(dtype)])
    x = np.concatenate([any_positive[:-quarter] - 1, rng.uniform(-1, 1, quarter),
                        tiny]).astype(dtype)
    return x[x > -1]


def trig_points(rng, dtype) -> np.ndarray:
    """Uniform over [-10, 10] and over the range of the fast reduction
    (|x| < 2^20 pi/2), any magnitude up to the largest float (libm's lanes
    beyond), and the floats nearest to multiples of pi/2, where sin or cos
    is smallest and the reduction cancels most."""
    eighth = POINTS // 8
    top = np.log10(np.finfo(dtype).max) - 0.01
    signs = np.sign(rng.uniform(-1, 1, 2 * eighth))
    multiples = (rng.integers(-2**20, 2**20, 2 * eighth) * (np.pi / 2)).astype(dtype)
    neighbours = np.nextafter(multiples, rng.choice([-np.inf, np.inf], multiples.size))
    x = np.concatenate([rng.uniform(-10, 10, 2 * eighth), rng.uniform(-1.6e6, 1.6e6, eighth),
                        signs * 10.0 ** rng.uniform(-20, top, 2 * eighth),
                        multiples, neighbours])
    return x.astype(dtype)


def ulp_error(got: np.ndarray, x: np.ndarray, reference) -> np.ndarray:
    """|got - exact| in ulps of the correctly rounded result; a result
    that rounds to 0 or inf must be exactly that."""
    exact = reference(x.astype(np.longdouble))
    with np.errstate(over="ignore"):
        rounded = exact.astype(x.dtype)
    edge = (rounded == 0) | np.isinf(rounded)
    assert np.array_equal(got[edge], rounded[edge]), x[edge][got[edge] != rounded[edge]][:5]
    inner = ~edge
    return (np.abs(got[inner].astype(np.longdouble) - exact[inner])
            / np.spacing(np.abs(rounded[inner])).astype(np.longdouble))


@pytest.mark.skipif(np.finfo(np.longdouble).nmant <= 52,
                    reason="needs a long double wider than float64 as the reference")
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("name", list(REFERENCES))
def test_sweep_within_documented_ulps(name, dtype):
    x = sweep_points(name, dtype)
    errors = ulp_error(apply(name, x), x, REFERENCES[name])
    worst = int(np.argmax(errors))
    assert errors[worst] <= MAX_ULP[name, dtype], (x[~np.isinf(x)][worst], errors[worst])


@pytest.mark.skipif(np.finfo(np.longdouble).nmant <= 52,
                    reason="needs a long double wider than float64 as the reference")
def test_float32_tanh_on_every_float_around_its_split():
    # float32 tanh is a polynomial below 3/4 and exp's quotient from it on:
    # every float32 in [0.71875, 0.78125], with either sign.
    low, high = np.array([0.71875, 0.78125], np.float32).view(np.int32)
    x = np.arange(low, high, dtype=np.int32).view(np.float32)
    x = np.concatenate([x, -x])
    errors = ulp_error(apply("tanh", x), x, np.tanh)
    assert errors.max() <= MAX_ULP["tanh", np.float32], x[np.argmax(errors)]


@numba.njit(error_model="numpy")
def _erf_erfc(x, out):
    for i in range(x.shape[0]):
        out[0, i] = cpu_math.erf(x[i])
        out[1, i] = cpu_math.erfc(x[i])


def test_float32_erf_and_erfc_within_half_an_ulp():
    # computed in float64 and rounded once (float64's are libm's); the
    # reference is libm's float64, within 1e-16 of the truth
    rng = np.random.default_rng(13)
    n = 50_000
    x = np.concatenate([rng.uniform(-12, 12, n), rng.uniform(-1, 1, n),
                        np.sign(rng.uniform(-1, 1, n)) * 10.0 ** rng.uniform(-40, 0, n),
                        rng.uniform(9.0, 10.1, n)]).astype(np.float32)  # erfc denormal
    out = np.empty((2, x.size), np.float32)
    _erf_erfc(x, out)
    for got, reference in zip(out, (math.erf, math.erfc)):
        exact = np.array([reference(float(v)) for v in x])
        rounded = exact.astype(np.float32)
        ulp = np.spacing(np.abs(rounded)).astype(np.float64)
        errors = np.abs(got.astype(np.float64) - exact) / ulp
        assert errors.max() <= 0.51, (reference.__name__, x[np.argmax(errors)], errors.max())
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 27.0, -27.0], np.float32)
    out = np.empty((2, special.size), np.float32)
    _erf_erfc(special, out)
    np.testing.assert_array_equal(out[0], [0.0, -0.0, 1.0, -1.0, np.nan, 1.0, -1.0])
    np.testing.assert_array_equal(np.signbit(out[0][:2]), [False, True])
    np.testing.assert_array_equal(out[1], [1.0, 1.0, 0.0, 2.0, np.nan, 0.0, 2.0])


_TWO_OVER_SQRT_PI = np.longdouble("1.128379167095512573896158903121545171688")


def erf_erfc_long_double(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """erf and erfc of float64 x in long double, independent of libm's (whose
    erfc is up to 3.8 ulp off): e^-x^2 with x^2 in exact parts (Dekker's
    split) times, for erf below 3, the series sum 2^n x^(2n+1) / (2n+1)!!,
    all of whose terms are positive; for erfc from 1 on, the continued
    fraction 1 / (x + (1/2) / (x + 1 / (x + (3/2) / ...))), 300 deep; each
    other one as 1 minus it (2 minus it for erfc of negative x).  Within
    0.02 ulp of float64 of mpmath's at 120 bits, from 0 to 27.3."""
    wide = np.longdouble
    a = np.abs(x)
    hi = a * 134217729.0 - (a * 134217729.0 - a)  # a's top 26 bits
    lo = (a - hi).astype(wide)
    hi = hi.astype(wide)
    gauss = np.exp(-hi * hi) * np.exp(-(2 * hi * lo + lo * lo))
    a = a.astype(wide)
    erf, erfc = np.empty_like(a), np.empty_like(a)
    near = a < 3
    b = a[near]
    term, total = b.copy(), b.copy()
    for n in range(1, 200):
        term = term * (2 * b * b) / (2 * n + 1)
        total += term
    erf[near] = _TWO_OVER_SQRT_PI * gauss[near] * total
    far = a >= 1
    b = a[far]
    fraction = b.copy()
    for k in range(300, 0, -1):
        fraction = b + wide(k / 2) / fraction
    erfc[far] = _TWO_OVER_SQRT_PI / 2 * gauss[far] / fraction
    erf[~near] = 1 - erfc[~near]
    erfc[~far] = 1 - erf[~far]
    negative = x < 0
    return np.where(negative, -erf, erf), np.where(negative, 2 - erfc, erfc)


@pytest.mark.skipif(np.finfo(np.longdouble).nmant <= 52,
                    reason="needs a long double wider than float64 as the reference")
def test_float64_erf_and_erfc_sweep_within_documented_ulps_and_special_values():
    """Over [-6, 6] (erf is 1 beyond), within 1e-4 of the four intervals'
    edges and of 1/4 (fdlibm's erfc changes form there), up to 27.3 for
    erfc (denormal from 26.55, 0 beyond 27.23), and down to 1e-300 (erf is
    x 2/sqrt(pi) there)."""
    rng = np.random.default_rng(17)
    n = 8000
    edges = np.array([0.25, 0.84375, 1.25, 1 / 0.35, 6.0])
    x = np.concatenate([rng.uniform(-6, 6, n), rng.uniform(0, 27.3, n),
                        rng.uniform(26.4, 27.3, n // 4),
                        np.sign(rng.uniform(-1, 1, n // 4)) * 10.0 ** rng.uniform(-300, 0, n // 4),
                        (rng.choice(np.concatenate([edges, -edges]), n)
                         + rng.uniform(-1e-4, 1e-4, n))])
    out = np.empty((2, x.size))
    _erf_erfc(x, out)
    for got, exact, name in zip(out, erf_erfc_long_double(x), ("erf", "erfc")):
        errors = ulp_error(got, x, lambda _: exact)
        worst = int(np.argmax(errors))
        assert errors[worst] <= MAX_ULP[name, np.float64], (name, x[worst], errors[worst])
    # (one test with the special values below: a test of its own may run in
    # another worker, which compiles the kernel again)
    float64_erf_and_erfc_special_values()


def float64_erf_and_erfc_special_values() -> None:
    smallest = np.finfo(np.float64).smallest_subnormal
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, smallest, -smallest, 1e-310, 6.0, -6.0,
                  27.3, -27.3, 28.0, 1e300, -1e300])
    out = np.empty((2, x.size))
    _erf_erfc(x, out)
    # (erf: libm's own, every one exact; erfc: 0 and 2 where it underflows
    # or rounds to 2)
    want_erf = np.array([math.erf(v) for v in x])
    np.testing.assert_array_equal(out[0], want_erf)
    np.testing.assert_array_equal(np.signbit(out[0]), np.signbit(want_erf))
    np.testing.assert_array_equal(np.delete(out[1], 8),  # (erfc(6): in the sweep)
                                  [1.0, 1.0, 0.0, 2.0, np.nan, 1.0, 1.0, 1.0, 2.0, 0.0, 2.0,
                                   0.0, 0.0, 2.0])
    # erfc's denormal results: within half a denormal ulp of the reference
    # (and a hair: a float64 is rounded, then scaled to a denormal)
    x = np.linspace(26.56, 27.22, 50)
    out = np.empty((2, x.size))
    _erf_erfc(x, out)
    exact = erf_erfc_long_double(x)[1]
    assert np.all(out[1] < np.finfo(np.float64).smallest_normal) and np.all(out[1] > 0)
    assert np.all(np.abs(out[1] - exact) <= 0.51 * smallest)


def pow_points(dtype) -> tuple[np.ndarray, np.ndarray]:
    """x with uniformly random bits (every exponent, denormals included) to
    powers in [-1, 1] and small integers; x in [1/2, 2] to powers up to
    where the result overflows (where y log x needs log x to 2^-64);
    negative x to integer powers; x next to 1 to huge powers."""
    rng = np.random.default_rng(11)
    quarter = POINTS // 4
    bits, finite_top = ((np.int64, 0x7FF0000000000000) if dtype == np.float64
                        else (np.int32, 0x7F800000))
    big = 1100.0 if dtype == np.float64 else 150.0
    x = np.concatenate([rng.integers(1, finite_top, quarter, dtype=bits).view(dtype),
                        rng.uniform(0.5, 2.0, quarter), -rng.uniform(0, 10, quarter),
                        1.0 + rng.uniform(-1e-6, 1e-6, quarter)]).astype(dtype)
    y = np.concatenate([np.where(rng.uniform(size=quarter) < 0.5, rng.uniform(-1, 1, quarter),
                                 rng.integers(-4, 5, quarter)),
                        rng.uniform(-big, big, quarter) / np.log2(np.abs(x[quarter:2 * quarter])),
                        rng.integers(-40, 41, quarter),
                        rng.uniform(-1e8, 1e8, quarter)]).astype(dtype)
    return x, y


@pytest.mark.skipif(np.finfo(np.longdouble).nmant <= 52,
                    reason="needs a long double wider than float64 as the reference")
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_pow_sweep_within_documented_ulps(dtype):
    x, y = pow_points(dtype)
    with np.errstate(all="ignore"):
        errors = ulp_error(power(x, y), x, lambda wide: np.power(wide, y.astype(np.longdouble)))
    worst = int(np.argmax(errors))
    assert errors[worst] <= MAX_ULP["pow", dtype], errors[worst]


@pytest.mark.skipif(np.finfo(np.longdouble).nmant <= 52,
                    reason="needs a long double wider than float64 as the reference")
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_tan_sweep_within_documented_ulps(dtype):
    """tan over sin's points (near multiples of pi/2 too, where it is
    largest or smallest)."""
    x = trig_points(np.random.default_rng(13), dtype)
    with np.errstate(all="ignore"):
        errors = ulp_error(apply_more("tan", x), x, np.tan)
    worst = int(np.argmax(errors))
    assert errors[worst] <= MAX_ULP["tan", dtype], errors[worst]


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_tan_special_values(dtype):
    info = np.finfo(dtype)
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, info.smallest_subnormal,
                  -info.smallest_subnormal, 1e22, -1e30, 1.0, -0.3,
                  *(np.arange(-8, 9) * (np.pi / 2))], dtype)
    # inf and NaN: NaN, +-0 and denormals: themselves, beyond 2^20 pi/2:
    # libm's, bit for bit; near multiples of pi/2: within 2 ulps of libm's
    with np.errstate(all="ignore"):
        want = np.tan(x.astype(np.float64)).astype(dtype)
    got = apply_more("tan", x)
    inner = np.isfinite(want) & (np.abs(want) > 0) & (np.abs(x) < 1e6)
    assert np.all(np.abs(got[inner] - want[inner]) <= 2 * np.spacing(np.abs(want[inner])))
    np.testing.assert_array_equal(got[~inner], want[~inner])
    signed = ~np.isnan(want)
    assert np.array_equal(np.signbit(got[signed]), np.signbit(want[signed]))


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_exp_special_values(dtype):
    # exp(tiny) rounds up to the least denormal; exp(underflow) is below half of it.
    big, overflow, tiny, underflow = ((709.78, 710.0, -745.1, -745.2) if dtype == np.float64
                                      else (88.72, 88.73, -103.9, -104.0))
    smallest = np.finfo(dtype).smallest_subnormal
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, overflow, tiny, underflow, 1.0],
                 dtype)
    expected = np.array([np.inf, 0.0, np.nan, 1.0, 1.0, np.inf, smallest, 0.0, np.e], dtype)
    np.testing.assert_array_equal(apply("exp", x)[:-1], expected[:-1])
    assert abs(apply("exp", x)[-1] - expected[-1]) <= np.spacing(expected[-1])
    largest = apply("exp", np.array([big], dtype))[0]
    assert np.isfinite(largest) and largest > np.finfo(dtype).max / 2


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_log_special_values(dtype):
    info = np.finfo(dtype)
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, -1.0, -info.smallest_subnormal, 1.0],
                 dtype)
    expected = np.array([np.inf, np.nan, np.nan, -np.inf, -np.inf, np.nan, np.nan, 0.0],
                        dtype)
    np.testing.assert_array_equal(apply("log", x), expected)
    # Denormals take the scaled-up path; the largest float the top of it.
    x = np.array([info.smallest_subnormal, info.smallest_normal / 3, info.max], dtype)
    exact = np.log(x.astype(np.longdouble))
    assert np.all(np.abs(apply("log", x) - exact) <= np.abs(np.spacing(exact.astype(dtype))))


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_log1p_expm1_tanh_special_values(dtype):
    smallest = np.finfo(dtype).smallest_subnormal
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, smallest, -smallest, -1.0, -2.0],
                 dtype)
    expected = {"log1p": [np.inf, np.nan, np.nan, 0.0, -0.0, smallest, -smallest, -np.inf,
                          np.nan],
                "expm1": [np.inf, -1.0, np.nan, 0.0, -0.0, smallest, -smallest,
                          np.expm1(-1.0), np.expm1(-2.0)],
                "tanh": [1.0, -1.0, np.nan, 0.0, -0.0, smallest, -smallest, np.tanh(-1.0),
                         np.tanh(-2.0)]}
    for name, values in expected.items():
        got, want = apply(name, x), np.array(values, dtype)
        exact = len(x) if name == "log1p" else -2  # the others' last two: within 2.5 ulp
        np.testing.assert_array_equal(got[:exact], want[:exact], err_msg=name)
        signed = ~np.isnan(want[:exact])
        assert np.array_equal(np.signbit(got[:exact][signed]), np.signbit(want[:exact][signed]))
        assert np.all(np.abs(got[exact:] - want[exact:]) <= 2.5 * np.spacing(np.abs(want[exact:])))
    # Overflow: expm1 follows exp to inf; tanh is 1 long before.
    big = np.array([709.78, 710.0] if dtype == np.float64 else [88.72, 88.73], dtype)
    got = apply("expm1", big)
    assert np.isfinite(got[0]) and got[1] == np.inf
    assert np.all(apply("tanh", np.array([30.0, -30.0, 1e30], dtype)) == [1.0, -1.0, 1.0])


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_sin_cos_special_values_and_huge_arguments(dtype):
    # Beyond the fast reduction (2^20 pi/2) lanes take libm's call; inf
    # and NaN too; multiples of pi/2 must come out as libm's, bit for bit.
    info = np.finfo(dtype)
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, info.smallest_subnormal, -info.tiny,
                  1e22, -1e22, 1e30, info.max, -info.max, 1647099.0, 1647100.0,
                  *(np.arange(-64, 65) * (np.pi / 2))], dtype)
    with np.errstate(invalid="ignore"):
        want = {"sin": np.sin(x.astype(np.float64)), "cos": np.cos(x.astype(np.float64))}
    for name in ("sin", "cos"):
        got = apply(name, x)
        np.testing.assert_array_equal(got, want[name].astype(dtype), err_msg=name)
        assert np.array_equal(np.signbit(got[3:7]), np.signbit(want[name][3:7].astype(dtype)))


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_pow_special_values(dtype):
    """C99 Annex F's pow: x^0 = 1 and 1^y = 1 even for NaN; (-x)^y for
    integer y; +-0 and +-inf; NaN for a negative finite x to a non-integer."""
    inf, nan = np.inf, np.nan
    big = 2.0**60  # an even integer
    cases = [  # (x, y, x**y)
        (nan, 0.0, 1.0), (nan, -0.0, 1.0), (inf, 0.0, 1.0), (1.0, nan, 1.0), (1.0, inf, 1.0),
        (1.0, -inf, 1.0), (-1.0, inf, 1.0), (-1.0, -inf, 1.0), (nan, 1.0, nan),
        (2.0, nan, nan), (-2.0, 0.5, nan), (-2.0, -1.5, nan),
        (-2.0, 3.0, -8.0), (-2.0, 2.0, 4.0), (-2.0, -3.0, -0.125), (-0.5, big, 0.0),
        (-2.0, big, inf), (-1.0, 3.0, -1.0), (-1.0, 0.5, nan),
        (0.0, 3.0, 0.0), (-0.0, 3.0, -0.0), (-0.0, 2.0, 0.0), (-0.0, 0.5, 0.0),
        (0.0, -3.0, inf), (-0.0, -3.0, -inf), (-0.0, -2.0, inf), (-0.0, -0.5, inf),
        (0.0, inf, 0.0), (0.0, -inf, inf),
        (inf, 2.0, inf), (inf, -2.0, 0.0), (-inf, 3.0, -inf), (-inf, 2.0, inf),
        (-inf, 0.5, inf), (-inf, -3.0, -0.0), (-inf, -2.0, 0.0), (-inf, -0.5, 0.0),
        (0.5, inf, 0.0), (0.5, -inf, inf), (2.0, inf, inf), (2.0, -inf, 0.0),
        (-0.5, inf, 0.0), (-2.0, -inf, 0.0),
        (10.0, 400.0, inf), (10.0, -400.0, 0.0), (-10.0, 401.0, -inf), (-10.0, -401.0, -0.0),
        (2.0, 10.0, 1024.0), (3.0, 20.0, 3486784401.0), (4.0, 0.5, 2.0), (2.0, -1074.0,
                                                                           5e-324)]
    if dtype == np.float32:  # the same edges, for float32's range
        cases[-5:] = [(10.0, 40.0, inf), (10.0, -50.0, 0.0), (-10.0, 41.0, -inf),
                      (-10.0, -51.0, -0.0), (2.0, 10.0, 1024.0)]
        cases += [(2.0, -149.0, float(np.finfo(np.float32).smallest_subnormal))]
    x, y, want = (np.array(column, dtype) for column in zip(*cases))
    with np.errstate(all="ignore"):
        got = power(x, y)
    np.testing.assert_array_equal(got, want, err_msg=str(list(zip(x, y, got))))
    assert np.array_equal(np.signbit(got), np.signbit(want))
    with np.errstate(all="ignore"):  # NumPy agrees, NaN signs aside
        assert np.array_equal(got, np.power(x, y), equal_nan=True)


def test_pow_of_integers_is_the_integer_power():
    @numba.njit
    def both(n, k):
        return cpu_math.pow(n, k), cpu_math.pow(2.0, 3)

    assert both(3, 13) == (3**13, 8.0)
    assert isinstance(both(3, 13)[0], int)


def test_integers_are_taken_as_float64():
    @numba.njit
    def both(n):
        return cpu_math.exp(n), cpu_math.log(n)

    assert both(2) == (np.exp(2.0), np.log(2.0))


def test_other_names_are_the_math_modules():
    assert cpu_math.sqrt is math.sqrt and cpu_math.floor is math.floor
    assert cpu_math.exp(1.0) == math.exp(1.0)  # in Python: libm's


ALL = ("def f(x):\n    return exp(x) + log(x) + log1p(x) + expm1(x) + tanh(x) + sigmoid(x)"
       " + sin(x) + cos(x) + tan(x) + x ** x + erf(x) * erfc(x)\n")


def _libm_calls(llvm: str) -> set[str]:
    """The functions of REFERENCES, MORE, pow, erf and erfc that the IR
    calls, as libm's scalar functions or as LLVM's vector intrinsics (which
    the backend splits into scalar libm calls).  sin and cos call libm only
    through `gradc_huge_sin` and its vector variants, in lanes beyond 2^20
    pi/2 (tan likewise)."""
    return set(re.findall(r"call [^@\n]*@(?:llvm\.)?(exp|log|log1p|expm1|tanh|sin|cos|pow"
                          r"|tan|erf|erfc)"
                          r"(?:f|\.v?\d*f(?:32|64))?\(", llvm))


@pytest.mark.parametrize("dtype", ["f64", "f32"])
def test_kernel_loop_vectorizes_with_no_libm_call(capsys, monkeypatch, tmp_path, dtype):
    source = tmp_path / "all.grad"
    source.write_text(ALL)
    argv = ["show", str(source), "--emit", "llvm", "--sig", f"f({dtype}[:])"]
    monkeypatch.delenv("GRADC_LIBM", raising=False)
    assert main(argv) == 0
    llvm = capsys.readouterr().out
    assert _libm_calls(llvm) == set()
    lanes = "double" if dtype == "f64" else "float"
    assert re.search(rf"<\d+ x {lanes}>", llvm), "the kernel loop is not vectorized"
    # Every cpu_math function is inlined (a call left is a scalar call in
    # the loop), and sin's and cos's rare huge lanes are called a vector at
    # a time.
    assert not re.search(r"call [^\n]*@_ZN\d+gradlang7runtime8cpu_math", llvm)
    assert re.search(r"call [^\n]*<\d+ x double> @gradc_huge_sin_v\d+\(", llvm)
    assert re.search(r"call [^\n]*<\d+ x double> @gradc_huge_cos_v\d+\(", llvm)
    if dtype == "f32":
        return  # the contrast below costs a compile; one dtype shows it
    # The switch back to libm, which the check above must see.
    monkeypatch.setenv("GRADC_LIBM", "1")
    assert main(argv) == 0
    assert _libm_calls(capsys.readouterr().out) == (set(REFERENCES) | set(MORE)
                                                    | {"pow", "erf", "erfc"})


def test_libm_switch_and_cpu_math_version_are_in_the_kernel_text(monkeypatch):
    """Kernel modules are cached under a hash of their text: a kernel
    compiled against libm, or an older cpu_math, must never be served."""
    from gradlang.runtime.cpu import TARGET
    monkeypatch.delenv("GRADC_LIBM", raising=False)
    ours = TARGET.header.splitlines()[:2]
    monkeypatch.setenv("GRADC_LIBM", "1")
    libm = TARGET.header.splitlines()[:2]
    assert ours[0] == "from gradlang.runtime import cpu_math as math"
    assert libm[0].startswith("import math  #")
    # Sums add with cpu_math's `accumulate` in both, `where` is its `select`, and
    # kernels compile with its `DisjointArrays`.
    for header in (ours, libm):
        assert re.fullmatch(r"from gradlang\.runtime\.cpu_math import DisjointArrays, accumulate, "
                            r"greatest, select  # cpu_math [0-9a-f]{12}", header[1])


_ONE_COMPILE = textwrap.dedent("""
    import numba
    from numba.core import event
    from gradlang.runtime import cpu_math as math

    compiled = []

    class Compiles(event.Listener):
        def on_start(self, event):
            pass

        def on_end(self, event):
            compiled.append(event.data["dispatcher"].py_func.__name__)

    @numba.njit(error_model="numpy")
    def kernel(x, y):
        return (math.exp(x) + math.log(x) + math.log1p(x) + math.tanh(x) + math.sin(x)
                + math.pow(x, y))

    with event.install_listener("numba:compile", Compiles()):
        print(repr(kernel(0.75, 1.5)))
    print(compiled)
    """)


def test_math_helpers_compile_as_part_of_the_kernel(tmp_path):
    """cpu_math's helpers are translated into the kernel's own LLVM module:
    a kernel calling exp, log, log1p, tanh, sin and pow is one Numba
    compile in a fresh process (each helper compiled on its own cost
    0.05-0.13 s more, a third of a small gradient's first call)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", _ONE_COMPILE], env=env, check=True,
                         capture_output=True, text=True).stdout.splitlines()
    x, y = 0.75, 1.5
    want = np.exp(x) + np.log(x) + np.log1p(x) + np.tanh(x) + np.sin(x) + x**y
    assert abs(float(out[0]) - want) <= 4 * np.spacing(want)
    assert out[1] == "['kernel']"


POWERS = "def f(x, y):\n    return sum(x ** 2 + x ** 3 + x ** 4 + x ** -1 + x ** 1 + x ** y)\n"


def test_small_integer_powers_are_products(capsys, tmp_path):
    """x ** 2, 3, 4, -1 and 1, and their derivatives (a literal exponent
    stays literal through the VJP: x ** 1 gives x ** 0 = 1), are products,
    a quotient and constants, not pow calls: only x ** y, its derivative's
    x ** (y - 1), and x ** -2 (from x ** -1: 1 / (x * x) would overflow
    early) are left."""
    source = tmp_path / "powers.grad"
    source.write_text(POWERS)
    assert main(["show", str(source), "--emit", "grad-ir"]) == 0
    pows = re.findall(r"= pow %x0, ([^ ]+) ", capsys.readouterr().out)
    assert len(pows) == 3 and "-2.0:f64" in pows


def test_small_integer_powers_values_and_gradients():
    import dsl
    from helpers import central_difference
    f = dsl.loads(POWERS).f
    rng = np.random.default_rng(5)
    x, y = rng.uniform(0.5, 2.0, 7), rng.uniform(-2.0, 2.0, 7)

    def reference(x, y):
        return np.sum(x**2 + x**3 + x**4 + 1 / x + x + x**y)

    value, (dx, dy) = dsl.value_and_grad(f, wrt=(0, 1))(x, y)
    np.testing.assert_allclose(value, reference(x, y), rtol=1e-14)
    np.testing.assert_allclose(dx, central_difference(reference, (x, y), 0), rtol=1e-7)
    np.testing.assert_allclose(dy, central_difference(reference, (x, y), 1), rtol=1e-7)


# ------------------------------------------- products, gathers, scatter-adds
# The helpers a loop's trips and its compiled form share (their bits must
# be one function's): against references computed term by term in the
# documented order.

@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 4), k=st.integers(0, 4), m=st.integers(0, 4),
       dtype=st.sampled_from([np.float64, np.float32]), seed=st.integers(0, 2**16))
def test_matrix_product_adds_each_element_s_terms_in_order_from_the_first(n, k, m, dtype, seed):
    rng = np.random.default_rng(seed)
    # zeros of both signs: an element whose every term is -0.0 is -0.0
    a = (rng.normal(size=(n, k)) * rng.integers(0, 2, (n, k))).astype(dtype)
    b = -(rng.normal(size=(k, m)) * rng.integers(0, 2, (k, m))).astype(dtype)
    want = np.zeros((n, m), dtype)
    for i in range(n):
        for j in range(m):
            if k:
                total = a[i, 0] * b[0, j]
                for kk in range(1, k):
                    total = dtype(total + a[i, kk] * b[kk, j])
                want[i, j] = total
    got = cpu_math.matrix_product(a.ravel(), b.ravel(), n, k, m)
    assert got.dtype == dtype and got.tobytes() == want.tobytes()
    np.testing.assert_allclose(got.reshape(n, m), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), data=st.data(),
       seed=st.integers(0, 2**16))
def test_gather_and_scatter_rows_are_numpys_take_and_add_at(shape, data, seed):
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(0, len(shape) - 1))
    n = shape[axis]
    idx = np.array(data.draw(st.lists(st.integers(-n, n - 1), max_size=5)), np.int64)
    outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    x = rng.normal(size=shape)
    out = np.empty(outer * len(idx) * inner)
    assert cpu_math.gather_rows(x.ravel(), idx, out, outer, n, inner) == -1
    taken = np.take(x, idx, axis)
    np.testing.assert_array_equal(out, taken.ravel())
    base, values = rng.normal(size=shape), rng.normal(size=taken.shape)
    want = base.copy()
    np.add.at(want, (slice(None),) * axis + (idx,), values)
    flat_base = base.ravel().copy()
    assert cpu_math.scatter_rows(flat_base, idx, values.ravel(), outer, n, inner) == -1
    np.testing.assert_array_equal(flat_base, want.ravel())  # (np.add.at adds in order too)
    # the first index out of range is reported, by its position
    bad = np.concatenate([idx, [n, -n - 1]]).astype(np.int64)
    spare = np.empty(outer * len(bad) * inner)
    assert cpu_math.gather_rows(x.ravel(), bad, spare, outer, n, inner) == len(idx)
    assert cpu_math.scatter_rows(base.ravel().copy(), bad, np.zeros(spare.size), outer, n,
                                 inner) == len(idx)
