"""Prebuilt matmul, linear and mlp against float64 NumPy references.

Per element, a float32 result must lie within the classic bound of a K-term float32 dot
product, ``gamma_(K+2) * (|a| @ |b| + |bias|)`` with ``gamma_n = n u / (1 - n u)`` and
u = 2**-24 (the +2: the bias add and the activation's rounding), times the activation's largest
slope (1.13 for gelu) plus 8 ulps of the activation (libdevice erff/tanhf/expf). A float16
result adds its one rounding at the store (2**-11 relative). Every result must also have a
relative Frobenius error below 1e-5 (float32) or 1e-2 (float16), the issue's figures.

Simulated blocks cost about 0.5 ms per thread and K step, so most tests use a one-warp
``TileConfig(32, 32, 8, 1, 3)`` (32 threads, 4 x 8 per thread) and small shapes that straddle
its 32-wide tiles; each default config runs once, on a shape just past its tile.
"""

import numpy as np
import pytest
from helpers import SIDES, back, counting_launches, on, transposed
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tessera_tile import TileConfig, ops, sim
from tessera_tile._runtime import arrays as _arrays
from tessera_tile.kernels.epilogue import reference as activation_reference
from tessera_tile.tile_config import CANDIDATES

U32 = 2.0**-24
U16 = 2.0**-11
FROBENIUS = {np.dtype(np.float32): 1e-5, np.dtype(np.float16): 1e-2}
SMALL = TileConfig(32, 32, 8, 1, 3)
SMALL2 = TileConfig(32, 32, 8, 1, 2)
ACTIVATIONS = [None, "relu", "gelu", "gelu_tanh", "silu"]


