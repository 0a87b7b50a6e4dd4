"""bfloat16 conversions (tessera_tile.bfloat16) against ml_dtypes, NumPy's bfloat16: the twins'
bits for every bfloat16 and for float32 values across the range (ties, overflow, subnormals,
infinities, NaN), and the intrinsics in kernels on host and device arrays."""

import ml_dtypes
import numpy as np
import pytest
from helpers import SIDES, on
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

from tessera_tile import bfloat16 as bf

EVERY_BF16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def reference_bits(x: np.ndarray) -> np.ndarray:
    """ml_dtypes' round-to-nearest-even conversion, as bit patterns."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def same_bits_or_both_nan(got_bits, want_bits):
    got, want = bf.bits_to_float32(got_bits), bf.bits_to_float32(want_bits)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got_bits[~nan], want_bits[~nan])


def test_every_bfloat16_widens_exactly():
    want = EVERY_BF16.view(ml_dtypes.bfloat16).astype(np.float32)
    got = bf.bits_to_float32(EVERY_BF16)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_every_bfloat16_narrows_to_itself():
    same_bits_or_both_nan(bf.float32_to_bits(bf.bits_to_float32(EVERY_BF16)), EVERY_BF16)


EDGES = np.array(
    [
        0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, -np.nan,
        3.3895314e38,  # bfloat16's largest finite value
        3.3961e38,  # rounds up to inf (past the halfway point above the largest finite)
        3.4028235e38,  # float32's largest: inf in bfloat16
        1e-40, -1e-40, 1.4e-45,  # float32 subnormals: kept as bfloat16 subnormals or 0
        1.00390625,  # 1 + 2^-8: a tie between 1 and 1 + 2^-7, to the even 1
        1.01171875,  # 1 + 3 * 2^-8: a tie, to the even 1 + 2^-6
        65504.0, 70000.0, 3e38, -3e38,  # past float16's range, inside bfloat16's
    ],
    np.float32,
)  # fmt: skip


def test_float32_narrows_as_ml_dtypes_at_the_edges():
    same_bits_or_both_nan(bf.float32_to_bits(EDGES), reference_bits(EDGES))


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64))
def test_any_float32_narrows_as_ml_dtypes(patterns):
    x = np.array(patterns, np.uint32).view(np.float32)
    same_bits_or_both_nan(bf.float32_to_bits(x), reference_bits(x))


@cuda.jit
def convert(bits, x, widened, narrowed, packed):
    i = cuda.grid(1)
    if i < bits.size:
        widened[i] = bf.bf16_to_f32(bits[i])
        narrowed[i] = bf.f32_to_bf16(x[i])
        packed[i] = bf.pack_bf16x2(x[i], -x[i])


@pytest.mark.parametrize("side", SIDES)
def test_the_intrinsics_in_a_kernel(side):
    rng = np.random.default_rng(0)
    bits = np.concatenate([EVERY_BF16[::97], reference_bits(EDGES)])
    x = np.concatenate([rng.standard_normal(bits.size - EDGES.size) * 1e30, EDGES])
    x = x.astype(np.float32)
    n = bits.size
    outs = np.zeros(n, np.float32), np.zeros(n, np.uint16), np.zeros(n, np.uint32)
    placed = on(side, bits, x, *outs)
    convert[-(-n // 128), 128](*placed)
    widened, narrowed, packed = (p if side == "host" else p.copy_to_host() for p in placed[2:])
    want = bits.view(ml_dtypes.bfloat16).astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(widened), nan)
    np.testing.assert_array_equal(widened[~nan], want[~nan])
    same_bits_or_both_nan(narrowed, reference_bits(x))
    same_bits_or_both_nan((packed & 0xFFFF).astype(np.uint16), reference_bits(x))
    same_bits_or_both_nan((packed >> 16).astype(np.uint16), reference_bits(-x))
