"""Opt-in instrumentation of simulated launches: global traffic, bank conflicts, races, bounds.

Inside ``with profile() as prof:`` kernel arguments and shared arrays are wrapped in
:class:`TrackedArray`, which counts every element access a thread makes and records where it
happened. Nothing is wrapped outside a profile, so unprofiled launches pay nothing.

Bank conflicts follow the hardware's model (:mod:`tessera_tile.banks`, the one the analytic
model of :mod:`tessera_tile.memory` uses): the k-th shared access of each lane of a warp (made at
the same source line) forms one warp-wide request; ``bank_conflicts`` counts its wavefronts
beyond the ideal (one per 128-byte phase).

A shared-memory race is two threads touching the same byte address, at least one writing, with
no ``syncthreads`` between them (and, within one warp, no warp operation between them).
Atomics are never races.
"""

from __future__ import annotations

import inspect as pyinspect
import io
from collections import Counter
from dataclasses import dataclass

import numpy as np
from greenlet import getcurrent

from ..banks import wavefronts
from ._base import SimulationError, format_site, user_site

_active: Profile | None = None


def active() -> Profile | None:
    return _active


@dataclass(frozen=True)
class Race:
    array: str
    kind: str  # "write-write", "write-read" (read after an unordered write), "read-write"
    first_thread: tuple
    first_line: str
    second_thread: tuple
    second_line: str

    def __str__(self) -> str:
        return (
            f"{self.kind} race on shared array {self.array}: thread {self.first_thread} at "
            f"{self.first_line} and thread {self.second_thread} at {self.second_line}"
        )


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


class Profile:
    """Totals over the launches made inside ``with tessera_tile.sim.profile() as prof:``."""

    MAX_REPORTS = 1000

    def __init__(self) -> None:
        self.launches = 0
        self.traffic: dict[tuple[str, str], list[int]] = {}  # (kernel, arg) -> [read, written]
        self.shared_requests = 0
        self.shared_wavefronts = 0
        self.bank_conflicts = 0
        self.conflict_lines: Counter = Counter()
        self.races: list[Race] = []
        self.out_of_bounds: list[OutOfBounds] = []
        # "shfl_down_sync at file.py:12" -> lanes that read a lane the mask names but that
        # exited or does not exist (legal PTX, undefined value: the simulator returns poison)
        self.undefined_shuffle_reads: Counter = Counter()
        self._race_keys: set = set()

    # totals -----------------------------------------------------------------------------
    @property
    def bytes_read(self) -> int:
        return sum(r for r, _ in self.traffic.values())

    @property
    def bytes_written(self) -> int:
        return sum(w for _, w in self.traffic.values())

    # context ----------------------------------------------------------------------------
    def __enter__(self) -> Profile:
        global _active
        if _active is not None:
            raise RuntimeError("a tessera_tile.sim.profile() is already active")
        _active = self
        return self

    def __exit__(self, *exc) -> None:
        global _active
        _active = None

    # hooks used by the engine -----------------------------------------------------------
    def wrap_args(self, fn, args: list) -> list:
        try:
            names = list(pyinspect.signature(fn).parameters)
        except (TypeError, ValueError):
            names = []
        out = []
        for i, a in enumerate(args):
            if isinstance(a, np.ndarray) and a.ndim > 0:
                name = names[i] if i < len(names) else f"arg{i}"
                counters = self.traffic.setdefault((fn.__name__, name), [0, 0])
                a = TrackedArray(a, _Space(self, name, a, counters=counters))
            out.append(a)
        return out

    def block_recorder(self, block) -> _BlockRecorder:
        return _BlockRecorder(self, block)

    def note_undefined_shuffle(self, kind: str, site, lanes: int) -> None:
        self.undefined_shuffle_reads[f"{kind} at {format_site(site)}"] += lanes

    def _add_race(self, race: Race) -> None:
        key = (race.array, race.kind, race.first_line, race.second_line)
        if key not in self._race_keys and len(self.races) < self.MAX_REPORTS:
            self._race_keys.add(key)
            self.races.append(race)

    # report -----------------------------------------------------------------------------
    def __str__(self) -> str:
        from rich import box
        from rich.console import Console
        from rich.table import Table

        buf = io.StringIO()
        console = Console(file=buf, width=110, color_system=None)
        console.print(f"tessera_tile simulator profile: {self.launches} launch(es)")
        table = Table(
            "kernel", "argument", "bytes read", "bytes written", title="global traffic",
            box=box.SIMPLE, title_justify="left",
        )  # fmt: skip
        for (kernel, arg), (r, w) in self.traffic.items():
            table.add_row(kernel, arg, str(r), str(w))
        table.add_row("total", "", str(self.bytes_read), str(self.bytes_written))
        console.print(table)
        console.print(
            f"shared memory: {self.shared_requests} warp-wide requests, "
            f"{self.shared_wavefronts} wavefronts, {self.bank_conflicts} bank conflicts "
            "(wavefronts beyond the ideal)"
        )
        for line, extra in self.conflict_lines.most_common(5):
            console.print(f"  {line}: {extra} extra wavefronts")
        console.print(f"races: {len(self.races)}")
        for race in self.races[:10]:
            console.print(f"  {race}")
        console.print(f"out-of-bounds accesses: {len(self.out_of_bounds)}")
        for oob in self.out_of_bounds[:10]:
            console.print(f"  {oob}")
        if self.undefined_shuffle_reads:
            console.print(
                f"undefined shuffle reads: {sum(self.undefined_shuffle_reads.values())} "
                "(from lanes the mask names that exited or do not exist)"
            )
            for where, lanes in self.undefined_shuffle_reads.most_common(5):
                console.print(f"  {where}: {lanes} lane(s)")
        return buf.getvalue().rstrip()


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


