"""`sparsex`: SparseX's Sparse-Q-driven Sparse-KV Recomputation ("SparseX: Efficient
Segment-Level KV Cache Sharing for Interleaved LLM Serving", Sec. 3.2–3.4, Alg. 1).

1. RoPE alignment (Alg. 1 line 6): each reused segment's keys move by Δ = p' − p. Our keys
   are stored pre-RoPE, so rotating them once to the composed positions is the same map
   (`assemble_cache(realign=True)`).
2. Full+sparse hybrid (Sec. 3.4, Alg. 1 lines 7–10): layers 1..ℓ* run every prompt token
   with full causal attention over the mixture of fresh and aligned cached K/V.
3. Sparse-Q estimation at ℓ* (Eq. 1–3, lines 11–14): the queries of the non-reused tokens
   I_nr — here the question (and any fresh text between segments) — attend to every visible
   key; s_j = Σ_i A_sq[i, j], summed over heads too (the paper aggregates across heads,
   Sec. 3.2); S_key = the top-k reused tokens by s_j.
4. Overflow (line 15): each contiguous interval of I_nr widened by one block of `block`
   tokens on both sides — the last block of the segment before it, the first of the one after.
5. Tail fallback (line 16): when the prompt ends in reused tokens, the last 64 tokens of the
   final reused segment join R.
6. From ℓ*+1 on only R = I_nr ∪ S_key ∪ S_ov ∪ S_tail run (lines 18–23); every other reused
   token keeps its aligned cached K/V.

How our composition maps: the chat prefix is a prefix-cache hit (exact KV at position 0; Alg. 1
line 5 excludes such hits from the prefill) — neither Sparse-Q nor a candidate. SparseX's
frozen blocks are our pinned packs (`PackCache.pinned`); its namespace extra keys e_m are our
namespaces: a pack's id covers its namespace, so two tenants never share an entry.

Decisions where the paper gives no value (each an option, measured in docs/reuse.md):
- ℓ* (`boundary`, a fraction of depth): 0.17 → 5 of SmolLM2's 30 layers. The paper puts the
  boundary at 15–20 % of the layers for small dense models (Sec. 3.4). Note what it costs:
  layers 1..ℓ* are a full prefill, so TTFT cannot drop below ℓ*/L of recompute's.
  `boundary=0` is the variant without hybrid attention (Table 1's "w/o"): Sparse-Q is
  estimated from layer-0 queries against the aligned cached keys and R runs from layer 0.
- k (`ratio`): a fraction of the reused tokens, default 0.15 — A3's default recompute ratio,
  so the two are compared at equal top-k budgets; overflow and tail come on top of it.
- b (`block`): 16 tokens, vLLM's default block size, the unit SparseX-vLLM reuses and widens
  intervals by (Sec. 4).
- `segment_head` (not in the paper; segment-boundary repair, docs/design.md decision 9): the first
  tokens of every reused segment, which act as attention sinks when a segment prefilled
  alone is placed mid-prompt, always join R. Default 0: plain SparseX.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvedge.common.registry import option
from kvedge.edge.strategies.a3 import question_attention
from kvedge.edge.strategies.base import (Composed, Plan, ReuseStrategy, assemble_cache,
                                         recomputed_count, top_k_plus)
from kvedge.edge.strategies.registry import STRATEGIES

TAIL_TOKENS = 64  # Alg. 1 line 16: "the last 64 query tokens of the final reuse segment"


def intervals(positions: torch.Tensor) -> list[tuple[int, int]]:
    """Contiguous [start, end) runs of sorted positions."""
    if positions.numel() == 0:
        return []
    breaks = torch.nonzero(positions[1:] != positions[:-1] + 1).flatten() + 1
    starts = torch.cat([positions[:1], positions[breaks]])
    ends = torch.cat([positions[breaks - 1], positions[-1:]]) + 1
    return list(zip(starts.tolist(), ends.tolist()))


@STRATEGIES.register
@dataclass
class SparseX(ReuseStrategy):
    ratio: float = option(0.15, 0.0, 1.0, "top-k budget: share of the reused tokens (Eq. 3)")
    boundary: float = option(0.17, 0.0, 1.0, "ℓ*: share of layers with full attention "
                             "(0 = no hybrid: sparse from layer 0)")
    block: int = option(16, 0, None, "overflow: tokens each non-reused interval widens by")
    segment_head: int = option(0, 0, None, "first tokens of each segment always recomputed")

    name = "sparsex"

    def boundary_layer(self, n_layers: int) -> int:
        """ℓ*: the number of leading layers that run full attention."""
        return min(round(self.boundary * n_layers), n_layers - 1)

    def plan(self, rt, composed: Composed, reserve: int) -> Plan:
        cache = assemble_cache(rt, composed, realign=True,
                               reserve=len(composed.question_ids) + reserve)
        fresh = composed.fresh_positions()              # I_nr
        reused = composed.reused_positions()            # I_reuse
        fixed = self.fixed_set(composed, fresh, reused)  # S_ov ∪ S_tail ∪ segment heads
        budget = round(self.ratio * reused.numel())
        ell = self.boundary_layer(rt.n_layers)
        if ell == 0:
            all_ids = torch.tensor(composed.all_ids())
            scores = self.layer0_scores(rt, cache, all_ids[fresh], fresh).cpu()
            chosen = top_k_plus(scores, reused, fixed, budget)
            run = torch.sort(torch.cat([chosen, fresh])).values
            return Plan(cache, all_ids[run], run, recomputed=chosen.numel())
        chosen: list[torch.Tensor] = []

        def observe(layer, q, q_pos, cache_layer):
            if layer == ell - 1 and not chosen:
                is_q = torch.isin(q_pos, fresh.to(q_pos.device))
                s = question_attention(q[:, :, is_q], q_pos[is_q], cache_layer, rt.scale,
                                       rt.layers[layer].window, composed.seq_len()).cpu()
                chosen.append(top_k_plus(s, reused, fixed, budget))

        def active(layer, current):
            return None if layer < ell else torch.sort(torch.cat([chosen[0], fresh])).values

        run_ids, run = composed.run_span()
        return Plan(cache, run_ids, run, active,
                    recomputed=recomputed_count(reused, fixed, budget), observe=observe)

    def fixed_set(self, composed: Composed, fresh: torch.Tensor,
                  reused: torch.Tensor) -> torch.Tensor:
        """Overflow (Alg. 1 line 15), tail fallback (line 16) and the segments' first tokens:
        the reused positions recomputed whatever Sparse-Q says."""
        picks = []
        for start, end in intervals(fresh):
            picks += [torch.arange(start - self.block, start), torch.arange(end, end + self.block)]
        if int(fresh.max()) < int(reused.max()):  # the prompt ends in reused tokens
            last = composed.offsets[-1]
            picks.append(torch.arange(max(last, int(reused.max()) + 1 - TAIL_TOKENS),
                                      int(reused.max()) + 1))
        picks.append(composed.segment_heads(self.segment_head))
        picked = torch.cat(picks)
        return torch.unique(picked[torch.isin(picked, reused)])

    @staticmethod
    def layer0_scores(rt, cache, ids: torch.Tensor, fresh: torch.Tensor) -> torch.Tensor:
        """s_j of Eq. 2 without hybrid attention: the non-reused tokens' layer-0 queries
        against the aligned cached keys (and their own fresh keys, which share the softmax)."""
        from kvedge.common.model.kvcache import DenseKV
        from kvedge.common.model.runtime import rms_norm

        w, seq_len = rt.layers[0], cache.seq_len
        q, k, v = rt.qkv(w, rms_norm(F.embedding(ids, rt.embed), w.ln1, rt.eps))
        q, k = rt.realign(q, fresh, seq_len), rt.realign(k, fresh, seq_len)
        held = cache[0].heads()
        keys = [torch.cat([g.keys, k[g.kv_heads]], dim=1) for g in held]
        vals = [torch.cat([g.values, v[g.kv_heads]], dim=1) for g in held]
        pos = [torch.cat([g.positions, fresh.to(g.positions.device)]) for g in held]
        if len(held) == 1:
            layer = DenseKV(keys[0], vals[0], pos[0])
        else:
            from kvedge.common.model.kvcache import RaggedKV

            layer = RaggedKV([k_[0] for k_ in keys], [v_[0] for v_ in vals], pos)
        q = q.view(rt.n_kv, rt.group, -1, rt.head_dim)
        return question_attention(q, fresh, layer, rt.scale, w.window, seq_len)  # (seq_len,)
