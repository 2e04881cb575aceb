"""`full-reuse`: concatenate the segments' caches as prefilled — no realignment, no recompute.

The lower bound of reuse (A3's "FullReuse" baseline): every segment's keys keep the RoPE of
positions 0..n-1 they were prefilled at, whatever their place in the prompt.
"""
from __future__ import annotations

from kvedge.edge.strategies.base import Composed, Plan, ReuseStrategy, assemble_cache


class FullReuse(ReuseStrategy):
    name = "full-reuse"

    def plan(self, rt, composed: Composed, reserve: int) -> Plan:
        cache = assemble_cache(rt, composed, realign=False,
                               reserve=len(composed.question_ids) + reserve)
        return self.question_plan(composed, cache)
