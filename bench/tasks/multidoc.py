"""Multi-document QA for the RAG path: facts spread over separate documents, questions that
need one or two of them (RULER's QA tasks and HotpotQA-style two-hop questions, with
generated documents instead of SQuAD/HotpotQA paragraphs, which cannot be downloaded here).

A small invented world: structures (a bridge, a tower, ...) designed by people, standing in
towns, completed in years; people born in towns. Each document is a few hundred tokens of
prose about one entity holding one or two facts. Questions: year / town / designer of a
structure, birthplace of a person (one document each), and "in which town was the designer
of X born?" (two documents). Every answer is a made-up name or a year written once in the
whole item, so the documents a question needs hold its answer and no other document does.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from . import haystack as hay
from . import prose
from .item import Document, Item, Question
from .length import TokenCounter, estimate_tokens, fill, fit_length
from .values import Uniques, make_rng

FAMILY = "multidoc_qa"
STRUCTURES = ("Bridge", "Tower", "Library", "Observatory", "Lighthouse", "Mill", "Theatre",
              "Aqueduct", "Abbey", "Market Hall")
SYLLABLES = ("vel", "kar", "nos", "tam", "ris", "dor", "quen", "bal", "zar", "mir", "tho",
             "lun", "fen", "gar", "vos", "rin", "sel", "dra", "kol", "mer", "ast", "bel",
             "cor", "dun", "fal", "hest", "jor", "kel", "lom", "nar", "ost", "pel", "ruk",
             "sar", "tor", "ul", "vard", "wyn", "yr", "zen")
KINDS = ("two_hop", "year", "designer", "birthplace", "town")
TOWN = "Answer with the town name only."
MIN_DOCS = 6
FACTS = "multidoc-facts"  # reuse benchmark prompts: `length` documents of one kind
FACT_KINDS = ("year", "town", "designer")  # what every such document states


@dataclass
class Entity:
    """One document's subject and the facts (sentence, answer) its document states."""
    name: str
    title: str
    facts: dict[str, tuple[str, str]] = field(default_factory=dict)
    designer: Entity | None = None
    doc_id: str = ""


class World:
    """The invented entities of one item; every name part is unique and no part is a
    substring of another part or of any prose word."""

    def __init__(self, rng: random.Random):
        self.u = Uniques(rng)
        self.rng = rng
        self.parts: list[str] = []
        self.vocab = prose.vocabulary()

    def part(self, syllables: int) -> str:
        def ok(v: str) -> bool:
            low = v.lower()
            return low not in self.vocab and not any(low in p or p in low for p in self.parts)
        name = self.u.draw(lambda: "".join(self.rng.choice(SYLLABLES)
                                           for _ in range(syllables)).capitalize(), ok)
        self.parts.append(name.lower())
        return name

    def person(self, with_doc: bool) -> Entity:
        name = f"{self.part(2)} {self.part(3)}"
        p = Entity(name, name)
        if with_doc:
            p.facts["birthplace"] = (f"{name} was born in the town of {{}}.", self.part(3))
            if self.rng.random() < 0.5:
                p.facts["settled"] = (f"Later in life, {name} settled in the town of {{}}.",
                                      self.part(3))
        return p

    def structure(self, designer: Entity, every_fact: bool = False) -> Entity:
        """A structure, its designer and its year or its town (`every_fact`: both)."""
        name = f"{self.part(3)} {self.rng.choice(STRUCTURES)}"
        s = Entity(name, f"The {name}", designer=designer)
        s.facts["designer"] = (f"The {name} was designed by the architect {{}}.", designer.name)
        year = every_fact or self.rng.random() < 0.5
        if year:
            when = self.u.draw(lambda: str(self.rng.randrange(1450, 1900)))
            s.facts["year"] = (f"Construction of the {name} was completed in {{}}.", when)
        if every_fact or not year:
            s.facts["town"] = (f"The {name} stands in the town of {{}}.", self.part(3))
        return s


