"""The fused definitions of the prebuilt row ops and reductions, and of cross-entropy's
reduction over rows: ``@tt.fuse`` functions the ops dispatch to, memoised per variant.

The composer already makes the best kernel for these, so no hand-written kernel is shipped:

- **softmax, log-softmax**: ``max -> exp(x - max) -> sum -> divide`` in one kernel, a warp or
  a block per row, the row kept on chip between passes when it fits (else the normaliser is
  computed online in the maximum's pass), one reciprocal per row.
- **layer norm, RMS norm** over the last axis: one kernel per call, the row kept on chip
  between the statistics pass and the write pass when it fits (16,384 float32 per row for a
  block of 512), one ``rsqrt`` per row, the weight and bias read as broadcast rows once per
  block: the minimum traffic (x read once, y written once).
- **reductions** (sum, mean, max, min, var, std, argmax, argmin): a warp or a block per row
  for trailing axes; for leading axes, rows split across blocks (16-byte loads of adjacent
  columns, several rows in flight per thread, per-block partials folded in order by the last
  block of each column tile); ``var`` and ``std`` there in one pass (Welford folds, partials
  merged by Chan's formula); a deterministic two-stage reduction in one launch for all axes.
  Results follow NumPy's dtypes.

**float16 is computed in float32** and rounded once, at the end. The composer rounds a
float16-typed value to float16 where a reduction reads it (as NumPy stores float16 arrays), so
a definition that squares or exponentiates float16 values would round, or overflow
(``x * x`` past ``|x| = 256``), between steps; these definitions widen x first and cast the
result back. (NumPy squares float16 deviations in float16, so its ``var`` and ``std`` overflow
from deviations of 256 on; ``std`` here is inf only where the result is.)
"""

from __future__ import annotations

import functools

import numpy as np

from .. import fusion as tt


def widened(x):
    """``x`` in its compute dtype: float32 for float16, else ``x`` itself."""
    return tt.astype(x, np.float32) if x.dtype == np.float16 else x


# --------------------------------------------------------------------------------------------
# softmax and log-softmax, over a fixed (normalised) axis


@functools.cache
def softmax(axis: int) -> tt.FusedFunction:
    """Fused ``exp(x - max) / sum(exp(x - max))`` over ``axis`` (a fixed, normalised axis)."""

    def softmax(x):
        xc = widened(x)
        m = tt.max(xc, axis=axis, keepdims=True)
        e = tt.exp(xc - m)
        return tt.astype(e / tt.sum(e, axis=axis, keepdims=True), x.dtype)

    return tt.fuse(softmax)


def accumulated(v):
    """A value in the dtype gradients are accumulated in: float32, float64 for float64 (so a
    16-bit gradient is rounded once, at the end)."""
    return v if v.dtype == np.float64 else tt.astype(v, np.float32)


@functools.cache
def softmax_backward(axis: int) -> tt.FusedFunction:
    """Softmax's gradient from its result ``y`` and the cotangent ``dy``:
    ``y * (dy - sum(dy * y))`` over ``axis``, one row kernel reading each once."""

    def softmax_backward(y, dy):
        yc, g = accumulated(y), accumulated(dy)
        return tt.astype(yc * (g - tt.sum(g * yc, axis=axis, keepdims=True)), y.dtype)

    return tt.fuse(softmax_backward)


@functools.cache
def log_softmax_backward(axis: int) -> tt.FusedFunction:
    """Log-softmax's gradient from its result ``y`` and the cotangent ``dy``:
    ``dy - exp(y) * sum(dy)`` over ``axis``, one row kernel reading each once."""

    def log_softmax_backward(y, dy):
        yc, g = accumulated(y), accumulated(dy)
        return tt.astype(g - tt.exp(yc) * tt.sum(g, axis=axis, keepdims=True), y.dtype)

    return tt.fuse(log_softmax_backward)


@functools.cache
def log_softmax(axis: int) -> tt.FusedFunction:
    """Fused ``(x - max) - log(sum(exp(x - max)))`` over ``axis``."""

    def log_softmax(x):
        xc = widened(x)
        d = xc - tt.max(xc, axis=axis, keepdims=True)
        return tt.astype(d - tt.log(tt.sum(tt.exp(d), axis=axis, keepdims=True)), x.dtype)

    return tt.fuse(log_softmax)


