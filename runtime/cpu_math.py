"""Vectorizable `exp`, `log`, `log1p`, `expm1` and `tanh` for CPU kernels,
which import this module as `math` (`runtime.cpu.CpuTarget.header`).

Contract: inside a Numba kernel, each of them of a float32 (a float64)
computes in float32 (float64) with a branch-free polynomial, within
the ulp bounds in docs/internals.md, and gives every special value as libm
does: +-inf, NaN, +-0, denormal inputs and results, overflow to inf and
underflow to 0.  Integers are taken as float64.  Every other name
(`math.sqrt`, `math.floor`, ...) is the standard `math` module's, so a
kernel can say `math.<anything>`.  Called from Python, they are libm's.
`accumulate` is the add of a kernel's sum, the one float operation that
LLVM may reorder (see there); `greatest`, a running maximum that
vectorizes and propagates NaN.

Why: with no vector math library in llvmlite, LLVM splits a vectorized
`@llvm.exp.v4f64` back into scalar libm calls, which costs most of a
kernel's time.  These functions inline into the kernel loop, which then
vectorizes.  They compile with `fastmath={'contract'}` only (fused
multiply-adds): the other fastmath flags would let LLVM assume no inf or
NaN and fold away the special-value selects and the bit-level scaling.

Methods: exp reduces x = k ln2 + r, |r| <= ln2/2 (Cody-Waite, ln2 in two
parts), takes k from the bits of x log2(e) + 1.5 2^52 (no float-to-int
conversion, which NaN would poison), evaluates fdlibm's rational form
(float64) or Cephes' polynomial (float32) and scales by 2^k as two powers
of two built from bits, so that results near overflow and in the denormal
range round once.  log splits x = 2^k m, m in [sqrt(2)/2, sqrt(2)), from the
bits (denormals scaled up first) and evaluates musl's (fdlibm's) series in
s = (m-1)/(m+1); log1p, expm1 and tanh say how they differ where they are
defined.  Each dispatches on its argument's width through an `overload`
and inlines into the kernel, so that LLVM sees one loop body to vectorize.
"""
from __future__ import annotations

import math as _libm

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload, register_jitable

# Only kernels call these, and inline them: no Python or C entry points
# (which cost a third of each one's compile, ~20-40 ms, in a cold process).
_JIT_OPTIONS = {"fastmath": {"contract"}, "nogil": True, "no_cpython_wrapper": True,
                "no_cfunc_wrapper": True}


def __getattr__(name: str):
    # Names this module does not define are the standard math module's.
    return getattr(_libm, name)


# ------------------------------------------------------------ bit casts


def _bitcast(source: types.Type, target: types.Type, width: int, is_float: bool):
    """An intrinsic reinterpreting the bits of a `source` scalar as `target`
    (LLVM's bitcast: free, and vectorizable, unlike a view of an array)."""
    def typer(typingctx, x):
        if x != source:
            return None

        def codegen(context, builder, signature, args):
            llvm_type = {(32, True): ir.FloatType(), (64, True): ir.DoubleType()}.get(
                (width, is_float), ir.IntType(width))
            return builder.bitcast(args[0], llvm_type)
        return target(source), codegen
    return intrinsic(typer)


_bits64 = _bitcast(types.float64, types.int64, 64, False)
_float64 = _bitcast(types.int64, types.float64, 64, True)
_bits32 = _bitcast(types.float32, types.int32, 32, False)
_float32 = _bitcast(types.int32, types.float32, 32, True)

_i32 = np.int32
_f32 = np.float32

# ------------------------------------------------------------ float64

_LOG2E = 1.4426950408889634
_SHIFT64 = 6755399441055744.0  # 1.5 * 2**52: adding it rounds to an integer
_SHIFT64_BITS = 0x4338000000000000
_LN2_HI = 6.93147180369123816490e-01  # trailing zeros: k * _LN2_HI is exact
_LN2_LO = 1.90821492927058770002e-10
_EXP_P1 = 1.66666666666666019037e-01
_EXP_P2 = -2.77777777770155933842e-03
_EXP_P3 = 6.61375632143793436117e-05
_EXP_P4 = -1.65339022054652515390e-06
_EXP_P5 = 4.13813679705723846039e-08
# Beyond these exp is inf or 0 in float64; clamping keeps 2^k representable.
_EXP_MAX64 = 710.0
_EXP_MIN64 = -746.0


