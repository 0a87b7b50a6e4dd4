"""@tt.fuse follows NumPy (issue 19, items 7 to 13): the ufuncs it traces, constants, results
of scalars alone, NumPy's error classes, ``out=`` casting, keyword arguments.

Every case runs on host arrays and on device arrays (the ``side`` fixture) and is compared
with NumPy's value and dtype, or NumPy's exception class where NumPy raises.

Tolerances: float32 results of libdevice functions are within 2 ulp of the exact value (CUDA C
Programming Guide, single-precision functions) and NumPy's float32 loops within 4 ulp, so the
two agree to 8 ulp: rtol 8 * 2**-23 (~1e-6); the inputs lie in [0.5, 2], where no function
below is ill-conditioned. float64: the same count of ulp, rtol 8 * 2**-52. float16 results are
such a float32 value rounded once on either side, so they may land one float16 ulp apart: rtol
2**-10. A float32 sum of n terms, in any order, is within (n - 1) * 2**-24 * sum(|terms|) of
the exact sum. Integers, booleans, casts and selects of constants must match exactly.
"""

import numpy as np
import pytest
from helpers import back, on
from numba import cuda

import tessera_tile as tt
from tessera_tile import ops
from tessera_tile._fusion.trace import TT_FUNCTIONS, UFUNCS
from tessera_tile.fusion import TraceError
from tessera_tile.tile_ir import SUPPORTED_DTYPES

rng = np.random.default_rng(19)
RTOL = {
    np.dtype(np.float16): 2.0**-10,
    np.dtype(np.float32): 8 * 2.0**-23,
    np.dtype(np.float64): 8 * 2.0**-52,
}


def sum_error(terms) -> float:
    """The bound of the module docstring on a float32 sum of ``terms``."""
    return (np.size(terms) - 1) * 2.0**-24 * float(np.sum(np.abs(terms), dtype=np.float64))


def assert_same(got, ref):
    """``got`` has NumPy's dtype, shape and values (within RTOL for floats; NaN where NumPy
    has NaN)."""
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.dtype == ref.dtype and got.shape == ref.shape, (got.dtype, ref.dtype, got.shape)
    if ref.dtype.kind == "f":
        np.testing.assert_allclose(got, ref, rtol=RTOL[ref.dtype], atol=0)
    else:
        np.testing.assert_array_equal(got, ref)


def zeros(side: str, shape, dtype):
    """A zeroed array (an ``out=``) on the caller's side."""
    host = np.zeros(shape, dtype)
    return host if side == "host" else cuda.to_device(host)


def to_host(array):
    """A host copy of a host or device array (0-d ones included)."""
    return array if isinstance(array, np.ndarray) else array.copy_to_host()


# --------------------------------------------------------------------------------------------
# item 7: every NumPy ufunc with a tt.* meaning traces, under each of its NumPy 2 names

NUMPY_UFUNC_NAMES = sorted(name for name in dir(np) if isinstance(getattr(np, name), np.ufunc))
TRACED_NAMES = [name for name in NUMPY_UFUNC_NAMES if getattr(np, name) in UFUNCS]
# the elementwise ones (matmul, a generalized ufunc, has its tests in test_fusion_matmul.py)
ELEMENTWISE_NAMES = [name for name in TRACED_NAMES if getattr(np, name).signature is None]


def test_trace_table_holds_numpy_2_ufuncs_and_every_tt_equivalent():
    # keyed by the ufunc itself: each entry is NumPy's ufunc of its own (NumPy 2) name, so a
    # renamed ufunc (true_divide -> divide) cannot fall out of the table
    for ufunc in UFUNCS:
        assert getattr(np, ufunc.__name__) is ufunc, ufunc.__name__
    # every tt.* function named as a NumPy ufunc traces as that ufunc
    same_name = [n for n in tt.fusion.__all__ if isinstance(getattr(np, n, None), np.ufunc)]
    assert same_name and all(getattr(np, n) in UFUNCS for n in same_name), same_name
    # the names found missing in issue 19, and their aliases
    for name in ("divide", "true_divide", "bitwise_and", "bitwise_or", "bitwise_xor", "invert",
                 "bitwise_not", "bitwise_invert", "pow", "mod", "abs"):  # fmt: skip
        assert name in TRACED_NAMES, name
    # the ndarray methods a traced value refuses point to tt.* functions that exist
    assert all(callable(getattr(tt, name)) for name in TT_FUNCTIONS)


