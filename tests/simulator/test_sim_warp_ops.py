"""Warp operations in the simulator against their definitions (CUDA programming guide, PTX ISA).

The references below are written from the definitions, independently of tessera_tile.sim.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

import tessera_tile  # noqa: F401 - importing it installs the warp-aware simulator

FULL = 0xFFFFFFFF

lane_values = st.lists(st.integers(-1000, 1000), min_size=32, max_size=32)
masks = st.integers(1, FULL)


@cuda.jit
def shuffle_kernel(x, out, mode, b):
    i = cuda.grid(1)
    v = x[i]
    if mode == 0:
        out[i] = cuda.shfl_sync(FULL, v, b)
    elif mode == 1:
        out[i] = cuda.shfl_up_sync(FULL, v, b)
    elif mode == 2:
        out[i] = cuda.shfl_down_sync(FULL, v, b)
    else:
        out[i] = cuda.shfl_xor_sync(FULL, v, b)


def shuffle_reference(x, mode, b):
    out = np.empty_like(x)
    b &= 31  # PTX uses the low 5 bits of the lane / offset operand
    for w in range(0, len(x), 32):
        for lane in range(32):
            if mode == 0:
                src = b
            elif mode == 1:
                src = lane - b if lane - b >= 0 else lane
            elif mode == 2:
                src = lane + b if lane + b < 32 else lane
            else:
                src = lane ^ b
            out[w + lane] = x[w + src]
    return out


@given(
    warps=st.integers(1, 2),
    mode=st.integers(0, 3),
    b=st.integers(0, 40),
    dtype=st.sampled_from([np.int32, np.int64, np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_shuffles_match_definition(warps, mode, b, dtype, seed):
    x = (np.random.default_rng(seed).standard_normal(32 * warps) * 100).astype(dtype)
    out = np.zeros_like(x)
    shuffle_kernel[1, 32 * warps](x, out, mode, b)
    np.testing.assert_array_equal(out, shuffle_reference(x, mode, b))
    assert out.dtype == dtype


@cuda.jit
def vote_kernel(pred, mask, out_all, out_any, out_eq, out_ballot):
    lane = cuda.threadIdx.x
    if (mask >> lane) & 1:
        p = pred[lane]
        out_all[lane] = cuda.all_sync(mask, p)
        out_any[lane] = cuda.any_sync(mask, p)
        out_eq[lane] = cuda.eq_sync(mask, p)
        out_ballot[lane] = cuda.ballot_sync(mask, p)


@given(pred=st.lists(st.integers(0, 1), min_size=32, max_size=32), mask=masks)
def test_votes_match_definition_with_any_mask(pred, mask):
    pred = np.array(pred, dtype=np.int32)
    outs = [np.full(32, -7, dtype=np.int32) for _ in range(3)] + [np.zeros(32, np.uint32)]
    vote_kernel[1, 32](pred, mask, *outs)
    members = [lane for lane in range(32) if (mask >> lane) & 1]
    p = pred[members].astype(bool)
    ballot = sum(1 << lane for lane in members if pred[lane])
    for out, expected in zip(outs, [p.all(), p.any(), p.all() or not p.any(), ballot], strict=True):
        np.testing.assert_array_equal(out[members], int(expected))
        outside = [lane for lane in range(32) if lane not in members]
        assert np.all(out[outside] == (0 if out.dtype == np.uint32 else -7))


@cuda.jit
def match_kernel(x, out_any, out_all, out_pred):
    lane = cuda.threadIdx.x
    out_any[lane] = cuda.match_any_sync(FULL, x[lane])
    m, p = cuda.match_all_sync(FULL, x[lane])
    out_all[lane] = m
    out_pred[lane] = p


@given(values=st.lists(st.integers(0, 3), min_size=32, max_size=32))
def test_match_matches_definition(values):
    x = np.array(values, dtype=np.int32)
    out_any, out_all, out_pred = (np.zeros(32, np.uint32) for _ in range(3))
    match_kernel[1, 32](x, out_any, out_all, out_pred)
    for lane in range(32):
        assert out_any[lane] == sum(1 << j for j in range(32) if x[j] == x[lane])
    same = bool(np.all(x == x[0]))
    assert np.all(out_all == (FULL if same else 0)) and np.all(out_pred == same)


@cuda.jit
def divergent_kernel(group_of, out_ballot, out_active, out_lt):
    lane = cuda.laneid
    g = group_of[lane]
    mask = 0
    for j in range(32):
        if group_of[j] == g:
            mask |= 1 << j
    if g == 0:
        out_ballot[lane] = cuda.ballot_sync(mask, True)
        out_active[lane] = cuda.activemask()
    else:
        out_ballot[lane] = cuda.ballot_sync(mask, True)
        out_active[lane] = cuda.activemask()
    cuda.syncwarp()
    out_lt[lane] = cuda.lanemask_lt()


@given(groups=st.lists(st.integers(0, 1), min_size=32, max_size=32))
def test_divergent_branches_see_their_own_lanes(groups):
    group_of = np.array(groups, dtype=np.int32)
    out_ballot, out_active, out_lt = (np.zeros(32, np.uint32) for _ in range(3))
    divergent_kernel[1, 32](group_of, out_ballot, out_active, out_lt)
    for lane in range(32):
        same = sum(1 << j for j in range(32) if group_of[j] == group_of[lane])
        assert out_ballot[lane] == same and out_active[lane] == same
        assert out_lt[lane] == (1 << lane) - 1


@cuda.jit
def partial_warp_sum(x, out):
    i = cuda.threadIdx.x
    n = cuda.blockDim.x
    base = i - cuda.laneid
    lanes = min(32, n - base)
    mask = (1 << lanes) - 1 if lanes < 32 else FULL
    v = x[i]
    off = 16
    while off > 0:
        other = cuda.shfl_down_sync(mask, v, off)
        if cuda.laneid + off < lanes:
            v += other
        off //= 2
    if cuda.laneid == 0:
        out[i // 32] = v


@pytest.mark.parametrize("n", [1, 31, 32, 33, 63, 64, 65])
def test_partial_warp_reduction_with_exact_mask(n):
    x = np.arange(1, n + 1, dtype=np.int64)
    out = np.zeros(-(-n // 32), np.int64)
    partial_warp_sum[1, n](x, out)
    expected = [x[w : w + 32].sum() for w in range(0, n, 32)]
    np.testing.assert_array_equal(out, expected)


@cuda.jit
def syncthreads_votes(pred, out):
    i = cuda.threadIdx.x
    out[0] = cuda.syncthreads_count(pred[i])
    out[1] = cuda.syncthreads_and(pred[i])
    out[2] = cuda.syncthreads_or(pred[i])


@given(pred=st.lists(st.integers(0, 1), min_size=1, max_size=70))
def test_syncthreads_reductions(pred):
    p = np.array(pred, dtype=np.int32)
    out = np.zeros(3, np.int32)
    syncthreads_votes[1, len(p)](p, out)
    np.testing.assert_array_equal(out, [p.sum(), p.all(), p.any()])


@cuda.jit
def warpsize_and_laneid(out):
    i = cuda.threadIdx.x
    out[i, 0] = cuda.laneid
    out[i, 1] = cuda.warpsize


def test_laneid_and_warpsize():
    out = np.zeros((70, 2), np.int32)
    warpsize_and_laneid[1, 70](out)
    np.testing.assert_array_equal(out[:, 0], np.arange(70) % 32)
    assert np.all(out[:, 1] == 32)


@cuda.jit
def laneid_2d(out):
    out[cuda.threadIdx.y, cuda.threadIdx.x] = cuda.laneid


def test_lanes_follow_linear_thread_index_in_2d_blocks():
    out = np.zeros((4, 24), np.int32)
    laneid_2d[1, (24, 4)](out)
    np.testing.assert_array_equal(out.ravel(), np.arange(96) % 32)


# -- masks naming lanes that exited or do not exist (PTX: they are not waited for) -------------


@cuda.jit
def full_mask_votes(pred, x, out):
    i = cuda.threadIdx.x
    if pred[i] < 0:
        return  # exits before the warp operations
    p = pred[i] == 1
    out[i, 0] = cuda.ballot_sync(FULL, p)
    out[i, 1] = cuda.all_sync(FULL, p)
    out[i, 2] = cuda.any_sync(FULL, p)
    out[i, 3] = cuda.match_any_sync(FULL, x[i])
    bits, same = cuda.match_all_sync(FULL, x[i])
    out[i, 4] = bits
    out[i, 5] = same
    out[i, 6] = cuda.shfl_sync(FULL, x[i], cuda.ffs(cuda.ballot_sync(FULL, True)) - 1)
    cuda.syncwarp(FULL)


@given(
    n=st.sampled_from([1, 10, 31, 32, 33, 40, 64]),
    preds=st.lists(st.integers(-1, 1), min_size=64, max_size=64),
    values=st.lists(st.integers(0, 2), min_size=64, max_size=64),
)
def test_full_mask_covers_the_lanes_that_take_part(n, preds, values):
    pred = np.array(preds[:n], np.int32)
    x = np.array(values[:n], np.int32)
    out = np.full((n, 7), -7, np.int64)
    full_mask_votes[1, n](pred, x, out)
    for w in range(0, n, 32):
        lanes = [lane for lane in range(min(32, n - w)) if pred[w + lane] >= 0]
        if not lanes:
            continue
        ballot = sum(1 << lane for lane in lanes if pred[w + lane] == 1)
        votes = [pred[w + lane] == 1 for lane in lanes]
        same = all(x[w + lane] == x[w + lanes[0]] for lane in lanes)
        for lane in lanes:
            row = out[w + lane]
            assert np.uint32(row[0] & FULL) == ballot
            assert (row[1], row[2]) == (all(votes), any(votes))
            group = sum(1 << j for j in lanes if x[w + j] == x[w + lane])
            assert row[3] & FULL == group
            assert (row[4] & FULL, row[5]) == ((sum(1 << j for j in lanes), 1) if same else (0, 0))
            assert row[6] == x[w + lanes[0]]  # the lowest lane that takes part
    exited = pred < 0
    assert np.all(out[exited] == -7)


# -- integers are typed as Numba types them ----------------------------------------------------


@cuda.jit
def int_arithmetic(x, u, wide, narrow):
    i = cuda.threadIdx.x
    wide[i, 0] = x[i] + x[i]  # int32 + int32 is int64 in Numba
    wide[i, 1] = x[i] * 4 - 1
    wide[i, 2] = (x[i] << 2) >> 1
    wide[i, 3] = u[i] + u[i]  # uint32 + uint32 is uint64
    wide[i, 4] = -x[i]  # negated at 32 bits, then widened: -(-2**31) stays -2**31
    wide[i, 5] = -u[i]
    wide[i, 6] = ~u[i]  # inverted at 32 bits, then widened
    narrow[i] = x[i] + x[i]  # stored back into int32: wraps around


def test_int32_arithmetic_widens_to_64_bits_and_stores_wrap():
    x = np.array([2**30, 2**31 - 1, -(2**31), -5], np.int32)
    u = np.array([2**31, 2**32 - 1, 0, 7], np.uint32)
    wide = np.zeros((4, 7), np.int64)
    narrow = np.zeros(4, np.int32)
    int_arithmetic[1, 4](x, u, wide, narrow)
    x64, u64 = x.astype(np.int64), u.astype(np.int64)
    np.testing.assert_array_equal(wide[:, 0], 2 * x64)
    np.testing.assert_array_equal(wide[:, 1], 4 * x64 - 1)
    np.testing.assert_array_equal(wide[:, 2], (x64 << 2) >> 1)
    np.testing.assert_array_equal(wide[:, 3], 2 * u64)
    np.testing.assert_array_equal(wide[:, 4], (-x64).astype(np.int32))  # seen on an H200
    np.testing.assert_array_equal(wide[:, 5], -u64 % 2**32)
    np.testing.assert_array_equal(wide[:, 6], 2**32 - 1 - u64)
    np.testing.assert_array_equal(narrow, (2 * x64).astype(np.int32))  # two's complement wrap


@cuda.jit
def bit_counts(x, out):
    i = cuda.threadIdx.x
    out[i, 0] = cuda.popc(cuda.ballot_sync(FULL, x[i] >= 0))
    out[i, 1] = cuda.popc(x[i])
    out[i, 2] = cuda.clz(x[i])
    out[i, 3] = cuda.ffs(x[i])


def test_bit_operations_use_the_operands_width():
    # A ballot with lane 31 set is a negative int32: popc still counts its 32 bits.
    x = np.array([-1, 0, 1, 2**31 - 1, -(2**31), 12] + [5] * 26, np.int32)
    out = np.zeros((32, 4), np.int64)
    bit_counts[1, 32](x, out)
    bits = x.view(np.uint32).astype(np.int64)
    assert np.all(out[:, 0] == np.sum(x >= 0))
    np.testing.assert_array_equal(out[:, 1], [bin(b).count("1") for b in bits])
    np.testing.assert_array_equal(out[:, 2], [32 - int(b).bit_length() for b in bits])
    np.testing.assert_array_equal(out[:, 3], [(int(b) & -int(b)).bit_length() for b in bits])


TABLE = np.array([2**30, 3], np.int32)


@cuda.jit
def local_shared_const_ints(out):
    local = cuda.local.array(2, np.int32)
    shared = cuda.shared.array(2, np.int32)
    table = cuda.const.array_like(TABLE)
    local[0] = table[0]
    shared[0] = table[0]
    cuda.syncthreads()
    out[0] = local[0] + local[0]
    out[1] = shared[0] * 4
    out[2] = table[0] + table[0] + table[1]


def test_local_shared_and_const_int32_arrays_widen_too():
    out = np.zeros(3, np.int64)
    local_shared_const_ints[1, 1](out)
    np.testing.assert_array_equal(out, [2**31, 2**32, 2**31 + 3])
