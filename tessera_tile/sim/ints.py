"""Numba's integer typing for the values the simulator hands to a kernel.

Numba types ``int32 + int32`` as int64: integer arithmetic widens to at least 64 bits, signed if
either operand is signed (a Python integer literal counts as int64). NumPy keeps int32 and wraps.
So that a simulated kernel computes what the compiled one computes, every narrow integer
(8, 16 or 32 bits) a kernel reads from an array, a shared or local array, a kernel argument or a
warp vote is a :data:`NARROW` scalar: it keeps its type while it is only moved (stored, shuffled,
passed to ``cuda.popc``), and arithmetic on it gives the 64-bit result Numba's typing gives.
Stores cast back to the array's type with wraparound, as compiled code does. Float arrays are
left alone (nothing to pay for them).
"""

from __future__ import annotations

import operator

import numpy as np
from numba.cuda import types

from .._runtime import compat

_MASK64 = (1 << 64) - 1
_HALF64 = 1 << 63


def _int64(r: int):
    """A Python integer result as int64, wrapping around like compiled code."""
    if -_HALF64 <= r < _HALF64:
        return np.int64(r)
    return np.int64(((r + _HALF64) & _MASK64) - _HALF64)


def _uint64(r: int):
    return np.uint64(r & _MASK64)


def _wide(a):
    return np.uint64(int(a)) if isinstance(a, np.unsignedinteger) else np.int64(int(a))


_INTEGERS = (int, np.integer)
_UNSIGNED = np.unsignedinteger


def _exact(op):
    """Operators that are exact on Python integers and wrap at 64 bits (add, shifts, ...)."""

    def apply(x, y):
        if isinstance(x, _INTEGERS) and isinstance(y, _INTEGERS):
            r = op(int(x), int(y))
            # Unsigned only when both are unsigned: a literal or a signed operand makes the
            # result signed (Numba's typing).
            unsigned = isinstance(x, _UNSIGNED) and isinstance(y, _UNSIGNED)
            return _uint64(r) if unsigned else _int64(r)
        # a float: NumPy promotes the widened integer with it as Numba does
        return op(
            _wide(x) if isinstance(x, np.integer) else x,
            _wide(y) if isinstance(y, np.integer) else y,
        )

    return (lambda self, other: apply(self, other)), (lambda self, other: apply(other, self))


def _numpy(op):
    """Operators with NumPy's integer semantics (no exception on division by zero)."""

    def operands(a, b):
        if isinstance(b, np.integer):
            if isinstance(a, np.unsignedinteger) and isinstance(b, np.unsignedinteger):
                return np.uint64(int(a)), np.uint64(int(b))
            return np.int64(int(a)), np.int64(int(b))
        if isinstance(b, int):  # a literal: int64, so the result is signed
            return np.int64(int(a)), b
        return _wide(a), b

    def forward(self, other):
        a, b = operands(self, other)
        return op(a, b)

    def reflected(self, other):
        a, b = operands(self, other)
        return op(b, a)

    return forward, reflected


def _unary(op, base: type):
    """Numba negates and inverts at the operand's width, then widens to 64 bits
    (``int_negate_impl``: "negate before upcasting"): -int32(-2**31) is -2**31 as an int64."""
    bits, signed = np.iinfo(base).bits, np.iinfo(base).min < 0

    def apply(self):
        r = op(int(self)) & ((1 << bits) - 1)  # wraps at the operand's width
        if signed and r >> (bits - 1):
            r -= 1 << bits
        return np.int64(r) if signed else np.uint64(r)

    return apply


_EXACT = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "lshift": operator.lshift,
    "rshift": operator.rshift,
    "and": operator.and_,
    "or": operator.or_,
    "xor": operator.xor,
}
_NUMPY = {"floordiv": operator.floordiv, "mod": operator.mod, "pow": operator.pow, "divmod": divmod}
# -x, +x and ~x are 64-bit results of a narrow operation (abs keeps the type: NumPy's matches).
_UNARY = {"neg": operator.neg, "pos": operator.pos, "invert": operator.invert}


