"""Fetch and decode alone, without a model: an ask's missing packs fetched then loaded
(fetch-then-load) against decoded while they arrive, the next one's transfer behind the last
one's bytes (the edge's streamed cold path: `Fetcher.fetch(decode=True)`,
`Fetcher.fetch_in_order`).

`python -m kvedge.bench.stream_fetch --mbit 10,100,1000`: `--packs` packs shaped like
SmolLM2-135M's (30 layers × 3 KV heads × 64, 256 tokens, int8+zstd; random KV) come from an
in-process client that paces 1 MiB chunks (the gateway's FetchPack chunk) at the bandwidth
after a 20 ms round trip; the real `Fetcher` and `PackCache` on a temporary folder take
them. Both ways run in turn, `--repeat` times; medians. It isolates what streaming can save
(verification and decoding hidden behind the transfer) from the model's share of a cold
TTFT, which `bench.link_ttft` measures whole.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from types import SimpleNamespace

FP = "ab" * 32
SMOLLM2 = (30, 3, 9, 64)  # layers, KV heads, query heads, head dim
CHUNK = 1 << 20


def make_packs(n: int, tokens: int = 256, shape=SMOLLM2) -> dict[str, bytes]:
    """pack id → bytes of `n` random packs of `shape`, int8+zstd, with side tensors."""
    import torch

    from kvedge.common.pack import KVContext, encode_pack, pack_id

    layers, heads, q_heads, dim = shape
    out = {}
    for seed in range(n):
        g = torch.Generator().manual_seed(seed)

        def kv(h: int) -> list:
            return [torch.randn(h, tokens, dim, generator=g).half() for _ in range(layers)]

        ctx = KVContext.from_dense(kv(heads), kv(heads), list(range(tokens)),
                                   model_fingerprint=FP, tokenizer_id="cd" * 32,
                                   positions=list(range(tokens)), queries=kv(q_heads),
                                   query_tokens=1, block_size=64)
        data = encode_pack(ctx, "int8+zstd")
        out[pack_id(data)] = data
    return out


class PacedCloud:
    """A cloud client whose packs arrive in CHUNK-byte chunks at `mbit_s`, the first after
    `rtt_s`: chunk i is handed over no sooner than it would have crossed the link."""

    def __init__(self, packs: dict[str, bytes], mbit_s: float, rtt_s: float = 0.02):
        self.packs, self.rate, self.rtt = packs, mbit_s * 1e6 / 8, rtt_s

    def fetch_pack(self, namespace: str, pack_id: str, offset: int = 0, length: int = 0):
        data, start = self.packs[pack_id], time.perf_counter() + self.rtt
        for at in range(offset, len(data), CHUNK):
            piece = data[at:at + CHUNK]
            time.sleep(max(0.0, start + (at - offset + len(piece)) / self.rate
                           - time.perf_counter()))
            yield SimpleNamespace(offset=at, data=piece, total=len(data))


def fetch_and_load(packs: dict[str, bytes], mbit_s: float, streamed: bool) -> float:
    """Seconds until every pack is cached and decoded, as an ask's `_segments` does it."""
    from kvedge.edge.fetcher import Fetcher
    from kvedge.edge.packcache import PackCache

    with tempfile.TemporaryDirectory(prefix="kvstream-") as folder:
        cache = PackCache(folder, FP)
        fetcher, ids = Fetcher(PacedCloud(packs, mbit_s), cache), list(packs)
        start = time.perf_counter()
        if streamed:
            fetcher.fetch_in_order("default", ids, decode=True)
        for pid in ids:
            fetcher.fetch("default", pid, decode=streamed)
            cache.load(pid)
        return time.perf_counter() - start


def run(mbits, n_packs: int = 3, repeat: int = 5, shape=SMOLLM2, tokens: int = 256) -> list:
    packs = make_packs(n_packs, tokens, shape)
    wire = sum(map(len, packs.values()))
    rows = []
    for mbit in mbits:
        times = {False: [], True: []}
        for _ in range(repeat):
            for streamed in (False, True):
                times[streamed].append(fetch_and_load(packs, mbit, streamed))
        then, streamed = (statistics.median(times[s]) for s in (False, True))
        rows.append({"mbit_s": mbit, "packs": n_packs, "pack_bytes": wire // n_packs,
                     "wire_s": wire * 8 / (mbit * 1e6) + n_packs * 0.02,
                     "fetch_then_load_s": then, "streamed_s": streamed})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| link | packs × bytes | on the wire s | fetch-then-load s | streamed s | "
             "streamed / fetch-then-load |", "|---" * 6 + "|"]
    for r in rows:
        lines.append(f"| {r['mbit_s']:g} Mbit/s, 20 ms | {r['packs']} × {r['pack_bytes']:,} | "
                     f"{r['wire_s']:.2f} | {r['fetch_then_load_s']:.2f} | "
                     f"{r['streamed_s']:.2f} | "
                     f"{r['streamed_s'] / r['fetch_then_load_s']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import argparse

    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mbit", default="10,100,1000")
    ap.add_argument("--packs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(table(run([float(m) for m in args.mbit.split(",")], args.packs, args.repeat)))


if __name__ == "__main__":
    main()
