"""Allocations and byte runs, with or without the profiler.

Where the memory an array is a view of begins and ends (:func:`allocation_bytes`,
:func:`own_allocation`), and the run of bytes a vector access takes: from the address of its
first element on, as a GPU does, across a row's end but not past the allocation.
"""

from __future__ import annotations

import numpy as np

from ._base import SimulationError

_INTS = (int, np.integer)


def _run(array, idx, ptr: int) -> tuple[int, int] | None:
    """``(address, count)`` when ``idx`` asks for one run along the last axis, ``(i, ...,
    slice(j, j + count))`` (an int per leading axis), else None. The address is the one compiled
    code computes for ``[i, ..., j]`` from the array's address ``ptr`` (no wraparound, no bounds
    check)."""
    key = idx if isinstance(idx, tuple) else (idx,)
    last = key[-1] if len(key) == array.ndim else None
    if not isinstance(last, slice) or last.stop is None or last.step not in (None, 1):
        return None
    first = 0 if last.start is None else int(last.start)
    count = int(last.stop) - first
    if count < 0:
        return None
    strides = array.strides
    addr = ptr + first * strides[-1]
    for i, s in zip(key[:-1], strides, strict=False):
        if not isinstance(i, _INTS):
            return None
        addr += int(i) * s
    return addr, count


def _in_row(array, idx) -> bool:
    """Whether ``idx`` is a run inside the array's last axis, contiguous, with its leading
    indices in range: then NumPy's ``array[idx]`` is exactly the run's memory (the common case,
    which needs no look at the allocation)."""
    if type(idx) is not tuple:
        idx = (idx,)
    shape = array.shape
    if len(idx) != len(shape):
        return False
    last = idx[-1]
    if type(last) is not slice or last.step not in (None, 1):
        return False
    first, stop = last.start or 0, last.stop
    if stop is None or first < 0 or stop > shape[-1]:
        return False
    if stop - first > 1 and array.strides[-1] != array.itemsize:
        return False
    for k in range(len(shape) - 1):
        i = idx[k]
        if not isinstance(i, _INTS) or not 0 <= i < shape[k]:
            return False
    return True


class _Allocation:
    """Stands for one simulated allocation: an array made from it (``np.asarray``) has it as its
    ``base``, so the array and its views find the allocation's extent in :func:`allocation`
    instead of the NumPy buffer the memory was taken from."""

    __slots__ = ("__array_interface__", "_keep")

    def __init__(self, interface: dict, keep) -> None:
        self.__array_interface__ = interface
        self._keep = keep


def own_allocation(array: np.ndarray) -> np.ndarray:
    """``array``'s memory as an allocation of its own (no copy): a host array a GPU would copy
    alone to the device, or a shared array cut out of a larger buffer."""
    return np.asarray(_Allocation(dict(array.__array_interface__), array))


def allocation(array: np.ndarray) -> np.ndarray:
    """The array whose memory ``array`` is a view of: the last array of its ``base`` chain."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def allocation_bytes(array: np.ndarray) -> tuple[int, np.ndarray]:
    """(address, bytes) of the allocation ``array`` lives in, as a ``uint8`` array over it."""
    owner = allocation(array)
    ptr, readonly = owner.__array_interface__["data"]
    lo = hi = ptr
    for n, s in zip(owner.shape, owner.strides, strict=True):
        if n == 0:
            hi = lo - owner.itemsize
            break
        if s < 0:
            lo += (n - 1) * s
        else:
            hi += (n - 1) * s
    size = hi + owner.itemsize - lo
    interface = {"data": (lo, readonly), "shape": (size,), "typestr": "|u1", "version": 3}
    return lo, np.asarray(_Allocation(interface, owner))


def _read_run(raw: np.ndarray, array) -> np.ndarray:
    """A copy of a run's bytes as ``array``'s elements (keeping Numba's integer typing)."""
    out = raw.view(array.dtype).copy()
    return out if type(array) is np.ndarray else out.view(type(array))


def _write_run(raw: np.ndarray, value, dtype, count: int) -> None:
    values = np.broadcast_to(np.asarray(value, dtype), (count,))
    raw[:] = np.ascontiguousarray(values).view(np.uint8)


def _memory_run(array, idx, addr: int, count: int) -> np.ndarray:
    """The bytes of a run that leaves its row (unprofiled); raises when they leave the
    allocation (the GPU faults or reads memory the program does not own)."""
    lo, memory = allocation_bytes(array)
    start, nbytes = addr - lo, count * array.itemsize
    if start < 0 or start + nbytes > len(memory):
        raise SimulationError(
            f"a {nbytes}-byte access at index {idx} of an array of shape {array.shape} leaves "
            "its allocation (run under tessera_tile.sim.profile() to have it reported)"
        )
    return memory[start : start + nbytes]
