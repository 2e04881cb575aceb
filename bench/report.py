"""Results (JSON lines) → markdown tables and PNG plots."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _fmt(x, spec=".2f"):
    return "—" if x is None else format(x, spec)


def tables(rows: list[dict]) -> str:
    out = []
    reuse = [r for r in rows if r["suite"] == "reuse"]
    if reuse:
        out += ["## Reuse strategies (RAG path)", "",
                "| task | docs | strategy | ratio | acc (any) | of ceiling | TTFT s | TTFT / "
                "recompute | TPOT ms | KV MB | recomputed tok | q |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(reuse, key=lambda r: (r["task"], r["length"], r["method"], r["budget"])):
            out.append(f"| {r['task']} | {r['length']} | {r['method']} | {r['budget']:g} | "
                       f"{r['any']:.2f} | {_fmt(r['any_ratio'])} | {r['first_token_s']:.3f} | "
                       f"{_fmt(r['first_token_s_ratio'])} | {r['tpot_s'] * 1e3:.0f} | "
                       f"{r['kv_bytes'] / 1e6:.2f} | {r['recomputed']:.0f} | {r['questions']} |")
        out.append("")
    evict = [r for r in rows if r["suite"] == "evict"]
    if evict:
        out += ["## Eviction methods (KBQA path: compressed once, asked every question)", "",
                "| task | docs | method | budget | acc (any) | of full KV | KV MB | KV / full | "
                "shipped MB | compress s | compress / prefill | q |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(evict, key=lambda r: (r["task"], r["length"], r["method"], -r["budget"])):
            out.append(f"| {r['task']} | {r['length']} | {r['method']} | {r['budget']:g} | "
                       f"{r['any']:.2f} | {_fmt(r['any_ratio'])} | {r['kv_bytes'] / 1e6:.2f} | "
                       f"{_fmt(r['kv_bytes_ratio'])} | {r['shipped_bytes'] / 1e6:.2f} | "
                       f"{r['compress_s']:.2f} | "
                       f"{_fmt(r['compress_s'] / r['prefill_s'] if r.get('prefill_s') else None, '.1f')}"
                       f" | {r['questions']} |")
        out.append("")
    return "\n".join(out)


def plots(rows: list[dict], folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    evict = [r for r in rows if r["suite"] == "evict" and r["method"] != "full"]
    if evict:
        fig, ax = plt.subplots(figsize=(6, 4))
        by_method = defaultdict(list)
        for r in evict:
            by_method[r["method"]].append((r["budget"], r["any_ratio"] or 0.0))
        for method, points in sorted(by_method.items()):
            points.sort()
            ax.plot(*zip(*points), marker="o", label=method)
        ax.set(xlabel="KV budget (fraction kept)", ylabel="accuracy / full KV",
               title="Accuracy vs budget")
        ax.legend()
        written.append(folder / "accuracy_vs_budget.png")
        fig.savefig(written[-1], dpi=120, bbox_inches="tight")
        plt.close(fig)
    reuse = [r for r in rows if r["suite"] == "reuse"]
    if reuse:
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in reuse:
            ax.scatter(r["first_token_s_ratio"] or 0, r["any_ratio"] or 0)
            ax.annotate(f"{r['method']}@{r['budget']:g}",
                        (r["first_token_s_ratio"] or 0, r["any_ratio"] or 0), fontsize=7)
        ax.set(xlabel="TTFT / recompute", ylabel="accuracy / recompute",
               title="Accuracy vs TTFT ratio")
        written.append(folder / "accuracy_vs_ttft.png")
        fig.savefig(written[-1], dpi=120, bbox_inches="tight")
        plt.close(fig)
    return written


def write_report(results: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = load(results)
    images = plots(rows, folder)
    md = folder / "report.md"
    md.write_text("# kvedge benchmark report\n\n" + f"results: `{results}` ({len(rows)} cells, "
                  f"model {rows[0]['model'] if rows else '?'})\n\n" + tables(rows) + "\n" +
                  "".join(f"![{p.stem}]({p.name})\n" for p in images))
    return md
