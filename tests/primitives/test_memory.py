"""tessera_tile.memory: tile descriptors, the bank-conflict model, staging and vector accesses."""

import functools

import numpy as np
import pytest
from helpers import load_example
from hypothesis import assume, given
from hypothesis import strategies as st
from numba import cuda
from numba.np import numpy_support

import tessera_tile  # noqa: F401  (installs the warp-aware simulator)
from tessera_tile import sim
from tessera_tile.memory import (
    Tile,
    aligned16,
    bank_conflict_degree,
    load16,
    load16_shared,
    make_stager,
    request_wavefronts,
    store16,
)

DTYPES = [np.float16, np.float32, np.float64, np.int32]
EDGES = [1, 31, 32, 33, 63, 64, 65, 127, 128, 129]  # n-1, n, n+1 around warp and tile sizes
THREADS = (32, 8)


def random_array(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-1000, 1000, size=shape, dtype=np.int32)
    return rng.standard_normal(shape).astype(dtype)


def sentinel(dtype):
    return np.dtype(dtype).type(-7)


# -------------------------------------------------------------------------------------------
# kernels (one set per tile; shapes are compile-time constants)
# -------------------------------------------------------------------------------------------


@functools.cache
def kernels(shape, dtype, pad):
    tile = Tile(shape, dtype, pad=pad, access="column")
    stage = make_stager(tile)
    SHAPE = tile.padded_shape
    TILE_M, TILE_N = shape
    NB = numpy_support.from_dtype(np.dtype(dtype))

    @cuda.jit
    def stage_one_tile(src, row0, col0, fill, out):
        s = cuda.shared.array(SHAPE, NB, alignment=16)
        stage.global_to_shared(src, row0, col0, s, fill)
        cuda.syncthreads()
        tid = cuda.threadIdx.x + cuda.blockDim.x * cuda.threadIdx.y
        for e in range(tid, TILE_M * TILE_N, cuda.blockDim.x * cuda.blockDim.y):
            out[e // TILE_N, e % TILE_N] = s[e // TILE_N, e % TILE_N]

    @cuda.jit
    def copy(src, dst):
        s = cuda.shared.array(SHAPE, NB, alignment=16)
        row0 = cuda.blockIdx.y * TILE_M
        col0 = cuda.blockIdx.x * TILE_N
        stage.global_to_shared(src, row0, col0, s, 0)
        cuda.syncthreads()
        stage.shared_to_global(s, dst, row0, col0)

    @cuda.jit
    def transpose(src, dst):
        s = cuda.shared.array(SHAPE, NB, alignment=16)
        row0 = cuda.blockIdx.y * TILE_M
        col0 = cuda.blockIdx.x * TILE_N
        stage.global_to_shared(src, row0, col0, s, 0)
        cuda.syncthreads()
        stage.shared_to_global_transposed(s, dst, col0, row0)

    return tile, stage_one_tile, copy, transpose


def grid(shape, tile_shape):
    return (-(-shape[1] // tile_shape[1]), -(-shape[0] // tile_shape[0]))


def expected_tile(src, row0, col0, tile_shape, fill):
    out = np.full(tile_shape, fill, dtype=src.dtype)
    part = src[row0 : row0 + tile_shape[0], col0 : col0 + tile_shape[1]]
    out[: part.shape[0], : part.shape[1]] = part
    return out


# -------------------------------------------------------------------------------------------
# Tile descriptor
# -------------------------------------------------------------------------------------------


def test_tile_basics():
    t = Tile((32, 32), np.float32)
    assert t.pad == 0 and t.padded_shape == (32, 32) and t.size_in_bytes == 4096
    assert t.dtype == np.dtype(np.float32) and t.vector_elements == 4
    t = Tile([32, 33], "float16", pad=1)
    assert t.shape == (32, 33) and t.padded_shape == (32, 34) and t.size_in_bytes == 32 * 34 * 2
    assert Tile((3, 3), np.float32).size_in_bytes == 48  # 36 rounded up to 16
    assert hash(Tile((8, 8), np.int32)) == hash(Tile((8, 8), "int32"))


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"shape": (32,)}, TypeError),
        ({"shape": (32, 32.0)}, TypeError),
        ({"shape": (0, 32)}, ValueError),
        ({"shape": (32, -1)}, ValueError),
        ({"dtype": np.int8}, TypeError),
        ({"dtype": np.complex64}, TypeError),
        ({"dtype": "no such type"}, TypeError),
        ({"pad": -1}, ValueError),
        ({"pad": "big"}, TypeError),
        ({"pad": 1.5}, TypeError),
        ({"access": "diagonal"}, ValueError),
        ({"vector": 3}, ValueError),
        ({"vector": 0}, ValueError),
        ({"vector": 8}, ValueError),  # 32 bytes
        ({"vector": 4, "pad": 1}, ValueError),  # rows no longer 16-byte aligned
        ({"vector": 4, "shape": (32, 30)}, ValueError),
        ({"vector": 2.0}, TypeError),
    ],
)
def test_tile_validation(kwargs, error):
    args = {"shape": (32, 32), "dtype": np.float32, **kwargs}
    with pytest.raises(error, match="Tile"):
        Tile(**args)


