"""Reverse-mode differentiation of fused functions: ``tt.vjp`` and ``tt.grad``.

The pullback is itself a fused function, so the composer plans, fuses and explains it like any
other: its body replays ``fn`` on its traced arguments (the forward values the gradients need
are recomputed inside the backward kernels, never stored by the forward call), then walks the
forward graph from the outputs back to the inputs, adding each node's cotangent into its
operands' by the rules of :data:`RULES`.

* Cotangents are computed in float32 (float64 where the value is float64): float16 and bfloat16
  gradients are accumulated in float32 and rounded once, to the primal's dtype.
* Broadcasting: an operand's cotangent is summed over the axes it was broadcast along.
* Ties and kinks follow PyTorch: ``max``/``min`` reductions share the cotangent evenly among
  the elements equal to the result, ``maximum``/``minimum`` give half to each side of a tie,
  ``abs`` and ``relu`` have derivative 0 at 0 (at NaN, ``abs`` gives NaN and ``relu`` passes
  the cotangent), ``x ** y`` has no ``y`` gradient where ``x == 0`` and ``y >= 0``.
* No gradient flows through comparisons, ``where``'s condition, ``floor``, ``ceil``, ``//``
  and the index and boolean reductions.
* Not differentiated yet (an error names them): ``prod``; attention; a reduction without
  ``keepdims`` over axes other than the leading ones whose result the function uses again (the
  IR has no reshape to put its axes back: write ``keepdims=True``). Such a reduction as a
  result of ``fn`` is fine: the pullback views its cotangent with the axes put back.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math

import numpy as np

from .. import fusion
from .. import tile_ir as ir
from .._runtime import arrays
from ..tile_ir import Op
from . import lower
from .trace import Traced, binary, counted, matmul, reduce, swapaxes, ternary, trace, unary

__all__ = ["grad", "vjp"]

RECOMPUTED = (
    "the backward recomputes the forward values it needs in its own kernels: the forward call "
    "stores nothing for it"
)
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
LN2 = math.log(2)


def vjp(fn, *primals, **kwargs):
    """``(outputs, pullback)``: ``outputs = fn(*primals, **kwargs)``, and
    ``pullback(cotangents)`` (one array per output, of its shape; a tuple for several) returns
    one cotangent per positional argument: an array of the primal's shape and dtype for a float
    array, None for anything else (integer and boolean arrays, Python numbers). ``fn``: a
    ``@tt.fuse`` function or a plain one (fused here); keyword arguments are passed through,
    not differentiated. Works on host, device and CuPy arrays; the pullback's kernels run on
    the side of the arguments. ``fn`` may also be a prebuilt op (``ops.softmax``...) that runs
    a fused definition: see ``PrebuiltOp.vjp``."""
    if not isinstance(fn, fusion.FusedFunction) and hasattr(fn, "vjp"):
        return fn.vjp(*primals, **kwargs)  # a prebuilt op differentiates itself
    fused = fn if isinstance(fn, fusion.FusedFunction) else fusion.fuse(fn)
    outputs = fused(*primals, **kwargs)
    return outputs, Pullback(fused, primals, kwargs, not isinstance(outputs, tuple))


class Pullback:
    """``pullback(cotangents)``: the cotangents of ``vjp``'s primals; ``explain(cotangents)``:
    the backward fused function's plan, as ``FusedFunction.explain`` gives it."""

    def __init__(self, fused, primals: tuple, kwargs: dict, single: bool):
        self.primals, self.kwargs, self.single = primals, kwargs, single
        if fusion.on_dask(primals, kwargs):  # lazy arrays: their dtype and shape
            keywords = tuple(kwargs)
            stand_ins = [_lazy_stand_in(v) for v in (*primals, *kwargs.values())]
        else:  # the arguments read as the forward reads them
            call = fused._call(primals, kwargs)
            keywords, stand_ins = call.keywords, call.stand_ins()
        stand_ins = tuple(map(_stand_in, stand_ins))
        n = len(primals)
        self.differentiable = [s[0] == "array" and lower.is_float(s[1]) for s in stand_ins[:n]]
        made = _make_backward(fused, n, keywords, stand_ins)
        self.backward, self.kept_axes, self.results = made

    def _arguments(self, cotangents) -> tuple:
        cts = (cotangents,) if self.single else tuple(cotangents)
        if len(cts) != len(self.results):
            raise ValueError(f"the pullback takes {len(self.results)} cotangent(s), got {len(cts)}")
        for k, (c, result) in enumerate(zip(cts, self.results, strict=True)):
            check_cotangent(k, c, *result)
        cts = tuple(_as_shape(c, self.kept_axes.get(k)) for k, c in enumerate(cts))
        return (*self.primals, *cts)

    def __call__(self, cotangents) -> tuple:
        grads = self.backward(*self._arguments(cotangents), **self.kwargs)
        grads = list(grads) if isinstance(grads, tuple) else [grads]
        return tuple(grads.pop(0) if d else None for d in self.differentiable)

    def explain(self, cotangents):
        report = self.backward.explain(*self._arguments(cotangents), **self.kwargs)
        report.reasons.insert(0, RECOMPUTED)
        return report

    def inspect(self, cotangents, arch: str | None = None) -> list:
        """Offline compile reports of the backward's kernels (``FusedFunction.inspect``)."""
        return self.backward.inspect(*self._arguments(cotangents), arch=arch, **self.kwargs)


