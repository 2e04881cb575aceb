"""Milliseconds per decoded token, side by side in one process (issue 28's first look).

`python -m kvedge.bench.decode_speed [--model M] [--context 1300] [--steps 20] [--threads 2]`:
one request over a dense cache of `context` random tokens, each path timed over `steps - 1`
steps after a warm one:

- the scheduler's `decode_step`, unpadded and padded to `ROW_MULTIPLE` rows (the served
  default, batch-invariant), with int8, fp16 and bf16 weights (`kvedge serve --decode-weights
  int8|fp16|bf16`, padded to the row multiple the load-time probe found:
  `Runtime.decode_row_multiple`), and `Runtime.forward` of one token
  (`bench.load.decode_costs`);
- transformers' own forward with its `DynamicCache` (the reference implementation);
- one pass over every 2-D weight with one row, in fp32, bf16 and fp16: what the matmuls of a
  step cost at each precision (decode on a CPU is bound by reading the weights); and in fp32,
  int8, fp16 and bf16 with 1, 4, 8, 16, 64 and 128 rows: what the rows a step carries cost
  (the padding rows that keep answers batch-invariant, and the draft rows of speculation,
  `batch.SPEC_ROWS`) and, at 64–128 rows, what an answer's start's matmuls cost
  (`kvedge serve --prompt-weights`);
- llama.cpp (`llama-cpp-python`, when importable: a reference point, never a dependency of
  the service) decoding the very GGUF file the model was converted from, one token per
  `eval`, on the same threads: the distance to a runtime built for CPU decode.

`--compile` adds the fixed-buffer step (`kvedge.common.model.static_decode.StaticDecode`)
eager and under `torch.compile` (CPU inductor, weights frozen as constants: gpt-fast's recipe),
in fp32 and int8 decode weights, with the compile's seconds and the largest |Δlogits| against
the eager step over 5 greedy steps.
"""
from __future__ import annotations


def transformers_ms(loaded, context: int, steps: int, seed: int = 0) -> float:
    import torch
    from transformers import DynamicCache

    from kvedge.bench.load import per_call_s

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, loaded.config.vocab_size, (1, context), generator=gen)
    with torch.no_grad():
        cache = DynamicCache(config=loaded.config)
        last = [loaded.model(ids, past_key_values=cache, use_cache=True).logits[0, -1].argmax()]

        def step():  # the greedy token fed back, as decoding does
            last[0] = loaded.model(last[0].view(1, 1), past_key_values=cache,
                                   use_cache=True).logits[0, -1].argmax()
        return per_call_s(step, steps) * 1e3


def llamacpp_ms(gguf: str, context: int, steps: int, threads: int, seed: int = 0
                ) -> float | None:
    """ms per decoded token in llama.cpp over the same GGUF (None without llama-cpp-python)."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    import random

    from kvedge.bench.load import per_call_s

    llm = Llama(model_path=gguf, n_ctx=context + steps + 8, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    rng = random.Random(seed)
    llm.eval([rng.randrange(1000, llm.n_vocab()) for _ in range(context)])
    return per_call_s(lambda: llm.eval([rng.randrange(1000, llm.n_vocab())]), steps) * 1e3


def weight_pass_ms(loaded, dtype, repeats: int = 10, n_rows: int = 1) -> float:
    """One pass over every 2-D weight in `dtype`, or "int8" (quant.Int8Weight, fp32 rows)."""
    import torch

    from kvedge.bench.load import per_call_s
    from kvedge.common.model.quant import Int8Weight, linear

    params = [p.detach() for p in loaded.model.parameters() if p.dim() == 2]
    weights = [Int8Weight(p) for p in params] if dtype == "int8" else [p.to(dtype)
                                                                        for p in params]
    rows = {p.shape[1]: torch.randn(n_rows, p.shape[1], dtype=torch.float32 if dtype == "int8"
                                    else dtype) for p in params}

    def one_pass():
        for p, w in zip(params, weights):
            linear(rows[p.shape[1]], w)
    return per_call_s(one_pass, repeats + 1) * 1e3


def static_rows(model: str, context: int, steps: int, seed: int = 0) -> dict[str, float]:
    """ms per token of `StaticDecode.step`, eager and compiled, per decode weights; also the
    compile's seconds and max |Δlogits| (compiled vs eager) as rows of their own."""
    import torch._inductor.config as inductor

    from kvedge.bench.load import dense_requests
    from kvedge.common.model.models import load_model
    from kvedge.common.model.runtime import Runtime
    from kvedge.common.model.static_decode import StaticDecode

    rt = Runtime(load_model(model))
    make = dense_requests(rt, context, seed)

    def fresh() -> StaticDecode:
        return StaticDecode(rt, make(2, steps + 10), steps=steps + 10)

    rows = {}
    with inductor.patch(freezing=True):  # weights as constants: CPU inference's recipe
        for weights in ("fp32", "int8"):
            rt.use_decode_weights(weights)
            rows.update(_compiled_vs_eager(fresh, weights, steps))
    rt.use_decode_weights("fp32")
    return rows


