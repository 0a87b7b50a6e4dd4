"""The ``math`` module a simulated kernel sees: CUDA's semantics, not Python's.

Python's ``math`` raises where CUDA returns an IEEE value (``log(0.0)`` is -inf, ``sqrt(-1.0)``
NaN, ``exp(1000.0)`` inf) and always computes and returns a double. For every ``math`` function
numba-cuda accepts in a kernel (the ones its typing registry ``cudamath`` declares), the twin
here:

* gives its result the type numba-cuda gives the call, resolved from that registry with Numba's
  own conversion rules (``math.exp`` of a float32 is a float32, of an integer a float64;
  ``math.pow(float32, int32)`` is float32, ``math.pow(float32, int64)`` float64);
* computes in double, where Python raises falls back to NumPy's IEEE result (C99 Annex F: NaN
  and +-inf in and out, no exception), and rounds once to the result type. Rounding the double
  result is within CUDA's documented error bounds for every function (0.5 ulp plus the double's
  error); functions that CUDA rounds correctly (``sqrt``, ``fmod``, ``floor``, ``ldexp``...) give
  the same bits as the GPU;
* refuses, as numba-cuda does, argument types it has no signature for (``NumbaTypeError``).

Every other ``math`` function (``cbrt``, ``factorial``, two-argument ``log``...) is refused when
called, as numba-cuda refuses to compile it. :func:`swapped_math` points a kernel module's
``math`` (and names imported with ``from math import ...``) at these twins for one launch.
"""

from __future__ import annotations

import contextlib
import math
import types

import numpy as np
from numba.cuda import types as numba_types

from .._runtime import compat
from . import ints

__all__ = ["MODULE", "SUPPORTED", "numba_result_type", "swapped_math"]

_CONSTANTS = ("e", "inf", "nan", "pi", "tau")
# the functions numba-cuda types in kernels: name -> the ConcreteTemplate signatures
SUPPORTED: dict[str, tuple] = {
    fn.__name__: tuple(case for template in fn_type.templates for case in template.cases)
    for fn, fn_type in compat.cuda_math_registry.globals
    if getattr(math, fn.__name__, None) is fn
}
# numba-cuda's fp16 module overloads these for a float16 argument (hexp, hsqrt...), and its
# typing tries those overloads first: the result stays float16. Others take float16 as float32.
_HALF = frozenset({
    "ceil", "cos", "exp", "exp2", "fabs", "floor", "log", "log10", "log2", "sin", "sqrt", "tanh",
    "trunc",
})  # fmt: skip


# -- typing: numba-cuda's result type of a call ------------------------------------------------


def numba_result_type(name: str, arg_types: tuple):
    """The type numba-cuda gives ``math.<name>(*args)`` for Numba ``arg_types``, or None.

    Numba's overload resolution (``BaseContext.resolve_overload``): each signature is rated by
    how many arguments need an unsafe, then a safe, then a promoting conversion; the lowest
    rating wins, the first listed on a tie.
    """
    if name in _HALF and arg_types == (numba_types.float16,):
        return numba_types.float16
    best = None
    for case in SUPPORTED.get(name, ()):
        if len(case.args) != len(arg_types):
            continue
        convs = [_conversion(a, f) for a, f in zip(arg_types, case.args, strict=True)]
        if None in convs:
            continue
        rating = tuple(convs.count(kind) for kind in _RATED)
        if best is None or rating < best[0]:
            best = (rating, case.return_type)
    return None if best is None else best[1]


_RATED = (compat.Conversion.unsafe, compat.Conversion.safe, compat.Conversion.promote)


def _conversion(actual, formal):
    if actual == formal:
        return compat.Conversion.exact
    return compat.type_manager.check_compatible(actual, formal)


# Numba types a Python number as 64 bits (bool before int: it is one)
_PYTHON_TYPES = (
    (bool, np.dtype(np.bool_)),
    (int, np.dtype(np.int64)),
    (float, np.dtype(np.float64)),
    (complex, np.dtype(np.complex128)),
)


def _numba_type(value):
    """The Numba type of a number a simulated kernel holds."""
    if isinstance(value, np.generic):
        return compat.from_dtype(value.dtype)
    for python_type, dtype in _PYTHON_TYPES:
        if isinstance(value, python_type):
            return compat.from_dtype(dtype)
    raise compat.NumbaTypeError(f"math functions take numbers, got {type(value).__name__}")


# -- rounding the double result to the result type ---------------------------------------------


