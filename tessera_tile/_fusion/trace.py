"""Tracing: run a Python function on stand-in values and record a Tile IR graph.

``Traced`` values support Python's operators and NumPy's ufuncs; the builders below make the IR
nodes for them and for the ``tt.*`` functions of :mod:`tessera_tile.fusion`, which expand
composite functions (mean, var, logsumexp...) into primitive ops, so the planner and the code
generator only see the ``Op`` enum.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field

import numpy as np

from .. import tile_ir as ir
from .._runtime import arrays
from ..tile_ir import Node, Op


class TraceError(TypeError):
    """Something in a fused function cannot be traced into one kernel program."""


@dataclass
class Trace:
    """The result of tracing: the graph, and where its leaves come from."""

    outputs: tuple[Node, ...]
    single: bool  # the function returned one value, not a tuple
    counts: dict[int, tuple[Node, tuple[int, ...]]] = field(default_factory=dict)
    # the function read a traced value's shape or size: its program holds those numbers, so
    # it serves calls with these exact shapes only (the program cache keys it by them)
    reads_shapes: bool = False
    returns_none: bool = False  # the function returned None (no result), as CuPy's fuse allows

    def pack(self, results):
        """A call's results as the function returned them: None, one value, or a tuple."""
        if self.returns_none:
            return None
        return results[0] if self.single else tuple(results)

    @property
    def nodes(self) -> list[Node]:
        return ir.walk(self.outputs)


class _Tracing(threading.local):
    """The trace in progress in this thread (COUNT leaves need their source at call time): two
    threads tracing at once each see their own."""

    current: Trace | None = None


_tracing = _Tracing()


def tracing() -> bool:
    """Whether a function is being traced in this thread."""
    return _tracing.current is not None


