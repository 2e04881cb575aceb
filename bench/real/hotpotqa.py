"""HotpotQA dev, distractor setting (Yang et al., "HotpotQA: A Dataset for Diverse, Explainable
Multi-hop Question Answering", EMNLP 2018), from the data wheel's `hotpotqa.json`.

A record is {"_id", "question", "answer", "type" (bridge | comparison), "level",
"supporting_facts": [[title, sentence index], ...], "context": [[title, [sentence, ...]],
...]}: ten paragraphs (a few records have fewer), two of them gold. A paragraph becomes one
document, its title on the first line and its sentences joined after it.

`hotpot-fixed` is the CacheBlend / EPIC setting: each question's paragraphs, each prefilled on
its own, composed in the record's order and asked once. At a `length` above the record's
paragraph count (20, 30; or the few records with fewer than ten) paragraphs of other questions
of the same split are added, seeded per question: they are inserted at seeded places, the
question's own paragraphs keeping their order.

`hotpot-kb` is the product's setting: the paragraphs of a run's questions are one knowledge
base (`hotpot_kb_corpus`), each paragraph a file, and every question is asked of all of it
through the gateway and the edge, its prompt the edge's BM25 top-k (`kvedge.bench.hotpot_kb`).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from kvedge.bench.answer_metrics import normalize_answer
from kvedge.bench.datasets import QAItem
from kvedge.bench.real import heldout as split_
from kvedge.bench.real.wheel import read_json
from kvedge.bench.tasks import Question
from kvedge.common.errors import InvalidRequest

FILE = "hotpotqa.json"
PARAGRAPHS = 10  # the distractor setting's paragraphs per question
# LongBench's HotpotQA instruction: the answer only, which EM and F1 need
INSTRUCTION = ("Answer the question based on the given passages. Only give me the answer and "
               "do not output any other words.")


@dataclass(frozen=True)
class HotpotQuestion:
    index: int                 # position in the file: the held-out split is by it
    id: str
    question: str
    answer: str
    paragraphs: tuple[tuple[str, str], ...]  # (title, text), in the record's order
    gold: tuple[str, ...]      # titles of the supporting paragraphs
    type: str


def document(title: str, text: str) -> str:
    """One paragraph as a document (a blank line after it: documents are concatenated)."""
    return f"{title}\n{text}\n\n"


def _question(index: int, record: dict) -> HotpotQuestion:
    paragraphs = tuple((title, "".join(sentences).strip()) for title, sentences in
                       record["context"])
    gold = tuple(dict.fromkeys(title for title, _ in record["supporting_facts"]))
    return HotpotQuestion(index, record["_id"], record["question"], record["answer"],
                          paragraphs, gold, record["type"])


def _records() -> list[dict]:
    return read_json(FILE)  # parsed once per process and wheel


def hotpot_size() -> int:
    return len(_records())


def hotpot_question(index: int, heldout: bool = False) -> HotpotQuestion:
    """Question `index` of the file; HeldOutData if it is outside the split asked for."""
    split_.check("hotpotqa", index, hotpot_size(), heldout)
    return _question(index, _records()[index])


def hotpot_questions(heldout: bool = False) -> list[HotpotQuestion]:
    """Every question of the tuning split (index < 6,000), or with `heldout` of the
    held-out one."""
    return [hotpot_question(i, heldout) for i in split_.split("hotpotqa", hotpot_size(), heldout)]


def question_order(seed: int, heldout: bool = False) -> list[int]:
    """The split's indices in a seeded order: n questions are its first n, so a run of 300
    holds a run of 100's questions. Answers the official normalization empties ("The The",
    "!!!": 2 of the first 6,000) are left out: no metric can score them."""
    indices = [i for i in split_.split("hotpotqa", hotpot_size(), heldout)
               if normalize_answer(_records()[i]["answer"])]
    return random.Random(seed).sample(indices, len(indices))


def with_distractors(q: HotpotQuestion, length: int, seed: int,
                     heldout: bool = False) -> list[tuple[str, str]]:
    """The question's paragraphs with paragraphs of other questions of its split added up to
    `length`, at seeded places (its own keep their order); no title twice."""
    if length < len(q.paragraphs):
        raise InvalidRequest(f"hotpot-fixed needs at least the question's own {len(q.paragraphs)} "
                             f"paragraphs; asked for {length}")
    rng = random.Random(f"hotpot-fixed/{seed}/{q.index}/{length}")
    titles, extra = {t for t, _ in q.paragraphs}, []
    others = [i for i in split_.split("hotpotqa", hotpot_size(), heldout) if i != q.index]
    while len(extra) < length - len(q.paragraphs):
        title, text = rng.choice(hotpot_question(rng.choice(others), heldout).paragraphs)
        if title not in titles:
            titles.add(title)
            extra.append((title, text))
    own = set(rng.sample(range(length), len(q.paragraphs)))
    mine, theirs = iter(q.paragraphs), iter(extra)
    return [next(mine) if i in own else next(theirs) for i in range(length)]


def first_questions(n_items: int, seed: int, heldout: bool = False) -> list[HotpotQuestion]:
    """The first `n_items` questions of the split in `question_order(seed)`."""
    order = question_order(seed, heldout)
    if n_items > len(order):
        raise InvalidRequest(f"asked for {n_items} HotpotQA questions; the "
                             f"{'held-out' if heldout else 'tuning'} split holds {len(order)}")
    return [hotpot_question(index, heldout) for index in order[:n_items]]


def as_question(q: HotpotQuestion) -> Question:
    """The bench's question: the gold answer, LongBench's instruction, the gold titles."""
    return Question(q.question, [q.answer], "hotpotqa", INSTRUCTION, metric="any",
                    needed_docs=list(q.gold))


def hotpot_fixed_items(length: int, n_items: int, seed: int,
                       heldout: bool = False) -> list[QAItem]:
    """`n_items` QAItems: one question each over `length` paragraphs as documents."""
    items = []
    for q in first_questions(n_items, seed, heldout):
        paragraphs = with_distractors(q, length, seed, heldout)
        items.append(QAItem(f"hotpotqa/{q.index}/{length}/{seed}",
                            [document(t, text) for t, text in paragraphs], [as_question(q)]))
    return items


def hotpot_kb_corpus(n_items: int, seed: int, heldout: bool = False
                     ) -> tuple[list[HotpotQuestion], list[tuple[str, str]]]:
    """(the first `n_items` questions, the union of their paragraphs as (title, text) in
    first-seen order). A paragraph two questions share (same title and text) is in the KB
    once, as a KB holds one copy of a Wikipedia paragraph however many questions cite it."""
    questions = first_questions(n_items, seed, heldout)
    paragraphs = dict.fromkeys(p for q in questions for p in q.paragraphs)
    return questions, list(paragraphs)
