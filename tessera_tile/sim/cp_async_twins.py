"""The simulator twins of :mod:`tessera_tile.pipeline`'s ``cp.async`` intrinsics: each thread's
copies are recorded when issued, grouped at commit, and land at the wait that retires their
group, not before (as the PTX ISA allows a GPU to land them); :func:`issued_copies` hands an
mbarrier the copies it must land."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from .. import sim

_STATE_KEY = "tessera_tile.pipeline.cp_async"


class _AsyncCopies:
    """One simulated thread's cp.async state: pending copies and committed, unlanded groups."""

    __slots__ = ("pending", "committed")

    def __init__(self) -> None:
        self.pending: list = []
        self.committed: list = []


def _copies() -> _AsyncCopies:
    state = sim.current_thread().state
    copies = state.get(_STATE_KEY)
    if copies is None:
        copies = state[_STATE_KEY] = _AsyncCopies()
    return copies


def _run(array, index, n: int, what: str, size: int):
    """The index expression of ``n`` elements from ``array[index]`` along the last axis."""
    key = index if isinstance(index, tuple) else (index,)
    key = tuple(int(i) for i in key)
    shape = array.shape
    if len(key) != len(shape):
        raise sim.SimulationError(f"cp.async {what}: {len(key)} indices for a {len(shape)}-d array")
    for i, extent in zip(key, shape, strict=True):
        if not 0 <= i < extent:
            raise sim.SimulationError(
                f"cp.async {what}: index {key} out of bounds for shape {tuple(shape)}"
            )
    return _address_run(array, key, n, what, size, f"index {key}")


def _at_run(array, offset, n: int, size: int):
    """The run of ``n`` elements ``offset`` elements (an int or a pair, added) from
    ``array[0, ..., 0]``: any address inside the array's allocation, as the GPU reads it
    (across row ends, past the view). Its key is ``[0, ..., 0, offset]``, whose address (no
    bounds check) is that."""
    offset = sum(int(o) for o in offset) if isinstance(offset, tuple) else int(offset)
    key = (0,) * (array.ndim - 1) + (offset,)
    return _address_run(array, key, n, "global source", size, f"element offset {offset}")


def _address_run(array, key: tuple, n: int, what: str, size: int, where: str):
    """The run of ``n`` elements from the address of ``array[key]``, checked as the GPU
    would: a contiguous last axis, ``size``-byte alignment, inside the allocation."""
    if n > 1 and array.strides[-1] != array.itemsize:
        raise sim.SimulationError(f"cp.async {what}: the last axis is not contiguous")
    if sim.element_address(array, key) % size:
        raise sim.SimulationError(f"cp.async {what}: address of {where} is not {size}-byte aligned")
    # The copy is an address range: it may cross a row end (the next row of a contiguous
    # array), not the end of the allocation.
    if not sim.in_allocation(array, key, n * array.itemsize):
        raise sim.SimulationError(
            f"cp.async {what}: {n * array.itemsize} bytes from {where} leave the "
            f"array's allocation (shape {tuple(array.shape)})"
        )
    return (*key[:-1], slice(key[-1], key[-1] + n))


def _copy_twin(size: int, zfill: bool, at: bool = False) -> Callable:
    source_run = _at_run if at else functools.partial(_run, what="global source")

    def record(dst, dst_index, src, src_index, src_bytes=size):
        if dst.dtype != src.dtype:
            raise sim.SimulationError(
                f"cp.async: shared {dst.dtype} and global {src.dtype} arrays differ in dtype"
            )
        item = dst.itemsize
        n = size // item
        src_bytes = int(src_bytes)
        if not 0 <= src_bytes <= size or src_bytes % item:
            raise sim.SimulationError(
                f"cp.async: src_bytes {src_bytes} must be a multiple of {item} in 0..{size}"
            )
        valid = src_bytes // item
        dst_run = _run(dst, dst_index, n, "shared destination", size)
        src_run = source_run(src, src_index, valid, size=size) if valid else None
        _copies().pending.append((dst, dst_run, src, src_run, valid, n))

    if not zfill:

        def record_full(dst, dst_index, src, src_index):
            record(dst, dst_index, src, src_index)

        return record_full
    return record


def _commit_twin() -> None:
    copies = _copies()
    copies.committed.append(copies.pending)
    copies.pending = []


def _land(copy) -> None:
    dst, dst_run, src, src_run, valid, count = copy
    values = np.zeros(count, dst.dtype)
    if valid:
        values[:valid] = sim.load(src, src_run)
    sim.store(dst, dst_run, values)


def _wait_group_twin(n) -> None:
    copies = _copies()
    keep = int(n)
    while len(copies.committed) > keep:
        for copy in copies.committed.pop(0):
            _land(copy)


def issued_copies() -> Callable[[], None]:
    """For twins of instructions that track this thread's earlier ``cp.async`` copies (the
    arrive-on of ``cp.async.mbarrier.arrive``): a function that lands those of them still in
    flight, in issue order, and forgets them (a later ``wait_group`` does not land them again).
    Copies issued after this call are not its concern."""
    copies = _copies()
    # by identity (the dict holds them, so their ids stay unique)
    tracked = {id(c): c for c in (*(c for g in copies.committed for c in g), *copies.pending)}

    def land() -> None:
        for group in (*copies.committed, copies.pending):
            for copy in group:
                if id(copy) in tracked:
                    _land(copy)
            group[:] = [c for c in group if id(c) not in tracked]
        tracked.clear()

    return land


def _wait_all_twin() -> None:
    _commit_twin()
    _wait_group_twin(0)
