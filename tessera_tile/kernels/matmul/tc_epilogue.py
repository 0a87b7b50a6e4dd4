"""The epilogue of the tensor-core GEMM kernels (:mod:`.matmul_tc`, :mod:`.matmul_wgmma`):
``act(acc + bias)`` for every accumulator of a warp's tile, stored two columns at a time,
written out statement by statement as a generated, inlined device function."""

from __future__ import annotations

from numba import cuda, float32

from ...bfloat16 import bf16_to_f32, f32_to_bf16
from ...mma import store_f16x2
from ..tc_tiles import INLINE

ZERO = float32(0.0)


def tensor_core_epilogue(
    mt: int, nt: int, has_bias: bool, async_copy: bool, act, store_pair=store_f16x2,
    bf16: bool = False, swapped: bool = False, extras: bool = False, stores: bool = True,
    dual: bool = False,
):  # fmt: skip
    """``epilogue(acc, acc2, c, bias, bz, row_base, col_base, m, n, extra_args)``:
    ``act(acc + bias)``
    (``extras``: ``act(acc + bias, bz, row, col, extra_args)``, an ElementEpilogue's) stored,
    masked, for every accumulator of the warp tile (``store_pair``: two columns in one store,
    ``store_f16x2`` / ``store_bf16x2`` rounding to the half type or ``store_f32x2``, where rows
    are aligned; else one element at a time, converted to C's dtype; ``bf16``: the bias and C
    are bfloat16 bits, widened and rounded with :mod:`tessera_tile.bfloat16`). Written out
    statement
    by statement (generated source, inlined): as loops, LLVM leaves the outer one rolled once
    the activation is large (gelu's erf), and the accumulators then go through local memory.

    ``swapped`` (the TF32 kernel's C^T tiles): ``acc[i, 2 I + jb, q]`` is row
    ``row_base + 16 i + 8 jb + q % 2``, column ``col_base + 16 I + q // 2`` (``row_base`` at
    ``2t``, ``col_base`` at ``2g``), so the pairs are ``q, q + 2`` and the lanes of a group
    share columns; else row ``row_base + 16 i + 8 (q // 2)``, column ``col_base + 8 j + q % 2``.
    ``stores=False``: ``act`` writes the results itself; nothing is stored to ``c``. ``dual``:
    ``act(acc + bias, acc2, bz, row, col, extra_args)``, the second product's accumulator too.
    """
    widen, narrow = ("bf16_to_f32", "f32_to_bf16") if bf16 else ("float32", "")
    lines = [
        "def epilogue(acc, acc2, c, bias, bz, row_base, col_base, m, n, extra_args):",
        "    lane = cuda.laneid",
    ]
    # per column offset: its (row offset, (i, j, q) of each of the pair's two values)
    if swapped:
        # lanes 4g read the bias pair of group g, the others take it from them
        reader, source = "(lane & 3) == 0", "lane & 28"
        columns = [
            (16 * blk, [
                (16 * i + 8 * jb + h, (i, 2 * blk + jb, h), (i, 2 * blk + jb, h + 2))
                for i in range(mt) for jb in range(2) for h in range(2)
            ])
            for blk in range(nt // 2)
        ]  # fmt: skip
    else:
        reader, source = "lane < 4", "lane & 3"
        columns = [
            (8 * j, [
                (16 * i + 8 * h, (i, j, 2 * h), (i, j, 2 * h + 1))
                for i in range(mt) for h in range(2)
            ])
            for j in range(nt)
        ]  # fmt: skip
    for offset, pairs_here in columns:
        lines.append(f"    col = col_base + {offset}")
        if has_bias:  # 4 lanes read the pair; shuffles give it to the others
            lines += [
                "    b0 = ZERO",
                "    b1 = ZERO",
                f"    if {reader} and col < n:",
                f"        b0 = {widen}(bias[col])",
                f"    if {reader} and col + 1 < n:",
                f"        b1 = {widen}(bias[col + 1])",
                f"    b0 = cuda.shfl_sync(FULL_MASK, b0, {source})",
                f"    b1 = cuda.shfl_sync(FULL_MASK, b1, {source})",
            ]
        for row_offset, *values in pairs_here:
            lines.append(f"    row = row_base + {row_offset}")
            pairs = zip(("v0", "v1"), ("b0", "b1"), values, strict=True)
            for h, (v, b, (i, j, q)) in enumerate(pairs):
                bias_term = f" + {b}" if has_bias else ""
                where = f", bz, row, col + {h}, extra_args" if extras else ""
                if dual:
                    where = f", acc2[{i}, {j}, {q}]{where}"
                lines.append(f"    {v} = act(acc[{i}, {j}, {q}]{bias_term}{where})")
            if not stores:
                continue
            lines.append("    if row < m and col < n:")
            if async_copy:  # N a multiple of the chunk: the pair is inside and aligned
                lines.append("        store_pair(c, (bz, row, col), v0, v1)")
            else:
                lines += [
                    f"        c[bz, row, col] = {narrow}(v0)",
                    "        if col + 1 < n:",
                    f"            c[bz, row, col + 1] = {narrow}(v1)",
                ]
    namespace = {
        "ZERO": ZERO, "act": act, "store_pair": store_pair, "cuda": cuda, "float32": float32,
        "FULL_MASK": 0xFFFFFFFF, "bf16_to_f32": bf16_to_f32, "f32_to_bf16": f32_to_bf16,
    }  # fmt: skip
    exec("\n".join(lines), namespace)  # noqa: S102 - our own generated code
    return cuda.jit(device=True, **INLINE)(namespace["epilogue"])
