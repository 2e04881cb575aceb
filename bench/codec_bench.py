"""Pack codec benchmark on real SmolLM2-135M-Instruct KV: size, error, speed, answers.

    python bench/codec_bench.py                      # every registered codec, prints the table
    python bench/codec_bench.py --write docs/codecs.md
    python bench/codec_bench.py -c int4+zstd -c "cachegen+zstd:recent=64" --items 4

For each codec (a registry spec, optionally ":option=value,..." for the base codec; by
default every registered base alone and with each stage, fp32 aside, plus CacheGen without
its recent tokens) on a few-thousand-token context of templated text: bytes per context
token (KV payload alone and the whole pack, side tensors and manifest included), the ratio to
fp16 KV, relative error of K and V, the relative error of attention outputs (the context's
real last-token queries, keys rotated with RoPE, causal softmax(qKᵀ/√D)·V, decoded vs
original), encode/decode speed in MB/s of fp16 KV, and end-to-end answers on needle
questions: teacher-forced KL and top-1 agreement of the answer tokens against the original
cache, and greedy answers.

It also calibrates CacheGen's per-layer bits for SmolLM2 (`calibrated` row: each layer's
sensitivity measured on separate calibration questions, bits allocated to fit ≥ 6× — see
kvedge.common.pack.calibrate) and measures the entropy-stage sub-steps before keeping them.

kvtc rows encode with the model's calibrated transform (`codec_for_model`: fitted once on
`calibrate.CALIBRATION_TEXT` and kept in <KVEDGE_HOME>/transforms), as the cloud's workers do;
their own table splits the bytes (codes, the transform slices packs embed, steps and sinks)
and compares zstd on the codes with the order-0 entropy of each component's symbols and, when
the `constriction` package is installed, its range coder with one categorical model per
component (model cost counted):

    python bench/codec_bench.py -c int8+zstd -c int4+zstd -c kvtc:bits=2 --no-calibrate
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np
import torch
import zstandard

from kvedge.bench.answer_kl import divergence
from kvedge.common.pack.calibrate import allocate_layer_bits
from kvedge.common.pack.codecs import (CacheGen, Codec, IntCodec, Kvtc, Role, Zstd,
                                       codec_for_model, codec_names, get_codec, parse_spec)
from kvedge.common.pack.context import KVContext
from kvedge.common.pack.format import encode_pack, open_pack
from kvedge.kernels.rope import rope_reference

# the ablation of CacheGen's full-precision recent tokens (its sinks stay)
ABLATIONS = ("cachegen+zstd:recent=0",)
NAMES = ["Alice", "Bob", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana", "Ivan", "Julia"]
CITIES = ["Lisbon", "Osaka", "Nairobi", "Quito", "Oslo", "Perth", "Tunis", "Hanoi", "Lima"]
THINGS = ["violin", "bicycle", "telescope", "notebook", "kettle", "lantern", "compass"]


# ---------------------------------------------------------------------- text
def filler(rng: random.Random) -> str:
    """One sentence of varied, templated prose."""
    templates = [
        lambda: f"{rng.choice(NAMES)} moved to {rng.choice(CITIES)} in {rng.randint(1950, 2020)}"
                f" and opened a small shop that sold {rng.choice(THINGS)}s and old maps.",
        lambda: f"In {rng.choice(CITIES)} the spring is usually "
                f"{rng.choice(['mild', 'rainy', 'windy', 'dry'])}, and people walk by the river "
                f"after {rng.choice(['work', 'dinner', 'school'])}.",
        lambda: f"{rng.choice(NAMES)} told {rng.choice(NAMES)} that the meeting had moved to "
                f"{rng.choice(['Monday', 'Tuesday', 'Friday'])} at {rng.randint(1, 12)} o'clock.",
        lambda: f"The museum in {rng.choice(CITIES)} keeps a {rng.choice(THINGS)} that is "
                f"{rng.randint(2, 900)} years old; visitors may not touch it.",
        lambda: f"Every {rng.choice(['morning', 'evening'])}, {rng.choice(NAMES)} reads "
                f"{rng.randint(2, 40)} pages before cooking "
                f"{rng.choice(['rice', 'soup', 'eggs'])}.",
    ]
    return rng.choice(templates)()


@dataclass
class Item:
    context: str
    question: str
    answer: str


def needle_item(rng: random.Random, n_sentences: int) -> Item:
    """A context with one code hidden among filler, and the question that asks for it."""
    thing, code = rng.choice(THINGS), str(rng.randint(1000, 9999))
    sentences = [filler(rng) for _ in range(n_sentences)]
    sentences.insert(rng.randrange(n_sentences), f"The secret code for the {thing} room is {code}.")
    return Item(" ".join(sentences), f"What is the secret code for the {thing} room?", code)


def split_prompt(tokenizer, item: Item) -> tuple[list[int], list[int]]:
    """Chat prompt ids split into (context part, question part) at the question."""
    content = f"{item.context}\n\n{item.question}"
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                         tokenize=False, add_generation_prompt=True)
    cut = text.index(f"\n\n{item.question}")
    return tokenizer(text[:cut])["input_ids"], tokenizer(text[cut:])["input_ids"]


# ---------------------------------------------------------------------- measuring
def default_codecs() -> list[str]:
    """Every registered codec alone and with each stage, except fp32 (what the prefill
    produces: the reference, not a candidate), then the ablations."""
    return [n for n in codec_names() if not n.startswith("fp32")] + list(ABLATIONS)


def attention(q, k, v, q_pos, k_pos, inv_freq):
    """Causal GQA attention outputs (Hq, n_q, D) from pre-RoPE q (Hq,n_q,D), k/v (Hkv,T,D)."""
    group = q.shape[0] // k.shape[0]
    q = rope_reference(q, q_pos, inv_freq)
    k = rope_reference(k, k_pos, inv_freq).repeat_interleave(group, 0)
    scores = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    return torch.softmax(scores, -1) @ v.repeat_interleave(group, 0)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def measure(spec: str, codec: Codec, ctx: KVContext, queries, inv_freq, fp16_bytes: int) -> dict:
    t0 = time.perf_counter()
    data = encode_pack(ctx, codec)
    t1 = time.perf_counter()
    pack = open_pack(data)
    decoded = pack.context()
    t2 = time.perf_counter()
    kv_bytes = sum(len(pack.container.parts[f"{t}/{p}"].data)
                   for t, e in pack.manifest.tensors.items() if t[0] in "kv" for p in e.parts)
    pos = torch.tensor(ctx.positions)
    q_pos = pos[-queries[0].shape[1]:]
    k_err, v_err, a_err = [], [], []
    for layer in range(ctx.n_layers):
        k, v = torch.stack(ctx.keys[layer]), torch.stack(ctx.values[layer])
        dk, dv = torch.stack(decoded.keys[layer]), torch.stack(decoded.values[layer])
        k_err.append(rel(dk, k))
        v_err.append(rel(dv, v))
        ref = attention(queries[layer], k, v, q_pos, pos, inv_freq)
        a_err.append(rel(attention(queries[layer], dk, dv, q_pos, pos, inv_freq), ref))
    n = ctx.n_tokens
    embedded = sum(len(pack.container.parts[f"{t}/{p}"].data) for t, e in
                   pack.manifest.tensors.items() if t[0] in "kv" for p in e.parts
                   if e.codec.startswith("kvtc") and p in ("basis", "mean"))
    return {"codec": spec, "kv_B_tok": kv_bytes / n, "pack_B_tok": len(data) / n,
            "transform_B_tok": embedded / n,
            "ratio": fp16_bytes / kv_bytes, "k_err": sum(k_err) / len(k_err),
            "v_err": sum(v_err) / len(v_err), "attn_err": sum(a_err) / len(a_err),
            "attn_err_max": max(a_err), "enc_MBs": fp16_bytes / (t1 - t0) / 1e6,
            "dec_MBs": fp16_bytes / (t2 - t1) / 1e6, "codec_obj": codec,
            "layer_bytes": _layer_bytes(pack)}


def _layer_bytes(pack) -> list[int]:
    """KV payload bytes per layer (what the bit allocation trades)."""
    sizes = [0] * pack.manifest.n_layers
    for key, part in pack.container.parts.items():
        name = key.split("/")[0]
        if name[0] in "kv":
            sizes[int(name.split(".")[1])] += len(part.data)
    return sizes


@dataclass
class Prepared:
    """One needle question: context prefilled, the original cache's answer and log-probs."""

    item: Item
    ids: list[int]
    q_ids: list[int]
    keys: list[torch.Tensor]    # per layer (Hkv, T, D) pre-RoPE
    values: list[torch.Tensor]
    answer: list[int] = None    # greedy answer tokens over the original cache
    logp: torch.Tensor = None   # (n_answer, vocab) teacher-forced log-probs, original cache


