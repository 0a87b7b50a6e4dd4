"""Reductions with NumPy's semantics (``sum``, ``mean``, ``max``, ``min``, ``var``, ``std``,
``argmax``, ``argmin``): fused definitions of :mod:`tessera_tile.ops._definitions`."""

from __future__ import annotations

import numpy as np

from ..kernels._calls import (
    COMPOSED_FLOATS,
    array_arg,
    axis_index,
)
from . import _definitions
from ._contract import Fused, PrebuiltOp

REDUCIBLE = tuple(np.dtype(d) for d in ("bool", "int32", "int64")) + COMPOSED_FLOATS


def _axes(axis, ndim: int):
    """None, or a sorted tuple of distinct normalised axes (NumPy's rules for ``axis=``)."""
    if axis is None:
        return None
    if isinstance(axis, tuple):
        axes = tuple(axis_index(a, ndim) for a in axis)
        if len(set(axes)) != len(axes):
            raise ValueError(f"axis {axis} repeats an axis")
        return tuple(sorted(axes))
    return axis_index(axis, ndim)


_SELECTION = "Exact; NaN wins, as in NumPy."
_REDUCTION_NUMERICS = {
    "sum": "float16 is summed in float32 and rounded once; NaN propagates, inf + -inf is NaN.",
    "mean": "float16 is summed in float32 and rounded once; NaN propagates, inf + -inf is NaN.",
    "var": "float16 is computed in float32 and rounded once (NumPy squares float16 deviations "
    "in float16); a NaN or an infinity gives NaN.",
    "std": "float16 is computed in float32 and rounded once, so it is inf only where the "
    "result is (NumPy's float16 std overflows with its variance); a NaN or an infinity gives "
    "NaN.",
    "max": _SELECTION,
    "min": _SELECTION,
    "argmax": "Exact; the first NaN's index wins, as in NumPy.",
    "argmin": "Exact; the first NaN's index wins, as in NumPy.",
}


def _reduction_plan(name: str):
    one_axis = name in ("argmax", "argmin")

    def plan(x, axis=None, keepdims=False, ddof=0):
        a = array_arg(x, "x", REDUCIBLE, name)
        if not isinstance(keepdims, bool | np.bool_):
            raise TypeError(f"keepdims must be a bool, got {type(keepdims).__name__}")
        if one_axis and isinstance(axis, tuple):
            raise TypeError(f"{name} takes one axis or None, not a tuple")
        axes = _axes(axis, len(a.shape))
        return Fused(_definitions.reduction(name, axes, bool(keepdims), _ddof(ddof)), (a,))

    def moments(x, axis=None, keepdims=False, ddof=0):
        return plan(x, axis, keepdims, ddof)

    def selection(x, axis=None, keepdims=False):
        return plan(x, axis, keepdims)

    chosen = moments if name in ("var", "std") else selection
    chosen.__name__ = chosen.__qualname__ = name
    chosen.__doc__ = (
        f"``numpy.{name}(x, axis, keepdims=keepdims"
        + (", ddof=ddof)``: divided by ``max(n - ddof, 0)``" if chosen is moments else ")``")
        + " with NumPy's result dtype.\n\n    x: bool, int32, int64, float16, float32 or "
        + "float64. "
        + _REDUCTION_NUMERICS[name]
    )
    return chosen


def _ddof(ddof) -> int:
    """``ddof``: an int (NumPy also takes a float, which would make the divisor float64)."""
    if isinstance(ddof, bool | np.bool_) or not isinstance(ddof, int | np.integer):
        raise TypeError(f"ddof must be an int, got {type(ddof).__name__}")
    return int(ddof)


sum = PrebuiltOp(_reduction_plan("sum"))  # noqa: A001 - NumPy's names
mean = PrebuiltOp(_reduction_plan("mean"))
max = PrebuiltOp(_reduction_plan("max"))  # noqa: A001
min = PrebuiltOp(_reduction_plan("min"))  # noqa: A001
var = PrebuiltOp(_reduction_plan("var"))
std = PrebuiltOp(_reduction_plan("std"))
argmax = PrebuiltOp(_reduction_plan("argmax"))
argmin = PrebuiltOp(_reduction_plan("argmin"))
