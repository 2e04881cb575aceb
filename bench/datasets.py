"""Question-answer items for the runner: the bundled demo KB, and the generated task families.

An item is documents + questions (`kvedge.bench.tasks.Question`: text, reference answers, the
task's own instruction and metric). Demo KB: for the reuse suite an item is one question over
`length` documents (the one holding the answer and seeded distractors, in seeded order); for
the eviction suite an item is one context of `length` documents holding the answers to three
questions (compressed once, asked all three). Generated tasks: `length` is the context's size
in the model's tokens; the reuse suite keeps multi-document items' documents apart (the runner
cuts long ones into the cloud's ingest segments), the eviction suite asks every question of
the one joined context. Fact documents (`multidoc-facts`, the reuse preset's prompts): `length`
documents about structures holding the same kinds of fact, each question answered by one of
them; `n_items` counts questions, asked `per_prompt` to a prompt (default
QUESTIONS_PER_PROMPT; at most FACT_KINDS per document, spread over the documents). Real
data (`hotpot-fixed`: HotpotQA questions over their paragraphs; `squad-evict`: SQuAD
articles, `length` tokens of each) comes from `kvedge.bench.real`, which builds its items
with QAItem (`kvedge.bench.suites.cell_items`).
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from kvedge.bench.real import HOTPOT_FIXED
from kvedge.bench.tasks import Question
from kvedge.bench.tasks.multidoc import FACT_KINDS, FACTS, fact_documents

PER_CONTEXT = 3  # questions per KBQA context
QUESTIONS_PER_PROMPT = 2  # fact-document prompts: more questions per prompt, fewer prompts
#                           (and packs), but more correlated questions
DATASETS = ("demo-kb", FACTS, HOTPOT_FIXED)  # item sources whose `length` counts documents
#                                            (hotpot-fixed: paragraphs), not tokens


@dataclass(frozen=True)
class QAItem:
    key: str
    documents: list[str]
    questions: list[Question]
    answer_at: tuple[int, ...] = ()  # per question: the index of the document holding its
    #                                  answer (where one document does)


def _demo_kb() -> tuple[dict[str, str], list[dict]]:
    from kvedge.apps import demo

    folder = Path(demo.DEMO_KB)
    docs = {p.name: p.read_text() for p in sorted(folder.glob("*.md"))}
    # one question per document (the demo itself asks 12 of them)
    return docs, json.loads((folder / "bench_questions.json").read_text())


def _demo_question(q: dict) -> Question:
    """A demo-KB question asked as the service asks it (its instruction), any alias scoring."""
    from kvedge.edge.engine import INSTRUCTION

    return Question(q["question"], q["answers"], "demo-kb", INSTRUCTION, metric="any")


def demo_kb_items(suite: str, length: int, n_items: int, seed: int) -> list[QAItem]:
    docs, questions = _demo_kb()
    rng = random.Random(seed)
    names = sorted(docs)
    if suite == "reuse":
        items = []
        for i, q in enumerate(questions[:n_items]):
            others = rng.sample([n for n in names if n != q["doc"]], max(length - 1, 0))
            order = others + [q["doc"]]
            rng.shuffle(order)
            items.append(QAItem(f"demo-kb/{seed}/{i}/{length}", [docs[n] for n in order],
                                [_demo_question(q)], (order.index(q["doc"]),)))
        return items
    # KBQA: each context holds the documents of PER_CONTEXT questions plus distractors, up to
    # `length` documents, and is asked all its questions (n_items contexts)
    items = []
    for i in range(n_items):
        asked = questions[i * PER_CONTEXT:(i + 1) * PER_CONTEXT]
        if not asked:
            break
        gold = [q["doc"] for q in asked][:max(length, 1)]
        asked = [q for q in asked if q["doc"] in gold]
        others = rng.sample([n for n in names if n not in gold], max(length - len(gold), 0))
        chosen = gold + others
        rng.shuffle(chosen)
        items.append(QAItem(f"demo-kb/{seed}/kbqa/{length}/{i}", [docs[n] for n in chosen],
                            [_demo_question(q) for q in asked]))
    return items


def generated_items(task: str, suite: str, length: int, n_items: int, seed: int,
                    tokenizer=None) -> list[QAItem]:
    """Items of a generated task family (kvedge.bench.tasks), `length` tokens each, counted
    with the model's tokenizer. Reuse keeps the item's documents apart (multi-doc QA);
    eviction asks every question of one context."""
    from kvedge.bench.tasks import generate

    count = (lambda s: len(tokenizer(s)["input_ids"])) if tokenizer is not None else None
    items = []
    for i in range(n_items):
        kw = {"count_tokens": count} if count else {}
        item = generate(task, length, seed + i, **kw)
        docs = [d.text for d in item.documents] if suite == "reuse" else [item.context]
        items.append(QAItem(item.key, docs, list(item.questions)))
    return items


def fact_items(length: int, n_questions: int, seed: int, tokenizer=None,
               doc_tokens: int | None = None,
               per_prompt: int = QUESTIONS_PER_PROMPT) -> list[QAItem]:
    """`n_questions` questions over prompts of `length` fact documents (kvedge.bench.tasks.
    multidoc.fact_documents) of about `doc_tokens` tokens each (default the generator's
    500), `per_prompt` to a prompt, the last maybe fewer. Prompt i is seed + i whatever
    `per_prompt` is, and its first questions do not depend on it either: more per prompt
    asks more of the same prompts' facts."""
    if not 1 <= per_prompt <= len(FACT_KINDS) * length:
        raise ValueError(f"{length} fact documents hold {len(FACT_KINDS) * length} distinct "
                         f"questions; ask 1 to that many per prompt, not {per_prompt}")
    count = (lambda s: len(tokenizer(s)["input_ids"])) if tokenizer is not None else None
    items = []
    for i, first in enumerate(range(0, n_questions, per_prompt)):
        k = min(per_prompt, n_questions - first)
        item = fact_documents(length, seed + i, questions=k,
                              **({"count_tokens": count} if count else {}),
                              **({"doc_tokens": doc_tokens} if doc_tokens else {}))
        order = [d.doc_id for d in item.documents]
        items.append(QAItem(f"{item.key}/{k}", [d.text for d in item.documents],
                            list(item.questions),
                            tuple(order.index(q.needed_docs[0]) for q in item.questions)))
    return items


def load_items(task: str, suite: str, length: int, n_items: int, seed: int,
               tokenizer=None, doc_tokens: int | None = None,
               per_prompt: int | None = None) -> list[QAItem]:
    """The cell's items; `doc_tokens` and `per_prompt` (None: QUESTIONS_PER_PROMPT) shape
    fact prompts only."""
    if task == "demo-kb":
        return demo_kb_items(suite, length, n_items, seed)
    if task == FACTS:  # eviction: the prompt's documents are one context, asked every question
        return fact_items(length, n_items, seed, tokenizer, doc_tokens,
                          per_prompt or QUESTIONS_PER_PROMPT)
    return generated_items(task, suite, length, n_items, seed, tokenizer)
