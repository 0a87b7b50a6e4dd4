"""Device helpers that generated kernels call, with NumPy's semantics.

Generated source is the same for the GPU and the simulator; only the names it resolves differ:
on a GPU ``exp`` is ``math.exp`` (lowered to libdevice), in the simulator ``numpy.exp``, because
Python's ``math`` raises where NumPy returns inf or NaN (``math.log(-1.0)``, ``math.exp(1e4)``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .. import _config

# name -> implementation, per target
MATH_NAMES = ("exp", "exp2", "log", "log2", "log1p", "expm1", "sqrt", "sin", "cos", "tanh")
if _config.SIMULATED:
    MATH = {name: getattr(np, name) for name in MATH_NAMES}
    MATH.update(floor=np.floor, ceil=np.ceil, fmod=np.fmod)
else:
    MATH = {name: getattr(math, name) for name in MATH_NAMES}
    MATH.update(floor=math.floor, ceil=math.ceil, fmod=math.fmod)
MATH.update(erf=math.erf, isfinite=math.isfinite, isinf=math.isinf, copysign=math.copysign)

fmod = MATH["fmod"]
floor = MATH["floor"]


@cuda.jit(device=True)
def max_nan(a, b):
    """NumPy's maximum: NaN wins."""
    if a != a:
        return a
    if b != b or b > a:
        return b
    return a


@cuda.jit(device=True)
def min_nan(a, b):
    """NumPy's minimum: NaN wins."""
    if a != a:
        return a
    if b != b or b < a:
        return b
    return a


@cuda.jit(device=True)
def floordiv_int(a, b):
    """NumPy's integer floor_divide: rounds toward -inf; division by zero gives 0."""
    if b == 0:
        return a - a
    q = a // b
    return q


@cuda.jit(device=True)
def mod_int(a, b):
    """NumPy's integer remainder: the sign of the divisor; modulo zero gives 0."""
    if b == 0:
        return a - a
    return a % b


@cuda.jit(device=True)
def floordiv_float(a, b):
    """NumPy's float floor_divide (npy_divmod)."""
    if b == 0:
        return a / b
    mod = fmod(a, b)
    div = (a - mod) / b
    if mod != 0 and (b < 0) != (mod < 0):
        div -= 1
    if div != 0:
        q = floor(div)
        if div - q > 0.5:
            q += 1
        return div - div + q
    return math.copysign(div - div, a / b)


@cuda.jit(device=True)
def mod_float(a, b):
    """NumPy's float remainder (npy_divmod): the sign of the divisor."""
    if b == 0:
        return fmod(a, b)
    mod = fmod(a, b)
    if mod != 0:
        if (b < 0) != (mod < 0):
            mod += b
        return mod
    return math.copysign(mod - mod, b)


@cuda.jit(device=True)
def pow_int(a, b):
    """Integer power by squaring (wraps like NumPy). A negative exponent, which NumPy rejects
    with ValueError, gives 0 here: a kernel cannot raise."""
    result = a - a + 1
    if b < 0:
        return result - result
    base = a
    e = b
    while e > 0:
        if e & 1:
            result = result * base
        base = base * base
        e >>= 1
    return result


@cuda.jit(device=True)
def bit_or(a, b):
    """any(): accumulators are 0/1 int32 (shuffles do not move booleans)."""
    return a | b


@cuda.jit(device=True)
def bit_and(a, b):
    """all(): accumulators are 0/1 int32."""
    return a & b
