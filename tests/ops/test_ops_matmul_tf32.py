"""``precision="tf32"`` on the prebuilt matmul, linear and mlp against float64 NumPy references.

The bound is derived from how the tensor core reads TF32, not tuned. It reads the upper 19 bits
of each float32 input and ignores the low 13: truncation, relative error below u = 2**-10 per
input (TF32's unit roundoff is 2**-11 when rounding to nearest; truncation doubles it). A
product of two such inputs is off by less than 2u + u**2 relative, the products are exact in
the tensor core and the K of them are summed in float32 (at most K + 2 roundings of 2**-24,
with the bias add and the epilogue's; a factor 2 on that term, the tensor core's internal
float32 sums not being specified to round to nearest). So, per element,

    |C - ref| <= slope * (2**-9 + 2**-20 + 2 (K + 2) 2**-24) * (|A| @ |B| + |bias|) + 8 ulp(ref)

with the activation's largest slope (1.13 for gelu) and 8 float32 ulps of its own rounding, as
in ``test_ops_matmul.py``; the relative Frobenius error against ``|| |A| @ |B| + |bias| ||``
then lies below the same factor (about 2e-3 for small K). The exact path (no precision) must
still meet the float32 bound and 1e-5 relative Frobenius error.

Simulated blocks cost about 0.5 ms per thread and K step: a one-warp
``TileConfig(32, 32, 16, 1, 2, dtype="tf32")`` and small shapes straddling its 32-wide tiles.
"""

import numpy as np
import pytest
from helpers import SIDES, back, on, transposed
from hypothesis import example, given, settings
from hypothesis import strategies as st
from numba import cuda

from tessera_tile import TileConfig, ops
from tessera_tile.kernels.epilogue import reference as activation_reference
from tessera_tile.tile_config import TF32_CANDIDATES, default_config

U32 = 2.0**-24
TINY = TileConfig(32, 32, 16, 1, 2, dtype="tf32")
EXACT_SMALL = TileConfig(32, 32, 8, 1, 3)
ACTIVATIONS = [None, "relu", "gelu", "gelu_tanh", "silu"]
ON_TENSOR_CORES = "TF32 tensor cores"
FELL_BACK = "the exact float32 SIMT kernel instead"


def gamma_tf32(k: int) -> float:
    return 2.0**-9 + 2.0**-20 + 2 * (k + 2) * U32


