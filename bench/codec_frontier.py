"""The eviction × codec frontier in docs/codecs.md: bytes shipped vs accuracy, for `kvctl job
submit --method M --budget B --codec C` as the eviction suite measures it (`kvctl bench run
--codec a,b`).

x: × fewer bytes than the context's full KV in fp16; y: accuracy as a fraction of full KV
uncompressed's (fp16 packs) on the same questions (`report.full_kv_acc`); each (method,
budget, codec) pooled over the run's tasks (`report.summary`). The plot is the benchmark
report's (`report.bytes_frontier_plot`); issue 12's target is the corner past `report.TARGET`.
"""
from __future__ import annotations

from pathlib import Path

import click

from kvedge.bench.report import (bytes_frontier_plot, full_kv_acc, load, rebase_kvpress,
                                 summary_table)

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
