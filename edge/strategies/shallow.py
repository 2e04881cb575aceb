"""Selective recompute decided at a shallow layer: the plumbing A3 and CacheBlend share."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvedge.common.errors import InvalidOption
from kvedge.common.registry import option
from kvedge.edge.strategies.base import (Composed, Plan, ReuseStrategy, assemble_cache,
                                         recomputed_count, top_k_plus)


@dataclass
class ShallowSelection(ReuseStrategy):
    """Recompute a ratio of the context chosen at a shallow layer (A3, CacheBlend).

    Every context token and the question run through blocks 0..`layer`; there `score()` rates
    each context token, the top `ratio · n` are kept and, with the question, are the only
    tokens run from `layer + 1` on. Subclasses implement `score` (and `before` if they need
    the reused cache's state) only.

    `segment_head` (in neither paper; docs/design.md decision 9, as SparseX's option of the
    same name): the first tokens of every segment are recomputed whatever the score says, on
    top of the ratio's top-k, which is then taken from the other tokens. A segment prefilled
    alone carries an attention sink on its first tokens; left stale mid-prompt it pulls the
    question's attention (measured in docs/results.md, hotpot-fixed on SmolLM2: A3's answers
    that stop at a preamble). Default 0: the papers' method.
    """

    ratio: float = option(0.15, 0.0, 1.0, "share of the context's tokens recomputed")
    layer: int = option(1, 0, None, "layer whose attention/deviation picks the tokens")
    segment_head: int = option(0, 0, None, "first tokens of each segment always recomputed")

    def before(self, rt, composed: Composed, cache) -> object:
        """State `score` needs from the cache before recompute overwrites it (optional)."""
        return None

    def score(self, rt, composed: Composed, state, q: torch.Tensor, q_pos: torch.Tensor,
              cache_layer) -> torch.Tensor:
        """Scores indexed by position (at least up to the question), at `self.layer`; only
        the reused positions' scores are read."""
        raise NotImplementedError

    def plan(self, rt, composed: Composed, reserve: int) -> Plan:
        if self.layer >= rt.n_layers:
            raise InvalidOption(f"{self.name!r} option 'layer' must be below the model's "
                                f"{rt.n_layers} layers, got {self.layer}")
        cache = assemble_cache(rt, composed, realign=True,
                               reserve=len(composed.question_ids) + reserve)
        state = self.before(rt, composed, cache)
        reused, fresh = composed.reused_positions(), composed.fresh_positions()
        heads = composed.segment_heads(self.segment_head)
        budget = round(self.ratio * reused.numel())
        chosen: list[torch.Tensor] = []

        def observe(layer, q, q_pos, cache_layer):
            if layer == self.layer and not chosen:
                # the plan's positions are CPU tensors; the model's scores may be on a GPU
                scores = self.score(rt, composed, state, q, q_pos, cache_layer).cpu()
                chosen.append(top_k_plus(scores, reused, heads, budget))

        def active(layer, current):
            if layer <= self.layer:
                return None
            return torch.sort(torch.cat([chosen[0], fresh])).values

        run_ids, run_pos = composed.run_span()
        return Plan(cache, run_ids, run_pos, active,
                    recomputed=recomputed_count(reused, heads, budget), observe=observe)
