"""Races on global memory (issue 40, item 3): two threads of one launch, in one block or in
two, touching the same address without an atomic or anything ordering them. Only a fence and
an atomic order two blocks (CUDA's threadFenceReduction "last block" pattern)."""

import numpy as np
import pytest
from numba import cuda, float32, int32

from tessera_tile import sim

pytestmark = pytest.mark.sim_only(reason="the profiler exists in the simulator only")


@cuda.jit
def racy_sum(x, out):
    out[0] += x[cuda.grid(1)]


@cuda.jit
def atomic_sum(x, out):
    cuda.atomic.add(out, 0, x[cuda.grid(1)])


def test_many_threads_adding_into_one_element_race_and_atomics_do_not():
    x = np.arange(64, dtype=np.float32)
    out = np.zeros(1, np.float32)
    with sim.profile() as prof:
        racy_sum[2, 32](x, out)
    kinds = {r.kind for r in prof.races}
    assert {"write-write", "write-read"} <= kinds, str(prof)
    assert all(r.space == "global" and r.array == "out" for r in prof.races)
    assert "race on global array out" in str(prof.races[0])
    assert "0 in shared memory (within a block), 2 in global memory" in str(prof)
    out[0] = 0
    with sim.profile() as prof:
        atomic_sum[2, 32](x, out)
    assert prof.races == [] and out[0] == x.sum()


@cuda.jit
def neighbour_exchange(x, y, tmp, barrier):
    t = cuda.threadIdx.x
    tmp[t] = x[t] * 2
    if barrier:
        cuda.syncthreads()
    y[t] = tmp[(t + 1) % 64]


@pytest.mark.parametrize("barrier", [False, True])
def test_a_barrier_orders_global_accesses_within_a_block(barrier):
    x = np.arange(64, dtype=np.float32)
    y, tmp = np.zeros(64, np.float32), np.zeros(64, np.float32)
    with sim.profile() as prof:
        neighbour_exchange[1, 64](x, y, tmp, barrier)
    assert bool(prof.races) != barrier, str(prof)
    if barrier:
        np.testing.assert_array_equal(y, np.roll(x, -1) * 2)
    else:
        assert {r.kind for r in prof.races} <= {"write-read", "read-write"}
        assert all(r.first_block == r.second_block == (0, 0, 0) for r in prof.races)


@cuda.jit
def last_block_sum(x, partial, count, out, fence):
    """Each block writes its partial sum; the block that counts itself last adds them up."""
    ticket = cuda.shared.array(1, int32)
    t, b = cuda.threadIdx.x, cuda.blockIdx.x
    if t == 0:
        partial[b] = x[2 * b] + x[2 * b + 1]
        if fence:
            cuda.threadfence()
        ticket[0] = cuda.atomic.add(count, 0, 1)
    cuda.syncthreads()
    if ticket[0] == cuda.gridDim.x - 1 and t == 1:  # not the thread that counted
        total = float32(0)
        for j in range(cuda.gridDim.x):
            total += partial[j]
        out[0] = total


@pytest.mark.parametrize("fence", [True, False])
def test_a_fence_then_an_atomic_orders_blocks_and_without_the_fence_it_is_a_race(fence):
    x = np.arange(32, dtype=np.float32)
    partial, count, out = np.zeros(16, np.float32), np.zeros(1, np.int32), np.zeros(1, np.float32)
    with sim.profile() as prof:
        last_block_sum[16, 32](x, partial, count, out, fence)
    assert out[0] == x.sum()
    if fence:
        assert prof.races == [], str(prof)
    else:
        (race,) = prof.races
        assert (race.kind, race.space, race.array) == ("write-read", "global", "partial")
        assert race.first_block != race.second_block == (15, 0, 0)


@cuda.jit
def every_block_writes_row_zero(y):
    y[0, cuda.threadIdx.x] = cuda.blockIdx.x


def test_two_blocks_writing_one_address_race():
    y = np.zeros((1, 32), np.float32)
    with sim.profile() as prof:
        every_block_writes_row_zero[3, 32](y)
    assert [r.kind for r in prof.races] == ["write-write"]
    assert prof.races[0].first_block == (0, 0, 0) and prof.races[0].second_block == (1, 0, 0)
