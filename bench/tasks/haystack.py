"""Haystacks and placing things in them at token depths (RULER's NIAH haystacks).

A haystack is a list of pieces, each a sentence carrying its trailing separator, with the
token count of each. Kinds, as in RULER: `noise` (the same few sentences repeated), `essays`
(Paul Graham's essays, RULER's own haystack, from the data wheel: `kvedge.bench.real`),
`prose` (generated sentences standing in for the essays where the wheel is not wanted) and
`needles` (distractor needles with other keys, built in `niah`). `insert_at_depths` places pieces at fractions of the haystack's tokens
in one linear pass.
"""
from __future__ import annotations

import random
import re
from bisect import bisect_right
from functools import lru_cache
from itertools import accumulate, cycle
from typing import Iterator, Sequence

from . import prose
from .length import TokenCounter, fill

KINDS = ("noise", "prose", "essays")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def noise() -> Iterator[str]:
    """RULER's noise haystack, one sentence a piece."""
    return (s + " " for s in cycle(prose.NOISE))


def essays(rng: random.Random) -> Iterator[str]:
    """Paul Graham's essays one sentence a piece, from a seeded sentence on and round again.

    RULER reads the essays from their start for every sample; a seeded start gives each
    item its own stretch of text, so items of one length do not share a haystack."""
    text = essay_sentences()
    start = rng.randrange(len(text))
    return (s + " " for s in cycle(text[start:] + text[:start]))


@lru_cache(maxsize=1)
def essay_sentences() -> tuple[str, ...]:
    """The essays split into sentences, once a process (a split took ~30 ms, once an item)."""
    from kvedge.bench.real.haystack import paul_graham_essays

    return tuple(s for s in SENTENCE_END.split(paul_graham_essays()) if s.strip())


def source(kind: str, rng: random.Random) -> Iterator[str]:
    if kind == "noise":
        return noise()
    if kind == "prose":
        return prose.sentences(rng)
    if kind == "essays":
        return essays(rng)
    raise ValueError(f"unknown haystack {kind!r}; choose one of {KINDS}")


def vocabulary(kind: str) -> str:
    """The words a haystack of this kind can contain (for collision checks)."""
    return " ".join(prose.NOISE).lower() if kind == "noise" else prose.vocabulary()


def haystack(kind: str, rng: random.Random, budget: float, count_tokens: TokenCounter
             ) -> tuple[list[str], list[int]]:
    return fill(source(kind, rng), budget, count_tokens)


def insert_at_depths(pieces: Sequence[str], counts: Sequence[int],
                     placements: Sequence[tuple[float, str]]) -> tuple[list[str], list[float]]:
    """Insert each (depth, piece) at a sentence boundary `depth` of the way through the
    haystack's tokens (0: before everything, 1: after everything).

    Placements at the same boundary keep their given order (a variable chain stays in
    order). Returns the merged pieces and each placement's achieved depth, in input order.
    """
    cumulative = list(accumulate(counts))
    total = cumulative[-1] if cumulative else 0
    at = [bisect_right(cumulative, d * total) if total else 0 for d, _ in placements]
    order = sorted(range(len(placements)), key=lambda k: (at[k], k))
    merged: list[str] = []
    start = 0
    for k in order:
        merged.extend(pieces[start:at[k]])
        merged.append(placements[k][1])
        start = at[k]
    merged.extend(pieces[start:])
    achieved = [(cumulative[at[k] - 1] if at[k] else 0) / total if total else 0.0
                for k in range(len(placements))]
    return merged, achieved


def seeded_depths(rng: random.Random, n: int, first: float | None) -> list[float]:
    """`n` depths: the first is `first` when given, the rest (or all) uniform in [0, 1]."""
    depths = [rng.random() for _ in range(n)]
    if first is not None and n:
        if not 0.0 <= first <= 1.0:
            raise ValueError(f"depth must be a fraction in [0, 1], not {first}")
        depths[0] = first
    return depths


def join(pieces: Sequence[str]) -> str:
    return "".join(pieces).strip()
