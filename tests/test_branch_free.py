"""`runtime.branch_free`: helpers translated into a kernel's LLVM IR give
what Numba gives compiling the same Python (`njit(fastmath={'contract'},
error_model='numpy')`), types and bits, and anything outside the subset is
refused with the helper's name and line when a kernel first needs it."""
import re

import numba
import numpy as np
import pytest

from gradlang.runtime.branch_free import BranchFreeError, branch_free, kernel_function

_I32 = np.int32(-7)
_F32 = np.float32(1.25)
_STEPS = (0.5, 0.25, 0.125, 2.0)
_F32_STEPS = tuple(np.float32(c) for c in _STEPS)


def _numba_rules(x):
    """Each line leans on one of Numba's typing rules: int32 arithmetic is
    int64 and `>>` of a negative one arithmetic; a select of int32 and
    int64 is int64; float32 with a Python float or an int64 is float64;
    an int divided by an int is a float."""
    n = _I32 >> 1
    m = n + _I32
    k = m if x > 0.0 else _I32
    f = _F32 * x if x > 1 else _F32 + x
    a, b = (f * 0.1, f - 1)
    acc = a
    for c in _STEPS[-2::-1]:
        acc = acc * x + c
    if not (x < 0.0) == (b > 0.0):
        acc = acc + k
    return acc + b * (k << 2) - float(m ^ 3) + abs(x) / 3


def _float32_polynomial(x):
    """Stays in float32: float32 constants, a loop over a tuple of them,
    a tuple select and a bit cast of an int32 result."""
    lo, hi = (_F32, -_F32) if x < _F32 else (-_F32, _F32)
    acc = _F32_STEPS[-1]
    for c in _F32_STEPS[-2::-1]:
        acc = acc * x + c
    return acc * hi + lo * x + np.float32(np.int32(x) << 3)


def rules(x):
    """Stands for `_numba_rules` in a kernel."""
    return x


def polynomial(x):
    """Stands for `_float32_polynomial` in a kernel."""
    return x


kernel_function(rules, lambda x: (branch_free(_numba_rules), (x,)))
kernel_function(polynomial, lambda x: (branch_free(_float32_polynomial), (x,)))


@numba.njit(error_model="numpy")
def _translated(x, out):
    for i in range(x.shape[0]):
        out[0, i] = rules(x[i])
        out[1, i] = polynomial(x[i])


_rules_by_numba = numba.njit(fastmath={"contract"}, error_model="numpy")(_numba_rules)
_polynomial_by_numba = numba.njit(fastmath={"contract"},
                                  error_model="numpy")(_float32_polynomial)


@numba.njit(error_model="numpy")
def _compiled(x, out):
    for i in range(x.shape[0]):
        out[0, i] = _rules_by_numba(x[i])
        out[1, i] = _polynomial_by_numba(x[i])


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64])
def test_translation_is_numbas_compile_bit_for_bit(dtype):
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-3, 3, 2000), [0, 1, -1, 2]]).astype(dtype)
    if dtype != np.int64:
        x = np.concatenate([x, np.array([np.inf, -np.inf, np.nan, -0.0], dtype)])
    ours, numbas = np.empty((2, x.size)), np.empty((2, x.size))
    with np.errstate(all="ignore"):
        _translated(x, ours)
        _compiled(x, numbas)
    assert np.array_equal(ours.view(np.int64), numbas.view(np.int64))
    # and the same result types (float32 for the polynomial of a float32)
    for translated, compiled in ((rules, _rules_by_numba), (polynomial, _polynomial_by_numba)):
        call = numba.njit(lambda v: translated(v))  # noqa: B023
        call(x[0])
        compiled(x[0])
        key = (numba.typeof(x[0]),)
        want = compiled.overloads[key].signature.return_type
        assert call.overloads[key].signature.return_type == want
        assert (want == numba.float32) == (translated is polynomial and dtype == np.float32)


@branch_free
def _looping(x):
    while x > 1.0:
        x = x / 2.0
    return x


@branch_free
def _indexing(x):
    return _STEPS[int(x)]


@branch_free
def _recursive(x):
    return _recursive(x - 1.0) if x > 0.0 else x


def looping(x):
    return x


def recursive(x):
    return x


def indexing(x):
    return x


kernel_function(looping, lambda x: (_looping, (x,)))
kernel_function(indexing, lambda x: (_indexing, (x,)))
kernel_function(recursive, lambda x: (_recursive, (x,)))


def _line_of(helper, offset: int) -> str:
    """`file:line` of the line `offset` lines below `helper`'s decorator."""
    return re.escape(f"{helper.__code__.co_filename}:{helper.__code__.co_firstlineno + offset}")


def test_statements_outside_the_subset_are_refused():
    # BranchFreeError itself (an internal crash of the translation, say an
    # AttributeError, would have no such message) with the helper's name
    # and the line of the statement refused
    with pytest.raises(BranchFreeError,
                       match=rf"^_looping \({_line_of(_looping, 2)}\): unsupported statement While$"):
        numba.njit(lambda v: looping(v))(1.0)
    with pytest.raises(BranchFreeError, match=rf"^_indexing \({_line_of(_indexing, 2)}\): "
                                              r"subscripts are integer constants$"):
        numba.njit(lambda v: indexing(v))(1.0)
    with pytest.raises(BranchFreeError,
                       match=rf"^_recursive \({_line_of(_recursive, 2)}\): calls itself$"):
        numba.njit(lambda v: recursive(v))(1.0)


