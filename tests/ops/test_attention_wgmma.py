"""The warpgroup-MMA flash attention (kernels.attention.wgmma, sm_90a) and ``ops.attention`` on
sm_90a, against the float64 NumPy reference, element by element.

The bound is test_ops_attention's (module doc there): the kernel rounds where the mma.sync
kernel does (scores and statistics in float32, P rounded to float16 or bfloat16 for ``P @ V``,
O once at its store), and the twins of ``wgmma`` sum each k16 step exactly and round once to
float32. In the simulator the tests stand for an sm_90a device (``sim.simulated_arch``); on a
GPU (``TESSERA_TIER=gpu``) they run on compute capability 9.0 and later and are skipped, with
the reason printed, on older devices; the profiler tests are simulator-only.
"""

import math

import ml_dtypes
import numpy as np
import pytest
from helpers import SIDES, SIMULATED, attention_reference, back, on, on_sm90a, wgmma_skip
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda
from test_ops_attention import check, check_infinities, operands, tolerance

import tessera_tile as tt
from tessera_tile import dynamic_shared, ops, sim
from tessera_tile.kernels.attention import tc
from tessera_tile.kernels.attention import wgmma as aw

pytestmark = wgmma_skip("test_attention_wgmma")

BF16 = ml_dtypes.bfloat16
F16 = np.float16
LOG2E = math.log2(math.e)
ONE_GROUP = aw.WgmmaAttentionConfig(64, 4)  # 64 query rows
NARROW_KEYS = aw.WgmmaAttentionConfig(32, 8)  # 128 rows, 32-key tiles
WIDE_KEYS = aw.WgmmaAttentionConfig(128, 4)  # 128-key tiles (D = 64 only)
IN_TURN = aw.WgmmaAttentionConfig(64, 8, 2, False)  # no overlap: S, softmax, P V in turn
IN_TURN_3 = aw.WgmmaAttentionConfig(64, 4, 3, False)  # the same, 3 stages
# warp-specialised: one more warpgroup copies Q, K and V, handed over through mbarriers
PRODUCER = aw.WgmmaAttentionConfig(64, 8, 3, True, True)
PRODUCER_ONE_GROUP = aw.WgmmaAttentionConfig(64, 4, 3, True, True)
PRODUCER_IN_TURN = aw.WgmmaAttentionConfig(64, 8, 2, False, True)
PRODUCER_NARROW = aw.WgmmaAttentionConfig(32, 8, 3, False, True)


def kernel_name(q, k, v, **kwargs) -> str:
    report = ops.attention.explain(q, k, v, **kwargs)
    assert report.kernels == 1, report
    return report.stages[0].split(":")[0]


