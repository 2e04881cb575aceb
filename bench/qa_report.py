"""The report's real-QA tables: HotpotQA's official EM, F1 and containment per setting (a
reuse strategy, an eviction method at a budget), each against the ceiling on the same
questions (recompute; full KV) with 95 % paired bootstrap intervals
(`kvedge.bench.cell_summary.intervals`), and the median TTFT ratio. One table per real task ×
length (`kvedge.bench.real.REAL_TASKS`); "correct" counts the answers that contain the gold
answer. A ceiling read from OUT/ceilings.jsonl was timed by an earlier run: the table says
how many questions' were.

Reuse tables also set each strategy beside the edge's default (`DEFAULT_STRATEGY`) on the same
questions: F1 and containment differences with their paired intervals, so that a ranking
among strategies (not only each against recompute) comes from the report, not by hand.
Eviction tables likewise set each method beside ContrastKV (`EVICT_REFERENCE`, the cloud's
query-agnostic method, whose standing against KVzip issue 29 asks for) at the same budget
and codec.
"""
from __future__ import annotations

from kvedge.bench.bootstrap import contexts_of, paired_bootstrap
from kvedge.bench.real import HOTPOT_FIXED, HOTPOT_KB, REAL_TASKS
from kvedge.edge import DEFAULT_STRATEGY

CEILING = {"reuse": "recompute", "evict": "full KV"}
EVICT_REFERENCE = "contrastkv"  # eviction cells are set beside it at their budget and codec
# the reuse tables' paired columns against the default: metric → its name in the header
AGAINST_DEFAULT = {"f1": "F1", "contain": "contain"}


def head(ceiling: str, default: str | None = None) -> list[str]:
    against = [f"{name} − {default} [95 % CI]"
               for name in AGAINST_DEFAULT.values()] if default else []
    return ["setting", "correct", "EM", "F1", "contain", f"F1 / {ceiling} [95 % CI]",
            f"contain / {ceiling} [95 % CI]", f"F1 − {ceiling} [95 % CI]", *against,
            "TTFT s (median)", f"TTFT / {ceiling}", "q"]


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


def qa_row(r: dict, against: list | None = None) -> list:
    """The table's cells for `r`; `against`: its columns against the default strategy
    (`against_default`), where the table has them."""
    paired = r.get("intervals") or {}
    f1, contain = paired.get("f1") or {}, paired.get("contain") or {}
    correct = round(r["contain"] * r["questions"]) if r.get("contain") is not None else None
    return [_label(r), _fmt(correct, "d"), _fmt(r.get("em")), _fmt(r.get("f1")),
            _fmt(r.get("contain")), with_interval(f1.get("ratio")),
            with_interval(contain.get("ratio")), with_interval(f1.get("diff"), "+.3f"),
            *(against or []), _fmt(r.get("first_token_s_median")),
            _fmt(r.get("first_token_s_median_ratio")), r["questions"]]


def ships_as_default(r: dict) -> bool:
    """Whether `r` is the edge's default strategy as it ships: its setting (its options —
    none, or a sweep's `tokens=20` where 20 is legolink's default — and its ratio, where the
    strategy has one) equals the default's."""
    if r["method"] != DEFAULT_STRATEGY:
        return False
    from kvedge.bench.runner import Cell, reuse_strategy
    from kvedge.common.errors import KvedgeError
    from kvedge.edge.strategies import get_strategy

    cell = Cell(r["suite"], r["task"], r["length"], r["method"], r["budget"], r["items"],
                options=r.get("options") or "")
    try:
        return reuse_strategy(cell) == get_strategy(DEFAULT_STRATEGY)
    except KvedgeError:  # an option the strategy no longer has: not today's default
        return False


def default_cells(group: list[dict]) -> dict:
    """Codec → the group's cell of the edge's default strategy as it ships (`ships_as_default`)
    in that codec, with per-question scores (a cell without options first): each strategy is
    set against the default over the same packs."""
    cells = sorted((r for r in group if r.get("per_question") and ships_as_default(r)),
                   key=lambda r: not r.get("options"))  # no options last: it wins
    return {r.get("codec"): r for r in cells}


def reference_cells(group: list[dict]) -> dict:
    """(codec, budget) → the group's EVICT_REFERENCE cell (without options) with
    per-question scores: each eviction method is set against it at its budget and codec."""
    return {_reference_key(r): r for r in group
            if r["method"] == EVICT_REFERENCE and not r.get("options") and r.get("per_question")}


def _reference_key(r: dict):
    """What a cell is set beside: the default strategy in its codec (reuse), ContrastKV at
    its codec and budget (eviction)."""
    return r.get("codec") if r["suite"] == "reuse" else (r.get("codec"), r["budget"])


def against_default(r: dict, default: dict | None) -> list[str]:
    """`r` − the default strategy's cell, question by question, per AGAINST_DEFAULT metric
    with its paired bootstrap interval ("—" for the default itself, without a default cell
    in `r`'s codec, or where a side lacks a question's score)."""
    if default is None or r is default:
        return ["—"] * len(AGAINST_DEFAULT)
    mine, ref = r.get("per_question") or [], default["per_question"]
    out = []
    for key in AGAINST_DEFAULT:
        a, b = [q.get(key) for q in mine], [q.get(key) for q in ref]
        if not a or len(a) != len(b) or None in a or None in b:
            out.append("—")
        else:
            out.append(with_interval(paired_bootstrap(
                a, b, clusters=contexts_of(mine)).diff.as_list(), "+.3f"))
    return out


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
        defaults, reference = ((default_cells(group), DEFAULT_STRATEGY) if suite == "reuse"
                               else (reference_cells(group), EVICT_REFERENCE))
        columns = head(CEILING[suite], reference if defaults else None)
        out += [f"### {task} @ {at}, {items} items (seed {seed}){note}", "",
                "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for r in sorted(group, key=lambda r: (-(r.get("first_token_s_median_ratio") or 0),
                                              _label(r))):
            against = against_default(r, defaults.get(_reference_key(r))) if defaults else None
            out.append("| " + " | ".join(map(str, qa_row(r, against))) + " |")
        out.append("")
    return (["## Real QA (HotpotQA's official EM / F1 / containment vs the ceiling)", "", *out]
            if out else [])
