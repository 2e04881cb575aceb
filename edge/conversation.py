"""A chat conversation as the edge's prompt: system messages and earlier turns before the
retrieved segments, the last user message as the question.

The composed prompt of a conversation is

    [system][turn 1 user][turn 1 assistant]...[user header][segments][question][assistant header]

rendered by the model's own chat template: the segments and the question form the last user
turn, as they do for a single question, and everything before them is the conversation's
*prefix*. The prefix goes first, not the segments, because it grows by whole turns: turn n+1's
prefix starts with turn n's, so its KV is reused (`edge.sessions.PrefixCache`) while the
segments, retrieved anew for each question, follow it.

Long histories are cut from the oldest turn (a user message and the answers after it, so the
prefix still alternates user/assistant) until the prompt and the answer fit the model's
window; the system messages are kept. A conversation whose last question alone does not fit
is ContextLengthExceeded.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvedge.common.errors import BadInput, ContextLengthExceeded

CONTENT = "\x00"  # where the last user turn's content goes in the rendered template
SYSTEM_ROLES = ("system", "developer")


@dataclass(frozen=True)
class Conversation:
    """`system`: the system messages' text (None: the template's default); `history`: the
    earlier turns as (role, text), user first; `question`: the last user message."""

    question: str
    history: tuple[tuple[str, str], ...] = ()
    system: str | None = None

    @classmethod
    def of_messages(cls, messages: list[tuple[str, str]]) -> "Conversation":
        """OpenAI-style (role, text) messages → a conversation: system/developer messages
        joined (in order) into one system message, the last user message the question, the
        turns before it the history (a message after it — an assistant prefill — is
        refused: the edge answers the last user message)."""
        users = [i for i, (role, _) in enumerate(messages) if role == "user"]
        if not users:
            raise BadInput("messages: no user message: the last one is the question")
        last = users[-1]
        if any(role not in SYSTEM_ROLES for role, _ in messages[last + 1:]):
            raise BadInput("messages: the last message must be the user's question")
        system = [text for role, text in messages if role in SYSTEM_ROLES]
        turns = tuple((role, text) for role, text in messages[:last]
                      if role in ("user", "assistant"))
        while turns and turns[0][0] != "user":  # an answer with no question before it
            turns = turns[1:]
        return cls(messages[last][1], turns, "\n\n".join(system) if system else None)

    def retrieval_query(self, scope: str = "last") -> str:
        """What retrieval ranks the KB's segments against: the last question ("last"), or
        every user message of the conversation joined ("conversation")."""
        if scope == "last":
            return self.question
        return "\n".join([text for role, text in self.history if role == "user"]
                         + [self.question])

    def messages(self) -> list[dict]:
        """The chat-template messages of the prefix, with a placeholder for the last user
        turn's content."""
        head = [] if self.system is None else [{"role": "system", "content": self.system}]
        turns = [{"role": role, "content": text} for role, text in self.history]
        return head + turns + [{"role": "user", "content": CONTENT}]

    def prefix_ids(self, tokenizer) -> list[int]:
        """Token ids before the last user turn's content (what `chat_turn` gives for a
        single question, with the system message and the turns before it)."""
        text = tokenizer.apply_chat_template(self.messages(), add_generation_prompt=True,
                                             tokenize=False)
        head, _ = text.rsplit(CONTENT, 1)  # the last one: earlier turns may hold the byte too
        return tokenizer(head)["input_ids"]

    def dropping_oldest(self) -> "Conversation | None":
        """The conversation without its oldest turn (its user message and the answers that
        followed), or None when no turn is left to drop."""
        if not self.history:
            return None
        nxt = next((i for i, (role, _) in enumerate(self.history) if i and role == "user"),
                   len(self.history))
        return Conversation(self.question, self.history[nxt:], self.system)

    def fit(self, tokenizer, budget: int) -> tuple["Conversation", list[int], int]:
        """Drop the oldest turns until the prefix is at most `budget` tokens: (the kept
        conversation, its prefix ids, the number of turns dropped)."""
        kept, dropped = self, 0
        while True:
            ids = kept.prefix_ids(tokenizer)
            if len(ids) <= budget:
                return kept, ids, dropped
            shorter = kept.dropping_oldest()
            if shorter is None:
                raise ContextLengthExceeded(
                    f"the conversation's system message and last question need "
                    f"{len(ids)} tokens before the documents, {budget} are left; shorten "
                    "them or ask with a smaller top_k or max_tokens")
            kept, dropped = shorter, dropped + 1
