"""The simulator twins of :mod:`tessera_tile.mma`'s intrinsics and the PTX ISA's fragment
layouts they follow (which lane's register holds which element of A, B and C). ``ldmatrix`` and
``mma`` run as warp collectives of :mod:`tessera_tile.sim`; the TF32 ``mma`` sums as an H200's
tensor core does (the model is in :mod:`tessera_tile.mma`'s docstring).
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import sim
from .sim._base import format_site, transparent_code, user_site
from .sim.ints import narrow

ROW_BYTES = 16  # one ldmatrix row: 8 x 16-bit

# --------------------------------------------------------------------------------------------
# Layouts (the PTX ISA's fragment tables), used by the twins
# --------------------------------------------------------------------------------------------


def _a_coord(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane & 3
    return g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2)


def _b_coord(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane & 3
    return 2 * t + (i & 1) + 8 * (i >> 1), g


def _c_coord(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane & 3
    return g + 8 * (i >> 1), 2 * t + (i & 1)


def _a_coord_tf32(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane & 3
    return g + 8 * (i & 1), t + 4 * (i >> 1)


def _b_coord_tf32(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane & 3
    return t + 4 * i, g


TF32_MASK = np.uint32(0xFFFFE000)  # the bits a TF32 operand keeps: sign, exponent, 10 mantissa


def _tf32_values(registers, count: int) -> np.ndarray:
    """The TF32 values the tensor core reads from ``count`` 32-bit registers (uint32 bit
    patterns or float32): the low 13 bits dropped (truncation toward zero)."""
    words = np.array(
        [
            np.float32(r).view(np.uint32) if isinstance(r, float | np.floating) else int(r)
            for r in registers
        ],
        dtype=np.int64,
    ).astype("<u4")
    if words.size != count:
        raise sim.SimulationError(f"expected a fragment of {count} registers, got {words.size}")
    return (words & TF32_MASK).view("<f4").astype(np.float64)


def _halves(registers, count: int) -> np.ndarray:
    """The float16 values of ``count`` packed registers (low half first)."""
    words = np.array([int(r) & 0xFFFFFFFF for r in registers], dtype="<u4")
    if words.size != count:
        raise sim.SimulationError(f"expected a fragment of {count} registers, got {words.size}")
    return words.view("<f2")


def _bf16_halves(registers, count: int) -> np.ndarray:
    """The bfloat16 values of ``count`` packed registers (low half first), as float32: a
    bfloat16 is the upper half of a float32."""
    words = np.array([int(r) & 0xFFFFFFFF for r in registers], dtype="<u4")
    if words.size != count:
        raise sim.SimulationError(f"expected a fragment of {count} registers, got {words.size}")
    return (words.view("<u2").astype(np.uint32) << 16).view(np.float32)


def _pack(lo, hi) -> np.uint32:
    return np.uint32(int(lo) | (int(hi) << 16))  # narrowed (Numba's typing) by the caller


# --------------------------------------------------------------------------------------------
# Simulator twins
# --------------------------------------------------------------------------------------------


def _ldmatrix_compute(count: int, trans: bool):
    def compute(args: dict) -> dict:
        mats = [np.stack([args[8 * j + r] for r in range(8)]) for j in range(count)]
        out = {}
        for lane in args:
            g, t = lane >> 2, lane & 3
            regs = [
                _pack(m[2 * t, g], m[2 * t + 1, g])
                if trans
                else _pack(m[g, 2 * t], m[g, 2 * t + 1])
                for m in mats
            ]
            out[lane] = narrow(regs[0]) if count == 1 else tuple(map(narrow, regs))
        return out

    return compute


def _ldmatrix_twin(count: int, trans: bool):
    kind = f"ldmatrix.x{count}{'.trans' if trans else ''}"
    sim.register_aligned(kind, _ldmatrix_compute(count, trans))

    def twin(smem, index):
        lane = sim.current_thread().lane
        row = None
        if lane < 8 * count:  # only these lanes' addresses are used
            key = tuple(int(i) for i in index) if isinstance(index, tuple) else (int(index),)
            if smem.itemsize not in (2, 4) or (trans and smem.itemsize != 2):
                raise sim.SimulationError(
                    f"{kind}: needs 16-bit elements{'' if trans else ' (or 32-bit ones)'}, got "
                    f"{smem.dtype}"
                )
            per_row = ROW_BYTES // smem.itemsize
            if not sim.in_shared_memory(smem):
                raise sim.SimulationError(
                    f"{kind}: reads shared memory; lane {lane} passed another array"
                )
            if len(key) != smem.ndim or any(
                not 0 <= i < n for i, n in zip(key, smem.shape, strict=True)
            ):
                raise sim.SimulationError(
                    f"{kind}: lane {lane}'s row index {key} is out of bounds for {smem.shape}"
                )
            if sim.element_address(smem, key) % ROW_BYTES:
                raise sim.SimulationError(
                    f"{kind}: lane {lane}'s row address (index {key}) is not 16-byte aligned "
                    "(ldmatrix needs 16-byte aligned rows)"
                )
            if smem.strides[-1] != smem.itemsize:
                raise sim.SimulationError(
                    f"{kind}: the last axis of {smem.shape} is not contiguous"
                )
            # a row is 16 bytes at an address: it may cross a row end of the array, not its end
            if not sim.in_allocation(smem, key, ROW_BYTES):
                raise sim.SimulationError(
                    f"{kind}: lane {lane}'s row {key} runs past the end of the shared array "
                    f"(shape {smem.shape})"
                )
            values = sim.load(smem, (*key[:-1], slice(key[-1], key[-1] + per_row)))
            row = np.asarray(values).view(np.uint16).copy()
        return sim.aligned_collective(kind, row)

    return twin


def _exact_sum(a, b, c) -> np.ndarray:
    """``a @ b + c`` summed exactly (float64) and rounded once to float32."""
    with np.errstate(invalid="ignore", over="ignore"):
        return (a @ b + c).astype(np.float32)


def _tf32_sum(a, b, c) -> np.ndarray:
    """``a @ b + c`` as an H200's TF32 tensor core sums it (probed, see the module docstring):
    every addend truncated toward zero to a multiple of ``2**(E - 25)``, E the largest addend
    exponent (a product's: the sum of its operands' exponents), the terms added exactly, the
    sum rounded toward zero to float32. Rows or columns holding a NaN or an infinity take the
    exact sum's IEEE result."""
    products = a[:, :, None] * b[None, :, :]  # (16, k, 8): exact, 11-bit significands
    exponents = np.frexp(a)[1][:, :, None] + np.frexp(b)[1][None, :, :] - 2
    terms = np.concatenate([products, c[:, None, :]], axis=1)
    exponents = np.concatenate([exponents, np.frexp(c)[1][:, None, :] - 1], axis=1)
    nonzero = terms != 0
    largest = np.where(nonzero, exponents, np.iinfo(np.int32).min).max(axis=1, keepdims=True)
    unit = np.ldexp(1.0, np.where(nonzero.any(axis=1, keepdims=True), largest - 25, 0))
    with np.errstate(invalid="ignore", over="ignore"):
        total = (np.trunc(terms / unit) * unit).sum(axis=1)  # < 2**31 units: exact
        rounded = total.astype(np.float32)
    toward_zero = np.abs(rounded.astype(np.float64)) > np.abs(total)
    rounded[toward_zero] = np.nextafter(rounded[toward_zero], np.float32(0))
    # NaN and infinities as IEEE gives them; all-zero sums with IEEE's sign of zero
    ieee = ~np.isfinite(terms).all(axis=1) | ~nonzero.any(axis=1)
    rounded[ieee] = _exact_sum(a, b, c)[ieee]
    return rounded


