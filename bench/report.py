"""Results (JSON lines) → markdown tables and PNG plots.

"acc" is each question's own metric (RULER's string_match_all where every reference must be
returned, string_match_part where references are aliases), averaged over the cell's questions;
"of ceiling" divides it by the same-run ceiling's (recompute for reuse, full KV for eviction).
Cells that did not measure something (kvpress's per-token times and KV bytes) show "—".
An eviction cell (method × budget × codec) has two ceilings: "of full KV" divides by full KV
uncompressed (fp16 packs) on the same questions — the yardstick a target like "≥ 92 % of
full-KV accuracy" means —, "of full, same codec" by full KV in the cell's own codec (what
eviction alone costs); "× vs fp16" is the context's full KV in fp16 (tokens × layers × KV
heads × head dim × K,V × 2 bytes) over the bytes the cell ships (its pack). kvpress's presses
are divided by kvpress's own full cache on the same items (`kvpress-full`, fp32 KV through
transformers) when the results hold it, ours by ours: each pipeline against its own ceiling.
Eviction rows also get the bytes-vs-accuracy frontier (`bytes_frontier_plot`, which
`kvedge.bench.codec_frontier` puts into docs/codecs.md); real-QA eviction cells also get it
in F1 over fp16 full KV's F1 on the same questions (`f1_of_full`: a table and
f1_bytes_frontier.png) — as the cell recorded it beside its own, else the fp16 full-KV cell's.
Reuse rows get a frontier per task × length — accuracy and median TTFT as fractions of
recompute's, one point per strategy setting — and, where a cell timed its first token by
phase, the breakdown (`kvedge.bench.ttft`). Fact-prompt cells asked other than the default
questions per prompt are their own task ("multidoc-facts ×4"). Real-data cells (HotpotQA)
also get EM / F1 / containment tables with paired bootstrap intervals (`kvedge.bench.qa_report`).
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

from kvedge.bench import noninferiority, unfinished
from kvedge.bench.datasets import DATASETS
from kvedge.bench.qa_report import qa_tables
from kvedge.bench.real import HOTPOT_KB
from kvedge.bench.runner import KVPRESS, REFERENCE_CODEC, codec_of, fewer_bytes

TARGET = (32.0, 0.92)  # ≥ 32× fewer bytes than fp16 KV at ≥ 92 % of full KV's accuracy


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def largest_runs(rows: list[dict]) -> list[dict]:
    """Each cell's largest run: rows that differ only in items are one setting asked on a
    prefix of one seeded question order (a 20-item run's questions are a 100-item run's first
    20), so pooling them would count those questions twice and a frontier would join them as
    if they were settings. Keeps the row with the most items; of equals, the later one.
    hotpot-kb's rows are one cell only over one KB (`kb_items`, else their own items'
    paragraphs): another KB retrieves other paragraphs."""
    best: dict[tuple, tuple[int, int]] = {}
    for i, r in enumerate(rows):
        cell = (r["suite"], r["task"], r["length"], r["method"], r["budget"], r["seed"],
                codec_of(r), r.get("options") or "", r.get("per_prompt"), r.get("model"),
                (r.get("kb_items") or r["items"]) if r["task"] == HOTPOT_KB else None)
        if cell not in best or r["items"] >= best[cell][0]:
            best[cell] = (r["items"], i)
    keep = {i for _, i in best.values()}
    return [r for i, r in enumerate(rows) if i in keep]


def _fmt(x, spec=".2f", scale=1.0):
    return "—" if x is None else format(x * scale, spec)


def acc(r: dict) -> tuple[float | None, float | None]:
    """(accuracy, of ceiling) by the questions' own metric; rows from before it was recorded
    fall back to "any"."""
    if r.get("score") is not None:
        return r["score"], r.get("score_ratio")
    return r.get("any"), r.get("any_ratio")


def full_kv_acc(r: dict) -> float | None:
    """Full KV uncompressed's accuracy on the cell's questions: recorded beside the cell, or
    (rows from before it was) the cell's own ceiling where that was fp16 full KV."""
    if r.get("full_kv_score") is not None:
        return r["full_kv_score"]
    return _ceiling_acc(r) if codec_of(r) == REFERENCE_CODEC else None


