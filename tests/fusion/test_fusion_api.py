"""@tt.fuse: inputs, outputs, out=, scalars, caching, and errors for bad input."""

import math

import numpy as np
import pytest
from helpers import back, counting_launches, on
from numba import cuda

import tessera_tile as tt
from tessera_tile.fusion import TraceError, kernel_cache

rng = np.random.default_rng(3)


def test_scalars_python_and_numpy_and_zero_d():
    x = rng.standard_normal((3, 4)).astype(np.float32)

    @tt.fuse
    def scaled(x, a, b, c):
        return x * a + b - c

    got = scaled(x, 2, np.float32(0.5), np.array(1.5, np.float64))
    ref = x * 2 + np.float32(0.5) - np.array(1.5)
    assert got.dtype == ref.dtype == np.float64  # a 0-d float64 array is a strong scalar
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    assert scaled(x, 2, 0.5, 1.5).dtype == np.float32  # Python scalars are weak


def test_results_and_inputs():
    x = rng.standard_normal((4, 5))
    before = x.copy()

    @tt.fuse
    def two(x):
        return x + 1, tt.sum(x, axis=0)

    a, s = two(x)
    assert isinstance(a, np.ndarray) and a.shape == (4, 5) and s.shape == (5,)
    np.testing.assert_array_equal(x, before)


def test_out_writes_into_given_arrays_including_views():
    x = rng.standard_normal((4, 6)).astype(np.float32)
    backing = np.zeros((4, 12), np.float32)
    out = backing[:, ::2]

    @tt.fuse
    def double(x):
        return x * 2

    result = double(x, out=out)
    assert result is out
    np.testing.assert_array_equal(backing[:, ::2], x * 2)
    np.testing.assert_array_equal(backing[:, 1::2], 0)


def test_out_errors_name_the_problem():
    x = rng.standard_normal((4, 6)).astype(np.float32)

    @tt.fuse
    def double(x):
        return x * 2

    with pytest.raises(ValueError, match="shape"):
        double(x, out=np.zeros((4, 5), np.float32))
    with pytest.raises(TypeError, match=r"into out from dtype\('float32'\) to dtype\('int32'\)"):
        double(x, out=np.zeros((4, 6), np.int32))
    with pytest.raises(ValueError, match="overlaps argument 0"):
        double(x, out=x)
    with pytest.raises(ValueError, match="1 result"):
        double(x, out=(np.zeros((4, 6), np.float32), np.zeros((4, 6), np.float32)))
    with pytest.raises(TypeError, match="not an array"):
        double(x, out=[1, 2])


def test_bad_arguments_are_named_before_anything_runs():
    @tt.fuse
    def add(a, b):
        return a + b

    x = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match=r"could not be broadcast .* shapes \(3,4\) \(5,\)"):
        add(x, np.ones(5, np.float32))
    with pytest.raises(TypeError, match="argument 1 of add has dtype complex128"):
        add(x, np.ones(4, np.complex128))
    with pytest.raises(TypeError, match="argument 0 of add has dtype <U1"):
        add(np.array(["a"]), x)
    with pytest.raises(TypeError, match="argument 1 of add is a list"):
        add(x, [1, 2, 3, 4])
    with pytest.raises(TypeError, match="datetime64"):
        add(x, np.array(["2020-01-01"] * 4, dtype="datetime64[D]"))


def test_axis_errors_follow_numpy():
    x = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match="axis 2 is out of bounds"):
        tt.fuse(lambda x: tt.sum(x, axis=2))(x)
    with pytest.raises(ValueError, match="repeated axis"):
        tt.fuse(lambda x: tt.sum(x, axis=(0, -2)))(x)
    with pytest.raises(ValueError, match="one axis or None"):
        tt.fuse(lambda x: tt.argmax(x, axis=(0, 1)))(x)


def test_empty_reductions_follow_numpy():
    e = np.zeros((0, 3), np.float32)
    np.testing.assert_array_equal(tt.fuse(lambda x: tt.sum(x, axis=0))(e), np.zeros(3))
    np.testing.assert_array_equal(tt.fuse(lambda x: tt.prod(x, axis=0))(e), np.ones(3))
    with pytest.raises(ValueError, match="zero-size array to reduction operation max"):
        tt.fuse(lambda x: tt.max(x, axis=0))(e)
    with np.errstate(invalid="ignore"):
        assert np.isnan(tt.fuse(lambda x: tt.mean(x))(e))


def test_nan_and_inf_propagate_as_in_numpy():
    x = np.array([[1.0, np.nan, 3.0, np.nan], [np.inf, -np.inf, 0.0, 2.0]], np.float32)

    @tt.fuse
    def stats(x):
        return tt.max(x, axis=1), tt.argmax(x, axis=1), tt.min(x), tt.argmin(x, axis=1)

    mx, amx, mn, amn = stats(x)
    np.testing.assert_array_equal(mx, x.max(1))
    np.testing.assert_array_equal(amx, x.argmax(1))
    assert np.isnan(mn) and np.isnan(x.min())
    np.testing.assert_array_equal(amn, x.argmin(1))


