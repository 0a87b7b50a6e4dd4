"""The simulator profiler: exact global traffic, bank conflicts, races, out-of-bounds accesses."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda, float32

from tessera_tile import sim

pytestmark = pytest.mark.sim_only(reason="the profiler exists in the simulator only")


@cuda.jit
def copy(x, y):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i]


@given(n=st.sampled_from([0, 1, 31, 32, 33, 100]))
def test_copy_traffic_is_exact(n):
    x = np.arange(n, dtype=np.float32)
    y = np.zeros(n, np.float32)
    with sim.profile() as prof:
        copy[2, 64](x, y)
    assert prof.bytes_read == 4 * n and prof.bytes_written == 4 * n
    assert prof.traffic[("copy", "x")] == [4 * n, 0] and prof.traffic[("copy", "y")] == [0, 4 * n]
    np.testing.assert_array_equal(x, y)
    assert "copy" in str(prof) and prof.launches == 1


@cuda.jit
def strided_row_sum(x, out):
    r = cuda.grid(1)
    if r < x.shape[0]:
        acc = x[r, 0]
        for j in range(1, x.shape[1]):
            acc += x[r, j]
        out[r] = acc


def test_traffic_of_a_non_contiguous_view_counts_elements():
    base = np.arange(60, dtype=np.float64).reshape(6, 10)
    view = cuda.to_device(base)[::2, 1::3]  # 3 x 3, a strided view of device memory
    out = np.zeros(3)
    with sim.profile() as prof:
        strided_row_sum[1, 32](view, out)
    assert prof.bytes_read == 9 * 8 and prof.bytes_written == 3 * 8
    np.testing.assert_allclose(out, base[::2, 1::3].sum(axis=1))


def make_transpose(cols):
    @cuda.jit
    def transpose(x, y):
        tile = cuda.shared.array((32, cols), float32)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        tile[ty, tx] = x[ty, tx]
        cuda.syncthreads()
        y[ty, tx] = tile[tx, ty]

    return transpose


@pytest.mark.parametrize("cols, conflicts", [(32, 32 * 31), (33, 0)])
def test_transpose_bank_conflicts(cols, conflicts):
    x = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    y = np.zeros_like(x)
    with sim.profile() as prof:
        make_transpose(cols)[1, (32, 32)](x, y)
    np.testing.assert_array_equal(y, x.T)
    # 32 warps each write a row (1 wavefront) and read a column: 32 wavefronts with a 32-float
    # row pitch (31 extra), 1 with 33.
    assert prof.shared_requests == 64
    assert prof.bank_conflicts == conflicts
    assert prof.bytes_read == prof.bytes_written == 32 * 32 * 4
    assert not prof.races
    if conflicts:
        assert "extra wavefronts" in str(prof)


def test_wavefront_model():
    # 8-byte accesses by 32 lanes to consecutive doubles: 2 half-warp phases, conflict free.
    assert sim.wavefronts([(lane, 8 * lane, 8) for lane in range(32)]) == (2, 2)
    # 16-byte accesses, consecutive: 4 quarter-warp phases.
    assert sim.wavefronts([(lane, 16 * lane, 16) for lane in range(32)]) == (4, 4)
    # All lanes read one word: a broadcast, 1 wavefront.
    assert sim.wavefronts([(lane, 0, 4) for lane in range(32)]) == (1, 1)
    # Stride of 2 words: 2-way conflict.
    assert sim.wavefronts([(lane, 8 * lane, 4) for lane in range(32)]) == (2, 1)


def make_neighbour_shift(with_barrier):
    @cuda.jit
    def shift(x, y):
        s = cuda.shared.array(64, float32)
        t = cuda.threadIdx.x
        s[t] = x[t]
        if with_barrier:
            cuda.syncthreads()
        y[t] = s[(t + 1) % 64]

    return shift


def test_missing_syncthreads_is_a_race_and_the_fix_is_not():
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(64, np.float32)
    with sim.profile() as prof:
        make_neighbour_shift(False)[1, 64](x, y)
    assert prof.races, "the racy kernel must be reported"
    race = prof.races[0]
    assert race.kind in ("write-read", "read-write")
    assert "test_sim_profile.py" in race.first_line and "test_sim_profile.py" in race.second_line
    with sim.profile() as prof:
        make_neighbour_shift(True)[1, 64](x, y)
    assert prof.races == []
    np.testing.assert_array_equal(y, np.roll(x, -1))


def make_mixed_width_exchange(read_at, with_barrier):
    """Thread 0 writes the float32 at bytes 4..7 of dynamic shared memory; thread 32 (another
    warp) reads the uint16 at bytes ``2 * read_at``.. through a second dynamic view."""

    @cuda.jit
    def exchange(y):
        words = cuda.shared.array(0, float32)
        halves = cuda.shared.array(0, np.uint16)
        t = cuda.threadIdx.x
        if t == 32:
            halves[0] = 0
            halves[1] = 0
        if t == 0:
            words[1] = 1.0
        if with_barrier:
            cuda.syncthreads()
        if t == 32:
            y[0] = halves[read_at]

    return exchange


@pytest.mark.parametrize(
    ("read_at", "with_barrier", "racy"),
    [(2, False, True), (3, False, True), (0, False, False), (2, True, False)],
)
def test_races_through_dynamic_views_of_other_widths(read_at, with_barrier, racy):
    """A byte is one byte whatever view touches it: a uint16 read of a float32 written by
    another warp races without a barrier, and only where their bytes overlap."""
    y = np.zeros(1, np.uint16)
    with sim.profile() as prof:
        make_mixed_width_exchange(read_at, with_barrier)[1, 64, 0, 16](y)
    assert bool(prof.races) == racy, str(prof)
    if with_barrier:
        assert y[0] == np.array([1.0], np.float32).view(np.uint16)[read_at - 2]


@cuda.jit
def warp_synchronous_exchange(y):
    s = cuda.shared.array(32, float32)
    lane = cuda.threadIdx.x
    s[lane] = lane
    cuda.syncwarp()
    y[lane] = s[31 - lane]


def test_syncwarp_orders_accesses_within_a_warp():
    y = np.zeros(32, np.float32)
    with sim.profile() as prof:
        warp_synchronous_exchange[1, 32](y)
    assert prof.races == []
    np.testing.assert_array_equal(y, np.arange(31, -1, -1))


@cuda.jit
def atomic_histogram(x, bins):
    counts = cuda.shared.array(4, np.int32)
    t = cuda.threadIdx.x
    if t < 4:
        counts[t] = 0
    cuda.syncthreads()
    cuda.atomic.add(counts, x[t] % 4, 1)
    cuda.syncthreads()
    if t < 4:
        bins[t] = counts[t]


def test_atomics_are_not_races():
    x = np.arange(64, dtype=np.int32)
    bins = np.zeros(4, np.int32)
    with sim.profile() as prof:
        atomic_histogram[1, 64](x, bins)
    assert prof.races == []
    np.testing.assert_array_equal(bins, [16] * 4)


@cuda.jit
def unguarded_write(x, y):
    i = cuda.grid(1)
    y[i] = x[i % x.shape[0]] + 1


def test_out_of_bounds_write_is_reported_without_corruption():
    x = np.arange(10, dtype=np.float32)
    backing = np.full(16, -1.0, np.float32)
    y = backing[:10]
    with sim.profile() as prof:
        unguarded_write[1, 12](x, y)
    assert len(prof.out_of_bounds) == 2
    oob = prof.out_of_bounds[0]
    assert oob.write and oob.space == "global" and oob.array == "y" and oob.index == 10
    assert oob.thread == (10, 0, 0) and "test_sim_profile.py" in oob.line
    np.testing.assert_array_equal(y, x + 1)
    np.testing.assert_array_equal(backing[10:], -1.0)  # the memory after y is untouched
    assert "out-of-bounds" in str(prof)
