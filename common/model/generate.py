"""Greedy and sampled decoding over any runtime cache (dense, realigned, ragged), gpt-fast style."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from kvedge.common.errors import InvalidRequest
from kvedge.common.model.kvcache import KVCache
from kvedge.common.model.runtime import Runtime

MAX_TEMPERATURE = 2.0  # OpenAI's range is [0, 2]; hotter only adds noise
MAX_SEED = 2**63 - 1   # what gRPC's int64 carries and a torch generator takes


@dataclass(frozen=True)
class Sampler:
    """temperature 0 → greedy (argmax); otherwise softmax(logits / T) with optional top-k/top-p.

    The one place sampling limits are checked: gRPC Ask, the HTTP API and the CLI build a
    Sampler from what they were sent and rely on it. temperature is a finite number in
    [0, 2] (OpenAI's range), top_p in (0, 1], top_k ≥ 0, seed in 0..2**63-1 or None
    (unseeded); anything else is InvalidRequest, its `param` naming the field."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        t, seed = self.temperature, self.seed
        checks = [("temperature", math.isfinite(t) and 0 <= t <= MAX_TEMPERATURE,
                   "a finite number in [0, 2] (OpenAI's range; 0 = greedy)"),
                  ("top_p", 0 < self.top_p <= 1, "in (0, 1] (1 = off)"),  # NaN fails too
                  ("top_k", self.top_k >= 0, "≥ 0 (0 = off)"),
                  ("seed", seed is None or 0 <= seed <= MAX_SEED, "in 0..2**63-1")]
        for name, ok, rule in checks:
            if not ok:
                err = InvalidRequest(f"sampling field {name} must be {rule}, not "
                                     f"{getattr(self, name)!r}; leave it unset for its default")
                err.param = name  # the request field at fault (the HTTP API's error names it)
                raise err

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


class Decoding:
    """One request's decoding state between forwards: its cache and one RoPE length, its
    sampler with its own generator (a seed stays the request's however requests are batched),
    the last token picked and its position. `generate` steps one alone;
    `kvedge.common.model.batch.decode_step` steps many in one batched forward."""

    def __init__(self, cache: KVCache, max_new_tokens: int, sampler: Sampler, seq_len: int,
                 last_position: int, stop_ids: tuple[int, ...] = ()):
        self.cache, self.max_new_tokens, self.sampler = cache, max_new_tokens, sampler
        self.seq_len, self.position, self.stop_ids = seq_len, last_position, stop_ids
        self.gen = sampler.generator()
        self.token: int | None = None
        self.picked = 0

    @classmethod
    def start(cls, rt: Runtime, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor,
              max_new_tokens: int, *, sampler: Sampler = GREEDY, stop_ids: tuple[int, ...] = (),
              active=None, observe=None, write=None, seq_len: int | None = None,
              after_first: Callable[[KVCache], None] | None = None) -> "Decoding":
        """Run the prompt (see `generate`), pick the first token, then `after_first(cache)`."""
        seq_len = seq_len or cache.seq_len or int(positions[-1]) + 1 + max_new_tokens
        state = cls(cache, max_new_tokens, sampler, seq_len, int(positions[-1]), stop_ids)
        out = rt.forward(ids, positions, cache, active, observe=observe, write=write,
                         seq_len=seq_len)
        state.pick(out.logits[-1])
        if after_first is not None:
            after_first(cache)
        return state

    def pick(self, logits: torch.Tensor) -> int:
        self.token = self.sampler.pick(logits, self.gen)
        self.picked += 1
        return self.token

    @property
    def finished(self) -> bool:
        """After a stop token or the last allowed one: its K/V is never needed."""
        return self.token in self.stop_ids or self.picked == self.max_new_tokens

    def next_position(self) -> int:
        """Where the last picked token goes in the next forward."""
        return self.position + 1

    def advance(self, logits: torch.Tensor) -> int:
        """The last token ran at `next_position()`; pick the next one from its logits (vocab,)."""
        self.position += 1
        return self.pick(logits)


def generate(rt: Runtime, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor,
             max_new_tokens: int, *, sampler: Sampler = GREEDY,
             stop_ids: tuple[int, ...] = (), active=None, observe=None, write=None,
             seq_len: int | None = None,
             after_first: Callable[[KVCache], None] | None = None) -> Iterator[int]:
    """Yield up to `max_new_tokens` token ids: run the prompt (`ids` at `positions`, with an
    optional partial-recompute `active` plan, its `observe` hook and `write` sets), then decode
    one token at a time, appending each at the next position. Stops after a token in
    `stop_ids` (which is yielded). `after_first(cache)` runs once the first token is picked,
    before any decode step (A3's eviction: what the prompt's attention showed decides which
    rows the decoding keeps).

    One RoPE length for the whole request: `seq_len`, else the cache's (an assembled cache's
    keys are rotated with it), else the prompt's end + `max_new_tokens`.
    """
    state = Decoding.start(rt, cache, ids, positions, max_new_tokens, sampler=sampler,
                           stop_ids=stop_ids, active=active, observe=observe, write=write,
                           seq_len=seq_len, after_first=after_first)
    while True:
        yield state.token
        if state.finished:
            return
        out = rt.forward(torch.tensor([state.token]), torch.tensor([state.next_position()]),
                         cache, seq_len=state.seq_len)
        state.advance(out.logits[-1])


def greedy_answer(rt: Runtime, prompt_ids: list[int], max_new_tokens: int = 32,
                  stop_ids: tuple[int, ...] = ()) -> list[int]:
    """Full prefill of a prompt then greedy decoding: the quality ceiling."""
    ids = torch.tensor(prompt_ids)
    cache = rt.empty_cache(reserve=len(prompt_ids) + max_new_tokens)
    return list(generate(rt, cache, ids, torch.arange(len(prompt_ids)), max_new_tokens,
                         stop_ids=stop_ids))
