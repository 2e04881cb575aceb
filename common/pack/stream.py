"""Read a pack while its bytes arrive: each layer's keys and values decoded as soon as that
layer's tensors are in and checksummed (issue 26, 2: layer-wise streaming over the network).

A format-2 pack is laid out for this (container.py): the header and manifest come first, then
the payload, the tensors' parts end to end in `Manifest.expected_tensors` order — layer 0's
keys (every KV head), its values, then layer 1's, …, and last the side tensors of every layer
(block summaries, the query cache: a few % of a pack, read only by SamKV, which selects over
all layers at once from a whole pack). So `PackStream.feed` hands out layer l once the bytes up
to its last value head have arrived, and `finish` the KVContext once the rest has, equal bit
for bit to `read_pack` over the same bytes.

What is checked when: the header and the manifest (against the header's hash) before any
tensor is decoded, the model fingerprint then too (ModelMismatch); each tensor against its
own checksum before it is decoded, so a layer is handed out only whole and verified, and a
damaged byte in layer k is PackCorrupt naming its tensor before layer k comes out. Only
`finish` checks the bytes against the pack id (blake3 over the whole file) and the header's
payload hash: until then a consistent pack other than the one asked for (a wrong or forged
one) is not told apart, so a caller acts on what it decoded only after `finish`.

Format-1 packs (a safetensors payload, no longer written) have no layout to stream by: their
bytes are kept and read whole by `finish`, and their layers come out then.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator

import blake3
import torch

from kvedge.common.pack.container import (HEADER_SIZE, RawPart, open_container, read_header,
                                          read_manifest, tensor_checksum)
from kvedge.common.pack.context import KVContext
from kvedge.common.pack.errors import PackCorrupt
from kvedge.common.pack.format import (SIDE, Pack, build_context, cached_codec, check_model,
                                       decode_parts, decode_together, stored_pieces)
from kvedge.common.pack.manifest import Manifest, kv_name


@dataclass(frozen=True)
class Layer:
    """One layer of a pack, decoded and verified: per KV head (n_kept, D), pre-RoPE."""

    index: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


@dataclass(frozen=True)
class _Span:
    """One payload tensor's place: its parts' (name, dtype, shape, bytes), in order."""

    name: str
    parts: tuple[tuple[str, str, tuple[int, ...], int], ...]

    @property
    def nbytes(self) -> int:
        return sum(size for *_, size in self.parts)


@dataclass
class PackStream:
    """Feed a pack's bytes in order (`feed`), then `finish`. `pack_id`: the content address
    the bytes must hash to (checked by `finish`); `model_fingerprint`: the model they must
    belong to (checked when the manifest arrives)."""

    model_fingerprint: str | None = None
    pack_id: str | None = None
    manifest: Manifest | None = field(default=None, init=False)
    received: int = field(default=0, init=False)  # bytes fed so far
    _buf: bytearray = field(default_factory=bytearray, init=False, repr=False)
    _whole: object = field(default_factory=blake3.blake3, init=False, repr=False)
    _payload: object = field(default_factory=blake3.blake3, init=False, repr=False)
    _header: tuple | None = field(default=None, init=False, repr=False)
    _spans: list[_Span] = field(default_factory=list, init=False, repr=False)
    _next: int = field(default=0, init=False, repr=False)  # first span not yet decoded
    _tensors: dict[str, torch.Tensor] = field(default_factory=dict, init=False, repr=False)
    _codecs: dict = field(default_factory=dict, init=False, repr=False)
    _old: bytearray | None = field(default=None, init=False, repr=False)  # format 1: all bytes

    def feed(self, data: bytes | memoryview) -> list[Layer]:
        """Take the next bytes; the layers they complete, verified and decoded."""
        self.received += len(data)
        self._whole.update(data)
        if self._old is not None:
            self._old += data
            return []
        self._buf += data
        if self.manifest is None and not self._read_front():
            return []
        return self._decode_ready()

    def _read_front(self) -> bool:
        """Parse the header and manifest once they are in (True then)."""
        if self._header is None:
            if len(self._buf) < HEADER_SIZE:
                return False
            self._header = read_header(bytes(self._buf[:HEADER_SIZE]))
        version, m_len, p_len, _, _ = self._header
        if len(self._buf) < HEADER_SIZE + m_len:
            return False
        self.manifest = read_manifest(bytes(self._buf[:HEADER_SIZE + m_len]))
        check_model(self.manifest, self.model_fingerprint)
        if version < 2:  # no layout: read whole at the end
            self._old, self._buf = bytearray(self._buf), bytearray()
            return False
        del self._buf[:HEADER_SIZE + m_len]
        self._spans = _spans(self.manifest)
        laid_out = sum(s.nbytes for s in self._spans)
        if laid_out != p_len:
            raise PackCorrupt(f"manifest lays out {laid_out:,} payload bytes, the header "
                              f"records {p_len:,}")
        return True

    def _decode_ready(self) -> list[Layer]:
        """Verify every tensor whose bytes are all in, decode them together
        (`decode_together`: one dequantization per layout); the layers completed."""
        names, stored = [], []
        while self._next < len(self._spans) and self._spans[self._next].nbytes <= len(self._buf):
            span = self._spans[self._next]
            names.append(span.name)
            stored.append(self._verified(span))
            self._next += 1
        self._tensors.update(zip(names, decode_together(self.manifest, names, stored)))
        completed = (_last_of_layer(self.manifest, name) for name in names)
        return [self._layer(layer) for layer in completed if layer is not None]

    def _verified(self, span: _Span) -> tuple:
        """One tensor's bytes taken off the buffer and verified: its pieces and stored dtype."""
        raw = bytes(self._buf[:span.nbytes])
        del self._buf[:span.nbytes]
        self._payload.update(raw)
        parts, offset = [], 0
        for part, dtype, shape, size in span.parts:
            parts.append((part, RawPart(dtype, shape, memoryview(raw)[offset:offset + size])))
            offset += size
        entry = self.manifest.tensors[span.name]
        if tensor_checksum(span.name, entry.codec, entry.params, parts) != entry.checksum:
            raise PackCorrupt("checksum mismatch", span.name)
        return decode_parts(self.manifest, span.name, parts,
                            cached_codec(self._codecs, entry.codec), stored_pieces)

    def _layer(self, layer: int) -> Layer:
        heads = range(self.manifest.n_kv_heads)
        return Layer(layer, [self._tensors[kv_name("k", layer, h)] for h in heads],
                     [self._tensors[kv_name("v", layer, h)] for h in heads])

    def finish(self) -> KVContext:
        """After the last byte: the pack checked whole (length, payload hash, pack id), then
        its context. PackCorrupt if anything is missing, extra or wrong."""
        if self._old is not None:
            return self._finish_old()
        if self.manifest is None:
            raise PackCorrupt(f"the stream ended after {self.received:,} bytes, before the "
                              "pack's header and manifest")
        missing = sum(s.nbytes for s in self._spans[self._next:]) - len(self._buf)
        if missing > 0:
            raise PackCorrupt(f"the stream ended {missing:,} bytes short of the pack",
                              self._spans[self._next].name)
        if self._buf:
            raise PackCorrupt(f"the stream runs {len(self._buf):,} bytes past the pack's end")
        if self._payload.digest() != self._header[4]:
            raise PackCorrupt("payload checksum mismatch outside every tensor")
        self._check_id()
        m = self.manifest
        heads = {kind: [[self._tensors[kv_name(kind, layer, h)] for h in range(m.n_kv_heads)]
                        for layer in range(m.n_layers)] for kind in ("k", "v")}
        side = {key: [self._tensors[f"{prefix}.{layer}"] for layer in range(m.n_layers)]
                for key, prefix in SIDE if key in m.side}
        return build_context(m, heads["k"], heads["v"], side)

    def _check_id(self) -> None:
        if self.pack_id is not None and self._whole.hexdigest() != self.pack_id:
            raise PackCorrupt("content hash does not match the pack id")

    def _finish_old(self) -> KVContext:
        self._check_id()
        data = bytes(self._old)
        return Pack(data, open_container(data)).context()


