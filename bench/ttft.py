"""Where a reuse strategy's time to first token goes, timed around the edge's own calls.

The edge runs a plan to its first token with `Decoding.start` (the strategy's `plan`: cache
assembly, every segment's keys rotated to its composed positions, plus whatever the strategy
decides before running; then one `Runtime.forward` over the plan's tokens, the first token's
pick and the plan's `after_first` step). This runs that same call on the same plan, with
clocks in wrappers around the plan's own per-layer hooks — nothing is re-implemented:

- `plan_s`: `strategy.plan(...)` and the cache's assembly to its last layer (every segment's
  layers realigned: the edge's loader builds them on a thread while the forward runs, so
  without the wait its time would hide in the forward's stalls);
- `forward_s`: `Decoding.start` — the forward through every layer (the recompute), the LM
  head, the first token's pick and `after_first` (A3's SnapKV eviction) — split by layer into
  `full_layers_s` (layers that run every token after the chat prefix — A3's blocks 0..ℓ, all
  of recompute's) and `sparse_layers_s` (layers that run a subset: the chosen tokens and the
  fresh ones — A3 from ℓ+1 on, every layer of a static plan such as legolink's), the last
  layer's span running to the end of the call; `select_s`, inside it, is the strategy's
  selection (its `observe` hook; absent for a plan with none: a static plan's selection is
  position arithmetic inside `plan_s`).

`phases_ttft_s` is their sum, to set beside the engine's own first_token_s of the same
question (the two differ by clock noise, by the plan being built twice, and by the loader's
overlap with the forward, which the split gives up to time assembly on its own).
"""
from __future__ import annotations

import time

from dataclasses import replace

from kvedge.common.model.decoding import Decoding


def _timed_observe(observe, spent: list[float]):
    if observe is None:
        return None

    def run(*args):
        start = time.perf_counter()
        observe(*args)
        spent.append(time.perf_counter() - start)
    return run


def _timed_active(active, marks: list[tuple[float, int]]):
    """The plan's per-layer plan (None, a list or a callable) as a callable noting when each
    layer starts and how many tokens reach it."""
    def ask(layer, current):
        at = time.perf_counter()
        keep = active(layer, current) if callable(active) else (
            None if active is None else active[layer])
        marks.append((at, current.numel() if keep is None else len(keep)))
        return keep
    return ask


def ttft_phases(rt, composed, strategy, max_new_tokens: int) -> dict[str, float]:
    """One question's first token, timed by phase (seconds; see the module docstring)."""
    start = time.perf_counter()
    plan = strategy.plan(rt, composed, reserve=max_new_tokens)
    if hasattr(plan.cache, "wait"):
        plan.cache.wait()  # the loader's layers, all built: assembly is timed in plan_s
    planned = time.perf_counter()
    selecting: list[float] = []
    marks: list[tuple[float, int]] = []
    timed = replace(plan, active=_timed_active(plan.active, marks),
                    observe=_timed_observe(plan.observe, selecting))
    Decoding.start(rt, timed, max_new_tokens)
    done = time.perf_counter()
    phases = {"plan_s": planned - start, "forward_s": done - planned, "phases_ttft_s": done - start}
    if plan.observe is not None:
        phases["select_s"] = sum(selecting)
    after_prefix = composed.seq_len() - composed.n_prefix  # every token but the chat prefix
    return {**phases, **_layer_split(marks, after_prefix, done)}


def _layer_split(marks: list[tuple[float, int]], n_all: int, end: float) -> dict[str, float]:
    """Seconds in layers that ran all `n_all` tokens vs. a subset (from each layer's start,
    `marks`: (time, tokens run); what follows the last layer — the final norm, the LM head, the
    pick and `after_first` — counts with it)."""
    if not marks:
        return {}
    starts = [at for at, _ in marks] + [end]
    spans = [(starts[i + 1] - starts[i], n >= n_all) for i, (_, n) in enumerate(marks)]
    return {"full_layers_s": sum(s for s, full in spans if full),
            "sparse_layers_s": sum(s for s, full in spans if not full)}


# ---------------------------------------------------------------------- loading
# How a question's packs become its cache, each timed from the pack files to the first token:
# - "sequential": the schedule before the streaming loader — every pack decoded whole (what
#   the edge's pack cache does on a miss, `read_pack`), the cache built, then the forward;
# - "streamed": the packs opened (`PackSegment`: header and manifest) and decoded layer by
#   layer by the loader's thread while the forward runs;
# - "hot-sequential" / "hot-streamed": the same from contexts already decoded in memory (the
#   pack cache's hits), so only the cache's assembly is loading;
# - "compute": the cache already built when the clock starts — no loading at all.
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
    """`python -m kvedge.bench.ttft`: the loading table on SmolLM2, fact documents."""
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
