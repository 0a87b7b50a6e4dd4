"""``math.*`` in kernels computes what CUDA computes (issue 20): IEEE results, NaN and +-inf in
and out, no exception, and the result type numba-cuda gives the call (float32 in, float32 out).

Every function numba-cuda accepts in kernels runs in a kernel over special values (+-0, +-inf,
NaN, subnormals, the largest finite, out-of-domain arguments) in float32 and float64 and is
compared with NumPy's ufuncs. The results are written to float64 arrays, so a result that was not
rounded to float32 shows. Tolerances, per function and type: CUDA's documented maximum error in
ulp (below); 0 ulp, the same bits, where CUDA rounds correctly. These value tests hold on a GPU
too (the GPU tier runs them); the typing and refusal tests are the simulator's own.
"""

import functools
import math
from decimal import Decimal, getcontext, localcontext
from fractions import Fraction

import numpy as np
import pytest
from helpers import SIMULATED, on
from numba import cuda

from tessera_tile._runtime import compat
from tessera_tile.sim import cuda_math, ints

# CUDA's maximum error in ulp against the correctly rounded result, (float32, float64): CUDA C++
# Programming Guide, "Mathematical Functions" appendix, standard functions, compute capability
# 5.2 and later, without --use_fast_math ("the absolute value of the difference in ulps between
# the correctly rounded result and the result returned by the CUDA library function"). erf 2/2,
# erfc 4/5, tgamma 5/10; lgamma's 6/4 hold outside (-10.001, -2.264) for float32 and
# (-23.0001, -2.2637) for float64: the values below avoid those intervals except at the poles
# (-10, exact).
CUDA_ULPS = {
    "acos": (2, 2), "acosh": (4, 3), "asin": (2, 2), "asinh": (3, 3), "atan": (2, 2),
    "atan2": (3, 2), "atanh": (3, 2), "cos": (2, 2), "cosh": (2, 1), "erf": (2, 2),
    "erfc": (4, 5), "exp": (2, 1), "exp2": (2, 1), "expm1": (1, 1), "gamma": (5, 10),
    "hypot": (3, 2), "lgamma": (6, 4), "log": (1, 1), "log10": (2, 1), "log1p": (1, 1),
    "log2": (1, 1), "pow": (4, 2), "sin": (2, 2), "sinh": (3, 2), "tan": (4, 2), "tanh": (2, 1),
}  # fmt: skip

UNARY_UFUNCS = {
    "acos": np.arccos, "acosh": np.arccosh, "asin": np.arcsin, "asinh": np.arcsinh,
    "atan": np.arctan, "atanh": np.arctanh, "cos": np.cos, "cosh": np.cosh, "exp": np.exp,
    "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log10": np.log10, "log1p": np.log1p,
    "log2": np.log2, "sin": np.sin, "sinh": np.sinh, "tan": np.tan, "tanh": np.tanh,
}  # fmt: skip
BINARY_UFUNCS = {"atan2": np.arctan2, "hypot": np.hypot, "pow": np.power}
# correctly rounded in CUDA (0 ulp) and in NumPy's loop of the type itself: the same bits
EXACT_UNARY = {"sqrt": np.sqrt, "fabs": np.fabs, "floor": np.floor, "ceil": np.ceil,
               "trunc": np.trunc}  # fmt: skip
