"""Tensor-core fragments (tessera_tile.mma) lane by lane against the PTX ISA's tables.

The layouts below are written from the PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating
point type", "ldmatrix") as tables per register, independently of the implementation's formulas.
"""

import functools
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from helpers import GROUP, TIG, c_fragment_coords, gather
from numba import cuda, float32, uint16, uint32
from numba.types import float16

from tessera_tile import mma

# Register r of a fragment covers an 8 x 8 quarter at (row offset, col offset); inside it, lane
# (groupID, threadID_in_group) holds row groupID, columns 2 * tig and 2 * tig + 1.
A_QUARTERS = [(0, 0), (8, 0), (0, 8), (8, 8)]  # a0a1, a2a3, a4a5, a6a7
# B (k x n): register r covers k rows 8r..8r+7 of column groupID; its halves are k = 2 tig, +1.
B_KROWS = [0, 8]

# float32 accumulation of 16 float16 products: stated bound relative to sum(|a||b|) + |c|.
MMA_RTOL = 1e-5


def a_fragment_coords():
    """coords[lane, h] = (row, col) of half h (0..7) of the A fragment."""
    out = np.empty((32, 8, 2), int)
    for reg, (r0, c0) in enumerate(A_QUARTERS):
        for half in range(2):
            out[:, 2 * reg + half] = np.stack([GROUP + r0, 2 * TIG + half + c0], axis=1)
    return out


def b_fragment_coords():
    out = np.empty((32, 4, 2), int)
    for reg, k0 in enumerate(B_KROWS):
        for half in range(2):
            out[:, 2 * reg + half] = np.stack([2 * TIG + half + k0, GROUP], axis=1)
    return out


def pack(halves):
    """(32, 2n) float16 -> (32, n) uint32 registers, low half first."""
    return np.ascontiguousarray(halves.astype(np.float16)).view(np.uint32)


def unpack(registers):
    return np.ascontiguousarray(registers).view(np.float16)


def small_ints(rng, shape):
    return rng.integers(-8, 9, shape).astype(np.float16)  # exact products and sums


# ---------------------------------------------------------------------------------------------
# ldmatrix: lane l points at row l of a 32 x 8 shared array, so matrix j is rows 8j..8j+7
# ---------------------------------------------------------------------------------------------


@functools.cache
def _ldmatrix_kernel(fn, count):
    @cuda.jit
    def kernel(x, out):
        s = cuda.shared.array((32, 8), float16, alignment=16)
        lane = cuda.threadIdx.x
        for j in range(8):
            s[lane, j] = x[lane, j]
        cuda.syncthreads()
        regs = fn(s, (lane, 0))
        if count == 1:
            out[lane, 0] = regs
        else:
            for j in range(count):
                out[lane, j] = regs[j]

    return kernel


LDMATRIX = [
    (mma.ldmatrix_x1, 1, False),
    (mma.ldmatrix_x2, 2, False),
    (mma.ldmatrix_x4, 4, False),
    (mma.ldmatrix_x1_trans, 1, True),
    (mma.ldmatrix_x2_trans, 2, True),
    (mma.ldmatrix_x4_trans, 4, True),
]


@pytest.mark.parametrize(
    ("fn", "count", "trans"), LDMATRIX, ids=lambda v: getattr(v, "__name__", v)
)
def test_ldmatrix_layout(fn, count, trans):
    x = np.arange(32 * 8, dtype=np.float16).reshape(32, 8)  # exact in float16
    out = np.zeros((32, count), np.uint32)
    _ldmatrix_kernel(fn, count)[1, 32](x, out)
    got = unpack(out).reshape(32, count, 2)
    for j in range(count):
        m = x[8 * j : 8 * j + 8]
        for half in range(2):
            # lane (g, t) gets row g, columns 2t and 2t + 1 (.trans: column g, rows 2t, 2t + 1)
            want = m[2 * TIG + half, GROUP] if trans else m[GROUP, 2 * TIG + half]
            np.testing.assert_array_equal(got[:, j, half], want, err_msg=f"matrix {j} half {half}")


# ---------------------------------------------------------------------------------------------
# mma from fragments packed on the host by the ISA tables
# ---------------------------------------------------------------------------------------------


def _from_registers(product):
    """A kernel of one warp: ``product`` (an m16n8k16 mma) of registers packed on the host."""

    @cuda.jit
    def kernel(fa, fb, fc, out):
        lane = cuda.threadIdx.x
        d = product(
            (fa[lane, 0], fa[lane, 1], fa[lane, 2], fa[lane, 3]),
            (fb[lane, 0], fb[lane, 1]),
            (fc[lane, 0], fc[lane, 1], fc[lane, 2], fc[lane, 3]),
        )
        for i in range(4):
            out[lane, i] = d[i]

    return kernel