def _spans(manifest: Manifest) -> list[_Span]:
    """Every payload tensor's parts, in the order the payload lays them out."""
    spans = []
    for name in manifest.expected_tensors():
        entry = manifest.tensors[name]
        parts = tuple((part, dtype, shape, size) for part, (dtype, shape), size
                      in zip(entry.parts, entry.layout, entry.part_sizes()))
        spans.append(_Span(name, parts))
    return spans


def _last_of_layer(manifest: Manifest, name: str) -> int | None:
    """The layer whose keys and values `name` completes (its last value head), else None."""
    kind, *idx = name.split(".")
    if kind == "v" and int(idx[1]) == manifest.n_kv_heads - 1:
        return int(idx[0])
    return None


def stream_pack(chunks: Iterable[bytes], model_fingerprint: str | None = None,
                pack_id: str | None = None) -> Iterator[Layer | KVContext]:
    """Each `Layer` as soon as the chunks complete it, then the whole pack's KVContext
    (format-1 packs: every layer at the end)."""
    stream = PackStream(model_fingerprint, pack_id)
    for chunk in chunks:
        yield from stream.feed(chunk)
    ctx = stream.finish()
    if stream.manifest.version < 2:
        yield from (Layer(layer, ctx.keys[layer], ctx.values[layer])
                    for layer in range(ctx.n_layers))
    yield ctx
