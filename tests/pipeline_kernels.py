"""Ring-buffer kernels shared by the simulator and compile tiers of tessera_tile.pipeline."""

import functools

from numba import cuda, float32

from tessera_tile import pipeline

ALIGN = pipeline.SHARED_ALIGN


@functools.cache
def stream_sum_kernel(stages: int, async_copy: bool, width: int):
    """out[t] = sum_k x[k*width + t]: streams every tile of x through the ring."""
    ring_t = pipeline.ring_buffer(stages, (width,), float32, async_copy=async_copy)
    shape = ring_t.shape

    @cuda.jit
    def stream_sum(x, out):
        ring = cuda.shared.array(shape, float32, alignment=ALIGN)
        t = cuda.threadIdx.x
        ring_t.fill(ring, x)
        acc = float32(0)
        for k in range(ring_t.num_tiles(x)):
            s = ring_t.wait_tile(k)
            ring_t.load_tile(ring, x, k + ring_t.stages - 1)
            ring_t.commit()
            acc += ring[s, t]
        out[t] = acc

    return stream_sum
