"""The edge engine: question → retrieve segments → load packs → strategy plan → stream tokens.

Retrieval reads the local KB manifests the syncer wrote. A retrieved segment whose pack is
not cached is fetched inside the ask (through the syncer's `Fetcher`: one transfer per pack
however many questions wait on it), and a pack found damaged or gone while answering is a
miss like any other: fetched again, a bounded number of times, so the user gets the answer
and not PackCorrupt (docs/design.md, decision 10). Cached packs answer with the cloud down; a
question needing a pack that cannot be fetched fails with PackUnavailable, naming them. With
fetch-or-compute on (`kvedge serve`'s default), a missing segment whose text the edge can
prefill sooner than its pack would arrive is computed on the edge instead
(`edge.fetch_or_compute`), and so is one whose fetch fails with the cloud unreachable.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import torch

from kvedge.common.errors import (BadInput, ContextLengthExceeded, InvalidRequest,
                                  ModelMismatch, NotFound, RequestTooLarge)
from kvedge.common.model.decoding import GREEDY, Sampler
from kvedge.common.pack.errors import PackCorrupt, PackError, PackUnavailable
from kvedge.common.pack.manifest import KVShape
from kvedge.common.pack.prefill import Anchor
from kvedge.common.model.tokenizer import chat_turn
from kvedge.edge import DEFAULT_SESSION_BYTES
from kvedge.edge.conversation import Conversation
from kvedge.edge import variants
from kvedge.edge.answer import Answer
from kvedge.edge.arriving import ArrivingSegment
from kvedge.edge.fetch_or_compute import FetchOrCompute, Sourced
from kvedge.edge.local_prefill import LocalPrefill, LocalSegment
from kvedge.edge.retrieval import BM25Index
from kvedge.edge.scheduler import Job, Scheduler
from kvedge.edge.sessions import PrefixCache, PrefixKV
from kvedge.edge.strategies import DEFAULT_STRATEGY, Composed, get_strategy
from kvedge.edge.strategies.base import TokenSegment
from kvedge.edge.sync import Target, decode_ids, manifest_path

log = logging.getLogger("kvedge.edge")
INSTRUCTION = "Answer the question using the documents above. Answer briefly."
HEAL_ATTEMPTS = 2  # a pack found damaged or gone while answering is fetched again this often
# Missing packs the link brings in sooner than this are fetched before the answer starts, not
# computed on as they arrive: overlap hides at most the shorter of the transfer and the
# start's compute, and the transfers' decoding then competes with the forward for the cores.
# SmolLM2 on 2 cores, 3 packs (python -m kvedge.bench.link_ttft): at 1 Gbit/s (~0.1 s on the
# wire) overlapping took 1.08x the fetched-first TTFT; at 100 Mbit/s (~0.6 s) 0.95x
OVERLAP_MIN_S = 0.3
# Request limits: checked before anything is tokenized, loaded or allocated for a request, so
# one request cannot take the daemon's memory (a 60,000-character question once needed 23 GB)
MAX_QUESTION_TOKENS = 1024
MAX_NEW_TOKENS = 1024
MAX_TOP_K = 32
MAX_STOPS, MAX_STOP_CHARS = 4, 256  # stop strings per request (OpenAI's limit), their length
CHARS_PER_TOKEN_BOUND = 16  # no tokenizer makes tokens longer on average than this


@dataclass
class AskResult:
    """The final event of an answer: the text and what it cost."""

    answer: str
    ttft_s: float
    tpot_s: float
    tokens: int
    segments: list[int]
    # the packs' bytes the answer read (segments computed on the edge, or given to recompute
    # as token ids, read none)
    bytes_loaded: int
    fp16_bytes: int
    strategy: str
    prompt_tokens: int
    recomputed_tokens: int
    kv_bytes: int = 0            # edge KV the answer attended over
    sequence_ratio: float = 1.0  # context rows kept / context tokens (SamKV's sequence ratio)
    finish_reason: str = "stop"  # "stop": end of turn or a stop string; "length": max_new_tokens
    session_reused: int = 0      # conversation prefix tokens whose KV the session cache held
    dropped_turns: int = 0       # oldest conversation turns left out to fit the window
    sources: list[str] = field(default_factory=list)  # the segments' files, in prompt order
    draft_tokens: int = 0        # prompt-lookup drafts run (kvedge.common.model.speculate)
    accepted_tokens: int = 0     # drafts the model's own picks agreed with (kept)
    # segments (indices) whose packs were missing: fetched inside the ask, or prefilled on
    # the edge instead (edge.fetch_or_compute; a segment computed for an earlier answer and
    # still in memory counts as computed)
    fetched_segments: list[int] = field(default_factory=list)
    computed_segments: list[int] = field(default_factory=list)
    # per segment, the KB variant its pack came from ("": the KB's own; edge.variants)
    variants: list[str] = field(default_factory=list)
    # where ttft_s went, in seconds summing to it (`ASK_PHASES`)
    phases: dict[str, float] = field(default_factory=dict)


# An ask's time to its first token, phase by phase (AskResult.phases): BM25 retrieval and the
# prompt's fit; the segments' packs read from the edge's cache, fetched or chosen to compute
# (an arriving pack's rest is read inside the model's time); waiting for the scheduler; the
# model's own part: the strategy's plan (its recompute) to the first token's pick.
ASK_PHASES = ("retrieve_s", "packs_s", "queued_s", "model_s")


@dataclass
class _KB:
    mtime: float
    manifest: dict
    index: BM25Index

    @cached_property
    def by_index(self) -> dict[int, dict]:
        """Each segment's manifest entry by its index in the KB (a variant's lookup)."""
        return {s["index"]: s for s in self.manifest["segments"]}


class EdgeEngine:
    """Answers questions about synced KBs through the scheduler: concurrent answers share
    decode steps, up to `max_batch` at once and `max_queue` waiting, and with
    `batch_invariant` an answer is the same whatever shares its steps, where the load-time
    probe finds padding that makes it so (`batch.row_multiple`; `kvedge serve` warns where
    none does); greedy answers draft up to `spec_rows`
    rows a step from their prompt (default: batch.spec_rows_for; 0 = off); `decode_weights`
    "int8", "fp16" or "bf16" makes the steps after the first token read weight-only int8, fp16
    or bf16 copies (faster, not bit-exact: kvedge.common.model.quant; steps over copies found
    row-invariant at load pad no rows), "auto" fp16 where a load-time probe finds its steps
    invariant and fast, else fp32 (`Runtime.auto_decode_weights`); `prompt_weights` "bf16" makes
    every forward over a prompt (an answer's start, session prefixes, segments computed here)
    read bf16 copies (`Runtime.use_prompt_weights`) — all but the fixed chat prefix, computed
    exactly once at load, which the cloud's packs are anchored behind. `ask` (the services)
    retrieves and composes; `answer` (the benchmark) takes a prompt the caller composed and
    runs it the same way. `graph_decode` (None: on when the model is on CUDA) steps a lone
    answer in fixed buffers replayed as a CUDA graph (`Scheduler`'s graph decode).
    `max_stall` (seconds; None: off) steps the answers decoding between the layers of a start
    once they have waited that long (`Scheduler`'s stall-free starts).
    `fetcher` (an `edge.fetcher.Fetcher`) fetches missing and damaged packs inside an ask;
    without one a missing or damaged pack fails the ask with PackCorrupt. `prefetcher` (an
    `edge.prefetch.Prefetcher`) is offered the segments ranked just below each ask's top_k.
    With `fetch_or_compute` (and a fetcher) an ask prefills a missing segment on the edge
    where that is sooner than fetching its pack, by the fetcher's link meter and the edge's
    prefill meter (calibrated when the scheduler is first idle). With `stream` (the
    default) a pack fetched for a decoded read is decoded layer by layer while its bytes
    arrive (`Fetcher.fetch(decode=True)`), not read from disk after (fetch-then-load); with
    `overlap` too (the default) an ask finding the scheduler idle submits its answer once
    the missing packs' manifests are in, and the forward computes layer l while later
    layers are on the wire (`edge.arriving`). Under load the packs are fetched first, so
    a start never holds the scheduler, and the answers decoding there, on the network."""

    def __init__(self, loaded, cache=None, state_dir: Path | str | None = None, *,
                 fetcher=None, prefetcher=None, max_batch: int = 16, max_queue: int = 64,
                 batch_invariant: bool = True, session_bytes: int = DEFAULT_SESSION_BYTES,
                 spec_rows: int | None = None, fetch_or_compute: bool = False,
                 stream: bool = True, overlap: bool = True, decode_weights: str = "fp32",
                 prompt_weights: str = "fp32", kv_budget: int | None = None,
                 alternates: dict[str, list[Target]] | None = None,
                 graph_decode: bool | None = None, max_stall: float | None = None):
        from kvedge.common.model.runtime import Runtime

        self.loaded, self.cache = loaded, cache
        self.fetcher, self.prefetcher = fetcher, prefetcher
        self.stream = stream  # a missing pack decoded while it arrives (False: after)
        self.overlap = overlap and stream  # ... and computed on as it arrives, when idle
        # per served KB (its key), variants whose packs may stand in for its own (edge.variants)
        self.alternates = alternates or {}
        self.rt = Runtime(loaded)
        self.rt.use_decode_weights(decode_weights)
        self.tok = loaded.tokenizer
        self.state_dir = Path(state_dir) if state_dir else None
        self.scheduler = Scheduler(self.rt, max_batch, max_queue, invariant=batch_invariant,
                                   spec_rows=spec_rows, graph_decode=graph_decode,
                                   kv_budget=kv_budget or default_kv_budget(self.rt.device),
                                   max_stall=max_stall)
        self._kbs: dict[str, _KB] = {}
        self._lock = threading.Lock()  # the KB table: asks retrieve on their own threads
        self.kv_shape = KVShape(self.rt.n_layers, self.rt.n_kv, self.rt.head_dim)
        # a token's K and V in every layer at the runtime's dtype: what admission counts
        self.kv_token_bytes = self.kv_shape.fp16_bytes(1) // 2 * self.rt.embed.element_size()
        self.sessions = PrefixCache(session_bytes)  # conversations' prefix KV, by token ids
        self.prefix_ids, self.suffix = chat_turn(self.tok)  # the cloud anchors behind the same
        prefix = self.rt.prefill(torch.tensor(self.prefix_ids), logits="none")
        self.prefix_keys, self.prefix_values = prefix.keys, prefix.values
        # every conversation's prefix starts as a lone question's does: a second turn extends it
        self.sessions.put(tuple(self.prefix_ids), PrefixKV(prefix.keys, prefix.values))
        # after the chat prefix: it stays the exact KV the cloud anchors its segments behind
        self.rt.use_prompt_weights(prompt_weights)
        self.local = self.chooser = None
        if fetch_or_compute and fetcher is not None:
            self._fetch_or_compute(fetcher)

    @property
    def batch_invariant(self) -> bool:
        """Whether an answer is the same whatever shares its decode steps: asked for, and the
        load-time probe found a padding of the decode weights' rows that makes it so
        (`Runtime.decode_row_multiple`)."""
        return self.scheduler.invariant and self.rt.decode_row_multiple is not None

    @property
    def step_rows(self) -> int:
        """The rows a lone answer's decode step runs (`batch.row_multiple`: 1, no padding)."""
        from kvedge.common.model.batch import row_multiple

        return row_multiple(self.rt, self.scheduler.invariant)

    def _fetch_or_compute(self, fetcher) -> None:
        """Segment prefills on this edge (`local`) and the choice between them and fetches."""
        self.local = LocalPrefill(self.loaded.fingerprint, self.loaded.tokenizer_id,
                                  Anchor(self.prefix_ids, self.prefix_keys, self.prefix_values))
        self.chooser = FetchOrCompute(fetcher.link, self.local.meter,
                                      lambda pack_id: pack_id in self.local.computed)
        self.scheduler.when_idle(self.local.calibrate)

    def _kb(self, target: Target) -> _KB:
        path = manifest_path(self.state_dir, target)
        if not path.exists():
            raise NotFound(f"this edge has no synced copy of {target.key}: serve it with "
                           f"`kvedge serve --kb {target.key}` and wait for the sync")
        mtime = path.stat().st_mtime
        kb = self._kbs.get(target.key)
        if kb is None or kb.mtime != mtime:
            manifest = json.loads(path.read_text())
            kb = _KB(mtime, manifest, BM25Index([s["text"] for s in manifest["segments"]]))
            self._kbs[target.key] = kb
        return kb

    def question_ids(self, question: str, instruction: str = INSTRUCTION) -> list[int]:
        """"Question: ...", the instruction on its own line, then the assistant header."""
        line = f"\n{instruction.strip()}" if instruction.strip() else ""
        return self.tok(f"Question: {question.strip()}{line}{self.suffix}")["input_ids"]

    def query_span(self, question: str, instruction: str = INSTRUCTION) -> tuple[int, int]:
        """[start, end) of the question's own tokens within `question_ids` (without the
        "Question:" label, the instruction and the assistant header)."""
        line = f"\n{instruction.strip()}" if instruction.strip() else ""
        start = len("Question: ")
        end = start + len(question.strip())
        enc = self.tok(f"Question: {question.strip()}{line}{self.suffix}",
                       return_offsets_mapping=True)
        inside = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if b > start and a < end]
        return (inside[0], inside[-1] + 1) if inside else (0, len(enc["input_ids"]))

    def compose(self, segments: list, question: str, instruction: str = INSTRUCTION) -> Composed:
        """[chat prefix][segments in the given order][question + instruction + assistant
        header]. The benchmark passes each task's own instruction ("Answer with the number
        only."); the service uses INSTRUCTION."""
        return Composed(self.prefix_ids, self.prefix_keys, self.prefix_values, segments,
                        self.question_ids(question, instruction),
                        query=self.query_span(question, instruction))

    def answer(self, composed: Composed, strategy, max_new_tokens: int, *,
               sampler: Sampler = GREEDY, stop: Sequence[str] = ()) -> Iterator[str | dict]:
        """The served path for a prompt composed by the caller (the benchmark): plan with
        `strategy`, run through the scheduler as `ask` does, decode with `sampler` until the
        end of the turn, a `stop` string (left out of the answer) or `max_new_tokens`; yield
        answer pieces, then a dict of what it cost (times are relative to the call; plan
        building counts toward the first token)."""
        yield from self.submit_answer(composed, strategy, max_new_tokens, sampler=sampler,
                                      stop=stop).events()

    def submit_answer(self, composed: Composed, strategy, max_new_tokens: int, *,
                      sampler: Sampler = GREEDY, stop: Sequence[str] = ()) -> Job:
        """`answer`, queued now: the job whose `events()` yield what `answer` yields. A caller
        with many prompts submits them all before reading any, so the scheduler decodes them
        together (the benchmark's concurrent asks); times count from this call."""
        return self.scheduler.submit(self._sized(Answer(
            self.tok, composed, strategy, max_new_tokens, sampler, stop, time.perf_counter(),
            None, None)))

    def _sized(self, answer: "Answer") -> "Answer":
        """The answer with the KV its cache holds at most (the scheduler admits by it): its
        prompt and decode budget, every layer, at the runtime's dtype."""
        answer.kv_bytes = answer.composed.seq_len(answer.max_new_tokens) * self.kv_token_bytes
        return answer

    def check_request(self, question: str, top_k: int, max_new_tokens: int,
                      stop: Sequence[str] = ()) -> None:
        """The request's sizes, before any work: InvalidRequest / RequestTooLarge."""
        if not question.strip():
            raise BadInput("the question is empty")
        if len(question) > MAX_QUESTION_TOKENS * CHARS_PER_TOKEN_BOUND:
            raise RequestTooLarge(f"the question has {len(question)} characters; at most "
                                  f"{MAX_QUESTION_TOKENS} tokens are allowed")
        if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
            raise InvalidRequest(f"max_new_tokens must be in [1, {MAX_NEW_TOKENS}], "
                                 f"got {max_new_tokens}")
        if not 1 <= top_k <= MAX_TOP_K:
            raise InvalidRequest(f"top_k must be in [1, {MAX_TOP_K}], got {top_k}")
        if len(stop) > MAX_STOPS or not all(0 < len(s) <= MAX_STOP_CHARS for s in stop):
            raise InvalidRequest(f"give at most {MAX_STOPS} stop strings of 1-{MAX_STOP_CHARS} "
                                 "characters each")

    def check_fits(self, context_tokens: int, question: str, max_new_tokens: int,
                   n_prefix: int | None = None) -> None:
        """The composed prompt and the answer within the model's context window, behind a
        prefix of `n_prefix` tokens (default: the engine's fixed chat prefix)."""
        n_question = len(self.question_ids(question))
        if n_question > MAX_QUESTION_TOKENS:
            raise RequestTooLarge(f"the question has {n_question} tokens; at most "
                                  f"{MAX_QUESTION_TOKENS} are allowed")
        n_prefix = len(self.prefix_ids) if n_prefix is None else n_prefix
        total = n_prefix + context_tokens + n_question + max_new_tokens
        window = self.rt.config.max_position_embeddings
        if total > window:
            raise ContextLengthExceeded(
                f"prompt ({total - max_new_tokens} tokens) + max_new_tokens ({max_new_tokens}) "
                f"exceed the model's {window}-token context; ask with a smaller top_k or "
                "max_new_tokens")

    def ask(self, target: Target, question: str | Conversation, *,
            strategy: str = DEFAULT_STRATEGY, top_k: int = 3, max_new_tokens: int = 48,
            options: Mapping[str, str] | None = None, sampler: Sampler = GREEDY,
            stop: Sequence[str] = (), deadline: float | None = None,
            alive: Callable[[], bool] | None = None,
            retrieval: str = "last", keep: bool = False,
            instruction: str = INSTRUCTION) -> Iterator[str | AskResult]:
        """Retrieve, load the packs (fetching missing ones), answer: yield answer pieces, then
        one AskResult. `options` are the strategy's (checked against its fields:
        InvalidOption if bad); `sampler` picks each token (greedy by default); a `stop` string
        ends the answer. Retrieval and fetches run on the caller's thread, the model on the
        scheduler's (Overloaded when its queue is full); past `deadline` (a time.monotonic()
        time) the request is dropped with DeadlineExceeded, and once `alive()` is False with
        Cancelled. The packs it reads are held from eviction until the answer is complete.

        A `Conversation` (system messages, earlier turns, the last question) goes before the
        segments as the prompt's prefix (`edge.conversation`): its oldest turns are dropped
        to fit the window, and its KV comes from the session cache, so a next turn computes
        only its new tokens. Retrieval ranks segments against the last question, or with
        `retrieval="conversation"` against every user message. With `keep` (a chat client,
        likely to send a next turn) the next turn's prefix — this question and its answer
        appended — is computed when the edge is idle, so that turn finds it whole.
        `instruction` follows the question (the benchmark's datasets give their own: HotpotQA
        asks for the answer only)."""
        start = time.perf_counter()
        chosen = get_strategy(strategy, options)
        chat = question if isinstance(question, Conversation) else Conversation(question)
        question = chat.question
        self.check_request(question, top_k, max_new_tokens, stop)
        if retrieval not in ("last", "conversation"):
            raise InvalidRequest(f"retrieval must be 'last' or 'conversation', not {retrieval!r}")
        # a conversation's own prefix, not the fixed one, is fitted to the window by prefix()
        n_prefix = None if self.lone(chat) else 0
        metas, below = self.pick(target, chat.retrieval_query(retrieval), top_k,
                                 max_new_tokens, question, n_prefix)
        prefix, dropped, kept = self.prefix(chat, sum(m["n_tokens"] for m in metas), question,
                                            max_new_tokens)
        metas = self._variants(target, metas)
        marks = {"retrieved": time.perf_counter()}

        def job(composed: Composed) -> Answer:
            if prefix is not None:
                composed = replace(composed, prefix_ids=prefix, prefix_keys=None,
                                   prefix_values=None)
            return self._sized(Answer(self.tok, composed, chosen, max_new_tokens, sampler, stop,
                                       start, deadline, alive,
                                       self.sessions if prefix is not None else None))

        with self.cache.hold(m["pack_id"] for m in metas):
            event = yield from self._run(target, metas, question, chosen, job, below,
                                         instruction, marks)
        if keep:
            self.keep_turn(kept, event["answer"])
        yield AskResult(
            answer=event["answer"], ttft_s=event["first_token_s"], tpot_s=event["tpot_s"],
            tokens=event["tokens"], segments=[m["index"] for m in metas],
            bytes_loaded=event["bytes_loaded"],
            fp16_bytes=self.kv_shape.fp16_bytes(sum(m["n_tokens"] for m in metas)),
            strategy=chosen.name,
            prompt_tokens=event["prompt_tokens"], recomputed_tokens=event["recomputed"],
            kv_bytes=event["kv_bytes"], sequence_ratio=event["sequence_ratio"],
            finish_reason=event["finish_reason"], session_reused=event["session_reused"],
            dropped_turns=dropped, sources=[m.get("source", "") for m in metas],
            draft_tokens=event["drafted"], accepted_tokens=event["accepted"],
            fetched_segments=event["fetched_segments"],
            computed_segments=event["computed_segments"],
            variants=[m.get("variant", "") for m in metas],
            phases=_phases(start, marks, event))

    def prefix(self, chat: Conversation, context_tokens: int, question: str,
               max_new_tokens: int) -> tuple[list[int] | None, int, Conversation]:
        """The conversation's prefix ids with its oldest turns dropped until the prompt and
        the answer fit the window, how many were dropped, and the conversation kept; None for
        the ids of a lone question with the template's own system message (the engine's
        fixed chat prefix)."""
        if self.lone(chat):
            return None, 0, chat
        window = self.rt.config.max_position_embeddings
        budget = window - context_tokens - len(self.question_ids(question)) - max_new_tokens
        kept, ids, dropped = chat.fit(self.tok, budget)
        return ids, dropped, kept

    @staticmethod
    def lone(chat: Conversation) -> bool:
        """A question with no history and the template's own system message: its prefix is
        the engine's fixed chat prefix."""
        return not chat.history and chat.system is None

    def keep_turn(self, chat: Conversation, answer: str) -> None:
        """Compute the KV of the prefix a next turn of `chat` starts with (its question and
        `answer` become history) when the edge is idle (`Scheduler.when_idle`)."""
        turn = (("user", chat.question), ("assistant", answer))
        ids = Conversation("", chat.history + turn, chat.system).prefix_ids(self.tok)
        self.scheduler.when_idle(lambda rt: self.sessions.kv(rt, ids))

    def _run(self, target: Target, metas: list[dict], question: str, chosen, job,
             below: list[dict], instruction: str, marks: dict):
        """Yield the answer's pieces; return its costs dict. Damage found in a pack while the
        answer decodes its rows (block-granular strategies decode them in the scheduler,
        before the first token) drops that pack; with a fetcher, and no text sent yet, the
        pack is fetched again and the answer run once more. `marks["packs"]` gets the time
        the last attempt's segments were ready."""
        # with the scheduler idle, the first attempt computes on packs as they arrive; what
        # goes wrong with an arriving pack sends the ask down the blocking path, which heals
        overlap = self.overlap and self.scheduler.in_flight == 0
        retried = False
        while True:
            sent = False
            try:
                segments, sourced = self._segments(target, metas, chosen.block_granular,
                                                   choose=True, overlap=overlap,
                                                   kv=chosen.reads_kv)
            except (PackUnavailable, PackCorrupt) as err:  # an arriving pack's manifest
                if not overlap:
                    raise
                overlap = self._blocking_after(target, err)
                continue
            overlap = overlap and any(isinstance(seg, ArrivingSegment) for seg in segments)
            marks["packs"] = time.perf_counter()
            composed = self.compose(segments, question, instruction)
            self._offer(target, sourced.computed + below)  # a computed segment's pack too
            try:
                for event in self.scheduler.submit(job(composed)).events():
                    if isinstance(event, str):
                        sent = True
                        yield event
                read = [m for m, seg in zip(metas, segments)
                        if not isinstance(seg, (TokenSegment, LocalSegment))]
                return {**event, "bytes_loaded": sum(m["pack_bytes"] for m in read),
                        "fetched_segments": [m["index"] for m in sourced.fetched],
                        "computed_segments": [m["index"] for m in sourced.computed]}
            except PackUnavailable as err:
                if not overlap or sent:
                    raise
                overlap = self._blocking_after(target, err)
            except PackCorrupt as err:
                if overlap and not sent:
                    overlap = self._blocking_after(target, err)
                    continue
                damaged = [m for m in metas if m not in sourced.computed
                           and not self.cache.recheck(m["pack_id"])]
                if self.fetcher is None or retried or sent:
                    raise
                log.warning("%s: %s found damaged while answering (%s); fetching again and "
                            "answering again", target.key, _named(damaged), err)
                retried, below = True, []

    @staticmethod
    def _blocking_after(target: Target, err: Exception) -> bool:
        """An arriving pack failed the answer before any text: the ask again, the packs
        fetched (and healed) first. Returns the next attempt's overlap (off)."""
        log.warning("%s: a pack arriving for the answer failed (%s); fetching it whole and "
                    "answering again", target.key, err)
        return False

    def retrieve(self, target: Target, question: str, top_k: int = 3,
                 max_new_tokens: int = 48, granular: bool = False) -> tuple[list[dict], Composed]:
        """The top_k segments' manifest entries and the composed prompt over their packs
        (decoded, or `granular`: opened, for a block-granular strategy), missing packs
        fetched."""
        metas, below = self.pick(target, question, top_k, max_new_tokens)
        composed = self.compose(self._segments(target, metas, granular)[0], question)
        self._offer(target, below)
        return metas, composed

    def pick(self, target: Target, query: str, top_k: int, max_new_tokens: int,
             question: str | None = None,
             n_prefix: int | None = None) -> tuple[list[dict], list[dict]]:
        """(the top_k segments' manifest entries ranked against `query`, in prompt order;
        those ranked just below them, for the prefetcher: none without one). The prompt is
        checked to fit with `question` (default: the query) behind `n_prefix` tokens
        (`check_fits`)."""
        question = query if question is None else question
        with self._lock:
            kb = self._kb(target)
        # the best segment goes last, next to the question: small models copy from there
        picked = kb.index.top_k(query, top_k)[::-1]
        metas = [kb.manifest["segments"][i] for i in picked]
        self.check_fits(sum(m["n_tokens"] for m in metas), question, max_new_tokens, n_prefix)
        below = []
        if self.prefetcher is not None and self.prefetcher.depth:
            ranked = kb.index.top_k(query, top_k + self.prefetcher.depth)
            below = [kb.manifest["segments"][i] for i in ranked if i not in picked]
        return metas, below

    def _variants(self, target: Target, metas: list[dict]) -> list[dict]:
        """Each segment's manifest entry, or an allowed variant's for the same segment where
        that pack is cached or arrives enough sooner (`edge.variants`), marked "variant"."""
        allowed = self.alternates.get(target.key)
        if not allowed or self.fetcher is None:
            return metas
        kbs = []
        with self._lock:
            for alt in allowed:
                try:
                    kbs.append((alt.variant, self._kb(alt)))
                except NotFound:  # not synced (yet): the KB's own packs
                    continue
        return [variants.choose(m, [{**kb.by_index[m["index"]], "variant": name}
                                    for name, kb in kbs if m["index"] in kb.by_index],
                                self.cache.has, self.fetcher.link.seconds) for m in metas]

    def _offer(self, target: Target, metas: list[dict]) -> None:
        """After the answer's own packs are in: the link is the answer's first."""
        if metas and self.prefetcher is not None:
            self.prefetcher.offer(target.namespace, metas)

    def _segments(self, target: Target, metas: list[dict], granular: bool,
                  choose: bool = False, overlap: bool = False,
                  kv: bool = True) -> tuple[list, Sourced]:
        """Each segment's pack, decoded (`granular`: opened), missing ones fetched first —
        or, with `choose` and fetch-or-compute on, prefilled on the edge where that is
        sooner (a `LocalSegment`, computed when the answer starts); and where the missing
        ones came from. With `overlap`, a missing pack read decoded is an `ArrivingSegment`
        as soon as its manifest is in, every transfer under way at once (layer l of each
        arrives about together). Without `kv` (a strategy that reads token ids only) a
        segment whose ids the local manifest holds is a `TokenSegment`: no pack read."""
        tokens = {m["pack_id"]: TokenSegment(m["pack_id"], decode_ids(m["token_ids"]))
                  for m in metas if not kv and "token_ids" in m}
        missing = [m for m in metas
                   if m["pack_id"] not in tokens and not self.cache.has(m["pack_id"])]
        local = self._computed(target, missing) if choose else {}
        fetch = [m for m in missing if m["pack_id"] not in local]
        read = self.cache.segment if granular else self.cache.load
        decode = self.stream and not granular  # an opened pack decodes only rows it keeps
        arriving = self._arriving(target, fetch) if overlap and decode and fetch else {}
        if self.stream and self.fetcher is not None and len(fetch) > 1 and not arriving:
            self.fetcher.fetch_in_order(target.namespace, [m["pack_id"] for m in fetch], decode)
        segments = [tokens[m["pack_id"]] if m["pack_id"] in tokens
                    else local[m["pack_id"]] if m["pack_id"] in local
                    else ArrivingSegment(arriving[m["pack_id"]]) if m["pack_id"] in arriving
                    else self._read_or_compute(target, m, read, fetch, decode, local)
                    for m in metas]
        return segments, Sourced([m for m in fetch if m["pack_id"] not in local],
                                 [m for m in missing if m["pack_id"] in local])

    def _arriving(self, target: Target, fetch: list[dict]) -> dict:
        """pack id → its Arrival, each transfer started (or joined) now (none without a
        fetcher; a pack whose transfer under way does not decode is read the blocking way).
        Transfers sharing the link are not measured by its meter, so while the link is not
        known yet several missing packs are fetched one after another instead (measured),
        as fetch-or-compute needs. Packs the link brings in under OVERLAP_MIN_S leave
        nothing to hide and are fetched first too."""
        if self.fetcher is None:
            return {}
        wire = self.fetcher.link.seconds(sum(m["pack_bytes"] for m in fetch))
        if (wire is None and len(fetch) > 1) or (wire is not None and wire < OVERLAP_MIN_S):
            return {}
        arrivals = {m["pack_id"]: self.fetcher.arriving(target.namespace, m["pack_id"])
                    for m in fetch}
        return {pid: a for pid, a in arrivals.items() if a is not None}

    def _read_or_compute(self, target: Target, meta: dict, read, missing: list[dict],
                         decode: bool, local: dict):
        """`_read`, or — where its fetch fails with the cloud unreachable and this edge can
        prefill the segment (fetch-or-compute on, its token ids synced) — the segment
        computed here, added to `local`: a KB served on demand keeps answering with the
        cloud down, at local prefill's cost, as a pinned KB does from its disk."""
        try:
            return self._read(target, meta, read, missing, decode)
        except PackUnavailable as err:
            if self.local is None or "token_ids" not in meta:
                raise
            log.warning("%s: fetching %s failed (%s); computing it on this edge instead",
                        target.key, _named([meta]), err.__cause__ or err)
            local[meta["pack_id"]] = self.local.segment(target.namespace, meta)
            return local[meta["pack_id"]]

    def _computed(self, target: Target, missing: list[dict]) -> dict:
        """pack id → LocalSegment for each missing segment the edge computes sooner than it
        fetches the pack (none with fetch-or-compute off)."""
        if self.chooser is None or not missing:
            return {}
        choices = self.chooser.choose(missing)
        log.info("%s: %s", target.key, self.chooser.describe(choices))
        return {c.meta["pack_id"]: self.local.segment(target.namespace, c.meta)
                for c in choices if c.compute}

    def _read(self, target: Target, meta: dict, read, missing: list[dict],
              decode: bool = False):
        """`read(pack id)`, the pack fetched first if missing (`decode`: decoded as it
        arrives); one found damaged (in transfer, or on disk: the cache deleted it) or gone
        is fetched again, HEAL_ATTEMPTS times at most, when there is a fetcher."""
        for attempt in range(HEAL_ATTEMPTS + 1):
            try:
                self._fetch(target, meta, missing, decode)
                return read(meta["pack_id"])
            except PackCorrupt as err:
                if self.fetcher is None or attempt == HEAL_ATTEMPTS:
                    raise
                log.warning("%s: %s: %s; fetching it again", target.key, _named([meta]), err)

    def _fetch(self, target: Target, meta: dict, missing: list[dict],
               decode: bool = False) -> None:
        """Fetch the segment's pack if the cache lacks it (nothing without a fetcher: reading
        it then fails as PackCorrupt, "the cached file is gone"). A fetch failing for any
        reason but the pack's own (damaged bytes, another model) is PackUnavailable, naming
        every segment of the answer still missing."""
        if self.fetcher is None:
            return
        try:
            self.fetcher.fetch(target.namespace, meta["pack_id"], decode)
        except (PackError, ModelMismatch):
            raise
        except Exception as err:  # noqa: BLE001 - the cloud down, refusing, stopping
            named = missing if any(m is meta for m in missing) else [meta, *missing]
            still = [m for m in named if not self.cache.has(m["pack_id"])]
            raise PackUnavailable(
                f"{target.key}: {_named(still)} not cached on this edge, and the cloud is "
                f"unreachable or refused the fetch ({type(err).__name__}: {err}). Questions "
                "whose segments are cached still answer; ask again once the cloud is "
                "reachable, or serve the KB with `kvedge serve --pin` to keep it whole on "
                "this edge") from err

    def close(self) -> None:
        """Stop the scheduler: answers in flight are cancelled."""
        self.scheduler.close()


def _named(metas: list[dict]) -> str:
    """"segment 3 (doc.md, pack 1a2b3c4d5e6f…)", joined: what an error or a log line names."""
    return ", ".join(f"segment {m['index']} ({m['source']}, pack {m['pack_id'][:12]}…)"
                     for m in metas) or "no segment"


def default_kv_budget(device) -> int | None:
    """Half the memory free now on `device` (the GPU's with CUDA, else the machine's): what
    the answers decoding together may hold in KV when `kvedge serve --kv-budget` is 0. None
    (no limit) where the system does not say (`SC_AVPHYS_PAGES` is Linux's)."""
    import os

    if torch.device(device).type == "cuda":
        return torch.cuda.mem_get_info(device)[0] // 2
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2 or None
    except (ValueError, OSError):
        log.warning("free memory unknown on this system: answers are admitted without a KV "
                    "budget (set kvedge serve --kv-budget)")
        return None


def _phases(start: float, marks: dict, event: dict) -> dict[str, float]:
    """ASK_PHASES from the ask's clock marks and its answer's costs (times from `start`)."""
    retrieved, packs = marks["retrieved"] - start, marks["packs"] - start
    began = event["started_s"]
    return {"retrieve_s": retrieved, "packs_s": packs - retrieved, "queued_s": began - packs,
            "model_s": event["first_token_s"] - began}
