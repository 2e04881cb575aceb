"""Attention over explicit KV with a position-based causal mask.

A query at position p sees exactly the keys at positions ≤ p (and, for sliding-window layers,
> p − window). Positions, not slot order, decide: recomputing a token in the middle of a cached
context must not see the tokens after it, which a bottom-right-aligned causal mask would show.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, NamedTuple

import torch
import torch.nn.functional as F

QUERY_CHUNK = 2048  # bounds the (queries × keys) score matrix for long prefills
CUT_CHUNK = 64  # queries a call where keys past the last of them are left out (_query_chunks)

# SDPA backends on CUDA: torch's own choice less cuDNN's. On an H200 (torch 2.11, bf16,
# Qwen2.5-0.5B's shapes) cuDNN took 1.6 ms of host time per decode call in the runtime's
# step — 54 ms a token, 3× transformers' 16 ms — and 18 ms without it; in isolation the same
# shapes took 29 µs, so it is something about the runtime's calls (views into the growing
# buffers, the sliced queries) that makes it re-plan; not established which
# (`python -m kvedge.bench.gpu_check`). Flash and the math kernel give the same function.
_CUDA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


# One query against a short context is too little work to split: on the CPU such a call runs
# on one thread. A decode step makes one per request and layer (480 a step for 16 requests on
# SmolLM2). SmolLM2's shapes, 2 cores: on a quiet machine one thread and two take the same
# time up to ~1K keys (512 keys: 72 against 68 µs; 1,024: 133 against 133) and two win past
# it (2,048: 260 against 180–255; 4,096: 526–566 against 323–371); with the other core busy —
# a benchmark beside it, as an edge under load has gRPC handlers and clients — one call over
# 600 keys took 82 µs on one thread and 107–388 µs on two (handing work to a busy core waits
# for it). Hence ONE_THREAD_KEYS = 1024. Every path that attends one query calls `sdpa`, so the
# rule holds for the runtime's forward and the batched step alike (their bits stay equal: the
# kernel may split a call differently by thread count).
ONE_THREAD_KEYS = 1024


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """`F.scaled_dot_product_attention`; on the CPU, one query over at most ONE_THREAD_KEYS
    keys on one thread; on CUDA without the cuDNN backend when no mask is given (what was
    measured, above: with a mask, flash does not apply and torch's choice stands)."""
    if not q.is_cuda:
        if q.shape[-2] == 1 and k.shape[-2] <= ONE_THREAD_KEYS:
            with one_thread():
                return F.scaled_dot_product_attention(q, k, v, **kwargs)
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    if kwargs.get("attn_mask") is not None:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([getattr(SDPBackend, name) for name in _CUDA_BACKENDS]):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


@contextmanager
def one_thread() -> Iterator[None]:
    """torch's CPU ops on this thread single-threaded inside (OpenMP keeps the setting per
    thread: the others keep theirs)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class OwnKV(NamedTuple):
    """The run tokens' own fresh K/V at one layer, k, v (Hkv, N, D) rotated, and `private`
    (Hkv, N) bool: where the cache does not hold a token's fresh K/V (None: it holds all).

    A token always attends to its own fresh key — also one it was computed without storing
    (SamKV Sec. 3.3 write sets) or one its head evicted (issue 11 (b)); the other queries see
    only what the cache holds.
    """

    k: torch.Tensor
    v: torch.Tensor
    private: torch.Tensor | None

    def head(self, h: int) -> "OwnKV":
        private = None if self.private is None else self.private[h: h + 1]
        return OwnKV(self.k[h: h + 1], self.v[h: h + 1], private)


def visible(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Bool mask (Tq, Tk): key j is visible to query i."""
    mask = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        mask &= k_pos[None, :] > q_pos[:, None] - window
    return mask


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor,
                  k_pos: torch.Tensor, scale: float, window: int | None = None,
                  own: OwnKV | None = None) -> torch.Tensor:
    """q (Hkv, G, Tq, D) against k, v (Hkv, Tk, D) → (Hkv, G, Tq, D).

    Grouped query heads share their KV head without expanding K/V. A query with no visible
    key (possible only in evicted caches) gets a zero output instead of NaN. `own` (its
    `private` rows the same for every head here): each private query also sees its own fresh
    key, in place of any cached key at its position.
    """
    private = None if own is None or own.private is None else own.private.any(0)  # (Tq,)
    if private is not None and bool(private.any()):
        mine = private.nonzero().flatten()  # (P,) the queries with a private key
        k, v = torch.cat([k, own.k[:, mine]], 1), torch.cat([v, own.v[:, mine]], 1)
    else:
        private = None
    n_kv, group, n_q, dim = q.shape
    if private is None and window is None and _self_causal(q_pos, k_pos):
        # a run over exactly the keys it attends to (a prefill, a layer that runs every
        # token): the mask is the lower triangle, and the fused kernel's causal mode skips
        # the blocks above it — 2.2× less attention time than the same mask given explicitly
        # (4.3K tokens, SmolLM2 shapes, 2 threads)
        out = sdpa(q.reshape(1, n_kv * group, n_q, dim), k[None], v[None], is_causal=True,
                   scale=scale, enable_gqa=group > 1)
        return out.view(n_kv, group, n_q, dim)
    out = torch.empty_like(q)
    for start, stop, cut in _query_chunks(q_pos, k_pos, private is None):
        kc, vc = (k, v) if cut is None else (k[:, :cut], v[:, :cut])
        mask = visible(q_pos[start:stop], k_pos[:cut], window)  # (tq, Tk)
        if private is not None:
            mask = _with_own(mask, q_pos, k_pos, private, mine, start, stop)  # (tq, Tk + P)
        qc = q[:, :, start:stop].reshape(1, n_kv * group, stop - start, dim)
        # 4-D with enable_gqa reaches the fused CPU/GPU kernels (a 3-D call falls back to the
        # unfused math path: ~5× slower); kv head j serves query heads jG..jG+G−1, as in HF
        oc = sdpa(qc, kc[None], vc[None], attn_mask=mask, scale=scale, enable_gqa=group > 1)
        oc = oc.view(n_kv, group, stop - start, dim)
        blind = ~mask.any(-1)
        if blind.any():
            oc = oc.masked_fill(blind[None, None, :, None], 0.0)
        out[:, :, start:stop] = oc
    return out


