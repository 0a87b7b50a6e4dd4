"""Prebuilt softmax, log-softmax, layer norm and RMS norm against float64 NumPy references.

Tolerances per dtype (output compared to the float64 reference of the same inputs):
float16 rtol 2e-3 / atol 1e-3 (float16 is computed in float32 and rounded once, 2**-11
relative, after a few float32 roundings); float32 rtol 2e-5 / atol 1e-6; float64 rtol 1e-12 /
atol 1e-14. The norms use atol 4x larger (outputs are O(3) and go through a reciprocal square
root). Inputs reach magnitude 1,000 (float16 squares overflow from 256 on), and NaN and
infinities anywhere in a row give NumPy's result: NaN where NumPy's is NaN.
"""

import ml_dtypes
import numpy as np
import pytest
from helpers import back, counting_launches, on, transposed
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_tile import ops, sim

# bfloat16 keeps 8 significant bits: a result rounded once is within 2^-8 of the exact value,
# relatively; rtol 2^-7 allows that and the float32 computation's own error beside it (a few
# 2^-24), and atol 2^-7 (one bfloat16 ulp at 1) the cancellation near 0, as float16's 1e-3 does
# for its 11 bits.
TOL = {
    np.float16: dict(rtol=2e-3, atol=1e-3),
    ml_dtypes.bfloat16: dict(rtol=2**-7, atol=2**-7),
    np.float32: dict(rtol=2e-5, atol=1e-6),
    np.float64: dict(rtol=1e-12, atol=1e-14),
}
NORM_TOL = {d: dict(rtol=t["rtol"], atol=4 * t["atol"]) for d, t in TOL.items()}
DTYPES = list(TOL)


@np.errstate(invalid="ignore")  # inf - inf is NaN, as the ops give
def softmax_ref(x, axis=-1):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


@np.errstate(invalid="ignore", divide="ignore")
def log_softmax_ref(x, axis=-1):
    x = x.astype(np.float64)
    d = x - x.max(axis, keepdims=True)
    return d - np.log(np.exp(d).sum(axis, keepdims=True))


@np.errstate(invalid="ignore")
def layer_norm_ref(x, w=None, b=None, eps=1e-5):
    x = x.astype(np.float64)
    y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
    y = y if w is None else y * w.astype(np.float64)
    return y if b is None else y + b.astype(np.float64)


@np.errstate(invalid="ignore")
def rms_norm_ref(x, w=None, eps=1e-6):
    x = x.astype(np.float64)
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y if w is None else y * w.astype(np.float64)


ROW_OPS = {
    "softmax": (ops.softmax, softmax_ref, TOL),
    "log_softmax": (ops.log_softmax, log_softmax_ref, TOL),
    "layer_norm": (ops.layer_norm, layer_norm_ref, NORM_TOL),
    "rms_norm": (ops.rms_norm, rms_norm_ref, NORM_TOL),
}


@st.composite
def cases(draw, ndim=(1, 3)):
    """A :class:`View`: shapes straddling the warp (31, 32, 33) and small ones, row length 1,
    float16/32/64, magnitudes up to about 1,000 (250 standard deviations: float16 squares
    overflow from 256 on), sometimes a non-contiguous view (every other column, or
    transposed)."""
    dtype = draw(st.sampled_from(DTYPES))
    nd = draw(st.integers(*ndim))
    shape = [draw(st.sampled_from([1, 2, 3, 5])) for _ in range(nd - 1)]
    shape.append(draw(st.sampled_from([1, 7, 31, 32, 33, 65])))
    seed = draw(st.integers(0, 2**16))
    scale = draw(st.sampled_from([1.0, 8.0, 250.0]))
    rng = np.random.default_rng(seed)
    view = draw(st.sampled_from(["contiguous", "strided", "transposed"]))
    if view == "strided":
        base = (rng.standard_normal((*shape[:-1], 2 * shape[-1])) * scale).astype(dtype)
    elif view == "transposed" and nd >= 2:
        base = (rng.standard_normal(shape[::-1]) * scale).astype(dtype)
    else:
        base, view = (rng.standard_normal(shape) * scale).astype(dtype), "contiguous"
    return View(base, view, draw(st.sampled_from(["host", "device"])))


