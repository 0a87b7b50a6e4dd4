"""The tensor-core matmul with transposed operands (``trans_a``/``trans_b``, kernels.matmul.tc
and .tc_staging): A read as a ``(batch, K, M)`` array, B as ``(batch, N, K)``, as the backward
GEMMs ``dy @ w.T`` and ``x.T @ dy`` read the forward's arrays. Against float64 NumPy of the
float16 (bfloat16) inputs; the tolerances are test_mma_matmul's (float16, relative Frobenius
1e-2) and test_mma_matmul_bf16's (4.5e-3), for the same float32 accumulation and one rounding.
"""

import ml_dtypes
import numpy as np
import pytest
from helpers import assert_planned_profile, on, transposed_operands
from numba import cuda, float32

from tessera_tile.kernels.matmul import tc

RTOL_FRO = {np.dtype(np.float16): 1e-2, np.dtype(ml_dtypes.bfloat16): 4.5e-3}
SMALL = dict(tile_m=32, tile_n=32, tile_k=16, num_warps=1, num_stages=2)
SMALL2 = dict(tile_m=32, tile_n=32, tile_k=16, num_warps=2, num_stages=3)
F16 = np.float16
LAYOUTS = [(True, False), (False, True), (True, True)]
LAYOUT_IDS = ["a_t", "b_t", "both_t"]


@cuda.jit(device=True)
def relu(x):
    return max(x, float32(0.0))


def run(a, b, m, n, k, bias, *, side, trans_a, trans_b, async_copy, profile=None, **cfg):
    bf16 = a.dtype == ml_dtypes.bfloat16
    batch = a.shape[0]
    has_bias = bias is not None
    c = np.full((batch, m, n), np.nan, a.dtype)
    options = dict(has_bias=has_bias, async_copy=async_copy, bf16=bf16)
    kernel = tc.tensor_core_matmul(
        **cfg, **options, activation=relu if has_bias else None, trans_a=trans_a,
        trans_b=trans_b,
    )  # fmt: skip
    config = tc.TensorCoreConfig(**cfg, **options, trans_a=trans_a, trans_b=trans_b)
    p = tc.plan(batch, m, n, k, config)
    bits = (lambda x: x.view(np.uint16)) if bf16 else (lambda x: x)
    bias = bits(bias) if has_bias else np.zeros(1, np.float32)  # bfloat16 kernels: its bits
    args = on(side, bits(a), bits(b), bias, bits(c))
    if profile is None:
        p.launch(kernel, *args)
    else:
        with profile() as prof:
            p.launch(kernel, *args)
        assert_planned_profile(prof, p)
    got = args[3] if side == "host" else args[3].copy_to_host()
    return got.view(a.dtype)


def assert_close(got, want):
    assert np.all(np.isfinite(got.astype(np.float32))), "unwritten (NaN) or overflowed elements"
    err = np.linalg.norm(got.astype(np.float64) - want)
    assert err / max(np.linalg.norm(want), 1e-300) < RTOL_FRO[got.dtype]


@pytest.mark.parametrize(("trans_a", "trans_b"), LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize(
    ("shape", "async_copy", "cfg"),
    [((2, 40, 48, 56), True, SMALL2), ((1, 37, 45, 27), False, SMALL)],
    ids=["aligned_async", "unaligned_sync"],
)
def test_transposed_operands_match_numpy(trans_a, trans_b, shape, async_copy, cfg, side):
    """Shapes that straddle the 32 x 32 x 16 tiles, on host and device arrays."""
    batch, m, n, k = shape
    a, b, va, vb = transposed_operands(batch, m, n, k, trans_a, trans_b, F16, seed=m + n + k)
    got = run(a, b, m, n, k, None, side=side, trans_a=trans_a, trans_b=trans_b,
              async_copy=async_copy, **cfg)  # fmt: skip
    assert_close(got, va.astype(np.float64) @ vb.astype(np.float64))


@pytest.mark.parametrize(("trans_a", "trans_b"), LAYOUTS, ids=LAYOUT_IDS)
def test_bfloat16_transposed_with_bias_and_activation(trans_a, trans_b):
    a, b, va, vb = transposed_operands(1, 48, 40, 32, trans_a, trans_b, ml_dtypes.bfloat16, seed=3)
    bias = np.random.default_rng(4).standard_normal(40).astype(ml_dtypes.bfloat16)
    got = run(a, b, 48, 40, 32, bias, side="host", trans_a=trans_a, trans_b=trans_b,
              async_copy=True, **SMALL2)  # fmt: skip
    want = va.astype(np.float64) @ vb.astype(np.float64) + bias.astype(np.float64)
    assert_close(got, np.maximum(want, 0))


@pytest.mark.sim_only(reason="the profiler exists only in the simulator")
@pytest.mark.parametrize(("trans_a", "trans_b"), LAYOUTS, ids=LAYOUT_IDS)
def test_transposed_tiles_are_conflict_free_and_read_as_planned(trans_a, trans_b):
    """The 128 x 128 x 32 anchor tile: ldmatrix(.trans) of the transposed tiles and their
    cp.async copies hit no bank conflict; A and B are read as the plan says (each once per
    column / row of C tiles)."""
    from tessera_tile import sim

    a, b, va, vb = transposed_operands(1, 128, 128, 64, trans_a, trans_b, F16, seed=7)
    got = run(a, b, 128, 128, 64, None, side="host", trans_a=trans_a, trans_b=trans_b,
              async_copy=True, profile=sim.profile, tile_m=128, tile_n=128, tile_k=32,
              num_warps=4, num_stages=3)  # fmt: skip
    assert_close(got, va.astype(np.float64) @ vb.astype(np.float64))


def test_transposed_configurations_are_checked():
    with pytest.raises(ValueError, match="power of two"):  # A's staged rows: tile_m wide
        tc.TensorCoreConfig(tile_m=96, tile_n=64, num_warps=2, trans_a=True).validate()
    tc.TensorCoreConfig(tile_m=96, tile_n=64, num_warps=2).validate()  # fine untransposed
