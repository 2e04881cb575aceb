"""Incremental detokenization: emit text as tokens arrive without splitting UTF-8 characters."""
from __future__ import annotations


class TextStream:
    """Feed token ids one at a time; `push` returns the newly completed text (maybe "")."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = 0  # characters already returned

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # a multi-byte character is still incomplete
            return ""
        new, self.emitted = text[self.emitted:], len(text)
        return new

    @property
    def text(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)
