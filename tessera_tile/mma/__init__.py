"""Warp-level tensor-core fragments: ``ldmatrix``, ``mma.sync.m16n8k16`` (float16 in, float32
accumulate), ``mma.sync.m16n8k8`` (TF32 in, float32 accumulate) and accumulator stores, as Numba
CUDA device functions (inline PTX, sm_80+); and Hopper's warpgroup MMA (``wgmma_fence``,
``wgmma_async``, ``wgmma_async_bf16``, ``wgmma_commit_group``, ``wgmma_wait_group``,
``wgmma_descriptor``, ``wgmma_zeros``: sm_90a, described in docs/tensor_cores.md, "Warpgroup
MMA", with its simulator twin's rules).

numba-cuda has no tensor-core API; these intrinsics reach the tensor cores through inline PTX
and each has a simulator twin (in :mod:`tessera_tile.sim.mma_twins`) that reproduces the PTX ISA's
fragment layouts lane by lane, so one kernel runs in the simulator (checked against NumPy) and
on the GPU.

Fragments (one warp holds one fragment; each lane holds the registers below)
===========================================================================

``groupID = lane >> 2`` and ``tig = lane % 4`` (the thread in its group of four). A ``uint32``
register holds two float16 values, the lower-numbered element in its low 16 bits.

A: 16 x 16 float16, row-major (``mma...row``), ``UniTuple(uint32, 4)`` = (a0a1, a2a3, a4a5, a6a7)::

    a_i at row = groupID + 8 * ((i >> 1) & 1),  col = 2 * tig + (i & 1) + 8 * (i >> 2)

            cols 0..7          cols 8..15
          +-----------------+-----------------+
    0..7  | reg 0 (a0, a1)  | reg 2 (a4, a5)  |    lane 4g+t holds row g (or g+8),
          +-----------------+-----------------+    columns 2t, 2t+1 of each 8 x 8 quarter
    8..15 | reg 1 (a2, a3)  | reg 3 (a6, a7)  |
          +-----------------+-----------------+

B: 16 x 8 float16 indexed [k, n] (``...col``), ``UniTuple(uint32, 2)`` = (b0b1, b2b3)::

    b_i at k = 2 * tig + (i & 1) + 8 * (i >> 1),  n = groupID

    k 0..7   | reg 0 (b0, b1) |    lane 4g+t holds column n = g, rows k = 2t, 2t+1
    k 8..15  | reg 1 (b2, b3) |    (two consecutive k of one column per register)

C and D: 16 x 8 float32, ``UniTuple(float32, 4)`` = (c0, c1, c2, c3)::

    c_i at row = groupID + 8 * (i >> 1),  col = 2 * tig + (i & 1)

    rows 0..7   | c0 c1 at (g, 2t), (g, 2t+1)         |
    rows 8..15  | c2 c3 at (g+8, 2t), (g+8, 2t+1)     |

TF32 (``mma_m16n8k8_tf32``): A 16 x 8, B 8 x 8 [k, n], C and D as above. Each register holds one
32-bit value (a float32 bit pattern; the tensor core reads it as TF32)::

    A, UniTuple(uint32 or float32, 4) = (a0, a1, a2, a3):
    a_i at row = groupID + 8 * (i & 1),  col = tig + 4 * (i >> 1)

            cols 0..3   cols 4..7
    0..7  |   a0     |   a2     |       lane 4g+t holds rows g, g+8, columns t, t+4
    8..15 |   a1     |   a3     |

    B, UniTuple(uint32 or float32, 2) = (b0, b1):   b_i at k = tig + 4 * i,  n = groupID

An A fragment of a row-major float32 tile is one ``ldmatrix_x4`` on the float32 array (each
float32 a pair of b16: lane ``4g + t`` receives row ``g``, float32 column ``t`` of each 8 x 4
matrix): ``ldmatrix_x4(s, (r0 + lane % 16, c0 + 4 * (lane // 16)))``. ``.trans`` moves 16-bit
halves, so it cannot transpose 32-bit elements: B fragments of a row-major [k, n] tile are two
scalar loads, ``s[k0 + t, n0 + g]`` and ``s[k0 + t + 4, n0 + g]``; or, with the operands swapped
(``C^T = B^T A^T``, the TF32 matmul), 16 columns of B are an A fragment whose row ``g`` is
column ``2g`` and row ``g + 8`` column ``2g + 1``: two ``load_f32x2_shared`` of ``(k0 + t, n0 +
2g)`` and ``(k0 + t + 4, n0 + 2g)`` fill ``(a0, a1)`` and ``(a2, a3)``.

This representation compiles to registers (HMMA.16816.F32 takes them directly): no local
memory, no packing instructions. Keep many fragments (a warp's accumulator tile) in
``cuda.local.array`` indexed only by constants (loops over constants, which LLVM unrolls).

Intrinsics
==========

==========================================  ================================================
``ldmatrix_x1/x2/x4(smem, index)``          ``ldmatrix.sync.aligned.m8n8.x{1,2,4}.shared.b16``:
                                            1, 2 or 4 8 x 8 matrices of 16-bit values from
                                            shared memory -> ``uint32`` / 2- / 4-tuple
``ldmatrix_x1/x2/x4_trans(smem, index)``    the same, each matrix transposed (``.trans``)
``mma_m16n8k16(a, b, c) -> d``              ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16
                                            .f32``: ``d = a @ b + c``
``mma_m16n8k8_tf32(a, b, c) -> d``         ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32
                                            .f32``: ``d = a @ b + c`` on TF32 inputs
``load_f32x2_shared(smem, index)``          ``ld.shared.v2.f32``: ``smem[index]`` and the next
                                            float32 (8-byte aligned) -> 2-tuple (``LDS.64``)
``load_f32_shared(smem, index)``            ``ld.shared.f32``: ``smem[index]`` (``LDS``), in
                                            its place among the mma
``to_tf32(x)``                              ``cvt.rna.tf32.f32``: ``x`` rounded to TF32
                                            (nearest, ties away from zero), as float32
``pack_f16x2(lo, hi) -> uint32``            ``cvt.rn.f16x2.f32``: two float32 rounded to float16
                                            in one register (``lo`` in the low half), e.g. an
                                            accumulator pair as an A-fragment register
``store_f16x2(out, index, x0, x1)``         ``out[index], out[index + 1] = x0, x1`` rounded to
                                            float16 in one 4-byte store (``.global``; use
                                            ``store_f16x2_shared`` for shared memory)
``store_f32x2(out, index, x0, x1)``          ``out[index], out[index + 1] = x0, x1`` (float32)
                                            in one 8-byte global store (``st.global.v2.f32``)
``store_accumulator(acc, out, row0, col0)``  the 16 x 8 tile ``acc`` at ``out[row0:, col0:]``,
                                            masked by ``out.shape`` (plain stores, any dtype)
==========================================  ================================================

ldmatrix addressing: lane ``8 * j + r`` gives the address of row ``r`` of matrix ``j``
(``&smem[index]``: 8 consecutive 16-bit elements, or 4 32-bit ones, 16 bytes, 16-byte aligned,
in shared memory);
``.x1`` uses lanes 0..7, ``.x2`` lanes 0..15 and ``.x4`` all 32 (the other lanes' addresses are
ignored). Register ``j`` of lane ``4 * g + t`` receives row ``g``, columns ``2t, 2t + 1`` of
matrix ``j`` (with ``.trans``: column ``g``, rows ``2t, 2t + 1``)::

    matrix j, 8 rows of 16 bytes        lane 4g+t, register j
    row r  <- address from lane 8j + r  (M[g, 2t], M[g, 2t+1])      no .trans
                                        (M[2t, g], M[2t+1, g])      .trans

So an A fragment of a row-major 16 x 16 tile at ``(r0, c0)`` is ``ldmatrix_x4(s, (r0 + lane %
16, c0 + 8 * (lane // 16)))``, and the B fragments of two n8 tiles of a row-major [k, n] tile
at ``(k0, n0)`` are ``ldmatrix_x4_trans(s, (k0 + lane % 8 + 8 * (lane // 8 % 2), n0 + 8 *
(lane // 16)))`` -> ``(b[0] of n0, b[1] of n0, b[0] of n0+8, b[1] of n0+8)``.

Every intrinsic is warp-wide and ``.aligned``: all 32 lanes of the warp must execute the same
call convergently (not under a condition some lanes take and others do not). The twins run as
warp collectives of :mod:`tessera_tile.sim` and raise :class:`tessera_tile.sim.SimulationError`
for a partial warp, exited lanes or a divergent call, and for an ldmatrix row address that is
not 16-byte aligned, out of bounds, or whose 16 bytes leave the shared array (a row may cross a
row end of the array: it is an address, as on the GPU). Shared-memory traffic
of ``ldmatrix`` is recorded per lane (one 16-byte row each), so the profiler counts its bank
conflicts as the hardware serves it: a quarter-warp (one 8 x 8 matrix) per 128-byte phase.

The simulated ``mma`` computes in float64 from the float16 inputs and rounds once to float32;
the tensor core keeps at least float32 precision in its sums, so results agree to float32
rounding of the accumulation (tests allow ``1e-6`` relative to the sum of absolute products).
The simulated TF32 ``mma`` multiplies the inputs' TF32 values: the tensor core reads only
the upper 19 bits of each 32-bit input (sign, 8 exponent bits, 10 mantissa bits) and ignores the
low 13, so a float32 that is not a TF32 value is truncated toward zero; the twin masks the low 13
bits the same way. Round first with ``to_tf32`` for round-to-nearest.

The TF32 twin sums as the hardware does, probed on an H200 (640 of 640 results matched): every
addend is aligned to the largest one's exponent (a product's taken as the sum of its operands'
exponents) and truncated toward zero to 2 bits below float32's last place there, the addends
are added exactly, and the sum is rounded toward zero. Subnormal addends were not probed. The
PTX ISA guarantees only "at least single precision" with order and rounding unspecified; the
tests check that bound on both tiers, and this model bit for bit.
"""

