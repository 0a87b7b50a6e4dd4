"""float32 matmul on TF32 tensor cores ``C = act(A @ B + bias)``: ``mma.sync.m16n8k8`` (TF32
inputs, float32 accumulation), ``ldmatrix`` on swizzled float32 tiles, a multi-stage
``cp.async`` pipeline.

:func:`tf32_matmul` makes the kernel ``kernel(a, b, bias, c)`` of one configuration, with the
contract of the float16 kernel (:mod:`tessera_tile.kernels.matmul.tc`, whose pipeline, swizzle,
copies and generated epilogue it shares) in float32:

* ``a``: float32 ``(batch, M, K)``, ``b``: float32 ``(batch, K, N)``, ``c``: float32
  ``(batch, M, N)``, the inner dimension contiguous, any batch strides (0 broadcasts);
  every row 16-byte aligned (:func:`aligned_rows`: K and N multiples of 4, aligned bases and
  strides); other layouts go to the exact float32 SIMT kernel (the ops say so);
* ``bias``: float32 ``(N,)`` (ignored unless ``has_bias``: pass any 1-element float32 array);
* launch ``grid = (ceil(N / tile_n), ceil(M / tile_m), batch)`` blocks of ``32 * num_warps``
  threads (:func:`plan` gives both and the global bytes the launch moves).

Precision: the tensor core reads the upper 19 bits of each float32 input (TF32: 8 exponent
bits, 10 mantissa bits) and ignores the low 13, which truncates toward zero (relative error
below ``2**-10`` per input; rounding to nearest first would halve it, but ``cvt.rna`` is
emulated, 3-4 instructions per fragment register, 24 registers per 16 HMMA in the main loop).
Products are exact and sums float32, so elementwise
``|C - A @ B| <= (2**-9 + 2**-20 + 2 (K + 2) 2**-24) |A| @ |B|`` (the factor 2 on the float32
term because the tensor core's internal sums are not specified to round to nearest).
``docs/matmul.md`` compares it with the exact float32 path.

The main loop, per k-tile (``tile_k = 16``: two k8 steps; 8 warps of 64 x 32)::

    cp.async.wait_group(stages - 2); __syncthreads()     1 barrier per k-tile
    cp.async tile k + stages - 1 into the freed stage
    for each k8 step (2), the mma with its operands swapped (C^T = B^T A^T):
      A: 4 ldmatrix.x4 on the float32 tile   (matrices: k 0-3 and 4-7 of rows 0-7, then of rows
                                              8-15: the mma's B fragments of 2 x 8 rows)
      B: 4 LDS.64                            (per 16 columns, k-rows t and t + 4, columns 2g and
                                              2g + 1: the mma's A fragment, 4 registers in order)
      16 mma.sync.m16n8k8 TF32

Why swapped: both TF32 fragments give lane ``(g, t)`` k index ``t`` (and ``t + 4``), and
``ldmatrix`` (non-trans) gives lane ``(g, t)`` the float32 ``t`` of a 16-byte row, so it reads
operands stored k-contiguous: A, not the row-major ``[k, n]`` B tile, which ``ldmatrix.trans``
(16-bit halves) cannot transpose on 32-bit elements and ``cp.async`` cannot stage transposed.
B's fragment wants ``B[t, n]`` and ``B[t + 4, n]`` for one column ``n``, two scalar loads; as the
mma's A operand (16 "rows" of B^T) a lane holds two columns of each k-row instead, so with row
``g`` mapped to column ``2g`` and row ``g + 8`` to ``2g + 1`` one ``LDS.64`` per k-row fills
``(a0, a1)`` and another ``(a2, a3)``, 4 consecutive registers as the HMMA reads them (an
``LDS.128`` of 4 columns would need register moves before every HMMA). The accumulators are C^T
tiles: lane ``(g, t)`` holds rows ``2t, 2t + 1`` and columns ``2g, 2g + 1`` of each 8 x 16 block
of C, stored as float32 pairs.

The A tile uses the float16 kernel's swizzle (16-byte chunks XOR-ed within each 128-byte line; an
ldmatrix reads 16-byte rows, whatever their elements). The B tile (at least 8 chunks per row,
``tile_n >= 32``) puts chunk ``c`` of row ``r`` at ``c ^ 2 (r % 4)``: a half-warp's ``LDS.64``
reads rows ``t = 0..3`` (or ``t + 4``), chunks ``2j`` and ``2j + 1`` of each, all 32 banks once;
rows ``t`` and ``t + 4`` share the pattern, so a lane needs one offset per 16 columns (mod 2) for
both. Both reads are conflict free (the simulator's profiler counts 0), and so are the cp.async
writes (each quarter-warp writes 8 chunks of one row, a permutation of a line).

Shared memory is dynamic, as the float16 kernel's (``plan(...).shared`` bytes, opted in past 48
KiB): three stages of 128 x 16 + 16 x 128 float32 tiles are 48 KiB, of 128 x 32 + 32 x 128 96 KiB.
"""