def _mma_twin_of(name: str, kind: str, k: int, values, a_coord, b_coord, accumulate=_exact_sum):
    """The twin of an ``m16n8k{k}`` mma: the warp's fragments gathered by the PTX layouts
    (``values`` unpacks a lane's registers), multiplied exactly and summed by ``accumulate``
    (float16: in float64, rounded once to float32, as the tensor core keeps at least float32
    precision in its sums; TF32: as the hardware sums)."""

    def compute(args: dict) -> dict:
        a = np.empty((16, k), np.float64)
        b = np.empty((k, 8), np.float64)
        c = np.empty((16, 8), np.float64)
        for lane, (ra, rb, rc) in args.items():
            for i, v in enumerate(values(ra, 4)):
                a[a_coord(lane, i)] = v
            for i, v in enumerate(values(rb, 2)):
                b[b_coord(lane, i)] = v
            for i in range(4):
                c[_c_coord(lane, i)] = rc[i]
        d = accumulate(a, b, c)
        return {lane: tuple(d[_c_coord(lane, i)] for i in range(4)) for lane in args}

    sim.register_aligned(kind, compute)

    def twin(a, b, c):
        if len(a) != 4 or len(b) != 2 or len(c) != 4:
            raise sim.SimulationError(
                f"{name} takes 4 A, 2 B and 4 C registers, got {len(a)}, {len(b)}, {len(c)}"
            )
        c32 = tuple(np.float32(x) for x in c)
        return sim.aligned_collective(kind, (tuple(a), tuple(b), c32))

    twin.__name__ = twin.__qualname__ = f"{name}_twin"
    return twin


