"""2-D transpose through a padded shared-memory tile: hand-written.

Why hand-written: the composer makes elementwise kernels whose threads walk the output, so a
transposed read is strided and uncoalesced. Here a block stages a 32 x 32 tile of ``src`` with
coalesced loads into shared memory padded for column reads (``Tile(..., pad="auto",
access="column")``), then writes it out transposed, again coalesced::

    src tile (rows r0.., cols c0..)  --global_to_shared-->  shared 32 x (32 + pad)
    shared column j                  --shared_to_global_transposed-->  dst row c0 + j

Both steps are :func:`tessera_tile.memory.make_stager`'s: 16-byte chunks per lane where the
bank model says they are conflict free on the padded pitch (float32 both ways; float16 on the
transposed side), one element per lane otherwise (float64, float16's staging stores), so the
simulator profile shows no bank conflicts for any of the three dtypes.

Any strides in (a strided source row moves element by element), C-contiguous out. Blocks walk
the tiles with a grid-stride loop, so any size fits a 1-D grid.
"""

from __future__ import annotations

import numpy as np
from numba import cuda
from numba.np import numpy_support

from ..memory import Tile, make_stager

TILE = 32
THREADS = 256  # one 16-byte chunk of a float32 tile per thread
TILES = {
    np.dtype(d): Tile((TILE, TILE), d, pad="auto", access="column") for d in ("f2", "f4", "f8")
}


def _make(dtype: str):
    """The transpose kernel of one dtype; closes over its tile and stager."""
    tile_spec = TILES[np.dtype(dtype)]
    shape = tile_spec.padded_shape
    nbtype = numpy_support.from_dtype(np.dtype(dtype))
    stage = make_stager(tile_spec)

    def transpose_tiles(src, dst):
        tile = cuda.shared.array(shape, nbtype)
        m, n = src.shape
        tiles_n = (n + TILE - 1) // TILE
        tiles_m = (m + TILE - 1) // TILE
        # this block's first tile; later ones step by gridDim.x tiles without a division in
        # the loop (a 64-bit division there called CUDA's division routine once per tile)
        tile_row = cuda.blockIdx.x // max(tiles_n, 1)
        tile_col = cuda.blockIdx.x - tile_row * tiles_n
        while tile_row < tiles_m:
            row0 = tile_row * TILE
            col0 = tile_col * TILE
            # 0 fills past the edge and never reaches dst; an int, as a captured float16
            # constant gave NVVM invalid IR
            stage.global_to_shared(src, row0, col0, tile, 0)
            cuda.syncthreads()
            stage.shared_to_global_transposed(tile, dst, col0, row0)
            cuda.syncthreads()  # the tile is overwritten by the next iteration
            tile_col += cuda.gridDim.x
            while tile_col >= tiles_n:  # once, unless the grid is wider than a tile row
                tile_col -= tiles_n
                tile_row += 1

    return cuda.jit(transpose_tiles)


transpose_f16 = _make("f2")
transpose_f32 = _make("f4")
transpose_f64 = _make("f8")
KERNELS = {
    np.dtype("f2"): transpose_f16,
    np.dtype("f4"): transpose_f32,
    np.dtype("f8"): transpose_f64,
}