EXACT_BINARY = {"fmod": np.fmod, "copysign": np.copysign, "nextafter": np.nextafter}
PREDICATES = {"isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite}
NO_UFUNC = ("erf", "erfc", "gamma", "lgamma")  # NumPy has none: see special_function_reference
FLOATS = (np.float32, np.float64)


def special_values(dtype, small: bool = False) -> np.ndarray:
    fi = np.finfo(dtype)
    tiny, normal, big = fi.smallest_subnormal, fi.smallest_normal, fi.max
    common = [0.0, -0.0, np.inf, -np.inf, np.nan, tiny, big, -big, 1.0, -1.0, 0.5, -2.0, 3.0]
    if small:  # for the pairs of binary functions
        return np.array(common + [2.5, -3.0], dtype)
    largest_subnormal = np.nextafter(dtype(normal), dtype(0))
    more = [-tiny, largest_subnormal, normal, -normal, -0.5, 2.0, 1.5, -1.5, -10.0, 10.0, 0.1,
            100.0, -100.0, 1000.0, -1000.0, 1e30, fi.eps]  # fmt: skip
    return np.array(common + more, dtype)


def pairs(dtype):
    v = special_values(dtype, small=True)
    x, y = np.meshgrid(v, v)
    return x.ravel(), y.ravel()


_SOURCE = """
@cuda.jit
def kernel({params}, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = {expr}
"""


@functools.cache
def elementwise(expr: str, params: str = "x"):
    """A kernel ``out[i] = expr`` (of ``x[i]``, ``y[i]``...) in a module that imports ``math``."""
    namespace = {"cuda": cuda, "math": math}
    exec(_SOURCE.format(params=params, expr=expr), namespace)
    return namespace["kernel"]


def launch(kernel, *args):
    out = args[-1]
    kernel[(out.size + 127) // 128, 128](*args)


def call_in_kernel(name: str, *args: np.ndarray, out_dtype=np.float64) -> np.ndarray:
    params = ", ".join("xyz"[: len(args)])
    expr = f"math.{name}({', '.join(f'{p}[i]' for p in 'xyz'[: len(args)])})"
    out = np.zeros(args[0].size, out_dtype)
    launch(elementwise(expr, params), *args, out)
    return out


def as_result(out64: np.ndarray, dtype, what: str) -> np.ndarray:
    """The float64 results as ``dtype``, after checking each is a ``dtype`` value (rounded)."""
    narrowed = out64.astype(dtype)
    wide = narrowed.astype(np.float64)
    same = (wide == out64) | (np.isnan(wide) & np.isnan(out64))
    assert same.all(), f"{what}: not {np.dtype(dtype).name} values: {out64[~same]}"
    return narrowed


def ordered(a: np.ndarray) -> np.ndarray:
    """Float bits as integers in the order of the floats (-0.0 and +0.0 both 0)."""
    bits = a.view(np.int32 if a.dtype == np.float32 else np.int64).astype(np.int64)
    sign = np.int64(-(2**31)) if a.dtype == np.float32 else np.iinfo(np.int64).min
    return np.where(bits < 0, sign - bits, bits)


def assert_cuda_close(got: np.ndarray, ref: np.ndarray, ulps: int, what: str, inputs) -> None:
    """NaN where the reference is NaN; the same bits where it is infinite or zero, or where the
    function is correctly rounded (``ulps == 0``); else within ``ulps`` units in the last place."""
    assert got.dtype == ref.dtype
    nan = np.isnan(ref)
    bad = np.isnan(got) != nan
    exact = ~nan & (~np.isfinite(ref) | (ref == 0) | (ulps == 0))
    unsigned = np.uint32 if got.dtype == np.float32 else np.uint64
    bad |= exact & (got.view(unsigned) != ref.view(unsigned))
    close = ~nan & ~exact
    steps = zip(ordered(got[close]).tolist(), ordered(ref[close]).tolist(), strict=True)
    bad[close] |= np.array([abs(a - b) for a, b in steps], dtype=np.int64) > ulps  # Python ints
    shown = [(tuple(a[i] for a in inputs), got[i], ref[i]) for i in np.flatnonzero(bad)[:8]]
    assert not bad.any(), f"{what}: (inputs, got, expected) {shown}"


def reference(ufunc, dtype, *args) -> np.ndarray:
    """The float64 ufunc, rounded once to ``dtype`` (NumPy's float32 loops are not all
    correctly rounded)."""
    with np.errstate(all="ignore"):
        return ufunc(*(a.astype(np.float64) for a in args)).astype(dtype)


# -- the whole table against NumPy --------------------------------------------------------------


def test_the_table_covers_every_function_numba_cuda_accepts():
    tested = {*UNARY_UFUNCS, *BINARY_UFUNCS, *EXACT_UNARY, *EXACT_BINARY, *PREDICATES, *NO_UFUNC}
    tested |= {"remainder", "degrees", "radians", "ldexp", "frexp", "modf"}
    assert tested == set(cuda_math.SUPPORTED)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(UNARY_UFUNCS))
def test_unary_functions_against_numpy(name, dtype):
    x = special_values(dtype)
    got = as_result(call_in_kernel(name, x), dtype, name)
    ulps = CUDA_ULPS[name][dtype == np.float64]
    assert_cuda_close(got, reference(UNARY_UFUNCS[name], dtype, x), ulps, name, [x])


@functools.cache
def through_a_closure(name: str):
    """A kernel made in a factory that captures ``math.<name>`` as a variable (valid numba-cuda:
    a closure variable is a constant of the kernel)."""
    fn = getattr(math, name)

    @cuda.jit
    def kernel(x, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = fn(x[i])

    return kernel


@pytest.mark.parametrize("name", sorted({*UNARY_UFUNCS, *EXACT_UNARY}))
def test_math_functions_captured_in_a_closure_follow_cuda_too(name):
    # they raised ValueError / OverflowError on special values (Python's math)
    x = special_values(np.float64)
    out = np.zeros(x.size)
    launch(through_a_closure(name), x, out)
    np.testing.assert_array_equal(out, call_in_kernel(name, x))  # as math.<name>(x) gives


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(EXACT_UNARY))
def test_correctly_rounded_unary_functions_give_numpys_bits(name, dtype):
    x = special_values(dtype)
    got = as_result(call_in_kernel(name, x), dtype, name)
    with np.errstate(invalid="ignore"):
        ref = EXACT_UNARY[name](x)
    assert_cuda_close(got, ref, 0, name, [x])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(BINARY_UFUNCS))