def ufunc_inputs(ufunc, dtype):
    """Inputs where every traced ufunc is well-conditioned (see the module docstring)."""
    shape = (3, 7)
    if dtype == np.dtype(bool):
        return [rng.random(shape) < 0.5 for _ in range(ufunc.nin)]
    if dtype.kind == "i":  # divisors and exponents in [1, 5]: no division by 0, no overflow
        first = rng.integers(-9, 10, shape).astype(dtype)
        return [first] + [rng.integers(1, 6, shape).astype(dtype) for _ in range(ufunc.nin - 1)]
    return [rng.uniform(0.5, 2.0, shape).astype(dtype) for _ in range(ufunc.nin)]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "bool"])
@pytest.mark.parametrize("name", ELEMENTWISE_NAMES + ["positive"])
def test_each_traced_ufunc_gives_numpy_result_and_dtype(name, dtype, side):
    ufunc, dtype = getattr(np, name), np.dtype(dtype)
    inputs = ufunc_inputs(ufunc, dtype)
    fused = tt.fuse(lambda *a: ufunc(*a))
    try:
        with np.errstate(all="ignore"):
            ref = ufunc(*inputs)
    except TypeError:  # NumPy has no loop for this dtype (subtract of booleans...)
        ref = None
    if ref is None or ref.dtype not in SUPPORTED_DTYPES:  # (floor_divide of booleans: int8)
        with pytest.raises(TypeError):
            fused(*on(side, *inputs))
        return
    assert_same(back(fused(*on(side, *inputs)), side), ref)


# --------------------------------------------------------------------------------------------
# item 8: NaN, infinite and narrow-float constants are written into kernels correctly


def test_nan_and_infinite_constants_in_elementwise_and_row_kernels(side):
    x = np.array([[2.0, -1.0, 0.0, 0.5], [0.25, 3.0, -2.0, 0.0]], np.float32)
    tiny16, big32 = np.float16(6.0e-8), np.float32(np.finfo(np.float32).max)

    @tt.fuse
    def constants(x):
        return (
            tt.where(x > 1.0, np.nan, x)
            + tt.where(x < 0.0, -np.inf, np.float32(np.inf))
            * tt.where(x == 0.0, np.float16(np.nan), tiny16)
            + tt.minimum(x * big32, big32)
        )

    with np.errstate(all="ignore"):
        ref = (
            np.where(x > 1.0, np.nan, x)
            + np.where(x < 0.0, -np.inf, np.float32(np.inf))
            * np.where(x == 0.0, np.float16(np.nan), tiny16)
            + np.minimum(x * big32, big32)
        )
        ref_max = np.max(np.where(x > 0, x, np.nan), axis=-1).astype(np.float32)
    assert_same(back(constants(*on(side, x)), side), ref)
    row_max = tt.fuse(lambda x: tt.max(tt.where(x > 0, x, np.nan), axis=-1))
    assert_same(back(row_max(*on(side, x)), side), ref_max)
    # float16 data with a float16 NaN constant and the smallest float16 subnormal
    h = x.astype(np.float16)
    f16 = tt.fuse(lambda h: tt.where(h > 0, h * tiny16, np.float16(np.nan)))
    got16 = back(f16(*on(side, h)), side)
    ref16 = np.where(h > 0, h * tiny16, np.float16(np.nan))
    assert got16.dtype == ref16.dtype == np.float16
    np.testing.assert_array_equal(got16, ref16)


