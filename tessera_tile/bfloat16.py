"""bfloat16 in kernels: conversions to and from float32, as inline PTX with simulator twins.

A bfloat16 array reaches a kernel as its ``uint16`` bit pattern (an ``ml_dtypes.bfloat16``
array viewed as ``uint16``): numba-cuda's own bfloat16 type lowers its conversions to functions
of a CUDA C++ shim that must be compiled with NVRTC and linked, which offline compilation
(:mod:`tessera_tile.inspect`) and the simulator cannot do. These need nothing but PTX:

* ``bf16_to_f32(bits) -> float32``: exact (a bfloat16 is the upper half of a float32); a shift
  and a move, no conversion instruction;
* ``f32_to_bf16(x) -> uint16``: rounded to nearest even (``cvt.rn.bf16.f32``, sm_80 and
  later); overflow gives inf, a NaN gives a NaN;
* ``pack_bf16x2(lo, hi) -> uint32``: two values rounded the same way into one register, ``lo``
  in the low half (``cvt.rn.bf16x2.f32``, one ``F2FP.BF16`` in SASS): a 32-bit store of two
  results, or an A-fragment register of a bfloat16 ``mma``.

The twins compute the same bits in NumPy. The payload of a NaN result is the canonical
``0x7FFF`` that CUDA's own host conversion gives; tests check NaN-ness, not payloads.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.cuda.extending import intrinsic

from ._device import twins
from ._runtime import config as _config
from ._runtime.compat import NumbaTypeError

if _config.SIMULATED:  # what the twins below use, run in the simulator only
    from .sim.ints import narrow

__all__ = ["bf16_to_f32", "f32_to_bf16", "pack_bf16x2"]

_I16, _I32 = ir.IntType(16), ir.IntType(32)
CANONICAL_NAN = 0x7FFF


def bits_to_float32(bits) -> np.ndarray:
    """bfloat16 bit patterns (any integer array) as the float32 values they are, exactly."""
    return (np.asarray(bits, np.uint32) << 16).view(np.float32)


def float32_to_bits(x) -> np.ndarray:
    """float32 values rounded to nearest even to bfloat16 bit patterns (``uint16``)."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, np.uint16(CANONICAL_NAN), rounded)


def _check_number(name: str, x) -> None:
    if not isinstance(x, types.Number):
        raise NumbaTypeError(f"{name} takes numbers, got {x}")


def _to_f32_twin(bits):
    return np.float32(bits_to_float32(int(bits) & 0xFFFF)[()])


@twins.twin(_to_f32_twin)
@intrinsic
def bf16_to_f32(typingctx, bits):
    """``bf16_to_f32(bits) -> float32``: the bfloat16 whose bit pattern is ``bits`` (its low
    16 bits), exactly."""
    if not isinstance(bits, types.Integer):
        raise NumbaTypeError(f"bf16_to_f32 takes a bfloat16's bits (an integer), got {bits}")

    def codegen(context, builder, sig, args):
        h = context.cast(builder, args[0], sig.args[0], types.uint16)
        wide = builder.shl(builder.zext(h, _I32), ir.Constant(_I32, 16))
        return builder.bitcast(wide, ir.FloatType())

    return types.float32(bits), codegen


def _to_bf16_twin(x):
    return narrow(np.uint16(float32_to_bits(np.float32(x))[()]))


@twins.twin(_to_bf16_twin)
@intrinsic
def f32_to_bf16(typingctx, x):
    """``f32_to_bf16(x) -> uint16``: ``x`` (as float32) rounded to nearest even to bfloat16,
    its bit pattern (``cvt.rn.bf16.f32``)."""
    _check_number("f32_to_bf16", x)

    def codegen(context, builder, sig, args):
        f = context.cast(builder, args[0], sig.args[0], types.float32)
        asm = ir.InlineAsm(
            ir.FunctionType(_I16, [ir.FloatType()]), "cvt.rn.bf16.f32 $0, $1;", "=h,f"
        )
        return builder.call(asm, [f])

    return types.uint16(x), codegen


def _pack_twin(lo, hi):
    halves = float32_to_bits(np.array([lo, hi], np.float32))
    return narrow(np.uint32(int(halves[0]) | (int(halves[1]) << 16)))


@twins.twin(_pack_twin)
@intrinsic
def pack_bf16x2(typingctx, lo, hi):
    """``pack_bf16x2(lo, hi) -> uint32``: ``lo`` and ``hi`` rounded to nearest even to bfloat16
    in one register, ``lo`` in the low 16 bits (``cvt.rn.bf16x2.f32``)."""
    _check_number("pack_bf16x2", lo)
    _check_number("pack_bf16x2", hi)

    def codegen(context, builder, sig, args):
        f32 = ir.FloatType()
        lo_v = context.cast(builder, args[0], sig.args[0], types.float32)
        hi_v = context.cast(builder, args[1], sig.args[1], types.float32)
        # cvt puts its first source in the upper half
        asm = ir.InlineAsm(
            ir.FunctionType(_I32, [f32, f32]), "cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f"
        )
        return builder.call(asm, [lo_v, hi_v])

    return types.uint32(lo, hi), codegen
