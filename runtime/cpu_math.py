"""Vectorizable `exp`, `log`, `log1p`, `expm1`, `tanh`, `sin`, `cos`,
`tan`, `pow`, `erf` and `erfc` for CPU kernels, which
import this module as `math` (`runtime.cpu.CpuTarget.header`).

Contract: inside a Numba kernel, each of them of a float32 (a float64)
computes in float32 (float64) with a branch-free polynomial (sin, cos,
tan, pow, erf and erfc of float32 in float64, rounded once; erf and erfc
of float64 rational), within the ulp bounds in docs/internals.md, and
gives every special value as libm does: +-inf, NaN, +-0, denormal inputs
and results, overflow to inf and underflow to 0; pow has C99's special
cases.  Integers are taken as float64 (pow of two
integers is Python's integer power).  Every other name (`math.sqrt`,
`math.floor`, ...) is the standard `math` module's, so a kernel can say
`math.<anything>`.  Called from Python, they are libm's.
`accumulate` is the add of a kernel's sum, the one float operation that
LLVM may reorder (see there); `greatest`, a running maximum that
vectorizes and propagates NaN; `DisjointArrays`, the compiler of every
kernel, which keeps a sum's bits from depending on where its arrays lie.

Why: with no vector math library in llvmlite, LLVM splits a vectorized
`@llvm.exp.v4f64` back into scalar libm calls, which costs most of a
kernel's time.  These functions inline into the kernel loop, which then
vectorizes.  Their helpers are `@branch_free` Python, which
`runtime.branch_free` translates into each kernel's own LLVM module (typed
and lowered by Numba's rules, as `njit` would), with no Numba compile of
their own: that cost 0.05-0.13 s per helper in a cold process, a third of
a small gradient's first call.  Their float instructions carry
`contract` only (fused multiply-adds, as `fastmath={'contract'}`): the
other fastmath flags would let LLVM assume no inf or NaN and fold away
the special-value selects and the bit-level scaling.  pow's and sin's
conditions combine with `&` and `|`: compiled by Numba, `and` and `or`
short-circuit, a branch, which LLVM turns back into a select only where
both sides are cheap (translated, they are one instruction either way).

Methods: exp reduces x = k ln2 + r, |r| <= ln2/2 (Cody-Waite, ln2 in two
parts), takes k from the bits of x log2(e) + 1.5 2^52 (no float-to-int
conversion, which NaN would poison), evaluates fdlibm's rational form
(float64) or Cephes' polynomial (float32) and scales by 2^k as two powers
of two built from bits, so that results near overflow and in the denormal
range round once.  log splits x = 2^k m, m in [sqrt(2)/2, sqrt(2)), from the
bits (denormals scaled up first) and evaluates musl's (fdlibm's) series in
s = (m-1)/(m+1); log1p, expm1, tanh, sin, cos, tan and pow say how they differ
where they are defined.  Each dispatches on its argument's width
(`kernel_function`) to an `alwaysinline` function of the kernel's module,
so that LLVM sees one loop body to vectorize.  sin, cos and tan hand lanes
beyond 2^20 pi/2 to libm through functions of our own with vector variants
(see "Lanes beyond").
"""
from __future__ import annotations

import decimal
import functools
import math as _libm
import operator
import sys

import numpy as np
from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.compiler import Compiler
from numba.core.imputils import lower_builtin
from numba.extending import intrinsic, type_callable

from gradlang.runtime.branch_free import branch_free, kernel_function
from gradlang.runtime.loader import before_cached_loads, jit_in_kernel_cache


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


@branch_free
def _exp_f64(x):
    return _exp_dd_f64(x, 0.0)  # (LLVM folds the zero tail away)


@branch_free
def _exp_dd_f64(x, tail):
    """e^(x + tail) for a finite tail below half an ulp of x, which pow's
    y log|x| carries (0 where x is clamped, inf or NaN)."""
    k, hi, rest = _exp_reduced(x, tail)
    return _times_power_of_two(1.0 - (rest - hi), k)


@branch_free
def _exp_reduced(x, tail):
    """(k, hi, rest) with e^(x + tail) = 2^k (1 + hi - rest), hi - rest in
    (-0.3, 0.42): for exp to round once, and for erfc to keep in two parts
    and divide by a before rounding; x clamped to where 2^k halves are
    normal."""
    x = _EXP_MAX64 if x > _EXP_MAX64 else x  # comparisons keep NaN as it is
    x = _EXP_MIN64 if x < _EXP_MIN64 else x
    shifted = x * _LOG2E + _SHIFT64
    k = _bits64(shifted) - _SHIFT64_BITS
    kd = shifted - _SHIFT64
    hi = x - kd * _LN2_HI
    lo = kd * _LN2_LO - tail
    r = hi - lo
    rr = r * r
    c = r - rr * (_EXP_P1 + rr * (_EXP_P2 + rr * (_EXP_P3 + rr * (_EXP_P4 + rr * _EXP_P5))))
    return k, hi, lo - (r * c) / (2.0 - c)


@branch_free
def _times_power_of_two(y, k):
    """y 2^k as two powers of two built from bits, so that a result in the
    denormal range rounds once."""
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


@branch_free
def _log_f64(x):
    denormal = x < _TINY64
    y = _log_normal_f64(x * _TWO54 if denormal else x, 54 if denormal else 0)
    y = x if x == np.inf else y
    y = -np.inf if x == 0.0 else y
    return y if x >= 0.0 else np.nan  # x < 0 or NaN


@branch_free
def _log_normal_f64(x, scale):
    """log(x 2^-scale) for a finite normal x > 0 (no special values)."""
    bits = _bits64(x)
    k = (bits - _SQRT_HALF_BITS64) >> 52
    m = _float64(bits - (k << 52))
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (_LOG_LG2 + w * (_LOG_LG4 + w * _LOG_LG6))
    t2 = z * (_LOG_LG1 + w * (_LOG_LG3 + w * (_LOG_LG5 + w * _LOG_LG7)))
    hfsq = 0.5 * f * f
    dk = float(k - scale)
    return s * (hfsq + t1 + t2) + dk * _LN2_LO - hfsq + f + dk * _LN2_HI


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


@branch_free
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


@branch_free
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


@branch_free
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
    @branch_free
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
        y = -float_type(np.inf) if x == -one else y  # (np.inf alone: float64)
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
    @branch_free
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


def _make_tanh(zero, one, two, split, tiny, coefficients):
    """tanh(a) = a + a^3 P(a^2) for a = |x| below `split` = 3/4, P
    (`coefficients`) a weighted least-squares fit, iterated towards
    minimax, of (tanh(a) - a) / a^3 on [0, 9/16]; from it on,
    1 - 2 / (exp(2a) + 1), whose error (about 2 ulp of a quotient below
    0.19) is under 1.5 ulp of a result above 0.63, and which is 1 where exp
    overflows.  Below `tiny`, tanh(x) rounds to x (and -0 stays -0).
    fdlibm's form, from one expm1, costs twice as much, and its slope
    (`ops._TANH_SLOPE`) shares this exp where a kernel has both."""
    @branch_free
    def tanh(x):
        a = abs(x)
        s = a * a
        small = a + a * s * _horner(s, coefficients)
        large = one - two / (exp(two * a) + one)
        t = small if a < split else large
        y = t if x > zero else -t
        return x if a < tiny else y
    return tanh