# --------------------------------------------------------------------------------------------
# items 9 and 12: results of scalars alone are NumPy scalars; an empty tuple is ()

SCALAR_CASES = {
    "negate": (lambda x, s: -s, np.negative, (3, np.int32(3), np.float32(2.5), np.array(4.0))),
    "invert": (lambda x, s: ~s, np.invert, (3, np.int64(5), True, np.array(7, np.int32))),
    "exp": (lambda x, s: tt.exp(s) * 2, lambda s: np.exp(s) * 2, (1.5, np.float32(1.5))),
}


@pytest.mark.parametrize("name", sorted(SCALAR_CASES))
def test_results_of_scalars_alone_are_numpy_scalars(name, side):
    fn, numpy_fn, values = SCALAR_CASES[name]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    fused = tt.fuse(fn)
    for s in values:
        got = fused(*on(side, x), s)
        assert isinstance(got, np.generic), type(got)  # what NumPy gives, on either side
        assert_same(got, numpy_fn(s))


def test_results_of_scalars_next_to_array_results_and_into_out(side):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    fused = tt.fuse(lambda x, s: (x * s, -s, s + 1))
    scaled, negated, plus = fused(*on(side, x), np.int32(3))
    assert_same(back(scaled, side), x * np.int32(3))
    assert_same(negated, np.negative(np.int32(3)))
    assert_same(plus, np.int32(3) + 1)
    # into out=, on the caller's side: each value cast into its array's dtype
    outs = (zeros(side, (2, 3), np.float64), zeros(side, (), np.float64), zeros(side, (), np.int64))
    results = fused(*on(side, x), np.int32(3), out=outs)
    assert all(a is b for a, b in zip(results, outs, strict=True))
    assert_same(to_host(outs[0]), (x * np.int32(3)).astype(np.float64))
    assert_same(to_host(outs[1]), np.float64(-3.0))
    assert_same(to_host(outs[2]), np.int64(4))


def test_function_of_scalars_only_follows_numpy():
    add = tt.fuse(lambda a, b: a + b)
    assert_same(add(2, 3), np.add(2, 3))
    assert_same(add(np.float32(2), 3), np.add(np.float32(2), 3))
    assert_same(add(np.int32(2), np.int64(3)), np.add(np.int32(2), np.int64(3)))
    roots = tt.fuse(lambda a: tt.sqrt(a) + tt.exp(a))
    assert_same(roots(np.float32(2)), np.sqrt(np.float32(2)) + np.exp(np.float32(2)))
    with pytest.raises(ValueError, match="Integers to negative integer powers"):
        tt.fuse(lambda a, b: a**b)(2, -1)
    plan = add.explain(2, 3)  # no kernel runs, none is predicted to move anything
    assert plan.kernels == 0 and plan.bytes_fused == plan.bytes_unfused == 0


def test_empty_tuple_returns_empty_tuple(side):
    x = np.ones(3, np.float32)
    assert tt.fuse(lambda x: ())(*on(side, x)) == ()


def test_a_negative_integer_exponent_array_on_the_host_raises_as_numpy_does():
    x, y = np.array([2, 3], np.int32), np.array([1, -1], np.int32)
    with pytest.raises(ValueError, match="Integers to negative integer powers"):
        x**y
    power = tt.fuse(lambda x, y: x**y)
    with pytest.raises(ValueError, match="Integers to negative integer powers"):
        power(x, y)
    np.testing.assert_array_equal(power(x, abs(y)), x ** abs(y))  # and runs when it may


def test_a_function_returning_none_returns_none(side):
    # CuPy's fuse does (its TestReturnNone); no kernel is planned
    x = np.arange(4, dtype=np.float32)
    fused = tt.fuse(lambda x: None)
    assert fused(*on(side, x)) is None
    assert fused.explain(x).kernels == 0


# --------------------------------------------------------------------------------------------
# item 10: NumPy's error classes and words


