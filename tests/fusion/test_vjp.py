"""Gradients of fused functions (``tt.vjp``, ``tt.grad``) against NumPy.

Reference: central finite differences (step 1e-6) of a float64 NumPy twin of each function at
the same inputs, contracted with the same cotangent: accurate to about 1e-9 here (so 1e-8 is
added to every absolute tolerance, for gradients that are 0, as w's in w + (x - w)). Tolerances
per primal dtype, relative to the largest reference magnitude: float64 1e-6, float32 1e-4 (a
few float32 roundings of the recomputed forward values and the cotangents); float16 1e-2 and
bfloat16 4e-2 (the forward values are recomputed in the primal's dtype, as the forward rounds
them; the cotangents are accumulated in float32 and rounded once).
"""

import functools
import math

import ml_dtypes
import numpy as np
import pytest
from helpers import Interface, back, counting_launches, expression_trees, on

import tessera_tile as tt
from tessera_tile import sim

BF16 = np.dtype(ml_dtypes.bfloat16)
RTOL = {np.dtype(np.float32): 1e-4, np.dtype(np.float16): 1e-2, BF16: 4e-2}
RTOL[np.dtype(np.float64)] = 1e-6  # central differences' own error, about 1e-9, and margin
FD_ERROR = 1e-8  # the references' absolute error bound: where a gradient is 0, all there is
erf = np.vectorize(math.erf)


def sigmoid(v):
    return 1 / (1 + np.exp(-v))


def layer_norm(x, w, b, T=tt):  # noqa: N803 - the namespace: tt, or NumPy for the twin
    d = x - T.mean(x, axis=-1, keepdims=True)
    return d / T.sqrt(T.mean(d * d, axis=-1, keepdims=True) + 1e-5) * w + b


def softmax(x, T=tt):  # noqa: N803
    e = T.exp(x - T.max(x, axis=-1, keepdims=True))
    return e / T.sum(e, axis=-1, keepdims=True)


def medley(x, T=tt):  # noqa: N803 - one of each unary op
    a = T.abs(x) + 1
    return (
        T.exp2(x) + T.log1p(a) + T.expm1(x) + T.sqrt(a) + 1 / T.sqrt(x * x + 1) + T.sin(x)
        - T.cos(x) + T.square(x) + T.log2(a) + T.tanh(x)
    )  # fmt: skip


# name: (fused function, NumPy float64 twin, argument shapes)
CASES = {
    "layer_norm": (layer_norm, lambda x, w, b: layer_norm(x, w, b, np), [(4, 40), (40,), (40,)]),
    "softmax": (softmax, lambda x: softmax(x, np), [(4, 24)]),
    "bias_gelu": (
        lambda x, b: tt.gelu(x + b),
        lambda x, b: 0.5 * (x + b) * (1 + erf((x + b) / np.sqrt(2))),
        [(4, 24), (24,)],
    ),
    "gelu_tanh_silu": (
        lambda x: tt.gelu(x, approximate="tanh") * tt.silu(x),
        lambda x: (
            0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))) * x * sigmoid(x)
        ),
        [(4, 16)],
    ),  # fmt: skip
    "row_sum_result": (
        lambda x, w: tt.sum(x * w, axis=-1),
        lambda x, w: (x * w).sum(-1),
        [(4, 24), (24,)],
    ),  # fmt: skip
    "row_max_result": (lambda x: tt.max(x, axis=-1), lambda x: x.max(-1), [(4, 24)]),
    "mean_of_all": (lambda x: tt.mean(x * x), lambda x: (x * x).mean(), [(4, 24)]),
    "column_sum": (lambda x: tt.sum(tt.tanh(x), axis=0), lambda x: np.tanh(x).sum(0), [(4, 24)]),
    "column_broadcast": (lambda x, s: x * s - s, lambda x, s: x * s - s, [(4, 8), (4, 1)]),
    "matmul_silu": (
        lambda x, w: tt.silu(x @ w),
        lambda x, w: (x @ w) * sigmoid(x @ w),
        [(8, 16), (16, 8)],
    ),  # fmt: skip
    "linear_gelu": (
        lambda x, w, b: tt.gelu(x @ w + b),
        lambda x, w, b: 0.5 * (x @ w + b) * (1 + erf((x @ w + b) / np.sqrt(2))),
        [(8, 16), (16, 8), (8,)],
    ),  # fmt: skip
    "pow_div": (
        lambda x, y: (tt.abs(x) + 1) ** y / (y + 3),
        lambda x, y: (np.abs(x) + 1) ** y / (y + 3),
        [(4, 8), (4, 8)],
    ),  # fmt: skip
    "where_sigmoid": (
        lambda x, y: tt.where(x > 0, x * y, tt.sigmoid(y)),
        lambda x, y: np.where(x > 0, x * y, sigmoid(y)),
        [(4, 8), (4, 8)],
    ),
    "logsumexp": (
        lambda x: tt.logsumexp(x, axis=-1, keepdims=True) * 2,
        lambda x: np.log(np.exp(x).sum(-1, keepdims=True)) * 2,
        [(4, 24)],
    ),
    "maximum_minimum": (
        lambda x, y: tt.maximum(x, y) - 2 * tt.minimum(x, y * 0.5),
        lambda x, y: np.maximum(x, y) - 2 * np.minimum(x, y * 0.5),
        [(4, 8), (8,)],
    ),  # fmt: skip
    "medley": (medley, lambda x: medley(x, np), [(3, 8)]),
}