def _query_chunks(q_pos: torch.Tensor, k_pos: torch.Tensor, may_cut: bool
                  ) -> Iterator[tuple[int, int, int | None]]:
    """The masked path's calls: (start, stop, cut) — queries [start, stop) attend to the
    first `cut` keys (None: all of them).

    Keys sorted by position (every cache's are) past a chunk's last query are masked for
    all of it, so a call can leave them out. Scattered queries — a strategy recomputing the
    first and last tokens of every segment (legolink, epic), or its top-k (a3, cacheblend) —
    each see on average half the keys, and one call over all of them spends half its work on
    masked scores. Where cutting would save at least a quarter of the work, the queries run
    in chunks of CUT_CHUNK, each over the keys up to its last query; otherwise in chunks of
    QUERY_CHUNK over all keys, as before (a run at the end of its cache — a question after
    its context, a decode step — loses nothing to the mask and keeps its bits). The outputs
    equal the one call's up to rounding (the kernel sums fewer exact zeros): a masked score
    weighs nothing, so the cut changes the function of nothing (|Δ| ≤ 2.1e-7 measured).

    `python -m kvedge.bench.masked_attention --threads 1` (CPU seconds, 2026-11-30, beside a
    benchmark): one layer's call with legolink's 1,200 queries over 30 segments of 140
    tokens took 0.55× (Qwen2.5-0.5B's heads) and 0.61× (SmolLM2's) of the one call, 0.64–0.66×
    at 10 segments, and a 1/7 top-k 0.56–0.78×; CUT_CHUNK = 64 against 128 and 256 was
    0.56–0.76× against 0.58–1.00× and 0.61–1.00× (at 10 segments 256 saves nothing). On
    SmolLM2's weights legolink's whole forward at 30 segments went from 0.41 to 0.30 of the
    full prefill's time (docs/reuse.md, "Scattered queries")."""
    n_q, n_k = q_pos.numel(), k_pos.numel()
    if may_cut and n_k > CUT_CHUNK and n_q > 1 and _ascending(k_pos):
        spans = [(s, min(s + CUT_CHUNK, n_q)) for s in range(0, n_q, CUT_CHUNK)]
        last = torch.stack([q_pos[s:e].max() for s, e in spans])
        cuts = torch.searchsorted(k_pos, last, right=True).clamp(min=1).tolist()  # ≥ 1 key
        if sum((e - s) * c for (s, e), c in zip(spans, cuts)) <= 0.75 * n_q * n_k:
            yield from ((s, e, c) for (s, e), c in zip(spans, cuts))
            return
    for start in range(0, n_q, QUERY_CHUNK):
        yield start, min(start + QUERY_CHUNK, n_q), None


def _ascending(pos: torch.Tensor) -> bool:
    """Positions in non-decreasing order (every cache's keys are; an empty or one-element
    tensor is)."""
    return bool((pos[1:] >= pos[:-1]).all())


def _self_causal(q_pos: torch.Tensor, k_pos: torch.Tensor) -> bool:
    """The queries are the keys, in the same order (positions strictly increase, as every
    forward's do): key j is visible to query i exactly when j ≤ i."""
    return q_pos.shape == k_pos.shape and q_pos.numel() > 1 and bool(
        (q_pos[1:] > q_pos[:-1]).all()) and torch.equal(q_pos, k_pos)


def _with_own(mask, q_pos, k_pos, private, mine, start, stop):
    """Hide a private query's cached key at its own position (stale, or absent) and show it
    its own fresh key, appended after the cached ones."""
    rows = torch.arange(start, stop, device=mask.device)
    stale = private[start:stop, None] & (k_pos[None, :] == q_pos[start:stop, None])
    return torch.cat([mask & ~stale, rows[:, None] == mine[None, :]], 1)