def test_axis_out_of_range_is_numpys_axis_error(side):
    x = np.ones((3, 4), np.float32)
    for axis in (2, -3, (0, 5)):
        with pytest.raises(np.exceptions.AxisError):
            np.sum(x, axis=axis)
        with pytest.raises(np.exceptions.AxisError, match="out of bounds for array of dimension 2"):
            tt.fuse(lambda x: tt.sum(x, axis=axis))(*on(side, x))  # noqa: B023 - called here
    with pytest.raises(np.exceptions.AxisError):
        tt.fuse(lambda x: tt.argmax(x, axis=-3))(*on(side, x))


def test_broadcast_errors_say_could_not_be_broadcast_and_name_shapes_and_arguments(side):
    add = tt.fuse(lambda a, b: a * 2 + b)
    x, y4, y5 = np.ones((3, 4), np.float32), np.ones(4, np.float32), np.ones(5, np.float32)
    with pytest.raises(ValueError, match="could not be broadcast"):
        np.add(x, y5)
    for first in (None, y4):  # at trace time; at a call that hits the cache with other sizes
        if first is not None:
            add(*on(side, x, first))
        with pytest.raises(ValueError) as error:
            add(*on(side, x, y5))
        message = str(error.value)
        assert "operands could not be broadcast together with shapes (3,4) (5,)" in message
        assert "in add of a value of argument 0 (3, 4), argument 1 (5,)" in message
    assert add.cache_info()["hits"] >= 1


def test_unsafe_cast_into_out_is_a_type_error_as_in_numpy(side):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    with pytest.raises(TypeError, match="Cannot cast"):
        np.multiply(x, 2, out=np.zeros((2, 3), np.int32))
    double = tt.fuse(lambda x: x * 2)
    with pytest.raises(TypeError, match=r"Cannot cast .* dtype\('float32'\) to dtype\('int32'\)"):
        double(*on(side, x), out=zeros(side, (2, 3), np.int32))
    two = tt.fuse(lambda x: (x > 0, x + 1))
    with pytest.raises(TypeError, match=r"into out\[1\] .* with casting rule 'same_kind'"):
        two(*on(side, x), out=(zeros(side, (2, 3), bool), zeros(side, (2, 3), np.int64)))


# --------------------------------------------------------------------------------------------
# item 11: out= of another dtype receives the result cast under same_kind, in the kernel


def add(a, b):
    return a + b


def multiply(a, b):
    return a * b


def divide(a, b):
    return a / b


def subtract(a, b):
    return a - b


def less(a, b):
    return a < b


# name: (fused function, its NumPy form, input dtype, out dtype); operators serve both
OUT_CASES = {
    "int32 sum into int64": (add, add, np.int32, np.int64),
    "int32 sum into float64": (add, add, np.int32, np.float64),
    "float32 product into float64": (multiply, multiply, np.float32, np.float64),
    "float64 quotient into float32": (divide, divide, np.float64, np.float32),
    "float32 difference into float16": (subtract, subtract, np.float32, np.float16),
    "comparison into int32": (less, less, np.float32, np.int32),
    "row sum into float32": (
        lambda a, b: tt.sum(a * b, axis=-1),
        lambda a, b: np.sum(a * b, axis=-1),
        np.int32,
        np.float32,
    ),
    "column max into int64": (
        lambda a, b: tt.max(a - b, axis=0),
        lambda a, b: np.max(a - b, axis=0),
        np.int32,
        np.int64,
    ),
    "full sum into float64": (
        lambda a, b: tt.sum(a + b),
        lambda a, b: np.sum(a + b),
        np.float32,
        np.float64,
    ),
}


