"""Layer norm over rows too long to keep on chip: hand-written, x read twice.

Why hand-written: up to 16,384 float32 or float16 per row (8,192 float64) the composer keeps
the row in registers, and its three passes (mean, variance of ``x - mean``, output) read x once.
Past that, each pass would read x again: three reads. This kernel computes the mean and the
variance in one pass with Welford's algorithm in Chan's parallel form, which is as stable as the
two-pass formula, then writes the output in a second pass: two reads of x, one write of y, and
each weight read once (a block per row).

::

    block = 256 threads per row, grid = one block per row
    pass 1: thread t folds 16-byte chunks t, t + 256, ... of the row (4 floats, 8 halves or
      2 doubles) when rows are contiguous and aligned, else columns t, t + 256, ...
      its first element is its shift; a chunk's own mean and sum of squared deviations of
      x - shift merge into the thread's running (count, mean, m2) by Chan's rule: one
      reciprocal per chunk, no division in the loop
    merge: xor-shuffle butterfly over the warp, then over the 8 warps' partials in shared
      memory, each set moved to the shift of the set it joins; lane 0's result is every
      thread's (one set of statistics per row)
    pass 2: y = (x - shift) * scale - mean * scale, scale = rsqrt(m2 / n + eps),
      [* weight] [+ bias], 16-byte accesses

Why the shift: the row's mean is ``shift + mean``, a sum never rounded. Rounding the mean
itself costs up to half an ulp of it, which ``rsqrt(eps)`` multiplies: rows of 1 + 1e-4 noise
were off by 2e-5, and are off by 2e-8 now; a constant row gives exactly 0.

Computation is in float32 for float16 and float32 rows, float64 for float64 rows.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, float64, int32

from .._device.numerics import rcp_approx, rsqrt_approx
from .._runtime import config as _config
from ..memory import aligned16, load16, store16
from ._named import NamedKernels

THREADS = 256
WARPS = THREADS // 32
FULL_MASK = 0xFFFFFFFF


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
        """Chan's rule: the (count, mean, sum of squared deviations) of two sets combined,
        both taken at one shift."""
        total = n + nb
        if nb == 0:
            return n, mean, m2
        share = ct(nb) * reciprocal(ct(total))
        delta = mean_b - mean
        return total, mean + delta * share, m2 + m2_b + delta * delta * ct(n) * share

    @cuda.jit(device=True)
    def merge_shifted(n, shift, mean, m2, nb, shift_b, mean_b, m2_b):
        """Two sets' statistics at their own shifts combined, at the first set's shift (the
        second's when the first is empty)."""
        if n == 0:
            return nb, shift_b, mean_b, m2_b
        n, mean, m2 = merge(n, mean, m2, nb, (shift_b - shift) + mean_b, m2_b)
        return n, shift, mean, m2

    @cuda.jit(device=True)
    def chunk_stats(vals, shift):
        """The mean of a chunk's ``x - shift`` and its sum of squared deviations."""
        s = zero
        for k in range(vector):
            s += ct(vals[k]) - shift
        mean = s * ct(1.0 / vector)
        m2 = zero
        for k in range(vector):
            d = (ct(vals[k]) - shift) - mean
            m2 += d * d
        return mean, m2

    @cuda.jit(device=True)
    def allmerge(n, shift, mean, m2):
        """The warp's merged statistics, lane 0's in every lane (the butterfly leaves each
        lane at its own shift)."""
        offset = 16
        while offset > 0:
            nb = cuda.shfl_xor_sync(FULL_MASK, n, offset)
            shift_b = cuda.shfl_xor_sync(FULL_MASK, shift, offset)
            mean_b = cuda.shfl_xor_sync(FULL_MASK, mean, offset)
            m2_b = cuda.shfl_xor_sync(FULL_MASK, m2, offset)
            n, shift, mean, m2 = merge_shifted(n, shift, mean, m2, nb, shift_b, mean_b, m2_b)
            offset //= 2
        shift = cuda.shfl_sync(FULL_MASK, shift, 0)
        mean = cuda.shfl_sync(FULL_MASK, mean, 0)
        return n, shift, mean, cuda.shfl_sync(FULL_MASK, m2, 0)

    def layer_norm_long_rows(x, weight, bias, out, eps):
        row = cuda.blockIdx.x
        t = cuda.threadIdx.x
        n_cols = x.shape[1]
        counts = cuda.shared.array(WARPS, int32)
        shifts = cuda.shared.array(WARPS, ct)
        means = cuda.shared.array(WARPS, ct)
        m2s = cuda.shared.array(WARPS, ct)
        vectors = x.strides[1] == x.itemsize and aligned16(x, (row, 0))
        n, shift, mean, m2 = int32(0), zero, zero, zero
        tail = 0
        if vectors:  # 16-byte chunks t, t + 256, ...
            chunk = t
            if chunk < n_cols // vector:  # the thread's first chunk sets its shift
                vals = load16(x, (row, chunk * vector))
                shift = ct(vals[0])
                mean, m2 = chunk_stats(vals, shift)
                n = int32(vector)
                chunk += THREADS
            while chunk < n_cols // vector:
                mean_c, m2_c = chunk_stats(load16(x, (row, chunk * vector)), shift)
                n, mean, m2 = merge(n, mean, m2, int32(vector), mean_c, m2_c)
                chunk += THREADS
            tail = (n_cols // vector) * vector
        j = tail + t
        if n == 0 and j < n_cols:  # no chunk: the thread's first column sets its shift
            shift = ct(x[row, j])
            n = int32(1)
            j += THREADS
        while j < n_cols:  # the columns left: all of a strided row, or the tail of a chunked one
            n, mean, m2 = merge(n, mean, m2, int32(1), ct(x[row, j]) - shift, zero)
            j += THREADS
        n, shift, mean, m2 = allmerge(n, shift, mean, m2)
        if t % 32 == 0:
            counts[t // 32] = n
            shifts[t // 32] = shift
            means[t // 32] = mean
            m2s[t // 32] = m2
        cuda.syncthreads()
        n, shift, mean, m2 = int32(0), zero, zero, zero
        if t % 32 < WARPS:
            n, shift, mean, m2 = counts[t % 32], shifts[t % 32], means[t % 32], m2s[t % 32]
        n, shift, mean, m2 = allmerge(n, shift, mean, m2)  # the same in every warp
        scale = inverse_sqrt(m2 * reciprocal(ct(n_cols)) + ct(eps))
        offset = mean * scale  # y = (x - shift) * scale - offset: one FFMA
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
                store16(out, (row, j), affine(vals, ws, bs, shift, scale, offset))
                chunk += THREADS
            tail = (n_cols // vector) * vector
        j = tail + t
        while j < n_cols:
            y = (ct(x[row, j]) - shift) * scale - offset
            if has_weight:
                y *= ct(weight[j])
            if has_bias:
                y += ct(bias[j])
            out[row, j] = y
            j += THREADS

    layer_norm_long_rows.__name__ = layer_norm_long_rows.__qualname__ = (
        f"layer_norm_long_rows_{dtype.name}"
    )
    # The block size as a launch bound (.maxntid): ptxas allocates registers for 256 threads
    # (without it, pass 2's shift took sm_80 from 48 to 55 registers; the simulator refuses it).
    bounds = {} if _config.SIMULATED else {"launch_bounds": (THREADS,)}
    return cuda.jit(layer_norm_long_rows, **bounds)


def _affine(vector: int, ct, has_weight: bool, has_bias: bool):
    """``affine(vals, ws, bs, shift, scale, offset)``: the chunk's outputs as one tuple for
    ``store16`` (written out element by element: a tuple cannot be built in a loop)."""
    terms = []
    for k in range(vector):
        term = f"((ct(vals[{k}]) - shift) * scale - offset)"
        term += f" * ct(ws[{k}])" if has_weight else ""
        term += f" + ct(bs[{k}])" if has_bias else ""
        terms.append(term)
    namespace = {"ct": ct}
    source = f"def affine(vals, ws, bs, shift, scale, offset):\n    return ({', '.join(terms)},)"
    exec(source, namespace)
    return cuda.jit(device=True)(namespace["affine"])


# The variants with a weight and a bias, by name, for the compile tier (tests/compile/cases.py).
NAMED = NamedKernels(
    __name__,
    {
        "layer_norm_long_f16": lambda: kernel(np.float16, True, True),
        "layer_norm_long_f32": lambda: kernel(np.float32, True, True),
        "layer_norm_long_f64": lambda: kernel(np.float64, True, True),
    },
)
__getattr__ = NAMED.module_getattr