def _floats_or(x):
    return (x > 0.0) or x


def floats_or(x):
    return x


kernel_function(floats_or, lambda x: (branch_free(_floats_or), (x,)))


def test_typing_outside_the_subset_is_refused():
    with pytest.raises(BranchFreeError, match=rf"^_floats_or \({_line_of(_floats_or, 1)}\): "
                                              r"`and` and `or` of booleans only$"):
        numba.njit(lambda v: floats_or(v))(1.0)


# cpu_math's own helpers, compiled by Numba (each registered as a jitable
# function, called from a kernel) against their translation (the public
# function in a kernel), bit for bit, on random bit patterns and special
# values: in a process of its own, since registering them is for good.
CPU_MATH_BY_NUMBA = r"""
import sys
import numba
import numpy as np
from numba.extending import register_jitable
from gradlang.runtime import branch_free, cpu_math as cm

OPTIONS = {"fastmath": {"contract"}, "error_model": "numpy"}
for helper in list(branch_free._HELPERS):
    register_jitable(**OPTIONS)(helper)
unary = ["exp", "log", "log1p", "expm1", "tanh", "sin", "cos", "tan"]
publics = tuple(getattr(cm, name) for name in unary) + (cm.pow,)

def kernel(fs):
    e, l, l1, em, th, s, c, t, p = fs
    @numba.njit(**OPTIONS)
    def run(x, y, out):
        for i in range(x.size):
            a = x[i]
            out[0, i], out[1, i], out[2, i], out[3, i] = e(a), l(a), l1(a), em(a)
            out[4, i], out[5, i], out[6, i], out[7, i] = th(a), s(a), c(a), t(a)
            out[8, i] = p(a, y[i])
    return run

def differences(dtype):
    w = "32" if dtype == np.float32 else "64"
    helpers = (tuple(getattr(cm, f"_{name}_f{w}") for name in unary)
               + (getattr(cm, f"_pow_f{w}"),))
    rng = np.random.default_rng(7)
    ints = np.int32 if dtype == np.float32 else np.int64
    bits = rng.integers(np.iinfo(ints).min, np.iinfo(ints).max, 200_000, dtype=ints)
    scale = np.array([1e-8, 0.1, 1.0, 3.0, 30.0, 100.0, 800.0, 1e6, 1e22], dtype)
    spread = (rng.standard_normal((scale.size, 20_000)) * scale[:, None]).astype(dtype).ravel()
    finfo = np.finfo(dtype)
    specials = np.array([0.0, -0.0, 1.0, -1.0, 0.5, 2.0, np.inf, -np.inf, np.nan, finfo.tiny,
                         finfo.smallest_subnormal, finfo.max, -finfo.max, 88.7, 709.8, -745.2,
                         1.5707963267948966, 3.141592653589793], dtype)
    x = np.concatenate([bits.view(dtype), spread, specials, np.repeat(specials, specials.size)])
    y = np.concatenate([rng.permutation(x[:-specials.size ** 2]),
                        np.tile(specials, specials.size)])
    want, got = np.empty((9, x.size), dtype), np.empty((9, x.size), dtype)
    kernel(helpers)(x, y, want)
    kernel(publics)(x, y, got)
    return (want.view(ints) != got.view(ints)).sum(axis=1)

for name in sys.argv[1:]:
    differ = differences(np.dtype(name))
    print(name, " ".join(f"{fn}:{n}" for fn, n in zip(unary + ["pow"], differ)))
"""


def test_cpu_math_translates_to_numbas_own_bits(tmp_path):
    # Both widths in one process (a process each paid its start and the
    # registering twice: 7.4 s of CPU for the two, 6.1 s in one).
    import os
    import subprocess
    import sys
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "GRADC_CACHE_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", CPU_MATH_BY_NUMBA, "float64", "float32"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    counts = {dtype: dict(item.split(":") for item in items.split())
              for dtype, items in (line.split(" ", 1) for line in run.stdout.splitlines())}
    assert sorted(counts) == ["float32", "float64"], run.stdout
    assert all(len(c) == 9 and set(c.values()) == {"0"} for c in counts.values()), counts


def test_each_helper_parses_from_its_own_lines_as_from_its_whole_file():
    # a helper's definition is parsed from its own lines (where its code
    # ends), not from all of cpu_math; cut short, shifted or dedented
    # wrong, its tree or line numbers (which errors cite) would differ
    import ast

    from gradlang.runtime import branch_free, cpu_math  # noqa: F401 (registers helpers)

    if not hasattr(branch_free._definition.__code__, "co_positions"):
        pytest.skip("Python 3.10: every helper is found in its whole file")
    helpers = list(branch_free._HELPERS)
    assert len(helpers) > 40
    for fn in helpers:
        code = fn.__code__
        own = branch_free._definition(fn)
        whole = branch_free._definitions(code.co_filename)[code.co_firstlineno]
        assert own is not whole, fn.__qualname__  # (not the file's, by fallback)
        assert ast.dump(own, include_attributes=False) == \
            ast.dump(whole, include_attributes=False), fn.__qualname__
        assert (own.lineno, own.end_lineno) == (whole.lineno, whole.end_lineno)