def test_binary_functions_against_numpy(name, dtype):
    x, y = pairs(dtype)
    got = as_result(call_in_kernel(name, x, y), dtype, name)
    ulps = CUDA_ULPS[name][dtype == np.float64]
    assert_cuda_close(got, reference(BINARY_UFUNCS[name], dtype, x, y), ulps, name, [x, y])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(EXACT_BINARY))
def test_correctly_rounded_binary_functions_give_numpys_bits(name, dtype):
    x, y = pairs(dtype)
    got = as_result(call_in_kernel(name, x, y), dtype, name)
    with np.errstate(all="ignore"):
        ref = EXACT_BINARY[name](x, y)
    assert_cuda_close(got, ref, 0, name, [x, y])


def ieee_remainder(x: float, y: float) -> float:
    """IEEE 754 remainder, exactly: x - n*y with n the integer nearest x/y, ties to even."""
    if math.isnan(x) or math.isnan(y) or math.isinf(x) or y == 0:
        return math.nan
    if math.isinf(y):
        return x
    exact = Fraction(x) - round(Fraction(x) / Fraction(y)) * Fraction(y)
    return math.copysign(float(exact), x) if exact == 0 else float(exact)


@pytest.mark.parametrize("dtype", FLOATS)
def test_remainder_is_ieee_exactly(dtype):
    x, y = pairs(dtype)
    got = as_result(call_in_kernel("remainder", x, y), dtype, "remainder")
    ref = np.array([ieee_remainder(float(a), float(b)) for a, b in zip(x, y, strict=True)], dtype)
    assert_cuda_close(got, ref, 0, "remainder", [x, y])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name, factor", [("degrees", 180 / math.pi), ("radians", math.pi / 180)])
def test_degrees_and_radians_multiply_in_the_type(name, factor, dtype):
    # numba-cuda lowers them as one multiply by the constant in the argument's type
    x = special_values(dtype)
    got = as_result(call_in_kernel(name, x), dtype, name)
    with np.errstate(over="ignore"):
        assert_cuda_close(got, x * dtype(factor), 0, name, [x])