_tanh_f64 = _make_tanh(0.0, 1.0, 2.0, 0.75, 2.0**-28, (
    -0.33333333333333276, 0.13333333333324748, -0.053968253963961106, 0.02186948842791748,
    -0.00886323391725639, 0.0035921125521422214, -0.0014557335070399875,
    0.0005895677203575534, -0.00023764043548643707, 9.34767684463343e-05,
    -3.365324345269563e-05, 9.514948696446575e-06, -1.4918720744943142e-06))
_tanh_f32 = _make_tanh(_ZERO_F, _ONE_F, _TWO_F, _f32(0.75), _f32(2.0**-13), tuple(
    _f32(c) for c in (-0.33333316, 0.1333272, -0.05389481, 0.02145946, -0.0076692603,
                      0.0017441594)))


# ------------------------------------------------------------ sin, cos
# x = n pi/2 + r, |r| <= pi/4 (about), r kept as r0 + r1: pi/2 in three
# 33-bit parts, each product with n exact for |n| < 2^20, and a tail, the
# sums carried in two parts (Cody-Waite); then sin or cos of r by fdlibm's
# kernels, picked by n mod 4.  Lanes with |x| >= 2^20 pi/2, inf or NaN get
# libm's value instead (see "Lanes beyond" below).

_TWO_OVER_PI = 6.36619772367581382433e-01
_PIO2_1 = 1.57079632673412561417e+00
_PIO2_2 = 6.07710050630396597660e-11
_PIO2_3 = 2.02226624871116645580e-21
_PIO2_3T = 8.47842766036889956997e-32
_REDUCIBLE = 1647099.3291652855  # 2^20 pi/2: n fits in 20 bits
_SIN_S = (-1.66666666666666324348e-01, 8.33333333332248946124e-03,
          -1.98412698298579493134e-04, 2.75573137070700676789e-06,
          -2.50507602534068634195e-08, 1.58969099521155010221e-10)
_COS_C = (4.16666666666666019037e-02, -1.38888888888741095749e-03,
          2.48015872894767294178e-05, -2.75573143513906633035e-07,
          2.08757232129817482790e-09, -1.13596475577881948265e-11)
_SIN_TINY = 2.0**-27  # below it sin(x) rounds to x and cos(x) to 1


# Lanes beyond _REDUCIBLE call libm, through functions of our own that LLVM
# knows nothing about (it would turn a call to libm's `sin` into
# `llvm.sin`, which it splits into a libm call per lane): for each lane
# count, `gradc_huge_<name>_v<lanes>` checks its lanes with one vector
# compare and calls libm only where some lane is huge, inf or NaN, which
# is rare; the loop vectorizer finds it through the scalar function's
# `vector-function-abi-variant` attribute.  Each returns libm's value in
# the lanes not below _REDUCIBLE, and 0 in the others (which are never
# read).
_HUGE_LANES = (2, 4, 8, 16)


def _below_limit(b: ir.IRBuilder, x, limit, minus_limit):
    """|x| < _REDUCIBLE (false for NaN), lane by lane."""
    return b.and_(b.fcmp_ordered("<", x, limit), b.fcmp_ordered(">", x, minus_limit))


def _huge_lane_module(names: tuple[str, ...]) -> ir.Module:
    """`gradc_huge_<name>` and its vector variants, for each libm name."""
    module = ir.Module("gradc_huge_lanes")
    double = ir.DoubleType()
    limit = ir.Constant(double, _REDUCIBLE)
    for name in names:
        libm = ir.Function(module, ir.FunctionType(double, [double]), name)
        scalar = ir.Function(module, ir.FunctionType(double, [double]), f"gradc_huge_{name}")
        b = ir.IRBuilder(scalar.append_basic_block())
        x = scalar.args[0]
        small = _below_limit(b, x, limit, ir.Constant(double, -_REDUCIBLE))
        with b.if_else(small) as (then, otherwise):
            with then:
                block_small = b.block
            with otherwise:
                value = b.call(libm, [x])
                block_huge = b.block
        phi = b.phi(double)
        phi.add_incoming(ir.Constant(double, 0.0), block_small)
        phi.add_incoming(value, block_huge)
        b.ret(phi)
        # every lane of a vector in place, in a loop of its own: one for all
        # the variants (unrolled into each, they took 4x the compile time)
        lanes_fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.PointerType(),
                                                                      ir.IntType(64)]),
                               f"gradc_huge_{name}_lanes")
        lanes_fn.attributes.add("noinline")
        b = ir.IRBuilder(lanes_fn.append_basic_block())
        pointer, count = lanes_fn.args
        with cgutils.for_range(b, count) as loop:
            slot = b.gep(pointer, [loop.index], source_etype=double)
            b.store(b.call(scalar, [b.load(slot, typ=double)]), slot)
        b.ret_void()
        for lanes in _HUGE_LANES:
            vector = ir.VectorType(double, lanes)
            fn = ir.Function(module, ir.FunctionType(vector, [vector]),
                             f"gradc_huge_{name}_v{lanes}")
            b = ir.IRBuilder(fn.append_basic_block())
            x = fn.args[0]
            small = _below_limit(b, x, ir.Constant(vector, [_REDUCIBLE] * lanes),
                                 ir.Constant(vector, [-_REDUCIBLE] * lanes))
            all_small = b.icmp_unsigned("==", b.bitcast(small, ir.IntType(lanes)),
                                        ir.Constant(ir.IntType(lanes), (1 << lanes) - 1))
            with b.if_then(all_small, likely=True):
                b.ret(ir.Constant(vector, [0.0] * lanes))
            buffer = b.alloca(vector)
            b.store(x, buffer)
            b.call(lanes_fn, [buffer, ir.Constant(ir.IntType(64), lanes)])
            b.ret(b.load(buffer, typ=vector))
    return module


_HUGE_LANE_NAMES = ("sin", "cos", "tan")


@functools.cache
def _huge_lane_library():
    """Compiles the functions once per process, or loads the machine code an
    earlier process kept (keyed by the IR's text), and names them to the JIT
    linker: before a kernel that calls them is compiled (the intrinsic
    asks) or one that names sin, cos or tan is loaded from the cache (the
    loader asks), and not at import: it costs 0.1 s in a cold process."""
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target

    from gradlang.runtime.loader import stored_library
    names = _HUGE_LANE_NAMES
    module = _huge_lane_module(names)
    codegen = cpu_target.target_context.codegen()

    def build():
        library = codegen.create_library("gradc_huge_lanes")
        library.add_ir_module(module)
        return library
    with global_compiler_lock:
        library = stored_library(codegen, "gradc_huge_lanes", str(module), build)
    for name in names:
        for symbol in [f"gradc_huge_{name}"] + [f"gradc_huge_{name}_v{n}" for n in _HUGE_LANES]:
            llvm_binding.add_symbol(symbol, library.get_pointer_to_function(symbol))
    return library


def _may_call_huge_lanes(function) -> bool:
    """Whether a kernel names sin, cos or tan of this module (its module
    holds this one: not libm's, as under GRADC_LIBM=1)."""
    return (not _HUGE_LANE_NAMES_SET.isdisjoint(function.__code__.co_names)
            and any(value is _THIS_MODULE for value in function.__globals__.values()))


