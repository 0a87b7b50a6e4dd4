"""Transpose: hand-written, a padded shared-memory tile keeps reads and writes coalesced."""

from __future__ import annotations

import builtins
from dataclasses import dataclass

from .. import _arrays as arrays
from ..kernels import transpose as _transpose
from ._contract import (
    FLOATS,
    PrebuiltOp,
    array_arg,
    check_out,
    numba_type,
    source_of,
)

MAX_BLOCKS = 132 * 16  # an H100 full 16 times over; blocks grid-stride over further tiles


@dataclass
class _Transpose:
    x: arrays.Arg

    @property
    def kernel(self):
        return _transpose.KERNELS[self.x.dtype]

    def _blocks(self) -> int:
        m, n = self.x.shape
        tiles = -(-m // _transpose.TILE) * -(-n // _transpose.TILE)
        return builtins.min(tiles, MAX_BLOCKS)

    def run(self, out, stream):
        m, n = self.x.shape
        o = check_out(out, (n, m), self.x.dtype, {"x": self.x})
        if o is not None and not o.contiguous:
            raise ValueError("out must be C-contiguous: transpose writes C-contiguous results")
        place = arrays.Placement([self.x], [o], stream)
        result = place.result((n, m), self.x.dtype, o)
        if self.x.size:
            src = arrays.device_handle(place.device(self.x))
            dst = arrays.device_handle(result)
            self.kernel[self._blocks(), _transpose.THREADS, place.stream](src, dst)
        return place.finish(result, o)

    def explain(self):
        from ..fusion import Explain

        name = self.kernel.py_func.__name__
        nbytes = 2 * self.x.size * self.x.dtype.itemsize
        return Explain(
            kernels=1,
            ir=f"hand-written {name} (no Tile IR)",
            source=source_of(self.kernel),
            bytes_fused=nbytes,
            bytes_unfused=nbytes,  # one op: nothing to fuse
            reasons=[],
            stages=[
                f"{name}: hand-written, {_transpose.TILE}x{_transpose.TILE} tiles through padded "
                f"shared memory, {self._blocks()} block(s) of {_transpose.THREADS}"
            ],
        )

    def inspect(self, arch: str) -> list:
        from numba import from_dtype, types

        from .. import inspect as offline

        out_type = types.Array(from_dtype(self.x.dtype), 2, "C")
        signature = (numba_type(self.x), out_type)
        return [offline.compile(self.kernel, signature, arch=arch, block=_transpose.THREADS)]


def transpose(x):
    """``x.T`` of a 2-D array as a new C-contiguous array: float16, float32 or float64, any
    strides in; values are copied bit for bit (NaN and ±inf included, float16 stays float16).
    One hand-written kernel through a padded shared-memory tile: each element read and written
    once, both coalesced, no bank conflicts.
    """
    a = array_arg(x, "x", FLOATS, "transpose")
    if len(a.shape) != 2:
        raise ValueError(f"x has shape {a.shape}; transpose takes 2-D arrays")
    return _Transpose(a)


transpose = PrebuiltOp(transpose)