def reference(a, b, bias=None, activation=None):
    """float64 reference and per-element tolerance of ``activation(a @ b + bias)``."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    pre, magnitude = a64 @ b64, np.abs(a64) @ np.abs(b64)
    if bias is not None:
        pre = pre + np.asarray(bias, np.float64)
        magnitude = magnitude + np.abs(np.asarray(bias, np.float64))
    k = a64.shape[-1]
    gamma = (k + 2) * U32 / (1 - (k + 2) * U32)
    ref = activation_reference(activation, pre)
    slope = 1.0 if activation in (None, "relu") else 1.13
    return ref, slope * gamma * magnitude + 8 * U32 * np.abs(ref)


def check(got, ref, tol, dtype) -> None:
    dtype = np.dtype(dtype)
    got = np.asarray(got)
    assert got.dtype == dtype and got.shape == ref.shape, (got.dtype, got.shape, ref.shape)
    if dtype == np.float16:
        tol = tol + U16 * np.abs(ref) + 2.0**-25  # the store's rounding (subnormals included)
    err = np.abs(got.astype(np.float64) - ref)
    bad = ~(err <= tol)
    assert not bad.any(), f"{int(bad.sum())} element(s) off, worst error {np.nanmax(err):.3g}"
    norm = np.linalg.norm(ref)
    if norm > 0:
        assert np.linalg.norm(got.astype(np.float64) - ref) / norm < FROBENIUS[dtype]


def rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# --------------------------------------------------------------------------------------------
# matmul

EDGE = st.sampled_from([1, 31, 32, 33, 40])  # around the small config's 32-wide tiles
K = st.sampled_from([0, 1, 7, 8, 9, 20])  # around its 8-deep K step
BATCH = st.sampled_from([((), ()), ((2,), ()), ((), (3,)), ((2, 1), (3,)), ((1, 2), (2, 1))])


@settings(max_examples=8, deadline=None)
@given(m=EDGE, n=EDGE, k=K, batch=BATCH, side=st.sampled_from(SIDES), seed=st.integers(0, 2**16))
@example(m=33, n=33, k=9, batch=((2, 1), (3,)), side="device", seed=0)
def test_matmul_matches_numpy(m, n, k, batch, side, seed):
    rng = np.random.default_rng(seed)
    a, b = rand(rng, (*batch[0], m, k)), rand(rng, (*batch[1], k, n))
    before = a.copy(), b.copy()
    got = back(ops.matmul(*on(side, a, b), config=SMALL), side)
    check(got, *reference(a, b), np.float32)
    np.testing.assert_array_equal(a, before[0])
    np.testing.assert_array_equal(b, before[1])


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [((9,), (9, 5)), ((3, 9), (9,)), ((9,), (9,)), ((2, 3, 9), (9,)), ((9,), (2, 9, 4))],
)
def test_one_dimensional_operands_as_numpy(a_shape, b_shape):
    rng = np.random.default_rng(1)
    a, b = rand(rng, a_shape), rand(rng, b_shape)
    got = ops.matmul(a, b, config=SMALL)
    assert np.shape(got) == np.matmul(a, b).shape
    check(np.asarray(got), *reference(a, b), np.float32)


@pytest.mark.parametrize("view", ["a_strided", "b_transposed", "both"])
def test_non_contiguous_inputs(side, view):
    rng = np.random.default_rng(2)
    a_base, b_base = rand(rng, (2, 33, 18)), rand(rng, (35, 9))
    a_dev, b_dev = on(side, a_base, b_base)
    strided, b_t = view in ("a_strided", "both"), view in ("b_transposed", "both")
    a, a_np = (
        (a_dev[:, :, ::2], a_base[:, :, ::2]) if strided else (a_dev[:, :, :9], a_base[:, :, :9])
    )
    b, b_np = (transposed(b_dev), b_base.T) if b_t else (b_dev[:9, :], b_base[:9, :])
    got = back(ops.matmul(a, b, config=SMALL2), side)
    check(got, *reference(a_np, b_np), np.float32)
    assert "copies, read in place" in " ".join(ops.matmul.explain(a, b, config=SMALL2).reasons)


@pytest.mark.sim_only(reason="counts the simulator's host<->device copies and allocations")
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_device_calls_copy_nothing_and_allocate_only_the_result(dtype):
    """Device operands are read in place; a call without a bias allocates no stand-in for it."""
    rng = np.random.default_rng(13)
    a, b, bias = on("device", rand(rng, (9, 20), dtype), rand(rng, (20, 12), dtype),
                    rand(rng, 12, dtype))  # fmt: skip
    for call in (lambda: ops.matmul(a, b, config=SMALL2), lambda: ops.linear(a, b, bias)):
        call()  # compile outside the count
        with sim.transfers() as counts:
            call()
        assert counts == {"to_device": 0, "copy_to_host": 0, "device_array": 1}


def test_k_zero_gives_zeros(side):
    a, b = on(side, np.ones((2, 3, 0), np.float32), np.ones((0, 5), np.float32))
    got = back(ops.matmul(a, b, config=SMALL), side)
    np.testing.assert_array_equal(got, np.zeros((2, 3, 5), np.float32))


EMPTY = [((0, 4), (4, 5)), ((3, 4), (4, 0)), ((0, 3, 4), (4, 5)), ((2, 1, 3, 4), (0, 4, 5))]


@pytest.mark.parametrize(("a_shape", "b_shape"), EMPTY)
def test_empty_results_launch_nothing(side, a_shape, b_shape):
    x, y = on(side, np.ones(a_shape, np.float32), np.ones(b_shape, np.float32))
    with counting_launches() as prof:
        got = back(ops.matmul(x, y), side)
    assert got.shape == np.matmul(np.ones(a_shape), np.ones(b_shape)).shape
    assert prof.launches == 0 and ops.matmul.explain(x, y).kernels == 0


# --------------------------------------------------------------------------------------------
# linear (every activation), float16, mlp


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_linear_every_activation(side, activation):
    rng = np.random.default_rng(3)
    x, w, bias = rand(rng, (2, 33, 20)), rand(rng, (20, 37)), rand(rng, 37)
    got = back(ops.linear(*on(side, x, w, bias), activation, config=SMALL), side)
    check(got, *reference(x, w, bias, activation), np.float32)


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
def test_linear_k_zero_gives_activation_of_bias(activation):
    bias = np.array([-2.0, -0.5, 0.0, 0.5, 3.0], np.float32)
    got = ops.linear(np.zeros((3, 0), np.float32), np.zeros((0, 5), np.float32), bias, activation)
    want = np.broadcast_to(activation_reference(activation, bias), (3, 5))
    np.testing.assert_allclose(got, want, rtol=8 * U32, atol=0)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_activations_at_extremes_and_nan(activation):
    """Saturation (exp(-x) overflowing to inf) gives the limit, NaN propagates (as PyTorch)."""
    bias = np.array([-1000.0, -90.0, 90.0, 1000.0, np.nan, 0.0], np.float32)
    got = ops.linear(np.zeros((1, 0), np.float32), np.zeros((0, 6), np.float32), bias, activation)
    want = activation_reference(activation, bias)
    np.testing.assert_allclose(got[0], want, rtol=8 * U32, atol=1e-37)


def test_linear_without_bias_and_one_dimensional_x():
    rng = np.random.default_rng(4)
    x, w = rand(rng, 20), rand(rng, (20, 9))
    got = ops.linear(x, w, None, "gelu_tanh", config=SMALL)
    check(got, *reference(x, w, None, "gelu_tanh"), np.float32)


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_float16_rounds_once_from_float32(side, activation):
    rng = np.random.default_rng(5)
    x, w, bias = (rand(rng, s, np.float16) for s in ((2, 33, 20), (20, 35), (35,)))
    got = back(ops.linear(*on(side, x, w, bias), activation, config=SMALL), side)
    check(got, *reference(x, w, bias, activation), np.float16)
    assert "float16 on the float32 SIMT kernel" in " ".join(
        ops.linear.explain(x, w, bias, activation, config=SMALL).reasons
    )


# float16 tiles: the tensor-core kernel (a small config; rows 16-byte aligned or not)
TC_SMALL = TileConfig(32, 32, 16, 2, 2, dtype="float16")


TC_CASES = pytest.mark.parametrize(
    "k, n, kind", [(32, 40, "aligned"), (20, 35, "synchronous")], ids=["aligned", "unaligned"]
)


def tensor_core_case(side, k, n):
    rng = np.random.default_rng(15)
    x, w, bias = (rand(rng, s, np.float16) for s in ((2, 33, k), (k, n), (n,)))
    return (x, w, bias), on(side, x, w, bias)


@TC_CASES
def test_float16_on_tensor_cores(side, k, n, kind):
    (x, w, bias), args = tensor_core_case(side, k, n)
    ex = ops.linear.explain(*args, "relu", config=TC_SMALL)
    got = back(ops.linear(*args, "relu", config=TC_SMALL), side)
    check(got, *reference(x, w, bias, "relu"), np.float16)
    assert ex.stages[0].startswith("matmul_tc_")
    assert ("synchronous variant" in " ".join(ex.reasons)) == (kind == "synchronous")


@pytest.mark.sim_only(reason="measures global traffic and bank conflicts with the simulator")
@TC_CASES
def test_float16_on_tensor_cores_traffic_is_explains(side, k, n, kind):
    _, args = tensor_core_case(side, k, n)
    ex = ops.linear.explain(*args, "relu", config=TC_SMALL)
    with sim.profile() as prof:
        ops.linear(*args, "relu", config=TC_SMALL)
    assert prof.bytes_read + prof.bytes_written == ex.bytes_fused
    assert prof.bank_conflicts == 0


@pytest.mark.parametrize("config", [None, TC_SMALL], ids=["default", "float16 tiles"])
def test_float16_k_zero(side, config):
    """K = 0 (issue 19): zeros for matmul, activation(bias) for linear and mlp, with float16
    tiles (the default ones included) as with float32 ones."""
    bias = np.array([-2.0, -0.5, 0.0, 0.5, 3.0], np.float16)
    x, w = np.ones((3, 0), np.float16), np.ones((0, 5), np.float16)
    got = back(ops.matmul(*on(side, x, w), config=config), side)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, np.zeros((3, 5), np.float16))
    got = back(ops.linear(*on(side, x, w, bias), "gelu", config=config), side)
    want = np.broadcast_to(activation_reference("gelu", bias.astype(np.float64)), (3, 5))
    check(got, want, 8 * U32 * np.abs(want), np.float16)  # gelu in float32, one rounding
    w2, b2 = np.ones((5, 2), np.float16), np.array([0.25, -1.0], np.float16)
    got = back(ops.mlp(*on(side, x, w, bias, w2, b2), "relu"), side)
    hidden = np.maximum(bias, 0).astype(np.float64)
    want = np.broadcast_to(hidden @ w2 + b2, (3, 2))  # exact: sums of a few halves
    np.testing.assert_array_equal(got, want.astype(np.float16))


SIMT_READ = "inner axis is strided"  # the explained reason of the SIMT kernel's in-place read
F16_VIEWS = {  # shapes of A and B, the views taken of them ((33, 9) @ (9, 35)), the reason
    "a sliced": ((33, 18), (9, 35), lambda a, b: (a[:, ::2], b), SIMT_READ),
    "b transposed": ((33, 9), (35, 9), lambda a, b: (a, transposed(b)), "w transposed in memory"),
    "both": ((33, 18), (35, 9), lambda a, b: (a[:, ::2], transposed(b)), SIMT_READ),
}


@pytest.mark.parametrize("view", F16_VIEWS)
@pytest.mark.parametrize("config", [None, TC_SMALL], ids=["default", "float16 tiles"])
def test_float16_strided_operands(side, view, config):
    """A float16 operand whose inner axis is strided (issue 19): the float32 SIMT kernel,
    computed in float32 and rounded once; the transpose of a row-major array (a backward
    GEMM's w.T), the tensor-core kernel reading it transposed. Device operands are read in
    place; host ones are copied contiguously first, so they run on the tensor cores."""
    rng = np.random.default_rng(16)
    a_shape, b_shape, take, reason = F16_VIEWS[view]
    a_base, b_base, bias = (rand(rng, s, np.float16) for s in (a_shape, b_shape, 35))
    a, b = take(*on(side, a_base, b_base))
    a_np, b_np = take(a_base, b_base)
    (d_bias,) = on(side, bias)
    got = back(ops.linear(a, b, d_bias, "silu", config=config), side)
    check(got, *reference(a_np, b_np, bias, "silu"), np.float16)
    reasons = " ".join(ops.linear.explain(a, b, d_bias, "silu", config=config).reasons)
    assert (reason in reasons) == (side == "device"), reasons
    assert "was given" not in reasons


def test_a_tile_that_cannot_stage_a_transposed_operand_is_replaced():
    """96 rows of A are 12 chunks, no power of two: A read transposed takes the anchor's
    128 x 128 x 32 tile of the config's warps and stages, and explain says so."""
    rng = np.random.default_rng(17)
    a_base, b = rand(rng, (40, 32), np.float16), rand(rng, (40, 24), np.float16)
    config = TileConfig(96, 64, 32, 4, 2, dtype="float16")
    a, db = transposed(on("device", a_base)[0]), on("device", b)[0]
    got = back(ops.matmul(a, db, config=config), "device")
    check(got, *reference(a_base.T, b), np.float16)
    reasons = " ".join(ops.matmul.explain(a, db, config=config).reasons)
    assert "cannot stage a transposed operand" in reasons and "128x128x32" in reasons, reasons


def test_float16_default_tunes_among_float16_tiles_where_a_gpu_times(monkeypatch):
    """Where a GPU times configs, a float16 call without config= times only the tiles the
    model does not score inf for float16. The tuner used to time the float32 SIMT tiles too and
    keep the fastest (a SIMT tile at this size, on an H200): explain then said "a float32
    TileConfig was given", and contiguous operands of the shape bucket ran on SIMT."""
    import importlib

    from tessera_tile import tuned
    from tessera_tile._runtime import config as _config

    autotune = importlib.import_module("tessera_tile.autotune")  # the package exports a function
    timed = []

    def time_config(launch, args, kwargs, config, warmup, repeat):
        timed.append(config)
        return (1.0 if config.dtype == "float32" else 2.0), None  # as if SIMT were faster

    monkeypatch.setattr(_config, "gpu_present", lambda: True)
    monkeypatch.setattr(autotune, "_time_config", time_config)
    for name, value in (("_memo", {}), ("_buckets", {}), ("disk", None)):
        monkeypatch.setattr(tuned.matmul, name, value)
    rng = np.random.default_rng(17)
    a, b, bias = (rand(rng, s, np.float16) for s in ((33, 18), (9, 35), 35))
    d_a, d_b, d_bias = on("device", a, b, bias)
    strided = d_a[:, ::2]
    got = back(ops.linear(strided, d_b, d_bias, "silu"), "device")
    check(got, *reference(a[:, ::2], b, bias, "silu"), np.float16)
    reasons = " ".join(ops.linear.explain(strided, d_b, d_bias, "silu").reasons)
    assert "inner axis is strided" in reasons and "was given" not in reasons, reasons
    assert all(c.dtype == "float16" for c in timed), timed
    (contiguous,) = on("device", np.ascontiguousarray(a[:, ::2]))
    assert ops.linear.explain(contiguous, d_b, d_bias, "silu").stages[0].startswith("matmul_tc_")


def refuse_indexing(monkeypatch):
    """Device arrays that host code cannot index. On a GPU numba's ``DeviceNDArray`` indexes
    through its dummyarray, unlike NumPy: size 1 along a stride-0 axis, and RuntimeError
    ("non-empty slice into empty slice") for a view into an empty (null) allocation, such as
    ``[0]`` of a (2, 3, 0) array. The ops build every view from the operand's record instead."""
    from numba import cuda

    def refuse(self, item):
        raise AssertionError(f"host code indexed a device array with {item!r}")

    monkeypatch.setattr(type(cuda.to_device(np.zeros(1))), "__getitem__", refuse)


# A and B shapes: K = 0 (empty operands, batched on either side) and a batch split into two
# launches (b's stride-0 dimension does not merge), whose second views start past the first
# matrices
VIEWS = {
    "k zero": ((2, 3, 0), (0, 5), 1),
    "k zero, batched b": ((4, 0), (3, 0, 6), 1),
    "two launches": ((2, 3, 9, 8), (2, 1, 8, 12), 2),
}


@pytest.mark.parametrize("shapes", VIEWS)
@pytest.mark.parametrize("config", [SMALL2, TC_SMALL], ids=["float32", "float16"])
def test_device_views_are_built_without_indexing(monkeypatch, shapes, config):
    a_shape, b_shape, launches = VIEWS[shapes]
    dtype = np.float16 if config is TC_SMALL else np.float32
    rng = np.random.default_rng(18)
    a, b = rand(rng, a_shape, dtype), rand(rng, b_shape, dtype)
    args = on("device", a, b)  # numba's to_device indexes its new array on a GPU
    refuse_indexing(monkeypatch)
    got = back(ops.matmul(*args, config=config), "device")
    check(got, *reference(a, b), dtype)
    assert f"in {launches} launch(es)" in ops.matmul.explain(*args, config=config).stages[0]


@pytest.mark.parametrize("config", [SMALL2, TC_SMALL], ids=["float32", "float16"])
def test_stride_0_device_operands(config):
    """cuda.to_device of a broadcast array keeps its stride 0 (numba's interface reports such an
    array as C-contiguous, which read as such puts its later batches past its allocation)."""
    dtype = np.float16 if config is TC_SMALL else np.float32
    rng = np.random.default_rng(19)
    a = np.broadcast_to(rand(rng, (1, 33, 24), dtype), (3, 33, 24))
    b, w = rand(rng, (3, 24, 32), dtype), rand(rng, (24, 32), dtype)
    bias = np.broadcast_to(rand(rng, 1, dtype), (32,))
    got = back(ops.matmul(*on("device", a, b), config=config), "device")
    check(got, *reference(a, b), dtype)
    got = back(ops.linear(*on("device", a, w, bias), "gelu", config=config), "device")
    check(got, *reference(a, w, bias, "gelu"), dtype)


def test_a_device_out_repeating_memory_is_refused():
    from numba import cuda

    a, b = on("device", np.ones((2, 3, 4), np.float32), np.ones((4, 5), np.float32))
    out = _arrays.view(cuda.device_array((3, 5), np.float32), (2, 3, 5), (0, 20, 4))
    with pytest.raises(ValueError, match="out repeats memory"):
        ops.matmul(a, b, out=out, config=SMALL)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_nan_inf_and_overflow_as_numpy(side, dtype):
    """IEEE arithmetic, as the docstring says: inf * 0 is NaN, NaN propagates, and a float16
    result beyond its range (computed in float32) rounds to inf."""
    big = 60000.0  # a float16 whose sum of two overflows float16, not float32
    a = np.array([[np.inf, 1, 0], [np.nan, 1, 0], [1, 1, 0], [big, big, 0]], dtype)
    b = np.array([[0, 1], [1, 1], [1, -1]], dtype)
    got = back(ops.matmul(*on(side, a, b)), side)
    with np.errstate(all="ignore"):  # the reference meets the same NaN and overflow
        want = (a.astype(np.float64) @ b.astype(np.float64)).astype(dtype)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)  # NaN where NumPy has NaN, inf where it has inf