def of_full_kv(r: dict) -> float | None:
    a, base = acc(r)[0], full_kv_acc(r)
    return a / base if a is not None and base else None


def _compress_ratio(r: dict) -> float | None:
    return r["compress_s"] / r["prefill_s"] if r.get("compress_s") and r.get("prefill_s") else None


def task_label(r: dict) -> str:
    """The task, with its questions per prompt where a run set them ("multidoc-facts ×4")."""
    return f"{r['task']} ×{r['per_prompt']}" if r.get("per_prompt") else r["task"]


def name(r: dict) -> str:
    """The method with its swept options ("sparsex[boundary=0.1]")."""
    return f"{r['method']}[{r['options']}]" if r.get("options") else r["method"]


def setting(r: dict) -> str:
    """One label per strategy setting: name and ratio ("a3 @0.15", "pie")."""
    return name(r) + (f" @{r['budget']:g}" if r["budget"] != 1 else "")


def _table(names: tuple[str, str], columns: list[str], rows: list[dict], budget_order: int,
           rest) -> list[str]:
    """Rows sorted by task, length, method, codec and budget (ascending if budget_order is
    1, descending if -1): the columns every table shares (the method and budget columns
    named `names`, the codec, the accuracy), then `rest(r)`'s cells, then q."""
    head = ["task", "length", *names, "codec", "acc", *columns, "q"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(rows, key=lambda r: (task_label(r), r["length"], name(r), codec_of(r),
                                         budget_order * r["budget"])):
        cells = [task_label(r), r["length"], name(r), f"{r['budget']:g}", codec_of(r),
                 _fmt(acc(r)[0]), *rest(r), r["questions"]]
        out.append("| " + " | ".join(map(str, cells)) + " |")
    return out


def reuse_table(rows: list[dict]) -> list[str]:
    columns = ["of ceiling", "TTFT s", "TTFT / recompute", "TPOT ms", "answer s",
               "answer / recompute", "KV MB", "KV / full", "sequence ratio", "recomputed tok"]
    return _table(("strategy", "ratio"), columns, rows, 1, lambda r: [
        _fmt(acc(r)[1]), _fmt(r.get("first_token_s"), ".3f"), _fmt(r.get("first_token_s_ratio")),
        _fmt(r.get("tpot_s"), ".0f", 1e3), _fmt(r.get("answer_s")),
        _fmt(r.get("answer_s_ratio")), _fmt(r.get("kv_bytes"), ".2f", 1e-6),
        _fmt(r.get("kv_bytes_ratio")), _fmt(r.get("sequence_ratio")),
        _fmt(r.get("recomputed"), ".0f")])


def evict_table(rows: list[dict]) -> list[str]:
    columns = ["of full KV", "of full, same codec", "× vs fp16", "KV MB", "KV / full",
               "shipped MB", "compress s", "compress / prefill"]
    return _table(("method", "budget"), columns, rows, -1, lambda r: [
        _fmt(of_full_kv(r)), _fmt(acc(r)[1]), _fmt(fewer_bytes(r), ".1f"),
        _fmt(r.get("kv_bytes"), ".2f", 1e-6), _fmt(r.get("kv_bytes_ratio")),
        _fmt(r.get("shipped_bytes"), ".2f", 1e-6), _fmt(r.get("compress_s")),
        _fmt(_compress_ratio(r), ".1f")])


def rebase_kvpress(rows: list[dict]) -> list[dict]:
    """kvpress-* rows measured against kvpress-full on the same items, where present."""
    own = {(r["task"], r["length"], r["items"], r["seed"]): r for r in rows
           if r["method"] == f"{KVPRESS}full"}
    out = []
    for r in rows:
        base = own.get((r["task"], r["length"], r["items"], r["seed"]))
        if r["method"].startswith(KVPRESS) and base and base.get("score") is not None:
            b = base["score"]
            ratio = r["score"] / b if b else None
            r = {**r, "ceiling_score": b, "score_ratio": ratio, "full_kv_score": b,
                 "full_kv_ratio": ratio}
        out.append(r)
    return out


def _ceiling_acc(r: dict) -> float | None:
    return r.get("ceiling_score") if r.get("score") is not None else r.get("ceiling_any")


class Pooled(NamedTuple):
    """A (method, budget, codec)'s cells pooled over every question: accuracy, the same pooled
    over their ceilings' (None where a cell has none), questions, task × length pairs, and
    × fewer bytes than fp16 full KV (None where a cell did not measure it)."""

    acc: float
    of_ceiling: float | None
    questions: int
    groups: int
    fewer_bytes: float | None


def _own_acc(r: dict) -> float | None:
    return acc(r)[0]


def summary(rows: list[dict], ceiling_acc=_ceiling_acc,
            accuracy=_own_acc) -> dict[tuple[str, float, str], Pooled]:
    """(method, budget, codec) → Pooled; a cell's accuracy is `accuracy(row)` (its questions'
    own metric by default) and its ceiling's `ceiling_acc(row)` (the same run's by default),
    so a method run on fewer tasks is compared on those."""
    cells = defaultdict(list)
    for r in rows:
        if accuracy(r) is not None and r["questions"]:
            cells[(name(r), r["budget"], codec_of(r))].append(r)
    return {key: _pool(group, ceiling_acc, accuracy) for key, group in cells.items()}


def _pool(rows: list[dict], ceiling_acc, accuracy=_own_acc) -> Pooled:
    def total(value) -> float | None:
        values = [value(r) for r in rows]
        return None if None in values else sum(v * r["questions"] for v, r in zip(values, rows))

    n = sum(r["questions"] for r in rows)
    a, base = total(accuracy), total(ceiling_acc)
    fp16, shipped = total(lambda r: r.get("fp16_bytes")), total(lambda r: r.get("shipped_bytes"))
    return Pooled(a / n, a / base if base else None, n,
                  len({(task_label(r), r["length"]) for r in rows}),
                  fp16 / shipped if fp16 and shipped else None)


def summary_table(rows: list[dict], what: str, ceiling: str, ceiling_acc=_ceiling_acc,
                  with_bytes: bool = False) -> list[str]:
    extra = ["× vs fp16"] if with_bytes else []
    head = [what, "budget", "codec", "acc (pooled)", f"of {ceiling}", *extra, "questions",
            "task × length"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (method, budget, codec), p in sorted(summary(rows, ceiling_acc).items(),
                                             key=lambda kv: (kv[0][0], kv[0][2], -kv[0][1])):
        cells = [method, f"{budget:g}", codec, f"{p.acc:.2f}", _fmt(p.of_ceiling),
                 *([_fmt(p.fewer_bytes, ".1f")] if with_bytes else []), p.questions, p.groups]
        out.append("| " + " | ".join(map(str, cells)) + " |")
    return out


def _groups(rows: list[dict]) -> list[tuple[str, int]]:
    return sorted({(task_label(r), r["length"]) for r in rows})


def _position_acc(r: dict, last: bool) -> str:
    """Accuracy over the questions whose answer document was (not) the last one, and n."""
    qs = [q for q in r.get("per_question") or [] if q.get("answer_at") is not None
          and (q["answer_at"] == q["documents"] - 1) == last and q.get("score") is not None]
    return f"{sum(q['score'] for q in qs) / len(qs):.2f} ({len(qs)})" if qs else "—"


def frontier_table(rows: list[dict]) -> list[str]:
    """Per setting: accuracy and median TTFT beside recompute's on the same questions, the
    questions won and lost against it, and accuracy by where the answer document sat."""
    head = ["setting", "acc", "of recompute", "+/− vs recompute", "TTFT s (median)",
            "TTFT / recompute", "recomputed tok", "answer last", "answer earlier",
            "at decode budget", "q"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(rows, key=lambda r: (-(r.get("first_token_s_median_ratio") or 0),
                                         setting(r))):
        cells = [setting(r), *map(_fmt, acc(r)), f"+{r.get('gained', 0)} −{r.get('lost', 0)}",
                 _fmt(r.get("first_token_s_median"), ".3f"),
                 _fmt(r.get("first_token_s_median_ratio"), ".3f"),
                 _fmt(r.get("recomputed"), ".0f"), _position_acc(r, True),
                 _position_acc(r, False), r.get("at_budget", "—"), r["questions"]]
        out.append("| " + " | ".join(map(str, cells)) + " |")
    return out


def breakdown_table(rows: list[dict]) -> list[str]:
    """The timed settings' first token by phase (medians, ms), recompute's TTFT beside."""
    timed = [r for r in rows if r.get("breakdown")]
    if not timed:
        return []
    head = ["task", "length", "setting", "pack load", "plan (cache assembly)",
            "forward to the first token", "· layers over all tokens",
            "· layers over the chosen", "· selection", "sum", "engine TTFT",
            "recompute TTFT", "q"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(timed, key=lambda r: (task_label(r), r["length"], setting(r))):
        b = r["breakdown"]
        ms = [_fmt(b.get(k), ".0f", 1e3) for k in (
            "load_s", "plan_s", "forward_s", "full_layers_s", "sparse_layers_s", "select_s",
            "phases_ttft_s", "engine_first_token_s")]
        out.append("| " + " | ".join(map(str, [
            task_label(r), r["length"], setting(r), *ms,
            _fmt(r.get("ceiling_first_token_s_median"), ".0f", 1e3), b["questions"]])) + " |")
    return out


def ask_phases_table(rows: list[dict]) -> list[str]:
    """hotpot-kb: each setting's TTFT on the product path by phase (medians, ms; the ask's
    ASK_PHASES), the ceiling's (recompute's) from its cells' `ceiling_ask_phases`."""
    lines, seen = [], set()
    for r in sorted(rows, key=lambda r: (task_label(r), r["length"], r["items"], setting(r))):
        settings = [(setting(r), r.get("ask_phases"))]
        group = (task_label(r), r["length"], r["items"], r.get("kb_items"), codec_of(r))
        if r.get("ceiling_ask_phases") and group not in seen:
            seen.add(group)
            settings.insert(0, ("recompute (the ceiling)", r["ceiling_ask_phases"]))
        for label, b in settings:
            if not b or label == "recompute":
                continue
            parts = [b["retrieve_s"], b["packs_s"], b["queued_s"], b["model_s"]]
            lines.append("| " + " | ".join(map(str, [
                task_label(r), r["length"], r["items"], codec_of(r), label,
                *(_fmt(x, ".0f", 1e3) for x in parts), _fmt(sum(parts), ".0f", 1e3),
                _fmt(b.get("first_token_s"), ".0f", 1e3), b["questions"]])) + " |")
    if not lines:
        return []
    head = ["task", "top-k", "items", "codec", "setting", "retrieval", "packs", "queued",
            "model (plan to first token)", "sum", "TTFT", "q"]
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *lines]


def frontier(rows: list[dict]) -> list[str]:
    out = []
    for task, length in _groups(rows):
        group = [r for r in rows if (task_label(r), r["length"]) == (task, length)]
        tokens = _fmt(next((r.get("ceiling_prompt_tokens") for r in group), None), ".0f")
        out += [f"### {task} @ {length} (prompt ≈ {tokens} tokens)", "",
                *frontier_table(group), ""]
    breakdown = breakdown_table(rows)
    if breakdown:
        out += ["### TTFT by phase (medians, ms)", "", *breakdown, ""]
    return out


def tables(rows: list[dict]) -> str:
    """Markdown: pooled summaries and frontiers over each cell's largest run
    (`largest_runs`); the per-cell, QA and non-inferiority tables keep every run (theirs are
    per items)."""
    out = []
    largest = largest_runs(rows)
    reuse = [r for r in rows if r["suite"] == "reuse"]
    pooled = [r for r in largest if r["suite"] == "reuse"]
    if reuse:
        out += ["## Reuse strategies (RAG path)", "",
                "Pooled over tasks (each cell's largest run):", "",
                *summary_table(pooled, "strategy", "recompute"), "", "Per cell:", "",
                *reuse_table(reuse), ""]
        if any(r.get("first_token_s_median_ratio") is not None for r in reuse):
            out += ["## Reuse frontier (accuracy and median TTFT as fractions of recompute's)",
                    "", *frontier(pooled)]
    phases = ask_phases_table(pooled)
    if phases:
        out += ["## TTFT on the product path by phase (hotpot-kb; medians, ms)", "",
                "Each phase's median on its own, so the sum is not the median TTFT.", "",
                *phases, ""]
    out += qa_tables(rows)
    evict = [r for r in rows if r["suite"] == "evict"]
    if evict:
        pooled = [r for r in largest if r["suite"] == "evict"]
        out += ["## Eviction methods (KBQA path: compressed once, asked every question)", "",
                "Pooled over tasks (each cell's largest run):", "",
                *summary_table(pooled, "method", "full KV", full_kv_acc, with_bytes=True), "",
                "Per cell:", "", *evict_table(evict), ""]
        out += f1_frontier_table(rows)
    out += noninferiority.table(rows)
    return "\n".join(out)


def f1_frontier_table(rows: list[dict]) -> list[str]:
    """The F1 frontier as markdown: pooled F1 over fp16 full KV's (`f1_of_full`) by bytes
    saved, and for a cell run on one task and length its paired 95 % interval."""
    points = {k: p for k, p in f1_of_full(rows).items()
              if p.fewer_bytes and p.of_ceiling is not None}
    if not points:
        return []
    cells = defaultdict(list)
    for r in largest_runs([r for r in rows if r["suite"] == "evict" and r.get("f1") is not None]):
        cells[(name(r), r["budget"], codec_of(r))].append(r)
    out = ["F1 frontier (real-QA cells, pooled; F1 over fp16 full KV's on the same questions, "
           "paired 95 % interval where the cell is one task and length):", "",
           "| method | budget | codec | × vs fp16 | F1 / full KV (fp16) | 95 % CI | "
           "F1 − full KV (fp16) [95 % CI] |", "|---|---|---|---|---|---|---|"]
    for (m, b, c), p in sorted(points.items(), key=lambda kv: kv[1].fewer_bytes):
        one = cells[(m, b, c)]
        paired = f1_of_full_interval(rows, one[0]) if len(one) == 1 else None
        ci, diff = "—", "—"
        if paired is not None:
            if paired.ratio is not None:
                ci = f"[{paired.ratio.low:.2f}, {paired.ratio.high:.2f}]"
            d = paired.diff
            diff = f"{d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"
        out.append(f"| {m} | {b:g} | {c} | {p.fewer_bytes:.1f} | {p.of_ceiling:.3f} | {ci} "
                   f"| {diff} |")
    return out + [""]


def plots(rows: list[dict], folder: Path) -> list[Path]:
    """PNGs into `folder`, each cell at its largest run (`largest_runs`); their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    evict = [r for r in largest_runs(rows) if r["suite"] == "evict" and r["method"] != "full"]
    if evict:
        groups = sorted({(r["task"], r["length"]) for r in evict})
        cols = min(3, len(groups))
        rows_n = -(-len(groups) // cols)
        fig, axes = plt.subplots(rows_n, cols, figsize=(4.2 * cols, 3.2 * rows_n), squeeze=False)
        several = len({codec_of(r) for r in evict}) > 1
        for ax, (task, length) in zip(axes.flat, groups):
            by_method = defaultdict(list)
            for r in evict:
                if (r["task"], r["length"]) == (task, length):
                    label = f"{r['method']} · {codec_of(r)}" if several else r["method"]
                    by_method[label].append((r["budget"], acc(r)[1] or 0.0))
            for method, points in sorted(by_method.items()):
                ax.plot(*zip(*sorted(points)), marker="o", label=method,
                        linestyle="--" if method.startswith(KVPRESS) else "-")
            ax.set(title=f"{task} @ {length}", xlabel="KV budget (fraction kept)",
                   ylabel="accuracy / full KV, same codec")
        for ax in axes.flat[len(groups):]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=7)
        fig.tight_layout()
        written.append(folder / "accuracy_vs_budget.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    if any(fewer_bytes(r) for r in evict):
        written.append(bytes_frontier_plot(rows, folder / "bytes_frontier.png"))
    if any(p.fewer_bytes for p in f1_of_full(rows).values()):
        written.append(bytes_frontier_plot(rows, folder / "f1_bytes_frontier.png", "f1"))
    reuse = [r for r in largest_runs(rows) if r["suite"] == "reuse"]
    if reuse:
        fig, ax = plt.subplots(figsize=(6, 4))
        points = defaultdict(list)
        for r in reuse:
            points[(r["method"], r["budget"])].append((r.get("first_token_s_ratio") or 0.0,
                                                       acc(r)[1] or 0.0))
        for (method, budget), pts in sorted(points.items()):
            x, y = (sum(v) / len(v) for v in zip(*pts))
            ax.scatter(x, y)
            ax.annotate(f"{method}@{budget:g}", (x, y), fontsize=7)
        ax.set(xlabel="TTFT / recompute (mean over tasks)",
               ylabel="accuracy / recompute (mean over tasks)", title="Accuracy vs TTFT ratio")
        written.append(folder / "accuracy_vs_ttft.png")
        fig.savefig(written[-1], dpi=120, bbox_inches="tight")
        plt.close(fig)
    medians = [r for r in reuse if r.get("first_token_s_median_ratio") is not None]
    if medians:
        written.append(frontier_plot(medians, folder / "reuse_frontier.png"))
    return written


def frontier_plot(rows: list[dict], path: Path) -> Path:
    """Accuracy / recompute vs median TTFT / recompute (log), one point per strategy
    setting, one panel per task × length; a strategy's ratios are one line (labelled with
    the ratio), its other options separate lines."""
    import matplotlib
    import matplotlib.pyplot as plt

    groups = _groups(rows)
    fig, axes = plt.subplots(1, len(groups), figsize=(5.6 * len(groups), 4.6), squeeze=False)
    series = sorted({name(r) for r in rows})
    style = {n: (plt.cm.tab10(i % 10), "osD^v<>p*h"[i // 10 % 10]) for i, n in enumerate(series)}
    for ax, (task, length) in zip(axes.flat, groups):
        group = [r for r in rows if (task_label(r), r["length"]) == (task, length)]
        for n in series:
            points = sorted((r["first_token_s_median_ratio"], acc(r)[1] or 0.0, r["budget"])
                            for r in group if name(r) == n)
            if not points:
                continue
            colour, marker = style[n]
            xs, ys, ratios = zip(*points)
            ax.plot(xs, ys, color=colour, marker=marker, markersize=5, linewidth=0.8, label=n)
            for x, y, ratio in points:
                if ratio != 1:
                    ax.annotate(f"{ratio:g}", (x, y), fontsize=6, xytext=(3, 2),
                                textcoords="offset points")
        ax.axhline(1.0, color="grey", linewidth=0.6, linestyle=":")
        ax.set_xscale("log")
        plain = matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}")  # 0.3, not 3×10⁻¹
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(plain)
        ax.tick_params(axis="x", which="minor", labelsize=6)
        unit = "documents" if group[0]["task"] in DATASETS else "tokens"
        ax.set(title=f"{task}: {length} {unit}, {max(r['questions'] for r in group)} questions",
               xlabel="median TTFT / recompute (log)", ylabel="accuracy / recompute")
        ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _f1_group(r: dict) -> tuple:
    return r["task"], r["length"], r["seed"], r.get("model")


def fp16_full_f1s(rows: list[dict], r: dict) -> list[float] | None:
    """Full KV uncompressed's per-question F1 on `r`'s questions: as `r` recorded it beside
    its own (`full_kv_f1`, from the fp16 ceilings its run kept), else the fp16 full-KV cell's
    — the row of `r`'s own items, else the first `r["questions"]` of a larger run of the same
    task, length, seed and model (a seeded order's prefix, `largest_runs`); None where none
    was run (or kept per-question scores)."""
    own = [q.get("full_kv_f1") for q in r.get("per_question") or []]
    if own and None not in own and len(own) == r["questions"]:
        return own
    full = [f for f in rows if f["suite"] == "evict" and f["method"] == "full"
            and codec_of(f) == REFERENCE_CODEC and _f1_group(f) == _f1_group(r)
            and f.get("per_question") and f["items"] >= r["items"]]
    for f in sorted(full, key=lambda f: f["items"] != r["items"]):
        f1s = [q.get("f1") for q in f["per_question"][:r["questions"]]]
        if len(f1s) == r["questions"] and None not in f1s:
            return f1s
    return None


def f1_of_full(rows: list[dict]) -> dict[tuple[str, float, str], Pooled]:
    """(method, budget, codec) → Pooled in F1, its ceiling the fp16 full-KV cell's F1 on the
    same questions (same task, length, items, seed and model — or a larger run's first
    questions, `fp16_full_f1s`): real-QA eviction cells that have one, the F1 frontier of
    issue 30; each cell at its largest run (`largest_runs`)."""
    def group(r: dict) -> tuple:
        return r["task"], r["length"], r["items"], r["seed"], r.get("model")

    evict = [r for r in rows if r["suite"] == "evict" and r.get("f1") is not None]
    full = {group(r): r["f1"] for r in evict
            if r["method"] == "full" and codec_of(r) == REFERENCE_CODEC and r["f1"]}
    largest = largest_runs(evict)
    for r in largest:
        if group(r) not in full and (f1s := fp16_full_f1s(evict, r)) and sum(f1s):
            full[group(r)] = sum(f1s) / len(f1s)
    return summary([r for r in largest if group(r) in full],
                   lambda r: full[group(r)], lambda r: r["f1"])


def f1_of_full_interval(rows: list[dict], r: dict):
    """`r`'s F1 over the fp16 full-KV cell's on the same questions, paired question by
    question (`kvedge.bench.bootstrap`), resampling contexts where the rows name each
    question's (`item`: squad-evict's articles): a Paired, or None without per-question
    scores."""
    from kvedge.bench.bootstrap import contexts_of, paired_bootstrap

    ref = fp16_full_f1s(rows, r)
    per_question = r.get("per_question") or []
    mine = [q.get("f1") for q in per_question]
    if ref is None or len(mine) != len(ref) or None in mine:
        return None
    return paired_bootstrap(mine, ref, clusters=contexts_of(per_question))


def bytes_frontier_plot(rows: list[dict], path: Path, metric: str = "acc") -> Path:
    """Accuracy (`metric` "acc": each question's own metric; "f1": real-QA cells' F1) as a
    fraction of full KV uncompressed's vs × fewer bytes than fp16 full KV (log), each
    eviction (method, budget, codec) pooled over tasks; one line per (method, codec) through
    its budgets (labelled), colour by method, marker by codec; the target (TARGET) is the
    top-right corner past the dotted lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = defaultdict(list)
    pooled = f1_of_full(rows) if metric == "f1" else summary(
        largest_runs([r for r in rows if r["suite"] == "evict"]), full_kv_acc)
    for (method, budget, codec), p in pooled.items():
        if p.fewer_bytes and p.of_ceiling is not None:
            lines[(method, codec)].append((p.fewer_bytes, p.of_ceiling, budget))
    methods, codecs = sorted({m for m, _ in lines}), sorted({c for _, c in lines})
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for (method, codec), points in sorted(lines.items()):
        xs, ys, budgets = zip(*sorted(points))
        ax.plot(xs, ys, color=plt.cm.tab10(methods.index(method) % 10), linewidth=0.8,
                marker="osD^v<>p*h"[codecs.index(codec) % 10], markersize=5,
                label=f"{method} · {codec}")
        for x, y, budget in zip(xs, ys, budgets):
            if budget != 1:
                ax.annotate(f"{budget:g}", (x, y), fontsize=6, xytext=(3, 2),
                            textcoords="offset points")
    ax.axvline(TARGET[0], color="grey", linewidth=0.6, linestyle=":")
    ax.axhline(TARGET[1], color="grey", linewidth=0.6, linestyle=":")
    ax.set_xscale("log")
    low, high = ax.get_xlim()
    ticks = [2.0 ** k for k in range(-2, 11) if low <= 2.0 ** k <= high]
    ax.set_xticks(ticks, [f"{t:g}×" for t in ticks])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    what = "F1" if metric == "f1" else "accuracy"
    ax.set(xlabel="× fewer bytes than fp16 full KV (log)", ylabel=f"{what} / full KV (fp16)",
           title=f"Eviction × codec: bytes shipped vs {what} (pooled over tasks)")
    if lines:
        ax.legend(fontsize=6, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(results: Path, folder: Path) -> Path:
    """report.md (and its plots) in `folder` from `results`' cells, with the unfinished
    cells' answers so far where the run's partial.jsonl holds any (`unfinished`)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = rebase_kvpress(load(results)) if Path(results).exists() else []
    images = plots(rows, folder)
    md = folder / "report.md"
    so_far = "\n".join(unfinished.table(Path(results).parent))
    md.write_text("# kvedge benchmark report\n\n" + f"results: `{results}` ({len(rows)} cells, "
                  f"model {rows[0]['model'] if rows else '?'})\n\n" + tables(rows) + "\n" +
                  (so_far + "\n" if so_far else "") +
                  "".join(f"![{p.stem}]({p.name})\n" for p in images))
    return md
