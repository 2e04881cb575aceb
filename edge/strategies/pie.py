"""`pie`: realignment only (PIE, as A3 Sec. 3.1 describes it): each segment's pre-RoPE keys
rotated to their positions in the composed prompt (A3 Eq. 2), nothing recomputed."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvedge.edge.strategies.base import Composed, Plan, ReuseStrategy, assemble_cache
from kvedge.edge.strategies.registry import STRATEGIES


@STRATEGIES.register
@dataclass
class Pie(ReuseStrategy):
    name = "pie"
    realign: ClassVar[bool] = True

    def plan(self, rt, composed: Composed, reserve: int) -> Plan:
        cache = assemble_cache(rt, composed, realign=self.realign,
                               reserve=len(composed.question_ids) + reserve)
        return self.question_plan(composed, cache)
