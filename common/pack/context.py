"""KVContext: one context's KV in memory, exactly what a pack holds (docs/design.md, decision 2).

Every (layer, KV head) keeps its own sorted list of original positions — ragged after
eviction, nothing padded. Keys are pre-RoPE (decision 1). Two optional side tensors travel
with the KV for SamKV (arXiv:2508.11661): per-block key summaries, which let the edge select
blocks without loading them, and the pre-RoPE queries of the context's last tokens, from
which SamKV builds its personalized query vectors (Eq. 1). `anchor` records how the KV was
prefilled (decision 9): behind those token ids, or alone from position 0 when empty.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

import torch

Heads = list[list[torch.Tensor]]  # [layer][kv head]


@dataclass
class KVContext:
    """Shapes: keys[l][h], values[l][h] (n_lh, D); kept_positions[l][h] (n_lh,) int64 sorted;
    block_summaries[l] (Hkv, ceil(T / block_size), D); query_cache[l] (Hq, n_q, D)."""

    model_fingerprint: str
    tokenizer_id: str
    token_ids: list[int]
    positions: list[int]             # original position of each token, strictly increasing
    keys: Heads                      # pre-RoPE
    values: Heads
    kept_positions: Heads
    segments: list[tuple[int, int]] = field(default_factory=list)  # [start, end) token ranges
    namespace: str = "default"
    block_size: int = 64
    block_summaries: list[torch.Tensor] | None = None
    query_cache: list[torch.Tensor] | None = None  # queries of the last n_q tokens
    anchor: list[int] = field(default_factory=list)  # prefilled behind these ids; [] = alone

    def __post_init__(self):
        self.segments = [tuple(s) for s in self.segments] or [(0, len(self.token_ids))]
        if not (len(self.keys) == len(self.values) == len(self.kept_positions)) or not self.keys:
            raise ValueError("keys, values and kept_positions need the same number of layers")
        for layer in range(self.n_layers):
            heads = zip(self.keys[layer], self.values[layer], self.kept_positions[layer],
                        strict=True)
            for k, v, p in heads:
                if k.shape != v.shape or k.shape != (p.numel(), self.head_dim):
                    raise ValueError(f"layer {layer}: keys {tuple(k.shape)}, values "
                                     f"{tuple(v.shape)} and {p.numel()} kept positions differ")

    # ------------------------------------------------------------------ shape
    @property
    def n_layers(self) -> int:
        return len(self.keys)

    @property
    def n_kv_heads(self) -> int:
        return len(self.keys[0])

    @property
    def head_dim(self) -> int:
        return self.keys[0][0].shape[-1]

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @cached_property
    def position_index(self) -> torch.Tensor:
        """`positions` as a tensor (int64), made once: `ranks` searches it per (layer, head)."""
        return torch.tensor(self.positions, dtype=torch.long)

    def ranks(self, layer: int, head: int) -> torch.Tensor:
        """(n_lh,) index of each kept row among the context's tokens."""
        return torch.searchsorted(self.position_index, self.kept_positions[layer][head])

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_dense(cls, keys: list[torch.Tensor], values: list[torch.Tensor],
                   token_ids: list[int], *, model_fingerprint: str, tokenizer_id: str,
                   positions: list[int] | None = None, queries: list[torch.Tensor] | None = None,
                   query_tokens: int = 64, block_size: int = 64, summaries: bool = True,
                   **fields) -> "KVContext":
        """From what a prefill returns: keys/values per layer (Hkv, T, D), every position kept;
        queries per layer (Hq, T, D) (optional) give the query cache of the last tokens."""
        n = len(token_ids)
        positions = list(range(n)) if positions is None else [int(p) for p in positions]
        pos = torch.tensor(positions, dtype=torch.long)
        ctx = cls(model_fingerprint, tokenizer_id, [int(t) for t in token_ids], positions,
                  [list(k.unbind(0)) for k in keys], [list(v.unbind(0)) for v in values],
                  [[pos] * k.shape[0] for k in keys], block_size=block_size, **fields)
        if summaries:
            ctx.block_summaries = [block_summaries(k, torch.arange(n), n, block_size)
                                   for k in keys]
        if queries is not None:
            ctx.query_cache = [q[:, -query_tokens:].contiguous() for q in queries]
        return ctx

    def held_rows(self, layer: int, head: int, kind: str, rows: torch.Tensor) -> torch.Tensor:
        """Rows `rows` (mask or indices among the head's held rows) of one head's keys ("k",
        pre-RoPE) or values ("v"); `PackSegment.held_rows` decodes only them."""
        return (self.keys if kind == "k" else self.values)[layer][head][rows]

    def select(self, keep: Heads) -> "KVContext":
        """A ragged copy keeping, per (layer, head), the given positions (a subset of kept)."""
        keys, values, kept = [], [], []
        for layer, rows in enumerate(held_indices(self.kept_positions, keep)):
            keys.append([k[r] for k, r in zip(self.keys[layer], rows)])
            values.append([v[r] for v, r in zip(self.values[layer], rows)])
            kept.append([p[r] for p, r in zip(self.kept_positions[layer], rows)])
        return replace(self, keys=keys, values=values, kept_positions=kept)

    def evicted(self, keep: Heads) -> "KVContext":
        """What an eviction ships: `select(keep)` without the block summaries once any row is
        dropped. Decision: the stored summaries are means over every key of a block, evicted
        ones included, and cost 64-dim fp16 per (layer, KV head, block) whatever the budget —
        measured on SmolLM2-shaped KV of 1.5K tokens, int4+zstd: 34 % of the pack at 5 %
        (41.8× → 62.9× below fp16), 22 % at 10 % (27.1× → 34.6×). What reads them (SamKV)
        derives them from the kept keys instead (`ragged_block_summaries`), so they are not
        shipped; a context nothing was evicted from keeps them. The pack then records no
        block size: a reader takes the default 64, which every cloud prefill uses."""
        out = self.select(keep)
        if any(w.numel() < h.numel() for have, want in zip(self.kept_positions, keep)
               for h, w in zip(have, want)):
            out.block_summaries = None
        return out


