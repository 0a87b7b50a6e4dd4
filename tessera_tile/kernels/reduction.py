"""Reductions (sum, mean, max, min, var, std, argmax, argmin): fused definitions.

The composer picks the kernel from the axes: a warp or a block per row for trailing axes; for
leading axes, rows split across blocks (16-byte loads of adjacent columns, several rows in
flight per thread, per-block partials folded in order by the last block of each column tile);
``var`` and ``std`` there in one pass (Welford folds, partials merged by Chan's formula); a
deterministic two-stage reduction in one launch for all axes. Results follow NumPy's
dtypes (NumPy itself infers them). float16 sums, means, variances and standard deviations are
computed in float32 and rounded once (NumPy squares float16 deviations in float16, so its
``var`` and ``std`` overflow from deviations of 256 on; ``std`` here is inf only where the
result is).
"""

from __future__ import annotations

import functools

import numpy as np

from .. import fusion as tt
from ._compute import widened

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
ARITHMETIC = frozenset({"sum", "mean", "var", "std"})  # the rest select an element


@functools.cache
def reduction(name: str, axis, keepdims: bool, ddof=0) -> tt.FusedFunction:
    """Fused ``name(x, axis, keepdims)``; ``axis`` is None, an int or a sorted tuple;
    ``ddof`` for ``var`` and ``std``."""
    reduce = _FUNCTIONS[name]
    options = {"axis": axis, "keepdims": keepdims}
    if name in ("var", "std"):
        options["ddof"] = ddof

    def fn(x):
        if name not in ARITHMETIC or x.dtype != np.float16:
            return reduce(x, **options)
        return tt.astype(reduce(widened(x), **options), x.dtype)

    fn.__name__ = fn.__qualname__ = name
    return tt.fuse(fn)