def finite_differences(twin, args, cotangent, i, step=1e-6):
    """d<twin(args), cotangent>/d args[i], by central differences in float64."""
    out = np.zeros_like(args[i])
    for j in np.ndindex(args[i].shape):
        up, down = [a.copy() for a in args], [a.copy() for a in args]
        up[i][j] += step
        down[i][j] -= step
        out[j] = ((twin(*up) - twin(*down)) * cotangent).sum() / (2 * step)
    return out


def check(fn, twin, args, side, seed=0):
    rng = np.random.default_rng(seed)
    copies = [a.copy() for a in args]
    outputs, pullback = tt.vjp(fn, *on(side, *args))
    y = np.asarray(back(outputs, side) if np.ndim(twin(*args)) else outputs)
    cotangent = rng.standard_normal(y.shape).astype(y.dtype)
    grads = pullback(on(side, cotangent)[0] if cotangent.ndim else cotangent)
    wide = [a.astype(np.float64) for a in args]
    for i, (got, a) in enumerate(zip(grads, args, strict=True)):
        got = back(got, side)
        assert got.dtype == a.dtype and got.shape == a.shape, (got.dtype, got.shape)
        want = finite_differences(twin, wide, cotangent.astype(np.float64), i)
        rtol = RTOL[a.dtype]
        scale = np.abs(want).max()
        atol = rtol * scale + FD_ERROR  # a gradient that is 0 is noise in the reference
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol)
    for a, copy in zip(args, copies, strict=True):
        np.testing.assert_array_equal(a, copy)  # inputs are never modified


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_match_finite_differences(name, side):
    fn, twin, shapes = CASES[name]
    rng = np.random.default_rng(len(name))
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    check(fn, twin, args, side)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["layer_norm", "bias_gelu", "linear_gelu"])
def test_16_bit_gradients_are_accumulated_in_float32_and_rounded_once(name, dtype, side):
    """(A 16-bit GEMM's cotangent is rounded to its dtype before the backward GEMMs, as
    PyTorch's 16-bit autograd does: within the same tolerances.)"""
    fn, twin, shapes = CASES[name]
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(s).astype(dtype) for s in shapes]
    check(fn, twin, args, side)