_HUGE_LANE_NAMES_SET = frozenset(_HUGE_LANE_NAMES)
_THIS_MODULE = sys.modules[__name__]
before_cached_loads(_may_call_huge_lanes, _huge_lane_library)


def _huge_lane_call(name: str):
    """An intrinsic calling `gradc_huge_<name>` (libm's `name` for x not
    below _REDUCIBLE, else 0), with its vector variants declared."""
    def typer(typingctx, x):
        if x != types.float64:
            return None

        def codegen(context, builder, signature, args):
            _huge_lane_library()
            module = builder.module
            double = ir.DoubleType()
            callee = cgutils.get_or_insert_function(
                module, ir.FunctionType(double, [double]), f"gradc_huge_{name}")
            for attribute in ("memory(none)", "nounwind", "willreturn"):
                set.add(callee.attributes, attribute)  # llvmlite knows none of them
            variants = []
            for lanes in _HUGE_LANES:
                vector = ir.VectorType(double, lanes)
                vname = f"gradc_huge_{name}_v{lanes}"
                variant = cgutils.get_or_insert_function(
                    module, ir.FunctionType(vector, [vector]), vname)
                _keep_alive(module, variant)
                variants.append(f"_ZGV_LLVM_N{lanes}v_gradc_huge_{name}({vname})")
            call = builder.call(callee, args)
            set.add(call.attributes, f'"vector-function-abi-variant"="{",".join(variants)}"')
            return call
        return types.float64(types.float64), codegen
    return intrinsic(typer)


def _keep_alive(module: ir.Module, function: ir.Function) -> None:
    """Lists `function` in the module's `llvm.compiler.used`, so that LLVM
    keeps its declaration until the vectorizer has looked for it."""
    used = module.globals.get("llvm.compiler.used")
    members = list(used.initializer.constant) if used is not None else []
    if function in members:
        return
    members.append(function)
    array = ir.ArrayType(ir.PointerType(), len(members))
    if used is None:
        used = ir.GlobalVariable(module, array, "llvm.compiler.used")
        used.linkage = "appending"
        used.section = "llvm.metadata"
    used.value_type = array  # (a global's type, rewritten as it grows)
    used.initializer = ir.Constant(array, members)


_huge_sin = _huge_lane_call("sin")
_huge_cos = _huge_lane_call("cos")
_huge_tan = _huge_lane_call("tan")


@branch_free
def _two_sum(a, b):
    """(s, e) with s = a + b rounded and s + e = a + b exactly (Knuth: no
    products, so contracting into fused multiply-adds cannot change it)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@branch_free
def _reduce_pio2(x):
    """(n, r0, r1) with x = n pi/2 + r0 + r1, for |x| < _REDUCIBLE."""
    shifted = x * _TWO_OVER_PI + _SHIFT64
    n = _bits64(shifted) - _SHIFT64_BITS
    fn = shifted - _SHIFT64
    # fn times each part is exact, and so is x - fn _PIO2_1; the sums of
    # the rest are kept in two parts, for x near a multiple of pi/2, where
    # they cancel.
    a, a_err = _two_sum(x - fn * _PIO2_1, -fn * _PIO2_2)
    b, b_err = _two_sum(a, -fn * _PIO2_3)
    tail = (a_err + b_err) - fn * _PIO2_3T
    r0 = b + tail
    return n, r0, tail - (r0 - b)


@branch_free
def _sin_kernel(x, y):
    """sin(x + y) for |x| <= pi/4 and y tiny beside x."""
    s1, s2, s3, s4, s5, s6 = _SIN_S
    z = x * x
    w = z * z
    r = s2 + z * (s3 + z * s4) + z * w * (s5 + z * s6)
    v = z * x
    return x - ((z * (0.5 * y - v * r) - y) - v * s1)


@branch_free
def _cos_kernel(x, y):
    """cos(x + y) for |x| <= pi/4 and y tiny beside x."""
    c1, c2, c3, c4, c5, c6 = _COS_C
    z = x * x
    w = z * z
    r = z * (c1 + z * (c2 + z * c3)) + w * w * (c4 + z * (c5 + z * c6))
    hz = 0.5 * z
    w = 1.0 - hz
    return w + (((1.0 - w) - hz) + (z * r - x * y))


@branch_free
def _by_quadrant(q, s, c):
    """sin(x) from s = sin(r), c = cos(r) for x = r + q pi/2: swapped on
    odd q, negated for q mod 4 in (2, 3), by a select and a sign-bit flip
    (branches on q become a switch, which blocks vectorizing)."""
    y = c if q & 1 else s
    return _float64(_bits64(y) ^ ((q & 2) << 62))


@branch_free
def _sin_cos_of_reduced(x):
    """(reducible, n, sin r, cos r) for x = n pi/2 + r; n and r of 0 where
    x is not reducible (|x| >= _REDUCIBLE, inf, NaN)."""
    reducible = abs(x) < _REDUCIBLE  # False for inf and NaN
    q, r0, r1 = _reduce_pio2(x if reducible else 0.0)
    return reducible, q, _sin_kernel(r0, r1), _cos_kernel(r0, r1)


@branch_free
def _sin_f64(x):
    reducible, q, s, c = _sin_cos_of_reduced(x)
    y = _by_quadrant(q, s, c)
    y = x if abs(x) < _SIN_TINY else y  # keeps -0 and denormals exact
    if not reducible:
        y = _huge_sin(x)
    return y


@branch_free
def _cos_f64(x):
    reducible, q, s, c = _sin_cos_of_reduced(x)
    y = _by_quadrant(q + 1, s, c)
    if not reducible:
        y = _huge_cos(x)
    return y


# float32: x in float64, reduced with pi/2 in two parts (a float32 times
# n fits 53 bits beside _PIO2_1, so x - fn _PIO2_1 is exact; the second
# part's error, n 2^-53 _PIO2_1T < 2^-56, is 2^-38 of the smallest |r|
# of a float32 below _REDUCIBLE, 4.19e-9 at x = 252.89821), then
# polynomials fitted here (Lawson's iteration towards minimax over
# [0, pi/4] against mpmath) with relative error 5.0e-15 (sin) and 7.3e-14
# (cos): rounded once to float32, within 0.500002 ulp (every float32 below
# _REDUCIBLE tried).  tan is their quotient.  Half the work of
# float64's reduction and kernels, which carry 2^-60 where float32 needs
# 2^-35.
_PIO2_1T = 6.07710050650619224932e-11  # pi/2 - _PIO2_1
_SIN_F32_S = (-0.16666666666630348, 0.008333333325076069, -0.00019841263727685002,
              2.755533945993007e-06, -2.4760440678469817e-08)
_COS_F32_C = (-0.4999999999948939, 0.041666666553430654, -0.0013888880659585698,
              2.4798960764769312e-05, -2.7174791849150087e-07)


@branch_free
def _sin_cos_of_reduced_f32(x):
    """(x in float64, reducible, n, sin r, cos r) for a float32 x = n pi/2
    + r, as _sin_cos_of_reduced; r is x itself for |x| < pi/4, so that -0
    and tiny x come out exact."""
    wide = np.float64(x)
    reducible = abs(wide) < _REDUCIBLE  # False for inf and NaN
    xr = wide if reducible else 0.0
    shifted = xr * _TWO_OVER_PI + _SHIFT64
    n = _bits64(shifted) - _SHIFT64_BITS
    fn = shifted - _SHIFT64
    r = (xr - fn * _PIO2_1) - fn * _PIO2_1T
    z = r * r
    # r (1 + z S(z)), not r + r z S(z), which is +0 for r = -0
    return (wide, reducible, n, r * (1.0 + z * _horner(z, _SIN_F32_S)),
            1.0 + z * _horner(z, _COS_F32_C))


@branch_free
def _sin_f32(x):
    wide, reducible, q, s, c = _sin_cos_of_reduced_f32(x)
    y = _by_quadrant(q, s, c)
    if not reducible:
        y = _huge_sin(wide)
    return _f32(y)


@branch_free
def _cos_f32(x):
    wide, reducible, q, s, c = _sin_cos_of_reduced_f32(x)
    y = _by_quadrant(q + 1, s, c)
    if not reducible:
        y = _huge_cos(wide)
    return _f32(y)


@branch_free
def _tan_by_quadrant(q, s, c):
    """tan x from s = sin r, c = cos r for x = r + q pi/2: s / c, or
    -c / s on odd q."""
    odd = (q & 1) != 0
    return (-c if odd else s) / (s if odd else c)


@branch_free
def _tan_f64(x):
    reducible, q, s, c = _sin_cos_of_reduced(x)
    y = _tan_by_quadrant(q, s, c)
    y = x if abs(x) < _SIN_TINY else y
    if not reducible:
        y = _huge_tan(x)
    return y


@branch_free
def _tan_f32(x):
    wide, reducible, q, s, c = _sin_cos_of_reduced_f32(x)
    y = _tan_by_quadrant(q, s, c)
    if not reducible:
        y = _huge_tan(wide)
    return _f32(y)


def sin(x):
    """The sine: libm's in Python, the polynomial in a kernel."""
    return _libm.sin(x)


