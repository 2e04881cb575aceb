"""The method × budget runner: a grid of cells, JSON lines out, resumable.

Two suites run the services' own code in-process (no method is re-implemented here):
- `reuse` (RAG path): each document is prefilled alone and packed exactly as the cloud's
  prefill actor does (`PrefillEngine.encode`), read back as the edge does, composed by the edge
  engine, answered with a reuse strategy (recompute | full-reuse | pie | a3 | cacheblend |
  epic). `budget` is the recompute ratio of the selective strategies.
- `evict` (KBQA path): the whole context is prefilled once, compressed once with an eviction
  method at `budget` (query-agnostic), and every question is asked against that one
  compressed cache (realigned after the chat prefix), the answers' KV discarded in between.
  `kvpress-*` methods are kvpress's presses on the same token ids (external references).
Every cell also records its ceiling measured in the same run (recompute / full KV on the same
items) so ratios never mix runs.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator


KVPRESS = "kvpress-"  # prefix of kvpress's presses (evict suite; kvedge.bench.kvpress_ref)
UNBUDGETED = ("full", f"{KVPRESS}full")  # ceilings: one cell each, budget 1


@dataclass(frozen=True)
class Cell:
    suite: str      # reuse | evict
    task: str
    length: int     # documents per prompt (reuse) or context tokens (evict)
    method: str     # strategy or eviction method
    budget: float   # recompute ratio (reuse) or fraction of KV kept (evict)
    items: int
    seed: int = 0

    @property
    def key(self) -> str:
        return (f"{self.suite}/{self.task}/{self.length}/{self.method}/{self.budget:g}/"
                f"{self.items}/{self.seed}")


@dataclass
class Preset:
    model: str
    reuse_tasks: list[str]
    reuse_lengths: list[int]
    strategies: list[str]
    ratios: list[float]
    evict_tasks: list[str]
    evict_lengths: list[int]
    methods: list[str]
    budgets: list[float]
    items: int
    max_new_tokens: int = 24
    codec: str = "fp16"
    extra: dict = field(default_factory=dict)
    also: list[Preset] = field(default_factory=list)  # grids whose lengths differ (demo-KB
    #                                                   documents vs generated tokens)

    def cells(self) -> list[Cell]:
        cells = [c for p in self.also for c in p.cells()]
        for task in self.reuse_tasks:
            for length in self.reuse_lengths:
                for method in self.strategies:
                    ratios = self.ratios if method in ("a3", "cacheblend") else [1.0]
                    cells += [Cell("reuse", task, length, method, r, self.items) for r in ratios]
        for task in self.evict_tasks:
            for length in self.evict_lengths:
                for method in self.methods:
                    budgets = [1.0] if method in UNBUDGETED else self.budgets
                    cells += [Cell("evict", task, length, method, b, self.items) for b in budgets]
        return list(dict.fromkeys(cells))


def done_keys(path: Path) -> set[str]:
    if not path.exists():
        return set()
    return {json.loads(line)["key"] for line in path.read_text().splitlines() if line.strip()}


def run_grid(preset: Preset, out: Path, run_cell: Callable[[Cell], dict],
             progress: Callable[[Iterator], Iterator] = iter) -> list[dict]:
    """Run every cell not yet in `out` (JSON lines); returns the new rows."""
    out.parent.mkdir(parents=True, exist_ok=True)
    finished = done_keys(out)
    todo = [c for c in preset.cells() if c.key not in finished]
    rows = []
    for cell in progress(todo):
        start = time.perf_counter()
        row = {"key": cell.key, **asdict(cell), "model": preset.model, **run_cell(cell),
               "cell_s": time.perf_counter() - start}
        with open(out, "a") as f:  # one line per finished cell: a rerun resumes after it
            f.write(json.dumps(row) + "\n")
        rows.append(row)
    return rows
