"""Device helpers that generated kernels call, with NumPy's semantics.

Generated source is the same for the GPU and the simulator; only the names it resolves differ:
on a GPU ``exp`` is ``math.exp`` (lowered to libdevice), in the simulator ``numpy.exp``, because
Python's ``math`` raises where NumPy returns inf or NaN (``math.log(-1.0)``, ``math.exp(1e4)``).
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir as llvm_ir
from numba import cuda, types
from numba.cuda.extending import intrinsic

from .._runtime import config as _config
from .._runtime.compat import NumbaTypeError
from . import twins

# name -> implementation, per target
MATH_NAMES = ("exp", "exp2", "log", "log2", "log1p", "expm1", "sqrt", "sin", "cos", "tanh")
if _config.SIMULATED:
    MATH = {name: getattr(np, name) for name in MATH_NAMES}
    MATH.update(floor=np.floor, ceil=np.ceil, fmod=np.fmod)
else:
    MATH = {name: getattr(math, name) for name in MATH_NAMES}
    MATH.update(floor=math.floor, ceil=math.ceil, fmod=math.fmod)
MATH.update(erf=math.erf, isfinite=math.isfinite, isinf=math.isinf, copysign=math.copysign)

fmod = MATH["fmod"]
floor = MATH["floor"]


def _hardware_nan_minmax() -> bool:
    """``max.NaN.f32`` exists from sm_80 on. Kernels compile for the current device; with no
    GPU they compile offline, for sm_80 or later (what ``tessera_tile.inspect`` targets)."""
    try:
        return cuda.get_current_device().compute_capability >= (8, 0)
    except Exception:  # no GPU: an offline compilation
        return True


def _make_extreme(name: str):
    """``max_nan`` / ``min_nan``: NumPy's maximum / minimum, where a NaN operand wins.

    float32 becomes one ``max.NaN.f32`` (or ``min``) on sm_80 and later; PTX has no ``.NaN``
    form for float64, so float64 (and float32 on older GPUs) compares and selects: NaN test,
    compare, two selects. Integers are plain ``max``/``min``. The simulator twin is NumPy's.
    """
    bigger = name == "max"

    def typer(typingctx, a, b):
        if a != b or not isinstance(a, (types.Float, types.Integer)):
            raise NumbaTypeError(f"{name}_nan takes two numbers of one type, got {a}, {b}")

        def codegen(context, builder, sig, args):
            x, y = args
            if isinstance(a, types.Integer):
                pred = ">" if bigger else "<"
                compare = builder.icmp_signed if a.signed else builder.icmp_unsigned
                return builder.select(compare(pred, y, x), y, x)
            if a == types.float32 and _hardware_nan_minmax():
                fnty = llvm_ir.FunctionType(llvm_ir.FloatType(), [x.type, y.type])
                asm = f"{name}.NaN.f32 $0, $1, $2;"
                return builder.call(llvm_ir.InlineAsm(fnty, asm, "=f,f,f"), [x, y])
            # y wins when it is NaN or strictly better ("u": unordered or ...); x when NaN
            y_wins = builder.fcmp_unordered(">" if bigger else "<", y, x)
            x_nan = builder.fcmp_unordered("uno", x, x)
            return builder.select(x_nan, x, builder.select(y_wins, y, x))

        return a(a, b), codegen

    def twin(a, b):
        return (np.maximum if bigger else np.minimum)(a, b)

    typer.__name__ = typer.__qualname__ = f"{name}_nan"
    twin.__name__ = twin.__qualname__ = f"{name}_nan_twin"
    return twins.twin(twin)(intrinsic(typer))


max_nan = _make_extreme("max")
min_nan = _make_extreme("min")


def _make_approx(name: str, asm: str, scale: float, twin):
    """A float32 function of one hardware instruction (``MUFU``), ``asm`` applied to
    ``x * scale``; its simulator twin computes the instruction with the worst error the PTX
    ISA allows it (:func:`_worst`)."""

    def typer(typingctx, x):
        if x != types.float32:
            raise NumbaTypeError(f"{name} takes float32, got {x}")

        def codegen(context, builder, sig, args):
            (v,) = args
            if scale != 1.0:
                v = builder.fmul(v, llvm_ir.Constant(llvm_ir.FloatType(), scale))
            fnty = llvm_ir.FunctionType(llvm_ir.FloatType(), [v.type])
            return builder.call(llvm_ir.InlineAsm(fnty, f"{asm} $0, $1;", "=f,f"), [v])

        return types.float32(x), codegen

    typer.__name__ = typer.__qualname__ = name
    twin.__name__ = twin.__qualname__ = f"{name}_twin"
    return twins.twin(twin)(intrinsic(typer))


_TINY = np.float32(2.0**-126)  # the smallest normal float32


def _flush(v):
    """What ``.ftz`` does to a float32 operand or result: subnormals become zero (signed)."""
    v = np.float32(v)
    return np.float32(np.copysign(0.0, v)) if 0 < abs(v) < _TINY else v


# The instructions' own error, as the PTX ISA (9.1, "Floating Point Instructions") bounds it:
# ex2.approx.f32 within 2 ulp of the correctly rounded result, rcp.approx.f32 within 1 ulp,
# rsqrt.approx.f32 within a relative 2**-22.9. A GPU's results lie somewhere inside; the twins
# give the farthest float32 the bound allows, on a side fixed by the argument's bits, so a test
# of a fast-math kernel sees the worst the instruction may do, the same on every run.
def _worst(exact: float, within) -> np.float32:
    """The float32 farthest from ``exact`` (a float64) that ``within(candidate)`` accepts, up
    to 3 steps either side of the correctly rounded result (the bits of ``exact`` break a tie);
    special values stay as they are."""
    r = np.float32(exact)
    if not np.isfinite(r) or r == 0:
        return r
    bits = int(np.float64(exact).view(np.uint64))
    first = np.float32(np.inf if (bits * 0x9E3779B97F4A7C15 >> 40) & 1 else -np.inf)
    best, far = r, abs(float(r) - exact)
    for side in (first, -first):
        c = r
        for _ in range(3):
            c = np.nextafter(c, side)
            if not np.isfinite(c) or c == 0 or not within(c):
                break
            if abs(float(c) - exact) > far:
                best, far = c, abs(float(c) - exact)
    return best


def _within_ulps(exact: float, ulps: float):
    spacing = float(np.spacing(np.float32(abs(exact))))
    return lambda c: abs(float(c) - exact) <= ulps * spacing


def _ex2(y) -> np.float32:
    y = float(y)
    if y == 0:  # the ISA's table: 2**0 is 1 exactly (softmax's largest element relies on it)
        return np.float32(1)
    exact = math.inf if y >= 1024 else 2.0**y  # NaN stays NaN, -inf gives 0
    return _worst(exact, _within_ulps(exact, 2.0))


def _rcp(x) -> np.float32:
    exact = 1.0 / float(x) if float(x) != 0 else math.copysign(math.inf, float(x))
    return _worst(exact, _within_ulps(exact, 1.0))


def _rsqrt(x) -> np.float32:
    x = float(x)
    if not x > 0 or math.isinf(x):  # NaN, negatives, zeros and inf: as numpy's float32
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.float32(1) / np.sqrt(np.float32(x))
    exact = 1.0 / math.sqrt(x)
    return _worst(exact, lambda c: abs(float(c) - exact) <= 2.0**-22.9 * exact)


# exp(x) = 2**(x log2 e), one FMUL and one MUFU.EX2, used per element where the rounding of
# x log2 e stays small (the error grows with |x|; docs/fusion.md): softmax's exp(x - max) and
# sigmoid's exp(-x). The .ftz form has no subnormal fix-up (ptxas adds three instructions to the
# plain form); results below 2**-126 (x < -87.3) become 0, an absolute error under 1.2e-38.
# The twin rounds x log2 e to float32 as the FMUL does and flushes as the instruction does.
_LOG2E = np.float32(math.log2(math.e))
exp_approx = _make_approx(
    "exp_approx",
    "ex2.approx.ftz.f32",
    math.log2(math.e),
    lambda x: _flush(_ex2(_flush(np.float32(x) * _LOG2E))),
)
# 2**x in one MUFU.EX2, for callers that fold log2(e) into a scale they apply anyway (flash
# attention's scores: one FFMA gives s * scale * log2(e) - max); .ftz as exp_approx
exp2_approx = _make_approx(
    "exp2_approx", "ex2.approx.ftz.f32", 1.0, lambda x: _flush(_ex2(_flush(x)))
)
# 1 / sqrt(x) in one MUFU.RSQ (instead of an IEEE square root and division), once per row
rsqrt_approx = _make_approx("rsqrt_approx", "rsqrt.approx.f32", 1.0, _rsqrt)
# 1 / x in one MUFU.RCP (no IEEE slow path): the reciprocal of a per-row divisor, which may be
# subnormal, so the plain form (ptxas scales operands beyond 2**126: four more instructions)
rcp_approx = _make_approx("rcp_approx", "rcp.approx.f32", 1.0, _rcp)
# 1 / x per element in one MUFU.RCP, for sigmoid's 1 + exp(-x) >= 1: only its results below
# 2**-126 (1 + exp(-x) above 2**126, x < -87.3) are flushed to 0
rcp_approx_ftz = _make_approx(
    "rcp_approx_ftz", "rcp.approx.ftz.f32", 1.0, lambda x: _flush(_rcp(_flush(x)))
)


@cuda.jit(device=True)
def maximum(a, b):
    """The operator of a NaN-propagating max all-reduce (``tessera_tile.warp``)."""
    return max_nan(a, b)


@cuda.jit(device=True)
def minimum(a, b):
    """The operator of a NaN-propagating min all-reduce."""
    return min_nan(a, b)


@cuda.jit(device=True)
def floordiv_int(a, b):
    """NumPy's integer floor_divide: rounds toward -inf; division by zero gives 0."""
    if b == 0:
        return a - a
    q = a // b
    return q