def cos(x):
    """The cosine: libm's in Python, the polynomial in a kernel."""
    return _libm.cos(x)


# ------------------------------------------------------------ erf, erfc
# float32: computed in float64 and rounded once: erfc(a) = t exp(Q(t) -
# a^2) for a = |x| and t = 1 / (1 + a/2), the form of Numerical Recipes'
# erfcc, with Q a polynomial of degree 12 fitted here
# (weighted least squares on Chebyshev nodes, iterated towards minimax) to
# log(erfc(a) / t) + a^2 over a in [0, 10.1], past which float32's erfc
# is 0: relative error 1.6e-10.  a^2 of a float32 is exact in float64.
# erf below |x| = 1/2 is x P(x^2), P Taylor's series to x^16 (a relative
# 2e-11 there); from 1/2 on, 1 - erfc(|x|), which keeps its digits above
# erf(1/2) = 0.52.
_ERFC_Q = (-1.2655060343155666, 0.9997786636579067, 0.37856863827599047,
           0.04957019143290783, 0.1228837594001391, -1.0327996200728773, 2.574051565968041,
           -5.610198870854372, 8.376026752035479, -7.7536770089439075, 4.332013670938129,
           -1.353960493432414, 0.18324878606614323)
_ERF_P = tuple(2 / _libm.sqrt(_libm.pi) * (-1) ** n / (_libm.factorial(n) * (2 * n + 1))
               for n in range(9))


@branch_free
def _erfc_of_magnitude(a):
    """erfc(a) for a >= 0 (or NaN), in float64."""
    t = 1.0 / (1.0 + 0.5 * a)
    return t * _exp_f64(_horner(t, _ERFC_Q) - a * a)


@branch_free
def _erfc_f32(x):
    y = _erfc_of_magnitude(abs(np.float64(x)))
    return _f32(2.0 - y if x < _ZERO_F else y)


@branch_free
def _erf_f32(x):
    wide = np.float64(x)
    a = abs(wide)
    large = 1.0 - _erfc_of_magnitude(a)
    large = -large if wide < 0.0 else large
    return _f32(wide * _horner(wide * wide, _ERF_P) if a < 0.5 else large)


# float64: fdlibm's method (s_erf.c) and its rational approximations, on
# four intervals of a = |x|: below 0.84375, erf(x) = x + x R(x^2)/S(x^2);
# below 1.25, erf(a) = c + P(a-1)/Q(a-1), c = erf(1) rounded to 24 bits;
# beyond, erfc(a) = e^(-a^2 - 0.5625 + R(1/a^2)/S(1/a^2)) / a, with R/S of
# one interval to 1/0.35 and another to 28 (past which erfc is 0); erf and
# erfc are 1 minus the other where that keeps their digits.  Branch-free,
# each lane picks its interval's coefficients with selects (intervals
# padded with zero coefficients to one degree) and evaluates one quotient.
# Where fdlibm rounds at every step, the steps that cost erfc its digits
# are kept in two parts: the polynomials' variable (x^2, 1/a^2), their
# last two Horner steps and the quotient (erfc = 1 - x - x R/S cancels
# near 0.84375, and (1 - c) - P/Q near 1.25), and e^(...) / a: -a^2 exact
# in two parts (a fused multiply-add gives the low one), the exponent's
# sum in two parts into exp's reduction (`_exp_reduced`), whose 1 + p and
# 1/a in two parts are multiplied out and rounded once.  Measured
# (docs/internals.md): erf within 0.86 ulp, erfc 1.01; glibc's erfc,
# fdlibm's code, is 3.8 ulp off on the same sweep.
_ERX = 8.45062911510467529297e-01
# Numerators and denominators of the four intervals, constant terms first.
_ERF_NUMERATORS = (
    (1.28379167095512558561e-01, -3.25042107247001499370e-01, -2.84817495755985104766e-02,
     -5.77027029648944159157e-03, -2.37630166566501626084e-05),
    (-2.36211856075265944077e-03, 4.14856118683748331666e-01, -3.72207876035701323847e-01,
     3.18346619901161753674e-01, -1.10894694282396677476e-01, 3.54783043256182359371e-02,
     -2.16637559486879084300e-03),
    (-9.86494403484714822705e-03, -6.93858572707181764372e-01, -1.05586262253232909814e+01,
     -6.23753324503260060396e+01, -1.62396669462573470355e+02, -1.84605092906711035994e+02,
     -8.12874355063065934246e+01, -9.81432934416914548592e+00),
    (-9.86494292470009928597e-03, -7.99283237680523006574e-01, -1.77579549177547519889e+01,
     -1.60636384855821916062e+02, -6.37566443368389627722e+02, -1.02509513161107724954e+03,
     -4.83519191608651397019e+02))