_mma_twin = _mma_twin_of("mma_m16n8k16", "mma.m16n8k16", 16, _halves, _a_coord, _b_coord)
# bfloat16: float16's fragment layout; products exact in float32 (8 x 8 significant bits)
_mma_bf16_twin = _mma_twin_of(
    "mma_m16n8k16_bf16", "mma.m16n8k16.bf16", 16, _bf16_halves, _a_coord, _b_coord
)
_mma_tf32_twin = _mma_twin_of(
    "mma_m16n8k8_tf32", "mma.m16n8k8.tf32", 8, _tf32_values, _a_coord_tf32, _b_coord_tf32,
    _tf32_sum,
)  # fmt: skip


def _to_tf32_twin(x):
    """``cvt.rna.tf32.f32``: round the low 13 bits away, to nearest, ties away from zero
    (adding half a TF32 ulp to the magnitude bits, then masking); inf and NaN pass."""
    v = np.float32(x)
    if not np.isfinite(v):
        return v
    bits = (int(v.view(np.uint32)) + 0x1000) & 0xFFFFE000  # may round up to inf, as cvt does
    return np.uint32(bits).view(np.float32)


def _pair_twin(name: str, dtype, space: str, convert=None):
    """The twin of a two-element vector store ``name`` of ``dtype`` into ``space`` memory;
    ``convert`` makes the stored values from float32 (default: a cast to ``dtype``)."""
    size = 2 * np.dtype(dtype).itemsize

    def twin(out, index, x0, x1):
        key = tuple(int(i) for i in index) if isinstance(index, tuple) else (int(index),)
        if out.dtype != dtype:
            raise sim.SimulationError(f"{name}: needs a {np.dtype(dtype)} array, got {out.dtype}")
        if out.strides[-1] != out.itemsize:
            raise sim.SimulationError(f"{name}: the last axis of {out.shape} is not contiguous")
        if sim.element_address(out, key) % size:
            raise sim.SimulationError(f"{name}: index {key} is not {size}-byte aligned")
        if sim.in_shared_memory(out) != (space == "shared"):
            other = "a global" if space == "shared" else "a shared"
            raise sim.SimulationError(f"{name} ({space}): got {other} array")
        with np.errstate(over="ignore"):  # beyond float16's range: inf, as cvt.rn does
            pair = np.array([x0, x1], np.float32)
            values = pair.astype(dtype) if convert is None else convert(pair)
        # an address range: it may cross a row end of the array, not its allocation
        sim.store(out, (*key[:-1], slice(key[-1], key[-1] + 2)), values)

    twin.__name__ = twin.__qualname__ = f"{name}_{space}_twin"
    return twin


