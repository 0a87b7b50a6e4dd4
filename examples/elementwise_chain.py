"""A first custom kernel: ``y = tanh(a*b + c) * sigmoid(a*b + c) - a`` on float32 vectors.

A grid-stride loop, one element per thread per step. Two details that matter on a real GPU:

* Python float literals are float64 in Numba, so every constant is cast to float32; otherwise
  the sigmoid would compute in float64 (DADD/MUFU.RCP64H in the SASS).
* ``t`` is computed once and reused by both branches of the chain.

Run it with ``python examples/elementwise_chain.py`` (add ``NUMBA_ENABLE_CUDASIM=1`` without a GPU).
"""

import math

import numpy as np
from numba import cuda, float32

SIGNATURE = "void(float32[::1], float32[::1], float32[::1], float32[::1])"
ONE = float32(1.0)


@cuda.jit  # lazy: an eager signature would ask for a GPU at import time
def tanh_sigmoid_chain(a, b, c, out):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, out.shape[0], stride):
        t = a[i] * b[i] + c[i]
        out[i] = math.tanh(t) * (ONE / (ONE + math.exp(-t))) - a[i]


# (kernel, signature) pairs the demo compiles and reports.
KERNELS = [(tanh_sigmoid_chain, SIGNATURE)]


def reference(a, b, c):
    """NumPy reference, computed in float64 and rounded once."""
    t = a.astype(np.float64) * b + c
    return (np.tanh(t) / (1.0 + np.exp(-t)) - a).astype(np.float32)


def run(n: int = 1000, threads: int = 128, blocks: int = 4, seed: int = 0) -> float:
    """Launch the kernel on random data and return the largest error against NumPy."""
    rng = np.random.default_rng(seed)
    a, b, c = (rng.standard_normal(n, dtype=np.float32) for _ in range(3))
    out = np.zeros(n, dtype=np.float32)
    tanh_sigmoid_chain[blocks, threads](a, b, c, out)
    expected = reference(a, b, c)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    return float(np.max(np.abs(out - expected), initial=0.0))


def main() -> None:
    err = run()
    print(f"tanh(a*b+c)*sigmoid(a*b+c)-a, 1000 float32: max |error| vs NumPy = {err:.2e}")


if __name__ == "__main__":
    main()
