"""Prebuilt reductions against NumPy: values and NumPy's result dtypes for bool, int32, int64,
float16, bfloat16, float32 and float64; any axis (None, an int, a tuple), keepdims, size 0.

Tolerances per result dtype, against a float64 reference of the same inputs: integer and bool
results exact; max/min/argmax/argmin exact for every dtype; float results rtol 2e-3 (float16:
the result is rounded to float16), 2^-7 (bfloat16, likewise), 2e-5 (float32: the combining order
differs from NumPy's pairwise sum) and 1e-12 (float64), with an absolute part of rtol times the
largest magnitude
the result can reach from its inputs (m = max |x|, n elements reduced): m * n for sum, m for
mean and std, m**2 for var, so cancellation to near zero is judged on the scale of the terms.
float16 and bfloat16 sums, means, variances and standard deviations are computed in float32 and
rounded once
(NumPy squares float16 deviations in float16: its ``std`` of [-300.25, 300.25] is inf), so the
reference is the float64 result; a float16 result past 65,504 is inf. Inputs reach magnitude
1,000, and hold NaN and infinities anywhere.
"""

import warnings

import ml_dtypes
import numpy as np
import pytest
from helpers import assert_close_rounded, back, counting_launches, on
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_tile import ops

NAMES = ["sum", "mean", "max", "min", "var", "std", "argmax", "argmin"]
EXACT = {"max", "min", "argmax", "argmin"}
# bfloat16: 8 significant bits, one rounding of a float32 result: 2^-7 (see test_ops_rows)
RTOL = {"float16": 2e-3, "bfloat16": 2**-7, "float32": 2e-5, "float64": 1e-12}
SHAPES = [(1,), (31,), (33,), (2, 33), (33, 5), (5, 32), (1, 7), (2, 3, 33), (3, 31, 2)]
DTYPES = ["bool", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def floating(dtype) -> bool:
    return dtype.kind == "f" or dtype == ml_dtypes.bfloat16  # ml_dtypes' kind is "V"


@np.errstate(invalid="ignore", over="ignore")  # NaN and inf inputs, float16 squares
def reference(name, x, axis, keepdims):
    """NumPy's value computed in float64 where NumPy's own dtype is a float, and NumPy's dtype."""
    expected = getattr(np, name)(x, axis=axis, keepdims=keepdims)
    dtype = np.asarray(expected).dtype
    if name in EXACT or not floating(dtype):
        return np.asarray(expected), dtype
    wide = getattr(np, name)(x.astype(np.float64), axis=axis, keepdims=keepdims)
    return np.asarray(wide), dtype


def check(got, x, name, axis, keepdims):
    """``got`` against NumPy: its dtype and shape, exact for integer results and the
    selections, else within the tolerance of the result dtype (see the module's docstring)."""
    want, dtype = reference(name, x, axis, keepdims)
    assert got.dtype == dtype and got.shape == want.shape, (got.dtype, dtype, got.shape)
    if name in EXACT or not floating(dtype):
        np.testing.assert_array_equal(got, want)
        return
    rtol = RTOL[str(dtype)]
    finite = np.abs(x[np.isfinite(x)].astype(np.float64))
    m = float(finite.max(initial=0.0))
    n = x.size // max(want.size, 1)
    scale = {"sum": m * n, "mean": m, "var": m * m, "std": m}[name]
    assert_close_rounded(got, want, rtol=rtol, atol=rtol * scale)


@st.composite
def cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    # straddling the warp size, few elements each (simulated launches are slow)
    shape = draw(st.sampled_from(SHAPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    scale = draw(st.sampled_from([1.0, 20.0, 250.0]))  # up to about 1,000
    x = (rng.standard_normal(shape) * scale).astype(dtype)
    name = draw(st.sampled_from(NAMES))
    if name in ("argmax", "argmin"):
        axis = draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    else:
        axis = draw(
            st.one_of(
                st.none(),
                st.integers(-len(shape), len(shape) - 1),
                st.sets(st.integers(0, len(shape) - 1), min_size=1).map(tuple),
            )
        )
    return name, x, axis, draw(st.booleans()), draw(st.sampled_from(["host", "device"]))


@given(cases())
def test_reductions_match_numpy(case):
    name, x, axis, keepdims, side = case
    before = x.copy()
    got = back(getattr(ops, name)(*on(side, x), axis=axis, keepdims=keepdims), side)
    np.testing.assert_array_equal(x, before)
    check(got, x, name, axis, keepdims)


@pytest.mark.parametrize("dtype", DTYPES)
def test_result_dtypes_are_numpys(dtype):
    x = np.arange(12).reshape(3, 4).astype(dtype)
    for name in NAMES:
        got = getattr(ops, name)(x, axis=1)
        assert got.dtype == getattr(np, name)(x, axis=1).dtype, name


def test_size_zero_gives_numpys_result_or_error():
    z = np.zeros((0, 3), np.float32)
    np.testing.assert_array_equal(ops.sum(z), 0)
    np.testing.assert_array_equal(ops.sum(z, axis=0), np.zeros(3))
    with np.errstate(all="ignore"):
        assert np.isnan(ops.mean(z, axis=0)).all() and np.isnan(ops.var(z)).all()
    for name in ("max", "min", "argmax", "argmin"):
        with pytest.raises(ValueError):
            getattr(ops, name)(z, axis=0)
        assert getattr(ops, name)(z, axis=1).shape == (0,)


def test_nan_propagates():
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    x[1, 2] = np.nan
    for name in NAMES:
        got, want = getattr(ops, name)(x, axis=1), getattr(np, name)(x, axis=1)
        if name in ("mean", "var", "std"):  # divide by n through rcp.approx (1 ulp, PTX ISA)
            np.testing.assert_allclose(got, want, rtol=4 * 2.0**-24, atol=0, err_msg=name)
            assert np.array_equal(np.isnan(got), np.isnan(want)), name
        else:
            np.testing.assert_array_equal(got, want, err_msg=name)


def test_out_on_device_and_explain():
    from numba import cuda

    x = np.arange(64, dtype=np.float32).reshape(4, 16)
    out = cuda.device_array(4, np.float32)
    assert ops.sum(cuda.to_device(x), axis=1, out=out) is out
    np.testing.assert_array_equal(out.copy_to_host(), x.sum(1))
    ex = ops.mean.explain(x, axis=1)
    assert ex.kernels == 1 and ex.bytes_fused == x.nbytes + 16


BAD = [
    (lambda: ops.sum(np.ones(3, np.complex64)), TypeError, "x has dtype"),
    (lambda: ops.sum(np.ones((2, 3)), axis=2), ValueError, "axis 2"),
    (lambda: ops.mean(np.ones((2, 3)), axis=(0, 0)), ValueError, "axis"),
    (lambda: ops.argmax(np.ones((2, 3)), axis=(0, 1)), TypeError, "one axis"),
    (lambda: ops.max(np.ones(3), axis="0"), TypeError, "axis"),
    (lambda: ops.std(np.ones(3), keepdims=None), TypeError, "keepdims"),
    (lambda: ops.sum(np.ones(3), out=np.ones(2)), ValueError, "out"),
    (lambda: ops.min([1, 2]), TypeError, "x"),
]


@pytest.mark.parametrize("call, error, words", BAD)
def test_bad_input_raises_before_any_launch(call, error, words):
    with counting_launches() as counted, pytest.raises(error, match=words):
        call()
    assert counted.launches == 0


def test_the_launch_counter_sees_a_valid_call():
    # the control of the test above: the same counter counts this family's fused launch
    x = np.ones((2, 3))
    with counting_launches() as counted:
        ops.sum(x, axis=1)
    assert counted.launches == ops.sum.explain(x, axis=1).kernels == 1


def test_float16_var_and_std_are_computed_in_float32(side):
    """The variance of [-300.25, 300.25] is 90,150: inf in float16, as NumPy gives it. Its
    square root 300.25 is representable; squaring in float16 gave inf for it too."""
    x = np.array([[-300.25, 300.25], [1000.0, -1000.0], [3.0, 5.0]], np.float16)
    (xs,) = on(side, x)
    np.testing.assert_array_equal(back(ops.std(xs, axis=1), side), [300.25, 1000, 1])
    np.testing.assert_array_equal(back(ops.var(xs, axis=1), side), [np.inf, np.inf, 1])
    for name in ("var", "std"):
        for axis in (None, 0):
            check(back(getattr(ops, name)(xs, axis=axis), side), x, name, axis, False)


@st.composite
def arrays_with_specials(draw):
    """Float arrays of magnitude up to about 1,000 holding NaN, +inf or -inf: none to three,
    at the first, the last or any position (in an array of one element, the only one)."""
    dtype = draw(st.sampled_from(["float16", "float32", "float64"]))
    shape = draw(st.sampled_from(SHAPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = (rng.standard_normal(shape) * draw(st.sampled_from([1.0, 250.0]))).astype(dtype)
    flat = x.reshape(-1)
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.one_of(st.just(0), st.just(flat.size - 1), st.integers(0, flat.size - 1)))
        flat[at] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    return x


@settings(max_examples=40)
@given(
    arrays_with_specials(),
    st.sampled_from(NAMES),
    st.sampled_from([None, -1, 0]),
    st.sampled_from(["host", "device"]),
)
def test_nan_and_infinities_anywhere_give_numpys_result(x, name, axis, side):
    got = back(getattr(ops, name)(*on(side, x), axis=axis), side)
    check(got, x, name, axis, False)


@pytest.mark.parametrize("ddof", [0, 1, 4, 5, 7, -1])
@pytest.mark.parametrize("axis", [0, 1, None])
@pytest.mark.parametrize("name", ["var", "std"])
def test_var_and_std_take_ddof_as_numpy(name, axis, ddof, side):
    """NumPy divides by max(n - ddof, 0): inf where ddof >= n (NaN for a constant row), and a
    negative ddof divides by more than n. Rows and columns of 5, one of them constant."""
    x = np.arange(25, dtype=np.float32).reshape(5, 5) ** 1.5
    x[2] = 3.0
    x[:, 3] = -2.0
    (xs,) = on(side, x)
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "Degrees of freedom <= 0"
        want = getattr(np, name)(x.astype(np.float64), axis=axis, ddof=ddof)
    got = back(getattr(ops, name)(xs, axis=axis, ddof=ddof), side)
    assert got.dtype == np.float32
    # float32: the centred squares summed in another order than NumPy's, then one division
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=0)


def test_ddof_must_be_an_int():
    x = np.ones((3, 4), np.float32)
    for bad in (0.5, True, "1", None):
        with pytest.raises(TypeError, match="ddof must be an int"):
            ops.var(x, ddof=bad)
    with pytest.raises(TypeError, match="ddof"):
        ops.sum(x, ddof=1)  # only var and std take it, as in NumPy's methods