def _load_f32x2_shared_twin(smem, index):
    """``ld.shared.v2.f32``: the 8 bytes at ``&smem[index]`` (a shared float32 array, 8-byte
    aligned; they may cross a row end of the array, not its allocation)."""
    key = tuple(int(i) for i in index) if isinstance(index, tuple) else (int(index),)
    if smem.dtype != np.float32:
        raise sim.SimulationError(f"load_f32x2_shared: needs a float32 array, got {smem.dtype}")
    if not sim.in_shared_memory(smem):
        raise sim.SimulationError("load_f32x2_shared: reads shared memory; got another array")
    if smem.strides[-1] != smem.itemsize:
        raise sim.SimulationError(
            f"load_f32x2_shared: the last axis of {smem.shape} is not contiguous"
        )
    if len(key) != smem.ndim or any(not 0 <= i < n for i, n in zip(key, smem.shape, strict=True)):
        raise sim.SimulationError(f"load_f32x2_shared: index {key} out of bounds for {smem.shape}")
    if sim.element_address(smem, key) % 8:
        raise sim.SimulationError(f"load_f32x2_shared: index {key} is not 8-byte aligned")
    if not sim.in_allocation(smem, key, 8):
        raise sim.SimulationError(f"load_f32x2_shared: index {key} runs past the array's end")
    values = np.asarray(sim.load(smem, (*key[:-1], slice(key[-1], key[-1] + 2))), np.float32)
    return np.float32(values[0]), np.float32(values[1])


