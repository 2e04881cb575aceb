"""Prefetch: while the link to the cloud is idle, fetch the packs the next questions are likely
to need — the segments retrieval ranked just below a recent question's top_k (a follow-up or
a rephrasing of the same question retrieves much the same segments).

Bounded on every side: `depth` segments per question, a queue of `capacity` packs (the oldest
offers dropped first, the newest fetched first), one transfer at a time, and only when no
other transfer is under way. A prefetched pack enters the cache's LRU like any other, so a
cache that holds fewer than MIN_CACHE_PACKS packs of its size prefetches nothing: there a
prefetch would push out the packs of the answers it is meant to help.
"""
from __future__ import annotations

import logging
import threading
from collections import deque

log = logging.getLogger("kvedge.prefetch")

PREFETCH_DEPTH = 2     # segments ranked just below top_k offered per question
QUEUE_PACKS = 32       # offers held at most
MIN_CACHE_PACKS = 32   # the cache must hold this many packs of a pack's size to prefetch it
IDLE_POLL_S = 0.05     # how often a waiting prefetch looks whether the link is idle


class Prefetcher:
    """Prefetches through `fetcher` (the edge's one transfer path) into `cache`."""

    def __init__(self, fetcher, cache, depth: int = PREFETCH_DEPTH,
                 capacity: int = QUEUE_PACKS):
        self.fetcher, self.cache, self.depth = fetcher, cache, depth
        self.fetched = 0  # packs prefetched since start
        self._queue: deque[tuple[str, str]] = deque(maxlen=capacity)
        self._ready = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def offer(self, namespace: str, metas: list[dict]) -> None:
        """Segments (manifest entries) a recent question ranked just below its top_k."""
        with self._ready:
            for meta in metas:
                item = (namespace, meta["pack_id"])
                if self._worth(meta) and item not in self._queue:
                    self._queue.append(item)
            self._ready.notify()

    def _worth(self, meta: dict) -> bool:
        capacity = self.cache.capacity
        return (not capacity or capacity >= MIN_CACHE_PACKS * meta["pack_bytes"]) \
            and not self.cache.has(meta["pack_id"])

    def run(self) -> None:
        """Prefetch until stop(); a failed prefetch (the cloud down) is dropped."""
        while (item := self._next()) is not None:
            namespace, pack_id = item
            try:
                self.fetched += self.fetcher.fetch(namespace, pack_id)
            except Exception as err:  # noqa: BLE001 - a prefetch is only a guess
                log.debug("prefetch of %s… failed: %s: %s", pack_id[:16], type(err).__name__,
                          err)

    def _next(self) -> tuple[str, str] | None:
        """The newest offer, once the link is idle; None when stopped."""
        while not self._stop.is_set():
            with self._ready:
                while not self._queue and not self._stop.is_set():
                    self._ready.wait()
            while self.fetcher.busy() and not self._stop.is_set():
                self._stop.wait(IDLE_POLL_S)
            with self._ready:
                if self._queue and not self._stop.is_set():
                    return self._queue.pop()
        return None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="prefetch", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the prefetch under way (if any) ends."""
        self._stop.set()
        with self._ready:
            self._ready.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
