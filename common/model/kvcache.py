"""Explicit per-layer KV caches: dense (every KV head keeps the same positions) and ragged.

Keys in a cache are *post*-RoPE, rotated to the positions the composed prompt gives them
(realigned). Tokens are identified by position; positions in a cache are strictly increasing.

A request's cache is a `KVCache`: one layer per transformer layer, the *extent* of its context
(the positions it covers, held or evicted) and its one RoPE length. One write exists,
`LayerKV.write`: a recomputed token (inside the extent) overwrites the K/V of its position — a
ragged head that evicted it keeps nothing — and a fresh token (outside it) is inserted at its
position in every head, after the held ones or between them (SparseX Sec. 3–4: fresh text
between cached segments). Every write returns its undo, so a failed forward restores the cache
exactly. Buffers are preallocated and grow by doubling, gpt-fast style; `extend` is the append
alone, for a caller that knows its tokens lie past everything held (the batched decode step).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from kvedge.common.model.attention import OwnKV, gqa_attention
from kvedge.common.errors import CacheError

Undo = Callable[[], None]
# fuse(old, new) → what an overwritten slot stores, K and V alike (SamKV Eq. 4's fusion)
Fuse = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _nothing() -> None:
    return None


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

    def write(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fresh: torch.Tensor,
              strict: bool, fuse: Fuse | None = None) -> tuple[Undo, torch.Tensor | None]:
        """K/V (H, N, D) of tokens at sorted positions (N,); fresh (N,) marks the inserted ones.

        Recomputed tokens overwrite their slot; one this buffer does not hold is skipped, or a
        CacheError when `strict` (a dense layer evicts nothing). Returns (undo, held): held (N,)
        says whose fresh K/V the buffer now holds (None: everyone's). `fuse(old, new)`, if
        given, is what an overwritten slot stores instead of the new K (and V) alone.
        """
        n_fresh = int(fresh.sum())
        if n_fresh == pos.numel():  # prefill, decode, fresh text: nothing to overwrite
            return self.insert(pos, k, v), None
        slots, found = self.slots_of(pos)
        if strict and not bool((found | fresh).all()):
            raise CacheError(f"recomputed positions {pos[~(found | fresh)].tolist()[:8]} are not "
                             "in the cache (a dense layer holds every position of its context)")
        old = found & ~fresh
        k_old, v_old = k[:, old], v[:, old]
        if fuse is not None:
            k_old = fuse(self.k[:, slots[old]], k_old)
            v_old = fuse(self.v[:, slots[old]], v_old)
        undo_old = self.overwrite_slots(slots[old], k_old, v_old)
        undo_new = self.insert(pos[fresh], k[:, fresh], v[:, fresh]) if n_fresh else _nothing
        held = None if strict else found | fresh
        return (lambda: (undo_new(), undo_old())), held

    def overwrite_slots(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Undo:
        old_k, old_v = self.k[:, slots], self.v[:, slots]  # copies: what the undo puts back
        self.k[:, slots], self.v[:, slots] = k, v

        def undo():
            self.k[:, slots], self.v[:, slots] = old_k, old_v
        return undo

    def insert(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Undo:
        """Fresh K/V at positions the buffer does not hold, wherever they fall; returns the undo."""
        n, m = self.n, pos.numel()
        if m == 0:
            return _nothing
        if n == 0 or int(pos[0]) > int(self.pos[n - 1]):  # after everything held
            return self.extend(pos, k, v)
        if n + m > self.pos.numel():
            self._grow(n + m)
        return self._merge(pos, k, v)

    def extend(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Undo:
        """Fresh K/V (H, m, D) at positions (m,) after every held one, appended without looking
        (the caller knows: a decoded token lies past its cache's extent); returns the undo."""
        n, m = self.n, pos.numel()
        if n + m > self.pos.numel():
            self._grow(n + m)
        self.k[:, n: n + m], self.v[:, n: n + m], self.pos[n: n + m] = k, v, pos
        self.n = n + m
        return lambda: setattr(self, "n", n)

    def _merge(self, pos, k, v) -> Undo:
        """Insert between held positions: the held tail after the first insertion point moves
        right by the number of fresh positions before each of its tokens."""
        n, held = self.n, self.positions
        at = torch.searchsorted(held, pos)
        if bool((held[at.clamp(max=n - 1)] == pos).any()):
            raise CacheError("fresh positions are already held: the cache's extent must cover "
                             "every position it holds")
        new_slots = at + torch.arange(pos.numel(), device=pos.device)
        first = int(at[0])
        shift = torch.searchsorted(pos, held[first:])  # fresh positions before each held one
        tail_slots = torch.arange(first, n, device=pos.device) + shift
        for buf, new in ((self.k, k), (self.v, v)):
            buf[:, tail_slots] = buf[:, first:n].clone()
            buf[:, new_slots] = new
        self.pos[tail_slots] = held[first:].clone()
        self.pos[new_slots] = pos
        self.n = n + pos.numel()
        return lambda: self._remove(new_slots)

    def _remove(self, slots: torch.Tensor) -> None:
        keep = torch.ones(self.n, dtype=torch.bool, device=slots.device)
        keep[slots] = False
        idx = keep.nonzero().flatten()
        m = idx.numel()
        self.k[:, :m], self.v[:, :m], self.pos[:m] = self.k[:, idx], self.v[:, idx], self.pos[idx]
        self.n = m

    def truncate(self, last_pos: int) -> None:
        """Forget every position after `last_pos` (e.g. a question and its answer)."""
        self.n = int(torch.searchsorted(self.positions, torch.tensor(last_pos)
                                        .to(self.pos.device), right=True))

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

    def write(self, pos, k, v, fresh, fuse: Fuse | None = None
              ) -> tuple[Undo, torch.Tensor | None]:
        """See `HeadBuffer.write`; returns (undo, None): every written token is held."""
        return self.buf.write(pos, k, v, fresh, strict=True, fuse=fuse)

    def overwrite(self, pos, k, v) -> Undo:
        return self.write(pos, k, v, torch.zeros_like(pos, dtype=torch.bool))[0]

    def append(self, pos, k, v) -> Undo:
        return self.buf.insert(pos, k, v)

    def extend(self, pos, k, v) -> Undo:
        """See `HeadBuffer.extend`: positions after every held one (decode's hot path)."""
        return self.buf.extend(pos, k, v)

    def truncate(self, last_pos: int) -> None:
        self.buf.truncate(last_pos)

    def attend(self, q, q_pos, scale, window=None, own: OwnKV | None = None):
        """q (Hkv, G, Tq, D) → (Hkv, G, Tq, D); `own`: see `gqa_attention`."""
        k, v, pos = self.buf.view()
        return gqa_attention(q, k, v, q_pos, pos, scale, window, own)

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

    def write(self, pos, k, v, fresh, fuse: Fuse | None = None
              ) -> tuple[Undo, torch.Tensor | None]:
        """Per head (see `HeadBuffer.write`): a head that evicted a recomputed position keeps
        nothing of it. Returns (undo, held (Hkv, N) | None)."""
        undos, held = [], []
        for h, head in enumerate(self.head_buffers):
            undo, kept = head.write(pos, k[h: h + 1], v[h: h + 1], fresh, strict=False,
                                    fuse=fuse)
            undos.append(undo)
            held.append(kept)
        if all(kept is None for kept in held):
            return _chain(undos), None
        ones = torch.ones_like(fresh)
        return _chain(undos), torch.stack([ones if kept is None else kept for kept in held])

    def overwrite(self, pos, k, v) -> Undo:
        return self.write(pos, k, v, torch.zeros_like(pos, dtype=torch.bool))[0]

    def append(self, pos, k, v) -> Undo:
        return _chain([head.insert(pos, k[h: h + 1], v[h: h + 1])
                       for h, head in enumerate(self.head_buffers)])

    def extend(self, pos, k, v) -> Undo:
        """See `HeadBuffer.extend`: positions after every one any head holds."""
        return _chain([head.extend(pos, k[h: h + 1], v[h: h + 1])
                       for h, head in enumerate(self.head_buffers)])

    def truncate(self, last_pos: int) -> None:
        for head in self.head_buffers:
            head.truncate(last_pos)

    def attend(self, q, q_pos, scale, window=None, own: OwnKV | None = None):
        """Per KV head over exactly its kept keys; `own`: see `gqa_attention`."""
        out = torch.empty_like(q)
        for h, head in enumerate(self.head_buffers):
            k, v, pos = head.view()
            mine = None if own is None else own.head(h)
            out[h: h + 1] = gqa_attention(q[h: h + 1], k, v, q_pos, pos, scale, window, mine)
        return out

    def heads(self) -> list[HeadGroup]:
        return [HeadGroup(h, *head.view()) for h, head in enumerate(self.head_buffers)]

    def nbytes(self) -> int:
        return sum(head.nbytes() for head in self.head_buffers)

    def kept(self) -> list[int]:
        return [head.n for head in self.head_buffers]


LayerKV = DenseKV | RaggedKV


def kept_rows(layer: LayerKV, keep: list[torch.Tensor], reserve: int = 0) -> LayerKV:
    """The layer holding in each KV head h only its rows where keep[h] ((n_h,) bool over the
    rows it holds, in order): eviction from a request's cache, after which attention runs
    over exactly the kept rows (`aligned`: dense if every head keeps the same positions).
    `reserve`: room per head for the tokens still to come."""
    ks, vs, ps = [], [], []
    for group in layer.heads():
        for h in range(group.keys.shape[0]):
            rows = keep[group.first + h].to(group.positions.device)
            ks.append(group.keys[h, rows])
            vs.append(group.values[h, rows])
            ps.append(group.positions[rows])
    return aligned(RaggedKV(ks, vs, ps, reserve), reserve)


def aligned(layer: LayerKV, reserve: int = 0) -> LayerKV:
    """A ragged layer whose KV heads all hold the same positions as one dense layer — one
    attention call per layer instead of one per head (decoding over SamKV's block selection,
    shared by a layer's heads) — any other layer as it is. Only for a cache that is past
    its recompute: a dense layer refuses writes to positions it does not hold."""
    if not isinstance(layer, RaggedKV):
        return layer
    heads = layer.heads()
    first = heads[0].positions
    if any(not torch.equal(g.positions, first) for g in heads[1:]):
        return layer
    return DenseKV(torch.cat([g.keys for g in heads]), torch.cat([g.values for g in heads]),
                   first, reserve)


def _chain(undos: list[Undo]) -> Undo:
    """One undo running `undos` last to first."""
    def undo():
        for step in reversed(undos):
            step()
    return undo


class Extent:
    """The positions a context covers, held or evicted, as sorted disjoint [start, stop) spans.

    A run token at a covered position is *recomputed* (its cached K/V, where held, is
    replaced); one outside is *fresh* (inserted in every head) — wherever it falls, so fresh
    text can sit between cached segments (SparseX Sec. 3–4). Eviction never changes it, so a
    segment whose last tokens every head evicted is still context.
    """

    def __init__(self, spans=()):
        self.spans = _merged(spans)

    @classmethod
    def of(cls, positions: torch.Tensor) -> "Extent":
        return cls(_runs(positions))

    @property
    def end(self) -> int:
        """One past the last covered position (0 when empty)."""
        return self.spans[-1][1] if self.spans else 0

    def covers(self, pos: torch.Tensor) -> torch.Tensor:
        """(N,) bool: which positions lie in the extent (one pass per span, not per token)."""
        hit = torch.zeros_like(pos, dtype=torch.bool)
        for start, stop in self.spans:
            hit |= (pos >= start) & (pos < stop)
        return hit

    def __contains__(self, pos: int) -> bool:
        """Whether one position lies in the extent (plain ints: decode asks per token)."""
        return any(start <= pos < stop for start, stop in self.spans)

    def add(self, positions: torch.Tensor) -> None:
        self.spans = _merged(self.spans + _runs(positions))

    def add_one(self, pos: int) -> None:
        """`add` of one position, without tensors (decode adds one per token)."""
        self.spans = _merged(self.spans + [(pos, pos + 1)])

    def truncate(self, last_pos: int) -> None:
        self.spans = [(a, min(b, last_pos + 1)) for a, b in self.spans if a <= last_pos]

    def __eq__(self, other) -> bool:
        return isinstance(other, Extent) and self.spans == other.spans

    def __repr__(self) -> str:
        return f"Extent({self.spans})"


def _runs(positions: torch.Tensor) -> list[tuple[int, int]]:
    """Contiguous [start, stop) runs of a set of positions."""
    pos = torch.unique(positions.to("cpu", torch.long))  # sorted
    if pos.numel() == 0:
        return []
    cut = (pos[1:] != pos[:-1] + 1).nonzero().flatten() + 1
    starts = torch.cat([pos[:1], pos[cut]]).tolist()
    stops = torch.cat([pos[cut - 1] + 1, pos[-1:] + 1]).tolist()
    return list(zip(starts, stops))


def _merged(spans) -> list[tuple[int, int]]:
    """Sorted disjoint spans covering the same positions (touching ones joined)."""
    out: list[tuple[int, int]] = []
    for start, stop in sorted((int(a), int(b)) for a, b in spans if b > a):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out


class KVCache(list):
    """A request's KV: one `LayerKV` per layer, the extent of its context and its RoPE length.

    extent: the positions the context covers (default: every position some layer holds); the
    runtime decides from it which run tokens are fresh and adds them once a forward succeeds.
    seq_len: the one RoPE sequence length of the request — keys already rotated with it and
    every later query and key use it (dynamic/longrope frequencies depend on it); None until
    the first forward fixes it.
    """

    def __init__(self, layers, extent: Extent | None = None, seq_len: int | None = None):
        super().__init__(layers)
        self.extent = extent if extent is not None else Extent.of(_held_positions(self))
        self.seq_len = seq_len

    def truncate(self, last_pos: int) -> None:
        for layer in self:
            layer.truncate(last_pos)
        self.extent.truncate(last_pos)


def _held_positions(layers) -> torch.Tensor:
    held = [group.positions.cpu() for layer in layers for group in layer.heads()]
    return torch.cat(held) if held else torch.empty(0, dtype=torch.long)


def truncate_cache(cache: KVCache, last_pos: int) -> None:
    """Drop everything after `last_pos` in every layer: the context stays, a turn is forgotten."""
    cache.truncate(last_pos)


def cache_nbytes(cache: list[LayerKV]) -> int:
    """Bytes the cache's live K/V (and positions) occupy: what eviction must shrink."""
    return sum(layer.nbytes() for layer in cache)
