"""TF32 tensor-core fragments (``mma_m16n8k8_tf32``, ``to_tf32``, ``ldmatrix`` on float32 tiles)
lane by lane against the PTX ISA's tables.

The layouts are written from the PTX ISA ("Matrix Fragments for mma.m16n8k8", the ``.tf32``
floating point type; "ldmatrix") as tables per register, independently of the implementation's
formulas.
"""

import math
from fractions import Fraction

import numpy as np
import pytest
from helpers import GROUP, TIG, c_fragment_coords, gather
from numba import cuda, float32

from tessera_tile import mma

# A (16 x 8): register r covers the 8 x 4 block at (row offset, col offset); inside it, lane
# (groupID, threadID_in_group) holds row groupID, column threadID_in_group.
A_BLOCKS = [(0, 0), (8, 0), (0, 4), (8, 4)]  # a0, a1, a2, a3
# B (8 x 8, [k, n]): register r holds k = threadID_in_group + 4 r, n = groupID.
B_KROWS = [0, 4]
# C/D (16 x 8): as for m16n8k16 (helpers.c_fragment_coords).


def a_coords():
    return np.stack(
        [np.stack([GROUP + r0, TIG + c0], axis=1) for r0, c0 in A_BLOCKS], axis=1
    )  # (32, 4, 2)


def b_coords():
    return np.stack([np.stack([TIG + k0, GROUP], axis=1) for k0 in B_KROWS], axis=1)


def truncate_tf32(x):
    """The TF32 value the tensor core reads from float32 ``x``: the low 13 bits dropped."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    return bits.view(np.float32)


def round_tf32(x):
    """cvt.rna.tf32.f32 from its definition: the nearest TF32 value, ties away from zero
    (computed on the value in float64, not on the bits)."""
    x = np.asarray(x, np.float32)
    out = np.empty_like(x)
    for i, v in np.ndenumerate(x):
        if not np.isfinite(v):
            out[i] = v
            continue
        lo = truncate_tf32(np.array([v]))[0]  # toward zero
        # TF32's step above |lo|: float32's times 2**13 (subnormals too: 2**-149 * 2**13)
        ulp = np.float64(np.spacing(np.float32(abs(lo)))) * 2**13
        hi = np.float64(lo) + np.copysign(ulp, v)  # away from zero
        d_lo, d_hi = abs(np.float64(v) - np.float64(lo)), abs(hi - np.float64(v))
        out[i] = np.float32(hi) if d_hi <= d_lo else lo  # ties away from zero
    return out


@cuda.jit
def mma_kernel(fa, fb, fc, out):
    """A and B as uint32 bit patterns (what ldmatrix gives) or float32 values (what scalar
    shared loads give): the kernel is typed for each."""
    lane = cuda.threadIdx.x
    d = mma.mma_m16n8k8_tf32(
        (fa[lane, 0], fa[lane, 1], fa[lane, 2], fa[lane, 3]),
        (fb[lane, 0], fb[lane, 1]),
        (fc[lane, 0], fc[lane, 1], fc[lane, 2], fc[lane, 3]),
    )
    for i in range(4):
        out[lane, i] = d[i]


def accumulation_bound(a, b, c):
    """Per element of ``a @ b + c`` (TF32 values a, b): how far the tensor core's float32 result
    may lie from the exact one. PTX ISA, mma, .tf32: products "with specified precision" (exact:
    11-bit significands), accumulation "with at least single precision", order and rounding
    unspecified. Each of the K additions may lose under one float32 ulp (2**-23 relative) in
    aligning its smaller operand and one in rounding or truncating its result, and the float32
    result one more: under (2K + 1) 2**-23 S (1 + 17 * 2**-23), S = sum |a b| + |c|; a fused
    K + 1 term adder loses less, (K + 2) 2**-23 S. 2 (K + 1) 2**-23 S bounds both, and the float64
    reference's own error (< 2**-50 S)."""
    k = a.shape[-1]
    a, b, c = (np.asarray(v, np.float64) for v in (a, b, c))
    return 2 * (k + 1) * 2.0**-23 * (np.abs(a) @ np.abs(b) + np.abs(c))


