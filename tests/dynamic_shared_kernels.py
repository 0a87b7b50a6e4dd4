"""A kernel on dynamic shared memory shared by the simulator and compile tiers of
tessera_tile.memory.carve."""

from numba import cuda, float32

from tessera_tile import memory

CARVED_BYTES = (64 * 65 + 32 * 32) * 4  # the two tiles: 20.5 KiB


@cuda.jit
def carved_tiles(x, out):
    """A 64 x 65 tile and a 32 x 32 one carved out of the dynamic shared memory (padded rows,
    a run-time offset): x's first 64 rows go through the first, its next 32 through the second."""
    smem = cuda.shared.array(0, float32)
    first = memory.carve(smem, 0, (64, 65))
    second = memory.carve(smem, 2 * x.shape[1] * 65, (32, 32))  # 64 x 65 elements on
    t = cuda.threadIdx.x
    for r in range(64):
        first[r, t] = x[r, t]
    for r in range(32):
        second[r, t] = x[64 + r, t]
    cuda.syncthreads()
    for r in range(32):
        out[t, r] = first[r, t] + second[r, t]
