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
    # it prefills the prompt's tokens and reads no KV: the edge hands it each segment's
    # synced token ids and fetches no missing pack (an on-demand edge answers it with no
    # transfer, or with the cloud down); a segment whose local manifest has no ids (written
    # before they were kept) comes as an opened pack, whose verified manifest gives them,
    # with none of its tensors decoded (a decode would count in the ceiling's TTFT: ~0.2 s
    # of Qwen2.5-0.5B's 7.5 s on hotpot-kb)
    reads_kv = False
    block_granular = True

    def plan(self, rt, composed: Composed, reserve: int) -> Plan:
        ids = composed.all_ids()
        cache = rt.empty_cache(reserve=len(ids) + reserve)
        return Plan(cache, torch.tensor(ids), torch.arange(len(ids)),
                    recomputed=composed.n_context)
