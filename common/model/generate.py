"""One request decoded alone on the caller's thread, gpt-fast style: `decode` is
`Decoding.start` (the prompt to its first token) then the scheduler's own decode step
(`kvedge.common.model.batch.decode_step`) with a batch of one, so what a single request
computes here is what the edge's continuous batching computes for it.

The edge answers through its scheduler; this is the loop for the places without one (the
needle demo, `kvedge generate`, the codec benchmark, tests).
"""
from __future__ import annotations

from typing import Iterator

import torch

from kvedge.common.model.batch import decode_step
from kvedge.common.model.decoding import GREEDY, Decoding, Prompt, Sampler
from kvedge.common.model.kvcache import KVCache
from kvedge.common.model.runtime import Runtime


def decode(rt: Runtime, prompt: Prompt, max_new_tokens: int, *, sampler: Sampler = GREEDY,
           stop_ids: tuple[int, ...] = (), seq_len: int | None = None) -> Iterator[int]:
    """Yield up to `max_new_tokens` token ids: the prompt's first token, then one token per
    decode step, each appended at the next position. Stops after a token in `stop_ids`
    (which is yielded)."""
    state = Decoding.start(rt, prompt, max_new_tokens, sampler=sampler, stop_ids=stop_ids,
                           seq_len=seq_len)
    while True:
        yield state.token
        if state.finished:
            return
        decode_step(rt, [state], row_multiple=1)  # alone: no padding rows (see ROW_MULTIPLE)


def generate(rt: Runtime, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor,
             max_new_tokens: int, *, sampler: Sampler = GREEDY,
             stop_ids: tuple[int, ...] = (), active=None, observe=None,
             seq_len: int | None = None, after_first=None) -> Iterator[int]:
    """`decode` of the prompt `ids` at `positions` over `cache` (see `Prompt` for `active`,
    `observe` and `after_first`)."""
    return decode(rt, Prompt(cache, ids, positions, active, observe, after_first),
                  max_new_tokens, sampler=sampler, stop_ids=stop_ids, seq_len=seq_len)


def greedy_answer(rt: Runtime, prompt_ids: list[int], max_new_tokens: int = 32,
                  stop_ids: tuple[int, ...] = ()) -> list[int]:
    """Full prefill of a prompt then greedy decoding: the quality ceiling."""
    ids = torch.tensor(prompt_ids)
    cache = rt.empty_cache(reserve=len(prompt_ids) + max_new_tokens)
    return list(generate(rt, cache, ids, torch.arange(len(prompt_ids)), max_new_tokens,
                         stop_ids=stop_ids))
