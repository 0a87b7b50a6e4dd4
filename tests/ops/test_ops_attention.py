"""ops.attention against a float64 NumPy reference, its traffic, and its errors.

Per element, a result must lie within a bound derived from where the kernels round, with
``w = sum_j p_j |v_j| / l`` (the softmax-weighted magnitude of V) and u = 2**-24:

* each score ``q . k`` is accumulated in float32 (tensor cores or FFMA), an error of at most
  ``e = |scale| gamma_D sum_i |q_i k_i|``; the exponent ``s c - max`` is rounded to float32,
  an error of at most ``u |scale| (max_j s_j - min_j s_j)``: a relative error ``e`` in ``p_j``
  moves O by at most ``2 e w``;
* float16: P is rounded to float16 before ``P @ V`` (2**-11 per term), O at its store
  (2**-11 of |O|), and MUFU.EX2 and the float32 sums add a few float32 ulps: ``6 * 2**-11 w``;
  bfloat16 the same with its unit roundoff 2**-8;
* float32: the sums over Sk keys and the final ``1 / l``: ``(Sk + 4) u w + u |O|``.

Every result must also have a relative Frobenius error below 1e-2 (float16) or 1e-5
(float32), the issue's figures, and 8e-2 for bfloat16 (float16's figure times the ratio of
their unit roundoffs, 2**-8 / 2**-11).
"""

import math

import ml_dtypes
import numpy as np
import pytest
from helpers import SIDES, attention_reference, back, counting_launches, on
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_tile import ops, sim
from tessera_tile.kernels.attention import simt, tc

U16 = 2.0**-11
U32 = 2.0**-24
BF16 = np.dtype(ml_dtypes.bfloat16)
HALF_U = {np.dtype(np.float16): U16, BF16: 2.0**-8}  # computed in float32, rounded to these
FROBENIUS = {np.dtype(np.float16): 1e-2, BF16: 8e-2, np.dtype(np.float32): 1e-5}
SMALL = tc.AttentionConfig(16, 1, 2)  # one warp: 16 query rows, 16-key tiles
SMALL32 = simt.SimtAttentionConfig(16, 16, 32)  # one warp: 4 row groups of 8 lanes


def tolerance(q, k, v, causal, scale):
    """The per-element bound of the module doc."""
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    d, sk = q64.shape[-1], k64.shape[-2]
    gamma = d * U32 / (1 - d * U32)
    e_score = abs(scale) * gamma * (np.abs(q64) @ np.swapaxes(np.abs(k64), -1, -2))
    s = q64 @ np.swapaxes(k64, -1, -2)
    spread = s.max(axis=-1, keepdims=True, initial=0.0) - s.min(axis=-1, keepdims=True, initial=0.0)
    e = e_score.max(axis=-1, keepdims=True, initial=0.0) + U32 * abs(scale) * spread
    w = attention_reference(q64, k64, np.abs(v64), causal, scale)
    ref = np.abs(attention_reference(q64, k64, v64, causal, scale))
    if q.dtype in HALF_U:
        u = HALF_U[q.dtype]
        return (6 * u + 2 * e) * w + u * ref
    return ((sk + 4) * U32 + 2 * e) * w + U32 * ref


