"""Which layers' keys and values can take fewer bits? A per-layer screen, and the widths it
allocates for a byte target (issue 30: "per-layer budgets ... measured one by one").

`python -m kvedge.bench.layer_sensitivity [--model M] [--items 2] [--questions 10]
[--key-widths 5,4] [--value-widths 4,3,2] [--ratio 4.15] [--out FILE.json] [--load FILE.json]`:
the first `items` squad-evict articles of the tuning split, their first `questions` questions,
answered as `kvedge.bench.answer_kl` answers them (fp16's greedy answer teacher-forced over
each cache, through `pie`). The base is kivi at the first width of each list (keys 5, values 4: the
default codec). For every layer l, two more caches: the base with layer l's keys at the
second key width, and with its values at the second value width. Each one's answer KL
against fp16, minus the base's, is that layer's sensitivity — how much of the answers' drift
lowering that one layer adds. The same articles' K and V are also encoded at every listed
width, layer by layer, for their bytes.

The allocation (`kvedge.common.pack.calibrate.allocate_kv_widths`) lowers, from the base, the
(layer, K or V, width) whose added damage per byte saved is least, until the tensors take at
most fp16 / `ratio` bytes. A list is the base, the measured width, then any others: those
are not measured, their damage is extrapolated as quantization noise (4× per bit: two bits
below the base adds 5× one bit's). The measured width need not be one bit below the base:
`--key-widths 8,5,6,4 --value-widths 8,4,6,5,3` measures each layer's whole loss at K5 / V4
against a near-lossless base, and lets the allocation keep 6 or 8 bits where a layer needs
them (SmolLM2, whose answers K5 V4 moves). `--load` allocates from an earlier `--out`
without measuring again; widths listed that it has no bytes for are encoded then (the
articles prefilled again, no answers asked).
What it prints is a codec spec (`kivi+zstd:...,key_layers=4454...,value_layers=...`) for one
model, to be judged by the F1 cells (`kvctl bench run --suite evict --tasks squad-evict`, and
hotpot-kb), not by this screen: 20 questions rank layers, they do not prove answers kept.
Widths that pass both go into the model's registry entry (`kivi_options` in
`kvedge.common.model.models`), where the default codec (`kivi ... calibrated=true`) binds them.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from kvedge.common.pack.calibrate import allocate_kv_widths


def kivi(key_bits: int, value_bits: int) -> str:
    return f"kivi+zstd:key_bits={key_bits},value_bits={value_bits}"


def layer_bytes(ctx, kind: str, bits: int) -> list[int]:
    """Bytes each layer's keys ("K") or values ("V") of `ctx` take at `bits`, +zstd."""
    from kvedge.common.pack.codecs import get_codec
    from kvedge.common.pack.codecs.base import Role

    codec = get_codec(kivi(bits, bits))
    role = "key" if kind == "K" else "value"
    out = []
    for layer, heads in enumerate(ctx.keys if kind == "K" else ctx.values):
        parts = [codec.encode(x.float(), Role(role, layer=layer, n_layers=ctx.n_layers,
                                              head=h))[0] for h, x in enumerate(heads)]
        out.append(sum(p.numel() * p.element_size() for ps in parts for p in ps.values()))
    return out