class Traced:
    """A value inside a function being traced by ``@tt.fuse``."""

    __slots__ = ("node",)
    __array_priority__ = 1000  # NumPy defers to our operators

    def __init__(self, node: Node):
        self.node = node

    # introspection ------------------------------------------------------------------------
    dtype = property(lambda self: self.node.dtype)
    ndim = property(lambda self: self.node.ndim)  # part of every program's key

    @property
    def shape(self) -> tuple[int, ...]:
        if _tracing.current is not None:
            _tracing.current.reads_shapes = True
        return self.node.shape

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def __repr__(self) -> str:
        return f"Traced({self.node.op.name.lower()}, {self.dtype}, shape={self.shape})"

    # operators ----------------------------------------------------------------------------
    def __add__(self, o):
        return binary(Op.ADD, self, o)

    def __radd__(self, o):
        return binary(Op.ADD, o, self)

    def __sub__(self, o):
        return binary(Op.SUB, self, o)

    def __rsub__(self, o):
        return binary(Op.SUB, o, self)

    def __mul__(self, o):
        return binary(Op.MUL, self, o)

    def __rmul__(self, o):
        return binary(Op.MUL, o, self)

    def __truediv__(self, o):
        return binary(Op.TRUEDIV, self, o)

    def __rtruediv__(self, o):
        return binary(Op.TRUEDIV, o, self)

    def __floordiv__(self, o):
        return binary(Op.FLOORDIV, self, o)

    def __rfloordiv__(self, o):
        return binary(Op.FLOORDIV, o, self)

    def __mod__(self, o):
        return binary(Op.MOD, self, o)

    def __rmod__(self, o):
        return binary(Op.MOD, o, self)

    def __pow__(self, o):
        return binary(Op.POW, self, o)

    def __matmul__(self, o):
        return matmul(self, o)

    def __rmatmul__(self, o):
        return matmul(o, self)

    def __rpow__(self, o):
        return binary(Op.POW, o, self)

    def __lt__(self, o):
        return binary(Op.LT, self, o)

    def __le__(self, o):
        return binary(Op.LE, self, o)

    def __gt__(self, o):
        return binary(Op.GT, self, o)

    def __ge__(self, o):
        return binary(Op.GE, self, o)

    def __eq__(self, o):  # type: ignore[override]
        return binary(Op.EQ, self, o)

    def __ne__(self, o):  # type: ignore[override]
        return binary(Op.NE, self, o)

    def __and__(self, o):
        return binary(Op.AND, self, o)

    def __rand__(self, o):
        return binary(Op.AND, o, self)

    def __or__(self, o):
        return binary(Op.OR, self, o)

    def __ror__(self, o):
        return binary(Op.OR, o, self)

    def __xor__(self, o):
        return binary(Op.XOR, self, o)

    def __rxor__(self, o):
        return binary(Op.XOR, o, self)

    def __neg__(self):
        return unary(Op.NEG, self)

    def __pos__(self):
        if self.dtype == np.dtype(bool):
            raise TypeError("positive (unary +) is not defined for booleans, as in NumPy")
        return self

    def __abs__(self):
        return unary(Op.ABS, self)

    def __invert__(self):
        return unary(Op.INVERT, self)

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
        if method == "__call__" and not kwargs:
            if ufunc is np.positive:
                return +inputs[0]
            if ufunc is np.matmul:
                return matmul(*inputs)
            op = UFUNCS.get(ufunc)
            if op is not None:
                return unary(op, *inputs) if len(inputs) == 1 else binary(op, *inputs)
        raise TraceError(
            f"numpy.{ufunc.__name__}{'' if method == '__call__' else '.' + method}"
            f"{' with keyword arguments' if kwargs else ''} cannot be traced; use the tt.* "
            "functions (see tessera_tile.fuse)"
        )

    def __array_function__(self, func, types, args, kwargs):
        raise TraceError(
            f"numpy.{func.__name__} cannot be traced; use the tt.* function of the same name"
        )

    def __getattr__(self, name: str):
        # only missing attributes get here; NumPy's protocols (dunder names) stay missing
        if name.startswith("_") or not hasattr(np.ndarray, name):
            raise AttributeError(f"'Traced' object has no attribute {name!r}")
        hint = f"use tt.{name}(x)" if name in TT_FUNCTIONS else "it has no tt.* equivalent"
        raise TraceError(
            f"the array method .{name} cannot be traced in @tt.fuse: {hint} (a traced value "
            "has shape, dtype, ndim, size and astype)"
        )

    def astype(self, dtype):
        dtype = np.dtype(dtype)
        if dtype not in ir.SUPPORTED_DTYPES:
            raise TypeError(f"astype: unsupported dtype {dtype}")
        return self if dtype == self.dtype else unary(Op.CAST, self, arg=ir.dtype_arg(dtype))


def as_node(value) -> Node:
    """The IR node of a traced value, a Python scalar (weak) or a NumPy scalar or 0-d array
    (strong, as in NumPy)."""
    if isinstance(value, Traced):
        return value.node
    if isinstance(value, bool | int | float) and not isinstance(value, np.generic):
        return ir.leaf_const(value)
    if isinstance(value, np.generic | np.ndarray) and np.ndim(value) == 0:
        dtype = np.dtype(value.dtype)
        if dtype in ir.SUPPORTED_DTYPES:
            return ir.Node(Op.CONST, dtype, arg=value.item())
    raise TraceError(
        f"a {type(value).__name__} cannot be used inside @tt.fuse: pass arrays as arguments of "
        "the fused function (Python scalars, NumPy scalars and 0-d arrays may be used directly)"
    )


# builders used by the operators above and by the tt.* functions of tessera_tile.fusion ----


def unary(op: Op, x, arg=None) -> Traced:
    return _result(ir.elementwise(op, as_node(x), arg=arg), (x,))


def binary(op: Op, a, b) -> Traced:
    return _result(ir.elementwise(op, as_node(a), as_node(b)), (a, b))


def matmul(a, b) -> Traced:
    return Traced(ir.matmul(as_node(a), as_node(b)))


def swapaxes(x, axis1, axis2) -> Traced:
    return Traced(ir.swapaxes(as_node(x), axis1, axis2))


