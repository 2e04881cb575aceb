"""Session KV: the KV of conversation prefixes, kept so that the next turn pays only for its
new tokens (vLLM's automatic prefix caching, at the granularity of whole prefixes).

An entry is keyed by its exact token ids and holds their pre-RoPE keys and values per layer
(the form `Composed.prefix_keys` takes). A prefix is served from the longest entry that is a
token prefix of it: a hit when that entry is the whole prefix, else the entry's KV extended by
a forward over the remaining tokens only (attending to the entry's KV at their positions) —
the same numbers a prefill of the whole prefix computes for them, up to the matmuls' row count
(`kvedge.common.model.batch.ROW_MULTIPLE` explains why row counts can move the last bits).
Entries are evicted least recently used beyond `budget_bytes`; the chat prefix every single
question starts with is one of them like any other.

Entries are found by a scan over at most `max_entries` keys: a conversation's turns each leave
one entry, and a scan of a few hundred tuples costs microseconds beside a forward.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvedge.common.model.runtime import LayerCapture
from kvedge.edge import DEFAULT_SESSION_BYTES
from kvedge.edge.lru import ByteLRU


@dataclass
class PrefixKV:
    """A prefix's KV per layer, (Hkv, P, D) pre-RoPE keys and values, and how it was got."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    reused: int = 0   # tokens whose KV came from the cache (all of them on a hit)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@dataclass
class SessionStats:
    """Counts for the edge's metrics: prefixes served whole from the cache, extended from a
    shorter one, computed from nothing; tokens whose KV was reused; entries evicted."""

    hits: int = 0
    extended: int = 0
    misses: int = 0
    reused_tokens: int = 0
    evictions: int = 0


@dataclass
class PrefixCache:
    budget_bytes: int = DEFAULT_SESSION_BYTES
    max_entries: int = 512
    stats: SessionStats = field(default_factory=SessionStats)

    def __post_init__(self):
        self._entries: ByteLRU[PrefixKV] = ByteLRU(self.budget_bytes, self.max_entries)

    def kv(self, rt, ids: list[int]) -> PrefixKV:
        """The KV of `ids` (run on the model's thread: it may run a forward)."""
        key = tuple(ids)
        base, stored = self._longest(key)
        if len(base) == len(key):
            self.stats.hits += 1
            self.stats.reused_tokens += len(key)
            return PrefixKV(stored.keys, stored.values, reused=len(key))
        got = _extend(rt, stored, len(base), key)
        if base:
            self.stats.extended += 1
            self.stats.reused_tokens += len(base)
        else:
            self.stats.misses += 1
        self.put(key, got)
        return got

    def _longest(self, key: tuple[int, ...]) -> tuple[tuple[int, ...], PrefixKV | None]:
        best = max((k for k in self._entries.keys() if len(k) <= len(key)
                    and key[:len(k)] == k), key=len, default=())
        stored = self._entries.get(best) if best else None
        return (best, stored) if stored is not None else ((), None)  # evicted meanwhile

    def put(self, key: tuple[int, ...], kv: PrefixKV) -> None:
        """Keep `kv` as the KV of the token ids `key` (evicting beyond the budget)."""
        self.stats.evictions += self._entries.put(key, PrefixKV(kv.keys, kv.values), kv.nbytes)

    def clear(self) -> None:
        """Forget every prefix (a benchmark's cold start; the counts are kept)."""
        self._entries.clear()


def _extend(rt, stored: PrefixKV | None, n: int, key: tuple[int, ...]) -> PrefixKV:
    """`stored` (the KV of key[:n], or None when n = 0) extended over key[n:] by one forward
    that attends to it, at the RoPE length a prefill of the whole key would use."""
    ids, total = torch.tensor(key[n:]), len(key)
    if stored is None:
        cache = rt.empty_cache(reserve=total, seq_len=total)
    else:
        cache = rt.dense_cache(stored.keys, stored.values, torch.arange(n), reserve=total - n,
                               seq_len=total)
    capture = LayerCapture()
    rt.forward(ids, torch.arange(n, total), cache, capture=capture, logits="none",
               seq_len=total)
    if stored is None:
        return PrefixKV(capture.keys, capture.values)
    return PrefixKV([torch.cat([a, b], 1) for a, b in zip(stored.keys, capture.keys)],
                    [torch.cat([a, b], 1) for a, b in zip(stored.values, capture.values)],
                    reused=n)