def check(got, q, k, v, causal=False, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    qb, kb, vb = np.asarray(q), np.asarray(k), np.asarray(v)
    batch = np.broadcast_shapes(qb.shape[:-2], kb.shape[:-2], vb.shape[:-2])
    qb = np.broadcast_to(qb, (*batch, *qb.shape[-2:]))
    kb = np.broadcast_to(kb, (*batch, *kb.shape[-2:]))
    vb = np.broadcast_to(vb, (*batch, *vb.shape[-2:]))
    ref = attention_reference(qb, kb, vb, causal, scale)
    got = np.asarray(got)
    assert got.dtype == qb.dtype and got.shape == ref.shape, (got.dtype, got.shape, ref.shape)
    err = np.abs(got.astype(np.float64) - ref)
    bad = ~(err <= tolerance(qb, kb, vb, causal, scale))
    assert not bad.any(), f"{int(bad.sum())} element(s) off, worst {np.nanmax(err):.3g}"
    norm = np.linalg.norm(ref)
    if norm > 0:
        assert np.linalg.norm(got - ref) / norm < FROBENIUS[got.dtype]


def operands(rng, q_shape, kv_shape, dtype=np.float16, amp=1.0):
    q = (rng.standard_normal(q_shape) * amp).astype(dtype)
    k = (rng.standard_normal(kv_shape) * amp).astype(dtype)
    v = rng.standard_normal(kv_shape).astype(dtype)
    return q, k, v


# --------------------------------------------------------------------------------------------
# correctness


@settings(max_examples=12, deadline=None)
@given(
    sq=st.integers(1, 70),
    sk=st.integers(0, 70),
    d=st.sampled_from([16, 32, 64]),
    causal=st.booleans(),
    side=st.sampled_from(SIDES),
    dtype=st.sampled_from([np.float16, ml_dtypes.bfloat16, np.float32]),
    seed=st.integers(0, 2**16),
)
def test_matches_numpy(sq, sk, d, causal, side, dtype, seed):
    rng = np.random.default_rng(seed)
    q, k, v = operands(rng, (sq, d), (sk, d), dtype)
    got = back(ops.attention(*on(side, q, k, v), causal=causal), side)
    check(got, q, k, v, causal)


DTYPES = [(np.float16, SMALL), (ml_dtypes.bfloat16, SMALL), (np.float32, SMALL32)]
BY_DTYPE = pytest.mark.parametrize(
    ("dtype", "small"), DTYPES, ids=["float16", "bfloat16", "float32"]
)


@BY_DTYPE
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("sq", "sk"), [(1, 1), (1, 40), (40, 1), (24, 70), (70, 24)])
@pytest.mark.device_only
def test_lengths_short_and_long(side, sq, sk, causal, dtype, small):
    """S = 1 and query/key lengths that differ both ways (causal: bottom-right aligned; with
    Sq > Sk the first Sq - Sk rows see no key and give 0)."""
    q, k, v = operands(np.random.default_rng(sq * 100 + sk), (2, sq, 32), (2, sk, 32), dtype)
    got = back(ops.attention(*on(side, q, k, v), causal=causal, config=small), side)
    check(got, q, k, v, causal)
    if causal and sq > sk:
        np.testing.assert_array_equal(got[:, : sq - sk], 0)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.device_only
def test_head_dim_128_and_default_configs(side, causal, dtype):
    q, k, v = operands(np.random.default_rng(3), (1, 33, 128), (1, 70, 128), dtype)
    got = back(ops.attention(*on(side, q, k, v), causal=causal), side)
    check(got, q, k, v, causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("sq", "sk"), [(31, 65), (32, 63), (33, 64), (129, 129)])
@pytest.mark.device_only
def test_32_row_warps_and_128_row_blocks(side, sq, sk, causal):
    """The default D = 64 schedule (warps of 32 query rows, two m16 tiles sharing each K/V
    fragment; blocks of 128 rows past Sq = 64): query lengths either side of a warp's 32 rows
    and of a block's 128, key lengths either side of a 64-key tile; causal, the diagonal tiles
    of 128-row blocks."""
    cfg = tc.default_config(64, sq)
    assert cfg.warp_rows == 32 and cfg.block_kv == 64
    assert cfg.block_q == (128 if sq > 64 else 64)
    q, k, v = operands(np.random.default_rng(sq * 1000 + sk), (sq, 64), (sk, 64))
    got = back(ops.attention(*on(side, q, k, v), causal=causal), side)
    check(got, q, k, v, causal)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize(
    "config",
    [None, tc.AttentionConfig(64, 2, 2, 32)],
    ids=["default", "32-row warps"],
)
@pytest.mark.device_only
def test_head_dim_128_in_dynamic_shared_memory(side, config, dtype):
    """D = 128 with 64-key tiles: 80 KiB of dynamic shared memory, past the 48 KiB a block
    may use without the opt-in (the simulator refuses the launch without it). The default has
    16-row warps with Q in registers; 32-row warps reload Q's fragments every tile. A negative
    scale is folded into Q in shared memory."""
    cfg = config or tc.default_config(128, 70)
    assert cfg.shared_bytes(128) == 80 * 1024
    assert cfg.q_in_registers(128) == (cfg.warp_rows == 16)
    q, k, v = operands(np.random.default_rng(13), (70, 128), (130, 128), dtype)
    for causal, scale in ((False, -0.1), (True, None)):
        got = back(ops.attention(*on(side, q, k, v), causal=causal, scale=scale, config=config),
                   side)  # fmt: skip
        check(got, q, k, v, causal, scale)
    stage = ops.attention.explain(q, k, v, config=config).stages[0]
    assert f"{cfg.warp_rows} per warp" in stage and "81920 B of dynamic shared" in stage


