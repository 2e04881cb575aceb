"""Chat prompts for a small instruct model (SmolLM2-135M-Instruct): context first, then the
question and a short imperative instruction ("Answer with the number only."), as RULER and
SCBench place them: the context is a prefix that can be cached and reused across questions.
"""
from __future__ import annotations

from typing import Sequence

from kvedge.bench.tasks.item import Document, Item, Question, join_documents

SYSTEM = "You answer questions about the text you are given. Be brief."


def question_prompt(question: Question | str, instruction: str | None = None) -> str:
    """What follows the context: "Question: ...", then the instruction on its own line."""
    if isinstance(question, Question):
        text, instruction = question.text, instruction or question.instruction
    else:
        text = question
    return f"Question: {text.strip()}" + (f"\n{instruction}" if instruction else "")


def user_prompt(context: str | Sequence[Document], question: Question | str,
                instruction: str | None = None) -> str:
    if not isinstance(context, str):
        context = join_documents(context)
    return f"{context}\n\n{question_prompt(question, instruction)}"


def to_messages(context: str | Sequence[Document], question: Question | str,
                instruction: str | None = None, system: str | None = SYSTEM
                ) -> list[dict[str, str]]:
    """[system?, user: context + question + instruction], for `apply_chat_template`."""
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [{"role": "user", "content": user_prompt(context, question, instruction)}]


def item_messages(item: Item, system: str | None = SYSTEM) -> list[list[dict[str, str]]]:
    """One conversation per question, each over the item's whole context."""
    return [to_messages(item.context, q, system=system) for q in item.questions]
