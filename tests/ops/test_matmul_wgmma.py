"""The warpgroup-MMA matmul (kernels.matmul.wgmma, sm_90a) against NumPy, element by element.

The reference is float64 on the rounded inputs (float16 or bfloat16: their products are exact in
float64). The kernel accumulates in float32 (the twin of each k16 wgmma sums exactly and rounds
once to float32, as the tensor core keeps at least float32 precision) and rounds once to the
output type at the store, so every element satisfies

    |c - ref| <= R * |ref| + 1e-5 * S        S = |A| @ |B| + |bias|

with R = 2^-11 for float16 and 2^-8 for bfloat16 (half an ulp of the output type: its rounding)
and the second term covering the float32 sums (at most K / 16 roundings of 2^-24 relative to S
here) and the float32 evaluation of an activation (|act'| <= 1.13 for those of the table). The
reference of ``act(A @ B + bias)`` is the activation's float64 NumPy definition.

Launch grids stay small (one to four blocks of 128 or 256 simulated threads). On a GPU
(``TESSERA_TIER=gpu``) the same tests run on compute capability 9.0 and later and are skipped,
with the reason printed, on older devices; the profiler test is simulator-only.
"""

import functools
import math

import ml_dtypes
import numpy as np
import pytest
from helpers import SIMULATED, assert_planned_profile, on, on_sm90a, wgmma_skip
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda, float32

from tessera_tile import mma, pipeline, sim
from tessera_tile.kernels import epilogue
from tessera_tile.kernels.matmul import wgmma as wg

pytestmark = wgmma_skip("test_matmul_wgmma")

BF16 = ml_dtypes.bfloat16
RTOL = {False: 2.0**-11, True: 2.0**-8}  # half an ulp of float16 / bfloat16
STOL = 1e-5  # relative to |A| @ |B| + |bias|: float32 sums and activations
# (tile_m, tile_n, tile_k, num_warps, num_stages)
ONE_GROUP = (64, 64, 32, 4, 3)  # one warpgroup of 64 x 64, 64-byte swizzled A rows
TWO_GROUPS = (128, 64, 32, 8, 4)  # two warpgroups of 64 x 64, 4 stages
TWO_BLOCKS = (128, 64, 64, 4, 3)  # one warpgroup, two 64-row accumulators, 128B swizzle
DEFAULT = tuple(wg.DEFAULT[:5])  # 128 x 128 x 64, two warpgroups, 4 stages
WIDE = (128, 256, 64, 8, 3)  # two warpgroups of 64 x 256 (128 accumulators per thread)
TALL = (256, 128, 64, 8, 3)  # two warpgroups, two 64 x 128 accumulators each


def operands(batch, m, n, k, seed, bf16=False):
    rng = np.random.default_rng(seed)
    dtype = BF16 if bf16 else np.float16
    a = rng.standard_normal((batch, m, k)).astype(dtype)
    b = rng.standard_normal((batch, k, n)).astype(dtype)
    bias = rng.standard_normal(n).astype(dtype if bf16 else np.float32)
    return a, b, bias


def bits(x):
    """bfloat16 arrays travel as their uint16 bits (as the mma.sync kernel takes them)."""
    return x.view(np.uint16) if x.dtype == BF16 else x


def run(
    a, b, bias, cfg, *, bf16=False, has_bias=False, activation=None, extras=(), side="host",
    producer=False,
):  # fmt: skip
    batch, m, k = a.shape
    n = b.shape[2]
    dtype = BF16 if bf16 else np.float16
    c = np.full((batch, m, n), np.nan, dtype)  # NaN until written
    kernel = wg.wgmma_matmul(
        *cfg, activation=activation, has_bias=has_bias, bf16=bf16, producer=producer
    )
    p = wg.plan(batch, m, n, k, wg.WgmmaConfig(*cfg, has_bias, bf16, producer))
    dummy = np.zeros(1, bias.dtype)  # no bias: a 1-element stand-in, bits too for bfloat16
    args = on(side, bits(a), bits(b), bits(bias if has_bias else dummy), bits(c))
    p.launch(kernel, *args, *((extras,) if extras else ()))
    got = args[3] if side == "host" else args[3].copy_to_host()
    return got.view(dtype) if bf16 else got


