"""Transpose: hand-written, a padded shared-memory tile keeps reads and writes coalesced."""

from __future__ import annotations

import builtins
from dataclasses import dataclass

import numpy as np

from .._runtime import arrays
from .._runtime.launch import KernelLaunch, View
from ..kernels import transpose as _transpose
from ..kernels._calls import (
    COMPOSED_FLOATS,
    HandWritten,
    Report,
    array_arg,
    numba_type,
)
from ..tile_ir import BFLOAT16
from ._contract import PrebuiltOp

MAX_BLOCKS = 132 * 16  # an H100 full 16 times over; blocks grid-stride over further tiles


@dataclass
class _Transpose(HandWritten):
    x: arrays.Arg
    contiguous_out = True

    @property
    def bits(self) -> np.dtype | None:
        """What a bfloat16 array is moved as: float16 (the same 2 bytes, copied as they are,
        NaN payloads included); None for the dtypes with kernels of their own."""
        return np.dtype(np.float16) if self.x.dtype == BFLOAT16 else None

    @property
    def kernel(self):
        return _transpose.kernel(self.bits or self.x.dtype)

    @property
    def out_shape(self) -> tuple:
        return self.x.shape[::-1]

    @property
    def dtype(self):
        return self.x.dtype

    def inputs(self) -> dict:
        return {"x": self.x}

    def _blocks(self) -> int:
        m, n = self.x.shape
        tiles = -(-m // _transpose.TILE) * -(-n // _transpose.TILE)
        return builtins.min(tiles, MAX_BLOCKS)

    def launches(self, records, result) -> list:
        if not self.x.size:
            return []
        signature = tuple(self._type(r) for r in (records[0], result))
        params = (View(0, dtype=self.bits), View(1, dtype=self.bits))
        return [KernelLaunch(self.kernel, self._blocks(), _transpose.THREADS, params, signature)]

    def _type(self, rec: arrays.Arg):
        return numba_type(rec if self.bits is None else rec._replace(dtype=self.bits))

    def report(self) -> Report:
        name = self.kernel.py_func.__name__
        nbytes = 2 * self.x.size * self.x.dtype.itemsize
        launch = KernelLaunch(
            self.kernel, self._blocks(), _transpose.THREADS, (),
            tuple(self._type(r) for r in (self.x, arrays.placeholder(self.out_shape, self.dtype))),
        )  # fmt: skip
        stage = (
            f"{name}: hand-written, {_transpose.TILE}x{_transpose.TILE} tiles through padded "
            f"shared memory, {self._blocks()} block(s) of {_transpose.THREADS}"
        )
        return Report(name, [launch], [stage], nbytes, nbytes)  # one op: nothing to fuse

    # gradients (PrebuiltOp.vjp): x.T's cotangent is the result's, transposed back
    @property
    def gradient_args(self) -> tuple:
        return (self.x,)

    def gradient_run(self):
        return self.run(None, None), None

    def gradient_plan(self, saved, cotangent):
        return _TransposedBack(cotangent)

    def gradient_stand_ins(self) -> tuple:
        return None, arrays.placeholder(self.out_shape, self.dtype)


@dataclass(frozen=True)
class _TransposedBack:
    """The backward of ``transpose``: the same kernel on the cotangent."""

    cotangent: object

    def grads(self) -> tuple:
        return (transpose(self.cotangent),)

    def explain(self):
        return transpose.explain(self.cotangent)

    def inspect(self, arch: str) -> list:
        return transpose.inspect(self.cotangent, arch=arch)


def transpose(x):
    """``x.T`` of a 2-D array as a new C-contiguous array: float16, bfloat16, float32 or float64,
    any strides in; values are copied bit for bit (NaN and ±inf included, float16 stays float16;
    bfloat16 moves as float16, the same two bytes).
    One hand-written kernel through a padded shared-memory tile: each element read and written
    once, both coalesced, no bank conflicts.
    """
    a = array_arg(x, "x", COMPOSED_FLOATS, "transpose")
    if len(a.shape) != 2:
        raise ValueError(f"x has shape {a.shape}; transpose takes 2-D arrays")
    return _Transpose(a)


transpose = PrebuiltOp(transpose)
