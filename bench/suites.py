"""Running one cell: the reuse suite (RAG) and the eviction suite (KBQA), on the services' code.

Packs are made by the cloud's `PrefillEngine` (`segment` + `encode`, as ingest does) and read
back with the edge's `read_pack`; prompts are composed and answered by the edge's
`EdgeEngine`; eviction is the cloud's method registry, the one batch jobs run (its `scores`
once per context, its `keep` per budget). Packs are encoded with the cell's codec. Ceilings
(recompute / full KV) are measured in the same process on the same items and cached per item
and codec, so every ratio is side by side. `kvpress-*` methods are NVIDIA kvpress's presses on
the same model and token ids, run in a child process (`kvedge.bench.kvpress_ref`): external
reference points, never our code.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from kvedge.bench.datasets import QAItem, load_items
from kvedge.bench.runner import KVPRESS, Cell
from kvedge.bench.scoring import score_question
from kvedge.bench.tasks import Question
from kvedge.common.pack.codecs import DEFAULT_CODEC

CEILING = {"reuse": ("recompute", 1.0), "evict": ("full", 1.0)}
SEGMENT_TOKENS = 512   # the gateway's default ingest segment (GatewayConfig.segment_tokens)
METRICS = ("score", "any", "all", "first_token_s", "tpot_s", "kv_bytes", "shipped_bytes",
           "recomputed", "compress_s", "prefill_s", "new_tokens")
RATIOS = ("score", "any", "all", "first_token_s", "tpot_s", "kv_bytes", "shipped_bytes")


@dataclass
class Bench:
    model: str
    max_new_tokens: int = 24            # the floor; questions with long references get more
    segment_tokens: int = SEGMENT_TOKENS

    def __post_init__(self):
        from kvedge.cloud.workers import PrefillEngine
        from kvedge.edge.engine import EdgeEngine

        self.prefill = PrefillEngine(self.model)
        self.engine = EdgeEngine(self.prefill.loaded)
        self._packs: dict[tuple[str, bool, str], list[tuple[object, int]]] = {}
        self._ceilings: dict[tuple, list[dict]] = {}
        self._scores: dict[tuple, tuple] = {}
        self._prefill_s: dict[str, float] = {}

    # ------------------------------------------------------------------ packs

    def packs(self, text: str, whole: bool, codec: str = DEFAULT_CODEC,
              namespace: str = "bench") -> list[tuple[object, int]]:
        """[(KVContext as the edge reads it, pack bytes)] for one document, made once per
        codec: one pack for the whole text (KBQA), or the ingest segments of ≤
        `segment_tokens`."""
        from kvedge.common.pack.format import read_pack

        key = (text, whole, codec)
        if key not in self._packs:
            out = []
            for seg in self.prefill.segment({"doc.md": text}, self.segment_tokens, whole):
                enc = self.prefill.encode(seg, namespace, codec)
                out.append((read_pack(enc.data, self.prefill.loaded.fingerprint), len(enc.data)))
            self._packs[key] = out
        return self._packs[key]

    def new_tokens(self, question: Question) -> int:
        """Decode budget: the floor, or twice the references' tokens (+8) when all of them
        must be returned (four 7-digit values are ~34 SmolLM2 tokens)."""
        refs = ", ".join(question.answers) if question.metric == "all" else max(
            question.answers, key=len)
        return max(self.max_new_tokens, 2 * len(self.engine.tok(refs)["input_ids"]) + 8)

    # ------------------------------------------------------------------ cells

    def run(self, cell: Cell) -> dict:
        items = load_items(cell.task, cell.suite, cell.length, cell.items, cell.seed,
                           self.prefill.loaded.tokenizer)
        run = self._reuse if cell.suite == "reuse" else self._evict
        ceilings = [o for item in items for o in self._ceiling(item, cell, run)]
        if (cell.method, cell.budget) == CEILING[cell.suite]:  # the ceiling is its own cell
            return summarize(ceilings, ceilings)
        if cell.method.startswith(KVPRESS):
            press = cell.method[len(KVPRESS):]
            return summarize(self._kvpress(items, press, cell.budget, cell.codec), ceilings)
        outcomes = [o for item in items for o in run(item, cell.method, cell.budget, cell.codec)]
        return summarize(outcomes, ceilings)

    def _ceiling(self, item: QAItem, cell: Cell, run) -> list[dict]:
        key = (cell.suite, item.key, cell.codec)
        if key not in self._ceilings:
            self._ceilings[key] = run(item, *CEILING[cell.suite], cell.codec)
        return self._ceilings[key]

    def _ask(self, segments: list, strategy, question: Question) -> dict:
        composed = self.engine.compose(segments, question.text, question.instruction)
        budget = self.new_tokens(question)
        *_, stats = self.engine.answer(composed, strategy, budget)
        return {**stats, **scores(stats["answer"], question), "new_tokens": budget}

    def _reuse(self, item: QAItem, method: str, budget: float, codec: str) -> list[dict]:
        from kvedge.edge.strategies import get_strategy

        strategy = get_strategy(method, {"ratio": budget} if budget < 1 else None)
        packs = [p for doc in item.documents for p in self.packs(doc, False, codec)]
        shipped = sum(size for _, size in packs)
        return [{**self._ask([ctx for ctx, _ in packs], strategy, q), "shipped_bytes": shipped}
                for q in item.questions]

    def _compressed(self, item: QAItem, ctx, method: str, budget: float, codec: str):
        """(evicted context, seconds). Scores are query-agnostic and budget-free, so they are
        computed once per (item, method, codec) and each budget only keeps its share; the
        seconds reported are scoring + keeping, as one compression job would spend."""
        from kvedge.cloud.eviction import get_method

        m = get_method(method, budget)
        key = (item.key, method, codec)
        if key not in self._scores:
            start = time.perf_counter()
            self._scores[key] = (m.scores(self.prefill.rt, ctx), time.perf_counter() - start)
        scores_, score_s = self._scores[key]
        start = time.perf_counter()
        kept = m.keep(scores_, ctx)
        return ctx.select(kept), score_s + time.perf_counter() - start

    def _context(self, item: QAItem, codec: str = DEFAULT_CODEC):
        (ctx, _), = self.packs("".join(item.documents), True, codec)
        return ctx

    def _prefill_seconds(self, item: QAItem, codec: str) -> float:
        """A plain prefill of the item's whole context, timed once: compression's yardstick."""
        import torch

        if item.key not in self._prefill_s:
            ids = torch.tensor(self._context(item, codec).token_ids)
            start = time.perf_counter()
            self.prefill.rt.prefill(ids, logits="none")
            self._prefill_s[item.key] = time.perf_counter() - start
        return self._prefill_s[item.key]

    def _evict(self, item: QAItem, method: str, budget: float, codec: str) -> list[dict]:
        """Compress the whole context once, then answer every question from it (PIE over the
        compressed, realigned context: the KBQA serving path)."""
        from kvedge.common.pack.format import encode_pack
        from kvedge.edge.strategies import get_strategy

        ctx, compress_s = self._context(item, codec), None
        if method != "full":
            ctx, compress_s = self._compressed(item, ctx, method, budget, codec)
        shipped = len(encode_pack(ctx, codec))
        prefill_s = self._prefill_seconds(item, codec) if method != "full" else None
        extra = {"shipped_bytes": shipped, "compress_s": compress_s, "prefill_s": prefill_s}
        return [{**self._ask([ctx], get_strategy("pie"), q), **extra} for q in item.questions]

    def _kvpress(self, items: list[QAItem], press: str, budget: float,
                 codec: str) -> list[dict]:
        """kvpress's `press` at `budget` over the very token ids our edge composes (`codec`:
        whose packs already hold them)."""
        from kvedge.bench.kvpress_ref import KVPressItem, run_kvpress

        jobs = []
        for item in items:
            ids = self.engine.prefix_ids + list(self._context(item, codec).token_ids)
            jobs.append(KVPressItem(ids, [(self.engine.question_ids(q.text, q.instruction),
                                           self.new_tokens(q)) for q in item.questions]))
        answers = run_kvpress(self.model, press, budget, jobs)
        out = []
        for item, result in zip(items, answers):
            for q, answer in zip(item.questions, result["answers"]):
                out.append({"answer": answer, **scores(answer, q),
                            "compress_s": result["compress_s"], "prefill_s": result["prefill_s"]})
        return out


def scores(prediction: str, question: Question) -> dict:
    """RULER's string_match_part ("any"), string_match_all ("all"), and the question's own
    metric ("score")."""
    s = score_question(prediction, question)
    return {"score": s.score, "any": s.any, "all": s.all}


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def summarize(outcomes: list[dict], ceilings: list[dict]) -> dict:
    """Per-cell metrics, each beside the same-run ceiling and its ratio (None where the cell
    did not measure it, e.g. kvpress's timings per token)."""
    out = {"questions": len(outcomes)}
    for key in METRICS:
        out[key] = _mean(outcomes, key)
        out[f"ceiling_{key}"] = _mean(ceilings, key)
    for key in RATIOS:
        value, base = out[key], out[f"ceiling_{key}"]
        out[f"{key}_ratio"] = value / base if value is not None and base else None
    out["answers"] = [r["answer"] for r in outcomes][:20]
    return out
