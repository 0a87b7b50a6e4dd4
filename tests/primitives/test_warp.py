"""tessera_tile.warp against NumPy: warp and block reductions, all-reductions, argmax/argmin, scans.

Block sizes straddle warp boundaries (the last warp partial), dtypes cover float16 (accumulated in
float32), float32, float64 and int32. Kernels come from memoised factories, like the library's.
"""

import functools

import numpy as np
import pytest
from helpers import load_example
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda, float32, int32

import tessera_tile  # noqa: F401 - importing it installs the warp-aware simulator
from tessera_tile import warp
from tessera_tile.warp import (
    FULL_MASK,
    add,
    make_block_allreduce,
    make_block_argmax,
    make_block_argmin,
    make_block_reduce,
    make_warp_allreduce,
    make_warp_exclusive_scan,
    make_warp_inclusive_scan,
    make_warp_reduce,
    maximum,
    minimum,
    multiply,
    prefix_mask,
    warp_argmax,
    warp_argmin,
)

WARP_SIZES = [1, 2, 31, 32, 33, 63, 64, 65, 96, 100, 127, 128, 129]
BLOCK_SIZES = [1, 31, 32, 33, 63, 64, 65, 96, 100, 127, 128, 129, 257, 1000]
DTYPES = [np.float16, np.float32, np.float64, np.int32]
NUMPY_OP = {add: np.add, multiply: np.multiply, maximum: np.maximum, minimum: np.minimum}
ACCUMULATOR = {np.float16: np.float32, np.float32: np.float32, np.float64: np.float64}


@cuda.jit(device=True)
def absmax(a, b):
    """A user-supplied op: the value of larger magnitude (ties: the larger value)."""
    if abs(a) > abs(b) or (abs(a) == abs(b) and a > b):
        return a
    return b


@cuda.jit(device=True)
def first(a, b):
    """Associative but not commutative: a scan with it shows the order of its arguments."""
    return a


@cuda.jit(device=True)
def same(x):
    return x


def absmax_reduce(x):
    return x[np.lexsort((x, np.abs(x)))[-1]]


NUMPY_OP[absmax] = None  # reduced by absmax_reduce