@BY_DTYPE
@pytest.mark.device_only
def test_large_values_exercise_the_online_rescaling(side, dtype, small):
    """Large scores make each row's maximum jump between K/V tiles: the running output must be
    rescaled each time (a kernel that skips it is off by orders of magnitude). float16: q and
    k around +-30. float32: scaled scores around +-30 (q, k around +-3.2); with q and k at
    +-30 the scores reach +-900 and their float32 rounding alone (u |s| ~ 5e-5 in the exponent)
    exceeds the 1e-5 relative error asked for, for any float32 kernel."""
    rng = np.random.default_rng(4)
    q, k, v = operands(
        rng, (2, 40, 16), (2, 90, 16), dtype, amp=30.0 if dtype == np.float16 else 3.2
    )
    k[:, 70:] *= dtype(1.5)  # the last tiles hold the largest scores
    for causal in (False, True):
        got = back(ops.attention(*on(side, q, k, v), causal=causal, config=small), side)
        check(got, q, k, v, causal)


@BY_DTYPE
@pytest.mark.device_only
def test_batch_and_heads_broadcast(side, dtype, small):
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 3, 20, 16)).astype(dtype)
    k = rng.standard_normal((1, 3, 25, 16)).astype(dtype)
    v = rng.standard_normal((3, 25, 16)).astype(dtype)
    got = back(ops.attention(*on(side, q, k, v), config=small), side)
    check(got, q, k, v)


@BY_DTYPE
def test_non_contiguous_views_are_read_in_place(side, dtype, small):
    """Device views are read in place: a strided head dimension (q), strided rows (k) and rows
    that are not 16-byte aligned (v) take the element-wise loads."""
    rng = np.random.default_rng(6)
    qb = rng.standard_normal((2, 40, 64)).astype(dtype)
    kb = rng.standard_normal((2, 50, 32)).astype(dtype)
    vb = rng.standard_normal((2, 25, 33)).astype(dtype)
    qd, kd, vd = on(side, qb, kb, vb)
    q, k, v = qd[:, :, ::2], kd[:, ::2], vd[:, :, 1:]
    got = back(ops.attention(q, k, v, config=small), side)
    check(got, qb[:, :, ::2], kb[:, ::2], vb[:, :, 1:])
    reasons = " ".join(ops.attention.explain(q, k, v, config=small).reasons)
    # host operands arrive as contiguous, aligned device copies: 16-byte copies
    assert ("not 16-byte aligned" in reasons) == (side == "device"), reasons


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("scale", [-0.7, 0.0, 2.5])
@pytest.mark.device_only
def test_scale(side, scale, dtype):
    """Negative scales flip the ranking of keys; 0 averages V over the visible keys."""
    q, k, v = operands(np.random.default_rng(7), (18, 16), (30, 16), dtype)
    for causal in (False, True):
        got = back(ops.attention(*on(side, q, k, v), causal=causal, scale=scale), side)
        check(got, q, k, v, causal, scale)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
@pytest.mark.device_only
def test_nan_propagates_as_in_numpy(side, dtype):
    """A NaN in q poisons its row; a NaN in k every row that sees that key (causal: the rows
    at or below it); the other rows are untouched."""
    q, k, v = operands(np.random.default_rng(11), (20, 16), (20, 16), dtype)
    q[3, 5] = np.nan
    k[12, 0] = np.nan
    got = back(ops.attention(*on(side, q, k, v), causal=True), side)
    nan_rows = np.isnan(got).any(axis=-1)
    expected = np.zeros(20, bool)
    expected[3] = True
    expected[12:] = True
    np.testing.assert_array_equal(nan_rows, expected)
    rows = ~expected
    want = attention_reference(q, k, v, True, 0.25)[rows]
    assert np.abs(got[rows].astype(np.float64) - want).max() < FROBENIUS[np.dtype(dtype)]


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
@pytest.mark.parametrize("where", ["k +inf", "k -inf", "v +inf"])
@pytest.mark.device_only
def test_infinities_as_ieee(side, dtype, where):
    """As the docstring says, IEEE arithmetic: a +inf score makes its row NaN (inf - inf), a
    -inf score gives its key weight 0 (the other keys within the module's bound), and inf in
    v passes through P @ V (the other columns within the bound)."""

    def attend(q, k, v):
        return back(ops.attention(*on(side, q, k, v), scale=0.25), side)

    check_infinities(where, *operands(np.random.default_rng(12), (20, 16), (20, 16), dtype), attend)


