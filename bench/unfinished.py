"""What an unfinished run has measured so far: each cell in `OUT/partial.jsonl`, over the
items it reached, against its ceiling on the same questions. Torch-free.

A run cut off (`kvctl bench run --by-item` most of all, whose every cell advances together)
keeps each item's answers in `partial.jsonl`, each entry naming its cell and the
`ceilings.jsonl` entry it is judged against: full KV uncompressed for eviction (what "of
full KV" means), recompute for reuse. `kvctl bench report` adds them as a section of their
own. These are figures over the first items of the seeded order, not the cell's: the row the
finished cell writes supersedes them, and fewer items mean wider intervals.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

from kvedge.bench.answer_metrics import PAIRED
from kvedge.bench.bootstrap import paired_bootstrap
from kvedge.bench.ceilings import read_entries
from kvedge.bench.runner import Cell


def unfinished(folder: Path) -> list[dict]:
    """Per cell with entries in `folder`/partial.jsonl whose ceiling `folder`/ceilings.jsonl
    holds: {"cell", "items", "questions", and per metric of PAIRED a paired bootstrap
    (`Paired.to_dict`: the cell's mean, the ceiling's, the difference and the ratio with
    their 95 % intervals, resampling items)}, cells in the order first kept. Entries from
    before the bench named their cell are left out."""
    refs = {key: e["rows"] for key, e in read_entries(folder / "ceilings.jsonl").items()}
    by_cell = {cell: [(e["item"], e["rows"], ref) for e in entries
                      if (ref := refs.get(e.get("ceiling"))) is not None
                      and len(ref) == len(e["rows"])]
               for cell, entries in _by_cell(folder).items()}
    out = []
    for cell, kept in by_cell.items():
        if not kept:
            continue
        rows = [r for _, own, _ in kept for r in own]
        ceiling = [r for _, _, ref in kept for r in ref]
        items = [item for item, own, _ in kept for _ in own]
        summary = {"cell": cell, "items": len(kept), "questions": len(rows)}
        for metric in PAIRED:  # where every row on both sides has it
            a, b = [r.get(metric) for r in rows], [r.get(metric) for r in ceiling]
            if rows and None not in a and None not in b:
                summary[metric] = paired_bootstrap(a, b, clusters=items).to_dict()
        out.append(summary)
    return out


def cells(folder: Path) -> list[dict]:
    """Each unfinished cell in `folder`/partial.jsonl as a results row would name it — the
    fields of its key (`Cell.from_key`), "unfinished": True, "items" reached so far and
    "per_question" (each row with its item), items in the order kept, and "model" where the
    entries name it — for `kvctl bench pair`. No ceiling is needed; entries from before the
    bench named their cell are left out."""
    out = []
    for key, entries in _by_cell(folder).items():
        try:
            fields = asdict(Cell.from_key(key))
        except ValueError:
            continue
        rows = [{"item": e["item"], **r} for e in entries for r in e["rows"]]
        out.append({"key": key, **fields,
                    "model": next((e["model"] for e in entries if e.get("model")), None),
                    "items": len(entries), "questions": len(rows), "unfinished": True,
                    "per_question": rows})
    return out


def _by_cell(folder: Path) -> dict[str, list[dict]]:
    """`folder`/partial.jsonl's entries by the cell they name (one an item), cells in the
    order first kept; entries from before the bench named their cell are left out."""
    by_cell: dict[str, list[dict]] = defaultdict(list)
    for e in read_entries(folder / "partial.jsonl").values():
        if "cell" in e:
            by_cell[e["cell"]].append(e)
    return by_cell


def _fmt(paired: dict | None, what: str) -> str:
    if not paired:
        return "—"
    low, high = paired["diff"][1:]
    span = "" if low is None else f" [{low:+.3f}, {high:+.3f}]"
    return f"{paired[what]:.3f}" if what != "diff" else f"{paired['diff'][0]:+.3f}{span}"


def table(folder: Path) -> list[str]:
    """Markdown lines: the unfinished cells so far (none: no lines)."""
    so_far = unfinished(folder)
    if not so_far:
        return []
    lines = ["## Unfinished cells, so far (OUT/partial.jsonl)", "",
             "Each cell over the first items it reached, against its ceiling (full KV in "
             "fp16 for eviction, recompute for reuse) on the same questions; 95 % paired "
             "bootstrap intervals over items. The finished cell's row supersedes these.", "",
             "| cell | items | questions | score | ceiling | score − ceiling | F1 "
             "| F1 − ceiling |",
             "|---|---|---|---|---|---|---|---|"]
    for c in so_far:
        score, f1 = c.get("score"), c.get("f1")
        lines.append(f"| {c['cell']} | {c['items']} | {c['questions']} | {_fmt(score, 'mean')} "
                     f"| {_fmt(score, 'ceiling')} | {_fmt(score, 'diff')} | {_fmt(f1, 'mean')} "
                     f"| {_fmt(f1, 'diff')} |")
    return lines + [""]