def grad(fn, argnums=0):
    """The gradient of ``fn`` (one result of shape ``()``) with respect to the positional
    argument ``argnums`` (an int, or a tuple of them for a tuple of gradients)."""

    positions = argnums if isinstance(argnums, tuple) else (argnums,)
    if not positions or not all(isinstance(i, int) and not isinstance(i, bool) for i in positions):
        raise TypeError(f"argnums must be an int or a non-empty tuple of ints, got {argnums!r}")

    @functools.wraps(fn)
    def gradient(*args, **kwargs):
        if not all(-len(args) <= i < len(args) for i in positions):
            raise ValueError(f"argnums {argnums!r} is out of range for {len(args)} argument(s)")
        out, pullback = vjp(fn, *args, **kwargs)
        if isinstance(out, tuple) or np.shape(out) != ():
            raise TypeError("tt.grad needs a function with one result of shape (); use tt.vjp")
        grads = pullback(1.0)
        return tuple(grads[i] for i in argnums) if isinstance(argnums, tuple) else grads[argnums]

    return gradient


# --------------------------------------------------------------------------------------------
# the backward fused function of one signature


def check_cotangent(k: int, cotangent, shape: tuple, dtype: np.dtype) -> None:
    """A cotangent has its result's shape (a number for a result of shape ``()``) and, for a
    float result, a float or Python-number dtype: TypeError or ValueError before any launch
    (broadcasting one would differentiate another function)."""
    if fusion.on_dask((cotangent,), {}):
        got_shape, got_dtype = tuple(cotangent.shape), np.dtype(cotangent.dtype)
    else:
        rec = arrays.read(cotangent, f"cotangent {k}")
        got_shape, got_dtype = rec.shape, rec.dtype
    if got_shape != shape:
        raise ValueError(f"cotangent {k} has shape {got_shape}; result {k} has shape {shape}")
    if lower.is_float(dtype) and got_dtype is not None and not lower.is_float(got_dtype):
        raise TypeError(f"cotangent {k} has dtype {got_dtype}; result {k} is {dtype}")


