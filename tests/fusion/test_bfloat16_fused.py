"""bfloat16 in fused functions (issue 22): computed in float32, rounded once to bfloat16 on
store; promotion as JAX's; against float64 NumPy rounded to bfloat16, on host and device
arrays, views, NaN and infinities, and values near bfloat16's range, past float16's.

Tolerance: a result computed in float32 and rounded once differs from the float64 reference
rounded to bfloat16 by at most one bfloat16 ulp (8 significant bits: 2^-7 relative), when the
float32 value and the exact one round to neighbours; NaN where the reference is NaN."""

import ml_dtypes
import numpy as np
import pytest
from helpers import SIDES, Interface, back, on, transposed
from hypothesis import given, settings
from hypothesis import strategies as st

import tessera_tile as tt

BF16 = np.dtype(ml_dtypes.bfloat16)
ONE_ULP = dict(rtol=2**-7, atol=2**-133)  # 2^-133: bfloat16's smallest subnormal


def rounded(reference: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(reference, np.float64).astype(BF16)


def check(got, reference):
    assert got.dtype == BF16, got.dtype
    want = rounded(reference).astype(np.float64)
    got = got.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, **ONE_ULP)


def bf16_arrays(shape):
    """Magnitudes across bfloat16's range (1e-30 to 3e38), zeros, and NaN and infinities."""
    scale = st.sampled_from([1e-30, 1.0, 1e4, 1e30, 3e38])
    special = st.sampled_from([0.0, -0.0, np.inf, -np.inf, np.nan])

    @st.composite
    def draw(draw_):
        rng = np.random.default_rng(draw_(st.integers(0, 2**16)))
        x = rng.standard_normal(shape) * draw_(scale)
        for _ in range(draw_(st.integers(0, 3))):
            x.flat[draw_(st.integers(0, x.size - 1))] = draw_(special)
        with np.errstate(over="ignore"):
            return x.astype(BF16)

    return draw()


ELEMENTWISE = {
    "affine": (lambda a, b: a * 0.5 + b, lambda a, b: a * 0.5 + b),
    "exp": (lambda a, b: tt.exp(a / 1e30), lambda a, b: np.exp(a / 1e30)),
    "tanh_of_difference": (lambda a, b: tt.tanh(a - b), lambda a, b: np.tanh(a - b)),
    "maximum_where": (
        lambda a, b: tt.where(a > b, tt.maximum(a, b), -b),
        lambda a, b: np.where(a > b, np.maximum(a, b), -b),
    ),
    "sqrt_abs": (lambda a, b: tt.sqrt(tt.abs(a)), lambda a, b: np.sqrt(np.abs(a))),
}


@settings(max_examples=30)
@given(bf16_arrays((3, 37)), bf16_arrays((3, 37)), st.sampled_from(sorted(ELEMENTWISE)))
def test_elementwise_functions_round_once(a, b, name):
    fn, ref = ELEMENTWISE[name]
    with np.errstate(all="ignore"):
        want = ref(a.astype(np.float64), b.astype(np.float64))
    for side in SIDES:
        check(back(tt.fuse(fn)(*on(side, a, b)), side), want)


@pytest.mark.parametrize("side", SIDES)
def test_views_and_values_past_float16s_range(side):
    rng = np.random.default_rng(1)
    base = (rng.standard_normal((6, 40)) * 1e38).astype(BF16)
    (placed,) = on(side, base)
    f = tt.fuse(lambda x: x * 0.25 + 1e37)
    for view, host in ((placed[:, ::2], base[:, ::2]), (transposed(placed), base.T)):
        check(back(f(view), side), host.astype(np.float64) * 0.25 + 1e37)


@pytest.mark.parametrize("side", SIDES)
def test_reductions_accumulate_in_float32(side):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((5, 300)) * 1e20).astype(BF16)
    xs = x.astype(np.float64)
    (placed,) = on(side, x)
    check(back(tt.fuse(lambda v: tt.sum(v, axis=1))(placed), side), xs.sum(1))
    check(back(tt.fuse(lambda v: tt.mean(v, axis=0))(placed), side), xs.mean(0))
    check(back(tt.fuse(lambda v: tt.max(v, axis=1))(placed), side), xs.max(1))
    e = np.exp(xs / 1e20 - (xs / 1e20).max(1, keepdims=True))

    def softmax(v):
        e = tt.exp(v / 1e20 - tt.max(v / 1e20, axis=1, keepdims=True))
        return e / tt.sum(e, axis=1, keepdims=True)

    check(back(tt.fuse(softmax)(placed), side), e / e.sum(1, keepdims=True))


PROMOTIONS = [  # (other operand, result dtype): JAX's rules for bfloat16
    (np.ones(4, np.float16), np.float32),
    (np.ones(4, np.float32), np.float32),
    (np.ones(4, np.float64), np.float64),
    (np.ones(4, np.int32), BF16),
    (np.ones(4, np.int64), BF16),
    (np.ones(4, bool), BF16),
    (2.5, BF16),  # a Python scalar is weak
    (3, BF16),
    (np.float32(2.5), np.float32),  # a NumPy scalar is not
]


