"""The method × budget runner: a grid of cells, JSON lines out, resumable.

Two suites run the services' own code in-process (no method is re-implemented here):
- `reuse` (RAG path): each document is prefilled alone and packed exactly as the cloud's
  prefill actor does (`PrefillEngine.encode`), read back as the edge does, composed by the edge
  engine, answered with a registered reuse strategy. `budget` is the recompute ratio of the
  strategies that have a `ratio` option; a cell's `options` hold its other swept options
  ("boundary=0.1"), so one strategy is measured at several settings.
- `evict` (KBQA path): the whole context is prefilled once, compressed once with an eviction
  method at `budget` (query-agnostic), and every question is asked against that one
  compressed cache (realigned after the chat prefix), the answers' KV discarded in between.
  `kvpress-*` methods are kvpress's presses on the same token ids (external references).
Every cell also records its ceiling measured in the same run (recompute / full KV on the same
items) so ratios never mix runs. A cell's key names everything that changes its numbers, the
packs' codec included, so a rerun skips exactly the cells already measured.
"""
from __future__ import annotations

import itertools
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

from kvedge.bench.real import HOTPOT_KB
from kvedge.common.pack.codecs import DEFAULT_CODEC

KVPRESS = "kvpress-"  # prefix of kvpress's presses (evict suite; kvedge.bench.kvpress_ref)
UNBUDGETED = ("full", f"{KVPRESS}full")  # ceilings: one cell each, budget 1
LEGACY_CODEC = "fp16"  # the packs' codec of rows written before the key held it
REFERENCE_CODEC = "fp16"  # full KV uncompressed: eviction's base, the yardstick of "of full KV"


@dataclass(frozen=True)
class Cell:
    suite: str      # reuse | evict
    task: str
    length: int     # documents per prompt (reuse) or context tokens (evict)
    method: str     # strategy or eviction method
    budget: float   # recompute ratio (reuse) or fraction of KV kept (evict)
    items: int
    seed: int = 0
    codec: str = DEFAULT_CODEC  # the documents' packs, as shipped to the edge
    options: str = ""           # the strategy's other options, "name=value,..." (reuse)
    per_prompt: int | None = None  # questions per fact prompt (None: the dataset's
    #                                QUESTIONS_PER_PROMPT) or per squad-evict article
    #                                (None: all); other tasks: always None
    kb_items: int = 0  # hotpot-kb: the KB holds this many questions' paragraphs, more than
    #                    `items` (0: the KB of its own items)

    @property
    def key(self) -> str:
        key = (f"{self.suite}/{self.task}/{self.length}/{self.method}/{self.budget:g}/"
               f"{self.items}/{self.seed}/{self.codec}")
        if self.per_prompt:  # other prompts, other questions: other cells
            key = f"{key}/{self.per_prompt}-per-prompt"
        if self.kb_items:  # a larger KB retrieves other paragraphs: another cell
            key = f"{key}/kb{self.kb_items}"
        return f"{key}/{self.options}" if self.options else key  # older keys stay valid

    @classmethod
    def from_key(cls, key: str) -> "Cell":
        """The cell a `key` names (its inverse; `ValueError` for a text that is not one)."""
        parts = key.split("/")
        if len(parts) < 8:
            raise ValueError(f"{key!r} is not a cell key (suite/task/length/method/budget/"
                             f"items/seed/codec[/...])")
        suite, task, length, method, budget, items, seed, codec, *rest = parts
        per_prompt, kb_items = None, 0
        if rest and rest[0].endswith("-per-prompt"):
            per_prompt = int(rest.pop(0).removesuffix("-per-prompt"))
        if rest and rest[0].startswith("kb") and rest[0][2:].isdigit():
            kb_items = int(rest.pop(0)[2:])
        return cls(suite, task, int(length), method, float(budget), int(items), int(seed),
                   codec, "/".join(rest), per_prompt, kb_items)

    def option_values(self) -> dict[str, str]:
        """The cell's other options, name → value (as a command line gives them)."""
        return dict(kv.split("=", 1) for kv in self.options.split(",") if kv)


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
    also: list[Preset] = field(default_factory=list)  # grids whose lengths differ (demo-KB
    #                                                   documents vs generated tokens)
    sweeps: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # per strategy:
    #   option → values, crossed; its "ratio" list replaces `ratios` for that strategy
    per_prompt: int | None = None  # questions per fact prompt (None: QUESTIONS_PER_PROMPT)
    kb_items: int = 0  # hotpot-kb: a KB of this many questions' paragraphs (Cell.kb_items)

    def cells(self, *codecs: str) -> list[Cell]:
        """Every cell, each setting crossed with every codec (default: DEFAULT_CODEC) —
        kvpress's presses once, at the first: they never read our packs."""
        codecs = codecs or (DEFAULT_CODEC,)
        cells = [c for p in self.also for c in replace(p, kb_items=p.kb_items or self.kb_items)
                 .cells(*codecs)]
        for task, length in itertools.product(self.reuse_tasks, self.reuse_lengths):
            per_prompt = questions_per_context(task, self.per_prompt)
            kb_items = self.kb_items if task == HOTPOT_KB and self.kb_items > self.items else 0
            for method, codec in itertools.product(self.strategies, codecs):
                cells += [Cell("reuse", task, length, method, r, self.items, codec=codec,
                               options=o, per_prompt=per_prompt, kb_items=kb_items)
                          for r, o in settings(method, self.ratios, self.sweeps.get(method, {}))]
        for task, length, method in itertools.product(self.evict_tasks, self.evict_lengths,
                                                      self.methods):
            budgets = [1.0] if method in UNBUDGETED else self.budgets
            per_prompt = questions_per_context(task, self.per_prompt)
            for codec in codecs[:1] if method.startswith(KVPRESS) else codecs:
                cells += [Cell("evict", task, length, method, b, self.items, codec=codec,
                               per_prompt=per_prompt)
                          for b in budgets]
        return list(dict.fromkeys(cells))


