"""The eviction × codec frontier: bytes shipped vs accuracy, for `kvctl job submit --method M
--budget B --codec C` as the eviction suite measures it (`kvctl bench run --codec a,b`).

x: × fewer bytes than the context's full KV in fp16; y: accuracy as a fraction of full KV
uncompressed's (fp16 packs) on the same questions (`report.full_kv_acc`); each (method,
budget, codec) pooled over the run's tasks (`report.summary`). Issue 12's target is the
corner past TARGET.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import click

from kvedge.bench.report import full_kv_acc, load, rebase_kvpress, summary, summary_table

TARGET = (32.0, 0.92)  # ≥ 32× fewer bytes than fp16 KV at ≥ 92 % of full KV's accuracy


def bytes_frontier_plot(rows: list[dict], path: Path) -> Path:
    """Accuracy as a fraction of full KV uncompressed's vs × fewer bytes than fp16 full KV
    (log), each eviction (method, budget, codec) pooled over tasks; one line per (method,
    codec) through its budgets (labelled), colour by method, marker by codec; the target
    (TARGET) is the top-right corner past the dotted lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = defaultdict(list)
    for (method, budget, codec), p in summary([r for r in rows if r["suite"] == "evict"],
                                              full_kv_acc).items():
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
    ax.set(xlabel="× fewer bytes than fp16 full KV (log)", ylabel="accuracy / full KV (fp16)",
           title="Eviction × codec: bytes shipped vs accuracy (pooled over tasks)")
    if lines:
        ax.legend(fontsize=6, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


FRONTIER_BEGIN = "<!-- bench eviction × codec: begin -->"
FRONTIER_END = "<!-- bench eviction × codec: end -->"


def write_codec_frontier(results: Path, doc: Path) -> Path:
    """Write an eviction × codec run's pooled table and frontier plot (saved beside the doc as
    codecs_frontier.png) into `doc` (docs/codecs.md) between FRONTIER_BEGIN and _END,
    keeping the prose around them; returns the plot."""
    rows = [r for r in rebase_kvpress(load(results)) if r["suite"] == "evict"]
    image = bytes_frontier_plot(rows, Path(doc).parent / "codecs_frontier.png")
    block = [f"Generated from `{results}` (model {rows[0]['model'] if rows else '?'}) by "
             "`python -m kvedge.bench.codec_frontier`.", "",
             *summary_table(rows, "method", "full KV", full_kv_acc, with_bytes=True), "",
             f"![bytes vs accuracy]({image.name})"]
    text = Path(doc).read_text() if Path(doc).exists() else ""
    head, _, rest = text.partition(FRONTIER_BEGIN)
    tail = rest.partition(FRONTIER_END)[2] if rest else "\n"
    Path(doc).write_text(f"{head.rstrip()}\n\n{FRONTIER_BEGIN}\n" + "\n".join(block) +
                         f"\n{FRONTIER_END}{tail}")
    return image


@click.command()
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@click.argument("doc", type=click.Path(dir_okay=False), default="docs/codecs.md")
def main(results, doc):
    """Put RESULTS.jsonl's eviction × codec frontier into DOC [default: docs/codecs.md]."""
    click.echo(f"{doc}: {write_codec_frontier(Path(results), Path(doc))}")


if __name__ == "__main__":
    main()