def attention_probs(q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                    scale: float, window: int | None = None) -> torch.Tensor:
    """Softmax attention weights (Hkv, G, Tq, Tk) of q (Hkv, G, Tq, D) over k (Hkv, Tk, D) for
    a *chunk* of queries (scoring only); a query that sees no key gets zeros. The function of
    `attention_probs_reference`, in fewer passes over the (Tq × Tk) scores: q is scaled
    before its one matmul, the mask is written in place and only over the keys some query
    does not see (a probe after a context sees every context key: only its own keys need the
    causal mask), and no NaN pass. Eviction's scoring (KVzip, ContrastKV, SnapKV) spends most
    of its time here. Beside a benchmark on 2 CPU threads, a 256 × 5,096 chunk took 127–143
    against 220–237 ms (SmolLM2's heads) and 180–186 against 323 ms (Qwen2.5-0.5B's), and
    ContrastKV's scores of a 2K-token SmolLM2 context 47.5 against 76.3 s, bit-identical
    (a head size of 64 makes the scale 1/8, exact before the matmul as after it)."""
    h, g, tq, d = q.shape
    s = torch.bmm((q.float() * scale).reshape(h, g * tq, d),
                  k.float().transpose(1, 2)).view(h, g, tq, k.shape[1])
    if tq == 0 or k_pos.numel() == 0:
        return s  # nothing to weigh (no query, or no key: zeros)
    if not _ascending(k_pos):  # unsorted: mask all
        mask = visible(q_pos, k_pos, window)
        s.masked_fill_(~mask, float("-inf"))
        sees = mask.any(-1)
    else:
        # keys every query sees: [lo, hi) (at or before the first query, within the last
        # query's window)
        lo = 0 if window is None else int(torch.searchsorted(k_pos, q_pos.max() - window,
                                                             right=True))
        hi = int(torch.searchsorted(k_pos, q_pos.min(), right=True))
        lo = min(lo, hi)
        for cols in (slice(0, lo), slice(hi, None)):
            if k_pos[cols].numel():
                s[..., cols].masked_fill_(~visible(q_pos, k_pos[cols], window), float("-inf"))
        last = torch.searchsorted(k_pos, q_pos, right=True) - 1  # each query's latest key
        sees = last >= 0
        if window is not None:
            sees &= k_pos[last.clamp(min=0)] > q_pos - window
    probs = torch.softmax(s, dim=-1)
    if not bool(sees.all()):
        probs[:, :, ~sees] = 0.0
    return probs


def attention_probs_reference(q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor,
                              k_pos: torch.Tensor, scale: float,
                              window: int | None = None) -> torch.Tensor:
    """`attention_probs` written plainly: the whole mask, softmax, NaN (no key seen) → 0."""
    scores = torch.einsum("hgqd,hkd->hgqk", q.float(), k.float()) * scale
    scores = scores.masked_fill(~visible(q_pos, k_pos, window), float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0)


def key_votes(q: torch.Tensor, q_pos: torch.Tensor, layer, scale: float, window: int | None,
              n_positions: int, reduce: str = "sum", seen: torch.Tensor | None = None,
              chunk: int | None = None) -> torch.Tensor:
    """Attention each cached key gets from the queries q (Hkv, G, Nq, D) rotated at q_pos,
    per KV head, reduced over its grouped query heads and the queries: "sum" (SnapKV's vote)
    or "max" (KVzip Eq. 8). Returns (Hkv, n_positions) indexed by position, 0 where a head
    holds nothing; the softmax runs over every key a query sees, keys at positions ≥
    n_positions (e.g. a probe's own) are then left out. `seen` (bool, indexed by position <
    n_positions) narrows the keys below n_positions that enter the softmax (KVzip scores a
    long context chunk by chunk, each over its own keys); unseen ones vote 0. `layer` is a
    cache layer (`heads()`). `chunk`: "max" only, the queries go through the softmax that
    many at a time, each head's keys gathered once (the maximum of the same softmax rows,
    though a matmul over very few rows may take another kernel, an ulp off; None: all at
    once)."""
    if chunk is not None and reduce != "max":
        raise ValueError("key_votes: chunked queries only for reduce='max' (a sum's order "
                         "would change)")
    votes = torch.zeros(q.shape[0], n_positions)
    for group in layer.heads():
        pos, keys, k_pos = group.positions.cpu(), group.keys, group.positions
        if seen is not None:
            keep = (pos >= n_positions) | seen[pos.clamp(max=n_positions - 1)]
            pos, keys, k_pos = pos[keep], keys[:, keep.to(keys.device)], k_pos[keep.to(k_pos.device)]
        inside = int(torch.searchsorted(pos, torch.tensor(n_positions)))  # positions sorted
        mine, step = q[group.kv_heads], chunk or max(q.shape[2], 1)
        got = None
        for start in range(0, q.shape[2], step):
            rows = slice(start, start + step)
            probs = attention_probs(mine[:, :, rows], keys, q_pos[rows], k_pos, scale,
                                    window)[..., :inside]  # (h, G, rows, inside)
            part = probs.sum(dim=(1, 2)) if reduce == "sum" else probs.amax(dim=(1, 2))
            got = part if got is None else torch.maximum(got, part)
        if got is not None:
            votes[group.kv_heads][:, pos[:inside]] = got.cpu()
    return votes
