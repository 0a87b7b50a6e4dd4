"""The TF32 fragments of the tensor-core matmul kernel (:mod:`.tc`, ``tf32=True``): how each
operand's float32 tile is swizzled and read into the swapped ``mma.m16n8k8`` (``C^T = B^T A^T``,
:mod:`.tf32`'s doc), in either layout of the operand in memory (:mod:`.tc_staging`).

Both fragments give lane ``(g, t)`` (``g = lane // 4``, ``t = lane % 4``) k indices ``t`` and
``t + 4``. B is the mma's A operand, 16 rows of which lane ``(g, t)`` holds rows ``g`` and
``g + 8``: they are columns ``2g`` and ``2g + 1`` of a 16-column block, so that the accumulators
hold column pairs (the epilogue's ``swapped`` layout). A is its B operand, 8 columns each,
which are rows of C in order.

* **A, k along the columns** (``(M, K)``): ``ldmatrix.x4`` (k 0-3 and 4-7 of rows 0-7, then of
  rows 8-15), the float16 kernel's swizzle.
* **A transposed** (``(K, M)``, k rows): ``ldmatrix`` cannot transpose 32-bit elements, so
  four scalar ``LDS.32`` per 16 rows (rows t and t + 4, columns g and g + 8), from a tile
  swizzled as B's.
* **B, k along the rows** (``(K, N)``): two ``LDS.64`` per 16 columns (k rows t and t + 4,
  columns 2g, 2g + 1). Chunk ``c`` of row ``r`` lies at ``c ^ reverse3(r % 8)`` (the 3-bit
  reversal): rows t = 0..3 differ in the two bits above the lowest, so a half-warp's LDS.64
  (chunks 2j, 2j + 1 of each) and A's warp of LDS.32 cover all 32 banks once; two consecutive
  rows differ in the top bit and eight in all three, so the cp.async copies of a quarter-warp
  (8 chunks of one row, 4 of two rows, 2 of four or 1 of eight, by the block's threads per
  row) hit 8 bank groups too. (``c ^ 2 (r % 4)``, the swizzle before, met the reads but made
  4 warps' copies of 32-row tiles conflict.)
* **B transposed** (``(N, K)``, k along the columns): ``ldmatrix.x4`` whose lanes address tile
  rows ``2 (l % 8) + (l // 8) % 2`` (matrix rows 0-7 are columns 0, 2, ..., 14; rows 8-15 the
  odd ones), chunk ``2 ks + l // 16``. One phase reads 8 even (or odd) rows at one logical
  chunk, which the float16 swizzle (made for 8 consecutive rows) would put in 4 bank groups;
  this tile XORs each chunk's position in its 128-byte line with a value per row
  (:data:`ROW_XOR`) that spreads both those reads and the copies over 8 bank groups.
"""

from __future__ import annotations

from typing import NamedTuple

from numba import cuda, float32, uint32

from ...mma import load_f32_shared, load_f32x2_shared, mma_m16n8k8_tf32
from ..tc_tiles import INLINE, TensorCoreConfig
from .tc_staging import b_fragments_step

__all__ = ["Tf32Fragments", "swizzles", "fragments"]