def _narrow(scalar_type):
    """Round a double to float32/float16 (overflow to inf without NumPy's warning)."""
    largest = float(np.finfo(scalar_type).max)

    def cast(r):
        if -largest <= r <= largest:
            return scalar_type(r)
        with np.errstate(over="ignore"):  # +-inf, NaN, or a value rounding to inf or max
            return scalar_type(r)

    return cast


_CASTS = {np.float64: np.float64, np.float32: _narrow(np.float32), np.float16: _narrow(np.float16)}


def _cast_for(numba_type):
    """The function that rounds a double to ``numba_type``'s float (a tuple's first element)."""
    element = numba_type.types[0] if isinstance(numba_type, numba_types.BaseTuple) else None
    scalar = compat.as_dtype(element or numba_type).type
    return _CASTS.get(scalar, scalar)  # np.bool_ for the predicates, which ignore it


# -- the computations: in double, IEEE where Python's math raises, rounded once ---------------


def _rounded(python_fn, ieee_fn=None):
    """``cast(python_fn(*args))``; where Python raises (a domain error, a pole, an overflow),
    ``ieee_fn`` of the arguments as doubles gives the IEEE result (a NumPy ufunc: its float64
    loop). Without ``ieee_fn``, ``python_fn`` never raises."""

    def compute(cast, *args):
        try:
            return cast(python_fn(*args))
        except (ValueError, OverflowError):
            with np.errstate(all="ignore"):
                return cast(float(ieee_fn(*(float(a) for a in args))))

    return compute


def _gamma_ieee(x: float) -> float:
    """tgamma where Python raises: -inf and the negative integers are NaN; a pole at +-0 and
    an overflow (large x, or a tiny x of either sign) are inf with the sign of x."""
    return math.nan if x < 0 and (x.is_integer() or math.isinf(x)) else math.copysign(math.inf, x)


def _int32(n) -> int:
    """An exponent converted to int32 as compiled code does: an integer wraps, a float
    saturates, NaN is 0 (PTX ``cvt.rzi.s32``)."""
    if isinstance(n, (float, np.floating)):
        n = float(n)
        return 0 if math.isnan(n) else int(min(max(n, -(2.0**31)), 2.0**31 - 1))
    return (int(n) + 2**31) % 2**32 - 2**31


def _ldexp(x, n) -> float:
    x = float(x)
    try:
        return math.ldexp(x, _int32(n))
    except OverflowError:
        return math.copysign(math.inf, x)


def _scaled(factor: float):
    """degrees / radians: numba-cuda multiplies by the constant rounded to the result type (the
    product of two float32 is exact in double, so rounding it once is the float32 product)."""
    return lambda cast, x: cast(float(x) * float(cast(factor)))


def _nextafter(cast, x, y):
    with np.errstate(all="ignore"):  # stepping from the largest finite to inf
        return np.nextafter(cast(float(x)), cast(float(y)))


def _frexp(cast, x):
    mantissa, exponent = math.frexp(x)
    return cast(mantissa), ints.NARROW[np.int32](exponent)


def _modf(cast, x):
    fraction, integral = math.modf(x)
    return cast(fraction), cast(integral)


def _predicate(python_fn):
    return lambda cast, x: python_fn(x)


# name -> compute(cast, *args), cast rounding a double to the call's result type
_COMPUTE = {
    "acos": _rounded(math.acos, np.arccos),
    "acosh": _rounded(math.acosh, np.arccosh),
    "asin": _rounded(math.asin, np.arcsin),
    "asinh": _rounded(math.asinh),
    "atan": _rounded(math.atan),
    "atan2": _rounded(math.atan2),
    "atanh": _rounded(math.atanh, np.arctanh),
    "ceil": _rounded(np.ceil),  # not math.ceil: it returns an int, losing -0.0
    "copysign": _rounded(math.copysign),
    "cos": _rounded(math.cos, np.cos),
    "cosh": _rounded(math.cosh, np.cosh),
    "degrees": _scaled(180.0 / math.pi),
    "erf": _rounded(math.erf),
    "erfc": _rounded(math.erfc),
    "exp": _rounded(math.exp, np.exp),
    "exp2": _rounded(math.exp2, np.exp2),
    "expm1": _rounded(math.expm1, np.expm1),
    "fabs": _rounded(math.fabs),
    "floor": _rounded(np.floor),
    "fmod": _rounded(math.fmod, np.fmod),
    "frexp": _frexp,
    "gamma": _rounded(math.gamma, _gamma_ieee),
    "hypot": _rounded(math.hypot, np.hypot),
    "isfinite": _predicate(math.isfinite),
    "isinf": _predicate(math.isinf),
    "isnan": _predicate(math.isnan),
    "ldexp": _rounded(_ldexp),
    "lgamma": _rounded(math.lgamma, lambda x: math.inf),  # a pole or an overflow: +inf
    "log": _rounded(math.log, np.log),
    "log10": _rounded(math.log10, np.log10),
    "log1p": _rounded(math.log1p, np.log1p),
    "log2": _rounded(math.log2, np.log2),
    "modf": _modf,
    "nextafter": _nextafter,
    "pow": _rounded(math.pow, np.power),
    "radians": _scaled(math.pi / 180.0),
    "remainder": _rounded(math.remainder, lambda x, y: math.nan),  # x infinite or y zero
    "sin": _rounded(math.sin, np.sin),
    "sinh": _rounded(math.sinh, np.sinh),
    "sqrt": _rounded(math.sqrt, np.sqrt),
    "tan": _rounded(math.tan, np.tan),
    "tanh": _rounded(math.tanh),
    "trunc": _rounded(np.trunc),
}


