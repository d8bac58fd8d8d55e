"""What `math` means inside CUDA kernels on a GPU: Python's `math` (which
numba-cuda compiles to libdevice), the quotient and remainder of a float
floor division, which the op table's `fmod_template`s call there, and
`select`, which its `kernel_template` of `where` calls.

Contract: `floor_quotient(x, y, one)` and `floor_remainder(x, y, one)` are
NumPy's `floor_divide` and `remainder` of floats x and y (`one`: 1 in their
type, so that every step computes in it), bit for bit where libdevice's
fmod is (it is exact) and the NaNs aside (a GPU's NaN has no sign bit
set), for every y and every finite x (an infinite x is the templates' own
case).  They follow NumPy's `npy_divmod`, with fmod where Numba's lowering
has LLVM's `frem`, which NVPTX expands inexactly as x - trunc(x / y) * y:
1e17 % 3.0 was 0 or 4 (it is 1).  Imported only where numba-cuda is
(`runtime.cuda`); under the simulator they run as Python, on the values
the simulator's kernels hold.
"""
from __future__ import annotations

import math
from math import *  # noqa: F401,F403  (a kernel's math.exp is math's)

from numba import cuda


@cuda.jit(device=True)
def floor_quotient(x, y, one):
    zero = one - one
    if y == zero:
        return x / y
    mod = math.fmod(x, y)
    div = (x - mod) / y
    if mod != zero and (y < zero) != (mod < zero):
        div -= one
    if div != zero:
        # floor(div) in div's type: its integer part (exact: fmod is), then
        # one less for a negative fraction; from 2**52 on (and at inf) a
        # float is integral
        floor = div
        if abs(div) < 4503599627370496.0:
            floor = div - math.fmod(div, one)
            if floor > div:
                floor -= one
        if div - floor > one / (one + one):  # snap to the nearest integer
            floor += one
        return floor
    return div * div * x / y  # a zero with the sign of x / y


@cuda.jit(device=True)
def floor_remainder(x, y, one):
    zero = one - one
    if y == zero:
        return (x * y) / (x * y)  # fmod's NaN, x's where x is one
    mod = math.fmod(x, y)
    if mod != zero:
        if (y < zero) != (mod < zero):
            mod += y  # the divisor's sign
        return mod
    return math.copysign(zero, y)


@cuda.jit(device=True)
def select(condition, a, b):
    # the op table's `where` in kernels (`runtime.cpu_math.select` says why)
    return a if condition else b