@pytest.mark.sim_only(reason="the profiler, which names the kernels, exists only in the simulator")
@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
def test_16_bit_backward_gemms_read_the_transposed_operands_on_tensor_cores(dtype):
    """dx = dz @ w.T and dw = x.T @ dz read w and x in place: the tensor-core kernel's
    transposed-B and transposed-A variants, no copy of either (their gradients against float64
    are test_16_bit_gradients_are_accumulated_in_float32_and_rounded_once's)."""
    rng = np.random.default_rng(5)
    x, w, b = (rng.standard_normal(s).astype(dtype) for s in [(40, 24), (24, 32), (32,)])
    _, pullback = tt.vjp(CASES["linear_gelu"][0], *on("device", x, w, b))
    with sim.profile() as prof:
        pullback(on("device", np.ones((40, 32), dtype))[0])
    kernels = {name for name, _ in prof.traffic}
    prefix = "matmul_bf16_" if dtype == BF16 else "matmul_tc_"
    for suffix in ("_at", "_bt"):
        assert any(k.startswith(prefix) and k.endswith(suffix) for k in kernels), kernels
    gemms = [k for k in kernels if k.startswith("matmul_")]  # none on the SIMT kernel
    assert all(k.startswith(prefix) for k in gemms), kernels


@pytest.mark.sim_only(reason="the profiler, which names the kernels, exists only in the simulator")
def test_tf32_backward_gemms_read_the_transposed_operands_on_tensor_cores():
    """precision="tf32": dx = dz @ w.T and dw = x.T @ dz on the TF32 kernel's transposed
    variants, within its bound (docs/matmul.md: 2**-9 + 2**-20 + 2 (K + 2) 2**-24 times the
    product of the absolute values, K the GEMM's inner size); db a float32 column sum."""
    rng = np.random.default_rng(6)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in [(40, 24), (24, 32), (32,)])
    dz = rng.standard_normal((40, 32)).astype(np.float32)
    affine = tt.fuse(lambda x, w, b: x @ w + b, precision="tf32")
    _, pullback = tt.vjp(affine, *on("device", x, w, b))
    with sim.profile() as prof:
        dx, dw, db = (d.copy_to_host() for d in pullback(on("device", dz)[0]))
    kernels = {name for name, _ in prof.traffic}
    for suffix in ("_at", "_bt"):
        assert any(k.startswith("matmul_tf32_") and k.endswith(suffix) for k in kernels), kernels
    assert all(k.startswith("matmul_tf32_") for k in kernels if k.startswith("matmul_")), kernels
    x64, w64, dz64 = (v.astype(np.float64) for v in (x, w, dz))
    for got, want, scale, k in [
        (dx, dz64 @ w64.T, np.abs(dz64) @ np.abs(w64.T), 32),
        (dw, x64.T @ dz64, np.abs(x64.T) @ np.abs(dz64), 40),
    ]:
        bound = (2.0**-9 + 2.0**-20 + 2 * (k + 2) * 2.0**-24) * scale
        assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) / bound)
    assert np.all(np.abs(db - dz64.sum(0)) <= 40 * 2.0**-24 * np.abs(dz64).sum(0))  # 40 adds


def test_ties_and_kinks_follow_pytorch(side):
    """max shares its cotangent among the tied elements, maximum gives half to each side of a
    tie, relu and abs have derivative 0 at 0."""
    x = np.array([[1.0, 3.0, 3.0, 2.0], [0.0, -1.0, 0.0, 5.0]], np.float32)
    y = np.array([1.0, 0.0, 3.0, 2.0], np.float32)
    g = np.ones((2, 4), np.float32)

    def fn(x, y):
        return tt.max(x, axis=-1, keepdims=True) + tt.maximum(x, y) + tt.relu(x) + tt.abs(x)

    _, pullback = tt.vjp(fn, *on(side, x, y))
    dx, dy = (back(d, side) for d in pullback(on(side, g)[0]))
    top = 4 * np.array([[0, 0.5, 0.5, 0], [0, 0, 0, 1]])  # the max's cotangent: 4 per row
    wins = np.array([[0.5, 1, 0.5, 0.5], [0, 0, 0, 1]])
    kinks = np.where(x > 0, 2.0, np.where(x < 0, -1.0, 0.0))
    # max's share is a division (by the number of ties), rcp.approx under math="fast": 2**-22
    np.testing.assert_allclose(dx, top + wins + kinks, rtol=2**-22)
    np.testing.assert_array_equal(dy, (1 - wins).sum(0))