_ERF_DENOMINATORS = (
    (1.0, 3.97917223959155352819e-01, 6.50222499887672944485e-02, 5.08130628187576562776e-03,
     1.32494738004321644526e-04, -3.96022827877536812320e-06),
    (1.0, 1.06420880400844228286e-01, 5.40397917702171048937e-01, 7.18286544141962662868e-02,
     1.26171219808761642112e-01, 1.36370839120290507362e-02, 1.19844998467991074170e-02),
    (1.0, 1.96512716674392571292e+01, 1.37657754143519042600e+02, 4.34565877475229228821e+02,
     6.45387271733267880336e+02, 4.29008140027567833386e+02, 1.08635005541779435134e+02,
     6.57024977031928170135e+00, -6.04244152148580987438e-02),
    (1.0, 3.03380607434824582924e+01, 3.25792512996573918826e+02, 1.53672958608443695994e+03,
     3.19985821950859553908e+03, 2.55305040643316442583e+03, 4.74528541206955367215e+02,
     -2.24409524465858183362e+01))
_ERF_SPLITS = (0.84375, 1.25, 1 / 0.35)
_ERFC_LAST = 28.0  # erfc(28) = 6e-343 is 0 in float64


def _by_degree(polynomials: tuple[tuple[float, ...], ...]) -> tuple[tuple[float, ...], ...]:
    """The coefficients of each degree across the intervals, highest degree
    first (what `_interval_polynomial` runs over), missing ones 0."""
    top = max(len(p) for p in polynomials)
    return tuple(tuple(p[d] if d < len(p) else 0.0 for p in polynomials)
                 for d in reversed(range(top)))


_ERF_NUMERATOR_ROWS = _by_degree(_ERF_NUMERATORS)
_ERF_DENOMINATOR_ROWS = _by_degree(_ERF_DENOMINATORS)


@branch_free
def _of_interval(row, first, second, third):
    """The first, second, third or fourth of row, by the lane's interval."""
    return row[0] if first else (row[1] if second else (row[2] if third else row[3]))


@branch_free
def _step_two_parts(u, u_lo, hi, lo, c):
    """c + (u + u_lo) (hi + lo) in two parts (the product's error from a
    fused multiply-add, the sum's from two-sum)."""
    product = u * hi
    product_err = _fma(u, hi, -product)
    s, s_err = _two_sum(c, product)
    return s, s_err + (product_err + (u * lo + u_lo * hi))


@branch_free
def _interval_polynomial(u, u_lo, rows, first, second, third):
    """The polynomial of the lane's interval at u + u_lo, in two parts:
    Horner's scheme, its last two steps kept in two parts, where the terms
    are largest and cancel most (near |x| = 0.84375 and 1.25 numerators of
    0.1 are sums of terms of 0.25: plain Horner cost erfc 1.8 ulp there)."""
    acc = 0.0
    for row in rows[:-2]:
        acc = acc * u + _of_interval(row, first, second, third)
    hi, lo = _step_two_parts(u, u_lo, acc, 0.0, _of_interval(rows[-2], first, second, third))
    return _step_two_parts(u, u_lo, hi, lo, _of_interval(rows[-1], first, second, third))


@branch_free
def _erf_parts(x):
    """(a, ratio, ratio_lo, tail): a = |x|, the rational approximation of
    a's interval in two parts, and tail = erfc(a) where a >= 1.25
    (meaningless below).  Three quotients (1/a, 1 / the denominator, and
    exp's), not five: divisions take most of the time."""
    a = abs(x)
    first = a < _ERF_SPLITS[0]
    second = a < _ERF_SPLITS[1]
    third = a < _ERF_SPLITS[2]
    c = _ERFC_LAST if a > _ERFC_LAST else a  # (comparisons keep NaN as it is)
    inverse = 1.0 / c
    inverse_lo = _fma(-inverse, c, 1.0) * inverse  # 1/c - inverse
    # The variable in two parts (x^2's rounding alone cost erfc 0.5 ulp
    # near 0.84375); a - 1 is exact; 1/c^2 from 1/c in two parts.
    square = x * x
    twice = 2.0 * inverse * inverse_lo
    inverse_square = _fma(inverse, inverse, twice)
    u = square if first else (a - 1.0 if second else inverse_square)
    u_lo = (_fma(x, x, -square) if first else
            (0.0 if second else _fma(inverse, inverse, -inverse_square) + twice))
    p, p_lo = _interval_polynomial(u, u_lo, _ERF_NUMERATOR_ROWS, first, second, third)
    q, q_lo = _interval_polynomial(u, u_lo, _ERF_DENOMINATOR_ROWS, first, second, third)
    q_inverse = 1.0 / q
    ratio = p * q_inverse  # (within an ulp: the exact remainder corrects it)
    ratio_lo = ((_fma(-ratio, q, p) + p_lo) - ratio * q_lo) * q_inverse
    return a, ratio, ratio_lo, _erfc_tail(c, inverse, inverse_lo, ratio, ratio_lo)


@branch_free
def _erfc_tail(a, inverse, inverse_lo, ratio, ratio_lo):
    """e^(-a^2 - 0.5625 + ratio + ratio_lo) / a = 2^k (1 + p) / a, rounded
    once (but for exp's polynomial and the tails' errors): the sums in two
    parts, products' errors from fused multiply-adds; 1/a = inverse +
    inverse_lo."""
    square = a * a
    square_lo = _fma(a, a, -square)  # a^2 = square + square_lo
    hi, hi_err = _two_sum(-square, -0.5625)
    sum_hi, sum_err = _two_sum(hi, ratio)
    k, p_hi, p_rest = _exp_reduced(sum_hi, (hi_err + sum_err) + (ratio_lo - square_lo))
    p, p_err = _two_sum(p_hi, -p_rest)
    product = inverse * p
    product_err = _fma(inverse, p, -product)
    y, y_err = _two_sum(inverse, product)  # (1 + p) / a, and the small terms:
    small = product_err + (inverse * p_err + inverse_lo * (1.0 + p))
    return _times_power_of_two(y + (y_err + small), k)


@branch_free
def _erf_f64(x):
    a, ratio, ratio_lo, tail = _erf_parts(x)
    near_one = _ERX + (ratio + ratio_lo) if a < _ERF_SPLITS[1] else 1.0 - tail
    near_one = -near_one if x < 0.0 else near_one
    # x + x ratio, the small term rounded first (where it is denormal,
    # below 2^-1019, twice: 0.85 ulp, the largest error of erf)
    return _fma(x, ratio, x * ratio_lo) + x if a < _ERF_SPLITS[0] else near_one


@branch_free
def _erfc_f64(x):
    a, ratio, ratio_lo, tail = _erf_parts(x)
    # 1 - x - x ratio with 1 - x in two parts (exact: |x| < 1), so that it
    # rounds where erfc does (fdlibm's 0.5 - (x - 0.5 + x ratio) rounds at
    # 0.27 where erfc is 0.23)
    one_less, one_less_err = _two_sum(1.0, -x)
    small = one_less + _fma(-x, ratio, one_less_err - x * ratio_lo)
    # 1 - c - ratio with the same care (it is 0.077 at 1.25, ratio 0.078)
    left, left_err = _two_sum(1.0 - _ERX, -ratio)
    middle = left + (left_err - ratio_lo) if x > 0.0 else 1.0 + (_ERX + ratio)
    large = tail if x > 0.0 else 2.0 - tail
    y = middle if a < _ERF_SPLITS[1] else large
    return small if a < _ERF_SPLITS[0] else y


def erf(x):
    """The error function: libm's in Python, the approximations above in a
    kernel."""
    return _libm.erf(x)


