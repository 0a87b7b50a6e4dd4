"""The smallest kernel: ``y = a * x + y`` on float32 vectors, in a grid-stride loop.

The README inspects it from the command line, offline (no GPU)::

    tessera-tile inspect examples/axpy.py:axpy \\
        --signature "void(float32, float32[::1], float32[::1])"

Run it with ``python examples/axpy.py`` (add ``NUMBA_ENABLE_CUDASIM=1`` without a GPU).
"""

import numpy as np
from numba import cuda

SIGNATURE = "void(float32, float32[::1], float32[::1])"


@cuda.jit  # lazy: an eager signature would ask for a GPU at import time
def axpy(a, x, y):
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        y[i] = a * x[i] + y[i]


# (kernel, signature) pairs the demo compiles and reports.
KERNELS = [(axpy, SIGNATURE)]


def run(n: int = 1000, a: float = 2.5, threads: int = 128, blocks: int = 4, seed: int = 0) -> float:
    """Launch the kernel on random data and return the largest error against NumPy."""
    rng = np.random.default_rng(seed)
    x, y = (rng.standard_normal(n, dtype=np.float32) for _ in range(2))
    ax, y64 = np.float64(np.float32(a)) * x, y.astype(np.float64)
    expected = ax + y64  # exact in float64
    axpy[blocks, threads](np.float32(a), x, y)
    # A GPU's FFMA rounds once, NumPy-style float32 (the simulator) twice: within one float32
    # epsilon of |a x| + |y| either way.
    err = np.abs(y - expected)
    assert np.all(err <= np.finfo(np.float32).eps * (np.abs(ax) + np.abs(y64))), err.max()
    return float(err.max(initial=0.0))


def main() -> None:
    print(f"y = 2.5 * x + y, 1000 float32: max |error| vs NumPy = {run():.2e}")


if __name__ == "__main__":
    main()
