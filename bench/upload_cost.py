"""What an upload costs per token, per codec: a KB's packs made as the gateway's ingest makes
them (`PrefillEngine.segment` + `encode`), their bytes against raw fp16 KV, and where one
pack's bytes go (K/V codes, quantization scales, side tensors, container).

    python -m kvedge.bench.upload_cost int8+zstd int4+zstd "kvtc:bits=3,embed=false"

Defaults: the bundled KB (apps/demo_kb), 512-token segments and packs without SamKV's side
tensors (the gateway's defaults; `--side-tensors` adds them, as `kvctl cloud up
--side-tensors` does).
"""
from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

from kvedge.common.pack.codecs import DEFAULT_CODEC

DEMO_KB = Path(__file__).resolve().parents[1] / "apps" / "demo_kb"


def pack_parts(data: bytes) -> Counter:
    """Bytes per part kind of one pack ("k.packed", "summary.data", ...) and "container":
    the header, manifest and payload framing no tensor owns."""
    from kvedge.common.pack.format import open_pack

    pack = open_pack(data)
    parts: Counter = Counter()
    for name in pack.manifest.tensors:
        for part, raw in pack.container.tensor_parts(name):
            parts[f"{name.split('.')[0]}.{part}"] += raw.data.nbytes
    parts["container"] = len(data) - sum(parts.values())
    return parts


def main(argv: list[str] | None = None) -> None:
    from kvedge.cloud.workers import PrefillEngine

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("codecs", nargs="*", default=[DEFAULT_CODEC])
    ap.add_argument("--kb", type=Path, default=DEMO_KB, help="a folder of .md/.txt files")
    ap.add_argument("--segment-tokens", type=int, default=512)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--side-tensors", action="store_true",
                    help="packs carry SamKV's query cache and block summaries")
    args = ap.parse_args(argv)
    engine = PrefillEngine(args.model)
    files = {p.name: p.read_text() for p in sorted(args.kb.iterdir())
             if p.suffix in (".md", ".txt")}
    segments = engine.segment(files, args.segment_tokens, False)
    print("| codec | packs | tokens | pack B/token | × below fp16 KV | encode s |")
    print("|---|---|---|---|---|---|")
    for codec in args.codecs:
        start = time.perf_counter()
        packs = [engine.encode(s, "default", codec, side_tensors=args.side_tensors)
                 for s in segments]
        size = sum(len(p.data) for p in packs)
        tokens = sum(p.n_tokens for p in packs)
        fp16 = engine.kv_shape.fp16_bytes(tokens)
        print(f"| `{codec}` | {len(packs)} | {tokens} | {size / tokens:,.0f} | "
              f"{fp16 / size:.2f} | {time.perf_counter() - start:.0f} |", flush=True)
        parts = pack_parts(packs[0].data)
        print(f"|  first pack ({packs[0].n_tokens} tokens), B/token: " + ", ".join(
            f"{k} {v / packs[0].n_tokens:,.0f}" for k, v in parts.most_common()) + " | | | | | |")


if __name__ == "__main__":
    main()
