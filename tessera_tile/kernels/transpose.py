"""2-D transpose through a padded shared-memory tile: hand-written.

Why hand-written: the composer makes elementwise kernels whose threads walk the output, so a
transposed read is strided and uncoalesced. Here a block stages a 32 x 32 tile of ``src`` with
coalesced loads into shared memory padded for column reads (``Tile(..., pad="auto",
access="column")``), then writes it out transposed, again coalesced::

    src tile (rows r0.., cols c0..)  --coalesced loads-->   shared 32 x (32 + pad)
    shared column j                  --coalesced stores-->  dst row c0 + j

Lanes per access follow :func:`tessera_tile.memory.make_stager`'s choice for the tile
(``row_vector``, ``column_vector``): 16-byte chunks where the bank model says they are conflict
free on the padded pitch (float32 both ways; float16 on the transposed side), one element per
lane otherwise, so the simulator profile shows no bank conflicts for any of the three dtypes.

Three tile loops, so that the steady state carries no guard (the SASS of each is its own loop):

- whole tiles, 16-byte chunks: ``src`` rows contiguous and both arrays' rows 16-byte aligned;
- whole tiles, one element per lane: any strides, any alignment;
- the partial tiles at the right and bottom edges, each element guarded.

Each walk is a grid-stride loop without a division (whole tiles: a block steps by
``gridDim.x`` tiles, carrying into the tile row; edge tiles: numbered along regions one tile
wide or one tile high), so any size fits a 1-D grid. Indices are unsigned, and the
counters of the whole-tile walks 32-bit: Numba adds no wraparound of negative indices, and
ptxas strength-reduces the addresses (see ``tests/compile/test_transpose_sass.py`` for the
instructions per tile). Launch with ``THREADS`` threads in x: the lanes' mapping is built in.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, uint32, uint64
from numba.np import numpy_support

from ..memory import Tile, aligned16, load16, make_stager, store16
from ._named import NamedKernels

TILE = 32
THREADS = 256  # the block the kernels are built for: a float32 tile is one 16-byte chunk each
TILES = {
    np.dtype(d): Tile((TILE, TILE), d, pad="auto", access="column") for d in ("f2", "f4", "f8")
}
# Unsigned constants: a Python int in a sum makes Numba type it signed (int64) again.
_T64 = np.uint64(TILE)
_ONE = np.uint32(1)
_ZERO = np.uint32(0)


def _column(vector: int):
    """Device function: ``vector`` shared elements down a column from ``(i, j)``, a tuple."""
    one = np.uint64(1)
    if vector == 4:
        return cuda.jit(device=True)(
            lambda s, i, j: (s[i, j], s[i + one, j], s[i + 2 * one, j], s[i + 3 * one, j])
        )
    if vector == 8:
        return cuda.jit(device=True)(
            lambda s, i, j: (
                s[i, j], s[i + one, j], s[i + 2 * one, j], s[i + 3 * one, j],
                s[i + 4 * one, j], s[i + 5 * one, j], s[i + 6 * one, j], s[i + 7 * one, j],
            )
        )  # fmt: skip
    raise ValueError(f"no column gather of {vector} elements")


def _mover(vg: int, vt: int, guarded: bool):
    """Device function moving one tile, src -> shared -> dst transposed, with ``vg`` / ``vt``
    elements per lane on the load / store side (16-byte accesses when > 1, which the caller
    has checked are aligned). Unguarded, the tile lies wholly inside both arrays; guarded
    (``vg == vt == 1``), elements outside ``m`` x ``n`` are neither read nor written."""
    u = np.uint64
    VG, VT = u(vg), u(vt)
    CPR, CPR_T = u(TILE // vg), u(TILE // vt)  # chunks per tile row / tile column
    G_ROWS = THREADS * vg // TILE  # tile rows the block loads in one pass
    T_ROWS = min(THREADS * vt // TILE, TILE)  # dst rows the block stores in one pass
    T_THREADS = T_ROWS * TILE // vt  # threads with a chunk to store
    G_STEP, T_STEP = u(G_ROWS), u(T_ROWS)
    G_PASSES, T_PASSES = TILE // G_ROWS, TILE // T_ROWS
    column = _column(vt) if vt > 1 else None

    @cuda.jit(device=True)
    def move(src, dst, row0, col0, tile, tid, m, n):
        t = uint64(tid)
        r = t // CPR
        c = t % CPR * VG
        for p in range(G_PASSES):
            rr = r + uint64(p) * G_STEP
            if guarded:
                if row0 + rr < m and col0 + c < n:
                    tile[rr, c] = src[row0 + rr, col0 + c]
            elif vg > 1:
                vals = load16(src, (row0 + rr, col0 + c))
                for e in range(vg):
                    tile[rr, c + uint64(e)] = vals[e]
            else:
                tile[rr, c] = src[row0 + rr, col0 + c]
        cuda.syncthreads()
        if T_THREADS == THREADS or tid < T_THREADS:
            j = t // CPR_T  # tile column = dst row
            i = t % CPR_T * VT  # tile row = dst column
            for p in range(T_PASSES):
                jj = j + uint64(p) * T_STEP
                if guarded:
                    if col0 + jj < n and row0 + i < m:
                        dst[col0 + jj, row0 + i] = tile[i, jj]
                elif vt > 1:
                    store16(dst, (col0 + jj, row0 + i), column(tile, i, jj))
                else:
                    dst[col0 + jj, row0 + i] = tile[i, jj]
        cuda.syncthreads()  # the tile is overwritten by the next one

    return move


def _whole_tiles(move):
    """Device function: a block's grid-stride walk over the ``rows`` x ``cols`` whole tiles
    (32-bit counters: tile counts fit, and they save registers and instructions)."""

    @cuda.jit(device=True)
    def walk(src, dst, tile, tid, b, g, rows, cols):
        m, n = uint64(src.shape[0]), uint64(src.shape[1])
        tile_row = uint32(b // max(cols, _ONE))
        tile_col = uint32(b - tile_row * cols)
        while tile_row < rows:
            move(src, dst, uint64(tile_row) * _T64, uint64(tile_col) * _T64, tile, tid, m, n)
            tile_col = uint32(tile_col + g)
            while tile_col >= cols:  # once, unless the grid is wider than a tile row
                tile_col = uint32(tile_col - cols)
                tile_row = uint32(tile_row + _ONE)

    return walk


def _make(dtype: str):
    """The transpose kernel of one dtype; closes over its tile and its tile movers."""
    tile_spec = TILES[np.dtype(dtype)]
    shape = tile_spec.padded_shape
    nbtype = numpy_support.from_dtype(np.dtype(dtype))
    itemsize = tile_spec.itemsize
    stage = make_stager(tile_spec)
    VG, VT = stage.row_vector, stage.column_vector
    walk_vector = _whole_tiles(_mover(VG, VT, False))
    walk_scalar = _whole_tiles(_mover(1, 1, False))
    move_edge = _mover(1, 1, True)

    def transpose_tiles(src, dst):
        tile = cuda.shared.array(shape, nbtype)
        m, n = src.shape
        tid = cuda.threadIdx.x
        b, g = uint32(cuda.blockIdx.x), uint32(cuda.gridDim.x)
        full_n = n // TILE
        full_m = m // TILE if full_n else 0
        rows, cols = uint32(full_m), uint32(full_n)
        vector = True  # every 16-byte chunk of a whole tile is aligned
        if VG > 1:
            vector = src.strides[1] == itemsize and src.strides[0] % 16 == 0
            vector = vector and aligned16(src, (0, 0))
        if VT > 1:
            vector = vector and dst.strides[0] % 16 == 0 and aligned16(dst, (0, 0))
        if vector:
            walk_vector(src, dst, tile, tid, b, g, rows, cols)
        else:
            walk_scalar(src, dst, tile, tid, b, g, rows, cols)
        # The partial tiles, numbered e = 0, 1, ...: the right column (one tile wide) of the
        # whole tile rows, then the bottom tile row (one tile high; every row, one tile wide,
        # when n < 32). Blocks that ran one whole tile fewer start them. No division: each
        # region is one tile wide or one tile high.
        shift = uint32(uint32(rows * cols) % g)
        e = uint32(b + g - shift)
        if e >= g:
            e = uint32(e - g)
        tiles_n = uint32((n + TILE - 1) // TILE)
        right = uint32(rows * (tiles_n - cols))  # 0 or the whole tile rows
        edges = uint32(right + (uint32((m + TILE - 1) // TILE) - rows) * tiles_n)
        while e < edges:
            tile_row, col = e, cols  # the right column
            if e >= right:  # the bottom row, or (n < 32) the one column of every row
                f = uint32(e - right)  # Numba types uint32 - uint32 as 64-bit
                tile_row, col = (uint32(rows + f), _ZERO) if tiles_n == 1 else (rows, f)
            row0, col0 = uint64(tile_row) * _T64, uint64(col) * _T64
            move_edge(src, dst, row0, col0, tile, tid, uint64(m), uint64(n))
            e = uint32(e + g)

    # 8 blocks of 256 threads per SM (32 registers each): full occupancy for a memory-bound
    # kernel, which ptxas otherwise gives up on sm_90 for the edge loop's few registers more
    return cuda.jit(transpose_tiles, launch_bounds=(THREADS, 8))


NAMED = NamedKernels(
    __name__,
    {f"transpose_f{8 * size}": (lambda size=size: _make(f"f{size}")) for size in (2, 4, 8)},
)
__getattr__ = NAMED.module_getattr


def kernel(dtype):
    """The kernel that moves elements of ``dtype``'s size (2, 4 or 8 bytes)."""
    return NAMED[f"transpose_f{8 * np.dtype(dtype).itemsize}"]
