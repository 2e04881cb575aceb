"""A cell's rows summed up: each answer scored (RULER's metrics, HotpotQA's EM / F1 /
containment), then the cell's means beside its ceiling's on the same questions, their
ratios, medians of the TTFT, answers gained and lost, paired bootstrap intervals
(`kvedge.bench.bootstrap`, resampling contexts where rows name their item), and the
per-question scores a results row keeps (`summarize`). What `kvedge.bench.suites` writes
for each cell; the report and `kvctl bench pair` read it back.
"""
from __future__ import annotations

from statistics import median

from kvedge.bench.answer_metrics import PAIRED, QA_METRICS, qa_scores
from kvedge.bench.bootstrap import contexts_of, paired_bootstrap
from kvedge.bench.datasets import QAItem
from kvedge.bench.scoring import score_question
from kvedge.bench.tasks import Question
from kvedge.edge.engine import ASK_PHASES

METRICS = ("score", "any", "all", "first_token_s", "tpot_s", "answer_s", "kv_bytes",
           "shipped_bytes", "fp16_bytes", "recomputed", "compress_s", "prefill_s", "new_tokens",
           "prompt_tokens", "load_s", "sequence_ratio", "gold_retrieved", *QA_METRICS)
RATIOS = ("score", "any", "all", "first_token_s", "tpot_s", "answer_s", "kv_bytes",
          "shipped_bytes", *QA_METRICS)
MEDIANS = ("first_token_s",)  # also reported as medians (and their ratio)
TIMES = ("first_token_s", "tpot_s", "answer_s")  # no ratio between rows asked concurrently
#                                                  and rows asked alone
PHASES = ("plan_s", "forward_s", "full_layers_s", "sparse_layers_s", "select_s",
          "phases_ttft_s")  # kvedge.bench.ttft's, as "phase_<name>"
PER_QUESTION = ("item", "score", "first_token_s", "recomputed", "prompt_tokens",
                "answer_at", "documents", "tokens", "new_tokens", "gold_retrieved", "answer",
                "answer_s", "gap_s", *QA_METRICS)


def scored(stats: dict, question: Question, budget: int) -> dict:
    """An answer's stats with its scores (`scores`, HotpotQA's EM / F1 / containment) and
    its decode budget."""
    return {**stats, **scores(stats["answer"], question),
            **qa_scores(stats["answer"], question.answers), "new_tokens": budget}


def scores(prediction: str, question: Question) -> dict:
    """RULER's string_match_part ("any"), string_match_all ("all"), and the question's own
    metric ("score")."""
    s = score_question(prediction, question)
    return {"score": s.score, "any": s.any, "all": s.all}


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def _median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return median(values) if values else None


def breakdown(outcomes: list[dict]) -> dict | None:
    """Medians over the questions of the timed phases (None where none were timed), with
    the pack load and the engine's own TTFT of the same questions beside them."""
    timed = [o for o in outcomes if o.get("phase_plan_s") is not None]
    if not timed:
        return None
    out = {k: _median(timed, f"phase_{k}") for k in PHASES}
    return {"load_s": _median(timed, "load_s"), **out,
            "engine_first_token_s": _median(timed, "first_token_s"), "questions": len(timed)}


def ask_phases(rows: list[dict]) -> dict | None:
    """hotpot-kb: medians over the questions of where each ask's TTFT went on the product
    path (`EdgeEngine.ask`'s ASK_PHASES: retrieval, packs, the scheduler's queue, the
    model), with the median TTFT beside them (None where no row has them)."""
    timed = [r for r in rows if r.get("ask_phases")]
    if not timed:
        return None
    return {**{k: median(r["ask_phases"][k] for r in timed) for k in ASK_PHASES},
            "first_token_s": _median(timed, "first_token_s"), "questions": len(timed)}


def against_full(row: dict, reference: list[dict]) -> dict:
    """An eviction cell's accuracy beside full KV uncompressed's on the same questions; its
    F1 too, mean and question by question (`per_question`'s `full_kv_f1`: the report's F1
    over fp16 full KV then needs no fp16 full-KV cell of its own)."""
    full = _mean(reference, "score")
    ratio = row["score"] / full if row.get("score") is not None and full else None
    out = {"full_kv_score": full, "full_kv_ratio": ratio, "full_kv_f1": _mean(reference, "f1")}
    per_question = row.get("per_question")
    if per_question and len(per_question) == len(reference):
        out["per_question"] = [{**q, "full_kv_f1": ref.get("f1")}
                               for q, ref in zip(per_question, reference)]
    return out


