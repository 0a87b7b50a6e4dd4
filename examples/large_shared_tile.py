"""A kernel that needs more than 48 KiB of shared memory: dynamic shared memory and the opt-in.

Each block stages a 64 x 256 float32 panel of ``x`` (64 KiB) in shared memory with coalesced
loads, then each thread walks one column of the panel and writes its running sum down the rows:
``out`` is the cumulative sum of ``x`` along axis 0 within each 64-row panel::

    x panel (64 x 256)  --coalesced-->  shared, 64 KiB  --column walks-->  out panel

Static ``cuda.shared.array`` is capped at 48 KiB per block, so the panel lives in *dynamic*
shared memory: ``cuda.shared.array(0, float32)`` is the memory the launch provides.
``tessera_tile.dynamic_shared.launch`` opts the kernel in (numba-cuda has no API for it) and
launches it with the panel's bytes. The simulator refuses the same launch without the opt-in,
as a GPU does.

Run it with ``python examples/large_shared_tile.py`` (add ``NUMBA_ENABLE_CUDASIM=1`` without a
GPU).
"""

import numpy as np
from numba import cuda, float32

from tessera_tile import dynamic_shared

PANEL_ROWS, PANEL_COLS = 64, 256
THREADS = 256  # one column of the panel each
PANEL_BYTES = PANEL_ROWS * PANEL_COLS * 4  # 64 KiB: over the 48 KiB static limit
SIGNATURE = "void(float32[:, ::1], float32[:, ::1])"
ZERO = float32(0.0)


@cuda.jit  # lazy: an eager signature would ask for a GPU at import time
def panel_cumsum(x, out):
    panel = cuda.shared.array(0, float32)  # PANEL_ROWS x PANEL_COLS, row-major
    rows, cols = x.shape
    r0 = cuda.blockIdx.y * PANEL_ROWS
    c0 = cuda.blockIdx.x * PANEL_COLS
    col = cuda.threadIdx.x
    for r in range(PANEL_ROWS):  # coalesced: a warp reads 32 adjacent floats of one row
        inside = r0 + r < rows and c0 + col < cols
        panel[r * PANEL_COLS + col] = x[r0 + r, c0 + col] if inside else ZERO
    cuda.syncthreads()
    total = ZERO
    for r in range(PANEL_ROWS):
        total += panel[r * PANEL_COLS + col]
        if r0 + r < rows and c0 + col < cols:
            out[r0 + r, c0 + col] = total


# (kernel, signature) pairs the demo compiles and reports.
KERNELS = [(panel_cumsum, SIGNATURE)]


def reference(x: np.ndarray) -> np.ndarray:
    """NumPy: the cumulative sum along axis 0 within each 64-row panel, in float32."""
    out = np.empty_like(x)
    for r0 in range(0, x.shape[0], PANEL_ROWS):
        out[r0 : r0 + PANEL_ROWS] = np.cumsum(x[r0 : r0 + PANEL_ROWS], axis=0, dtype=np.float32)
    return out


def panel_sums(x):
    """``x`` (2-D float32, host or device) -> its panel cumulative sums (a new array)."""
    host = isinstance(x, np.ndarray)
    out = np.empty(x.shape, np.float32) if host else cuda.device_array(x.shape, np.float32)
    if x.size:
        grid = (-(-x.shape[1] // PANEL_COLS), -(-x.shape[0] // PANEL_ROWS))
        dynamic_shared.launch(panel_cumsum, grid, THREADS, PANEL_BYTES, (x, out))
    return out


def run(rows: int = 70, cols: int = 300, seed: int = 0) -> float:
    """Run on host and device arrays; assert each equals NumPy's sums (the same float32 additions
    in the same order, so bit for bit); return the largest error."""
    x = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    want = reference(x)
    worst = 0.0
    for got in (panel_sums(x), panel_sums(cuda.to_device(x)).copy_to_host()):
        np.testing.assert_array_equal(got, want)
        worst = max(worst, float(np.max(np.abs(got - want), initial=0.0)))
    return worst


if __name__ == "__main__":
    print(f"largest error against NumPy: {run():.3g}")
