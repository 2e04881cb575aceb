"""Needle in a haystack: RULER's NIAH family (Hsieh et al., 2024, "RULER", Sec. 3.1).

One generator covers RULER's eight variants through its parameters:
- single needle: `queries=1, values_per_key=1`;
- multi-key: `distractors>0` (needles with other keys in the haystack), or `haystack="needles"`
  (the haystack is made of distractor needles only);
- multi-value: `values_per_key>1` (one key, several needles; all values must be returned);
- multi-query: `queries>1` (several keys asked in one question; all values must be returned).
Values are 7-digit numbers or short random strings (RULER uses UUIDs: shorter suits small models).
"""
from __future__ import annotations

from typing import Iterator

from . import haystack as hay
from .item import Item, Question, single_context
from .length import TokenCounter, estimate_tokens, fill, fit_length
from .values import Uniques, make_rng

HAYSTACKS = ("noise", "prose", "essays", "needles")
VALUE_KINDS = ("number", "string")
FAMILY = "niah"


def needle(key: str, value: str, value_kind: str) -> str:
    return f"One of the special magic {value_kind}s for {key} is: {value}."


def _draw_value(u: Uniques, value_kind: str) -> str:
    return u.number(7) if value_kind == "number" else u.string(8)


def _distractor_needles(u: Uniques, value_kind: str) -> Iterator[str]:
    while True:
        yield needle(u.key(), _draw_value(u, value_kind), value_kind) + " "


def _question(keys: list[str], values_per_key: int, value_kind: str,
              answers: list[str], kind: str) -> Question:
    if len(keys) == 1 and values_per_key == 1:
        return Question(f"What is the special magic {value_kind} for {keys[0]}?", answers, kind,
                        f"Answer with the {value_kind} only.")
    asked = keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + f" and {keys[-1]}"
    return Question(f"What are all the special magic {value_kind}s for {asked}?", answers, kind,
                    f"Answer with the {value_kind}s only, separated by commas.")


def _kind(queries: int, values_per_key: int, multikey: bool) -> str:
    if queries > 1:
        return "niah_multiquery"
    if values_per_key > 1:
        return "niah_multivalue"
    return "niah_multikey" if multikey else "niah_single"


def niah(length: int = 2048, seed: int = 0, *, haystack: str = "prose",
         value_kind: str = "number", queries: int = 1, values_per_key: int = 1,
         distractors: int = 0, depth: float | None = None,
         count_tokens: TokenCounter = estimate_tokens) -> Item:
    """A context of about `length` tokens with needles "One of the special magic numbers for
    KEY is: VALUE." and one question asking for the values of `queries` keys.

    `depth` (a fraction of the haystack's tokens) places the first asked needle; the other
    needles go at seeded random depths. Achieved depths are in `metadata["needles"]`.
    """
    if haystack not in HAYSTACKS:
        raise ValueError(f"unknown haystack {haystack!r}; choose one of {HAYSTACKS}")
    if value_kind not in VALUE_KINDS:
        raise ValueError(f"unknown value_kind {value_kind!r}; choose one of {VALUE_KINDS}")
    if queries < 1 or values_per_key < 1 or distractors < 0:
        raise ValueError("need queries >= 1, values_per_key >= 1 and distractors >= 0")
    params = dict(haystack=haystack, value_kind=value_kind, queries=queries,
                  values_per_key=values_per_key, distractors=distractors, depth=depth)

    def build(budget: float) -> Item:
        u = Uniques(make_rng(FAMILY, seed, "needles"))
        asked = [(key, _draw_value(u, value_kind))
                 for key in [u.key() for _ in range(queries)] for _ in range(values_per_key)]
        others = [(u.key(), _draw_value(u, value_kind)) for _ in range(distractors)]
        needles = [needle(k, v, value_kind) + " " for k, v in asked + others]
        rest = budget - sum(count_tokens(n) for n in needles)
        if haystack == "needles":
            pieces, counts = fill(_distractor_needles(u, value_kind), rest, count_tokens)
        else:
            pieces, counts = hay.haystack(haystack, make_rng(FAMILY, seed, "haystack"), rest,
                                          count_tokens)
        depths = hay.seeded_depths(make_rng(FAMILY, seed, "depths"), len(needles), depth)
        merged, achieved = hay.insert_at_depths(pieces, counts, list(zip(depths, needles)))
        keys = list(dict.fromkeys(k for k, _ in asked))
        question = _question(keys, values_per_key, value_kind, [v for _, v in asked],
                             _kind(queries, values_per_key, bool(others) or haystack == "needles"))
        placed = [{"key": k, "value": v, "depth": round(d, 4), "asked": i < len(asked)}
                  for i, ((k, v), d) in enumerate(zip(asked + others, achieved))]
        return single_context(FAMILY, seed, length, hay.join(merged), [question],
                              params=params, needles=placed)

    return fit_length(build, length, count_tokens)