CHUNK = 4  # float32 per 16-byte chunk
# B transposed: the XOR of each row (modulo 16) with its chunk's position in the 128-byte line,
# per chunks in a row (k-tile 8, 16, 32). Found by search so that, for every tile and block
# size the configurations allow, an ldmatrix phase (8 even or 8 odd rows of a 16-row block, one
# chunk) and a quarter-warp of cp.async copies each hit 8 distinct bank groups, and each line
# stays a permutation of itself (checked by the simulator's profiler: 0 conflicts).
ROW_XOR = {
    2: (0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
    4: (0, 0, 2, 2, 1, 1, 3, 3, 4, 4, 6, 6, 5, 5, 7, 7),
    8: (0, 4, 2, 6, 1, 5, 3, 7, 4, 0, 6, 2, 5, 1, 7, 3),
}


def swizzles(cfg: TensorCoreConfig) -> tuple:
    """``(A's, B's)`` swizzle device functions ``chunk_of(r, c)`` for the TF32 tiles of
    ``cfg``; None: :mod:`.tc_staging`'s XOR swizzle."""

    @cuda.jit(device=True)
    def k_rows(r, c):
        """A tile with k rows and at least 8 chunks a row: chunk ``c ^ reverse3(r % 8)``."""
        return c ^ (((r & 1) << 2) | (r & 2) | ((r >> 2) & 1))

    chunks = cfg.tile_k // CHUNK  # a (N, K) tile's chunks per row: 2, 4 or 8
    per_line = 8 // chunks  # its rows per 128-byte line
    xor = sum(v << (4 * r) for r, v in enumerate(ROW_XOR[chunks]))  # 4 bits per row

    @cuda.jit(device=True)
    def rows_in_pairs(r, c):
        """B transposed: the chunk's position in its line XOR ``ROW_XOR[chunks][r % 16]``,
        given as a chunk offset from the row's start (it may move into another row of the
        line)."""
        first = (r % per_line) * chunks
        return ((first + c) ^ ((xor >> ((r & 15) << 2)) & 7)) - first

    return (k_rows if cfg.trans_a else None), (rows_in_pairs if cfg.trans_b else k_rows)


class Tf32Fragments(NamedTuple):
    """The TF32 fragment reads of one kernel: offsets per lane (``n_off_a``, ``n_off_b`` of
    each), ``offsets(lane, wm0, wn0, a_off, b_off)``, ``a_block(sa, base, off, ks, i)`` (A's 4
    registers of rows 16 i..16 i + 15 at k8 step ``ks``), ``b_step(sb, base, ks, fa, fb, acc,
    off)`` (B's fragments of the step and its mma), and the local array types of A's and B's
    fragments."""

    n_off_a: int
    n_off_b: int
    offsets: object
    a_block: object
    b_step: object
    frag_a: object
    frag_b: object


def fragments(cfg: TensorCoreConfig, mt: int, nt: int, chunk_a, chunk_b, block_a, block_b):
    """:class:`Tf32Fragments` for ``cfg`` (``mt`` x ``nt`` mma tiles per warp), given the
    stagings' swizzles and ``ldmatrix`` block reads (:func:`.tc_staging.stage_functions`)."""
    tile_m, tile_n, tile_k = cfg.tile_m, cfg.tile_n, cfg.tile_k
    ksteps, nt2 = tile_k // 8, nt // 2
    trans_a, trans_b = cfg.trans_a, cfg.trans_b
    # k rows: one offset per row t or t + 4 and 8-column (A) or 16-column (B) block modulo 32
    # columns (the swizzle repeats every 8 rows and 32 columns)
    n_off_a = min(mt, 2) * 4 if trans_a else ksteps
    n_off_b = ksteps if trans_b else min(nt2, 2) * 2

    @cuda.jit(device=True)
    def offsets(lane, wm0, wn0, a_off, b_off):
        g = lane >> 2
        t = lane & 3
        if trans_a:  # k-rows t + 4 v, columns 16 i + 8 h + g for i % 2 (+ 32 per two i)
            for i in range(n_off_a // 4):
                for h in range(2):
                    for v in range(2):
                        col = wm0 + 16 * i + 8 * h + g
                        row = t + 4 * v
                        at = row * tile_m + chunk_a(row, col // CHUNK) * CHUNK + col % CHUNK
                        a_off[4 * i + 2 * h + v] = at
        else:  # rows lane % 8 + 8 (lane // 16), chunk 2 ks + lane // 8 % 2
            r = wm0 + lane % 8 + 8 * (lane // 16)
            for ks in range(ksteps):
                a_off[ks] = r * tile_k + chunk_a(r, 2 * ks + lane // 8 % 2) * CHUNK
        if trans_b:  # tile rows 2 (lane % 8) + lane // 8 % 2, chunk 2 ks + lane // 16
            r = wn0 + 2 * (lane % 8) + lane // 8 % 2
            for ks in range(ksteps):
                b_off[ks] = r * tile_k + chunk_b(r, 2 * ks + lane // 16) * CHUNK
        else:  # k-rows t + 4 h, columns 2g, 2g + 1 of the 16-column block (modulo 2)
            for blk in range(n_off_b // 2):
                for h in range(2):
                    col = wn0 + 16 * blk + 2 * g
                    row = t + 4 * h
                    at = row * tile_n + chunk_b(row, col // CHUNK) * CHUNK + col % CHUNK
                    b_off[2 * blk + h] = at

    @cuda.jit(device=True, **INLINE)
    def a_block_rows(sa, base, off, ks, i):
        """A transposed: k-rows t and t + 4 of columns 16 i + g and 16 i + 8 + g."""
        o = base + 8 * ks * tile_m + 32 * (i // 2)
        at = 4 * (i % 2)
        return (
            load_f32_shared(sa, o + off[at]), load_f32_shared(sa, o + off[at + 1]),
            load_f32_shared(sa, o + off[at + 2]), load_f32_shared(sa, o + off[at + 3]),
        )  # fmt: skip

    @cuda.jit(device=True, **INLINE)
    def multiply(fa, fb, acc):
        """The k8 step's mma with the operands swapped: the B fragment of 16 columns (fb rows
        2I, 2I + 1) as the mma's A, the A fragment of 8 rows (fa[i] half jb) as its B; tile
        (I, 2i + jb) accumulates in acc[i, 2I + jb]."""
        for i in range(mt):
            for jb in range(2):
                for blk in range(nt2):
                    j = 2 * blk + jb
                    d = mma_m16n8k8_tf32(
                        (fb[2 * blk, 0], fb[2 * blk, 1], fb[2 * blk + 1, 0], fb[2 * blk + 1, 1]),
                        (fa[i, 2 * jb], fa[i, 2 * jb + 1]),
                        (acc[i, j, 0], acc[i, j, 1], acc[i, j, 2], acc[i, j, 3]),
                    )
                    for q in range(4):
                        acc[i, j, q] = d[q]

    @cuda.jit(device=True, **INLINE)
    def b_step_k_rows(sb, base, ks, fa, fb, acc, off):
        """Two LDS.64 per 16 columns (rows t and t + 4, columns 2g, 2g + 1: one A fragment of
        the swapped mma, no register moves), then the mma."""
        for blk in range(nt2):
            for h in range(2):
                at = base + off[2 * (blk % 2) + h] + 32 * (blk // 2) + 8 * ks * tile_n
                v = load_f32x2_shared(sb, at)
                fb[2 * blk + h, 0] = v[0]
                fb[2 * blk + h, 1] = v[1]
        multiply(fa, fb, acc)

    return Tf32Fragments(
        n_off_a, n_off_b, offsets,
        a_block_rows if trans_a else block_a,
        b_fragments_step(block_b, nt2, multiply) if trans_b else b_step_k_rows,  # ldmatrix.x4
        float32 if trans_a else uint32,  # scalar loads give float32, ldmatrix 32-bit bits
        uint32 if trans_b else float32,
    )  # fmt: skip