def reference(a, b, bias=None, activation=None, exact=False):
    """float64 reference and per-element tolerance of ``activation(a @ b + bias)``: the TF32
    bound above, or (``exact``) the float32 one of ``test_ops_matmul.py``."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    pre, magnitude = a64 @ b64, np.abs(a64) @ np.abs(b64)
    if bias is not None:
        pre = pre + np.asarray(bias, np.float64)
        magnitude = magnitude + np.abs(np.asarray(bias, np.float64))
    k = a64.shape[-1]
    gamma = (k + 2) * U32 / (1 - (k + 2) * U32) if exact else gamma_tf32(k)
    ref = activation_reference(activation, pre)
    slope = 1.0 if activation in (None, "relu") else 1.13
    return ref, slope * gamma * magnitude + 8 * U32 * np.abs(ref), magnitude, gamma


def check(got, a, b, bias=None, activation=None, exact=False):
    ref, tol, magnitude, gamma = reference(a, b, bias, activation, exact)
    got = np.asarray(got)
    assert got.dtype == np.float32 and got.shape == ref.shape, (got.dtype, got.shape)
    err = np.abs(got.astype(np.float64) - ref)
    bad = ~(err <= tol)
    assert not bad.any(), f"{int(bad.sum())} element(s) off, worst error {np.nanmax(err):.3g}"
    scale = np.linalg.norm(magnitude)
    if scale > 0:
        slope = 1.0 if activation in (None, "relu") else 1.13
        rel = np.linalg.norm(got - ref) / scale
        assert rel <= slope * gamma + 8 * U32, f"relative Frobenius error {rel:.3g}"
    if exact and np.linalg.norm(ref) > 0:
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5


def rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def reasons(op, *args, **kwargs) -> str:
    return " ".join(op.explain(*args, **kwargs).reasons)


# --------------------------------------------------------------------------------------------
# matmul: the TF32 kernel where rows are 16-byte aligned (K and N multiples of 4)

M = st.sampled_from([1, 31, 32, 33, 40])  # around the tiny config's 32-wide tiles
N = st.sampled_from([4, 28, 32, 36])
K = st.sampled_from([0, 4, 8, 16, 20, 36])  # around its 16-deep K step
BATCH = st.sampled_from([((), ()), ((2,), ()), ((), (3,)), ((2, 1), (3,))])


@settings(max_examples=8, deadline=None)
@given(m=M, n=N, k=K, batch=BATCH, side=st.sampled_from(SIDES), seed=st.integers(0, 2**16))
@example(m=33, n=36, k=20, batch=((2, 1), (3,)), side="device", seed=0)
def test_matmul_within_tf32_bound(m, n, k, batch, side, seed):
    rng = np.random.default_rng(seed)
    a, b = rand(rng, (*batch[0], m, k)), rand(rng, (*batch[1], k, n))
    before = a.copy(), b.copy()
    got = back(ops.matmul(*on(side, a, b), config=TINY, precision="tf32"), side)
    check(got, a, b)
    np.testing.assert_array_equal(a, before[0])  # inputs untouched
    np.testing.assert_array_equal(b, before[1])
    if k:  # (K = 0 has no rows to copy: the geometry calls them unaligned, and a @ b is 0)
        assert ON_TENSOR_CORES in reasons(ops.matmul, a, b, config=TINY, precision="tf32")


def test_tf32_is_not_exact_and_the_default_still_is():
    """The opt-in changes the arithmetic (truncated inputs: errors near 2**-10 relative, far
    above float32's), and leaving it out keeps the exact float32 path (1e-5)."""
    rng = np.random.default_rng(1)
    a, b = rand(rng, (40, 64)), rand(rng, (64, 36))
    fast = ops.matmul(a, b, config=TINY, precision="tf32")
    exact = ops.matmul(a, b, config=EXACT_SMALL)
    check(fast, a, b)
    check(exact, a, b, exact=True)
    ref = a.astype(np.float64) @ b
    assert np.linalg.norm(fast - ref) / np.linalg.norm(ref) > 1e-4  # really TF32
    assert ON_TENSOR_CORES not in reasons(ops.matmul, a, b, config=EXACT_SMALL)


@pytest.mark.sim_only(reason="the model's choice; a GPU's tuner times the TF32 tiles instead")
@pytest.mark.parametrize("side", SIDES)
def test_default_tf32_config_once(side):
    """No config: the model's TF32 tile for this shape (one block of it)."""
    rng = np.random.default_rng(2)
    a, b = rand(rng, (70, 12)), rand(rng, (12, 36))
    chosen = default_config(70, 36, 12, precision="tf32")
    assert chosen in TF32_CANDIDATES
    got = back(ops.matmul(*on(side, a, b), precision="tf32"), side)
    check(got, a, b)
    assert str(chosen) in " ".join(ops.matmul.explain(a, b, precision="tf32").stages)


@pytest.mark.sim_only(reason="measures traffic and bank conflicts with the simulator's profiler")
def test_measured_traffic_equals_prediction(side):
    from tessera_tile import sim

    rng = np.random.default_rng(9)
    x, w, bias = rand(rng, (2, 33, 40)), rand(rng, (40, 36)), rand(rng, 36)
    args = on(side, x, w, bias)
    ex = ops.linear.explain(*args, "relu", config=TINY, precision="tf32")
    with sim.profile() as prof:
        got = back(ops.linear(*args, "relu", config=TINY, precision="tf32"), side)
    check(got, x, w, bias, "relu")
    assert ex.stages[0].startswith("matmul_tf32_")
    assert prof.bytes_read + prof.bytes_written == ex.bytes_fused
    assert prof.bank_conflicts == 0


# --------------------------------------------------------------------------------------------
# layouts the TF32 kernel cannot take: the exact kernel, and explain says so


def test_unaligned_rows_fall_back_to_exact():
    rng = np.random.default_rng(3)
    a, b = rand(rng, (33, 7)), rand(rng, (7, 36))  # K = 7: rows not 16-byte aligned
    got = ops.matmul(a, b, config=TINY, precision="tf32")
    check(got, a, b, exact=True)
    assert FELL_BACK in reasons(ops.matmul, a, b, config=TINY, precision="tf32")


def test_strided_device_operand_falls_back_to_exact():
    rng = np.random.default_rng(4)
    a = rand(rng, (33, 40))
    b = rand(rng, (20, 72))
    d_a = cuda.to_device(a)[:, ::2]  # inner axis strided on the device: no copy is made
    d_b = cuda.to_device(b)[:, ::2]
    got = ops.matmul(d_a, d_b, config=TINY, precision="tf32")
    check(got.copy_to_host(), a[:, ::2], b[:, ::2], exact=True)
    assert FELL_BACK in reasons(ops.matmul, d_a, d_b, config=TINY, precision="tf32")


@pytest.mark.parametrize("layout", ["a_t", "b_t", "both_t"])
def test_transposed_device_operands_run_tf32_in_place(layout):
    """The backward GEMMs' operands, x.T of x.T @ dy and w.T of dy @ w.T (transposes of
    row-major device arrays): the TF32 kernel reads them in place, and explain says so."""
    rng = np.random.default_rng(7)
    trans_a, trans_b = layout != "b_t", layout != "a_t"
    m, k, n = 40, 36, 44
    a_base = rand(rng, (k, m) if trans_a else (m, k))
    b_base = rand(rng, (n, k) if trans_b else (k, n))
    d_a, d_b = on("device", a_base, b_base)
    a, a_np = (transposed(d_a), a_base.T) if trans_a else (d_a, a_base)
    b, b_np = (transposed(d_b), b_base.T) if trans_b else (d_b, b_base)
    got = ops.matmul(a, b, config=TINY, precision="tf32")
    check(got.copy_to_host(), a_np, b_np)
    why = reasons(ops.matmul, a, b, config=TINY, precision="tf32")
    assert ON_TENSOR_CORES in why and "transposed in memory" in why, why


def test_transposed_unaligned_rows_fall_back_to_exact():
    """x.T whose rows are not 16-byte aligned (M = 33 floats): the exact kernel reads the view
    as it is (the TF32 kernel would need them aligned)."""
    rng = np.random.default_rng(8)
    x, dy = rand(rng, (40, 33)), rand(rng, (40, 36))
    d_x, d_dy = on("device", x, dy)
    got = ops.matmul(transposed(d_x), d_dy, config=TINY, precision="tf32")
    check(got.copy_to_host(), x.T, dy, exact=True)
    why = reasons(ops.matmul, transposed(d_x), d_dy, config=TINY, precision="tf32")
    assert FELL_BACK in why and "transposed in memory" not in why, why


def test_strided_host_operands_are_copied_and_run_tf32():
    """Host inputs travel to the device as contiguous copies: aligned, the TF32 kernel."""
    rng = np.random.default_rng(5)
    a = rand(rng, (2, 40, 48))[:, ::-1, ::2]  # negative and doubled strides
    b = np.asfortranarray(rand(rng, (24, 36)))
    got = ops.matmul(a, b, config=TINY, precision="tf32")
    check(got, a, b)
    assert ON_TENSOR_CORES in reasons(ops.matmul, a, b, config=TINY, precision="tf32")


def test_broadcast_batch_without_copies():
    rng = np.random.default_rng(6)
    a = np.broadcast_to(rand(rng, (1, 33, 24)), (3, 33, 24))
    b = rand(rng, (3, 24, 32))
    got = back(ops.matmul(*on("device", a, b), config=TINY, precision="tf32"), "device")
    check(got, a, b)


# --------------------------------------------------------------------------------------------
# linear (every activation), K = 0, size 0, mlp


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_linear_every_activation(activation):
    rng = np.random.default_rng(7)
    x, w, bias = rand(rng, (2, 17, 20)), rand(rng, (20, 36)), rand(rng, 36)
    got = ops.linear(x, w, bias, activation, config=TINY, precision="tf32")
    check(got, x, w, bias, activation)


@pytest.mark.parametrize("side", SIDES)
def test_k_zero_gives_activation_of_bias(side):
    x, w = np.zeros((5, 0), np.float32), np.zeros((0, 36), np.float32)
    bias = np.linspace(-2, 2, 36).astype(np.float32)
    got = back(ops.linear(*on(side, x, w, bias), "relu", config=TINY, precision="tf32"), side)
    np.testing.assert_array_equal(got, np.broadcast_to(np.maximum(bias, 0), (5, 36)))


@pytest.mark.parametrize(("a_shape", "b_shape", "out"), [
    ((0, 8), (8, 32), (0, 32)), ((3, 8), (8, 0), (3, 0)), ((0, 4, 8), (8, 32), (0, 4, 32)),
])  # fmt: skip
def test_size_zero_dimensions(a_shape, b_shape, out):
    a, b = np.zeros(a_shape, np.float32), np.zeros(b_shape, np.float32)
    got = ops.matmul(a, b, config=TINY, precision="tf32")
    assert got.shape == out and got.dtype == np.float32
    assert ops.matmul.explain(a, b, config=TINY, precision="tf32").kernels == 0


def test_mlp_tf32_both_products():
    rng = np.random.default_rng(8)
    x, w1, b1 = rand(rng, (9, 16)), rand(rng, (16, 32)), rand(rng, 32)
    w2, b2 = rand(rng, (32, 4)), rand(rng, 4)
    got = ops.mlp(x, w1, b1, w2, b2, "gelu", precision="tf32")
    h = activation_reference("gelu", x.astype(np.float64) @ w1 + b1)
    want = h @ w2 + b2
    # the hidden activation carries the first product's TF32 bound into the second
    _, tol1, _, _ = reference(x, w1, b1, "gelu")
    magnitude = (np.abs(h) + tol1) @ np.abs(w2.astype(np.float64)) + np.abs(b2)
    tol = tol1 @ np.abs(w2.astype(np.float64)) + gamma_tf32(32) * magnitude
    assert np.all(np.abs(got - want) <= tol + 8 * U32 * np.abs(want))
    explained = ops.mlp.explain(x, w1, b1, w2, b2, "gelu", precision="tf32")
    assert explained.kernels == 2
    assert ON_TENSOR_CORES in " ".join(explained.reasons)


# --------------------------------------------------------------------------------------------
# bad input: TypeError / ValueError naming the argument, before any launch

F32 = np.zeros((4, 8), np.float32)
W32 = np.zeros((8, 32), np.float32)
BAD = [
    (lambda: ops.matmul(F32, W32, precision="fp32"), ValueError, "precision must be one of"),
    (lambda: ops.matmul(F32, W32, precision="TF32"), ValueError, "precision must be one of"),
    (lambda: ops.matmul(F32, W32, precision=32), TypeError, "precision must be None or a str"),
    (
        lambda: ops.matmul(F32.astype(np.float16), W32.astype(np.float16), precision="tf32"),
        ValueError,
        "precision='tf32' is for float32 inputs",
    ),
    (lambda: ops.matmul(F32, W32, config=TINY), ValueError, "config has tf32 tiles"),
    (
        lambda: ops.matmul(F32.astype(np.float16), W32.astype(np.float16), config=TINY),
        ValueError,
        "config has tf32 tiles",
    ),
    (lambda: ops.matmul(F32, W32, config=EXACT_SMALL, precision="tf32"), ValueError, "tf32"),
    (lambda: ops.linear(F32, W32, precision="bf16"), ValueError, "precision"),
    (lambda: ops.mlp(F32, W32, None, W32.T, None, precision="x"), ValueError, "precision"),
    (lambda: ops.matmul(F32, W32, "tf32"), TypeError, "positional"),
    (lambda: TileConfig(32, 16, 16, 1, 2, dtype="tf32"), ValueError, "tile_n"),
    (lambda: TileConfig(32, 32, 12, 1, 2, dtype="tf32"), ValueError, "tile_k"),
    (lambda: TileConfig(256, 256, 32, 8, 4, dtype="tf32"), ValueError, "shared memory"),
    (
        lambda: ops.matmul(
            F32, W32, config=TileConfig(32, 32, 64, 1, 2, dtype="tf32"), precision="tf32"
        ),
        ValueError,
        "tile_k",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("call", "error", "message"), BAD)
def test_bad_input_names_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()
