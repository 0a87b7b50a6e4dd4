"""Kernels launched from several host threads at once (issue 20): a GPU runs the launches of one
stream one after the other, and so does the simulator; a device function called by a running
kernel stays a call, not a launch, and host code of another thread keeps the real ``cuda``."""

import math
import threading

import numpy as np
import pytest
from helpers import back, on
from numba import cuda

import tessera_tile as tt

pytestmark = pytest.mark.sim_only(reason="the simulator's launch path under host threads")
ROUNDS = 3  # launches per thread: enough to overlap a launch with another thread's
THREADS = 4
N = 200  # elements: 2 blocks of 128 threads, the last one partial
EPS64 = np.finfo(np.float64).eps
EPS32 = np.finfo(np.float32).eps


@cuda.jit(device=True)
def twice(v):
    return v + v


@cuda.jit
def add_twice(x, y, out):
    """out = x + 2 y, through a device function."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + twice(y[i])


@cuda.jit
def block_sums(x, out):
    """One sum per block, through shared memory and a barrier."""
    partial = cuda.shared.array(128, np.float64)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    partial[t] = x[i] if i < x.size else 0.0
    cuda.syncthreads()
    if t == 0:
        total = 0.0
        for k in range(cuda.blockDim.x):
            total += partial[k]
        out[cuda.blockIdx.x] = total


@cuda.jit
def warp_max(x, out):
    """The maximum of each warp, by shuffles."""
    i = cuda.grid(1)
    v = x[i] if i < x.size else -np.inf
    for offset in (16, 8, 4, 2, 1):
        v = max(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, offset))
    if cuda.laneid == 0:
        out[i // 32] = v


def scaled_softmax(x):
    e = tt.exp(2 * x - tt.max(2 * x, axis=-1, keepdims=True))
    return e / tt.sum(e, axis=-1, keepdims=True)


def softmax_ref(x):
    x = x.astype(np.float64)
    e = np.exp(2 * x - (2 * x).max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _jobs(seed: int, side: str, fused) -> list:
    """(run, expected, rtol, atol) of one thread: kernels and a fused function on its own data.

    Adding and taking maxima are exact in float64. A sequential float64 sum of 128 values is
    within 127 eps of the sum of their magnitudes (the reference is exact: math.fsum). The
    float32 softmax is within 80 float32 eps of the float64 reference (its 70-term sum, up to
    70 eps, plus exp and the division, a few ulps).
    """
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal((2, N))
    rows = rng.standard_normal((3, 70)).astype(np.float32)

    def launch(kernel, blocks, *args):
        def run():
            # ``cuda`` of this module, where other threads' kernels run meanwhile
            *inputs, out = args if side == "host" else [cuda.to_device(a) for a in args]
            kernel[blocks, 128](*inputs, out)
            return out if side == "host" else out.copy_to_host()

        return run

    def fresh_kernel():
        # a kernel compiled while other threads' kernels of this module run (a memoised
        # factory's first call)
        return launch(cuda.jit(add_twice.py_func), 2, y, x, np.zeros(N))()

    padded = np.concatenate([x, np.full(2 * 128 - N, -np.inf)])
    blocks = (x[:128], x[128:])
    sum_atol = 127 * EPS64 * max(np.abs(b).sum() for b in blocks)
    return [
        (launch(add_twice, 2, x, y, np.zeros(N)), x + 2 * y, 0, 0),
        (fresh_kernel, y + 2 * x, 0, 0),
        (launch(block_sums, 2, x, np.zeros(2)), [math.fsum(b) for b in blocks], 0, sum_atol),
        (launch(warp_max, 2, x, np.zeros(8)), padded.reshape(8, 32).max(1), 0, 0),
        (lambda: back(fused(*on(side, rows)), side), softmax_ref(rows), 80 * EPS32, 0),
    ]


def test_threads_launching_at_once_get_numpys_results(side):
    fused = tt.fuse(scaled_softmax)  # new here: the threads' first calls compile it at once
    barrier = threading.Barrier(THREADS)
    errors: list = []

    def worker(seed):
        try:
            jobs = _jobs(seed, side, fused)
            barrier.wait()  # start together, so that launches overlap
            for _ in range(ROUNDS):
                for run, expected, rtol, atol in jobs:
                    np.testing.assert_allclose(run(), expected, rtol=rtol, atol=atol)
        except BaseException as e:  # reported by the test thread below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@cuda.jit
def uses_host_api(x):
    cuda.to_device(x)


def test_a_kernel_still_cannot_reach_the_host_api():
    # host code of other threads gets numba-cuda's names through the kernel's ``cuda``; a
    # kernel does not (a GPU does not compile ``cuda.to_device`` in a kernel)
    with pytest.raises(
        AttributeError, match="'WarpAwareModule' object has no attribute 'to_device'"
    ):
        uses_host_api[1, 1](np.zeros(1))
