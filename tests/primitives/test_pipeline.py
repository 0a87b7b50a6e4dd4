"""Ring buffers and cp.async twins: streamed K-loops against NumPy, missing waits, traffic."""

import functools

import numpy as np
import pytest
from helpers import on
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda, float32
from numba.types import float16
from pipeline_kernels import stream_sum_kernel

import tessera_tile  # noqa: F401 - installs the warp-aware simulator
from tessera_tile import pipeline, sim

ALIGN = pipeline.SHARED_ALIGN
WIDTH = 32  # 1-d tile: one float per thread of a 32-thread block
ROWS, COLS = 4, 8  # 2-d tile


def stream_sum_reference(x: np.ndarray) -> np.ndarray:
    padded = np.zeros(-(-x.size // WIDTH) * WIDTH, np.float32)
    padded[: x.size] = x
    return padded.reshape(-1, WIDTH).sum(axis=0, dtype=np.float32)


@functools.cache
def stream_copy_kernel(stages: int, async_copy: bool, k_axis: int, copy_bytes: int, on_load=None):
    """y = x (``on_load(x)``), one (ROWS, COLS) tile at a time; block b streams panel b along
    k_axis."""
    ring_t = pipeline.ring_buffer(
        stages, (ROWS, COLS), float32, k_axis=k_axis, async_copy=async_copy,
        copy_bytes=copy_bytes, on_load=on_load,
    )  # fmt: skip
    shape = ring_t.shape

    @cuda.jit
    def stream_copy(x, y):
        ring = cuda.shared.array(shape, float32, alignment=ALIGN)
        b = cuda.blockIdx.x
        if k_axis == 1:
            src = x[b * ROWS : (b + 1) * ROWS, :]
            dst = y[b * ROWS : (b + 1) * ROWS, :]
        else:
            src = x[:, b * COLS : (b + 1) * COLS]
            dst = y[:, b * COLS : (b + 1) * COLS]
        ring_t.fill(ring, src)
        t = cuda.threadIdx.x
        r = t // COLS
        c = t % COLS
        for k in range(ring_t.num_tiles(src)):
            s = ring_t.wait_tile(k)
            ring_t.load_tile(ring, src, k + ring_t.stages - 1)
            ring_t.commit()
            gr = r + (k * ROWS if k_axis == 0 else 0)
            gc = c + (k * COLS if k_axis == 1 else 0)
            if gr < src.shape[0] and gc < src.shape[1]:
                dst[gr, gc] = ring[s, r, c]

    return stream_copy


def run_stream_copy(x, stages, async_copy, k_axis, copy_bytes, on_load=None):
    y = np.full(x.shape, -7.0, np.float32)
    extent = x.shape[0] if k_axis == 1 else x.shape[1]
    blocks = max(1, -(-extent // (ROWS if k_axis == 1 else COLS)))
    kernel = stream_copy_kernel(stages, async_copy, k_axis, copy_bytes, on_load)
    kernel[blocks, ROWS * COLS](x, y)
    return y


def around(n: int) -> list[int]:
    return [n - 1, n, n + 1]


@given(
    stages=st.sampled_from([2, 3, 4]),
    async_copy=st.booleans(),
    n=st.sampled_from([0, 1, *around(WIDTH), *around(2 * WIDTH), *around(4 * WIDTH), 5 * WIDTH]),
)
def test_stream_sum_matches_numpy(stages, async_copy, n):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    out = np.zeros(WIDTH, np.float32)
    stream_sum_kernel(stages, async_copy, WIDTH)[1, WIDTH](x, out)
    np.testing.assert_allclose(out, stream_sum_reference(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("async_copy", [True, False])
def test_every_stage_count_streams_many_tiles(stages, async_copy):
    x = np.arange(7 * WIDTH + 3, dtype=np.float32)
    out = np.zeros(WIDTH, np.float32)
    stream_sum_kernel(stages, async_copy, WIDTH)[1, WIDTH](x, out)
    np.testing.assert_array_equal(out, stream_sum_reference(x))


@given(
    stages=st.sampled_from([2, 3, 4]),
    async_copy=st.booleans(),
    k_axis=st.sampled_from([0, 1]),
    rows=st.sampled_from([1, ROWS - 1, ROWS, ROWS + 1, 2 * ROWS + 1]),
    col_vectors=st.sampled_from([1, 2, 3, 4, 5]),  # columns in whole 16-byte vectors
)
def test_stream_copy_16_byte_copies(stages, async_copy, k_axis, rows, col_vectors):
    x = np.random.default_rng(rows).standard_normal((rows, 4 * col_vectors)).astype(np.float32)
    np.testing.assert_array_equal(run_stream_copy(x, stages, async_copy, k_axis, 16), x)


@given(
    stages=st.sampled_from([2, 3, 4]),
    async_copy=st.booleans(),
    k_axis=st.sampled_from([0, 1]),
    rows=st.sampled_from([1, ROWS - 1, ROWS, ROWS + 1, 2 * ROWS + 1]),
    cols=st.sampled_from([1, COLS - 1, COLS, COLS + 1, 2 * COLS + 3]),
)
def test_stream_copy_4_byte_copies_any_width(stages, async_copy, k_axis, rows, cols):
    x = np.random.default_rng(cols).standard_normal((rows, cols)).astype(np.float32)
    np.testing.assert_array_equal(run_stream_copy(x, stages, async_copy, k_axis, 4), x)


@cuda.jit(device=True)
def doubled(v):
    return float32(v) * float32(2.0)


@pytest.mark.parametrize("k_axis", [0, 1])
def test_on_load_converts_each_element_of_a_synchronous_ring(k_axis):
    """float16 into a float32 ring, doubled on the way in; a partial last tile."""
    x = np.random.default_rng(k_axis).standard_normal((ROWS + 1, COLS + 3)).astype(np.float16)
    got = run_stream_copy(x, 2, False, k_axis, 4, doubled)
    np.testing.assert_array_equal(got, x.astype(np.float32) * 2)


# --- the cp.async intrinsics directly -----------------------------------------------------


def make_copy_kernel(wait: bool, commit: bool = True):
    @cuda.jit
    def copy_through_shared(x, y):
        buf = cuda.shared.array(64, float32, alignment=ALIGN)
        t = cuda.threadIdx.x
        pipeline.cp_async_16(buf, 4 * t, x, 4 * t)  # 4 floats per thread, 16 threads
        if commit:
            pipeline.cp_async_commit_group()
        if wait:
            pipeline.cp_async_wait_group(0)
        cuda.syncthreads()
        for j in range(4):
            y[4 * t + j] = buf[4 * t + j]

    return copy_through_shared


copy_with_wait = make_copy_kernel(wait=True)
copy_without_wait = make_copy_kernel(wait=False)
copy_without_commit = make_copy_kernel(wait=True, commit=False)


def test_cp_async_with_wait_lands():
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(64, np.float32)
    copy_with_wait[1, 16](x, y)
    np.testing.assert_array_equal(y, x)


@pytest.mark.sim_only(reason="on a GPU an unwaited copy lands some time; the twin: never")
@pytest.mark.parametrize("kernel", [copy_without_wait, copy_without_commit])
def test_cp_async_without_wait_never_lands(kernel):
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(64, np.float32)
    kernel[1, 16](x, y)
    assert np.isnan(y).all()  # the simulator's shared memory reads as NaN until written


@cuda.jit
def groups_land_in_order(x, y):
    buf = cuda.shared.array(12, float32, alignment=ALIGN)
    for g in range(3):  # three groups of one 16-byte copy each
        pipeline.cp_async_16(buf, 4 * g, x, 4 * g)
        pipeline.cp_async_commit_group()
    pipeline.cp_async_wait_group(2)  # the oldest group only
    y[0] = buf[0]
    y[1] = buf[4]
    pipeline.cp_async_wait_group(1)
    y[2] = buf[4]
    y[3] = buf[8]
    pipeline.cp_async_wait_all()
    y[4] = buf[8]


@pytest.mark.sim_only(reason="observes when each group lands, which only the twin controls")
def test_wait_group_lands_all_but_the_newest_n():
    x = np.arange(12, dtype=np.float32)
    y = np.zeros(5, np.float32)
    groups_land_in_order[1, 1](x, y)
    assert y[0] == 0 and np.isnan(y[1])
    assert y[2] == 4 and np.isnan(y[3])
    assert y[4] == 8


@cuda.jit
def zfill_copies(x, y):
    buf = cuda.shared.array(16, float32, alignment=ALIGN)
    pipeline.cp_async_16_zfill(buf, 0, x, 0, 8)  # 2 floats read, 2 zeroed
    pipeline.cp_async_cg_16_zfill(buf, 4, x, 4, 0)  # nothing read, 4 zeroed
    pipeline.cp_async_8(buf, 8, x, 8)
    pipeline.cp_async_4(buf, 10, x, 10)
    pipeline.cp_async_cg_16(buf, 12, x, 12)
    pipeline.cp_async_wait_all()
    for i in range(11):
        y[i] = buf[i]
    for i in range(12, 16):
        y[i] = buf[i]


def test_every_copy_width_and_zero_fill():
    x = np.arange(1, 17, dtype=np.float32)
    y = np.full(16, -1.0, np.float32)
    zfill_copies[1, 1](x, y)
    expected = x.copy()
    expected[2:8] = 0
    expected[11] = -1
    np.testing.assert_array_equal(y, expected)


@cuda.jit
def copy_at(x, offsets, nbytes, y):
    """Thread t: 16 bytes ``offsets[t]`` elements from ``x[0, 0, 0]`` into ``y[t]``."""
    buf = cuda.shared.array((4, 8), float16, alignment=ALIGN)
    t = cuda.threadIdx.x
    pipeline.cp_async_cg_16_zfill_at(buf, (t, 0), x, offsets[t], nbytes[t])
    pipeline.cp_async_wait_all()
    for i in range(8):
        y[t, i] = buf[t, i]


@cuda.jit
def copy_at_pair(x, offsets, nbytes, y):
    """copy_at with each offset as a pair: 40 elements back, then ``offsets[t] + 40``."""
    buf = cuda.shared.array((4, 8), float16, alignment=ALIGN)
    t = cuda.threadIdx.x
    pipeline.cp_async_cg_16_zfill_at(buf, (t, 0), x, (offsets[t] + 40, -40), nbytes[t])
    pipeline.cp_async_wait_all()
    for i in range(8):
        y[t, i] = buf[t, i]


# Offsets count elements from the first element of a view, through the allocation's memory.
# The view: row 2 of each batch of a (2, 3, 12) float16 array (batches of 72 bytes); its first
# element is element 24 of the allocation.
AT_CASES = (  # (offset, bytes read)
    (8, 16),  # across the row's end, out of the view: batch 1's row 0
    (-24, 16),  # before the view, inside the allocation
    (40, 16),  # inside the view's batch 1
    (16, 8),  # half read, half zero-filled
)


@pytest.mark.parametrize("kernel", [copy_at, copy_at_pair], ids=["offset", "pair"])
def test_copy_from_an_element_offset_reads_the_memory_at_that_address(kernel, side):
    full = np.arange(2 * 3 * 12, dtype=np.float16).reshape(2, 3, 12)
    offsets = np.array([o for o, _ in AT_CASES], np.int64)
    nbytes = np.array([n for _, n in AT_CASES], np.int32)
    y = np.full((4, 8), -1, np.float16)
    if side == "host":  # a kernel takes contiguous host arrays only: offsets from full[0, 0, 0]
        kernel[1, 4](full, offsets + 24, nbytes, y)
        got = y
    else:
        d_full, d_offsets, d_nbytes, d_y = on(side, full, offsets, nbytes, y)
        kernel[1, 4](d_full[:, 2:, :], d_offsets, d_nbytes, d_y)
        got = d_y.copy_to_host()
    flat = full.ravel()
    expected = np.stack([flat[24 + o : 24 + o + 8] for o in offsets])
    expected[3, 4:] = 0  # 8 of 16 bytes read, the rest zero-filled
    np.testing.assert_array_equal(got, expected)


@cuda.jit
def copy_at_one(x, offset, y):
    buf = cuda.shared.array(8, float16, alignment=ALIGN)
    pipeline.cp_async_cg_16_zfill_at(buf, 0, x, offset, 16)
    pipeline.cp_async_wait_all()
    y[0] = buf[0]


@pytest.mark.sim_only(reason="on a GPU the launch fails with an address error")
@pytest.mark.parametrize(
    ("offset", "message"),
    [
        (4, "not 16-byte aligned"),
        (16, "leave the array's allocation"),
        (-8, "leave the array's allocation"),
    ],  # fmt: skip
)
def test_copy_from_an_element_offset_outside_the_allocation_is_an_error(offset, message):
    x = np.arange(16, dtype=np.float16).reshape(2, 8)
    with pytest.raises(sim.SimulationError, match=message):
        copy_at_one[1, 1](x, offset, np.zeros(1, np.float16))


@cuda.jit
def misaligned(x, y):
    buf = cuda.shared.array(16, float32, alignment=ALIGN)
    pipeline.cp_async_16(buf, 0, x, 1)  # x + 4 bytes is not 16-byte aligned
    pipeline.cp_async_wait_all()
    y[0] = buf[0]


@pytest.mark.sim_only(reason="on a GPU the launch fails with a misaligned-address error")
def test_misaligned_copy_is_an_error():
    x = np.arange(16, dtype=np.float32)
    with pytest.raises(sim.SimulationError, match="not 16-byte aligned"):
        misaligned[1, 1](x, np.zeros(1, np.float32))


@pytest.mark.sim_only(reason="the twin registry is the simulator's")
def test_twins_list_the_intrinsics():
    names = {name.rsplit(".", 1)[-1] for name in sim.twins() if ".pipeline." in name}
    assert {
        "cp_async_4",
        "cp_async_8",
        "cp_async_16",
        "cp_async_cg_16",
        "cp_async_4_zfill",
        "cp_async_8_zfill",
        "cp_async_16_zfill",
        "cp_async_cg_16_zfill",
        "cp_async_cg_16_zfill_at",
        "cp_async_commit_group",
        "cp_async_wait_group",
        "cp_async_wait_all",
    } <= names
    for name in names:
        assert hasattr(pipeline, name)


# --- traffic ------------------------------------------------------------------------------


@pytest.mark.sim_only(
    reason="the profiler measures traffic and bank conflicts in the simulator only"
)
@pytest.mark.parametrize("async_copy", [True, False])
@pytest.mark.parametrize("k_axis", [0, 1])
@pytest.mark.parametrize("shape", [(9, 20), (4, 8), (1, 4)])
def test_streamed_copy_traffic_is_exact(async_copy, k_axis, shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    with sim.profile() as prof:
        y = run_stream_copy(x, 3, async_copy, k_axis, 16)
    np.testing.assert_array_equal(y, x)
    # Each element read once (zero-filled edges read nothing) and written once.
    assert prof.traffic[("stream_copy", "x")] == [x.nbytes, 0]
    assert prof.traffic[("stream_copy", "y")] == [0, x.nbytes]
    assert not prof.races and not prof.out_of_bounds, str(prof)


@pytest.mark.sim_only(
    reason="the profiler measures traffic and bank conflicts in the simulator only"
)
def test_streamed_sum_traffic_is_exact():
    x = np.arange(3 * WIDTH + 5, dtype=np.float32)
    out = np.zeros(WIDTH, np.float32)
    with sim.profile() as prof:
        stream_sum_kernel(3, True, WIDTH)[1, WIDTH](x, out)
    assert prof.bytes_read == x.nbytes and prof.bytes_written == out.nbytes
    assert not prof.races and not prof.out_of_bounds, str(prof)


# --- options ------------------------------------------------------------------------------


def test_factory_is_memoised_and_describes_the_ring():
    a = pipeline.ring_buffer(3, (ROWS, COLS), float32)
    assert pipeline.ring_buffer(3, (ROWS, COLS), np.float32) is a
    assert a.shape == (3, ROWS, COLS) and a.k_axis == 1 and a.async_copy and a.copy_bytes == 16
    assert pipeline.ring_buffer(2, 64, "float64").shape == (2, 64)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"stages": 5, "tile": (8,)}, "stages"),
        ({"stages": 1, "tile": (8,)}, "stages"),
        ({"stages": 2, "tile": (2, 3, 4)}, "tile"),
        ({"stages": 2, "tile": (6,)}, "multiple"),
        ({"stages": 2, "tile": (8,), "copy_bytes": 12}, "copy_bytes"),
        ({"stages": 2, "tile": (8,), "k_axis": 1}, "k_axis"),
    ],
)
def test_bad_options_are_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pipeline.ring_buffer(dtype=float32, **kwargs)


def test_on_load_needs_synchronous_loads_and_a_function():
    with pytest.raises(ValueError, match="async_copy=False"):
        pipeline.ring_buffer(2, (8,), float32, on_load=doubled)
    with pytest.raises(TypeError, match="device function"):
        pipeline.ring_buffer(2, (8,), float32, async_copy=False, on_load=2.0)
