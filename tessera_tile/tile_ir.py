"""Tile IR: the small graph language the fusion composer traces functions into.

One ``Op`` enum with groups, one frozen node type, dtype inference and broadcasting in one place
each, a structural fingerprint, and validation kept apart from construction.

Dtypes follow NumPy 2 exactly because they are inferred by NumPy itself: ``infer_dtype`` applies
the NumPy function of an op to tiny arrays of the operand dtypes (Python scalars stay Python
scalars, so they are weak, as in NumPy 2). bfloat16 (``ml_dtypes``), which NumPy promotes with
little else, follows JAX: with float16 it gives float32, with an integer array or a Python
scalar it stays bfloat16, with float32 or float64 it gives those.
"""

from __future__ import annotations

import functools
import hashlib
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, auto

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def storage_dtype(dtype) -> np.dtype:
    """What an array of ``dtype`` is in a kernel: bfloat16 as its ``uint16`` bits."""
    return np.dtype(np.uint16) if np.dtype(dtype) == BFLOAT16 else np.dtype(dtype)


def dtype_arg(dtype) -> str:
    """A dtype as a cast's argument: its ``str``, but bfloat16 by name (its ``str`` is the
    2-byte void ``<V2``, which ``np.dtype`` reads back as void)."""
    dtype = np.dtype(dtype)
    return dtype.name if dtype == BFLOAT16 else dtype.str


SUPPORTED_DTYPES = tuple(
    np.dtype(d) for d in ("bool", "int32", "int64", "float16", "float32", "float64")
) + (BFLOAT16,)


class Op(Enum):
    # leaves
    INPUT = auto()  # arg: input position
    CONST = auto()  # arg: a Python scalar baked into the kernel
    SCALAR = auto()  # arg: input position of a scalar passed at run time
    COUNT = auto()  # arg: (source key, axes); how many elements a reduction sums (for means)
    # elementwise, one operand
    NEG = auto()
    ABS = auto()
    INVERT = auto()
    EXP = auto()
    EXP2 = auto()
    LOG = auto()
    LOG2 = auto()
    LOG1P = auto()
    EXPM1 = auto()
    SQRT = auto()
    RSQRT = auto()
    SIN = auto()
    COS = auto()
    TANH = auto()
    ERF = auto()
    SIGMOID = auto()
    FLOOR = auto()
    CEIL = auto()
    SQUARE = auto()
    RELU = auto()
    GELU = auto()
    GELU_TANH = auto()
    SILU = auto()
    ISNAN = auto()
    ISINF = auto()
    ISFINITE = auto()
    CAST = auto()  # arg: target dtype
    # elementwise, two operands
    ADD = auto()
    SUB = auto()
    MUL = auto()
    TRUEDIV = auto()
    FLOORDIV = auto()
    MOD = auto()
    POW = auto()
    MAXIMUM = auto()
    MINIMUM = auto()
    LT = auto()
    LE = auto()
    GT = auto()
    GE = auto()
    EQ = auto()
    NE = auto()
    AND = auto()
    OR = auto()
    XOR = auto()
    # elementwise, three operands
    WHERE = auto()
    # reductions; arg: (axes, keepdims) with axes a sorted tuple of non-negative ints
    SUM = auto()
    PROD = auto()
    MAX = auto()
    MIN = auto()
    ARGMAX = auto()
    ARGMIN = auto()
    ANY = auto()
    ALL = auto()
    # contraction: NumPy's matmul (1-D operands, batch broadcasting); a GEMM stage runs it
    MATMUL = auto()
    # a view of an argument: numpy.swapaxes (arg: the two axes), read in place by a GEMM
    SWAPAXES = auto()
    # softmax(q @ swapaxes(k) * scale, axis=-1) @ v, found by the planner (arg: (the scale, the
    # causal mask's shape or None)): srcs (q, k, v), run by the flash-attention kernel
    ATTENTION = auto()
    # numpy.tri(n, m, k): true (one) at and below diagonal k, a function of its indices alone
    # (arg: (n, m, k)); a kernel of its own writes it, or the attention pattern takes it as
    # its causal mask
    TRI = auto()


