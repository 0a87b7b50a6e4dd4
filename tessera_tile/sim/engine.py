"""The launch path of the warp-aware simulator.

numba-cuda's simulator runs every CUDA thread as an OS thread and busy-polls them. Here a block's
threads are greenlets run by one scheduler in the calling thread: a thread runs until it reaches
a barrier, a warp operation or its end, then hands control back. When no thread can run, the
scheduler completes the warp operations whose lanes have all arrived, else releases the barrier
when every live thread waits at it, else reports a deadlock naming the lanes and source lines.
"""

from __future__ import annotations

import contextvars
import functools
import sys
from collections import deque
from contextlib import ExitStack
from pathlib import Path

import numpy as np
from greenlet import getcurrent, greenlet
from numba.cuda.simulator import kernel as stock_kernel
from numba.cuda.simulator import kernelapi as stock_api
from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

from . import profiler, warp_ops
from .warp_ops import FULL_MASK, WARP_SIZE, lane_ranges, lanes_of

_SIM_DIR = str(Path(__file__).resolve().parent)
_transparent_code: set = set()  # code objects of twins: accesses inside them belong to the caller


class SimulationError(RuntimeError):
    """A kernel did something that has no defined meaning on a GPU (bad mask, deadlock...)."""


def user_site(depth: int = 2) -> tuple[str, int]:
    """(file, line) of the nearest frame outside the simulator and registered twins."""
    frame = sys._getframe(depth)
    while frame is not None and (
        frame.f_code.co_filename.startswith(_SIM_DIR) or frame.f_code in _transparent_code
    ):
        frame = frame.f_back
    if frame is None:
        return ("<unknown>", 0)
    return (frame.f_code.co_filename, frame.f_lineno)


def format_site(site: tuple[str, int]) -> str:
    return f"{Path(site[0]).name}:{site[1]}"


class Dim3(stock_api.Dim3):
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
        w = t.wait
        if w.kind == "activemask":
            return {
                lane: u
                for lane, u in waiting.items()
                if u.wait is not None and u.wait.kind == "activemask" and u.wait.site == w.site
            }
        where = f"{w.kind} at {format_site(w.site)} (warp {warp}, mask 0x{w.mask:08x})"
        if not (w.mask >> t.lane) & 1:
            raise SimulationError(
                f"{where}: lane {t.lane} calls it with a mask that excludes itself"
            )
        lanes = lanes_of(w.mask)
        base = warp * WARP_SIZE
        absent = [lane for lane in lanes if base + lane >= self.nthreads]
        if absent:
            raise SimulationError(
                f"{where}: the mask names lanes {lane_ranges(absent)} that do not exist "
                f"(this warp has {self.nthreads - base} lanes)"
            )
        exited = [lane for lane in lanes if self.threads[base + lane].dead]
        if exited:
            raise SimulationError(
                f"{where}: the mask names lanes {lane_ranges(exited)} that exited"
            )
        group = {}
        for lane in lanes:
            u = waiting.get(lane)
            if u is None or u.wait is None or u.wait.kind != w.kind or u.wait.mask != w.mask:
                return None
            group[lane] = u
        return group

    @staticmethod
    def _compute(w: Wait, group: dict) -> dict:
        kind = w.kind
        args = {lane: u.wait.arg for lane, u in group.items()}
        if kind in warp_ops.SHUFFLE_MODES:
            return warp_ops.shuffle(kind, args, w.mask)
        if kind in ("all_sync", "any_sync", "eq_sync", "ballot_sync"):
            return warp_ops.vote(kind, args, w.mask)
        if kind == "match_any_sync":
            return warp_ops.match_any(args)
        if kind == "match_all_sync":
            return warp_ops.match_all(args, w.mask)
        if kind == "activemask":
            bits = sum(1 << lane for lane in group)
            return dict.fromkeys(group, np.uint32(bits))
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
        from numba.cuda.errors import normalize_kernel_dimensions

        self.grid_dim, self.block_dim = normalize_kernel_dimensions(
            kernel.grid_dim, kernel.block_dim
        )
        self.dynshared_size = kernel.dynshared_size
        self.kernel = kernel
        self.profile = profiler.active()
        self.module = WarpAwareModule(self)
        self.swaps = ExitStack()
        self.swapped: set[int] = set()
        self.retr: list = []
        self.args = [self._device_arg(a) for a in args]
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
            return arg  # run on the array itself: no copy, no wrapper on every access
        if isinstance(arg, stock_kernel.ArgHint):
            arg = arg.to_device(self.retr)
        if isinstance(arg, FakeCUDAArray) and arg._ary.dtype.fields is None:
            return arg._ary
        if isinstance(arg, np.ndarray) and arg.ndim > 0:
            arg = stock_kernel.InOut(arg).to_device(self.retr)
        elif isinstance(arg, np.void):
            arg = FakeCUDAArray(arg)
        if isinstance(arg, FakeCUDAArray):
            return stock_kernel.FakeWithinKernelCUDAArray(arg)
        return arg

    def swap_module_of(self, fn) -> None:
        """Point ``cuda`` in ``fn``'s module at the fake module for the rest of the launch."""
        gid = id(fn.__globals__)
        if gid not in self.swapped:
            self.swapped.add(gid)
            self.swaps.enter_context(stock_api.swapped_cuda_module(fn, self.module))

    def run(self) -> None:
        with stock_kernel._push_kernel_context(self.module), self.swaps:
            self.swap_module_of(self.kernel.fn)
            for block_idx in np.ndindex(*self.grid_dim):
                BlockRun(self, block_idx).run()
        for write_back in self.retr:
            write_back()
        if self.profile:
            self.profile.launches += 1