def _pack_twin(lo, hi):
    with np.errstate(over="ignore"):  # beyond float16's range: inf, as cvt.rn does
        halves = np.array([lo, hi], np.float32).astype(np.float16).view(np.uint16)
    return narrow(_pack(halves[0], halves[1]))


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
        for lo, data in self._candidates():
            if lo <= host < lo + data.size:
                if lo not in self.regions:
                    start = -(-self.cursor // 1024) * 1024 + lo % 1024
                    if start + data.size > self.LIMIT:
                        raise sim.SimulationError("wgmma: shared arrays pass the 256 KiB window")
                    self.regions[lo] = (start, data)
                    self.cursor = start + data.size
                return self.regions[lo][0] + host - lo
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


class WgmmaError(sim.SimulationError):
    """A warpgroup MMA rule broken in the simulator (fence, wait, 128 threads, descriptors)."""


class _Op:
    """One wgmma.mma_async of a warpgroup: its group's fate and the shared bytes it read."""

    __slots__ = ("site", "committed", "retired", "reads", "n")

    def __init__(self, site, n):
        self.site, self.n = site, n
        self.committed = self.retired = False
        self.reads: list = []  # (window, addresses, words) to check unchanged at retirement


class WgmmaAccumulator:
    """One thread's accumulator registers of a wgmma.mma_async in the simulator: ``N / 2``
    float32 (the layout of :mod:`tessera_tile.mma`), readable as a tuple only once a
    ``wgmma_wait_group`` has retired the group holding its MMA. Reading it is a register
    access: a later ``wgmma_async`` that takes it as its accumulator needs a ``wgmma_fence``
    after the read."""

    __slots__ = ("_values", "_op", "_state", "read_fence")

    def __init__(self, values, op: _Op, state):
        self._values, self._op, self._state = values, op, state
        self.read_fence = -1  # the fence count when a thread last read these registers

    def _ready(self):
        if not self._op.retired:
            how = (
                "its group is still in flight (wgmma_wait_group with a smaller n)"
                if self._op.committed
                else "it was never committed (wgmma_commit_group, then wgmma_wait_group)"
            )
            raise WgmmaError(
                f"wgmma: the accumulator of the wgmma.mma_async at {format_site(self._op.site)} "
                f"is read before wgmma.wait_group retired it: {how}"
            )
        self.read_fence = self._state.fences
        return self._values

    def __getitem__(self, i):
        return self._ready()[i]

    def __iter__(self):
        return iter(self._ready())

    def __len__(self):
        return len(self._values)

    def __repr__(self):
        state = "retired" if self._op.retired else "in flight"
        return f"<wgmma accumulator of {len(self._values)} float32, {state}>"


class _Record:
    """The k-th wgmma instruction of a warpgroup, as its warps arrive at it."""

    __slots__ = ("kind", "site", "arrived", "first", "op", "complete")

    def __init__(self, kind, site):
        self.kind, self.site = kind, site
        self.arrived: set[int] = set()
        self.first = None  # the first warp's warp-uniform operands, to compare the others'
        self.op = None
        self.complete = False


class _Warpgroup:
    def __init__(self, window: SharedWindow):
        self.window = window
        self.records: dict[int, _Record] = {}
        self.next = [0, 0, 0, 0]  # per warp: the index of its next wgmma instruction
        self.fences = 0
        self.fences_at_wait = 0
        self.uncommitted: list[_Op] = []
        self.groups: deque[list[_Op]] = deque()
        self.a_seen: dict[tuple[int, int], dict[int, object]] = {}  # plain A tuples used


_BLOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _warpgroup_of(block, index: int) -> _Warpgroup:
    per_block = _BLOCKS.get(block)
    if per_block is None:
        per_block = _BLOCKS[block] = {"window": SharedWindow(block)}
    wg = per_block.get(index)
    if wg is None:
        wg = per_block[index] = _Warpgroup(per_block["window"])
    return wg


def shared_window(block=None) -> SharedWindow:
    """The running block's shared window (for twins and tests)."""
    block = block if block is not None else sim.current_thread().block
    per_block = _BLOCKS.get(block)
    if per_block is None:
        per_block = _BLOCKS[block] = {"window": SharedWindow(block)}
    return per_block["window"]


_ACTIONS: dict[str, Callable] = {}  # kind -> warp action(wg, record, warp, args) -> results
_FINISH: dict[str, Callable] = {}  # kind -> warpgroup action(wg, record), at the 4th warp


def _arrive(kind: str):
    def compute(args: dict) -> dict:
        (block, wg_index, warp, site), _ = next(iter(args.values()))
        wg = _warpgroup_of(block, wg_index)
        k = wg.next[warp]
        wg.next[warp] += 1
        record = wg.records.get(k)
        if record is None:
            record = wg.records[k] = _Record(kind, site)
        elif (record.kind, record.site) != (kind, site):
            raise WgmmaError(
                f"wgmma: divergent warpgroup {wg_index}: warp {4 * wg_index + warp} executes "
                f"{kind} at {format_site(site)} where another warp of the warpgroup executed "
                f"{record.kind} at {format_site(record.site)}; a wgmma instruction is "
                ".sync.aligned over the warpgroup: its 4 warps execute the same instructions"
            )
        results = _ACTIONS[kind](wg, record, warp, {lane: a for lane, (_, a) in args.items()})
        record.arrived.add(warp)
        if len(record.arrived) == 4:
            _FINISH.get(kind, lambda wg, record: None)(wg, record)
            record.complete = True
            record.first = None
            del wg.records[k]
        return {lane: (record, results[lane]) for lane in args}

    sim.register_aligned(kind, compute)
    sim.register_aligned(kind + ".wait", lambda args: dict.fromkeys(args))
    return kind


def _warpgroup_collective(kind: str, arg):
    """Arrive at wgmma instruction ``kind`` with this thread's ``arg``; returns this thread's
    result once the 4 warps of its warpgroup have all executed it."""
    t = sim.current_thread()
    block = t.block
    wg_index, warp = divmod(t.warp, 4)
    if block.nthreads < WARPGROUP * (wg_index + 1):
        raise WgmmaError(
            f"wgmma: {kind} needs the 128 threads of warpgroup {wg_index} (threads "
            f"{WARPGROUP * wg_index}..{WARPGROUP * wg_index + 127}); the block has "
            f"{block.nthreads} threads. A warpgroup is 4 consecutive warps whose first warp's "
            "index is a multiple of 4"
        )
    site = user_site(2)
    record, result = sim.aligned_collective(kind, ((block, wg_index, warp, site), arg))
    if record.complete:
        return result
    base = 4 * wg_index
    last, unchanged = None, 0
    while not record.complete:
        missing = [w for w in range(4) if w not in record.arrived]
        threads = [u for w in missing for u in block.threads[32 * (base + w) : 32 * (base + w + 1)]]
        where = f"{kind} at {format_site(site)}"
        warps = ", ".join(str(base + w) for w in missing)
        if any(u.dead for u in threads):
            raise WgmmaError(
                f"wgmma: warp(s) {warps} of warpgroup {wg_index} exited without executing {where}"
                "; wgmma instructions need all 128 threads of the warpgroup, converged (a "
                "warpgroup is 4 consecutive warps starting at a warp index multiple of 4)"
            )
        waits = tuple(u.wait for u in threads)
        unchanged = unchanged + 1 if last is not None and all(
            a is b for a, b in zip(waits, last, strict=True)
        ) else 0  # fmt: skip
        last = waits
        if unchanged >= 2 or all(w is not None and w.kind == "syncthreads" for w in waits):
            elsewhere = sorted({(w.kind, format_site(w.site)) for w in waits if w is not None})
            raise WgmmaError(
                f"wgmma: warp(s) {warps} of warpgroup {wg_index} never reach {where}: they wait "
                f"in {', '.join(f'{k} at {s}' for k, s in elsewhere)}; wgmma instructions need "
                "all 128 threads of the warpgroup, converged"
            )
        sim.aligned_collective(kind + ".wait", None)
    return result


transparent_code.add(_warpgroup_collective.__code__)  # sites are the kernel's lines


# -- wgmma.fence, commit_group, wait_group ---------------------------------------------------


def _no_results(wg, record, warp, args):
    return dict.fromkeys(args)


def _fence_done(wg, record):
    wg.fences += 1


def _commit_done(wg, record):
    for op in wg.uncommitted:
        op.committed = True
    wg.groups.append(wg.uncommitted)  # an empty group too, as the PTX ISA defines
    wg.uncommitted = []


# The per-thread state of tessera_tile.pipeline's cp.async twins: copies issued and not yet
# waited for (``pending``, then ``committed`` groups of them), each ``(dst, dst_run, ...)``.
_CP_ASYNC_STATE = "tessera_tile.pipeline.cp_async"


def _copies_in_flight(window) -> np.ndarray:
    """``(n, 2)`` window byte ranges ``[start, end)`` of the cp.async copies into shared
    memory that the block's threads have issued and not waited for. The cp.async twins land a
    copy at its thread's wait_group; on a GPU it may land any time after its issue."""
    ranges = []
    for t in window.block.threads:
        copies = t.state.get(_CP_ASYNC_STATE)
        if copies is None:
            continue
        for dst, run, *_ in (*copies.pending, *(c for g in copies.committed for c in g)):
            last = run[-1]
            host = sim.element_address(dst, (*run[:-1], last.start))
            start = window.address(host)
            ranges.append((start, start + (last.stop - last.start) * dst.itemsize))
    return np.array(ranges, np.int64).reshape(-1, 2)


def _retire(op: _Op) -> None:
    in_flight = None
    for window, addresses, words, what in op.reads:
        now = window.read_u16(addresses, what)
        if not np.array_equal(now, words):
            raise WgmmaError(
                f"wgmma: shared memory that the wgmma.mma_async at {format_site(op.site)} reads "
                f"({what}) was written before wgmma.wait_group retired it; the tensor cores "
                "read it asynchronously until then"
            )
        in_flight = _copies_in_flight(window) if in_flight is None else in_flight
        if len(in_flight):
            read = np.unique(addresses)
            hits = np.searchsorted(read, in_flight[:, 1]) - np.searchsorted(read, in_flight[:, 0])
            if hits.any():
                raise WgmmaError(
                    f"wgmma: a cp.async into shared memory that the wgmma.mma_async at "
                    f"{format_site(op.site)} reads ({what}) is in flight (issued, not waited for) "
                    "when wgmma.wait_group retires it: it may land while the tensor cores read "
                    "(or before they read; the simulator lands it at the cp.async wait_group)"
                )
    op.reads = []
    op.retired = True


def _wait_action(wg, record, warp, args):
    ns = {int(n) for n, _ in args.values()}
    if len(ns) != 1:
        raise WgmmaError(f"wgmma: wait_group with different n in one warp: {sorted(ns)}")
    if record.first is None:
        record.first = ns
    elif record.first != ns:
        raise WgmmaError("wgmma: wait_group with different n in the warps of a warpgroup")
    return {lane: acc for lane, (_, acc) in args.items()}


def _wait_done(wg, record):
    (n,) = record.first
    while len(wg.groups) > n:
        for op in wg.groups.popleft():
            _retire(op)
    wg.fences_at_wait = wg.fences


_FENCE = _arrive("wgmma.fence")
_COMMIT = _arrive("wgmma.commit_group")
_WAIT = _arrive("wgmma.wait_group")
_ACTIONS.update({_FENCE: _no_results, _COMMIT: _no_results, _WAIT: _wait_action})
_FINISH.update({_FENCE: _fence_done, _COMMIT: _commit_done, _WAIT: _wait_done})


def _wgmma_fence_twin():
    _warpgroup_collective(_FENCE, None)


def _wgmma_commit_twin():
    _warpgroup_collective(_COMMIT, None)


def _wgmma_wait_twin(n, acc):
    if not 0 <= int(n) <= 7:
        raise WgmmaError(f"wgmma_wait_group: n must be in 0..7, got {n}")
    return _warpgroup_collective(_WAIT, (int(n), acc))


# -- wgmma.mma_async ----------------------------------------------------------------------------


def _wgmma_a_coord(lane: int, i: int) -> tuple[int, int]:
    """Element ``i`` (0..7) of a warp's A registers: the 16 x 16 A fragment of mma.m16n8k16."""
    g, t = lane >> 2, lane & 3
    return g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2)


