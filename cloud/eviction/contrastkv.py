"""`contrastkv`: ContrastKV ("ContrastKV: Robust KV Cache Eviction via Contrastive Signal Fusion
for Multi-Query Generalization", Sec. 4).

1. Signals (Sec. 4.1): positive = the context's reconstruction, as KVzip (t_pos = n; its
   wording, and chunk by chunk past `chunk` tokens, each chunk normalized over its own keys
   as KVzip's code does: `kvedge.cloud.eviction.kvzip`);
   negative = a maximum-entropy noise sequence of t_neg tokens drawn uniformly from the
   vocabulary (seeded), which highlights tokens that draw attention whatever the content.
2. Scoring (Sec. 4.2, Eq. 8): for both, per layer and KV head, a token's score is the maximum
   attention it receives over the grouped query heads and the signal's positions.
3. Head-level fusion (Eq. 9), per head with quantiles G_β / G_{1−β}: 1.0 where both signals
   are in their top quantile, 0.0 where both are in their bottom one, S_pos otherwise.
4. Layer-level fusion (Eq. 10), on the undecided positions only: Ŝ = min(S_pos + γ·Ŝ_neg,
   max S_pos) with Ŝ_neg the negative score min-max normalized over the layer.
5. Selection: a global top-k over all (layer, head, token) — adaptive, non-uniform head
   budgets (App. A.5) — with attention sinks and any protected prefix always kept.
Defaults from App. A.3: β = 0.05 (5–10 % recommended), t_neg = 64 (≤ 128), γ = 0.12.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvedge.cloud.eviction.base import EvictionMethod
from kvedge.cloud.eviction.kvzip import positive_scores
from kvedge.cloud.eviction.registry import METHODS
from kvedge.cloud.eviction.scoring import context_cache, probe_scores
from kvedge.common.registry import option


def noise_sequence(vocab_size: int, length: int, seed: int) -> list[int]:
    """Maximum-entropy noise: tokens i.i.d. uniform over the vocabulary (Sec. 4.1)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (length,), generator=gen).tolist()


def head_fusion(pos: torch.Tensor, neg: torch.Tensor, beta: float):
    """Eq. 9 on (H, n) scores, quantiles per head → (gated scores, undecided mask)."""
    q = torch.tensor([beta, 1 - beta])
    p_lo, p_hi = torch.quantile(pos, q, dim=-1, keepdim=True)
    n_lo, n_hi = torch.quantile(neg, q, dim=-1, keepdim=True)
    top = (pos >= p_hi) & (neg >= n_hi)
    bottom = (pos <= p_lo) & (neg <= n_lo)
    gated = torch.where(top, 1.0, torch.where(bottom, 0.0, pos))
    return gated, ~(top | bottom)


def layer_fusion(pos: torch.Tensor, neg: torch.Tensor, gated: torch.Tensor,
                 undecided: torch.Tensor, gamma: float) -> torch.Tensor:
    """Eq. 10 over one layer's (H, n) scores: boost undecided positions by the negative."""
    span = neg.max() - neg.min()
    neg_hat = (neg - neg.min()) / span if span > 0 else torch.zeros_like(neg)
    boosted = torch.minimum(pos + gamma * neg_hat, pos.max())
    return torch.where(undecided, boosted, gated)


def fuse(pos: torch.Tensor, neg: torch.Tensor, beta: float, gamma: float) -> torch.Tensor:
    gated, undecided = head_fusion(pos, neg, beta)
    return layer_fusion(pos, neg, gated, undecided, gamma)


@METHODS.register
@dataclass
class ContrastKV(EvictionMethod):
    beta: float = option(0.05, 0.0, 0.5, "quantile β of the head-level gating (Eq. 9)")
    gamma: float = option(0.12, 0.0, None, "weight γ of the layer-level boost (Eq. 10)")
    t_neg: int = option(64, 1, None, "noise tokens of the negative signal (Sec. 4.1)")
    seed: int = option(0, help="seed of the noise sequence")
    chunk: int = option(2048, 1, None, "context tokens reconstructed per probe")
    seed_tokens: int = option(8, 0, None, "tokens of the previous chunk leading the next")

    name = "contrastkv"

    def score(self, rt, ctx):
        cache = context_cache(rt, ctx)  # both signals probe it: each probe truncates it back
        positive = positive_scores(rt, cache, ctx, self.chunk, self.seed_tokens,
                                   max(self.sinks, self.protect))
        noise = noise_sequence(rt.config.vocab_size, self.t_neg, self.seed)
        negative = probe_scores(rt, cache, ctx.n_tokens, noise)
        return [fuse(p, n, self.beta, self.gamma) for p, n in zip(positive, negative)]
