"""In-memory caches that count their hits (tests assert the counts)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable

MAX_LAUNCH_PLANS = 256  # launch plans kept per fused program, and for the matmul family


class CountingCache:
    """A thread-safe memo that counts its hits and misses (tests assert the counts). With
    ``bound``, it starts over when that many entries are held (per-layout plans: a caller of
    ever new shapes must not grow it without end)."""

    def __init__(self, bound: int | None = None):
        self.bound = bound
        self._entries: dict = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, make: Callable[[], object]):
        with self._lock:
            got = self._entries.get(key)
            if got is not None:
                self.hits += 1
                return got
            self.misses += 1
            got = make()
            if self.bound is not None and len(self._entries) >= self.bound:
                self._entries.clear()
            self._entries[key] = got
            return got

    def values(self) -> list:
        with self._lock:
            return list(self._entries.values())

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0
