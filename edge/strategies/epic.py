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
from typing import Callable

import torch

from kvedge.common.registry import option
from kvedge.edge.strategies.base import Composed, Plan, ReuseStrategy, assemble_cache
from kvedge.edge.strategies.registry import STRATEGIES


def boundary_plan(rt, composed: Composed, reserve: int,
                  local: Callable[[int], torch.Tensor]) -> Plan:
    """Realign every segment, then run at full depth the tokens `local(n)` of each segment
    (indices into a segment of n tokens) and every fresh token, in position order."""
    cache = assemble_cache(rt, composed, realign=True,
                           reserve=len(composed.question_ids) + reserve)
    chosen = [local(seg.n_tokens) + off for seg, off in zip(composed.segments, composed.offsets)]
    positions = torch.sort(torch.cat(chosen + [composed.fresh_positions()])).values
    all_ids = torch.tensor(composed.all_ids())
    return Plan(cache, all_ids[positions], positions, recomputed=sum(c.numel() for c in chosen))


@STRATEGIES.register
@dataclass
class Epic(ReuseStrategy):
    k: int = option(16, 0, 32, "tokens recomputed at the start of every segment (EPIC: k ≤ 32)")

    name = "epic"

    def plan(self, rt, composed: Composed, reserve: int) -> Plan:
        return boundary_plan(rt, composed, reserve, lambda n: torch.arange(min(self.k, n)))
