"""Seconds of one layer's eviction max votes at each query chunk, side by side.

`python -m kvedge.bench.key_votes [--context 4096] [--probe 2048] [--chunks 8,4,16,256]
[--rounds 7] [--threads 1]`: one cache layer of `context` random keys on Qwen2.5-0.5B's
head shapes (2 KV heads, 7 query heads each, head dim 64; `--kv-heads`, `--group`,
`--head-dim` for others), and a `probe` of queries after it — what KVzip's context
reconstruction (and ContrastKV's, which reads it) asks of `key_votes(reduce="max")` in each
layer. Each chunk is the number of queries that go through the softmax at a time
(`key_votes(chunk=)`; the eviction scorer's CPU default is `scoring.MAX_CHUNK`). Rounds
alternate the chunks in one process; the figures are medians of each call's thread CPU
time (`time.thread_time`: what the call cost, not what the box's neighbours did to the
wall clock). Every chunk's votes are checked against the first chunk's (equal to the bit,
or within an ulp where a very few rows take another matmul kernel) before anything is
timed.
"""
from __future__ import annotations

import statistics
import time


def layer_and_probe(context: int, probe: int, kv_heads: int, group: int, head_dim: int,
                    seed: int = 0, device="cpu", dtype=None):
    """A dense cache layer of `context + probe` keys (the probe's own last) and the probe's
    queries (kv_heads, group, probe, head_dim) at positions context.., on `device`."""
    import torch

    from kvedge.common.model.kvcache import DenseKV

    gen = torch.Generator().manual_seed(seed)
    n = context + probe
    to = {"device": device, "dtype": dtype or torch.float32}
    layer = DenseKV(torch.randn(kv_heads, n, head_dim, generator=gen).to(**to),
                    torch.randn(kv_heads, n, head_dim, generator=gen).to(**to),
                    torch.arange(n, device=device))
    q = torch.randn(kv_heads, group, probe, head_dim, generator=gen).to(**to)
    return layer, q, torch.arange(context, n, device=device)


def votes(layer, q, q_pos, context: int, chunk: int | None):
    from kvedge.common.model.attention import key_votes

    return key_votes(q, q_pos, layer, q.shape[-1] ** -0.5, None, context, "max", None, chunk)


def measure(context: int, probe: int, chunks: list[int], rounds: int, kv_heads: int = 2,
            group: int = 7, head_dim: int = 64) -> dict[int, float]:
    """Median thread-CPU seconds of one layer's votes at each chunk."""
    import torch

    layer, q, q_pos = layer_and_probe(context, probe, kv_heads, group, head_dim)
    first = votes(layer, q, q_pos, context, chunks[0])
    for chunk in chunks[1:]:
        torch.testing.assert_close(votes(layer, q, q_pos, context, chunk), first,
                                   atol=1e-7, rtol=1e-6)
    times: dict[int, list[float]] = {chunk: [] for chunk in chunks}
    for _ in range(rounds):
        for chunk in chunks:
            start = time.thread_time()
            votes(layer, q, q_pos, context, chunk)
            times[chunk].append(time.thread_time() - start)
    return {chunk: statistics.median(t) for chunk, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    import argparse

    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--probe", type=int, default=2048)
    ap.add_argument("--chunks", default="8,4,16,256",
                    help="queries through the softmax at a time, comma-separated; the first "
                         "is the one the others are reported against")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--group", type=int, default=7)
    ap.add_argument("--head-dim", type=int, default=64)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    chunks = [int(c) for c in args.chunks.split(",")]
    got = measure(args.context, args.probe, chunks, args.rounds, args.kv_heads, args.group,
                  args.head_dim)
    print(f"one layer's max votes: {args.probe} probe queries over {args.context} context "
          f"keys, {args.kv_heads} KV heads × {args.group}, head dim {args.head_dim}, "
          f"{args.threads} thread(s), medians of {args.rounds} (thread CPU time)")
    print("| chunk | seconds | / chunk " + str(chunks[0]) + " |")
    print("|---|---|---|")
    for chunk, seconds in got.items():
        print(f"| {chunk} | {seconds:.3f} | {seconds / got[chunks[0]]:.2f} |")


if __name__ == "__main__":
    main()