LEAF = frozenset({Op.INPUT, Op.CONST, Op.SCALAR, Op.COUNT})
UNARY = frozenset(
    {
        Op.NEG, Op.ABS, Op.INVERT, Op.EXP, Op.EXP2, Op.LOG, Op.LOG2, Op.LOG1P, Op.EXPM1,
        Op.SQRT, Op.RSQRT, Op.SIN, Op.COS, Op.TANH, Op.ERF, Op.SIGMOID, Op.FLOOR, Op.CEIL,
        Op.SQUARE, Op.RELU, Op.GELU, Op.GELU_TANH, Op.SILU, Op.ISNAN, Op.ISINF, Op.ISFINITE,
        Op.CAST,
    }
)  # fmt: skip
BINARY = frozenset(
    {
        Op.ADD, Op.SUB, Op.MUL, Op.TRUEDIV, Op.FLOORDIV, Op.MOD, Op.POW, Op.MAXIMUM,
        Op.MINIMUM, Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ, Op.NE, Op.AND, Op.OR, Op.XOR,
    }
)  # fmt: skip
TERNARY = frozenset({Op.WHERE})
ELEMENTWISE = UNARY | BINARY | TERNARY
REDUCE = frozenset({Op.SUM, Op.PROD, Op.MAX, Op.MIN, Op.ARGMAX, Op.ARGMIN, Op.ANY, Op.ALL})
INDEX_REDUCE = frozenset({Op.ARGMAX, Op.ARGMIN})
CONTRACT = frozenset({Op.MATMUL})
VIEW = frozenset({Op.SWAPAXES})
GENERATED = frozenset({Op.TRI})  # arrays made from their indices: no operands, not on the host
# the dtypes the matmul kernels take (both operands one dtype: tt.matmul casts to the result's)
MATMUL_DTYPES = (np.dtype(np.float16), BFLOAT16, np.dtype(np.float32))


def _erf(x):
    import math

    out = np.vectorize(math.erf, otypes=[np.float64])(x)
    return out.astype(np.result_type(x.dtype, np.float16))  # NumPy's float result for x


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# gelu's constants: 1/sqrt(2); sqrt(2/pi) and the cubic coefficient of the tanh form
SQRT_HALF, SQRT_2_OVER_PI, GELU_CUBIC = 0.7071067811865476, 0.7978845608028654, 0.044715


@dataclass(frozen=True)
class Activation:
    """An activation, defined here once for the composer (its op, NumPy meaning and generated
    expression), the matmul epilogues (``kernels.epilogue``: a device function of each name)
    and ``ops``' ``activation=`` names.

    ``numpy(x)`` computes in x's dtype (the tests' references pass float64); ``expr(x, t)`` is
    the source of the activation of expression ``x`` in float compute type ``t``; ``approx``
    the same with hardware approximations (float32, where the composer's schedule says).
    """

    op: Op
    numpy: Callable
    expr: Callable[[str, str], str]
    approx: Callable[[str, str], str] | None = None


ACTIVATIONS: dict[str, Activation] = {
    "relu": Activation(
        Op.RELU, lambda x: np.maximum(x, x.dtype.type(0)), lambda x, t: f"max_nan({x}, {t}(0.0))"
    ),
    "gelu": Activation(
        Op.GELU,
        lambda x: 0.5 * x * (1.0 + _erf(x * SQRT_HALF)),
        lambda x, t: f"({t}(0.5) * {x} * ({t}(1.0) + {t}(erf({x} * {t}({SQRT_HALF!r})))))",
    ),
    "gelu_tanh": Activation(
        Op.GELU_TANH,
        lambda x: 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * (x + GELU_CUBIC * x**3))),
        lambda x, t: (
            f"({t}(0.5) * {x} * ({t}(1.0) + {t}(tanh({t}({SQRT_2_OVER_PI!r}) * "
            f"({x} + {t}({GELU_CUBIC!r}) * {x} * {x} * {x})))))"
        ),
    ),
    "silu": Activation(
        Op.SILU,
        lambda x: x * _sigmoid(x),
        lambda x, t: f"({x} / ({t}(1.0) + {t}(exp(-{x}))))",
        lambda x, t: f"({x} * rcp_approx_ftz({t}(1.0) + exp_approx(-{x})))",
    ),
}