def special_function_reference(name: str, x: float) -> float:
    """erf, erfc, gamma, lgamma: the special values the CUDA Math API documents (C99 Annex F),
    else Python's math (the C library) in double, an overflow being inf."""
    if math.isnan(x):
        return math.nan
    pole = x <= 0 and (x.is_integer() or math.isinf(x))  # 0, -1, -2, ..., -inf
    if name == "gamma":
        if x == 0:
            return math.copysign(math.inf, x)  # tgamma(+-0) = +-inf
        if pole:
            return math.nan  # tgamma(negative integer) and tgamma(-inf) = NaN
    if name == "lgamma" and (pole or math.isinf(x)):
        return math.inf  # lgamma(non-positive integer) and lgamma(+-inf) = +inf
    if name in ("erf", "erfc") and math.isinf(x):
        return {"erf": math.copysign(1.0, x), "erfc": 0.0 if x > 0 else 2.0}[name]
    try:
        return getattr(math, name)(x)
    except OverflowError:  # gamma of a large x, or of a tiny one (~1/x); lgamma of a huge one
        return math.copysign(math.inf, x) if name == "gamma" else math.inf


# Correctly rounded references for a GPU. CUDA's bounds are against the correctly rounded
# result, and Python's math is not one: gamma and lgamma are CPython's own Lanczos sums with no
# stated bound (math.lgamma(1.5) is 14.7 ulp below ln(sqrt(pi) / 2); an H200 gave 0.7 ulp), erf
# and erfc the platform's libm. These are evaluated in decimal (60 digits, more where erf
# cancels) and rounded once. The simulator computes with Python's math: its tier compares with
# that, as before.
_DIGITS = 60