def erfc(x):
    """1 - erf(x): libm's in Python, the approximations above in a kernel."""
    return _libm.erfc(x)


# ------------------------------------------------------------ pow
# float64: log|x| in two parts, good to about 2^-64 relative (x = 2^k m,
# m in [sqrt(2)/2, sqrt(2)), log m = 2 atanh(s) = 2s + 2s^3/3 + ..., s =
# (m-1)/(m+1), whose first two terms carry their rounding errors along),
# times y in two parts, then e^(z + z_tail) (exp's reduction takes the
# tail).  float32: exp(y log|x|) in float64 (`_pow_f32`), then rounded
# once.  Then C99's special cases as selects; (-x)^y for integer y is
# +-|x|^y.

def _fma_typer(typingctx, a, b, c):
    if not (a == b == c == types.float64):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return types.float64(a, b, c), codegen


# a b + c rounded once (LLVM's llvm.fma: one instruction where the CPU has
# it), for the exact error of a product, whatever `contract` does.
_fma = intrinsic(_fma_typer)

_TWO_THIRDS = 2.0 / 3.0
_TWO_THIRDS_LO = 3.700743415417188e-17  # 2/3 - _TWO_THIRDS


def _two_parts(value: decimal.Decimal) -> tuple[float, float]:
    hi = float(value)
    return hi, float(value - decimal.Decimal(hi))


with decimal.localcontext(prec=40):
    _LOG_3_4 = _two_parts(decimal.Decimal("0.75").ln())
    _LOG_3_2 = _two_parts(decimal.Decimal("1.5").ln())
_SQRT_3_4 = 0.8660254037844386
_SQRT_3_2 = 1.224744871391589
# 2 / (2j + 1), j = 2..10: the rest of 2 atanh(s) / s^5 in s^2; |s| < 0.102
# leaves out less than 2^-75.
_ATANH_REST = tuple(2.0 / (2 * j + 1) for j in range(2, 11))
_TWO52 = 4503599627370496.0


@branch_free
def _log_dd_split(x):
    """(m, c, log c in two parts, k) with x = 2^k m, m in [sqrt(2)/2,
    sqrt(2)), c = 3/4, 1 or 3/2, whichever is nearest m, for finite x > 0."""
    denormal = x < _TINY64
    bits = _bits64(x * _TWO54 if denormal else x)
    k = (bits - _SQRT_HALF_BITS64) >> 52
    m = _float64(bits - (k << 52))
    c = 0.75 if m < _SQRT_3_4 else (1.5 if m >= _SQRT_3_2 else 1.0)
    log_c, log_c_lo = (_LOG_3_4 if m < _SQRT_3_4 else
                       (_LOG_3_2 if m >= _SQRT_3_2 else (0.0, 0.0)))
    return m, c, log_c, log_c_lo, float(k - 54) if denormal else float(k)


@branch_free
def _log_dd_f64(x):
    """log(x) as hi + lo, for finite x > 0, within about 2^-65 of it:
    x = 2^k m, m in [sqrt(2)/2, sqrt(2)), m = c (1+s)/(1-s) for c = 3/4, 1
    or 3/2, whichever is nearest (|s| < 0.102, and m - c is exact), and
    log m = log c + 2s + 2s^3/3 + ..., whose first terms are kept in two
    parts."""
    m, c, log_c, log_c_lo, dk = _log_dd_split(x)
    f = m - c  # exact
    d, d_err = _two_sum(m, c)
    s = f / d
    s_lo = (_fma(-s, d, f) - s * d_err) / d
    s2 = s * s
    s2_lo = _fma(s, s, -s2) + 2.0 * s * s_lo
    s3 = s2 * s
    s3_lo = _fma(s2, s, -s3) + (s2_lo * s + s2 * s_lo)
    t = s3 * _TWO_THIRDS
    t_lo = _fma(s3, _TWO_THIRDS, -t) + (s3_lo * _TWO_THIRDS + s3 * _TWO_THIRDS_LO)
    rest = s3 * s2 * _horner(s2, _ATANH_REST)
    a, a_err = _two_sum(dk * _LN2_HI, log_c)
    b, b_err = _two_sum(a, 2.0 * s)
    e, e_err = _two_sum(b, t)
    lo = (a_err + b_err + e_err) + (t_lo + 2.0 * s_lo) + (dk * _LN2_LO + log_c_lo + rest)
    hi = e + lo
    return hi, lo - (hi - e)


def _make_pow_special(zero, one, half, inf, nan, two_mantissa, as_bits):
    """`_pow_base` and `_pow_finish` of one float width (`two_mantissa`:
    2^52 or 2^23, from which every float of that width is an integer)."""
    @branch_free
    def pow_base(x):
        """|x|, or 1 where it is 0, inf or NaN (`pow_finish` answers there)."""
        ax = abs(x)
        # (`&`, not `and`: under Numba, Python's short circuit is a branch,
        # which stopped the loop vectorizer here)
        return ax if (ax > zero) & (ax < inf) else one

    @branch_free
    def pow_finish(x, y, core):
        """x^y from core = |x|^y (finite nonzero x): signs, C99's specials."""
        ax = abs(x)
        ay = abs(y)
        # (False for NaN)
        y_int = (ay >= two_mantissa) | ((ay + two_mantissa) - two_mantissa == ay)
        halved = ay * half
        y_odd = (y_int & (ay < two_mantissa + two_mantissa)
                 & ((halved + two_mantissa) - two_mantissa != halved))
        # |x| = 0 or inf: 0 or inf, inf where exactly one of them is "small"
        edge = inf if (ax == zero) == (y < zero) else zero
        r = core if (ax > zero) & (ax < inf) else edge
        flip = (as_bits(x) < 0) & y_odd  # (-0 and -inf too)
        r = -r if flip else r
        r = nan if (x < zero) & (ax < inf) & (not y_int) else r
        r = one if (ax == one) & (ay == inf) else r  # (-1)^+-inf
        r = nan if (x != x) | (y != y) else r
        return one if (y == zero) | (x == one) else r  # even for NaN
    return pow_base, pow_finish


_pow_base, _pow_finish = _make_pow_special(0.0, 1.0, 0.5, np.inf, np.nan, _TWO52, _bits64)
# float32's selects on a float32 core: the same results on vectors of half
# the width
_pow_base_f32, _pow_finish_f32 = _make_pow_special(
    _ZERO_F, _ONE_F, _HALF_F, _INF_F, _NAN_F, _f32(2.0**23), _bits32)


@branch_free
def _pow_f64(x, y):
    hi, lo = _log_dd_f64(_pow_base(x))
    return _pow_finish(x, y, _exp_dd_f64(*_times_dd(y, hi, lo)))


@branch_free
def _times_dd(y, hi, lo):
    """y (hi + lo) in two parts, the second 0 beyond 2000, where e^ of it is
    0 or inf anyway and the tail may be NaN."""
    z = y * hi
    z_lo = _fma(y, hi, -z) + y * lo
    in_range = abs(z) < 2000.0
    zz = z + z_lo if in_range else z
    return zz, z_lo - (zz - z) if in_range else 0.0


