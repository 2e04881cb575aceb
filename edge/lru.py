"""A least-recently-used map under a byte budget, shared by the edge's in-memory KV caches:
conversation prefixes (`edge.sessions.PrefixCache`) and segments computed on the edge
(`edge.local_prefill.LocalPrefill.computed`). Thread-safe: looked up on asks' threads, filled
on the scheduler's. The byte total is kept as entries come and go, not summed per put."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, Hashable, TypeVar

V = TypeVar("V")


class ByteLRU(Generic[V]):
    """Values by key, each with its size; the least recently used are dropped once the sizes
    pass `budget_bytes` or the count passes `max_entries` (None: no count limit).
    `evictions` counts the drops."""

    def __init__(self, budget_bytes: int, max_entries: int | None = None):
        self.budget_bytes, self.max_entries = budget_bytes, max_entries
        self.evictions = 0
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    def get(self, key: Hashable) -> V | None:
        """The value, now the most recently used; None if not held."""
        with self._lock:
            if key not in self._entries:
                return None
            self._entries.move_to_end(key)
            return self._entries[key][0]

    def keys(self) -> list:
        with self._lock:
            return list(self._entries)

    def put(self, key: Hashable, value: V, nbytes: int) -> int:
        """Hold `value` (of `nbytes`) under `key`, replacing what it held; evict beyond the
        limits; returns how many were evicted."""
        evicted = 0
        with self._lock:
            if key in self._entries:
                self._bytes -= self._entries.pop(key)[1]
            self._entries[key] = value, nbytes
            self._bytes += nbytes
            while self._entries and (self._bytes > self.budget_bytes or (
                    self.max_entries is not None and len(self._entries) > self.max_entries)):
                self._bytes -= self._entries.popitem(last=False)[1][1]
                evicted += 1
            self.evictions += evicted
        return evicted

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
