"""`kvzip`: KVzip's query-agnostic scoring (Kim et al., "KVzip: Query-Agnostic KV Cache
Compression with Context Reconstruction", NeurIPS 2025, §3) — the positive signal alone.

The context is followed by a request to repeat it and by the repetition itself, as the
model would answer; each KV pair's importance is the maximum attention it receives over the
grouped query heads and the repetition's positions (ContrastKV Eq. 8). As in KVzip's own
code (its `self_task` and `KVScore._get_score`), a context longer than `chunk` tokens is
reconstructed chunk by chunk:

- chunk 0's request is "\\n\\nRepeat the previous context exactly.", chunk i's "\\n\\nRepeat the
  part of the previous context exactly, starting with " followed by the last `seed_tokens`
  tokens of chunk i−1; then the chat template's assistant header (the request continues the
  user turn the context sits in, as the edge composes prompts) and the chunk's own tokens;
- the chunk's probe attends to the whole cache, but its scores are a softmax over the sink
  (the context's first `sinks` tokens — KVzip's sink is the system prompt before the
  context; a pack here starts with the document, whose first tokens are the attention sink),
  the chunk's own keys and the probe's — so each chunk is normalized on its own and a token
  is scored by its chunk's reconstruction only.

KVzip's chunk is 2K tokens ("a fixed chunk size of m = 2K", as ContrastKV's §5 runs it).
Selection is a global top-k over every (layer, head, token): non-uniform head budgets.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvedge.cloud.eviction.base import EvictionMethod
from kvedge.cloud.eviction.registry import METHODS
from kvedge.cloud.eviction.scoring import context_cache, merge_max, probe_scores, shared
from kvedge.common.model.tokenizer import chat_turn
from kvedge.common.registry import option

REPEAT = "\n\nRepeat the previous context exactly."
REPEAT_PART = "\n\nRepeat the part of the previous context exactly, starting with "


def reconstruction_prompts(tokenizer, context_ids: list[int], chunk: int = 2048,
                           seed_tokens: int = 8) -> list[tuple[list[int], tuple[int, int]]]:
    """[(probe ids, (start, end) of the context chunk it reconstructs)], KVzip's wording."""
    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    header = ids(chat_turn(tokenizer)[1])  # the user turn's end and the assistant's header
    prompts = []
    for start in range(0, len(context_ids), chunk):
        end = min(start + chunk, len(context_ids))
        ask = ids(REPEAT) if start == 0 else \
            ids(REPEAT_PART) + list(context_ids[max(start - seed_tokens, 0):start])
        prompts.append((ask + header + list(context_ids[start:end]), (start, end)))
    return prompts


def positive_scores(rt, cache, ctx, chunk: int = 2048, seed_tokens: int = 8, sink: int = 4):
    """Per layer (Hkv, n): max attention from the context's reconstruction (Eq. 8), chunk by
    chunk, probed against `cache`, the context's `context_cache` (left as it was; None: made
    here, only if the probe runs). Shared (`scoring.shared`): KVzip and ContrastKV scoring
    one context probe it once."""
    def probe():
        prompts = reconstruction_prompts(rt.loaded.tokenizer, ctx.token_ids, chunk, seed_tokens)
        whole = len(prompts) == 1  # one chunk: its span is the whole context
        dense = context_cache(rt, ctx) if cache is None else cache
        return merge_max([probe_scores(rt, dense, ctx.n_tokens, ids,
                                       span=None if whole else span, sink=sink)
                          for ids, span in prompts])

    return shared(("reconstruction", tuple(ctx.token_ids), chunk, seed_tokens, sink), probe)


@METHODS.register
@dataclass
class KVzip(EvictionMethod):
    chunk: int = option(2048, 1, None, "context tokens reconstructed per probe")
    seed_tokens: int = option(8, 0, None, "tokens of the previous chunk leading the next")

    name = "kvzip"

    def score(self, rt, ctx):
        return positive_scores(rt, None, ctx, self.chunk, self.seed_tokens,
                               max(self.sinks, self.protect))
