"""Warp and block reductions, all-reductions, arg-reductions and scans, built on shuffles.

Everything here is a Numba CUDA device function (lazy ``@cuda.jit(device=True)``): call it from
your own ``@cuda.jit`` kernel. Functions parametrised by an operator or a dtype come from
memoised factories (``make_*``), so a given ``(op, dtype)`` always yields the same compiled
device function::

    from tessera_tile.warp import FULL_MASK, make_block_reduce, maximum, warp_sum

    block_max = make_block_reduce(maximum, float32)


    @cuda.jit
    def kernel(x, out):
        v = x[cuda.grid(1)]
        s = warp_sum(v, FULL_MASK)  # valid in lane 0 of each warp
        m = block_max(v)  # valid in thread 0 of the block

**Masks (warp level).** ``mask`` names the lanes that call the function: a *contiguous run* of
lanes, ``FULL_MASK`` for a whole warp or ``prefix_mask(n)`` for the first ``n`` lanes (the last,
partial warp of a block of ``32*k + n`` threads). Every lane of the run calls it with the same
mask; lanes outside the run do not call it and contribute nothing. "Lane 0" below means the
run's lowest lane. A mask that is not a contiguous run gives undefined results.

**Operators.** ``op(a, b)`` is a device function. Reductions need it associative and commutative
(they combine in tree order); scans need it associative only. Ready-made: :func:`add`,
:func:`multiply`, :func:`maximum`, :func:`minimum` (the last two propagate NaN like ``np.max``).

**float16 and narrow integers.** Numba shuffles only 32- and 64-bit ints and floats. The factories
take the data's ``dtype`` and convert: float16 accumulates (and returns) float32, int8/int16
accumulate in int32. The ready-made warp functions (``warp_sum``...) are generic: pass them
float32/float64/int32/int64 values (convert float16 with ``float32(x)``). With no ``dtype`` the
accumulator type is whatever ``op`` returns: Numba adds two int32 as int64 (exact); with
``dtype=int32`` sums stay int32 and wrap, like CUDA C and CUB.

**Block level.** Block functions contain ``cuda.syncthreads()``: every thread of the block calls
them, never from divergent code. Any block shape and size up to 1024 threads (threads are ranked
``x + X*(y + Y*z)``, as the hardware forms warps), partial last warp included.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numba
import numpy as np
from numba import cuda, int32
from numba.core import types

from ._device.intrinsics import thread_rank

__all__ = [
    "FULL_MASK",
    "WARP_SIZE",
    "add",
    "make_block_allreduce",
    "make_block_argmax",
    "make_block_argmin",
    "make_block_reduce",
    "make_warp_allreduce",
    "make_warp_exclusive_scan",
    "make_warp_inclusive_scan",
    "make_warp_reduce",
    "maximum",
    "minimum",
    "multiply",
    "prefix_mask",
    "warp_allmax",
    "warp_allmin",
    "warp_allprod",
    "warp_allsum",
    "warp_argmax",
    "warp_argmin",
    "warp_exclusive_sum",
    "warp_inclusive_sum",
    "warp_max",
    "warp_min",
    "warp_prod",
    "warp_sum",
]

WARP_SIZE = 32
FULL_MASK = 0xFFFFFFFF
_LOG2_WARP = 5
_SCRATCH = WARP_SIZE + 1  # one partial per warp (1024 threads at most) + a broadcast slot


# -- operators ---------------------------------------------------------------------------------


@cuda.jit(device=True)
def add(a, b):
    return a + b


@cuda.jit(device=True)
def multiply(a, b):
    return a * b


@cuda.jit(device=True)
def maximum(a, b):
    """Larger of ``a`` and ``b``; NaN if either is NaN (like ``np.maximum``)."""
    # `a != a` is the NaN test that also compiles for integers (where it is always false).
    if a > b or a != a:
        return a
    return b


@cuda.jit(device=True)
def minimum(a, b):
    """Smaller of ``a`` and ``b``; NaN if either is NaN (like ``np.minimum``)."""
    if a < b or a != a:
        return a
    return b


@cuda.jit(device=True)
def _keep(x):
    return x


# -- masks -------------------------------------------------------------------------------------


@cuda.jit(device=True)
def prefix_mask(count):
    """Mask of lanes ``0 .. count-1`` (``count`` clamped to 0..32)."""
    if count >= WARP_SIZE:
        return FULL_MASK
    if count <= 0:
        return 0
    return (1 << count) - 1


@cuda.jit(device=True)
def _rank_and_count(mask):
    """This lane's rank in the run of lanes ``mask`` names, and the run's length."""
    # The run starts at the mask's lowest set bit (ffs is 1-based).
    return cuda.laneid - (cuda.ffs(mask) - 1), cuda.popc(mask)


# -- dtypes ------------------------------------------------------------------------------------

_ACCUMULATOR = {
    types.float16: types.float32,
    types.int8: types.int32,
    types.int16: types.int32,
    types.uint8: types.int32,
    types.uint16: types.int32,
}
_SHUFFLABLE = (types.float32, types.float64, types.int32, types.int64)


def _accumulator(dtype) -> types.Type | None:
    """The Numba type a reduction over ``dtype`` data accumulates in (None: op's own type)."""
    if dtype is None:
        return None
    if not isinstance(dtype, types.Type):
        dtype = numba.from_dtype(np.dtype(dtype))
    acc = _ACCUMULATOR.get(dtype, dtype)
    if acc not in _SHUFFLABLE:
        raise TypeError(
            f"warp reductions accumulate in float32, float64, int32 or int64; {dtype} is not "
            "supported (shuffles move 32- and 64-bit ints and floats only)"
        )
    return acc


# -- warp reductions ---------------------------------------------------------------------------


def make_warp_reduce(op: Callable, dtype=None) -> Callable:
    """``f(value, mask)``: ``op`` over the lanes of ``mask``; the result is valid in lane 0.

    Shuffle-down tree (5 steps for a full warp, fewer for a short run): lane ``r`` combines the
    value of lane ``r + offset`` only when that lane is in the run, so absent lanes never
    contribute. ``dtype``: the data's dtype, see the module docstring (None: generic).
    """
    return _warp_reduce(op, _accumulator(dtype))


@functools.cache
def _warp_reduce(op, acc):
    cast = _keep if acc is None else acc

    @cuda.jit(device=True)
    def warp_reduce(value, mask):
        value = cast(value)
        rank, count = _rank_and_count(mask)
        offset = WARP_SIZE // 2
        while offset > 0:
            # `count` is the same in every lane of the run: a uniform branch, and a run of n
            # lanes needs only the offsets below n.
            if offset < count:
                other = cuda.shfl_down_sync(mask, value, offset)
                if rank + offset < count:  # the source lane is in the run
                    value = cast(op(value, other))
            offset >>= 1
        return value

    return warp_reduce


def make_warp_allreduce(op: Callable, dtype=None) -> Callable:
    """``f(value, mask)``: ``op`` over the lanes of ``mask``; every lane of ``mask`` gets it.

    A full warp uses the xor butterfly (5 shuffles; both partners of a pair compute the same
    value, so every lane ends bitwise equal). A partial run cannot: a butterfly pairs some lanes
    with absent partners. It reduces into the run's first lane and broadcasts (one more shuffle).
    """
    return _warp_allreduce(op, _accumulator(dtype))


@functools.cache
def _warp_allreduce(op, acc):
    cast = _keep if acc is None else acc
    reduce = _warp_reduce(op, acc)

    @cuda.jit(device=True)
    def warp_allreduce(value, mask):
        if mask == FULL_MASK:
            value = cast(value)
            offset = WARP_SIZE // 2
            while offset > 0:
                value = cast(op(value, cuda.shfl_xor_sync(mask, value, offset)))
                offset >>= 1
            return value
        value = reduce(value, mask)
        return cuda.shfl_sync(mask, value, cuda.ffs(mask) - 1)

    return warp_allreduce


warp_sum = make_warp_reduce(add)
warp_prod = make_warp_reduce(multiply)
warp_max = make_warp_reduce(maximum)
warp_min = make_warp_reduce(minimum)
warp_allsum = make_warp_allreduce(add)
warp_allprod = make_warp_allreduce(multiply)
warp_allmax = make_warp_allreduce(maximum)
warp_allmin = make_warp_allreduce(minimum)


# -- warp scans --------------------------------------------------------------------------------


def make_warp_inclusive_scan(op: Callable, dtype=None) -> Callable:
    """``f(value, mask)``: lane ``r`` of the run gets ``op`` over lanes ``0..r`` of the run.

    Hillis-Steele with ``shfl_up``: log2(run length) steps. ``op(earlier, later)`` keeps the
    order, so ``op`` need only be associative.
    """
    return _warp_inclusive_scan(op, _accumulator(dtype))


@functools.cache
def _warp_inclusive_scan(op, acc):
    cast = _keep if acc is None else acc

    @cuda.jit(device=True)
    def warp_inclusive_scan(value, mask):
        value = cast(value)
        rank, count = _rank_and_count(mask)
        offset = 1
        while offset < count:  # uniform over the run, see warp_reduce
            other = cuda.shfl_up_sync(mask, value, offset)
            if rank >= offset:  # lanes below `offset` would read from before the run
                value = cast(op(other, value))
            offset <<= 1
        return value

    return warp_inclusive_scan


def make_warp_exclusive_scan(op: Callable, dtype=None) -> Callable:
    """``f(value, identity, mask)``: lane ``r`` gets ``op`` over lanes ``0..r-1``; lane 0 gets
    ``identity`` (of the accumulator's type, e.g. ``float32(0)`` for a float32 sum).
    """
    return _warp_exclusive_scan(op, _accumulator(dtype))


@functools.cache
def _warp_exclusive_scan(op, acc):
    cast = _keep if acc is None else acc
    inclusive = _warp_inclusive_scan(op, acc)

    @cuda.jit(device=True)
    def warp_exclusive_scan(value, identity, mask):
        # Shifting the inclusive scan up one lane needs no inverse of `op` (max has none).
        value = cuda.shfl_up_sync(mask, inclusive(value, mask), 1)
        if _rank_and_count(mask)[0] == 0:
            value = cast(identity)
        return value

    return warp_exclusive_scan


warp_inclusive_sum = make_warp_inclusive_scan(add)
warp_exclusive_sum = make_warp_exclusive_scan(add)


# -- arg-reductions ----------------------------------------------------------------------------


@cuda.jit(device=True)
def _wins(v, i, w, j, w_better, w_equal):
    """Whether ``(w, j)`` beats ``(v, i)`` in NumPy's argmax/argmin order.

    NaN beats any number, then the better value, then (equal values, or two NaN) the lower index.
    """
    if w != w:
        return v == v or j < i
    if v != v:
        return False
    return w_better or (w_equal and j < i)


@cuda.jit(device=True)
def _argmax_wins(v, i, w, j):
    return _wins(v, i, w, j, w > v, w == v)


@cuda.jit(device=True)
def _argmin_wins(v, i, w, j):
    return _wins(v, i, w, j, w < v, w == v)


@functools.cache
def _warp_argreduce(wins, broadcast):
    @cuda.jit(device=True)
    def warp_argreduce(value, index, mask):
        if broadcast and mask == FULL_MASK:
            # Butterfly: `wins` is a strict total order, so both partners keep the same pair.
            offset = WARP_SIZE // 2
            while offset > 0:
                w = cuda.shfl_xor_sync(mask, value, offset)
                j = cuda.shfl_xor_sync(mask, index, offset)
                if wins(value, index, w, j):
                    value = w
                    index = j
                offset >>= 1
            return value, index
        rank, count = _rank_and_count(mask)
        offset = WARP_SIZE // 2
        while offset > 0:
            if offset < count:
                w = cuda.shfl_down_sync(mask, value, offset)
                j = cuda.shfl_down_sync(mask, index, offset)
                if rank + offset < count and wins(value, index, w, j):
                    value = w
                    index = j
            offset >>= 1
        if broadcast:
            first = cuda.ffs(mask) - 1
            value = cuda.shfl_sync(mask, value, first)
            index = cuda.shfl_sync(mask, index, first)
        return value, index

    return warp_argreduce


_warp_argmax = _warp_argreduce(_argmax_wins, True)
_warp_argmin = _warp_argreduce(_argmin_wins, True)


@cuda.jit(device=True)
def warp_argmax(value, index, mask):
    """``(value, index)`` of the largest value over the lanes of ``mask``, in every lane of it.

    Each lane supplies its own ``index`` (any int type). Ties go to the lowest index; NaN wins
    like ``np.argmax`` (the first NaN). ``value`` must be 32/64-bit (convert float16 first).
    """
    return _warp_argmax(value, index, mask)


@cuda.jit(device=True)
def warp_argmin(value, index, mask):
    """Like :func:`warp_argmax`, for the smallest value (NaN wins like ``np.argmin``)."""
    return _warp_argmin(value, index, mask)


# -- block reductions --------------------------------------------------------------------------


def make_block_reduce(op: Callable, dtype) -> Callable:
    """``f(value)``: ``op`` over one value from every thread of the block; valid in thread 0.

    Each warp reduces (its last warp may be partial), lane 0 of each warp writes the partial to a
    shared scratch of 32 slots, and warp 0 reduces the partials. The result has the accumulator
    type of ``dtype`` (float16 -> float32). Launch contract: every thread of the block calls it
    (it has ``syncthreads``), any block size up to 1024; 33 * itemsize bytes of shared memory.
    """
    return _block_reduce(op, _accumulator(dtype), False)


def make_block_allreduce(op: Callable, dtype) -> Callable:
    """``f(value)``: like :func:`make_block_reduce`, and every thread gets the result."""
    return _block_reduce(op, _accumulator(dtype), True)


@functools.cache
def _block_reduce(op, acc, broadcast):
    warp_reduce = _warp_reduce(op, acc)

    @cuda.jit(device=True)
    def block_reduce(value):
        scratch = cuda.shared.array(_SCRATCH, acc)
        rank, size = thread_rank()
        # Shifts, not % and //: Numba's signed % and // add floor-rounding fixups.
        lane = rank & (WARP_SIZE - 1)
        warp = rank >> _LOG2_WARP
        value = warp_reduce(value, prefix_mask(size - warp * WARP_SIZE))
        # A previous call of this same function (same scratch) may still be reading: wait.
        cuda.syncthreads()
        if lane == 0:
            scratch[warp] = value
        cuda.syncthreads()
        warps = (size + WARP_SIZE - 1) >> _LOG2_WARP
        if rank < warps:
            value = warp_reduce(scratch[rank], prefix_mask(warps))
            if broadcast and rank == 0:
                scratch[WARP_SIZE] = value
        if broadcast:
            cuda.syncthreads()
            value = scratch[WARP_SIZE]
        return value

    return block_reduce


def make_block_argmax(dtype, broadcast: bool = False) -> Callable:
    """``f(value, index) -> (value, index)``: the block's largest value and its index.

    Ties go to the lowest index; NaN wins like ``np.argmax``. Indices are int32. Valid in
    thread 0, or in every thread with ``broadcast=True``. Launch contract as
    :func:`make_block_reduce`; 33 * (itemsize + 4) bytes of shared memory.
    """
    return _block_argreduce(_argmax_wins, _accumulator(dtype), broadcast)


def make_block_argmin(dtype, broadcast: bool = False) -> Callable:
    """Like :func:`make_block_argmax`, for the smallest value (NaN wins like ``np.argmin``)."""
    return _block_argreduce(_argmin_wins, _accumulator(dtype), broadcast)


@functools.cache
def _block_argreduce(wins, acc, broadcast):
    warp_argreduce = _warp_argreduce(wins, False)

    @cuda.jit(device=True)
    def block_argreduce(value, index):
        values = cuda.shared.array(_SCRATCH, acc)
        indices = cuda.shared.array(_SCRATCH, int32)
        rank, size = thread_rank()
        # Shifts, not % and //: Numba's signed % and // add floor-rounding fixups.
        lane = rank & (WARP_SIZE - 1)
        warp = rank >> _LOG2_WARP
        value, index = warp_argreduce(
            acc(value), int32(index), prefix_mask(size - warp * WARP_SIZE)
        )
        cuda.syncthreads()  # a previous call may still be reading the scratch
        if lane == 0:
            values[warp] = value
            indices[warp] = index
        cuda.syncthreads()
        warps = (size + WARP_SIZE - 1) >> _LOG2_WARP
        if rank < warps:
            value, index = warp_argreduce(values[rank], indices[rank], prefix_mask(warps))
            if broadcast and rank == 0:
                values[WARP_SIZE] = value
                indices[WARP_SIZE] = index
        if broadcast:
            cuda.syncthreads()
            value = values[WARP_SIZE]
            index = indices[WARP_SIZE]
        return value, index

    return block_argreduce
