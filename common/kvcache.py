"""Explicit per-layer KV caches: dense (every KV head keeps the same positions) and ragged.

Keys in a cache are *post*-RoPE, rotated to the positions the composed prompt gives them
(realigned). Tokens are identified by position; positions in a cache are strictly increasing.
Two writes exist: `overwrite` (partial recompute replaces the K/V of positions already held —
a ragged head that evicted a position ignores it) and `append` (new tokens, after every held
position, go to every head). Buffers are preallocated and grow by doubling, gpt-fast style.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from kvedge.common.attention import gqa_attention
from kvedge.common.errors import CacheError


class HeadGroup(NamedTuple):
    """KV heads that hold the same positions: keys/values (h, n, D) at positions (n,).

    `first` is the index of the group's first KV head; a dense layer is one group of every
    head, a ragged layer one group per head. Scoring loops (A3, CacheBlend, eviction) iterate
    `layer.heads()` and never ask which kind of cache they hold.
    """

    first: int
    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor

    @property
    def kv_heads(self) -> slice:
        return slice(self.first, self.first + self.keys.shape[0])


class HeadBuffer:
    """Growable (capacity, D) K and V buffers plus the positions they hold, for one or more heads.

    k, v have a leading head axis (H, capacity, D) so a dense layer is one buffer of H heads and
    a ragged layer is H buffers of one head each.
    """

    def __init__(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, reserve: int = 0):
        n_heads, n, dim = k.shape
        self.n = n
        self.k = k.new_empty(n_heads, n + reserve, dim)
        self.v = v.new_empty(n_heads, n + reserve, v.shape[-1])
        self.pos = pos.new_empty(n + reserve)
        self.k[:, :n], self.v[:, :n], self.pos[:n] = k, v, pos

    @property
    def positions(self) -> torch.Tensor:
        return self.pos[: self.n]

    def view(self):
        return self.k[:, : self.n], self.v[:, : self.n], self.pos[: self.n]

    def slots_of(self, pos: torch.Tensor):
        """(slots, held): where each position sits, and whether it is held at all."""
        held = self.positions
        slots = torch.searchsorted(held, pos).clamp(max=max(self.n - 1, 0))
        found = held[slots] == pos if self.n else torch.zeros_like(pos, dtype=torch.bool)
        return slots, found

    def overwrite(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor, strict: bool) -> None:
        slots, found = self.slots_of(pos)
        if strict and not bool(found.all()):
            raise CacheError(f"recomputed positions {pos[~found].tolist()[:8]} are not in the cache")
        slots = slots[found]
        self.k[:, slots], self.v[:, slots] = k[:, found], v[:, found]

    def append(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        n_new = pos.numel()
        if self.n and n_new and int(pos[0]) <= int(self.pos[self.n - 1]):
            raise CacheError(f"appended position {int(pos[0])} is not after the cache's last "
                             f"position {int(self.pos[self.n - 1])}")
        if self.n + n_new > self.pos.numel():
            self._grow(self.n + n_new)
        self.k[:, self.n: self.n + n_new], self.v[:, self.n: self.n + n_new] = k, v
        self.pos[self.n: self.n + n_new] = pos
        self.n += n_new

    def truncate(self, last_pos: int) -> None:
        """Forget every position after `last_pos` (e.g. a question and its answer)."""
        self.n = int(torch.searchsorted(self.positions, torch.tensor(last_pos), right=True))

    def _grow(self, needed: int) -> None:
        capacity = max(needed, 2 * self.pos.numel(), 16)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_empty(old.shape[0], capacity, old.shape[2])
            new[:, : self.n] = old[:, : self.n]
            setattr(self, name, new)
        pos = self.pos.new_empty(capacity)
        pos[: self.n] = self.pos[: self.n]
        self.pos = pos

    def nbytes(self) -> int:
        return self.n * (self.k.shape[0] * (self.k.shape[2] + self.v.shape[2]) * self.k.element_size()
                         + self.pos.element_size())


class DenseKV:
    """One layer's KV, all KV heads holding the same positions: k, v (Hkv, T, D)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, reserve: int = 0):
        self.buf = HeadBuffer(k, v, pos, reserve)

    @classmethod
    def empty(cls, n_kv: int, dim: int, dtype, device, reserve: int = 0) -> "DenseKV":
        z = torch.empty(n_kv, 0, dim, dtype=dtype, device=device)
        return cls(z, z, torch.empty(0, dtype=torch.long, device=device), reserve)

    @property
    def max_pos(self) -> int:
        return int(self.buf.pos[self.buf.n - 1]) if self.buf.n else -1

    def overwrite(self, pos, k, v):
        self.buf.overwrite(pos, k, v, strict=True)

    def append(self, pos, k, v):
        self.buf.append(pos, k, v)

    def truncate(self, last_pos: int) -> None:
        self.buf.truncate(last_pos)

    def attend(self, q, q_pos, scale, window=None):
        """q (Hkv, G, Tq, D) → (Hkv, G, Tq, D)."""
        k, v, pos = self.buf.view()
        return gqa_attention(q, k, v, q_pos, pos, scale, window)

    def view(self):
        return self.buf.view()

    def heads(self) -> list[HeadGroup]:
        return [HeadGroup(0, *self.buf.view())]

    def nbytes(self) -> int:
        return self.buf.nbytes()

    def __len__(self):
        return self.buf.n


class RaggedKV:
    """One layer's KV where each KV head keeps its own sorted subset of positions (evicted).

    Nothing is padded to the full length: head h holds exactly its kept (n_h, D) keys/values.
    """

    def __init__(self, heads_k: list[torch.Tensor], heads_v: list[torch.Tensor],
                 heads_pos: list[torch.Tensor], reserve: int = 0):
        self.head_buffers = [HeadBuffer(k[None], v[None], p, reserve)
                      for k, v, p in zip(heads_k, heads_v, heads_pos)]

    @property
    def max_pos(self) -> int:
        return max((int(h.pos[h.n - 1]) for h in self.head_buffers if h.n), default=-1)

    def overwrite(self, pos, k, v):
        for h, head in enumerate(self.head_buffers):
            head.overwrite(pos, k[h: h + 1], v[h: h + 1], strict=False)

    def append(self, pos, k, v):
        for h, head in enumerate(self.head_buffers):
            head.append(pos, k[h: h + 1], v[h: h + 1])

    def truncate(self, last_pos: int) -> None:
        for head in self.head_buffers:
            head.truncate(last_pos)

    def attend(self, q, q_pos, scale, window=None):
        out = torch.empty_like(q)
        for h, head in enumerate(self.head_buffers):
            k, v, pos = head.view()
            out[h: h + 1] = gqa_attention(q[h: h + 1], k, v, q_pos, pos, scale, window)
        return out

    def heads(self) -> list[HeadGroup]:
        return [HeadGroup(h, *head.view()) for h, head in enumerate(self.head_buffers)]

    def nbytes(self) -> int:
        return sum(head.nbytes() for head in self.head_buffers)

    def kept(self) -> list[int]:
        return [head.n for head in self.head_buffers]


LayerKV = DenseKV | RaggedKV


def truncate_cache(cache: list[LayerKV], last_pos: int) -> None:
    """Drop everything after `last_pos` in every layer: the context stays, a turn is forgotten."""
    for layer in cache:
        layer.truncate(last_pos)


def cache_nbytes(cache: list[LayerKV]) -> int:
    """Bytes the cache's live K/V (and positions) occupy: what eviction must shrink."""
    return sum(layer.nbytes() for layer in cache)
