"""What every query-agnostic eviction method shares: scoring a context's KV once, selecting.

A method scores each cached KV pair — per layer, KV head and token: `score(rt, ctx) →
[layer] (Hkv, n)`, the one override (kvpress's contract) — and the base class keeps the top
`budget` fraction, either over all pairs at once (adaptive, non-uniform head budgets, as
KVzip and ContrastKV do) or per head (uniform). Attention sinks and a protected prefix are
never evicted. The result is ragged: per (layer, head) its own sorted positions, applied with
`KVContext.select` so the kept KV really is smaller (no masks pretending to evict).

`evict` = `scores` then `keep`; both are public because scores are query-agnostic and
budget-free: the benchmark scores a context once and keeps several budgets from it. A
method's hyperparameters are its dataclass fields, declared with `option()` (range, help),
so the CLI and jobs set them by name through the registry (`registry.METHODS`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from kvedge.common.errors import InvalidRequest
from kvedge.common.registry import option, validate


@dataclass
class EvictionResult:
    kept: list[list[torch.Tensor]]          # [layer][head] sorted original positions
    scores: list[torch.Tensor] | None       # [layer] (Hkv, n), for inspection
    seconds: float
    budget: float

    @property
    def kept_pairs(self) -> int:
        return sum(k.numel() for layer in self.kept for k in layer)


@dataclass
class EvictionMethod:
    """Base class: subclasses set `name` and implement `score`."""

    budget: float = option(0.2, 0.0, 1.0, "fraction of the context's KV pairs kept, in (0, 1]")
    sinks: int = option(4, 0, None, "first tokens never evicted (attention sinks)")
    protect: int = option(0, 0, None, "a protected prefix (e.g. a chat prefix), never evicted")
    adaptive: ClassVar[bool] = True   # global top-k across heads (else the same k per head)
    name: ClassVar[str] = ""

    def __post_init__(self):
        if not 0 < self.budget <= 1:  # the option's range is closed; keeping nothing is not
            raise InvalidRequest(f"budget must be in (0, 1], got {self.budget}")
        validate(self)

    def score(self, rt, ctx) -> list[torch.Tensor]:
        raise NotImplementedError

    def scores(self, rt, ctx) -> list[torch.Tensor]:
        """Per layer (Hkv, n) float scores, higher = kept first; independent of the budget."""
        return [s.float() for s in self.score(rt, ctx)]

    def keep(self, scores: list[torch.Tensor], ctx) -> list[list[torch.Tensor]]:
        """[layer][head] sorted positions this method keeps at its budget, given `scores`."""
        return select(scores, ctx, self.budget, self.sinks, self.protect, self.adaptive)

    def evict(self, rt, ctx) -> EvictionResult:
        start = time.perf_counter()
        scores = self.scores(rt, ctx)
        kept = self.keep(scores, ctx)
        return EvictionResult(kept, scores, time.perf_counter() - start, self.budget)


def select(scores: list[torch.Tensor], ctx, budget: float, sinks: int, protect: int,
           adaptive: bool) -> list[list[torch.Tensor]]:
    """Keep round(budget · pairs) KV pairs by score; protected tokens first, always."""
    positions = torch.tensor(ctx.positions)
    n = positions.numel()
    guarded = torch.arange(n) < max(sinks, protect)
    total = sum(s.numel() for s in scores)
    k_total = max(round(budget * total), sum(int(guarded.sum()) * s.shape[0] for s in scores))
    stacked = torch.stack(scores)  # (L, Hkv, n)
    stacked = torch.where(guarded, torch.inf, stacked)
    if adaptive:
        flat = stacked.flatten()
        keep = torch.zeros_like(flat, dtype=torch.bool)
        keep[torch.topk(flat, min(k_total, flat.numel())).indices] = True
        keep = keep.view_as(stacked)
    else:
        per_head = max(round(k_total / (stacked.shape[0] * stacked.shape[1])), 1)
        idx = torch.topk(stacked, min(per_head, n), dim=-1).indices
        keep = torch.zeros_like(stacked, dtype=torch.bool).scatter_(-1, idx, True)
    return [[positions[keep[l, h]] for h in range(keep.shape[1])] for l in range(keep.shape[0])]
