"""Attention over explicit KV with a position-based causal mask.

A query at position p sees exactly the keys at positions ≤ p (and, for sliding-window layers,
> p − window). Positions, not slot order, decide: recomputing a token in the middle of a cached
context must not see the tokens after it, which a bottom-right-aligned causal mask would show.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

QUERY_CHUNK = 2048  # bounds the (queries × keys) score matrix for long prefills


def visible(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Bool mask (Tq, Tk): key j is visible to query i."""
    mask = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        mask &= k_pos[None, :] > q_pos[:, None] - window
    return mask


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor,
                  k_pos: torch.Tensor, scale: float, window: int | None = None) -> torch.Tensor:
    """q (Hkv, G, Tq, D) against k, v (Hkv, Tk, D) → (Hkv, G, Tq, D).

    Grouped query heads share their KV head without expanding K/V. A query with no visible
    key (possible only in evicted caches) gets a zero output instead of NaN.
    """
    n_kv, group, n_q, dim = q.shape
    out = torch.empty_like(q)
    for start in range(0, n_q, QUERY_CHUNK):
        stop = min(start + QUERY_CHUNK, n_q)
        mask = visible(q_pos[start:stop], k_pos, window)  # (tq, Tk)
        qc = q[:, :, start:stop].reshape(1, n_kv * group, stop - start, dim)
        # 4-D with enable_gqa reaches the fused CPU/GPU kernels (a 3-D call falls back to the
        # unfused math path: ~5× slower); kv head j serves query heads jG..jG+G−1, as in HF
        oc = F.scaled_dot_product_attention(qc, k[None], v[None], attn_mask=mask, scale=scale,
                                            enable_gqa=group > 1)
        oc = oc.view(n_kv, group, stop - start, dim)
        blind = ~mask.any(-1)
        if blind.any():
            oc = oc.masked_fill(blind[None, None, :, None], 0.0)
        out[:, :, start:stop] = oc
    return out


def attention_probs(q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                    scale: float, window: int | None = None) -> torch.Tensor:
    """Softmax attention weights (Hkv, G, Tq, Tk) for a *chunk* of queries (scoring only)."""
    scores = torch.einsum("hgqd,hkd->hgqk", q.float(), k.float()) * scale
    scores = scores.masked_fill(~visible(q_pos, k_pos, window), float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0)