class View:
    """A test input: a contiguous base, the view of it the op gets, and the caller's side
    (device views are taken of the device copy: numba cannot copy a strided view)."""

    def __init__(self, base, how, side):
        self.base, self.how, self.side = base, how, side
        self.x = self.of(base)

    def of(self, a):
        # numba's device arrays take no Ellipsis: the index is spelled out
        every_other = (slice(None),) * (a.ndim - 1) + (slice(None, None, 2),)
        return {"contiguous": a, "strided": a[every_other], "transposed": transposed(a)}[self.how]

    def placed(self):
        return self.of(on(self.side, self.base)[0])


def run(op, case, *params, **kwargs):
    """``op`` on the case's view and ``params``, on the case's side, as NumPy."""
    before = [a.copy() for a in (case.base, *params)]
    got = back(op(case.placed(), *on(case.side, *params), **kwargs), case.side)
    for a, b in zip((case.base, *params), before, strict=True):
        np.testing.assert_array_equal(a, b)  # inputs are never modified
    return got


@given(cases(), st.data())
def test_softmax_and_log_softmax_match_numpy(case, data):
    x = case.x
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    for op, ref in ((ops.softmax, softmax_ref), (ops.log_softmax, log_softmax_ref)):
        got = run(op, case, axis=axis)
        assert got.dtype == x.dtype and got.shape == x.shape
        np.testing.assert_allclose(got, ref(x, axis), **TOL[x.dtype.type])


@given(cases(ndim=(1, 2)), st.booleans(), st.booleans())
def test_layer_norm_matches_numpy(case, with_w, with_b):
    x = case.x
    rng = np.random.default_rng(x.shape[-1])
    w = rng.standard_normal(x.shape[-1]).astype(x.dtype) if with_w else None
    b = rng.standard_normal(x.shape[-1]).astype(x.dtype) if with_b else None
    params = [p for p in (w, b) if p is not None]
    if with_b and not with_w:
        got = run(lambda x, b: ops.layer_norm(x, bias=b), case, b)
    else:
        got = run(ops.layer_norm, case, *params)
    assert got.dtype == x.dtype and got.shape == x.shape
    np.testing.assert_allclose(got, layer_norm_ref(x, w, b), **NORM_TOL[x.dtype.type])


@given(cases(ndim=(1, 2)), st.booleans())
def test_rms_norm_matches_numpy(case, with_w):
    x = case.x
    w = np.linspace(-2, 2, x.shape[-1]).astype(x.dtype) if with_w else None
    got = run(ops.rms_norm, case, *([w] if with_w else []), eps=1e-5)
    assert got.dtype == x.dtype and got.shape == x.shape
    np.testing.assert_allclose(got, rms_norm_ref(x, w, eps=1e-5), **NORM_TOL[x.dtype.type])


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_of_large_magnitude_inputs_does_not_overflow(dtype, side):
    x = (np.random.default_rng(1).standard_normal((4, 33)) * 1e4).astype(dtype)
    x[0, :] = 1e4  # a row of equal large values: exactly uniform
    for op, ref in ((ops.softmax, softmax_ref), (ops.log_softmax, log_softmax_ref)):
        got = run(op, View(x, "contiguous", side))
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, ref(x), **TOL[np.dtype(dtype).type])
    np.testing.assert_allclose(back(ops.softmax(*on(side, x)), side)[0], 1 / 33, rtol=1e-3)


def test_nan_propagates_as_in_numpy():
    x = np.ones((3, 8), np.float32)
    x[1, 2] = np.nan
    for op, ref in (
        (ops.softmax, softmax_ref),
        (ops.log_softmax, log_softmax_ref),
        (ops.layer_norm, layer_norm_ref),
        (ops.rms_norm, rms_norm_ref),
    ):
        got = op(x)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref(x)))
        assert np.isnan(got[1]).all() and not np.isnan(got[0]).any()


def test_size_zero_follows_numpy():
    rows = np.zeros((0, 5), np.float32)
    for op in (ops.softmax, ops.log_softmax, ops.layer_norm, ops.rms_norm):
        assert op(rows).shape == (0, 5)
    empty_rows = np.zeros((3, 0), np.float32)
    assert ops.layer_norm(empty_rows).shape == (3, 0)
    assert ops.rms_norm(empty_rows).shape == (3, 0)
    with pytest.raises(ValueError, match="zero-size"):  # NumPy's error: max of nothing
        ops.softmax(empty_rows)