# e^r for |r| <= ln2/2 as Taylor's series to r^9 / 9!, within 2^-36
# relative: no division, unlike exp's rational form, and far within the
# 2^-30 that float32 pow's rounding once to 0.51 ulp leaves.
_EXP_TAYLOR = tuple(1.0 / _libm.factorial(j) for j in range(10))
# Beyond these e^z is inf or 0 in float32; 2^k stays a normal float64.
_POW32_Z_MAX = 200.0
_POW32_Z_MIN = -200.0


@branch_free
def _exp_for_f32(z):
    """e^z in float64 to about 2^-36 relative, to be rounded to float32."""
    z = _POW32_Z_MAX if z > _POW32_Z_MAX else z  # comparisons keep NaN as it is
    z = _POW32_Z_MIN if z < _POW32_Z_MIN else z
    shifted = z * _LOG2E + _SHIFT64
    k = _bits64(shifted) - _SHIFT64_BITS
    kd = shifted - _SHIFT64
    r = (z - kd * _LN2_HI) - kd * _LN2_LO
    return _horner(r, _EXP_TAYLOR) * _float64((k + 1023) << 52)


@branch_free
def _pow_f32(x, y):
    """|x|^y as e^(y log|x|) in float64 (log|x| of a float32 is never
    denormal there), rounded once to float32, then the special cases in
    float32."""
    base = np.float64(_pow_base_f32(x))
    core = _exp_for_f32(np.float64(y) * _log_normal_f64(base, 0))
    return _pow_finish_f32(x, y, _f32(core))


def tan(x):
    """The tangent: libm's in Python, sin / cos in a kernel."""
    return _libm.tan(x)


def pow(x, y):
    """x**y: libm's in Python, from exp and log in a kernel."""
    return _libm.pow(x, y)


def _pow_by_types(x, y):
    if isinstance(x, types.Integer) and isinstance(y, types.Integer):
        return operator.pow, (x, y)  # Numba's integer power
    if not all(isinstance(a, (types.Float, types.Integer, types.Boolean)) for a in (x, y)):
        return None
    if x == y == types.float32:
        return _pow_f32, (x, y)
    if x == y == types.float64:
        return _pow_f64, (x, y)
    return _pow_f64, (types.float64, types.float64)


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
    """Floats to the helper of their width; integers and booleans as
    float64."""
    def select(x):
        if isinstance(x, types.Float):
            return (f32_impl if x.bitwidth == 32 else f64_impl), (x,)
        if isinstance(x, (types.Integer, types.Boolean)):
            return f64_impl, (types.float64,)
        return None
    return select


# Each is an `alwaysinline` function of the kernel's module (expm1, tanh,
# sin, cos, tan and pow are larger than LLVM's inlining threshold).  Numba's
# IR inliner (`inline="always"`), which retyped the body at every call
# site, made a kernel calling tanh 3-4x slower to compile (0.6 s of
# inlining and 1 s of typing), and x ** y's value and gradient 1.8x.
kernel_function(exp, _by_width(_exp_f32, _exp_f64))
kernel_function(log, _by_width(_log_f32, _log_f64))
kernel_function(log1p, _by_width(_log1p_f32, _log1p_f64))
kernel_function(expm1, _by_width(_expm1_f32, _expm1_f64))
kernel_function(tanh, _by_width(_tanh_f32, _tanh_f64))
kernel_function(sin, _by_width(_sin_f32, _sin_f64))
kernel_function(cos, _by_width(_cos_f32, _cos_f64))
kernel_function(tan, _by_width(_tan_f32, _tan_f64))
kernel_function(pow, _pow_by_types)
kernel_function(erf, _by_width(_erf_f32, _erf_f64))
kernel_function(erfc, _by_width(_erfc_f32, _erfc_f64))


# ------------------------------------------------------------ sums


def accumulate(acc, x):
    """`acc + x` in `acc`'s type (x converted first), for a loop that sums
    into `acc`.  In a kernel, a float add carries LLVM's `reassoc` flag, on
    this one instruction only: it lets the loop vectorizer keep partial
    sums in vector lanes (a float sum may not be reordered otherwise, so a
    loop that sums with `+=` runs one element at a time), while the loop's
    other float arithmetic (the bit-level math above included) stays exact.
    The order of the partial sums is fixed by the compiled code, so a
    result is the same run to run, provided the kernel is compiled with
    `DisjointArrays` (see there): else LLVM keeps a scalar copy of a loop
    that also stores, run when an output lies just after an input in
    memory, which adds in another order.  (A plain function, typed and
    lowered for Numba below, so that kernels also run as Python under
    NUMBA_DISABLE_JIT.)"""
    return acc + type(acc)(x)


class DisjointArrays(Compiler):
    """Numba's compiler for a generated kernel (`pipeline_class=` in
    `runtime.cpu`'s decorators), whose array arguments it compiles as
    `noalias`.  Contract of its callers: no array a kernel writes overlaps
    another of its arrays (outputs are fresh, or `out=` buffers checked to
    overlap nothing; inputs may share memory, being only read).

    Why: not knowing that, LLVM's loop vectorizer versions a loop that
    stores and sums: a runtime check runs the vector loop (its sums in
    vector lanes, `accumulate`) unless an output starts within a few
    vectors after an input, where the scalar copy runs instead, adding in
    order.  The two differ in the last bits, so a sum over a short array
    (some tens of elements) depended on where the allocator had placed
    its arrays: a Dask block's partial loss changed by an ulp from one
    call to the next under the threaded scheduler (whose threads allocate
    in their own arenas), its inputs the same.  Numba's `prange` variants
    were compiled so already (a parfor body whose arrays it sees do not
    alias), so the serial ones could also differ from them."""

    def __init__(self, typingctx, targetctx, library, args, return_type, flags, locals):
        flags = flags.copy()
        flags.noalias = True
        super().__init__(typingctx, targetctx, library, args, return_type, flags, locals)


def _accumulate_type(acc, x):
    summable = (types.Integer, types.Boolean) + ((types.Float,) if isinstance(acc, types.Float)
                                                 else ())
    if isinstance(acc, (types.Float, types.Integer)) and isinstance(x, summable):
        return acc
    return None


@type_callable(accumulate)
def _type_accumulate(typingctx):
    return _accumulate_type


@lower_builtin(accumulate, types.Any, types.Any)
def _lower_accumulate(context, builder, signature, args):
    value = context.cast(builder, args[1], signature.args[1], signature.return_type)
    if isinstance(signature.return_type, types.Float):
        return builder.fadd(args[0], value, flags=("reassoc",))
    return builder.add(args[0], value)  # integer sums reorder freely


def select(condition, a, b):
    """`a if condition else b` of two values already computed (the op
    table's `where`).  In a kernel it is one LLVM `select` instruction:
    Numba turns a conditional expression into three blocks and a phi, and
    its SSA pass is quadratic in blocks times variables, so a chain of
    `where`s (an `elif` chain of a hundred branches) took seconds to
    compile where LLVM makes selects of the phis anyway.  (A plain function
    for NUMBA_DISABLE_JIT, as `accumulate`.)"""
    return a if condition else b


def _select_type(typingctx, condition, a, b):
    if not isinstance(condition, types.Boolean):
        return None
    if a == b:
        return a
    unified = typingctx.unify_types(a, b)
    return unified if isinstance(unified, (types.Number, types.Boolean)) else None