def _world(seed: int, n_docs: int) -> list[Entity]:
    """Entities with documents: a third people, each the designer of one structure; the
    other structures' designers have no document (their names appear once)."""
    w = World(make_rng(FAMILY, seed, "world"))
    people = [w.person(with_doc=True) for _ in range(max(2, n_docs // 3))]
    designers = people + [w.person(with_doc=False) for _ in range(n_docs - 2 * len(people))]
    entities = people + [w.structure(d) for d in designers]
    w.rng.shuffle(entities)
    for i, e in enumerate(entities):
        e.doc_id = f"doc{i:03d}"
    return entities


def _document(e: Entity, seed: int, budget: float, count_tokens: TokenCounter) -> Document:
    rng = make_rng(FAMILY, seed, f"prose/{e.doc_id}")
    facts = [sentence.format(answer) + " " for sentence, answer in e.facts.values()]
    rest = budget - count_tokens(e.title) - sum(count_tokens(f) for f in facts)
    topic = f"the {e.name}" if e.designer else None  # topical sentences suit places only
    pieces, counts = fill(prose.sentences(rng, topic), rest, count_tokens)
    depths = [rng.uniform(0.05, 0.95) for _ in facts]
    merged, _ = hay.insert_at_depths(pieces, counts, list(zip(depths, facts)))
    return Document(e.doc_id, f"{e.title}\n\n{hay.join(merged)}")


def _ask(kind: str, e: Entity) -> Question:
    if kind == "two_hop":
        return Question(f"In which town was the designer of the {e.name} born?",
                        [e.designer.facts["birthplace"][1]], kind, TOWN, "any",
                        [e.doc_id, e.designer.doc_id])
    if kind == "designer":
        full = e.facts["designer"][1]
        return Question(f"Who designed the {e.name}?", [full, full.split()[-1]], kind,
                        "Answer with the name only.", "any", [e.doc_id])
    if kind == "year":
        return Question(f"In which year was the construction of the {e.name} completed?",
                        [e.facts["year"][1]], kind, "Answer with the year only.", "any",
                        [e.doc_id])
    if kind == "town":
        return Question(f"In which town does the {e.name} stand?", [e.facts["town"][1]], kind,
                        TOWN, "any", [e.doc_id])
    return Question(f"In which town was {e.name} born?", [e.facts["birthplace"][1]], kind, TOWN,
                    "any", [e.doc_id])


def _askable(kind: str, e: Entity) -> bool:
    """Whether `e` can be asked `kind` with the answer only in the documents it needs."""
    if kind == "two_hop":
        return e.designer is not None and bool(e.designer.facts)
    if kind == "designer":
        return e.designer is not None and not e.designer.facts
    return kind in e.facts


def _questions(entities: list[Entity], n: int, rng: random.Random) -> list[Question]:
    """`n` questions cycling through KINDS (a kind with nothing left is skipped), no entity
    asked about twice."""
    used: set[str] = set()
    out: list[Question] = []
    for i in range(n * len(KINDS)):
        if len(out) == n:
            break
        kind = KINDS[i % len(KINDS)]
        pool = [e for e in entities if _askable(kind, e) and e.name not in used
                and (e.designer is None or kind != "two_hop" or e.designer.name not in used)]
        if pool:
            e = rng.choice(pool)
            used.update([e.name] + ([e.designer.name] if kind == "two_hop" else []))
            out.append(_ask(kind, e))
    return out


def _order(docs: list[Document], gold: set[str], depth: float | None,
           rng: random.Random) -> list[Document]:
    """Shuffled; with `depth`, the needed documents together at that fraction of the rest."""
    rng.shuffle(docs)
    if depth is None:
        return docs
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be a fraction in [0, 1], not {depth}")
    others = [d for d in docs if d.doc_id not in gold]
    at = round(depth * len(others))
    return others[:at] + [d for d in docs if d.doc_id in gold] + others[at:]


def multidoc_qa(length: int = 2048, seed: int = 0, *, questions: int = 4,
                doc_tokens: int = 300, depth: float | None = None,
                count_tokens: TokenCounter = estimate_tokens) -> Item:
    """Documents of about `doc_tokens` tokens each (±25%, at least six documents) adding up to
    about `length` tokens, and `questions` questions over them (fewer if the documents run
    out of askable facts); each question names the documents it needs."""
    if questions < 1 or doc_tokens < 50:
        raise ValueError("need questions >= 1 and doc_tokens >= 50")
    params = dict(questions=questions, doc_tokens=doc_tokens, depth=depth)

    def build(budget: float) -> Item:
        n_docs = max(MIN_DOCS, round(budget / doc_tokens))
        entities = _world(seed, n_docs)
        rng = make_rng(FAMILY, seed, "layout")
        weights = [rng.uniform(0.75, 1.25) for _ in entities]
        docs = [_document(e, seed, budget * w / sum(weights), count_tokens)
                for e, w in zip(entities, weights)]
        asked = _questions(entities, questions, make_rng(FAMILY, seed, "questions"))
        gold = {d for q in asked for d in q.needed_docs}
        docs = _order(docs, gold, depth, rng)
        return Item(FAMILY, seed, length, docs, asked,
                    {"params": params, "order": [d.doc_id for d in docs]})

    return fit_length(build, length, count_tokens)


def _fact_questions(entities: list[Entity], n: int, rng: random.Random,
                    offset: int) -> list[Question]:
    """`n` questions, every document asked once before any is asked twice; document j of
    round r is asked FACT_KINDS[j + r + offset] (so a document's rounds ask different kinds,
    and `offset` rotates the kinds between prompts)."""
    order = entities[:]
    rng.shuffle(order)
    n = min(n, len(order) * len(FACT_KINDS))
    return [_ask(FACT_KINDS[(i % len(order) + i // len(order) + offset) % len(FACT_KINDS)],
                 order[i % len(order)]) for i in range(n)]


def fact_documents(n_docs: int, seed: int = 0, *, questions: int = 2, doc_tokens: int = 500,
                   count_tokens: TokenCounter = estimate_tokens) -> Item:
    """A reuse-benchmark prompt: `n_docs` documents about structures, each stating the same
    three kinds of fact — designer, completion year, town — so that every document is a
    distractor of the same kind for a question about another; about `doc_tokens` tokens each
    (±25 %, adding up to n_docs · doc_tokens), in random order. `questions` questions (at
    most 3 · n_docs), each answered by exactly one document (`needed_docs`); designers have no
    document of their own, so a designer's name is written once."""
    if n_docs < 1 or questions < 1 or doc_tokens < 50:
        raise ValueError("need n_docs >= 1, questions >= 1 and doc_tokens >= 50")
    w = World(make_rng(FACTS, seed, "world"))
    entities = [w.structure(w.person(with_doc=False), every_fact=True) for _ in range(n_docs)]
    for i, e in enumerate(entities):
        e.doc_id = f"doc{i:03d}"
    rng = make_rng(FACTS, seed, "layout")
    weights = [rng.uniform(0.75, 1.25) for _ in entities]
    budget = n_docs * doc_tokens
    docs = [_document(e, seed, budget * wt / sum(weights), count_tokens)
            for e, wt in zip(entities, weights)]
    asked = _fact_questions(entities, questions, make_rng(FACTS, seed, "questions"), seed)
    rng.shuffle(docs)
    params = dict(questions=questions, doc_tokens=doc_tokens)
    item = Item(FACTS, seed, n_docs, docs, asked,
                {"params": params, "order": [d.doc_id for d in docs]})
    return replace(item, metadata={**item.metadata, "context_tokens": count_tokens(item.context)})
