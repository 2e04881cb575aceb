"""`kvzip`: KVzip's query-agnostic scoring (Kim et al. 2025) — the positive signal alone.

The model is asked to repeat the context ("Repeat the previous context exactly.", then the
context itself) against the context's full cache; each KV pair's importance is the maximum
attention it receives over the grouped query heads and the reconstruction's positions
(ContrastKV Eq. 8). Long contexts are reconstructed in chunks of `chunk` tokens, a later chunk
seeded with the last `seed_tokens` tokens of the one before, so memory stays bounded.
Selection is a global top-k over every (layer, head, token): non-uniform head budgets.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvedge.cloud.eviction.base import EvictionMethod
from kvedge.cloud.eviction.registry import METHODS
from kvedge.cloud.eviction.scoring import context_cache, merge_max, probe_scores
from kvedge.common.registry import option

REPEAT = "Repeat the previous context exactly."


def reconstruction_prompts(tokenizer, context_ids: list[int], chunk: int = 2048,
                           seed_tokens: int = 8) -> list[list[int]]:
    """Chat-wrapped repeat instruction followed by each chunk of the context."""
    head = tokenizer.apply_chat_template([{"role": "user", "content": REPEAT}],
                                         add_generation_prompt=True, return_dict=False)
    prompts = []
    for start in range(0, len(context_ids), chunk):
        lead = max(start - seed_tokens, 0)
        prompts.append(list(head) + list(context_ids[lead:start + chunk]))
    return prompts


def positive_scores(rt, cache, ctx, chunk: int = 2048, seed_tokens: int = 8):
    """Per layer (Hkv, n): max attention from the context's reconstruction (Eq. 8), probed
    against `cache`, the context's `context_cache` (left as it was)."""
    prompts = reconstruction_prompts(rt.loaded.tokenizer, ctx.token_ids, chunk, seed_tokens)
    return merge_max([probe_scores(rt, cache, ctx.n_tokens, p) for p in prompts])


@METHODS.register
@dataclass
class KVzip(EvictionMethod):
    chunk: int = option(2048, 1, None, "context tokens reconstructed per probe")
    seed_tokens: int = option(8, 0, None, "tokens of the previous chunk leading the next")

    name = "kvzip"

    def score(self, rt, ctx):
        return positive_scores(rt, context_cache(rt, ctx), ctx, self.chunk, self.seed_tokens)
