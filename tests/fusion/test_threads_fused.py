"""Fused functions and ops called from 8 host threads at once (issue 21): each thread traces,
plans and launches its own functions and shapes while the others do, then calls them again
(the kept calls); every result matches NumPy. Tracing state is per thread, and the program,
launch-plan and kernel caches are shared safely."""

import sys
import threading

import numpy as np
import pytest
from helpers import SIDES, back, on

import tessera_tile as tt
from tessera_tile import ops

THREADS = 8


def centred(x, scale):  # a mean: its COUNT leaf reads the trace in progress
    return (x - tt.mean(x, axis=-1, keepdims=True)) * scale


def normalised(x):
    return x / tt.sum(tt.abs(x), axis=-1, keepdims=True)


def jobs(seed: int, side: str):
    """(call, expected, rtol) for one thread: new fused functions (traced here, while the
    other threads trace theirs) and ops, on shapes of its own."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3 + seed, 17 + 5 * seed)).astype(np.float32)
    w = rng.standard_normal((17 + 5 * seed, 4)).astype(np.float32)
    placed, w_placed = on(side, x, w)
    f, g = tt.fuse(centred), tt.fuse(normalised)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return [
        (lambda: f(placed, 2.0), (x - x.mean(axis=-1, keepdims=True)) * 2, 1e-5),
        (lambda: g(placed), x / np.abs(x).sum(axis=-1, keepdims=True), 1e-5),
        (lambda: ops.softmax(placed), e / e.sum(axis=-1, keepdims=True), 1e-5),
        (lambda: ops.sum(placed, axis=0), x.sum(axis=0), 1e-5),
        (lambda: ops.linear(placed, w_placed, None, "relu"), np.maximum(x @ w, 0), 1e-5),
        (lambda: ops.transpose(placed), x.T, 0),
    ]


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.device_only
def test_eight_threads_trace_plan_and_launch_at_once(side):
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: inside tracing and planning too
    barrier = threading.Barrier(THREADS)
    errors: list = []

    def worker(seed):
        try:
            work = jobs(seed, side)
            barrier.wait()
            for _ in range(2):
                for call, expected, rtol in work:
                    got = back(call(), side)
                    np.testing.assert_allclose(got, expected, rtol=rtol, atol=1e-6)
        except BaseException as e:  # reported by the test thread below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(THREADS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    if errors:
        raise errors[0]
