"""Tracing: run a Python function on stand-in values and record a Tile IR graph.

``Traced`` values support Python's operators; ``tt.exp``, ``tt.sum``... build IR nodes.
Composite functions (mean, var, std, logsumexp, clip) are expanded here into primitive ops, so
the planner and the code generator only see the ``Op`` enum.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import tile_ir as ir
from ..tile_ir import Node, Op


class TraceError(TypeError):
    """Something in a fused function cannot be traced into one kernel program."""


@dataclass
class Trace:
    """The result of tracing: the graph, and where its leaves come from."""

    outputs: tuple[Node, ...]
    single: bool  # the function returned one value, not a tuple
    counts: dict[int, tuple[Node, tuple[int, ...]]] = field(default_factory=dict)

    @property
    def nodes(self) -> list[Node]:
        return ir.walk(self.outputs)


class _Tracing:
    """State of the trace in progress (COUNT leaves need their source at call time)."""

    current: Trace | None = None


class Traced:
    """A value inside a function being traced by ``@tt.fuse``."""

    __slots__ = ("node",)
    __array_priority__ = 1000  # NumPy defers to our operators

    def __init__(self, node: Node):
        self.node = node

    # introspection ------------------------------------------------------------------------
    shape = property(lambda self: self.node.shape)
    dtype = property(lambda self: self.node.dtype)
    ndim = property(lambda self: self.node.ndim)

    @property
    def size(self) -> int:
        return int(np.prod(self.node.shape))

    def __repr__(self) -> str:
        return f"Traced({self.node.op.name.lower()}, {self.dtype}, shape={self.shape})"

    # operators ----------------------------------------------------------------------------
    def __add__(self, o):
        return _binary(Op.ADD, self, o)

    def __radd__(self, o):
        return _binary(Op.ADD, o, self)

    def __sub__(self, o):
        return _binary(Op.SUB, self, o)

    def __rsub__(self, o):
        return _binary(Op.SUB, o, self)

    def __mul__(self, o):
        return _binary(Op.MUL, self, o)

    def __rmul__(self, o):
        return _binary(Op.MUL, o, self)

    def __truediv__(self, o):
        return _binary(Op.TRUEDIV, self, o)

    def __rtruediv__(self, o):
        return _binary(Op.TRUEDIV, o, self)

    def __floordiv__(self, o):
        return _binary(Op.FLOORDIV, self, o)

    def __rfloordiv__(self, o):
        return _binary(Op.FLOORDIV, o, self)

    def __mod__(self, o):
        return _binary(Op.MOD, self, o)

    def __rmod__(self, o):
        return _binary(Op.MOD, o, self)

    def __pow__(self, o):
        return _binary(Op.POW, self, o)

    def __rpow__(self, o):
        return _binary(Op.POW, o, self)

    def __lt__(self, o):
        return _binary(Op.LT, self, o)

    def __le__(self, o):
        return _binary(Op.LE, self, o)

    def __gt__(self, o):
        return _binary(Op.GT, self, o)

    def __ge__(self, o):
        return _binary(Op.GE, self, o)

    def __eq__(self, o):  # type: ignore[override]
        return _binary(Op.EQ, self, o)

    def __ne__(self, o):  # type: ignore[override]
        return _binary(Op.NE, self, o)

    def __and__(self, o):
        return _binary(Op.AND, self, o)

    def __rand__(self, o):
        return _binary(Op.AND, o, self)

    def __or__(self, o):
        return _binary(Op.OR, self, o)

    def __ror__(self, o):
        return _binary(Op.OR, o, self)

    def __xor__(self, o):
        return _binary(Op.XOR, self, o)

    def __rxor__(self, o):
        return _binary(Op.XOR, o, self)

    def __neg__(self):
        return _unary(Op.NEG, self)

    def __pos__(self):
        return self

    def __abs__(self):
        return _unary(Op.ABS, self)

    def __invert__(self):
        return _unary(Op.INVERT, self)

    __hash__ = None  # type: ignore[assignment]

    # what cannot be traced ------------------------------------------------------------------
    def __bool__(self):
        raise TraceError(
            "a traced value was used as a Python bool (an `if`, `while`, `and`, `or` or `not` "
            "on array data): the kernel cannot branch on data at trace time; use "
            "tt.where(cond, a, b)"
        )

    def __float__(self):
        raise TraceError(
            "a traced value was converted to a Python number (math.* functions do this); "
            "use the tt.* functions instead, e.g. tt.exp(x)"
        )

    __int__ = __float__
    __index__ = __float__

    def __len__(self):
        raise TraceError("len() of a traced value: use x.shape[0]")

    def __iter__(self):
        raise TraceError("iterating over a traced value is not supported")

    def __getitem__(self, key):
        raise TraceError("indexing or slicing a traced value is not supported in @tt.fuse")

    def __setitem__(self, key, value):
        raise TraceError(
            "in-place update of a traced value (x[...] = v): inputs are never modified; "
            "build a new value with tt.where instead"
        )

    def _inplace(self, *_):
        raise TraceError(
            "in-place operator on a traced value (x += y): inputs are never modified; "
            "write x = x + y"
        )

    __iadd__ = __isub__ = __imul__ = __itruediv__ = __ifloordiv__ = __imod__ = _inplace
    __ipow__ = __iand__ = __ior__ = __ixor__ = _inplace

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        fn = _UFUNCS.get(ufunc.__name__) if method == "__call__" and not kwargs else None
        if fn is None:
            raise TraceError(
                f"numpy.{ufunc.__name__} cannot be traced; use the tt.* functions "
                "(see tessera_tile.fuse)"
            )
        return fn(*inputs)

    def __array_function__(self, func, types, args, kwargs):
        raise TraceError(
            f"numpy.{func.__name__} cannot be traced; use the tt.* function of the same name"
        )

    def astype(self, dtype):
        return astype(self, dtype)


def _as_node(value) -> Node:
    if isinstance(value, Traced):
        return value.node
    if isinstance(value, bool | int | float) and not isinstance(value, np.generic):
        return ir.leaf_const(value)
    if isinstance(value, np.generic) and np.dtype(value.dtype) in ir.SUPPORTED_DTYPES:
        return ir.Node(Op.CONST, np.dtype(value.dtype), arg=value.item())
    raise TraceError(
        f"a {type(value).__name__} cannot be used inside @tt.fuse: pass arrays and scalars as "
        "arguments of the fused function"
    )


def _wrap(node: Node) -> Traced:
    return Traced(node)


def _unary(op: Op, x, arg=None) -> Traced:
    return _wrap(ir.elementwise(op, _as_node(x), arg=arg))


def _binary(op: Op, a, b) -> Traced:
    return _wrap(ir.elementwise(op, _as_node(a), _as_node(b)))


def _require_traced(name: str, x) -> None:
    if not isinstance(x, Traced):
        raise TraceError(f"tt.{name} works on values traced by @tt.fuse, got {type(x).__name__}")


# elementwise functions ----------------------------------------------------------------------


def _unary_fn(op: Op, name: str):
    def fn(x):
        _require_traced(name, x)
        return _unary(op, x)

    fn.__name__ = name
    fn.__doc__ = f"Elementwise {name} (NumPy semantics; float16 computes in float32)."
    return fn


exp = _unary_fn(Op.EXP, "exp")
exp2 = _unary_fn(Op.EXP2, "exp2")
log = _unary_fn(Op.LOG, "log")
log2 = _unary_fn(Op.LOG2, "log2")
log1p = _unary_fn(Op.LOG1P, "log1p")
expm1 = _unary_fn(Op.EXPM1, "expm1")
sqrt = _unary_fn(Op.SQRT, "sqrt")
rsqrt = _unary_fn(Op.RSQRT, "rsqrt")
sin = _unary_fn(Op.SIN, "sin")
cos = _unary_fn(Op.COS, "cos")
tanh = _unary_fn(Op.TANH, "tanh")
erf = _unary_fn(Op.ERF, "erf")
sigmoid = _unary_fn(Op.SIGMOID, "sigmoid")
floor = _unary_fn(Op.FLOOR, "floor")
ceil = _unary_fn(Op.CEIL, "ceil")
square = _unary_fn(Op.SQUARE, "square")
relu = _unary_fn(Op.RELU, "relu")
silu = _unary_fn(Op.SILU, "silu")
isnan = _unary_fn(Op.ISNAN, "isnan")
isinf = _unary_fn(Op.ISINF, "isinf")
isfinite = _unary_fn(Op.ISFINITE, "isfinite")


def abs(x):  # noqa: A001 - the NumPy name
    """Elementwise absolute value."""
    _require_traced("abs", x)
    return _unary(Op.ABS, x)


def gelu(x, approximate: str = "none"):
    """GELU: ``x * Phi(x)`` with the exact erf form, or ``approximate="tanh"``."""
    _require_traced("gelu", x)
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return _unary(Op.GELU if approximate == "none" else Op.GELU_TANH, x)


def maximum(a, b):
    """Elementwise maximum; NaN propagates as in NumPy."""
    return _binary(Op.MAXIMUM, a, b)


def minimum(a, b):
    """Elementwise minimum; NaN propagates as in NumPy."""
    return _binary(Op.MINIMUM, a, b)


def where(cond, a, b):
    """``a`` where ``cond`` else ``b``, broadcast together."""
    nodes = [_as_node(v) for v in (cond, a, b)]
    if nodes[0].dtype != np.dtype(bool):
        nodes[0] = ir.elementwise(Op.NE, nodes[0], ir.leaf_const(0))
    return _wrap(ir.elementwise(Op.WHERE, *nodes))


def clip(x, lo, hi):
    """``minimum(maximum(x, lo), hi)``, as ``numpy.clip``."""
    return minimum(maximum(x, lo), hi)


def astype(x, dtype):
    """Convert to ``dtype`` (one of bool, int32, int64, float16, float32, float64)."""
    _require_traced("astype", x)
    dtype = np.dtype(dtype)
    if dtype not in ir.SUPPORTED_DTYPES:
        raise TypeError(f"astype: unsupported dtype {dtype}")
    if dtype == x.dtype:
        return x
    return _unary(Op.CAST, x, arg=dtype.str)


# reductions ---------------------------------------------------------------------------------


def _reduce(op: Op, name: str, x, axis, keepdims: bool) -> Traced:
    _require_traced(name, x)
    return _wrap(ir.reduction(op, x.node, axis, keepdims))


def sum(x, axis=None, keepdims: bool = False):  # noqa: A001
    """Sum over ``axis`` (None, an int or a tuple), NumPy's dtype rules."""
    return _reduce(Op.SUM, "sum", x, axis, keepdims)