def check_infinities(where, q, k, v, attend):
    """test_infinities_as_ieee's checks of ``attend(q, k, v)`` (scale 0.25), with one infinity
    put ``where`` it says."""
    q[:, 0] = np.abs(q[:, 0]) + 0.5  # q . k[5] is +-inf for every row, never inf * 0
    (v if where == "v +inf" else k)[5, 0] = -np.inf if where == "k -inf" else np.inf
    got = attend(q, k, v)
    if where == "k +inf":
        assert np.isnan(got).all()
    elif where == "k -inf":
        check(got, q, np.delete(k, 5, axis=0), np.delete(v, 5, axis=0), scale=0.25)
    else:
        assert np.isposinf(got[:, 0]).all()
        check(got[:, 1:], q, k, v[:, 1:], scale=0.25)


@pytest.mark.sim_only(reason="counts the simulator's host<->device copies and allocations")
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_device_calls_copy_nothing_and_allocate_only_the_result(dtype):
    q, k, v = on("device", *operands(np.random.default_rng(12), (20, 16), (30, 16), dtype))
    ops.attention(q, k, v)  # compile outside the count
    with sim.transfers() as counts:
        ops.attention(q, k, v, causal=True)
    assert counts == {"to_device": 0, "copy_to_host": 0, "device_array": 1}


def test_out_and_inputs_unchanged(side):
    q, k, v = operands(np.random.default_rng(8), (2, 17, 16), (2, 19, 16))
    copies = [x.copy() for x in (q, k, v)]
    qd, kd, vd, out = on(side, q, k, v, np.zeros((2, 17, 16), np.float16))
    got = ops.attention(qd, kd, vd, out=out, config=SMALL)
    assert got is out or side == "host"
    check(back(out, side) if side == "device" else out, q, k, v)
    for x, c in zip((q, k, v), copies, strict=True):
        np.testing.assert_array_equal(x, c)


def test_out_with_repeated_memory_is_refused(side):
    """A stride-0 ``out`` (as ``cupy.broadcast_to`` makes) would have its batches race."""
    from tessera_tile._runtime import arrays as _arrays

    q, k, v = operands(np.random.default_rng(8), (2, 17, 16), (2, 19, 16))
    if side == "host":
        out = np.broadcast_to(np.zeros((17, 16), np.float16), (2, 17, 16))  # read-only
    else:
        (one,) = on(side, np.zeros((17, 16), np.float16))
        out = _arrays.view(one, (2, 17, 16), (0, 32, 2))
    with pytest.raises(ValueError, match="out (is read-only|repeats memory)"):
        ops.attention(*on(side, q, k, v), out=out)


@pytest.mark.parametrize(
    ("q_shape", "kv_shape"),
    [((0, 16), (5, 16)), ((3, 0, 16), (3, 5, 16)), ((4, 16), (0, 16)), ((0, 3, 16), (1, 4, 16))],
)
def test_empty(side, q_shape, kv_shape):
    """S = 0 or an empty batch: NumPy's empty result; no keys (Sk = 0): zeros."""
    q, k, v = (np.ones(s, np.float16) for s in (q_shape, kv_shape, kv_shape))
    got = back(ops.attention(*on(side, q, k, v)), side)
    expected_shape = (*np.broadcast_shapes(q_shape[:-2], kv_shape[:-2]), q_shape[-2], 16)
    assert got.shape == expected_shape and got.dtype == np.float16
    np.testing.assert_array_equal(got, 0)


# --------------------------------------------------------------------------------------------
# traffic and shared memory (the simulator's profiler)


