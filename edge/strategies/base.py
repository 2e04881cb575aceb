"""What every reuse strategy shares: the composed prompt, the plan it returns, cache assembly.

A composed prompt is [chat prefix][segment 1]...[segment k][question + assistant header]. The
prefix's KV is exact (it always sits at position 0); each segment's pre-RoPE KV comes from its
pack, prefilled on its own from position 0 in the cloud. A strategy turns this into a Plan:
the cache to start from, the tokens to run (context tokens it recomputes, then the question)
and the per-layer active sets — then the runtime decodes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import torch

from kvedge.common.model.decoding import Prompt
from kvedge.common.model.kvcache import KVCache
from kvedge.common.registry import validate
from kvedge.edge.loader import load_cache


@dataclass
class Composed:
    """[prefix][text 0][segment 0][text 1][segment 1]...[question]: cached segments and fresh
    text interleaved in any order (SparseX Sec. 3–4: system text, doc A, user text, doc B,
    question). `texts[i]` is the fresh text just before segment i (missing or empty: none);
    the question is the fresh text after the last one. Fresh tokens are not in the cache: they
    run in the same forward as the question and are inserted at their positions."""

    prefix_ids: list[int]
    prefix_keys: list[torch.Tensor]     # per layer (Hkv, P, D), pre-RoPE, exact
    prefix_values: list[torch.Tensor]
    segments: list                      # KVContexts (pre-RoPE, maybe ragged per head)
    question_ids: list[int]
    texts: tuple[list[int], ...] = ()   # fresh text before each segment (at most one each)
    # [start, end) of the user's query text within question_ids (None: unknown, all of them):
    # question_ids also hold a label, the instruction and the chat template's assistant header
    query: tuple[int, int] | None = None

    def __post_init__(self):
        if len(self.texts) > len(self.segments):
            raise ValueError(f"{len(self.texts)} fresh texts for {len(self.segments)} segments: "
                             "each text goes before a segment (the question goes last)")

    def text_before(self, i: int) -> list[int]:
        return list(self.texts[i]) if i < len(self.texts) else []

    @property
    def offsets(self) -> list[int]:
        """Position of each segment's first token in the composed prompt."""
        out, pos = [], len(self.prefix_ids)
        for i, seg in enumerate(self.segments):
            pos += len(self.text_before(i))
            out.append(pos)
            pos += seg.n_tokens
        return out

    @property
    def context_ids(self) -> list[int]:
        """The segments' tokens (the cached context; fresh texts not included)."""
        return [t for seg in self.segments for t in seg.token_ids]

    @property
    def n_prefix(self) -> int:
        return len(self.prefix_ids)

    @property
    def n_context(self) -> int:
        return sum(seg.n_tokens for seg in self.segments)

    @property
    def question_start(self) -> int:
        return self.n_prefix + sum(len(t) for t in self.texts) + self.n_context

    def question_positions(self) -> torch.Tensor:
        return torch.arange(self.question_start, self.question_start + len(self.question_ids))

    def query_positions(self) -> torch.Tensor:
        """Positions of the user's query text (SamKV's "user query", Sec. 3.1)."""
        start, end = self.query or (0, len(self.question_ids))
        return torch.arange(self.question_start + start, self.question_start + end)

    def fresh_positions(self) -> torch.Tensor:
        """Every position not cached: the fresh texts', then the question's (SparseX's I_nr)."""
        texts = [torch.arange(off - len(self.text_before(i)), off)
                 for i, off in enumerate(self.offsets)]
        return torch.cat(texts + [self.question_positions()])

    def reused_positions(self) -> torch.Tensor:
        """The segments' positions (SparseX's I_reuse): what selective recompute picks from."""
        return torch.cat([torch.arange(off, off + seg.n_tokens)
                          for seg, off in zip(self.segments, self.offsets)])

    def segment_heads(self, tokens: int) -> torch.Tensor:
        """The first `tokens` positions of every segment: where a segment prefilled alone
        grew its attention sink (docs/design.md decision 9)."""
        return torch.cat([torch.arange(off, off + min(tokens, seg.n_tokens))
                          for seg, off in zip(self.segments, self.offsets)]
                         + [torch.empty(0, dtype=torch.long)])

    def run_span(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, positions) of everything after the prefix — segments, fresh texts and the
        question — which is what a shallow-selection plan runs at layer 0."""
        positions = torch.arange(self.n_prefix, self.question_start + len(self.question_ids))
        return torch.tensor(self.all_ids())[positions], positions

    def seq_len(self, max_new_tokens: int = 0) -> int:
        """The request's one RoPE length: the composed prompt plus the decode reserve."""
        return self.question_start + len(self.question_ids) + max_new_tokens

    def all_ids(self) -> list[int]:
        pieces = [self.text_before(i) + list(seg.token_ids) for i, seg in enumerate(self.segments)]
        return self.prefix_ids + [t for piece in pieces for t in piece] + self.question_ids


@dataclass(frozen=True)
class TokenSegment:
    """A segment known by its token ids alone — the local manifest's, which the syncer took
    from the pack's manifest — standing in a composed prompt for a strategy that reads no KV
    (`ReuseStrategy.reads_kv` False): what `Composed` reads of a segment besides its KV."""

    pack_id: str
    token_ids: list[int]

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class Plan(Prompt):
    """A strategy's answer to a composed prompt: the `Prompt` the runtime runs to the first
    token (`Decoding.start`: cache, tokens run at layer 0, per-layer active sets, `observe`
    and `after_first` hooks) and what it costs."""

    recomputed: int = 0                 # context tokens recomputed at full depth


