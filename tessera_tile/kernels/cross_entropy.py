"""Cross-entropy forward: hand-written, one warp per row, logits read once.

Why hand-written: the loss of a row is ``logsumexp(row) - row[target]``. The composer has no
gather, so a fused definition would need the target column as a one-hot (an extra array as
large as the logits) or a second kernel; this kernel picks ``row[target]`` up in the same pass
that computes the log-sum-exp, so each logit is read exactly once and no probability is
written.

::

    block = 4 warps; warp w of block b takes rows b*4 + w, + 4*gridDim.x, ...
    lane l reads 16-byte chunks l, l+32, ... of the row when it is contiguous and aligned
      (LDG.E.128: 4 floats, 8 halves, 2 doubles), else columns l, l+32, ...
      per chunk: its maximum, the running sum s rescaled once to it, then exp(x - m) of each
      logit added (ex2.approx in float32), without a branch per logit
      the lane holding column target keeps x[target] (a select per logit)
      (strided or unaligned rows: columns l, l+32, ... one at a time, the same online rule)
    xor-shuffle butterfly combines (m, s) and x[target]; lane 0 writes
      loss = (m - x[target]) + log(s)   (0 and valid = 0 where target == ignore_index)

A target outside ``[0, C)`` that is not ``ignore_index`` gives NaN here (a kernel cannot raise);
``tessera_tile.ops.cross_entropy`` refuses such targets before launch when they are on the host.
Computation is in float32 for float16, bfloat16 (read as its bits, widened exactly) and float32
logits, float64 for float64 logits. NaN and
infinities as PyTorch's ``log_softmax`` gives them: a NaN that a lane meets first becomes its
maximum, and the butterfly combines maxima with ``max_nan``, so a NaN logit makes the loss NaN
from any lane; a +inf makes it NaN through ``exp(inf - inf)``; a row of only -inf gives
``(-inf - -inf) + log(0)``, NaN.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64

from .._device.numerics import exp_approx, max_nan
from ..bfloat16 import bf16_to_f32, f32_to_bf16
from ..memory import aligned16, load16
from ._named import NamedKernels
from .tc_tiles import INLINE

WARP_SIZE = 32
WARPS_PER_BLOCK = 4
THREADS = WARP_SIZE * WARPS_PER_BLOCK
FULL_MASK = 0xFFFFFFFF


def row_statistics(ct, vector: int, bf16: bool = False):
    """``stats(logits, row, t, lane)``: the row's maximum ``m``, sum ``s`` of ``exp(x - m)``
    and ``x[t]``, in ``ct`` (float32 or float64) for logits of ``16 // vector`` bytes
    (``bf16``: bfloat16 bits, widened exactly), in every lane of the warp that reads it."""
    zero, one = ct(0.0), ct(1.0)
    widen = bf16_to_f32 if bf16 else ct
    neg_inf = ct(-math.inf)
    # exp(x - m) of a chunk's elements: ex2.approx (an FMUL and a MUFU.EX2, no libdevice
    # range reduction) in float32, as the composer's softmax; libdevice's exp in float64
    exp_shifted = math.exp if ct is float64 else exp_approx

    @cuda.jit(device=True, **INLINE)
    def rescaled(m, s, top):
        """The running sum ``s`` of ``exp(x - m)`` for the new maximum ``top`` (once per
        chunk): 0 stays 0 when both are -inf, where ``m - top`` is NaN."""
        return s if m == top else s * math.exp(m - top)

    @cuda.jit(device=True)
    def online(m, s, x):
        """One element into the running maximum ``m`` and sum ``s`` of ``exp(x - m)``."""
        if x > m:
            return x, s * math.exp(m - x) + one  # exp(-inf) = 0 on the first element
        if m != neg_inf:
            return m, s + math.exp(x - m)  # a NaN x makes s NaN; inf - inf too, as PyTorch
        return x, s  # m is -inf, x is -inf or NaN: a NaN becomes the maximum and stays

    @cuda.jit(device=True, **INLINE)
    def stats(logits, row, t, lane):
        n_cols = logits.shape[1]
        m, s, picked = neg_inf, zero, zero
        j = lane
        if logits.strides[1] == logits.itemsize and aligned16(logits, (row, 0)):
            # 16-byte loads: lane takes chunks lane, lane + 32, ... of the row
            # per chunk: its maximum, one rescale of the sum, then each element's exp
            # added without a branch (a chunk of -inf adds nothing: its exps are skipped)
            chunk = lane
            while chunk < n_cols // vector:
                vals = load16(logits, (row, chunk * vector))
                base = chunk * vector
                top = m
                for k in range(vector):
                    x = widen(vals[k])
                    top = max_nan(top, x)
                    picked = x if base + k == t else picked
                s = rescaled(m, s, top)
                m = top
                if m != neg_inf:
                    for k in range(vector):
                        s += exp_shifted(widen(vals[k]) - m)
                chunk += WARP_SIZE
            j = (n_cols // vector) * vector + lane  # the tail: fewer than one chunk
        while j < n_cols:
            x = widen(logits[row, j])
            m, s = online(m, s, x)
            if j == t:
                picked = x
            j += WARP_SIZE
        offset = WARP_SIZE // 2
        while offset > 0:
            m2 = cuda.shfl_xor_sync(FULL_MASK, m, offset)
            s2 = cuda.shfl_xor_sync(FULL_MASK, s, offset)
            picked += cuda.shfl_xor_sync(FULL_MASK, picked, offset)
            top = max_nan(m, m2)
            if top != neg_inf:  # +inf or NaN: exp(NaN) makes s NaN
                s = s * math.exp(m - top) + s2 * math.exp(m2 - top)
            m = top
            offset //= 2
        return m, s, picked

    return stats


def row_loss(ct):
    """``loss(m, s, picked, t, n_cols, ignore_index)``: (the row's loss, 1 if counted else 0)."""
    zero, one, nan = ct(0.0), ct(1.0), ct(math.nan)

    @cuda.jit(device=True, **INLINE)
    def loss(m, s, picked, t, n_cols, ignore_index):
        if t == ignore_index:
            return zero, zero
        if t < 0 or t >= n_cols:
            return nan, one
        return (m - picked) + math.log(s), one  # m - picked is exact near m

    return loss


def _make(ct, vector: int, bf16: bool = False, bf16_losses: bool = False):
    """The kernel computing in ``ct`` (float32 or float64) for logits of ``16 // vector``
    bytes; closes over its constants (a constant ``vector`` keeps divisions by it shifts).
    ``bf16``: the logits are bfloat16 bits, widened exactly; ``bf16_losses``: the losses too
    (reduction "none"), each rounded once."""
    stats, row_loss_of = row_statistics(ct, vector, bf16), row_loss(ct)

    def cross_entropy_rows(logits, targets, loss, valid, ignore_index, write_valid):
        n_rows, n_cols = logits.shape
        lane = cuda.threadIdx.x % WARP_SIZE
        row = cuda.blockIdx.x * WARPS_PER_BLOCK + cuda.threadIdx.x // WARP_SIZE
        row_step = cuda.gridDim.x * WARPS_PER_BLOCK
        while row < n_rows:  # the whole warp has one row: shuffles below see all 32 lanes
            t = -1
            if lane == 0:
                t = targets[row]
            t = cuda.shfl_sync(FULL_MASK, t, 0)  # one read of the target per row
            m, s, picked = stats(logits, row, t, lane)
            if lane == 0:
                value, counted = row_loss_of(m, s, picked, t, n_cols, ignore_index)
                if bf16_losses:
                    loss[row] = f32_to_bf16(value)
                else:
                    loss[row] = value
                if write_valid:  # only the mean needs the count of rows not ignored
                    valid[row] = counted
            row += row_step

    return cuda.jit(cross_entropy_rows)


NAMED = NamedKernels(
    __name__,
    {
        "cross_entropy_rows_f16": lambda: _make(float32, 8),  # float16 logits, in float32
        "cross_entropy_rows_f32": lambda: _make(float32, 4),
        "cross_entropy_rows_f64": lambda: _make(float64, 2),
        # bfloat16 logits: bfloat16 losses (reduction "none") or float32 ones to reduce
        "cross_entropy_rows_bf16": lambda: _make(float32, 8, bf16=True, bf16_losses=True),
        "cross_entropy_rows_bf16_f32": lambda: _make(float32, 8, bf16=True),
    },
)
__getattr__ = NAMED.module_getattr


def rows_kernel(dtype, bf16_none: bool = False):
    """The row kernel for logits of ``dtype``; bfloat16 logits (``dtype`` None) write
    bfloat16 losses when ``bf16_none`` (reduction "none"), else float32 ones."""
    if dtype is None:
        return NAMED["cross_entropy_rows_bf16" if bf16_none else "cross_entropy_rows_bf16_f32"]
    return NAMED[f"cross_entropy_rows_f{np.dtype(dtype).itemsize * 8}"]