def test_what_cannot_be_traced_is_explained():
    x = np.ones(4, np.float32)

    def branch(x):
        return x if x > 0 else -x

    with pytest.raises(TraceError, match="tt.where"):
        tt.fuse(branch)(x)
    with pytest.raises(TraceError, match="tt.exp"):
        tt.fuse(lambda x: math.exp(x))(x)
    with pytest.raises(TraceError, match="numpy.cumsum"):
        tt.fuse(lambda x: np.cumsum(x))(x)

    def inplace(x):
        x += 1
        return x

    with pytest.raises(TraceError, match="in-place"):
        tt.fuse(inplace)(x)

    def setitem(x):
        x[0] = 1
        return x

    with pytest.raises(TraceError, match="in-place"):
        tt.fuse(setitem)(x)
    with pytest.raises(TraceError, match="result has type int"):
        tt.fuse(lambda x: 3)(x)
    with pytest.raises(TypeError, match="fuse expects a function"):
        tt.fuse(3)


def test_tt_functions_on_arrays_outside_a_fused_function_run_one_kernel(side):
    # as CuPy's fused ufuncs do; each function and set of fixed arguments compiles once
    x = rng.standard_normal((3, 5)).astype(np.float32)
    (xs,) = on(side, x)
    cases = [
        (lambda: tt.exp(xs), np.exp(x)),
        (lambda: tt.sum(xs, axis=1, keepdims=True), x.sum(1, keepdims=True)),
        (lambda: tt.var(xs, 0, ddof=1), x.var(0, ddof=1)),
        (lambda: tt.clip(xs, -0.5, 0.5), np.clip(x, -0.5, 0.5)),
        (lambda: tt.maximum(xs, 0.25), np.maximum(x, 0.25)),
        (lambda: tt.astype(xs, np.float16), x.astype(np.float16)),
    ]
    for run, want in cases:
        with counting_launches() as counted:
            got = back(run(), side)
        assert counted.launches == 1
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(x, back(xs, side) if side == "device" else xs)  # untouched


def test_tt_functions_on_scalars_outside_a_fused_function_follow_numpy():
    assert repr(tt.exp(2.0)) == repr(np.exp(2.0))
    assert repr(tt.maximum(np.float32(1), 2)) == repr(np.maximum(np.float32(1), 2))
    with pytest.raises(TypeError, match="argument 0 of sum is a list, not an array"):
        tt.sum([1, 2, 3])
    with pytest.raises(TypeError, match="pass axis as ints, tuples"):
        tt.sum(np.ones(3), axis=[0])


def test_tt_functions_outside_take_new_numbers_without_new_kernels():
    # numbers are arguments of the function's one fused function; axes and dtypes shape it
    x = rng.standard_normal(8).astype(np.float32)
    tt.maximum(x, 0.25)
    misses = kernel_cache.misses
    for bound in (0.5, -1.0, 2.0):  # one scalar kind: one signature
        np.testing.assert_array_equal(tt.maximum(x, bound), np.maximum(x, bound))
    assert kernel_cache.misses == misses


def test_numpy_ufuncs_on_traced_values_work():
    x = rng.standard_normal(10)
    np.testing.assert_allclose(tt.fuse(lambda x: np.exp(x) + np.maximum(x, 0))(x),
                               np.exp(x) + np.maximum(x, 0))  # fmt: skip


def test_cache_hits_skip_tracing_and_code_generation():
    calls = []

    @tt.fuse
    def f(x, y):
        calls.append(1)
        return tt.sum(x * y, axis=-1)

    a = np.ones((3, 5), np.float32)
    f(a, a)
    assert f.cache_info()["misses"] == 1 and len(calls) == 1
    generated = kernel_cache.misses
    f(np.ones((7, 9), np.float32), np.ones((7, 9), np.float32))  # same signature, new sizes
    assert f.cache_info()["hits"] == 1 and len(calls) == 1
    assert kernel_cache.misses == generated  # no code generation
    f(np.ones((7, 9)), np.ones((7, 9)))  # float64: a new signature
    assert f.cache_info()["misses"] == 2 and len(calls) == 2
    f(np.ones((7, 1), np.float32), np.ones((7, 9), np.float32))  # a broadcast axis: new
    assert f.cache_info()["misses"] == 3 and len(calls) == 3


def test_same_structure_shares_kernels_across_functions():
    x = np.ones((2, 3), np.float32)
    tt.fuse(lambda x: tt.exp(x) * 3)(x)
    before = kernel_cache.misses
    tt.fuse(lambda y: tt.exp(y) * 3)(x)
    assert kernel_cache.misses == before and kernel_cache.hits > 0


def test_explain_reports_the_plan():
    @tt.fuse
    def softmax(x):
        e = tt.exp(x - tt.max(x, axis=-1, keepdims=True))
        return e / tt.sum(e, axis=-1, keepdims=True)

    x = np.ones((4, 8), np.float32)
    ex = softmax.explain(x)
    assert ex.kernels == 1  # and why its rows stay on chip as they do
    assert ex.reasons == [
        "kernel 0: rows of 8 stay in registers as their 1 input row(s) (4 B per element)"
    ]
    assert "max" in ex.ir and "sum" in ex.ir and "@cuda.jit" in ex.source
    assert ex.source.startswith("# tessera_tile fused kernel: max, sub, exp, sum, truediv")
    assert ex.bytes_fused == 2 * x.nbytes and ex.bytes_unfused > ex.bytes_fused
    assert "1 kernel(s)" in str(ex)