@dataclass
class ReuseStrategy:
    """Base class: a dataclass whose fields are the strategy's options (`option(...)`, with
    their ranges and help); subclasses set `name`, register with `@STRATEGIES.register` and
    implement `plan`."""

    name: ClassVar[str] = ""
    # True: the strategy reads packs block by block (`PackSegment.select`, `held_rows`), so
    # the edge hands it opened packs and a cold pack is never decoded whole for it
    block_granular: ClassVar[bool] = False
    # False: the strategy reads the segments' token ids and no KV (recompute), so the edge
    # gives it each segment's synced ids (`TokenSegment`) and fetches or opens no pack for it
    reads_kv: ClassVar[bool] = True

    def __post_init__(self):
        validate(self)

    def plan(self, rt, composed: Composed, reserve: int) -> Plan:
        raise NotImplementedError

    def question_plan(self, composed: Composed, cache) -> Plan:
        """Run only the fresh tokens — texts between segments, then the question — over
        `cache` (the reuse strategies' common case)."""
        fresh = composed.fresh_positions()
        return Plan(cache, torch.tensor(composed.all_ids())[fresh], fresh)


def top_k_plus(scores: torch.Tensor, reused: torch.Tensor, fixed: torch.Tensor,
               budget: int) -> torch.Tensor:
    """Sorted: the top-`budget` reused positions by `scores` (indexed by position) that are not
    in `fixed`, plus `fixed` — selective recompute's set when some tokens are recomputed
    whatever the scores say (SparseX's S_key ∪ S_ov ∪ S_tail, Alg. 1 lines 14–17; segment
    heads)."""
    candidates = reused[~torch.isin(reused, fixed)]
    top = candidates[torch.topk(scores[candidates], min(budget, candidates.numel())).indices]
    return torch.sort(torch.cat([top, fixed])).values


def recomputed_count(reused: torch.Tensor, fixed: torch.Tensor, budget: int) -> int:
    """How many context tokens `top_k_plus` returns (fixed ⊆ reused)."""
    return min(budget, reused.numel() - fixed.numel()) + fixed.numel()


def assemble_cache(rt, composed: Composed, *, realign: bool = True, reserve: int = 0,
                   seq_len: int | None = None) -> KVCache:
    """The prompt's cached KV as a runtime cache: prefix + every segment at its offset.

    realign=True rotates each segment's keys to its composed positions (PIE, A3 Eq. 2);
    realign=False keeps the rotation of the positions it was prefilled at (full reuse) while
    masking by composed positions. Dense when every head kept every token; ragged once anything
    was evicted (recomputing an evicted token then computes it without storing it back, in every
    head alike — a dense cache would treat the hole as an error).

    The cache's extent is the prefix and every segment whole, evicted tokens included (an
    evicted token that is recomputed is context, not new); the fresh texts and the question
    lie outside it, so the runtime inserts them. `reserve`: what the request adds after the
    last segment (question + decoded tokens). seq_len: the request's one RoPE length, for
    these keys and every later query (default `question_start + reserve`, which is
    `composed.seq_len(max_new_tokens)` when reserve = question + max_new_tokens).

    Built by the edge's loader (`kvedge.edge.loader`): one pass per layer, layer by layer on
    a background thread — reading a layer of the returned cache waits until it is built.
    """
    return load_cache(rt, composed, realign=realign, reserve=reserve, seq_len=seq_len)


def boundary_plan(rt, composed: Composed, reserve: int,
                  local: Callable[[int], torch.Tensor]) -> Plan:
    """Realign every segment, then run at full depth the tokens `local(n)` of each segment
    (indices into a segment of n tokens) and every fresh token, in position order: EPIC's
    LegoLink, where `epic` (first k) and `legolink` (first and last k) differ only in `local`."""
    cache = assemble_cache(rt, composed, realign=True,
                           reserve=len(composed.question_ids) + reserve)
    chosen = [local(seg.n_tokens) + off for seg, off in zip(composed.segments, composed.offsets)]
    positions = torch.sort(torch.cat(chosen + [composed.fresh_positions()])).values
    all_ids = torch.tensor(composed.all_ids())
    return Plan(cache, all_ids[positions], positions, recomputed=sum(c.numel() for c in chosen))


def sequence_ratio(cache: KVCache, composed: Composed) -> float:
    """Context rows the cache holds / context tokens, mean over layers and KV heads: SamKV's
    sequence ratio (1.0 for a strategy that keeps every context token; below it after
    eviction in the cloud or block selection at the edge). The prefix, fresh texts, question
    and answer are not context."""
    if composed.n_context == 0:
        return 1.0
    ranges = torch.tensor([(off, off + seg.n_tokens)
                           for seg, off in zip(composed.segments, composed.offsets)])
    held = heads = 0
    for layer in cache:
        for group in layer.heads():
            pos = group.positions.cpu()  # on the model's device, as the cache is
            inside = ((pos[:, None] >= ranges[:, 0]) & (pos[:, None] < ranges[:, 1])).any(1)
            held += int(inside.sum()) * group.keys.shape[0]
            heads += group.keys.shape[0]
    return held / (heads * composed.n_context)
