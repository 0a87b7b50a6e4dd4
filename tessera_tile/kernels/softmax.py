"""Softmax and log-softmax: fused definitions (the composer already makes the best kernel).

The composer plans ``max -> exp(x - max) -> sum -> divide`` into one kernel: a warp or a block
per row, the row kept on chip between passes when it fits (else the normaliser is computed
online in the maximum's pass), one reciprocal per row. A hand-written kernel would move the
same bytes, so these are ``@tt.fuse`` definitions, one per (axis, kind), memoised.
"""

from __future__ import annotations

import functools

from .. import fusion as tt


@functools.cache
def softmax(axis: int) -> tt.FusedFunction:
    """Fused ``exp(x - max) / sum(exp(x - max))`` over ``axis`` (a fixed, normalised axis)."""

    def softmax(x):
        m = tt.max(x, axis=axis, keepdims=True)
        e = tt.exp(x - m)
        return e / tt.sum(e, axis=axis, keepdims=True)

    return tt.fuse(softmax)


@functools.cache
def log_softmax(axis: int) -> tt.FusedFunction:
    """Fused ``(x - max) - log(sum(exp(x - max)))`` over ``axis``."""

    def log_softmax(x):
        d = x - tt.max(x, axis=axis, keepdims=True)
        return d - tt.log(tt.sum(tt.exp(d), axis=axis, keepdims=True))

    return tt.fuse(log_softmax)