def _pi() -> Decimal:
    """pi in the context's precision (Machin: 16 atan(1/5) - 4 atan(1/239))."""
    eps = Decimal(10) ** -(getcontext().prec + 2)

    def atan_inv(n: int) -> Decimal:
        power = total = Decimal(1) / n
        k = 1
        while power > eps:
            power /= n * n
            k += 2
            total += (-1) ** (k // 2) * power / k
        return total

    return 16 * atan_inv(5) - 4 * atan_inv(239)


def _bernoulli(n: int) -> list[Fraction]:
    """B_0 ... B_n (Akiyama-Tanigawa; B_1 = +1/2, unused)."""
    a, out = [Fraction(0)] * (n + 1), []
    for m in range(n + 1):
        a[m] = Fraction(1, m + 1)
        for j in range(m, 0, -1):
            a[j - 1] = j * (a[j - 1] - a[j])
        out.append(a[0])
    return out


# Stirling's series of ln Gamma(z): B_2k / (2k (2k - 1) z^(2k - 1)), k = 1..12. For z >= 40 the
# first term left out, |B_26| / (650 z^25), is below 3e-37.
_STIRLING = [b / (2 * k * (2 * k - 1)) for k, b in enumerate(_bernoulli(24)[2::2], start=1)]


def _sin_pi(x: Decimal) -> Decimal:
    t = _pi() * (x % 2)  # x is a binary fraction: the reduction is exact
    term = total = t
    n = 1
    while abs(term) > abs(total) * Decimal(10) ** -(_DIGITS + 5):
        term *= -t * t / ((n + 1) * (n + 2))
        total += term
        n += 2
    return total


def _lgamma(x: Decimal) -> Decimal:
    """ln |Gamma(x)| (x not a pole): reflection below 0, then the recurrence up to z >= 40."""
    if x < 0:
        return _pi().ln() - abs(_sin_pi(x)).ln() - _lgamma(1 - x)
    z, product = x, Decimal(1)
    while z < 40:
        product *= z
        z += 1
    total = (z - Decimal("0.5")) * z.ln() - z + (2 * _pi()).ln() / 2
    power = z
    for c in _STIRLING:
        total += Decimal(c.numerator) / Decimal(c.denominator) / power
        power *= z * z
    return total - product.ln()


def _erf(x: Decimal, digits: int) -> Decimal:
    total = term = x
    n = 0
    while abs(term) > Decimal(10) ** -(digits + 5):
        n += 1
        term *= -x * x / n
        total += term / (2 * n + 1)
    return total * 2 / _pi().sqrt()


def correctly_rounded_reference(name: str, x: float) -> float:
    """erf, erfc, gamma, lgamma of ``x`` correctly rounded to float64; NaN, zeros, infinities
    and poles as :func:`special_function_reference` gives them (exact)."""
    gammas = name in ("gamma", "lgamma")
    if not math.isfinite(x) or x == 0 or (gammas and x < 0 and x.is_integer()):
        return special_function_reference(name, x)
    if name == "lgamma" and x in (1.0, 2.0):
        return 0.0  # exactly (the decimal sum is off by ~1e-37)
    if not gammas and abs(x) >= 28:
        # erfc(x) < exp(-x^2) / (x sqrt(pi)) < 1e-342 for x >= 28: below half the smallest
        # subnormal, so erf rounds to +-1 and erfc to 0 or 2
        return {"erf": math.copysign(1.0, x), "erfc": 0.0 if x > 0 else 2.0}[name]
    with localcontext() as ctx:
        # erf's Taylor terms grow to exp(x^2) before they cancel, and erfc = 1 - erf falls to
        # exp(-x^2): x^2 / ln 10 digits more for each
        ctx.prec = _DIGITS + (0 if gammas else 2 * math.ceil(x * x / math.log(10)))
        d = Decimal(x)  # exact
        if not gammas:
            erf = _erf(d, ctx.prec)
            return float(erf if name == "erf" else 1 - erf)
        lg = _lgamma(d)
        if name == "lgamma":
            return float(lg)
        sign = -1 if x < 0 and math.ceil(-x) % 2 else 1  # Gamma < 0 on (-1, 0), (-3, -2)...
        return sign * math.inf if lg > 710 else float(sign * lg.exp())  # e^710 > float64's max


@pytest.mark.parametrize(
    "name, x, expected",
    [
        ("lgamma", 0.5, "0.57236494292470008707171367567652935582364740645766"),  # ln sqrt(pi)
        ("lgamma", 1.5, "-0.12078223763524522234551844578164721225185272790260"),
        ("lgamma", -0.5, "1.26551212348464539648894579713470592389914754081791"),  # ln 2 sqrt(pi)
        ("gamma", 0.5, "1.77245385090551602729816748334114518279754945612239"),  # sqrt(pi)
        ("gamma", -1.5, "2.36327180120735470306422331112152691039673260816318"),  # 4 sqrt(pi) / 3
        ("gamma", 10.0, "362880"),
        ("erf", 1.0, "0.84270079294971486934122063508260925929606699796630"),
        ("erfc", 10.0, "2.0884875837625447570007862949577886115608181193212e-45"),
    ],
)
def test_the_decimal_reference_against_known_values(name, x, expected):
    assert correctly_rounded_reference(name, x) == float(Decimal(expected))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", NO_UFUNC)
def test_erf_erfc_gamma_lgamma(name, dtype):
    x = special_values(dtype)
    got = as_result(call_in_kernel(name, x), dtype, name)
    reference = special_function_reference if SIMULATED else correctly_rounded_reference
    with np.errstate(over="ignore"):
        ref = np.array([reference(name, float(v)) for v in x]).astype(dtype)
    assert_cuda_close(got, ref, CUDA_ULPS[name][dtype == np.float64], name, [x])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(PREDICATES))
def test_predicates(name, dtype):
    x = special_values(dtype)
    got = call_in_kernel(name, x, out_dtype=np.int8)
    np.testing.assert_array_equal(got, PREDICATES[name](x).astype(np.int8), err_msg=name)


def test_predicates_of_integers():
    n = np.array([0, -5, 2**31 - 1], np.int32)
    for name, expected in (("isnan", 0), ("isinf", 0), ("isfinite", 1)):
        np.testing.assert_array_equal(call_in_kernel(name, n, out_dtype=np.int8), expected)