def with_items(outcomes: list[dict], items: list[QAItem]) -> list[dict]:
    """The rows, each with its item's key (`item`: the context its question was asked of),
    where they are the items' questions in order (else as they are)."""
    keys = [item.key for item in items for _ in item.questions]
    if len(keys) != len(outcomes):
        return outcomes
    return [{**row, "item": key} for row, key in zip(outcomes, keys)]


def intervals(outcomes: list[dict], ceilings: list[dict]) -> dict[str, dict]:
    """Per metric of PAIRED that every question has on both sides: the cell's mean against
    the ceiling's on the same questions, the difference and the ratio with their 95 % paired
    bootstrap intervals (kvedge.bench.bootstrap), resampling items — the questions of one
    context together — where the rows name them (`with_items`)."""
    out, clusters = {}, contexts_of(outcomes)
    for key in PAIRED:
        pairs = [(o.get(key), c.get(key)) for o, c in zip(outcomes, ceilings)]
        if pairs and len(outcomes) == len(ceilings) and None not in {v for p in pairs for v in p}:
            out[key] = paired_bootstrap(*zip(*pairs), clusters=clusters).to_dict()
    return out


def summarize(outcomes: list[dict], ceilings: list[dict]) -> dict:
    """Per-cell metrics, each beside the same-run ceiling and its ratio (None where the cell
    did not measure it, e.g. kvpress's timings per token); medians of the TTFT too; how many
    questions the cell answered that the ceiling missed (`gained`) and the reverse (`lost`),
    question by question (both lists hold the same items' questions in the same order); the
    paired intervals; how many ceiling rows came from the store (`ceiling_cached`) and how
    many of the cell's own from an earlier, unfinished run of it (`resumed`)."""
    out = {"questions": len(outcomes)}
    for key in METRICS:
        out[key] = _mean(outcomes, key)
        out[f"ceiling_{key}"] = _mean(ceilings, key)
    for key in RATIOS:
        value, base = out[key], out[f"ceiling_{key}"]
        out[f"{key}_ratio"] = value / base if value is not None and base else None
    for key in MEDIANS:
        value, base = _median(outcomes, key), _median(ceilings, key)
        out[f"{key}_median"], out[f"ceiling_{key}_median"] = value, base
        out[f"{key}_median_ratio"] = value / base if value is not None and base else None
    concurrency = {o.get("concurrent") for o in outcomes} | {c.get("concurrent")
                                                               for c in ceilings}
    if len(concurrency) > 1:  # times taken beside other asks against times taken alone
        out["times_comparable"] = False
        for key in TIMES:
            out[f"{key}_ratio"] = None
            if key in MEDIANS:
                out[f"{key}_median_ratio"] = None
    if stalls := {o["max_stall"] for o in outcomes if o.get("max_stall") is not None}:
        out["max_stall"] = max(stalls)  # the cell's answers were stepped inside starts
    pairs = [(o["score"], c["score"]) for o, c in zip(outcomes, ceilings)
             if o.get("score") is not None and c.get("score") is not None]
    out["gained"] = sum(a > b for a, b in pairs)
    out["lost"] = sum(a < b for a, b in pairs)
    out["at_budget"] = sum(o.get("tokens", 0) >= o["new_tokens"] for o in outcomes
                           if o.get("new_tokens"))  # answers maybe cut short
    out["intervals"] = intervals(outcomes, ceilings)
    out["ceiling_cached"] = sum(bool(c.get("cached")) for c in ceilings)
    out["resumed"] = sum(bool(o.get("resumed")) for o in outcomes)
    out["breakdown"] = breakdown(outcomes)
    out["ask_phases"], out["ceiling_ask_phases"] = ask_phases(outcomes), ask_phases(ceilings)
    out["per_question"] = [{k: o.get(k) for k in PER_QUESTION} for o in outcomes]
    out["answers"] = [r["answer"] for r in outcomes][:20]
    return out
