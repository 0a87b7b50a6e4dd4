"""The float16 tensor-core matmul (tessera_tile.kernels.matmul.tc) against NumPy.

Reference: float64 products of the float16 inputs (+ bias, activation). The kernel accumulates
in float32 and rounds the result once to float16, so the relative Frobenius error stays below
1e-2 (float16 rounding is 2**-11 ~ 4.9e-4 relative per element).
"""

import math
from functools import partial

import numpy as np
import pytest
from helpers import assert_planned_profile, on
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda, float32

from tessera_tile.kernels import epilogue
from tessera_tile.kernels.matmul import tc

RTOL_FRO = 1e-2  # relative Frobenius error for float16 output
SMALL = dict(tile_m=32, tile_n=32, tile_k=16, num_warps=1, num_stages=2)
SMALL2 = dict(tile_m=32, tile_n=32, tile_k=16, num_warps=2, num_stages=3)
ANCHOR = dict(tile_m=128, tile_n=128, tile_k=32, num_warps=4, num_stages=3)


@cuda.jit(device=True)
def relu(x):
    return max(x, float32(0.0))


np_relu = partial(epilogue.reference, "relu")


def operands(batch, m, n, k, seed=0, bias=False):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((batch, m, k)).astype(np.float16)
    b = rng.standard_normal((batch, k, n)).astype(np.float16)
    bb = rng.standard_normal(n).astype(np.float32) if bias else np.zeros(1, np.float32)
    return a, b, bb


def reference(a, b, bias=None, act=None):
    r = np.matmul(a.astype(np.float64), b.astype(np.float64))
    if bias is not None:
        r = r + bias.astype(np.float64)
    return act(r) if act is not None else r


def run(a, b, bias, *, side="host", activation=None, has_bias=False, async_copy=None, **cfg):
    batch = max(a.shape[0], b.shape[0])
    m, k = a.shape[1:]
    n = b.shape[2]
    c = np.full((batch, m, n), np.nan, np.float16)
    if async_copy is None:
        async_copy = tc.aligned_rows(a, b, c)
    config = tc.TensorCoreConfig(**cfg, has_bias=has_bias, async_copy=async_copy)
    kernel = tc.tensor_core_matmul(
        **cfg, activation=activation, has_bias=has_bias, async_copy=async_copy
    )
    p = tc.plan(batch, m, n, k, config)
    if 0 in p.grid:
        return c
    args = on(side, a, b, bias, c)
    p.launch(kernel, *args)
    return args[3] if side == "host" else args[3].copy_to_host()


def assert_close(got, want):
    assert got.dtype == np.float16
    assert np.all(np.isfinite(got)), "unwritten (NaN) or overflowed elements"
    err = np.linalg.norm(got.astype(np.float64) - want)
    scale = max(np.linalg.norm(want), 1e-30)
    assert err / scale < RTOL_FRO, f"relative Frobenius error {err / scale:.3g}"


