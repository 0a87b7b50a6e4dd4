"""Opt-in instrumentation of simulated launches: global traffic, bank conflicts, races, bounds.

Inside ``with profile() as prof:`` kernel arguments and shared arrays are wrapped in
:class:`TrackedArray`, which counts every element access a thread makes and records where it
happened. Nothing is wrapped outside a profile, so unprofiled launches pay nothing.

Bank conflicts follow the hardware's model (:mod:`tessera_tile._device.banks`, the one the analytic
model of :mod:`tessera_tile.memory` uses): the k-th shared access of each lane of a warp (made at
the same source line) forms one warp-wide request; ``bank_conflicts`` counts its wavefronts
beyond the ideal (one per 128-byte phase).

A shared-memory race is two threads touching the same byte address, at least one writing, with
no ``syncthreads`` between them (and, within one warp, no warp operation between them).
A global-memory race is the same across a launch's blocks too, where only a fence and an atomic
order two blocks' accesses (:mod:`.global_races`). Atomics are never races.

The profile and its per-block recorder of shared accesses are here; the wrapper that counts
accesses is in :mod:`.tracked_arrays`.
"""

from __future__ import annotations

import inspect as pyinspect
import io
from collections import Counter
from dataclasses import dataclass

import numpy as np
from greenlet import getcurrent

from .._device.banks import wavefronts
from ._base import format_site
from .global_races import GlobalRaces
from .races import RaceTable
from .tracked_arrays import OutOfBounds, TrackedArray, _Space

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
    space: str = "shared"  # or "global": then the blocks of the two threads
    first_block: tuple = ()
    second_block: tuple = ()

    def __str__(self) -> str:
        if self.space == "shared":
            return (
                f"{self.kind} race on shared array {self.array}: thread {self.first_thread} at "
                f"{self.first_line} and thread {self.second_thread} at {self.second_line}"
            )
        return (
            f"{self.kind} race on global array {self.array}: thread {self.first_thread} of "
            f"block {self.first_block} at {self.first_line} and thread {self.second_thread} of "
            f"block {self.second_block} at {self.second_line}"
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
        self.global_accesses: GlobalRaces | None = None  # the running launch's

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

        def wrap(a, name: str):
            if type(a) is tuple:  # a tuple argument's arrays: "extras[0]"...
                return tuple(wrap(item, f"{name}[{j}]") for j, item in enumerate(a))
            if isinstance(a, np.ndarray) and a.ndim > 0:
                counters = self.traffic.setdefault((fn.__name__, name), [0, 0])
                return TrackedArray(a, _Space(self, name, a, counters=counters))
            return a

        return [wrap(a, names[i] if i < len(names) else f"arg{i}") for i, a in enumerate(args)]

    def block_recorder(self, block) -> _BlockRecorder:
        return _BlockRecorder(self, block)

    def note_undefined_shuffle(self, kind: str, site, lanes: int) -> None:
        self.undefined_shuffle_reads[f"{kind} at {format_site(site)}"] += lanes

    def launch_started(self) -> GlobalRaces:
        self.global_accesses = GlobalRaces(self)
        return self.global_accesses

    def launch_finished(self) -> None:
        self.global_accesses = None
        self.launches += 1

    def add_race(self, array, kind, first, second, space="shared") -> None:
        """Report a race between ``first`` and ``second``: (thread, line, block) each."""
        self._add_race(Race(array, kind, first[0], first[1], second[0], second[1], space,
                            first[2], second[2]))  # fmt: skip

    def _add_race(self, race: Race) -> None:
        key = (race.space, race.array, race.kind, race.first_line, race.second_line)
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
        shared = sum(r.space == "shared" for r in self.races)
        console.print(
            f"races: {shared} in shared memory (within a block), {len(self.races) - shared} in "
            "global memory (across the launch's threads and blocks)"
        )
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


class _BlockRecorder(RaceTable):
    """Shared-memory accesses of one block: bank conflicts and races."""

    def __init__(self, profile: Profile, block):
        super().__init__()
        self.profile = profile
        self.block = block
        self.sequences: dict[int, list] = {}  # tid -> [(site, key, first_offset, width)]
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
        # Every dynamic shared array of a block is one memory, whatever its dtype: they race.
        memory = "dynamic" if isinstance(space.key[0], str) else space.key
        self.access(space, memory, offsets, itemsize, write, rec)

    def ordered(self, a, b) -> bool:
        return self.within_block(a, b)

    def report(self, space, kind, first, second) -> None:
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
