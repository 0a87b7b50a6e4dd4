"""Tiled float32 matmul ``C = A @ B`` on a multi-stage ``cp.async`` ring buffer.

Each block computes a ``TILE_M x TILE_N`` (64 x 64) tile of ``C`` with 256 threads; each thread
keeps a ``4 x 4`` register tile of accumulators. The K axis is streamed through two ring buffers
from :mod:`tessera_tile.pipeline` (``TILE_K`` = 16 columns of A, 16 rows of B per step)::

              K                       64                           64
        +-----------+          +-------------+             +-------------+
     64 | A panel   |  x    K  |  B panel    |   =      64 |   C tile    |
        | ->  tiles |          |  |  tiles   |             | 16 x 16 thr |
        +-----------+          |  v          |             | 4 x 4 each  |
                               +-------------+             +-------------+

    prologue:      tiles 0 .. STAGES-2 of A and B in flight (one cp.async group per tile)
    steady state:  wait for tile k; issue tile k + STAGES-1 into the stage tile k-1 freed;
                   multiply tile k from shared memory into the register tile
    drain:         nothing to do: copies past the last tile are never issued, and the
                   (empty) groups still open at exit do not touch shared memory

Thread ``t`` (``tx = t % 16``, ``ty = t // 16``) owns rows ``ty + 16 * i`` and columns
``4 * tx + j`` of the C tile. Inner loop, per 4 steps of k: 4 ``LDS.128`` of A (a row of the A
tile, 4 consecutive k) and 4 ``LDS.128`` of B (a row of the B tile, 4 consecutive n) feed 64
FFMA, 8 FFMA per shared load. Both reads are conflict free without padding: the 8 lanes of a
quarter-warp read the same A vector (a broadcast) and 8 consecutive B vectors (128 contiguous
bytes). Padding would cost here: a pitch that is not a multiple of 4 floats breaks the 16-byte
alignment ``LDS.128`` needs (``Tile((64, 16), np.float32, pad="auto", access="row", vector=4)``
picks ``pad = 0``); the simulator profiler confirms 0 bank conflicts.

Edges: the rings zero-fill elements outside A and B (``cp.async`` with ``src_bytes < 16``), so
partial tiles multiply zeros (with 4-byte copies, ``src_bytes`` 0 or 4); C is written only
inside its bounds. Any M, N, K, including 0.

Variants (all ``void(float32[:, ::1], float32[:, ::1], float32[:, ::1])``; launch with
``grid(m, n, variant)`` blocks of ``CONFIGS[variant].threads`` (256) threads, or call
:func:`matmul`):

* ``matmul_sync``: 2 stages, synchronous loads and stores (any target);
* ``matmul_2stage``, ``matmul_3stage``: ``cp.async`` of 4 bytes per element (any shape);
* ``matmul_3stage_v16``: ``cp.async.cg`` of 16 bytes, when K and N are multiples of 4 (the rows
  of A and B are then 16-byte aligned); :func:`matmul` picks it when it can;
* ``matmul_3stage_8x8``: the shape of an expert hand-written CUDA C++ SIMT GEMM:
  128 x 128 x 8 block tile, 8 x 8 per thread, 16-byte copies: 16 FFMA per shared load, but
  128 (sm_80) / 164 (sm_90) registers.

A is kept row-major in shared memory (the rings copy it as it is in global memory), so a
thread reads A along k; ``docs/custom_kernels.md`` walks through this kernel.

This file is the teaching copy: 2-D, no epilogue, every variant spelled out. The shipped kernel
behind ``tessera_tile.ops.matmul`` / ``linear`` (``tessera_tile/kernels/matmul.py``) grows the
8 x 8 variant into a factory keyed by ``tessera_tile.TileConfig``: batched operands with
broadcast (stride-0) batches, 4- or 16-byte copies per operand, and a fused bias + activation
epilogue; ``docs/matmul.md`` describes it.

Run it with ``python examples/matmul.py`` (add ``NUMBA_ENABLE_CUDASIM=1`` without a GPU).
"""

from typing import NamedTuple

import numpy as np
from numba import cuda, float32

from tessera_tile.memory import Tile, aligned16, load16_shared, store16
from tessera_tile.pipeline import SHARED_ALIGN, ring_buffer

