"""Two cells paired question by question, across runs: `kvctl bench pair A B`.

A run's report pairs each cell with its own ceiling. The comparisons that decide a default
are often between cells a report never puts side by side: a strategy against another
strategy, a cell over one codec's upload against the same strategy over another's (two
runs, two OUT folders), a new cell against a reference store's (`bench/reference/`). This
pairs any two cells by the paired bootstrap over their rows' per-question scores
(`kvedge.bench.bootstrap`), so such a figure comes from a command, not from a script.

A cell is named `RESULTS#FIELD=VALUE,...`: RESULTS a results.jsonl, or the OUT folder that
holds one; each filter is matched against the rows' fields (method, codec, options, budget,
task, length, model, ...) — the value equals the field's text, or, for `codec`, names its
family (`codec=rdq` matches `rdq:calibrated=true,...`); `FIELD~=TEXT` asks only that the
field contain TEXT (`codec~=key_layers=5545`: a codec spec has commas of its own, so it
cannot be given whole). Exactly one row must match (`CellNotFound` names the candidates
otherwise).

Questions are paired by identity, not by position: a per-question row's `item` and its rank
among that item's questions. hotpot-kb's items name the KB (`hotpot-kb/<KB>/<HotpotQA
index>/<top-k>`), and the KB's name digests its codec, so the same question over two uploads
has two item keys: there the KB's name is left out. Only questions both cells asked are
paired (their count is printed). Where items hold several questions (squad-evict's
articles) contexts are resampled whole (`contexts_of`), as the report does.

An OUT folder's unfinished cells (its `partial.jsonl`: a `--by-item` run, a run cut off)
are cells too, over the items measured so far (`unfinished.cells`); a finished cell's row
supersedes its partial rows.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from kvedge.bench import unfinished
from kvedge.bench.bootstrap import Interval, contexts_of, paired_bootstrap
from kvedge.bench.hotpot_kb import parse_item_key
from kvedge.bench.qa_report import _label
from kvedge.bench.real import HOTPOT_KB
from kvedge.bench.report import load
from kvedge.bench.runner import codec_of, row_key

METRICS = ("f1", "contain", "em")


class CellNotFound(ValueError):
    """A cell reference matched no row, or more than one."""


@dataclass(frozen=True)
class Comparison:
    metric: str
    questions: int
    mean_a: float
    mean_b: float
    diff: Interval          # A − B, 95 % paired interval
    ratio: Interval | None  # A / B (None where B scored 0)
    gained: int             # questions A scores higher on
    lost: int               # questions B scores higher on


def results_path(path: str | Path) -> Path:
    path = Path(path)
    return path / "results.jsonl" if path.is_dir() else path


def _matches(row: dict, field: str, value: str) -> bool:
    contains = field.endswith("~")
    field = field.rstrip("~").strip()
    got = codec_of(row) if field == "codec" else row.get(field)
    got = "" if got is None else str(got)
    if contains:
        return value in got
    return got == value or (field == "codec" and got.split(":")[0] == value)


def all_cells(results: Path) -> list[dict]:
    """The rows of `results` and, after them, the unfinished cells of its folder's
    `partial.jsonl` that no row supersedes (a finished cell's row is its record)."""
    rows = load(results) if results.is_file() else []
    finished = {row_key(r) for r in rows if "key" in r}  # supersede their partial rows
    return rows + [c for c in unfinished.cells(results.parent) if c["key"] not in finished]


def load_cell(ref: str) -> dict:
    """The one row of `RESULTS#FIELD=VALUE,...` (see the module docstring)."""
    path, _, filters = ref.partition("#")
    results = results_path(path)
    partial = results.parent / "partial.jsonl"
    if not results.is_file() and not partial.is_file():
        raise CellNotFound(f"{ref}: no results file at {results} (nor {partial.name})")
    wanted = []
    for part in filter(None, filters.split(",")):
        field, eq, value = part.partition("=")
        if not eq:
            raise CellNotFound(f"{ref}: filter {part!r} is not FIELD=VALUE")
        wanted.append((field.strip(), value.strip()))
    rows = all_cells(results)
    found = [r for r in rows if all(_matches(r, f, v) for f, v in wanted)]
    if len(found) != 1:
        names = "; ".join(_name(r) for r in (found or rows))
        raise CellNotFound(f"{ref}: {len(found)} cells match (of {len(rows)}): {names}")
    if not found[0].get("per_question"):
        raise CellNotFound(f"{ref}: the cell keeps no per-question scores")
    return found[0]


def _name(row: dict) -> str:
    so_far = f" (unfinished: {row['items']} items so far)" if row.get("unfinished") else ""
    return f"{_label(row)} {codec_of(row)}{so_far}"


def question_keys(per_question: list[dict]) -> list[tuple]:
    """Each question's identity: its item (hotpot-kb's without the KB's name) and its rank
    among that item's questions."""
    seen: Counter = Counter()
    out = []
    for q in per_question:
        item = str(q.get("item"))
        kb = parse_item_key(item)
        if kb is not None:
            _, index, top_k = kb
            item = f"{HOTPOT_KB}/{index}/{top_k}"
        out.append((item, seen[item]))
        seen[item] += 1
    return out


def pair(a: dict, b: dict, metrics=METRICS) -> tuple[list[Comparison], int, int]:
    """(A − B for each metric both cells scored, questions paired, of them with the same
    answer text)."""
    qa = dict(zip(question_keys(a["per_question"]), a["per_question"]))
    qb = dict(zip(question_keys(b["per_question"]), b["per_question"]))
    keys = sorted(k for k in qa if k in qb)  # the draws do not depend on the rows' order
    if not keys:
        raise CellNotFound(f"{_name(a)} and {_name(b)} asked no question in common")
    rows_a, rows_b = [qa[k] for k in keys], [qb[k] for k in keys]
    clusters = contexts_of(rows_a)
    if clusters is not None and len(set(clusters)) == len(clusters):
        clusters = None  # one question per context: the question bootstrap, the same draws
    out = []
    for metric in metrics:
        sa, sb = [r.get(metric) for r in rows_a], [r.get(metric) for r in rows_b]
        if None in sa or None in sb:
            continue
        p = paired_bootstrap(sa, sb, clusters=clusters)
        out.append(Comparison(metric, len(keys), p.mean, p.ceiling, p.diff, p.ratio,
                              sum(x > y for x, y in zip(sa, sb)),
                              sum(x < y for x, y in zip(sa, sb))))
    same = sum(x.get("answer") is not None and x.get("answer") == y.get("answer")
               for x, y in zip(rows_a, rows_b))
    return out, len(keys), same


def _interval(i: Interval | None, spec: str) -> str:
    if i is None:
        return "—"
    ends = "" if i.low is None else f" [{i.low:{spec}}, {i.high:{spec}}]"
    return f"{i.value:{spec}}{ends}"


def describe(a: dict, b: dict, metrics=METRICS) -> list[str]:
    """The comparison as text lines (what `kvctl bench pair` prints)."""
    comparisons, n, same = pair(a, b, metrics)
    lines = [f"A: {_name(a)} ({a.get('task')}, {a.get('model') or '?'}, {len(a['per_question'])} "
             f"questions)",
             f"B: {_name(b)} ({b.get('task')}, {b.get('model') or '?'}, {len(b['per_question'])} "
             f"questions)",
             f"paired: {n} questions, {same} with the same answer text",
             "| metric | A | B | A − B [95 % CI] | A / B [95 % CI] | A higher / B higher |",
             "|---|---|---|---|---|---|"]
    for c in comparisons:
        lines.append(f"| {c.metric} | {c.mean_a:.4f} | {c.mean_b:.4f} | "
                     f"{_interval(c.diff, '+.4f')} | {_interval(c.ratio, '.3f')} | "
                     f"{c.gained} / {c.lost} |")
    return lines
