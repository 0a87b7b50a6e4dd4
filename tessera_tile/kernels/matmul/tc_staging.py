"""How the tensor-core matmul kernel (:mod:`.tc`) stages one operand's k-tile in shared memory
and reads its fragments back, in either layout of the operand in memory.

The kernel reads every operand through a ``(batch, rows, cols)`` view whose last axis is
contiguous, and stages a tile of it row for row in 16-byte chunks along that axis, swizzled
(the module doc of :mod:`.tc`). Which axis of the product the rows are decides the rest:

* **k along the columns** (:attr:`Staging.k_rows` false): A as it usually is, ``(M, K)``
  row-major; B transposed, ``w.T`` of a row-major ``w`` read as ``(N, K)``;
* **k along the rows**: B as it usually is, ``(K, N)``; A transposed, ``x.T`` of a row-major
  ``x`` read as ``(K, M)``.

So the backward GEMMs of ``y = x @ w``, ``dx = dy @ w.T`` and ``dw = x.T @ dy``, read the
forward's arrays in place, as cuBLAS's transposed operands do. An operand's 16 x 16 block of
a k16 step is one ``ldmatrix.x4``: plain where the rows are the product's M or N (each row
of the 8 x 8 matrices is one row's 8 k values, as the mma wants), ``.trans`` where the rows
are k. Each lane addresses one row of one of the four 8 x 8 matrices, chosen so that they
come back in the order the mma takes its registers (:func:`stage_functions`); either way
the 8 rows of a phase are 8 consecutive rows of one logical chunk, which the swizzle puts in
8 distinct bank groups: no conflicts.
"""

from __future__ import annotations

from typing import NamedTuple

from numba import cuda, int32

from ...memory import store16_shared
from ...mma import ldmatrix_x4, ldmatrix_x4_trans
from ...pipeline import cp_async_cg_16_zfill
from ..tc_tiles import INLINE, TileCopies, swizzled_copies

__all__ = ["Staging", "b_fragments_step", "staging", "stage_functions"]


class Staging(NamedTuple):
    """One operand's shared tile: ``rows`` x ``cols`` elements in 16-byte chunks of ``chunk``
    along the columns; ``k_rows``: the rows are k (else the columns are); ``copies``: how the
    block's threads copy it."""

    k_rows: bool
    rows: int
    cols: int
    chunk: int
    copies: TileCopies

    @property
    def per(self) -> int:
        """Chunks a thread copies per pass."""
        return self.copies.chunks // self.copies.per_row

    @property
    def guards(self) -> int:
        """Bounds guards a thread keeps: one per pass (k along the columns: the row, an M or N
        index, is fixed for the whole loop) or one per chunk of a pass (k along the rows)."""
        return self.per if self.k_rows else self.copies.passes


def staging(k_rows: bool, extent: int, tile_k: int, threads: int, chunk: int) -> Staging:
    """The staging of an operand whose tile spans ``extent`` rows of C (tile_m) or columns
    (tile_n) and ``tile_k`` of k; ``ValueError`` when the block's copies cannot split it."""
    rows, cols = (tile_k, extent) if k_rows else (extent, tile_k)
    return Staging(k_rows, rows, cols, chunk, swizzled_copies(rows, cols, chunk, threads))


