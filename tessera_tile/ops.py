"""Prebuilt fused ops on CuPy arrays, numba device arrays and NumPy arrays.

::

    from tessera_tile import ops

    y = ops.softmax(x)                      # x: CuPy in, CuPy out; NumPy in, NumPy out
    y = ops.layer_norm(x, w, b, out=y, stream=s)
    print(ops.softmax.explain(x))           # kernels, predicted traffic, source, no launch
    reports = ops.rms_norm.inspect(x, w, arch="sm_90")   # offline compile reports

Every op validates its arguments (each read once into an ``_arrays.Arg`` record) and raises
``TypeError`` or ``ValueError`` naming the argument before anything is launched, then dispatches
to :mod:`tessera_tile.kernels`: a fused definition where the composer already makes the best
kernel (softmax, log-softmax, the norms, reductions), a hand-written kernel where one does
better (cross-entropy's gather, the padded transpose). Results follow the inputs (see
``docs/ops.md``); ``out=`` writes into a given array, ``stream=`` picks the stream; inputs are
never modified. float16 is computed in float32.
"""

from __future__ import annotations

import inspect as _pyinspect
import numbers
import operator
from dataclasses import dataclass

import numpy as np

from . import _arrays as arrays
from .kernels import norms as _norms
from .kernels import reduction as _reduction
from .kernels import softmax as _softmax

__all__ = [
    "argmax", "argmin", "layer_norm", "log_softmax", "max", "mean", "min",
    "rms_norm", "softmax", "std", "sum", "var",
]  # fmt: skip

FLOATS = tuple(np.dtype(d) for d in ("float16", "float32", "float64"))
REDUCIBLE = tuple(np.dtype(d) for d in ("bool", "int32", "int64")) + FLOATS


# --------------------------------------------------------------------------------------------
# the op object: call, explain, inspect


class PrebuiltOp:
    """A prebuilt op: ``op(*args, out=None, stream=None, **kwargs)``, ``op.explain(...)`` and
    ``op.inspect(..., arch="sm_90")``.

    ``explain`` returns the :class:`tessera_tile.fusion.Explain` report of the call (kernels,
    predicted traffic, source, reasons) and ``inspect`` one offline compile report per kernel
    the call would launch; neither allocates nor launches, and NumPy arrays may stand in for
    device arrays (only their shape, dtype and strides are used).
    """

    def __init__(self, plan):
        self._plan = plan
        self.__name__ = self.__qualname__ = plan.__name__
        self.__doc__ = plan.__doc__
        self.__module__ = __name__
        sig = _pyinspect.signature(plan)
        extra = [
            _pyinspect.Parameter(n, _pyinspect.Parameter.KEYWORD_ONLY, default=None)
            for n in ("out", "stream")
        ]
        self.__signature__ = sig.replace(parameters=[*sig.parameters.values(), *extra])

    def __call__(self, *args, out=None, stream=None, **kwargs):
        return self._plan(*args, **kwargs).run(out, stream)

    def explain(self, *args, **kwargs):
        """What the call would do, without running it (see the class docstring)."""
        return self._plan(*args, **kwargs).explain()

    def inspect(self, *args, arch: str = "sm_90", **kwargs) -> list:
        """Offline compile reports of the kernels the call would launch, for ``arch``."""
        return self._plan(*args, **kwargs).inspect(arch)

    def __repr__(self) -> str:
        return f"<tessera_tile op {self.__name__}{self.__signature__}>"


@dataclass
class _Fused:
    """A call dispatched to a fused definition of :mod:`tessera_tile.kernels`."""

    fn: object  # a FusedFunction
    args: tuple

    def run(self, out, stream):
        return self.fn(*self.args, out=out, stream=stream)

    def explain(self):
        return self.fn.explain(*self.args)

    def inspect(self, arch: str) -> list:
        return self.fn.inspect(*self.args, arch=arch)


# --------------------------------------------------------------------------------------------
# validation (before any launch; every message names the argument)


def _array(value, name: str, dtypes, what: str) -> arrays.Arg:
    a = arrays.read(value, name, scalars=False)
    if a.dtype not in dtypes:
        raise TypeError(
            f"{name} has dtype {a.dtype}; {what} takes {', '.join(str(d) for d in dtypes)}"
        )
    return a


def _axis(axis, ndim: int, name: str = "axis") -> int:
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(axis).__name__}")
    axis = operator.index(axis)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name} {axis} is out of range for an array of {ndim} dimension(s)")
    return axis % ndim


def _axes(axis, ndim: int):
    """None, or a sorted tuple of distinct normalised axes (NumPy's rules for ``axis=``)."""
    if axis is None:
        return None
    if isinstance(axis, tuple):
        axes = tuple(_axis(a, ndim) for a in axis)
        if len(set(axes)) != len(axes):
            raise ValueError(f"axis {axis} repeats an axis")
        return tuple(sorted(axes))
    return _axis(axis, ndim)


def _eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    return float(eps)