@cuda.jit(device=True)
def mod_int(a, b):
    """NumPy's integer remainder: the sign of the divisor; modulo zero gives 0."""
    if b == 0:
        return a - a
    return a % b


@cuda.jit(device=True)
def floordiv_float(a, b):
    """NumPy's float floor_divide (npy_divmod)."""
    if b == 0:
        return a / b
    mod = fmod(a, b)
    div = (a - mod) / b
    if mod != 0 and (b < 0) != (mod < 0):
        div -= 1
    if div != 0:
        q = floor(div)
        if div - q > 0.5:
            q += 1
        return div - div + q
    return math.copysign(div - div, a / b)


@cuda.jit(device=True)
def mod_float(a, b):
    """NumPy's float remainder (npy_divmod): the sign of the divisor."""
    if b == 0:
        return fmod(a, b)
    mod = fmod(a, b)
    if mod != 0:
        if (b < 0) != (mod < 0):
            mod += b
        return mod
    return math.copysign(mod - mod, b)


@cuda.jit(device=True)
def pow_int(a, b):
    """Integer power by squaring (wraps like NumPy). A negative exponent, which NumPy rejects
    with ValueError, gives 0 here: a kernel cannot raise."""
    result = a - a + 1
    if b < 0:
        return result - result
    base = a
    e = b
    while e > 0:
        if e & 1:
            result = result * base
        base = base * base
        e >>= 1
    return result


@cuda.jit(device=True)
def bit_or(a, b):
    """any(): accumulators are 0/1 int32 (shuffles do not move booleans)."""
    return a | b


@cuda.jit(device=True)
def bit_and(a, b):
    """all(): accumulators are 0/1 int32."""
    return a & b
