"""`a3`: Attention-Aware Accurate KV Cache Fusion (A3, ../shared/papers/a3-*.txt, Sec. 2).

1. Position recovery (Eq. 2): each segment's pre-RoPE keys are rotated to their positions in
   the composed prompt (`assemble_cache(realign=True)`).
2. Every context token and the question pass through decoder blocks 0..ℓ (option `layer`,
   default 1), so layer ℓ holds
   the true Q/K/V of all of them (K_true). There the question's attention picks the tokens
   to recompute (Eq. 3):  s(d_i) = Σ_j softmax(q_j K_trueᵀ / √h)_{d_i},  Re = top_{r·n}(s),
   summed over query heads too; r is the recompute ratio (default 0.15), n the context length.
3. From layer ℓ+1 on only [Re, Q] run (Eq. 4–5): their fresh K/V overwrite the cached ones,
   every other token keeps its realigned cached K/V.
The chat prefix is not a candidate: its KV is exact already (it always sits at position 0).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvedge.common.attention import attention_probs
from kvedge.edge.strategies.registry import STRATEGIES
from kvedge.edge.strategies.shallow import ShallowSelection


def question_attention(q: torch.Tensor, q_pos: torch.Tensor, layer, scale: float,
                       window: int | None, n_positions: int) -> torch.Tensor:
    """Σ over query heads and question tokens of their attention to each cached position.

    q (Hkv, G, Nq, D) rotated; returns scores (n_positions,) indexed by position.
    """
    scores = torch.zeros(n_positions)
    for group in layer.heads():
        probs = attention_probs(q[group.kv_heads], group.keys, q_pos, group.positions, scale,
                                window)  # (h, G, Nq, Tk)
        scores.index_add_(0, group.positions.cpu(), probs.sum(dim=(0, 1, 2)).cpu())
    return scores


@STRATEGIES.register
@dataclass
class A3(ShallowSelection):
    name = "a3"

    def score(self, rt, composed, state, q, q_pos, cache_layer):
        is_q = q_pos >= composed.question_start
        return question_attention(q[:, :, is_q], q_pos[is_q], cache_layer, rt.scale,
                                  rt.layers[self.layer].window, composed.seq_len())
