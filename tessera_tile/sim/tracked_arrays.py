"""The arrays a profile watches, and the one-access loads and stores of twins.

Inside a profile (:mod:`.profiler`) kernel arguments and shared arrays are wrapped in
:class:`TrackedArray`, which counts every element access a thread makes, checks its bounds and
records where it happened. :func:`load`, :func:`store`, :func:`address` and
:func:`in_allocation` take a tracked array or a plain one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from greenlet import getcurrent

from ._base import SimulationError, format_site, user_site
from .allocations import _in_row, _memory_run, _read_run, _run, _write_run, allocation_bytes


@dataclass(frozen=True)
class OutOfBounds:
    space: str  # "global" or "shared"
    array: str
    index: object
    shape: tuple
    thread: tuple
    block: tuple
    line: str
    write: bool

    def __str__(self) -> str:
        what = "write" if self.write else "read"
        return (
            f"out-of-bounds {self.space} {what} {self.array}[{self.index}] (shape {self.shape}) "
            f"by thread {self.thread} of block {self.block} at {self.line}"
        )


class _Space:
    """The memory behind one tracked array: a kernel argument or a shared allocation."""

    __slots__ = (
        "profile", "name", "root", "root_ptr", "counters", "recorder", "key", "shared", "_memory"
    )  # fmt: skip

    def __init__(self, profile, name, root, counters=None, recorder=None, key=None):
        self.profile = profile
        self.name = name
        self.root = root
        self.root_ptr = root.__array_interface__["data"][0]
        self._memory = None
        self.counters = counters
        self.recorder = recorder
        self.key = key
        self.shared = recorder is not None

    def out_of_bounds(self, index, shape, write: bool, site) -> None:
        t = getcurrent()
        prof = self.profile
        if len(prof.out_of_bounds) < prof.MAX_REPORTS:
            prof.out_of_bounds.append(
                OutOfBounds(
                    "shared" if self.shared else "global",
                    self.name,
                    index,
                    tuple(shape),
                    tuple(getattr(t, "threadIdx", ())),
                    tuple(getattr(t, "blockIdx", ())),
                    format_site(site),
                    write,
                )
            )

    def memory(self) -> tuple[int, np.ndarray]:
        """(address, bytes) of the allocation this array lives in (computed once)."""
        if self._memory is None:
            self._memory = allocation_bytes(self.root)
        return self._memory

    def touch(self, offsets, itemsize: int, write: bool, site, vector: bool = False) -> None:
        nbytes = len(offsets) * itemsize
        if self.counters is not None:
            self.counters[1 if write else 0] += nbytes
        if self.recorder is not None:
            self.recorder.record(self, offsets, itemsize, write, site, vector)
        elif self.profile.global_accesses is not None:
            self.profile.global_accesses.record(self, offsets, itemsize, write, site)


class TrackedArray:
    """An array whose element accesses are counted and checked (only inside a profile)."""

    __slots__ = ("_a", "_space", "_base")

    def __init__(self, array: np.ndarray, space: _Space):
        self._a = array
        self._space = space
        self._base = array.__array_interface__["data"][0] - space.root_ptr

    shape = property(lambda self: self._a.shape)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    dtype = property(lambda self: self._a.dtype)
    strides = property(lambda self: self._a.strides)
    itemsize = property(lambda self: self._a.itemsize)

    def __len__(self) -> int:
        return len(self._a)

    def reshape(self, *shape):
        """A kernel's ``reshape``: a view of the same memory, still tracked (refused for layout
        "A", as Numba refuses it)."""
        return TrackedArray(self._a.reshape(*shape), self._space)

    def __repr__(self) -> str:
        return f"TrackedArray({self._space.name}, shape={self._a.shape}, dtype={self._a.dtype})"

    def _element_offset(self, key):
        """Byte offset of an element index, or None when it is out of bounds."""
        off = self._base
        for i, n, s in zip(key, self._a.shape, self._a.strides, strict=True):
            i = int(i)
            if i < -n or i >= n:
                return None
            off += (i + n if i < 0 else i) * s
        return off

    def _offsets(self, sub: np.ndarray) -> list[int]:
        start = sub.__array_interface__["data"][0] - self._space.root_ptr
        if sub.size == 0:
            return []
        grids = np.indices(sub.shape).reshape(sub.ndim, -1)
        return (start + (grids.T * np.array(sub.strides)).sum(axis=1)).tolist()

    def _access(self, idx, value, write: bool):
        a = self._a
        site = user_site(3)
        key = idx if isinstance(idx, tuple) else (idx,)
        if len(key) == a.ndim and all(isinstance(i, int | np.integer) for i in key):
            off = self._element_offset(key)
            if off is None:
                self._space.out_of_bounds(idx, a.shape, write, site)
                return None if write else a.dtype.type(0)
            self._space.touch([off], a.itemsize, write, site)
            if write:
                a[key] = value
                return None
            return a[key]
        try:
            sub = a[idx]
        except IndexError:
            self._space.out_of_bounds(idx, a.shape, write, site)
            return None if write else a.dtype.type(0)
        if write:
            self._space.touch(self._offsets(np.asarray(sub)), a.itemsize, True, site)
            a[idx] = value
            return None
        if isinstance(sub, np.ndarray) and sub.base is not None:
            return TrackedArray(sub, self._space)  # a view: its elements count when used
        self._space.touch(self._offsets(np.asarray(sub)), a.itemsize, False, site)
        return sub

    def __getitem__(self, idx):
        return self._access(idx, None, False)

    def __setitem__(self, idx, value):
        self._access(idx, value, True)

    def atomic_access(self, idx) -> bool:
        """Count an atomic read-modify-write of one element; False when out of bounds."""
        site = user_site(3)
        key = idx if isinstance(idx, tuple) else (idx,)
        off = self._element_offset(key) if len(key) == self._a.ndim else None
        if off is None:
            self._space.out_of_bounds(idx, self._a.shape, True, site)
            return False
        self._space.touch([off], self._a.itemsize, False, site)
        self._space.touch([off], self._a.itemsize, True, site)
        return True

    def vector_access(self, idx, value=None, write: bool = False):
        """One access of a contiguous run (a 4/8/16-byte vector load or store) for twins.

        A run ``(i, ..., slice(j, j + n))`` is what the GPU makes of it: the ``n * itemsize``
        bytes from the address of ``[i, ..., j]``, valid when they lie inside the allocation the
        array is a view of, so a run that crosses a row end reads the bytes that follow (the
        next row of a contiguous array). A run that leaves the allocation is out of bounds: it
        is reported, a read returns zeros and a write is dropped. Other indices must stay inside
        the array (unlike a slice in Python, which clips).
        """
        site = user_site(3)
        a = self._a
        run = _run(a, idx, self._space.root_ptr + self._base)
        if run is None:
            return self._indexed_access(idx, value, write, site)
        addr, count = run
        lo, memory = self._space.memory()
        start, nbytes = addr - lo, count * a.itemsize
        if start < 0 or start + nbytes > len(memory):
            self._space.out_of_bounds(idx, a.shape, write, site)
            return None if write else np.zeros(count, a.dtype)
        first = addr - self._space.root_ptr
        offsets = list(range(first, first + nbytes, a.itemsize))
        self._space.touch(offsets, a.itemsize, write, site, True)
        if write:
            _write_run(memory[start : start + nbytes], value, a.dtype, count)
            return None
        return _read_run(memory[start : start + nbytes], a)

    def _indexed_access(self, idx, value, write: bool, site):
        count = _run_length(idx, self._a.shape)
        sub = None if count is None else self._a[idx]
        if sub is None or np.size(sub) != count:
            self._space.out_of_bounds(idx, self._a.shape, write, site)
            return None if write else np.zeros(_requested(idx), self._a.dtype)
        self._space.touch(self._offsets(np.asarray(sub)), self._a.itemsize, write, site, True)
        if write:
            self._a[idx] = value
            return None
        return np.array(sub, subok=True)  # a copy that keeps Numba's integer typing


def _requested(idx) -> int:
    """How many elements a twin asked for (to return zeros for an out-of-bounds read)."""
    key = idx if isinstance(idx, tuple) else (idx,)
    last = key[-1]
    if isinstance(last, slice) and last.stop is not None:
        return max(0, -(-(last.stop - (last.start or 0)) // (last.step or 1)))
    return 1


def _run_length(idx, shape) -> int | None:
    """Elements an index asks for, without NumPy's clipping of slices; None if out of range."""
    key = idx if isinstance(idx, tuple) else (idx,)
    if len(key) > len(shape):
        return None
    count = 1
    for k, n in zip(key, shape, strict=False):
        if isinstance(k, slice):
            start, stop, step = k.start or 0, n if k.stop is None else k.stop, k.step or 1
            if start < 0 or stop < start or step < 1:
                return None
            count *= -(-(stop - start) // step)
        elif not -n <= int(k) < n:
            return None
    for n in shape[len(key) :]:
        count *= n
    return count


def address(array) -> int:
    """Address of an array's first element, seen through the profiler's wrapper (for twins
    that check alignment)."""
    if isinstance(array, TrackedArray):
        array = array._a
    return array.__array_interface__["data"][0]


def element_address(array, index) -> int:
    """Address of ``array[index]`` (an int or one int per dimension; not bounds checked)."""
    key = index if isinstance(index, tuple) else (index,)
    return address(array) + sum(int(i) * s for i, s in zip(key, array.strides, strict=True))


def in_allocation(array, index, nbytes: int) -> bool:
    """Whether the ``nbytes`` bytes from the address of ``array[index]`` (an int or one int per
    dimension; no bounds check) lie inside the allocation ``array`` is a view of: what a GPU
    needs of a vector access besides its alignment (for twins that check before they copy)."""
    addr = element_address(array, index)
    if isinstance(array, TrackedArray):
        lo, memory = array._space.memory()
    else:
        lo, memory = allocation_bytes(array)
    return lo <= addr and addr + nbytes <= lo + len(memory)


def load(array, idx):
    """Read ``array[idx]`` as one access (for intrinsic twins); returns a copy.

    A run ``(i, ..., slice(j, j + n))`` reads the bytes at the address of ``[i, ..., j]`` as the
    GPU does: across a row end into the bytes that follow, inside the array's allocation."""
    if isinstance(array, TrackedArray):
        return array.vector_access(idx)
    run = None if _in_row(array, idx) else _plain_run(array, idx)
    if run is None:
        return np.array(array[idx], subok=True)
    return _read_run(_memory_run(array, idx, *run), array)


def store(array, idx, values) -> None:
    """Write ``array[idx] = values`` as one access (for intrinsic twins); a run is written to
    the bytes at its address, as :func:`load` reads them."""
    if isinstance(array, TrackedArray):
        array.vector_access(idx, values, write=True)
        return
    run = None if _in_row(array, idx) else _plain_run(array, idx)
    if run is None:
        array[idx] = values
    else:
        _write_run(_memory_run(array, idx, *run), values, array.dtype, run[1])


def _plain_run(array, idx) -> tuple[int, int] | None:
    if not isinstance(array, np.ndarray):
        return None
    return _run(array, idx, array.__array_interface__["data"][0])


def carved(array, offset: int, shape: tuple) -> object:
    """The C-contiguous ``shape`` view of a 1-D ``array`` from element ``offset`` (the twin
    of :func:`tessera_tile.memory.carve`); tracked when ``array`` is."""
    base = array._a if isinstance(array, TrackedArray) else array
    count = int(np.prod(shape, dtype=np.int64))
    offset = int(offset)
    if base.ndim != 1 or offset < 0 or offset + count > base.size:
        raise SimulationError(
            f"carve of {shape} at element {offset} leaves the {base.shape} array it is cut from"
        )
    view = base[offset : offset + count].reshape(tuple(int(n) for n in shape))
    return TrackedArray(view, array._space) if isinstance(array, TrackedArray) else view
