"""Greedy and sampled decoding over any runtime cache (dense, realigned, ragged), gpt-fast style."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from kvedge.common.kvcache import KVCache
from kvedge.common.runtime import Runtime


@dataclass(frozen=True)
class Sampler:
    """temperature 0 → greedy (argmax); otherwise softmax(logits / T) with optional top-k/top-p."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError("need temperature ≥ 0, 0 < top_p ≤ 1, top_k ≥ 0")

    def generator(self) -> torch.Generator | None:
        if self.seed is None:
            return None
        return torch.Generator().manual_seed(self.seed)

    def pick(self, logits: torch.Tensor, gen: torch.Generator | None = None) -> int:
        """logits (vocab,) → token id."""
        if self.temperature == 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        if self.top_k:
            kth = torch.topk(probs, min(self.top_k, probs.numel())).values[-1]
            probs = torch.where(probs < kth, 0.0, probs)
        if self.top_p < 1:
            sorted_p, order = torch.sort(probs, descending=True)
            drop = sorted_p.cumsum(0) - sorted_p > self.top_p  # keep the nucleus
            probs[order[drop]] = 0.0
        return int(torch.multinomial((probs / probs.sum()).cpu(), 1, generator=gen))


GREEDY = Sampler()


def generate(rt: Runtime, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor,
             max_new_tokens: int, *, sampler: Sampler = GREEDY,
             stop_ids: tuple[int, ...] = (), active=None, observe=None, write=None,
             seq_len: int | None = None) -> Iterator[int]:
    """Yield up to `max_new_tokens` token ids: run the prompt (`ids` at `positions`, with an
    optional partial-recompute `active` plan, its `observe` hook and `write` sets), then decode
    one token at a time, appending each at the next position. Stops after a token in
    `stop_ids` (which is yielded).

    One RoPE length for the whole request: `seq_len`, else the cache's (an assembled cache's
    keys are rotated with it), else the prompt's end + `max_new_tokens`.
    """
    gen = sampler.generator()
    seq_len = seq_len or cache.seq_len or int(positions[-1]) + 1 + max_new_tokens
    out = rt.forward(ids, positions, cache, active, observe=observe, write=write, seq_len=seq_len)
    pos = int(positions[-1])
    for step in range(max_new_tokens):
        token = sampler.pick(out.logits[-1], gen)
        yield token
        if token in stop_ids or step == max_new_tokens - 1:
            return  # the last token's K/V is never needed: no forward for it
        pos += 1
        out = rt.forward(torch.tensor([token]), torch.tensor([pos]), cache, seq_len=seq_len)


def greedy_answer(rt: Runtime, prompt_ids: list[int], max_new_tokens: int = 32,
                  stop_ids: tuple[int, ...] = ()) -> list[int]:
    """Full prefill of a prompt then greedy decoding: the quality ceiling."""
    ids = torch.tensor(prompt_ids)
    cache = rt.empty_cache(reserve=len(prompt_ids) + max_new_tokens)
    return list(generate(rt, cache, ids, torch.arange(len(prompt_ids)), max_new_tokens,
                         stop_ids=stop_ids))
