"""One answer as the edge's scheduler runs it (`EdgeEngine.ask` and `EdgeEngine.answer`):
the strategy's plan run to its first token when it starts, its tokens turned into text, and
what it cost."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Sequence

from kvedge.common.model.decoding import Decoding, Sampler
from kvedge.edge.local_prefill import resolve
from kvedge.edge.scheduler import Job
from kvedge.edge.sessions import PrefixCache
from kvedge.edge.strategies import Composed


class Transcript:
    """An answer's tokens as text: the end-of-turn token or a `stop` string (left out of the
    text) ends it; each token's arrival is timed."""

    def __init__(self, tok, stop: Sequence[str]):
        from kvedge.common.model.textstream import StopText, TextStream

        self.stream, self.stops, self.eos = TextStream(tok), StopText(stop), tok.eos_token_id
        self.times: list[float] = []
        self.finish_reason = "length"  # until the turn ends or a stop string comes

    def push(self, token: int) -> tuple[str, bool]:
        """(the text it completes, whether the answer is over)."""
        self.times.append(time.perf_counter())
        if token == self.eos:
            self.finish_reason = "stop"
            return "", True
        piece = self.stops.push(self.stream.push(token))
        if self.stops.hit:
            self.finish_reason = "stop"
        return piece, self.stops.hit

    def costs(self, start: float, plan, composed: Composed) -> dict:
        """What the answer cost; times relative to `start`."""
        from kvedge.common.model.kvcache import cache_nbytes
        from kvedge.edge.strategies.base import sequence_ratio

        times = self.times
        return {"answer": self.stops.text.strip(), "tokens": len(self.stream.ids),
                "finish_reason": self.finish_reason,
                "first_token_s": times[0] - start if times else 0.0,
                "answer_s": times[-1] - start if times else 0.0,  # time to the whole answer
                "tpot_s": (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0,
                # the longest wait between two of its tokens (a start beside it stalls it)
                "gap_s": longest_gap(times) or 0.0,
                "recomputed": plan.recomputed, "kv_bytes": cache_nbytes(plan.cache),
                "sequence_ratio": sequence_ratio(plan.cache, composed),
                "prompt_tokens": len(composed.all_ids())}


def longest_gap(times: list[float]) -> float | None:
    """The longest interval between successive arrival times (None for fewer than two)."""
    return max((b - a for a, b in zip(times, times[1:])), default=None)


class Answer(Job):
    """One answer in the scheduler (`EdgeEngine.ask` and `EdgeEngine.answer`): the strategy's
    plan run to its first token when it starts, then the text pieces, then the costs dict."""

    def __init__(self, tok, composed: Composed, strategy, max_new_tokens: int, sampler: Sampler,
                 stop: Sequence[str], start: float, deadline: float | None,
                 alive: Callable[[], bool] | None, sessions: PrefixCache | None = None):
        super().__init__(deadline, alive)
        self.composed, self.strategy, self.max_new_tokens = composed, strategy, max_new_tokens
        self.sampler, self.started, self.plan = sampler, start, None
        self.began = start  # when the scheduler started it (`start`)
        self.text = Transcript(tok, stop)
        self.sessions, self.reused = sessions, 0  # a conversation's prefix KV comes from it

    def start(self, rt) -> Decoding:
        self.began = time.perf_counter()  # out of the scheduler's queue
        self.composed = resolve(rt, self.composed)  # segments chosen to be computed: now
        if self.sessions is not None:  # on the model's thread: it may prefill new turns
            kv = self.sessions.kv(rt, self.composed.prefix_ids)
            self.composed = replace(self.composed, prefix_keys=kv.keys, prefix_values=kv.values)
            self.reused = kv.reused
        self.plan = self.strategy.plan(rt, self.composed, reserve=self.max_new_tokens)
        return Decoding.start(rt, self.plan, self.max_new_tokens, sampler=self.sampler,
                              stop_ids=(self.text.eos,), lookup=self.composed.all_ids())

    def on_token(self, token: int) -> bool:
        piece, done = self.text.push(token)
        if piece:
            self.put(piece)
        return done

    def finish(self) -> None:
        if rest := self.text.stops.flush():
            self.put(rest)
        self.put({**self.text.costs(self.started, self.plan, self.composed),
                  "started_s": self.began - self.started,
                  "session_reused": self.reused, "decode_steps": self.decoding.steps,
                  "drafted": self.decoding.drafted, "accepted": self.decoding.accepted})