def tri(n, m=None, k=0, dtype=float) -> Traced:
    return Traced(ir.tri(n, m, k, dtype))


def ternary(op: Op, a, b, c) -> Traced:
    return _result(ir.elementwise(op, as_node(a), as_node(b), as_node(c)), (a, b, c))


def reduce(op: Op, x, axis, keepdims: bool) -> Traced:
    return _result(ir.reduction(op, as_node(x), axis, keepdims), (x,))


def count(x: Traced, axis) -> Traced:
    """The number of elements ``axis`` reduces, as a weak int known at call time."""
    node = as_node(x)
    axes = ir.normalize_axes(axis, node.ndim)
    count_node = ir.Node(Op.COUNT, np.dtype(np.int64), arg=(node.key, axes), weak=True)
    trace = _tracing.current
    if trace is not None:
        trace.counts[id(count_node)] = (node, axes)
    return Traced(count_node)


def counted(node: Node) -> int:
    """The number a COUNT leaf of the current trace stands for, read from its source's shape
    (so the trace serves calls of these shapes only, as reading a shape does)."""
    source, axes = _tracing.current.counts[id(node)]
    _tracing.current.reads_shapes = True
    return int(np.prod([source.shape[a] for a in axes], dtype=np.int64))


def _result(node: Node, operands) -> Traced:
    """A function of scalars alone gives a NumPy scalar, which is strong (NEP 50): ``np.exp(1.0)``
    is float64 whatever it later meets."""
    if node.weak and not any(isinstance(v, Traced) for v in operands):
        node = dataclasses.replace(node, weak=False)
    return Traced(node)


# NumPy ufuncs called on traced values: every ufunc that is the NumPy meaning of an op (keyed
# by the ufunc, so aliases such as true_divide / divide and invert / bitwise_not are one entry)
UFUNCS: dict[np.ufunc, Op] = {fn: op for op, fn in ir.NUMPY.items() if isinstance(fn, np.ufunc)}

# ndarray methods whose tt.* function of the same name a traced value points to
TT_FUNCTIONS = frozenset(
    {"sum", "prod", "max", "min", "argmax", "argmin", "any", "all", "mean", "var", "std", "clip"}
)


def trace(fn, stand_ins: list, keywords: tuple[str, ...] = ()) -> Trace:
    """Trace ``fn`` on stand-ins for its arguments: ``("array", dtype, shape)`` or
    ``("scalar", value)`` per position; the last ``len(keywords)`` are passed by these names.
    A function that returns an empty tuple traces to no result, as it returns ``()``; one that
    returns None, to no result too, and its calls return None (as CuPy's ``fuse`` does)."""
    values = [
        Traced(ir.leaf_input(i, s[1], s[2]) if s[0] == "array" else ir.leaf_scalar(i, s[1]))
        for i, s in enumerate(stand_ins)
    ]
    positional = len(values) - len(keywords)
    result_trace = Trace(outputs=(), single=True)
    outer, _tracing.current = _tracing.current, result_trace
    try:
        result = fn(*values[:positional], **dict(zip(keywords, values[positional:], strict=True)))
    finally:
        _tracing.current = outer
    result_trace.returns_none = result is None
    single = not isinstance(result, tuple) and result is not None
    results = (result,) if single else result or ()
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
    validate(result_trace.outputs)
    _share_common(result_trace)
    return result_trace


def cast_results(trace: Trace, dtypes: list, names: list[str], fn_name: str) -> None:
    """Each result cast to the dtype of its ``out=`` array (``names``: how the call names
    them) under NumPy's ``same_kind`` rule, TypeError in NumPy's words otherwise: the kernel
    stores the cast value. A count of arrays that differs is reported by the call."""
    if len(dtypes) != len(trace.outputs):
        return
    outputs = []
    for node, dtype, name in zip(trace.outputs, map(np.dtype, dtypes), names, strict=True):
        if node.dtype != dtype:
            arrays.check_cast(node.dtype, dtype, f"of {fn_name} into {name}")
            node = ir.elementwise(Op.CAST, node, arg=ir.dtype_arg(dtype))
        outputs.append(node)
    trace.outputs = tuple(outputs)