def reference(a, b, bias=None, activation=None):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    pre, scale = a64 @ b64, np.abs(a64) @ np.abs(b64)
    if bias is not None:
        pre, scale = pre + bias.astype(np.float64), scale + np.abs(bias.astype(np.float64))
    return epilogue.reference(activation, pre), scale


def assert_close(got, want, scale, bf16):
    got = got.astype(np.float64)
    assert not np.isnan(got).any(), "unwritten (NaN) elements"
    err = np.abs(got - want)
    bound = RTOL[bf16] * np.abs(want) + STOL * scale
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), (
        f"{int((err > bound).sum())} elements off; worst at {worst}: got {got[worst]}, "
        f"want {want[worst]}, bound {bound[worst]}"
    )


# ---------------------------------------------------------------------------------------------
# Shapes across the tiles: edges of M, N and K, one and several k-tiles, batches
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bf16", [False, True], ids=["f16", "bf16"])
@pytest.mark.parametrize(
    ("cfg", "shape"),
    [
        (ONE_GROUP, (1, 64, 64, 32)),  # one tile, one k-tile
        (ONE_GROUP, (2, 70, 72, 200)),  # M, N, K past the tiles; 7 k-tiles around a 3-ring
        (TWO_GROUPS, (1, 130, 64, 96)),  # second warpgroup's rows partly, then wholly outside
        (TWO_BLOCKS, (1, 100, 56, 136)),  # two accumulators; the last k-tile partly past K
        (DEFAULT, (1, 128, 120, 136)),  # the default tile, N past the edge
        (WIDE, (1, 72, 200, 64)),  # N = 256 wgmma
        (TALL, (1, 200, 64, 72)),  # 4 accumulators per block
    ],
    ids=["one-tile", "edges-batch", "two-groups", "two-blocks", "default", "wide", "tall"],
)
def test_matches_numpy(cfg, shape, bf16):
    batch, m, n, k = shape
    a, b, bias = operands(batch, m, n, k, seed=m + n + k + bf16, bf16=bf16)
    got = run(a, b, bias, cfg, bf16=bf16)
    assert_close(got, *reference(a, b), bf16)


# ---------------------------------------------------------------------------------------------
# Warp specialisation: a producer warpgroup copies, the others multiply (mbarrier hand-off)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bf16", [False, True], ids=["f16", "bf16"])
@pytest.mark.parametrize(
    ("cfg", "shape"),
    [
        (DEFAULT, (1, 128, 120, 136)),  # 4 stages, 3 k-tiles: the ring never wraps
        (DEFAULT, (1, 70, 72, 392)),  # 7 k-tiles in a 4-ring: stages refilled
        (ONE_GROUP, (2, 70, 72, 200)),  # one consumer warpgroup, 7 k-tiles in a 3-ring
        (TWO_BLOCKS, (1, 100, 56, 136)),  # one consumer warpgroup, two accumulators
        (WIDE, (1, 72, 200, 64)),  # one k-tile
    ],
    ids=["default", "wraps", "one-group", "two-blocks", "wide"],
)
def test_warp_specialised_matches_numpy(cfg, shape, bf16):
    batch, m, n, k = shape
    a, b, bias = operands(batch, m, n, k, seed=m + n + k + bf16, bf16=bf16)
    got = run(a, b, bias, cfg, bf16=bf16, producer=True)
    assert_close(got, *reference(a, b), bf16)