class FakeDeviceArray:
    """Stands for a CuPy / Numba device array: only the interface is looked at (over device
    memory it holds)."""

    def __init__(self, shape):
        self.memory = cuda.device_array(shape, np.float32)
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": "<f4", "strides": None, "version": 3,
            "data": (self.memory.__cuda_array_interface__["data"][0], False),
        }  # fmt: skip


def test_host_and_device_arrays_cannot_be_mixed():
    f = tt.fuse(lambda a, b, c: a + b + c)
    with pytest.raises(TypeError, match="argument 0 of <lambda> is a host .* argument 1 of"):
        f(np.ones(3, np.float32), FakeDeviceArray((3,)), 2.0)
    with pytest.raises(TypeError, match="argument 1 of <lambda> is a host .* out a device"):
        f(2.0, np.ones(3, np.float32), np.array(1.0), out=FakeDeviceArray((3,)))


def test_tt_functions_take_scalars_as_numpy_functions_do():
    """``tt.exp(1.0)`` is ``np.exp(1.0)``: a float64 NumPy scalar, strong in promotion."""
    x = rng.standard_normal(5).astype(np.float32)

    @tt.fuse
    def strong(x):
        return x * tt.exp(1.0) + tt.maximum(2, 3) - tt.sum(np.float32(2.0))

    @tt.fuse
    def stays_float32(x):
        return x * tt.sqrt(np.array(4.0, np.float32)) + tt.where(True, 1.0, 2.0).astype(np.float32)

    ref = x * np.exp(1.0) + np.maximum(2, 3) - np.sum(np.float32(2.0))
    got = strong(x)
    assert got.dtype == ref.dtype == np.float64
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    ref32 = x * np.sqrt(np.array(4.0, np.float32)) + np.where(True, 1.0, 2.0).astype(np.float32)
    got32 = stays_float32(x)
    assert got32.dtype == ref32.dtype == np.float32
    np.testing.assert_allclose(got32, ref32, rtol=1e-6)


def test_fast_sigmoid_flushes_subnormal_results_as_the_hardware_does():
    # ex2.approx.ftz and rcp.approx.ftz flush results below 2**-126 to 0 on the GPU; the
    # simulator's twins do the same, and math="ieee" keeps NumPy's subnormal result
    x = np.array([-88.0, -87.0, 0.0, 88.0], np.float32)
    fast, ieee = tt.fuse(tt.sigmoid), tt.fuse(math="ieee")(tt.sigmoid)
    got, exact = fast(x), ieee(x)
    ref = 1 / (1 + np.exp(-x.astype(np.float64)))
    assert got[0] == 0 and 0 < exact[0] < 2.0**-126  # 6.05e-39, subnormal
    np.testing.assert_allclose(got[1:], ref[1:], rtol=2e-5)
    np.testing.assert_allclose(exact, ref, rtol=2e-5)


def test_math_option_selects_ieee_or_fast_kernels():
    def softmax(x):
        e = tt.exp(x - tt.max(x, axis=-1, keepdims=True))
        return e / tt.sum(e, axis=-1, keepdims=True)

    x = np.random.default_rng(3).standard_normal((4, 96)).astype(np.float32)
    fast, ieee = tt.fuse(softmax), tt.fuse(math="ieee")(softmax)
    assert "exp_approx(" in fast.explain(x).source and "rcp_approx(" in fast.explain(x).source
    assert "exp_approx(" not in ieee.explain(x).source
    assert "rcp_approx(" not in ieee.explain(x).source
    ref = np.exp(x - x.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    for fn in (fast, ieee):
        np.testing.assert_allclose(fn(x), ref, rtol=2e-4)
    with pytest.raises(ValueError, match="math must be one of"):
        tt.fuse(softmax, math="approximate")


@pytest.mark.parametrize("side", ["host", "device"])
def test_a_function_reading_shapes_is_traced_per_shape(side):
    """A fused function that reads ``x.shape`` or ``x.size`` holds those numbers: a call with
    other shapes (of the same rank, dtype and layout) traces again instead of reusing them."""
    from numba import cuda

    fn = tt.fuse(lambda x: x / x.shape[-1] + x.size)
    plain = tt.fuse(lambda x: x * 2.0)
    for cols in (4, 8, 8, 4):
        x = np.ones((3, cols), np.float32)
        got = fn(cuda.to_device(x) if side == "device" else x)
        got = got.copy_to_host() if side == "device" else got
        np.testing.assert_array_equal(got, x / cols + x.size)
        plain(x)
    # programs made (traced, or read from the disk cache): the first signature, then each
    # exact shape once; one for every size where no shape is read
    assert fn.traced + fn.loaded == 3
    assert plain.traced + plain.loaded == 1
