"""`legolink`: LegoLink as A3 runs it ("A³: Attention-Aware Accurate KV Cache Fusion for Fast
Large Language Model Serving", Sec. 3.1: "we recompute the first and last 20 tokens of each
chunk"): after position recovery, recompute the first and last `tokens` tokens of every segment
at full depth — StreamingLLM's sink-and-recent rule applied per chunk. EPIC's own rule (first
k ≤ 32 tokens only) is `epic`; both are `base.boundary_plan`.

`tokens` = 20 is A3's value (Sec. 4, "Details"), set there for 512-token chunks (8 % of a
chunk). Over shorter segments it recomputes more of the prompt (~30 % of 10 HotpotQA
paragraphs of ~140 tokens), which is what caps legolink's first-token speed-up. Halving it
was measured and rejected: on 300 HotpotQA questions (Qwen2.5-0.5B, 10 paragraphs, each
prefilled alone) tokens = 10 lost 0.032 F1 against 20, interval [−0.057, −0.008]
(docs/results.md, hotpot-fixed).

`first` sets the start apart from the end (−1, the default, takes `tokens` at both, as A3
runs it). The paper does not split them; the option exists to measure which end carries the
quality (StreamingLLM's sink needs ~4 tokens at the start, so `first` = 4 keeps the sink and
the recent end for 24 tokens a segment instead of 40). Measured on the same 300 questions
(docs/results.md, "Which end of a segment carries legolink's quality"): `first` = 4 and
`first` = 0 each lose 0.016 F1 to 20 + 20 (intervals [−0.050, +0.018] and [−0.055, +0.024])
and tie with each other; `first` = 0 brings the first token to 0.224 of recompute's against
the default's 0.365 (20 questions, one at a time). The default stays −1: the interval cannot
place the loss, and the speed-up (4.5×) still misses the 5× target.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvedge.common.registry import option
from kvedge.edge.strategies.base import Composed, Plan, ReuseStrategy, boundary_plan
from kvedge.edge.strategies.registry import STRATEGIES


def ends(n: int, first: int, last: int) -> torch.Tensor:
    """The first `first` and last `last` of n indices (each once, sorted)."""
    return torch.unique(torch.cat([torch.arange(min(first, n)),
                                   torch.arange(max(n - last, 0), n)]))


@STRATEGIES.register
@dataclass
class LegoLink(ReuseStrategy):
    tokens: int = option(20, 0, None, "tokens recomputed at each end of every segment")
    first: int = option(-1, -1, None, "tokens recomputed at the start of every segment "
                                      "(-1: `tokens`)")

    name = "legolink"

    def plan(self, rt, composed: Composed, reserve: int) -> Plan:
        first = self.tokens if self.first < 0 else self.first
        return boundary_plan(rt, composed, reserve, lambda n: ends(n, first, self.tokens))