@cuda.jit
def frexp_kernel(x, mantissa, exponent):
    i = cuda.grid(1)
    if i < x.size:
        mantissa[i], exponent[i] = math.frexp(x[i])


@cuda.jit
def modf_kernel(x, fraction, integral):
    i = cuda.grid(1)
    if i < x.size:
        fraction[i], integral[i] = math.modf(x[i])


@cuda.jit
def ldexp_kernel(x, n, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = math.ldexp(x[i], n[i])


@pytest.mark.parametrize("dtype", FLOATS)
def test_frexp_and_modf_give_numpys_bits(dtype):
    x = special_values(dtype)
    mantissa, exponent = np.zeros(x.size), np.zeros(x.size, np.int64)
    launch(frexp_kernel, x, mantissa, exponent)
    ref_mantissa, ref_exponent = np.frexp(x)  # frexp(+-inf) = (+-inf, 0), frexp(NaN) = (NaN, 0)
    assert_cuda_close(as_result(mantissa, dtype, "frexp"), ref_mantissa, 0, "frexp", [x])
    np.testing.assert_array_equal(exponent, ref_exponent)

    fraction, integral = np.zeros(x.size), np.zeros(x.size)
    launch(modf_kernel, x, fraction, integral)
    ref_fraction, ref_integral = np.modf(x)  # modf(+-inf) = (+-0, +-inf)
    assert_cuda_close(as_result(fraction, dtype, "modf"), ref_fraction, 0, "modf", [x])
    assert_cuda_close(as_result(integral, dtype, "modf"), ref_integral, 0, "modf", [x])


@pytest.mark.parametrize("dtype", FLOATS)
def test_ldexp_gives_numpys_bits(dtype):
    values = special_values(dtype)
    exponents = np.array([0, 1, -1, 24, -24, 200, -200, 1100, -1100, 2**31 - 1, -(2**31)], np.int32)
    x, n = (a.ravel() for a in np.meshgrid(values, exponents))
    out = np.zeros(x.size)
    launch(ldexp_kernel, x, n, out)
    with np.errstate(all="ignore"):
        ref = np.ldexp(x, n)  # NumPy's loop of the type: correctly rounded, overflow to inf
    assert_cuda_close(as_result(out, dtype, "ldexp"), ref, 0, "ldexp", [x, n])


@pytest.mark.parametrize(
    "name, x, expected",
    [
        (
            "exp",
            [0.0, -np.inf, np.inf, np.nan, 20.0, -20.0],
            [1.0, 0.0, np.inf, np.nan, np.inf, 0.0],
        ),
        ("log", [0.0, -0.0, -1.0, 1.0, np.inf], [-np.inf, -np.inf, np.nan, 0.0, np.inf]),
        ("sqrt", [-1.0, 4.0, -0.0, np.inf], [np.nan, 2.0, -0.0, np.inf]),
        ("floor", [-0.5, 2.5, -np.inf], [-1.0, 2.0, -np.inf]),
        ("tanh", [np.inf, -np.inf, -0.0], [1.0, -1.0, -0.0]),
    ],
)
def test_float16_functions_return_float16(name, x, expected):
    # numba-cuda computes these in half precision (cuda.fp16.hexp...); on exact and special
    # values every correct implementation agrees
    x = np.array(x, np.float16)
    got = as_result(call_in_kernel(name, x), np.float16, name)
    np.testing.assert_array_equal(
        got.view(np.uint16)[~np.isnan(got)],
        np.array(expected, np.float16).view(np.uint16)[~np.isnan(got)],
    )
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))


