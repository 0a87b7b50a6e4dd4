"""Hopper's wgmma matrix descriptors (encode, decode, the addresses they name, swizzles) and the
shared-memory window the tensor cores read: what :mod:`.wgmma_twins` and the descriptor
intrinsic's twin share."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import sim

# ============================================================================================
# Warpgroup MMA (wgmma, sm_90a): matrix descriptors, the shared-memory window, the twins
# ============================================================================================
#
# A warpgroup is 4 consecutive warps of a block whose first warp's index is a multiple of 4
# (threads 128 g .. 128 g + 127 of the linear thread rank). Every wgmma instruction is
# ``.sync.aligned`` over the warpgroup: each warp arrives as a warp collective of the simulator
# (its 32 lanes converged), and then waits until the other 3 warps of its warpgroup have executed
# the same instruction (same kind, same source line, same position in the warp's sequence of
# wgmma instructions). The warpgroup's state (fences, groups in flight, accumulators) lives
# beside the running block, keyed by it.

SWIZZLE_NONE, SWIZZLE_128B, SWIZZLE_64B, SWIZZLE_32B = 0, 1, 2, 3
# swizzle mode -> the width of its repeating row in bytes (PTX ISA: 128B, 64B, 32B modes)
SWIZZLE_BYTES = {SWIZZLE_NONE: 0, SWIZZLE_128B: 128, SWIZZLE_64B: 64, SWIZZLE_32B: 32}
WARPGROUP = 128
WGMMA_N = tuple(range(8, 257, 8))  # m64nNk16 with f16/bf16 inputs: N = 8, 16, ..., 256
_FIELD = 0x3FFFF  # an 18-bit byte value, stored >> 4 in 14 bits
_RESERVED = ~((0x3FFF) | (0x3FFF << 16) | (0x3FFF << 32) | (0x7 << 49) | (0x3 << 62)) & (
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


class SharedWindow:
    """The block's shared memory as one 18-bit address space, as a descriptor addresses it.

    Each shared array (static, per call site, and the dynamic one) gets a window address the
    first time a twin asks for one; it keeps its host address's position modulo 1024, so the
    alignment a kernel asked for (``alignment=`` of ``cuda.shared.array``) is the alignment the
    swizzle patterns see, and an alignment it did not ask for is a matter of chance, as on a
    GPU."""

    LIMIT = 1 << 18

    def __init__(self, block):
        self.block = block
        self.regions: dict[int, tuple[int, np.ndarray]] = {}  # host start -> (window, bytes)
        self.cursor = 0

    def _candidates(self):
        for region in (*self.block.shared.values(), self.block.dynshared):
            raw = np.asarray(region)
            if raw.nbytes:
                yield sim.address(raw), raw.reshape(-1).view(np.uint8)

    def address(self, host: int) -> int:
        """The window address of the shared byte at host address ``host``."""
        for lo, (start, data) in self.regions.items():  # the arrays already placed first
            if lo <= host < lo + data.size:
                return start + host - lo
        for lo, data in self._candidates():  # an array not placed yet: placed now
            if lo <= host < lo + data.size:
                start = -(-self.cursor // 1024) * 1024 + lo % 1024
                if start + data.size > self.LIMIT:
                    raise sim.SimulationError("wgmma: shared arrays pass the 256 KiB window")
                self.regions[lo] = (start, data)
                self.cursor = start + data.size
                return start + host - lo
        raise sim.SimulationError("wgmma: a matrix descriptor needs an address in shared memory")

    def read_u16(self, addresses: np.ndarray, what: str) -> np.ndarray:
        """The 16-bit words at ``addresses`` (window addresses, 2-byte aligned)."""
        flat = addresses.reshape(-1)
        out = np.empty(flat.size, np.uint16)
        found = np.zeros(flat.size, bool)
        for start, data in self.regions.values():
            inside = (flat >= start) & (flat + 2 <= start + data.size)
            if inside.any():
                off = flat[inside] - start
                out[inside] = data[off].astype(np.uint16) | (data[off + 1].astype(np.uint16) << 8)
                found |= inside
        if not found.all():
            bad = int(flat[~found][0])
            raise sim.SimulationError(
                f"wgmma: {what} reads shared address 0x{bad:05x}, outside every shared array "
                "of the block (a bad descriptor: start address, byte offsets or swizzle)"
            )
        return out.reshape(addresses.shape)
