"""Vectorizable `exp` and `log` for CPU kernels, which import this module
as `math` (`runtime.cpu.CpuTarget.header`).

Contract: inside a Numba kernel, `exp(x)` and `log(x)` of a float32 (a
float64) compute in float32 (float64) with a branch-free polynomial, within
the ulp bounds in docs/internals.md, and give every special value as libm
does: +-inf, NaN, +-0, denormal inputs and results, overflow to inf and
underflow to 0.  Integers are taken as float64.  Every other name
(`math.sqrt`, `math.floor`, ...) is the standard `math` module's, so a
kernel can say `math.<anything>`.  Called from Python, `exp` and `log` are
libm's.

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
s = (m-1)/(m+1).
"""
from __future__ import annotations

import math as _libm

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload, register_jitable

_JIT_OPTIONS = {"fastmath": {"contract"}, "nogil": True, "cache": False}


def __getattr__(name: str):
    # Names this module does not define are the standard math module's.
    return getattr(_libm, name)


# ------------------------------------------------------------ bit casts


def _bitcast(source: types.Type, target: types.Type, width: int, is_float: bool):
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


# ------------------------------------------------------------ dispatch


def exp(x):
    """e**x: libm's in Python, the polynomial in a kernel."""
    return _libm.exp(x)


def log(x):
    """The natural logarithm: libm's in Python, the polynomial in a kernel."""
    return _libm.log(x)


def _by_width(f32_impl, f64_impl):
    def select(x):
        if isinstance(x, types.Float):
            return f32_impl if x.bitwidth == 32 else f64_impl
        if isinstance(x, (types.Integer, types.Boolean)):
            return lambda x: f64_impl(float(x))
        return None
    return select


overload(exp, jit_options=_JIT_OPTIONS)(_by_width(_exp_f32, _exp_f64))
overload(log, jit_options=_JIT_OPTIONS)(_by_width(_log_f32, _log_f64))