def _as_shape(cotangent, axes):
    """``cotangent`` with size-1 axes put back at ``axes`` (a reduction's, for an output reduced
    without keepdims): a view, on the host or the device (any array fused functions take)."""
    if axes is None:
        return cotangent
    if fusion.on_dask((cotangent,), {}):
        return np.expand_dims(cotangent, axes)
    rec = arrays.read(cotangent, "cotangent", scalars=False)
    if rec.kind == arrays.HOST:
        return np.expand_dims(cotangent, axes)
    shape, strides = list(rec.shape), list(rec.strides)
    for a in sorted(axes):
        shape.insert(a, 1)
        strides.insert(a, 0)
    return arrays.view(arrays.device_handle(rec), tuple(shape), tuple(strides))


def _lazy_stand_in(value) -> tuple:
    if fusion.on_dask((value,), {}):
        return ("array", np.dtype(value.dtype), tuple(value.shape))
    return ("scalar", value)


def _stand_in(stand_in: tuple) -> tuple:
    """A call's stand-in with a number's value replaced by its type's zero: the trace reads
    only its type, and the backward is then made once for all values."""
    kind, value = stand_in[0], stand_in[1]
    if kind == "scalar" and isinstance(value, bool | int | float | np.generic):
        return (kind, type(value)(0))
    return stand_in


@functools.lru_cache(maxsize=128)
def _make_backward(fused, n, keywords, stand_ins):
    """The backward fused function of ``fused`` for one signature, the axes its cotangents get
    back (an output reduced without ``keepdims``), and each result's (shape, dtype)."""
    forward = trace(fused.fn, list(stand_ins), keywords)
    kept_axes = {  # outputs reduced without keepdims: their cotangents get the axes back
        k: tuple(o.arg[0])
        for k, o in enumerate(forward.outputs)
        if o.op in ir.REDUCE and not o.arg[1] and _needs_axes(o)
    }
    differentiable = [
        i for i, s in enumerate(stand_ins[:n]) if s[0] == "array" and lower.is_float(s[1])
    ]
    n_out = len(forward.outputs)
    names = [f"p{i}" for i in range(n)] + [f"c{k}" for k in range(n_out)]

    def backward(*args, **kw):
        primals, cts = args[:n], args[n:]
        result = fused.fn(*primals, **kw)
        outs = (result,) if forward.single else tuple(result)
        return _pull(outs, cts, [primals[i] for i in differentiable], set(kept_axes))

    params = [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in names]
    params += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY) for k in keywords]
    backward.__signature__ = inspect.Signature(params)
    backward.__name__ = backward.__qualname__ = f"{fused.__name__}_backward"
    results = tuple((o.shape, o.dtype) for o in forward.outputs)
    return fusion.fuse(backward, math=fused.math, precision=fused.precision), kept_axes, results


def _needs_axes(node) -> bool:
    """Whether a reduction without keepdims dropped axes other than leading ones: its cotangent
    then cannot broadcast back against its operand."""
    axes = node.arg[0]
    return tuple(axes) != tuple(range(len(axes))) and len(axes) != node.srcs[0].ndim


# --------------------------------------------------------------------------------------------
# the reverse walk


