"""Warpgroup MMA (wgmma, sm_90a) against the PTX ISA's layouts, element by element.

The shared-memory layouts and register fragments below are written from the PTX ISA 8.x
("Asynchronous Warpgroup Level Matrix Multiply-Accumulate": the shared-memory matrix layouts and
their swizzle figures, the register fragment figures of wgmma .m64nNk16) as placements of each
element, independently of the implementation's formulas. A kernel copies a prepared image of
shared memory, runs wgmma on descriptors into it and writes every thread's accumulator
registers out as they are; the test places them with the ISA's accumulator figure and compares
with NumPy.

On a GPU (``TESSERA_TIER=gpu``) the same kernels run on compute capability 9.0 and later, and
are skipped, with the reason, on older devices; the rules only the simulator can enforce (a
missing fence, a read before the wait...) are ``sim_only``.
"""

import functools

import ml_dtypes
import numpy as np
import pytest
from helpers import wgmma_skip
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda, uint16

from tessera_tile import mma, sim

THREADS = 128
SMEM_BYTES = 40 * 1024  # the image every kernel copies in: A at 0, B at B_BASE
B_BASE = 8 * 1024
SMEM_WORDS = SMEM_BYTES // 2  # a global constant: Numba types it as a literal shape
B_WORD = B_BASE // 2


pytestmark = wgmma_skip("test_wgmma")

# ---------------------------------------------------------------------------------------------
# Layouts, from the ISA's figures
# ---------------------------------------------------------------------------------------------
#
# A core matrix is 8 rows of 16 bytes (8 16-bit elements). "K-major": the 16 bytes of a row run
# along K; "MN-major" (the transpose immediate set): along M or N.
#
# Swizzled layouts are built of atoms of 8 rows of W bytes (W = 128, 64, 32), 8 W bytes in
# all, aligned to 8 W bytes. In row r of an atom, the 16-byte chunk c is stored at chunk
#   128B: c ^ r            (8 chunks per row)
#   64B:  c ^ (r // 2)     (4 chunks per row)
#   32B:  c ^ (r // 4)     (2 chunks per row)
# Without swizzle, the core matrices are 128 contiguous bytes each, placed by the two byte
# offsets of the descriptor.

SWIZZLE_WIDTH = {
    mma.SWIZZLE_NONE: 16,
    mma.SWIZZLE_128B: 128,
    mma.SWIZZLE_64B: 64,
    mma.SWIZZLE_32B: 32,
}


