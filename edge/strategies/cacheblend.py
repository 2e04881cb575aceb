"""`cacheblend`: CacheBlend's KV-deviation selection (Yao et al. 2025), as A3 Sec. 3.1 compares it.

Position recovery first (realigned segments). Every context token and the question run through
blocks 0 and 1; at layer 1 the tokens whose freshly computed values deviate most from their
cached (realigned, cross-attention-free) values — the "high-KV-deviation" tokens — are chosen,
a ratio r of the context (default 0.15), and only they and the question run from layer 2 on.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvedge.edge.strategies.registry import STRATEGIES
from kvedge.edge.strategies.shallow import ShallowSelection


def values_by_position(cache_layer, n_positions: int) -> torch.Tensor:
    """Values as (Hkv, n_positions, D), indexed by position; zeros where a head holds none
    (sized by the prompt, not the largest held position: a segment's tail may be evicted)."""
    groups = cache_layer.heads()
    n_kv = sum(g.values.shape[0] for g in groups)
    out = torch.zeros(n_kv, n_positions, groups[0].values.shape[-1],
                      device=groups[0].values.device)
    for g in groups:
        out[g.kv_heads, g.positions] = g.values.float()
    return out


@STRATEGIES.register
@dataclass
class CacheBlend(ShallowSelection):
    name = "cacheblend"

    def before(self, rt, composed, cache):
        return values_by_position(cache[self.layer], composed.seq_len())  # reused (stale) values

    def score(self, rt, composed, stale, q, q_pos, cache_layer):
        fresh = values_by_position(cache_layer, composed.seq_len())
        return (fresh - stale).norm(dim=-1).sum(0)
