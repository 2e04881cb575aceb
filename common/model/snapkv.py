"""SnapKV's selection (Li et al., 2024, "SnapKV: LLM Knows What You are Looking for before
Generation", arXiv:2404.14469, Sec. 4): the queries of an observation window vote for the keys
they attend to (`kvedge.common.model.attention.key_votes`, reduce="sum": summed over the window and,
per KV head, over its grouped query heads), the votes are pooled over neighbouring positions
so that a kept token keeps its neighbours ("clustering"), and each head keeps its top-k.

Shared by the cloud's query-agnostic `snapkv` eviction (a generic proxy question is the
window) and A3's eviction after the first token (the question is the window). Torch only.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

KERNEL = 7  # max-pooling width (SnapKV pools by max or mean): the cloud's `snapkv` default


def cluster(votes: torch.Tensor, kernel: int = KERNEL) -> torch.Tensor:
    """votes (..., n) max-pooled over the `kernel` positions around each (odd kernel: the
    same length back)."""
    flat = votes.reshape(-1, 1, votes.shape[-1])
    return F.max_pool1d(flat, kernel, 1, kernel // 2).reshape(votes.shape)


def keep_top(votes: torch.Tensor, candidates: torch.Tensor, budget: int) -> torch.Tensor:
    """(n,) bool: the `budget` candidates with the most votes, and every non-candidate
    (what the caller protects); all of them when the candidates are no more than `budget`."""
    keep = ~candidates
    index = candidates.nonzero().flatten()
    if index.numel() <= budget:
        return torch.ones_like(candidates)
    keep[index[torch.topk(votes[index], budget).indices]] = True
    return keep
