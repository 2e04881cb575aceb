"""`cacheblend`: CacheBlend's KV-deviation selection (Yao et al. 2025), as A3 Sec. 3.1 compares it.

Position recovery first (realigned segments). Every context token and the question run through
blocks 0 and 1; at layer 1 the tokens whose freshly computed values deviate most from their
cached (realigned, cross-attention-free) values — the "high-KV-deviation" tokens — are chosen,
a ratio r of the context (default 0.15), and only they and the question run from layer 2 on.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvedge.edge.strategies.a3 import SCORE_LAYER
from kvedge.edge.strategies.base import Composed, Plan, ReuseStrategy, assemble_cache


@dataclass
class CacheBlend(ReuseStrategy):
    ratio: float = 0.15

    name = "cacheblend"

    def plan(self, rt, composed: Composed, reserve: int) -> Plan:
        cache = assemble_cache(rt, composed, realign=True,
                               reserve=len(composed.question_ids) + reserve)
        start, q_start = composed.n_prefix, composed.question_start
        stale = _values_by_position(cache[SCORE_LAYER])  # before recompute overwrites them
        question = composed.question_positions()
        budget = round(self.ratio * composed.n_context)
        chosen: dict[str, torch.Tensor] = {}

        def observe(layer, q, q_pos, cache_layer):
            if layer != SCORE_LAYER or "hkvd" in chosen:
                return
            fresh = _values_by_position(cache_layer)
            context = torch.arange(start, q_start)
            deviation = (fresh[:, context] - stale[:, context]).norm(dim=-1).sum(0)  # (n,)
            top = torch.topk(deviation, min(budget, deviation.numel())).indices
            chosen["hkvd"] = torch.sort(top + start).values

        def active(layer, current):
            return None if layer <= SCORE_LAYER else torch.cat([chosen["hkvd"], question])

        run_pos = torch.arange(start, q_start + len(question))
        run_ids = torch.tensor(composed.context_ids + composed.question_ids)
        return Plan(cache, run_ids, run_pos, active, recomputed=budget, observe=observe)


def _values_by_position(cache_layer) -> torch.Tensor:
    """Values as (Hkv, max_pos + 1, D), indexed by position; zeros where a head holds none."""
    heads = [(cache_layer.view(), None)] if hasattr(cache_layer, "buf") else \
        [(h.view(), i) for i, h in enumerate(cache_layer.heads)]
    n_heads = heads[0][0][1].shape[0] if heads[0][1] is None else len(heads)
    top = max(int(view[2].max()) for view, _ in heads) + 1
    out = torch.zeros(n_heads, top, heads[0][0][1].shape[-1])
    for (k, v, pos), h in heads:
        if h is None:
            out[:, pos] = v.float()
        else:
            out[h, pos] = v[0].float()
    return out