class _BlockRecorder:
    """Shared-memory accesses of one block: bank conflicts and races."""

    def __init__(self, profile: Profile, block):
        self.profile = profile
        self.block = block
        self.sequences: dict[int, list] = {}  # tid -> [(site, key, first_offset, width)]
        self.last_write: dict = {}  # (key, byte) -> access record
        self.reads: dict = {}  # (key, byte) -> {tid: access record}
        self.spaces: dict = {}

    def shared_array(self, key, arr: np.ndarray) -> TrackedArray:
        space = self.spaces.get(key)
        if space is None:
            name = (
                "dynamic" if isinstance(key[0], str) else format_site((key[0].co_filename, key[1]))
            )
            space = _Space(self.profile, name, arr, recorder=self, key=key)
            self.spaces[key] = space
        return TrackedArray(arr, space)

    def record(self, space: _Space, offsets, itemsize, write, site, vector) -> None:
        t = getcurrent()
        if not offsets:
            return
        seq = self.sequences.setdefault(t.tid, [])
        if vector:
            seq.append((site, space.key, offsets[0], itemsize * len(offsets)))
        else:
            seq.extend((site, space.key, off, itemsize) for off in offsets)
        if t.in_atomic:
            return
        block = self.block
        rec = (t.tid, t.warp, block.barrier_epoch, block.warp_epoch[t.warp], site, t.threadIdx)
        for off in offsets:
            for byte in range(off, off + itemsize):
                self._check_race(space, (space.key, byte), rec, write)

    @staticmethod
    def _ordered(a, b) -> bool:
        if a[0] == b[0] or a[2] != b[2]:
            return True
        return a[1] == b[1] and b[3] > a[3]

    def _check_race(self, space, addr, rec, write) -> None:
        last = self.last_write.get(addr)
        if last is not None and not self._ordered(last, rec):
            self._report(space, "write-write" if write else "write-read", last, rec)
        if write:
            for r in self.reads.pop(addr, {}).values():
                if not self._ordered(r, rec):
                    self._report(space, "read-write", r, rec)
            self.last_write[addr] = rec
        else:
            self.reads.setdefault(addr, {})[rec[0]] = rec

    def _report(self, space, kind, first, second) -> None:
        self.profile._add_race(
            Race(
                space.name,
                kind,
                tuple(first[5]),
                format_site(first[4]),
                tuple(second[5]),
                format_site(second[4]),
            )
        )

    def finish(self) -> None:
        prof = self.profile
        warps: dict[int, dict[int, list]] = {}
        for tid, seq in self.sequences.items():
            warps.setdefault(tid // 32, {})[tid % 32] = seq
        for lanes in warps.values():
            depth = max(len(s) for s in lanes.values())
            for k in range(depth):
                requests: dict = {}
                for lane, seq in lanes.items():
                    if k < len(seq):
                        site, key, off, width = seq[k]
                        requests.setdefault((site, key), []).append((lane, off, width))
                for (site, _), accesses in requests.items():
                    total, ideal = wavefronts(accesses)
                    prof.shared_requests += 1
                    prof.shared_wavefronts += total
                    if total > ideal:
                        prof.bank_conflicts += total - ideal
                        prof.conflict_lines[format_site(site)] += total - ideal