def _acc(dtype) -> np.dtype:
    """The dtype cotangents of a value of ``dtype`` are accumulated in."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def _pull(outs, cts, wrt, kept_outputs: set) -> tuple:
    """The cotangents of ``wrt`` (traced leaves) given those of ``outs``."""
    order = ir.walk([o.node for o in outs])
    operands = {id(s) for n in order for s in n.srcs}  # nodes another node uses
    grads: dict[int, Traced] = {}  # id(node) -> cotangent, in the accumulation dtype

    def add(node, g, kept_axes: bool = False):
        if not lower.is_float(node.dtype) or g is None:
            return
        if not kept_axes:  # (a result's cotangent given with its reduced axes kept is as is)
            g = _unbroadcast(g, node.shape)
        prior = grads.get(id(node))
        grads[id(node)] = g if prior is None else prior + g

    for k, (o, ct) in enumerate(zip(outs, cts, strict=True)):
        if lower.is_float(o.node.dtype):
            add(o.node, _strong(_cast(ct, _acc(o.node.dtype))), k in kept_outputs)
    for node in reversed(order):
        g = grads.get(id(node))
        if g is None or node.op in ir.LEAF or node.op in ir.GENERATED:
            continue
        dropped = node.op in ir.REDUCE and not node.arg[1] and _needs_axes(node)
        if dropped and id(node) in operands:
            raise NotImplementedError(
                f"tt.vjp: {node.op.name.lower()} over axes {list(node.arg[0])} without "
                "keepdims is used inside the function; write it with keepdims=True"
            )
        if node.op in ir.CONTRACT | ir.VIEW:  # a reduction's cotangent, still broadcast
            g = _broadcast_to(g, _v(node))
        rule = RULES.get(node.op)
        if rule is None:
            raise NotImplementedError(f"tt.vjp: no gradient for {node.op.name.lower()}")
        for src, contribution in zip(node.srcs, rule(node, g), strict=True):
            add(src, contribution)
    results = []
    for leaf in wrt:
        g = grads.get(id(leaf.node))
        results.append(_zeros(leaf) if g is None else _cast(_broadcast_to(g, leaf), leaf.dtype))
    return results[0] if len(results) == 1 else tuple(results)


def _unbroadcast(g: Traced, shape: tuple) -> Traced:
    """``g`` summed over the axes ``shape`` was broadcast along. A ``g`` that broadcasts to
    ``shape`` (a reduction's cotangent) stays as it is: it is made full where it must be."""
    gshape = g.shape
    lead = len(gshape) - len(shape)
    ones = tuple(
        lead + i for i, n in enumerate(shape) if n == 1 and lead + i >= 0 and gshape[lead + i] != 1
    )
    if ones:
        g = reduce(Op.SUM, g, ones, True)
    if lead > 0:
        g = reduce(Op.SUM, g, tuple(range(lead)), False)
    return g


def _broadcast_to(g: Traced, like: Traced) -> Traced:
    """``g`` as an array of ``like``'s shape (both branches of a ``where`` are ``g``)."""
    if tuple(g.shape) == tuple(like.shape):
        return g
    return ternary(Op.WHERE, unary(Op.ISNAN, like), g, g)


def _strong(g: Traced) -> Traced:
    """A cotangent passed as a Python number, made a value of its dtype: NumPy 2's weak
    promotion would let it take a float16 operand's dtype, or float64 against itself."""
    return Traced(dataclasses.replace(g.node, weak=False)) if g.node.weak else g


def _cast(g, dtype):
    dtype = np.dtype(dtype)
    if not isinstance(g, Traced):
        return g
    return g if g.dtype == dtype else unary(Op.CAST, g, arg=ir.dtype_arg(dtype))


def _zeros(leaf: Traced) -> Traced:
    """An array of zeros of the leaf's shape and dtype (``0 * x`` would carry its NaN)."""
    return _cast(ternary(Op.WHERE, unary(Op.ISNAN, leaf), 0.0, 0.0), leaf.dtype)


# --------------------------------------------------------------------------------------------
# the rules: (node, cotangent of node) -> one cotangent (or None) per operand


def _v(node) -> Traced | int:
    """A forward value; a mean's count as the number it is (GEMM prologues take numbers)."""
    return counted(node) if node.op is Op.COUNT else Traced(node)


def _where(c, a, b):
    return ternary(Op.WHERE, c, a, b)


def _sign(a):
    """PyTorch's ``sgn``: 1, -1, 0 at 0, NaN at NaN (``a * 0``)."""
    return _where(binary(Op.GT, a, 0), 1.0, _where(binary(Op.LT, a, 0), -1.0, a * 0.0))


def _gelu(node, g):
    a = _v(node.srcs[0])
    cdf = 0.5 * (1.0 + unary(Op.ERF, a * (1 / math.sqrt(2))))
    pdf = unary(Op.EXP, -0.5 * a * a) * (1 / math.sqrt(2 * math.pi))
    return (g * (cdf + a * pdf),)


def _gelu_tanh(node, g):
    a = _v(node.srcs[0])
    t = unary(Op.TANH, SQRT_2_OVER_PI * (a + 0.044715 * a * a * a))
    inner = SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * a * a)
    return (g * (0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * inner),)