@pytest.mark.parametrize("activation", ["gelu", "silu"])
def test_mlp_matches_numpy(side, activation):
    rng = np.random.default_rng(6)
    x, w1, b1 = rand(rng, (2, 5, 12)), rand(rng, (12, 33)), rand(rng, 33)
    w2, b2 = rand(rng, (33, 7)), rand(rng, 7)
    got = back(ops.mlp(*on(side, x, w1, b1, w2, b2), activation), side)
    hidden, _ = reference(x, w1, b1, activation)
    ref, tol = reference(hidden, w2, b2)
    # the hidden activation is rounded to float32 once: its error reaches the output through w2
    h_tol = reference(x, w1, b1, activation)[1] + U32 * np.abs(hidden)
    check(got, ref, tol + h_tol @ np.abs(w2.astype(np.float64)), np.float32)
    assert ops.mlp.explain(x, w1, b1, w2, b2, activation).kernels == 2


# --------------------------------------------------------------------------------------------
# out=, streams, defaults


def test_out_host_and_device():
    from numba import cuda

    rng = np.random.default_rng(7)
    a, b = rand(rng, (33, 9)), rand(rng, (9, 34))
    out = np.full((33, 34), np.nan, np.float32)
    assert ops.matmul(a, b, out=out, config=SMALL) is out
    check(out, *reference(a, b), np.float32)
    d_out = cuda.device_array((33, 68), np.float32)[:, ::2]  # a strided device out
    ops.matmul(cuda.to_device(a), cuda.to_device(b), out=d_out, config=SMALL, stream=0)
    check(d_out.copy_to_host(), *reference(a, b), np.float32)