@pytest.mark.parametrize(
    "shape, dtype, access, vector, pad",
    [
        ((32, 32), np.float32, "row", 1, 0),
        ((32, 32), np.float32, "row", 4, 0),
        ((32, 32), np.float32, "column", 1, 1),
        ((64, 64), np.float32, "column", 1, 1),
        ((32, 32), np.int32, "column", 1, 1),
        ((32, 32), np.float64, "column", 1, 1),
        ((32, 32), np.float16, "column", 1, 2),  # 1 half would put lanes 0 and 31 in bank 0
        ((16, 16), np.float32, "column", 1, 2),  # 2 columns per warp: pitch 18 spreads them
        ((32, 32), np.float32, "column", 4, 1),
    ],
)
def test_auto_pad_is_the_smallest_conflict_free_padding(shape, dtype, access, vector, pad):
    tile = Tile(shape, dtype, pad="auto", access=access, vector=vector)
    assert tile.pad == pad and tile.conflict_degree == 1
    for smaller in range(pad):
        assert Tile(shape, dtype, pad=smaller, access=access).conflict_degree > 1


def test_bank_conflict_model():
    f32 = np.float32
    assert bank_conflict_degree((32, 32), f32, "row") == 1
    assert bank_conflict_degree((32, 32), f32, "column") == 32
    assert bank_conflict_degree((32, 33), f32, "column", cols=32) == 1
    assert bank_conflict_degree((32, 64), f32, "column") == 32
    assert bank_conflict_degree((32, 32), np.float64, "column") == 16  # per half-warp
    assert bank_conflict_degree((32, 32), f32, "row", 4) == 1  # 16-byte vectors
    assert bank_conflict_degree((32, 32), f32, "row", 4, scalar=True) == 4
    assert bank_conflict_degree((32, 33), f32, "row", 4, scalar=True, cols=32) == 1
    assert bank_conflict_degree((32, 32), f32, "column", 4) == 8
    assert request_wavefronts((32, 32), f32, "column") == [(32, 1)]
    assert request_wavefronts((32, 32), f32, "row", 4) == [(4, 4)]
    with pytest.raises(ValueError):
        bank_conflict_degree((32, 32), f32, "diagonal")


# -------------------------------------------------------------------------------------------
# Staging against NumPy
# -------------------------------------------------------------------------------------------


@given(
    dtype=st.sampled_from(DTYPES),
    rows=st.sampled_from([0, *EDGES]),
    cols=st.sampled_from([0, *EDGES]),
    tile_row=st.integers(0, 2),
    tile_col=st.integers(0, 2),
)
def test_global_to_shared_fills_outside_the_array(dtype, rows, cols, tile_row, tile_col):
    _, stage_one_tile, _, _ = kernels((32, 32), dtype, "auto")
    src = random_array((rows, cols), dtype)
    out = np.zeros((32, 32), dtype)
    fill = sentinel(dtype)
    stage_one_tile[1, THREADS](src, 32 * tile_row, 32 * tile_col, fill, out)
    np.testing.assert_array_equal(
        out, expected_tile(src, 32 * tile_row, 32 * tile_col, out.shape, fill)
    )


