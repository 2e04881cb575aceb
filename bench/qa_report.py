"""The report's real-QA tables: HotpotQA's official EM, F1 and containment per setting (a
reuse strategy, an eviction method at a budget), each against the ceiling on the same
questions (recompute; full KV) with 95 % paired bootstrap intervals
(`kvedge.bench.suites.intervals`), and the median TTFT ratio. One table per real task ×
length (`kvedge.bench.real.REAL_TASKS`); "correct" counts the answers that contain the gold
answer. A ceiling read from OUT/ceilings.jsonl was timed by an earlier run: the table says
how many questions' were.
"""
from __future__ import annotations

from kvedge.bench.real import HOTPOT_FIXED, HOTPOT_KB, REAL_TASKS

CEILING = {"reuse": "recompute", "evict": "full KV"}


def head(ceiling: str) -> list[str]:
    return ["setting", "correct", "EM", "F1", "contain", f"F1 / {ceiling} [95 % CI]",
            f"contain / {ceiling} [95 % CI]", f"F1 − {ceiling} [95 % CI]", "TTFT s (median)",
            f"TTFT / {ceiling}", "q"]


def _fmt(x, spec=".3f") -> str:
    return "—" if x is None else format(x, spec)


def with_interval(interval: list | None, spec: str = ".3f") -> str:
    """"0.912 [0.85, 0.97]" from [value, low, high]."""
    if not interval:
        return "—"
    value, low, high = interval
    ends = f" [{_fmt(low, '.2f')}, {_fmt(high, '.2f')}]" if low is not None else ""
    return f"{_fmt(value, spec)}{ends}"


def _label(r: dict) -> str:
    name = f"{r['method']}[{r['options']}]" if r.get("options") else r["method"]
    return name + (f" @{r['budget']:g}" if r["budget"] != 1 else "")


def qa_row(r: dict) -> list:
    paired = r.get("intervals") or {}
    f1, contain = paired.get("f1") or {}, paired.get("contain") or {}
    correct = round(r["contain"] * r["questions"]) if r.get("contain") is not None else None
    return [_label(r), _fmt(correct, "d"), _fmt(r.get("em")), _fmt(r.get("f1")),
            _fmt(r.get("contain")), with_interval(f1.get("ratio")),
            with_interval(contain.get("ratio")), with_interval(f1.get("diff"), "+.3f"),
            _fmt(r.get("first_token_s_median")), _fmt(r.get("first_token_s_median_ratio")),
            r["questions"]]


def _group_key(r: dict) -> tuple:
    return r["suite"], r["task"], r["length"], r["items"], r["seed"]


def _groups(rows: list[dict]) -> list[list[dict]]:
    """Cells over the same questions (a run of 100 items is another table than one of 50)."""
    return [[r for r in rows if _group_key(r) == key]
            for key in sorted({_group_key(r) for r in rows})]


def qa_tables(rows: list[dict]) -> list[str]:
    """Markdown lines: one table per real task × length × items, settings by median TTFT
    ratio."""
    real = [r for r in rows if r["task"] in REAL_TASKS and r.get("f1") is not None]
    out = []
    for group in _groups(real):
        suite, task, length, items, seed = _group_key(group[0])
        cached = max(r.get("ceiling_cached") or 0 for r in group)
        note = f"; {CEILING[suite]}'s answers of {cached} questions read from an earlier run" \
            if cached else ""
        resumed = [f"{_label(r)} {r['resumed']}" for r in group if r.get("resumed")]
        if resumed:  # timed in a process that stopped before the cell's end
            note += f"; answers resumed from an unfinished run: {', '.join(resumed)}"
        if group[0].get("gold_retrieved") is not None:  # hotpot-kb: what retrieval gave it
            note += (f"; the top-{length} held {group[0]['gold_retrieved']:.2f} of the gold "
                     "paragraphs per question")
        at = {HOTPOT_FIXED: f"{length} paragraphs",
              HOTPOT_KB: f"top-{length} of the KB"}.get(task, f"{length} tokens")
        out += [f"### {task} @ {at}, {items} items (seed {seed}){note}", "",
                "| " + " | ".join(head(CEILING[suite])) + " |", "|" + "---|" * 11]
        for r in sorted(group, key=lambda r: (-(r.get("first_token_s_median_ratio") or 0),
                                              _label(r))):
            out.append("| " + " | ".join(map(str, qa_row(r))) + " |")
        out.append("")
    return (["## Real QA (HotpotQA's official EM / F1 / containment vs the ceiling)", "", *out]
            if out else [])
