"""A request's decoding state, and the one way a prompt runs to its first token.

`Decoding.start` runs a `Prompt` (the cache to start from, the tokens to run at layer 0, the
per-layer active sets and the hooks a strategy watches or acts with) to its first token, then
runs the prompt's `after_first` step. Everything that answers calls it: the edge's scheduler
(the served path), `generate` below it (the CLI's and tests' single-request loop), the
benchmark (through the served path) and `kvctl model verify`. Decoding then steps with
`kvedge.common.model.batch.decode_step`, one request or many.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from kvedge.common.errors import CacheError, InvalidRequest
from kvedge.common.model.kvcache import KVCache
from kvedge.common.model.runtime import ActivePlan, Observer, Runtime
from kvedge.common.model.speculate import PromptLookup

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


@dataclass
class Prompt:
    """What runs to the first token: the cache to start from, the tokens run at layer 0 (`run_ids`
    at `run_positions`, strictly increasing), an optional partial-recompute `active` plan (per
    layer, or decided layer by layer), an `observe` hook on each layer's attention inputs, and
    `after_first(cache)`, run once the first token is picked and before any decode step (A3's
    SnapKV eviction: what the prompt's attention showed decides which rows decoding keeps).
    A reuse strategy's plan is one (`kvedge.edge.strategies.base.Plan`)."""

    cache: KVCache
    run_ids: torch.Tensor
    run_positions: torch.Tensor
    active: ActivePlan | None = None
    observe: Observer | None = None
    after_first: Callable[[KVCache], None] | None = None


class Decoding:
    """One request's decoding state between forwards: its cache and one RoPE length, its
    sampler with its own generator (a seed stays the request's however requests are batched),
    the last token picked and its position, and `fresh`, the tokens the last forward picked
    (one, or more when drafts were accepted). `start` makes one from a prompt;
    `kvedge.common.model.batch.decode_step` steps one or many in one batched forward.

    `lookup`, when given, holds the prompt's tokens and every picked one, and proposes
    drafts (`kvedge.common.model.speculate`); only a greedy request drafts, as only under
    greedy is keeping the tokens the model agrees with exactly plain decoding."""

    def __init__(self, cache: KVCache, max_new_tokens: int, sampler: Sampler, seq_len: int,
                 last_position: int, stop_ids: tuple[int, ...] = (),
                 lookup: PromptLookup | None = None):
        self.cache, self.max_new_tokens, self.sampler = cache, max_new_tokens, sampler
        self.seq_len, self.position, self.stop_ids = seq_len, last_position, stop_ids
        self.gen = sampler.generator()
        self.lookup = lookup if sampler.temperature == 0 else None
        self.token: int | None = None
        self.logits: torch.Tensor | None = None  # what the last token was picked from
        self.picked = 0
        self.fresh: list[int] = []
        self.steps = 0  # decode forwards run (the first token's not counted)
        self.drafted = self.accepted = 0  # draft tokens run, and those the model agreed with

    @classmethod
    def start(cls, rt: Runtime, prompt: Prompt, max_new_tokens: int, *,
              sampler: Sampler = GREEDY, stop_ids: tuple[int, ...] = (),
              seq_len: int | None = None, lookup: Sequence[int] | None = None) -> "Decoding":
        """Run `prompt` through the model, pick the first token, then `prompt.after_first`.

        One RoPE length for the whole request: `seq_len`, else the cache's (an assembled
        cache's keys are rotated with it), else the prompt's end + `max_new_tokens`.
        `lookup`: the prompt's tokens, which drafts are copied from (None: no drafts)."""
        cache, positions = prompt.cache, prompt.run_positions
        seq_len = seq_len or cache.seq_len or int(positions[-1]) + 1 + max_new_tokens
        state = cls(cache, max_new_tokens, sampler, seq_len, int(positions[-1]), stop_ids,
                    None if lookup is None else PromptLookup(lookup))
        out = rt.forward(prompt.run_ids, positions, cache, prompt.active,
                         observe=prompt.observe, seq_len=seq_len)
        state.fresh = [state.pick(out.logits[-1])]
        if prompt.after_first is not None:
            prompt.after_first(cache)
        return state

    def pick(self, logits: torch.Tensor) -> int:
        self.logits, self.token = logits, self.sampler.pick(logits, self.gen)
        self.picked += 1
        if self.lookup is not None:
            self.lookup.push(self.token)
        return self.token

    @property
    def finished(self) -> bool:
        """After a stop token or the last allowed one: its K/V is never needed."""
        return self.token in self.stop_ids or self.picked == self.max_new_tokens

    def next_position(self) -> int:
        """Where the last picked token goes in the next forward."""
        return self.position + 1

    def check_next_position(self) -> None:
        """CacheError if the next position lies inside the cache's context: the token's K/V
        would be held twice. Every decode step checks it (on the host: no device sync)."""
        if (p := self.next_position()) in self.cache.extent:
            raise CacheError(f"decode position {p} is inside the cache's context")

    def draft(self, k: int) -> list[int]:
        """Up to k tokens guessed to follow the last picked one (none without a lookup),
        never more than the answer may still add after the next pick."""
        if self.lookup is None:
            return []
        return self.lookup.draft(min(k, self.max_new_tokens - self.picked - 1))

    def advance(self, logits: torch.Tensor) -> int:
        """The last token ran at `next_position()`; pick the next one from its logits (vocab,)."""
        self.accept(logits[None], [])
        return self.token

    def accept(self, logits: torch.Tensor, drafts: list[int]) -> int:
        """The last token and then `drafts` ran at the next positions; `logits` (1 +
        len(drafts), vocab) are theirs. Pick from each row while the pick equals the draft
        the next row ran (so its logits are the ones plain decoding would have computed);
        stop at the first disagreement, a stop token or the last allowed token. Returns how
        many rows were used; `fresh` holds the picks."""
        self.fresh = []
        for used, row in enumerate(logits, 1):
            self.position += 1
            self.fresh.append(self.pick(row))
            if self.finished or used > len(drafts) or self.token != drafts[used - 1]:
                break
        self.steps += 1
        self.drafted += len(drafts)
        self.accepted += used - 1
        return used
