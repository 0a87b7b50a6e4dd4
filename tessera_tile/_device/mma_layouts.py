"""The PTX ISA's layouts of the tensor-core instructions that kernels, the primitives and the
simulator's twins all use: the ``ldmatrix`` row, the TF32 operand bits, and Hopper's wgmma
matrix descriptors (encode, decode, the addresses they name, the swizzles). Pure arithmetic:
nothing here runs a kernel or needs the simulator."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ROW_BYTES = 16  # one ldmatrix row: 8 x 16-bit
TF32_MASK = np.uint32(0xFFFFE000)  # the bits a TF32 operand keeps: sign, exponent, 10 mantissa

SWIZZLE_NONE, SWIZZLE_128B, SWIZZLE_64B, SWIZZLE_32B = 0, 1, 2, 3
# swizzle mode -> the width of its repeating row in bytes (PTX ISA: 128B, 64B, 32B modes)
SWIZZLE_BYTES = {SWIZZLE_NONE: 0, SWIZZLE_128B: 128, SWIZZLE_64B: 64, SWIZZLE_32B: 32}
WARPGROUP = 128
WGMMA_N = tuple(range(8, 257, 8))  # m64nNk16 with f16/bf16 inputs: N = 8, 16, ..., 256
_FIELD = 0x3FFFF  # an 18-bit byte value, stored >> 4 in 14 bits
RESERVED_BITS = ~((0x3FFF) | (0x3FFF << 16) | (0x3FFF << 32) | (0x7 << 49) | (0x3 << 62)) & (
    (1 << 64) - 1
)


@dataclass(frozen=True)
class MatrixDescriptor:
    """The fields of a wgmma matrix descriptor (PTX ISA 8.x, "Matrix Descriptor Format" of the
    asynchronous warpgroup-level matrix instructions), in bytes."""

    start_address: int  # bits 0-13: (address & 0x3FFFF) >> 4
    leading_byte_offset: int  # bits 16-29, same encoding
    stride_byte_offset: int  # bits 32-45, same encoding
    base_offset: int  # bits 49-51
    swizzle: int  # bits 62-63: 0 none, 1 128B, 2 64B, 3 32B


def encode_descriptor(
    address: int,
    leading_byte_offset: int,
    stride_byte_offset: int,
    swizzle: int = SWIZZLE_NONE,
    base_offset: int = 0,
) -> int:
    """The 64-bit wgmma matrix descriptor of a shared-memory operand (a Python int).

    ``address``: the shared-window byte address of the matrix's start; the byte offsets as the
    PTX ISA's canonical layouts define them (see :mod:`tessera_tile.mma`); all three multiples
    of 16 below 2**18. ``swizzle``: ``SWIZZLE_NONE``, ``SWIZZLE_128B``, ``SWIZZLE_64B`` or
    ``SWIZZLE_32B``; ``base_offset``: 0..7. ``ValueError`` for anything else.
    """
    for what, value in (
        ("address", address),
        ("leading_byte_offset", leading_byte_offset),
        ("stride_byte_offset", stride_byte_offset),
    ):
        value = int(value)
        if not 0 <= value <= _FIELD or value % 16:
            raise ValueError(f"{what} must be a multiple of 16 in [0, 2**18), got {value}")
    if int(swizzle) not in SWIZZLE_BYTES:
        raise ValueError(f"swizzle must be 0 (none), 1 (128B), 2 (64B) or 3 (32B), got {swizzle}")
    if not 0 <= int(base_offset) <= 7:
        raise ValueError(f"base_offset must be in 0..7, got {base_offset}")
    return (
        (int(address) >> 4)
        | ((int(leading_byte_offset) >> 4) << 16)
        | ((int(stride_byte_offset) >> 4) << 32)
        | (int(base_offset) << 49)
        | (int(swizzle) << 62)
    )


def decode_descriptor(desc) -> MatrixDescriptor:
    """The fields of a 64-bit descriptor (an int or a NumPy integer, any sign)."""
    d = int(desc) & ((1 << 64) - 1)
    return MatrixDescriptor(
        start_address=(d & 0x3FFF) << 4,
        leading_byte_offset=((d >> 16) & 0x3FFF) << 4,
        stride_byte_offset=((d >> 32) & 0x3FFF) << 4,
        base_offset=(d >> 49) & 0x7,
        swizzle=(d >> 62) & 0x3,
    )


def swizzled(addresses, swizzle: int):
    """Byte addresses after the swizzle of ``swizzle`` mode (an XOR of the 16-byte chunk bits
    4.. of the address with its bits 7..: 3 bits for 128B, 2 for 64B, 1 for 32B)."""
    bits = {SWIZZLE_NONE: 0, SWIZZLE_128B: 3, SWIZZLE_64B: 2, SWIZZLE_32B: 1}[swizzle]
    mask = (1 << bits) - 1
    return addresses ^ (((addresses >> 7) & mask) << 4)


def operand_addresses(desc: MatrixDescriptor, rows: int, mn_major: bool, itemsize: int = 2):
    """``(rows, 16)`` byte addresses of a ``rows`` x 16 (M or N by K) operand of 16-bit elements
    that ``desc`` describes: the canonical layouts of the PTX ISA (asynchronous warpgroup-level
    matrix "Shared Memory Matrix Layout"), in units of T = 16 bytes / element (CuTe notation,
    as the ISA writes them; m = rows / 8 or rows / (8 T), k = 2 (K-major) or 2 (MN-major)):

    ============  ======================================  =====================================
    swizzle       K-major (no transpose)                  MN-major (transpose)
    ============  ======================================  =====================================
    none          ((8,m),(T,2)) : ((1T,SBO),(1,LBO))      ((T,1,m),(8,2)) : ((1,T,SBO),(1T,LBO))
    32B           ((8,m),(T,2)) : ((2T,SBO),(1,T))        ((T,2,m),(8,2)) : ((1,T,LBO),(2T,SBO))
    64B           ((8,m),(T,2)) : ((4T,SBO),(1,T))        ((T,4,m),(8,2)) : ((1,T,LBO),(4T,SBO))
    128B          ((8,m),(T,2)) : ((8T,SBO),(1,T))        ((T,8,m),(8,2)) : ((1,T,LBO),(8T,SBO))
    ============  ======================================  =====================================

    then the swizzle of the absolute address (:func:`swizzled`)."""
    t = 16 // itemsize
    r = np.arange(rows)[:, None]
    k = np.arange(16)[None, :]
    lbo, sbo = desc.leading_byte_offset, desc.stride_byte_offset
    width = SWIZZLE_BYTES[desc.swizzle]
    if not mn_major:
        chunk, within = k // t, (k % t) * itemsize
        if width == 0:
            offset = (r % 8) * 16 + (r // 8) * sbo + chunk * lbo + within
        else:
            offset = (r % 8) * width + (r // 8) * sbo + chunk * 16 + within
    else:
        within = (r % t) * itemsize
        if width == 0:
            offset = within + (r // t) * sbo + (k % 8) * 16 + (k // 8) * lbo
        else:
            per_row = width // 16  # 16-byte chunks in one swizzle row
            chunk = (r // t) % per_row
            offset = within + chunk * 16 + (r // (t * per_row)) * lbo + (k % 8) * width
            offset = offset + (k // 8) * sbo
    return swizzled(desc.start_address + offset, desc.swizzle)