def _compiled_vs_eager(fresh, weights: str, steps: int) -> dict[str, float]:
    import time

    import torch

    from kvedge.bench.load import per_call_s

    label = f"static step, {weights}"
    rows = {f"{label}, eager": per_call_s(fresh().step, steps) * 1e3}
    eager, run = fresh(), fresh()
    step, delta = torch.compile(run.step, dynamic=False), 0.0
    for i in range(5):  # the same greedy tokens fed to both; the first call compiles
        start = time.perf_counter()
        got = step().clone()
        if i == 0:
            rows[f"{label}: compile s"] = time.perf_counter() - start
        want = eager.step().clone()
        delta = max(delta, (want - got).abs().max().item())
        eager.token.fill_(int(want.argmax()))
        run.token.fill_(int(want.argmax()))
    rows[f"{label}: max |Δlogits| compiled vs eager"] = delta
    rows[f"{label}, torch.compile"] = per_call_s(step, steps) * 1e3  # slots: steps + 10
    return rows


def add_decode_options(ap) -> None:
    """The model, context, timed steps and threads of a decode measurement (also
    `kvedge.bench.blas_mode`'s)."""
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--context", type=int, default=1300)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)


def main(argv: list[str] | None = None) -> None:
    import argparse

    import torch

    from kvedge.bench.load import decode_costs
    from kvedge.common.model.models import load_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_decode_options(ap)
    ap.add_argument("--compile", action="store_true",
                    help="also the fixed-buffer step, eager and under torch.compile")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    costs = decode_costs(args.model, args.context, batches=(1, 4), steps=args.steps)
    loaded = load_model(args.model)
    rows = {**{k: v * 1e3 for k, v in costs.items()},
            "transformers forward with its cache": transformers_ms(loaded, args.context,
                                                                   args.steps)}
    if loaded.source.endswith(".gguf"):
        ms = llamacpp_ms(loaded.source, args.context, args.steps, args.threads)
        rows["llama.cpp, the same GGUF" if ms else
             "llama.cpp: not measured (pip install llama-cpp-python)"] = ms or float("nan")
    if args.compile:
        rows.update(static_rows(args.model, args.context, args.steps))
    print(f"{args.model}, {args.context}-token cache, {args.threads} threads")
    print("| path | ms per token |\n|---|---|")
    for name, ms in rows.items():
        print(f"| {name} | {ms:.3g} |" if "Δ" in name else f"| {name} | {ms:.1f} |")
    print("| weights, one row | ms per pass |\n|---|---|")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        print(f"| {str(dtype).removeprefix('torch.')} | {weight_pass_ms(loaded, dtype):.1f} |")
    print("| rows | fp32 weights, ms per pass | int8 weights, ms per pass "
          "| fp16 weights, ms per pass | bf16 weights, ms per pass |\n|---|---|---|---|---|")
    for n_rows in (1, 4, 8, 16, 64, 128):  # a step's rows, then an answer's start's
        print(f"| {n_rows} | " + " | ".join(
            f"{weight_pass_ms(loaded, w, n_rows=n_rows):.1f}"
            for w in (torch.float32, "int8", torch.float16, torch.bfloat16)) + " |")


if __name__ == "__main__":
    main()