def _share_common(trace: Trace) -> None:
    """Make structurally equal nodes one node, so each value is computed once: ``tt.var``
    computes its own mean, and layer norm would otherwise reduce ``sum(x)`` twice."""
    canon: dict[str, Node] = {}
    for n in ir.walk(trace.outputs):
        if n.key in canon:
            continue
        srcs = tuple(canon[s.key] for s in n.srcs)
        same = all(a is b for a, b in zip(srcs, n.srcs, strict=True))
        canon[n.key] = n if same else dataclasses.replace(n, srcs=srcs)
        if n.op is Op.COUNT:
            trace.counts[id(canon[n.key])] = trace.counts[id(n)]
    trace.outputs = tuple(canon[o.key] for o in trace.outputs)


__all__ = [
    "Trace",
    "TraceError",
    "Traced",
    "as_node",
    "binary",
    "cast_results",
    "count",
    "counted",
    "reduce",
    "ternary",
    "trace",
    "unary",
]


def validate(outputs) -> None:
    """Check a traced graph: operand counts, dtypes and shapes agree with inference."""
    for n in ir.walk(outputs):
        if n.op in ir.LEAF or n.op in ir.GENERATED:
            if n.srcs:
                raise ValueError(f"{n.op.name} takes no operands")
            continue
        one, two = ir.UNARY | ir.REDUCE | ir.VIEW, ir.BINARY | ir.CONTRACT
        expected = 1 if n.op in one else 2 if n.op in two else 3
        if len(n.srcs) != expected:
            raise ValueError(f"{n.op.name} takes {expected} operands, got {len(n.srcs)}")
        if n.op in ir.ELEMENTWISE:
            if n.dtype != ir.infer_dtype(n.op, n.srcs, n.arg):
                raise TypeError(f"{n.op.name} has dtype {n.dtype}, inference says otherwise")
            if n.shape != ir.broadcast_shapes(*(s.shape for s in n.srcs)):
                raise ValueError(f"{n.op.name} has shape {n.shape}, operands disagree")
        if n.dtype not in ir.SUPPORTED_DTYPES:
            raise TypeError(f"unsupported dtype {n.dtype}")


def format_ir(outputs, shapes: dict | None = None) -> str:
    """Readable text of the graph, one node per line (``%3 = add %1 %2 : float32[4, 8]``), with
    the shapes of one call (``shapes``: node key -> shape, see :func:`.plan.propagate_shapes`);
    without them, those of the call that traced it."""
    names: dict[int, str] = {}
    lines = []
    for i, n in enumerate(ir.walk(outputs)):
        names[id(n)] = f"%{i}"
        operands = " ".join(names[id(s)] for s in n.srcs)
        if n.op is Op.INPUT:
            operands = f"arg{n.arg}"
        elif n.op is Op.SCALAR:
            operands = f"scalar arg{n.arg}"
        elif n.op is Op.COUNT:
            operands = f"count axes={list(n.arg[1])}"
        elif n.op is Op.CONST:
            operands = repr(n.arg)
        elif n.op is Op.CAST:
            operands += f" to {np.dtype(n.arg)}"
        elif n.op is Op.TRI:
            operands = "N={} M={} k={}".format(*n.arg)
        elif n.op in ir.REDUCE:
            axes, keepdims, flat = n.arg
            operands += f" axes={list(axes)}" + (" keepdims" if keepdims else "")
            operands += " flat" if flat else ""
        shape = ", ".join(map(str, shapes.get(n.key, n.shape) if shapes else n.shape))
        lines.append(f"{names[id(n)]} = {n.op.name.lower()} {operands} : {n.dtype}[{shape}]")
    outs = ", ".join(names[id(o)] for o in outputs)
    lines.append(f"return {outs}")
    return "\n".join(lines)
