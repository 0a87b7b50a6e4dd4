"""Reductions (sum, mean, max, min, var, std, argmax, argmin): fused definitions.

The composer picks the kernel from the axes: a warp or a block per row for trailing axes, a
coalesced thread-per-column kernel for leading axes, a deterministic two-stage reduction in one
launch for all axes. Results follow NumPy's dtypes (NumPy itself infers them).
"""

from __future__ import annotations

import functools

from .. import fusion as tt

_FUNCTIONS = {
    "sum": tt.sum,
    "mean": tt.mean,
    "max": tt.max,
    "min": tt.min,
    "var": tt.var,
    "std": tt.std,
    "argmax": tt.argmax,
    "argmin": tt.argmin,
}

NAMES = tuple(_FUNCTIONS)


@functools.cache
def reduction(name: str, axis, keepdims: bool) -> tt.FusedFunction:
    """Fused ``name(x, axis, keepdims)``; ``axis`` is None, an int or a sorted tuple."""
    reduce = _FUNCTIONS[name]

    def fn(x):
        return reduce(x, axis=axis, keepdims=keepdims)

    fn.__name__ = fn.__qualname__ = name
    return tt.fuse(fn)
