"""Scoring answers: normalized, case-insensitive substring match (RULER's metrics).

- `string_match_all` (RULER's string_match_all): the fraction of references found in the
  prediction; for questions whose every reference must be returned (several needles,
  variables, words).
- `string_match_part` (RULER's string_match_part): 1 if any reference is found; for
  references that are aliases of one answer.

Both normalize prediction and references alike: Unicode NFKC, case folding, whitespace
stripped and collapsed to single spaces.

Substring semantics, honestly: a reference counts as found wherever it occurs, with no word
or number boundaries. So "1234567" is found in "91234567" and in "12345678"; "cat" in
"concatenate"; and a prediction that lists every number in the context scores 1. The task
generators keep answers apart from the rest of the context (fixed-length values, no digits
in the filler) so the first two cannot credit a wrong answer drawn from the same item; the
last is why answers are also compared with the ceiling method on the same items.
"""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Sequence

from kvedge.bench.tasks.item import Question


class NoReferences(ValueError):
    """Scoring needs at least one non-empty reference answer."""


def normalize(text: str) -> str:
    """NFKC, casefold, strip, collapse runs of whitespace into one space."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _found(prediction: str, references: Sequence[str]) -> list[bool]:
    refs = [normalize(r) for r in references]
    if not refs or not all(refs):
        raise NoReferences(f"references must be non-empty strings, got {list(references)!r}: "
                           f"an empty reference would match every prediction")
    pred = normalize(prediction)
    return [r in pred for r in refs]


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """Fraction of references found in the prediction (0.0 for an empty prediction)."""
    found = _found(prediction, references)
    return sum(found) / len(found)


def string_match_part(prediction: str, references: Sequence[str]) -> float:
    """1.0 if any reference is found in the prediction, else 0.0."""
    return float(any(_found(prediction, references)))


@dataclass(frozen=True)
class Score:
    all: float    # string_match_all
    any: float    # string_match_part
    score: float  # the question's own metric, one of the two


def score_question(prediction: str, question: Question) -> Score:
    found = _found(prediction, question.answers)
    hit_all, hit_any = sum(found) / len(found), float(any(found))
    return Score(hit_all, hit_any, hit_all if question.metric == "all" else hit_any)


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value for paired right/wrong outcomes: `only_a` questions
    only method A answered, `only_b` only method B. Under H0 the discordant pairs split
    Binomial(n, 1/2); p = min(1, 2·P[X ≤ min(only_a, only_b)]). No discordant pair: p = 1."""
    from math import comb

    n, k = only_a + only_b, min(only_a, only_b)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2 ** n)