def _twin(name: str):
    """``math.<name>`` with numba-cuda's typing and CUDA's results."""
    compute = _COMPUTE[name]
    casts: dict = {}  # the Python types of the arguments -> the cast of the result

    def resolve(args, key):
        arg_types = tuple(_numba_type(a) for a in args)
        result = numba_result_type(name, arg_types)
        if result is None:
            shown = ", ".join(map(str, arg_types))
            raise compat.NumbaTypeError(f"numba-cuda has no math.{name}({shown}) in kernels")
        cast = casts[key] = _cast_for(result)
        return cast

    # The simulator calls these in every thread: one short function per arity (a generic one
    # costs a third more). A call with another number of arguments is refused by resolve.
    if len(SUPPORTED[name][0].args) == 1:

        def call(x, *more):
            if more:
                resolve((x, *more), None)
            return compute(casts.get(type(x)) or resolve((x,), type(x)), x)

    else:

        def call(x, *more):
            if len(more) != 1:
                resolve((x, *more), None)
            y = more[0]
            key = (type(x), type(y))
            return compute(casts.get(key) or resolve((x, y), key), x, y)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"math.{name} as a CUDA kernel computes it (numba-cuda's typing, IEEE results)."
    return call


def _refused(name: str):
    def call(*args, **kwargs):
        raise compat.NumbaTypeError(f"math.{name} is not supported in CUDA kernels (numba-cuda)")

    call.__name__ = call.__qualname__ = name
    return call


def _unsimulated(name: str):
    """A function a newer numba-cuda accepts that this simulator has no twin for yet."""

    def call(*args, **kwargs):
        raise NotImplementedError(
            f"math.{name}: numba-cuda accepts it, the simulator cannot run it"
        )

    call.__name__ = call.__qualname__ = name
    return call


def _module() -> types.ModuleType:
    module = types.ModuleType("math", "CUDA's math for simulated kernels (tessera_tile.sim).")
    for name in dir(math):
        if not name.startswith("_"):
            value = getattr(math, name)
            module.__dict__[name] = value if name in _CONSTANTS else _refused(name)
    for name in SUPPORTED:
        module.__dict__[name] = _twin(name) if name in _COMPUTE else _unsimulated(name)
    return module


MODULE = _module()

# id of a ``math`` object a kernel's globals may hold -> (that object, its twin)
_SWAPS = {id(math): (math, MODULE)} | {
    id(getattr(math, name)): (getattr(math, name), getattr(MODULE, name))
    for name in dir(math)
    if not name.startswith("_") and name not in _CONSTANTS
}


@contextlib.contextmanager
def swapped_math(fn):
    """Inside, ``fn``'s module sees :data:`MODULE`: every global bound to the ``math`` module
    or to one of its functions is bound to the twin, and so is every variable of ``fn``'s
    closure (``log = math.log`` captured by a kernel made in a factory); restored on exit."""
    fn_globals = fn.__globals__
    saved = {}
    for key, value in fn_globals.items():
        swap = _SWAPS.get(id(value))
        if swap is not None and swap[0] is value:
            saved[key] = value
    cells = []
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # a variable not yet bound
            continue
        swap = _SWAPS.get(id(value))
        if swap is not None and swap[0] is value:
            cells.append((cell, value))
    fn_globals.update({key: _SWAPS[id(value)][1] for key, value in saved.items()})
    for cell, value in cells:
        cell.cell_contents = _SWAPS[id(value)][1]
    try:
        yield
    finally:
        fn_globals.update(saved)
        for cell, value in cells:
            cell.cell_contents = value
