"""The launch path of the warp-aware simulator.

numba-cuda's simulator runs every CUDA thread as an OS thread and busy-polls them. Here a block's
threads are greenlets run by one scheduler in the calling thread: a thread runs until it reaches
a barrier, a warp operation or its end, then hands control back. When no thread can run, the
scheduler completes the warp operations whose lanes have all arrived (the lanes of the mask that
have not exited, as PTX defines it), else releases the barrier when every live thread waits at
it, else reports a deadlock naming the lanes and source lines.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import struct
import sys
import threading
from collections import deque
from collections.abc import Callable
from contextlib import ExitStack

import numpy as np
from greenlet import getcurrent, greenlet
from numba import cuda as numba_cuda
from numba.cuda import types

from . import compat, cuda_math, device_arrays, ints
from ._base import SimulationError, format_site, user_site
from .profiler import Profile, TrackedArray, active, own_allocation
from .warp_ops import (
    FULL_MASK,
    SHUFFLE_MODES,
    WARP_SIZE,
    lane_ranges,
    lanes_bits,
    lanes_of,
    match_all,
    match_any,
    shuffle,
    vote,
)

_strict = False  # strict_masks(): a mask naming exited or absent lanes is an error
# Warp collectives of ``.sync.aligned`` instructions that intrinsic twins define (ldmatrix,
# mma.sync): kind -> compute(args by lane) -> results by lane.
_ALIGNED: dict[str, Callable[[dict], dict]] = {}


def register_aligned(kind: str, compute: Callable[[dict], dict]) -> None:
    """Define the ``.sync.aligned`` warp collective ``kind``.

    ``compute`` is a pure function of the 32 lanes' arguments (a dict lane -> argument) that
    returns each lane's result. :func:`aligned_collective` waits for every lane of the warp at
    the same call site (the PTX ISA's ``.aligned``: all threads of the warp execute the same
    instruction, convergently); a warp with absent or exited lanes, or whose lanes wait at
    another aligned instruction or at a barrier meanwhile, raises :class:`SimulationError`,
    since the hardware's result is undefined there.
    """
    _ALIGNED[kind] = compute


def aligned_collective(kind: str, arg):
    """Arrive at the ``.sync.aligned`` warp collective ``kind`` with this lane's ``arg``;
    returns this lane's result once all 32 lanes have arrived (see :func:`register_aligned`)."""
    if kind not in _ALIGNED:
        raise SimulationError(f"unknown warp collective {kind!r}: register it first")
    return block_on(kind, FULL_MASK, arg)


@contextlib.contextmanager
def strict_masks(enabled: bool = True):
    """Inside, a warp operation whose mask names lanes that exited or do not exist raises
    :class:`SimulationError` instead of leaving them out as PTX does (opt-in: such a mask is
    legal, but usually a bug)."""
    global _strict
    saved, _strict = _strict, bool(enabled)
    try:
        yield
    finally:
        _strict = saved


class Dim3(compat.Dim3):
    __slots__ = ()


class Wait:
    """What a blocked thread waits for: a barrier or a warp operation."""

    __slots__ = ("kind", "mask", "arg", "site")

    def __init__(self, kind, mask, arg, site):
        self.kind, self.mask, self.arg, self.site = kind, mask, arg, site


class SimThread(greenlet):
    """One simulated CUDA thread."""

    def __init__(self, run, block: BlockRun, tid: int, thread_idx, block_idx):
        super().__init__(run)
        self.block = block
        self.tid = tid
        self.warp, self.lane = divmod(tid, WARP_SIZE)
        self.threadIdx = Dim3(*thread_idx)
        self.blockIdx = Dim3(*block_idx)
        self.wait: Wait | None = None
        self.state: dict = {}  # per-thread scratch for intrinsic twins (e.g. cp.async groups)
        self.in_atomic = False


def current_thread() -> SimThread:
    """The simulated thread running now (for intrinsic twins)."""
    t = getcurrent()
    if not isinstance(t, SimThread):
        raise SimulationError("not inside a kernel running in tessera_tile's simulator")
    return t


