"""Short-answer QA metrics: HotpotQA's official answer normalization, EM, F1, containment.

`normalize_answer`, `exact_match` and `f1` follow HotpotQA's evaluation script
(hotpot_evaluate_v1.py, itself SQuAD v1.1's): lowercase, drop punctuation, drop the articles
a/an/the, collapse whitespace; F1 over the normalized answers' tokens (a multiset), and 0 when
either side is "yes", "no" or "noanswer" and the two differ. `containment` is the lenient
metric the issue's first look used: the normalized gold answer appears in the normalized
prediction as whole tokens, so a model that answers in a sentence still counts, and "no" is
not found in "not". Where a question has several references (SQuAD's annotators), each metric
is the best over them, as the official scripts take it.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Sequence

from kvedge.bench.scoring import NoReferences

QA_METRICS = ("em", "f1", "contain")
PAIRED = ("score", *QA_METRICS)  # per-question metrics given paired bootstrap intervals
#                                  against the ceiling (kvedge.bench.bootstrap)
_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_UNSPLIT = ("yes", "no", "noanswer")  # the official F1 scores these all or nothing


def normalize_answer(text: str) -> str:
    """Lowercase, remove punctuation, the articles a/an/the, and extra whitespace (in the
    official script's order: lower → punctuation → articles → whitespace)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """Token F1 of the normalized answers (HotpotQA's f1_score)."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if (pred in _UNSPLIT or ref in _UNSPLIT) and pred != ref:
        return 0.0
    common = Counter(pred.split()) & Counter(ref.split())
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred.split()), same / len(ref.split())
    return 2 * precision * recall / (precision + recall)


def containment(prediction: str, gold: str) -> float:
    """1.0 if the normalized gold answer occurs in the normalized prediction on token
    boundaries."""
    ref = normalize_answer(gold)
    return float(bool(ref) and f" {ref} " in f" {normalize_answer(prediction)} ")


def qa_scores(prediction: str, references: Sequence[str]) -> dict[str, float | None]:
    """{"em", "f1", "contain"}: each the best over the references. References that normalize
    to nothing (a generated task's "A", punctuation) cannot be scored this way: None where no
    reference is left."""
    refs = [r for r in references if normalize_answer(r)]
    if not references:
        raise NoReferences("a question needs at least one reference answer")
    if not refs:
        return dict.fromkeys(QA_METRICS)
    return {"em": max(exact_match(prediction, r) for r in refs),
            "f1": max(f1(prediction, r) for r in refs),
            "contain": max(containment(prediction, r) for r in refs)}
