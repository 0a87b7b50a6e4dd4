"""The TF32 tensor-core matmul (tessera_tile.kernels.matmul.tf32) against NumPy.

Reference: float64 products of the float32 inputs (+ bias, activation). The error bound is
derived, not tuned: the tensor core reads each input's upper 19 bits (truncation, relative
error below u = 2**-10 per input, so below 2u + u**2 per product), multiplies exactly and
accumulates in float32 (at most K + 1 roundings of 2**-24 each, bounded by (K + 2) 2**-24
relative to the sum of absolute terms); so, elementwise,

    |C - A @ B - bias| <= (2**-9 + 2**-20 + (K + 2) * 2**-24) * (|A| @ |B| + |bias|)

The tests assert it with a factor 2 on the accumulation term (the tensor core's internal
float32 sums are not specified to round to nearest); activations are Lipschitz with constant
at most 1.13 (gelu), asserted with 1.2 plus their own float32 error (4 ulp of the output).
"""

import numpy as np
import pytest
from helpers import assert_planned_profile, on, transposed_operands

from tessera_tile.kernels import epilogue
from tessera_tile.kernels.matmul import tf32 as tf

SMALL = dict(tile_m=32, tile_n=32, tile_k=16, num_warps=1, num_stages=2)
SMALL2 = dict(tile_m=32, tile_n=64, tile_k=8, num_warps=2, num_stages=3)
ACT_LIPSCHITZ = 1.2


def bound(a, b, bias):
    """The elementwise bound above, for (batch, M, K) @ (batch, K, N)."""
    k = a.shape[-1]
    gamma = 2.0**-9 + 2.0**-20 + 2 * (k + 2) * 2.0**-24
    scale = np.matmul(np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64)))
    if bias is not None:
        scale = scale + np.abs(bias.astype(np.float64))
    return gamma * scale


def operands(batch, m, n, k, seed=0, bias=False):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((batch, m, k)).astype(np.float32)
    b = rng.standard_normal((batch, k, n)).astype(np.float32)
    bb = rng.standard_normal(n).astype(np.float32) if bias else np.zeros(1, np.float32)
    return a, b, bb


def run(a, b, bias, *, side="host", activation=None, has_bias=False, **cfg):
    batch = max(a.shape[0], b.shape[0])
    m, k = a.shape[1:]
    n = b.shape[2]
    c = np.full((batch, m, n), np.nan, np.float32)
    assert tf.aligned_rows(a, b, c), "the TF32 kernel needs 16-byte aligned rows"
    act = epilogue.activation_function(activation)
    kernel = tf.tf32_matmul(**cfg, activation=act, has_bias=has_bias)
    p = tf.plan(batch, m, n, k, tf.ANCHOR._replace(**cfg, has_bias=has_bias))
    if 0 in p.grid:
        return c
    args = on(side, a, b, bias, c)
    p.launch(kernel, *args)
    return args[3] if side == "host" else args[3].copy_to_host()


def assert_within_bound(got, a, b, bias=None, activation=None):
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    if bias is not None:
        want = want + bias.astype(np.float64)
    tol = bound(a, b, bias)
    if activation is not None:
        want = epilogue.reference(activation, want)
        tol = ACT_LIPSCHITZ * tol + 4 * np.spacing(np.abs(want).astype(np.float32))
    assert got.dtype == np.float32
    assert np.all(np.isfinite(got)), "unwritten (NaN) elements"
    excess = np.abs(got - want) - tol
    assert np.all(excess <= 0), (
        f"{np.sum(excess > 0)} elements over the bound, worst {excess.max()}"
    )


