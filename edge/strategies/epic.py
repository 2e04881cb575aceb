"""`epic`: EPIC's LegoLink (Hu et al. 2024), as A3 Sec. 3.1 runs it: after position recovery,
recompute the first and last `tokens` tokens of every segment (default 20) at full depth —
static, position-based selection (StreamingLLM's sink rule applied per chunk)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvedge.common.registry import option
from kvedge.edge.strategies.base import Composed, Plan, ReuseStrategy, assemble_cache
from kvedge.edge.strategies.registry import STRATEGIES


@STRATEGIES.register
@dataclass
class Epic(ReuseStrategy):
    tokens: int = option(20, 0, None, "tokens recomputed at each end of every segment")

    name = "epic"

    def plan(self, rt, composed: Composed, reserve: int) -> Plan:
        cache = assemble_cache(rt, composed, realign=True,
                               reserve=len(composed.question_ids) + reserve)
        chosen = []
        for seg, off in zip(composed.segments, composed.offsets):
            n = seg.n_tokens
            local = torch.unique(torch.cat([torch.arange(min(self.tokens, n)),
                                            torch.arange(max(n - self.tokens, 0), n)]))
            chosen.append(local + off)
        positions = torch.cat(chosen + [composed.question_positions()])
        all_ids = torch.tensor(composed.all_ids())
        return Plan(cache, all_ids[positions], positions, recomputed=sum(c.numel() for c in chosen))
