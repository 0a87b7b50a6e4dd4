"""Prebuilt 2-D transpose: exact against NumPy for any strides, C-contiguous out, each element
read and written once, and zero bank conflicts in the simulator profile."""

import ml_dtypes
import numpy as np
import pytest
from helpers import back, counting_launches, on, transposed
from hypothesis import given
from hypothesis import strategies as st

from tessera_tile import ops, sim

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]


@given(
    st.sampled_from(DTYPES),
    st.sampled_from([1, 31, 32, 33, 65]),
    st.sampled_from([1, 7, 32, 33]),
    st.sampled_from(["contiguous", "strided", "transposed"]),
    st.sampled_from(["host", "device"]),
)
def test_transpose_matches_numpy(dtype, m, n, view, side):
    base = np.arange(m * n * 2, dtype=np.float64).astype(dtype)
    base = {
        "contiguous": base[: m * n].reshape(m, n),
        "strided": base.reshape(m, 2 * n),
        "transposed": base[: m * n].reshape(n, m),
    }[view]
    before = base.copy()
    (placed,) = on(side, base)
    x = {"contiguous": lambda a: a, "strided": lambda a: a[:, ::2], "transposed": transposed}[view](
        placed
    )
    got = back(ops.transpose(x), side)
    want = {"contiguous": base, "strided": base[:, ::2], "transposed": base.T}[view].T
    np.testing.assert_array_equal(got, want)
    assert got.dtype == dtype and got.flags.c_contiguous
    np.testing.assert_array_equal(base, before)


@pytest.mark.sim_only(
    reason="the profiler measures traffic and bank conflicts in the simulator only"
)
@pytest.mark.parametrize("shape", [(45, 70), (64, 96)])  # edge tiles; whole 16-byte tiles
@pytest.mark.parametrize("dtype", DTYPES)
def test_traffic_is_the_minimum_and_no_bank_conflicts(dtype, shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    with sim.profile() as prof:
        got = ops.transpose(x)
    np.testing.assert_array_equal(got, x.T)
    assert prof.bank_conflicts == 0, str(prof)
    assert prof.shared_requests > 0  # the tile really went through shared memory
    assert prof.bytes_read == x.nbytes and prof.bytes_written == x.nbytes
    assert ops.transpose.explain(x).bytes_fused == 2 * x.nbytes


def test_bfloat16_moves_bit_for_bit(side):
    """Every bfloat16 bit pattern, NaN payloads included, lands transposed unchanged."""
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)
    x = x.reshape(128, 512)
    got = back(ops.transpose(*on(side, x)), side)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.view(np.uint16), x.view(np.uint16).T)


def test_size_zero_and_out(side):
    from numba import cuda

    assert back(ops.transpose(*on(side, np.zeros((0, 3), np.float32))), side).shape == (3, 0)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = np.empty((4, 3), np.float32) if side == "host" else cuda.device_array((4, 3), np.float32)
    assert ops.transpose(*on(side, x), out=out, stream=0) is out
    np.testing.assert_array_equal(back(out, side), x.T)


x32 = np.ones((4, 8), np.float32)
BAD = [
    (lambda: ops.transpose(np.ones(3, np.float32)), ValueError, "x has shape"),
    (lambda: ops.transpose(np.ones((2, 2, 2), np.float32)), ValueError, "x has shape"),
    (lambda: ops.transpose(np.ones((2, 2), np.int32)), TypeError, "x has dtype"),
    (lambda: ops.transpose(x32, out=np.empty((4, 8), np.float32)), ValueError, "out"),
    (lambda: ops.transpose(x32, out=np.empty((16, 4), np.float32)[::2]), ValueError, "out"),
    (lambda: ops.transpose(x32, out=x32.reshape(8, 4)), ValueError, "out overlaps"),
]


@pytest.mark.parametrize("call, error, words", BAD)
def test_bad_input_raises_before_any_launch(call, error, words):
    with counting_launches() as counted, pytest.raises(error, match=words):
        call()
    assert counted.launches == 0


def test_the_launch_counter_sees_a_valid_call():
    # the control of the test above: the same counter counts the hand-written kernel's launch
    with counting_launches() as counted:
        ops.transpose(x32)
    assert counted.launches == ops.transpose.explain(x32).kernels == 1


@pytest.mark.parametrize("shape", [(70, 100), (96, 128)])
@pytest.mark.parametrize("blocks", [1, 3, 5, 13])
def test_blocks_step_through_every_tile(blocks, shape):
    """Fewer blocks than tiles (3 x 4 here): each block steps through tiles t, t + blocks, ...
    across tile rows, and a grid wider than a tile row (5, 13) wraps more than once; at
    70 x 100 through the whole tiles and then the edge tiles, at 96 x 128 all whole."""
    from tessera_tile.kernels import transpose as kernels

    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    out = np.full(shape[::-1], np.nan, np.float32)
    kernels.transpose_f32[blocks, kernels.THREADS](x, out)
    np.testing.assert_array_equal(out, x.T)


# Sizes around the tile: whole tiles only (32, 64), whole and edge tiles (33, 65), edge only
# (31). float32 rows of dst are 16-byte aligned when m % 4 == 0 (16-byte whole tiles), not
# otherwise (one element per lane); float16 when m % 8 == 0; float64 one element per lane.
SHAPES = [(32, 32), (64, 64), (64, 65), (65, 64), (33, 31), (31, 33), (33, 96), (96, 33)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_whole_and_edge_tiles_match_numpy(dtype, shape, side):
    x = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    got = back(ops.transpose(*on(side, x)), side)
    assert got.dtype == dtype and got.flags.c_contiguous
    np.testing.assert_array_equal(got, x.T)


@pytest.mark.parametrize("dtype", DTYPES)
def test_misaligned_rows_take_the_element_path(dtype, side):
    """A view one element into each row: its rows are contiguous with a 16-byte pitch, but no
    chunk is 16-byte aligned, so float32's whole tiles load one element per lane (a 16-byte
    load there faults on the GPU and raises in the simulator; a host view reaches the kernel
    as a contiguous copy)."""
    base = np.arange(64 * 72, dtype=np.float64).astype(dtype).reshape(64, 72)
    (placed,) = on(side, base)
    got = back(ops.transpose(placed[:, 1:65]), side)
    np.testing.assert_array_equal(got, base[:, 1:65].T)