@register_jitable(**_JIT_OPTIONS)
def _exp_f64(x):
    x = _EXP_MAX64 if x > _EXP_MAX64 else x  # comparisons keep NaN as it is
    x = _EXP_MIN64 if x < _EXP_MIN64 else x
    shifted = x * _LOG2E + _SHIFT64
    k = _bits64(shifted) - _SHIFT64_BITS
    kd = shifted - _SHIFT64
    hi = x - kd * _LN2_HI
    lo = kd * _LN2_LO
    r = hi - lo
    rr = r * r
    c = r - rr * (_EXP_P1 + rr * (_EXP_P2 + rr * (_EXP_P3 + rr * (_EXP_P4 + rr * _EXP_P5))))
    y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)
    k1 = k >> 1
    return y * _float64((k1 + 1023) << 52) * _float64((k - k1 + 1023) << 52)


_LOG_LG1 = 6.666666666666735130e-01
_LOG_LG2 = 3.999999999940941908e-01
_LOG_LG3 = 2.857142874366239149e-01
_LOG_LG4 = 2.222219843214978396e-01
_LOG_LG5 = 1.818357216161805012e-01
_LOG_LG6 = 1.531383769920937332e-01
_LOG_LG7 = 1.479819860511658591e-01
_SQRT_HALF_BITS64 = 0x3FE6A09E00000000  # a little below sqrt(2)/2
_TINY64 = 2.2250738585072014e-308  # the smallest normal float64
_TWO54 = 18014398509481984.0


@register_jitable(**_JIT_OPTIONS)
def _log_f64(x):
    denormal = x < _TINY64
    scaled = x * _TWO54 if denormal else x
    bits = _bits64(scaled)
    k = (bits - _SQRT_HALF_BITS64) >> 52
    m = _float64(bits - (k << 52))
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (_LOG_LG2 + w * (_LOG_LG4 + w * _LOG_LG6))
    t2 = z * (_LOG_LG1 + w * (_LOG_LG3 + w * (_LOG_LG5 + w * _LOG_LG7)))
    hfsq = 0.5 * f * f
    dk = float(k - 54) if denormal else float(k)
    y = s * (hfsq + t1 + t2) + dk * _LN2_LO - hfsq + f + dk * _LN2_HI
    y = x if x == np.inf else y
    y = -np.inf if x == 0.0 else y
    return y if x >= 0.0 else np.nan  # x < 0 or NaN


# ------------------------------------------------------------ float32
# Constants are float32 scalars: a Python float would make Numba compute
# in float64.

_LOG2E_F = _f32(1.44269504088896341)
_SHIFT32 = _f32(12582912.0)  # 1.5 * 2**23
_SHIFT32_BITS = _i32(0x4B400000)
_LN2_HI_F = _f32(0.693359375)
_LN2_LO_F = _f32(-2.12194440e-4)
_EXPF_P = tuple(_f32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3,
                                  4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1))
_EXP_MAX32 = _f32(89.0)
_EXP_MIN32 = _f32(-110.0)
_ONE_F = _f32(1.0)
_HALF_F = _f32(0.5)
_TWO_F = _f32(2.0)
_ZERO_F = _f32(0.0)
_INF_F = _f32(np.inf)
_NAN_F = _f32(np.nan)


@register_jitable(**_JIT_OPTIONS)
def _exp_f32(x):
    x = _EXP_MAX32 if x > _EXP_MAX32 else x
    x = _EXP_MIN32 if x < _EXP_MIN32 else x
    shifted = x * _LOG2E_F + _SHIFT32
    k = _bits32(shifted) - _SHIFT32_BITS
    kf = shifted - _SHIFT32
    r = (x - kf * _LN2_HI_F) - kf * _LN2_LO_F
    p0, p1, p2, p3, p4, p5 = _EXPF_P
    p = ((((p0 * r + p1) * r + p2) * r + p3) * r + p4) * r + p5
    y = p * r * r + r + _ONE_F
    k1 = k >> 1
    return (y * _float32(_i32((k1 + 127) << 23))
            * _float32(_i32((k - k1 + 127) << 23)))


