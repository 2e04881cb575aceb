"""Draft tokens copied from the prompt: speculative decoding without a draft model.

Speculative decoding (Leviathan, Kalman & Matias, "Fast Inference from Transformers via
Speculative Decoding", ICML 2023, Sec. 2) runs k guessed tokens through the model in one
forward and keeps the longest prefix the model agrees with, plus the model's own next token:
one forward yields 1 to k + 1 tokens. Under greedy decoding "agrees" is "the argmax is the
guess", so the answer is the one plain decoding gives, token for token (Sec. 2.3 with
temperature 0). The guesses here come from prompt lookup (Saxena, "Prompt Lookup Decoding",
2023; transformers' `PromptLookupCandidateGenerator`): find the last few tokens earlier in the
prompt or answer and propose what followed them there. Answers over a knowledge base copy
its text — names, titles, dates — so the guesses are often right, and they cost nothing.

Decisions the sources leave open, and why:
- **n-gram sizes 3, then 2, then 1** (`MAX_NGRAM`): the longest match first (transformers
  tries its `max_matching_ngram_size` down to 1 as well); a 1-gram proposes after any common
  token, but a wrong guess only costs a row the step pays for anyway (see
  `kvedge.common.model.batch.SPEC_ROWS`).
- **the first occurrence** of the n-gram, as transformers takes: the prompt's order, not the
  answer's last words, decides; kept O(1) per step by an index of each n-gram's first
  follower, built once over the prompt and extended by each picked token.
"""
from __future__ import annotations

from typing import Sequence

MAX_NGRAM = 3


class PromptLookup:
    """The tokens seen so far — the prompt, then every picked token — and where each n-gram
    (n ≤ `max_ngram`) first appeared: `draft(k)` proposes the k tokens that followed the
    first earlier occurrence of the longest matching suffix."""

    def __init__(self, source: Sequence[int], max_ngram: int = MAX_NGRAM):
        if max_ngram < 1:
            raise ValueError(f"max_ngram must be ≥ 1, not {max_ngram}")
        self.max_ngram = max_ngram
        self.tokens: list[int] = []
        self._follower: dict[tuple[int, ...], int] = {}  # n-gram → index just after its first
        for token in source:
            self.push(token)

    def push(self, token: int) -> None:
        """One more token (a picked one): every n-gram ending just before it now has a
        follower."""
        tokens, end = self.tokens, len(self.tokens)
        for n in range(1, min(self.max_ngram, end) + 1):
            self._follower.setdefault(tuple(tokens[end - n:end]), end)
        tokens.append(token)

    def draft(self, k: int) -> list[int]:
        """Up to k tokens guessed to come next (none when no suffix was seen before)."""
        if k <= 0:
            return []
        for n in range(min(self.max_ngram, len(self.tokens)), 0, -1):
            start = self._follower.get(tuple(self.tokens[-n:]))
            if start is not None:
                return self.tokens[start:start + k]
        return []
