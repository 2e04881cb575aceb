"""Needles found by where they sat: a ruler-niah run's cells, and the ceiling they are judged
against, counted by the needle's depth.

`python -m kvedge.bench.niah_depth OUT [OUT ...] [--bins 5]` reads each OUT folder's finished
cells (`results.jsonl`) and unfinished ones (`partial.jsonl`, as `kvctl bench pair` reads
them: `pair.all_cells`, with the full-KV ceiling their entries name in `ceilings.jsonl`) and prints, per cell, the needles found (containment:
RULER's string_match_part) of those asked, in `--bins` equal bands of depth from the start of
the context (0 %) to its end (100 %). A budget's losses can then be read as where they fall:
an eviction that drops mid-context needles, or a model that loses them before any eviction
("lost in the middle", Liu et al., TACL 2024).

Depth is the item's seeded one (`kvedge.bench.tasks.niah`: the "depths" stream of the
item's seed, drawn before any token is counted), not the achieved one: the generator places
the needle at the nearest sentence boundary of a haystack fitted to the model's tokenizer,
so the achieved depth differs from the seeded one by at most a sentence (under 1 % of a
4K context: `tests/test_bench_niah_depth.py`), and reading the seeded one needs neither
the model's tokenizer nor the essays. Items are named `ruler-niah/<seed>/<length>`.
Torch-free: it reads rows only.
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from kvedge.bench.ceilings import read_entries
from kvedge.bench.pair import all_cells
from kvedge.bench.qa_report import _label
from kvedge.bench.tasks import haystack as hay
from kvedge.bench.tasks.niah import FAMILY
from kvedge.bench.tasks.values import make_rng

CEILING = "full KV, fp16 (the ceiling)"


def seeded_depth(item: str) -> float:
    """The needle's seeded depth (a fraction of the haystack) of a ruler-niah item key."""
    task, seed, _length = item.split("/")
    if task != "ruler-niah":
        raise ValueError(f"{item!r} is not a ruler-niah item")
    return hay.seeded_depths(make_rng(FAMILY, int(seed), "depths"), 1, None)[0]


def band(depth: float, bins: int) -> int:
    return min(int(depth * bins), bins - 1)


def cells(folder: Path, metric: str = "contain") -> dict[str, dict[str, float]]:
    """{cell label: {item: score}} for every cell of `folder`, and the full-KV ceiling that
    its unfinished cells' entries name (finished runs keep it as their `full` rows)."""
    out: dict[str, dict[str, float]] = {}
    for row in all_cells(folder / "results.jsonl"):
        scores = {q["item"]: q[metric] for q in row.get("per_question") or []
                  if str(q.get("item", "")).startswith("ruler-niah/") and metric in q}
        if scores:
            so_far = " (unfinished)" if row.get("unfinished") else ""
            out[f"{_label(row)} {row.get('codec', '')}{so_far}".strip()] = scores
    partial = folder / "partial.jsonl"
    if partial.is_file():
        refs = read_entries(folder / "ceilings.jsonl")
        ceiling = {}
        for entry in read_entries(partial).values():
            ref = refs.get(entry.get("ceiling"))
            if ref and entry["item"].startswith("ruler-niah/") and metric in ref["rows"][0]:
                ceiling[entry["item"]] = ref["rows"][0][metric]
        if ceiling:
            out[CEILING] = ceiling
    return out


def by_depth(scores: dict[str, float], bins: int) -> list[tuple[float, int]]:
    """(score summed, items) in each band of depth."""
    found, asked = defaultdict(float), defaultdict(int)
    for item, score in scores.items():
        b = band(seeded_depth(item), bins)
        found[b] += score
        asked[b] += 1
    return [(found[b], asked[b]) for b in range(bins)]


def table(folder: Path, bins: int = 5, metric: str = "contain") -> list[str]:
    heads = [f"{100 * b // bins}–{100 * (b + 1) // bins} %" for b in range(bins)]
    lines = [f"{folder}: needles found ({metric}) of those asked, by seeded depth",
             "", "| cell | all | " + " | ".join(heads) + " |",
             "|---|---|" + "---|" * bins]
    for label, scores in cells(folder, metric).items():
        bands = by_depth(scores, bins)
        total = f"{sum(f for f, _ in bands):g}/{len(scores)}"
        lines.append(f"| {label} | {total} | "
                     + " | ".join(f"{f:g}/{n}" for f, n in bands) + " |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvedge.bench.niah_depth",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="+", type=Path, help="a ruler-niah run's OUT folder")
    parser.add_argument("--bins", type=int, default=5, help="bands of depth [default: 5]")
    parser.add_argument("--metric", default="contain", help="per-question score [contain]")
    args = parser.parse_args(argv)
    if args.bins < 1:
        parser.error("--bins must be at least 1")
    for folder in args.out:
        if not folder.is_dir():
            parser.error(f"{folder}: not a folder")
        print("\n".join(table(folder, args.bins, args.metric)) + "\n")


if __name__ == "__main__":
    main()