# -- what issue 20 names, and issue 19's all -inf row --------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_domain_errors_are_ieee_values_not_exceptions(dtype):
    cases = [
        ("log", (0.0,), -np.inf), ("log", (-1.0,), np.nan), ("sqrt", (-1.0,), np.nan),
        ("exp", (1000.0,), np.inf), ("acos", (2.0,), np.nan), ("pow", (-8.0, 1 / 3), np.nan),
        ("pow", (0.0, -1.0), np.inf), ("pow", (-0.0, -1.0), -np.inf), ("log1p", (-1.0,), -np.inf),
        ("atanh", (1.0,), np.inf), ("cosh", (-1000.0,), np.inf), ("fmod", (1.0, 0.0), np.nan),
        ("remainder", (np.inf, 1.0), np.nan), ("gamma", (-0.0,), -np.inf),
        ("lgamma", (-3.0,), np.inf), ("sin", (np.inf,), np.nan),
    ]  # fmt: skip
    for name, args, expected in cases:
        got = call_in_kernel(name, *(np.array([a], dtype) for a in args))[0]
        assert got == expected or (np.isnan(got) and np.isnan(expected)), (name, args, got)


@cuda.jit
def row_logsumexp(x, out):
    """One thread per row: log(sum(exp(x))) without the max shift, so a row of -inf sums to 0."""
    r = cuda.grid(1)
    if r < x.shape[0]:
        s = 0.0
        for c in range(x.shape[1]):
            s += math.exp(x[r, c])
        out[r] = math.log(s)


@cuda.jit
def elementwise_log(x, out):
    r, c = cuda.grid(2)
    if r < x.shape[0] and c < x.shape[1]:
        out[r, c] = math.log(x[r, c])


@pytest.mark.parametrize("dtype", FLOATS)
def test_log_of_a_row_of_zeros_is_minus_inf(side, dtype):
    x = np.zeros((3, 33), dtype)
    x[1] = np.linspace(0.5, 2.0, 33)
    out = np.full(x.shape, 7.0, dtype)
    (dx, dout) = on(side, x, out)
    elementwise_log[(1, 2), (3, 32)](dx, dout)
    got = dout if side == "host" else dout.copy_to_host()
    expected = reference(np.log, dtype, x)
    assert expected[0].tolist() == [-np.inf] * 33
    ulps = CUDA_ULPS["log"][dtype == np.float64]
    assert_cuda_close(got.ravel(), expected.ravel(), ulps, "log", [x.ravel()])

    rows = np.full((3, 40), -np.inf, dtype)
    rows[1] = np.linspace(-3.0, 1.0, 40)
    rows[2, 5] = 0.0
    sums = np.zeros(3)
    (drows, dsums) = on(side, rows, sums)
    row_logsumexp[1, 32](drows, dsums)
    got = dsums if side == "host" else dsums.copy_to_host()
    with np.errstate(divide="ignore"):
        expected = np.log(np.exp(rows.astype(np.float64)).sum(axis=1))
    assert got[0] == -np.inf and got[2] == 0.0
    # the sum may accumulate in dtype (the simulator keeps NumPy's float32): n roundings of u
    # each, and 2 ulp (4 u) per exp, change log(sum) by at most (n + 4) u; log adds 1 ulp
    u = np.finfo(dtype).eps / 2
    atol = (rows.shape[1] + 4) * u
    np.testing.assert_allclose(got[1], expected[1], rtol=2 * u, atol=atol)


# -- the simulator's own: typing, refusals, the swap ---------------------------------------------

sim_only = pytest.mark.sim_only(reason="calls the simulator's math module directly")
INT32 = ints.NARROW[np.int32]
# Python types of the values a simulated kernel holds, and a value of each
VALUES = {np.float16: np.float16(1), np.float32: np.float32(1), np.float64: np.float64(1),
          float: 1.0, int: 1, bool: True, INT32: INT32(1), np.int64: np.int64(1),
          np.uint64: np.uint64(1)}  # fmt: skip


def result_types(result) -> tuple:
    return tuple(map(type, result)) if isinstance(result, tuple) else (type(result),)


def expected_types(numba_type) -> tuple:
    elements = getattr(numba_type, "types", (numba_type,))
    return tuple(bool if t == cuda_math.numba_types.boolean else compat.as_dtype(t).type
                 for t in elements)  # fmt: skip


