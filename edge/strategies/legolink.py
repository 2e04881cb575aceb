"""`legolink`: LegoLink as A3 runs it ("A³: Attention-Aware Accurate KV Cache Fusion for Fast
Large Language Model Serving", Sec. 3.1: "we recompute the first and last 20 tokens of each
chunk"): after position recovery, recompute the first and last `tokens` tokens of every segment
at full depth — StreamingLLM's sink-and-recent rule applied per chunk. EPIC's own rule (first
k ≤ 32 tokens only) is `epic`; both are `base.boundary_plan`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvedge.common.registry import option
from kvedge.edge.strategies.base import Composed, Plan, ReuseStrategy, boundary_plan
from kvedge.edge.strategies.registry import STRATEGIES


def ends(n: int, tokens: int) -> torch.Tensor:
    """The first and last `tokens` of n indices (each once, sorted)."""
    return torch.unique(torch.cat([torch.arange(min(tokens, n)),
                                   torch.arange(max(n - tokens, 0), n)]))


@STRATEGIES.register
@dataclass
class LegoLink(ReuseStrategy):
    tokens: int = option(20, 0, None, "tokens recomputed at each end of every segment")

    name = "legolink"

    def plan(self, rt, composed: Composed, reserve: int) -> Plan:
        return boundary_plan(rt, composed, reserve, lambda n: ends(n, self.tokens))
