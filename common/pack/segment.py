"""PackSegment: an opened pack standing in for its KVContext in a composed prompt
(`ManifestSegment`: the part of that surface a manifest alone gives, shared with the edge's
packs still arriving, `kvedge.edge.arriving`).

What a composed prompt and the strategies read about a segment's tokens — ids, positions,
kept positions per (layer, head), block size — comes from the verified manifest at once; the
tensors stay encoded in the pack. The edge's loader (`realign.PackSource`) decodes them layer
by layer straight into the cache; a strategy that reads whole tensors (SamKV reads keys and
side tensors before its forward) decodes them once, on first use (`context`).
"""
from __future__ import annotations

import threading
from functools import cached_property

import torch

from kvedge.common.pack.context import KVContext, held_indices
from kvedge.common.pack.format import Pack, open_pack
from kvedge.common.pack.manifest import Manifest
from kvedge.common.pack.realign import ContextSource, PackSource, RowSource, stored_head


class ManifestSegment:
    """What a composed prompt and the strategies read about a segment's tokens, from its
    verified manifest alone: ids, positions, kept positions per (layer, head), block size.
    Its tensors come from a subclass (`context`, `row_source`)."""

    def __init__(self, manifest: Manifest):
        m = self.manifest = manifest
        self.model_fingerprint, self.tokenizer_id = m.model_fingerprint, m.tokenizer_id
        self.token_ids, self.positions = m.token_ids, m.positions
        self.segments, self.namespace = [tuple(s) for s in m.segments], m.namespace
        self.anchor = list(m.anchor)
        self.block_size = m.side.get("block_summaries", {}).get("block_size", 64)
        self.position_index = every = torch.tensor(m.positions, dtype=torch.long)
        self.kept_positions = [[every if len(kept) == m.n_tokens else
                                torch.tensor(kept, dtype=torch.long) for kept in layer]
                               for layer in m.kept]

    @property
    def n_layers(self) -> int:
        return self.manifest.n_layers

    @property
    def n_kv_heads(self) -> int:
        return self.manifest.n_kv_heads

    @property
    def head_dim(self) -> int:
        return self.manifest.head_dim

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    ranks = KVContext.ranks  # over `position_index`, made once in __init__

    def context(self) -> KVContext:
        raise NotImplementedError

    @property
    def keys(self):
        return self.context().keys

    @property
    def values(self):
        return self.context().values

    @cached_property
    def block_summaries(self) -> list[torch.Tensor] | None:
        return self.context().block_summaries

    @cached_property
    def query_cache(self) -> list[torch.Tensor] | None:
        return self.context().query_cache


class PackSegment(ManifestSegment):
    """A KVContext's read-only surface over an opened pack (see the module docstring)."""

    def __init__(self, pack: Pack, keep=None):
        super().__init__(pack.manifest)
        self.pack = pack
        self.rows = None  # block-granular: per (layer, head) the stored rows kept (`select`)
        if keep is not None:
            self.rows = held_indices(self.kept_positions, keep)
            self.kept_positions = [[h[r] for h, r in zip(held, rows)]
                                   for held, rows in zip(self.kept_positions, self.rows)]
        self._decoded: KVContext | None = None
        self._lock = threading.Lock()

    @classmethod
    def open(cls, source, model_fingerprint: str | None = None) -> "PackSegment":
        """A path or bytes (ModelMismatch if the pack belongs to another model)."""
        return cls(open_pack(source, model_fingerprint))

    # ------------------------------------------------------------------ tensors
    def context(self) -> KVContext:
        """The pack decoded (every checksum verified), once: only the kept rows of a
        selection (decoded whole, then selected)."""
        with self._lock:
            if self._decoded is None:
                whole = self.pack.context()
                self._decoded = whole if self.rows is None else whole.select(self.kept_positions)
            return self._decoded

    def row_source(self) -> RowSource:
        """What the loader assembles from: the decoded context if a strategy already asked
        for it, else the pack, decoded layer by layer (only the selected rows)."""
        return ContextSource(self._decoded) if self._decoded is not None \
            else PackSource(self.pack, self.rows)

    def select(self, keep) -> "PackSegment":
        """Block-granular: a view keeping, per (layer, head), the given positions (a subset
        of those held); the loader dequantizes only them. Nothing is decoded here."""
        if self.rows is not None:
            return self.context().select(keep)
        return PackSegment(self.pack, keep)

    def held_rows(self, layer: int, head: int, kind: str, rows: torch.Tensor) -> torch.Tensor:
        """Rows `rows` (bool mask or indices among the head's held rows) of one head's keys
        ("k", pre-RoPE) or values ("v"), decoded alone."""
        if self._decoded is not None or self.rows is not None:
            return (self.context().keys if kind == "k" else self.context().values)[layer][head][rows]
        index = torch.nonzero(rows).flatten() if rows.dtype == torch.bool else rows
        return stored_head(self.pack, layer, head, kind, index).decode()

    @cached_property
    def block_summaries(self) -> list[torch.Tensor] | None:
        return self._side("block_summaries", "summary")

    @cached_property
    def query_cache(self) -> list[torch.Tensor] | None:
        return self._side("query_cache", "qcache")

    def _side(self, key: str, prefix: str) -> list[torch.Tensor] | None:
        if key not in self.pack.manifest.side:
            return None
        return [self.pack.tensor(f"{prefix}.{layer}") for layer in range(self.n_layers)]