class _Shared:
    """``cuda.shared``: one array per call site and block, filled with 0xFF bytes.

    Unlike numba-cuda's, two arrays declared on one source line do not alias, and every block
    gets fresh memory whose bytes read as NaN / -1 until written.
    """

    def array(self, shape, dtype, alignment=None):
        from numba.cuda import types
        from numba.cuda.np import numpy_support

        t = current_thread()
        block = t.block
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        dtype = np.dtype(dtype)
        if shape == 0 or shape == (0,):
            count = block.dynshared.size // dtype.itemsize
            arr = np.frombuffer(block.dynshared.data, dtype=dtype, count=count)
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
                block.shared[key] = arr
        if block.recorder:
            return block.recorder.shared_array(key, arr)
        return arr


def _aligned_empty(shape, dtype: np.dtype, alignment: int) -> np.ndarray:
    """An uninitialised array whose first byte sits on ``alignment`` (``alignment=`` of
    ``cuda.shared.array``; 16 by default, enough for 16-byte vector accesses)."""
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.empty(count * dtype.itemsize + alignment, np.uint8)
    start = -raw.__array_interface__["data"][0] % alignment
    flat = raw[start : start + count * dtype.itemsize].view(dtype)
    return flat.reshape(shape)


class _Atomic(stock_api.FakeCUDAAtomic):
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
                if isinstance(array, profiler.TrackedArray):
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


class WarpAwareModule(stock_api.FakeCUDAModule):
    """The ``cuda`` module seen by kernels: numba-cuda's, plus warp operations."""

    def __init__(self, launch: Launch):
        super().__init__(launch.grid_dim, launch.block_dim, launch.dynshared_size)
        self._launch = launch
        self._shared = _Shared()
        self._atomic = _Atomic()
        self._cg = _CooperativeGroups(launch)

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
        return np.uint32((1 << getcurrent().lane) - 1)


_stock_call = stock_kernel.FakeCUDAKernel.__call__


def _call(self, *args):
    """Replacement for ``FakeCUDAKernel.__call__``: launches go through :class:`Launch`."""
    context = stock_kernel._get_kernel_context()
    if isinstance(context, WarpAwareModule):
        context._launch.swap_module_of(self.fn)
        return self.fn(*args)
    if self._device or context:
        return _stock_call(self, *args)
    Launch(self, args).run()


def patch() -> None:
    stock_kernel.FakeCUDAKernel.__call__ = _call


def unpatch() -> None:
    stock_kernel.FakeCUDAKernel.__call__ = _stock_call


def patched() -> bool:
    return stock_kernel.FakeCUDAKernel.__call__ is _call
