"""Kernel parameters packed as numba-cuda packs them, for launches that skip its dispatcher.

numba-cuda (``_Kernel._prepare_args``, 0.30) turns each argument of a kernel into driver
parameters, which ``cuda.core.launch`` lays out (a Python int as an ``intptr_t``, a bool as a
C ``bool``, a ctypes value as itself):

- an array: a null meminfo and parent, its element count and item size, its data pointer, then
  its shape and its byte strides;
- an integer as the ctypes integer of its type; float32 and float64 as ``c_float`` and
  ``c_double``; float16 as its ``uint16`` bits; a boolean as it is;
- a tuple: its items, in order.

:func:`packer` makes the same list from what a call already knows of each array (a
:class:`Pointer`: address, shape, strides, item size), so a kept call launches without typing
its arguments again and without making a device-array object per view. A test compares the
two lists byte for byte for every kernel signature the library launches.
"""

from __future__ import annotations

import ctypes
import math
from typing import NamedTuple

import numpy as np
from numba import types

from . import compat
from .arrays import Arg


class Pointer(NamedTuple):
    """An array parameter as the kernel receives it."""

    address: int
    shape: tuple
    strides: tuple  # bytes
    itemsize: int


def pointer_of(array) -> Pointer:
    """The :class:`Pointer` of a device array's record (``arrays.Arg``), or of a numba device
    array, read from its attributes."""
    if type(array) is Arg:
        return Pointer(array.address, array.shape, array.strides, array.dtype.itemsize)
    shape, strides, dtype, address = compat.layout(array)
    return Pointer(address, tuple(shape), tuple(strides), dtype.itemsize)


def view_pointer(array, shape, strides, offset: int) -> Pointer:
    """The :class:`Pointer` of the view ``arrays.view`` makes: ``offset`` bytes past the
    array's first element (none for a view without elements), with this shape and these
    strides."""
    base = pointer_of(array)
    address = base.address + (offset if math.prod(shape) else 0)
    return Pointer(address, shape, strides, base.itemsize)


def _array(value, out: list) -> None:
    p = value if type(value) is Pointer else pointer_of(value)
    out += (0, 0, math.prod(p.shape), p.itemsize, p.address, *p.shape, *p.strides)


def _scalar(make):
    def scalar(value, out: list) -> None:
        out.append(make(value))

    return scalar


def _tuple(items: list):
    def tuple_(value, out: list) -> None:
        for field, item in zip(items, value, strict=True):
            field(item, out)

    return tuple_


def address_of(array) -> int:
    """The address of a device array's record (``arrays.Arg``) or of a numba device array."""
    return array.address if type(array) is Arg else compat.device_pointer(array)


def scalar(ty):
    """The driver parameter of a scalar argument of numba type ``ty``, from its value."""
    if isinstance(ty, types.Integer):
        return getattr(ctypes, f"c_{ty}")
    if ty == types.float32:
        return ctypes.c_float
    if ty == types.float64:
        return ctypes.c_double
    if ty == types.float16:
        return lambda v: ctypes.c_uint16(np.float16(v).view(np.uint16))
    if ty == types.boolean:
        return _same
    raise NotImplementedError(f"packing a kernel parameter of type {ty}")


def _same(value):
    return value


def leaves(argtypes) -> list[tuple[int, object]]:
    """Per leaf argument (tuples flattened, in order), the position in the packed list of what
    a call on other arrays of the same layouts changes (an array's address, a scalar's value),
    and its type."""
    out, at = [], 0
    stack = list(reversed(argtypes))
    while stack:
        ty = stack.pop()
        if isinstance(ty, types.BaseTuple):
            stack.extend(reversed(list(ty)))
        elif isinstance(ty, types.Array):
            out.append((at + 4, ty))  # meminfo, parent, size, itemsize, then the address
            at += 5 + 2 * ty.ndim
        else:
            out.append((at, ty))
            at += 1
    return out


def field(ty):
    """The function that appends the driver parameters of an argument of numba type ``ty``
    (its value an array's :class:`Pointer` or device array, or a scalar or tuple) to a list;
    decided once per type, so packing a launch costs a call per argument."""
    if isinstance(ty, types.Array):
        return _array
    if isinstance(ty, types.BaseTuple):
        return _tuple([field(t) for t in ty])
    return _scalar(scalar(ty))


def packer(argtypes: tuple):
    """``pack(values) -> list``: the driver parameters of a launch with these argument types."""
    fields = [field(t) for t in argtypes]

    def pack(values) -> list:
        out: list = []
        for append, value in zip(fields, values, strict=True):
            append(value, out)
        return out

    return pack