@given(
    dtype=st.sampled_from(DTYPES),
    rows=st.sampled_from(EDGES),
    cols=st.sampled_from(EDGES),
    pad=st.sampled_from([0, "auto"]),
)
def test_copy_and_transpose_match_numpy(dtype, rows, cols, pad):
    _, _, copy, transpose = kernels((32, 32), dtype, pad)
    src = random_array((rows, cols), dtype, seed=rows * 100 + cols)
    dst = np.full_like(src, sentinel(dtype))
    copy[grid(src.shape, (32, 32)), THREADS](src, dst)
    np.testing.assert_array_equal(dst, src)
    dst_t = np.full((cols, rows), sentinel(dtype), dtype)
    transpose[grid(src.shape, (32, 32)), THREADS](src, dst_t)
    np.testing.assert_array_equal(dst_t, src.T)


@pytest.mark.parametrize("dtype", DTYPES)
def test_unaligned_and_strided_views_fall_back_to_scalar_accesses(dtype):
    _, _, copy, transpose = kernels((32, 32), dtype, "auto")
    base = random_array((40, 80), dtype)
    device_base = cuda.to_device(base)  # strided views of host arrays cannot be launched
    for view in (
        (slice(1, None), slice(1, None)),
        (slice(None), slice(3, 70)),
        (slice(None), slice(None, None, 2)),
    ):
        src = base[view]
        dst = cuda.to_device(np.zeros(src.shape, dtype))
        copy[grid(src.shape, (32, 32)), THREADS](device_base[view], dst)
        np.testing.assert_array_equal(dst.copy_to_host(), src)
        dst_t = cuda.to_device(np.zeros(src.shape[::-1], dtype))
        transpose[grid(src.shape, (32, 32)), THREADS](device_base[view], dst_t)
        np.testing.assert_array_equal(dst_t.copy_to_host(), src.T)


def test_a_strided_host_array_is_refused_as_on_a_gpu():
    _, _, copy, _ = kernels((32, 32), np.float32, "auto")
    base = random_array((40, 80), np.float32)
    dst = np.zeros((40, 40), np.float32)
    # numba-cuda's own check says "non-contiguous"; on an H200 (numba-cuda 0.30.4, cuda-core
    # 1.2.0) cuda-core refused the copy first: "Buffer size is too small for the layout".
    with pytest.raises(ValueError, match="non-contiguous|too small for the layout"):
        copy[grid(dst.shape, (32, 32)), THREADS](base[:, ::2], dst)
    assert not dst.any()


@pytest.mark.parametrize("shape", [(16, 64), (8, 24), (40, 8)])
def test_other_tile_shapes(shape):
    # (8, 24) float16: 24 columns are not whole 16-byte chunks, so staging is element-wise.
    for dtype in (np.float16, np.float32):
        _, _, copy, transpose = kernels(shape, dtype, "auto")
        src = random_array((shape[0] * 2 + 1, shape[1] + 3), dtype)
        dst = np.zeros_like(src)
        copy[grid(src.shape, shape), (64, 2)](src, dst)
        np.testing.assert_array_equal(dst, src)
        dst_t = np.zeros(src.shape[::-1], dtype)
        transpose[grid(src.shape, shape), (64, 2)](src, dst_t)
        np.testing.assert_array_equal(dst_t, src.T)


SUB = (2, 4)
_REG_TILE = Tile((16, 16), np.float32, pad="auto")
_reg_stage = make_stager(_REG_TILE)
_REG_SHAPE = _REG_TILE.padded_shape


