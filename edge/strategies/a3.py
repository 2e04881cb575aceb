"""`a3`: A3 ("A³: Attention-Aware Accurate KV Cache Fusion for Fast Large Language Model
Serving", Sec. 2).

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
Not in the paper: `segment_head` > 0 recomputes every segment's first tokens on top of the
top-k (`ShallowSelection`, docs/design.md decision 9); default 0, the paper's selection.

Extension (Sec. 2, "Extention", after Eq. 5; off unless `capacity` > 0): once the first token
is picked, every layer and KV head keeps at most C = `capacity` rows — the system prompt S and
the question Q whole, and the top C − |S| − |Q| document tokens by SnapKV (Li et al., 2024;
`kvedge.common.model.snapkv`) — and decoding attends over exactly those (`kv_bytes` shrinks). What
the paper leaves open, decided here:
- S is the chat prefix, and fresh text between segments (SparseX layouts) is kept like it:
  both are exact, small, and not reusable document tokens; C counts them with Q, so a head
  holds exactly C rows after eviction. A C below |S| + |fresh| + |Q| is InvalidOption (the
  paper never evicts S or Q; silently holding more than C would misreport the capacity).
- Observation window: the question's tokens (its text, the instruction and the assistant
  header): they end the prompt, as SnapKV's window does, A3 already runs them at every layer
  (their queries cost nothing extra), and they are what the paper keeps as Q. A fixed
  32-token window would cut a long question and reach into the last document for a short one.
- Votes per KV head (the cache's unit: a query head cannot drop rows its KV head shares),
  summed over its grouped query heads and the window; max-pooled with SnapKV's kernel 7, as
  the cloud's `snapkv` does, with S, fresh text and Q zeroed first so their own votes (the
  prefix's attention sink, the question attending to itself) do not spill onto neighbouring
  document tokens.
- Votes are taken while the prompt runs, from each layer's final cache (recomputed tokens'
  fresh K/V, the others' realigned K/V): what the first token attended to. The eviction runs
  before the first token is returned, so its few milliseconds count in TTFT (the paper
  reports ≈5 ms more TTFT with it).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvedge.common.model.attention import key_votes
from kvedge.common.errors import InvalidOption
from kvedge.common.model.kvcache import KVCache, kept_rows
from kvedge.common.registry import option
from kvedge.common.model.snapkv import cluster, keep_top
from kvedge.edge.strategies.base import Composed, Plan
from kvedge.edge.strategies.registry import STRATEGIES
from kvedge.edge.strategies.shallow import ShallowSelection


def question_attention(q: torch.Tensor, q_pos: torch.Tensor, layer, scale: float,
                       window: int | None, n_positions: int) -> torch.Tensor:
    """Σ over query heads and question tokens of their attention to each cached position:
    SnapKV's votes (`key_votes`) summed over the KV heads.

    q (Hkv, G, Nq, D) rotated; returns scores (n_positions,) indexed by position.
    """
    return key_votes(q, q_pos, layer, scale, window, n_positions).sum(0)


@STRATEGIES.register
@dataclass
class A3(ShallowSelection):
    capacity: int = option(0, 0, None, "KV rows kept per layer and KV head once the first "
                           "token is picked (SnapKV; prefix and question always kept); 0: all")

    name = "a3"

    def score(self, rt, composed, state, q, q_pos, cache_layer):
        is_q = q_pos >= composed.question_start
        return question_attention(q[:, :, is_q], q_pos[is_q], cache_layer, rt.scale,
                                  rt.layers[self.layer].window, composed.seq_len())

    def plan(self, rt, composed: Composed, reserve: int) -> Plan:
        plan = super().plan(rt, composed, reserve)
        if self.capacity:
            evict = SnapEviction(rt, composed, self.capacity, reserve)
            select = plan.observe

            def observe(layer, q, q_pos, cache_layer):
                select(layer, q, q_pos, cache_layer)
                evict.observe(layer, q, q_pos, cache_layer)
            plan.observe, plan.after_first = observe, evict
        return plan


class SnapEviction:
    """A3's extension: SnapKV votes of the question gathered while the prompt runs; called on
    the cache once the first token is picked, it keeps `capacity` rows per layer and KV head."""

    def __init__(self, rt, composed: Composed, capacity: int, reserve: int):
        protected = composed.n_prefix + composed.fresh_positions().numel()
        if capacity < protected:
            raise InvalidOption(f"'a3' option 'capacity' ({capacity}) is below the {protected} "
                                "rows this prompt keeps whole (chat prefix, fresh text and "
                                "question): raise it, or use 0 for no eviction")
        self.rt, self.budget, self.reserve = rt, capacity - protected, reserve
        self.window_start = composed.question_start
        self.document = torch.zeros(composed.seq_len(), dtype=torch.bool)
        self.document[composed.reused_positions()] = True
        self.votes: list[torch.Tensor | None] = [None] * rt.n_layers

    def observe(self, layer: int, q: torch.Tensor, q_pos: torch.Tensor, cache_layer) -> None:
        """Layer `layer`'s votes (Hkv, positions): the window's attention, clustered."""
        window = q_pos >= self.window_start
        votes = key_votes(q[:, :, window], q_pos[window], cache_layer, self.rt.scale,
                          self.rt.layers[layer].window, self.document.numel())
        self.votes[layer] = cluster(votes * self.document)

    def __call__(self, cache: KVCache) -> None:
        """Evict in place: each layer where some head holds more than the capacity becomes
        ragged, holding per head its protected rows and its top `budget` document rows."""
        for i, layer in enumerate(cache):
            keep = []
            for group in layer.heads():
                pos = group.positions.cpu()
                keep += [keep_top(self.votes[i][h][pos], self.document[pos], self.budget)
                         for h in range(group.first, group.first + group.keys.shape[0])]
            if not all(bool(k.all()) for k in keep):
                cache[i] = kept_rows(layer, keep, self.reserve)