@pytest.mark.parametrize("config", CANDIDATES, ids=str)
def test_each_default_config_once(config):
    rng = np.random.default_rng(8)
    m, n = config.tile_m + 3, config.tile_n - 4  # past the tile's rows, short of its columns
    x, w, bias = rand(rng, (m, 12)), rand(rng, (12, n)), rand(rng, n)
    got = ops.linear(x, w, bias, "gelu", config=config)
    check(got, *reference(x, w, bias, "gelu"), np.float32)


@pytest.mark.parametrize("side", SIDES)
def test_simt_tiles_past_48_kib_run_in_dynamic_shared_memory(side):
    """TileConfig(128, 64, 32, 4, 3) needs 72 KiB: its tiles are carved from dynamic shared
    memory and the launch opts in (issue 40 found it refused on sm_90). K of 70 runs three
    tiles of 32, the last partial; rows past the tile, columns short of it."""
    big = TileConfig(128, 64, 32, 4, 3)
    rng = np.random.default_rng(12)
    x, w, bias = rand(rng, (131, 70)), rand(rng, (70, 60)), rand(rng, 60)
    got = back(ops.linear(*on(side, x, w, bias), "gelu", config=big), side)
    check(got, *reference(x, w, bias, "gelu"), np.float32)
    (launch,) = ops.linear._plan(x, w, bias, "gelu", config=big).report().launches
    assert launch.shared == big.shared_bytes + 16  # the rings, the bias row, B2's placeholder


