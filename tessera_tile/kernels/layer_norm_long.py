"""Layer norm over rows too long to keep on chip: hand-written, x read twice.

Why hand-written: up to 32 KiB per row (8,192 float32) the composer keeps the row in registers
or shared memory, and its three passes (mean, variance of ``x - mean``, output) read x once.
Past that, each pass would read x again: three reads. This kernel computes the mean and the
variance in one pass with Welford's algorithm in Chan's parallel form, which is as stable as the
two-pass formula, then writes the output in a second pass: two reads of x, one write of y, and
each weight read once (a block per row).

::

    block = 256 threads per row, grid = one block per row
    pass 1: thread t folds 16-byte chunks t, t + 256, ... of the row (4 floats, 8 halves or
      2 doubles) when rows are contiguous and aligned, else columns t, t + 256, ...
      a chunk's own mean and sum of squared deviations merge into the thread's running
      (count, mean, m2) by Chan's rule: one reciprocal per chunk, no division in the loop
    merge: xor-shuffle butterfly over the warp, then over the 8 warps' partials in shared memory
    pass 2: y = (x - mean) * rsqrt(m2 / n + eps) [* weight] [+ bias], 16-byte accesses

Computation is in float32 for float16 and float32 rows, float64 for float64 rows.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, float64, int32

from .._fusion.device import rcp_approx, rsqrt_approx
from .._fusion.schedule import CACHE_BYTES
from ..memory import aligned16, load16, store16

THREADS = 256
WARPS = THREADS // 32
FULL_MASK = 0xFFFFFFFF


def on_chip(n: int, dtype) -> bool:
    """Whether the composer keeps a row of ``n`` elements on chip (then its fused layer norm
    reads x once); past this the hand-written kernel reads x twice instead of three times."""
    return n * np.dtype(dtype).itemsize <= CACHE_BYTES


def rows_view(x) -> tuple | None:
    """x (an array record) as a 2-D ``((rows, n), byte strides)``: its leading axes merged,
    which needs them to step evenly; ``None`` when they do not (the composer's kernel, which
    takes any strides, runs such calls)."""
    shape, strides = x.shape, x.strides
    if not shape:
        return None
    lead = [(m, st) for m, st in zip(shape[:-1], strides[:-1], strict=True) if m != 1]
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    pairs = zip(lead[:-1], lead[1:], strict=True)
    if any(outer != size * inner for (_, outer), (size, inner) in pairs):
        return None
    row_stride = lead[-1][1] if lead else shape[-1] * strides[-1]
    return (rows, shape[-1]), (row_stride, strides[-1])


@functools.cache
def kernel(dtype, has_weight: bool, has_bias: bool):
    """The kernel for rows of ``dtype``: ``kernel(x, weight, bias, out, eps)`` with x and out
    of shape (rows, n), weight and bias of shape (n,) (1-element placeholders when absent)."""
    dtype = np.dtype(dtype)
    ct = float64 if dtype == np.float64 else float32
    vector = 16 // dtype.itemsize
    zero, one = ct(0.0), ct(1.0)
    if ct is float32:  # one MUFU per chunk or per row, no IEEE slow path (docs/fusion.md)
        reciprocal, inverse_sqrt = rcp_approx, rsqrt_approx
    else:

        @cuda.jit(device=True)
        def reciprocal(v):
            return one / v

        @cuda.jit(device=True)
        def inverse_sqrt(v):
            return one / v**0.5

    affine = _affine(vector, ct, has_weight, has_bias)

    @cuda.jit(device=True)
    def merge(n, mean, m2, nb, mean_b, m2_b):
        """Chan's rule: the (count, mean, sum of squared deviations) of two sets combined."""
        total = n + nb
        if nb == 0:
            return n, mean, m2
        share = ct(nb) * reciprocal(ct(total))
        delta = mean_b - mean
        return total, mean + delta * share, m2 + m2_b + delta * delta * ct(n) * share

    @cuda.jit(device=True)
    def allmerge(n, mean, m2):
        """Every lane of the warp gets the warp's merged statistics."""
        offset = 16
        while offset > 0:
            nb = cuda.shfl_xor_sync(FULL_MASK, n, offset)
            mean_b = cuda.shfl_xor_sync(FULL_MASK, mean, offset)
            m2_b = cuda.shfl_xor_sync(FULL_MASK, m2, offset)
            n, mean, m2 = merge(n, mean, m2, nb, mean_b, m2_b)
            offset //= 2
        return n, mean, m2

    def layer_norm_long_rows(x, weight, bias, out, eps):
        row = cuda.blockIdx.x
        t = cuda.threadIdx.x
        n_cols = x.shape[1]
        counts = cuda.shared.array(WARPS, int32)
        means = cuda.shared.array(WARPS, ct)
        m2s = cuda.shared.array(WARPS, ct)
        vectors = x.strides[1] == x.itemsize and aligned16(x, (row, 0))
        n, mean, m2 = int32(0), zero, zero
        tail = 0
        if vectors:  # 16-byte chunks t, t + 256, ...
            chunk = t
            while chunk < n_cols // vector:
                vals = load16(x, (row, chunk * vector))
                s = zero
                for k in range(vector):
                    s += ct(vals[k])
                mean_c = s * ct(1.0 / vector)
                m2_c = zero
                for k in range(vector):
                    d = ct(vals[k]) - mean_c
                    m2_c += d * d
                n, mean, m2 = merge(n, mean, m2, int32(vector), mean_c, m2_c)
                chunk += THREADS
            tail = (n_cols // vector) * vector
        j = tail + t
        while j < n_cols:  # the columns left: all of a strided row, or the tail of a chunked one
            n, mean, m2 = merge(n, mean, m2, int32(1), ct(x[row, j]), zero)
            j += THREADS
        n, mean, m2 = allmerge(n, mean, m2)
        if t % 32 == 0:
            counts[t // 32] = n
            means[t // 32] = mean
            m2s[t // 32] = m2
        cuda.syncthreads()
        n, mean, m2 = int32(0), zero, zero
        if t % 32 < WARPS:
            n, mean, m2 = counts[t % 32], means[t % 32], m2s[t % 32]
        n, mean, m2 = allmerge(n, mean, m2)  # every warp merges the 8 partials in one order
        scale = inverse_sqrt(m2 * reciprocal(ct(n_cols)) + ct(eps))
        wide = vectors and aligned16(out, (row, 0))
        if has_weight:
            wide = wide and aligned16(weight, (0,))
        if has_bias:
            wide = wide and aligned16(bias, (0,))
        tail = 0
        if wide:
            chunk = t
            while chunk < n_cols // vector:
                j = chunk * vector
                vals = load16(x, (row, j))
                ws = load16(weight, (j,)) if has_weight else vals
                bs = load16(bias, (j,)) if has_bias else vals
                store16(out, (row, j), affine(vals, ws, bs, mean, scale))
                chunk += THREADS
            tail = (n_cols // vector) * vector
        j = tail + t
        while j < n_cols:
            y = (ct(x[row, j]) - mean) * scale
            if has_weight:
                y *= ct(weight[j])
            if has_bias:
                y += ct(bias[j])
            out[row, j] = y
            j += THREADS

    layer_norm_long_rows.__name__ = layer_norm_long_rows.__qualname__ = (
        f"layer_norm_long_rows_{dtype.name}"
    )
    return cuda.jit(layer_norm_long_rows)


def _affine(vector: int, ct, has_weight: bool, has_bias: bool):
    """``affine(vals, ws, bs, mean, scale)``: the chunk's outputs as one tuple for ``store16``
    (written out element by element: a tuple cannot be built in a loop)."""
    terms = []
    for k in range(vector):
        term = f"(ct(vals[{k}]) - mean) * scale"
        term += f" * ct(ws[{k}])" if has_weight else ""
        term += f" + ct(bs[{k}])" if has_bias else ""
        terms.append(term)
    namespace = {"ct": ct}
    exec(f"def affine(vals, ws, bs, mean, scale):\n    return ({', '.join(terms)},)", namespace)
    return cuda.jit(device=True)(namespace["affine"])


# The variants with a weight and a bias, by name, for the compile tier (tests/compile/cases.py).
layer_norm_long_f16 = kernel(np.float16, True, True)
layer_norm_long_f32 = kernel(np.float32, True, True)
layer_norm_long_f64 = kernel(np.float64, True, True)
