"""Races on global memory within one launch, for the profiler (:mod:`.profiler`).

Two accesses of one launch race when they touch the same byte, at least one writes, neither is
an atomic, and nothing orders them:

* within a block, as in shared memory: the same thread, a ``syncthreads`` between them, or
  (within one warp) a warp operation between them;
* across blocks, only a release and an acquire: after the first access its thread, or any thread
  of its block after a ``syncthreads``, runs ``threadfence()`` and then an atomic (the release);
  before the second access its thread, or any thread of its block before a ``syncthreads``, ran
  an atomic after that one (the acquire). This is the "last block" pattern of CUDA's
  threadFenceReduction sample: each block writes its partial result, fences, and counts itself
  with ``atomic.add``; the block that counts last reads every partial. The simulator runs blocks
  one after another, so "after" is the order it ran them in; which atomic (which counter) the
  acquire read is not checked.

Reads are kept as the latest read of each block at each address (a write is checked against
those), so a write that races only with an earlier read of its block, by another thread, at an
address its own thread read since, is not reported.
"""

from __future__ import annotations

from greenlet import getcurrent

from ._base import format_site

_SYNC = "global races"  # the key of a block's :class:`_BlockSync` in its ``state`` dict


class _BlockSync:
    """A block's fences and atomics, in the order the simulator ran them."""

    __slots__ = ("pending", "releases", "atomics")

    def __init__(self):
        self.pending: dict = {}  # tid -> [(barrier epoch, clock) of fences not yet released]
        self.releases: list = []  # (tid, barrier epoch of the fence, its clock, atomic's clock)
        self.atomics: list = []  # (tid, barrier epoch, clock)


class GlobalRaces:
    """One launch's global accesses (made by the profile's tracked arguments)."""

    def __init__(self, profile):
        self.profile = profile
        self.clock = 0  # counts fences and atomics: the order the simulator ran them in
        self.last_write: dict = {}  # address -> access record
        self.reads: dict = {}  # address -> {block index: access record}
        self.unit = 0  # bytes an address stands for (the itemsize while all accesses align)

    @staticmethod
    def _sync(block) -> _BlockSync:
        sync = block.state.get(_SYNC)
        if sync is None:
            sync = block.state[_SYNC] = _BlockSync()
        return sync

    # fences and atomics ---------------------------------------------------------------------
    def fence(self) -> None:
        t = getcurrent()
        self.clock += 1
        self._sync(t.block).pending.setdefault(t.tid, []).append(
            (t.block.barrier_epoch, self.clock)
        )

    def atomic(self) -> None:
        t = getcurrent()
        self.clock += 1
        sync = self._sync(t.block)
        epoch = t.block.barrier_epoch
        for fence_epoch, fence_clock in sync.pending.pop(t.tid, ()):
            sync.releases.append((t.tid, fence_epoch, fence_clock, self.clock))
        sync.atomics.append((t.tid, epoch, self.clock))

    # accesses -------------------------------------------------------------------------------
    def record(self, space, offsets, itemsize: int, write: bool, site) -> None:
        t = getcurrent()
        if t.in_atomic or not offsets:
            return
        block = t.block
        # (block index, thread, warp, barrier epoch, warp epoch, clock, site, threadIdx, block)
        rec = (
            block.block_idx, t.tid, t.warp, block.barrier_epoch, block.warp_epoch[t.warp],
            self.clock, site, tuple(t.threadIdx), block,
        )  # fmt: skip
        base = space.root_ptr
        unit = self.unit or itemsize
        self.unit = unit
        if unit > 1 and (itemsize != unit or any((base + off) % unit for off in offsets)):
            self._to_bytes(unit)
            unit = 1
        if unit > 1:
            for off in offsets:
                self._check(space, base + off, rec, write)
            return
        for off in offsets:
            for byte in range(base + off, base + off + itemsize):
                self._check(space, byte, rec, write)

    def _to_bytes(self, unit: int) -> None:
        """Split element addresses into bytes, once an access is not one aligned element."""
        self.unit = 1
        for table in (self.last_write, self.reads):
            for addr in list(table):
                value = table.pop(addr)
                for byte in range(addr, addr + unit):
                    table[byte] = value if table is self.last_write else dict(value)

    def _check(self, space, addr, rec, write) -> None:
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

    def _ordered(self, a, b) -> bool:
        """Whether access ``a`` (earlier) happens before ``b`` (now)."""
        if a[0] == b[0]:  # one block: one thread, a barrier, or a warp operation of one warp
            if a[1] == b[1] or a[3] != b[3]:
                return True
            return a[2] == b[2] and b[4] > a[4]
        released = self._released(a)
        return released is not None and released < self._acquired(b)

    def _released(self, a):
        """The clock of the first atomic that releases ``a``, None if none has."""
        tid, epoch, clock = a[1], a[3], a[5]
        for r_tid, r_epoch, r_fence, r_atomic in self._sync(a[8]).releases:
            if (r_tid == tid and r_fence > clock) or r_epoch > epoch:
                return r_atomic
        return None

    def _acquired(self, b) -> int:
        """The clock of the latest atomic ``b`` sees: its thread's, or its block's before a
        barrier ``b`` passed."""
        tid, epoch = b[1], b[3]
        seen = -1
        for a_tid, a_epoch, a_clock in self._sync(b[8]).atomics:
            if a_tid == tid or a_epoch < epoch:
                seen = a_clock
        return seen

    def _report(self, space, kind, first, second) -> None:
        self.profile.add_race(
            space.name, kind, (first[7], format_site(first[6]), tuple(first[0])),
            (second[7], format_site(second[6]), tuple(second[0])), space="global",
        )  # fmt: skip
