"""The serving path's loader: a composed prompt's packs → the runtime's cache, layer by layer.

`load_cache` assembles the chat prefix and every segment at its composed offset, one pass per
layer (`kvedge.common.pack.realign.realign_layer`: the fused dequantize+RoPE kernel on CUDA,
one batched torch pass elsewhere), from whatever each segment is: a `PackSegment` (decoded
from its pack as its layer is assembled) or a decoded `KVContext`.

Layer-wise streaming (LMCache's layerwise pipeline): the layers are built on a background
thread, in order, into a `StreamingCache`; reading layer l waits until it is built, so a
forward starts on layer 0 while later layers are still being decoded (zstd, blake3 and the
torch ops release the GIL). A strategy that reads a deep layer before its forward (CacheBlend's
layer-1 values) just waits for it. A failure while building — a damaged tensor is PackCorrupt
naming it — is raised by every read of that layer or a later one, so the request fails with
it and the runtime's forward undoes what it wrote to the layers before.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from kvedge.common.model.kvcache import Extent, KVCache, LayerKV
from kvedge.common.pack.context import KVContext
from kvedge.common.pack.realign import (ContextSource, DenseSource, RopeTable, RowSource,
                                        realign_layer)


class StreamingCache(KVCache):
    """A KVCache whose layers `build(layer)` makes in order on a thread (or at once with
    stream=False); `cache[i]` and iteration wait for the layers they reach."""

    def __init__(self, n_layers: int, build: Callable[[int], LayerKV], extent: Extent,
                 seq_len: int | None, *, stream: bool = True):
        super().__init__([None] * n_layers, extent, seq_len)
        self.stalled_s = 0.0  # time readers spent waiting for layers (loading left in TTFT)
        self._built = 0
        self._error: BaseException | None = None
        self._done = threading.Condition()
        if not stream:
            self._build(build)
            if self._error is not None:
                raise self._error
            return
        threading.Thread(target=self._build, args=(build,), name="kv-loader",
                         daemon=True).start()

    def _build(self, build: Callable[[int], LayerKV]) -> None:
        try:
            for layer in range(len(self)):
                built = build(layer)
                with self._done:
                    list.__setitem__(self, layer, built)
                    self._built = layer + 1
                    self._done.notify_all()
        except BaseException as err:  # handed to whoever reads the layer
            with self._done:
                self._error = err
                self._done.notify_all()

    def wait(self, n_layers: int | None = None) -> None:
        """Until the first `n_layers` (default all) are built; raises the loader's error."""
        want = len(self) if n_layers is None else n_layers
        if self._built >= want:  # only ever grows: no lock needed to see it done
            return
        start = time.perf_counter()
        with self._done:
            while self._built < want and self._error is None:
                self._done.wait()
            self.stalled_s += time.perf_counter() - start
            if self._built < want:
                raise self._error

    def __getitem__(self, i):
        if isinstance(i, slice):
            self.wait()
        else:
            self.wait((i % len(self)) + 1)
        return list.__getitem__(self, i)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


def load_cache(rt, composed, *, realign: bool = True, reserve: int = 0,
               seq_len: int | None = None, stream: bool = True) -> StreamingCache:
    """The prompt's cached KV (`kvedge.edge.strategies.assemble_cache`'s contract): the
    prefix and every segment at its composed offset, keys rotated to those positions
    (realign=False: to the positions each segment was prefilled at); dense when every head
    kept every token, ragged otherwise. Extent: the prefix and every segment whole; seq_len
    default `composed.question_start + reserve`."""
    offsets = composed.offsets
    seq_len = seq_len or composed.question_start + reserve
    sources: list[RowSource] = [DenseSource(composed.prefix_keys, composed.prefix_values)]
    sources += [ContextSource(seg) if isinstance(seg, KVContext) else seg.row_source()
                for seg in composed.segments]
    starts = [0] + offsets
    table = RopeTable.of(rt.rope, seq_len, composed.question_start, rt.device)
    full = composed.n_prefix + composed.n_context

    def build(layer: int) -> LayerKV:
        built = realign_layer(sources, starts, layer, table, realign=realign, dtype=rt.dtype,
                              device=rt.device, full=full, reserve=reserve)
        if layer == rt.n_layers - 1:
            for source in sources:
                source.finish()
        return built

    spans = [(off, off + seg.n_tokens) for seg, off in zip(composed.segments, offsets)]
    return StreamingCache(rt.n_layers, build, Extent([(0, composed.n_prefix)] + spans), seq_len,
                          stream=stream)