def _narrow_type(base: type) -> type:
    namespace: dict = {"__slots__": (), "__doc__": f"A simulated {base.__name__} (Numba typing)."}
    for name, op in _EXACT.items():
        namespace[f"__{name}__"], namespace[f"__r{name}__"] = _exact(op)
    for name, op in _NUMPY.items():
        namespace[f"__{name}__"], namespace[f"__r{name}__"] = _numpy(op)
    for name, op in _UNARY.items():
        namespace[f"__{name}__"] = _unary(op, base)
    return type(f"Sim{base.__name__.capitalize()}", (base,), namespace)


# plain NumPy type -> its simulated twin
NARROW: dict[type, type] = {
    t: _narrow_type(t) for t in (np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32)
}
_NARROW_DTYPES = frozenset(np.dtype(t) for t in NARROW)


def narrow(value):
    """``value`` as a simulated narrow integer when it is a plain narrow NumPy integer."""
    t = NARROW.get(type(value))
    return value if t is None else t(value)


def _wrapped(value, dtype: np.dtype):
    """``value`` cast to ``dtype`` with wraparound (what a compiled store does)."""
    if isinstance(value, int | np.integer):
        return np.uint64(int(value) & _MASK64).astype(dtype)
    return np.asarray(value).astype(dtype)


def as_declared(value, ty):
    """An integer ``value`` as the integer type ``ty`` that a signature declares for it, wrapped
    around as compiled code converts it; anything else is returned unchanged.

    Floats stay Python floats: NumPy's float32 scalars do not follow Numba's typing
    (``float32 * 2.5`` is float64 in Numba, float32 in NumPy).
    """
    if isinstance(ty, types.Integer) and isinstance(value, int | np.integer):
        return narrow(_wrapped(value, compat.as_dtype(ty)))
    return value


class IntArray(np.ndarray):
    """A view of a narrow-integer array: elements read as simulated narrow integers and stores
    wrap around."""

    def __getitem__(self, idx):
        value = np.ndarray.__getitem__(self, idx)
        t = NARROW.get(type(value))
        return value if t is None else t(value)

    def __setitem__(self, idx, value):
        try:
            np.ndarray.__setitem__(self, idx, value)
        except OverflowError:  # NumPy refuses out-of-range integers; compiled code wraps
            np.ndarray.__setitem__(self, idx, _wrapped(value, self.dtype))


def typed_view(array: np.ndarray) -> np.ndarray:
    """``array`` itself, or an :class:`IntArray` view of it when it holds narrow integers."""
    if array.dtype in _NARROW_DTYPES and not isinstance(array, IntArray):
        return array.view(IntArray)
    return array


def _bits(value) -> tuple[int, int]:
    """(bit pattern, width) of an integer as Numba types it (a Python int is an int64)."""
    width = value.dtype.itemsize * 8 if isinstance(value, np.integer) else 64
    return int(value) & ((1 << width) - 1), width


def popc(value):
    """``cuda.popc``: set bits of the value's two's-complement pattern in its own width."""
    bits, _ = _bits(value)
    return bits.bit_count()


def clz(value):
    """``cuda.clz``: leading zero bits in the value's width."""
    bits, width = _bits(value)
    return width - bits.bit_length()


def ffs(value):
    """``cuda.ffs``: 1-based position of the lowest set bit, 0 when there is none."""
    bits, _ = _bits(value)
    return (bits & -bits).bit_length()


def brev(value):
    """``cuda.brev``: the bits reversed, as uint32 for 32 bits or fewer, else uint64."""
    bits, width = _bits(value)
    width = 32 if width <= 32 else 64
    reversed_bits = int(f"{bits:0{width}b}"[::-1], 2)
    return NARROW[np.uint32](reversed_bits) if width == 32 else np.uint64(reversed_bits)
