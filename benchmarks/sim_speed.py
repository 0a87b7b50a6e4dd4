"""Speed of tessera_tile's simulator against numba-cuda's own, side by side in one run.

A row-reduction kernel (one block of 128 threads per row, shared-memory tree, 64 rows of 256
float32) runs under both simulators on the same data; the script checks both results against
NumPy and prints the wall-clock times and their ratio. It re-executes itself with
NUMBA_ENABLE_CUDASIM=1 when needed.

    python benchmarks/sim_speed.py [--rows 64] [--threads 128] [--cols 256]
"""

import argparse
import os
import sys
import time

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    os.execv(sys.executable, [sys.executable, *sys.argv])

import numpy as np  # noqa: E402
from numba import cuda, float32  # noqa: E402

from tessera_tile import sim  # noqa: E402

THREADS = 128


@cuda.jit
def row_sum(x, out):
    partial = cuda.shared.array(THREADS, float32)
    row, t = cuda.blockIdx.x, cuda.threadIdx.x
    acc = float32(0)
    for j in range(t, x.shape[1], cuda.blockDim.x):
        acc += x[row, j]
    partial[t] = acc
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            partial[t] += partial[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        out[row] = partial[0]


def timed(x, threads):
    out = np.zeros(x.shape[0], np.float32)
    start = time.perf_counter()
    row_sum[x.shape[0], threads](x, out)
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--cols", type=int, default=256)
    parser.add_argument("--threads", type=int, default=THREADS, choices=[32, 64, 128])
    args = parser.parse_args()
    x = np.random.default_rng(0).standard_normal((args.rows, args.cols)).astype(np.float32)
    expected = x.sum(axis=1, dtype=np.float64)

    ours, out_ours = timed(x, args.threads)
    with sim.stock():
        stock, out_stock = timed(x, args.threads)
    for name, out in (("tessera_tile", out_ours), ("numba-cuda", out_stock)):
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4, err_msg=name)
    assert np.array_equal(out_ours, out_stock), "the two simulators disagree"

    print(f"row reduction, {args.rows} blocks x {args.threads} threads, {args.cols} float32/row")
    print(f"  numba-cuda simulator:   {stock:8.3f} s")
    print(f"  tessera_tile simulator: {ours:8.3f} s")
    print(f"  speed-up: {stock / ours:.1f}x (same results, checked against NumPy)")


if __name__ == "__main__":
    main()
