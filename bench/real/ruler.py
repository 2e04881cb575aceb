"""`ruler-niah`: RULER's single needle in its own haystack (Hsieh et al., "RULER: What's the
Real Context Size of Your Long-Context Language Models?", COLM 2024, §3.1, niah_single_2:
a 7-digit number needle "One of the special magic numbers for KEY is: VALUE." in Paul
Graham's essays), at the lengths the issue asks (4K, 8K, 16K tokens of the model's own
tokenizer).

The generator is the bench's own (`kvedge.bench.tasks.niah`, haystack `essays`); each item
is one seeded needle depth and one seeded stretch of the essays. RULER scores it by
string_match_part: the needle's value inside the answer (containment). The essays are not
questions, so nothing here is held out.
"""
from __future__ import annotations

from kvedge.bench.datasets import QAItem

LENGTHS = (4096, 8192, 16384)


def ruler_niah_items(suite: str, length: int, n_items: int, seed: int = 0,
                     tokenizer=None) -> list[QAItem]:
    """`n_items` needles in `length` tokens of essays (counted with `tokenizer` where given).
    Eviction asks the one joined context; reuse keeps the item's documents apart."""
    from kvedge.bench.tasks.niah import niah

    kw = {"count_tokens": lambda s: len(tokenizer(s)["input_ids"])} if tokenizer else {}
    items = []
    for i in range(n_items):
        item = niah(length, seed + i, haystack="essays", **kw)
        docs = [d.text for d in item.documents] if suite == "reuse" else [item.context]
        items.append(QAItem(f"ruler-niah/{seed + i}/{length}", docs, list(item.questions)))
    return items