@sim_only
@pytest.mark.parametrize("name", sorted(cuda_math.SUPPORTED))
def test_every_call_returns_the_type_numba_cuda_resolves(name):
    arity = len(cuda_math.SUPPORTED[name][0].args)
    fn = getattr(cuda_math.MODULE, name)
    for types in ((t,) * arity for t in VALUES):
        args = [VALUES[t] for t in types]
        numba_type = cuda_math.numba_result_type(name, tuple(map(cuda_math._numba_type, args)))
        got = result_types(fn(*args))
        expected = expected_types(numba_type)
        if name == "frexp":  # the exponent is the simulator's int32 (Numba's integer typing)
            expected = (expected[0], INT32)
        assert got == expected, (name, types, got, expected)


@sim_only
@pytest.mark.parametrize(
    "name, args, expected",
    [
        # from numba-cuda 0.30's compiled signatures (compile_ptx's return types)
        ("exp", (np.float32(1),), (np.float32,)),
        ("sqrt", (2,), (np.float64,)),  # an integer is typed int64: float64
        ("sqrt", (INT32(2),), (np.float64,)),
        ("floor", (np.float32(1.5),), (np.float32,)),  # a float, unlike Python and Numba's CPU
        ("floor", (2.5,), (np.float64,)),
        ("exp", (np.float16(1),), (np.float16,)),  # numba-cuda's half-precision functions
        ("tan", (np.float16(1),), (np.float32,)),  # no half version: float32
        ("pow", (np.float32(2), INT32(3)), (np.float32,)),  # powif
        ("pow", (np.float32(2), 3), (np.float64,)),  # a Python int is int64: double pow
        ("atan2", (np.float32(1), 1.0), (np.float64,)),
        ("ldexp", (np.float32(1), 3), (np.float32,)),
        ("frexp", (np.float32(3),), (np.float32, INT32)),
        ("modf", (np.float16(1.5),), (np.float64, np.float64)),
        ("isnan", (3,), (bool,)),
    ],
)
def test_result_types_numba_cuda_gives(name, args, expected):
    assert result_types(getattr(cuda_math.MODULE, name)(*args)) == expected


@cuda.jit
def unsupported_function(x, out):
    out[0] = math.cbrt(x[0])


@cuda.jit
def two_argument_log(x, out):
    out[0] = math.log(x[0], 2.0)


@sim_only
@pytest.mark.parametrize("kernel", [unsupported_function, two_argument_log])
def test_what_numba_cuda_refuses_is_refused(kernel):
    # numba-cuda has no typing for these (the compile tier checks the same list against it)
    with pytest.raises(compat.NumbaTypeError, match=r"math\.(cbrt|log)"):
        kernel[1, 1](np.ones(1), np.zeros(1))


@sim_only
def test_a_complex_argument_is_refused():
    with pytest.raises(compat.NumbaTypeError, match="complex128"):
        cuda_math.MODULE.exp(1j)


from math import exp as imported_exp  # noqa: E402  (a name imported from math, swapped too)


@cuda.jit
def uses_an_imported_name(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = imported_exp(x[i])


def test_names_imported_from_math_follow_cuda_and_are_restored():
    x = np.array([1000.0, -np.inf, 1.0], np.float32)
    out = np.zeros(3)
    uses_an_imported_name[1, 3](x, out)
    assert out[0] == np.inf and out[1] == 0.0
    assert out[2] == np.float64(np.float32(math.e))  # float32's e, not the double
    assert globals()["imported_exp"] is math.exp and globals()["math"] is math


_OTHER_MODULE = """
import math as m
from numba import cuda

@cuda.jit(device=True)
def safe_log(v):
    return m.log(v)
"""


def test_a_device_function_in_another_module_follows_cuda():
    namespace: dict = {}
    exec(_OTHER_MODULE, namespace)
    safe_log = namespace["safe_log"]

    @cuda.jit
    def kernel(x, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = safe_log(x[i])

    out = np.zeros(2)
    kernel[1, 2](np.array([0.0, -1.0]), out)
    assert out[0] == -np.inf and np.isnan(out[1])
    assert namespace["m"] is math