def _row_param(value, name: str, x: arrays.Arg, what: str) -> arrays.Arg:
    """A weight or bias: shape ``(x.shape[-1],)`` and x's dtype, on x's side."""
    p = arrays.read(value, name, scalars=False)
    if p.shape != x.shape[-1:]:
        raise ValueError(f"{name} has shape {p.shape}; {what} needs ({x.shape[-1]},)")
    if p.dtype != x.dtype:
        raise TypeError(f"{name} has dtype {p.dtype}; it must match x's dtype {x.dtype}")
    arrays.check_one_side([x, p], ["x", name])
    return p


# --------------------------------------------------------------------------------------------
# softmax, log-softmax, norms (fused definitions)


def _softmax_plan(kind: str):
    def plan(x, axis=-1):
        a = _array(x, "x", FLOATS, kind)
        if not a.shape:
            raise ValueError(f"x is 0-dimensional; {kind} needs at least one axis")
        return _Fused(getattr(_softmax, kind)(_axis(axis, len(a.shape))), (x,))

    return plan


def softmax(x, axis=-1):
    """Softmax over ``axis``: ``exp(x - max) / sum(exp(x - max))`` (numerically stable).

    x: float16 (computed in float32), float32 or float64, any strides. One kernel: a warp or a
    block per row, the row read once when it fits on chip.
    """
    return _softmax_plan("softmax")(x, axis)


def log_softmax(x, axis=-1):
    """Log-softmax over ``axis``: ``(x - max) - log(sum(exp(x - max)))`` (stable)."""
    return _softmax_plan("log_softmax")(x, axis)


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """Layer norm over the last axis, as in PyTorch (biased variance)::

        (x - mean(x)) / sqrt(var(x) + eps) * weight + bias

    weight, bias: None or arrays of shape ``(x.shape[-1],)`` and x's dtype. One kernel, the row
    read once when it fits on chip, one ``rsqrt`` per row.
    """
    a = _array(x, "x", FLOATS, "layer_norm")
    if not a.shape:
        raise ValueError("x is 0-dimensional; layer_norm normalises over the last axis")
    params = [
        v
        for v, name in ((weight, "weight"), (bias, "bias"))
        if v is not None and _row_param(v, name, a, "layer_norm")
    ]
    fn = _norms.layer_norm(weight is not None, bias is not None)
    return _Fused(fn, (x, *params, _eps(eps)))


def rms_norm(x, weight=None, eps=1e-6):
    """RMS norm over the last axis: ``x / sqrt(mean(x**2) + eps) * weight``.

    weight: None or an array of shape ``(x.shape[-1],)`` and x's dtype.
    """
    a = _array(x, "x", FLOATS, "rms_norm")
    if not a.shape:
        raise ValueError("x is 0-dimensional; rms_norm normalises over the last axis")
    params = [] if weight is None else [_row_param(weight, "weight", a, "rms_norm") and weight]
    return _Fused(_norms.rms_norm(weight is not None), (x, *params, _eps(eps)))


# --------------------------------------------------------------------------------------------
# reductions (fused definitions)


def _reduction_plan(name: str):
    one_axis = name in ("argmax", "argmin")

    def plan(x, axis=None, keepdims=False):
        a = _array(x, "x", REDUCIBLE, name)
        if not isinstance(keepdims, bool | np.bool_):
            raise TypeError(f"keepdims must be a bool, got {type(keepdims).__name__}")
        if one_axis and isinstance(axis, tuple):
            raise TypeError(f"{name} takes one axis or None, not a tuple")
        axes = _axes(axis, len(a.shape))
        return _Fused(_reduction.reduction(name, axes, bool(keepdims)), (x,))

    plan.__name__ = plan.__qualname__ = name
    plan.__doc__ = (
        f"``numpy.{name}(x, axis, keepdims=keepdims)`` with NumPy's result dtype"
        + (" (ddof=0)" if name in ("var", "std") else "")
        + ".\n\n    x: bool, int32, int64, float16 (computed in float32), float32 or float64."
    )
    plan.__signature__ = _pyinspect.signature(_signature_of_reduction)
    return plan


def _signature_of_reduction(x, axis=None, keepdims=False):
    """(signature template of the reductions)"""


softmax = PrebuiltOp(softmax)
log_softmax = PrebuiltOp(log_softmax)
layer_norm = PrebuiltOp(layer_norm)
rms_norm = PrebuiltOp(rms_norm)
sum = PrebuiltOp(_reduction_plan("sum"))  # noqa: A001 - NumPy's names
mean = PrebuiltOp(_reduction_plan("mean"))
max = PrebuiltOp(_reduction_plan("max"))  # noqa: A001
min = PrebuiltOp(_reduction_plan("min"))  # noqa: A001
var = PrebuiltOp(_reduction_plan("var"))
std = PrebuiltOp(_reduction_plan("std"))
argmax = PrebuiltOp(_reduction_plan("argmax"))
argmin = PrebuiltOp(_reduction_plan("argmin"))
