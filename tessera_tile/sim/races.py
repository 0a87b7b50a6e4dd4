"""The race table the profiler's recorders share (shared memory per block, :mod:`.profiler`;
global memory per launch, :mod:`.global_races`): the last write and the reads at each address,
an address a memory's element while every access is one aligned element, its bytes after.

A record starts ``(thread, warp, barrier epoch, warp epoch, site, threadIdx)``; a subclass says
which records are ordered (:meth:`ordered`), how a race is reported (:meth:`report`) and which
reads an address keeps (:meth:`reader`: one per thread, or one per block)."""

from __future__ import annotations


class RaceTable:
    def __init__(self):
        self.last_write: dict = {}  # (memory, address) -> access record
        self.reads: dict = {}  # (memory, address) -> {reader: access record}
        self.units: dict = {}  # memory -> bytes an address stands for (its itemsize, or 1)

    @staticmethod
    def within_block(a, b) -> bool:
        """Whether ``a`` (earlier) is ordered before ``b`` in one block: one thread, a barrier
        between them, or (one warp) a warp operation between them."""
        if a[0] == b[0] or a[2] != b[2]:
            return True
        return a[1] == b[1] and b[3] > a[3]

    def access(self, space, memory, offsets, itemsize: int, write: bool, rec) -> None:
        """Check and record an access of ``itemsize`` bytes at each of ``offsets`` (bytes into
        ``memory``) against the earlier ones."""
        unit = self.units.setdefault(memory, itemsize)
        if unit > 1 and (itemsize != unit or any(off % unit for off in offsets)):
            self._to_bytes(memory, unit)
            unit = 1
        if unit > 1:
            for off in offsets:
                self._check(space, (memory, off), rec, write)
            return
        for off in offsets:
            for byte in range(off, off + itemsize):
                self._check(space, (memory, byte), rec, write)

    def _to_bytes(self, memory, unit: int) -> None:
        """Split the memory's element addresses into bytes, once it is accessed otherwise."""
        self.units[memory] = 1
        for table in (self.last_write, self.reads):
            for addr in [a for a in table if a[0] == memory]:
                value = table.pop(addr)
                for byte in range(addr[1], addr[1] + unit):
                    table[memory, byte] = value if table is self.last_write else dict(value)

    def _check(self, space, addr, rec, write) -> None:
        last = self.last_write.get(addr)
        if last is not None and not self.ordered(last, rec):
            self.report(space, "write-write" if write else "write-read", last, rec)
        if write:
            for r in self.reads.pop(addr, {}).values():
                if not self.ordered(r, rec):
                    self.report(space, "read-write", r, rec)
            self.last_write[addr] = rec
        else:
            self.reads.setdefault(addr, {})[self.reader(rec)] = rec

    def ordered(self, a, b) -> bool:
        raise NotImplementedError

    def report(self, space, kind, first, second) -> None:
        raise NotImplementedError

    @staticmethod
    def reader(rec):
        return rec[0]  # one read per thread