@pytest.mark.parametrize(("other", "dtype"), PROMOTIONS, ids=lambda v: getattr(v, "dtype", v))
def test_promotion_follows_jax(other, dtype):
    x = np.array([1.5, -2.0, 3e38, 0.0], BF16)
    got = tt.fuse(lambda a, b: a + b)(x, other)
    assert got.dtype == np.dtype(dtype)
    want = x.astype(np.float64) + np.asarray(other, np.float64)
    with np.errstate(over="ignore"):
        want = want.astype(np.dtype(dtype))
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def test_an_explicit_cast_rounds_where_it_is():
    x = np.array([1.0, 3.0, 1e38], BF16)
    f = tt.fuse(lambda a: tt.astype(a / 3, np.float32) * 3)
    want = (x.astype(np.float64) / 3).astype(BF16).astype(np.float32) * 3
    np.testing.assert_array_equal(f(x), want)


def test_explain_takes_bfloat16_stand_ins():
    ex = tt.fuse(lambda a: tt.exp(a) * 2).explain(np.zeros((64, 128), BF16))
    assert ex.kernels == 1 and ex.bytes_fused == 2 * 64 * 128 * 2
    assert "bf16_to_f32" in ex.source and "f32_to_bf16" in ex.source


def test_interface_objects_of_bfloat16_are_read_by_their_typestr():
    """CuPy and PyTorch describe bfloat16 in __cuda_array_interface__ with ml_dtypes'
    typestr "<V2"; the result is a numba device array of bfloat16."""
    x = (np.random.default_rng(3).standard_normal((3, 20)) * 100).astype(BF16)
    d = tt.to_device(x)

    assert Interface(d).__cuda_array_interface__["typestr"] == "<V2"
    got = tt.fuse(lambda a: a * 2 - 1)(Interface(d))
    assert getattr(got, "__cuda_ndarray__", False)
    check(got.copy_to_host(), x.astype(np.float64) * 2 - 1)


@pytest.mark.sim_only(reason="the profiler measures traffic in the simulator only")
def test_row_ops_move_what_float16_moves():
    from tessera_tile import ops, sim

    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 300))
    w, b = rng.standard_normal(300), rng.standard_normal(300)
    t = rng.integers(0, 300, 6)
    moved = {}
    for dtype in (np.float16, BF16):
        xs, ws, bs = (a.astype(dtype) for a in (x, w, b))
        calls = {
            "softmax": lambda: ops.softmax(xs),  # noqa: B023
            "layer_norm": lambda: ops.layer_norm(xs, ws, bs),  # noqa: B023
            "cross_entropy": lambda: ops.cross_entropy(xs, t, reduction="none"),  # noqa: B023
            "sum": lambda: ops.sum(xs, axis=1),  # noqa: B023
        }
        for name, call in calls.items():
            with sim.profile() as prof:
                call()
            moved[name, np.dtype(dtype).name] = prof.bytes_read + prof.bytes_written
    for name in ("softmax", "layer_norm", "cross_entropy", "sum"):
        assert moved[name, "bfloat16"] == moved[name, "float16"] > 0, name


def test_every_elementwise_function_on_bfloat16():
    """Every unary tt.* function: bfloat16 in, bfloat16 (or bool) out, within one ulp of the
    float64 result rounded to bfloat16 (NaN where it is NaN)."""
    from math import erf

    from tessera_tile.kernels import epilogue

    x = np.linspace(-3, 3, 37).astype(BF16)
    x[5], x[6], x[7] = np.nan, np.inf, -np.inf
    cases = {
        "exp": (tt.exp, np.exp), "exp2": (tt.exp2, np.exp2), "log": (tt.log, np.log),
        "log2": (tt.log2, np.log2), "log1p": (tt.log1p, np.log1p),
        "expm1": (tt.expm1, np.expm1), "sqrt": (tt.sqrt, np.sqrt),
        "rsqrt": (tt.rsqrt, lambda v: 1 / np.sqrt(v)), "sin": (tt.sin, np.sin),
        "cos": (tt.cos, np.cos), "tanh": (tt.tanh, np.tanh),
        "erf": (tt.erf, np.vectorize(erf)), "sigmoid": (tt.sigmoid, lambda v: 1 / (1 + np.exp(-v))),
        "floor": (tt.floor, np.floor), "ceil": (tt.ceil, np.ceil),
        "square": (tt.square, np.square), "abs": (tt.abs, np.abs),
        "clip": (lambda v: tt.clip(v, -1, 0.5), lambda v: np.clip(v, -1, 0.5)),
        **{
            name: (getattr(tt, name), lambda v, name=name: epilogue.reference(name, v))
            for name in ("relu", "gelu", "silu")
        },
    }  # fmt: skip
    for name, (ours, theirs) in cases.items():
        with np.errstate(all="ignore"):
            want = np.asarray(theirs(x.astype(np.float64)), np.float64)
        got = tt.fuse(ours)(x)
        assert got.dtype == BF16, name
        try:
            check(got, want)
        except AssertionError as e:
            raise AssertionError(name) from e
    for name, ours, theirs in (("isnan", tt.isnan, np.isnan), ("isinf", tt.isinf, np.isinf)):
        np.testing.assert_array_equal(tt.fuse(ours)(x), theirs(x.astype(np.float64)), name)