def test_float16_default_config_once():
    rng = np.random.default_rng(9)
    a, b = rand(rng, (70, 12), np.float16), rand(rng, (12, 36), np.float16)
    got = ops.matmul(a, b)
    check(got, *reference(a, b), np.float16)


# --------------------------------------------------------------------------------------------
# bad input: TypeError / ValueError naming the argument, before any launch

F32 = np.zeros((4, 3), np.float32)
W = np.zeros((3, 5), np.float32)
BAD = [
    (lambda: ops.matmul(F32, np.zeros((4, 5), np.float32)), ValueError, "inner dimensions"),
    (
        lambda: ops.matmul(np.zeros((2, 4, 3), "f4"), np.zeros((3, 3, 5), "f4")),
        ValueError,
        "do not broadcast",
    ),
    (lambda: ops.matmul(F32.astype(np.int32), W), TypeError, "a has dtype int32"),
    (lambda: ops.matmul(F32, W.astype(np.float16)), TypeError, "b has dtype float16"),
    (lambda: ops.matmul(F32.astype(np.float64), W), TypeError, "a has dtype float64"),
    (lambda: ops.matmul(np.float32(1), W), TypeError, "a is a float32"),
    (lambda: ops.linear(F32, W, np.zeros(4, "f4")), ValueError, "bias has shape"),
    (lambda: ops.linear(F32, W, np.zeros(5, "f2")), TypeError, "bias has dtype"),
    (lambda: ops.linear(F32, W, None, "tanh"), ValueError, "activation must be one of"),
    (lambda: ops.linear(F32, np.zeros((1, 3, 5), "f4")), ValueError, "w has shape"),
    (lambda: ops.matmul(F32, W, config=(32, 32, 8, 1, 3)), TypeError, "config must be"),
    (
        lambda: ops.matmul(F32, W, config=TileConfig(64, 64, 16, 4, 2, dtype="float16")),
        ValueError,
        "config has float16 tiles",
    ),
    (lambda: ops.matmul(F32, W, out=np.zeros((4, 4), "f4")), ValueError, "out has shape"),
    (lambda: ops.matmul(F32, W, out=np.zeros((4, 5), "i4")), TypeError, "same_kind"),
    (lambda: ops.mlp(F32, W, None, np.zeros((4, 2), "f4"), None), ValueError, "w2 has shape"),
    (lambda: ops.mlp(F32, W, np.zeros(3, "f4"), np.zeros((5, 2), "f4"), None), ValueError, "b1"),
    (lambda: ops.mlp(F32, W, None, np.zeros((5, 2), "f4"), np.zeros(3, "f4")), ValueError, "b2"),
]