def _silu(node, g):
    a = _v(node.srcs[0])
    s = unary(Op.SIGMOID, a)
    return (g * s * (1.0 + a * (1.0 - s)),)


def _pow(node, g):
    a, b, y = _v(node.srcs[0]), _v(node.srcs[1]), _v(node)
    da = g * b * binary(Op.POW, a, b - 1)
    # PyTorch's rule: no exponent gradient where the base is 0 and the exponent >= 0
    zero = binary(Op.AND, binary(Op.EQ, a, 0), binary(Op.GE, b, 0))
    db = _where(zero, 0.0, g * y * unary(Op.LOG, a))
    return da, db


def _extreme(compare: Op):
    def rule(node, g):
        a, b = _v(node.srcs[0]), _v(node.srcs[1])
        wins, tie = binary(compare, a, b), binary(Op.EQ, a, b)
        half = 0.5 * g
        return _where(wins, g, _where(tie, half, 0.0)), _where(
            binary(compare, b, a), g, _where(tie, half, 0.0)
        )

    return rule


# A reduction's cotangent broadcasts back against its operand as it is: it kept the reduced
# axes (keepdims, or a result of fn reshaped by the pullback), or they were leading ones.


def _reduce_extreme(node, g):
    """PyTorch's ``amax``/``amin`` rule: the cotangent shared evenly among the elements equal to
    the result (a NaN result: NaN gradient)."""
    a = _v(node.srcs[0])
    axes = node.arg[0]
    hit = unary(
        Op.CAST, binary(Op.EQ, a, reduce(node.op, a, axes, True)), arg=ir.dtype_arg(g.dtype)
    )
    return (hit * g / reduce(Op.SUM, hit, axes, True),)


def _mod(node, g):
    """NumPy's remainder ``a - floor(a / b) * b``, differentiated as PyTorch does."""
    a, b = _v(node.srcs[0]), _v(node.srcs[1])
    return g, -g * unary(Op.FLOOR, a / b)


def _matmul(node, g):
    """``dA = dC @ B^T``, ``dB = A^T @ dC``. For 16-bit operands the cotangent is rounded to
    their dtype first (the backward GEMMs run on the same tensor-core kernels, which read the
    transposed operands in place, accumulating in float32, as PyTorch's 16-bit autograd does):
    a GEMM operand must be an argument's view or a value of its own, not a cast of a transposed
    argument."""
    a, b = _v(node.srcs[0]), _v(node.srcs[1])
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise NotImplementedError("tt.vjp: matmul of 1-D operands")
    if a.dtype == b.dtype and a.dtype != g.dtype and np.dtype(a.dtype).itemsize == 2:
        g = _rounded(g, a.dtype)
    return matmul(g, swapaxes(b, -1, -2)), matmul(swapaxes(a, -1, -2), g)


def _sum_of_product(node, g):
    """``g`` for both terms of ``a + b`` (``-g`` for the second of ``a - b``); where a term is
    a 16-bit product in the sum's dtype, rounded to that dtype first, as the product's own rule
    would round it (:func:`_matmul`): the other term's gradient (a bias's column sum) then
    reads the array the backward GEMMs read, as PyTorch's 16-bit autograd does, instead of a
    second GEMM recomputing the value before its rounding."""
    dtype = node.dtype
    if (
        g.dtype != dtype
        and np.dtype(dtype).itemsize == 2
        and any(s.op is Op.MATMUL and s.dtype == dtype for s in node.srcs)
    ):
        g = _rounded(g, dtype)
    return g, (-g if node.op is Op.SUB else g)