def block_on(kind: str, mask: int = 0, arg=None):
    """Suspend the current thread at a barrier or warp operation; returns its result."""
    t = current_thread()
    t.wait = Wait(kind, int(mask) & FULL_MASK, arg, user_site(3))
    return t.parent.switch()


def in_shared_memory(array) -> bool:
    """Whether ``array`` (a view of) lies in the running block's shared memory (for twins of
    instructions that take only shared addresses, such as ``ldmatrix``)."""
    a = array._a if isinstance(array, TrackedArray) else array
    if not isinstance(a, np.ndarray):
        return False
    start = a.__array_interface__["data"][0]
    block = current_thread().block
    for region in (*block.shared.values(), block.dynshared):
        lo = region.__array_interface__["data"][0]
        if lo <= start < lo + region.nbytes:
            return True
    return False


def _prefix_thread_position(error: Exception, t: SimThread) -> None:
    """Start ``error``'s message with the raising thread's position, as numba-cuda does for a
    kernel exception (``tid=[z, y, x] ctaid=[z, y, x]: message``, z first as its dispatcher
    prints it); a bare ``raise E`` gets the position alone."""
    prefix = f"tid={list(t.threadIdx)[::-1]} ctaid={list(t.blockIdx)[::-1]}"
    args = error.args
    error.args = (f"{prefix}: {args[0]}", *args[1:]) if args else (prefix,)