def h200_sum(a, b, c) -> np.ndarray:
    """``a @ b + c`` (TF32 values a, b; float32 c) as an H200's tensor core sums it, probed
    there (every probe below and 640 random results matched), in exact rational arithmetic:
    each addend (the products, then c) truncated toward zero to a multiple of ``2**(E - 25)``,
    E the largest addend exponent (a product's: the sum of its operands' exponents), the
    truncated addends added exactly, the sum rounded toward zero to float32."""

    def exponent(x: float) -> int:
        return math.frexp(x)[1] - 1

    out = np.empty((a.shape[0], b.shape[1]), np.float32)
    for i, j in np.ndindex(out.shape):
        terms = [(float(x), float(y)) for x, y in zip(a[i], b[:, j], strict=True) if x and y]
        addends = [(Fraction(x) * Fraction(y), exponent(x) + exponent(y)) for x, y in terms]
        if c[i, j]:
            addends.append((Fraction(float(c[i, j])), exponent(float(c[i, j]))))
        if not addends:  # all zero
            out[i, j] = 0.0
            continue
        unit = Fraction(2) ** (max(e for _, e in addends) - 25)
        total = sum(int(v / unit) * unit for v, _ in addends)  # int() truncates toward zero
        nearest = np.float32(float(total))  # float(total) is exact: under 31 bits
        if abs(Fraction(float(nearest))) > abs(total):
            nearest = np.nextafter(nearest, np.float32(0))
        out[i, j] = nearest
    return out


def run_mma(a, b, c, as_bits):
    fa, fb = gather(a, a_coords()), gather(b, b_coords())
    if as_bits:
        fa, fb = fa.view(np.uint32), fb.view(np.uint32)
    out = np.zeros((32, 4), np.float32)
    mma_kernel[1, 32](
        np.ascontiguousarray(fa), np.ascontiguousarray(fb), gather(c, c_fragment_coords()), out
    )
    return out


@pytest.mark.parametrize("as_bits", [True, False], ids=["uint32", "float32"])
def test_mma_tf32_layout_exact_on_integers(as_bits):
    rng = np.random.default_rng(0)
    a = rng.integers(-64, 65, (16, 8)).astype(np.float32)  # TF32-exact, exact products/sums
    b = rng.integers(-64, 65, (8, 8)).astype(np.float32)
    c = rng.integers(-1000, 1001, (16, 8)).astype(np.float32)
    out = run_mma(a, b, c, as_bits)
    np.testing.assert_array_equal(out, gather(a @ b + c, c_fragment_coords()))


