"""`epic`: EPIC's LegoLink (Hu et al., "EPIC: Efficient Position-Independent Caching for
Serving Large Language Models", ICML 2025, arXiv:2410.15332): after position recovery, recompute
only the first k ≤ 32 tokens of every chunk at full depth, with the fresh tokens — static,
position-based selection aimed at the attention sink a chunk prefilled alone grows at its start.

Every segment is recomputed, the first one too: the sink that belongs at the start of the prompt
is the chat prefix's (its KV is exact), and every segment follows it. Default k = 16: the sink
sits on a chunk's first few tokens (StreamingLLM keeps 4), EPIC's TTFT-vs-length runs use
LegoLink-16 on 512-token chunks — the gateway's ingest segment — and it costs ~3 % of a segment,
half of k = 32. `legolink` is the first-and-last variant A3 runs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvedge.common.registry import option
from kvedge.edge.strategies.base import Composed, Plan, ReuseStrategy, boundary_plan
from kvedge.edge.strategies.registry import STRATEGIES


@STRATEGIES.register
@dataclass
class Epic(ReuseStrategy):
    k: int = option(16, 0, 32, "tokens recomputed at the start of every segment (EPIC: k ≤ 32)")

    name = "epic"

    def plan(self, rt, composed: Composed, reserve: int) -> Plan:
        return boundary_plan(rt, composed, reserve, lambda n: torch.arange(min(self.k, n)))