def prod(x, axis=None, keepdims: bool = False):
    """Product over ``axis``."""
    return _reduce(Op.PROD, "prod", x, axis, keepdims)


def max(x, axis=None, keepdims: bool = False):  # noqa: A001
    """Maximum over ``axis``; NaN propagates; an empty axis raises ValueError as in NumPy."""
    return _reduce(Op.MAX, "max", x, axis, keepdims)


def min(x, axis=None, keepdims: bool = False):  # noqa: A001
    """Minimum over ``axis``."""
    return _reduce(Op.MIN, "min", x, axis, keepdims)


def argmax(x, axis=None, keepdims: bool = False):
    """Index of the maximum over one axis or the flattened array; first NaN wins."""
    return _reduce(Op.ARGMAX, "argmax", x, axis, keepdims)


def argmin(x, axis=None, keepdims: bool = False):
    """Index of the minimum over one axis or the flattened array; first NaN wins."""
    return _reduce(Op.ARGMIN, "argmin", x, axis, keepdims)


def any(x, axis=None, keepdims: bool = False):  # noqa: A001
    """True where any element over ``axis`` is non-zero."""
    return _reduce(Op.ANY, "any", x, axis, keepdims)


def all(x, axis=None, keepdims: bool = False):  # noqa: A001
    """True where all elements over ``axis`` are non-zero."""
    return _reduce(Op.ALL, "all", x, axis, keepdims)