def prepare(rt, lm, item: Item) -> Prepared:
    ids, q_ids = split_prompt(lm.tokenizer, item)
    res = rt.prefill(torch.tensor(ids))
    p = Prepared(item, ids, q_ids, res.keys, res.values)
    p.answer = greedy(rt, lm, p, p.keys, p.values)
    p.logp = forced_logp(rt, p, p.keys, p.values)
    return p


def greedy(rt, lm, p: Prepared, keys, values, n_new: int = 16) -> list[int]:
    from kvedge.common.model.generate import generate

    cache = rt.dense_cache(keys, values, torch.arange(len(p.ids)), reserve=len(p.q_ids) + n_new)
    q_pos = torch.arange(len(p.ids), len(p.ids) + len(p.q_ids))
    return list(generate(rt, cache, torch.tensor(p.q_ids), q_pos, n_new,
                         stop_ids=(lm.tokenizer.eos_token_id,)))


def forced_logp(rt, p: Prepared, keys, values) -> torch.Tensor:
    """Log-probs of each reference answer token, question and answer teacher-forced."""
    ids = p.q_ids + p.answer[:-1]
    cache = rt.dense_cache(keys, values, torch.arange(len(p.ids)), reserve=len(ids))
    pos = torch.arange(len(p.ids), len(p.ids) + len(ids))
    logits = rt.forward(torch.tensor(ids), pos, cache, logits="all").logits
    return logits[-len(p.answer):].float().log_softmax(-1)


