"""Pack transfers from the cloud into the edge's cache: the one code path for sync, for a
question's missing packs and for prefetch.

A transfer resumes from the bytes a broken one left (`<id>.part`), and the pack enters the
cache only once verified (`PackCache.commit`). Transfers are single-flight: concurrent callers
needing the same missing pack share one transfer, and each waiter gets its outcome, the
fetch's error included. A pack's header and manifest alone (`manifest`) come as a ranged read
of the pack's first bytes, which is how a KB served on demand builds its retrieval index
without fetching packs.

Every pack transfer is timed for the edge's `LinkMeter` (`link`: round trip and throughput,
what `edge.fetch_or_compute` predicts a fetch by).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from kvedge.common.pack.container import HEADER_SIZE, read_header, read_manifest
from kvedge.common.pack.manifest import Manifest
from kvedge.edge.meters import LinkMeter

# A first ranged read of a pack takes this much beyond the header, so one round trip gets the
# manifest of packs whose manifest fits (a 240-tensor SmolLM2 pack's is ~12 KB); a longer one
# costs a second read, of exactly the rest.
MANIFEST_GUESS = 32 * 1024


class FetchStopped(Exception):
    """Raised inside a transfer when the fetcher is stopped mid-pack (the bytes that arrived
    stay in `<id>.part`, resumed next time)."""


@dataclass
class _Flight:
    """One transfer in progress; waiters block on `done` and then see its `error`."""

    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    callers: int = 1  # the leader and its waiters


class Fetcher:
    """Fetches packs of `client` (a CloudClient) into `cache` (a PackCache).

    Counts since start, for the edge's metrics: `fetched_bytes` (every byte received: whole
    packs and the header + manifest reads of the retrieval index), `fetched_packs` (packs
    verified into the cache) and `transfers` (whole-pack transfers started). `link` measures
    the link from the transfers that had it alone."""

    def __init__(self, client, cache, link: LinkMeter | None = None):
        self.client, self.cache = client, cache
        self.link = link if link is not None else LinkMeter()
        self.fetched_bytes = self.fetched_packs = self.transfers = 0
        self._flights: dict[str, _Flight] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def fetch(self, namespace: str, pack_id: str) -> bool:
        """Make `pack_id` cached: transfer it, or wait for the transfer already under way.
        True if this call transferred it; raises the transfer's error (a waiter too)."""
        with self._lock:
            if self.cache.has(pack_id):
                return False
            flight = self._flights.get(pack_id)
            leading = flight is None
            if leading:
                flight = self._flights[pack_id] = _Flight()
                self.transfers += 1
            else:
                flight.callers += 1
        if not leading:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            return False
        try:
            self._transfer(namespace, pack_id)
        except BaseException as err:
            flight.error = err
            raise
        finally:
            with self._lock:
                del self._flights[pack_id]
            flight.done.set()
        return True

    def busy(self) -> bool:
        """A transfer is under way (prefetch waits for the link to be idle)."""
        with self._lock:
            return bool(self._flights)

    def in_flight(self, pack_id: str) -> int:
        """How many fetches share the transfer of `pack_id` under way (0: none)."""
        with self._lock:
            flight = self._flights.get(pack_id)
            return 0 if flight is None else flight.callers

    def _transfer(self, namespace: str, pack_id: str) -> None:
        """Resume from what the cache holds of it, verify, commit, keep the cache in budget
        (the caller holds the packs it is about to read: `PackCache.hold`)."""
        offset = self.cache.held(pack_id)
        for chunk in self._timed(self.client.fetch_pack(namespace, pack_id, offset)):
            self.cache.append(pack_id, chunk.offset, chunk.data)
            if self._stop.is_set():  # stopping: keep what arrived, resume it next start
                raise FetchStopped(f"stopped while fetching {pack_id[:16]}…")
        self.cache.commit(pack_id)
        with self._lock:
            self.fetched_packs += 1
        self.cache.evict()

    def manifest(self, namespace: str, pack_id: str) -> Manifest:
        """A pack's manifest from its first bytes alone (header + manifest: a ranged read,
        one round trip for most packs).

        The manifest is checked against the header's hash, not against the pack id (only the
        whole pack's bytes can be): the retrieval text it gives is as trusted as the
        gateway's own KB listing, and the KV an answer uses is verified when its pack
        arrives."""
        head = self._range(namespace, pack_id, 0, HEADER_SIZE + MANIFEST_GUESS)
        end = HEADER_SIZE + read_header(head)[1]
        if len(head) < end:
            head += self._range(namespace, pack_id, len(head), end - len(head))
        return read_manifest(head)

    def _range(self, namespace: str, pack_id: str, offset: int, length: int) -> bytes:
        chunks = self.client.fetch_pack(namespace, pack_id, offset, length)
        return b"".join(c.data for c in self._timed(chunks, measured=False))

    def _timed(self, chunks, measured: bool = True):
        """A transfer's chunks, counted, and timed for `link` from the first one asked for
        (the client's stream sends its request then); one left before its end is not
        measured. Ranged manifest reads are not `measured` (they only mark the transfers
        they overlap as sharing the link): a sync runs them 8 at a time, and what the meter
        predicts is a pack's transfer — so an edge knows its link from its first pack
        fetched on."""
        timing, complete = self.link.begin(measured), False
        try:
            for chunk in chunks:
                timing.arrived(len(chunk.data))
                self._count(len(chunk.data))
                yield chunk
            complete = True
        finally:
            self.link.end(timing, complete)

    def _count(self, n: int) -> None:
        with self._lock:
            self.fetched_bytes += n

    def stop(self) -> None:
        """Transfers under way stop at their next chunk (resumable); later ones too."""
        self._stop.set()
