"""`cacheblend`: CacheBlend's KV-deviation selection (Yao et al. 2025), as A3 Sec. 3.1 compares it.

Position recovery first (realigned segments). Every context token and the question run through
blocks 0 and 1; at layer 1 the tokens whose freshly computed values deviate most from their
cached (realigned, cross-attention-free) values — the "high-KV-deviation" tokens — are chosen,
a ratio r of the context (default 0.15), and only they and the question run from layer 2 on.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvedge.common.kvcache import DenseKV
from kvedge.edge.strategies.base import ShallowSelection


def values_by_position(cache_layer) -> torch.Tensor:
    """Values as (Hkv, max_pos + 1, D), indexed by position; zeros where a head holds none."""
    if isinstance(cache_layer, DenseKV):
        _, v, pos = cache_layer.view()
        out = torch.zeros(v.shape[0], int(pos.max()) + 1, v.shape[-1])
        out[:, pos] = v.float()
        return out
    views = [h.view() for h in cache_layer.heads]
    top = max(int(pos.max()) for _, _, pos in views if pos.numel()) + 1
    out = torch.zeros(len(views), top, views[0][1].shape[-1])
    for h, (_, v, pos) in enumerate(views):
        out[h, pos] = v[0].float()
    return out


@dataclass
class CacheBlend(ShallowSelection):
    ratio: float = 0.15

    name = "cacheblend"

    def before(self, rt, composed, cache):
        return values_by_position(cache[self.score_layer])  # the reused (stale) values

    def score(self, rt, composed, stale, q, q_pos, cache_layer):
        fresh = values_by_position(cache_layer)
        context = torch.arange(composed.n_prefix, composed.question_start)
        return (fresh[:, context] - stale[:, context]).norm(dim=-1).sum(0)