@pytest.mark.sim_only(reason="the profiler measures traffic and bank conflicts in the simulator")
@pytest.mark.parametrize("s", [64, 256])
def test_traffic_is_linear_in_s_and_as_predicted(s):
    """Q read once, K and V once per block of query rows, O written once: no S x S term.
    Causal tile skipping halves the K/V traffic (about: the diagonal tiles are read whole)."""
    q, k, v = operands(np.random.default_rng(9), (1, s, 64), (1, s, 64))
    measured = {}
    for causal in (False, True):
        with sim.profile() as prof:
            got = ops.attention(q, k, v, causal=causal)
        check(got, q, k, v, causal)
        assert prof.bank_conflicts == 0, str(prof)
        assert prof.races == [] and prof.out_of_bounds == [], str(prof)
        ex = ops.attention.explain(q, k, v, causal=causal)
        assert prof.bytes_read + prof.bytes_written == ex.bytes_fused, str(prof)
        assert prof.bytes_written == s * 64 * 2
        measured[causal] = prof.bytes_read - s * 64 * 2  # K and V
    block_q = tc.default_config(64, s).block_q  # 64 rows for S = 64 (2 warps), else 128
    blocks = s // block_q
    assert measured[False] == 2 * blocks * s * 64 * 2
    # causal: block b reads keys up to its last row, (b + 1) block_q of them
    assert measured[True] == 2 * block_q * 64 * 2 * blocks * (blocks + 1) // 2
    print(f"S={s}: K/V bytes non-causal {measured[False]}, causal {measured[True]}")


@pytest.mark.sim_only(reason="the profiler measures traffic and bank conflicts in the simulator")
@pytest.mark.parametrize("causal", [False, True])
def test_float32_traffic_as_predicted(causal):
    """The SIMT kernel follows the same rule (its blocks of 64 query rows, 32-key tiles)."""
    q, k, v = operands(np.random.default_rng(10), (70, 64), (90, 64), np.float32)
    with sim.profile() as prof:
        got = ops.attention(q, k, v, causal=causal)
    check(got, q, k, v, causal)
    assert prof.bank_conflicts == 0 and prof.out_of_bounds == [], str(prof)
    predicted = ops.attention.explain(q, k, v, causal=causal).bytes_fused
    assert prof.bytes_read + prof.bytes_written == predicted, str(prof)


# --------------------------------------------------------------------------------------------
# bad input


BAD = [
    (dict(k=np.ones((4, 32), np.float16)), ValueError, "k has head dimension 32"),
    (dict(v=np.ones((4, 32), np.float16)), ValueError, "v has head dimension 32"),
    (dict(v=np.ones((5, 16), np.float16)), ValueError, "v has 5 keys, k has 4"),
    (dict(k=np.ones((3, 4, 16), np.float16)), ValueError, "batch shapes"),
    (dict(q=np.ones((6, 16), np.float64)), TypeError, "q has dtype float64"),
    (dict(k=np.ones((4, 16), np.float32)), TypeError, "k has dtype float32, q has float16"),
    (
        dict(
            q=np.ones((6, 24), np.float16),
            k=np.ones((4, 24), np.float16),
            v=np.ones((4, 24), np.float16),
        ),
        ValueError,
        "q has head dimension 24; attention supports",
    ),
    (dict(q=np.ones(16, np.float16)), ValueError, "q has shape"),
    (dict(scale=float("inf")), ValueError, "scale must be finite"),
    (dict(scale="1"), TypeError, "scale must be a real number"),
    (dict(causal=1), TypeError, "causal must be a bool"),
    (dict(config=(64, 4, 2)), TypeError, "config must be None or"),
    (dict(config=tc.AttentionConfig(48, 4, 2)), ValueError, "config: block_kv must be"),
    (dict(config=tc.AttentionConfig(64, 4, 2, 24)), ValueError, "config: warp_rows must be"),
    (
        dict(
            q=np.ones((6, 128), np.float16),
            k=np.ones((4, 128), np.float16),
            v=np.ones((4, 128), np.float16),
            config=tc.AttentionConfig(128, 8, 3),
        ),
        ValueError,
        "config: .*shared memory",
    ),
]


@pytest.mark.parametrize(("change", "error", "words"), BAD)
def test_bad_input_raises_before_any_launch(change, error, words):
    args = dict(
        q=np.ones((2, 6, 16), np.float16),
        k=np.ones((4, 16), np.float16),
        v=np.ones((4, 16), np.float16),
    )
    kwargs = {}
    for name, value in change.items():
        (args if name in args else kwargs)[name] = value
    with counting_launches() as prof, pytest.raises(error, match=words):
        ops.attention(args["q"], args["k"], args["v"], **kwargs)
    assert prof.launches == 0