def _count(x: Traced, axis) -> Traced:
    """The number of elements ``axis`` reduces, as a weak int known at call time."""
    axes = ir.normalize_axes(axis, x.ndim)
    node = ir.Node(Op.COUNT, np.dtype(np.int64), arg=(x.node.key, axes), weak=True)
    trace = _Tracing.current
    if trace is not None:
        trace.counts[id(node)] = (x.node, axes)
    return _wrap(node)


def mean(x, axis=None, keepdims: bool = False):
    """Arithmetic mean over ``axis`` (``sum / count``), NumPy's dtypes."""
    _require_traced("mean", x)
    total = sum(x, axis, keepdims)
    return total / _count(x, axis)


def var(x, axis=None, keepdims: bool = False, ddof: int = 0):
    """Variance over ``axis``: ``mean(|x - mean(x)|**2)``, two passes as NumPy does."""
    _require_traced("var", x)
    centred = x - mean(x, axis, keepdims=True)
    squares = sum(centred * centred, axis, keepdims)
    count = _count(x, axis)
    return squares / (count - ddof if ddof else count)


def std(x, axis=None, keepdims: bool = False, ddof: int = 0):
    """Standard deviation over ``axis``."""
    return sqrt(var(x, axis, keepdims, ddof))


def logsumexp(x, axis=None, keepdims: bool = False):
    """``log(sum(exp(x)))`` over ``axis``, computed stably around the maximum."""
    _require_traced("logsumexp", x)
    if not np.issubdtype(x.dtype, np.floating):
        x = astype(x, np.float64)
    m = max(x, axis, keepdims=True)
    shift = where(isfinite(m), m, 0)
    total = sum(exp(x - shift), axis, keepdims)
    if not keepdims:
        m = max(x, axis, keepdims=False)
        shift = where(isfinite(m), m, 0)
    return log(total) + shift