@pytest.mark.parametrize("name", sorted(OUT_CASES))
def test_out_of_another_dtype_receives_the_cast_result(name, side):
    fn, numpy_fn, dtype, out_dtype = OUT_CASES[name]
    a = (rng.standard_normal((5, 70)) * 10).astype(dtype)
    b = (rng.standard_normal((5, 70)) * 10 + 40).astype(dtype)
    value = numpy_fn(a, b)
    ref = np.zeros(np.shape(value), out_dtype)
    np.copyto(ref, value, casting="same_kind")  # what NumPy's out= does with the result
    out = zeros(side, ref.shape, out_dtype)
    assert tt.fuse(fn)(*on(side, a, b), out=out) is out
    got = to_host(out)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    # elementwise results and their casts are exact; a float32 sum is within its bound
    atol = sum_error(a + b) if name == "full sum into float64" else 0
    np.testing.assert_allclose(got, ref, rtol=0, atol=atol)


def test_zero_d_out_of_a_full_reduction_on_host_and_device(side):
    x = rng.standard_normal((4, 50)).astype(np.float32)
    total = tt.fuse(lambda x: tt.sum(x))
    for dtype in (np.float32, np.float64):
        out = zeros(side, (), dtype)
        assert total(*on(side, x), out=out) is out
        value = to_host(out)
        assert value.shape == () and value.dtype == dtype
        np.testing.assert_allclose(value, np.sum(x, dtype=np.float64), atol=sum_error(x))


# --------------------------------------------------------------------------------------------
# item 12: keepdims and negative integer powers


def test_keepdims_is_checked_as_numpy_checks_it(side):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError):
        np.sum(x, keepdims="yes")
    with pytest.raises(TypeError, match="keepdims must be a bool, got 'yes'"):
        tt.fuse(lambda x: tt.sum(x, keepdims="yes"))(*on(side, x))
    with pytest.raises(TypeError, match="keepdims must be a bool"):
        tt.fuse(lambda x: tt.mean(x, axis=0, keepdims=None))(*on(side, x))
    got = tt.fuse(lambda x: tt.sum(x, axis=0, keepdims=1))(*on(side, x))  # NumPy takes ints
    assert_same(back(got, side), np.sum(x, axis=0, keepdims=1))


def test_integer_to_negative_integer_power_raises_as_in_numpy(side):
    x = np.arange(1, 7, dtype=np.int32).reshape(2, 3)
    with pytest.raises(ValueError, match="Integers to negative integer powers are not allowed"):
        x ** np.int32(-1)
    const = tt.fuse(lambda x: x**-1)
    scalar = tt.fuse(lambda x, e: x**e)
    shifted = tt.fuse(lambda x, e: x ** (e - 3))
    calls = [
        lambda: const(*on(side, x)),
        lambda: scalar(*on(side, x), -2),
        lambda: scalar(*on(side, x), np.int32(-1)),
        lambda: shifted(*on(side, x), 2),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="Integers to negative integer powers are not"):
            call()
    # the same programs run with non-negative exponents: each call checks its own values
    assert_same(back(scalar(*on(side, x), 2), side), x**2)
    assert_same(back(shifted(*on(side, x), 5), side), x ** (5 - 3))
    assert scalar.cache_info()["misses"] == 2  # a Python int and an int32: a program each
    # a float exponent gives floats, as NumPy computes them
    assert_same(back(scalar(*on(side, x), -1.0), side), x**-1.0)


def test_negative_entries_of_an_integer_array_exponent_give_zero_on_the_device(side):
    # the documented limit (docs/fusion.md): NumPy raises, a kernel cannot; on the device such
    # entries are 0, and an exponent array passed on the host is read first, raising as NumPy
    x = np.array([2, 3, 4, 1], np.int32)
    e = np.array([3, -1, 2, -2], np.int32)
    power = tt.fuse(lambda x, e: x**e)
    if side == "host":
        with pytest.raises(ValueError, match="Integers to negative integer powers"):
            power(x, e)
        return
    got = back(power(*on(side, x, e)), side)
    assert_same(got, np.where(e < 0, 0, x ** np.maximum(e, 0)).astype(np.int32))


# --------------------------------------------------------------------------------------------
# item 13: keyword arguments, what fuse accepts, ndarray methods, the name of out


