"""The benchmark's generated tasks, by name: the one registry the runner and the CLI read.

Each task is a family generator (one module per family) with fixed parameters. Every
generator is seeded, downloads nothing, and takes `count_tokens` (default: `estimate_tokens`)
to fill its context up to a target length in tokens:

    item = generate("niah_single_prose", length=2048, seed=0)
    item = generate("multidoc_qa", 4096, 1, count_tokens=lambda s: len(tok(s)["input_ids"]))
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from .item import Document, Item, Question, join_documents
from .knowledge_base import knowledge_base
from .length import TokenCounter, estimate_tokens
from .multidoc import multidoc_qa
from .niah import niah
from .variable_tracking import variable_tracking
from .word_extraction import common_words, frequent_words

__all__ = ["TASKS", "TaskSpec", "UnknownTask", "generate", "Item", "Question", "Document",
           "join_documents", "estimate_tokens", "TokenCounter"]


class UnknownTask(KeyError):
    def __str__(self) -> str:
        return f"unknown benchmark task {self.args[0]!r}; known: {', '.join(sorted(TASKS))}"


@dataclass(frozen=True)
class TaskSpec:
    """A named task: a family generator `build(length, seed, **params)` and its parameters."""
    name: str
    build: Callable[..., Item]
    params: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    def __call__(self, length: int, seed: int = 0, **overrides: Any) -> Item:
        item = self.build(length, seed, **{**self.params, **overrides})
        return replace(item, task=self.name)


_SPECS = [
    TaskSpec("niah_single_noise", niah, {"haystack": "noise"},
             "RULER niah_single_1: one number needle in repeated noise sentences"),
    TaskSpec("niah_single_prose", niah, {"haystack": "prose"},
             "RULER niah_single_2: one number needle in generated prose"),
    TaskSpec("niah_single_prose_string", niah, {"haystack": "prose", "value_kind": "string"},
             "RULER niah_single_3: one random-string needle in generated prose"),
    TaskSpec("niah_multikey_prose", niah, {"haystack": "prose", "distractors": 3},
             "RULER niah_multikey_1: the asked needle among three needles with other keys"),
    TaskSpec("niah_multikey_needles", niah, {"haystack": "needles"},
             "RULER niah_multikey_2: the haystack is all needles with other keys"),
    TaskSpec("niah_multikey_needles_string", niah,
             {"haystack": "needles", "value_kind": "string"},
             "RULER niah_multikey_3: a haystack of string needles with other keys"),
    TaskSpec("niah_multivalue", niah, {"haystack": "prose", "values_per_key": 4},
             "RULER niah_multivalue: one key, four values, all to be returned"),
    TaskSpec("niah_multiquery", niah, {"haystack": "prose", "queries": 4},
             "RULER niah_multiquery: four keys asked at once"),
    TaskSpec("variable_tracking", variable_tracking, {"chains": 1, "hops": 4},
             "RULER vt: every variable a chain of assignments gives the asked value"),
    TaskSpec("cwe", common_words, {},
             "RULER cwe: the ten most common words of a numbered list"),
    TaskSpec("fwe", frequent_words, {},
             "RULER fwe: the three most frequent words of Zipf-distributed coded text"),
    TaskSpec("kb_multiquery", knowledge_base, {},
             "SCBench-style shared context: key-value, prefix-suffix and multi-hop questions"),
    TaskSpec("multidoc_qa", multidoc_qa, {},
             "RAG: one- and two-document questions over separately retrievable documents"),
]
TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in _SPECS}


def generate(task_name: str, length: int, seed: int = 0, **kw: Any) -> Item:
    """One item of `task_name` with a context of about `length` tokens.

    Keyword arguments override the task's parameters (and may pass `count_tokens`);
    `generate(item.task, item.target_length, item.seed, **item.metadata["params"])`, with
    the same `count_tokens`, makes the same item again.
    """
    try:
        spec = TASKS[task_name]
    except KeyError:
        raise UnknownTask(task_name) from None
    return spec(length, seed, **kw)