def run_kernel(q, k, v, causal, cfg, scale, side="host"):
    """The kernel alone, launched as the op launches it."""
    z, sq, d = q.shape
    bf16 = q.dtype == BF16
    o = np.full((z, sq, d), np.nan, q.dtype)
    args = on(side, q, k, v, o)
    if side == "host" and bf16:  # a host launch takes bfloat16 by its bits
        args = tuple(a.view(np.uint16) for a in args)
    kernel = aw.wgmma_attention(d, causal, cfg, bf16)
    grid = (-(-sq // cfg.block_q), z)
    params = (*args, np.float32(scale * LOG2E))
    dynamic_shared.launch(kernel, grid, cfg.threads, cfg.shared_bytes(d), params)
    got = args[3] if side == "host" else args[3].copy_to_host()
    return got.view(q.dtype)


# --------------------------------------------------------------------------------------------
# the kernel


# Every config once or twice, not every config x causal x dtype: the mask meets the key tile
# widths (32, 64, 128 keys) and head dims causal and not, and each dtype runs with each.
@pytest.mark.parametrize(
    ("d", "cfg", "causal", "dtype"),
    [(64, None, False, F16), (64, None, True, BF16), (64, ONE_GROUP, True, F16),
     (64, NARROW_KEYS, True, BF16), (64, NARROW_KEYS, False, F16),
     (64, WIDE_KEYS, True, F16), (64, WIDE_KEYS, False, BF16), (64, IN_TURN, False, BF16),
     (64, IN_TURN_3, True, F16), (128, None, False, BF16), (128, None, True, F16),
     (128, ONE_GROUP, False, BF16), (128, IN_TURN, True, BF16)],
    ids=["d64", "d64-causal-bf16", "d64-one-group-causal", "d64-32-keys-causal-bf16",
         "d64-32-keys", "d64-128-keys-causal", "d64-128-keys-bf16", "d64-in-turn-bf16",
         "d64-in-turn-3-stages-causal", "d128-bf16", "d128-causal", "d128-one-group-bf16",
         "d128-in-turn-causal-bf16"],
)  # fmt: skip
def test_kernel_matches_numpy(d, cfg, causal, dtype):
    """Query and key lengths that end inside a warp's 16 rows, a warpgroup's 64 and a tile."""
    cfg = cfg or aw.default_config(d)
    q, k, v = operands(np.random.default_rng(d + causal), (2, 75, d), (2, 150, d), dtype)
    with on_sm90a():
        got = run_kernel(q, k, v, causal, cfg, 1 / math.sqrt(d))
    check(got, q, k, v, causal)


@pytest.mark.parametrize(
    ("d", "cfg", "causal", "dtype"),
    [(64, PRODUCER, True, np.float16), (64, PRODUCER_IN_TURN, False, BF16),
     (64, PRODUCER_NARROW, True, BF16), (128, PRODUCER_ONE_GROUP, False, np.float16)],
    ids=["d64-causal", "d64-in-turn-bf16", "d64-32-keys-causal-bf16", "d128-one-group"],
)  # fmt: skip
def test_warp_specialised_kernel_matches_numpy(d, cfg, causal, dtype):
    """With a producer warpgroup: query and key lengths that end inside a warp's 16 rows, a
    warpgroup's 64 and a tile."""
    q, k, v = operands(np.random.default_rng(d + causal), (2, 75, d), (2, 150, d), dtype)
    with on_sm90a():
        got = run_kernel(q, k, v, causal, cfg, 1 / math.sqrt(d))
    check(got, q, k, v, causal)


@pytest.mark.parametrize("producer", [False, True], ids=["", "producer"])
def test_kernel_on_device_arrays_with_a_negative_scale(producer):
    """A negative scale is folded into Q in shared memory (the sign bits of each copier's
    chunks), before the first tile's fence makes it visible to the tensor cores (with a
    producer: before its arrival on Q's mbarrier)."""
    q, k, v = operands(np.random.default_rng(5), (1, 64, 128), (1, 300, 128))
    cfg = aw.default_config(128)._replace(producer=producer)
    with on_sm90a():
        got = run_kernel(q, k, v, False, cfg, -0.3, side="device")
    check(got, q, k, v, False, -0.3)


@pytest.mark.parametrize("producer", [False, True], ids=["", "producer"])
def test_kernel_on_strided_device_views(producer):
    """K and V are copied from element offsets built from their strides: K every other batch
    of rows padded to 72, V one matrix broadcast over the batch (batch stride 0)."""
    from tessera_tile._runtime import arrays as _arrays

    rng = np.random.default_rng(8)
    q, k_full, v_one = (
        rng.standard_normal(shape).astype(np.float16)
        for shape in ((2, 70, 64), (4, 130, 72), (1, 130, 64))
    )
    k, v = k_full[::2, :, :64], np.broadcast_to(v_one, (2, 130, 64))
    cfg = aw.default_config(64)._replace(producer=producer)
    d_q, d_o = cuda.to_device(q), cuda.to_device(np.full(q.shape, np.nan, np.float16))
    d_k = cuda.to_device(k_full)[::2, :, :64]
    d_v = _arrays.view(cuda.to_device(v_one), v.shape, (0, *v_one.strides[1:]))
    with on_sm90a():
        kernel = aw.wgmma_attention(64, True, cfg, False)
        params = (d_q, d_k, d_v, d_o, np.float32(LOG2E / 8))
        dynamic_shared.launch(kernel, (1, 2), cfg.threads, cfg.shared_bytes(64), params)
    check(d_o.copy_to_host(), q, k, v, True)


def test_default_configs_and_shared_memory():
    assert aw.default_config(64) == aw.WgmmaAttentionConfig(64, 8, 3, True)
    assert aw.default_config(128, sq=64).num_warps == 4  # one warpgroup covers Sq
    cfg = aw.default_config(128)
    assert cfg.block_q == 128 and cfg.threads == 256
    # Q, three stages of K and V, and the slack that aligns them to 1024 bytes
    assert cfg.shared_bytes(128) == 2 * 128 * (128 + 6 * 64) + 1024


@pytest.mark.parametrize(
    ("d", "config", "message"),
    [
        (32, aw.WgmmaAttentionConfig(), "head_dim must be one of"),
        (64, aw.WgmmaAttentionConfig(48), "block_kv"),
        (64, aw.WgmmaAttentionConfig(64, 2), "num_warps"),
        (64, aw.WgmmaAttentionConfig(64, 8, 4, False), "num_stages"),
        (64, aw.WgmmaAttentionConfig(64, 8, 2), "overlap needs num_stages=3"),
        (128, aw.WgmmaAttentionConfig(128), "block_kv \\+ head_dim <= 192"),
        (64, aw.WgmmaAttentionConfig(64, 8, 3, True, "yes"), "producer must be a bool"),
    ],
)
def test_bad_configs_are_refused(d, config, message):
    with pytest.raises(ValueError, match=message):
        aw.wgmma_attention(d, False, config)


# --------------------------------------------------------------------------------------------
# ops.attention on sm_90a


@settings(max_examples=10, deadline=None)
@given(
    sq=st.integers(1, 140),
    sk=st.integers(0, 140),
    d=st.sampled_from([64, 128]),
    causal=st.booleans(),
    dtype=st.sampled_from([np.float16, BF16]),
    side=st.sampled_from(SIDES),
    seed=st.integers(0, 2**16),
)
def test_op_matches_numpy(sq, sk, d, causal, dtype, side, seed):
    q, k, v = operands(np.random.default_rng(seed), (sq, d), (sk, d), dtype)
    with on_sm90a():
        got = back(ops.attention(*on(side, q, k, v), causal=causal), side)
    check(got, q, k, v, causal)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["f16", "bf16"])
@pytest.mark.device_only
def test_op_chooses_the_wgmma_kernel_on_sm90a(side, dtype):
    """float16 and bfloat16 with D 64 or 128: the wgmma kernel, and explain says so; an
    AttentionConfig asks for the mma.sync kernel; D = 32 has no wgmma kernel. Causal with
    Sq > Sk: the rows that see no key are zeros."""
    q, k, v = operands(np.random.default_rng(11), (3, 130, 64), (3, 100, 64), dtype)
    if SIMULATED:  # the simulator's default sm_80: mma.sync
        assert "wgmma" not in kernel_name(q, k, v)
    with on_sm90a():
        assert kernel_name(q, k, v).startswith("flash_attention_wgmma")
        report = ops.attention.explain(q, k, v)
        assert any("warpgroup MMA" in reason for reason in report.reasons), report.reasons
        mma_sync = tc.AttentionConfig(64, 4, 2, 32)
        assert "wgmma" not in kernel_name(q, k, v, config=mma_sync)
        small = operands(np.random.default_rng(1), (8, 32), (8, 32), dtype)
        assert "wgmma" not in kernel_name(*small)
        got = back(ops.attention(*on(side, q, k, v), causal=True), side)
    check(got, q, k, v, True)
    np.testing.assert_array_equal(got[:, :30], 0)


@pytest.mark.parametrize(("side", "dtype"), [("host", np.float16), ("device", BF16)],
                         ids=["host-f16", "device-bf16"])  # fmt: skip
def test_op_runs_a_warp_specialised_config(side, dtype):
    """An explicit WgmmaAttentionConfig with a producer warpgroup runs that kernel (12 warps
    for two warpgroups of query rows)."""
    q, k, v = operands(np.random.default_rng(12), (2, 130, 64), (2, 200, 64), dtype)
    with on_sm90a():
        name = kernel_name(q, k, v, config=PRODUCER)
        assert name.startswith("flash_attention_wgmma") and "_w8_ws_" in name, name
        got = back(ops.attention(*on(side, q, k, v), causal=True, config=PRODUCER), side)
    check(got, q, k, v, True)


@pytest.mark.parametrize("scale", [0.0, -1.5])
def test_op_scale(scale):
    """scale 0 averages V (c is clamped, not 0 * inf); a negative scale flips Q's sign bits."""
    q, k, v = operands(np.random.default_rng(4), (70, 64), (90, 64))
    with on_sm90a():
        got = ops.attention(q, k, v, scale=scale)
    check(got, q, k, v, False, scale)


def test_op_nan_propagates_as_in_numpy():
    """A NaN in q poisons its row; a NaN in k every row that sees that key (causal: the rows
    at or below it); the others are within the bound."""
    q, k, v = operands(np.random.default_rng(11), (100, 64), (100, 64))
    q[3, 5] = np.nan
    k[70, 0] = np.nan
    with on_sm90a():
        got = ops.attention(q, k, v, causal=True)
    expected = np.zeros(100, bool)
    expected[3] = True
    expected[70:] = True
    np.testing.assert_array_equal(np.isnan(got).any(axis=-1), expected)
    np.testing.assert_array_equal(np.isnan(got).all(axis=-1), expected)
    # rows 0..69 see keys 0..69 only (causal): NumPy on those, q's NaN row replaced
    clean = q[:70].copy()
    clean[3] = 0
    ref = attention_reference(clean, k[:70], v[:70], True, 0.125)
    bound = tolerance(clean, k[:70], v[:70], True, 0.125)
    err = np.abs(got[:70].astype(np.float64) - ref)
    assert (err <= bound)[~expected[:70]].all()


@pytest.mark.parametrize("where", ["k +inf", "k -inf", "v +inf"])
def test_op_infinities_as_ieee(where):
    """A +inf score makes its row NaN (inf - inf), a -inf score gives its key weight 0, and inf
    in v passes through P @ V (test_ops_attention's checks)."""

    def attend(q, k, v):
        with on_sm90a():
            return ops.attention(q, k, v, scale=0.25)

    check_infinities(where, *operands(np.random.default_rng(12), (70, 64), (90, 64)), attend)


@pytest.mark.sim_only(reason="the profiler measures traffic and bank conflicts in the simulator")
@pytest.mark.parametrize(
    ("causal", "config"), [(False, None), (True, None), (True, PRODUCER)],
    ids=["default", "default-causal", "producer-causal"],
)  # fmt: skip
def test_op_traffic_as_predicted(causal, config):
    """Q read once, K and V once per block of 128 query rows up to its last visible key, O
    written once; cp.async writes and the sign flips conflict-free."""
    q, k, v = operands(np.random.default_rng(2), (2, 200, 64), (2, 200, 64))
    with on_sm90a():
        ex = ops.attention.explain(q, k, v, causal=causal, scale=-0.125, config=config)
        with sim.profile() as prof:
            got = ops.attention(q, k, v, causal=causal, scale=-0.125, config=config)
    check(got, q, k, v, causal, -0.125)
    assert prof.bank_conflicts == 0, str(prof)
    assert prof.races == [] and prof.out_of_bounds == [], str(prof)
    assert prof.bytes_read + prof.bytes_written == ex.bytes_fused, str(prof)


def test_op_refuses_a_wgmma_config_where_it_does_not_run():
    q, k, v = operands(np.random.default_rng(0), (16, 32), (16, 32))
    with on_sm90a(), pytest.raises(TypeError, match="warpgroup-MMA kernel runs on sm_90a"):
        ops.attention(q, k, v, config=aw.WgmmaAttentionConfig())
    q32 = q.astype(np.float32)
    with pytest.raises(TypeError, match="SimtAttentionConfig"):
        ops.attention(q32, q32, q32, config=aw.WgmmaAttentionConfig())


@tt.fuse
def fused_attention(q, k, v):
    s = q @ tt.swapaxes(k, -1, -2) * 0.125
    e = tt.exp(s - tt.max(s, axis=-1, keepdims=True))
    return e / tt.sum(e, axis=-1, keepdims=True) @ v


def test_the_fused_attention_pattern_runs_on_the_wgmma_kernel(side):
    """The composer's attention pattern goes through ops.attention: on sm_90a its wgmma kernel
    (the plan is made again when the architecture changes); ``explain(arch="sm_80")`` plans the
    mma.sync one from anywhere."""
    q, k, v = operands(np.random.default_rng(21), (2, 80, 64), (2, 96, 64))
    with on_sm90a():
        report = fused_attention.explain(q, k, v)
        got = back(fused_attention(*on(side, q, k, v)), side)
    assert report.kernels == 1 and "flash_attention_wgmma" in report.stages[0], report.stages
    assert "flash_attention_wgmma" not in fused_attention.explain(q, k, v, arch="sm_80").stages[0]
    check(got, q, k, v, False, 0.125)
    if SIMULATED:  # back on the simulator's default device: the mma.sync kernel again
        assert "flash_attention_wgmma" not in fused_attention.explain(q, k, v).stages[0]


def test_the_tuner_offers_a_producer_warpgroup_that_only_a_measurement_picks(monkeypatch):
    """Without a config the wgmma kernel's is its tuner's: the default and the same with a
    producer warpgroup, scored alike for the default's warps (inf for the others), so the model
    keeps the default; a choice of the producer (as a GPU timing would make) is launched."""
    from tessera_tile.kernels.attention import plan as _attention

    q, k, v = operands(np.random.default_rng(13), (2, 130, 64), (2, 210, 64))
    for rows, warps in ((130, 8), (40, 4)):
        pair = [c for c in _attention.WGMMA_CHOICES if c.num_warps == warps]
        assert [c.producer for c in pair] == [False, True]
        for c in _attention.WGMMA_CHOICES:
            score = _attention.wgmma_model(c, q[:, :rows], k, v, False)
            assert score == (0.0 if c in pair else math.inf), (rows, c)
    with on_sm90a():
        assert "_ws_" not in kernel_name(q, k, v, causal=True)
        measured = aw.WgmmaAttentionConfig(64, 8, 3, True, True)
        for method in ("expected", "choose"):
            monkeypatch.setattr(_attention.TUNED_WGMMA, method, lambda *args: measured)
        assert "_ws_" in kernel_name(q, k, v, causal=True)
        got = back(ops.attention(*on("device", q, k, v), causal=True), "device")
    check(got, q, k, v, True)