def data(dtype, shape, seed, op=add):
    """Normal floats (0.7..1.3 for products) and small ints (no int32 overflow)."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i":
        low, high = (-1, 2) if op is multiply else (-50, 51)
        return rng.integers(low, high, size=shape).astype(dtype)
    if op is multiply:
        return rng.uniform(0.7, 1.3, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def reduce_numpy(op, x):
    """Reduce in float64 (ints exactly in int64): the reference for any summation order."""
    x = x.astype(np.int64) if x.dtype.kind == "i" else x.astype(np.float64)
    if op is absmax:
        return absmax_reduce(x)
    return NUMPY_OP[op].reduce(x)


def assert_close(actual, expected, dtype, op, x):
    """Exact for ints, max and min; for sums and products, within the rounding of any order.

    A tree of depth d over the values x errs by at most d * eps * sum|x| (sum) and a product of n
    factors by n * eps relative, however it is ordered.
    """
    if np.dtype(dtype).kind == "i" or op in (maximum, minimum, absmax):
        np.testing.assert_array_equal(actual, expected)
        return
    eps = np.finfo(ACCUMULATOR[dtype]).eps
    n = max(np.size(x), 2)
    if op is multiply:
        np.testing.assert_allclose(actual, expected, rtol=2 * n * eps)
    else:
        atol = 2 * (np.log2(n) + 2) * eps * np.abs(x.astype(np.float64)).sum()
        np.testing.assert_allclose(actual, expected, rtol=0, atol=atol)


def segments(n):
    """(start, stop) of each warp of an n-thread block."""
    return [(s, min(s + 32, n)) for s in range(0, n, 32)]


# -- warp reductions ---------------------------------------------------------------------------


@functools.cache
def warp_reduce_kernel(op, dtype):
    reduce = make_warp_reduce(op, dtype)
    allreduce = make_warp_allreduce(op, dtype)

    @cuda.jit
    def kernel(x, lane0, every):
        i = cuda.threadIdx.x
        # The last warp of the block may be partial: name only the lanes that exist.
        mask = prefix_mask(cuda.blockDim.x - (i - cuda.laneid))
        r = reduce(x[i], mask)
        if cuda.laneid == 0:
            lane0[i // 32] = r
        every[i] = allreduce(x[i], mask)

    return kernel


def run_warp_reduce(op, dtype, n, seed):
    x = data(dtype, n, seed, op)
    out_dtype = ACCUMULATOR.get(dtype, np.int64)
    lane0 = np.zeros(len(segments(n)), out_dtype)
    every = np.zeros(n, out_dtype)
    warp_reduce_kernel(op, dtype)[1, n](x, lane0, every)
    for w, (a, b) in enumerate(segments(n)):
        expected = reduce_numpy(op, x[a:b])
        assert_close(lane0[w], expected, dtype, op, x[a:b])
        # An all-reduce leaves every lane bitwise equal, and equal to the reduction.
        assert_close(every[a:b], np.full(b - a, expected), dtype, op, x[a:b])
        assert np.all(every[a:b] == every[a]), every[a:b]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", [add, maximum, minimum, multiply], ids=lambda f: f.__name__)
@given(n=st.sampled_from(WARP_SIZES), seed=st.integers(0, 2**16))
def test_warp_reduce_and_allreduce_match_numpy(op, dtype, n, seed):
    run_warp_reduce(op, dtype, n, seed)


@given(n=st.sampled_from(WARP_SIZES), seed=st.integers(0, 2**16))
def test_warp_reduce_with_a_user_op(n, seed):
    run_warp_reduce(absmax, np.float32, n, seed)


@pytest.mark.parametrize("op", [add, maximum, minimum, multiply], ids=lambda f: f.__name__)
def test_ready_made_warp_functions_are_the_factories(op):
    name = {add: "sum", maximum: "max", minimum: "min", multiply: "prod"}[op]
    assert getattr(warp, f"warp_{name}") is make_warp_reduce(op)
    assert getattr(warp, f"warp_all{name}") is make_warp_allreduce(op)


@functools.cache
def run_kernel(lo, k):
    """Lanes lo .. lo+k-1 of one warp reduce and scan; the others do nothing."""
    reduce = warp.warp_sum
    allreduce = warp.warp_allmax
    scan = warp.warp_inclusive_sum

    @cuda.jit
    def kernel(x, out):
        lane = cuda.laneid
        if lo <= lane < lo + k:
            mask = prefix_mask(k) << lo
            v = x[lane]
            r = reduce(v, mask)
            if lane == lo:
                out[0, 0] = r
            out[1, lane] = allreduce(v, mask)
            out[2, lane] = scan(v, mask)

    return kernel


@given(lo=st.integers(0, 31), k=st.integers(1, 32), seed=st.integers(0, 2**16))
def test_a_run_of_lanes_not_starting_at_lane_0(lo, k, seed):
    k = min(k, 32 - lo)
    x = data(np.float32, 32, seed)
    out = np.zeros((3, 32), np.float32)
    run_kernel(lo, k)[1, 32](x, out)
    seg = x[lo : lo + k].astype(np.float64)
    np.testing.assert_allclose(out[0, 0], seg.sum(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[1, lo : lo + k], seg.max())
    np.testing.assert_allclose(out[2, lo : lo + k], np.cumsum(seg), rtol=1e-5, atol=1e-5)


# -- block reductions --------------------------------------------------------------------------


@functools.cache
def block_reduce_kernel(op, dtype):
    reduce = make_block_reduce(op, dtype)
    allreduce = make_block_allreduce(op, dtype)

    @cuda.jit
    def kernel(x, first_thread, every):
        tid, dim = cuda.threadIdx, cuda.blockDim
        t = tid.x + dim.x * (tid.y + dim.y * tid.z)
        b = cuda.blockIdx.x
        r = reduce(x[b, t])
        if t == 0:
            first_thread[b] = r
        # A second call of the same function reuses its shared scratch.
        every[b, t] = allreduce(x[b, t])
        r = reduce(x[b, t])
        if t == 0:
            first_thread[b] = op(first_thread[b], r)

    return kernel


def run_block_reduce(op, dtype, block, seed, blocks=2):
    n = int(np.prod(block))
    x = data(dtype, (blocks, n), seed, op)
    out_dtype = ACCUMULATOR.get(dtype, np.int32)
    first_thread = np.zeros(blocks, out_dtype)
    every = np.zeros((blocks, n), out_dtype)
    block_reduce_kernel(op, dtype)[blocks, block](x, first_thread, every)
    for b, row in enumerate(x):
        expected = reduce_numpy(op, row)
        # The kernel reduced twice and combined the two results in thread 0.
        twice = {add: 2 * expected, multiply: expected * expected}.get(op, expected)
        assert_close(first_thread[b], twice, dtype, op, np.concatenate([row, row]))
        assert_close(every[b], np.full(n, expected), dtype, op, row)
        assert np.all(every[b] == every[b, 0])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", [add, maximum, minimum, multiply], ids=lambda f: f.__name__)
@given(n=st.sampled_from(BLOCK_SIZES), seed=st.integers(0, 2**16))
def test_block_reduce_matches_numpy(op, dtype, n, seed):
    if op is multiply:
        n = min(n, 129)  # keep products of 0.7..1.3 inside float16's accumulator range
    run_block_reduce(op, dtype, n, seed)


@given(
    shape=st.sampled_from([(10, 7), (32, 2), (33, 3), (7, 5, 3), (1, 40)]),
    seed=st.integers(0, 2**16),
)
def test_block_reduce_with_a_2d_or_3d_block(shape, seed):
    run_block_reduce(add, np.float32, shape, seed, blocks=1)


def test_block_reduce_of_1024_threads():
    run_block_reduce(add, np.float32, 1024, seed=1, blocks=1)
    run_block_reduce(absmax, np.float64, 1024, seed=2, blocks=1)


@pytest.mark.filterwarnings("ignore:overflow encountered")  # NumPy's int32, in the simulator
def test_int32_block_sum_stays_int32_and_wraps_like_cuda():
    x = np.full((1, 64), 2**30, np.int32)
    out = np.zeros(1, np.int32)
    every = np.zeros((1, 64), np.int32)
    block_reduce_kernel(add, np.int32)[1, 64](x, out, every)
    assert every[0, 0] == np.int32(0)  # 64 * 2**30 = 2**36 wraps to 0 in 32 bits


def test_generic_int32_warp_sum_widens_to_int64_like_numba():
    # Numba types int32 + int32 as int64: with no dtype the sum is exact, 32 * 2**30 = 2**35
    # (a simulator computing in NumPy's int32 wrapped it to 0).
    x = np.full(32, 2**30, np.int32)
    lane0 = np.zeros(1, np.int64)
    every = np.zeros(32, np.int64)
    warp_reduce_kernel(add, None)[1, 32](x, lane0, every)
    assert lane0[0] == 2**35
    np.testing.assert_array_equal(every, 2**35)


def test_factories_are_memoised_by_value():
    assert make_block_reduce(add, np.float32) is make_block_reduce(add, float32)
    assert make_warp_reduce(maximum, "float16") is make_warp_reduce(maximum, np.float16)
    assert make_block_argmax(np.float32) is not make_block_argmax(np.float32, broadcast=True)


@pytest.mark.parametrize("dtype", [np.uint32, np.complex64, np.bool_])
def test_unshufflable_dtypes_are_refused(dtype):
    with pytest.raises(TypeError, match="32- and 64-bit"):
        make_warp_reduce(add, dtype)


# -- argmax / argmin ---------------------------------------------------------------------------


def arg_data(dtype, shape, seed, nans):
    """Few distinct values (many ties) and, for floats, some NaN."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, size=shape).astype(dtype)
    if np.dtype(dtype).kind == "f" and nans:
        flat = x.reshape(-1)
        flat[rng.choice(flat.size, size=min(nans, flat.size), replace=False)] = np.nan
    return x