# --------------------------------------------------------------------------------------------
# layer norm and RMS norm over the last axis


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


# --------------------------------------------------------------------------------------------
# reductions

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


# --------------------------------------------------------------------------------------------
# cross-entropy's reduction of its per-row losses


@functools.cache
def reduce_losses(reduction: str, dtype: str) -> tt.FusedFunction:
    """Fused ``sum(loss)`` (arguments: loss) or ``sum(loss) / sum(valid)`` (arguments: loss,
    valid) of the per-row losses, as ``dtype``; deterministic (the composer's two-stage full
    reduction, combined in block order)."""

    def mean_loss(loss, valid):
        return tt.astype(tt.sum(loss) / tt.sum(valid), dtype)

    def sum_loss(loss):
        return tt.astype(tt.sum(loss), dtype)

    return tt.fuse(mean_loss if reduction == "mean" else sum_loss)


@functools.cache
def cast(dtype) -> tt.FusedFunction:
    """Fused ``astype(v, dtype)``: cross-entropy's kept float32 losses as the result's dtype,
    a bfloat16 cotangent as the float32 its backward kernel reads."""

    def cast(v):
        return tt.astype(v, dtype)

    return tt.fuse(cast)


@functools.cache
def mean_loss_scale(dtype: str) -> tt.FusedFunction:
    """The scale of every row's gradient for cross-entropy's ``"mean"``: the loss's cotangent
    over the rows counted, ``g / sum(valid)``, as ``dtype``."""

    def mean_loss_scale(g, valid):
        return tt.astype(g, dtype) / tt.sum(valid)

    return tt.fuse(mean_loss_scale)


@functools.cache
def valid_reciprocal(dtype: str) -> tt.FusedFunction:
    """One over the rows cross-entropy counts, ``1 / sum(targets != ignore_index)``, as
    ``dtype``: the ``"mean"`` gradient's scale before any row is read."""

    def valid_reciprocal(targets, ignore_index):
        return 1.0 / tt.sum(tt.astype(targets != ignore_index, dtype))

    return tt.fuse(valid_reciprocal)


@functools.cache
def scaled_gradient(dtype: str, compute: str) -> tt.FusedFunction:
    """``grad * g`` in ``compute``, as ``dtype``: a gradient the forward wrote, scaled by the
    loss's cotangent."""

    def scaled_gradient(grad, g):
        return tt.astype(tt.astype(grad, compute) * tt.astype(g, compute), dtype)

    return tt.fuse(scaled_gradient)


# --------------------------------------------------------------------------------------------
# the matmul family, as the composer differentiates it (the ops run hand-written GEMMs)

_ACTIVATIONS = {
    None: lambda v: v,
    "relu": tt.relu,
    "gelu": tt.gelu,
    "gelu_tanh": lambda v: tt.gelu(v, approximate="tanh"),
    "silu": tt.silu,
}


@functools.cache
def linear(activation, has_bias: bool, precision) -> tt.FusedFunction:
    """Fused ``activation(x @ w [+ bias])``; arguments ``x, w, [bias]``."""
    act = _ACTIVATIONS[activation]

    def linear(x, w, *bias):
        return act(x @ w + bias[0] if has_bias else x @ w)

    return tt.fuse(linear, precision=precision)


@functools.cache
def mlp(activation, has_b1: bool, has_b2: bool, precision) -> tt.FusedFunction:
    """Fused ``activation(x @ w1 [+ b1]) @ w2 [+ b2]``; arguments ``x, w1, [b1], w2, [b2]``."""
    act = _ACTIVATIONS[activation]

    def mlp(x, w1, *rest):
        rest = list(rest)
        h = x @ w1 + rest.pop(0) if has_b1 else x @ w1
        y = act(h) @ rest.pop(0)
        return y + rest.pop(0) if has_b2 else y

    return tt.fuse(mlp, precision=precision)