def test_warp_specialised_bias_gelu_on_device_arrays():
    a, b, bias = operands(2, 90, 64, 264, seed=21)
    gelu = epilogue.ACTIVATIONS["gelu"]
    got = run(a, b, bias, TWO_GROUPS, has_bias=True, activation=gelu, side="device",
              producer=True)  # fmt: skip
    assert_close(got, *reference(a, b, bias, "gelu"), False)


def test_device_arrays():
    a, b, bias = operands(2, 40, 72, 48, seed=3)
    got = run(a, b, bias, ONE_GROUP, has_bias=True, side="device")
    assert_close(got, *reference(a, b, bias), False)


@pytest.mark.parametrize("producer", [False, True], ids=["", "producer"])
@pytest.mark.parametrize("cfg", [ONE_GROUP, TWO_BLOCKS], ids=["one-group", "two-blocks"])
def test_strided_device_views(cfg, producer):
    """Sources are element offsets from the strides: A every other batch of padded rows, B one
    matrix broadcast over the batch (batch stride 0), as ops pass views."""
    from tessera_tile._runtime import arrays as _arrays

    batch, m, n, k = 2, 70, 72, 136
    rng = np.random.default_rng(11)
    a_full = rng.standard_normal((2 * batch, m, k + 8)).astype(np.float16)
    b_one = rng.standard_normal((k, n)).astype(np.float16)
    a = a_full[::2, :, :k]
    b = np.broadcast_to(b_one, (batch, k, n))
    d_a = cuda.to_device(a_full)[::2, :, :k]
    d_b = _arrays.view(cuda.to_device(b_one), (batch, k, n), (0, *b_one.strides))
    d_c = cuda.to_device(np.full((batch, m, n), np.nan, np.float16))
    kernel = wg.wgmma_matmul(*cfg, producer=producer)
    plan = wg.plan(batch, m, n, k, wg.WgmmaConfig(*cfg, producer=producer))
    plan.launch(kernel, d_a, d_b, np.zeros(1), d_c)
    assert_close(d_c.copy_to_host(), *reference(a, b), False)


def test_empty_inner_dimension_is_activation_of_bias():
    a, b, bias = operands(1, 20, 64, 0, seed=4)
    got = run(a, b, bias, ONE_GROUP, has_bias=True, activation=epilogue.ACTIVATIONS["relu"])
    want = np.broadcast_to(np.maximum(bias, 0).astype(np.float16), got.shape)
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------------------------
# Epilogues: bias and every named activation, an ElementEpilogue
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(epilogue.ACTIVATIONS))
def test_bias_and_activation(name):
    a, b, bias = operands(1, 70, 64, 48, seed=len(name))
    got = run(a, b, bias, ONE_GROUP, has_bias=True, activation=epilogue.ACTIVATIONS[name])
    assert_close(got, *reference(a, b, bias, name), False)


def test_bias_and_gelu_bf16_two_warpgroups():
    a, b, bias = operands(1, 128, 64, 64, seed=9, bf16=True)
    got = run(
        a, b, bias, TWO_GROUPS, bf16=True, has_bias=True, activation=epilogue.ACTIVATIONS["gelu"]
    )
    assert_close(got, *reference(a, b, bias, "gelu"), True)


@cuda.jit(device=True)
def _scaled_residual(x, z, row, col, extras):
    """``x * s + r[z, row, col]`` (extras = (r, s)), r read only inside its bounds: the kernel
    calls it on edge elements it does not store."""
    r = extras[0]
    v = float32(0.0)
    if row < r.shape[1] and col < r.shape[2]:
        v = float32(r[z, row, col])
    return x * float32(extras[1]) + v


SCALED_RESIDUAL = epilogue.ElementEpilogue(_scaled_residual, "scaled_residual")


def test_element_epilogue_reads_extras():
    a, b, bias = operands(2, 70, 72, 40, seed=11)
    residual = np.random.default_rng(12).standard_normal((2, 70, 72)).astype(np.float16)
    # a device array, as the fused ops pass their extras
    (r,) = on("device", residual)
    got = run(a, b, bias, ONE_GROUP, has_bias=True, activation=SCALED_RESIDUAL, extras=(r, 0.5))
    pre, scale = reference(a, b, bias)
    want = pre * 0.5 + residual.astype(np.float64)
    assert_close(got, want, scale + np.abs(residual.astype(np.float64)), False)