def test_out_and_stream(side):
    from numba import cuda

    x = np.random.default_rng(2).standard_normal((5, 40)).astype(np.float32)
    (xs,) = on(side, x)
    out = np.empty_like(x) if side == "host" else cuda.device_array_like(x)
    result = ops.softmax(xs, out=out, stream=cuda.stream())
    assert result is out
    np.testing.assert_allclose(back(out, side), softmax_ref(x), **TOL[np.float32])
    w = np.ones(40, np.float32)
    result = ops.rms_norm(xs, *on(side, w), out=out, stream=0)
    np.testing.assert_allclose(back(result, side), rms_norm_ref(x), **NORM_TOL[np.float32])


x32 = np.ones((4, 8), np.float32)
BAD = [
    (lambda: ops.softmax(np.ones((4, 8), np.int32)), TypeError, "x has dtype int32"),
    (lambda: ops.softmax(x32, axis=2), ValueError, "axis 2"),
    (lambda: ops.log_softmax(x32, axis=1.0), TypeError, "axis"),
    (lambda: ops.softmax(np.float32(1)), TypeError, "x"),
    (lambda: ops.softmax(x32.astype(np.complex64)), TypeError, "x has dtype complex64"),
    (lambda: ops.layer_norm(x32, np.ones(7, np.float32)), ValueError, "weight has shape"),
    (lambda: ops.layer_norm(x32, None, np.ones(8, np.float64)), TypeError, "bias has dtype"),
    (lambda: ops.layer_norm(x32, eps=-1.0), ValueError, "eps"),
    (lambda: ops.rms_norm(x32, np.ones((1, 8), np.float32)), ValueError, "weight"),
    (lambda: ops.rms_norm(np.ones(3, bool)), TypeError, "x has dtype bool"),
    (lambda: ops.softmax(x32, out=np.empty((4, 7), np.float32)), ValueError, "out"),
    (lambda: ops.softmax(x32, out=np.empty((4, 8), np.int32)), TypeError, "Cannot cast.* out"),
    (lambda: ops.softmax(x32, out=x32), ValueError, "out.*overlaps"),
    (lambda: ops.softmax(x32, stream="s"), TypeError, "stream"),
]


@pytest.mark.parametrize("call, error, words", BAD)
def test_bad_input_raises_naming_the_argument_before_any_launch(call, error, words):
    with counting_launches() as counted, pytest.raises(error, match=words):
        call()
    assert counted.launches == 0


def test_the_launch_counter_sees_a_valid_call():
    # the control of the test above: the same counter counts this family's fused launch
    with counting_launches() as counted:
        ops.softmax(x32)
    assert counted.launches == ops.softmax.explain(x32).kernels == 1


def test_host_weight_with_device_x_is_refused():
    from numba import cuda

    with pytest.raises(TypeError, match="weight"):
        ops.rms_norm(cuda.to_device(x32), np.ones(8, np.float32))


def test_explain_and_signature():
    import inspect

    assert str(inspect.signature(ops.softmax)) == "(x, axis=-1, *, out=None, stream=None)"
    assert str(inspect.signature(ops.layer_norm)).startswith("(x, weight=None, bias=None, eps=")
    x = np.ones((16, 512), np.float32)
    for op in (ops.softmax, ops.log_softmax, ops.layer_norm, ops.rms_norm):
        ex = op.explain(x)
        assert ex.kernels == 1 and ex.bytes_fused == 2 * x.nbytes < ex.bytes_unfused
        assert "@cuda.jit" in ex.source or "cuda.jit" in ex.source


def test_each_argument_is_read_once(monkeypatch, side):
    """ops hands its records to the fused call: no argument of the user is read twice."""
    from tessera_tile._runtime import arrays as _arrays

    reads = []
    real_read = _arrays.read

    def counting_read(value, name, **kw):
        reads.append(id(value))
        return real_read(value, name, **kw)

    monkeypatch.setattr(_arrays, "read", counting_read)
    args = on(side, *(np.ones(s, np.float32) for s in ((4, 8), (8,), (8,))))
    ops.layer_norm(*args)
    assert [reads.count(id(a)) for a in args] == [1, 1, 1]


# Rows longer than the composer keeps on chip (16,384 float32 or float16, 8,192 float64): the
# hand-written Welford kernel, x read twice. (shape, dtype, weight, bias)
LONG_ROWS = [
    ((2, 16385), np.float32, True, True),  # rows after the first not 16-byte aligned
    ((1, 16392), np.float32, True, False),
    ((2, 1, 8193), np.float64, False, True),  # leading axes merged into rows
    ((1, 16392), np.float16, True, True),
]