def test_arguments_without_gradients_get_none(side):
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    k = np.arange(12, dtype=np.int32).reshape(3, 4)
    mask = x > 0
    outputs, pullback = tt.vjp(
        lambda x, k, m, s: tt.where(m, x * k, x) * s, *on(side, x, k, mask), 2.0
    )
    dx, dk, dm, ds = pullback(on(side, np.ones((3, 4), np.float32))[0])
    assert dk is None and dm is None and ds is None
    np.testing.assert_array_equal(back(dx, side), np.where(mask, k, 1.0) * 2)


def test_an_argument_the_result_does_not_depend_on_gets_zeros(side):
    x = np.full((2, 3), np.nan, np.float32)  # zeros, not 0 * NaN
    _, pullback = tt.vjp(lambda x, y: y * 2, *on(side, x, np.ones((2, 3), np.float32)))
    dx, dy = (back(d, side) for d in pullback(on(side, np.ones((2, 3), np.float32))[0]))
    np.testing.assert_array_equal(dx, np.zeros((2, 3)))
    np.testing.assert_array_equal(dy, np.full((2, 3), 2.0))


def test_grad_of_a_scalar_loss(side):
    rng = np.random.default_rng(4)
    x, w, t = (rng.standard_normal(s).astype(np.float32) for s in ((8, 6), (6, 3), (8, 3)))

    def loss(x, w, t):
        return tt.mean(tt.square(x @ w - t))

    dw = back(tt.grad(loss, argnums=1)(*on(side, x, w, t)), side)
    want = 2 * x.astype(np.float64).T @ (x @ w - t) / t.size
    np.testing.assert_allclose(dw, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    dx, dt = back(tt.grad(loss, argnums=(0, 2))(*on(side, x, w, t)), side)
    np.testing.assert_allclose(dt, -2 * (x @ w - t) / t.size, rtol=1e-4, atol=1e-6)
    assert dx.shape == x.shape
    with pytest.raises(TypeError, match="shape"):
        tt.grad(lambda x: x * 2)(*on(side, x))


def test_bad_cotangents_and_argnums_are_refused_before_any_launch(side):
    from tessera_tile import ops

    x = np.ones((4, 24), np.float32)
    pullbacks = [tt.vjp(tt.exp, *on(side, x))[1], tt.vjp(ops.softmax, *on(side, x))[1]]
    with counting_launches() as counted:
        for pullback in pullbacks:
            with pytest.raises(ValueError, match=r"cotangent 0 has shape \(24,\)"):
                pullback(on(side, np.ones(24, np.float32))[0])  # would broadcast
            with pytest.raises(TypeError, match="cotangent 0 has dtype int32"):
                pullback(on(side, np.ones((4, 24), np.int32))[0])
        with pytest.raises(TypeError, match="argnums"):
            tt.grad(tt.sum, argnums=[0])
        with pytest.raises(ValueError, match="out of range"):
            tt.grad(tt.sum, argnums=1)(*on(side, x))
    assert counted.launches == 0


def test_a_device_pullback_copies_nothing_through_the_host():
    x, w = on("device", *(np.ones(s, np.float32) for s in ((4, 24), (24,))))
    y, pullback = tt.vjp(CASES["layer_norm"][0], x, w, w)
    pullback(y)  # compile outside the count
    with sim.transfers() as counts:
        pullback(y)
    assert counts["to_device"] == 0 and counts["copy_to_host"] == 0, counts


def test_nan_and_infinities_give_pytorchs_gradients(side):
    """exp, sqrt, abs and relu at NaN, +-inf, 0 and 1, with a cotangent of 1: PyTorch's values
    (abs: sgn(NaN) = NaN; relu: 0 where x <= 0, so NaN passes the cotangent)."""
    x = np.array([np.nan, np.inf, -np.inf, 0.0, 1.0], np.float32)
    wants = {
        "exp": (tt.exp, [np.nan, np.inf, 0.0, 1.0, np.e]),
        "sqrt": (tt.sqrt, [np.nan, 0.0, np.nan, np.inf, 0.5]),
        "abs": (tt.abs, [np.nan, 1.0, -1.0, 0.0, 1.0]),
        "relu": (tt.relu, [1.0, 1.0, 0.0, 0.0, 1.0]),
    }
    for name, (fn, want) in wants.items():
        _, pullback = tt.vjp(fn, *on(side, x))
        with np.errstate(invalid="ignore"):
            (dx,) = pullback(on(side, np.ones(5, np.float32))[0])
        np.testing.assert_allclose(back(dx, side), want, rtol=1e-6, err_msg=name)


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float16, BF16], ids=["float32", "float16", "bfloat16"]
)
def test_magnitudes_across_the_dtype_range(dtype):
    """A weighted row sum at magnitudes from near the smallest normal to near the largest finite
    value of the dtype: dx = dy * w and dw = sum(dy * x), each one rounding from float32."""
    info = ml_dtypes.finfo(dtype)
    exponents = np.linspace(np.log2(float(info.tiny)) + 2, np.log2(float(info.max)) - 4, 8)
    x = (2.0**exponents).reshape(2, 4).astype(dtype)
    w = (2.0 ** -exponents[:4] * 3).astype(dtype)  # x * w stays finite
    dy = np.array([0.5, -2.0], dtype)
    _, pullback = tt.vjp(lambda x, w: tt.sum(x * w, axis=-1), x, w)
    dx, dw = pullback(dy)
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    np.testing.assert_allclose(
        dx.astype(np.float64), dy64[:, None] * w64, rtol=RTOL[np.dtype(dtype)]
    )
    np.testing.assert_allclose(dw.astype(np.float64), (dy64[:, None] * x64).sum(0),
                               rtol=RTOL[np.dtype(dtype)])  # fmt: skip