@pytest.mark.parametrize("seed", [1, 2])
def test_mma_tf32_reads_only_the_upper_19_bits(seed):
    """float32 inputs with mantissa bits below TF32's: the result is the product of the
    truncated values (within the accumulation's bound), not of the float32 values, nor of the
    values rounded to TF32."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((16, 8)).astype(np.float32)
    b = rng.standard_normal((8, 8)).astype(np.float32)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    out = run_mma(a, b, c, as_bits=seed % 2 == 0).astype(np.float64)
    at, bt = truncate_tf32(a), truncate_tf32(b)
    bound = gather(accumulation_bound(at, bt, c), c_fragment_coords())
    want = gather(at.astype(np.float64) @ bt + c, c_fragment_coords())
    assert np.all(np.abs(out - want) <= bound), np.max(np.abs(out - want) / bound)
    # The other readings lie more than twice the bound away almost everywhere, so within it of
    # the truncated product the result is more than the bound away from them.
    full = gather(a.astype(np.float64) @ b + c, c_fragment_coords())
    rounded = gather(round_tf32(a).astype(np.float64) @ round_tf32(b) + c, c_fragment_coords())
    for reading in (full, rounded):
        assert np.mean(np.abs(reading - want) > 2 * bound) > 0.9
    np.testing.assert_array_equal(out, gather(h200_sum(at, bt, c), c_fragment_coords()))


# Seen on an H200, one result each: (A row 0's values, B's column 0 all ones, C[0, 0]) ->
# D[0, 0]. Inputs are truncated to TF32; tiny addends drop; the sum rounds toward zero.
PROBES = [
    ([1 + 2**-11 + 2**-12], 0.0, 1.0),
    ([1, 1.5 * 2**-24], 0.0, 1.0),
    ([1, -(2**-30)], 0.0, 1.0),
    ([-1, 2**-30], 0.0, -1.0),
    ([1, 2**-24, 2**-24], 0.0, 1 + 2**-23),
    ([1, 3 * 2**-25], 2**-25, 1 + 2**-23),
    ([1, 7 * 2**-26], 2**-26, 1.0),
    ([1, -(2**-25)], 0.0, 1 - 2**-24),
]


@pytest.mark.parametrize(("row", "c00", "d00"), PROBES)
def test_tf32_sums_as_probed_on_an_h200(row, c00, d00):
    a = np.zeros((16, 8), np.float32)
    a[0, : len(row)] = row
    b = np.ones((8, 8), np.float32)
    c = np.zeros((16, 8), np.float32)
    c[0, 0] = c00
    out = run_mma(a, b, c, as_bits=False)
    d = np.zeros((16, 8), np.float32)
    d[tuple(c_fragment_coords().reshape(-1, 2).T)] = out.reshape(-1)
    assert d[0, 0] == np.float32(d00), (d[0, 0], d00)
    assert h200_sum(truncate_tf32(a), b, c)[0, 0] == np.float32(d00)  # the oracle agrees


@cuda.jit
def round_kernel(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = mma.to_tf32(x[i])


def test_to_tf32_rounds_to_nearest_ties_away():
    rng = np.random.default_rng(4)
    one = np.float32(1.0).view(np.uint32)
    special = np.array(
        [one + 0x1000, one + 0x0FFF, one + 0x1001, one + 0x3000, one + 0x1FFF],  # ties, near
        np.uint32,
    ).view(np.float32)
    x = np.concatenate(
        [
            rng.standard_normal(40).astype(np.float32),
            special,
            -special,
            np.array([0.0, -0.0, np.inf, -np.inf, 3.4e38, 1e-40], np.float32),
        ]
    )
    out = np.zeros_like(x)
    round_kernel[2, 32](x, out)
    want = round_tf32(x)
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(out[40:45], [1 + 2**-10, 1, 1 + 2**-10, 1 + 2**-9, 1 + 2**-10])
    assert np.all(out.view(np.uint32)[np.isfinite(out)] & 0x1FFF == 0)


@cuda.jit
def round_nan(out):
    out[0] = mma.to_tf32(float32(np.nan))


def test_to_tf32_keeps_nan():
    out = np.zeros(1, np.float32)
    round_nan[1, 1](out)
    assert np.isnan(out[0])


# ---------------------------------------------------------------------------------------------
# ldmatrix on a float32 tile gives A fragments; B by scalar loads; together one 16 x 8 x 8 mma
# ---------------------------------------------------------------------------------------------


@cuda.jit
def tile_mma_tf32(a, b, d, frag):
    sa = cuda.shared.array((16, 8), float32, alignment=16)
    sb = cuda.shared.array((8, 8), float32, alignment=16)
    lane = cuda.threadIdx.x
    for i in range(lane, 128, 32):
        sa[i // 8, i % 8] = a[i // 8, i % 8]
    for i in range(lane, 64, 32):
        sb[i // 8, i % 8] = b[i // 8, i % 8]
    cuda.syncthreads()
    fa = mma.ldmatrix_x4(sa, (lane % 16, 4 * (lane // 16)))
    g, t = lane >> 2, lane & 3
    fb = (sb[t, g], sb[t + 4, g])
    for q in range(4):
        frag[lane, q] = fa[q]
    zero = float32(0)
    acc = mma.mma_m16n8k8_tf32(fa, fb, (zero, zero, zero, zero))
    mma.store_accumulator(acc, d, 0, 0)


def test_ldmatrix_on_float32_gives_the_a_fragment():
    rng = np.random.default_rng(5)
    a = truncate_tf32(rng.standard_normal((16, 8)).astype(np.float32))
    b = truncate_tf32(rng.standard_normal((8, 8)).astype(np.float32))
    d = np.full((16, 8), np.nan, np.float32)
    frag = np.zeros((32, 4), np.uint32)
    tile_mma_tf32[1, 32](a, b, d, frag)
    np.testing.assert_array_equal(frag, gather(a, a_coords()).view(np.uint32))
    zero = np.zeros((16, 8), np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.all(np.abs(d - want) <= accumulation_bound(a, b, zero))
    np.testing.assert_array_equal(d, h200_sum(a, b, zero))


@cuda.jit
def swapped_tile_mma_tf32(a, b, d):
    """The TF32 matmul's main-loop fragments: C = A @ B (16 x 8 @ 8 x 16) as C^T = B^T A^T.
    B by two LDS.64 (rows t, t + 4, columns 2g, 2g + 1) is the mma's A (its row g is column
    2g, row g + 8 column 2g + 1); A by ldmatrix with matrices (rows 0-7, k 0-3), (rows 0-7,
    k 4-7), (rows 8-15, ...) gives the mma's B of rows 0-7, then 8-15."""
    sa = cuda.shared.array((16, 8), float32, alignment=16)
    sb = cuda.shared.array((8, 16), float32, alignment=16)
    lane = cuda.threadIdx.x
    for i in range(lane, 128, 32):
        sa[i // 8, i % 8] = a[i // 8, i % 8]
        sb[i // 16, i % 16] = b[i // 16, i % 16]
    cuda.syncthreads()
    f = mma.ldmatrix_x4(sa, (lane % 8 + 8 * (lane // 16), 4 * (lane // 8 % 2)))
    g, t = lane >> 2, lane & 3
    b0 = mma.load_f32x2_shared(sb, (t, 2 * g))
    b1 = mma.load_f32x2_shared(sb, (t + 4, 2 * g))
    zero = float32(0)
    for jb in range(2):
        acc = mma.mma_m16n8k8_tf32(
            (b0[0], b0[1], b1[0], b1[1]), (f[2 * jb], f[2 * jb + 1]), (zero, zero, zero, zero)
        )
        for q in range(4):  # C[8 jb + 2t + q % 2, 2g + q // 2]
            d[8 * jb + 2 * t + q % 2, 2 * g + q // 2] = acc[q]


def test_swapped_fragments_give_the_product():
    rng = np.random.default_rng(8)
    a = truncate_tf32(rng.standard_normal((16, 8)).astype(np.float32))
    b = truncate_tf32(rng.standard_normal((8, 16)).astype(np.float32))
    d = np.full((16, 16), np.nan, np.float32)
    swapped_tile_mma_tf32[1, 32](a, b, d)
    zero = np.zeros((16, 8), np.float32)
    # the same products per element, summed as the hardware does in any order
    want = np.concatenate([h200_sum(a, b[:, :8], zero), h200_sum(a, b[:, 8:], zero)], axis=1)
    np.testing.assert_array_equal(d, want)


@cuda.jit
def pair_load(s_index, out):
    s = cuda.shared.array(64, float32, alignment=16)
    lane = cuda.threadIdx.x
    s[lane] = float32(lane)
    s[lane + 32] = float32(-lane)
    cuda.syncthreads()
    v = mma.load_f32x2_shared(s, s_index + 2 * (lane % 16))
    out[lane, 0] = v[0]
    out[lane, 1] = v[1]


def test_load_f32x2_shared_reads_pairs():
    out = np.zeros((32, 2), np.float32)
    pair_load[1, 32](np.int64(16), out)
    want = np.concatenate([np.arange(32), -np.arange(32)]).astype(np.float32)
    idx = 16 + 2 * (np.arange(32) % 16)
    np.testing.assert_array_equal(out, np.stack([want[idx], want[idx + 1]], axis=1))


@pytest.mark.sim_only(reason="the GPU faults on a misaligned vector load; the twin refuses it")
def test_load_f32x2_shared_refuses_misaligned_pairs():
    from tessera_tile import sim

    with pytest.raises(sim.SimulationError, match="8-byte aligned"):
        pair_load[1, 32](np.int64(1), np.zeros((32, 2), np.float32))


@cuda.jit
def scalar_load(s_index, out):
    s = cuda.shared.array((2, 32), float32)
    lane = cuda.threadIdx.x
    s[0, lane] = float32(lane)
    s[1, lane] = float32(-lane)
    cuda.syncthreads()
    out[lane] = mma.load_f32_shared(s, (s_index, lane))


def test_load_f32_shared_reads_one_float():
    out = np.zeros(32, np.float32)
    scalar_load[1, 32](np.int64(1), out)
    np.testing.assert_array_equal(out, -np.arange(32, dtype=np.float32))


@pytest.mark.sim_only(reason="the GPU reads whatever lies past the array; the twin refuses it")
def test_load_f32_shared_refuses_an_index_outside_the_array():
    from tessera_tile import sim

    with pytest.raises(sim.SimulationError, match="out of bounds"):
        scalar_load[1, 32](np.int64(2), np.zeros(32, np.float32))


@cuda.jit
def trans_on_float32(out):
    s = cuda.shared.array((32, 4), float32, alignment=16)
    lane = cuda.threadIdx.x
    for j in range(4):
        s[lane, j] = float32(lane)
    cuda.syncthreads()
    out[lane] = mma.ldmatrix_x1_trans(s, (lane, 0))


@pytest.mark.sim_only(reason="the compiler refuses it at typing; the twin must refuse it too")
def test_ldmatrix_trans_refuses_32bit_elements():
    from tessera_tile import sim

    with pytest.raises(sim.SimulationError, match="16-bit elements"):
        trans_on_float32[1, 32](np.zeros(32, np.uint32))


@cuda.jit
def pair_store(out, col):
    i = cuda.threadIdx.x
    mma.store_f32x2(out, (i, col), float32(i), float32(-i))


def test_store_f32x2_writes_pairs():
    out = np.zeros((32, 6), np.float32)
    pair_store[1, 32](out, 2)
    np.testing.assert_array_equal(out[:, 2], np.arange(32))
    np.testing.assert_array_equal(out[:, 3], -np.arange(32))
    assert not out[:, [0, 1, 4, 5]].any()


@pytest.mark.sim_only(reason="the GPU faults on a misaligned vector store; the twin refuses it")
def test_store_f32x2_refuses_misaligned_pairs():
    from tessera_tile import sim

    with pytest.raises(sim.SimulationError, match="8-byte aligned"):
        pair_store[1, 32](np.zeros((32, 6), np.float32), 1)