@type_callable(select)
def _type_select(typingctx):
    return lambda condition, a, b: _select_type(typingctx, condition, a, b)


@lower_builtin(select, types.Any, types.Any, types.Any)
def _lower_select(context, builder, signature, args):
    result = signature.return_type
    a, b = (context.cast(builder, v, t, result) for v, t in zip(args[1:], signature.args[1:]))
    return builder.select(args[0], a, b)


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


@branch_free
def _float_greatest(a, b):
    return _float_maximum(a, b)


@branch_free
def _greater(a, b):
    return a if a >= b else b  # (integers: no NaN)


kernel_function(greatest, lambda a, b: ((_float_greatest if isinstance(a, types.Float)
                                         and a == b else _greater), (a, b)))


# ------------------------------------------------------------ products
# For a loop's body that may run as one compiled function (`codegen`),
# on flat C-order arrays (a reshape is then no step at all: Numba's
# reshape and transpose, with their checks' messages, took seconds to
# compile).


@jit_in_kernel_cache()
def matrix_product(a, b, n, k, m):
    """The flat n x m product of a (n x k) and b (k x m), each element's
    terms added in the order of k, from the first (so -0.0 where every
    term is: 0 where k is 0), in their dtype: the same bits whether the
    driver runs the loop's trips (from Python) or a compiled loop does
    (BLAS, which a kernel cannot call, orders and fuses its terms its own
    way).  Starting each row from its first term, not from zeros, halved
    an outer product's time (k = 1: a rank-1 update of an RNN's weight
    gradient), and the offsets are unsigned (see "gathers" below)."""
    out = np.empty(n * m, a.dtype)
    for i in range(n):
        row = np.uint64(i * m)
        if k == 0:
            for j in range(np.uint64(m)):
                out[row + j] = 0
            continue
        first = a[np.uint64(i * k)]
        for j in range(np.uint64(m)):
            out[row + j] = first * b[j]
        for kk in range(1, k):
            aik, b_row = a[np.uint64(i * k + kk)], np.uint64(kk * m)
            for j in range(np.uint64(m)):
                out[row + j] += aik * b[b_row + j]
    return out


@jit_in_kernel_cache()
def add_outer(out, column, row, n, m, product_first):
    """out (n x m) plus the outer product of column (n) and row (m), in
    place (a compiled loop's rank-one update, `codegen._rank_one_updates`):
    each element the product, rounded (`matrix_product`'s of one term),
    then the sum, its operands in the fused add's order (`product_first`:
    the product, then out), so the bits of the product made and then
    added, a NaN's payload too: where the first operand is a NaN the sum
    is it (quieted), as the CPU gives, chosen here because the compiler
    may swap an add's operands (the product, in a register, first)."""
    for i in range(n):
        ci, start = column[np.uint64(i)], np.uint64(i * m)
        if product_first:
            for j in range(np.uint64(m)):
                term = ci * row[j]  # (a NaN here is quiet already)
                out[start + j] = term + out[start + j] if term == term else term
        else:
            for j in range(np.uint64(m)):
                first = out[start + j]
                out[start + j] = first + ci * row[j] if first == first else first + first


@jit_in_kernel_cache()
def matrix_transpose(x, rows, columns):
    """The flat transpose of a flat rows x columns matrix."""
    out = np.empty(rows * columns, x.dtype)
    for i in range(rows):
        for j in range(columns):
            out[j * rows + i] = x[i * columns + j]
    return out


# ------------------------------------------------------------ gathers
# np.take's rows and np.add.at's adds over flat C-order arrays viewed as
# (outer, n, inner): index k picks slice idx[k] along the middle axis (a
# negative one counts from the end, as NumPy's).  `runtime.cpu.take` and
# `scatter_add` call them, and so does a compiled loop (`codegen`), so a
# loop's gathers have the same bits whichever runs its trips.  Each
# returns the position in idx of the first index out of range (its
# caller reports it), or -1.  Their offsets are unsigned: Numba wraps a
# negative signed index around, a compare and an add per access that
# kept LLVM from vectorizing the copy (4x slower for rows of 64).


@jit_in_kernel_cache()
def first_out_of_range(idx, n):
    """The position in idx (flat) of its first index outside [-n, n), or
    -1: a compiled loop's `check_index`."""
    for k in range(idx.size):
        if idx[k] < -n or idx[k] >= n:
            return k
    return -1


@jit_in_kernel_cache()
def gather_rows(x, idx, out, outer, n, inner):
    """out (outer, idx.size, inner) = x (outer, n, inner) at idx."""
    m = idx.size
    for k in range(m):
        j = idx[k]
        if j < -n or j >= n:
            return k
        j = j + n if j < 0 else j
        if outer == 1 and inner == 1:  # (each loop of one costs 2-3x here)
            out[np.uint64(k)] = x[np.uint64(j)]
            continue
        for o in range(outer):
            source, target = np.uint64((o * n + j) * inner), np.uint64((o * m + k) * inner)
            if inner == 1:
                out[target] = x[source]
            else:
                for i in range(np.uint64(inner)):
                    out[target + i] = x[source + i]
    return -1


@jit_in_kernel_cache()
def scatter_rows(out, idx, values, outer, n, inner):
    """out (outer, n, inner) with values (outer, idx.size, inner) added
    at idx in place, each element's values in the order of idx."""
    m = idx.size
    for k in range(m):
        j = idx[k]
        if j < -n or j >= n:
            return k
        j = j + n if j < 0 else j
        if outer == 1 and inner == 1:  # (a segment sum)
            out[np.uint64(j)] += values[np.uint64(k)]
            continue
        for o in range(outer):
            target, source = np.uint64((o * n + j) * inner), np.uint64((o * m + k) * inner)
            if inner == 1:
                out[target] += values[source]
            else:
                for i in range(np.uint64(inner)):
                    out[target + i] += values[source + i]
    return -1


# take_along_axis and its VJP over flat C-order arrays viewed as (outer,
# n, inner) (x, out) and (outer, m, inner) (idx, values): position
# (o, k, i) of idx picks x[o, idx[o, k, i], i].  The driver's
# `runtime.cpu.take_along_axis` and `scatter_add_along_axis` call them,
# and so does a compiled loop (a batch's cross-entropy picks each row's
# target), so that both give the same bits.


@jit_in_kernel_cache()
def gather_along(x, idx, out, outer, n, inner):
    """out (as idx) = x at idx along the middle axis."""
    m = idx.size // (outer * inner) if outer * inner else 0
    for t in range(idx.size):
        o, i = t // (m * inner), t % inner
        j = idx[t]
        if j < -n or j >= n:
            return t
        j = j + n if j < 0 else j
        out[t] = x[np.uint64((o * n + j) * inner + i)]
    return -1


@jit_in_kernel_cache()
def scatter_along(out, idx, values, outer, n, inner):
    """out with values (as idx) added in place where `gather_along` reads,
    each element's values in the order of idx."""
    m = idx.size // (outer * inner) if outer * inner else 0
    for t in range(idx.size):
        o, i = t // (m * inner), t % inner
        j = idx[t]
        if j < -n or j >= n:
            return t
        j = j + n if j < 0 else j
        out[np.uint64((o * n + j) * inner + i)] += values[t]
    return -1