def test_what_is_not_differentiated_says_so():
    """A reduction without keepdims over trailing axes, used inside the function: its cotangent
    cannot be broadcast back (the IR has no reshape); prod has no rule yet."""
    x = np.ones((2, 8), np.float32)
    inner = tt.vjp(lambda x, b: tt.sum(x, axis=-1) + b, x, np.ones(2, np.float32))[1]
    with pytest.raises(NotImplementedError, match="keepdims=True"):
        inner(np.ones(2, np.float32))
    prod = tt.vjp(lambda x: tt.prod(x, axis=-1, keepdims=True), x)[1]
    with pytest.raises(NotImplementedError, match="no gradient for prod"):
        prod(np.ones((2, 1), np.float32))
    two = tt.vjp(lambda x: (x * 2, x + 1), x)[1]
    with pytest.raises(ValueError, match="2 cotangent"):
        two((x,))


def test_the_pullback_is_a_fused_function_and_explains_itself():
    x, w = np.zeros((16, 64), np.float32), np.zeros(64, np.float32)
    y, pullback = tt.vjp(layer_norm, x, w, w)
    report = pullback.explain(y)
    # dx by rows; dw and db summed over the rows by one column kernel, in fewer bytes than a
    # kernel per op
    assert report.kernels == len(report.stages) and report.bytes_fused < report.bytes_unfused
    assert "2 output(s)" in [s for s in report.stages if "column" in s][0], report
    assert report.reasons[0].startswith("the backward recomputes the forward values")