# The NumPy meaning of every op: the reference for dtype inference and for tests.
NUMPY: dict[Op, object] = {
    Op.NEG: np.negative, Op.ABS: np.absolute, Op.INVERT: np.invert, Op.EXP: np.exp,
    Op.EXP2: np.exp2, Op.LOG: np.log, Op.LOG2: np.log2, Op.LOG1P: np.log1p,
    Op.EXPM1: np.expm1, Op.SQRT: np.sqrt, Op.RSQRT: lambda x: 1 / np.sqrt(x), Op.SIN: np.sin,
    Op.COS: np.cos, Op.TANH: np.tanh, Op.ERF: _erf, Op.SIGMOID: _sigmoid, Op.FLOOR: np.floor,
    Op.CEIL: np.ceil, Op.SQUARE: np.square, **{a.op: a.numpy for a in ACTIVATIONS.values()},
    Op.ISNAN: np.isnan, Op.ISINF: np.isinf, Op.ISFINITE: np.isfinite,
    Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.TRUEDIV: np.true_divide,
    Op.FLOORDIV: np.floor_divide, Op.MOD: np.remainder, Op.POW: np.power,
    Op.MAXIMUM: np.maximum, Op.MINIMUM: np.minimum, Op.LT: np.less, Op.LE: np.less_equal,
    Op.GT: np.greater, Op.GE: np.greater_equal, Op.EQ: np.equal, Op.NE: np.not_equal,
    Op.AND: np.bitwise_and, Op.OR: np.bitwise_or, Op.XOR: np.bitwise_xor, Op.WHERE: np.where,
    Op.SUM: np.sum, Op.PROD: np.prod, Op.MAX: np.max, Op.MIN: np.min, Op.ARGMAX: np.argmax,
    Op.ARGMIN: np.argmin, Op.ANY: np.any, Op.ALL: np.all, Op.MATMUL: np.matmul,
}  # fmt: skip


@dataclass(frozen=True, eq=False)
class Node:
    """One IR value: ``op`` applied to ``srcs``; ``arg`` holds op-specific constants.

    ``dtype`` is the NumPy dtype of the value; ``shape`` its shape for this trace (broadcast).
    Nodes compare by identity; ``key`` is the structural identity used by caches.
    """

    op: Op
    dtype: np.dtype
    srcs: tuple[Node, ...] = ()
    arg: object = None
    shape: tuple[int, ...] = ()
    weak: bool = False  # a Python scalar: takes part in promotion as NumPy 2's weak scalars
    key: str = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "key", fingerprint_of(self))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"Node({self.op.name}, {self.dtype}, shape={self.shape})"


def fingerprint_of(node: Node) -> str:
    """Recursive structural hash of (op, dtype, arg, source keys); shapes are not part of it."""
    h = hashlib.blake2b(digest_size=10)
    arg = node.arg
    if node.op is Op.CONST:
        arg = (type(arg).__name__, repr(arg))
    h.update(repr((node.op.name, str(node.dtype), arg, node.weak, node.ndim)).encode())
    for s in node.srcs:
        h.update(s.key.encode())
    return h.hexdigest()


def fingerprint(outputs) -> str:
    h = hashlib.blake2b(digest_size=10)
    for o in outputs:
        h.update(o.key.encode())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# dtype inference and broadcasting


def _sample(dtype: np.dtype, weak: bool):
    if weak:
        return {"b": False, "i": 0, "u": 0, "f": 0.0}[dtype.kind]
    return np.ones(1, dtype)


def _apply(op: Op, values: list, arg):
    """NumPy's result of elementwise ``op`` on ``values`` (Python scalars are weak, NEP 50)."""
    if op is Op.CAST:
        return np.asarray(values[0]).astype(arg)
    if all(_is_python_scalar(v) for v in values):  # only scalars: NumPy's default dtypes
        values = [np.asarray(v) for v in values]
    return NUMPY[op](*values)


def _is_python_scalar(value) -> bool:
    return type(value) in (bool, int, float)


@functools.cache
def _infer(op: Op, operands: tuple[tuple[np.dtype, bool], ...], arg) -> np.dtype:
    import warnings

    if op is Op.CAST:
        return np.dtype(arg)
    samples = [_sample(d, w) for d, w in operands]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        if op in REDUCE:
            return np.asarray(NUMPY[op](np.asarray(samples[0]), axis=0)).dtype
        if op is Op.MATMUL:  # vectors of one element: matmul refuses 0-d operands
            vectors = [np.ones(1, np.asarray(s).dtype) for s in samples]
            return np.matmul(*vectors).dtype
        return np.asarray(_apply(op, samples, arg)).dtype


