"""The benchmark's data model: an item is one context (or a list of documents) asked questions.

Every task family produces `Item`s. Single-context tasks (RULER's NIAH, variable tracking,
CWE/FWE, the SCBench-style knowledge base) hold one document with id "context"; multi-document
QA holds one `Document` per retrievable unit. Both views exist on every item: `item.documents`
for the RAG path (each document prefilled and retrieved on its own) and `item.context` for the
KBQA path (one cached context asked every question).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

DOC_SEPARATOR = "\n\n"
METRICS = ("all", "any")


@dataclass(frozen=True)
class Document:
    doc_id: str
    text: str


@dataclass(frozen=True)
class Question:
    """One question about the item's context.

    `answers` are the reference strings; `metric` says how they combine: "all" (every reference
    must be in the prediction, RULER's string_match_all: several needles, variables, words) or
    "any" (one suffices, RULER's string_match_part: aliases of one answer). `needed_docs` names
    the documents that hold what the answer needs (multi-document QA; empty elsewhere).
    """
    text: str
    answers: list[str]
    kind: str
    instruction: str = "Answer briefly."
    metric: str = "all"
    needed_docs: list[str] = field(default_factory=list)

    def __post_init__(self):
        if not self.answers or any(not a.strip() for a in self.answers):
            raise ValueError(f"question {self.text!r} needs non-empty reference answers")
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, not {self.metric!r}")


def join_documents(documents: Sequence[Document]) -> str:
    """The one-context view of a list of documents (what the KBQA path caches)."""
    return DOC_SEPARATOR.join(d.text for d in documents)


@dataclass(frozen=True)
class Item:
    """One benchmark item: documents (one, "context", for single-context tasks) and questions.

    `metadata` holds what made it (`params`: the generator's keyword arguments, so
    `generate(task, target_length, seed, **metadata["params"])` makes it again) and what was
    measured (`context_tokens` by the generator's token counter, needle depths, ...).
    """
    task: str
    seed: int
    target_length: int
    documents: list[Document]
    questions: list[Question]
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def context(self) -> str:
        return join_documents(self.documents)

    @property
    def key(self) -> str:
        """A stable name for result files: task/target length/seed."""
        return f"{self.task}/{self.target_length}/{self.seed}"

    def document(self, doc_id: str) -> Document:
        for doc in self.documents:
            if doc.doc_id == doc_id:
                return doc
        raise KeyError(f"item {self.key} has no document {doc_id!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Item:
        return cls(task=data["task"], seed=data["seed"], target_length=data["target_length"],
                   documents=[Document(**d) for d in data["documents"]],
                   questions=[Question(**q) for q in data["questions"]],
                   metadata=dict(data.get("metadata", {})))


def single_context(task: str, seed: int, target_length: int, text: str,
                   questions: list[Question], **metadata: Any) -> Item:
    """An item whose whole context is one document, id "context"."""
    return Item(task, seed, target_length, [Document("context", text)], questions, metadata)