_LOGF_LG1 = _f32(0.66666662693)
_LOGF_LG2 = _f32(0.40000972152)
_LOGF_LG3 = _f32(0.28498786688)
_LOGF_LG4 = _f32(0.24279078841)
_LN2_HI_LOGF = _f32(6.9313812256e-01)
_LN2_LO_LOGF = _f32(9.0580006145e-06)
_SQRT_HALF_BITS32 = _i32(0x3F3504F3)
_TINY32 = _f32(1.17549435e-38)
_TWO25_F = _f32(33554432.0)


@register_jitable(**_JIT_OPTIONS)
def _log_f32(x):
    denormal = x < _TINY32
    scaled = x * _TWO25_F if denormal else x
    bits = _bits32(scaled)
    k = (bits - _SQRT_HALF_BITS32) >> 23
    m = _float32(_i32(bits - (k << 23)))
    f = m - _ONE_F
    s = f / (_TWO_F + f)
    z = s * s
    w = z * z
    t1 = w * (_LOGF_LG2 + w * _LOGF_LG4)
    t2 = z * (_LOGF_LG1 + w * _LOGF_LG3)
    hfsq = _HALF_F * f * f
    dk = _f32(k - 25) if denormal else _f32(k)
    y = s * (hfsq + t1 + t2) + dk * _LN2_LO_LOGF - hfsq + f + dk * _LN2_HI_LOGF
    y = x if x == _INF_F else y
    y = -_INF_F if x == _ZERO_F else y
    return y if x >= _ZERO_F else _NAN_F


# ------------------------------------------------------------ log1p, expm1, tanh
# One algorithm per function for both widths, specialized by its constants
# (closure values, which Numba compiles in as constants of their own type).


@register_jitable(**_JIT_OPTIONS)
def _horner(r, coefficients):
    """coefficients[0] + r coefficients[1] + ... (constant length: unrolled)."""
    acc = coefficients[-1]
    for c in coefficients[-2::-1]:
        acc = acc * r + c
    return acc


def _make_log1p(float_type, zero, one, two, half, lg_even, lg_odd, ln2_hi, ln2_lo, as_bits,
                as_float, int_type, mantissa_bits, sqrt_half_bits, exact_k, tiny):
    """musl's log1p without branches: log(u) for u = 1 + x rounded, plus
    the rounding error (x - (u - 1)) / u; when u is within [sqrt(2)/2,
    sqrt(2)), the series in x itself."""
    @register_jitable(**_JIT_OPTIONS)
    def log1p(x):
        u = one + x
        bits = as_bits(u)
        k = (bits - sqrt_half_bits) >> mantissa_bits
        m = as_float(int_type(bits - (k << mantissa_bits)))
        reduced = k != 0
        c = ((one - (u - x)) if k >= 2 else (x - (u - one))) / u
        c = c if reduced and k < exact_k else zero
        f = m - one if reduced else x
        hfsq = half * f * f
        s = f / (two + f)
        z = s * s
        w = z * z
        r = w * _horner(w, lg_even) + z * _horner(w, lg_odd)
        dk = float_type(k) if reduced else zero
        y = s * (hfsq + r) + (dk * ln2_lo + c) - hfsq + f + dk * ln2_hi
        y = x if abs(x) < tiny or x == np.inf else y  # keeps -0 and tiny x exact
        y = -np.inf if x == -one else y
        return y if x >= -one else float_type(np.nan)  # x < -1 or NaN
    return log1p


_log1p_f64 = _make_log1p(
    np.float64, 0.0, 1.0, 2.0, 0.5, (_LOG_LG2, _LOG_LG4, _LOG_LG6),
    (_LOG_LG1, _LOG_LG3, _LOG_LG5, _LOG_LG7),
    _LN2_HI, _LN2_LO, _bits64, _float64, np.int64, 52, _SQRT_HALF_BITS64, 54, 2.0**-54)