def _rounded(g: Traced, dtype) -> Traced:
    """``g`` as ``dtype``: the value it was widened from where it is a cast of one (the
    round trip is exact, and the GEMM then reads the 16-bit array on tensor cores)."""
    node = g.node
    if node.op is Op.CAST and node.srcs[0].dtype == dtype:
        return Traced(node.srcs[0])
    return unary(Op.CAST, g, arg=ir.dtype_arg(dtype))


def _no_gradient(node, g):
    return (None,) * len(node.srcs)


RULES = {
    Op.NEG: lambda n, g: (-g,),
    Op.ABS: lambda n, g: (g * _sign(_v(n.srcs[0])),),
    Op.EXP: lambda n, g: (g * _v(n),),
    Op.EXP2: lambda n, g: (g * _v(n) * LN2,),
    Op.LOG: lambda n, g: (g / _v(n.srcs[0]),),
    Op.LOG2: lambda n, g: (g / (_v(n.srcs[0]) * LN2),),
    Op.LOG1P: lambda n, g: (g / (1.0 + _v(n.srcs[0])),),
    Op.EXPM1: lambda n, g: (g * (_v(n) + 1.0),),
    Op.SQRT: lambda n, g: (g / (2.0 * _v(n)),),
    Op.RSQRT: lambda n, g: (-0.5 * g * _v(n) * _v(n) * _v(n),),
    Op.SIN: lambda n, g: (g * unary(Op.COS, _v(n.srcs[0])),),
    Op.COS: lambda n, g: (-g * unary(Op.SIN, _v(n.srcs[0])),),
    Op.TANH: lambda n, g: (g * (1.0 - _v(n) * _v(n)),),
    Op.ERF: lambda n, g: (
        g * (2 / math.sqrt(math.pi)) * unary(Op.EXP, -_v(n.srcs[0]) * _v(n.srcs[0])),
    ),
    Op.SIGMOID: lambda n, g: (g * _v(n) * (1.0 - _v(n)),),
    Op.SQUARE: lambda n, g: (2.0 * g * _v(n.srcs[0]),),
    # PyTorch's threshold rule: 0 where x <= 0, so a NaN passes the cotangent
    Op.RELU: lambda n, g: (_where(binary(Op.LE, _v(n.srcs[0]), 0), 0.0, g),),
    Op.GELU: _gelu,
    Op.GELU_TANH: _gelu_tanh,
    Op.SILU: _silu,
    Op.CAST: lambda n, g: (g,),
    Op.ADD: _sum_of_product,
    Op.SUB: _sum_of_product,
    Op.MUL: lambda n, g: (g * _v(n.srcs[1]), g * _v(n.srcs[0])),
    Op.TRUEDIV: lambda n, g: (g / _v(n.srcs[1]), -g * _v(n) / _v(n.srcs[1])),
    Op.POW: _pow,
    Op.MAXIMUM: _extreme(Op.GT),
    Op.MINIMUM: _extreme(Op.LT),
    Op.WHERE: lambda n, g: (None, _where(_v(n.srcs[0]), g, 0.0), _where(_v(n.srcs[0]), 0.0, g)),
    Op.SUM: lambda n, g: (g,),
    Op.MOD: _mod,
    Op.MAX: _reduce_extreme,
    Op.MIN: _reduce_extreme,
    Op.MATMUL: _matmul,
    Op.SWAPAXES: lambda n, g: (swapaxes(g, *n.arg),),
    **{
        op: _no_gradient
        for op in {Op.FLOOR, Op.CEIL, Op.FLOORDIV, Op.ISNAN, Op.ISINF, Op.ISFINITE, Op.INVERT}
        | ir.BINARY - {Op.ADD, Op.SUB, Op.MUL, Op.TRUEDIV, Op.POW, Op.MAXIMUM, Op.MINIMUM, Op.MOD}
        | {Op.ARGMAX, Op.ARGMIN, Op.ANY, Op.ALL}
    },
}