@pytest.mark.parametrize(("call", "error", "words"), BAD)
def test_bad_input_raises_before_any_launch(call, error, words):
    with counting_launches() as prof, pytest.raises(error, match=words):
        call()
    assert prof.launches == 0


def test_out_overlapping_an_input_and_mixed_sides():
    from numba import cuda

    base = np.zeros((4, 5), np.float32)
    with counting_launches() as prof:
        with pytest.raises(ValueError, match="out overlaps a"):
            ops.matmul(base[:, :3], np.zeros((3, 5), np.float32), out=base)
        with pytest.raises(TypeError, match="host .* device"):
            ops.matmul(F32, cuda.to_device(W))
    assert prof.launches == 0


# --------------------------------------------------------------------------------------------
# the simulator profile: traffic as predicted, no bank conflicts


@pytest.mark.sim_only(reason="the profiler measures traffic and bank conflicts in the simulator")
@pytest.mark.parametrize(
    ("a_shape", "b_shape", "config"),
    [
        ((40, 24), (24, 36), SMALL),
        ((2, 33, 17), (17, 70), SMALL2),
        ((2, 1, 9, 8), (3, 8, 12), SMALL),
    ],
    ids=["16-byte copies", "4-byte copies", "broadcast batch"],
)
def test_traffic_equals_prediction_and_no_bank_conflicts(a_shape, b_shape, config):
    rng = np.random.default_rng(10)
    a, b = rand(rng, a_shape), rand(rng, b_shape)
    n = b_shape[-1]
    bias = rand(rng, n)
    with sim.profile() as plain:
        c = ops.matmul(a, b, config=config)
    with sim.profile() as fused:
        y = ops.linear(a, b, bias, "gelu", config=config) if len(b_shape) == 2 else c
    check(c, *reference(a, b), np.float32)
    for prof in (plain, fused):
        assert prof.bank_conflicts == 0, str(prof)
        assert not prof.races and not prof.out_of_bounds, str(prof)
    predicted = ops.matmul.explain(a, b, config=config).bytes_fused
    assert plain.bytes_read + plain.bytes_written == predicted, str(plain)
    m, k = a_shape[-2:]
    batch = int(np.prod(np.broadcast_shapes(a_shape[:-2], b_shape[:-2])))
    tiles_m, tiles_n = -(-m // config.tile_m), -(-n // config.tile_n)
    # A once per column of C tiles, B once per row of them, C written once
    assert plain.bytes_written == batch * m * n * 4
    assert plain.bytes_read == batch * 4 * (m * k * tiles_n + k * n * tiles_m)
    if len(b_shape) == 2:
        check(y, *reference(a, b, bias, "gelu"), np.float32)
        bias_bytes = batch * tiles_m * n * 4  # the block's bias row, once per block
        fused_total = fused.bytes_read + fused.bytes_written
        assert fused_total == ops.linear.explain(a, b, bias, "gelu", config=config).bytes_fused
        assert fused_total <= plain.bytes_read + plain.bytes_written + bias_bytes


@pytest.mark.sim_only(reason="the profiler measures traffic in the simulator")
def test_mlp_traffic_equals_prediction():
    rng = np.random.default_rng(11)
    x, w1, b1 = rand(rng, (40, 12)), rand(rng, (12, 36)), rand(rng, 36)
    w2, b2 = rand(rng, (36, 20)), rand(rng, 20)
    plan = ops.mlp.explain(x, w1, b1, w2, b2)
    with sim.profile() as prof:
        ops.mlp(x, w1, b1, w2, b2)
    assert prof.launches == 2 and prof.bank_conflicts == 0, str(prof)
    assert prof.bytes_read + prof.bytes_written == plan.bytes_fused, str(prof)
    # the hidden activation: written once by the first kernel, read by the second
    hidden = 40 * 36 * 4
    written = sum(w for (kernel, arg), (_, w) in prof.traffic.items() if arg == "c")
    assert written == hidden + 40 * 20 * 4
    read_back = [
        r for (kernel, arg), (r, _) in prof.traffic.items() if arg == "a" and "none" in kernel
    ]
    assert f"costs {hidden + sum(read_back)} B of traffic" in plan.reasons[0], plan.reasons
