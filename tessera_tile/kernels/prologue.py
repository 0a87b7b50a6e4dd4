"""Matmul prologues: an elementwise function applied to each element of an operand as its tile
is staged into shared memory, once per element per block.

An :class:`ElementPrologue` wraps a device function ``fn(v)`` of one element ``v`` of the array
the kernel reads for A or B, as stored (a bfloat16's ``uint16`` bits), that returns the
operand's element (float16, bfloat16 bits, or float32). The composer generates one for a matmul
operand that is an elementwise chain over one array (``tt.relu(x) @ w``,
``x @ wq.astype(np.float16)``): the GEMM kernel reads the array and applies ``fn`` where the
elements pass:

* synchronous staging (each element loaded into registers, then stored into the tile): ``fn``
  on the way, so the array may have another dtype than the operand (a cast);
* ``cp.async`` staging (global to shared without registers; the array has the operand's
  dtype): a pass over each tile once it lands::

    wait for tile k; __syncthreads       (the kernel's own)
    issue the copies of tile k + stages - 1
    prologue: each thread rewrites its share of tile k's A (and/or B) elements
    __syncthreads                        (one more per k-tile)
    multiply tile k

Elements past K (the zero fill of a partial k-tile) stay 0, whatever ``fn(0)`` is: the other
operand's fill is 0 too, but ``fn(0)`` may be inf (``1 / x``), and inf * 0 is NaN. Rows of A past
M and columns of B past N are transformed: they reach only the C elements no kernel stores.

The builders here make the passes of the two ``cp.async`` tile layouts: :func:`chunk_pass` for
the tensor-core kernels' 16-byte chunks and :func:`vector_pass` for the SIMT kernel's float32
rings.
"""

from __future__ import annotations

from typing import NamedTuple

from numba import cuda, float32, int32

from ..memory import load16_shared, store16_shared

__all__ = ["ElementPrologue", "chunk_pass", "fn_of", "name_of", "on_load", "vector_pass"]


class ElementPrologue(NamedTuple):
    """A device function ``fn(v)`` of one element of the array read for an operand, returning
    the operand's element (the module doc); ``name`` tags the kernels built with it."""

    fn: object
    name: str


def name_of(prologue: tuple) -> str:
    """The kernel-name suffix of an ``(a, b)`` pair of prologues (each one or None)."""
    return "".join(f"_pro{side}_{p.name}" for side, p in zip("ab", prologue, strict=True) if p)


def fn_of(prologue):
    """The device function of a prologue, or None."""
    return None if prologue is None else prologue.fn


@cuda.jit(device=True)
def _unchanged(v):
    return v


def chunk_pass(fn, chunk: int):
    """``apply(tile, offset)``: ``fn`` on each element of the 16-byte chunk at ``tile[offset:]``
    (``chunk`` elements: 8 halves or 4 float32), in place; the caller guards the chunk (a
    ``cp.async`` chunk is all inside K or all past it). ``fn=None``: a function that does
    nothing."""
    if fn is None:

        @cuda.jit(device=True)
        def skip(tile, offset):
            pass

        return skip
    if chunk == 4:

        @cuda.jit(device=True)
        def apply4(tile, offset):
            v = load16_shared(tile, offset)
            store16_shared(tile, offset, (fn(v[0]), fn(v[1]), fn(v[2]), fn(v[3])))

        return apply4

    @cuda.jit(device=True)
    def apply8(tile, offset):
        v = load16_shared(tile, offset)
        store16_shared(
            tile, offset,
            (fn(v[0]), fn(v[1]), fn(v[2]), fn(v[3]), fn(v[4]), fn(v[5]), fn(v[6]), fn(v[7])),
        )  # fmt: skip

    return apply8


def on_load(fn):
    """The function synchronous staging applies to each loaded element: ``fn``, or (None) one
    that returns the element unchanged."""
    return _unchanged if fn is None else fn


def vector_pass(fn, rows: int, cols: int, threads: int, k_axis: int):
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
    def one(v, kk, k):
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
