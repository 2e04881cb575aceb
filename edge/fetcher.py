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

import logging
import queue
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

from kvedge.common.net.rpc import MAX_HEADS
from kvedge.common.pack.container import read_head, read_manifest
from kvedge.common.pack.errors import ModelMismatch, PackError
from kvedge.common.pack.manifest import Manifest
from kvedge.edge.meters import LinkMeter

log = logging.getLogger("kvedge.edge.fetcher")


class FetchStopped(Exception):
    """Raised inside a transfer when the fetcher is stopped mid-pack (the bytes that arrived
    stay in `<id>.part`, resumed next time)."""


@dataclass
class _Flight:
    """One transfer in progress; waiters block on `done` and then see its `error`.
    `received`: its last byte is in (or it failed), verification and decoding may remain."""

    done: threading.Event = field(default_factory=threading.Event)
    received: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    callers: int = 1  # the leader and its waiters
    arrival: object = None  # a decoding transfer's layers as they arrive (edge.arriving)


class _Decoding:
    """A transfer's pack decoded while it arrives (`common.pack.stream.PackStream`), the
    bytes a broken transfer left read first. Damage it finds drops the unfinished file:
    resuming it would only repeat the damage."""

    def __init__(self, cache, pack_id: str, held: int, arrival=None):
        from kvedge.common.pack.stream import PackStream  # torch: only where packs decode

        self.cache, self.pack_id, self.arrival = cache, pack_id, arrival
        self.stream = PackStream(cache.fingerprint, pack_id)
        if held:
            self.feed(cache.partial(pack_id)[:held])

    def feed(self, data: bytes) -> None:
        if self.arrival is not None:
            self.arrival.touch()
        with self._dropping():
            layers = self.stream.feed(data)
        if self.arrival is not None and self.stream.manifest is not None:
            self.arrival.front(self.stream.manifest)
            self.arrival.publish(layers)

    def finish(self):
        with self._dropping():
            ctx = self.stream.finish()
        if self.arrival is not None:
            self.arrival.complete(ctx)
        return ctx

    @contextmanager
    def _dropping(self):
        try:
            yield
        except (PackError, ModelMismatch):
            self.cache.discard(self.pack_id)
            raise


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

    def fetch(self, namespace: str, pack_id: str, decode: bool = False) -> bool:
        """Make `pack_id` cached: transfer it, or wait for the transfer already under way.
        True if this call transferred it; raises the transfer's error (a waiter too). With
        `decode`, a transfer this call starts decodes the pack layer by layer while its bytes
        arrive (`common.pack.stream`) and leaves the context decoded in the cache's memory
        (`PackCache.keep`), so the read that follows decodes nothing."""
        return self._fetch(namespace, pack_id, decode)

    def _fetch(self, namespace: str, pack_id: str, decode: bool,
               joined: Callable[[_Flight | None], None] = lambda flight: None) -> bool:
        """`fetch`; `joined` is told the transfer this call leads or waits on (None: the
        pack is cached)."""
        flight, leading = self._join(pack_id, decode)
        joined(flight)
        if flight is None:
            return False
        if not leading:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            return False
        self._lead(namespace, pack_id, flight)
        return True

    def arriving(self, namespace: str, pack_id: str):
        """The pack's layers as its bytes arrive (an `edge.arriving.Arrival`), without waiting:
        the transfer under way joined, or one started on a background thread, decoding. None
        when the pack is cached, or its transfer under way does not decode (the caller then
        `fetch`es it). Its error reaches the Arrival's readers; a later `fetch` of the pack
        tries again."""
        flight, leading = self._join(pack_id, True)
        if flight is not None and flight.arrival is None:  # under way, not decoding
            with self._lock:
                flight.callers -= 1
            return None
        if leading:
            threading.Thread(target=self._lead_quietly, args=(namespace, pack_id, flight),
                             daemon=True, name="kvedge-fetch-arriving").start()
        return None if flight is None else flight.arrival

    def _join(self, pack_id: str, decode: bool) -> tuple[_Flight | None, bool]:
        """(the transfer of `pack_id` this caller leads or waits on, whether it leads); None
        when the pack is cached."""
        from kvedge.edge.arriving import Arrival

        with self._lock:
            if self.cache.has(pack_id):
                return None, False
            flight = self._flights.get(pack_id)
            if flight is not None:
                flight.callers += 1
                return flight, False
            flight = self._flights[pack_id] = _Flight(
                arrival=Arrival(pack_id) if decode else None)
            self.transfers += 1
            return flight, True

    def _lead(self, namespace: str, pack_id: str, flight: _Flight) -> None:
        """Run the transfer this caller leads; its outcome to every waiter."""
        try:
            self._transfer(namespace, pack_id, flight.received, flight.arrival)
        except BaseException as err:
            flight.error = err
            if flight.arrival is not None:
                flight.arrival.fail(err)
            raise
        finally:
            with self._lock:
                del self._flights[pack_id]
            flight.received.set()
            flight.done.set()

    def _lead_quietly(self, namespace: str, pack_id: str, flight: _Flight) -> None:
        try:
            self._lead(namespace, pack_id, flight)
        except Exception as err:  # noqa: BLE001 - its readers get it from the Arrival
            log.info("fetching %s… failed: %s", pack_id[:16], err)

    def fetch_in_order(self, namespace: str, pack_ids: list[str], decode: bool = False) -> None:
        """Start fetching these packs, in the background and one after another: each
        transfer starts once the one before it has all its bytes, so the link carries the
        next pack while the last one is verified, decoded and committed. A caller then
        `fetch`es each (joining its transfer, or finding it cached) and sees its outcome
        there; one transfer at a time keeps each measurable by the link meter."""
        if pack_ids:
            threading.Thread(target=self._in_order, args=(namespace, list(pack_ids), decode),
                             daemon=True, name="kvedge-fetch-in-order").start()

    def _in_order(self, namespace: str, pack_ids: list[str], decode: bool) -> None:
        for pack_id in pack_ids:
            if self._stop.is_set():
                return
            flights: queue.Queue = queue.Queue(1)
            threading.Thread(target=self._quietly, args=(namespace, pack_id, decode, flights.put),
                             daemon=True).start()
            flight = flights.get()
            if flight is not None:
                flight.received.wait()

    def _quietly(self, namespace: str, pack_id: str, decode: bool, joined) -> None:
        """A transfer started ahead: its error reaches whoever fetches the pack (a waiter
        gets it; one arriving after it ended tries again)."""
        told = []
        try:
            self._fetch(namespace, pack_id, decode, lambda flight: told.append(joined(flight)))
        except Exception:  # noqa: BLE001 - reported to the fetch that needs the pack
            if not told:  # failed before it joined a transfer: the next one may start
                joined(None)

    def busy(self) -> bool:
        """A transfer is under way (prefetch waits for the link to be idle)."""
        with self._lock:
            return bool(self._flights)

    def in_flight(self, pack_id: str) -> int:
        """How many fetches share the transfer of `pack_id` under way (0: none)."""
        with self._lock:
            flight = self._flights.get(pack_id)
            return 0 if flight is None else flight.callers

    def _transfer(self, namespace: str, pack_id: str, received: threading.Event,
                  arrival=None) -> None:
        """Resume from what the cache holds of it, verify, commit, keep the cache in budget
        (the caller holds the packs it is about to read: `PackCache.hold`); with an
        `arrival`, read it as it arrives (each layer handed to `arrival` once decoded).
        `received` is set once the last byte is in."""
        offset = self.cache.held(pack_id)
        stream = _Decoding(self.cache, pack_id, offset, arrival) if arrival is not None else None
        try:
            for chunk in self._timed(self.client.fetch_pack(namespace, pack_id, offset)):
                if chunk.offset == offset and chunk.total:  # room first: disk ≤ capacity
                    self.cache.reserve(pack_id, chunk.total)
                self.cache.append(pack_id, chunk.offset, chunk.data)
                if stream is not None:
                    stream.feed(chunk.data)
                if self._stop.is_set():  # stopping: keep what arrived, resume it next start
                    raise FetchStopped(f"stopped while fetching {pack_id[:16]}…")
            received.set()
            ctx = stream.finish() if stream is not None else None
            self.cache.commit(pack_id)  # releases the reservation: the pack is counted
        except BaseException:
            self.cache.release(pack_id)
            raise
        if ctx is not None:
            self.cache.keep(pack_id, ctx)
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
        return read_manifest(read_head(
            lambda offset, length: self._range(namespace, pack_id, offset, length)))

    def manifests(self, namespace: str, pack_ids: list[str]) -> dict[str, Manifest]:
        """Many packs' manifests (`manifest`'s checks), MAX_HEADS per call: one stream of
        first bytes instead of a ranged read each. A client or gateway without FetchHeads
        (an older gateway, a test double) is read pack by pack."""
        out: dict[str, Manifest] = {}
        heads = getattr(self.client, "fetch_heads", None)
        try:
            for first in range(0, len(pack_ids) if heads else 0, MAX_HEADS):
                batch = heads(namespace, pack_ids[first:first + MAX_HEADS])
                for head in self._timed(batch, measured=False):
                    out[head.pack_id] = read_manifest(head.data)
        except NotImplementedError:
            pass
        return {pid: out[pid] if pid in out else self.manifest(namespace, pid)
                for pid in pack_ids}

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
