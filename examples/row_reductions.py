"""Row-wise max and sum of a 2-D float32 array with tessera_tile's warp and block reductions.

Two ways to give rows to threads:

* ``row_max_sum_warp``: one warp per row, for short rows. A block is ``(32, W)`` threads: W warps,
  each lane strides along its row, then ``warp_max`` / ``warp_sum`` combine the 32 lanes with five
  shuffles each, with no shared memory and no barrier.
* ``row_max_sum_block``: one block per row, for long rows. Every thread strides along the row,
  then ``block_reduce`` combines warps through 32 slots of shared memory.

Both use grid-stride loops over rows, so any grid covers any number of rows. The max propagates
NaN like ``np.max``; an empty row has max -inf and sum 0. Constants are float32: a bare ``0.0``
would make the sum float64.

Run it with ``python examples/row_reductions.py`` (add ``NUMBA_ENABLE_CUDASIM=1`` without a GPU).
"""

import numpy as np
from numba import cuda, float32

from tessera_tile.warp import FULL_MASK, add, make_block_reduce, maximum, warp_max, warp_sum

SIGNATURE = "void(float32[:, ::1], float32[::1], float32[::1])"
ZERO = float32(0)
NEG_INF = float32(-np.inf)

block_max = make_block_reduce(maximum, float32)  # result in thread 0
block_sum = make_block_reduce(add, float32)


@cuda.jit  # lazy: an eager signature would ask for a GPU at import time
def row_max_sum_warp(x, row_max, row_sum):
    """One warp per row. Launch with ``blockDim == (32, W)``; any grid."""
    lane = cuda.threadIdx.x
    first = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
    stride = cuda.gridDim.x * cuda.blockDim.y
    n_rows, n_cols = x.shape
    # `row` is the same for the 32 lanes of a warp, so whole warps enter and leave the loop and
    # the full mask is right.
    row = first
    while row < n_rows:
        m = NEG_INF
        s = ZERO
        col = lane
        while col < n_cols:  # consecutive lanes read consecutive addresses
            v = x[row, col]
            m = maximum(m, v)
            s += v
            col += 32
        m = warp_max(m, FULL_MASK)
        s = warp_sum(s, FULL_MASK)
        if lane == 0:
            row_max[row] = m
            row_sum[row] = s
        row += stride


@cuda.jit
def row_max_sum_block(x, row_max, row_sum):
    """One block per row. Launch with a 1-D block of any size up to 1024; any grid."""
    t = cuda.threadIdx.x
    n_rows, n_cols = x.shape
    # `row` is uniform over the block, as the barriers inside block_max/block_sum require.
    row = cuda.blockIdx.x
    while row < n_rows:
        m = NEG_INF
        s = ZERO
        col = t
        while col < n_cols:
            v = x[row, col]
            m = maximum(m, v)
            s += v
            col += cuda.blockDim.x
        m = block_max(m)
        s = block_sum(s)
        if t == 0:
            row_max[row] = m
            row_sum[row] = s
        row += cuda.gridDim.x


# (kernel, signature) pairs the demo compiles and reports.
KERNELS = [(row_max_sum_warp, SIGNATURE), (row_max_sum_block, SIGNATURE)]


def reference(x):
    """NumPy reference: row max (NaN-propagating, -inf when empty) and float64 row sum."""
    return np.max(x, axis=1, initial=-np.inf), x.astype(np.float64).sum(axis=1)


def check(x, row_max, row_sum) -> float:
    """Assert against NumPy; return the largest relative error of the sums."""
    expected_max, expected_sum = reference(x)
    np.testing.assert_array_equal(row_max, expected_max.astype(np.float32))
    # Any summation order of float32 values errs by at most ~log2(n) * eps * sum|x|.
    scale = np.abs(x.astype(np.float64)).sum(axis=1) + np.finfo(np.float32).tiny
    depth = np.log2(max(x.shape[1], 2)) + 2
    err = np.abs(row_sum - expected_sum) / scale
    assert np.all(err <= depth * np.finfo(np.float32).eps), err.max()
    return float(err.max(initial=0.0))


def run(
    n_rows: int = 37, n_cols: int = 100, warps_per_block: int = 4, threads: int = 128, seed: int = 0
) -> float:
    """Launch both kernels on random data, assert against NumPy, return the largest sum error."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_rows, n_cols), dtype=np.float32)
    worst = 0.0
    row_max = np.zeros(n_rows, np.float32)
    row_sum = np.zeros(n_rows, np.float32)
    blocks = max(1, min(-(-n_rows // warps_per_block), 4))  # few blocks: exercise the row loop
    row_max_sum_warp[blocks, (32, warps_per_block)](x, row_max, row_sum)
    worst = max(worst, check(x, row_max, row_sum))
    row_max[:] = 0
    row_sum[:] = 0
    row_max_sum_block[max(1, min(n_rows, 3)), threads](x, row_max, row_sum)
    worst = max(worst, check(x, row_max, row_sum))
    return worst


def main() -> None:
    err = run()
    print(
        "row max and sum of a 37 x 100 float32 array, one warp per row and one block per row: "
        f"max equal to NumPy, sums within {err:.2e} (relative to sum|x|)"
    )


if __name__ == "__main__":
    main()
