"""Softmax and log-softmax: fused definitions (the composer already makes the best kernel).

The composer plans ``max -> exp(x - max) -> sum -> divide`` into one kernel: a warp or a block
per row, the row kept on chip between passes when it fits (else the normaliser is computed
online in the maximum's pass), one reciprocal per row. A hand-written kernel would move the
same bytes, so these are ``@tt.fuse`` definitions, one per (axis, kind), memoised.
"""

from __future__ import annotations

import functools

from .. import fusion as tt
from ._compute import widened


@functools.cache
def softmax(axis: int) -> tt.FusedFunction:
    """Fused ``exp(x - max) / sum(exp(x - max))`` over ``axis`` (a fixed, normalised axis)."""

    def softmax(x):
        xc = widened(x)
        m = tt.max(xc, axis=axis, keepdims=True)
        e = tt.exp(xc - m)
        return tt.astype(e / tt.sum(e, axis=axis, keepdims=True), x.dtype)

    return tt.fuse(softmax)


@functools.cache
def log_softmax(axis: int) -> tt.FusedFunction:
    """Fused ``(x - max) - log(sum(exp(x - max)))`` over ``axis``."""

    def log_softmax(x):
        xc = widened(x)
        d = xc - tt.max(xc, axis=axis, keepdims=True)
        return tt.astype(d - tt.log(tt.sum(tt.exp(d), axis=axis, keepdims=True)), x.dtype)

    return tt.fuse(log_softmax)
