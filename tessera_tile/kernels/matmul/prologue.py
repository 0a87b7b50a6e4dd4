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

:func:`chunk_pass` makes the pass over the tensor-core kernels' 16-byte chunks; the SIMT
kernel's over its float32 rings is its own (:mod:`.matmul`, beside the vector reads it shares).
"""

from __future__ import annotations

from typing import NamedTuple

from numba import cuda

from ...memory import load16_shared, store16_shared
from ..epilogue import identity

__all__ = ["ElementPrologue", "chunk_pass", "name_of", "on_load"]


class ElementPrologue(NamedTuple):
    """A device function ``fn(v)`` of one element of the array read for an operand, returning
    the operand's element (the module doc); ``name`` tags the kernels built with it."""

    fn: object
    name: str


def name_of(prologue: tuple) -> str:
    """The kernel-name suffix of an ``(a, b)`` pair of prologues (each one or None)."""
    return "".join(f"_pro{side}_{p.name}" for side, p in zip("ab", prologue, strict=True) if p)


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
    return identity if fn is None else fn