@functools.cache
def warp_arg_kernel(dtype):
    # Warp functions shuffle 32/64-bit values: float16 is converted by the caller.
    cast = float32 if dtype == np.float16 else same

    @cuda.jit
    def kernel(x, values, indices):
        i = cuda.threadIdx.x
        mask = prefix_mask(cuda.blockDim.x - (i - cuda.laneid))
        v, j = warp_argmax(cast(x[i]), i, mask)
        values[0, i] = v
        indices[0, i] = j
        v, j = warp_argmin(cast(x[i]), i, mask)
        values[1, i] = v
        indices[1, i] = j

    return kernel


def check_arg(values, indices, x, start):
    """Rows 0 and 1 of (values, indices): argmax and argmin of segment x, which starts at start."""
    for row, arg in ((0, np.argmax), (1, np.argmin)):
        k = arg(x)
        assert np.all(indices[row] == start + k), (arg.__name__, x, indices[row], start + k)
        np.testing.assert_array_equal(values[row], x[k].astype(values.dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@given(n=st.sampled_from(WARP_SIZES), seed=st.integers(0, 2**16), nans=st.integers(0, 3))
def test_warp_argmax_argmin_ties_and_nan(dtype, n, seed, nans):
    x = arg_data(dtype, n, seed, nans)
    values = np.zeros((2, n), ACCUMULATOR.get(dtype, np.int32))
    indices = np.full((2, n), -1, np.int32)
    warp_arg_kernel(dtype)[1, n](x, values, indices)
    for a, b in segments(n):
        check_arg(values[:, a:b], indices[:, a:b], x[a:b], a)


@functools.cache
def block_arg_kernel(dtype, broadcast):
    argmax = make_block_argmax(dtype, broadcast)
    argmin = make_block_argmin(dtype, broadcast)

    @cuda.jit
    def kernel(x, values, indices):
        t = cuda.threadIdx.x
        b = cuda.blockIdx.x
        v, i = argmax(x[b, t], t)
        w, j = argmin(x[b, t], t)
        if broadcast or t == 0:
            values[b, 0, t] = v
            indices[b, 0, t] = i
            values[b, 1, t] = w
            indices[b, 1, t] = j

    return kernel


@pytest.mark.parametrize("broadcast", [False, True], ids=["thread0", "broadcast"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@given(n=st.sampled_from(BLOCK_SIZES), seed=st.integers(0, 2**16), nans=st.integers(0, 3))
def test_block_argmax_argmin_ties_and_nan(dtype, broadcast, n, seed, nans):
    blocks = 2
    x = arg_data(dtype, (blocks, n), seed, nans)
    values = np.zeros((blocks, 2, n), ACCUMULATOR.get(dtype, np.int32))
    indices = np.full((blocks, 2, n), -1, np.int32)
    block_arg_kernel(dtype, broadcast)[blocks, n](x, values, indices)
    width = n if broadcast else 1
    for b in range(blocks):
        check_arg(values[b, :, :width], indices[b, :, :width], x[b], 0)


def test_argmax_returns_the_first_nan_and_the_first_tie():
    x = np.array([1, 5, np.nan, 5, np.nan, 0] * 6, np.float32)
    values = np.zeros((1, 2, x.size), np.float32)
    indices = np.zeros((1, 2, x.size), np.int32)
    block_arg_kernel(np.float32, True)[1, x.size](x[None], values, indices)
    assert np.all(indices[0] == 2) and np.all(np.isnan(values[0]))
    x = np.array([1, 5, 0, 5, 0, 5] * 6, np.float32)
    block_arg_kernel(np.float32, True)[1, x.size](x[None], values, indices)
    assert np.all(indices[0, 0] == 1) and np.all(indices[0, 1] == 2)


# -- scans -------------------------------------------------------------------------------------


@functools.cache
def scan_kernel(op, dtype):
    inclusive = make_warp_inclusive_scan(op, dtype)
    exclusive = make_warp_exclusive_scan(op, dtype)

    @cuda.jit
    def kernel(x, identity, out):
        i = cuda.threadIdx.x
        mask = prefix_mask(cuda.blockDim.x - (i - cuda.laneid))
        out[0, i] = inclusive(x[i], mask)
        out[1, i] = exclusive(x[i], identity[0], mask)

    return kernel


SCAN_OPS = {add: np.cumsum, maximum: np.maximum.accumulate, first: lambda s: np.full_like(s, s[0])}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", list(SCAN_OPS), ids=lambda f: f.__name__)
@given(n=st.sampled_from(WARP_SIZES), seed=st.integers(0, 2**16))
def test_warp_scans_match_numpy(op, dtype, n, seed):
    x = data(dtype, n, seed)
    acc = ACCUMULATOR.get(dtype, np.int32)
    identity = np.array([0 if op is add else -(2**20)], acc)
    out = np.zeros((2, n), acc)
    scan_kernel(op, dtype)[1, n](x, identity, out)
    wide = np.float64 if acc != np.int32 else np.int64
    for a, b in segments(n):
        inclusive = SCAN_OPS[op](x[a:b].astype(wide))
        exclusive = np.concatenate([identity.astype(wide), inclusive[:-1]])
        if op is add and acc != np.int32:
            atol = 16 * np.finfo(acc).eps * np.abs(x[a:b].astype(wide)).sum()
            np.testing.assert_allclose(out[0, a:b], inclusive, rtol=0, atol=atol)
            np.testing.assert_allclose(out[1, a:b], exclusive, rtol=0, atol=atol)
        else:
            np.testing.assert_array_equal(out[0, a:b], inclusive.astype(acc))
            np.testing.assert_array_equal(out[1, a:b], exclusive.astype(acc))


@functools.cache
def ready_scan_kernel():
    @cuda.jit
    def kernel(x, out):
        i = cuda.threadIdx.x
        out[0, i] = warp.warp_inclusive_sum(x[i], FULL_MASK)
        out[1, i] = warp.warp_exclusive_sum(x[i], int32(0), FULL_MASK)

    return kernel


def test_ready_made_int_scans_over_a_full_warp():
    x = np.arange(1, 33, dtype=np.int32)
    out = np.zeros((2, 32), np.int64)
    ready_scan_kernel()[1, 32](x, out)
    np.testing.assert_array_equal(out[0], np.cumsum(x))
    np.testing.assert_array_equal(out[1], np.cumsum(x) - x)


# -- the example -------------------------------------------------------------------------------


@given(
    n_rows=st.sampled_from([0, 1, 5, 9, 37]),
    n_cols=st.sampled_from([0, 1, 31, 32, 33, 100]),
    seed=st.integers(0, 2**16),
)
def test_row_reductions_example_matches_numpy(n_rows, n_cols, seed):
    example = load_example("row_reductions")
    assert (
        example.run(n_rows=n_rows, n_cols=n_cols, warps_per_block=2, threads=65, seed=seed) < 1e-6
    )


def test_row_reductions_example_propagates_nan_and_handles_empty_rows():
    example = load_example("row_reductions")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    x[1, 2] = np.nan
    for kernel, launch in (
        (example.row_max_sum_warp, (2, (32, 2))),
        (example.row_max_sum_block, (2, 40)),
    ):
        row_max = np.zeros(3, np.float32)
        row_sum = np.zeros(3, np.float32)
        kernel[launch](x, row_max, row_sum)
        assert np.isnan(row_max[1]) and np.isnan(row_sum[1])
        np.testing.assert_array_equal(row_max[[0, 2]], [3, 11])
        np.testing.assert_array_equal(row_sum[[0, 2]], [6, 38])
    empty = np.zeros((2, 0), np.float32)
    row_max = np.zeros(2, np.float32)
    row_sum = np.ones(2, np.float32)
    example.row_max_sum_block[1, 33](empty, row_max, row_sum)
    assert np.all(row_max == -np.inf) and np.all(row_sum == 0)
