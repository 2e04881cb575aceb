"""One request decoded alone on the caller's thread, gpt-fast style: `decode` is
`Decoding.start` (the prompt to its first token) then the scheduler's own decode step
(`kvedge.common.model.batch.decode_step`) with a batch of one, so what a single request
computes here is what the edge's continuous batching computes for it.

The edge answers through its scheduler; this is the loop for the places without one (the
needle demo, `kvedge generate`, the codec benchmark, tests).
"""
from __future__ import annotations

from typing import Iterator, Sequence

import torch

from kvedge.common.model.batch import decode_step, row_multiple, spec_rows_for
from kvedge.common.model.decoding import GREEDY, Decoding, Prompt, Sampler
from kvedge.common.model.kvcache import KVCache
from kvedge.common.model.runtime import Runtime


def decode(rt: Runtime, prompt: Prompt, max_new_tokens: int, *, sampler: Sampler = GREEDY,
           stop_ids: tuple[int, ...] = (), seq_len: int | None = None,
           lookup: Sequence[int] | None = None) -> Iterator[int]:
    """Yield up to `max_new_tokens` token ids: the prompt's first token, then the tokens of
    each decode step, each appended at the next position. Stops after a token in `stop_ids`
    (which is yielded).

    Alone, a step has no padding rows (see ROW_MULTIPLE): it computes exactly what
    `Runtime.forward` does. `lookup` (the prompt's tokens) turns on prompt-lookup drafts
    (`kvedge.common.model.batch.spec_rows_for` rows a step); the steps are then padded as
    the scheduler's are, so the answer is the one the edge serves."""
    state = Decoding.start(rt, prompt, max_new_tokens, sampler=sampler, stop_ids=stop_ids,
                           seq_len=seq_len, lookup=lookup)
    while True:
        yield from state.fresh
        if state.finished:
            return
        if lookup is None:
            decode_step(rt, [state], row_multiple=1)
        else:
            decode_step(rt, [state], row_multiple(rt, True), spec_rows_for(rt))


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
