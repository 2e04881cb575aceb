"""MKL's default and strict modes side by side: `python -m kvedge.bench.blas_mode`.

`kvedge.common` asks MKL (torch's CPU BLAS) for its strict reproducible mode,
`MKL_CBWR=AUTO,STRICT`, so that a row of a product gets the same bits whatever the row
count and a decode step is batch-invariant without padding rows
(`kvedge.common.model.batch.ROW_MULTIPLE`). This measures what the mode buys and costs on
the machine at hand. MKL reads the variable once, at its first call, so each mode runs in a
child process of its own (`MKL_CBWR=AUTO` for the default), the modes alternating
`--rounds` times so that a loaded machine's drift falls on both; the table gives each
mode's median and strict / default. Per child:

- the load-time probe's verdict on the model's fp32 weights (`quant.invariant_multiple`,
  `Runtime.decode_row_multiple`): whether a step needs padding rows at all;
- a prefill of `--context` random tokens (`Runtime.prefill`, seconds): what the cloud's
  packs, the bench's ceilings and every recompute pay;
- one request's decode step over that context (`batch.decode_step`, ms), unpadded and
  padded to ROW_MULTIPLE rows (what a lone answer paid before, when fp32 was padded).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

MODES = {"default": "AUTO", "strict": "AUTO,STRICT"}


def measure(model: str, context: int, steps: int, threads: int) -> dict:
    """One child's figures, in this process (whose MKL mode its environment decided)."""
    import time

    import torch

    from kvedge.bench.load import dense_requests, per_call_s
    from kvedge.common.model.batch import ROW_MULTIPLE, decode_step
    from kvedge.common.model.models import load_model
    from kvedge.common.model.runtime import Runtime

    torch.set_num_threads(threads)
    rt = Runtime(load_model(model))
    rt.prefill(torch.arange(64), logits="none")  # warm-up
    start = time.perf_counter()
    make = dense_requests(rt, context)
    prefill_s = time.perf_counter() - start

    def step_ms(rows: int) -> float:
        state = make(steps + 2, steps + 2)
        return 1e3 * per_call_s(lambda: decode_step(rt, [state], rows), steps)

    return {"mkl_cbwr": os.environ.get("MKL_CBWR"), "invariant": rt.decode_row_multiple == 1,
            "prefill_s": prefill_s,
            "step_1_row_ms": step_ms(1), f"step_{ROW_MULTIPLE}_rows_ms": step_ms(ROW_MULTIPLE)}


def child(mode: str, args) -> dict:
    env = {**os.environ, "MKL_CBWR": MODES[mode]}
    out = subprocess.run(
        [sys.executable, "-m", "kvedge.bench.blas_mode", "--child", "--model", args.model,
         "--context", str(args.context), "--steps", str(args.steps),
         "--threads", str(args.threads)],
        env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def table(runs: dict[str, list[dict]]) -> str:
    keys = [k for k in runs["default"][0] if k.endswith(("_s", "_ms"))]
    lines = ["| | default | strict | strict / default |", "|---|---|---|---|"] + [
        f"| {label} | " + " | ".join(", ".join(sorted({str(r[key]) for r in runs[m]}))
                                    for m in MODES) + " | |"
        for label, key in (("MKL_CBWR", "mkl_cbwr"),
                           ("fp32 rows invariant (probe)", "invariant"))]
    for key in keys:
        default, strict = (statistics.median(r[key] for r in runs[m]) for m in MODES)
        lines.append(f"| {key} | {default:.3g} | {strict:.3g} | {strict / default:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from kvedge.bench.decode_speed import add_decode_options

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_decode_options(ap)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.model, args.context, args.steps, args.threads)))
        return
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            runs[mode].append(child(mode, args))
    print(f"{args.model}, {args.context}-token context, {args.threads} threads, "
          f"{args.rounds} rounds (medians)")
    print(table(runs))


if __name__ == "__main__":
    main()
