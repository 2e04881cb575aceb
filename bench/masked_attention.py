"""The masked attention of a partial recompute, with and without the key cut, side by side.

`python -m kvedge.bench.masked_attention [--segments 10,30] [--tokens 140] [--boundary 20]
[--repeats 7] [--threads 2]`: one layer's `gqa_attention` call as legolink makes it — the
first and last `boundary` tokens of each of `segments` segments of `tokens` tokens recomputed
against the whole dense cache (HotpotQA's paragraphs are ~140 tokens; legolink's default
boundary is 20) — on random tensors of Qwen2.5-0.5B's and SmolLM2-135M's attention shapes, and
the same for a top-k set (every 7th token, a3/cacheblend's ~15 %). Each call is timed
with the key cut (`attention._query_chunks`) and without it (CUT_CHUNK past every key count:
the single masked call over all keys the runtime made before), alternating, so the ratio
comes from one run on one machine state; with the largest |Δ| between the two outputs.

`--model M` adds the whole start: `Runtime.forward` of legolink's recomputed tokens (random
ids) through every layer against a dense cache of the same random context, cut and uncut,
with the full prefill of that context (recompute's forward) beside them — what the cut buys
a first token. `--threads 1` times CPU seconds of the calling thread (`time.thread_time`),
which a busy machine disturbs far less than wall time.
"""
from __future__ import annotations

import argparse
import time
from contextlib import contextmanager, nullcontext
from statistics import median

SHAPES = {"qwen2.5-0.5b": (2, 7, 64), "smollm2-135m": (3, 3, 64)}  # (KV heads, group, dim)


def legolink_positions(segments: int, tokens: int, boundary: int) -> list[int]:
    return [s * tokens + i for s in range(segments) for i in range(tokens)
            if i < boundary or i >= tokens - boundary]


def top_k_positions(segments: int, tokens: int, every: int = 7) -> list[int]:
    return list(range(0, segments * tokens, every))


@contextmanager
def uncut():
    """`gqa_attention` as before the key cut: one masked call over every key."""
    from kvedge.common.model import attention

    was = attention.CUT_CHUNK
    attention.CUT_CHUNK = 1 << 62
    try:
        yield
    finally:
        attention.CUT_CHUNK = was


def alternating(timed, repeats: int) -> tuple[float, float]:
    """Median of `timed()` (its own seconds) uncut and cut, the two paths taking turns."""
    times = {uncut: [], nullcontext: []}
    for _ in range(repeats):
        for path, seconds in times.items():
            with path():
                seconds.append(timed())
    return median(times[uncut]), median(times[nullcontext])


def measure(shape: tuple[int, int, int], n_keys: int, recomputed: list[int], repeats: int,
            seed: int = 0, clock=time.perf_counter) -> dict:
    """One layer's call on random tensors, cut and uncut; `clock` times it (wall seconds,
    or `time.thread_time`: this thread's CPU seconds)."""
    import torch

    from kvedge.common.model.attention import gqa_attention

    n_kv, group, dim = shape
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n_kv, group, len(recomputed), dim, generator=gen)
    k, v = (torch.randn(n_kv, n_keys, dim, generator=gen) for _ in range(2))
    q_pos, k_pos = torch.tensor(recomputed), torch.arange(n_keys)

    def call():
        return gqa_attention(q, k, v, q_pos, k_pos, dim ** -0.5)

    def timed() -> float:
        start = clock()
        call()
        return clock() - start

    with uncut():
        before = call()
    after = call()
    uncut_ms, cut_ms = (t * 1e3 for t in alternating(timed, repeats))
    return {"queries": len(recomputed), "keys": n_keys, "uncut_ms": uncut_ms, "cut_ms": cut_ms,
            "ratio": cut_ms / uncut_ms, "max_abs_diff": float((after - before).abs().max())}


def start_seconds(model: str, segments: int, tokens: int, boundary: int, repeats: int,
                  seed: int = 0, clock=time.perf_counter) -> dict:
    """legolink's forward (every layer, its recomputed tokens) cut and uncut, and the full
    prefill of the same context, in seconds of `clock`, on the model's own weights."""
    import torch

    from kvedge.common.model.models import load_model
    from kvedge.common.model.runtime import Runtime

    rt = Runtime(load_model(model))
    n = segments * tokens
    ids = torch.randint(0, rt.config.vocab_size, (n,),
                        generator=torch.Generator().manual_seed(seed))
    start = clock()
    pre = rt.prefill(ids, logits="none")
    prefill_s = clock() - start
    chosen = torch.tensor(legolink_positions(segments, tokens, boundary))

    def forward() -> float:
        cache = rt.dense_cache(pre.keys, pre.values, torch.arange(n))
        start = clock()
        rt.forward(ids[chosen], chosen, cache, logits="none")
        return clock() - start

    uncut_s, cut_s = alternating(forward, repeats)
    return {"tokens": n, "recomputed": len(chosen), "prefill_s": prefill_s, "uncut_s": uncut_s,
            "cut_s": cut_s, "ratio": cut_s / uncut_s}


def main(argv: list[str] | None = None) -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--segments", default="10,30")
    p.add_argument("--tokens", type=int, default=140)
    p.add_argument("--boundary", type=int, default=20)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", help="also time legolink's whole forward on this model")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    # one thread: its CPU seconds, what the call costs less what a busy box adds
    clock = time.thread_time if a.threads == 1 else time.perf_counter
    print("| shape | queries | segments × tokens | keys | uncut ms | cut ms | cut / uncut "
          "| max abs Δ |")
    print("|---|---|---|---|---|---|---|---|")
    for segments in (int(s) for s in a.segments.split(",")):
        sets = {"legolink": legolink_positions(segments, a.tokens, a.boundary),
                "top-k 1/7": top_k_positions(segments, a.tokens)}
        for name, shape in SHAPES.items():
            for what, positions in sets.items():
                r = measure(shape, segments * a.tokens, positions, a.repeats, clock=clock)
                print(f"| {name} | {what} ({r['queries']}) | {segments} × {a.tokens} "
                      f"| {r['keys']} | {r['uncut_ms']:.1f} | {r['cut_ms']:.1f} "
                      f"| {r['ratio']:.2f} | {r['max_abs_diff']:.1e} |", flush=True)

    if a.model:
        print(f"\n{a.model}: legolink's forward (every layer) against the full prefill")
        print("| segments × tokens | recomputed | prefill s | uncut s | cut s | cut / uncut "
              "| uncut / prefill | cut / prefill |")
        print("|---|---|---|---|---|---|---|---|")
        for segments in (int(s) for s in a.segments.split(",")):
            r = start_seconds(a.model, segments, a.tokens, a.boundary, max(1, a.repeats // 3),
                              clock=clock)
            print(f"| {segments} × {a.tokens} | {r['recomputed']} | {r['prefill_s']:.2f} "
                  f"| {r['uncut_s']:.2f} | {r['cut_s']:.2f} | {r['ratio']:.2f} "
                  f"| {r['uncut_s'] / r['prefill_s']:.3f} | {r['cut_s'] / r['prefill_s']:.3f} |",
                  flush=True)


if __name__ == "__main__":
    main()
