"""Matrix transpose through a shared-memory tile, with and without padding.

Each block stages a 32 x 32 tile of ``src`` into shared memory with coalesced 16-byte loads, then
writes it out transposed: consecutive threads take consecutive *rows* of the tile, so they read
one shared-memory column::

    src (row-major)            shared tile, pitch 33           dst = src.T
    +--------+                 +--------+-+                    +--------+
    | 32x32  |  LDG.E.128 -->  | row i  |p|  column j  -->     | row j  |  STG.E.128
    +--------+                 +--------+-+                    +--------+

With a pitch of 32 floats every element of a column sits in the same bank (an 8-way conflict per
request here: 8 lanes read each of 4 columns); one float of padding per row (``pad="auto"`` for
``access="column"``) spreads a column over all 32 banks. ``transpose_unpadded`` keeps the conflicts
so the simulator profiler and the docs can show them.

Run it with ``python examples/transpose.py`` (add ``NUMBA_ENABLE_CUDASIM=1`` without a GPU).
"""

import numpy as np
from numba import cuda, float32

from tessera_tile.memory import Tile, make_stager

SIGNATURE = "void(float32[:, ::1], float32[:, ::1])"
TILE_M = TILE_N = 32
THREADS = (32, 8)  # 256 threads: one 16-byte chunk of the tile each
ZERO = float32(0.0)

PADDED = Tile((TILE_M, TILE_N), np.float32, pad="auto", access="column")  # pad = 1
PLAIN = Tile((TILE_M, TILE_N), np.float32)  # pad = 0: 8-way conflicts on the column reads
PADDED_SHAPE = PADDED.padded_shape
PLAIN_SHAPE = PLAIN.padded_shape
padded = make_stager(PADDED)
plain = make_stager(PLAIN)


@cuda.jit  # lazy: an eager signature would ask for a GPU at import time
def transpose_padded(src, dst):
    tile = cuda.shared.array(PADDED_SHAPE, float32)
    row0 = cuda.blockIdx.y * TILE_M
    col0 = cuda.blockIdx.x * TILE_N
    padded.global_to_shared(src, row0, col0, tile, ZERO)
    cuda.syncthreads()
    padded.shared_to_global_transposed(tile, dst, col0, row0)


@cuda.jit
def transpose_unpadded(src, dst):
    # 16-byte aligned rows: the staging stores become STS.128, the column reads conflict.
    tile = cuda.shared.array(PLAIN_SHAPE, float32, alignment=16)
    row0 = cuda.blockIdx.y * TILE_M
    col0 = cuda.blockIdx.x * TILE_N
    plain.global_to_shared(src, row0, col0, tile, ZERO)
    cuda.syncthreads()
    plain.shared_to_global_transposed(tile, dst, col0, row0)


# (kernel, signature) pairs the demo compiles and reports.
KERNELS = [(transpose_padded, SIGNATURE), (transpose_unpadded, SIGNATURE)]


def reference(src):
    """NumPy reference."""
    return np.ascontiguousarray(src.T)


def grid(rows: int, cols: int) -> tuple[int, int]:
    """Blocks for an ``rows x cols`` source: x over tile columns, y over tile rows."""
    return (-(-cols // TILE_N), -(-rows // TILE_M))


def transpose(src, padded_tile: bool = True):
    """Transpose a 2-D float32 array with one of the kernels; returns a new array."""
    src = np.ascontiguousarray(src, dtype=np.float32)
    dst = np.zeros((src.shape[1], src.shape[0]), np.float32)
    if src.size:
        kernel = transpose_padded if padded_tile else transpose_unpadded
        kernel[grid(*src.shape), THREADS](src, dst)
    return dst


def checks(rows: int = 70, cols: int = 33, seed: int = 0) -> list:
    """``(label, check)`` per kernel: ``check()`` transposes a random ``rows x cols`` matrix,
    asserts it equals NumPy's and returns the largest error (0: a transpose copies exactly)."""
    src = np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32)

    def check(padded_tile: bool) -> float:
        got, expected = transpose(src, padded_tile), reference(src)
        np.testing.assert_array_equal(got, expected)
        return float(np.max(np.abs(got - expected), initial=0.0))

    return [
        (f"transpose {rows}x{cols}, {name} tile", lambda padded=padded: check(padded))
        for name, padded in (("padded", True), ("unpadded", False))
    ]


def run(rows: int = 70, cols: int = 33, seed: int = 0) -> tuple[int, int]:
    """Transpose a random ``rows x cols`` matrix with both kernels and check against NumPy."""
    for _, check in checks(rows, cols, seed):
        check()
    return rows, cols


def main() -> None:
    rows, cols = run()
    print(
        f"transpose of a {rows} x {cols} float32 matrix through padded (pitch {PADDED_SHAPE[1]}) "
        f"and unpadded (pitch {PLAIN_SHAPE[1]}) 32 x 32 shared tiles: equal to NumPy's src.T"
    )


if __name__ == "__main__":
    main()
