"""Matmul prologues: an elementwise function applied to an operand's tile in shared memory, once
per element per block, after the tile lands and before any warp reads it.

An :class:`ElementPrologue` wraps a device function ``fn(x: float32)`` of one element of A or B
(its value, as float32) that returns the new element in the operand's dtype (float16, the
``uint16`` bits of a bfloat16, or float32), written back into the tile as it is. The composer
generates one for a matmul operand that is an elementwise chain over one array
(``tt.relu(x) @ w``): the GEMM kernel reads that array with its usual copies (``cp.async``, or
the synchronous fallback) and transforms each tile in place::

    wait for tile k; __syncthreads       (the kernel's own)
    issue the copies of tile k + stages - 1
    prologue: each thread rewrites its share of tile k's A (and/or B) elements
    __syncthreads                        (one more per k-tile)
    multiply tile k

Elements past K (the zero fill of a partial k-tile) stay 0, whatever ``fn(0)`` is: the other
operand's fill is 0 too, but ``fn(0)`` may be inf (``1 / x``), and inf * 0 is NaN. Rows of A past
M and columns of B past N are transformed: they reach only the C elements no kernel stores.

The builders here make the per-thread passes of the two tile layouts: :func:`chunk_passes` for
the tensor-core kernels' 16-byte chunks (float16, bfloat16 bits, or float32) and
:func:`element_pass` for the SIMT kernel's float32 rings.
"""

from __future__ import annotations

from typing import NamedTuple

from numba import cuda, float32, int32

from ..bfloat16 import bf16_to_f32
from ..memory import load16_shared, store16_shared

__all__ = ["ElementPrologue", "chunk_passes", "element_pass", "name_of"]


class ElementPrologue(NamedTuple):
    """A device function ``fn(x: float32)`` of one operand element, returning it in the
    operand's dtype (the module doc); ``name`` tags the kernels built with it."""

    fn: object
    name: str


def name_of(prologue: tuple) -> str:
    """The kernel-name suffix of an ``(a, b)`` pair of prologues (each one or None)."""
    return "".join(f"_pro{side}_{p.name}" for side, p in zip("ab", prologue, strict=True) if p)


def _to_float32(kind: str):
    """A shared tile element as float32: ``"f16"``, ``"bf16"`` (its ``uint16`` bits) or
    ``"f32"``."""
    if kind == "bf16":
        return bf16_to_f32

    @cuda.jit(device=True)
    def to_f32(v):
        return float32(v)

    return to_f32


def chunk_passes(fn, kind: str):
    """``(along_k, whole)``: device functions rewriting the 16-byte chunk at ``tile[offset:]``
    in place. ``along_k(tile, offset, first, k)``: an A chunk, whose element ``j`` is at k
    index ``first + j``, transformed where that is below ``k`` (both 32-bit, counted from the
    tile's first k); ``whole(tile, offset)``: a B chunk (one k row, guarded by the caller).
    ``fn=None``: functions that do nothing."""
    if fn is None:

        @cuda.jit(device=True)
        def skip_k(tile, offset, first, k):
            pass

        @cuda.jit(device=True)
        def skip(tile, offset):
            pass

        return skip_k, skip
    to_f32 = _to_float32(kind)

    @cuda.jit(device=True)
    def one(v, kk, k):
        return fn(to_f32(v)) if kk < k else v

    @cuda.jit(device=True)
    def full(v):
        return fn(to_f32(v))

    if kind == "f32":  # 4 elements a chunk

        @cuda.jit(device=True)
        def along_k(tile, offset, first, k):
            v = load16_shared(tile, offset)
            kk = first
            store16_shared(
                tile, offset,
                (one(v[0], kk, k), one(v[1], kk + 1, k), one(v[2], kk + 2, k),
                 one(v[3], kk + 3, k)),
            )  # fmt: skip

        @cuda.jit(device=True)
        def whole(tile, offset):
            v = load16_shared(tile, offset)
            store16_shared(tile, offset, (full(v[0]), full(v[1]), full(v[2]), full(v[3])))

        return along_k, whole

    @cuda.jit(device=True)
    def along_k(tile, offset, first, k):  # 8 elements a chunk
        v = load16_shared(tile, offset)
        kk = first
        store16_shared(
            tile, offset,
            (one(v[0], kk, k), one(v[1], kk + 1, k), one(v[2], kk + 2, k), one(v[3], kk + 3, k),
             one(v[4], kk + 4, k), one(v[5], kk + 5, k), one(v[6], kk + 6, k),
             one(v[7], kk + 7, k)),
        )  # fmt: skip

    @cuda.jit(device=True)
    def whole(tile, offset):
        v = load16_shared(tile, offset)
        store16_shared(
            tile, offset,
            (full(v[0]), full(v[1]), full(v[2]), full(v[3]), full(v[4]), full(v[5]),
             full(v[6]), full(v[7])),
        )  # fmt: skip

    return along_k, whole


def element_pass(fn, rows: int, cols: int, threads: int, k_axis: int):
    """``apply(ring, stage, k0, k, tid)``: ``fn`` on every element of ``ring[stage]`` (a
    float32 ``rows x cols`` tile, ``cols`` a multiple of 4, whose k index along ``k_axis``
    starts at ``k0``), the elements at k index ``k`` or more left as they are. Thread ``tid`` of
    ``threads`` takes the 16-byte vectors ``tid, tid + threads, ...`` (consecutive threads,
    consecutive vectors: conflict free), one ``LDS.128`` and ``STS.128`` each.
    ``fn=None``: a function that does nothing."""
    if fn is None:

        @cuda.jit(device=True)
        def skip(ring, stage, k0, k, tid):
            pass

        return skip
    per_row = cols // 4
    size = rows * per_row
    per_thread = -(-size // threads)
    exact = size % threads == 0

    @cuda.jit(device=True)
    def one(v, kk, k):  # float16 operands: float32 tiles of widened values
        return float32(fn(v)) if kk < k else v

    @cuda.jit(device=True)
    def apply(ring, stage, k0, k, tid):
        left = int32(min(k - k0, rows if k_axis == 0 else cols))  # k indices inside K
        for j in range(per_thread):
            e = tid + j * threads
            if exact or e < size:
                r = e // per_row
                c = (e - r * per_row) * 4
                v = load16_shared(ring, (stage, r, c))
                if k_axis == 1:  # k along the row: each element its own guard
                    kk = int32(c)
                    v = (one(v[0], kk, left), one(v[1], kk + 1, left), one(v[2], kk + 2, left),
                         one(v[3], kk + 3, left))  # fmt: skip
                else:
                    kk = int32(r)
                    v = (one(v[0], kk, left), one(v[1], kk, left), one(v[2], kk, left),
                         one(v[3], kk, left))  # fmt: skip
                store16_shared(ring, (stage, r, c), v)

    return apply
