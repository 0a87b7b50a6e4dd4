"""The ``cuda`` module a kernel sees while the simulator runs it (:class:`WarpAwareModule`).

numba-cuda's fake module, plus barriers and warp operations that suspend the calling thread in
the block's scheduler (:mod:`.scheduler`), thread identity read from the running greenlet, and
``cuda.shared``, ``cuda.local``, ``cuda.const`` and ``cuda.atomic`` with the GPU's typing and
alignment rules. :mod:`.engine` makes one for each launch.
"""

from __future__ import annotations

import struct
import sys

import numpy as np
from greenlet import getcurrent
from numba import cuda as numba_cuda
from numba.cuda import types

from .._runtime import compat
from . import constant_shapes, ints, shared_limits
from ._base import SimulationError
from .allocations import own_allocation
from .scheduler import SimThread, block_on, current_thread
from .tracked_arrays import TrackedArray
from .warp_ops import FULL_MASK, WARP_SIZE, lanes_bits


class _Shared:
    """``cuda.shared``: one array per call site and block, filled with 0xFF bytes.

    Unlike numba-cuda's, two arrays declared on one source line do not alias, every block
    gets fresh memory whose bytes read as NaN / -1 until written, and a block's static arrays
    are held to the GPU's limits (:mod:`.shared_limits`).
    """

    def array(self, shape, dtype, alignment=None):
        alignment = _checked_alignment(alignment)
        block = current_thread().block
        dtype = _numpy_dtype(dtype)
        if shape == 0 or shape == (0,):
            count = block.dynshared.size // dtype.itemsize
            arr = ints.typed_view(np.frombuffer(block.dynshared.data, dtype=dtype, count=count))
            key = ("dynamic", dtype.str)
        else:
            # One array per call instruction, as a GPU allocates it once per kernel: the same
            # call made again (a device function called twice) gets the same memory, two calls
            # on one line get two arrays.
            frame = sys._getframe(1)
            key = (frame.f_code, frame.f_lineno, frame.f_lasti)
            arr = block.shared.get(key)
            if arr is None:
                constant_shapes.check(frame, "cuda.shared.array")
                arr = _aligned_empty(shape, dtype, alignment or natural_alignment(dtype))
                arr.view(np.uint8).fill(0xFF)
                arr = block.shared[key] = ints.typed_view(arr)
                static = sum(a.nbytes for a in block.shared.values())
                launch = block.launch
                shared_limits.check_block(
                    launch.kernel.fn, launch.opted_shared, static, block.dynshared.size
                )
        if block.recorder:
            return block.recorder.shared_array(key, arr)
        return arr


def _numpy_dtype(dtype) -> np.dtype:
    """The NumPy dtype of a ``dtype=`` argument (a Numba type or anything NumPy takes)."""
    return np.dtype(compat.as_dtype(dtype) if isinstance(dtype, types.Type) else dtype)


_POINTER_SIZE = struct.calcsize("P")


def _checked_alignment(alignment) -> int | None:
    """``alignment=`` of ``cuda.shared.array`` / ``cuda.local.array``, refused where numba-cuda
    refuses to compile it (a constant integer, positive, a power of 2, a multiple of the pointer
    size), with its errors."""
    if alignment is None:
        return None
    if isinstance(alignment, bool) or not isinstance(alignment, int | np.integer):
        raise compat.RequireLiteralValue("alignment must be a constant integer")
    if alignment <= 0:
        raise ValueError("Alignment must be positive")
    if alignment & (alignment - 1):
        raise ValueError("Alignment must be a power of 2")
    if alignment % _POINTER_SIZE:
        raise ValueError(f"Alignment must be a multiple of {_POINTER_SIZE}")
    return int(alignment)


def natural_alignment(dtype: np.dtype) -> int:
    """What numba-cuda aligns a shared array to without ``alignment=``: its element's ABI
    alignment rounded up to a power of two (2 bytes for float16), not 16."""
    return 1 << (np.dtype(dtype).alignment - 1).bit_length()


def _aligned_empty(shape, dtype: np.dtype, alignment: int) -> np.ndarray:
    """An uninitialised array whose first byte sits on ``alignment`` and, below 16 bytes, on
    no larger power of two (``alignment=`` of ``cuda.shared.array`` and ``cuda.local.array``,
    or the element's own): a GPU guarantees no more, so a 16-byte vector access into an array
    declared without ``alignment=16`` faults here as it may there."""
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.empty(count * dtype.itemsize + 2 * max(alignment, 16), np.uint8)
    base = raw.__array_interface__["data"][0]
    start = -base % alignment
    if alignment < 16 and (base + start) % (2 * alignment) == 0:
        start += alignment
    flat = raw[start : start + count * dtype.itemsize].view(dtype)
    return own_allocation(flat).reshape(shape)  # its allocation ends where the array does


class _Local(compat.FakeCUDALocal):
    """``cuda.local``: numba-cuda's, with narrow integers typed as Numba types them and
    ``alignment=`` honoured as compiled code honours it (numba-cuda's simulator refuses it)."""

    def array(self, shape, dtype, alignment=None):
        constant_shapes.check(sys._getframe(1), "cuda.local.array")
        alignment = _checked_alignment(alignment)
        if alignment is None:
            return ints.typed_view(super().array(shape, dtype))
        return ints.typed_view(_aligned_empty(shape, _numpy_dtype(dtype), alignment))


