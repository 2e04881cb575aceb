"""Time to the whole answer, with and without prompt-lookup drafts, on real questions (issue 28).

`python -m kvedge.bench.speculation [--model M] [--questions 30] [--strategies recompute,epic]
[--style short|sentence] [--spec-rows 8] [--no-batch-invariant]`: HotpotQA questions of the
tuning split (`hotpot-fixed`: each over its 10 paragraphs, prefilled as packs) answered through
the served path (`EdgeEngine.answer`, the scheduler, batch-invariant steps unless told
otherwise) by each strategy twice in a row — drafts off (`spec_rows` 0), then on — so both
see the same machine. Per strategy and mode: median TTFT, TPOT and time to the whole
answer, tokens per decode step, the drafts' accept rate, and how many answers differ between
the modes (none may: under greedy a step keeps only the drafts the model's own picks agree
with).

`--style short` asks HotpotQA's way (the answer only: a few tokens); `sentence` asks for one
sentence (~20–30 tokens), the answers users of a chat page read.
"""
from __future__ import annotations

import statistics
import time

STYLES = {
    "short": None,  # HotpotQA's own instruction (kvedge.bench.real.hotpotqa.INSTRUCTION)
    "sentence": ("Answer the question in one full sentence, using the passages above. "
                 "Only give me the sentence and do not output any other words."),
}


def run(model: str, questions: int, strategies: list[str], style: str, spec_rows: int,
        max_new_tokens: int, seed: int = 0, invariant: bool = True) -> list[dict]:
    from kvedge.bench.real.hotpotqa import hotpot_fixed_items
    from kvedge.bench.suites import Bench
    from kvedge.edge.strategies import get_strategy

    bench = Bench(model)
    scheduler = bench.engine.scheduler
    scheduler.invariant = invariant  # off: a lone answer's plain step is one row, no padding
    rows = []
    for item in hotpot_fixed_items(10, questions, seed):
        segments = [ctx for doc in item.documents for ctx, _ in bench.packs(doc, False)]
        q = item.questions[0]
        composed = bench.engine.compose(segments, q.text, STYLES[style] or q.instruction)
        for name in strategies:
            for spec in (0, spec_rows):
                scheduler.spec_rows = spec
                start = time.perf_counter()
                *_, stats = bench.engine.answer(composed, get_strategy(name), max_new_tokens)
                rows.append({**stats, "strategy": name, "spec_rows": spec, "item": item.key,
                             "answer_s": time.perf_counter() - start})
    return rows


def summary(rows: list[dict]) -> list[str]:
    def med(values):
        return statistics.median(values) if values else float("nan")

    out = ["| strategy | drafts | TTFT s | TPOT ms | whole answer s | tokens | tokens/step "
           "| accepted/drafted | answers changed |", "|---|---|---|---|---|---|---|---|---|"]
    plain = {(r["strategy"], r["item"]): r for r in rows if r["spec_rows"] == 0}
    for name in dict.fromkeys(r["strategy"] for r in rows):
        for spec in dict.fromkeys(r["spec_rows"] for r in rows):
            sel = [r for r in rows if r["strategy"] == name and r["spec_rows"] == spec]
            tokens = sum(r["tokens"] for r in sel)
            steps = sum(r["decode_steps"] for r in sel)
            drafted = sum(r["drafted"] for r in sel)
            changed = sum(r["answer"] != plain[name, r["item"]]["answer"] for r in sel)
            out.append(
                f"| {name} | {spec or 'off'} | {med([r['first_token_s'] for r in sel]):.2f} "
                f"| {med([r['tpot_s'] for r in sel if r['tokens'] > 1]) * 1e3:.0f} "
                f"| {med([r['answer_s'] for r in sel]):.2f} | {tokens / len(sel):.1f} "
                f"| {(steps + sum(r['accepted'] for r in sel)) / max(steps, 1):.2f} "
                f"| {sum(r['accepted'] for r in sel)}/{drafted} | {changed}/{len(sel)} |")
    return out


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json

    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--questions", type=int, default=30)
    ap.add_argument("--strategies", default="recompute,epic")
    ap.add_argument("--style", choices=sorted(STYLES), default="sentence")
    ap.add_argument("--spec-rows", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-batch-invariant", dest="invariant", action="store_false",
                    help="unpadded steps (`kvedge serve --no-batch-invariant`): drafts then "
                    "add rows to a one-row step instead of filling padding")
    ap.add_argument("--out", help="write every answer's row here (JSON lines)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = run(args.model, args.questions, args.strategies.split(","), args.style,
               args.spec_rows, args.max_new_tokens, invariant=args.invariant)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r, default=str) + "\n" for r in rows)
    print(f"{args.model}, {args.questions} HotpotQA questions (tuning split, 10 paragraphs), "
          f"style {args.style}, {args.threads} threads, "
          f"{'batch-invariant' if args.invariant else 'unpadded'} steps")
    print("\n".join(summary(rows)))


if __name__ == "__main__":
    main()
