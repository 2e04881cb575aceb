"""How a question's packs become its cache, each mode timed from the pack files to the first
token (`python -m kvedge.bench.loading`: the table on SmolLM2, fact documents):

- "sequential": the schedule before the streaming loader — every pack decoded whole (what
  the edge's pack cache does on a miss, `read_pack`), the cache built, then the forward;
- "streamed": the packs opened (`PackSegment`: header and manifest) and decoded layer by
  layer by the loader's thread while the forward runs;
- "hot-sequential" / "hot-streamed": the same from contexts already decoded in memory (the
  pack cache's hits), so only the cache's assembly is loading;
- "compute": the cache already built when the clock starts — no loading at all.

Each runs the plan to its first token with `Decoding.start`, as the edge does.
"""
from __future__ import annotations

import time

from kvedge.common.model.decoding import Decoding

LOAD_MODES = ("sequential", "streamed", "hot-sequential", "hot-streamed", "compute")


def loading_ttft(engine, files: list, fingerprint: str, strategy, question: str,
                 instruction: str, max_new_tokens: int, mode: str,
                 decoded: list | None = None) -> dict[str, float]:
    """One question's TTFT (seconds) from `files` (its packs, in prompt order) under `mode`;
    `stalled_s`: how long the forward waited for the loader's layers."""
    from kvedge.common.pack.format import read_pack
    from kvedge.common.pack.segment import PackSegment

    rt = engine.rt
    start = time.perf_counter()
    if mode in ("sequential", "streamed"):
        open_ = read_pack if mode == "sequential" else PackSegment.open
        segments = [open_(path, fingerprint) for path in files]
    else:
        segments = decoded
    plan = strategy.plan(rt, engine.compose(segments, question, instruction),
                         reserve=max_new_tokens)
    if not mode.endswith("streamed") and hasattr(plan.cache, "wait"):
        plan.cache.wait()  # the old schedule: everything loaded before the forward
    if mode == "compute":
        start = time.perf_counter()
    stalled = getattr(plan.cache, "stalled_s", 0.0)
    Decoding.start(rt, plan, max_new_tokens)
    return {"ttft_s": time.perf_counter() - start,
            "stalled_s": getattr(plan.cache, "stalled_s", 0.0) - stalled}


def loading_table(engine, files, fingerprint, strategies, question: str, instruction: str,
                  max_new_tokens: int = 24, repeats: int = 5) -> dict:
    """Medians over `repeats` rounds, every mode of every strategy (and a full prefill) once
    per round, interleaved so that the machine's load hits them alike. Per strategy and mode:
    TTFT, loading = TTFT − compute's TTFT (of the same round), its share of TTFT, stalls."""
    from statistics import median

    from kvedge.common.pack.format import read_pack
    from kvedge.edge.strategies import get_strategy

    decoded = [read_pack(path, fingerprint) for path in files]
    rows: dict[tuple[str, str], list[dict]] = {}
    for _ in range(repeats):
        for name in [*strategies, "recompute"]:
            modes = ("compute",) if name == "recompute" else LOAD_MODES
            timed = {mode: loading_ttft(engine, files, fingerprint, get_strategy(name),
                                        question, instruction, max_new_tokens, mode, decoded)
                     for mode in modes}
            for mode, t in timed.items():
                loading = t["ttft_s"] - timed["compute"]["ttft_s"]
                rows.setdefault((name, mode), []).append(
                    {**t, "loading_s": loading, "loading_share": loading / t["ttft_s"]})
    return {key: {k: median(r[k] for r in runs) for k in runs[0]} for key, runs in rows.items()}


def main(argv: list[str] | None = None) -> None:
    """`python -m kvedge.bench.loading`: the loading table on SmolLM2, fact documents."""
    import argparse

    from kvedge.bench.datasets import load_items
    from kvedge.bench.suites import Bench
    from kvedge.common.pack.codecs import DEFAULT_CODEC
    from kvedge.edge import DEFAULT_STRATEGY

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--docs", type=int, default=3)
    ap.add_argument("--doc-tokens", type=int, default=500)
    ap.add_argument("--codec", default=DEFAULT_CODEC)
    ap.add_argument("--strategies", default=",".join(dict.fromkeys(["a3", DEFAULT_STRATEGY,
                                                                     "pie"])))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    bench = Bench(args.model, breakdown=None, doc_tokens=args.doc_tokens)
    item = load_items("multidoc-facts", "reuse", args.docs, 1, 0,
                      bench.prefill.loaded.tokenizer, args.doc_tokens)[0]
    files = [path for doc in item.documents for path, _ in bench.pack_files(doc, False,
                                                                             args.codec)]
    q = item.questions[0]
    table = loading_table(bench.engine, files, bench.prefill.loaded.fingerprint,
                          args.strategies.split(","), q.text, q.instruction,
                          repeats=args.repeats)
    tokens = sum(bench.load(path).n_tokens for path in files)
    print(f"{len(files)} packs, {tokens} context tokens, codec {args.codec}, "
          f"medians of {args.repeats} rounds")
    prefill = table["recompute", "compute"]["ttft_s"]
    print("| strategy | mode | TTFT s | × full prefill | loading s | loading share | stalled s |")
    print("|---|---|---|---|---|---|---|")
    for (name, mode), r in table.items():
        print(f"| {name} | {mode} | {r['ttft_s']:.3f} | {r['ttft_s'] / prefill:.2f} | "
              f"{r['loading_s']:.3f} | {r['loading_share']:.0%} | {r['stalled_s']:.3f} |")


if __name__ == "__main__":
    main()