def questions_per_context(task: str, per_prompt: int | None) -> int | None:
    """A cell's `per_prompt` (questions asked of one context): None unless the task is fact
    prompts asked other than the default QUESTIONS_PER_PROMPT at a time, or squad-evict's
    articles asked that many questions each, not all (so default cells keep their keys)."""
    from kvedge.bench.datasets import FACTS, QUESTIONS_PER_PROMPT
    from kvedge.bench.real import SQUAD_EVICT

    if task == SQUAD_EVICT:
        return per_prompt
    return None if task != FACTS or per_prompt == QUESTIONS_PER_PROMPT else per_prompt


def strategies_with_ratio() -> set[str]:
    """Reuse strategies whose `ratio` option the grid's ratios sweep (A3, CacheBlend, ...)."""
    from kvedge.common.registry import options_of
    from kvedge.edge.strategies import STRATEGIES

    return {name for name, cls in STRATEGIES.items()
            if any(f.name == "ratio" for f in options_of(cls))}


def strategy_options(cell: Cell) -> dict:
    """The cell's strategy options: its ratio (where the strategy has one) and the others."""
    ratio = {"ratio": cell.budget} if cell.method in strategies_with_ratio() else {}
    return {**ratio, **cell.option_values()}


def reuse_strategy(cell: Cell):
    """The cell's strategy setting."""
    from kvedge.edge.strategies import get_strategy

    return get_strategy(cell.method, strategy_options(cell))


def settings(strategy: str, ratios: list[float],
             sweep: dict[str, list]) -> list[tuple[float, str]]:
    """(ratio, other options) of each setting of `strategy` a grid runs: `ratios` — or the
    sweep's own "ratio" list — if it has a ratio option (else 1.0), crossed with every other
    swept option's values. A swept option the strategy lacks is an InvalidOption."""
    from kvedge.common.errors import InvalidOption
    from kvedge.common.registry import options_of
    from kvedge.edge.strategies import STRATEGIES

    names = {f.name for f in options_of(STRATEGIES[strategy])}
    if set(sweep) - names:
        raise InvalidOption(f"strategy {strategy!r} has no option "
                            f"{', '.join(sorted(set(sweep) - names))}; it has "
                            f"{', '.join(sorted(names)) or 'none'}")
    rs = list(sweep.get("ratio", ratios)) if "ratio" in names else [1.0]
    rest = sorted((k, v) for k, v in sweep.items() if k != "ratio")
    combos = itertools.product(*[[f"{k}={x:g}" if isinstance(x, float) else f"{k}={x}"
                                  for x in values] for k, values in rest])
    return [(r, ",".join(c)) for c in combos for r in rs]


def codec_of(r: dict) -> str:
    """A results row's pack codec; rows from before the codec joined the key get theirs."""
    return r.get("codec", LEGACY_CODEC)


def fewer_bytes(r: dict) -> float | None:
    """× fewer bytes than the context's full KV in fp16, as the cell ships it."""
    return r["fp16_bytes"] / r["shipped_bytes"] if r.get("fp16_bytes") and r.get(
        "shipped_bytes") else None


def row_key(row: dict) -> str:
    """A results row's cell key; rows from before the codec joined the key get theirs."""
    return row["key"] if "codec" in row else f"{row['key']}/{LEGACY_CODEC}"


def done_keys(path: Path) -> set[str]:
    if not path.exists():
        return set()
    return {row_key(json.loads(line)) for line in path.read_text().splitlines()
            if line.strip()}


def todo_cells(preset: Preset, out: Path,
               codecs: Sequence[str] = (DEFAULT_CODEC,)) -> list[Cell]:
    """The preset's cells (each setting once per codec of its packs) not yet in `out`."""
    finished = done_keys(out)
    return [c for c in preset.cells(*codecs) if c.key not in finished]


def run_grid(preset: Preset, out: Path, run_cell: Callable[[Cell], dict],
             progress: Callable[[Iterator], Iterator] = iter,
             codecs: Sequence[str] = (DEFAULT_CODEC,)) -> list[dict]:
    """Run every cell not yet in `out` (JSON lines), each setting once per codec of its
    packs; returns the new rows."""
    out.parent.mkdir(parents=True, exist_ok=True)
    todo = todo_cells(preset, out, codecs)
    rows = []
    for cell in progress(todo):
        start = time.perf_counter()
        row = {"key": cell.key, **asdict(cell), "model": preset.model, **run_cell(cell),
               "cell_s": time.perf_counter() - start}
        with open(out, "a") as f:  # one line per finished cell: a rerun resumes after it
            f.write(json.dumps(row) + "\n")
        rows.append(row)
    return rows