_UFUNCS = {
    "add": lambda a, b: _binary(Op.ADD, a, b),
    "subtract": lambda a, b: _binary(Op.SUB, a, b),
    "multiply": lambda a, b: _binary(Op.MUL, a, b),
    "true_divide": lambda a, b: _binary(Op.TRUEDIV, a, b),
    "floor_divide": lambda a, b: _binary(Op.FLOORDIV, a, b),
    "remainder": lambda a, b: _binary(Op.MOD, a, b),
    "power": lambda a, b: _binary(Op.POW, a, b),
    "maximum": maximum,
    "minimum": minimum,
    "less": lambda a, b: _binary(Op.LT, a, b),
    "less_equal": lambda a, b: _binary(Op.LE, a, b),
    "greater": lambda a, b: _binary(Op.GT, a, b),
    "greater_equal": lambda a, b: _binary(Op.GE, a, b),
    "equal": lambda a, b: _binary(Op.EQ, a, b),
    "not_equal": lambda a, b: _binary(Op.NE, a, b),
    "negative": lambda a: _unary(Op.NEG, a),
    "absolute": lambda a: _unary(Op.ABS, a),
    "exp": exp,
    "exp2": exp2,
    "log": log,
    "log2": log2,
    "log1p": log1p,
    "expm1": expm1,
    "sqrt": sqrt,
    "sin": sin,
    "cos": cos,
    "tanh": tanh,
    "floor": floor,
    "ceil": ceil,
    "square": square,
    "isnan": isnan,
    "isinf": isinf,
    "isfinite": isfinite,
}


def trace(fn, args: tuple, classify) -> Trace:
    """Trace ``fn`` on stand-ins for ``args``.

    ``classify(position, value)`` returns ``("array", dtype, shape)`` or ``("scalar", value)``.
    """
    stand_ins = []
    for i, a in enumerate(args):
        kind = classify(i, a)
        if kind[0] == "array":
            stand_ins.append(Traced(ir.leaf_input(i, kind[1], kind[2])))
        else:
            stand_ins.append(Traced(ir.leaf_scalar(i, kind[1])))
    result_trace = Trace(outputs=(), single=True)
    _Tracing.current = result_trace
    try:
        result = fn(*stand_ins)
    finally:
        _Tracing.current = None
    single = not isinstance(result, tuple)
    results = (result,) if single else result
    if not results:
        raise TraceError(f"{fn.__name__} returned an empty tuple")
    outputs = []
    for k, r in enumerate(results):
        if not isinstance(r, Traced):
            where_ = "its result" if single else f"result {k}"
            raise TraceError(
                f"{fn.__name__}: {where_} has type {type(r).__name__}, not a value computed "
                "from its arguments"
            )
        outputs.append(r.node)
    result_trace.outputs = tuple(outputs)
    result_trace.single = single
    ir.validate(result_trace.outputs)
    return result_trace


__all__ = [
    "Traced",
    "TraceError",
    "Trace",
    "trace",
]