from .._device.mma_layouts import (  # the fragment constants and wgmma helpers, re-exported
    ROW_BYTES,
    SWIZZLE_32B,
    SWIZZLE_64B,
    SWIZZLE_128B,
    SWIZZLE_NONE,
    TF32_MASK,
    WGMMA_N,
    MatrixDescriptor,
    decode_descriptor,
    encode_descriptor,
)
from .sync import (
    WARP_SIZE,
    ldmatrix_x1,
    ldmatrix_x1_trans,
    ldmatrix_x2,
    ldmatrix_x2_trans,
    ldmatrix_x4,
    ldmatrix_x4_trans,
    load_f32_shared,
    load_f32x2_shared,
    mma_m16n8k8_tf32,
    mma_m16n8k16,
    mma_m16n8k16_bf16,
    pack_f16x2,
    store_accumulator,
    store_bf16x2,
    store_bf16x2_shared,
    store_f16x2,
    store_f16x2_shared,
    store_f32x2,
    to_tf32,
)
from .wgmma import (
    fence_proxy_async,
    wgmma_async,
    wgmma_async_bf16,
    wgmma_commit_group,
    wgmma_descriptor,
    wgmma_fence,
    wgmma_wait_group,
    wgmma_zeros,
)

__all__ = [
    "ROW_BYTES",
    "TF32_MASK",
    "SWIZZLE_32B",
    "SWIZZLE_64B",
    "SWIZZLE_128B",
    "SWIZZLE_NONE",
    "WARP_SIZE",
    "WGMMA_N",
    "MatrixDescriptor",
    "WgmmaAccumulator",
    "WgmmaError",
    "decode_descriptor",
    "encode_descriptor",
    "fence_proxy_async",
    "ldmatrix_x1",
    "ldmatrix_x1_trans",
    "ldmatrix_x2",
    "ldmatrix_x2_trans",
    "ldmatrix_x4",
    "ldmatrix_x4_trans",
    "load_f32_shared",
    "load_f32x2_shared",
    "mma_m16n8k16",
    "mma_m16n8k16_bf16",
    "mma_m16n8k8_tf32",
    "pack_f16x2",
    "store_accumulator",
    "store_bf16x2",
    "store_bf16x2_shared",
    "store_f16x2",
    "store_f16x2_shared",
    "store_f32x2",
    "to_tf32",
    "wgmma_async",
    "wgmma_async_bf16",
    "wgmma_commit_group",
    "wgmma_descriptor",
    "wgmma_fence",
    "wgmma_wait_group",
    "wgmma_zeros",
]


def __getattr__(name: str):
    """The simulator's wgmma classes, imported from it on first use (importing the primitives
    does not load the simulator)."""
    if name in ("WgmmaAccumulator", "WgmmaError"):
        from ..sim import wgmma_twins

        return getattr(wgmma_twins, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
