"""Vector accesses are plain addresses: a run may cross a row end inside its allocation.

On a GPU a 16-byte load (``ld.global.v4``), a ``cp.async`` copy, an ``ldmatrix`` row or a 4-byte
``store_f16x2`` reads or writes the bytes at one address: it is valid when the address is
aligned to the access size (PTX ISA: "the address must be naturally aligned to a multiple of the
access size") and the bytes lie inside the allocation. A run that starts near the end of a row
of a C-contiguous array therefore continues into the next row; one that leaves the allocation
is an illegal access. These tests pin the simulator's twins to that rule in both directions.

Rows with an odd number of 16-byte words make such runs honest: a (R, 12) float16 array has
24-byte rows, so element (2k, 8) sits on a 16-byte boundary and its 8-element run takes the last
4 elements of row 2k and the first 4 of row 2k + 1.
"""

import contextlib

import numpy as np
import pytest
from numba import cuda, float32

import tessera_tile  # noqa: F401  (installs the warp-aware simulator)
from tessera_tile import sim
from tessera_tile.memory import load16, store16
from tessera_tile.mma import ldmatrix_x1, store_f16x2
from tessera_tile.pipeline import SHARED_ALIGN, cp_async_16, cp_async_wait_all

SIDES = ("host", "device")
# dtype -> a row length whose row stride is not a multiple of 16 bytes (24 bytes both)
ROWS = {np.float16: 12, np.float32: 6}
SIM_ONLY = pytest.mark.sim_only(reason="on a GPU the launch fails (illegal or misaligned address)")


def aligned_host(shape, dtype, fill) -> np.ndarray:
    """A C-contiguous host array whose first byte sits on 64 bytes (a view of a larger one)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + 64, np.uint8)
    start = -raw.__array_interface__["data"][0] % 64
    out = raw[start : start + nbytes].view(dtype).reshape(shape)
    out[...] = fill
    return out


def on_side(side, x):
    return x if side == "host" else cuda.to_device(x)


def host_of(a):
    return a if isinstance(a, np.ndarray) else a.copy_to_host()


def device_address(d) -> int:
    """The address of a device array's first element: a GPU's arrays give it in their
    ``__cuda_array_interface__``; the simulator's are NumPy arrays in host memory."""
    return (d.__array_interface__ if sim.enabled() else d.__cuda_array_interface__)["data"][0]


def crossing_starts(shape, dtype) -> list[tuple[int, int]]:
    """Every (row, col) of a C-contiguous array starting at a 16-byte boundary whose 16-byte run
    crosses the row end and stays inside the array."""
    item = np.dtype(dtype).itemsize
    n = 16 // item
    rows, cols = shape
    return [
        (r, c)
        for r in range(rows)
        for c in range(cols)
        if (r * cols + c) * item % 16 == 0 and c + n > cols and (r * cols + c) + n <= rows * cols
    ]


@cuda.jit
def load_runs(src, starts, out):
    t = cuda.threadIdx.x
    if t < starts.shape[0]:
        v = load16(src, (starts[t, 0], starts[t, 1]))
        for k in range(out.shape[1]):
            out[t, k] = v[k]


@cuda.jit
def store_runs(dst, starts, values):
    t = cuda.threadIdx.x
    if t < starts.shape[0]:
        v = values
        store16(dst, (starts[t, 0], starts[t, 1]), (v[t, 0], v[t, 1], v[t, 2], v[t, 3]))


@cuda.jit
def store_runs_f16(dst, starts, values):
    t = cuda.threadIdx.x
    if t < starts.shape[0]:
        v = values
        store16(
            dst,
            (starts[t, 0], starts[t, 1]),
            (v[t, 0], v[t, 1], v[t, 2], v[t, 3], v[t, 4], v[t, 5], v[t, 6], v[t, 7]),
        )