mma_from_registers = _from_registers(mma.mma_m16n8k16)
mma_bf16_from_registers = _from_registers(mma.mma_m16n8k16_bf16)


def reference(a, b, c):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return a64 @ b64 + c, np.abs(a64) @ np.abs(b64) + np.abs(c)


def pack_bf16(values):
    """(32, 2n) values -> (32, n) uint32 registers of bfloat16 (rounded), low half first."""
    return np.ascontiguousarray(values.astype(ml_dtypes.bfloat16)).view(np.uint32)


# (kernel, packing, operands' dtype, their scale): bfloat16 far past float16's range, its
# products exact in float32 as float16's are, the sums within the same float32 bound
FRAGMENT_CASES = {
    "float16": (mma_from_registers, pack, np.float16, 1.0),
    "bfloat16": (mma_bf16_from_registers, pack_bf16, ml_dtypes.bfloat16, 1e20),
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dtype", sorted(FRAGMENT_CASES))
def test_mma_fragment_layout(dtype, seed):
    kernel, packed, dt, scale = FRAGMENT_CASES[dtype]
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((16, 16)) * scale).astype(dt)
    b = (rng.standard_normal((16, 8)) / scale).astype(dt)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    fa = packed(gather(a, a_fragment_coords()))
    fb = packed(gather(b, b_fragment_coords()))
    fc = gather(c, c_fragment_coords()).astype(np.float32)
    out = np.zeros((32, 4), np.float32)
    kernel[1, 32](fa, fb, fc, out)
    want, bound = reference(a, b, c)
    coords = c_fragment_coords()
    np.testing.assert_array_less(
        np.abs(out - gather(want, coords)), MMA_RTOL * gather(bound, coords) + 1e-30
    )


def test_mma_integers_exact():
    rng = np.random.default_rng(2)
    a, b = small_ints(rng, (16, 16)), small_ints(rng, (16, 8))
    c = small_ints(rng, (16, 8)).astype(np.float32)
    out = np.zeros((32, 4), np.float32)
    mma_from_registers[1, 32](
        pack(gather(a, a_fragment_coords())),
        pack(gather(b, b_fragment_coords())),
        gather(c, c_fragment_coords()),
        out,
    )
    want = a.astype(np.float32) @ b.astype(np.float32) + c
    np.testing.assert_array_equal(out, gather(want, c_fragment_coords()))


# ---------------------------------------------------------------------------------------------
# ldmatrix + mma + accumulator stores, as a kernel uses them
# ---------------------------------------------------------------------------------------------


