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


class StopText:
    """Cuts streamed text at the first of some stop strings (OpenAI's `stop`).

    `push` returns what can be shown now: text that might be the start of a stop string is
    held back until the next piece shows whether it is, so no part of a stop string is ever
    returned. After a stop string appears, `hit` is set and `text` ends before it."""

    def __init__(self, stops=()):
        self.stops = tuple(s for s in stops if s)
        self.text = ""
        self.sent = 0  # characters of `text` already returned
        self.hit = False

    def push(self, piece: str) -> str:
        self.text += piece
        # none starts before `sent`: the start of a stop string is always held back
        found = [i for i in (self.text.find(s, self.sent) for s in self.stops) if i >= 0]
        if found:
            self.hit, self.text = True, self.text[:min(found)]
            return self._upto(len(self.text))
        held = max((n for s in self.stops for n in range(1, len(s))
                    if self.text.endswith(s[:n])), default=0)
        return self._upto(len(self.text) - held)

    def flush(self) -> str:
        """What was held back, once no more text will come."""
        return self._upto(len(self.text))

    def _upto(self, end: int) -> str:
        out = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        return out
