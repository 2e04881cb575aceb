"""How far below zstd could an entropy coder take quantized KV codes? (issue 30: "an entropy
coder that beats zstd on the quantized symbols, if it measurably does")

`python -m kvedge.bench.entropy_bound [--model M] [--tokens 1024] [--bits 4,2]`: one SQuAD v2
article of the tuning split (its leading paragraphs up to `--tokens`), prefilled as the cloud
prefills a pack; each (layer, KV head) tensor quantized as `int<b>` quantizes it (keys per
channel, values per token, groups of 64). Per kind, bits per code of:

- zstd over the packed codes (what `int<b>+zstd` stores, level 3);
- the ideal static order-0 code (entropy of one histogram per tensor, + its 16-entry table):
  the best a range/ANS coder with a per-tensor categorical model (`constriction`'s) can do;
- the ideal order-1 code, each code conditioned on the previous token's code in its channel
  (one 16 × 16 table per tensor): a context model such a coder would need.

These are lower bounds for those models (ideal code lengths; a real coder adds a little), so
a coder is worth building only where the bound is well below zstd.
"""
from __future__ import annotations

import numpy as np
import torch
import zstandard

TABLE_BITS = 8  # one byte per histogram entry: what storing a model would cost, at least


def order0_bits(codes: np.ndarray, levels: int) -> float:
    counts = np.bincount(codes.ravel(), minlength=levels).astype(float)
    seen = counts[counts > 0]
    return float(-(seen * np.log2(seen / seen.sum())).sum()) + levels * TABLE_BITS


def order1_bits(codes: np.ndarray, levels: int) -> float:
    """Each code given the previous token's code in the same channel (the first row given
    0)."""
    prev = np.vstack([np.zeros((1, codes.shape[1]), dtype=codes.dtype), codes[:-1]])
    joint = np.bincount((prev * levels + codes).ravel(), minlength=levels * levels)
    joint = joint.reshape(levels, levels).astype(float)
    given = joint / np.maximum(joint.sum(1, keepdims=True), 1)
    logs = np.log2(np.where(joint > 0, given, 1.0))
    return float(-(joint * logs).sum()) + levels * levels * TABLE_BITS


def article_kv(model: str, tokens: int) -> tuple[list[int], list, list]:
    """(token ids, keys, values) of the first SQuAD v2 tuning article's leading paragraphs up
    to `tokens`, prefilled as the cloud prefills a pack: pre-RoPE, (H, T, D) per layer."""
    from kvedge.bench.real.squad import squad_items
    from kvedge.cloud.workers import PrefillEngine

    engine = PrefillEngine(model)
    tok = engine.loaded.tokenizer
    item, = squad_items(1, length=tokens, count_tokens=lambda s: len(tok(s)["input_ids"]))
    ids = tok(item.documents[0])["input_ids"]
    keys, values, _ = engine.prefill_segment(ids)
    return ids, keys, values


def measure(model: str, tokens: int, widths: list[int]) -> list[dict]:
    from kvedge.kernels.quant import quantize, unpack_codes

    ids, keys, values = article_kv(model, tokens)
    zstd = zstandard.ZstdCompressor(level=3)
    rows = []
    for bits in widths:
        for kind, layers in (("key", keys), ("value", values)):
            z = h0 = h1 = n = 0.0
            for layer in layers:
                for x in layer.float():
                    q = quantize(x, bits, 64, kind == "key")
                    codes = unpack_codes(q.packed, bits, x.shape[1]).numpy().astype(np.int64)
                    n += codes.size
                    z += 8 * len(zstd.compress(q.packed.numpy().tobytes()))
                    h0 += order0_bits(codes, 1 << bits)
                    h1 += order1_bits(codes, 1 << bits)
            rows.append({"bits": bits, "kind": kind, "tokens": len(ids), "zstd": z / n,
                         "order0": h0 / n, "order1": h1 / n})
    return rows


def article_options(argv: list[str] | None, doc: str, tokens: int,
                    bits: str) -> tuple[str, int, list[int]]:
    """(model, tokens, bit widths) from the command line of a bench over `article_kv` (this
    module's and `quant_error`'s), one torch thread set."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--tokens", type=int, default=tokens)
    ap.add_argument("--bits", default=bits)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    return args.model, args.tokens, [int(b) for b in args.bits.split(",")]


def main(argv: list[str] | None = None) -> None:
    model, tokens, widths = article_options(argv, __doc__, 1024, "4,2")
    rows = measure(model, tokens, widths)
    print(f"{model}, {rows[0]['tokens']} tokens of a SQuAD tuning article; bits per code")
    print("| codes | zstd | ideal order-0 (per tensor) | ideal order-1 (previous token) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| int{r['bits']} {r['kind']}s | {r['zstd']:.3f} | {r['order0']:.3f} "
              f"| {r['order1']:.3f} |")


if __name__ == "__main__":
    main()
