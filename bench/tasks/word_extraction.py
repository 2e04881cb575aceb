"""Aggregation tasks: RULER's common-words (CWE) and frequent-words (FWE) extraction
(Hsieh et al., 2024, "RULER", Sec. 3.3).

CWE: a numbered list in which `num_common` words appear `freq_common` times each and every
other word `freq_uncommon` times; name the common words. FWE: "coded text" whose words follow
a Zipf distribution; name the three most frequent. Words are made-up six-letter words
("balomi"): the list grows with the length without running out of vocabulary, and no word is
a substring of another, so substring scoring credits only the word itself.
"""
from __future__ import annotations

import random
from collections import Counter
from itertools import accumulate
from typing import Iterator

from .item import Item, Question, single_context
from .length import TokenCounter, estimate_tokens, fill, fit_length
from .values import Uniques, make_rng

CWE_INTRO = ("Below is a numbered list of words. In these words, some appear more often than "
             "others. Memorize the ones that appear most often.")
FWE_INTRO = "Read the following coded text and track the frequency of each coded word."
WORDS_ONLY = "Answer with the words only, separated by commas."


def numbered(words: list[str]) -> str:
    return "\n".join(f"{i}. {w}" for i, w in enumerate(words, 1))


def common_words(length: int = 2048, seed: int = 0, *, num_common: int = 10,
                 freq_common: int | None = None, freq_uncommon: int = 3,
                 count_tokens: TokenCounter = estimate_tokens) -> Item:
    """CWE. `freq_common=None` picks RULER's 30, lowered for short contexts so the common
    words take at most about half of the list (never below `freq_uncommon + 3`)."""
    if num_common < 1 or freq_uncommon < 1:
        raise ValueError("need num_common >= 1 and freq_uncommon >= 1")
    params = dict(num_common=num_common, freq_common=freq_common, freq_uncommon=freq_uncommon)

    def build(budget: float) -> Item:
        u = Uniques(make_rng("cwe", seed, "words"))
        rest = budget - count_tokens(CWE_INTRO)
        per_entry = count_tokens("100. balomi\n")
        freq = freq_common or max(freq_uncommon + 3,
                                  min(30, int(rest / 2 / (num_common * per_entry))))
        if freq <= freq_uncommon:
            raise ValueError(f"freq_common ({freq}) must exceed freq_uncommon ({freq_uncommon})")
        common = [u.word() for _ in range(num_common)]
        rest -= freq * num_common * per_entry

        def uncommon() -> Iterator[str]:
            while True:
                yield u.word()
        # one uncommon word stands for `freq_uncommon` entries of the list
        rare, _ = fill(uncommon(), rest, lambda w: freq_uncommon * count_tokens(f"100. {w}\n"))
        words = common * freq + rare * freq_uncommon
        make_rng("cwe", seed, "order").shuffle(words)
        question = Question(f"What are the {num_common} most common words in the list above?",
                            common, "cwe", WORDS_ONLY)
        return single_context("cwe", seed, length, CWE_INTRO + "\n\n" + numbered(words),
                              [question], params=params, freq_common=freq,
                              uncommon_words=len(rare))

    return fit_length(build, length, count_tokens)


def _zipf_words(rng: random.Random, vocab: list[str], alpha: float) -> Iterator[str]:
    weights = list(accumulate(1.0 / (rank ** alpha) for rank in range(1, len(vocab) + 1)))
    while True:
        yield from rng.choices(vocab, cum_weights=weights, k=512)


def frequent_words(length: int = 2048, seed: int = 0, *, alpha: float = 2.0, top: int = 3,
                   count_tokens: TokenCounter = estimate_tokens) -> Item:
    """FWE: coded words drawn from a Zipf(`alpha`) law over a vocabulary that grows with the
    length; the answer is the `top` most frequent, counted in the text actually generated
    (redrawn, with a new stream, until the `top`-th is strictly more frequent than the next)."""
    if top < 1 or alpha <= 0:
        raise ValueError("need top >= 1 and alpha > 0")
    params = dict(alpha=alpha, top=top)

    def build(budget: float) -> Item:
        rest = budget - count_tokens(FWE_INTRO)
        u = Uniques(make_rng("fwe", seed, "vocab"))
        vocab = [u.word() for _ in range(max(top + 10, int(rest) // 40))]
        for attempt in range(20):
            words, _ = fill(_zipf_words(make_rng("fwe", seed, f"text{attempt}"), vocab, alpha),
                            rest, lambda w: count_tokens(w + " "))
            ranked = Counter(words).most_common(top + 1)
            if len(ranked) > top and ranked[top - 1][1] > ranked[top][1]:
                break
        else:
            raise ValueError(f"fwe at {length} tokens gives no clear top {top}: ask for more "
                             f"tokens")
        answers = [w for w, _ in ranked[:top]]
        question = Question(f"Which {top} coded words appear most often in the coded text "
                            f"above?", answers, "fwe", WORDS_ONLY)
        return single_context("fwe", seed, length, FWE_INTRO + "\n\n" + " ".join(words),
                              [question], params=params, vocabulary=len(vocab),
                              counts=[c for _, c in ranked[:top + 1]])

    return fit_length(build, length, count_tokens)
