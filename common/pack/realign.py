"""Stored KV rows → the runtime's cache layout at target positions, one pass per layer.

A layer of a composed cache holds, per KV head, the rows of several *sources* one after
another — the chat prefix, then each segment — each with its own target positions. A source
hands out what it stores (`RowSource.stored`): dense rows (the prefix, a decoded context) or a
pack's pieces, still quantized (keys pre-RoPE, docs/design.md decision 1). `realign_layer` turns
every head of every source into rotated keys and values (A3 Eq. 2) in one pass:

- on CUDA the pieces of each quantization layout go through the fused
  `kernels.dequant_rope.dequant_rope_many` (Triton, one launch), dense pieces through
  `kernels.rope.apply_rope_at`;
- elsewhere — and as the kernel's reference — the pieces of a layer are dequantized together
  (one unpack and one `codes · scale + zero` per quantization layout), cast as the codec's
  `decode` casts them, and every key row is rotated at once with cos/sin gathered from a
  per-request table (`RopeTable`). Element by element these are the operations of decoding
  a pack and then `Runtime.realign`, so the result is the same to the bit.

`realign_pack` (one pack alone, per head) is the same pass with a single source.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from kvedge.common.model.kvcache import DenseKV, LayerKV, RaggedKV
from kvedge.common.pack.codecs import (FLOAT_DTYPES, Piece, decode_pieces, decode_tensors,
                                       piece_rows)
from kvedge.common.pack.errors import PackCorrupt
from kvedge.common.pack.format import Pack
from kvedge.common.pack.manifest import kv_name
from kvedge.kernels.dequant_rope import dequant_rope_many
from kvedge.kernels.quant import QuantizedTensor
from kvedge.kernels.rope import apply_rope_at, apply_rotary, rope_cos_sin, use_triton

Heads = list[list[torch.Tensor]]


@dataclass
class Stored:
    """One head's rows of one source as stored: pieces in row order, and the dtype they were
    encoded from (what a codec's `decode` casts to before anything else)."""

    pieces: list[Piece]
    dtype: torch.dtype

    def decode(self) -> torch.Tensor:
        """The rows (n, D) as a codec's `decode` returns them (torch reference, same bits)."""
        return decode_pieces(self.pieces, self.dtype)


class RowSource(Protocol):
    """What a layer is assembled from: per layer, each KV head's stored rows and their
    0-based index among the source's tokens (n_h,) int64."""

    def stored(self, layer: int, kind: str) -> list[Stored]: ...

    def local(self, layer: int) -> list[torch.Tensor]: ...

    def finish(self) -> None:
        """Called once every layer is assembled: checks that span layers."""


@dataclass
class DenseSource:
    """Dense per-layer K/V (Hkv, n, D) holding every token (the chat prefix)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    def stored(self, layer: int, kind: str) -> list[Stored]:
        x = (self.keys if kind == "k" else self.values)[layer]
        return [Stored([h], x.dtype) for h in x.unbind(0)]

    def local(self, layer: int) -> list[torch.Tensor]:
        n_kv, n, _ = self.keys[layer].shape
        return [torch.arange(n)] * n_kv

    def finish(self) -> None:
        return None


class ContextSource:
    """A decoded `KVContext` (maybe ragged per head)."""

    def __init__(self, ctx):
        self.ctx = ctx

    def stored(self, layer: int, kind: str) -> list[Stored]:
        heads = (self.ctx.keys if kind == "k" else self.ctx.values)[layer]
        return [Stored([x], x.dtype) for x in heads]

    def local(self, layer: int) -> list[torch.Tensor]:
        return [self.ctx.ranks(layer, h) for h in range(self.ctx.n_kv_heads)]

    def finish(self) -> None:
        return None


class PackSource:
    """An opened pack, decoded one layer at a time: each head's tensor is checksummed and
    entropy-decoded when its layer is assembled; quantized pieces stay quantized.

    `rows` (per layer and head: sorted indices among the head's stored rows) makes the
    loading block-granular: only those rows are dequantized and rotated (`Codec.take`); the
    whole tensor is still read and checksummed, so damage anywhere is still found."""

    def __init__(self, pack: Pack, rows: Heads | None = None):
        self.pack, self.rows = pack, rows
        self._locals = pack_locals(pack)
        if rows is not None:
            self._locals = [[held[r] for held, r in zip(layer, chosen, strict=True)]
                            for layer, chosen in zip(self._locals, rows, strict=True)]

    def stored(self, layer: int, kind: str) -> list[Stored]:
        return [self.head(layer, head, kind) for head in range(self.pack.manifest.n_kv_heads)]

    def head(self, layer: int, head: int, kind: str) -> Stored:
        """One head's stored rows (only the chosen ones, if rows were given)."""
        return stored_head(self.pack, layer, head, kind,
                           None if self.rows is None else self.rows[layer][head])

    def finish(self) -> None:
        """After the last layer: the payload bytes no tensor owns (safetensors header)."""
        self.pack.container.verify_payload()

    def local(self, layer: int) -> list[torch.Tensor]:
        return self._locals[layer]


def stored_head(pack: Pack, layer: int, head: int, kind: str,
                rows: torch.Tensor | None = None) -> Stored:
    """One head's keys ("k") or values ("v") as stored — checksummed and entropy-decoded,
    quantized pieces left quantized — or only its rows `rows` (sorted indices)."""
    name = kv_name(kind, layer, head)
    stored = pack.manifest.tensors[name].params.get("dtype")
    if stored not in FLOAT_DTYPES:
        raise PackCorrupt(f"params dtype {stored!r} is not a float dtype", name)
    return Stored(pack.pieces(name, rows), FLOAT_DTYPES[stored])


def pack_locals(pack: Pack) -> Heads:
    """Per (layer, head): the index of each kept row among the pack's tokens (n_h,)."""
    m = pack.manifest
    index = {p: i for i, p in enumerate(m.positions)}
    dense = torch.arange(m.n_tokens)
    return [[dense if len(kept) == m.n_tokens else
             torch.tensor([index[p] for p in kept], dtype=torch.long) for kept in layer]
            for layer in m.kept]


class RopeTable:
    """cos/sin (n, D) of positions 0..n-1 for one request's RoPE length, computed once and
    gathered per layer (`Runtime.realign` computes the same values for each call). Layers
    whose rows sit at the same positions (every dense layer) reuse one gather."""

    def __init__(self, inv_freq: torch.Tensor, scaling: float, n: int, device="cpu"):
        self.inv_freq, self.scaling = inv_freq, scaling
        self.cos, self.sin = rope_cos_sin(torch.arange(n, device=device), inv_freq, scaling)
        self._last: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def of(cls, rope, seq_len: int, n: int, device="cpu") -> "RopeTable":
        """For `kvedge.common.model.rope.Rope` at the request's length `seq_len`."""
        inv_freq, scaling = rope.frequencies(seq_len)
        return cls(inv_freq.to(device), scaling, n, device)

    def at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (N, D) of positions (N,)."""
        last = self._last
        if last is None or not torch.equal(last[0], positions):
            last = self._last = (positions, self.cos[positions], self.sin[positions])
        return last[1], last[2]

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x (..., N, D) pre-RoPE → rotated to positions (N,), arithmetic in x's dtype."""
        return apply_rotary(x, *self.at(positions))


# ---------------------------------------------------------------------- one layer
def realign_layer(sources: list[RowSource], offsets: list[int], layer: int, table: RopeTable,
                  *, realign: bool = True, dtype=torch.float32, device="cpu", full: int = -1,
                  reserve: int = 0) -> LayerKV:
    """Layer `layer` of a cache holding each source's rows at `offset` + their index.

    realign=False keeps the rotation of the positions each source was prefilled at (its own
    indices) while the cache positions are the composed ones. The layer is dense when every
    head holds `full` rows (each source whole), ragged otherwise.
    """
    k_stored = [s.stored(layer, "k") for s in sources]
    v_stored = [s.stored(layer, "v") for s in sources]
    locals_ = [s.local(layer) for s in sources]
    n_kv = len(locals_[0])
    order = [(i, h) for h in range(n_kv) for i in range(len(sources))]  # head-major rows
    sizes = torch.tensor([locals_[i][h].numel() for i, h in order]).view(n_kv, len(sources))
    counts = sizes.sum(1).tolist()
    dense = all(c == full for c in counts)  # then every head sits at head 0's positions
    chunks = order[: len(sources)] if dense else order
    local = torch.cat([locals_[i][h] for i, h in chunks])
    shift = torch.tensor(offsets).repeat(len(chunks) // len(sources))
    pos = local + shift.repeat_interleave(sizes.flatten()[: len(chunks)])
    keys = realign_rows([k_stored[i][h] for i, h in order], pos if realign else local, table,
                        dtype, device, n_kv if dense else 1)
    values = realign_rows([v_stored[i][h] for i, h in order], None, table, dtype, device)
    pos = pos.to(device)
    if dense:
        return DenseKV(keys.view(n_kv, full, -1), values.view(n_kv, full, -1), pos, reserve)
    return RaggedKV(list(keys.split(counts)), list(values.split(counts)),
                    list(pos.split(counts)), reserve)


def realign_rows(runs: list[Stored], positions: torch.Tensor | None, table: RopeTable,
                 dtype: torch.dtype, device, repeat: int = 1) -> torch.Tensor:
    """Every run's rows, concatenated (R, D) in `dtype` on `device`, rotated when positions
    are given: (R,), or (R / repeat,) for each of `repeat` equal blocks of rows (the heads
    of a dense layer). The fused kernel per piece on CUDA, one batched pass elsewhere."""
    pieces = [(p, run.dtype) for run in runs for p in run.pieces]
    if positions is not None:
        positions = positions.to(device)
    if use_triton(torch.empty(0, device=device)):
        return _fused_rows(pieces, None if positions is None else positions.repeat(repeat),
                           table, dtype, device)
    x = _decoded_rows(pieces, dtype, device)
    if positions is None:
        return x
    return table.rotate(x.view(repeat, -1, x.shape[-1]), positions).view(x.shape)


def _fused_rows(pieces, positions, table: RopeTable, dtype, device) -> torch.Tensor:
    """CUDA: the pieces of one quantization layout dequantized and rotated in one launch of
    the fused kernel (math in fp32, then `dtype`); float pieces (a chat prefix) rotated
    together by the RoPE kernel. One launch per layout, not per piece: a layer of 8 heads ×
    20 segments took 25 ms piece by piece on an H200, more than the batched torch pass."""
    def convert(layout, batch, pos):
        if isinstance(layout, tuple):
            return dequant_rope_many([p.to(device) for p in batch], pos, table.inv_freq,
                                     table.scaling, dtype)
        x = torch.cat([p.to(device, torch.float32) for p in batch])
        return (x if pos is None else apply_rope_at(x, pos, table.inv_freq,
                                                    table.scaling)).to(dtype)
    layouts = [_layout(p) for p, _ in pieces]
    return _by_layout(layouts, [p for p, _ in pieces], positions, convert)


def _by_layout(layouts: list, pieces: list[Piece], positions: torch.Tensor | None,
               convert) -> torch.Tensor:
    """Rows of `pieces` in order, each run of one layout converted together:
    `convert(layout, batch, positions of its rows or None)` → (Σn, D)."""
    groups: dict = {}
    for i, layout in enumerate(layouts):
        groups.setdefault(layout, []).append(i)
    sizes = [piece_rows(p) for p in pieces]
    if len(groups) == 1:
        ((layout, _),) = groups.items()
        return convert(layout, pieces, positions)
    starts = torch.tensor([0] + sizes).cumsum(0).tolist()
    parts: list[torch.Tensor | None] = [None] * len(pieces)
    for layout, members in groups.items():
        rows = None if positions is None else torch.cat(
            [positions[starts[i]: starts[i + 1]] for i in members])
        x = convert(layout, [pieces[i] for i in members], rows)
        for i, part in zip(members, x.split([sizes[i] for i in members])):
            parts[i] = part
    return torch.cat(parts)


def _decoded_rows(pieces: list[tuple[Piece, torch.dtype]], dtype, device) -> torch.Tensor:
    """Pieces → (R, D) rows in order, each as its codec's `decode` converts it (the quantized
    pieces of one layout and stored dtype dequantized together: `decode_tensors`), then cast
    to `dtype`."""
    return torch.cat(decode_tensors([([p.to(device)], stored) for p, stored in pieces])).to(dtype)


def _layout(piece: Piece):
    return piece.layout if isinstance(piece, QuantizedTensor) else piece.dtype



# ---------------------------------------------------------------------- one pack
@dataclass
class RealignedKV:
    """keys[l][h] (n_lh, D) rotated, values[l][h] (n_lh, D), positions[l][h] (n_lh,) int64."""

    keys: Heads
    values: Heads
    positions: Heads


def realign_pack(pack: Pack, inv_freq: torch.Tensor, scaling: float = 1.0,
                 target_positions: torch.Tensor | None = None, device="cpu",
                 dtype: torch.dtype = torch.float32) -> RealignedKV:
    """Decode every head of a pack straight into rotated cache tensors.

    target_positions (T,): the position each context token takes in the composed prompt
    (default: its original position). inv_freq and scaling: `Rope(config).frequencies(seq_len)`.
    """
    m = pack.manifest
    targets = torch.tensor(m.positions) if target_positions is None else target_positions
    if targets.shape != (m.n_tokens,):
        raise ValueError(f"target_positions must be ({m.n_tokens},), got {tuple(targets.shape)}")
    targets = targets.to(torch.long)
    table = RopeTable(inv_freq.to(device), scaling, int(targets.max()) + 1 if m.n_tokens else 0,
                      device)
    source = PackSource(pack)
    keys, values, positions = [], [], []
    for layer in range(m.n_layers):
        local = source.local(layer)
        counts = [int(r.numel()) for r in local]
        pos = targets[torch.cat(local)]
        keys.append(list(realign_rows(source.stored(layer, "k"), pos, table, dtype, device)
                         .split(counts)))
        values.append(list(realign_rows(source.stored(layer, "v"), None, table, dtype, device)
                           .split(counts)))
        positions.append(list(pos.to(device).split(counts)))
    source.finish()
    return RealignedKV(keys, values, positions)