def stage_functions(
    st: Staging, b_operand: bool, tile_k: int, n_offsets: int, async_copy: bool, sync_chunk,
    prologue_pass, swizzle=None,
):  # fmt: skip
    """The device functions of one operand's staging: ``(chunk_of, targets, load, transform,
    offsets, block16)``.

    * ``chunk_of(r, c)``: the physical chunk of logical chunk ``c`` of tile row ``r``
      (``swizzle``, a device function of its own, or :mod:`.tc`'s XOR swizzle);
    * ``targets(tid, mn0, mn, dst, ok)``: this thread's swizzled chunk offsets in a stage and
      its bounds guards (``mn0`` the block's first row of C (A) or column (B), ``mn`` their
      count);
    * ``load(ring, base, src, bz, mn0, k0, k, dst, ok, r0, c0)``: its chunks of the k-tile from
      ``k0`` into the stage at ``base``, zero outside the operand;
    * ``transform(ring, base, k, k0, dst, r0, c0)``: the prologue's pass over its chunks that lie
      inside K (``prologue_pass``: :func:`.prologue.chunk_pass`);
    * ``offsets(lane, w0, off)``: this lane's ldmatrix offsets (``w0``: the warp tile's first
      row or column of C), ``n_offsets`` of them: one per k step (k along the columns) or
      per 16-wide block of the warp tile (k along the rows);
    * ``block16(ring, base, off, ks, blk)``: block ``blk`` of k16 step ``ks``, 4 registers:
      A's fragment (``b_operand`` false) or two n8 tiles' B fragments, registers 0 and 1, then
      2 and 3.

    ``sync_chunk(dst, offset, src, bz, gr, gc)`` stages one chunk synchronously (guarded loads)."""
    cp = st.copies
    rows, cols, chunk, k_rows = st.rows, st.cols, st.chunk, st.k_rows
    q, step, passes, exact, per = cp.per_row, cp.row_step, cp.passes, cp.exact, st.per
    lines, period, shift = cp.lines, cp.period, 3 - cp.bits

    @cuda.jit(device=True)
    def reverse3(v):
        return ((v & 1) << 2) | (v & 2) | ((v >> 2) & 1)

    @cuda.jit(device=True)
    def xor_swizzle(r, c):
        return c ^ (reverse3((r // lines) % period) >> shift)

    chunk_of = swizzle or xor_swizzle

    @cuda.jit(device=True)
    def copy(dst, offset, src, bz, gr, gc, ok):
        """Chunk ``src[bz, gr, gc:gc + chunk]`` -> ``dst[offset:]``; zeros unless ``ok``
        (async) / outside ``src`` (sync)."""
        if async_copy:
            # Rows are 16-byte aligned here (aligned_rows): a chunk is all in or all out,
            # and a copy of 0 source bytes reads nothing, so its address may lie outside src.
            cp_async_cg_16_zfill(dst, offset, src, (bz, gr, gc), 16 if ok else 0)
        else:
            sync_chunk(dst, offset, src, bz, gr, gc)

    @cuda.jit(device=True)
    def targets(tid, mn0, mn, dst, ok):
        r0 = tid // q
        c0 = tid % q
        for p in range(passes):
            r = r0 + p * step
            if not k_rows:
                ok[p] = mn0 + r < mn
            for i in range(per):
                dst[p, i] = r * cols + chunk_of(r, c0 + q * i) * chunk
        if k_rows:
            for i in range(per):
                ok[i] = mn0 + (c0 + q * i) * chunk < mn

    @cuda.jit(device=True, **INLINE)
    def load(ring, base, src, bz, mn0, k0, k, dst, ok, r0, c0):
        if k_rows:
            for p in range(passes):
                if exact or r0 + p * step < rows:
                    kr = k0 + r0 + p * step
                    for i in range(per):
                        copy(ring, base + dst[p, i], src, bz, kr, mn0 + (c0 + q * i) * chunk,
                             ok[i] and kr < k)  # fmt: skip
        else:
            # k-columns of this thread's first chunk left in the tile: a 32-bit count, so the
            # chunk guards below are one compare with a constant each.
            left = int32(min(k - k0 - c0 * chunk, tile_k))
            for p in range(passes):
                if exact or r0 + p * step < rows:
                    for i in range(per):
                        copy(ring, base + dst[p, i], src, bz, mn0 + r0 + p * step,
                             k0 + (c0 + q * i) * chunk, ok[p] and left > q * chunk * i)  # fmt: skip

    @cuda.jit(device=True, **INLINE)
    def transform(ring, base, k, k0, dst, r0, c0):
        left = int32(min(k - k0, tile_k))  # k indices of this tile inside K
        for p in range(passes):
            if exact or r0 + p * step < rows:
                if k_rows:
                    if r0 + p * step < left:
                        for i in range(per):
                            prologue_pass(ring, base + dst[p, i])
                else:
                    for i in range(per):  # K a multiple of the chunk: all in or all out
                        if (c0 + q * i) * chunk < left:
                            prologue_pass(ring, base + dst[p, i])

    # ldmatrix lanes: lane l gives row l % 8 of matrix l // 8. The matrices come back in the
    # order the mma wants (A: rows 0-7 then 8-15 of k 0-7, then of k 8-15; B: k 0-7 then
    # 8-15 of columns 0-7, then of 8-15), so no register moves: rows l % 16 of chunk l // 16
    # where the rows are k for B or not k for A, else rows l % 8 + 8 (l // 16) of chunk
    # l // 8 % 2.
    first = k_rows == b_operand

    @cuda.jit(device=True)
    def offsets(lane, w0, off):
        lr = lane % 16 if first else lane % 8 + 8 * (lane // 16)
        lc = lane // 16 if first else lane // 8 % 2
        # The swizzle repeats every 8 rows, so the other index's 16-row terms are constants
        # added to these (block16).
        if k_rows:
            for blk in range(n_offsets):
                off[blk] = lr * cols + chunk_of(lr, w0 // chunk + 2 * blk + lc) * chunk
        else:
            r = w0 + lr
            for ks in range(n_offsets):
                off[ks] = r * cols + chunk_of(r, 2 * ks + lc) * chunk

    @cuda.jit(device=True, **INLINE)
    def block16(ring, base, off, ks, blk):
        if k_rows:
            return ldmatrix_x4_trans(ring, base + off[blk] + 16 * cols * ks)
        return ldmatrix_x4(ring, base + off[ks] + 16 * cols * blk)

    return chunk_of, targets, load, transform, offsets, block16


def b_fragments_step(block16, blocks: int, multiply):
    """``step(ring, base, ks, fa, fb, acc, off)``: B's fragments of one k step, one
    :func:`stage_functions` ``block16`` per 16-column block (registers 0 and 1 into ``fb`` row
    ``2 blk``, 2 and 3 into row ``2 blk + 1``), then ``multiply(fa, fb, acc)``."""

    @cuda.jit(device=True, **INLINE)
    def step(ring, base, ks, fa, fb, acc, off):
        for blk in range(blocks):
            f = block16(ring, base, off, ks, blk)
            fb[2 * blk, 0] = f[0]
            fb[2 * blk, 1] = f[1]
            fb[2 * blk + 1, 0] = f[2]
            fb[2 * blk + 1, 1] = f[3]
        multiply(fa, fb, acc)

    return step


def sync_chunk(elem, chunk: int, load):
    """``chunk(dst, offset, src, bz, gr, gc)``: guarded loads of ``chunk`` single elements
    (any alignment) of ``src[bz, gr, gc:]``, ``load`` on each (zero outside ``src``), one
    16-byte shared store; written out, as a tuple cannot be built in a loop."""
    values = [f"x{i}" for i in range(chunk)]
    source = "\n".join(
        [
            "def sync_chunk(dst, offset, src, bz, gr, gk):",
            "    ok = gr < src.shape[1]",
            "    cols = src.shape[2]",
            *(f"    x{i} = load(src[bz, gr, gk + {i}]) if ok and gk + {i} < cols else elem(0)"
              for i in range(chunk)),
            f"    store16_shared(dst, offset, ({', '.join(values)},))",
        ]
    )  # fmt: skip
    namespace = {"load": load, "elem": elem, "store16_shared": store16_shared}
    exec(source, namespace)  # noqa: S102 - our own generated code
    return cuda.jit(device=True)(namespace["sync_chunk"])
