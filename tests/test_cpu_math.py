"""`runtime.cpu_math`: the vectorizable exp, log, log1p, expm1 and tanh
CPU kernels call.

Accuracy is measured in ulps of the result's dtype against NumPy in long
double, over 10^6 points per function and dtype, each sweep one jitted loop;
the bounds are those docs/internals.md states.  Special values are exact.
And a real kernel's LLVM IR must have no scalar libm call left in it."""
import re

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
           ("tanh", np.float64): 2.5, ("tanh", np.float32): 2.5}
REFERENCES = {"exp": np.exp, "log": np.log, "log1p": np.log1p, "expm1": np.expm1,
              "tanh": np.tanh}
POINTS = 10**6


@numba.njit(error_model="numpy")
def _all_functions(x, out):
    # One kernel for all five: one compile per dtype keeps the file fast.
    for i in range(x.shape[0]):
        out[0, i] = cpu_math.exp(x[i])
        out[1, i] = cpu_math.log(x[i])
        out[2, i] = cpu_math.log1p(x[i])
        out[3, i] = cpu_math.expm1(x[i])
        out[4, i] = cpu_math.tanh(x[i])


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


def test_integers_are_taken_as_float64():
    @numba.njit
    def both(n):
        return cpu_math.exp(n), cpu_math.log(n)

    assert both(2) == (np.exp(2.0), np.log(2.0))


def test_other_names_are_the_math_modules():
    import math
    assert cpu_math.sqrt is math.sqrt and cpu_math.floor is math.floor
    assert cpu_math.exp(1.0) == math.exp(1.0)  # in Python: libm's


ALL = "def f(x):\n    return exp(x) + log(x) + log1p(x) + expm1(x) + tanh(x) + sigmoid(x)\n"


def _libm_calls(llvm: str) -> set[str]:
    """The functions of REFERENCES that the IR calls, as libm's scalar
    functions or as LLVM's vector intrinsics (which the backend splits into
    scalar libm calls)."""
    return set(re.findall(r"call [^@\n]*@(?:llvm\.)?(exp|log|log1p|expm1|tanh)"
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
    if dtype == "f32":
        return  # the contrast below costs a compile; one dtype shows it
    # The switch back to libm, which the check above must see.
    monkeypatch.setenv("GRADC_LIBM", "1")
    assert main(argv) == 0
    assert _libm_calls(capsys.readouterr().out) == set(REFERENCES)


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
    # Sums add with cpu_math's `accumulate` in both.
    for header in (ours, libm):
        assert re.fullmatch(r"from gradlang\.runtime\.cpu_math import accumulate  "
                            r"# cpu_math [0-9a-f]{12}", header[1])
