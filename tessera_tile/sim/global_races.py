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
from .races import RaceTable

_SYNC = "global races"  # the key of a block's :class:`_BlockSync` in its ``state`` dict


class _BlockSync:
    """A block's fences and atomics, in the order the simulator ran them."""

    __slots__ = ("pending", "releases", "atomics")

    def __init__(self):
        self.pending: dict = {}  # tid -> [(barrier epoch, clock) of fences not yet released]
        self.releases: list = []  # (tid, barrier epoch of the fence, its clock, atomic's clock)
        self.atomics: list = []  # (tid, barrier epoch, clock)


class GlobalRaces(RaceTable):
    """One launch's global accesses (made by the profile's tracked arguments), at their
    addresses: one memory, whatever array an access goes through."""

    def __init__(self, profile):
        super().__init__()
        self.profile = profile
        self.clock = 0  # counts fences and atomics: the order the simulator ran them in

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
        # within_block's fields, then the clock, the block index and the block
        rec = (
            t.tid, t.warp, block.barrier_epoch, block.warp_epoch[t.warp], site,
            tuple(t.threadIdx), self.clock, block.block_idx, block,
        )  # fmt: skip
        base = space.root_ptr  # absolute addresses: arguments may share memory
        self.access(space, "global", [base + off for off in offsets], itemsize, write, rec)

    @staticmethod
    def reader(rec):
        return rec[7]  # one read per block

    def ordered(self, a, b) -> bool:
        """Whether access ``a`` (earlier) happens before ``b`` (now)."""
        if a[7] == b[7]:
            return self.within_block(a, b)
        released = self._released(a)
        return released is not None and released < self._acquired(b)

    def _released(self, a):
        """The clock of the first atomic that releases ``a``, None if none has."""
        tid, epoch, clock = a[0], a[2], a[6]
        for r_tid, r_epoch, r_fence, r_atomic in self._sync(a[8]).releases:
            if (r_tid == tid and r_fence > clock) or r_epoch > epoch:
                return r_atomic
        return None

    def _acquired(self, b) -> int:
        """The clock of the latest atomic ``b`` sees: its thread's, or its block's before a
        barrier ``b`` passed."""
        tid, epoch = b[0], b[2]
        seen = -1
        for a_tid, a_epoch, a_clock in self._sync(b[8]).atomics:
            if a_tid == tid or a_epoch < epoch:
                seen = a_clock
        return seen

    def report(self, space, kind, first, second) -> None:
        self.profile.add_race(
            space.name, kind, (first[5], format_site(first[4]), tuple(first[7])),
            (second[5], format_site(second[4]), tuple(second[7])), space="global",
        )  # fmt: skip
