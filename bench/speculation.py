"""Time to the whole answer, with and without prompt-lookup drafts and lower-precision decode
weights (int8, fp16, bf16) and prompt weights (bf16 starts), on real questions (issues 27, 28).

`python -m kvedge.bench.speculation [--model M] [--questions 30] [--strategies recompute,epic]
[--style short|sentence] [--spec-rows 4,8] [--decode-weights fp32,fp16] [--no-batch-invariant]
[--out F]`:
HotpotQA questions of the
tuning split (`hotpot-fixed`: each over its 10 paragraphs, prefilled as packs) answered through
the served path (`EdgeEngine.answer`, the scheduler, batch-invariant steps unless told
otherwise) by each strategy in every mode in a row — for each decode-weight format, drafts
off (`spec_rows` 0), then on — so all see the same machine. Per strategy and mode: median
TTFT, TPOT and time to the whole answer, tokens per decode step, the drafts' accept rate,
mean F1 against HotpotQA's answers, and how many answers differ from the first mode's
(fp32 weights, no drafts). Drafts change none (under greedy a step keeps only the drafts
the model's own picks agree with); int8 and fp16 weights may (`kvedge.common.model.quant`),
and the count is their agreement rate.

`--style short` asks HotpotQA's way (the answer only: a few tokens); `sentence` asks for one
sentence (~20–30 tokens), the answers users of a chat page read.
"""
from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable

STYLES = {
    "short": None,  # HotpotQA's own instruction (kvedge.bench.real.hotpotqa.INSTRUCTION)
    "sentence": ("Answer the question in one full sentence, using the passages above. "
                 "Only give me the sentence and do not output any other words."),
}


def run(model: str, questions: int, strategies: list[str], style: str,
        spec_rows: int | tuple[int, ...],
        max_new_tokens: int, seed: int = 0, invariant: bool = True,
        formats: tuple[str, ...] = ("fp32",), done: list[dict] = (),
        sink: Callable[[dict], None] | None = None) -> list[dict]:
    """Every (question, strategy, weights, drafts) answer's row, `done`'s rows (an earlier
    run's, same arguments) taken as they are and the rest measured, each handed to `sink` as
    it is made (a long run cut off keeps what it measured)."""
    from kvedge.bench.answer_metrics import qa_scores
    from kvedge.bench.real.hotpotqa import hotpot_fixed_items
    from kvedge.bench.suites import Bench
    from kvedge.edge.strategies import get_strategy

    bench = Bench(model)
    scheduler = bench.engine.scheduler
    scheduler.invariant = invariant  # off: a lone answer's plain step is one row, no padding
    rows, kept = [], {_key(r): r for r in done}
    modes = [(name, fmt, spec) for name in strategies for fmt in formats
             for spec in dict.fromkeys((0, *((spec_rows,) if isinstance(spec_rows, int)
                                             else spec_rows)))]
    for item in hotpot_fixed_items(10, questions, seed):
        if all((item.key, *mode) in kept for mode in modes):  # no packs to build
            rows += [kept[(item.key, *mode)] for mode in modes]
            continue
        segments = [ctx for doc in item.documents for ctx, _ in bench.packs(doc, False)]
        q = item.questions[0]
        composed = bench.engine.compose(segments, q.text, STYLES[style] or q.instruction)
        for name, fmt, spec in modes:
            use_weights(bench.engine.rt, fmt)  # the scheduler is idle between answers
            if (row := kept.get((item.key, name, fmt, spec))) is not None:
                rows.append(row)
                continue
            scheduler.spec_rows = spec
            start = time.perf_counter()
            *_, stats = bench.engine.answer(composed, get_strategy(name), max_new_tokens)
            rows.append({**stats, **qa_scores(stats["answer"], q.answers),
                         "strategy": name, "weights": fmt, "spec_rows": spec,
                         "item": item.key, "answer_s": time.perf_counter() - start})
            if sink is not None:
                sink(rows[-1])
    use_weights(bench.engine.rt, formats[0])
    return rows


def use_weights(rt, fmt: str) -> None:
    """A mode's weights on `rt`: DECODE, or DECODE/PROMPT (prompt weights fp32 if not given)."""
    decode, _, prompt = fmt.partition("/")
    rt.use_decode_weights(decode)
    rt.use_prompt_weights(prompt or "fp32")


def _key(row: dict) -> tuple:
    return row["item"], row["strategy"], row.get("weights", "fp32"), row["spec_rows"]