def _wgmma_d_coord(lane: int, i: int) -> tuple[int, int]:
    """Accumulator ``i`` of a lane, in its warp's 16 rows: the 16 x 8 C layout of
    mma.m16n8k16 repeated over the N / 8 column blocks."""
    g, t = lane >> 2, lane & 3
    return g + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * t + (i & 1)


def _words_to_float(words: np.ndarray, bf16: bool) -> np.ndarray:
    if bf16:
        return (words.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return words.view(np.float16).astype(np.float64)


def _read_operand(wg, op, desc, rows, mn_major, bf16, what):
    fields = decode_descriptor(desc)
    if int(desc) & _RESERVED:
        raise WgmmaError(f"wgmma: {what} descriptor 0x{int(desc):016x} sets reserved bits")
    if fields.base_offset:
        raise WgmmaError(
            f"wgmma: {what} descriptor has base offset {fields.base_offset}; the simulator "
            "models base offset 0 only (matrices whose swizzle pattern starts at its alignment)"
        )
    addresses = operand_addresses(fields, rows, mn_major)
    words = wg.window.read_u16(addresses, what)
    op.reads.append((wg.window, addresses, words, what))
    return _words_to_float(words, bf16)


def _check_registers(wg, record, warp, lane, a, acc, n):
    if wg.fences == 0:
        raise WgmmaError(
            "wgmma: wgmma.mma_async before any wgmma.fence of its warpgroup; the PTX ISA "
            "requires a wgmma.fence before the first wgmma.mma_async"
        )
    fresh = wg.fences > wg.fences_at_wait  # a fence since the latest wait_group
    if isinstance(acc, WgmmaAccumulator):
        if len(acc) != n // 2:
            raise WgmmaError(f"wgmma: an accumulator of {len(acc)} registers for m64n{n}k16")
        if acc.read_fence >= wg.fences:
            raise WgmmaError(
                "wgmma: the accumulator registers were read by a thread after the latest "
                "wgmma.fence; a wgmma_fence must separate register accesses from the "
                "wgmma.mma_async that uses those registers"
            )
    elif not fresh:
        raise WgmmaError(
            "wgmma: the accumulator is ordinary registers (not the pending result of a "
            "wgmma.mma_async) and no wgmma.fence came after the latest wgmma.wait_group; a "
            "wgmma_fence must separate register writes from the wgmma.mma_async reading them"
        )
    if isinstance(a, tuple):
        seen = wg.a_seen.setdefault((warp, lane), {})
        if not fresh and id(a) not in seen:
            raise WgmmaError(
                "wgmma: A registers written after the latest wgmma.fence (no fence since the "
                "latest wgmma.wait_group); a wgmma_fence must come between"
            )
        seen[id(a)] = a  # kept alive: the same tuple is the same, unwritten registers


def _mma_action(wg, record, warp, args):
    lanes = sorted(args)
    a0, b0, _, s0, flags = args[lanes[0]]
    n, bf16, scale_a, scale_b, trans_a, trans_b = flags
    from_registers = isinstance(a0, tuple)
    uniform = (None if from_registers else int(a0), int(b0), bool(s0), flags)
    for lane in lanes:
        a, b, _, s, f = args[lane]
        mine = (None if isinstance(a, tuple) else int(a), int(b), bool(s), f)
        if mine != uniform:
            raise WgmmaError(
                f"wgmma: lane {lane} of warp {warp} of its warpgroup passes other descriptors, "
                "scale-d or shape than the warp's first lane; they must be the same in every "
                "thread of the warpgroup"
            )
    if record.first is None:
        record.first = uniform
        record.op = _Op(record.site, n)
    elif record.first != uniform:
        raise WgmmaError(
            "wgmma: the warps of a warpgroup pass different descriptors, scale-d or shapes to "
            "one wgmma.mma_async; they must be the same in all 128 threads"
        )
    op = record.op
    for lane in lanes:
        a, _, acc, _, _ = args[lane]
        _check_registers(wg, record, warp, lane, a, acc, n)
    what = "B (descriptor)"
    b = _read_operand(wg, op, b0, n, bool(trans_b), bf16, what)  # [n, k]
    if from_registers:
        a_rows = np.empty((16, 16), np.float64)
        values = _bf16_halves if bf16 else _halves
        for lane in lanes:
            regs = args[lane][0]
            for i, v in enumerate(values(regs, 4)):
                a_rows[_wgmma_a_coord(lane, i)] = v
    else:
        a_full = _read_operand(wg, op, a0, 64, bool(trans_a), bf16, "A (descriptor)")
        a_rows = a_full[16 * warp : 16 * warp + 16]
    c = np.zeros((16, n), np.float64)
    if s0:
        for lane in lanes:
            acc = args[lane][2]
            regs = acc._values if isinstance(acc, WgmmaAccumulator) else tuple(acc)
            if len(regs) != n // 2:
                raise WgmmaError(f"wgmma: an accumulator of {len(regs)} registers for m64n{n}k16")
            for i in range(n // 2):
                c[_wgmma_d_coord(lane, i)] = np.float32(regs[i])
    d = _exact_sum(scale_a * a_rows, scale_b * b.T, c)
    return {
        lane: WgmmaAccumulator(tuple(d[_wgmma_d_coord(lane, i)] for i in range(n // 2)), op, wg)
        for lane in lanes
    }


def _mma_done(wg, record):
    wg.uncommitted.append(record.op)


_MMA = _arrive("wgmma.mma_async")
_ACTIONS[_MMA] = _mma_action
_FINISH[_MMA] = _mma_done


def wgmma_async_twin(bf16: bool):
    """The twin of ``wgmma_async`` (float16) or ``wgmma_async_bf16``."""

    def twin(a, b_desc, acc, scale_d, scale_a, scale_b, trans_a, trans_b):
        n = 2 * len(acc)
        if n not in WGMMA_N:
            raise WgmmaError(f"wgmma: N = {n} (an accumulator of {len(acc)}): not m64nNk16")
        if isinstance(a, tuple) and (len(a) != 4 or int(trans_a)):
            raise WgmmaError("wgmma: A from registers is 4 uint32 and cannot be transposed")
        for what, v, allowed in (
            ("scale_a", scale_a, (1, -1)),
            ("scale_b", scale_b, (1, -1)),
            ("trans_a", trans_a, (0, 1)),
            ("trans_b", trans_b, (0, 1)),
        ):
            if int(v) not in allowed:
                raise WgmmaError(f"wgmma: {what} must be one of {allowed}, got {v}")
        flags = (n, bf16, int(scale_a), int(scale_b), int(trans_a), int(trans_b))
        if not isinstance(a, tuple):
            a = np.uint64(int(a) & ((1 << 64) - 1))
        return _warpgroup_collective(_MMA, (a, b_desc, acc, scale_d, flags))

    twin.__name__ = twin.__qualname__ = "wgmma_async_bf16_twin" if bf16 else "wgmma_async_twin"
    return twin


def _wgmma_descriptor_twin(smem, index, leading_byte_offset, stride_byte_offset, swizzle):
    """The descriptor of the matrix starting at ``smem[index]``: its window address."""
    key = tuple(int(i) for i in index) if isinstance(index, tuple) else (int(index),)
    if not sim.in_shared_memory(smem):
        raise WgmmaError("wgmma_descriptor: the matrix must be in shared memory")
    if len(key) != smem.ndim or any(not 0 <= i < n for i, n in zip(key, smem.shape, strict=True)):
        raise WgmmaError(f"wgmma_descriptor: index {key} out of bounds for {smem.shape}")
    host = sim.element_address(smem, key)
    address = shared_window().address(host)
    try:
        desc = encode_descriptor(address, leading_byte_offset, stride_byte_offset, swizzle)
    except ValueError as e:
        raise WgmmaError(f"wgmma_descriptor: {e}") from None
    return np.uint64(desc)