def held_indices(held: Heads, keep: Heads) -> Heads:
    """Per (layer, head): the index among the held rows of each position kept (ValueError
    if one is not held)."""
    out = []
    for layer, (have, want) in enumerate(zip(held, keep, strict=True)):
        rows = [torch.searchsorted(h, w.to(torch.long).contiguous())
                for h, w in zip(have, want, strict=True)]
        for h, w, r in zip(have, want, rows):
            if r.numel() and (r.max() >= h.numel() or not torch.equal(h[r], w)):
                raise ValueError(f"layer {layer}: can only keep positions already held")
        out.append(rows)
    return out


def block_summaries(keys: torch.Tensor, ranks: torch.Tensor, n_tokens: int,
                    block_size: int = 64) -> torch.Tensor:
    """Mean pre-RoPE key per block of `block_size` context tokens (SamKV's block summary).

    keys (H, n, D) at token indices ranks (n,) → (H, ceil(n_tokens / block_size), D) fp32.
    Blocks are fixed by token index, so summaries of a ragged head still line up with the
    context's blocks; a block with no kept key summarizes to zeros.
    """
    n_blocks = -(-n_tokens // block_size)
    block = ranks.to(torch.long) // block_size
    sums = keys.new_zeros(keys.shape[0], n_blocks, keys.shape[-1], dtype=torch.float32)
    sums.index_add_(1, block, keys.to(torch.float32))
    counts = torch.zeros(n_blocks).index_add_(0, block, torch.ones(block.numel()))
    return sums / counts.clamp(min=1)[None, :, None]


def ragged_block_summaries(ctx: KVContext) -> list[torch.Tensor]:
    """Block summaries from what each head kept: per layer (Hkv, n_blocks, D)."""
    return [torch.cat([block_summaries(k[None], ctx.ranks(layer, head), ctx.n_tokens,
                                       ctx.block_size)
                       for head, k in enumerate(ctx.keys[layer])])
            for layer in range(ctx.n_layers)]
