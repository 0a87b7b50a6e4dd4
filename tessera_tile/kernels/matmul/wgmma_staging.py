"""How the warpgroup-MMA matmul (:mod:`.wgmma`) copies one operand's k-tile into its swizzled
shared tile, in either layout the tensor cores read through a descriptor:

* **K-major** (A as it usually is, ``(M, K)``; B transposed, read as its ``(N, K)`` array): one
  row of ``tile_k`` elements per M (N) row, 128 bytes with ``tile_k = 64`` (128B swizzle: chunk
  ``c`` of row ``r`` at ``c ^ (r % 8)``), 64 bytes with ``tile_k = 32`` (64B swizzle:
  ``c ^ ((r // 2) % 4)``); descriptor SBO = 8 rows, a k16 step moves the start 32 bytes;
* **MN-major** (B as it usually is, ``(K, N)``; A transposed, read as its ``(K, M)`` array):
  blocks of 64 columns, each ``tile_k`` rows of 128 bytes, chunk ``c`` of row ``k`` at
  ``c ^ (k % 8)`` (128B swizzle); SBO = 1024 (8 rows of K), LBO = one block, a k16 step moves
  the start 16 rows; the wgmma's transpose flag set for that operand.

Either way the threads of a row take its chunks in order (a quarter-warp writes one 128-byte
row and reads 128 contiguous global bytes), every copy names its source by an element offset
pair whose first part is fixed (:func:`~tessera_tile.pipeline.cp_async_cg_16_zfill_at`), and
copies outside the operand read 0 bytes: zero-filled.
"""

from __future__ import annotations

from typing import NamedTuple

from numba import cuda, int32, int64

from ...mma import SWIZZLE_64B, SWIZZLE_128B
from ...pipeline import cp_async_cg_16_zfill_at
from ..tc_tiles import INLINE
from ..wgmma_tiles import CHUNK
from .wgmma_config import B_BLOCK

__all__ = ["Layout", "k_major", "mn_major"]


class Layout(NamedTuple):
    """One operand's staging: ``plan(x, tid, bz, mn0, mn, src, dst, ok, kr)`` fills this
    thread's copy arrays (of ``passes`` each) and returns ``(r0, c0)``; ``load(smem, base, x,
    k, k0, src, dst, ok, kr, r0, c0)`` issues the k-tile from ``k0``; the descriptor's LBO, SBO
    and swizzle, its k16 step and its 64-row block (in 16-byte units); ``transposed``: the
    wgmma's transpose flag (MN-major)."""

    plan: object
    load: object
    passes: int
    lbo: int
    sbo: int
    swizzle: int
    step16: int
    block16: int
    transposed: int


def k_major(extent: int, tile_k: int, copiers: int) -> Layout:
    """``extent`` rows (tile_m or tile_n) of ``tile_k`` elements."""
    chunks = tile_k // CHUNK
    lines = 8 // chunks  # rows per 128-byte line: the swizzle's row bits are r // lines
    step = copiers // chunks  # rows a pass of the copiers covers
    passes, exact = -(-extent // step), extent % step == 0
    row_bytes = 2 * tile_k

    @cuda.jit(device=True)
    def chunk_of(r, c):
        return c ^ ((r // lines) % chunks)

    @cuda.jit(device=True, **INLINE)
    def plan(x, tid, bz, mn0, mn, src, dst, ok, kr):
        r0 = tid // chunks
        c0 = tid % chunks
        rows = x.strides[1] // 2  # elements: the rows are 16-bit
        first = bz * (x.strides[0] // 2) + int64(mn0 + r0) * rows + c0 * CHUNK
        for p in range(passes):
            r = r0 + p * step
            src[p] = first + p * step * rows
            ok[p] = mn0 + r < mn
            dst[p] = r * tile_k + chunk_of(r, c0) * CHUNK
        return r0, c0

    @cuda.jit(device=True, **INLINE)
    def load(smem, base, x, k, k0, src, dst, ok, kr, r0, c0):
        left = int32(k - k0)  # k-columns left: 32-bit guards
        inside = int32(c0 * CHUNK) < left  # K is a multiple of the chunk: all in or all out
        for p in range(passes):
            if exact or r0 + p * step < extent:
                cp_async_cg_16_zfill_at(
                    smem, base + dst[p], x, (src[p], k0), 16 if ok[p] and inside else 0
                )

    swizzle = SWIZZLE_128B if tile_k == 64 else SWIZZLE_64B
    return Layout(plan, load, passes, 16, 8 * row_bytes, swizzle, 2, 64 * row_bytes // 16, 0)


def mn_major(extent: int, tile_k: int, copiers: int) -> Layout:
    """``tile_k`` rows of ``extent`` columns (tile_n or tile_m), in blocks of 64."""
    chunks = extent // CHUNK
    step = copiers // chunks
    passes, exact = -(-tile_k // step), tile_k % step == 0
    block = tile_k * B_BLOCK  # elements of one 64-column block

    @cuda.jit(device=True, **INLINE)
    def plan(x, tid, bz, mn0, mn, src, dst, ok, kr):
        r0 = tid // chunks
        c0 = tid % chunks
        rows = x.strides[1] // 2
        src[0] = bz * (x.strides[0] // 2) + int64(r0) * rows + mn0 + c0 * CHUNK
        ok[0] = mn0 + c0 * CHUNK < mn
        blk, cc = c0 // 8, c0 % 8
        for p in range(passes):
            r = r0 + p * step
            kr[p] = int32(r)
            dst[p] = blk * block + r * B_BLOCK + (cc ^ (r % 8)) * CHUNK
        return r0, c0

    @cuda.jit(device=True, **INLINE)
    def load(smem, base, x, k, k0, src, dst, ok, kr, r0, c0):
        left = int32(k - k0)  # k-rows left
        rows = x.strides[1] // 2
        first = src[0] + int64(k0) * rows
        for p in range(passes):
            if exact or kr[p] < tile_k:
                cp_async_cg_16_zfill_at(
                    smem, base + dst[p], x, (first, p * step * rows),
                    16 if ok[0] and kr[p] < left else 0,
                )  # fmt: skip

    return Layout(plan, load, passes, 2 * block, 1024, SWIZZLE_128B, 16 * 128 // 16, block // 8, 1)