def roundtrip(p: Prepared, codec: Codec, layers=None):
    """Keys and values of a prepared context after encode → decode (only `layers`, if given)."""
    ctx = KVContext.from_dense(p.keys, p.values, p.ids, model_fingerprint="0",
                               tokenizer_id="0", summaries=False)
    dec = open_pack(encode_pack(ctx, codec)).context()
    keys = [torch.stack(k) if layers is None or i in layers else p.keys[i]
            for i, k in enumerate(dec.keys)]
    values = [torch.stack(v) if layers is None or i in layers else p.values[i]
              for i, v in enumerate(dec.values)]
    return keys, values


def answer_metrics(rt, lm, preps: list[Prepared], codec: Codec) -> dict:
    """Answer columns over `preps`, and `per_item`: each question's own outcome (same greedy
    answer as the original cache, needle found, answer text) for paired tests."""
    kl = agree = n = 0
    per_item = []
    for i, p in enumerate(preps):
        keys, values = roundtrip(p, codec)
        d = divergence(p.logp, forced_logp(rt, p, keys, values), p.answer)
        kl, agree, n = kl + d["kl"], agree + d["agree"], n + d["tokens"]
        out = greedy(rt, lm, p, keys, values)
        text = lm.tokenizer.decode(out, skip_special_tokens=True)
        per_item.append({"item": i, "same": out == p.answer,
                         "correct": p.item.answer in text, "answer": text})
    return {"kl": kl / n, "agree": agree / n, "same": sum(r["same"] for r in per_item),
            "correct": sum(r["correct"] for r in per_item), "per_item": per_item}