def _as_float16(operands: tuple) -> tuple:
    """bfloat16 operands as float16 ones, which NumPy promotes as JAX does bfloat16 (the
    result is mapped back): integer arrays beside them weak, and float16 beside them float32."""
    f16 = np.dtype(np.float16)
    both = any(d == f16 and not w for d, w in operands)
    out = []
    for d, w in operands:
        if d == BFLOAT16 or (both and d == f16 and not w):
            out.append((np.dtype(np.float32) if both else f16, w))
        elif d.kind in "iub" and not w:
            out.append((d, True))
        else:
            out.append((d, w))
    return tuple(out)


def infer_dtype(op: Op, srcs, arg=None) -> np.dtype:
    """The NumPy 2 result dtype of ``op`` on ``srcs`` (bfloat16 as JAX promotes it); TypeError
    when NumPy refuses or the result is a dtype the library does not support."""
    operands = tuple((s.dtype, s.weak) for s in srcs)
    bf16 = any(d == BFLOAT16 for d, _ in operands)
    try:
        dtype = _infer(op, _as_float16(operands) if bf16 else operands, arg)
        if bf16 and dtype == np.float16:
            dtype = BFLOAT16
    except TypeError as e:
        names = ", ".join(str(d) for d, _ in operands)
        raise TypeError(f"{op.name.lower()} is not defined for ({names}): {e}") from None
    if dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d) for d, _ in operands)
        raise TypeError(
            f"{op.name.lower()}({names}) gives {dtype}, which tessera_tile does not support "
            f"(supported: {', '.join(map(str, SUPPORTED_DTYPES))})"
        )
    return dtype


def broadcast_shapes(*shapes) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(_broadcast_message(shapes)) from None


def _broadcast_message(shapes) -> str:
    """NumPy's words: ``operands could not be broadcast together with shapes (2,3) (4,)``."""
    text = [f"({','.join(map(str, s))}{',' if len(s) == 1 else ''})" for s in shapes]
    return "operands could not be broadcast together with shapes " + " ".join(text)