def _chunk(c, r, width):
    return {128: c ^ r, 64: c ^ (r // 2), 32: c ^ (r // 4)}[width]


def place_k_major(rows: int, k_total: int, swizzle: int):
    """Byte offset of element (row, k) of a rows x k_total K-major tile, with the descriptor's
    (leading, stride) byte offsets and the bytes one k16 step moves the start address."""
    w = SWIZZLE_WIDTH[swizzle]
    r = np.arange(rows)[:, None]
    k = np.arange(k_total)[None, :]
    if swizzle == mma.SWIZZLE_NONE:
        lbo = 128  # core matrices next to each other along K
        sbo = 128 * (k_total // 8)  # then the next 8 rows
        offset = (r // 8) * sbo + (k // 8) * lbo + (r % 8) * 16 + (k % 8) * 2
        return offset, lbo, sbo, 2 * lbo
    assert k_total * 2 == w, "one swizzle row holds the whole K of the tile"
    sbo = 8 * w  # next atom: the next 8 rows
    offset = (r // 8) * sbo + (r % 8) * w + _chunk(k // 8, r % 8, w) * 16 + (k % 8) * 2
    return offset, 16, sbo, 32  # LBO unused (K within the swizzle row); a k16 step: 32 bytes


def place_mn_major(rows: int, k_total: int, swizzle: int):
    """Byte offset of element (row, k) of an MN-major tile (rows along M or N contiguous)."""
    w = SWIZZLE_WIDTH[swizzle]
    r = np.arange(rows)[:, None]
    k = np.arange(k_total)[None, :]
    if swizzle == mma.SWIZZLE_NONE:
        lbo = 128  # core matrices (8 k x 8 mn) next to each other along K
        sbo = 128 * (k_total // 8)  # then the next 8 of M or N
        offset = (r // 8) * sbo + (k // 8) * lbo + (k % 8) * 16 + (r % 8) * 2
        return offset, lbo, sbo, 2 * lbo
    per_row = w // 2  # elements of M or N in one swizzle row
    sbo = 8 * w  # the next 8 k
    lbo = sbo * (k_total // 8)  # the next block of per_row along M or N
    within = r % per_row
    offset = (
        (r // per_row) * lbo
        + (k // 8) * sbo
        + (k % 8) * w
        + _chunk(within // 8, k % 8, w) * 16
        + (r % 8) * 2
    )
    return offset, lbo, sbo, 2 * sbo  # a k16 step: the next 16 rows of K


def d_coords(n: int) -> np.ndarray:
    """coords[thread, i] = (row, col) of accumulator i of a 64 x n wgmma D (PTX ISA figure of
    the .m64nNk16 D fragment): warp w of the warpgroup holds rows 16 w .. 16 w + 15; in the
    8-column block j, d[4j], d[4j+1] sit at row g, columns 8j + 2t, 8j + 2t + 1 and d[4j+2],
    d[4j+3] at row g + 8 (g = lane // 4, t = lane % 4)."""
    out = np.empty((THREADS, n // 2, 2), int)
    for tid in range(THREADS):
        w, lane = divmod(tid, 32)
        g, t = divmod(lane, 4)
        for j in range(n // 8):
            for half in range(2):
                for pair in range(2):
                    out[tid, 4 * j + 2 * half + pair] = (
                        16 * w + g + 8 * half,
                        8 * j + 2 * t + pair,
                    )
    return out


def a_registers(a: np.ndarray) -> np.ndarray:
    """(128, 4) uint32: each thread's A registers of a 64 x 16 A (PTX ISA figure of the
    .m64nNk16 A fragment): warp w holds rows 16 w ..; register q covers the 8 x 8 quarter at
    (0, 0), (8, 0), (0, 8), (8, 8) of them; lane 4g + t holds row g, columns 2t, 2t + 1 (the
    low half first)."""
    quarters = [(0, 0), (8, 0), (0, 8), (8, 8)]
    halves = np.empty((THREADS, 8), np.uint16)
    bits = a.view(np.uint16)
    for tid in range(THREADS):
        w, lane = divmod(tid, 32)
        g, t = divmod(lane, 4)
        for q, (r0, c0) in enumerate(quarters):
            for h in range(2):
                halves[tid, 2 * q + h] = bits[16 * w + g + r0, 2 * t + h + c0]
    return np.ascontiguousarray(halves).view(np.uint32)


def image_of(a, b, a_major_k, b_major_k, swizzle_a, swizzle_b):
    """Shared-memory image (uint16 words) holding A (64 x K) at 0 and B (N x K, i.e. B^T of
    the [K, N] operand) at B_BASE, and the descriptor fields of each."""
    img = np.zeros(SMEM_BYTES // 2, np.uint16)
    fields = []
    for tile, base, k_major, swizzle in (
        (a, 0, a_major_k, swizzle_a),
        (b, B_BASE, b_major_k, swizzle_b),
    ):
        if tile is None:
            fields.append((0, 16, 16, 0))
            continue
        place = place_k_major if k_major else place_mn_major
        offset, lbo, sbo, step = place(tile.shape[0], tile.shape[1], swizzle)
        assert base + offset.max() + 2 <= SMEM_BYTES
        img[(base + offset) // 2] = tile.view(np.uint16)
        fields.append((base // 2, lbo, sbo, step // 2))
    return img, fields


# ---------------------------------------------------------------------------------------------
# Kernels (factories close over the constants: the immediates are compile-time)
# ---------------------------------------------------------------------------------------------


def _wgmma(bf16):
    return mma.wgmma_async_bf16 if bf16 else mma.wgmma_async


@functools.cache
def ss_kernel(n, bf16, trans_a, trans_b, swz_a, swz_b, steps, scale_a=1, scale_b=1):
    """A and B from shared memory: ``steps`` k16 steps chained on one accumulator."""
    op = _wgmma(bf16)

    @cuda.jit
    def kernel(image, fa, fb, out):
        s = cuda.shared.array(SMEM_WORDS, uint16, alignment=1024)
        tid = cuda.threadIdx.x
        for i in range(tid, SMEM_WORDS, THREADS):
            s[i] = image[i]
        cuda.syncthreads()
        acc = mma.wgmma_zeros(n)
        mma.wgmma_fence()
        for kk in range(steps):
            da = mma.wgmma_descriptor(s, fa[0] + kk * fa[3], fa[1], fa[2], swz_a)
            db = mma.wgmma_descriptor(s, fb[0] + kk * fb[3], fb[1], fb[2], swz_b)
            acc = op(da, db, acc, 1, scale_a, scale_b, trans_a, trans_b)
        mma.wgmma_commit_group()
        acc = mma.wgmma_wait_group(0, acc)
        for i in range(n // 2):
            out[tid, i] = acc[i]

    return kernel


@functools.cache
def rs_kernel(n, bf16, trans_b, swz_b):
    """A from registers, two products: the second with scale-d = 0 on the first's result
    (which it must ignore), then a third accumulating onto it (scale-d = 1)."""
    op = _wgmma(bf16)

    @cuda.jit
    def kernel(image, regs, fb, out):
        s = cuda.shared.array(SMEM_WORDS, uint16, alignment=1024)
        tid = cuda.threadIdx.x
        for i in range(tid, SMEM_WORDS, THREADS):
            s[i] = image[i]
        cuda.syncthreads()
        a0 = (regs[0, tid, 0], regs[0, tid, 1], regs[0, tid, 2], regs[0, tid, 3])
        a1 = (regs[1, tid, 0], regs[1, tid, 1], regs[1, tid, 2], regs[1, tid, 3])
        db = mma.wgmma_descriptor(s, fb[0], fb[1], fb[2], swz_b)
        db1 = mma.wgmma_descriptor(s, fb[0] + fb[3], fb[1], fb[2], swz_b)
        mma.wgmma_fence()
        acc = op(a1, db1, mma.wgmma_zeros(n), 1, 1, 1, 0, trans_b)
        acc = op(a0, db, acc, 0, 1, 1, 0, trans_b)  # scale-d 0: D = A0 @ B0
        acc = op(a1, db1, acc, 1, 1, 1, 0, trans_b)  # D += A1 @ B1
        mma.wgmma_commit_group()
        acc = mma.wgmma_wait_group(0, acc)
        for i in range(n // 2):
            out[tid, i] = acc[i]

    return kernel


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------

DTYPES = {False: np.float16, True: ml_dtypes.bfloat16}
# Inputs are exact in the reference (float64 products of the rounded inputs); the error is the
# float32 accumulation: |d - ref| <= RTOL * (|A| @ |B|) for both input types (K <= 64).
RTOL = {False: 1e-5, True: 1e-5}


def random_tile(rng, shape, bf16):
    return rng.standard_normal(shape).astype(DTYPES[bf16])


def placed(out, n):
    d = np.full((64, n), np.nan, np.float32)
    coords = d_coords(n)
    d[coords[..., 0], coords[..., 1]] = out
    assert not np.isnan(d).any()
    return d


def check(d, a, b_t, bf16, a2=None, b2_t=None):
    """d against A @ B (+ A2 @ B2), B given as B^T (N x K)."""
    a64, b64 = a.astype(np.float64), b_t.astype(np.float64).T
    ref, bound = a64 @ b64, np.abs(a64) @ np.abs(b64)
    if a2 is not None:
        a64, b64 = a2.astype(np.float64), b2_t.astype(np.float64).T
        ref, bound = ref + a64 @ b64, bound + np.abs(a64) @ np.abs(b64)
    err = np.abs(d.astype(np.float64) - ref)
    assert (err <= RTOL[bf16] * bound + 1e-30).all(), float((err - RTOL[bf16] * bound).max())


def run_ss(n, bf16, trans_a, trans_b, swz_a, swz_b, k_total, seed, scale_a=1, scale_b=1):
    rng = np.random.default_rng(seed)
    a = random_tile(rng, (64, k_total), bf16)
    b_t = random_tile(rng, (n, k_total), bf16)
    img, (fa, fb) = image_of(a, b_t, not trans_a, not trans_b, swz_a, swz_b)
    out = np.zeros((THREADS, n // 2), np.float32)
    kernel = ss_kernel(n, bf16, trans_a, trans_b, swz_a, swz_b, k_total // 16, scale_a, scale_b)
    kernel[1, THREADS](img, np.array(fa, np.int64), np.array(fb, np.int64), out)
    check(placed(out, n), scale_a * a.astype(np.float64), scale_b * b_t.astype(np.float64), bf16)


@pytest.mark.parametrize(
    ("n", "bf16", "trans_a", "trans_b", "swz", "k_total"),
    [
        (64, False, 0, 0, mma.SWIZZLE_NONE, 32),  # K-major, interleaved core matrices
        (128, False, 0, 0, mma.SWIZZLE_128B, 64),  # the GEMM's tiles: 4 k-steps in the row
        (128, True, 0, 1, mma.SWIZZLE_128B, 64),  # B N-major (a row-major [K, N] B tile)
        (64, True, 1, 1, mma.SWIZZLE_NONE, 16),  # both MN-major, no swizzle
    ],
)
def test_wgmma_from_shared_memory(n, bf16, trans_a, trans_b, swz, k_total):
    run_ss(n, bf16, trans_a, trans_b, swz, swz, k_total, seed=n + 7 * trans_b + bf16)


@given(
    n=st.sampled_from([8, 32, 96, 256]),
    bf16=st.booleans(),
    trans_b=st.integers(0, 1),
    swz=st.sampled_from([mma.SWIZZLE_NONE, mma.SWIZZLE_32B, mma.SWIZZLE_64B, mma.SWIZZLE_128B]),
    negate=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_wgmma_shapes_and_swizzles(n, bf16, trans_b, swz, negate, seed):
    """Every swizzle mode, B in either major order, N from 8 to 256, negated A (imm-scale-a).
    A is K-major with the same swizzle, K one swizzle row (16 without swizzle)."""
    k_total = {mma.SWIZZLE_NONE: 16, mma.SWIZZLE_32B: 16, mma.SWIZZLE_64B: 32}.get(swz, 64)
    run_ss(n, bf16, 0, trans_b, swz, swz, k_total, seed, scale_a=-1 if negate else 1)


@pytest.mark.parametrize(
    ("n", "bf16", "trans_b", "swz"),
    [(64, False, 1, mma.SWIZZLE_NONE), (128, True, 0, mma.SWIZZLE_128B)],
)
def test_wgmma_a_from_registers_and_scale_d(n, bf16, trans_b, swz):
    rng = np.random.default_rng(n)
    a0, a1 = (random_tile(rng, (64, 16), bf16) for _ in range(2))
    # k 0..15 for the first product, 16..31 for the second (a K-major 128B row holds 64)
    b_t = random_tile(rng, (n, 64 if swz == mma.SWIZZLE_128B and not trans_b else 32), bf16)
    img, (_, fb) = image_of(None, b_t, True, not trans_b, swz, swz)
    regs = np.stack([a_registers(a0), a_registers(a1)])
    out = np.zeros((THREADS, n // 2), np.float32)
    rs_kernel(n, bf16, trans_b, swz)[1, THREADS](img, regs, np.array(fb, np.int64), out)
    check(placed(out, n), a0, b_t[:, :16], bf16, a1, b_t[:, 16:32])


def test_descriptor_fields_follow_the_isa():
    desc = mma.encode_descriptor(0x12340, 0x1000, 0x400, mma.SWIZZLE_128B)
    # start >> 4 in bits 0-13, LBO >> 4 in 16-29, SBO >> 4 in 32-45, swizzle in 62-63
    assert desc == (0x1234 | (0x100 << 16) | (0x40 << 32) | (1 << 62))
    fields = mma.decode_descriptor(desc | (5 << 49))
    assert (fields.start_address, fields.leading_byte_offset, fields.stride_byte_offset) == (
        0x12340,
        0x1000,
        0x400,
    )
    assert (fields.base_offset, fields.swizzle) == (5, mma.SWIZZLE_128B)
    for bad in ((0x12348, 16, 16), (1 << 18, 16, 16), (0, 8, 16)):
        with pytest.raises(ValueError, match="multiple of 16"):
            mma.encode_descriptor(*bad)


# ---------------------------------------------------------------------------------------------
# The rules the twin enforces (undefined on a GPU: only the simulator can refuse them)
# ---------------------------------------------------------------------------------------------

BASE_OFFSET_1 = np.uint64(1 << 49)  # base offset field (bits 49-51) = 1
RULES = pytest.mark.sim_only(reason="undefined behaviour on a GPU: only the twin can refuse it")


@functools.cache
def rule_kernel(case):
    """One kernel per broken rule; ``case`` picks what it does wrong."""
    n = 64

    @cuda.jit
    def kernel(image, out):
        s = cuda.shared.array(SMEM_WORDS, uint16, alignment=1024)
        tid = cuda.threadIdx.x
        if case == "misaligned" and (tid < 64 or tid >= 192):
            return  # warps 2..5 try to be a warpgroup: warps 0 and 1 are gone
        for i in range(tid, SMEM_WORDS, cuda.blockDim.x):
            s[i] = image[i]
        cuda.syncthreads()
        da = mma.wgmma_descriptor(s, 0, 128, 512, mma.SWIZZLE_NONE)
        db = mma.wgmma_descriptor(s, B_WORD, 128, 512, mma.SWIZZLE_NONE)
        if case == "outside":
            db = mma.wgmma_descriptor(s, SMEM_WORDS - 256, 128, 512, mma.SWIZZLE_NONE)
        if case == "base_offset":
            db = db | BASE_OFFSET_1
        if case == "divergent":  # warps 0, 1 and 2, 3 fence at different instructions
            if tid < 64:
                mma.wgmma_fence()
            else:
                mma.wgmma_fence()
        elif case != "no_fence":
            mma.wgmma_fence()
        acc = mma.wgmma_async(da, db, mma.wgmma_zeros(n), 1, 1, 1, 0, 0)
        if case == "overwrite":
            s[B_WORD] = uint16(0x3C00)
        mma.wgmma_commit_group()
        if case == "early_read":
            out[tid, 0] = acc[0]
        acc = mma.wgmma_wait_group(0, acc)
        if case == "fence_after_read":
            out[tid, 1] = acc[1]  # a thread reads the registers ...
            acc = mma.wgmma_async(da, db, acc, 1, 1, 1, 0, 0)  # ... and no fence before reuse
            mma.wgmma_commit_group()
            acc = mma.wgmma_wait_group(0, acc)
        for i in range(n // 2):
            out[tid, i] = acc[i]

    return kernel


@RULES
@pytest.mark.parametrize(
    ("case", "threads", "message"),
    [
        ("no_fence", 128, "before any wgmma.fence"),
        ("early_read", 128, "read before wgmma.wait_group retired it"),
        ("fence_after_read", 128, "read by a thread after the latest wgmma.fence"),
        ("overwrite", 128, "was written before wgmma.wait_group retired it"),
        ("outside", 128, "outside every shared array"),
        ("base_offset", 128, "base offset 1"),
        ("divergent", 128, "divergent warpgroup 0"),
        ("ok", 96, "needs the 128 threads of warpgroup 0"),
        ("misaligned", 256, r"warp\(s\) \d, \d of warpgroup \d exited without executing"),
    ],
)
def test_wgmma_rules(case, threads, message):
    rng = np.random.default_rng(0)
    img, _ = image_of(
        random_tile(rng, (64, 16), False),
        random_tile(rng, (64, 16), False),
        True,
        True,
        mma.SWIZZLE_NONE,
        mma.SWIZZLE_NONE,
    )
    out = np.zeros((threads, 32), np.float32)
    with pytest.raises(sim.SimulationError, match=message):
        rule_kernel(case)[1, threads](img, out)
