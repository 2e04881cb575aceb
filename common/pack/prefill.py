"""A segment's KV as a pack holds it before the codec: one definition for the cloud, which
encodes it (`kvedge.cloud.workers.PrefillEngine.encode`), and the edge, which computes it when
that beats fetching the pack (`kvedge.edge.local_prefill`).

The segment's token ids run from position 0, alone, or — anchored (docs/design.md, decision
9) — at positions P.. behind the P tokens of the chat prefix, whose KV is given once: the joint
prefill of [anchor + segment] without recomputing the anchor, keeping the segment's KV only.
With `side_tensors`, beside the K/V the pack keeps SamKV's side tensors: the mean pre-RoPE
query of the last QUERY_CACHE_TOKENS tokens and the block summaries (`KVContext.from_dense`).
The gateway makes packs without them by default (`GatewayConfig.side_tensors`, the reason is
there); SamKV then derives the summaries from the keys and scores without Eq. 1's local term.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvedge.common.pack.context import KVContext

# SamKV's local Q cache (Eq. 1) enters the query vector as one pooled vector per head, so the
# pack keeps the mean pre-RoPE query of the local region — the last 2 blocks, 128 tokens
# (the paper's Sec. 4.1) — as (Hq, 1, D) per layer: 34.6 KB per pack on SmolLM2 whatever its
# length (30 layers × 9 heads × 64 × fp16). Keeping the 128 queries themselves would cost
# 4.4 MB per pack, more than a 190-token segment's whole KV (Hq = 3 Hkv on SmolLM2).
QUERY_CACHE_TOKENS = 128


@dataclass(frozen=True)
class Anchor:
    """The chat prefix an anchored segment is prefilled behind: ids, pre-RoPE KV per layer."""

    ids: list[int]
    keys: list[torch.Tensor]    # (Hkv, P, D)
    values: list[torch.Tensor]


def prefill_segment(rt, token_ids: list[int], anchor: Anchor | None = None,
                    queries: bool = True):
    """(keys, values, queries) per layer of the segment's tokens only, pre-RoPE, each
    (H, T, D): prefilled from position 0, or at positions P..P+T-1 over the anchor's KV
    (queries not captured, None, unless `queries`)."""
    from kvedge.common.model.runtime import LayerCapture

    ids = torch.tensor(token_ids)
    if anchor is None:
        res = rt.prefill(ids, want_queries=queries, logits="none")
        return res.keys, res.values, res.queries if queries else None
    n_anchor = len(anchor.ids)
    cache = rt.dense_cache(anchor.keys, anchor.values, torch.arange(n_anchor),
                           reserve=ids.numel())
    capture = LayerCapture(want_queries=queries)
    rt.forward(ids, torch.arange(n_anchor, n_anchor + ids.numel()), cache, capture=capture,
               logits="none")
    return capture.keys, capture.values, capture.queries if queries else None


def segment_context(rt, token_ids: list[int], *, fingerprint: str, tokenizer_id: str,
                    namespace: str, anchor: Anchor | None = None,
                    side_tensors: bool = True) -> KVContext:
    """The segment's KVContext, unquantized: what the cloud's codec encodes into its pack
    (with SamKV's side tensors, or without: `side_tensors`)."""
    keys, values, queries = prefill_segment(rt, token_ids, anchor, queries=side_tensors)
    pooled = [q[:, -QUERY_CACHE_TOKENS:].mean(1, keepdim=True) for q in queries] \
        if side_tensors else None
    return KVContext.from_dense(
        keys, values, token_ids, model_fingerprint=fingerprint, tokenizer_id=tokenizer_id,
        queries=pooled, query_tokens=1, summaries=side_tensors, namespace=namespace,
        anchor=list(anchor.ids) if anchor else [])