def _tile_mma(elem, product, store_pair):
    """A kernel of one warp: D (16 x 16) = A (16 x 16) @ B (16 x 16) from shared memory of
    ``elem`` (float16, or bfloat16's uint16 bits: ldmatrix moves 16-bit values whatever they
    are), two n8 tiles by ``product``, stored in float32 and, in pairs, by ``store_pair``."""

    @cuda.jit
    def kernel(a, b, d, d16):
        sa = cuda.shared.array((16, 16), elem, alignment=16)
        sb = cuda.shared.array((16, 16), elem, alignment=16)
        lane = cuda.threadIdx.x
        for i in range(lane, 256, 32):
            sa[i // 16, i % 16] = a[i // 16, i % 16]
            sb[i // 16, i % 16] = b[i // 16, i % 16]
        cuda.syncthreads()
        fa = mma.ldmatrix_x4(sa, (lane % 16, 8 * (lane // 16)))
        fb = mma.ldmatrix_x4_trans(sb, (lane % 8 + 8 * (lane // 8 % 2), 8 * (lane // 16)))
        zero = float32(0)
        for nt in range(2):
            acc = product(fa, (fb[2 * nt], fb[2 * nt + 1]), (zero, zero, zero, zero))
            mma.store_accumulator(acc, d, 0, 8 * nt)
            g, t = lane >> 2, lane & 3
            store_pair(d16, (g, 8 * nt + 2 * t), acc[0], acc[1])
            store_pair(d16, (g + 8, 8 * nt + 2 * t), acc[2], acc[3])

    return kernel


tile_mma = _tile_mma(float16, mma.mma_m16n8k16, mma.store_f16x2)
tile_mma_bf16 = _tile_mma(uint16, mma.mma_m16n8k16_bf16, mma.store_bf16x2)


def test_ldmatrix_feeds_mma():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((16, 16)).astype(np.float16)
    b = rng.standard_normal((16, 16)).astype(np.float16)
    d = np.full((16, 16), np.nan, np.float32)
    d16 = np.full((16, 16), np.nan, np.float16)
    tile_mma[1, 32](a, b, d, d16)
    want, scale = reference(a, b, np.zeros((16, 16)))
    np.testing.assert_array_less(np.abs(d - want), MMA_RTOL * scale + 1e-30)
    np.testing.assert_array_equal(d16, d.astype(np.float16))


def test_ldmatrix_feeds_the_bf16_mma_and_pair_stores_round_to_nearest_even():
    rng = np.random.default_rng(4)
    a = (rng.standard_normal((16, 16)) * 1e30).astype(ml_dtypes.bfloat16)
    b = (rng.standard_normal((16, 16)) * 1e-30).astype(ml_dtypes.bfloat16)
    d = np.full((16, 16), np.nan, np.float32)
    d16 = np.full((16, 16), 0xFFFF, np.uint16)
    tile_mma_bf16[1, 32](a.view(np.uint16), b.view(np.uint16), d, d16)
    want, scale = reference(a, b, np.zeros((16, 16)))
    np.testing.assert_array_less(np.abs(d - want), MMA_RTOL * scale + 1e-30)
    np.testing.assert_array_equal(d16.view(ml_dtypes.bfloat16), d.astype(ml_dtypes.bfloat16))


@cuda.jit
def masked_store(acc_in, out, row0, col0):
    lane = cuda.threadIdx.x
    acc = (acc_in[lane, 0], acc_in[lane, 1], acc_in[lane, 2], acc_in[lane, 3])
    mma.store_accumulator(acc, out, row0, col0)


@pytest.mark.parametrize(
    ("shape", "row0", "col0"), [((16, 8), 0, 0), ((13, 5), 0, 0), ((20, 20), 9, 14)]
)
def test_store_accumulator_masks(shape, row0, col0):
    c = np.arange(128, dtype=np.float32).reshape(16, 8)
    out = np.full(shape, -1.0, np.float16)
    masked_store[1, 32](gather(c, c_fragment_coords()), out, row0, col0)
    want = np.full(shape, -1.0, np.float16)
    rows, cols = min(16, shape[0] - row0), min(8, shape[1] - col0)
    want[row0 : row0 + rows, col0 : col0 + cols] = c[:rows, :cols]
    np.testing.assert_array_equal(out, want)


# ---------------------------------------------------------------------------------------------
# Uses the hardware leaves undefined are refused (fragments written out in full: Numba has no
# tuple repetition, which the simulator's Python would accept; tests/compile compiles these)
# ---------------------------------------------------------------------------------------------


@cuda.jit
def divergent_mma(out):
    lane = cuda.threadIdx.x
    z, u = float32(0), uint32(0)
    if lane < 16:
        d = mma.mma_m16n8k16((u, u, u, u), (u, u), (z, z, z, z))
        out[lane] = d[0]
    cuda.syncthreads()


@cuda.jit
def branchy_mma(out):
    lane = cuda.threadIdx.x
    z, u = float32(0), uint32(0)
    one = uint32(1)
    if lane < 16:
        d = mma.mma_m16n8k16((u, u, u, u), (u, u), (z, z, z, z))
    else:
        d = mma.mma_m16n8k16((one, one, one, one), (one, one), (z, z, z, z))
    out[lane] = d[0]


@cuda.jit
def early_exit_mma(out):
    lane = cuda.threadIdx.x
    if lane >= 16:
        return
    z, u = float32(0), uint32(0)
    d = mma.mma_m16n8k16((u, u, u, u), (u, u), (z, z, z, z))
    out[lane] = d[0]


@cuda.jit
def full_mma(out):
    lane = cuda.threadIdx.x
    z, u = float32(0), uint32(0)
    d = mma.mma_m16n8k16((u, u, u, u), (u, u), (z, z, z, z))
    out[lane] = d[0]


@cuda.jit
def ldmatrix_at(out, col):
    s = cuda.shared.array((32, 16), float16, alignment=16)
    lane = cuda.threadIdx.x
    for j in range(16):
        s[lane, j] = 0
    cuda.syncthreads()
    regs = mma.ldmatrix_x4(s, (lane, col))
    out[lane] = regs[0]


@pytest.mark.sim_only(reason="the GPU's behaviour is undefined there: only the twin can refuse it")
@pytest.mark.parametrize(
    ("kernel", "threads", "message"),
    [
        (divergent_mma, 32, "divergent warp"),
        (branchy_mma, 32, "divergent warp"),
        (early_exit_mma, 32, "exited without executing it"),
        (full_mma, 16, "this warp has 16"),
        (full_mma, 48, "this warp has 16"),
    ],
    ids=["divergent", "if-else", "early-exit", "partial-warp", "partial-second-warp"],
)
def test_mma_refuses_non_convergent_warps(kernel, threads, message):
    from tessera_tile import sim

    out = np.zeros(threads, np.float32)
    with pytest.raises(sim.SimulationError, match=message):
        kernel[1, threads](out)


@pytest.mark.sim_only(reason="the GPU faults or misbehaves there: only the twin can refuse it")
@pytest.mark.parametrize("col", [4, 2, 10])
def test_ldmatrix_refuses_misaligned_rows(col):
    from tessera_tile import sim

    out = np.zeros(32, np.uint32)
    with pytest.raises(sim.SimulationError, match="16-byte aligned"):
        ldmatrix_at[1, 32](out, col)


def test_ldmatrix_accepts_aligned_rows():
    out = np.ones(32, np.uint32)
    ldmatrix_at[1, 32](out, 8)
    np.testing.assert_array_equal(out, 0)


def test_full_warp_mma_runs():
    out = np.ones(64, np.float32)
    full_mma[1, 64](out)
    np.testing.assert_array_equal(out, 0)


def conflicts_at(prof, needle: str) -> int:
    """Extra wavefronts the profile counts at lines of this file whose source holds ``needle``."""
    lines = Path(__file__).read_text().splitlines()
    name = Path(__file__).name
    total = 0
    for where, extra in prof.conflict_lines.items():
        file, _, line = where.rpartition(":")
        if file == name and needle in lines[int(line) - 1]:
            total += extra
    return total


@pytest.mark.sim_only(reason="the profiler exists only in the simulator")
def test_ldmatrix_bank_conflicts_are_counted_per_phase():
    """ldmatrix serves one 8 x 8 matrix (8 rows of 16 bytes) per 128-byte phase: rows at a
    16-byte pitch are conflict free; at a 32-byte pitch rows r and r + 4 share banks, 2 wavefronts
    per phase (4 extra per .x4)."""
    from tessera_tile import sim

    x = np.zeros((32, 8), np.float16)
    out = np.zeros((32, 4), np.uint32)
    with sim.profile() as prof:
        _ldmatrix_kernel(mma.ldmatrix_x4, 4)[1, 32](x, out)
    assert conflicts_at(prof, "regs = fn(s, (lane, 0))") == 0, str(prof)
    assert conflicts_at(prof, "s[lane, j] = x[lane, j]") > 0, str(prof)  # the scalar fill: 8-way
    assert prof.races == [], str(prof)

    rng = np.random.default_rng(4)
    a = rng.standard_normal((16, 16)).astype(np.float16)
    b = rng.standard_normal((16, 16)).astype(np.float16)
    d = np.zeros((16, 16), np.float32)
    d16 = np.zeros((16, 16), np.float16)
    with sim.profile() as prof:
        tile_mma[1, 32](a, b, d, d16)
    assert conflicts_at(prof, "fa = mma.ldmatrix_x4(") == 4, str(prof)
    assert conflicts_at(prof, "fb = mma.ldmatrix_x4_trans(") == 4, str(prof)
    assert prof.races == [], str(prof)


@cuda.jit
def ldmatrix_global(x, out):
    lane = cuda.threadIdx.x
    out[lane] = mma.ldmatrix_x1(x, (lane, 0))


@cuda.jit
def pair_store_wrong_space(x):
    s = cuda.shared.array((32, 8), float16, alignment=16)
    lane = cuda.threadIdx.x
    mma.store_f16x2(s, (lane, 0), float32(1), float32(2))  # a global store into shared
    cuda.syncthreads()
    x[lane, 0] = s[lane, 0]


@pytest.mark.sim_only(reason="the GPU misbehaves silently there: only the twin can refuse it")
def test_shared_only_instructions_refuse_other_arrays():
    from tessera_tile import sim

    x = np.zeros((32, 8), np.float16)
    with pytest.raises(sim.SimulationError, match="reads shared memory"):
        ldmatrix_global[1, 32](x, np.zeros(32, np.uint32))
    with pytest.raises(sim.SimulationError, match="got a shared array"):
        pair_store_wrong_space[1, 32](x)