@given(
    batch=st.integers(1, 2),
    m=st.integers(1, 90),
    n8=st.integers(1, 10),
    k8=st.integers(0, 14),
    cfg=st.sampled_from([ONE_GROUP, TWO_GROUPS, TWO_BLOCKS]),
    bf16=st.booleans(),
    producer=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_hypothesis_shapes(batch, m, n8, k8, cfg, bf16, producer, seed):
    """Any M, N and K multiples of 8 (the rows cp.async copies), bias included; with and
    without a producer warpgroup."""
    n, k = 8 * n8, 8 * k8
    a, b, bias = operands(batch, m, n, k, seed=seed, bf16=bf16)
    got = run(a, b, bias, cfg, bf16=bf16, has_bias=True, producer=producer)
    assert_close(got, *reference(a, b, bias), bf16)


# ---------------------------------------------------------------------------------------------
# The profile, the plan, the configurations
# ---------------------------------------------------------------------------------------------


@pytest.mark.sim_only(reason="the profiler exists only in the simulator")
@pytest.mark.parametrize("producer", [False, True], ids=["", "producer"])
def test_conflict_free_copies_and_planned_traffic(producer):
    a, b, bias = operands(1, 128, 128, 136, seed=6)
    c = np.zeros((1, 128, 128), np.float16)
    cfg = wg.WgmmaConfig(has_bias=True, producer=producer)
    p = wg.plan(1, 128, 128, 136, cfg)
    with sim.profile() as prof:
        p.launch(wg.wgmma_matmul(has_bias=True, producer=producer), a, b, bias, c)
    assert_planned_profile(prof, p)
    assert_close(c, *reference(a, b, bias), False)


def test_plan_figures():
    p = wg.plan(2, 300, 200, 64)
    assert p.grid == (2, 3, 2) and p.block == (256, 1, 1)
    assert p.shared == 4 * (128 * 64 + 64 * 128) * 2 + 1024  # 4 stages + alignment slack
    assert p.bytes_a == 2 * 2 * 300 * 64 * 2 and p.bytes_b == 2 * 2 * 64 * 200 * 3
    assert p.bytes_c == 2 * 2 * 300 * 200 and p.bytes_bias == 0
    assert wg.DEFAULT.hgmma_per_k_tile == 4
    specialised = wg.DEFAULT._replace(producer=True)
    assert wg.plan(2, 300, 200, 64, specialised).block == (384, 1, 1)  # + a producer warpgroup
    assert specialised.static_bytes == 2 * 4 * 8  # a full and an empty mbarrier per stage


def test_bad_configurations_raise_naming_the_argument():
    with pytest.raises(ValueError, match="num_stages"):
        wg.wgmma_matmul(num_stages=2)
    with pytest.raises(ValueError, match="tile_k"):
        wg.wgmma_matmul(tile_k=16)
    with pytest.raises(ValueError, match="num_warps"):
        wg.wgmma_matmul(num_warps=2)
    with pytest.raises(ValueError, match="tile_m"):
        wg.wgmma_matmul(tile_m=64, num_warps=8)
    with pytest.raises(ValueError, match="tile_n"):
        wg.wgmma_matmul(tile_n=96)
    with pytest.raises(ValueError, match="at most 128 fit"):
        wg.wgmma_matmul(128, 256, 64, 4, 3)
    with pytest.raises(TypeError, match="activation"):
        wg.wgmma_matmul(activation=math.tanh)


# ---------------------------------------------------------------------------------------------
# The rule the ring relies on: no cp.async in flight into what an unretired wgmma reads
# ---------------------------------------------------------------------------------------------


@functools.cache
def _refill_kernel(refill_before_wait: bool):
    """One 64 x 64 x 16 wgmma on unswizzled tiles (A at 0, B^T at 1024 halves), then a
    cp.async refill of B's tile from ``src``: before or after the wait that retires it."""

    @cuda.jit
    def kernel(src, out):
        s = cuda.shared.array(2048, np.float16, alignment=1024)
        tid = cuda.threadIdx.x
        for i in range(tid, 2048, 128):
            s[i] = src[i]
        cuda.syncthreads()
        da = mma.wgmma_descriptor(s, 0, 128, 256, mma.SWIZZLE_NONE)
        db = mma.wgmma_descriptor(s, 1024, 128, 256, mma.SWIZZLE_NONE)
        mma.wgmma_fence()
        acc = mma.wgmma_async(da, db, mma.wgmma_zeros(64), 1, 1, 1, 0, 0)
        mma.wgmma_commit_group()
        if refill_before_wait:
            pipeline.cp_async_cg_16_zfill(s, 1024 + 8 * tid, src, 8 * tid, 16)
            pipeline.cp_async_commit_group()
        acc = mma.wgmma_wait_group(0, acc)
        if not refill_before_wait:
            pipeline.cp_async_cg_16_zfill(s, 1024 + 8 * tid, src, 8 * tid, 16)
            pipeline.cp_async_commit_group()
        pipeline.cp_async_wait_group(0)
        out[tid] = acc[0]

    return kernel


@pytest.mark.sim_only(reason="undefined behaviour on a GPU: only the twin can refuse it")
def test_refilling_a_stage_before_its_wgmma_retired_is_refused():
    """A cp.async lands at its wait_group in the simulator, but on a GPU at any time after its
    issue: the twin refuses a copy in flight into shared memory an MMA being retired read (the
    ring's ``stages - 2`` tiles ahead exist for this; ``stages - 1`` is refused)."""
    src = np.random.default_rng(0).standard_normal(2048).astype(np.float16)
    out = np.zeros(128, np.float32)
    _refill_kernel(False)[1, 128](src, out)
    with pytest.raises(sim.SimulationError, match="cp.async into shared memory that the wgmma"):
        _refill_kernel(True)[1, 128](src, out)


# --------------------------------------------------------------------------------------------
# the ops on sm_90a: the matmul family and GEMM stages choose this kernel


@pytest.mark.parametrize("side", ["host", "device"])
@pytest.mark.parametrize("bf16", [False, True], ids=["f16", "bf16"])
def test_the_ops_choose_the_wgmma_kernel_on_sm90a(bf16, side):
    import tessera_tile as tt
    from tessera_tile import ops

    dtype = BF16 if bf16 else np.float16
    rng = np.random.default_rng(7)
    x, w = (rng.standard_normal(s).astype(dtype) for s in ((2, 70, 48), (48, 72)))
    b, r = (rng.standard_normal(s).astype(dtype) for s in ((72,), (70, 72)))
    block = tt.fuse(lambda x, w, b, r: tt.gelu(x @ w + b) * r)
    cast = tt.fuse(lambda x, w: (x @ w).astype(np.float32))  # the epilogue stores, not the kernel

    def moved(a):  # bfloat16 host arrays reach a device by their bits (tt.to_device)
        return tt.to_device(a) if side == "device" else a

    if SIMULATED:  # planned first as the simulator's default sm_80 has it: mma.sync
        ((kernel, *_),) = block.kernel_signatures(x, w, b, r)
        assert not kernel.py_func.__name__.startswith("matmul_wgmma"), kernel.py_func.__name__
    with on_sm90a():
        report = ops.linear.explain(x, w, b, "gelu")
        assert any("wgmma" in reason for reason in report.reasons), report.reasons
        ((kernel, *_),) = block.kernel_signatures(x, w, b, r)
        assert kernel.py_func.__name__.startswith("matmul_wgmma"), kernel.py_func.__name__
        got_linear = ops.linear(*map(moved, (x, w, b)), "gelu")
        got_block = block(*map(moved, (x, w, b, r)))
        got_cast = cast(*map(moved, (x, w)))
    got_cast = got_cast if side == "host" else got_cast.copy_to_host()
    product, product_scale = reference(x, w)
    assert got_cast.dtype == np.float32
    assert_close(got_cast, product, product_scale, bf16)  # rounded to the operands' dtype
    got_linear, got_block = (
        g if side == "host" else g.copy_to_host().view(dtype) for g in (got_linear, got_block)
    )
    ref, scale = reference(x, w, b, "gelu")
    assert_close(got_linear, ref, scale, bf16)
    r64 = r.astype(np.float64)
    assert_close(got_block, ref * r64, (scale + 1) * np.abs(r64), bf16)


@pytest.mark.parametrize("side", ["host", "device"])
@pytest.mark.device_only
def test_the_tuner_offers_the_wgmma_tiles_on_sm90a(side):
    """tile_config.WGMMA_CANDIDATES (k-tiles of 64, this kernel's fastest on an H200) are
    choices only where this kernel runs: the model scores them inf elsewhere, and on sm_90a
    its ties go to them; each makes a valid kernel config, and an op runs on it."""
    from tessera_tile import ops, tile_config
    from tessera_tile.kernels.matmul.choice import wgmma_config

    big = (4096, 4096, 4096)
    for cfg in tile_config.WGMMA_CANDIDATES:
        assert tile_config.score(cfg, *big, dtype="float16") == math.inf
    assert tile_config.default_config(*big, dtype="float16") not in tile_config.WGMMA_CANDIDATES
    with on_sm90a():
        chosen = tile_config.default_config(*big, dtype="float16")
        assert chosen == tile_config.TileConfig(128, 256, 64, 8, 4, dtype="float16"), chosen
        for cfg in tile_config.WGMMA_CANDIDATES:
            assert math.isfinite(tile_config.score(cfg, *big, dtype="float16"))
            assert wgmma_config(cfg, np.dtype(np.float16), False, False) is not None
        a, b, _ = operands(1, 130, 136, 200, seed=13)
        cfg = tile_config.WGMMA_CANDIDATES[2]  # 128 x 128 x 64, 8 warps, 3 stages
        report = ops.matmul.explain(a[0], b[0], config=cfg)
        assert "wgmma" in report.stages[0], report.stages
        got = ops.matmul(*on(side, a[0], b[0]), config=cfg)
    got = got if side == "host" else got.copy_to_host()
    assert_close(got[None], *reference(a, b), False)


@pytest.mark.parametrize("side", ["host", "device"])
@pytest.mark.device_only
def test_the_tuner_offers_warp_specialised_tiles_that_only_a_measurement_picks(side):
    """The 12-warp WGMMA_CANDIDATES (a producer warpgroup, two that multiply) score as their
    8-warp twins and come after them, so the model never picks one; an explicit one runs the
    warp-specialised kernel on sm_90a and is refused, with the reason, where it cannot run."""
    from tessera_tile import ops, tile_config
    from tessera_tile.kernels.matmul.choice import wgmma_config

    specialised = [c for c in tile_config.WGMMA_CANDIDATES if c.num_warps == 12]
    assert len(specialised) == 3
    a, b, _ = operands(1, 130, 136, 200, seed=14)
    with on_sm90a():
        for shape in [(4096, 4096, 4096), (512, 512, 512), (130, 136, 200)]:
            chosen = tile_config.default_config(*shape, dtype="float16")
            assert chosen.num_warps != 12, (shape, chosen)
            for cfg in specialised:
                twin = tile_config.TileConfig(*cfg.key[:3], 8, cfg.num_stages, dtype="float16")
                score = tile_config.score(cfg, *shape, dtype="float16")
                assert score == tile_config.score(twin, *shape, dtype="float16")
                assert wgmma_config(cfg, np.dtype(np.float16), False, False).producer
        cfg = specialised[2]  # 128 x 128 x 64, 4 stages
        assert "warp-specialised" in ops.matmul.explain(a[0], b[0], config=cfg).stages[0]
        got = ops.matmul(*on(side, a[0], b[0]), config=cfg)
    got = got if side == "host" else got.copy_to_host()
    assert_close(got[None], *reference(a, b), False)
    with pytest.raises(ValueError, match="runs only on sm_90a"):
        ops.matmul(*on(side, a[0], b[0]), config=cfg)


# ---------------------------------------------------------------------------------------------
# Transposed operands (the backward GEMMs' x.T and w.T): A MN-major, B K-major, read in place
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("trans_a", "trans_b"), [(True, False), (False, True), (True, True)],
    ids=["a_t", "b_t", "both_t"],
)  # fmt: skip
@pytest.mark.parametrize(
    ("cfg", "shape", "bf16"),
    [(ONE_GROUP, (1, 72, 80, 48), False), (TWO_BLOCKS, (2, 136, 64, 136), True),
     (TWO_GROUPS, (1, 128, 72, 40), False)],
    ids=["one-group-f16", "two-blocks-bf16", "two-groups-f16"],
)  # fmt: skip
def test_transposed_operands_match_numpy(trans_a, trans_b, cfg, shape, bf16):
    """The kernel takes A as its (K, M) array and B as its (N, K) one: edges of M, N and K,
    64- and 128-byte swizzled rows, one and two warpgroups and accumulators, a batch."""
    batch, m, n, k = shape
    a, b, bias = operands(batch, m, n, k, seed=m + n, bf16=bf16)
    a_mem = np.ascontiguousarray(a.transpose(0, 2, 1)) if trans_a else a
    b_mem = np.ascontiguousarray(b.transpose(0, 2, 1)) if trans_b else b
    dtype = BF16 if bf16 else np.float16
    c = np.full((batch, m, n), np.nan, dtype)
    kernel = wg.wgmma_matmul(*cfg, bf16=bf16, trans_a=trans_a, trans_b=trans_b)
    p = wg.plan(batch, m, n, k, wg.WgmmaConfig(*cfg, bf16=bf16, trans_a=trans_a, trans_b=trans_b))
    args = (bits(a_mem), bits(b_mem), bits(np.zeros(1, bias.dtype)), bits(c))
    with on_sm90a():
        p.launch(kernel, *args)
    assert_close(c.view(dtype) if bf16 else c, *reference(a, b), bf16)


