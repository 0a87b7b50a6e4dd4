"""mbarriers: a producer warp hands tiles to a consumer warp through full and empty barriers,
against NumPy; the twin's phases, parities and refusals."""

import numpy as np
import pytest
from helpers import on
from numba import cuda, float32, uint64

from tessera_tile import mbarrier, pipeline, sim

ALIGN = pipeline.SHARED_ALIGN
WIDTH = 32  # floats per tile: one per producer lane
STAGES = 2


@cuda.jit
def handoff(x, y):
    """Warp 0 copies tile k of ``x`` into stage k % 2 (cp.async; the copies' completion is the
    arrival on ``full``); warp 1 waits on ``full``, adds the tile into ``y`` and arrives on
    ``empty``, which the producer waits on before refilling the stage."""
    ring = cuda.shared.array((STAGES, WIDTH), float32, alignment=ALIGN)
    full = cuda.shared.array(STAGES, uint64)
    empty = cuda.shared.array(STAGES, uint64)
    warp, lane = cuda.threadIdx.x // 32, cuda.threadIdx.x % 32
    if cuda.threadIdx.x == 0:
        for s in range(STAGES):
            mbarrier.mbarrier_init(full, s, WIDTH)  # the producer's 32 copy arrivals
            mbarrier.mbarrier_init(empty, s, WIDTH)  # the consumer's 32 arrivals
    cuda.syncthreads()
    tiles = x.shape[0] // WIDTH
    if warp == 0:
        for k in range(tiles):
            s = k % STAGES
            mbarrier.mbarrier_wait(empty, s, ((k // STAGES) & 1) ^ 1)  # fresh: parity 1 passes
            pipeline.cp_async_4(ring, (s, lane), x, k * WIDTH + lane)
            mbarrier.cp_async_mbarrier_arrive(full, s)
    else:
        acc = float32(0)
        for k in range(tiles):
            s = k % STAGES
            mbarrier.mbarrier_wait(full, s, (k // STAGES) & 1)
            acc += ring[s, lane]
            mbarrier.mbarrier_arrive(empty, s)
        y[lane] = acc


def test_a_producer_warp_hands_tiles_to_a_consumer_warp(side):
    x = np.random.default_rng(0).standard_normal(7 * WIDTH).astype(np.float32)
    y = np.full(WIDTH, np.nan, np.float32)
    d_x, d_y = on(side, x, y)
    handoff[1, 64](d_x, d_y)
    got = d_y if side == "host" else d_y.copy_to_host()
    np.testing.assert_allclose(got, x.reshape(-1, WIDTH).sum(axis=0), rtol=1e-6, atol=1e-6)
    assert not np.isnan(x).any()


@cuda.jit
def no_full_wait(x, y):
    """The consumer reads the stage without waiting on ``full``."""
    ring = cuda.shared.array(WIDTH, float32, alignment=ALIGN)
    full = cuda.shared.array(1, uint64)
    if cuda.threadIdx.x == 0:
        mbarrier.mbarrier_init(full, 0, WIDTH)
    cuda.syncthreads()
    lane = cuda.threadIdx.x % 32
    if cuda.threadIdx.x < 32:
        pipeline.cp_async_4(ring, lane, x, lane)
        mbarrier.cp_async_mbarrier_arrive(full, 0)
    else:
        y[lane] = ring[lane]


@pytest.mark.sim_only(reason="the twin lands tracked copies as late as a GPU may: at the wait")
def test_reading_before_the_wait_sees_no_copy():
    x = np.ones(WIDTH, np.float32)
    y = np.zeros(WIDTH, np.float32)
    no_full_wait[1, 64](x, y)
    assert np.isnan(y).all()  # shared memory starts as NaN; the copies never landed


@cuda.jit
def phases(out):
    """Two arrivals a phase: the phase of parity 0 completes at the second, of parity 1 at the
    fourth; a fresh barrier's parity 1 counts as completed."""
    bar = cuda.shared.array(1, uint64)
    t = cuda.threadIdx.x
    if t == 0:
        mbarrier.mbarrier_init(bar, 0, 2)
        mbarrier.mbarrier_wait(bar, 0, 1)  # the phase before phase 0: completed
    cuda.syncthreads()
    mbarrier.mbarrier_arrive(bar, 0)
    mbarrier.mbarrier_wait(bar, 0, 0)
    out[t] = 1
    mbarrier.mbarrier_arrive(bar, 0)
    mbarrier.mbarrier_wait(bar, 0, 1)
    out[t] = 2


def test_phases_complete_after_the_expected_arrivals():
    out = np.zeros(2, np.int32)
    phases[1, 2](out)
    np.testing.assert_array_equal(out, [2, 2])


@cuda.jit
def waits_forever(out):
    bar = cuda.shared.array(1, uint64)
    if cuda.threadIdx.x == 0:
        mbarrier.mbarrier_init(bar, 0, 3)  # 3 arrivals expected, 2 threads arrive
    cuda.syncthreads()
    mbarrier.mbarrier_arrive(bar, 0)
    mbarrier.mbarrier_wait(bar, 0, 0)
    out[cuda.threadIdx.x] = 1


@cuda.jit
def unpublished(out):
    bar = cuda.shared.array(1, uint64)
    if cuda.threadIdx.x == 0:
        mbarrier.mbarrier_init(bar, 0, 2)
    mbarrier.mbarrier_arrive(bar, 0)  # thread 1: before the barrier that publishes the init
    out[cuda.threadIdx.x] = 1


@cuda.jit
def never_initialised(out):
    bar = cuda.shared.array(1, uint64)
    mbarrier.mbarrier_arrive(bar, 0)
    out[0] = 1


@cuda.jit
def bad_count(out, count):
    bar = cuda.shared.array(1, uint64)
    mbarrier.mbarrier_init(bar, 0, count)
    out[0] = 1


@cuda.jit
def bad_parity(out):
    bar = cuda.shared.array(1, uint64)
    mbarrier.mbarrier_init(bar, 0, 1)
    mbarrier.mbarrier_wait(bar, 0, 2)
    out[0] = 1


@cuda.jit
def global_barrier(bars):
    mbarrier.mbarrier_init(bars, 0, 1)


@pytest.mark.sim_only(reason="a GPU hangs or has undefined behaviour; the twin reports it")
@pytest.mark.parametrize(
    ("launch", "message"),
    [
        (lambda: waits_forever[1, 2](np.zeros(2, np.int32)), "deadlock: .*mbarrier_wait"),
        (lambda: unpublished[1, 2](np.zeros(2, np.int32)), "not visible yet"),
        (lambda: never_initialised[1, 1](np.zeros(1, np.int32)), "never initialised"),
        (lambda: bad_count[1, 1](np.zeros(1, np.int32), 0), "count 0 is not in"),
        (lambda: bad_count[1, 1](np.zeros(1, np.int32), 2**20), "is not in 1..1048575"),
        (lambda: bad_parity[1, 1](np.zeros(1, np.int32)), "parity must be 0 or 1"),
        (lambda: global_barrier[1, 1](np.zeros(1, np.uint64)), "lives in shared memory"),
    ],
    ids=["deadlock", "unpublished", "uninitialised", "count-0", "count-2^20", "parity", "global"],
)
def test_misuse_is_refused(launch, message):
    with pytest.raises(sim.SimulationError, match=message):
        launch()


@pytest.mark.sim_only(reason="the twin registry is the simulator's")
def test_twins_list_the_intrinsics():
    names = {name.rsplit(".", 1)[-1] for name in sim.twins() if ".mbarrier." in name}
    assert names == set(mbarrier.__all__)
