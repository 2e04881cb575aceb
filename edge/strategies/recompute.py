"""`recompute`: full prefill of the composed prompt — the quality ceiling and the speed baseline."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvedge.edge.strategies.base import Composed, Plan, ReuseStrategy
from kvedge.edge.strategies.registry import STRATEGIES


@STRATEGIES.register
@dataclass
class Recompute(ReuseStrategy):
    name = "recompute"

    def plan(self, rt, composed: Composed, reserve: int) -> Plan:
        ids = composed.all_ids()
        cache = rt.empty_cache(reserve=len(ids) + reserve)
        return Plan(cache, torch.tensor(ids), torch.arange(len(ids)),
                    recomputed=composed.n_context)
