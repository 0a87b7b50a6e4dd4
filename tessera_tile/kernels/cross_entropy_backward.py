"""Cross-entropy backward: hand-written, one warp per row, the logits read once.

The gradient of a row's loss ``lse - x[t]`` is ``softmax(row) - onehot(t)``, scaled by the
row's cotangent (``"none"``), the loss's (``"sum"``) or the loss's over the rows counted
(``"mean"``); an ignored row's is 0. The forward kept each row's loss in float32 (float64 for
float64 logits), so ``lse = loss + x[t]`` costs one logit per row, and one pass over the row
writes its gradient: the logits read once and the gradient written once, no probability
stored.

::

    block = 4 warps; warp w of block b takes rows b*4 + w, + 4*gridDim.x, ...
    lane 0 reads the target, the loss, x[target] and the scale; shuffled to the warp
    lane l writes 16-byte chunks l, l+32, ... of the row's gradient from the same chunks of
      the logits (when the row, the gradient's row and the target allow; else column by column)
      (exp(x - lse) - [j == t]) * scale, exp as ex2.approx in float32

The forward's variant (``ops.cross_entropy(..., gradient_in_forward=True)`` under ``tt.vjp``)
runs the forward's row statistics (:func:`.cross_entropy.row_statistics`), writes the row's
loss and count, then the same gradient pass with ``lse = m + log(s)`` and one scale for every
row (``"mean"``: one over the rows counted, from a reduction of the targets before it): the
warp reads its row twice, back to back, and the backward has nothing left to read.

NaN and infinities: a row whose loss is NaN (a NaN logit, a +inf logit, a row of only -inf, a
target outside the row) gets NaN everywhere (PyTorch's +inf row has NaN at the +inf and 0
elsewhere: its log-softmax keeps the other elements finite); an ignored row is 0 whatever its
logits. Computation in float32 (float16 and bfloat16 logits widened exactly), float64 for
float64 logits.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64

from .._device.numerics import exp_approx
from ..bfloat16 import bf16_to_f32, f32_to_bf16
from ..memory import aligned16, load16, store16
from ._named import NamedKernels
from .cross_entropy import (
    FULL_MASK,
    THREADS,
    WARP_SIZE,
    WARPS_PER_BLOCK,
    row_loss,
    row_statistics,
)
from .tc_tiles import INLINE

__all__ = ["THREADS", "kernel"]


def _row_writer(ct, vector: int, bf16: bool):
    """``write(logits, grad, row, t, lse, g, ignored, lane)``: the warp's row of the gradient,
    ``(exp(x - lse) - [j == t]) * g`` (zeros where ``ignored``), computed in ``ct`` for
    logits of ``16 // vector`` bytes (``bf16``: bfloat16 bits in and out)."""
    zero, one = ct(0.0), ct(1.0)
    widen = bf16_to_f32 if bf16 else ct
    exp = math.exp if ct is float64 else exp_approx  # ex2.approx in float32, as the forward
    narrow = cuda.jit(device=True)((lambda v: f32_to_bf16(v)) if bf16 else (lambda v: v))

    @cuda.jit(device=True)
    def gradient(x, j, t, lse, g):
        hot = one if j == t else zero
        return narrow((exp(widen(x) - lse) - hot) * g)

    chunk_of = _chunk(vector, gradient)

    @cuda.jit(device=True, **INLINE)
    def write(logits, grad, row, t, lse, g, ignored, lane):
        n_cols = logits.shape[1]
        nil = narrow(zero)
        j = lane
        if (
            logits.strides[1] == logits.itemsize
            and grad.strides[1] == grad.itemsize
            and aligned16(logits, (row, 0))
            and aligned16(grad, (row, 0))
        ):
            chunk = lane
            while chunk < n_cols // vector:
                base = chunk * vector
                vals = load16(logits, (row, base))
                store16(grad, (row, base), chunk_of(vals, base, t, lse, g, ignored, nil))
                chunk += WARP_SIZE
            j = (n_cols // vector) * vector + lane
        while j < n_cols:
            if ignored:
                grad[row, j] = nil
            else:
                grad[row, j] = gradient(logits[row, j], j, t, lse, g)
            j += WARP_SIZE

    return write


def _make(ct, vector: int, bf16: bool = False):
    """The kernel computing in ``ct`` for logits of ``16 // vector`` bytes (``bf16``: bfloat16
    bits in and out)."""
    nan, zero = ct(math.nan), ct(0.0)
    widen = bf16_to_f32 if bf16 else ct
    write = _row_writer(ct, vector, bf16)

    def cross_entropy_backward_rows(logits, targets, loss, scale, grad, ignore_index):
        n_rows, n_cols = logits.shape
        lane = cuda.threadIdx.x % WARP_SIZE
        row = cuda.blockIdx.x * WARPS_PER_BLOCK + cuda.threadIdx.x // WARP_SIZE
        row_step = cuda.gridDim.x * WARPS_PER_BLOCK
        while row < n_rows:  # the whole warp has one row
            t = -1
            lse, g = nan, zero
            if lane == 0:
                t = targets[row]
                g = ct(scale[row])
                if t >= 0 and t < n_cols:  # else NaN, as the forward's loss
                    lse = ct(loss[row]) + widen(logits[row, t])
            t = cuda.shfl_sync(FULL_MASK, t, 0)
            lse = cuda.shfl_sync(FULL_MASK, lse, 0)
            g = cuda.shfl_sync(FULL_MASK, g, 0)
            # an ignored row is zeros, whatever its logits (an inf among them too)
            write(logits, grad, row, t, lse, g, t == ignore_index, lane)
            row += row_step

    return cuda.jit(cross_entropy_backward_rows)


def _make_forward(ct, vector: int, bf16: bool = False):
    """The forward row kernel that writes the gradient too (``gradient_in_forward``): each
    row's loss (and count) as the forward's ``"mean"`` kernel writes them, then the row's
    gradient scaled by ``scale[0]`` (``unit``: by 1), the row read a second time by the warp
    that just read it."""
    stats, loss_of = row_statistics(ct, vector, bf16), row_loss(ct)
    write = _row_writer(ct, vector, bf16)
    one, nan = ct(1.0), ct(math.nan)

    def cross_entropy_rows_with_gradient(
        logits, targets, loss, valid, grad, scale, ignore_index, unit
    ):
        n_rows, n_cols = logits.shape
        lane = cuda.threadIdx.x % WARP_SIZE
        row = cuda.blockIdx.x * WARPS_PER_BLOCK + cuda.threadIdx.x // WARP_SIZE
        row_step = cuda.gridDim.x * WARPS_PER_BLOCK
        g = one if unit else ct(scale[0])
        while row < n_rows:  # the whole warp has one row
            t = -1
            if lane == 0:
                t = targets[row]
            t = cuda.shfl_sync(FULL_MASK, t, 0)
            m, s, picked = stats(logits, row, t, lane)
            value, counted = loss_of(m, s, picked, t, n_cols, ignore_index)
            if lane == 0:
                loss[row] = value
                valid[row] = counted
            # every lane holds m and s: the log-sum-exp without the loss's rounding
            lse = m + math.log(s) if t >= 0 and t < n_cols else nan
            write(logits, grad, row, t, lse, g, t == ignore_index, lane)
            row += row_step

    return cuda.jit(cross_entropy_rows_with_gradient)


def _chunk(vector: int, gradient):
    """``chunk_of(vals, base, t, lse, g, ignored, nil)``: one chunk's gradients as a tuple
    for ``store16`` (``nil``, a zero, for an ignored row), written out: a tuple cannot be
    built in a loop."""
    terms = ", ".join(f"gradient(vals[{k}], base + {k}, t, lse, g)" for k in range(vector))
    source = (
        "def chunk_of(vals, base, t, lse, g, ignored, nil):\n"
        f"    if ignored:\n        return ({', '.join(['nil'] * vector)},)\n"
        f"    return ({terms},)\n"
    )
    namespace = {"gradient": gradient}
    exec(source, namespace)
    return cuda.jit(device=True)(namespace["chunk_of"])


NAMED = NamedKernels(
    __name__,
    {
        "cross_entropy_backward_f16": lambda: _make(float32, 8),
        "cross_entropy_backward_f32": lambda: _make(float32, 4),
        "cross_entropy_backward_f64": lambda: _make(float64, 2),
        "cross_entropy_backward_bf16": lambda: _make(float32, 8, bf16=True),
        # the forward's kernel with the gradient (gradient_in_forward)
        "cross_entropy_forward_gradient_f16": lambda: _make_forward(float32, 8),
        "cross_entropy_forward_gradient_f32": lambda: _make_forward(float32, 4),
        "cross_entropy_forward_gradient_f64": lambda: _make_forward(float64, 2),
        "cross_entropy_forward_gradient_bf16": lambda: _make_forward(float32, 8, bf16=True),
    },
)
__getattr__ = NAMED.module_getattr


def kernel(dtype, forward: bool = False):
    """The backward row kernel for logits of ``dtype`` (None: bfloat16, as its bits);
    ``forward``: the forward's kernel that writes the gradient too."""
    name = "cross_entropy_forward_gradient" if forward else "cross_entropy_backward"
    if dtype is None:
        return NAMED[f"{name}_bf16"]
    return NAMED[f"{name}_f{np.dtype(dtype).itemsize * 8}"]