def summary(rows: list[dict]) -> list[str]:
    def med(values):
        return statistics.median(values) if values else float("nan")

    out = ["| strategy | weights | drafts | TTFT s | TPOT ms | whole answer s | tokens "
           "| tokens/step | accepted/drafted | F1 | F1 − first mode [95 % CI] | answers changed |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    modes = list(dict.fromkeys((r.get("weights", "fp32"), r["spec_rows"]) for r in rows))
    plain = {(r["strategy"], r["item"]): r for r in rows
             if (r.get("weights", "fp32"), r["spec_rows"]) == modes[0]}
    for name in dict.fromkeys(r["strategy"] for r in rows):
        for fmt, spec in modes:
            sel = [r for r in rows if r["strategy"] == name and r["spec_rows"] == spec
                   and r.get("weights", "fp32") == fmt]
            tokens = sum(r["tokens"] for r in sel)
            steps = sum(r["decode_steps"] for r in sel)
            drafted = sum(r["drafted"] for r in sel)
            changed = sum(r["answer"] != plain[name, r["item"]]["answer"] for r in sel)
            f1 = [r["f1"] for r in sel if r.get("f1") is not None]
            out.append(
                f"| {name} | {fmt} | {spec or 'off'} "
                f"| {med([r['first_token_s'] for r in sel]):.2f} "
                f"| {med([r['tpot_s'] for r in sel if r['tokens'] > 1]) * 1e3:.0f} "
                f"| {med([r['answer_s'] for r in sel]):.2f} | {tokens / len(sel):.1f} "
                f"| {(steps + sum(r['accepted'] for r in sel)) / max(steps, 1):.2f} "
                f"| {sum(r['accepted'] for r in sel)}/{drafted} "
                f"| {sum(f1) / len(f1) if f1 else float('nan'):.3f} "
                f"| {_f1_change(sel, plain, name)} | {changed}/{len(sel)} |")
    return out


def _f1_change(sel: list[dict], plain: dict, name: str) -> str:
    """Mean F1 of a mode minus the first mode's, on the same questions, with its paired
    bootstrap interval (kvedge.bench.bootstrap)."""
    from kvedge.bench.bootstrap import paired_bootstrap

    pairs = [(r["f1"], plain[name, r["item"]]["f1"]) for r in sel
             if r.get("f1") is not None and plain[name, r["item"]].get("f1") is not None]
    if not pairs:
        return "-"
    d = paired_bootstrap([a for a, _ in pairs], [b for _, b in pairs]).diff
    return f"{d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}]" if d.low is not None else \
        f"{d.value:+.3f}"


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json

    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--questions", type=int, default=30)
    ap.add_argument("--strategies", default="recompute,epic")
    ap.add_argument("--style", choices=sorted(STYLES), default="sentence")
    ap.add_argument("--spec-rows", default="8",
                    help="draft rows for the 'on' modes; comma-separated for several (4,8)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--decode-weights", default="fp32",
                    help="comma-separated decode-weight formats, each run with drafts off and "
                    "on; changed answers count against the first (e.g. fp32,int8); "
                    "DECODE/PROMPT also sets the prompt weights (bf16/bf16: bf16 starts)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-batch-invariant", dest="invariant", action="store_false",
                    help="unpadded steps (`kvedge serve --no-batch-invariant`): drafts then "
                    "add rows to a one-row step instead of filling padding")
    ap.add_argument("--out", help="every answer's row, appended as it is made (JSON lines); "
                    "rows already there are kept and not measured again, so rerunning the "
                    "same command finishes a run that was cut off")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    done, out = [], Path(args.out) if args.out else None
    if out is not None and out.exists():
        done = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    with open(out, "a") if out is not None else nullcontext() as f:
        def sink(row: dict) -> None:
            f.write(json.dumps(row, default=str) + "\n")
            f.flush()

        rows = run(args.model, args.questions, args.strategies.split(","), args.style,
                   tuple(int(n) for n in args.spec_rows.split(",")), args.max_new_tokens,
                   invariant=args.invariant, formats=tuple(args.decode_weights.split(",")),
                   done=done, sink=sink if f is not None else None)
    print(f"{args.model}, {args.questions} HotpotQA questions (tuning split, 10 paragraphs), "
          f"style {args.style}, {args.threads} threads, "
          f"{'batch-invariant' if args.invariant else 'unpadded'} steps")
    print("\n".join(summary(rows)))


if __name__ == "__main__":
    main()