@pytest.mark.parametrize(
    "shape",
    [(1, 32, 32, 32), (1, 31, 36, 16), (2, 33, 40, 24), (1, 65, 12, 44), (1, 1, 4, 4)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_small_config_within_tf32_bound(shape, side):
    batch, m, n, k = shape
    a, b, bias = operands(batch, m, n, k, seed=m + n + k)
    assert_within_bound(run(a, b, bias, side=side, **SMALL), a, b)


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu"])
def test_bias_and_activation(activation):
    a, b, bias = operands(1, 40, 64, 20, seed=2, bias=True)
    got = run(a, b, bias, activation=activation, has_bias=True, **SMALL2)
    assert_within_bound(got, a, b, bias, activation)


def test_really_tf32():
    """The tensor core truncates the inputs: the result is not the float32 product (an exact
    kernel would be within 1e-5), and it equals the product of the truncated inputs to
    float32 accumulation."""
    a, b, _ = operands(1, 32, 32, 64, seed=3)
    got = run(a, b, np.zeros(1, np.float32), **SMALL)
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
    rel = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    assert rel > 1e-4, rel  # truncation to 10 mantissa bits: ~2**-10 relative
    mask = np.uint32(0xFFFFE000)
    at = (a.view(np.uint32) & mask).view(np.float32).astype(np.float64)
    bt = (b.view(np.uint32) & mask).view(np.float32).astype(np.float64)
    scale = np.matmul(np.abs(at), np.abs(bt))
    assert np.all(np.abs(got - at @ bt) <= 2 * 66 * 2.0**-24 * scale)


def test_broadcast_batch_stride_zero():
    rng = np.random.default_rng(4)
    a = np.broadcast_to(rng.standard_normal((1, 40, 32)).astype(np.float32), (3, 40, 32))
    b = rng.standard_normal((3, 32, 36)).astype(np.float32)
    assert a.strides[0] == 0
    got = run(a, b, np.zeros(1, np.float32), **SMALL)
    assert_within_bound(got, a, b)


def test_k_zero_gives_act_of_bias():
    a = np.zeros((2, 20, 0), np.float32)
    b = np.zeros((2, 0, 36), np.float32)
    bias = np.linspace(-2, 2, 36).astype(np.float32)
    got = run(a, b, bias, activation="relu", has_bias=True, **SMALL)
    np.testing.assert_array_equal(got, np.broadcast_to(np.maximum(bias, 0), got.shape))


def test_empty_output_launches_nothing():
    a, b, bias = operands(1, 0, 8, 8)
    assert tf.plan(1, 0, 8, 8).grid[1] == 0
    assert run(a, b, bias, **SMALL).shape == (1, 0, 8)


@pytest.mark.sim_only(reason="the profiler measures traffic and bank conflicts in the simulator")
@pytest.mark.parametrize(
    ("cfg", "shape"),
    [(SMALL, (1, 64, 64, 48)), (SMALL2, (2, 40, 64, 32))],
    ids=["32x32x16-w1", "32x64x8-w2"],
)
def test_zero_bank_conflicts_and_planned_traffic(cfg, shape):
    from tessera_tile import sim

    batch, m, n, k = shape
    a, b, bias = operands(batch, m, n, k, seed=6, bias=True)
    c = np.zeros((batch, m, n), np.float32)
    kernel = tf.tf32_matmul(**cfg, has_bias=True)
    p = tf.plan(batch, m, n, k, tf.ANCHOR._replace(**cfg, has_bias=True))
    with sim.profile() as prof:
        p.launch(kernel, a, b, bias, c)
    assert_planned_profile(prof, p)
    assert_within_bound(c, a, b, bias)


LAYOUTS = {"plain": (False, False), "a_t": (True, False), "b_t": (False, True),
           "both_t": (True, True)}  # fmt: skip
TRANSPOSED = ["a_t", "b_t", "both_t"]


def run_transposed(a, b, m, n, k, layout, side="host", profile=None, **cfg):
    trans_a, trans_b = LAYOUTS[layout]
    c = np.full((a.shape[0], m, n), np.nan, np.float32)
    kernel = tf.tf32_matmul(**cfg, trans_a=trans_a, trans_b=trans_b)
    p = tf.plan(a.shape[0], m, n, k, tf.ANCHOR._replace(**cfg, trans_a=trans_a, trans_b=trans_b))
    args = on(side, a, b, np.zeros(1, np.float32), c)
    if profile is None:
        p.launch(kernel, *args)
    else:
        with profile() as prof:
            p.launch(kernel, *args)
        assert_planned_profile(prof, p)
    return args[3] if side == "host" else args[3].copy_to_host()


@pytest.mark.parametrize("layout", TRANSPOSED)
@pytest.mark.parametrize(
    ("shape", "cfg"), [((1, 40, 48, 40), SMALL), ((2, 36, 64, 24), SMALL2)], ids=["w1", "w2"]
)
def test_transposed_operands_within_tf32_bound(layout, shape, cfg, side):
    """A read as (K, M) (four LDS.32 per fragment), B as (N, K) (ldmatrix on rows taken in
    pairs), both: shapes straddling the tiles, host and device arrays (module tc_tf32)."""
    batch, m, n, k = shape
    a, b, va, vb = transposed_operands(batch, m, n, k, *LAYOUTS[layout], np.float32, m + n + k)
    assert_within_bound(run_transposed(a, b, m, n, k, layout, side, **cfg), va, vb)


@pytest.mark.sim_only(reason="the profiler counts bank conflicts in the simulator")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "cfg",
    [dict(tile_m=128, tile_n=128, tile_k=16, num_warps=8, num_stages=3),
     dict(tile_m=128, tile_n=128, tile_k=32, num_warps=4, num_stages=3)],
    ids=["anchor", "wide"],
)  # fmt: skip
def test_transposed_tiles_conflict_free_and_read_as_planned(layout, cfg):
    """The anchor and the wide tile (4 warps, k-tiles of 32: two rows a quarter-warp of copies,
    which the k-row swizzle before this one made conflict, 256 extra wavefronts a tile) with
    each layout: 0 bank conflicts, A and B read as the plan says."""
    from tessera_tile import sim

    a, b, va, vb = transposed_operands(
        1, 128, 128, 2 * cfg["tile_k"], *LAYOUTS[layout], np.float32, 8
    )
    c = run_transposed(a, b, 128, 128, va.shape[2], layout, profile=sim.profile, **cfg)
    assert_within_bound(c, va, vb)


@pytest.mark.sim_only(reason="the profiler counts bank conflicts in the simulator")
def test_default_config_single_tile():
    """The shipped default (128 x 128 x 16, 8 warps, 3 stages) on one tile, conflict free."""
    from tessera_tile import sim

    a, b, bias = operands(1, 128, 128, 32, seed=7, bias=True)
    c = np.zeros((1, 128, 128), np.float32)
    p = tf.plan(1, 128, 128, 32, tf.ANCHOR._replace(has_bias=True))
    with sim.profile() as prof:
        p.launch(tf.tf32_matmul(has_bias=True), a, b, bias, c)
    assert prof.bank_conflicts == 0, str(prof)
    assert_within_bound(c, a, b, bias)


@pytest.mark.sim_only(reason="the profiler counts bank conflicts in the simulator")
def test_four_warps_of_64x64_single_tile():
    """128 x 128 x 16 with 4 warps of 64 x 64 (the tile that meets the instructions-per-HMMA
    bar in tests/compile/test_mma_sass.py): 4 B blocks of 16 columns per warp, conflict free."""
    from tessera_tile import sim

    cfg = dict(tile_m=128, tile_n=128, tile_k=16, num_warps=4, num_stages=3)
    a, b, bias = operands(1, 128, 128, 48, seed=9, bias=True)
    c = np.zeros((1, 128, 128), np.float32)
    p = tf.plan(1, 128, 128, 48, tf.ANCHOR._replace(**cfg, has_bias=True))
    with sim.profile() as prof:
        p.launch(tf.tf32_matmul(**cfg, has_bias=True), a, b, bias, c)
    assert prof.bank_conflicts == 0, str(prof)
    assert_within_bound(c, a, b, bias)


def test_plan_figures():
    p = tf.plan(2, 300, 200, 64)
    assert p.grid == (2, 3, 2) and p.block == (256, 1, 1)
    assert p.bytes_a == 4 * 2 * 300 * 64 * 2  # float32, once per column of output tiles
    assert p.bytes_b == 4 * 2 * 64 * 200 * 3  # once per row of output tiles
    assert p.bytes_c == 4 * 2 * 300 * 200


def test_configs_are_validated():
    with pytest.raises(ValueError, match="tile_n must be at least 32"):
        tf.tf32_matmul(32, 16, 16, 1, 2)
    with pytest.raises(ValueError, match="tile_k"):
        tf.tf32_matmul(32, 32, 64, 1, 2)
    with pytest.raises(ValueError, match="no architecture gives a block more than"):
        tf.tf32_matmul(256, 256, 32, 8, 4)  # 256 KiB
    with pytest.raises(ValueError, match="tile_m of at least 32"):  # A's scalar fragment reads
        tf.tf32_matmul(16, 32, 16, 1, 2, trans_a=True)


def test_check_operands():
    a, b, bias = operands(2, 16, 12, 8)
    c = np.empty((2, 16, 12), np.float32)
    assert tf.check_operands(a, b, bias, c) is True
    assert tf.check_operands(a[:, :, :6], b[:, :6], bias, c) is False  # K = 6: not aligned
    with pytest.raises(TypeError, match="a must be float32"):
        tf.check_operands(a.astype(np.float16), b, bias, c)
    with pytest.raises(ValueError, match="inner dimensions"):
        tf.check_operands(a, b[:, :4], bias, c)
