"""Layer norm and RMS norm over the last axis: fused definitions.

The composer makes one kernel per call: a warp or a block per row, the row kept on chip between
the statistics pass and the write pass when it fits (8,192 float32 per row for a block), one
``rsqrt`` per row, and the weight and bias read as broadcast rows. That is the minimum traffic
(read x once, write y once), so no hand-written kernel is shipped for these yet.

float16 rows are computed in float32 and rounded once, at the end (see ``_compute``).
"""

from __future__ import annotations

import functools

from .. import fusion as tt
from ._compute import widened


@functools.cache
def layer_norm(has_weight: bool, has_bias: bool) -> tt.FusedFunction:
    """Fused ``(x - mean) * rsqrt(var + eps) [* weight] [+ bias]``, biased variance.

    Arguments of the fused function: ``x, [weight], [bias], eps``. The statistics follow the
    corrected two-pass algorithm (Chan, Golub and LeVeque, 1983): the mean of the centred row
    is the rounding error of the first mean, so ``centred - error`` is accurate even where
    the mean itself is not representable (a constant row of 1000.1 gives 0, not
    ``ulp(1000.1) / sqrt(eps)``). It costs one more sum in the variance's pass.
    """

    def layer_norm(x, *rest):
        *params, eps = rest
        xc = widened(x)
        centred = xc - tt.mean(xc, axis=-1, keepdims=True)
        error = tt.mean(centred, axis=-1, keepdims=True)
        var = tt.mean(centred * centred, axis=-1, keepdims=True) - error * error
        scale = tt.rsqrt(var + eps)
        y = centred * scale - error * scale  # one FFMA per element
        if has_weight:
            y = y * params.pop(0)
        if has_bias:
            y = y + params.pop(0)
        return tt.astype(y, x.dtype)

    return tt.fuse(layer_norm)


@functools.cache
def rms_norm(has_weight: bool) -> tt.FusedFunction:
    """Fused ``x * rsqrt(mean(x * x) + eps) [* weight]``; arguments ``x, [weight], eps``."""

    def rms_norm(x, *rest):
        *params, eps = rest
        xc = widened(x)
        y = xc * tt.rsqrt(tt.mean(xc * xc, axis=-1, keepdims=True) + eps)
        if has_weight:
            y = y * params[0]
        return tt.astype(y, x.dtype)

    return tt.fuse(rms_norm)
