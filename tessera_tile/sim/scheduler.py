"""How one thread block runs in the simulator: its threads, barriers and warp operations.

numba-cuda's simulator runs every CUDA thread as an OS thread and busy-polls them. Here a block's
threads are greenlets run by one scheduler in the calling thread: a thread runs until it reaches
a barrier, a warp operation or its end, then hands control back. When no thread can run, the
scheduler completes the warp operations whose lanes have all arrived (the lanes of the mask that
have not exited, as PTX defines it), else releases the barrier when every live thread waits at
it, else reports a deadlock naming the lanes and source lines.

It also holds what twins call from a running thread (:func:`current_thread`, the
``.sync.aligned`` collectives, :func:`in_shared_memory`). A launch (:mod:`.engine`) runs its
blocks here one after another.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import deque
from collections.abc import Callable

import numpy as np
from greenlet import getcurrent, greenlet

from .._runtime import compat
from ._base import SimulationError, format_site, user_site
from .tracked_arrays import TrackedArray
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

UNTIL = "until"  # a wait on a condition (block_until)
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


def block_until(ready: Callable[[bool], bool], what: str) -> None:
    """Suspend the current thread until ``ready(force)`` holds (for twins of waits on memory
    that other threads change, such as ``mbarrier`` phases). ``ready(False)`` must only look;
    the scheduler asks it whenever no thread can run. When it holds for no waiting thread, each
    waiting thread is resumed once to ask ``ready(True)``, in its own context: the moment a
    twin may do what it deferred (land async copies), the latest a GPU would do it. ``what``
    names the wait in a deadlock report."""
    if ready(False):
        return
    t = current_thread()
    site = user_site(3)
    while True:
        t.wait = Wait(UNTIL, 0, (ready, what), site)
        if ready(bool(t.parent.switch())):
            t.block.forced.clear()  # progress: every waiting thread may be forced again
            return
        t.block.forced.add(t.tid)


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

    def __init__(self, launch, block_idx: tuple[int, ...]):
        self.launch = launch
        self.block_idx = block_idx
        bx, by, bz = launch.block_dim
        self.nthreads = bx * by * bz
        self.shared: dict = {}
        self.state: dict = {}  # per-block scratch for intrinsic twins (e.g. mbarriers)
        self.forced: set = set()  # threads whose forced condition failed since the last progress
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
                self.forced.clear()
                continue
            if self._resolve_conditions(live, runnable):
                continue
            if all(t.wait.kind == "syncthreads" for t in live):
                self._release_barrier(live, runnable)
                self.forced.clear()
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
            if t.wait.kind not in ("syncthreads", UNTIL):
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

    def _resolve_conditions(self, live, runnable) -> bool:
        """Resume the threads whose condition holds; else force, once each since the last
        progress, those still waiting (see :func:`block_until`)."""
        waiting = [t for t in live if t.wait is not None and t.wait.kind == UNTIL]
        ready = [t for t in waiting if t.wait.arg[0](False)]
        if ready:
            self.forced.clear()
        resumed = ready or [t for t in waiting if t.tid not in self.forced]
        for t in resumed:
            t.wait = None
            runnable.append((t, (not ready,)))  # not ready: forced
        return bool(resumed)

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
            kind = t.wait.arg[1] if t.wait.kind == UNTIL else t.wait.kind
            groups.setdefault((kind, t.wait.site, t.warp), []).append(t.lane)
        parts = [
            f"warp {warp} lanes {lane_ranges(lanes)} wait in {kind} at {format_site(site)}"
            for (kind, site, warp), lanes in sorted(groups.items(), key=lambda kv: kv[0][2])
        ]
        return "; ".join(parts) + f" (block {tuple(self.block_idx)})"