@cuda.jit
def sub_tile_sums(src, out):
    # 32 threads, each owns a 2 x 4 sub-tile of a 16 x 16 tile; adds 1 in registers, writes back.
    s = cuda.shared.array(_REG_SHAPE, np.float32, alignment=16)
    _reg_stage.global_to_shared(src, 0, 0, s, 0)
    cuda.syncthreads()
    t = cuda.threadIdx.x
    row = (t // 4) * SUB[0]
    col = (t % 4) * SUB[1]
    regs = cuda.local.array(SUB, np.float32)
    _reg_stage.shared_to_registers(s, row, col, regs)
    for a in range(SUB[0]):
        for b in range(SUB[1]):
            regs[a, b] += np.float32(1.0)
    _reg_stage.registers_to_shared(regs, s, row, col)
    cuda.syncthreads()
    _reg_stage.shared_to_global(s, out, 0, 0)


def test_shared_to_registers_round_trip():
    src = random_array((16, 16), np.float32)
    out = np.zeros_like(src)
    sub_tile_sums[1, 32](src, out)
    np.testing.assert_array_equal(out, src + np.float32(1))


@cuda.jit
def vector_copy(src, dst, aligned):
    i = cuda.threadIdx.x * 4
    if i + 4 <= src.shape[0]:
        ok = aligned16(src, i)
        aligned[cuda.threadIdx.x] = ok
        if ok:
            a, b, c, d = load16(src, i)
            store16(dst, i, (d, c, b, a))


def test_vector_intrinsics():
    src = cuda.to_device(np.arange(64, dtype=np.float32))  # device memory is 256-byte aligned
    dst = cuda.to_device(np.zeros(64, np.float32))
    aligned = cuda.to_device(np.zeros(16, np.bool_))
    vector_copy[1, 16](src, dst, aligned)
    expected = np.arange(64, dtype=np.float32).reshape(16, 4)[:, ::-1].ravel()
    np.testing.assert_array_equal(dst.copy_to_host(), expected)
    assert aligned.copy_to_host().all()
    view = cuda.to_device(np.arange(65, dtype=np.float32))[1:]  # 4 bytes past an aligned start
    vector_copy[1, 16](view, dst, aligned)
    assert not aligned.copy_to_host().any()


@cuda.jit
def misaligned_vector_access(src, dst, load):
    if load:
        a, b, c, d = load16(src, 1)
        dst[0] = a + b + c + d
    else:
        store16(dst, 1, (src[0], src[1], src[2], src[3]))


@pytest.mark.sim_only(reason="on a GPU the launch fails with a misaligned-address error")
@pytest.mark.parametrize("load", [True, False])
def test_misaligned_vector_access_faults(load):
    src = cuda.to_device(np.arange(16, dtype=np.float32))
    dst = cuda.to_device(np.zeros(16, np.float32))
    what = "load" if load else "store"
    with pytest.raises(sim.SimulationError, match=f"vector {what}: misaligned address"):
        misaligned_vector_access[1, 1](src, dst, load)
    assert not dst.copy_to_host().any()


@cuda.jit
def shared_misaligned_load(out):
    s = cuda.shared.array(16, np.float32, alignment=16)
    for k in range(16):
        s[k] = k
    a, b, c, d = load16_shared(s, 2)
    out[0] = a + b + c + d


@pytest.mark.sim_only(reason="on a GPU the launch fails with a misaligned-address error")
def test_misaligned_shared_vector_load_faults():
    with pytest.raises(sim.SimulationError, match="misaligned address"):
        shared_misaligned_load[1, 1](np.zeros(1, np.float32))


# -------------------------------------------------------------------------------------------
# Profiler: traffic, bounds, bank conflicts
# -------------------------------------------------------------------------------------------


@pytest.mark.sim_only(
    reason="the profiler measures traffic and bank conflicts in the simulator only"
)
@given(
    dtype=st.sampled_from(DTYPES),
    rows=st.sampled_from([0, *EDGES]),
    cols=st.sampled_from([0, *EDGES]),
)
def test_global_to_shared_reads_only_the_valid_region(dtype, rows, cols):
    _, stage_one_tile, _, _ = kernels((32, 32), dtype, "auto")
    src = random_array((rows, cols), dtype)
    out = np.zeros((32, 32), dtype)
    with sim.profile() as prof:
        stage_one_tile[1, THREADS](src, 16, 16, sentinel(dtype), out)
    valid = max(0, min(rows, 48) - 16) * max(0, min(cols, 48) - 16)
    itemsize = np.dtype(dtype).itemsize
    assert prof.out_of_bounds == []
    assert prof.traffic[("stage_one_tile", "src")] == [valid * itemsize, 0]
    assert prof.races == []
    np.testing.assert_array_equal(out, expected_tile(src, 16, 16, out.shape, sentinel(dtype)))


def _transpose_profile(kernel, src):
    dst = np.zeros(src.shape[::-1], src.dtype)
    with sim.profile() as prof:
        kernel[grid(src.shape, (32, 32)), THREADS](src, dst)
    np.testing.assert_array_equal(dst, src.T)
    assert prof.out_of_bounds == [] and prof.races == []
    return prof


@pytest.mark.sim_only(
    reason="the profiler measures traffic and bank conflicts in the simulator only"
)
@pytest.mark.parametrize("rows, cols", [(32, 32), (31, 33), (65, 33), (1, 64)])
def test_padded_transpose_is_conflict_free_and_moves_each_element_once(rows, cols):
    ex = load_example("transpose")
    src = random_array((rows, cols), np.float32)
    prof = _transpose_profile(ex.transpose_padded, src)
    assert prof.bank_conflicts == 0, str(prof)
    assert prof.bytes_read == prof.bytes_written == rows * cols * 4


def predicted_transpose_conflicts(tile: Tile, blocks: int) -> int:
    """Bank conflicts the model predicts for a transpose of whole tiles staged by make_stager.

    Per warp: the staging stores walk the tile in rows, ``stager.row_vector`` elements per lane
    (one STS.128 when the pitch keeps rows 16-byte aligned, else one-element stores); the
    transposed reads walk it in columns, ``stager.column_vector`` elements down a column per
    lane.
    """
    stage = make_stager(tile)
    vg, vt = stage.row_vector, stage.column_vector
    (rows, cols), shape = tile.shape, tile.padded_shape
    per_block = 0
    for step in range(-(-rows * cols // (32 * vg))):  # a warp's 32 chunks, whatever the block
        p = step * 32 * vg
        scalar = shape[1] % vg != 0 or vg == 1
        per_block += sum(
            w - ideal
            for w, ideal in request_wavefronts(
                shape, tile.dtype, "row", vg, scalar=scalar, cols=cols, start=divmod(p, cols)
            )
        )
    for step in range(-(-rows * cols // (32 * vt))):
        p = step * 32 * vt
        per_block += sum(
            w - ideal
            for w, ideal in request_wavefronts(
                shape, tile.dtype, "column", vt, cols=cols, start=(p % rows, p // rows)
            )
        )
    return blocks * per_block


@pytest.mark.sim_only(
    reason="the profiler measures traffic and bank conflicts in the simulator only"
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_padded_transpose_conflicts_match_the_model_for_every_dtype(dtype):
    # 16-byte chunks would conflict 2 ways for float16 (stored element by element into the
    # padded, not 16-byte aligned rows) and float64 (2 doubles per lane down a column put 16
    # lanes on 8 bank pairs whatever the pitch); the model says so, and the stager then walks
    # one element per lane instead, which the padding makes conflict free.
    tile, _, _, transpose = kernels((32, 32), dtype, "auto")
    src = random_array((64, 64), dtype)
    prof = _transpose_profile(transpose, src)
    assert prof.bytes_read == prof.bytes_written == src.nbytes
    assert prof.bank_conflicts == predicted_transpose_conflicts(tile, blocks=4) == 0, str(prof)
    v = tile.vector_elements
    reads = bank_conflict_degree(tile.padded_shape, dtype, "column", v, cols=32)
    stores = bank_conflict_degree(tile.padded_shape, dtype, "row", v, scalar=True, cols=32)
    expected = {np.float16: (1, 2), np.float32: (1, 1), np.int32: (1, 1), np.float64: (2, 2)}
    assert (reads, stores) == expected[dtype]
    stage = make_stager(tile)
    assert stage.row_vector == (v if stores == 1 else 1)
    assert stage.column_vector == (v if reads == 1 else 1)


def _staging_profile(tile: Tile, src, transposed: bool):
    _, _, copy, transpose = kernels(tile.shape, tile.dtype, tile.pad)
    kernel = transpose if transposed else copy
    dst = np.zeros(src.shape[::-1] if transposed else src.shape, src.dtype)
    with sim.profile() as prof:
        kernel[grid(src.shape, tile.shape), THREADS](src, dst)
    np.testing.assert_array_equal(dst, src.T if transposed else src)
    return prof


@pytest.mark.sim_only(
    reason="the profiler measures traffic and bank conflicts in the simulator only"
)
def test_the_two_staging_cases_of_the_prebuilt_ops_issue_are_conflict_free():
    # A (64, 32) float32 column tile gets pad 1 and the model calls it conflict free; the
    # transposed store used to read 4 floats per lane down a column, 16 lanes per column
    # (2-way, 64 extra wavefronts per block whatever the pad).
    column = Tile((64, 32), np.float32, pad="auto", access="column")
    assert column.pad == 1 and column.conflict_degree == 1
    prof = _staging_profile(column, random_array((64, 32), np.float32), transposed=True)
    assert prof.bank_conflicts == 0, str(prof)
    # global_to_shared into a (16, 34) tile: 16-byte chunks stored element by element at a
    # pitch of 34 floats put rows 0 and 2 on the same banks (2-way).
    row = Tile((16, 32), np.float32, pad=2)
    assert row.padded_shape == (16, 34) and row.conflict_degree == 1
    prof = _staging_profile(row, random_array((16, 32), np.float32), transposed=False)
    assert prof.bank_conflicts == 0, str(prof)


@pytest.mark.sim_only(
    reason="the profiler measures traffic and bank conflicts in the simulator only"
)
@given(
    shape=st.sampled_from([(16, 32), (32, 16), (64, 32), (32, 64), (8, 32), (32, 8)]),
    dtype=st.sampled_from(DTYPES),
    access=st.sampled_from(["row", "column"]),
    pad=st.integers(0, 4),
)
def test_a_tile_the_model_calls_conflict_free_is_staged_without_conflicts(
    shape, dtype, access, pad
):
    """Every direction the stager walks: if the model calls the plain row walk and the plain
    column walk of the pitch conflict free, the profile shows no conflicts either way."""
    try:
        tile = Tile(shape, dtype, pad=pad, access=access)
    except ValueError:  # a pad that breaks the alignment a vector access needs
        assume(False)
    cols = shape[1]
    plain = [
        bank_conflict_degree(tile.padded_shape, dtype, a, 1, cols=cols) for a in ("row", "column")
    ]
    src = random_array(shape, dtype)
    for transposed in (False, True):
        prof = _staging_profile(tile, src, transposed)
        if plain == [1, 1]:
            assert prof.bank_conflicts == 0, (tile, transposed, str(prof))
        assert prof.bank_conflicts == predicted_transpose_conflicts(tile, 1) or not transposed


@pytest.mark.sim_only(
    reason="the profiler measures traffic and bank conflicts in the simulator only"
)
@pytest.mark.parametrize("rows, cols", [(32, 32), (64, 32), (32, 96)])
def test_model_agrees_with_measured_conflicts(rows, cols):
    ex = load_example("transpose")
    src = random_array((rows, cols), np.float32)
    blocks = (rows // 32) * (cols // 32)
    unpadded = _transpose_profile(ex.transpose_unpadded, src)
    padded = _transpose_profile(ex.transpose_padded, src)
    assert unpadded.bank_conflicts == predicted_transpose_conflicts(ex.PLAIN, blocks) > 0
    assert padded.bank_conflicts == predicted_transpose_conflicts(ex.PADDED, blocks) == 0
    # 8 lanes read each of 4 columns per request: the model's degree for that walk.
    assert bank_conflict_degree(ex.PLAIN_SHAPE, np.float32, "column", 4) == 8
    assert unpadded.bytes_read == unpadded.bytes_written == rows * cols * 4
    assert "memory.py" in next(iter(unpadded.conflict_lines))


def test_example_runs():
    ex = load_example("transpose")
    assert ex.run(70, 33) == (70, 33)
    np.testing.assert_array_equal(ex.transpose(np.zeros((0, 5), np.float32)), np.zeros((5, 0)))