def measure(model: str, key_widths: list[int], value_widths: list[int], items: int,
            questions: int, length: int, log=print) -> dict:
    """Per-layer KL increments of one step down from the base, and per-layer bytes at every
    listed width, summed over the articles."""
    from kvedge.bench.answer_kl import divergence, forced_logp, reference_answer
    from kvedge.bench.suites import Bench
    from kvedge.edge.strategies import get_strategy

    bench = Bench(model, breakdown=None)
    pie = get_strategy("pie")
    (kb, kl), (vb, vl) = key_widths[:2], value_widths[:2]
    kl_sum: dict[str, float] = {}
    out = {"model": model, "key_widths": key_widths, "value_widths": value_widths,
           "items": items, "length": length, "tokens": 0, "fp16_bytes": 0,
           "answer_tokens": 0, "questions": 0,
           "bytes": {"K": {b: None for b in key_widths}, "V": {b: None for b in value_widths}}}
    for item in _articles(bench, items, length):
        text = "".join(item.documents)
        fp16, base, low_k, low_v = (bench.packs(text, True, c)[0][0] for c in
                                    ("fp16", kivi(kb, vb), kivi(kl, vb), kivi(kb, vl)))
        out["tokens"] += fp16.n_tokens
        out["fp16_bytes"] += bench.prefill.kv_shape.fp16_bytes(fp16.n_tokens)
        _add_bytes(out["bytes"], fp16, key_widths, value_widths)
        caches = {"base": base}
        for layer in range(base.n_layers):
            caches[f"K{layer}"] = replace(base, keys=_swap(base.keys, low_k.keys, layer))
            caches[f"V{layer}"] = replace(base, values=_swap(base.values, low_v.values, layer))
        for q in item.questions[:questions]:
            composed = bench.engine.compose([fp16], q.text, q.instruction)
            answer = reference_answer(bench, composed, bench.new_tokens(q), pie)
            ref = forced_logp(bench, composed, answer, pie)
            for name, cache in caches.items():
                logp = forced_logp(bench, bench.engine.compose([cache], q.text, q.instruction),
                                   answer, pie)
                kl_sum[name] = kl_sum.get(name, 0.0) + divergence(ref, logp, answer)["kl"]
            out["answer_tokens"] += len(answer)
            out["questions"] += 1
        log(f"{item.key}: {len(item.questions[:questions])} questions")
    bench.close()
    per = {name: s / out["answer_tokens"] for name, s in kl_sum.items()}
    n_layers = sum(name.startswith("K") for name in per)
    out["base_kl"] = per["base"]
    out["K"] = [per[f"K{i}"] - per["base"] for i in range(n_layers)]
    out["V"] = [per[f"V{i}"] - per["base"] for i in range(n_layers)]
    return out


def _articles(bench, items: int, length: int) -> list:
    """The first `items` squad-evict articles of the tuning split, at `length` tokens."""
    from kvedge.bench.runner import Cell
    from kvedge.bench.suites import cell_items

    cell = Cell(suite="evict", task="squad-evict", length=length, method="full", budget=1.0,
                items=items)
    return cell_items(cell, bench.prefill.loaded.tokenizer)


def _add_bytes(into: dict, fp16, key_widths, value_widths) -> None:
    """Add each layer's bytes of `fp16`'s keys and values at every listed width to `into`
    (widths as int keys)."""
    for kind, widths in (("K", key_widths), ("V", value_widths)):
        for b in widths:
            sizes = layer_bytes(fp16, kind, b)
            have = into[kind].get(b)
            into[kind][b] = sizes if have is None else [x + y for x, y in zip(have, sizes)]


def with_widths(row: dict, key_widths: list[int], value_widths: list[int],
                log=print) -> dict:
    """`row` (an earlier `measure`) allowed `key_widths` / `value_widths` as well: the
    same base and measured width, bytes encoded for the widths it lacks (its articles
    prefilled again; no question asked)."""
    from kvedge.bench.suites import Bench

    for kind, widths in (("key_widths", key_widths), ("value_widths", value_widths)):
        if widths[:2] != row[kind][:2]:
            raise ValueError(f"{kind} {widths} must start with the measurement's base and "
                             f"measured width, {row[kind][:2]}")
    out = {**row, "key_widths": key_widths, "value_widths": value_widths,
           "bytes": {kind: {int(b): s for b, s in row["bytes"][kind].items()}
                     for kind in "KV"}}  # a width read back from JSON is a string
    missing = {kind: [b for b in widths if b not in out["bytes"][kind]]
               for kind, widths in (("K", key_widths), ("V", value_widths))}
    if not missing["K"] and not missing["V"]:
        return out
    bench = Bench(row["model"], breakdown=None)
    for item in _articles(bench, row.get("items", 2), row.get("length", 4096)):
        fp16 = bench.packs("".join(item.documents), True, "fp16")[0][0]
        _add_bytes(out["bytes"], fp16, missing["K"], missing["V"])
        log(f"{item.key}: bytes at K {missing['K']}, V {missing['V']}")
    bench.close()
    return out


