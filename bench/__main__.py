"""`python -m kvedge.bench` (also `kvctl bench`): run the grid, write the report."""
from __future__ import annotations

from pathlib import Path

import click

from kvedge.bench.runner import Preset, run_grid


def preset(name: str, model: str | None) -> Preset:
    if name == "eviction":  # issue 6's grid: every method at 0.5/0.3/0.2/0.1 on the whole KB
        return Preset(model or "smollm2-135m-instruct", [], [], [], [], ["demo-kb"], [6],
                      _methods(), [0.5, 0.3, 0.2, 0.1], items=10, max_new_tokens=24)
    if name == "quick":  # minutes on a 2-core CPU: a smoke test of every path
        return Preset(model or "smollm2-135m-instruct", ["demo-kb"], [3],
                      ["recompute", "pie", "a3"], [0.15], ["demo-kb"], [4],
                      ["full", "contrastkv", "kvzip"], [0.2], items=3, max_new_tokens=16)
    return Preset(model or "smollm2-135m-instruct", ["demo-kb"], [3, 6],
                  ["recompute", "full-reuse", "pie", "a3", "cacheblend", "epic"],
                  [0.05, 0.15, 0.3], ["demo-kb"], [6], _methods(), [0.5, 0.3, 0.2, 0.1],
                  items=10, max_new_tokens=24)


def _methods() -> list[str]:
    try:
        from kvedge.cloud.eviction import METHODS
    except ImportError:
        return ["full"]
    return ["full", *sorted(METHODS)]


@click.group()
def bench():
    """Benchmark: method × budget grids, tables and plots."""


@bench.command("run")
@click.option("--preset", "preset_name", type=click.Choice(["quick", "eviction", "full"]), default="quick",
              show_default=True)
@click.option("--quick", is_flag=True, help="same as --preset quick")
@click.option("--model", default=None, help="[default: smollm2-135m-instruct]")
@click.option("--out", "out_dir", type=click.Path(), default="bench/results", show_default=True)
@click.option("--codec", default="fp16", show_default=True, help="pack codec of the documents")
def run_cmd(preset_name, quick, model, out_dir, codec):
    """Run every cell not already in OUT/results.jsonl, then write OUT/report.md."""
    from tqdm import tqdm

    from kvedge.bench.report import write_report
    from kvedge.bench.suites import Bench

    p = preset("quick" if quick else preset_name, model)
    out = Path(out_dir)
    results = out / "results.jsonl"
    runner = Bench(p.model, codec, p.max_new_tokens)
    rows = run_grid(p, results, runner.run, progress=lambda cells: tqdm(cells, desc="cells"))
    click.echo(f"{len(rows)} new cells → {results}")
    click.echo(f"report: {write_report(results, out)}")


@bench.command("report")
@click.option("--out", "out_dir", type=click.Path(exists=True), default="bench/results",
              show_default=True)
def report_cmd(out_dir):
    from kvedge.bench.report import write_report

    click.echo(write_report(Path(out_dir) / "results.jsonl", Path(out_dir)))


if __name__ == "__main__":
    bench()