def _expected_runs(x, starts):
    n = 16 // x.itemsize
    flat = x.ravel()
    return np.stack([flat[r * x.shape[1] + c : r * x.shape[1] + c + n] for r, c in starts])


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("dtype", list(ROWS))
def test_load16_crossing_a_row_end_reads_the_next_row(side, dtype):
    shape = (5, ROWS[dtype])
    x = aligned_host(shape, dtype, np.arange(np.prod(shape)).reshape(shape) - 7)
    starts = crossing_starts(shape, dtype)
    assert len(starts) >= 2, starts  # the case exists: aligned starts whose run crosses a row
    out = np.zeros((len(starts), 16 // x.itemsize), dtype)
    src = on_side(side, x)
    assert (sim.address(x) if side == "host" else device_address(src)) % 16 == 0
    load_runs[1, 32](src, np.array(starts, np.int32), out)
    np.testing.assert_array_equal(out, _expected_runs(x, starts))  # exact: a copy of bytes


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("dtype", list(ROWS))
def test_store16_crossing_a_row_end_writes_the_next_row(side, dtype):
    shape = (5, ROWS[dtype])
    n = 16 // np.dtype(dtype).itemsize
    starts = crossing_starts(shape, dtype)
    values = (np.arange(len(starts) * n).reshape(len(starts), n) + 100).astype(dtype)
    x = aligned_host(shape, dtype, -1)
    dst = on_side(side, x)
    kernel = store_runs_f16 if n == 8 else store_runs
    kernel[1, 32](dst, np.array(starts, np.int32), values)
    expected = np.full(shape, -1, dtype)
    flat = expected.ravel()
    for (r, c), v in zip(starts, values, strict=True):
        flat[r * shape[1] + c : r * shape[1] + c + n] = v
    np.testing.assert_array_equal(host_of(dst), expected)


@SIM_ONLY
@pytest.mark.parametrize("side", SIDES)
def test_crossing_runs_are_not_reported_and_count_their_bytes(side):
    shape = (5, 12)
    x = aligned_host(shape, np.float16, np.arange(60).reshape(shape))
    starts = crossing_starts(shape, np.float16)
    out = np.zeros((len(starts), 8), np.float16)
    with sim.profile() as prof:
        load_runs[1, 32](on_side(side, x), np.array(starts, np.int32), out)
    assert prof.out_of_bounds == [], str(prof)
    assert prof.traffic[("load_runs", "src")][0] == 16 * len(starts)
    np.testing.assert_array_equal(out, _expected_runs(x, starts))


@SIM_ONLY
@pytest.mark.parametrize("side", SIDES)
def test_a_run_past_the_allocation_is_reported(side):
    # (4, 8) of a (5, 12) float16 array starts 16-byte aligned 8 bytes before the end.
    backing = aligned_host((6, 12), np.float16, 3)
    x = backing[:5]  # host: the kernel's allocation is this view (a GPU copies it alone)
    src = on_side(side, x)
    out = np.full((1, 8), 9, np.float16)
    with sim.profile() as prof:
        load_runs[1, 1](src, np.array([[4, 8]], np.int32), out)
    assert len(prof.out_of_bounds) == 1, str(prof)
    oob = prof.out_of_bounds[0]
    assert oob.array == "src" and not oob.write and oob.space == "global"
    np.testing.assert_array_equal(out, 0)  # a reported read returns zeros
    with pytest.raises(sim.SimulationError, match="leaves its allocation"):
        load_runs[1, 1](src, np.array([[4, 8]], np.int32), out)


@SIM_ONLY
@pytest.mark.parametrize("side", SIDES)
def test_a_store_past_the_allocation_is_reported_and_dropped(side):
    backing = aligned_host((6, 12), np.float16, 3)
    dst = on_side(side, backing[:5])
    values = np.arange(8, dtype=np.float16).reshape(1, 8) + 1
    with sim.profile() as prof:
        store_runs_f16[1, 1](dst, np.array([[4, 8]], np.int32), values)
    assert len(prof.out_of_bounds) == 1 and prof.out_of_bounds[0].write, str(prof)
    np.testing.assert_array_equal(host_of(dst), 3)
    np.testing.assert_array_equal(backing, 3)  # nothing written after the allocation either
    with pytest.raises(sim.SimulationError, match="leaves its allocation"):
        store_runs_f16[1, 1](dst, np.array([[4, 8]], np.int32), values)
    np.testing.assert_array_equal(backing, 3)


@SIM_ONLY
@pytest.mark.parametrize("side", SIDES)
def test_a_misaligned_crossing_run_is_refused(side):
    # (1, 8) of a (5, 12) float16 array: byte 40, crosses row 1's end, not 16-byte aligned
    x = aligned_host((5, 12), np.float16, 1)
    out = np.zeros((1, 8), np.float16)
    with pytest.raises(sim.SimulationError, match="misaligned address"):
        load_runs[1, 1](on_side(side, x), np.array([[1, 8]], np.int32), out)


@pytest.mark.parametrize("profiled", [False, pytest.param(True, marks=SIM_ONLY)])
def test_a_strided_view_reads_and_writes_the_buffer_after_its_row(profiled):
    # A device view x[:, :12] of a (4, 16) float16 array has 32-byte rows; the run at (r, 8)
    # covers the view's last 4 elements of row r and the 4 hidden elements after them, which
    # lie inside the device allocation: a GPU reads and writes them.
    x = np.arange(64, dtype=np.float16).reshape(4, 16)
    d = cuda.to_device(x)
    assert device_address(d) % 16 == 0
    view = d[:, :12]
    starts = np.array([[r, 8] for r in range(4)], np.int32)
    out = np.zeros((4, 8), np.float16)
    values = (np.arange(32).reshape(4, 8) + 1000).astype(np.float16)
    with sim.profile() if profiled else contextlib.nullcontext() as prof:
        load_runs[1, 32](view, starts, out)
        store_runs_f16[1, 32](view, starts, values)
    np.testing.assert_array_equal(out, x[:, 8:16])
    expected = x.copy()
    expected[:, 8:16] = values
    np.testing.assert_array_equal(d.copy_to_host(), expected)
    if profiled:
        assert prof.out_of_bounds == [], str(prof)


@SIM_ONLY
def test_a_strided_view_run_past_its_base_allocation_is_reported():
    # d[:, 4:] of a (3, 12) float16 device array (72 bytes): (2, 4) sits on byte 64, 16-byte
    # aligned; its run would read bytes 64..79, past the allocation's end.
    d = cuda.to_device(np.ones((3, 12), np.float16))
    assert device_address(d) % 16 == 0
    out = np.zeros((1, 8), np.float16)
    with sim.profile() as prof:
        load_runs[1, 1](d[:, 4:], np.array([[2, 4]], np.int32), out)
    assert len(prof.out_of_bounds) == 1, str(prof)
    np.testing.assert_array_equal(out, 0)


# ---- cp.async, ldmatrix, store_f16x2 --------------------------------------------------------


@cuda.jit
def cp_async_run(src, r, c, out):
    s = cuda.shared.array(4, np.float32, alignment=SHARED_ALIGN)
    cp_async_16(s, 0, src, (r, c))
    cp_async_wait_all()
    for k in range(4):
        out[k] = s[k]


@cuda.jit
def ldmatrix_rows(src, out):
    # shared (16, 12) float16: lane l < 8 gives row l of the matrix at (2l, 8), 16-byte aligned
    # (byte 48l + 16), crossing into row 2l + 1
    s = cuda.shared.array((16, 12), np.float16, alignment=SHARED_ALIGN)
    lane = cuda.threadIdx.x
    for k in range(lane, 192, 32):
        s[k // 12, k % 12] = src[k // 12, k % 12]
    cuda.syncthreads()
    out[lane] = ldmatrix_x1(s, (2 * (lane % 8), 8))


@cuda.jit
def pair_store(out, r, c):
    store_f16x2(out, (r, c), float32(1.5), float32(-2.5))


@pytest.mark.parametrize("side", SIDES)
def test_cp_async_crossing_a_row_end_copies_the_next_row(side):
    x = aligned_host((3, 6), np.float32, np.arange(18).reshape(3, 6))
    out = np.zeros(4, np.float32)
    cp_async_run[1, 1](on_side(side, x), 0, 4, out)  # byte 16: x[0, 4:6] then x[1, 0:2]
    np.testing.assert_array_equal(out, x.ravel()[4:8])


def test_ldmatrix_row_crossing_a_row_end_reads_the_next_row():
    x = (np.arange(192) % 251).astype(np.float16).reshape(16, 12)
    out = np.zeros(32, np.uint32)
    ldmatrix_rows[1, 32](x, out)
    m = np.stack([x.ravel()[24 * r + 8 : 24 * r + 16] for r in range(8)])  # row r of matrix
    pairs = [m[lane // 4, 2 * (lane % 4) : 2 * (lane % 4) + 2] for lane in range(32)]
    expected = [p.view(np.uint32)[0] for p in pairs]  # lane 4g + t: (M[g, 2t], M[g, 2t + 1])
    np.testing.assert_array_equal(out, expected)


def test_store_f16x2_crossing_a_row_end_writes_the_next_row():
    x = aligned_host((2, 3), np.float16, 0)  # 6-byte rows: (0, 2) is byte 4, 4-byte aligned
    pair_store[1, 1](x, 0, 2)
    np.testing.assert_array_equal(x, [[0, 0, 1.5], [-2.5, 0, 0]])


@SIM_ONLY
def test_in_allocation_follows_the_base_allocation():
    x = cuda.to_device(np.zeros((3, 12), np.float16))._ary  # 72 bytes
    view = x[:, 4:]
    assert sim.in_allocation(x, (0, 8), 16)  # crosses row 0's end: bytes 16..31
    assert sim.in_allocation(view, (1, 4), 16)  # bytes 40..55, past the view's row end
    assert not sim.in_allocation(view, (2, 4), 16)  # bytes 64..79, past the allocation
    assert sim.in_allocation(view, (2, 4), 8)  # bytes 64..71, its last 8
    assert sim.in_allocation(view, (0, -4), 2)  # byte 0: x[0, 0], before the view, inside x
    assert not sim.in_allocation(view, (0, -5), 2)  # byte -2: before the allocation
    host = aligned_host((6, 12), np.float16, 0)[:5]  # a view: its allocation is the whole buffer
    assert sim.in_allocation(host, (4, 8), 16)  # (inside a kernel it would be its own)