def test_any_cuda_array_interface_object_is_taken():
    """Arguments and cotangents that are nothing but ``__cuda_array_interface__`` (CuPy's
    kind): the gradients are those of the same call on device arrays, a reduced result's
    cotangent included (viewed with its axes put back, never copied)."""
    rng = np.random.default_rng(6)
    x, w = (
        rng.standard_normal((4, 24)).astype(np.float32),
        rng.standard_normal(24).astype(np.float32),
    )
    g = rng.standard_normal(4).astype(np.float32)
    fn = CASES["row_sum_result"][0]
    want = [d.copy_to_host() for d in tt.vjp(fn, *on("device", x, w))[1](on("device", g)[0])]
    wrapped = (Interface(a) for a in on("device", x, w))
    _, pullback = tt.vjp(fn, *wrapped)
    got = pullback(Interface(on("device", g)[0]))
    for d, ref in zip(got, want, strict=True):
        np.testing.assert_array_equal(back(d, "device"), ref)


def test_reduced_cotangents_are_broadcast_back():
    """A full or leading-axis reduction's cotangent is broadcast back before a matmul takes it
    and where an argument's gradient is returned."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    w = np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2)
    dx, dw = tt.grad(lambda x, w: tt.sum(x @ w), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(dx, np.ones((3, 2)) @ w.T, rtol=1e-6)
    np.testing.assert_allclose(dw, x.T @ np.ones((3, 2)), rtol=1e-6)
    dx = tt.grad(lambda x: tt.sum(tt.sum(x, axis=0) * 2))(x)
    np.testing.assert_array_equal(dx, np.full((3, 4), 2.0))


OPS = {  # op name: (arguments' shapes, float64 NumPy twin)
    "softmax": ([(4, 24)], lambda x: softmax(x, np)),
    "log_softmax": ([(4, 24)], lambda x: np.log(softmax(x, np))),
    "layer_norm": ([(4, 24), (24,), (24,)], lambda x, w, b: layer_norm(x, w, b, np)),
    "rms_norm": (
        [(4, 24), (24,)],
        lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w,
    ),
    "sum": ([(4, 24)], lambda x: x.sum()),
    "transpose": ([(5, 7)], lambda x: x.T),
    "matmul": ([(2, 6, 8), (8, 5)], lambda a, b: a @ b),  # b broadcast over the batch
    "linear": (
        [(6, 8), (8, 5), (5,)],
        lambda x, w, b: 0.5 * (x @ w + b) * (1 + erf((x @ w + b) / np.sqrt(2))),
    ),  # (activation "gelu", passed below)
    "mlp": (
        [(6, 8), (8, 12), (12,), (12, 4), (4,)],
        lambda x, w1, b1, w2, b2: (
            (0.5 * (x @ w1 + b1) * (1 + erf((x @ w1 + b1) / np.sqrt(2)))) @ w2 + b2
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_prebuilt_ops_that_run_a_fused_definition_are_differentiated(name, side):
    from tessera_tile import ops

    shapes, twin = OPS[name]
    rng = np.random.default_rng(7)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    op = getattr(ops, name)
    if name == "linear":
        op = functools.partial(ops.linear, activation="gelu")
        op.vjp = lambda *a: ops.linear.vjp(*a, activation="gelu")
    check(op, twin, args, side)


def test_prebuilt_ops_on_hand_written_kernels_say_they_have_no_gradient_yet():
    from tessera_tile import ops

    q = np.ones((2, 16, 16), np.float32)
    with pytest.raises(NotImplementedError, match="ops.attention runs a hand-written kernel"):
        tt.vjp(ops.attention, q, q, q)


@pytest.mark.parametrize("columns", [512, 1024])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_backward_is_one_row_kernel_reading_y_and_dy_once(name, columns, side):
    """ops.softmax and ops.log_softmax have a backward of their own, from the result: dx from
    y and dy in one row kernel, y and dy read once and dx written once: a warp per row while
    the values a row keeps fit a lane's 32 registers (softmax keeps y and dy, to 512 float32),
    a block per row past that."""
    from tessera_tile import ops

    x = np.random.default_rng(8).standard_normal((8, columns)).astype(np.float32)
    y, pullback = tt.vjp(getattr(ops, name), *on(side, x))
    report = pullback.explain(y)
    assert report.kernels == 1 and report.bytes_fused == 3 * x.nbytes, report
    assert "kept on chip" in report.stages[0]


@pytest.mark.sim_only(reason="the profiler measures traffic in the simulator only")
@pytest.mark.parametrize("columns", [512, 1024])
def test_softmax_backward_moves_what_it_plans(columns):
    """The traffic measured is the plan's, and dx = y * (dy - sum(dy * y)) against float64
    (float32's tolerance, RTOL, relative to the largest element)."""
    from tessera_tile import ops

    rng = np.random.default_rng(9)
    x, g = (rng.standard_normal((8, columns)).astype(np.float32) for _ in range(2))
    y, pullback = tt.vjp(ops.softmax, *on("device", x))
    dy = on("device", g)[0]
    with tt.sim.profile() as prof:
        (dx,) = pullback(dy)
    assert prof.bytes_read + prof.bytes_written == 3 * x.nbytes
    p = np.exp(x - x.max(-1, keepdims=True).astype(np.float64))
    p /= p.sum(-1, keepdims=True)
    want = p * (g - (g * p).sum(-1, keepdims=True))
    rtol = RTOL[np.dtype(np.float32)]
    np.testing.assert_allclose(back(dx, "device"), want, rtol=rtol, atol=rtol * abs(want).max())


# fused functions drawn by hypothesis: expression trees over two arguments, (3, 5) and (5,)
# (broadcast), of elementwise ops, broadcasting and keepdims reductions; each with its NumPy
# twin, differentiated in float64 against central differences
UNARY = {
    "tanh": (tt.tanh, np.tanh),
    "sin": (tt.sin, np.sin),
    "sigmoid": (tt.sigmoid, sigmoid),
    "square": (tt.square, np.square),
    "exp_half": (lambda v: tt.exp(v * 0.5), lambda v: np.exp(v * 0.5)),
    "row_sum": (
        lambda v: tt.sum(v, axis=-1, keepdims=True),
        lambda v: np.sum(v, axis=-1, keepdims=True),
    ),
    "column_mean": (
        lambda v: tt.mean(v, axis=0, keepdims=True),
        lambda v: np.mean(v, axis=0, keepdims=True),
    ),
}
BINARY = {
    "add": (lambda a, b: a + b,) * 2,
    "sub": (lambda a, b: a - b,) * 2,
    "mul": (lambda a, b: a * b,) * 2,
    "max": (tt.maximum, np.maximum),
}


def evaluate(expr, x, w, twin: bool):
    if isinstance(expr, str):
        return {"x": x, "w": w}[expr]
    name, *args = expr
    values = [evaluate(a, x, w, twin) for a in args]
    table = UNARY if len(values) == 1 else BINARY
    return table[name][1 if twin else 0](*values)


def test_drawn_fused_functions_match_finite_differences():
    from hypothesis import example, given

    @given(expression_trees(["x", "w"], UNARY, BINARY, max_leaves=5))
    @example(("add", "w", ("sub", "x", "w")))  # w's gradient is 0: the reference is noise
    def check_drawn(expr):
        rng = np.random.default_rng(len(str(expr)))
        x, w = rng.standard_normal((3, 5)), rng.standard_normal(5)

        def fn(x, w):
            return evaluate(expr, x, w, False) + 0 * x  # a (3, 5) result, whatever expr is

        def twin(x, w):
            return evaluate(expr, x, w, True) + 0 * x

        check(fn, twin, [x, w], "host")
        drawn.append(expr)

    drawn = []
    check_drawn()
    assert len(drawn) >= 10 and any(isinstance(e, tuple) and len(e) == 3 for e in drawn), drawn