SIGNATURE = "void(float32[:, ::1], float32[:, ::1], float32[:, ::1])"
TILE_M = 64  # C tile of a block
TILE_N = 64
TILE_K = 16  # K step: columns of A / rows of B per ring stage
TM = 4  # register tile: rows of C per thread
TN = 4  # register tile: columns of C per thread (whole 16-byte vectors)
KV = 4  # k values per LDS.128 of A
THREADS = (TILE_M // TM) * (TILE_N // TN)  # 256
ZERO = float32(0.0)

# The rings write their shared tiles in row order, one copy per lane (16 or 4 bytes): with the
# pitch a multiple of 4 floats that is conflict free, and 'auto' padding finds nothing to add.
A_TILE = Tile((TILE_M, TILE_K), np.float32, pad="auto", access="row", vector=KV)
B_TILE = Tile((TILE_K, TILE_N), np.float32, pad="auto", access="row", vector=4)
assert A_TILE.pad == 0 and B_TILE.pad == 0


class Config(NamedTuple):
    """Block tile, register tile and pipeline of one kernel variant."""

    stages: int
    copy_bytes: int  # 4: any shape; 16: K and N multiples of 4
    async_copy: bool = True
    tile: tuple[int, int, int] = (TILE_M, TILE_N, TILE_K)
    regs: tuple[int, int] = (TM, TN)

    @property
    def threads(self) -> int:
        return (self.tile[0] // self.regs[0]) * (self.tile[1] // self.regs[1])


def _make_matmul(name: str, cfg: Config):
    """One matmul kernel for ``cfg`` (called once per variant, at import: never per call)."""
    tile_m, tile_n, tile_k = cfg.tile
    tm, tn = cfg.regs
    threads_m = tile_m // tm  # thread rows: a thread owns rows ty + threads_m * i
    threads_n = tile_n // tn
    span_n = threads_n * 4  # a thread owns columns h * span_n + 4 * tx + (0..3)
    ring_a = ring_buffer(
        cfg.stages, (tile_m, tile_k), float32, k_axis=1,
        async_copy=cfg.async_copy, copy_bytes=cfg.copy_bytes,
    )  # fmt: skip
    ring_b = ring_buffer(
        cfg.stages, (tile_k, tile_n), float32, k_axis=0,
        async_copy=cfg.async_copy, copy_bytes=cfg.copy_bytes,
    )  # fmt: skip
    a_shape = ring_a.shape  # (stages, tile_m, tile_k)
    b_shape = ring_b.shape  # (stages, tile_k, tile_n)
    ahead = cfg.stages - 1  # tiles in flight while one is consumed

    def kernel(a, b, c):
        sa = cuda.shared.array(a_shape, float32, alignment=SHARED_ALIGN)
        sb = cuda.shared.array(b_shape, float32, alignment=SHARED_ALIGN)
        # Local arrays indexed only by constants (loops over constants, which LLVM unrolls)
        # become registers: the compile tier checks there is no local memory.
        acc = cuda.local.array((tm, tn), float32)
        av = cuda.local.array((tm, KV), float32)
        bv = cuda.local.array(tn, float32)
        m, n = c.shape
        m0 = cuda.blockIdx.y * tile_m
        n0 = cuda.blockIdx.x * tile_n
        tx = cuda.threadIdx.x % threads_n
        ty = cuda.threadIdx.x // threads_n
        for i in range(tm):
            for j in range(tn):
                acc[i, j] = ZERO
        a_panel = a[m0 : m0 + tile_m, :]  # the rows of A this block needs
        b_panel = b[:, n0 : n0 + tile_n]  # the columns of B this block needs
        tiles = ring_a.num_tiles(a_panel)

        # Prologue: tiles 0 .. stages-2 in flight, one cp.async group per tile (A and B share it).
        for k in range(ahead):
            ring_a.load_tile(sa, a_panel, k)
            ring_b.load_tile(sb, b_panel, k)
            ring_a.commit()

        # Steady state.
        kt = 0
        while kt < tiles:  # a run-time bound: `while`, not range()
            s = ring_a.wait_tile(kt)  # tile kt has landed and every thread is done with kt - 1
            ring_a.load_tile(sa, a_panel, kt + ahead)  # refill the stage kt - 1 used
            ring_b.load_tile(sb, b_panel, kt + ahead)  # (no copy past the last tile)
            ring_a.commit()
            for kk in range(0, tile_k, KV):
                for i in range(tm):  # A[row, kk .. kk+3]: a quarter-warp reads one vector
                    v = load16_shared(sa, (s, ty + i * threads_m, kk))
                    for q in range(KV):
                        av[i, q] = v[q]
                for q in range(KV):
                    for h in range(tn // 4):  # B[kk+q, 4 columns]: 8 lanes, 128 bytes in a row
                        v = load16_shared(sb, (s, kk + q, h * span_n + tx * 4))
                        for j in range(4):
                            bv[h * 4 + j] = v[j]
                    for i in range(tm):
                        for j in range(tn):
                            acc[i, j] += av[i, q] * bv[j]
            kt += 1
        # Drain: nothing to wait for. Copies past the last tile were never issued, and the
        # groups still open hold none.

        # Epilogue: 16-byte stores where inside C and aligned, else element by element.
        for i in range(tm):
            row = m0 + ty + i * threads_m
            if row < m:
                for h in range(tn // 4):
                    col = n0 + h * span_n + tx * 4
                    j0 = h * 4
                    if col + 4 <= n and aligned16(c, (row, col)):
                        vals = (acc[i, j0], acc[i, j0 + 1], acc[i, j0 + 2], acc[i, j0 + 3])
                        store16(c, (row, col), vals)
                    else:
                        for j in range(4):
                            if col + j < n:
                                c[row, col + j] = acc[i, j0 + j]

    kernel.__name__ = kernel.__qualname__ = name
    return cuda.jit(kernel)  # lazy: an eager signature would ask for a GPU at import time


CONFIGS = {
    "sync": Config(stages=2, copy_bytes=4, async_copy=False),
    "2stage": Config(stages=2, copy_bytes=4),
    "3stage": Config(stages=3, copy_bytes=4),
    "3stage_v16": Config(stages=3, copy_bytes=16),
    # The shape of an expert hand-written SIMT GEMM: 128 x 128 x 8, 8 x 8 per thread.
    "3stage_8x8": Config(stages=3, copy_bytes=16, tile=(128, 128, 8), regs=(8, 8)),
}
matmul_sync = _make_matmul("matmul_sync", CONFIGS["sync"])
matmul_2stage = _make_matmul("matmul_2stage", CONFIGS["2stage"])
matmul_3stage = _make_matmul("matmul_3stage", CONFIGS["3stage"])
matmul_3stage_v16 = _make_matmul("matmul_3stage_v16", CONFIGS["3stage_v16"])
matmul_3stage_8x8 = _make_matmul("matmul_3stage_8x8", CONFIGS["3stage_8x8"])
VARIANTS = {
    "sync": matmul_sync,
    "2stage": matmul_2stage,
    "3stage": matmul_3stage,
    "3stage_v16": matmul_3stage_v16,
    "3stage_8x8": matmul_3stage_8x8,
}

# (kernel, signature) pairs the demo compiles and reports.
KERNELS = [(kernel, SIGNATURE) for kernel in VARIANTS.values()]


def reference(a, b):
    """NumPy reference, accumulated in float64."""
    return a.astype(np.float64) @ b


def grid(m: int, n: int, variant: str = "3stage") -> tuple[int, int]:
    """Blocks for an ``m x n`` C: x over tile columns, y over tile rows."""
    tile_m, tile_n, _ = CONFIGS[variant].tile
    return (-(-n // tile_n), -(-m // tile_m))


def vectorizable(a, b) -> bool:
    """Can a 16-byte-copy variant run: does every row of A and B start 16-byte aligned?"""
    return all(x.shape[1] % 4 == 0 and x.ctypes.data % 16 == 0 for x in (a, b))


def matmul(a, b, variant: str = "auto"):
    """``a @ b`` for 2-D float32 arrays with one of :data:`VARIANTS`; returns a new array.

    ``"auto"`` takes ``3stage_v16`` when :func:`vectorizable`, else ``3stage``. A variant is
    launched with :func:`grid` blocks of ``CONFIGS[variant].threads`` threads.
    """
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul needs (M, K) @ (K, N), got {a.shape} @ {b.shape}")
    if variant == "auto":
        variant = "3stage_v16" if vectorizable(a, b) else "3stage"
    if variant not in VARIANTS:
        raise ValueError(f"variant must be 'auto' or one of {sorted(VARIANTS)}, got {variant!r}")
    if CONFIGS[variant].copy_bytes == 16 and not vectorizable(a, b):
        raise ValueError(f"{variant} needs K and N multiples of 4 and 16-byte aligned arrays")
    m, n = a.shape[0], b.shape[1]
    c = np.full((m, n), np.nan, np.float32)  # NaN: an element the kernel misses fails the check
    if m and n:
        VARIANTS[variant][grid(m, n, variant), CONFIGS[variant].threads](a, b, c)
    return c


def run(m: int = 70, n: int = 67, k: int = 37, variant: str = "auto", seed: int = 0) -> float:
    """Multiply random ``m x k`` and ``k x n`` matrices, check against NumPy (rtol and atol
    1e-4) and return the largest error."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c, expected = matmul(a, b, variant), reference(a, b)
    np.testing.assert_allclose(c, expected, rtol=1e-4, atol=1e-4)
    return float(np.max(np.abs(c - expected), initial=0.0))


# (m, n, k) each variant runs at in the demo: edges in every dimension, two block rows and one
# block column (each simulated block costs seconds; 16-byte variants need N and K multiples of 4)
DEMO_SIZES = {
    "sync": (70, 35, 37),
    "2stage": (70, 35, 37),
    "3stage": (70, 35, 37),
    "3stage_v16": (70, 36, 36),
    "3stage_8x8": (70, 36, 36),
}


def checks() -> list:
    """``(label, check)`` per variant: ``check()`` runs it at its demo size against NumPy."""
    return [
        (f"matmul_{variant} ({m}x{k} @ {k}x{n})", lambda m=m, n=n, k=k, v=variant: run(m, n, k, v))
        for variant, (m, n, k) in DEMO_SIZES.items()
    ]


def main() -> None:
    for label, check in checks():
        print(f"{label} float32 equal to NumPy (rtol 1e-4), max |error| {check():.2e}")


if __name__ == "__main__":
    main()