def long_rows_case(shape, dtype, with_w, with_b, side):
    """(x, weight, bias) in NumPy, the caller's x and keyword arguments on ``side``, and the
    minimum traffic: x read twice, y written once, the parameters read once per row."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(shape) * 3 + 2).astype(dtype)
    w = rng.standard_normal(shape[-1]).astype(dtype) if with_w else None
    b = rng.standard_normal(shape[-1]).astype(dtype) if with_b else None
    named = {n: p for n, p in (("weight", w), ("bias", b)) if p is not None}
    xs, *ps = on(side, x, *named.values())
    rows = x.size // shape[-1]
    minimum = 3 * x.nbytes + rows * sum(p.nbytes for p in named.values())
    return (x, w, b), xs, dict(zip(named, ps, strict=True)), minimum


@pytest.mark.parametrize("shape, dtype, with_w, with_b", LONG_ROWS)
def test_layer_norm_of_long_rows_matches_numpy(shape, dtype, with_w, with_b, side):
    (x, w, b), xs, kwargs, minimum = long_rows_case(shape, dtype, with_w, with_b, side)
    ex = ops.layer_norm.explain(xs, **kwargs)
    got = back(ops.layer_norm(xs, **kwargs), side)
    np.testing.assert_allclose(got, layer_norm_ref(x, w, b), **NORM_TOL[dtype])
    assert ex.kernels == 1 and "hand-written" in ex.stages[0]
    assert ex.bytes_fused == minimum


@pytest.mark.sim_only(reason="measures global traffic and bank conflicts with the simulator")
@pytest.mark.parametrize("shape, dtype, with_w, with_b", LONG_ROWS)
def test_layer_norm_of_long_rows_reads_x_twice(shape, dtype, with_w, with_b, side):
    _, xs, kwargs, minimum = long_rows_case(shape, dtype, with_w, with_b, side)
    with sim.profile() as prof:
        ops.layer_norm(xs, **kwargs)
    assert prof.bytes_read + prof.bytes_written == minimum
    assert prof.bank_conflicts == 0


def test_layer_norm_picks_the_hand_written_kernel_only_past_the_on_chip_row():
    cases = [(16384, np.float32, "fused_row"), (16385, np.float32, "layer_norm_long"),
             (16384, np.float16, "fused_row"), (16385, np.float16, "layer_norm_long"),
             (8192, np.float64, "fused_row"), (8193, np.float64, "layer_norm_long")]  # fmt: skip
    for n, dtype, kernel in cases:
        x = np.zeros((2, n), dtype)
        assert ex_kernel(ops.layer_norm.explain(x)).startswith(kernel), (n, dtype)
    # leading axes that cannot be merged into rows: the composer's kernel, which takes any
    # strides (it reads such rows three times), still right
    x = np.random.default_rng(6).standard_normal((2, 3, 16400)).astype(np.float32)
    view = x.transpose(1, 0, 2)
    assert ex_kernel(ops.layer_norm.explain(view)).startswith("fused_row")
    np.testing.assert_allclose(ops.layer_norm(view), layer_norm_ref(view), **NORM_TOL[np.float32])


def ex_kernel(ex) -> str:
    return ex.stages[0].split(":")[0]


# --------------------------------------------------------------------------------------------
# Numerics of issue 19: float16 computed in float32, statistics that never round the mean,
# NaN and infinities anywhere in a row


def test_float16_rows_of_large_magnitude_are_computed_in_float32(side):
    """float16 squares overflow from 256 on: a norm that squared in float16 gave -0.0 for -6
    (rms_norm) and -0.96 for -6.77 (layer_norm) on rows of magnitude 300."""
    x = np.zeros((3, 36), np.float16)
    x[0, 0] = -300  # one spike: rms_norm gives -sqrt(36), layer_norm -sqrt(35)
    x[1] = np.random.default_rng(7).standard_normal(36) * 300
    x[2] = np.linspace(-1000, 1000, 36)
    w = np.linspace(0.5, 2, 36).astype(np.float16)
    for name, (op, ref, tol) in ROW_OPS.items():
        got = back(op(*on(side, x)), side)
        np.testing.assert_allclose(got, ref(x), **tol[np.float16], err_msg=name)
    assert back(ops.rms_norm(*on(side, x)), side)[0, 0] == -6
    got = back(ops.layer_norm(*on(side, x, w, w)), side)
    np.testing.assert_allclose(got, layer_norm_ref(x, w, w), **NORM_TOL[np.float16])


# A warp per row, a block per row with the row in registers, the hand-written long-row kernel.
ROW_LENGTHS = [1000, 4096, 16400]


@pytest.mark.parametrize("n", ROW_LENGTHS)
def test_layer_norm_of_constant_rows_is_zero(n, side):
    """1000.1 repeated: a mean one ulp off, times 1/sqrt(eps) = 316, gave 0.0193."""
    x = np.full((2, n), 1000.1, np.float32)
    got = back(ops.layer_norm(*on(side, x)), side)
    assert np.abs(got).max() <= 1e-6


@pytest.mark.parametrize("n", ROW_LENGTHS)
def test_layer_norm_of_noisy_rows_does_not_amplify_the_means_rounding(n, side):
    """Rows of 1 + 1e-4 noise. A mean rounded to float32 is off by up to half an ulp of 1
    (6e-8), and 1/sqrt(var + eps) (about 316 here) carries that into every output: 1.9e-5,
    the error the kernels had. The statistics must not round the mean: the error must stay
    under a quarter of that, and within the float32 tolerance."""
    x = (1 + 1e-4 * np.random.default_rng(n).standard_normal((2, n))).astype(np.float32)
    got = back(ops.layer_norm(*on(side, x)), side)
    want = layer_norm_ref(x)
    amplified = np.spacing(np.float32(1)) / 2 / np.sqrt(x.astype(np.float64).var(-1) + 1e-5)
    assert (np.abs(got - want).max(-1) <= amplified / 4).all()
    np.testing.assert_allclose(got, want, **NORM_TOL[np.float32])


SPECIAL = [np.nan, np.inf, -np.inf]


@st.composite
def rows_with_specials(draw):
    """Rows (2 of them, one length from 1 to 65) holding NaN, +inf or -inf: none, one or two
    per row, at the first, the last or any position, and in rows of one element the only one."""
    dtype = draw(st.sampled_from(DTYPES))
    n = draw(st.sampled_from([1, 2, 31, 33, 65]))
    x = np.random.default_rng(draw(st.integers(0, 2**16))).standard_normal((2, n)).astype(dtype)
    for row in x:
        for _ in range(draw(st.integers(0, 2))):
            at = draw(st.one_of(st.just(0), st.just(n - 1), st.integers(0, n - 1)))
            row[at] = draw(st.sampled_from(SPECIAL))
    return x


@settings(max_examples=40)
@given(rows_with_specials(), st.sampled_from(list(ROW_OPS)), st.sampled_from(["host", "device"]))
def test_nan_and_infinities_anywhere_give_numpys_result(x, name, side):
    op, ref, tol = ROW_OPS[name]
    got = back(op(*on(side, x)), side)
    np.testing.assert_allclose(got, ref(x), **tol[x.dtype.type])


@pytest.mark.parametrize("value", SPECIAL)
@pytest.mark.parametrize("n", ROW_LENGTHS[1:])
def test_layer_norm_of_long_rows_with_nan_or_infinity_is_nan(n, value, side):
    """A block per row, and the long-row kernel with its per-thread shifts: a NaN or an
    infinity at the first element (a shift) or the last makes the row NaN, as NumPy."""
    x = np.random.default_rng(8).standard_normal((2, n)).astype(np.float32)
    x[0, 0] = x[1, -1] = value
    with np.errstate(invalid="ignore"):  # the simulator's inf - inf is NumPy's, which warns
        got = back(ops.layer_norm(*on(side, x)), side)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(layer_norm_ref(x)))
    assert np.isnan(got).all()


def test_layer_norm_of_long_strided_rows(side):
    """Rows that step evenly but not contiguously: a device x is read where it is, a host x
    from its contiguous device copy, with the copy's strides (x's own lie past the copy)."""
    rng = np.random.default_rng(8)
    base = (rng.standard_normal((2, 2 * 16400)) * 2 - 1).astype(np.float32)
    x = base[:, ::2]
    w = rng.standard_normal(16400).astype(np.float32)
    placed, ws = on(side, base, w)
    xs = placed[:, ::2]
    ex = ops.layer_norm.explain(xs, ws)
    assert "hand-written" in ex.stages[0]
    got = back(ops.layer_norm(xs, ws), side)
    np.testing.assert_allclose(got, layer_norm_ref(x, w, None), **NORM_TOL[np.float32])