class BlockRun:
    """Runs one thread block to completion."""

    def __init__(self, launch: Launch, block_idx: tuple[int, ...]):
        self.launch = launch
        self.block_idx = block_idx
        bx, by, bz = launch.block_dim
        self.nthreads = bx * by * bz
        self.shared: dict = {}
        self.dynshared = np.full(launch.dynshared_size, 0xFF, dtype=np.uint8)
        self.barrier_epoch = 0
        self.warp_epoch = [0] * (-(-self.nthreads // WARP_SIZE))
        self.recorder = launch.profile.block_recorder(self) if launch.profile else None
        target = launch.target
        self.threads = [
            SimThread(target, self, x + bx * (y + by * z), (x, y, z), block_idx)
            for z in range(bz)
            for y in range(by)
            for x in range(bx)
        ]
        for t in self.threads:  # the launcher's context (numpy.errstate, ...) holds inside
            t.gr_context = contextvars.copy_context()

    def run(self) -> None:
        runnable = deque((t, ()) for t in self.threads)  # () starts a thread
        while True:
            while runnable:
                t, resume = runnable.popleft()
                try:
                    t.switch(*resume)
                except BaseException as e:
                    if isinstance(e, Exception):
                        _prefix_thread_position(e, t)
                    e.add_note(
                        f"in simulated thread threadIdx={tuple(t.threadIdx)} "
                        f"blockIdx={tuple(t.blockIdx)}"
                    )
                    raise
            live = [t for t in self.threads if not t.dead]
            if not live:
                break
            if self._resolve_warp_operations(live, runnable):
                continue
            if all(t.wait.kind == "syncthreads" for t in live):
                self._release_barrier(live, runnable)
                continue
            raise SimulationError("deadlock: " + self._describe_waits(live))
        if self.recorder:
            self.recorder.finish()

    def _release_barrier(self, live, runnable) -> None:
        values = [t.wait.arg[1] for t in live if t.wait.arg is not None]
        for t in live:
            op = t.wait.arg[0] if t.wait.arg else None
            if op == "count":
                result = int(np.count_nonzero(values))
            elif op == "and":
                result = int(all(values))
            elif op == "or":
                result = int(any(values))
            else:
                result = None
            t.wait = None
            runnable.append((t, (result,)))
        self.barrier_epoch += 1

    def _resolve_warp_operations(self, live, runnable) -> bool:
        by_warp: dict[int, dict[int, SimThread]] = {}
        for t in live:
            if t.wait.kind != "syncthreads":
                by_warp.setdefault(t.warp, {})[t.lane] = t
        progressed = False
        for warp, waiting in by_warp.items():
            for lane in sorted(waiting):
                t = waiting[lane]
                if t.wait is None:
                    continue  # resolved with an earlier lane of this round
                group = self._ready_group(warp, t, waiting)
                if group is None:
                    continue
                results = self._compute(t.wait, group)
                for g in group.values():
                    g.wait = None
                    runnable.append((g, (results[g.lane],)))
                self.warp_epoch[warp] += 1
                progressed = True
        return progressed

    def _ready_group(self, warp: int, t: SimThread, waiting: dict) -> dict | None:
        """The lanes taking part in ``t``'s warp operation, once all of them have arrived.

        PTX (shfl.sync, vote.sync, match.sync, bar.warp.sync) waits only for the non-exited
        threads the mask names: lanes that exited, or that do not exist in a partial warp, are
        left out (an error under :func:`strict_masks`).
        """
        w = t.wait
        if w.kind in _ALIGNED:
            return self._aligned_group(warp, w)
        if w.kind == "activemask":
            return {
                lane: u
                for lane, u in waiting.items()
                if u.wait is not None and u.wait.kind == "activemask" and u.wait.site == w.site
            }
        if not (w.mask >> t.lane) & 1:
            raise SimulationError(
                f"{self._where(warp, w)}: lane {t.lane} calls it with a mask that excludes itself"
            )
        base = warp * WARP_SIZE
        lanes = lanes_of(w.mask)
        if _strict:
            self._check_strict(warp, w, lanes)
        group = {}
        for lane in lanes:
            if base + lane >= self.nthreads or self.threads[base + lane].dead:
                continue
            u = waiting.get(lane)
            if u is None or u.wait is None or u.wait.kind != w.kind or u.wait.mask != w.mask:
                return None
            group[lane] = u
        return group

    def _aligned_group(self, warp: int, w: Wait) -> dict | None:
        """All 32 lanes of ``warp`` once they wait at ``w``'s instruction; an error when they
        cannot all get there convergently (called only when no thread can run)."""
        base = warp * WARP_SIZE
        where = f"{w.kind} at {format_site(w.site)} (warp {warp})"
        present = min(WARP_SIZE, self.nthreads - base)
        if present < WARP_SIZE:
            raise SimulationError(
                f"{where}: a .sync.aligned instruction needs all 32 lanes of the warp; this warp "
                f"has {present} (a block of {self.nthreads} threads)"
            )
        lanes = self.threads[base : base + WARP_SIZE]
        exited = [u.lane for u in lanes if u.dead]
        if exited:
            raise SimulationError(
                f"{where}: lanes {lane_ranges(exited)} exited without executing it; a "
                ".sync.aligned instruction must be executed by all 32 lanes of the warp"
            )
        group = {}
        for u in lanes:
            v = u.wait
            if v is None:
                return None  # resolved this round: it will run, then come back
            if v.kind == w.kind and v.site == w.site:
                group[u.lane] = u
            elif v.kind == "syncthreads" or v.kind in _ALIGNED:
                here = [x.lane for x in lanes if x.wait is not None and x.wait.site == w.site]
                raise SimulationError(
                    f"{where}: divergent warp: lanes {lane_ranges(here)} wait here while lane "
                    f"{u.lane} waits in {v.kind} at {format_site(v.site)}; a .sync.aligned "
                    "instruction must be executed by all 32 lanes of the warp convergently"
                )
            else:
                return None  # another warp operation may still release this lane
        return group

    def _where(self, warp: int, w: Wait) -> str:
        return f"{w.kind} at {format_site(w.site)} (warp {warp}, mask 0x{w.mask:08x})"

    def _check_strict(self, warp: int, w: Wait, lanes: list[int]) -> None:
        base = warp * WARP_SIZE
        absent = [lane for lane in lanes if base + lane >= self.nthreads]
        if absent:
            raise SimulationError(
                f"{self._where(warp, w)}: the mask names lanes {lane_ranges(absent)} that do not "
                f"exist (this warp has {self.nthreads - base} lanes; strict_masks is on)"
            )
        exited = [lane for lane in lanes if self.threads[base + lane].dead]
        if exited:
            raise SimulationError(
                f"{self._where(warp, w)}: the mask names lanes {lane_ranges(exited)} that exited "
                "(strict_masks is on)"
            )

    def _compute(self, w: Wait, group: dict) -> dict:
        kind = w.kind
        args = {lane: u.wait.arg for lane, u in group.items()}
        if kind in SHUFFLE_MODES:
            results, undefined = shuffle(kind, args, w.mask)
            if undefined and self.launch.profile:
                self.launch.profile.note_undefined_shuffle(kind, w.site, undefined)
            return results
        if kind in ("all_sync", "any_sync", "eq_sync", "ballot_sync"):
            return vote(kind, args, w.mask)
        if kind == "match_any_sync":
            return match_any(args)
        if kind == "match_all_sync":
            return match_all(args)
        if kind in _ALIGNED:
            return _ALIGNED[kind](args)
        if kind == "activemask":
            return dict.fromkeys(group, lanes_bits(group))
        return dict.fromkeys(group)  # syncwarp

    def _describe_waits(self, live) -> str:
        groups: dict = {}
        for t in live:
            groups.setdefault((t.wait.kind, t.wait.site, t.warp), []).append(t.lane)
        parts = [
            f"warp {warp} lanes {lane_ranges(lanes)} wait in {kind} at {format_site(site)}"
            for (kind, site, warp), lanes in sorted(groups.items(), key=lambda kv: kv[0][2])
        ]
        return "; ".join(parts) + f" (block {tuple(self.block_idx)})"


class Launch:
    """One kernel launch: the fake ``cuda`` module, arguments and blocks."""

    def __init__(self, kernel, args):
        self.grid_dim, self.block_dim = compat.normalize_kernel_dimensions(
            kernel.grid_dim, kernel.block_dim
        )
        self.dynshared_size = kernel.dynshared_size
        self.kernel = kernel
        self.profile: Profile | None = active()
        self.module = WarpAwareModule(self)
        self.swaps = ExitStack()
        self.swapped: set[int] = set()
        self.retr: list = []
        argtypes, _ = _declared_types(kernel, len(args))
        self.args = [self._device_arg(a) for a in map(ints.as_declared, args, argtypes)]
        if self.profile:
            self.args = self.profile.wrap_args(kernel.fn, self.args)
        fn, kargs = kernel.fn, self.args
        self.target = lambda: fn(*kargs)

    def _device_arg(self, arg):
        _, arg = functools.reduce(
            lambda ty_val, ext: ext.prepare_args(*ty_val, stream=0, retr=self.retr),
            self.kernel.extensions,
            (None, arg),
        )
        if isinstance(arg, np.ndarray) and arg.ndim > 0 and arg.dtype.fields is None:
            flags = arg.flags
            if not (flags.c_contiguous or flags.f_contiguous):
                # A GPU launch copies a host array as one block and refuses a strided view
                # (broadcast views pass): the same check, the same ValueError.
                compat.sentry_contiguous(arg)
            # Run on the array itself (no copy), seen as an allocation of its own, as its device
            # copy would be: a vector access past its end is out of bounds even where the
            # NumPy array it is a view of goes on.
            return ints.typed_view(own_allocation(arg))
        if isinstance(arg, compat.ArgHint):
            arg = arg.to_device(self.retr)
        if isinstance(arg, compat.FakeCUDAArray) and arg._ary.dtype.fields is None:
            return ints.typed_view(arg._ary)  # device arrays and their views: any strides
        if isinstance(arg, np.ndarray) and arg.ndim > 0:
            arg = compat.InOut(arg).to_device(self.retr)
        elif isinstance(arg, np.void):
            arg = compat.FakeCUDAArray(arg)
        if isinstance(arg, compat.FakeCUDAArray):
            return compat.FakeWithinKernelCUDAArray(arg)
        return ints.narrow(arg)  # an int32 scalar argument computes as Numba types it

    def swap_module_of(self, fn) -> None:
        """Point ``cuda`` in ``fn``'s module at the fake module, and ``math`` at CUDA's
        (:mod:`.cuda_math`), for the rest of the launch."""
        gid = id(fn.__globals__)
        if gid not in self.swapped:
            self.swapped.add(gid)
            self.swaps.enter_context(compat.swapped_cuda_module(fn, self.module))
            self.swaps.enter_context(cuda_math.swapped_math(fn))

    def run(self) -> None:
        with compat._push_kernel_context(self.module), self.swaps, self._error_model():
            self.swap_module_of(self.kernel.fn)
            for block_idx in np.ndindex(*self.grid_dim):
                BlockRun(self, block_idx).run()
        for write_back in self.retr:
            write_back()
        if self.profile:
            self.profile.launches += 1

    def _error_model(self):
        """``debug=True`` kernels stop at a division by zero with ``FloatingPointError``, as
        numba-cuda's simulator documents (compiled, they raise ``ZeroDivisionError``)."""
        if self.kernel._debug:
            return np.errstate(divide="raise")  # the block's threads copy this context
        return contextlib.nullcontext()


class _Shared:
    """``cuda.shared``: one array per call site and block, filled with 0xFF bytes.

    Unlike numba-cuda's, two arrays declared on one source line do not alias, and every block
    gets fresh memory whose bytes read as NaN / -1 until written.
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
                arr = _aligned_empty(shape, dtype, alignment or 16)
                arr.view(np.uint8).fill(0xFF)
                arr = block.shared[key] = ints.typed_view(arr)
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


def _aligned_empty(shape, dtype: np.dtype, alignment: int) -> np.ndarray:
    """An uninitialised array whose first byte sits on ``alignment`` (``alignment=`` of
    ``cuda.shared.array`` and ``cuda.local.array``; shared arrays take 16 by default, enough
    for 16-byte vector accesses)."""
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.empty(count * dtype.itemsize + alignment, np.uint8)
    start = -raw.__array_interface__["data"][0] % alignment
    flat = raw[start : start + count * dtype.itemsize].view(dtype)
    return own_allocation(flat).reshape(shape)  # its allocation ends where the array does


class _Local(compat.FakeCUDALocal):
    """``cuda.local``: numba-cuda's, with narrow integers typed as Numba types them and
    ``alignment=`` honoured as compiled code honours it (numba-cuda's simulator refuses it)."""

    def array(self, shape, dtype, alignment=None):
        alignment = _checked_alignment(alignment)
        if alignment is None:
            return ints.typed_view(super().array(shape, dtype))
        return ints.typed_view(_aligned_empty(shape, _numpy_dtype(dtype), alignment))


class _Const:
    """``cuda.const``: the array itself, with narrow integers typed as Numba types them."""

    def array_like(self, ary):
        return ints.typed_view(ary) if isinstance(ary, np.ndarray) else ary


class _Atomic(compat.FakeCUDAAtomic):
    """Atomics are never races; under the profiler each counts one read and one write."""

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
                    array = array._a
                return attr(array, *args)
            finally:
                if simulated:
                    t.in_atomic = False

        return atomic


class _GridGroup:
    def __init__(self, launch: Launch):
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

    def __init__(self, launch: Launch):
        super().__init__(launch.grid_dim, launch.block_dim, launch.dynshared_size)
        self._launch = launch
        self._shared = _Shared()
        self._local = _Local()
        self._const = _Const()
        self._atomic = _Atomic()
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


_stock_call = compat.FakeCUDAKernel.__call__
_stock_jit = compat.JIT_MODULES[-1].jit
_SIGNATURE = "_tessera_signature"  # (argument types, return type) of an explicit signature
# Launches from several host threads run one after the other, as on one stream. Reentrant so
# that a launch made while launching fails with numba-cuda's error instead of hanging.
_launch_lock = threading.RLock()


def _call(self, *args):
    """Replacement for ``FakeCUDAKernel.__call__``: launches go through :class:`Launch`."""
    t = getcurrent()
    if isinstance(t, SimThread):  # called by a running kernel: a device function
        t.block.launch.swap_module_of(self.fn)
        argtypes, restype = _declared_types(self, len(args))
        result = self.fn(*map(ints.as_declared, args, argtypes))
        return ints.as_declared(result, restype)
    if self._device:
        return _stock_call(self, *args)
    with _launch_lock:
        Launch(self, args).run()


def _declared_types(kernel, nargs: int) -> tuple:
    """``(argument types, return type)`` of ``kernel``'s explicit signature, else ``None`` for
    each."""
    signature = getattr(kernel, _SIGNATURE, None)
    if signature is None or len(signature[0]) != nargs:
        return (None,) * nargs, None  # a wrong count fails at the call, with Python's TypeError
    return signature


# Options of numba-cuda's ``cuda.jit`` that change only the compiled code: its simulator's
# ``jit`` refuses them (a TypeError for code a GPU compiles), so they are dropped here.
_CODE_ONLY_OPTIONS = ("lineinfo", "launch_bounds", "forceinline", "lto", "max_registers")


def _jit(func_or_sig=None, *args, **kwargs):
    """numba-cuda's simulated ``cuda.jit``, keeping an explicit signature on the kernel (a GPU
    converts scalar arguments to the types it declares; numba-cuda's simulator drops it)."""
    for option in _CODE_ONLY_OPTIONS:
        kwargs.pop(option, None)
    made = _stock_jit(func_or_sig, *args, **kwargs)
    signature = _one_signature(func_or_sig)
    if signature is None:
        return made

    def decorate(fn):
        kernel = made(fn)
        setattr(kernel, _SIGNATURE, signature)
        return kernel

    return decorate


def _one_signature(func_or_sig) -> tuple | None:
    """``(argument types, return type)`` of a single explicit signature, else ``None`` (with
    several, the GPU picks one by the arguments' types: left to Python's typing here)."""
    if isinstance(func_or_sig, list) and len(func_or_sig) == 1:
        func_or_sig = func_or_sig[0]
    if isinstance(func_or_sig, list) or not compat.is_signature(func_or_sig):
        return None
    return compat.normalize_signature(func_or_sig)


_stock_configure = compat.FakeCUDAKernel.__getitem__


def _configure(self, configuration):
    """``kernel[grid, block, ...]``: a configured copy, as numba-cuda makes a launch
    configuration of its own on a GPU. The stock fake sets the grid on the kernel itself, so
    two threads configuring one kernel at once launched each other's grids."""
    return _stock_configure(copy.copy(self), configuration)


def patch() -> None:
    """Route simulated launches through :class:`Launch`."""
    compat.FakeCUDAKernel.__call__ = _call
    compat.FakeCUDAKernel.__getitem__ = _configure
    for module in compat.JIT_MODULES:
        module.jit = _jit
    device_arrays.patch()


def unpatch() -> None:
    """Give launches back to numba-cuda's simulator."""
    compat.FakeCUDAKernel.__call__ = _stock_call
    compat.FakeCUDAKernel.__getitem__ = _stock_configure
    for module in compat.JIT_MODULES:
        module.jit = _stock_jit
    device_arrays.unpatch()


def _skip(self, *args):
    return None


def skip_launches(skip: bool) -> None:
    """Launches return without running (``sim.launches_skipped``), or run again."""
    compat.FakeCUDAKernel.__call__ = _skip if skip else _call


def patched() -> bool:
    """Whether launches go through :class:`Launch`."""
    return compat.FakeCUDAKernel.__call__ in (_call, _skip)