def broadcast_operands(op: Op, srcs, shapes) -> tuple[int, ...]:
    """The shape of ``op`` on ``srcs`` whose shapes are ``shapes``; NumPy's ValueError, naming
    the op and the arguments each operand comes from, when they do not broadcast."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        operands = [f"{_origin(n)} {tuple(s)}" for n, s in zip(srcs, shapes, strict=True)]
        raise ValueError(
            f"{_broadcast_message(shapes)} (in {op.name.lower()} of {', '.join(operands)})"
        ) from None


def matmul_shape(a, b) -> tuple[int, ...]:
    """NumPy's shape of ``matmul`` on operands of shapes ``a`` and ``b`` (a 1-D left operand
    is a row, a 1-D right one a column, and their dimension is dropped), with NumPy's
    ValueError for a 0-d operand, a core-dimension mismatch or batches that do not broadcast."""
    for i, s in enumerate((a, b)):
        if len(s) == 0:
            raise ValueError(
                f"matmul: Input operand {i} does not have enough dimensions (has 0, gufunc "
                "core with signature (n?,k),(k,m?)->(n?,m?) requires 1)"
            )
    ka = a[-1]
    kb = b[-2] if len(b) > 1 else b[0]
    if ka != kb:
        raise ValueError(
            "matmul: Input operand 1 has a mismatch in its core dimension 0, with gufunc "
            f"signature (n?,k),(k,m?)->(n?,m?) (size {kb} is different from {ka})"
        )
    batch = broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    rows = (a[-2],) if len(a) > 1 else ()
    cols = (b[-1],) if len(b) > 1 else ()
    return (*batch, *rows, *cols)


def operands_shape(op: Op, srcs, shapes, arg=None) -> tuple[int, ...]:
    """The shape of an elementwise, contraction or view ``op`` on operands of ``shapes``."""
    if op is Op.MATMUL:
        return matmul_shape(*shapes)
    if op is Op.SWAPAXES:
        out = list(shapes[0])
        out[arg[0]], out[arg[1]] = out[arg[1]], out[arg[0]]
        return tuple(out)
    if op is Op.ATTENTION:
        q, k, v = shapes
        mask = arg[1]  # a causal mask's (Sq, Sk), as traced: NumPy's error where it differs
        if mask is not None and tuple(mask) != (q[-2], k[-2]):
            broadcast_shapes(tuple(mask), (q[-2], k[-2]))
        return (*broadcast_shapes(q[:-2], k[:-2], v[:-2]), q[-2], v[-1])
    if op is Op.TRI:
        return tuple(arg[:2])
    return broadcast_operands(op, srcs, shapes)


def _origin(n: Node) -> str:
    """Which arguments of the traced function a value comes from."""
    if n.op is Op.INPUT:
        return f"argument {n.arg}" if isinstance(n.arg, int) else "an intermediate result"
    positions = sorted({m.arg for m in walk([n]) if m.op is Op.INPUT and isinstance(m.arg, int)})
    if not positions:
        return "a scalar"
    plural = "s" if len(positions) > 1 else ""
    return f"a value of argument{plural} {', '.join(map(str, positions))}"


def normalize_axes(axis, ndim: int) -> tuple[int, ...]:
    """``None | int | tuple`` -> sorted tuple of non-negative axes, with NumPy's errors
    (``numpy.exceptions.AxisError`` for an axis out of range)."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int | np.integer) else tuple(axis)
    out = []
    for a in axes:
        if not isinstance(a, int | np.integer):
            raise TypeError(f"axis must be an int, a tuple of ints or None, got {axis!r}")
        if not -ndim <= a < ndim:
            raise np.exceptions.AxisError(int(a), ndim)
        out.append(int(a) % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise ValueError(f"repeated axis in {axis!r}")
    return tuple(sorted(out))


def normalize_keepdims(keepdims) -> bool:
    """``keepdims`` as NumPy reads it: an integer (``True``, ``False``, 0, 1), else TypeError."""
    try:
        return bool(operator.index(keepdims))
    except TypeError:
        raise TypeError(f"keepdims must be a bool, got {keepdims!r}") from None


def reduced_shape(shape, axes, keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in axes)


# --------------------------------------------------------------------------------------------
# construction helpers (no validation beyond what typing needs) and validation


def leaf_input(position: int, dtype, shape) -> Node:
    return Node(Op.INPUT, np.dtype(dtype), arg=position, shape=tuple(shape))


def leaf_const(value) -> Node:
    dtype = np.asarray(value).dtype
    if isinstance(value, bool):
        dtype = np.dtype(bool)
    return Node(Op.CONST, dtype, arg=value, weak=type(value) in (bool, int, float))


def leaf_scalar(position: int, value) -> Node:
    dtype = np.dtype(bool) if isinstance(value, bool) else np.asarray(value).dtype
    # only Python scalars are weak (NEP 50): NumPy scalars and 0-d arrays keep their dtype
    return Node(Op.SCALAR, dtype, arg=position, weak=type(value) in (bool, int, float))


def elementwise(op: Op, *srcs: Node, arg=None) -> Node:
    dtype = infer_dtype(op, srcs, arg)
    shape = broadcast_operands(op, srcs, [s.shape for s in srcs])
    return Node(op, dtype, tuple(srcs), arg, shape, weak=all(s.weak for s in srcs))


def matmul(a: Node, b: Node) -> Node:
    """``a @ b`` with NumPy's shapes and result dtype; operands of another dtype than the result
    are cast to it first (NumPy computes in the promoted type too). TypeError for dtypes the
    matmul kernels do not take."""
    dtype = infer_dtype(Op.MATMUL, (a, b))
    if dtype not in MATMUL_DTYPES or any(s.dtype.kind not in "fV" for s in (a, b)):
        raise TypeError(
            f"matmul in a fused function takes float16, bfloat16 or float32 operands, got "
            f"{a.dtype} @ {b.dtype}"
        )
    a, b = (
        s if s.dtype == dtype else elementwise(Op.CAST, s, arg=dtype_arg(dtype)) for s in (a, b)
    )
    return Node(Op.MATMUL, dtype, (a, b), None, matmul_shape(a.shape, b.shape))


def swapaxes(x: Node, axis1, axis2) -> Node:
    """``numpy.swapaxes(x, axis1, axis2)`` (NumPy's AxisError for an axis out of range)."""
    if not all(isinstance(a, int | np.integer) for a in (axis1, axis2)):
        raise TypeError(f"swapaxes takes two int axes, got {axis1!r} and {axis2!r}")
    axes = tuple(sorted(normalize_axes(a, x.ndim)[0] for a in (axis1, axis2)))  # symmetric
    if axes[0] == axes[1]:
        return x
    return Node(
        Op.SWAPAXES, x.dtype, (x,), axes, operands_shape(Op.SWAPAXES, (x,), [x.shape], axes)
    )


def tri(n, m=None, k=0, dtype=float) -> Node:
    """``numpy.tri(n, m, k, dtype)``: ``(n, m)``, one where ``j <= i + k``, else zero."""
    m = n if m is None else m
    for name, v in (("N", n), ("M", m), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer):
            raise TypeError(f"tri: {name} must be an int, got {v!r}")
    if n < 0 or m < 0:
        raise ValueError(f"negative dimensions are not allowed (N={n}, M={m})")
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"tri: unsupported dtype {dtype}")
    return Node(Op.TRI, dtype, arg=(int(n), int(m), int(k)), shape=(int(n), int(m)))