class _Const:
    """``cuda.const``: the array itself, with narrow integers typed as Numba types them."""

    def array_like(self, ary):
        return ints.typed_view(ary) if isinstance(ary, np.ndarray) else ary


class _Atomic(compat.FakeCUDAAtomic):
    """Atomics are never races; under the profiler each counts one read and one write, and one
    on global memory may release or acquire other accesses (:mod:`.global_races`)."""

    def __init__(self, launch):
        super().__init__()
        self._launch = launch

    def __getattribute__(self, name):
        attr = super().__getattribute__(name)
        if name.startswith("_") or not callable(attr):
            return attr

        def atomic(array, *args):
            t = getcurrent()
            simulated = isinstance(t, SimThread)
            if simulated:
                t.in_atomic = True
            try:
                if isinstance(array, TrackedArray):
                    index = (0,) * array.ndim if name == "compare_and_swap" else args[0]
                    if not array.atomic_access(index):
                        return array.dtype.type(0)  # out of bounds: reported, not done
                    races = self._launch.profile.global_accesses
                    if races is not None and not array._space.shared:
                        races.atomic()
                    array = array._a
                return attr(array, *args)
            finally:
                if simulated:
                    t.in_atomic = False

        return atomic


class _GridGroup:
    def __init__(self, launch):
        self._launch = launch

    def sync(self):
        if int(np.prod(self._launch.grid_dim)) != 1:
            raise SimulationError("grid.sync() in the simulator needs a grid of one block")
        block_on("syncthreads")


class _CooperativeGroups:
    def __init__(self, launch):
        self._launch = launch

    def this_grid(self):
        return _GridGroup(self._launch)


class WarpAwareModule(compat.FakeCUDAModule):
    """The ``cuda`` module seen by kernels: numba-cuda's, plus warp operations."""

    def __init__(self, launch):
        super().__init__(launch.grid_dim, launch.block_dim, launch.dynshared_size)
        self._launch = launch
        self._shared = _Shared()
        self._local = _Local()
        self._const = _Const()
        self._atomic = _Atomic(launch)
        self._cg = _CooperativeGroups(launch)

    def __getattr__(self, name):
        # Reached for names a kernel's ``cuda`` lacks. While a launch runs, ``cuda`` in the
        # modules of its functions is this object, also for host code of other threads there:
        # they get numba-cuda's (cuda.jit, cuda.to_device...); a kernel gets an AttributeError.
        if isinstance(getcurrent(), SimThread):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(numba_cuda, name)

    # Thread identity, from the running greenlet.
    @property
    def threadIdx(self):
        return getcurrent().threadIdx

    @property
    def blockIdx(self):
        return getcurrent().blockIdx

    @property
    def laneid(self):
        return getcurrent().lane

    @property
    def warpsize(self):
        return WARP_SIZE

    def grid(self, n):
        t = getcurrent()
        b, i, d = t.blockIdx, t.threadIdx, self.blockDim
        x = b.x * d.x + i.x
        if n == 1:
            return x
        y = b.y * d.y + i.y
        if n == 2:
            return (x, y)
        if n == 3:
            return (x, y, b.z * d.z + i.z)
        raise RuntimeError(f"Global ID has 1-3 dimensions. {n} requested")

    # Barriers.
    def syncthreads(self):
        block_on("syncthreads")

    # Fences order a thread's global accesses before its later atomics (the profiler reads them).
    def threadfence(self):
        races = self._launch.profile.global_accesses if self._launch.profile else None
        if races is not None:
            races.fence()

    threadfence_system = threadfence

    def syncthreads_count(self, value):
        return block_on("syncthreads", 0, ("count", value))

    def syncthreads_and(self, value):
        return block_on("syncthreads", 0, ("and", value))

    def syncthreads_or(self, value):
        return block_on("syncthreads", 0, ("or", value))

    def syncwarp(self, mask=FULL_MASK):
        block_on("syncwarp", mask)

    # Warp operations.
    def shfl_sync(self, mask, value, src_lane):
        return block_on("shfl_sync", mask, (value, src_lane))

    def shfl_up_sync(self, mask, value, delta):
        return block_on("shfl_up_sync", mask, (value, delta))

    def shfl_down_sync(self, mask, value, delta):
        return block_on("shfl_down_sync", mask, (value, delta))

    def shfl_xor_sync(self, mask, value, lane_mask):
        return block_on("shfl_xor_sync", mask, (value, lane_mask))

    def all_sync(self, mask, predicate):
        return block_on("all_sync", mask, predicate)

    def any_sync(self, mask, predicate):
        return block_on("any_sync", mask, predicate)

    def eq_sync(self, mask, predicate):
        return block_on("eq_sync", mask, predicate)

    def ballot_sync(self, mask, predicate):
        return block_on("ballot_sync", mask, predicate)

    def match_any_sync(self, mask, value):
        return block_on("match_any_sync", mask, value)

    def match_all_sync(self, mask, value):
        return block_on("match_all_sync", mask, value)

    def activemask(self):
        """Lanes of this warp that reached this same call site (the converged lanes)."""
        return block_on("activemask")

    def lanemask_lt(self):
        return lanes_bits(range(getcurrent().lane))

    # Bit operations in the operand's own width (numba-cuda's simulator formats a negative
    # value with a minus sign, so popc of a ballot with lane 31 set was wrong).
    popc = staticmethod(ints.popc)
    clz = staticmethod(ints.clz)
    ffs = staticmethod(ints.ffs)
    brev = staticmethod(ints.brev)