_log1p_f32 = _make_log1p(
    _f32, _ZERO_F, _ONE_F, _TWO_F, _HALF_F, (_LOGF_LG2, _LOGF_LG4), (_LOGF_LG1, _LOGF_LG3),
    _LN2_HI_LOGF, _LN2_LO_LOGF, _bits32, _float32, _i32, 23, _SQRT_HALF_BITS32, 25,
    _f32(2.0**-25))


def _make_expm1(zero, one, half, log2e, shift, shift_bits, ln2_hi, ln2_lo, taylor, low, high,
                as_bits, as_float, int_type, mantissa_bits, exponent_bias, top_k):
    """expm1(x) = 2^k (1 + p) - 1 with x = k ln2 + r and p = expm1(r) as
    Taylor's series r + r^2/2 + r^3 (1/6 + ...); k = 0 for |x| < 1/2, where
    k = 1 would cancel digits.  For k < 3, 2^k p + (2^k - 1), whose second
    term is exact; beyond, 2^k ((p - 2^-k) + 1), rounded once at the sum.
    2^k is capped at 2^top_k (times an exact power of two beyond) so that it
    and 2^-k stay normal floats."""
    @register_jitable(**_JIT_OPTIONS)
    def expm1(x):
        clamped = high if x > high else x  # comparisons keep NaN as it is
        clamped = low if clamped < low else clamped
        shifted = clamped * log2e + shift
        near_zero = abs(x) < half
        k = 0 if near_zero else as_bits(shifted) - shift_bits
        kf = zero if near_zero else shifted - shift
        r = (clamped - kf * ln2_hi) - kf * ln2_lo
        p = r + r * r * _horner(r, taylor)
        capped = k if k < top_k else top_k
        t = as_float(int_type((capped + exponent_bias) << mantissa_bits))
        inverse_t = as_float(int_type((exponent_bias - capped) << mantissa_bits))
        beyond = as_float(int_type((k - capped + exponent_bias) << mantissa_bits))
        y = t * p + (t - one) if k < 3 else t * ((p - inverse_t) + one) * beyond
        return x if x == zero else y  # -0
    return expm1


def _taylor_expm1(terms: int) -> tuple[float, ...]:
    """1/2!, 1/3!, ...: the coefficients of (expm1(r) - r) / r^2."""
    return tuple(1.0 / _libm.factorial(n) for n in range(2, terms + 2))


_expm1_f64 = _make_expm1(
    0.0, 1.0, 0.5, _LOG2E, _SHIFT64, _SHIFT64_BITS, _LN2_HI, _LN2_LO, _taylor_expm1(15),
    -60.0, _EXP_MAX64, _bits64, _float64, np.int64, 52, 1023, 1000)
_expm1_f32 = _make_expm1(
    _ZERO_F, _ONE_F, _HALF_F, _LOG2E_F, _SHIFT32, _SHIFT32_BITS, _LN2_HI_F, _LN2_LO_F,
    tuple(_f32(c) for c in _taylor_expm1(8)), _f32(-30.0), _EXP_MAX32, _bits32, _float32, _i32,
    23, 127, 120)


def _make_tanh(zero, one, two, threshold, tiny):
    """fdlibm's tanh without branches, from one expm1 that never overflows
    to NaN: below |x| = `threshold`, -e / (e + 2) for e = expm1(-2|x|);
    from it on, 1 - 2 / (e + 2) for e = expm1(2|x|).  Below `tiny`, tanh(x) rounds to x
    (and -0 stays -0)."""
    @register_jitable(**_JIT_OPTIONS)
    def tanh(x):
        a = abs(x)
        large = a >= threshold
        e = expm1(two * a if large else -two * a)
        t = one - two / (e + two) if large else -e / (e + two)
        y = t if x > zero else -t
        return x if a < tiny else y
    return tanh


_tanh_f64 = _make_tanh(0.0, 1.0, 2.0, 0.5, 2.0**-28)
_tanh_f32 = _make_tanh(_ZERO_F, _ONE_F, _TWO_F, _f32(0.5), _f32(2.0**-13))


# ------------------------------------------------------------ dispatch


