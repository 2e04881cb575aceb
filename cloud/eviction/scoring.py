"""Attention a probe sequence pays to a context's cached keys, never as a full matrix.

A probe (a reconstruction prompt, a noise sequence, a proxy question) runs after the context
against its full cache; at every layer each context key gets the maximum (KVzip/ContrastKV
Eq. 8) or the sum (SnapKV) of the attention it receives over the grouped query heads and the
probe's positions. The softmax runs over every key a probe query sees (context and the
probe's own earlier tokens) and is then sliced to the context, as Eq. 8 says. Queries are
processed in chunks, so memory is O(chunk × keys), and long probes run in pieces that each
restore the context-only cache afterwards.

A signal two methods share (KVzip's reconstruction is ContrastKV's positive signal, Sec. 4.1)
is probed once per context where the caller says so (`sharing_signals`): the benchmark
scores one context with both. Each reuse charges the seconds the probe took to
`SignalMemo.reused_s`, so a method's timed scoring still reports what it costs alone.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from kvedge.common.model.attention import key_votes
from kvedge.common.model.kvcache import truncate_cache

QUERY_CHUNK = 256  # probe queries per vote call where votes add up ("sum", SnapKV's)
# ... and where they take the maximum (KVzip, ContrastKV: Eq. 8), on the CPU: one call per
# layer, its queries through the softmax 8 at a time (`key_votes(chunk=)`), each head's keys
# gathered once. A maximum does not depend on how the queries are split (a one-query step
# may take another matmul kernel, an ulp off; 8 × the group rows gave the bits of one pass
# on both models' head shapes), and 8 queries × the group keep each step's scores (56 × 4K
# fp32 on Qwen2.5-0.5B: 0.9 MB a head) in cache through the matmul, mask, softmax and max.
# One layer's votes for a 2K-token reconstruction over 4K context keys on Qwen2.5-0.5B's
# heads, one thread, thread CPU time (`python -m kvedge.bench.key_votes --chunks
# 8,4,16,32,256 --rounds 9`, the box idle, two runs): 0.55–0.67 s at 8, level with 4, 16
# and 32 (0.94–1.18×), and 1.66–1.99× that at 256 — the same votes. A sum keeps 256 a call:
# other chunks would add its terms in another order. A GPU is short of launches, not cache,
# and keeps 256 too.
MAX_CHUNK = 8


class SignalMemo:
    """Signals already probed by one runtime, keyed by what they depend on (the context's
    tokens among it), kept for the next method that needs the same one; `reused_s` sums the
    seconds each reuse saved."""

    def __init__(self):
        self._kept: dict[tuple, tuple[object, float]] = {}
        self.reused_s = 0.0

    def get(self, key: tuple, probe):
        if key in self._kept:
            value, seconds = self._kept[key]
            self.reused_s += seconds
            return value
        start = time.perf_counter()
        value = probe()
        self._kept[key] = (value, time.perf_counter() - start)
        return value


_MEMO: ContextVar[SignalMemo | None] = ContextVar("kvedge_signal_memo", default=None)


@contextmanager
def sharing_signals(memo: SignalMemo):
    """Within the block, shared signals (`shared`) are looked up in `memo`: the caller's
    promise that every method scored inside uses the same runtime, and that contexts with
    the same tokens hold the same KV (the bench scores each item's uncompressed context)."""
    token = _MEMO.set(memo)
    try:
        yield memo
    finally:
        _MEMO.reset(token)


def shared(key: tuple, probe):
    """`probe()`, or its value from the memo `sharing_signals` set (none: always probed)."""
    memo = _MEMO.get()
    return probe() if memo is None else memo.get(key, probe)


def context_cache(rt, ctx):
    """A dense runtime cache of a context's full (un-evicted) KV at its original positions."""
    keys = [torch.stack(layer).to(rt.dtype) for layer in ctx.keys]
    values = [torch.stack(layer).to(rt.dtype) for layer in ctx.values]
    return rt.dense_cache(keys, values, torch.tensor(ctx.positions), reserve=0)


def probe_scores(rt, cache, n_context: int, probe_ids: list[int], *, reduce: str = "max",
                 window: int | None = None, span: tuple[int, int] | None = None,
                 sink: int = 0) -> list[torch.Tensor]:
    """Run probe_ids after the context; per layer (Hkv, n_context) scores.

    reduce: "max" over (group, probe positions) — Eq. 8; "sum" — SnapKV's vote.
    window: only the probe's last `window` queries vote (SnapKV's observation window).
    span: the context tokens [start, end) whose keys, with the first `sink` tokens and the
    probe's own, make up the softmax (KVzip's chunked scoring); the rest score 0. None: all.
    """
    last = cache.extent.end - 1
    context = cache[0].heads()[0].positions[:n_context].cpu()  # dense: every head alike
    scores = [torch.zeros(rt.n_kv, n_context) for _ in range(rt.n_layers)]
    first_voter = len(probe_ids) - window if window else 0
    seen = None
    if span is not None:
        seen = torch.zeros(last + 1, dtype=torch.bool)
        seen[context[:sink]] = True
        seen[context[span[0]:span[1]]] = True

    def observe(layer, q, q_pos, cache_layer):
        if reduce == "max" and q.device.type == "cpu":  # one call, chunked inside
            voters = q_pos - (last + 1) >= first_voter
            if bool(voters.any()):
                vote(layer, q[:, :, voters], q_pos[voters], cache_layer, MAX_CHUNK)
            return
        for start in range(0, q.shape[2], QUERY_CHUNK):
            rows = slice(start, start + QUERY_CHUNK)
            voters = q_pos[rows] - (last + 1) >= first_voter
            if bool(voters.any()):
                vote(layer, q[:, :, rows][:, :, voters], q_pos[rows][voters], cache_layer)

    def vote(layer, q, q_pos, cache_layer, chunk=None):
        got = key_votes(q, q_pos, cache_layer, rt.scale, rt.layers[layer].window, last + 1,
                        reduce, seen, chunk)[:, context]
        mine = scores[layer]
        if reduce == "max":
            mine.copy_(torch.maximum(mine, got))
        else:
            mine += got

    ids = torch.tensor(probe_ids)
    rt.forward(ids, torch.arange(last + 1, last + 1 + ids.numel()), cache, observe=observe,
               logits="none")
    truncate_cache(cache, last)
    return scores


def merge_max(parts: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    return [torch.stack(layer).amax(0) for layer in zip(*parts)]
