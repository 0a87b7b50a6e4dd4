"""Launches from packed parameters: the simulator's side of ``tessera_tile._runtime.launch``'s
direct launches.

On a GPU a kept call hands the driver the parameters ``_runtime.packing`` packed (each array as
its pointer, shape and strides). Here the same list is decoded back: each array becomes a view
of the simulator's allocation that holds its address, with the packed shape and strides, and
the kernel runs on those. So a packing mistake (a wrong pointer offset, shape or stride) computes
wrong results in the simulator tier, as it would on a GPU.
"""

from __future__ import annotations

import ctypes

import numpy as np
from numba import types

from .._runtime import compat
from ._base import SimulationError
from .device_arrays import root_memory


def _allocation(address: int, nbytes: int, owners) -> np.ndarray:
    """The allocation, among those of ``owners`` (the device arrays the call's parameters were
    made from, or their allocations), that holds ``nbytes`` from ``address`` on."""
    for owner in owners:
        root = owner if isinstance(owner, np.ndarray) else root_memory(compat.host_memory(owner))
        start = root.__array_interface__["data"][0]
        if start <= address and address + nbytes <= start + max(root.nbytes, 1):
            return root
    raise SimulationError(
        f"a packed kernel parameter points at {address:#x}, inside none of the call's arrays "
        "(the GPU would read memory that is not the array's)"
    )


def _array(ty, fields, owners) -> object:
    _meminfo, _parent, size, itemsize, address = (next(fields) for _ in range(5))
    shape = tuple(next(fields) for _ in range(ty.ndim))
    strides = tuple(next(fields) for _ in range(ty.ndim))
    dtype = np.dtype(str(ty.dtype))
    if size != int(np.prod(shape)) or itemsize != dtype.itemsize:
        raise SimulationError(
            f"a packed {ty} says {size} elements of {itemsize} bytes for shape {shape}"
        )
    span = sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + itemsize if size else 0
    root = _allocation(address, span, owners)
    offset = address - root.__array_interface__["data"][0]
    if not size:
        offset = 0
    host = np.ndarray(shape, dtype, buffer=root, offset=offset, strides=strides)
    return compat.FakeCUDAArray(host)


def _decode(ty, fields, owners):
    if isinstance(ty, types.Array):
        return _array(ty, fields, owners)
    if isinstance(ty, types.BaseTuple):
        return tuple(_decode(t, fields, owners) for t in ty)
    value = next(fields)
    if ty == types.float16:
        return np.uint16(value.value).view(np.float16)
    if isinstance(value, ctypes._SimpleCData):
        value = value.value
    return np.dtype(str(ty)).type(value)


skipped = False  # set by sim.launches_skipped: the launch is the driver's work, not the caller's


def launch(kernel, grid, block, shared: int, stream, argtypes: tuple, params: list, owners) -> None:
    """Launch ``kernel`` on the arguments the packed ``params`` describe, their arrays views
    of the allocations of ``owners`` (device arrays, or allocations' host buffers)."""
    if skipped:
        return
    fields = iter(params)
    owners = [o for o in owners if isinstance(o, compat.FakeCUDAArray | np.ndarray)]
    args = [_decode(ty, fields, owners) for ty in argtypes]
    if next(fields, None) is not None:
        raise SimulationError("more packed parameters than the kernel's arguments take")
    kernel[grid, block, stream, shared](*args)