def test_keyword_arguments_bind_by_the_signature_and_hit_the_right_cache_entry(side):
    def affine(x, scale=1.0, *, shift=0.0):
        return x * scale + shift

    fused = tt.fuse(affine)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    cases = [
        ((), {}),
        ((2.0,), {}),
        ((), {"scale": 2.0}),  # the call before, by keyword: the same program
        ((), {"scale": 3.0}),  # another value: the same program
        ((), {"shift": 1.5}),
        ((), {"scale": np.float64(2.0), "shift": 1.0}),  # a strong float64: another dtype
    ]
    for args, kwargs in cases:
        assert_same(back(fused(*on(side, x), *args, **kwargs), side), affine(x, *args, **kwargs))
    info = fused.cache_info()
    # programs: (x), (x, scale), (x; shift), (x, float64 scale; shift); the other calls hit
    assert info["misses"] == 4 and info["hits"] == 2, info
    assert fused.explain(x, scale=2.0).kernels == 1
    with pytest.raises(TypeError, match=r"affine\(\): got an unexpected keyword argument 'bias'"):
        fused(*on(side, x), bias=1.0)
    with pytest.raises(TypeError, match="argument 'shift' of affine is a str"):
        fused(*on(side, x), shift="a")


def test_var_positional_and_var_keyword_functions(side):
    @tt.fuse
    def weighted(*xs, **weights):
        total = 0.0
        for k, x in enumerate(xs):
            total = total + x * weights.get(f"w{k}", 1.0)
        return total

    a, b = rng.standard_normal((2, 4, 6)).astype(np.float32)
    assert_same(back(weighted(*on(side, a, b), w1=3.0), side), a + b * np.float32(3.0))
    assert_same(back(weighted(*on(side, a), w0=2.0), side), a * np.float32(2.0))
    assert_same(back(weighted(*on(side, a, b)), side), a + b)


def test_what_fuse_refuses_at_decoration():
    with pytest.raises(TypeError, match=r"the NumPy ufunc exp .*tt.fuse\(lambda x: np.exp\(x\)\)"):
        tt.fuse(np.exp)
    with pytest.raises(TypeError, match="fuse expects a function"):
        tt.fuse(3)
    with pytest.raises(TypeError, match="parameter named 'out'"):
        tt.fuse(lambda x, out: x)
    with pytest.raises(TypeError, match="parameter named 'stream'"):
        tt.fuse(lambda x, *, stream=0: x)


def test_array_methods_point_to_tt_functions(side):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(TraceError, match=r"\.any cannot be traced .*use tt.any\(x\)"):
        tt.fuse(lambda x: (x > 0).any())(*on(side, x))
    with pytest.raises(TraceError, match=r"\.mean cannot be traced .*use tt.mean\(x\)"):
        tt.fuse(lambda x: x.mean(axis=0))(*on(side, x))
    with pytest.raises(TraceError, match=r"\.reshape cannot be traced .*no tt.\* equivalent"):
        tt.fuse(lambda x: x.reshape(3, 2))(*on(side, x))
    with pytest.raises(AttributeError):  # no ndarray attribute: still an AttributeError
        tt.fuse(lambda x: x.no_such_attribute)(*on(side, x))


def test_one_out_array_is_named_out(side):
    x = np.ones((2, 3), np.float32)
    wrong = zeros(side, 3, np.float32)
    with pytest.raises(ValueError, match=r"^out has shape \(3,\)"):
        ops.softmax(*on(side, x), out=wrong)
    with pytest.raises(ValueError, match=r"^out has shape \(3,\)"):
        tt.fuse(lambda x: x + 1)(*on(side, x), out=wrong)
    with pytest.raises(ValueError, match=r"^out\[1\] has shape \(3,\)"):
        tt.fuse(lambda x: (x + 1, x - 1))(
            *on(side, x), out=(zeros(side, (2, 3), np.float32), wrong)
        )
