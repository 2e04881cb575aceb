"""Running one cell: the reuse suite (RAG) and the eviction suite (KBQA), on the services' code.

Packs are made by the cloud's `PrefillEngine.encode` and read back with the edge's
`read_pack`; prompts are composed and answered by the edge's `EdgeEngine`; eviction is the
cloud's `evict_context`, the one batch jobs run. Ceilings (recompute / full KV) are measured in
the same process on the same items and cached per item, so every ratio is side by side.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from kvedge.bench.datasets import QAItem, load_items
from kvedge.bench.runner import Cell

CEILING = {"reuse": ("recompute", 1.0), "evict": ("full", 1.0)}


def matches(prediction: str, answers: list[str]) -> tuple[float, float]:
    """(any reference found, fraction found): RULER's string_match_part / string_match_all."""
    from kvedge.bench.scoring import string_match_all, string_match_part

    return string_match_part(prediction, answers), string_match_all(prediction, answers)


@dataclass
class Bench:
    model: str
    codec: str = "fp16"
    max_new_tokens: int = 24

    def __post_init__(self):
        from kvedge.cloud.workers import PrefillEngine
        from kvedge.edge.engine import EdgeEngine

        self.prefill = PrefillEngine(self.model)
        self.engine = EdgeEngine(self.prefill.loaded)
        self._packs: dict[str, tuple[object, int]] = {}
        self._ceilings: dict[tuple, dict] = {}
        self._scores: dict[tuple, tuple] = {}

    # ------------------------------------------------------------------ packs

    def pack(self, text: str, namespace: str = "bench"):
        """(KVContext as the edge reads it, pack bytes) for one document, made once."""
        from kvedge.common.pack.format import read_pack

        if text not in self._packs:
            seg, = self.prefill.segment({"doc.md": text}, segment_tokens=1 << 20, whole=True)
            enc = self.prefill.encode(seg, namespace, self.codec)
            self._packs[text] = (read_pack(enc.data, self.prefill.loaded.fingerprint),
                                 len(enc.data))
        return self._packs[text]

    # ------------------------------------------------------------------ cells

    def run(self, cell: Cell) -> dict:
        items = load_items(cell.task, cell.suite, cell.length, cell.items, cell.seed,
                           self.prefill.loaded.tokenizer)
        run = self._reuse if cell.suite == "reuse" else self._evict
        ceilings = [o for item in items for o in self._ceiling(item, cell.suite, run)]
        if (cell.method, cell.budget) == CEILING[cell.suite]:  # the ceiling is its own cell
            return summarize(ceilings, ceilings)
        outcomes = [o for item in items for o in run(item, cell.method, cell.budget)]
        return summarize(outcomes, ceilings)

    def _ceiling(self, item: QAItem, suite: str, run) -> list[dict]:
        key = (suite, item.key)
        if key not in self._ceilings:
            self._ceilings[key] = run(item, *CEILING[suite])
        return self._ceilings[key]

    def _ask(self, composed, strategy, answers) -> dict:
        *_, stats = self.engine.answer(composed, strategy, self.max_new_tokens)
        hit_any, hit_all = matches(stats["answer"], answers)
        return {**stats, "any": hit_any, "all": hit_all}

    def _reuse(self, item: QAItem, method: str, budget: float) -> list[dict]:
        from kvedge.edge.strategies import get_strategy

        strategy = get_strategy(method, budget if budget < 1 else None)
        packs = [self.pack(doc) for doc in item.documents]
        out = []
        for question, answers in item.questions:
            composed = self.engine.compose([ctx for ctx, _ in packs], question)
            row = self._ask(composed, strategy, answers)
            row["shipped_bytes"] = sum(size for _, size in packs)
            out.append(row)
        return out

    def _compressed(self, item: QAItem, ctx, method: str, budget: float):
        """(evicted context, seconds). Scores are query-agnostic and budget-free, so they are
        computed once per (item, method) and each budget only re-selects; the seconds
        reported are scoring + selection, as one compression job would spend."""
        from kvedge.cloud.eviction import get_method, select

        m = get_method(method, budget)
        key = (item.key, method)
        if key not in self._scores:
            start = time.perf_counter()
            self._scores[key] = (m.score(self.prefill.rt, ctx), time.perf_counter() - start)
        scores, score_s = self._scores[key]
        start = time.perf_counter()
        kept = select(scores, ctx, budget, m.sinks, m.protect, m.adaptive)
        return ctx.select(kept), score_s + time.perf_counter() - start

    def _evict(self, item: QAItem, method: str, budget: float) -> list[dict]:
        """Compress the whole context once, then answer every question from it (PIE over the
        compressed, realigned context: the KBQA serving path)."""
        from kvedge.common.pack.format import encode_pack
        from kvedge.edge.strategies import get_strategy

        ctx, _ = self.pack("".join(item.documents))
        compress_s = 0.0
        if method != "full":
            ctx, compress_s = self._compressed(item, ctx, method, budget)
        shipped = len(encode_pack(ctx, self.codec))
        prefill_s = _prefill_seconds(self.prefill.rt, ctx) if method != "full" else 0.0
        out = []
        for question, answers in item.questions:
            row = self._ask(self.engine.compose([ctx], question), get_strategy("pie"), answers)
            out.append({**row, "shipped_bytes": shipped, "compress_s": compress_s,
                        "prefill_s": prefill_s})
        return out


def _prefill_seconds(rt, ctx) -> float:
    import torch

    start = time.perf_counter()
    rt.prefill(torch.tensor(ctx.token_ids), logits="none")
    return time.perf_counter() - start


def _mean(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows if key in r]
    return sum(values) / len(values) if values else 0.0


def summarize(outcomes: list[dict], ceilings: list[dict]) -> dict:
    """Per-cell metrics, each beside the same-run ceiling and its ratio."""
    out = {"questions": len(outcomes)}
    for key in ("any", "all", "first_token_s", "tpot_s", "kv_bytes", "shipped_bytes",
                "recomputed", "compress_s", "prefill_s"):
        out[key] = _mean(outcomes, key)
        out[f"ceiling_{key}"] = _mean(ceilings, key)
    for key in ("any", "all", "first_token_s", "tpot_s", "kv_bytes", "shipped_bytes"):
        base = out[f"ceiling_{key}"]
        out[f"{key}_ratio"] = out[key] / base if base else None
    out["answers"] = [r["answer"] for r in outcomes][:20]
    return out
