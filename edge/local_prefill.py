"""A segment's KV computed on the edge instead of fetched (`edge.fetch_or_compute`): exactly
what the cloud's prefill computes before its codec quantizes it into the pack — the same code,
`kvedge.common.pack.prefill`, which the cloud's `PrefillEngine.encode` runs: the segment's ids
from position 0, alone, or, where its pack says it was anchored (docs/design.md, decision 9),
at positions P.. behind the P tokens of the chat prefix, keeping the segment's KV only; then,
where its pack has them, the same side tensors (block summaries of every 64 tokens, the mean
pre-RoPE query of the last QUERY_CACHE_TOKENS). The edge's chat prefix is the cloud's anchor
by construction (both are `chat_turn(tokenizer)`'s prefix), and its KV is already prefilled
(`EdgeEngine.prefix_keys`).
The token ids are the pack manifest's own, kept in the local index by the syncer
(`edge.sync.encode_ids`), never the text tokenized again: a decode → encode round trip can
give other ids.

A `LocalSegment` stands in a composed prompt for a segment chosen to be computed; the
answer's start, on the scheduler thread that owns the model, turns it into its KVContext
(`resolve`) before the strategy's plan, so a strategy sees a KVContext as it would a decoded
pack. Each prefill is timed into the `PrefillMeter` the choice reads; `calibrate` times two
when the edge is idle, so the edge knows its prefill before it first has to choose. Computed
contexts are kept in a small LRU in memory (`edge.lru.ByteLRU`, by pack id), never in the
pack cache: they are not the pack's bytes (unquantized, unverified against its hash), and the
cache's files are what sync, prefetch and eviction reason about.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from kvedge.common.pack.context import KVContext
from kvedge.common.pack.prefill import Anchor, segment_context
from kvedge.edge.lru import ByteLRU
from kvedge.edge.meters import PrefillMeter
from kvedge.edge.sync import decode_ids

CALIBRATION_TOKENS = (64, 256)  # two sizes: the meter's line needs a slope
COMPUTED_BYTES = 64 * 2**20  # computed contexts kept (~5 SmolLM2 segments of 256 tokens, fp32)


def context_nbytes(ctx: KVContext) -> int:
    tensors = [t for heads in (ctx.keys, ctx.values, ctx.kept_positions) for layer in heads
               for t in layer]
    tensors += [*(ctx.block_summaries or ()), *(ctx.query_cache or ())]
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True)
class LocalSegment:
    """A segment to be computed when its answer starts: what a composed prompt needs of a
    segment before then (its tokens) and what computing it needs."""

    pack_id: str
    token_ids: list[int]
    namespace: str
    anchored: bool
    side_tensors: bool
    prefill: "LocalPrefill"

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


class LocalPrefill:
    """The edge's segment prefills for one model: timed into `meter`, kept in `computed`."""

    def __init__(self, fingerprint: str, tokenizer_id: str, anchor: Anchor,
                 meter: PrefillMeter | None = None, budget_bytes: int = COMPUTED_BYTES):
        self.fingerprint, self.tokenizer_id, self.anchor = fingerprint, tokenizer_id, anchor
        self.meter = meter if meter is not None else PrefillMeter()
        self.computed: ByteLRU[KVContext] = ByteLRU(budget_bytes)  # by pack id
        self.prefills = 0  # segments prefilled since start (LRU hits not counted)

    def segment(self, namespace: str, meta: dict) -> LocalSegment:
        """The stand-in for a local manifest's segment (it has `token_ids`)."""
        return LocalSegment(meta["pack_id"], decode_ids(meta["token_ids"]), namespace,
                            bool(meta.get("anchored")), bool(meta.get("side_tensors")), self)

    def context(self, rt, seg: LocalSegment) -> KVContext:
        """The segment's KVContext: kept from an earlier answer, or prefilled now (timed)."""
        ctx = self.computed.get(seg.pack_id)
        if ctx is None:
            ctx = self._timed(rt, seg.token_ids, seg.namespace, seg.anchored, seg.side_tensors)
            self.computed.put(seg.pack_id, ctx, context_nbytes(ctx))
            self.prefills += 1
        return ctx

    def _timed(self, rt, token_ids: list[int], namespace: str, anchored: bool,
               side_tensors: bool = False) -> KVContext:
        start = time.perf_counter()
        ctx = segment_context(rt, token_ids, fingerprint=self.fingerprint,
                              tokenizer_id=self.tokenizer_id, namespace=namespace,
                              anchor=self.anchor if anchored else None,
                              side_tensors=side_tensors)
        if ctx.keys[0][0].is_cuda:  # the kernels were only queued
            torch.cuda.synchronize()
        self.meter.add(len(token_ids), time.perf_counter() - start)
        return ctx

    def calibrate(self, rt) -> None:
        """Time prefills of CALIBRATION_TOKENS tokens (within the model's window): run by
        the scheduler when the edge is idle (`Scheduler.when_idle`)."""
        window = rt.config.max_position_embeddings
        for n in CALIBRATION_TOKENS:
            ids = [i % rt.config.vocab_size for i in range(min(n, window))]
            self._timed(rt, ids, "calibration", anchored=False)


def resolve(rt, composed):
    """`composed` with each LocalSegment replaced by its KVContext (on the model's thread)."""
    if not any(isinstance(seg, LocalSegment) for seg in composed.segments):
        return composed
    return replace(composed, segments=[seg.prefill.context(rt, seg)
                                       if isinstance(seg, LocalSegment) else seg
                                       for seg in composed.segments])