@pytest.mark.sim_only(reason="the profiler, which names the kernels, exists only in the simulator")
def test_the_backward_gemms_read_transposed_operands_on_warpgroup_mma():
    """On sm_90a, tt.vjp's backward GEMMs of gelu(x @ w + b) (dz @ w.T, x.T @ dz) run on the
    wgmma kernel reading w and x in place, and give the mma.sync kernels' gradients within
    the float16 products' rounding (the same products, summed in another order)."""
    import tessera_tile as tt

    rng = np.random.default_rng(21)
    x, w, b = (rng.standard_normal(s).astype(np.float16) for s in [(72, 64), (64, 64), (64,)])
    g = rng.standard_normal((72, 64)).astype(np.float16)

    def grads():
        _, pullback = tt.vjp(lambda x, w, b: tt.gelu(x @ w + b), *on("device", x, w, b))
        with sim.profile() as prof:
            got = pullback(on("device", g)[0])
        return [d.copy_to_host() for d in got], {name for name, _ in prof.traffic}

    with on_sm90a():
        on_wgmma, kernels = grads()
    for suffix in ("_at", "_bt"):
        assert any(k.startswith("matmul_wgmma") and k.endswith(suffix) for k in kernels), kernels
    on_mma_sync, _ = grads()
    for got, want in zip(on_wgmma, on_mma_sync, strict=True):
        wide = want.astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(wide).max())