def paired_table(rows: list[dict], against: str) -> str:
    """Each codec's needle answers against `against`'s on the same questions: questions only
    one of the two answered, and the exact McNemar p of that split (bench.scoring)."""
    from kvedge.bench.scoring import mcnemar_exact

    base = next(r for r in rows if r["codec"] == against)["per_item"]
    lines = [f"| codec | × vs fp16 | correct | only this codec | only `{against}` | McNemar p |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if r["codec"] == against:
            continue
        mine = r["per_item"]
        only_mine = sum(a["correct"] and not b["correct"] for a, b in zip(mine, base))
        only_base = sum(b["correct"] and not a["correct"] for a, b in zip(mine, base))
        lines.append(f"| `{r['codec']}` | {r['ratio']:.2f} | {r['correct']}/{len(mine)} | "
                     f"{only_mine} | {only_base} | {mcnemar_exact(only_mine, only_base):.3f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------- calibration
def layer_sensitivity(rt, preps: list[Prepared], low: Codec, n_layers: int) -> list[float]:
    """Teacher-forced KL of the answers when only layer l is encoded with `low`."""
    out = []
    for layer in range(n_layers):
        kl = n = 0
        for p in preps:
            d = divergence(p.logp, forced_logp(rt, p, *roundtrip(p, low, layers={layer})),
                           p.answer)
            kl, n = kl + d["kl"], n + d["tokens"]
        out.append(kl / n)
    return out


def calibrated_codec(rt, preps, ctx, queries, inv_freq, fp16_bytes, target: float, **cachegen):
    """CacheGen with per-layer bits (2, 3 or 4) from sensitivity, fitting fp16 / target bytes."""
    n_layers = ctx.n_layers
    sizes = {b: measure("", Zstd(CacheGen(layer_bits=(b,) * n_layers, **cachegen)), ctx,
                        queries, inv_freq, fp16_bytes)["layer_bytes"] for b in (2, 3, 4)}
    low = Zstd(CacheGen(layer_bits=(2,) * n_layers, **cachegen))
    sensitivity = layer_sensitivity(rt, preps, low, n_layers)
    bits = allocate_layer_bits(sensitivity, sizes, int(fp16_bytes / target))
    return Zstd(CacheGen(layer_bits=bits, **cachegen)), sensitivity


# ---------------------------------------------------------------------- sub-steps
def substep_ablation(ctx: KVContext) -> list[tuple[str, int, int]]:
    """(sub-step, bytes without, bytes with) over every KV head of the context, zstd level 3
    (each row compresses head by head, as the codecs do)."""
    z = zstandard.ZstdCompressor(level=3)

    def size(arrays) -> int:
        return sum(len(z.compress(np.ascontiguousarray(a).tobytes())) for a in arrays)

    heads = [x for layer in ctx.keys + ctx.values for x in layer]
    fp16 = [x.half().contiguous().view(torch.uint8).numpy().reshape(-1, 2) for x in heads]
    scales = [get_codec("int4").encode(x, Role("key"))[0]["scale"].view(torch.uint8).numpy()
              .reshape(-1, 2) for x in heads]
    codes = [_codes(x, 4, per_channel=True) for layer in ctx.keys for x in layer]
    deltas = [np.concatenate([c[:1], (c[1:] - c[:-1]) & 15]) for c in codes]  # mod 2^bits
    return [("byte planes in one frame (fp16 KV)", size(fp16), size(a.T for a in fp16)),
            ("byte planes, a frame each (fp16 KV)", size(fp16),
             size(plane for a in fp16 for plane in a.T)),
            ("byte planes, a frame each (int4 key scales)", size(scales),
             size(plane for a in scales for plane in a.T)),
            ("token-wise delta (int4 key codes)", size(codes), size(deltas))]


def _codes(x: torch.Tensor, bits: int, per_channel: bool) -> np.ndarray:
    """Unpacked codes (n, D) of one head: what a delta step would see."""
    from kvedge.kernels.quant import unpack_codes

    parts, params = IntCodec(bits).encode(x, Role("key" if per_channel else "value"))
    return unpack_codes(parts["packed"], bits, x.shape[1]).numpy()


# ---------------------------------------------------------------------- kvtc
def kvtc_bytes(ctx: KVContext, codec: Kvtc) -> dict:
    """Bytes of a kvtc pack's KV by part, and three coders of its codes: zstd (what the codec
    stores), the order-0 entropy of each component's symbols (what any coder with one
    adaptive model per component approaches), and constriction's range coder with one
    categorical model per component, the model's counts costed at 2 bytes per used symbol."""
    out = dict.fromkeys(("codes", "transform", "steps+sinks", "entropy", "constriction"), 0.0)
    for layer in range(ctx.n_layers):
        for kind, heads in (("key", ctx.keys[layer]), ("value", ctx.values[layer])):
            for head, x in enumerate(heads):
                role = Role(kind, layer, ctx.n_layers, ctx.ranks(layer, head), ctx.n_tokens, head)
                parts, params = codec.encode(x, role)
                size = {k: v.numel() * v.element_size() for k, v in parts.items()}
                out["codes"] += size["codes"]
                out["transform"] += size.get("basis", 0) + size.get("mean", 0)
                out["steps+sinks"] += size["step"] + size["sink"]
                k = int((parts["step"] > 0).sum())
                m = x.shape[0] - params["sinks"]
                if k * m:
                    raw = zstandard.ZstdDecompressor().decompress(parts["codes"].numpy().tobytes())
                    symbols = np.frombuffer(raw, np.uint8).reshape(k, m)
                    out["entropy"] += sum(_entropy_bits(row) for row in symbols) / 8
                    out["constriction"] += _range_coded(symbols)
    return {key: value / ctx.n_tokens for key, value in out.items()}


def _entropy_bits(row: np.ndarray) -> float:
    p = np.bincount(row) / row.size
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum() * row.size)


def _range_coded(symbols: np.ndarray) -> float:
    """Bytes with constriction (one categorical per component, counts sent), or nan."""
    try:
        import constriction
    except ImportError:
        return float("nan")
    total = 0
    for row in symbols:
        counts = np.bincount(row).astype(np.float64)
        model = constriction.stream.model.Categorical(counts / counts.sum(), perfect=False)
        coder = constriction.stream.queue.RangeEncoder()
        coder.encode(row.astype(np.int32), model)
        total += 4 * len(coder.get_compressed()) + 2 * int((counts > 0).sum())
    return float(total)


def kvtc_table(rows: list[dict]) -> str:
    lines = ["| kvtc codec | codes B/token | embedded transform B/token | steps + sinks B/token "
             "| codes: order-0 entropy B/token | codes: constriction B/token |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        b = r["kvtc"]
        lines.append(f"| `{r['codec']}` | {b['codes']:.0f} | {b['transform']:.0f} | "
                     f"{b['steps+sinks']:.0f} | {b['entropy']:.0f} | {b['constriction']:.0f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------- main
@click.command()
@click.option("-c", "--codec", "codecs", multiple=True, help="codec spec (repeatable)")
@click.option("--tokens", default=3000, show_default=True, help="context length for the table")
@click.option("--items", default=8, show_default=True, help="needle questions (0: skip)")
@click.option("--calibrate/--no-calibrate", default=True, show_default=True,
              help="add the calibrated CacheGen row (needs --items)")
@click.option("--calib-items", default=4, show_default=True, help="calibration questions")
@click.option("--sinks", default=4, show_default=True, help="calibrated CacheGen: fp16 sinks")
@click.option("--recent", default=32, show_default=True, help="calibrated CacheGen: fp16 recent")
@click.option("--target", default=6.2, show_default=True, help="calibrated ratio vs fp16")
@click.option("--write", type=click.Path(dir_okay=False), help="write the markdown report here")
@click.option("--rows", "rows_path", type=click.Path(dir_okay=False),
              help="write every (codec, question) outcome here as JSON lines")
@click.option("--paired-with", default=None,
              help="codec spec the others are tested against, paired [default: the first -c]")
@click.option("--seed", default=0, show_default=True)
def main(codecs, tokens, items, calibrate, calib_items, sinks, recent, target, write, rows_path,
         paired_with, seed):
    from kvedge.common.model.models import DEFAULT_MODEL, load_model
    from kvedge.common.model.rope import Rope
    from kvedge.common.model.runtime import Runtime
    from kvedge.common.pack.manifest import KVShape

    torch.manual_seed(seed)
    rng = random.Random(seed)
    lm = load_model(DEFAULT_MODEL)
    rt = Runtime(lm)
    inv_freq, _ = Rope(lm.config).frequencies()
    text = " ".join(filler(rng) for _ in range(tokens // 12))
    ids = lm.tokenizer(text)["input_ids"][:tokens]
    res = rt.prefill(torch.tensor(ids), want_queries=True)
    queries = [q[:, -16:] for q in res.queries]
    ctx = KVContext.from_dense(res.keys, res.values, ids, model_fingerprint=lm.fingerprint,
                               tokenizer_id=lm.tokenizer_id, queries=res.queries)
    fp16_bytes = KVShape(rt.n_layers, rt.n_kv, rt.head_dim).fp16_bytes(len(ids))
    specs = list(codecs or default_codecs())
    if paired_with is not None and paired_with not in specs:
        raise click.BadParameter(f"{paired_with!r} is not one of the -c codecs", param_hint="--paired-with")
    rows = []
    for spec in specs:
        name, options = parse_spec(spec)
        codec = codec_for_model(get_codec(name, **options), rt)  # kvtc: the model's transform
        rows.append(measure(spec, codec, ctx, queries, inv_freq, fp16_bytes))
        click.echo(format_row(rows[-1]), err=True)
        if isinstance(getattr(codec, "inner", codec), Kvtc):
            rows[-1]["kvtc"] = kvtc_bytes(ctx, getattr(codec, "inner", codec))

    preps, notes = [], []
    if items:
        preps = [prepare(rt, lm, needle_item(rng, 60)) for _ in range(items)]
        base = sum(p.item.answer in lm.tokenizer.decode(p.answer) for p in preps)
        notes.append(f"original KV answers {base}/{items} needles correctly")
    if items and calibrate:
        calib = [prepare(rt, lm, needle_item(rng, 60)) for _ in range(calib_items)]
        codec, sensitivity = calibrated_codec(rt, calib, ctx, queries, inv_freq, fp16_bytes,
                                              target, sinks=sinks, recent=recent)
        rows.append(measure("cachegen+zstd (calibrated)", codec, ctx, queries, inv_freq,
                            fp16_bytes))
        click.echo(format_row(rows[-1]), err=True)
        notes.append("calibrated layer bits: " + "".join(map(str, codec.inner.layer_bits)))
        notes.append("layer sensitivity (answer KL, that layer alone at 2 bits): "
                     + ", ".join(f"{s:.4f}" for s in sensitivity))
    for row in rows if items else []:
        row.update(answer_metrics(rt, lm, preps, row["codec_obj"]))
        click.echo(f"{row['codec']}: KL {row['kl']:.4f} agree {row['agree']:.3f} same "
                   f"{row['same']}/{items} correct {row['correct']}/{items}", err=True)
    report = markdown(rows, items)
    if items and len(rows) > 1:
        report += "\n\n" + paired_table(rows, paired_with or rows[0]["codec"])
    if rows_path:
        with open(rows_path, "w") as f:
            for r in rows if items else []:
                for q in r["per_item"]:
                    f.write(json.dumps({"codec": r["codec"], "ratio": r["ratio"], **q}) + "\n")
    report += "\n\n" + ablation_table(substep_ablation(ctx))
    if any("kvtc" in r for r in rows):
        report += "\n\n" + kvtc_table([r for r in rows if "kvtc" in r])
    report += "".join(f"\n\n{note}" for note in notes)
    click.echo(report)
    if write:
        write_report(Path(write), DOC_HEADER.format(tokens=len(ids), items=items) + report)


BEGIN, END = "<!-- codec_bench: begin -->", "<!-- codec_bench: end -->"


def write_report(path: Path, generated: str) -> None:
    """Replace the generated block of the doc, keeping the prose written around it."""
    text = path.read_text() if path.exists() else f"# Pack codecs\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        text += f"\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    path.write_text(f"{head}{BEGIN}\n{generated}\n{END}{rest.split(END, 1)[1]}")


def format_row(r: dict) -> str:
    return (f"{r['codec']:<28} {r['kv_B_tok']:8.0f} B/tok  {r['ratio']:5.2f}x  K {r['k_err']:.4f} "
            f"V {r['v_err']:.4f} attn {r['attn_err']:.4f} (max {r['attn_err_max']:.4f}) "
            f"enc {r['enc_MBs']:.0f} MB/s dec {r['dec_MBs']:.0f} MB/s")


def markdown(rows: list[dict], items: int) -> str:
    head = ["codec", "KV B/token", "pack B/token", "× vs fp16", "K rel err", "V rel err",
            "attn-out err mean / worst layer", "encode MB/s", "decode MB/s"]
    if items:
        head += ["answer KL", "answer top-1 agree", "same answer", "needle correct"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"`{r['codec']}`", f"{r['kv_B_tok']:.0f}", f"{r['pack_B_tok']:.0f}",
                 f"{r['ratio']:.2f}", f"{r['k_err']:.4f}", f"{r['v_err']:.4f}",
                 f"{r['attn_err']:.4f} / {r['attn_err_max']:.4f}", f"{r['enc_MBs']:.0f}",
                 f"{r['dec_MBs']:.0f}"]
        if items:
            cells += [f"{r['kl']:.4f}", f"{r['agree']:.3f}", f"{r['same']}/{items}",
                      f"{r['correct']}/{items}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ablation_table(rows: list[tuple[str, int, int]]) -> str:
    lines = ["| entropy sub-step | bytes without | bytes with | helps? |", "|---|---|---|---|"]
    for name, without, with_ in rows:
        lines.append(f"| {name} | {without:,} | {with_:,} | {'yes' if with_ < without else 'no'}"
                     f" ({100 * (with_ - without) / without:+.1f}%) |")
    return "\n".join(lines)


DOC_HEADER = """Generated by `python bench/codec_bench.py --write docs/codecs.md` on SmolLM2-135M-Instruct
(2-core CPU). Table rows: one {tokens}-token templated context. Sizes are per context token;
fp16 KV is 23,040 B/token (30 layers × 3 KV heads × 64 dims × K and V × 2 bytes); "pack" adds
the side tensors (block summaries and a 64-token query cache, fp16) and the manifest.
Errors are relative L2; attention error uses the context's last 16 real queries (keys rotated
with RoPE, causal softmax(qKᵀ/√D)·V), mean over layers and the worst layer. MB/s are MB of
fp16 KV per second, whole pack, single thread for zstd. Answer columns: {items} needle
questions (~1.3K-token contexts), teacher-forced KL (nats/token) and top-1 agreement of the
original cache's greedy answer tokens, identical greedy answers, and answers containing the
needle.

"""


if __name__ == "__main__":
    main()