@pytest.mark.parametrize(
    "shape",
    [(1, 32, 32, 32), (1, 31, 33, 16), (2, 33, 40, 24), (1, 65, 17, 48), (1, 1, 8, 8)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_small_config_matches_numpy(shape, side):
    batch, m, n, k = shape
    a, b, bias = operands(batch, m, n, k, seed=m + n + k)
    assert_close(run(a, b, bias, side=side, **SMALL), reference(a, b))


@pytest.mark.parametrize("shape", [(1, 37, 45, 40), (2, 30, 31, 13), (1, 16, 5, 3)])
def test_unaligned_fallback_bias_relu(shape, side):
    """K or N not a multiple of 8: rows are not 16-byte aligned, the synchronous variant."""
    batch, m, n, k = shape
    a, b, bias = operands(batch, m, n, k, seed=1, bias=True)
    assert not tc.aligned_rows(a, b, np.empty((batch, m, n), np.float16))
    got = run(a, b, bias, side=side, activation=relu, has_bias=True, **SMALL2)
    assert_close(got, reference(a, b, bias, np_relu))


def test_async_two_warps_bias_relu():
    a, b, bias = operands(1, 64, 48, 48, seed=2, bias=True)
    got = run(a, b, bias, activation=relu, has_bias=True, **SMALL2)
    assert_close(got, reference(a, b, bias, np_relu))


def test_broadcast_batch_stride_zero():
    """A batch of one matrix broadcast (batch stride 0) against a batch of three."""
    rng = np.random.default_rng(3)
    a = np.broadcast_to(rng.standard_normal((1, 40, 32)).astype(np.float16), (3, 40, 32))
    b = rng.standard_normal((3, 32, 24)).astype(np.float16)
    assert a.strides[0] == 0
    assert tc.aligned_rows(a, b, np.empty((3, 40, 24), np.float16))
    got = run(a, b, np.zeros(1, np.float32), **SMALL)
    assert_close(got, reference(a, b))


@pytest.mark.parametrize("async_copy", [True, False])
def test_k_zero_gives_act_of_bias(async_copy):
    """An empty inner dimension: a @ b is zeros, so the result is act(0 + bias)."""
    a = np.zeros((2, 20, 0), np.float16)
    b = np.zeros((2, 0, 24), np.float16)
    bias = np.linspace(-2, 2, 24).astype(np.float32)
    got = run(a, b, bias, activation=relu, has_bias=True, async_copy=async_copy, **SMALL)
    np.testing.assert_array_equal(got, np.broadcast_to(np_relu(bias).astype(np.float16), got.shape))


def test_empty_outputs_launch_nothing():
    a, b, bias = operands(1, 0, 8, 8)
    assert tc.plan(1, 0, 8, 8, tc.TensorCoreConfig(**SMALL)).grid[1] == 0
    assert run(a, b, bias, **SMALL).shape == (1, 0, 8)


def test_anchor_config_single_tile():
    """The default 128 x 128 x 32, 4 warps, 3 stages on one tile, with ragged edges."""
    a, b, bias = operands(1, 120, 128, 72, seed=4, bias=True)
    got = run(a, b, bias, activation=relu, has_bias=True, **ANCHOR)
    assert_close(got, reference(a, b, bias, np_relu))


def test_inputs_not_modified():
    a, b, bias = operands(1, 33, 40, 24, seed=5, bias=True)
    copies = [x.copy() for x in (a, b, bias)]
    run(a, b, bias, has_bias=True, **SMALL)
    for before, after in zip(copies, (a, b, bias), strict=True):
        np.testing.assert_array_equal(before, after)


@given(
    batch=st.integers(1, 2),
    m=st.integers(1, 40),
    n=st.integers(1, 40),
    k=st.integers(0, 40),
    seed=st.integers(0, 2**16),
)
def test_hypothesis_small_shapes(batch, m, n, k, seed):
    a, b, bias = operands(batch, m, n, k, seed=seed, bias=True)
    got = run(a, b, bias, has_bias=True, **SMALL)
    want = reference(a, b, bias)
    if k == 0:
        np.testing.assert_array_equal(got, np.broadcast_to(bias.astype(np.float16), got.shape))
    else:
        assert_close(got, want)


# ---------------------------------------------------------------------------------------------
# The profile: conflict-free shared memory, traffic as planned
# ---------------------------------------------------------------------------------------------


@pytest.mark.sim_only(reason="the profiler exists only in the simulator")
@pytest.mark.parametrize(
    ("cfg", "shape"),
    [(SMALL, (1, 64, 64, 64)), (SMALL2, (2, 40, 48, 32)), (ANCHOR, (1, 128, 128, 64))],
    ids=["32x32x16-w1", "32x32x16-w2", "anchor"],
)
def test_zero_bank_conflicts_and_planned_traffic(cfg, shape):
    from tessera_tile import sim

    batch, m, n, k = shape
    a, b, bias = operands(batch, m, n, k, seed=6, bias=True)
    c = np.zeros((batch, m, n), np.float16)
    config = tc.TensorCoreConfig(**(cfg | {"has_bias": True}))
    assert tc.aligned_rows(a, b, c)
    kernel = tc.tensor_core_matmul(**(cfg | {"has_bias": True}))
    p = tc.plan(batch, m, n, k, config)
    with sim.profile() as prof:
        p.launch(kernel, a, b, bias, c)
    assert_planned_profile(prof, p)
    assert_close(c, reference(a, b, bias))


def test_plan_figures():
    p = tc.plan(2, 300, 200, 64, tc.ANCHOR)
    assert p.grid == (2, 3, 2) and p.block == (128, 1, 1)
    assert p.bytes_a == 2 * 2 * 300 * 64 * 2  # once per column of output tiles
    assert p.bytes_b == 2 * 2 * 64 * 200 * 3  # once per row of output tiles
    assert p.bytes_c == 2 * 2 * 300 * 200
    assert p.bytes_bias == 0
    assert p.bytes_total == p.bytes_a + p.bytes_b + p.bytes_c


def test_bad_configurations_raise_naming_the_argument():
    with pytest.raises(ValueError, match="num_stages"):
        tc.tensor_core_matmul(num_stages=5)
    with pytest.raises(ValueError, match="tile_k"):
        tc.tensor_core_matmul(tile_k=24)
    with pytest.raises(ValueError, match="num_warps"):
        tc.tensor_core_matmul(num_warps=3)
    with pytest.raises(ValueError, match="no architecture gives a block more than"):
        tc.tensor_core_matmul(256, 256, 64, 8, 4)  # 256 KiB
    with pytest.raises(TypeError, match="activation"):
        tc.tensor_core_matmul(activation=math.tanh)
    with pytest.raises(ValueError, match="tile_n"):
        tc.tensor_core_matmul(tile_n=48, num_warps=1, tile_m=32)


def test_check_operands_names_the_argument():
    a, b, bias = operands(2, 8, 16, 8)
    c = np.empty((2, 8, 16), np.float16)
    assert tc.check_operands(a, b, bias, c) is True
    assert tc.check_operands(a[:, :, :7], b[:, :7], bias, c) is False  # K = 7: not aligned
    with pytest.raises(TypeError, match="a must be float16"):
        tc.check_operands(a.astype(np.float32), b, bias, c)
    with pytest.raises(TypeError, match="bias"):
        tc.check_operands(a, b, bias.astype(np.float16), c)
    with pytest.raises(ValueError, match="inner dimensions"):
        tc.check_operands(a, b[:, :7], bias, c)
    with pytest.raises(ValueError, match="batch"):
        tc.check_operands(a[:1], b, bias, c)
    with pytest.raises(ValueError, match="c has shape"):
        tc.check_operands(a, b, bias, c[:, :4])
    with pytest.raises(ValueError, match="contiguous"):
        tc.check_operands(a[:, :, ::2], b[:, :4], bias, c)
    with pytest.raises(ValueError, match="stride of 0"):
        tc.check_operands(a, b, bias, np.broadcast_to(c[:1], c.shape))
    with pytest.raises(TypeError, match="not an array"):
        tc.check_operands(a, [1.0], bias, c)