def exp(x):
    """e**x: libm's in Python, the polynomial in a kernel."""
    return _libm.exp(x)


def log(x):
    """The natural logarithm: libm's in Python, the polynomial in a kernel."""
    return _libm.log(x)


def log1p(x):
    """log(1 + x): libm's in Python, the polynomial in a kernel."""
    return _libm.log1p(x)


def expm1(x):
    """e**x - 1: libm's in Python, the polynomial in a kernel."""
    return _libm.expm1(x)


def tanh(x):
    """The hyperbolic tangent: libm's in Python, from expm1 in a kernel."""
    return _libm.tanh(x)


def _by_width(f32_impl, f64_impl):
    def select(x):
        if isinstance(x, types.Float):
            return f32_impl if x.bitwidth == 32 else f64_impl
        if isinstance(x, (types.Integer, types.Boolean)):
            return lambda x: f64_impl(float(x))
        return None
    return select


# LLVM inlines exp, log and log1p by itself.  expm1 (and tanh through it)
# is larger than LLVM's inlining threshold, so it is marked `alwaysinline`
# for LLVM (`forceinline`), not inlined in Numba's IR (`inline="always"`),
# which retypes the body at every call site: that made a kernel calling
# tanh 3-4x slower to compile (0.6 s of inlining and 1 s of typing).
_FORCE_INLINE = {**_JIT_OPTIONS, "forceinline": True}
overload(exp, jit_options=_JIT_OPTIONS)(_by_width(_exp_f32, _exp_f64))
overload(log, jit_options=_JIT_OPTIONS)(_by_width(_log_f32, _log_f64))
overload(log1p, jit_options=_JIT_OPTIONS)(_by_width(_log1p_f32, _log1p_f64))
overload(expm1, jit_options=_FORCE_INLINE)(_by_width(_expm1_f32, _expm1_f64))
overload(tanh, jit_options=_FORCE_INLINE)(_by_width(_tanh_f32, _tanh_f64))


# ------------------------------------------------------------ sums


@intrinsic
def accumulate(typingctx, acc, x):
    """`acc + x` in `acc`'s type (x converted first), for a loop that sums
    into `acc`.  A float add carries LLVM's `reassoc` flag, on this one
    instruction only: it lets the loop vectorizer keep partial sums in
    vector lanes (a float sum may not be reordered otherwise, so a loop
    that sums with `+=` runs one element at a time), while the loop's other
    float arithmetic (the bit-level math above included) stays exact.
    The order of the partial sums is fixed by the compiled code, so a
    result is the same run to run."""
    summable = (types.Integer, types.Boolean) + ((types.Float,) if isinstance(acc, types.Float)
                                                 else ())
    if not isinstance(acc, (types.Float, types.Integer)) or not isinstance(x, summable):
        return None

    def codegen(context, builder, signature, args):
        value = context.cast(builder, args[1], signature.args[1], signature.return_type)
        if isinstance(signature.return_type, types.Float):
            return builder.fadd(args[0], value, flags=("reassoc",))
        return builder.add(args[0], value)  # integer sums reorder freely
    return acc(acc, x), codegen


@intrinsic
def _float_maximum(typingctx, a, b):
    # LLVM's maximum: NaN if either is NaN, and -0 < +0; exact, so a loop
    # taking it over elements vectorizes with no flag.
    if not (isinstance(a, types.Float) and a == b):
        return None

    def codegen(context, builder, signature, args):
        kind = args[0].type
        name = f"llvm.maximum.f{signature.args[0].bitwidth}"
        maximum = cgutils.get_or_insert_function(builder.module,
                                                 ir.FunctionType(kind, [kind, kind]), name)
        return builder.call(maximum, args)
    return a(a, b), codegen


def greatest(a, b):
    """The greater of a and b, NaN if either is NaN (as NumPy's max): for
    a kernel's running maximum, which then vectorizes."""
    return max(a, b) if a == a and b == b else _libm.nan


@overload(greatest, jit_options=_JIT_OPTIONS)
def _greatest(a, b):
    if isinstance(a, types.Float) and a == b:
        return lambda a, b: _float_maximum(a, b)
    return lambda a, b: a if a >= b else b