from __future__ import annotations

import numpy as np

from .._named import NamedKernels
from ..epilogue import ACTIVATIONS
from ..tc_tiles import TensorCoreConfig
from . import tc_plan as matmul_tc_plan
from .tc import build_kernel
from .tc_plan import Plan, aligned_rows

__all__ = ["ANCHOR", "Plan", "aligned_rows", "check_operands", "plan", "tf32_matmul"]

# 128 x 128 x 16, 8 warps of 64 x 32, 3 stages: 48 KiB of shared memory. (4 warps of 64 x 64,
# the float16 kernel's arrangement, fit in 221 registers, no spills, at 2.39 instructions per
# HMMA against 3.49; the ops' first choice is that arrangement with k-tiles of 32, 2.11:
# docs/matmul.md.)
ANCHOR = TensorCoreConfig(128, 128, 16, 8, 3, tf32=True)


def tf32_matmul(
    tile_m: int = 128,
    tile_n: int = 128,
    tile_k: int = 16,
    num_warps: int = 8,
    num_stages: int = 3,
    activation=None,
    has_bias: bool = False,
    dual: bool = False,
    prologue: tuple = (None, None),
    *,
    trans_a: bool = False,
    trans_b: bool = False,
):
    """The ``cuda.jit`` kernel ``kernel(a, b, bias, c)``: ``c = activation(a @ b + bias)`` for
    float32 operands on TF32 tensor cores, float32 accumulation (memoised per configuration);
    ``dual``, ``prologue``, ``trans_a`` and ``trans_b``: as
    :func:`~.tc.tensor_core_matmul`'s (the transposed operands' fragments:
    :mod:`.tc_tf32`).

    ``tile_k`` 8, 16 or 32; ``tile_n`` at least 32; warp tiles multiples of 16 x 16. Needs
    :func:`aligned_rows`. See the module doc for the launch, the layouts and the precision.
    """
    cfg = TensorCoreConfig(
        tile_m, tile_n, tile_k, num_warps, num_stages, bool(has_bias), True, True,
        dual=bool(dual), trans_a=bool(trans_a), trans_b=bool(trans_b),
    )  # fmt: skip
    cfg.validate(activation)
    return build_kernel(cfg, activation, __name__, tuple(prologue))


def plan(batch: int, m: int, n: int, k: int, config: TensorCoreConfig = ANCHOR) -> Plan:
    """Grid, block and the global bytes a launch reads and writes (float32 elements)."""
    return matmul_tc_plan.plan(batch, m, n, k, config._replace(tf32=True))


def check_operands(a, b, bias, c) -> bool:
    """Validate the kernel's arguments before a launch (as
    :func:`tessera_tile.kernels.matmul.tc_plan.check_operands`, in float32); returns
    :func:`aligned_rows`, which the kernel needs."""
    return matmul_tc_plan.check_operands(a, b, bias, c, np.float32)


# The configurations the compile tier builds (one compile case each), built on first use.
NAMED = NamedKernels(
    __name__,
    {
        "matmul_tf32_anchor": lambda: tf32_matmul(),  # 128 x 128 x 16, 8 warps, 3 stages
        "matmul_tf32_4warps": lambda: tf32_matmul(128, 64, 16, 4, 3),
        "matmul_tf32_small_bias": lambda: tf32_matmul(32, 32, 16, 1, 2, has_bias=True),
        "linear_tf32_gelu_bias": (  # exact erf
            lambda: tf32_matmul(activation=ACTIVATIONS["gelu"], has_bias=True)
        ),
        # 4 warps of 64 x 64 and k-tiles of 32 (96 KiB, dynamic shared memory): the first of
        # tile_config.TF32_CANDIDATES, 2.11 / 2.15 instructions per HMMA on sm_80 / sm_90
        "matmul_tf32_wide": lambda: tf32_matmul(128, 128, 32, 4, 3),
        # the backward GEMMs' operands read transposed (x.T of x.T @ dy, w.T of dy @ w.T) on
        # that tile: 2.83 / 2.88 and 1.90 / 1.93 instructions per HMMA (sm_80 / sm_90)
        "matmul_tf32_at": lambda: tf32_matmul(128, 128, 32, 4, 3, trans_a=True),
        "matmul_tf32_bt": lambda: tf32_matmul(128, 128, 32, 4, 3, trans_b=True),
    },
)
__getattr__ = NAMED.module_getattr
