"""2-D transpose through a padded shared-memory tile: hand-written.

Why hand-written: the composer makes elementwise kernels whose threads walk the output, so a
transposed read is strided and uncoalesced. Here a block stages a 32 x 32 tile of ``src`` with
coalesced (16-byte where aligned) loads into shared memory padded for column reads
(``Tile(..., pad="auto", access="column")``), then writes it out transposed, again coalesced::

    src tile (rows r0.., cols c0..)  --global_to_shared-->  shared 32 x (32 + pad)
    shared column j                  --shared_to_global_transposed-->  dst row c0 + j

Any strides in (a strided source row moves element by element), C-contiguous out. Blocks walk
the tiles with a grid-stride loop, so any size fits a 1-D grid.

float32 goes through :func:`tessera_tile.memory.make_stager` (16-byte loads and stores where
aligned, zero bank conflicts in the simulator profile). For float16 and float64 the stager's
16-byte chunks hit bank conflicts today (a 2-byte or 8-byte element is not one bank: the
stager/model disagreement of the prebuilt-ops issue), so those dtypes use the classic mapping
instead: a (32, 8) block, each thread moving 4 elements, lanes on consecutive columns when
loading and on consecutive tile rows when storing, rows padded to an odd number of 4-byte
words (2 halves, 1 double): conflict free (8-byte requests are served per half-warp).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, float64
from numba.core.types import float16

from ..memory import Tile, make_stager

TILE = 32
THREADS = 256  # one 16-byte chunk of a float32 tile per thread; (32, 8) for the classic mapping
ROWS_PER_PASS = THREADS // TILE
F32_TILE = Tile((TILE, TILE), np.float32, pad="auto", access="column")  # pad 1


def _make_staged():
    shape = F32_TILE.padded_shape
    stage = make_stager(F32_TILE)
    zero = float32(0)
    nbtype = float32

    def transpose_tiles(src, dst):
        tile = cuda.shared.array(shape, nbtype)
        m, n = src.shape
        tiles_n = (n + TILE - 1) // TILE
        total = ((m + TILE - 1) // TILE) * tiles_n
        t = cuda.blockIdx.x
        while t < total:
            row0 = (t // tiles_n) * TILE
            col0 = (t - (t // tiles_n) * tiles_n) * TILE
            stage.global_to_shared(src, row0, col0, tile, zero)
            cuda.syncthreads()
            stage.shared_to_global_transposed(tile, dst, col0, row0)
            cuda.syncthreads()  # the tile is overwritten by the next iteration
            t += cuda.gridDim.x

    return cuda.jit(transpose_tiles)


def _make_classic(nbtype, pad):
    # a pitch of an odd number of 4-byte words: a column read spans every bank
    shape = (TILE, TILE + pad)

    def transpose_tiles(src, dst):
        tile = cuda.shared.array(shape, nbtype)
        m, n = src.shape
        tx = cuda.threadIdx.x % TILE
        ty = cuda.threadIdx.x // TILE
        tiles_n = (n + TILE - 1) // TILE
        total = ((m + TILE - 1) // TILE) * tiles_n
        t = cuda.blockIdx.x
        while t < total:
            row0 = (t // tiles_n) * TILE
            col0 = (t - (t // tiles_n) * tiles_n) * TILE
            r = ty
            while r < TILE:  # lanes on consecutive source columns: coalesced reads
                if row0 + r < m and col0 + tx < n:
                    tile[r, tx] = src[row0 + r, col0 + tx]
                r += ROWS_PER_PASS
            cuda.syncthreads()
            r = ty
            while r < TILE:  # lanes on consecutive tile rows = consecutive dst columns
                if col0 + r < n and row0 + tx < m:
                    dst[col0 + r, row0 + tx] = tile[tx, r]
                r += ROWS_PER_PASS
            cuda.syncthreads()  # the tile is overwritten by the next iteration
            t += cuda.gridDim.x

    return cuda.jit(transpose_tiles)


transpose_f32 = _make_staged()
transpose_f16 = _make_classic(float16, 2)
transpose_f64 = _make_classic(float64, 1)
KERNELS = {
    np.dtype("f2"): transpose_f16,
    np.dtype("f4"): transpose_f32,
    np.dtype("f8"): transpose_f64,
}
