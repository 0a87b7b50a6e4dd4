"""Prebuilt reductions against NumPy: values and NumPy's result dtypes for bool, int32, int64,
float16, float32 and float64; any axis (None, an int, a tuple), keepdims, size 0.

Tolerances per result dtype, against a float64 reference of the same inputs: integer and bool
results exact; max/min/argmax/argmin exact for every dtype; float results rtol 2e-3 (float16:
the result is rounded to float16), 2e-5 (float32: the combining order differs from NumPy's
pairwise sum) and 1e-12 (float64), with an absolute part of rtol times the largest magnitude
the result can reach from its inputs (m = max |x|, n elements reduced): m * n for sum, m for
mean and std, m**2 for var, so cancellation to near zero is judged on the scale of the terms.
"""

import numpy as np
import pytest
from helpers import back, on
from hypothesis import given
from hypothesis import strategies as st

from tessera_tile import ops, sim

NAMES = ["sum", "mean", "max", "min", "var", "std", "argmax", "argmin"]
EXACT = {"max", "min", "argmax", "argmin"}
RTOL = {"float16": 2e-3, "float32": 2e-5, "float64": 1e-12}
SHAPES = [(1,), (31,), (33,), (2, 33), (33, 5), (5, 32), (1, 7), (2, 3, 33), (3, 31, 2)]
DTYPES = ["bool", "int32", "int64", "float16", "float32", "float64"]


def reference(name, x, axis, keepdims):
    """NumPy's value computed in float64 where NumPy's own dtype is a float, and NumPy's dtype."""
    expected = getattr(np, name)(x, axis=axis, keepdims=keepdims)
    dtype = np.asarray(expected).dtype
    if name in EXACT or dtype.kind != "f":
        return np.asarray(expected), dtype
    wide = getattr(np, name)(x.astype(np.float64), axis=axis, keepdims=keepdims)
    return np.asarray(wide), dtype


@st.composite
def cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    # straddling the warp size, few elements each (simulated launches are slow)
    shape = draw(st.sampled_from(SHAPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = (rng.standard_normal(shape) * 20).astype(dtype)
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
    want, dtype = reference(name, x, axis, keepdims)
    np.testing.assert_array_equal(x, before)
    assert got.dtype == dtype and got.shape == want.shape, (got.dtype, dtype, got.shape)
    if name in EXACT or dtype.kind != "f":
        np.testing.assert_array_equal(got, want)
    else:
        rtol = RTOL[str(dtype)]
        m = float(np.abs(x.astype(np.float64)).max()) if x.size else 0.0
        n = x.size // max(want.size, 1)
        scale = {"sum": m * n, "mean": m, "var": m * m, "std": m}[name]
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


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
        np.testing.assert_array_equal(
            getattr(ops, name)(x, axis=1), getattr(np, name)(x, axis=1), err_msg=name
        )


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
    with sim.profile() as prof, pytest.raises(error, match=words):
        call()
    assert prof.launches == 0
