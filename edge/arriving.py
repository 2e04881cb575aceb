"""A missing pack's layers handed to the answer as they arrive (issue 26, 2: the reuse path
computes layer l while layers > l are still on the wire; LMCache's layer-wise pipeline from a
remote tier, SparKV's overlap of transfer and compute).

`Arrival` is one transfer's decoded layers, shared by the fetcher that feeds it
(`edge.fetcher`, decoding each layer once its bytes are in and checksummed,
`common.pack.stream`) and the answers that read it. `ArrivingSegment` stands in a composed
prompt for the pack's KVContext from the moment its manifest is in; the loader
(`edge.loader.load_cache`) reads its layer l through `ArrivingSource`, waiting for it, on the
loader's thread, so the forward runs layer 0 while later layers arrive. The cache built is
the one a fetched-then-decoded pack gives, bit for bit: the same decoded tensors.

Computing on a pack before it is verified whole is allowed; acting on it is not. Until the
transfer ends, a consistent pack other than the one asked for (a forged one) is not told
apart (only the whole-pack hash names it). The loader calls `ArrivingSource.finish` once the
last layer is built and before that layer is handed to the forward. `finish` waits for the
transfer's end and its whole-pack check. So the forward's last layer, and hence the first
token, comes only from a verified pack. A damaged or forged pack fails the answer with
PackCorrupt before any text is sent, and the engine fetches it again the blocking way.

A transfer that fails for another reason (the cloud unreachable, the edge stopping) is
PackUnavailable to its readers, naming the pack; the engine then asks again the blocking
way, which names every segment still missing or computes them on the edge. So is one that
stalls: the reader waits on the scheduler's thread, so a transfer that brings no byte for
`STALL_S` seconds fails the attempt rather than holding the scheduler until gRPC's deadline.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from kvedge.common.errors import ModelMismatch
from kvedge.common.pack.errors import PackError, PackUnavailable
from kvedge.common.pack.realign import Stored
from kvedge.common.pack.segment import ManifestSegment


STALL_S = 10.0  # seconds without a byte after which a reader gives an arriving pack up


class Arrival:
    """One transfer's manifest and layers as they come in, then its context or its error."""

    def __init__(self, pack_id: str, stall_s: float = STALL_S):
        self.pack_id, self.stall_s = pack_id, stall_s
        self._progress = time.monotonic()  # when the transfer last brought bytes
        self._manifest = None
        self._layers: dict = {}       # layer index → common.pack.stream.Layer
        self._context = None          # the KVContext once the pack is verified whole
        self._error: BaseException | None = None
        self._changed = threading.Condition()

    # ------------------------------------------------------------------ the transfer's side
    def touch(self) -> None:
        """Bytes arrived (readers measure a stall from the last of these)."""
        self._progress = time.monotonic()

    def front(self, manifest) -> None:
        self._set(lambda: setattr(self, "_manifest", manifest))

    def publish(self, layers) -> None:
        self._set(lambda: self._layers.update((layer.index, layer) for layer in layers))

    def complete(self, context) -> None:
        self._set(lambda: setattr(self, "_context", context))

    def fail(self, error: BaseException) -> None:
        if not isinstance(error, (PackError, ModelMismatch)):  # the cloud unreachable, ...
            named = PackUnavailable(f"the transfer of pack {self.pack_id[:16]}… failed: {error}")
            named.__cause__, error = error, named
        self._set(lambda: setattr(self, "_error", error))

    def _set(self, change: Callable[[], None]) -> None:
        with self._changed:
            change()
            self._changed.notify_all()

    # ------------------------------------------------------------------ the readers' side
    def manifest(self):
        return self._wait(lambda: self._manifest)

    def layer(self, index: int):
        return self._wait(lambda: self._layers.get(index))

    def context(self):
        """The KVContext, once the transfer ended and the pack was verified whole."""
        return self._wait(lambda: self._context)

    def _wait(self, ready: Callable):
        with self._changed:
            while (got := ready()) is None and self._error is None:
                idle = time.monotonic() - self._progress
                if idle > self.stall_s:
                    raise PackUnavailable(f"the transfer of pack {self.pack_id[:16]}… brought "
                                          f"no byte for {idle:.0f} s")
                self._changed.wait(self.stall_s - idle + 0.01)
            if got is None:
                raise self._error
            return got


class ArrivingSegment(ManifestSegment):
    """A pack still arriving, standing in for its KVContext in a composed prompt. Reading its
    tensors whole (`keys`, `values`, `context`: a strategy that scores before its forward)
    waits for the verified pack; the loader reads it layer by layer (`row_source`)."""

    def __init__(self, arrival: Arrival):
        super().__init__(arrival.manifest())
        self.arrival = arrival

    def context(self):
        return self.arrival.context()

    def row_source(self) -> "ArrivingSource":
        return ArrivingSource(self)

    def select(self, keep):
        return self.context().select(keep)

    def held_rows(self, layer: int, head: int, kind: str, rows):
        return (self.keys if kind == "k" else self.values)[layer][head][rows]


class ArrivingSource:
    """The loader's `RowSource` over an arriving segment: layer l's decoded heads, waited for;
    `finish` waits for the pack verified whole (see the module docstring)."""

    def __init__(self, segment: ArrivingSegment):
        self.segment = segment

    def stored(self, layer: int, kind: str) -> list[Stored]:
        got = self.segment.arrival.layer(layer)
        return [Stored([x], x.dtype) for x in (got.keys if kind == "k" else got.values)]

    def local(self, layer: int):
        return [self.segment.ranks(layer, h) for h in range(self.segment.n_kv_heads)]

    def finish(self) -> None:
        self.segment.arrival.context()