def _swap(heads: list, other: list, layer: int) -> list:
    out = list(heads)
    out[layer] = other[layer]
    return out


def allocate(row: dict, ratio: float, floor: float = 1e-5) -> tuple[tuple, tuple, float]:
    """(key widths, value widths, tensor bytes per token) for fp16 / `ratio`; a layer's
    measured increment is taken as at least `floor` (an increment this small is within what
    20 questions resolve, so no layer is treated as free)."""
    allowed = {"K": row["key_widths"], "V": row["value_widths"]}
    sizes = {kind: {int(b): s for b, s in row["bytes"][kind].items()
                    if s is not None and int(b) in allowed[kind]} for kind in "KV"}
    keys, values, size = allocate_kv_widths(
        [max(d, floor) for d in row["K"]], [max(d, floor) for d in row["V"]],
        sizes["K"], sizes["V"], row["fp16_bytes"] / ratio,
        measured=(row["key_widths"][1], row["value_widths"][1]))
    return keys, values, size / row["tokens"]


def spec(keys: tuple, values: tuple, row: dict) -> str:
    """The kivi spec of these widths, one digit a layer (a name a KB variant can carry)."""
    digits = "".join
    return (f"{kivi(row['key_widths'][0], row['value_widths'][0])},"
            f"key_layers={digits(map(str, keys))},value_layers={digits(map(str, values))}")


def table(row: dict) -> str:
    out = [f"base {kivi(row['key_widths'][0], row['value_widths'][0])}: answer KL "
           f"{row['base_kl']:.5f} over {row['questions']} questions",
           f"| layer | K at {row['key_widths'][1]}: + KL | V at {row['value_widths'][1]}: + KL |",
           "|---|---|---|"]
    out += [f"| {i} | {k:+.5f} | {v:+.5f} |" for i, (k, v) in enumerate(zip(row["K"], row["V"]))]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--items", type=int, default=2, help="squad-evict articles")
    ap.add_argument("--questions", type=int, default=10, help="questions per article")
    ap.add_argument("--length", type=int, default=4096, help="context tokens per article")
    ap.add_argument("--key-widths", help="the base key width, the measured one, then any "
                    "others (default 5,4; with --load: the file's)")
    ap.add_argument("--value-widths", help="likewise for values (default 4,3,2)")
    ap.add_argument("--ratio", type=float, default=4.15, help="× fewer tensor bytes than fp16")
    ap.add_argument("--load", type=Path, help="a previous --out: allocate without measuring")
    ap.add_argument("--out", type=Path, help="the measurement, JSON")
    args = ap.parse_args(argv)
    given = [None if w is None else [int(b) for b in w.split(",")]
             for w in (args.key_widths, args.value_widths)]
    if args.load:
        row = json.loads(args.load.read_text())
        if given != [None, None]:
            row = with_widths(row, given[0] or row["key_widths"],
                              given[1] or row["value_widths"])
    else:
        row = measure(args.model, given[0] or [5, 4], given[1] or [4, 3, 2], args.items,
                      args.questions, args.length)
    if args.out:
        args.out.write_text(json.dumps(row))
    print(table(row))
    keys, values, size = allocate(row, args.ratio)
    fp16 = row["fp16_bytes"] / row["tokens"]
    print(f"\n{spec(keys, values, row)}\n{size:.0f} tensor bytes a token, "
          f"{fp16 / size:.2f}× below fp16 KV ({fp16:.0f})")


if __name__ == "__main__":
    main()