def reduction(op: Op, src: Node, axis, keepdims: bool) -> Node:
    axes = normalize_axes(axis, src.ndim)
    keepdims = normalize_keepdims(keepdims)
    if op in INDEX_REDUCE and axis is not None and len(axes) != 1:
        raise ValueError(f"{op.name.lower()} takes one axis or None, got {axis!r}")
    if op in (Op.MAX, Op.MIN, Op.ARGMAX, Op.ARGMIN) and any(src.shape[a] == 0 for a in axes):
        raise ValueError(
            f"zero-size array to reduction operation {op.name.lower()} which has no identity"
        )
    dtype = infer_dtype(op, (src,))
    if not axes:  # nothing to reduce (a 0-d value, or axis=()): NumPy returns the value
        if op in INDEX_REDUCE:
            false = elementwise(Op.AND, elementwise(Op.ISNAN, src), leaf_const(False))
            return elementwise(Op.CAST, false, arg=dtype_arg(np.int64))
        if op in (Op.ANY, Op.ALL):
            return elementwise(Op.NE, src, leaf_const(0))
        return src if dtype == src.dtype else elementwise(Op.CAST, src, arg=dtype_arg(dtype))
    if op in INDEX_REDUCE and axis is None:
        keepdims_shape = (1,) * src.ndim if keepdims else ()
        return Node(op, dtype, (src,), (axes, keepdims, True), keepdims_shape)
    return Node(
        op, dtype, (src,), (axes, keepdims, False), reduced_shape(src.shape, axes, keepdims)
    )


def walk(outputs) -> list[Node]:
    """All nodes reachable from ``outputs``, sources before users (topological order)."""
    seen: dict[int, Node] = {}
    order: list[Node] = []

    def visit(n: Node):
        if id(n) in seen:
            return
        seen[id(n)] = n
        for s in n.srcs:
            visit(s)
        order.append(n)

    for o in outputs:
        visit(o)
    return order


def on_host(n: Node) -> bool:
    """True when ``n`` depends on no array (only on constants and scalar arguments): NumPy
    gives it as a scalar, computed where it is (see :func:`evaluate`)."""
    return not any(m.op in (Op.INPUT, Op.COUNT, *GENERATED) for m in walk([n]))


def evaluate(n: Node, scalars) -> np.generic:
    """NumPy's value of ``n`` (an :func:`on_host` node) given the values of the scalar
    arguments (``scalars[position]``): a NumPy scalar of ``n``'s dtype. NumPy's errors are
    raised (an integer to a negative integer power); its warnings are not (kernels cannot
    warn either)."""
    values: dict[int, object] = {}
    with np.errstate(all="ignore"):
        for m in walk([n]):
            if m.op is Op.CONST:
                v = m.arg
            elif m.op is Op.SCALAR:
                v = scalars[m.arg]
            else:
                v = _apply(m.op, [values[id(s)] for s in m.srcs], m.arg)
            # a weak value stays a Python scalar, so that it promotes as NumPy's would
            values[id(m)] = np.asarray(v).item() if m.weak else np.asarray(v, m.dtype)[()]
    return np.asarray(values[id(n)], n.dtype)[()]
