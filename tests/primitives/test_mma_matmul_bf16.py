"""The bfloat16 tensor-core matmul (kernels.matmul.tc with ``bf16=True``): every array its uint16
bits, bfloat16 products exact in float32, float32 accumulation, one rounding to bfloat16 at the
store. So each element is within 2^-8 of the float64 product, relatively, plus the float32 sum's
error (K terms of 2^-24): the relative Frobenius error stays below 2^-8 + K 2^-24, under 4.5e-3
for these K."""

import ml_dtypes
import numpy as np
import pytest
from helpers import on
from numba import cuda, float32

from tessera_tile.kernels.matmul import tc

BF16 = ml_dtypes.bfloat16
RTOL_FRO = 4.5e-3
SMALL = dict(tile_m=32, tile_n=32, tile_k=16, num_warps=1, num_stages=2)
SMALL2 = dict(tile_m=32, tile_n=32, tile_k=16, num_warps=2, num_stages=3)


@cuda.jit(device=True)
def relu(x):
    return max(x, float32(0.0))


def operands(batch, m, n, k, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((batch, m, k)) * scale).astype(BF16)
    b = (rng.standard_normal((batch, k, n)) / scale).astype(BF16)
    bias = rng.standard_normal(n).astype(BF16)
    return a, b, bias


def run(a, b, bias, *, side, async_copy, has_bias=False, activation=None, **cfg):
    batch, m, k = a.shape
    n = b.shape[2]
    c = np.full((batch, m, n), 0x7FFF, np.uint16)  # NaN until written
    kernel = tc.tensor_core_matmul(
        **cfg, activation=activation, has_bias=has_bias, async_copy=async_copy, bf16=True
    )
    config = tc.TensorCoreConfig(**cfg, has_bias=has_bias, async_copy=async_copy, bf16=True)
    p = tc.plan(batch, m, n, k, config)
    args = on(side, a.view(np.uint16), b.view(np.uint16), bias.view(np.uint16), c)
    p.launch(kernel, *args)
    got = args[3] if side == "host" else args[3].copy_to_host()
    return got.view(BF16)


def assert_close(got, want):
    assert np.all(np.isfinite(got.astype(np.float32))), "unwritten (NaN) or overflowed elements"
    err = np.linalg.norm(got.astype(np.float64) - want)
    assert err / max(np.linalg.norm(want), 1e-300) < RTOL_FRO


@pytest.mark.parametrize(
    ("shape", "async_copy"),
    [((1, 32, 32, 32), True), ((2, 33, 40, 24), True), ((1, 37, 45, 40), False)],
    ids=["one_tile", "batch_edges", "unaligned_sync"],
)
def test_bf16_matmul_matches_numpy(shape, async_copy, side):
    batch, m, n, k = shape
    a, b, bias = operands(batch, m, n, k, seed=m + n + k, scale=1e30)  # past float16's range
    got = run(a, b, bias, side=side, async_copy=async_copy, **SMALL)
    assert_close(got, a.astype(np.float64) @ b.astype(np.float64))


def test_bf16_bias_and_activation_in_the_epilogue(side):
    a, b, bias = operands(1, 64, 48, 48, seed=5)
    got = run(a, b, bias, side=side, async_copy=True, has_bias=True, activation=relu, **SMALL2)
    want = a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64)
    assert_close(got, np.maximum(want, 0))
