"""The device check: what kvedge's CUDA paths do on a real GPU, in one short run.

`python -m kvedge.bench.gpu_check [--out DIR] [--quick]` (CI has no GPU; `--quick` on a CPU
runs the runtime sections at toy sizes, which is how this script is tested):

1. **ceilings** — device-to-device copy bandwidth (bytes read + written), the memory-bound
   floor every other figure is set against.
2. **kernels** — `rope_triton` and `dequant_rope_triton` compiled for the GPU (not Triton's
   interpreter, which the unit tests use) against a float64 reference, over random inputs of
   every bit width, layout and output dtype; outputs land in memory poisoned with NaN first,
   so an unwritten element shows. The torch reference run on the GPU is judged the same way.
3. **kernel speed** — one large piece (Llama-3.1-8B's 8 KV heads × 32K tokens × 128) through
   the fused kernel and the torch reference on the GPU: median time and GB/s (packed codes,
   scales and zero points read once, output written once) against the copy ceiling.
4. **realign** — one layer of a composed cache (8 heads × 20 segments × 512 tokens, int4+zstd)
   through `realign_layer` three ways: CUDA with the fused kernel, one launch per
   quantization layout (the default), CUDA with the batched torch pass
   (`KVEDGE_NO_TRITON=1`) and the CPU path (the reference): time per layer and the largest
   difference from the CPU path.
5. **sdpa** and **runtime** (`kvedge.bench.gpu_runtime`) — one decode query's SDPA under each
   backend; a random-weight model of Qwen2.5-0.5B's shape on the GPU: the runtime's prefill
   logits against transformers' forward, greedy tokens against transformers' `generate`, ms
   per decoded token (the scheduler's `decode_step`, batch 1 and 16; also with torch's own
   SDPA backend choice) and per prefill against transformers', at 1.3K and 8K tokens of
   context, and a profile of the decode step; the weights' bytes over the copy ceiling is
   the step's floor.
6. **key_cut** — a partial recompute's scattered queries attended in chunks of 64, each over
   the keys up to its last (`attention._query_chunks`), against one masked call over every
   key: one layer, Qwen2.5-0.5B's heads, legolink's and a top-k set of queries, 10 and 30
   segments; times and the largest difference.
7. **key_votes** — eviction's max votes (KVzip's reconstruction, ContrastKV's positive
   signal: `key_votes(reduce="max")`) for one layer, Qwen2.5-0.5B's heads, a 2K-token probe
   over 4K and 16K context keys, with the queries through the softmax all at once, 8 at a
   time (the CPU's `scoring.MAX_CHUNK`) and 256 at a time (what the scorer keeps on a GPU,
   unmeasured until this runs): times and the largest difference from all at once.

Prints one table per section last and writes everything to OUT/gpu_check.json.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

import torch

from kvedge.bench.gpu_timing import median_ms, poison, rel_err


# ---------------------------------------------------------------------- 1. ceilings
def ceilings(device) -> dict:
    n = 1 << (29 if torch.device(device).type == "cuda" else 24)  # 2 GiB of fp32 on a GPU
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), device, repeats=10)
    return {"copy_GBps": 2 * n * 4 / ms / 1e6, "copy_ms": ms}


# ---------------------------------------------------------------------- 2. kernels
def _inv_freq(dim: int, theta: float = 5e5) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def _rope64(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor, scaling: float):
    """The rotation in float64 on the CPU: the reference both GPU paths are judged by."""
    x = x.double().cpu()
    freqs = pos.double().cpu()[:, None] * inv_freq.double()[None, :]
    emb = torch.cat((freqs, freqs), -1)
    cos, sin = emb.cos() * scaling, emb.sin() * scaling
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def kernel_checks(device) -> list[dict]:
    from kvedge.kernels.dequant_rope import dequant_rope_reference, dequant_rope_triton
    from kvedge.kernels.quant import quantize
    from kvedge.kernels.rope import rope_reference, rope_triton

    gen = torch.Generator().manual_seed(0)
    rows = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for shape in ((8, 4097, 128), (2, 37, 64), (3, 1, 80)):
            x = (torch.randn(*shape, generator=gen) * 3).to(dtype)
            pos = torch.randint(0, 131072, (shape[-2],), generator=gen)
            freq = _inv_freq(shape[-1])
            ref = _rope64(x, pos, freq, 1.1)
            poison(device)
            got = rope_triton(x.to(device), pos, freq.float(), 1.1)
            torch_gpu = rope_reference(x.to(device).float(), pos.to(device), freq.float(), 1.1)
            rows.append({"kernel": "rope", "dtype": str(dtype).split(".")[1],
                         "shape": list(shape), "triton": rel_err(got, ref),
                         "torch_gpu_fp32": rel_err(torch_gpu, ref),
                         "vs_torch": rel_err(got, torch_gpu)})
    # each case is a compile (its constexprs differ): every bit width and layout at the
    # served head size, the odd ones (group 7, D = 80, one row) at int4 only
    cases = [(bits, pc, group, 5000, 128, out) for bits in (8, 4, 3, 2)
             for pc, group in ((True, 64), (False, 32)) for out in (torch.float32, torch.float16)]
    cases += [(4, True, 7, 45, 64, torch.float16), (4, False, 32, 1, 80, torch.float16),
              (2, True, 64, 3, 64, torch.float16)]
    for bits, per_channel, group, n, dim, out_dtype in cases:
        x = torch.randn(n, dim, generator=gen) * 4
        q = quantize(x, bits, group, per_channel)
        pos = torch.randint(0, 131072, (n,), generator=gen)
        freq = _inv_freq(dim)
        deq = q.dequantize(torch.float64)
        for rotate in (True, False):
            ref = _rope64(deq, pos, freq, 1.0) if rotate else deq
            args = (pos.to(device), freq.float().to(device), 1.0) if rotate else (None, None, 1.0)
            poison(device)
            got = dequant_rope_triton(q.to(device), *args, out_dtype=out_dtype)
            tref = dequant_rope_reference(q.to(device), *args, out_dtype=out_dtype)
            rows.append({"kernel": "dequant_rope", "bits": bits, "per_channel": per_channel,
                         "group": group, "n": n, "dim": dim, "rotate": rotate,
                         "dtype": str(out_dtype).split(".")[1], "triton": rel_err(got, ref),
                         "torch_gpu_fp32": rel_err(tref, ref), "vs_torch": rel_err(got, tref)})
    return rows


# ---------------------------------------------------------------------- 3. kernel speed
def kernel_speed(device) -> list[dict]:
    import triton.testing

    from kvedge.kernels.dequant_rope import dequant_rope_reference, dequant_rope_triton
    from kvedge.kernels.quant import quantize
    from kvedge.kernels.rope import rope_reference, rope_triton

    n, dim = 8 * 32768, 128
    pos = torch.randint(0, 131072, (n,), device=device)
    freq = _inv_freq(dim).float().to(device)
    rows = []
    for bits, per_channel, group in ((4, True, 64), (2, False, 32), (8, True, 64)):
        q = quantize(torch.randn(n, dim, device=device), bits, group, per_channel)
        moved = sum(t.numel() * t.element_size() for t in (q.packed, q.scale, q.zero))
        moved += n * dim * 2  # fp16 out
        for name, fn in (("triton", dequant_rope_triton), ("torch", dequant_rope_reference)):
            ms = triton.testing.do_bench(lambda: fn(q, pos, freq, 1.0, torch.float16),
                                         warmup=50, rep=300, return_mode="median")
            rows.append({"op": f"dequant_rope int{bits} {'chan' if per_channel else 'tok'}",
                         "path": name, "ms": ms, "GBps": moved / ms / 1e6})
    x = torch.randn(8, 32768, dim, device=device, dtype=torch.bfloat16)
    p = torch.randint(0, 131072, (32768,), device=device)
    for name, fn in (("triton", rope_triton), ("torch", rope_reference)):
        ms = triton.testing.do_bench(lambda: fn(x, p, freq, 1.0), warmup=50, rep=300,
                                     return_mode="median")
        rows.append({"op": "rope bf16", "path": name, "ms": ms,
                     "GBps": 2 * x.numel() * 2 / ms / 1e6})
    return rows


def block_sweep(device) -> list[dict]:
    """The fused kernel's rows per program (`block_rows`) on the large piece above: GB/s each,
    int4 per channel and int2 per token, fp16 out; and the RoPE kernel's."""
    import triton.testing

    from kvedge.kernels.dequant_rope import dequant_rope_many
    from kvedge.kernels.quant import quantize
    from kvedge.kernels.rope import rope_triton

    n, dim = 8 * 32768, 128
    pos = torch.randint(0, 131072, (n,), device=device)
    freq = _inv_freq(dim).float().to(device)
    rows = []
    for bits, per_channel, group in ((4, True, 64), (2, False, 32)):
        q = quantize(torch.randn(n, dim, device=device), bits, group, per_channel)
        moved = sum(t.numel() * t.element_size() for t in (q.packed, q.scale, q.zero))
        moved += n * dim * 2
        for block in (8, 16, 32, 64, 128):
            ms = triton.testing.do_bench(
                lambda: dequant_rope_many([q], pos, freq, 1.0, torch.float16, block),
                warmup=50, rep=200, return_mode="median")
            rows.append({"op": f"dequant_rope int{bits}", "block_rows": block, "ms": ms,
                         "GBps": moved / ms / 1e6})
    x = torch.randn(8, 32768, dim, device=device, dtype=torch.bfloat16)
    p = torch.randint(0, 131072, (32768,), device=device)
    for block in (8, 16, 32, 64, 128):
        ms = triton.testing.do_bench(lambda: rope_triton(x, p, freq, 1.0, block), warmup=50,
                                     rep=200, return_mode="median")
        rows.append({"op": "rope bf16", "block_rows": block, "ms": ms,
                     "GBps": 2 * x.numel() * 2 / ms / 1e6})
    return rows


# ---------------------------------------------------------------------- 4. realign
class _Pieces:
    """A RowSource over pre-encoded per-head pieces (what an opened pack hands out)."""

    def __init__(self, keys, values, n):
        self.keys, self.values, self.n = keys, values, n

    def stored(self, layer, kind):
        return self.keys if kind == "k" else self.values

    def local(self, layer):
        return [torch.arange(self.n)] * len(self.keys)

    def finish(self):
        return None


def _moved(stored, device):
    from kvedge.common.pack.realign import Stored
    return [Stored([p.to(device) for p in s.pieces], s.dtype) for s in stored]


def realign_check(device, n_kv=8, dim=128, segments=20, tokens=512) -> dict:
    from kvedge.common.pack.codecs import get_codec
    from kvedge.common.pack.codecs.base import Role
    from kvedge.common.pack.realign import RopeTable, Stored, realign_layer

    codec = get_codec("int4+zstd")
    gen = torch.Generator().manual_seed(1)
    sources = []
    for _ in range(segments):
        heads = {}
        for kind, role in (("k", "key"), ("v", "value")):
            heads[kind] = []
            for h in range(n_kv):
                x = (torch.randn(tokens, dim, generator=gen) * 2).to(torch.float16)
                parts, params = codec.encode(x, Role(role, head=h))
                heads[kind].append(Stored(codec.pieces(parts, params), torch.float16))
        sources.append((heads["k"], heads["v"]))
    offsets = [i * tokens for i in range(segments)]
    full = segments * tokens
    inv_freq = _inv_freq(dim).float()

    def layer(dev, srcs):
        table = RopeTable(inv_freq.to(dev), 1.0, full + 64, dev)
        return realign_layer(srcs, offsets, 0, table, dtype=torch.float16, device=dev,
                             full=full)

    cpu_srcs = [_Pieces(k, v, tokens) for k, v in sources]
    gpu_srcs = [_Pieces(_moved(k, device), _moved(v, device), tokens) for k, v in sources]
    ref = layer("cpu", cpu_srcs)
    out = {"rows_per_layer": n_kv * full, "cpu_ms": median_ms(lambda: layer("cpu", cpu_srcs),
                                                             "cpu", repeats=3, warmup=1)}
    for name, flag in (("cuda_fused", None), ("cuda_torch", "1")):
        if flag:
            os.environ["KVEDGE_NO_TRITON"] = flag
        try:
            got = layer(device, gpu_srcs)
            out[f"{name}_ms"] = median_ms(lambda: layer(device, gpu_srcs), device)
            rk, gk = ref.heads()[0], got.heads()[0]
            out[f"{name}_keys_max_abs_vs_cpu"] = float((gk.keys.cpu().float()
                                                        - rk.keys.float()).abs().max())
            out[f"{name}_values_equal_cpu"] = bool(torch.equal(gk.values.cpu(), rk.values))
            out[f"{name}_keys_equal_cpu"] = bool(torch.equal(gk.keys.cpu(), rk.keys))
        finally:
            os.environ.pop("KVEDGE_NO_TRITON", None)
    return out


# ---------------------------------------------------------------------- 6. key cut
def key_cut(device, quick: bool = False, tokens: int = 140) -> list[dict]:
    """A partial recompute's scattered queries (`attention._query_chunks`: chunks of 64
    queries, each over the keys up to its last) against the single masked call over every
    key, on the device (bf16 on a GPU): one layer's `gqa_attention` with Qwen2.5-0.5B's
    heads, legolink's queries and a top-k set (`kvedge.bench.masked_attention`), at 10 and
    30 segments of `tokens`. On the CPU the cut saves 0.55–0.79× of a call; on a GPU it
    makes ~N/64 kernel launches instead of one, which is what this measures."""
    from kvedge.bench.masked_attention import (SHAPES, legolink_positions, top_k_positions,
                                               uncut)
    from kvedge.common.model.attention import gqa_attention

    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    n_kv, group, dim = SHAPES["qwen2.5-0.5b"]
    gen = torch.Generator().manual_seed(0)
    rows = []
    for segments in (2,) if quick else (10, 30):
        n = segments * tokens
        for what, chosen in (("legolink", legolink_positions(segments, tokens, 20)),
                             ("top-k 1/7", top_k_positions(segments, tokens))):
            q = torch.randn(n_kv, group, len(chosen), dim, generator=gen).to(device, dtype)
            k, v = (torch.randn(n_kv, n, dim, generator=gen).to(device, dtype)
                    for _ in range(2))
            q_pos = torch.tensor(chosen, device=device)
            k_pos = torch.arange(n, device=device)

            def call():
                return gqa_attention(q, k, v, q_pos, k_pos, dim ** -0.5)

            with uncut():
                before = call()
                uncut_ms = median_ms(call, device, repeats=5 if quick else 20)
            after = call()
            cut_ms = median_ms(call, device, repeats=5 if quick else 20)
            rows.append({"queries": what, "n_queries": len(chosen), "keys": n,
                         "dtype": str(dtype).split(".")[1], "uncut_ms": uncut_ms,
                         "cut_ms": cut_ms, "cut_over_uncut": cut_ms / uncut_ms,
                         "max_abs_diff": float((after.float() - before.float()).abs().max())})
    return rows


def key_votes_chunks(device, quick: bool = False) -> list[dict]:
    """One layer's max votes at each query chunk on the device (`kvedge.bench.key_votes`'s
    layer; bf16 on a GPU, as the runtime keeps its queries and keys there): milliseconds and
    the largest difference from one pass over every query. On the CPU 8 at a time costs
    0.50–0.60× of 256 (docs/eviction.md); on a GPU, with no cache to fit, the question is
    the launches: ~probe/8 softmaxes against probe/256."""
    from kvedge.bench.key_votes import layer_and_probe, votes
    from kvedge.cloud.eviction.scoring import MAX_CHUNK, QUERY_CHUNK

    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    rows = []
    for context, probe in ((96, 40),) if quick else ((4096, 2048), (16384, 2048)):
        layer, q, q_pos = layer_and_probe(context, probe, 2, 7, 64, device=device, dtype=dtype)
        whole = votes(layer, q, q_pos, context, None)
        for chunk in (None, MAX_CHUNK, QUERY_CHUNK):
            got = whole if chunk is None else votes(layer, q, q_pos, context, chunk)
            ms = median_ms(lambda: votes(layer, q, q_pos, context, chunk), device,
                           repeats=3 if quick else 10)
            rows.append({"context": context, "probe": probe, "chunk": chunk or probe,
                         "dtype": str(dtype).split(".")[1], "ms": ms,
                         "max_abs_diff": float((got.float() - whole.float()).abs().max())})
    return rows


# ---------------------------------------------------------------------- main
def _table(title: str, rows) -> str:
    if not rows:
        return f"## {title}: nothing\n"
    rows = rows if isinstance(rows, list) else [rows]
    keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k != "profile"]
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = [f"## {title}", " | ".join(keys)]
    lines += [" | ".join(fmt(r.get(k, "")) for k in keys) for r in rows]
    return "\n".join(lines) + "\n"


def _kernel_summary(rows: list[dict]) -> list[dict]:
    """The worst relative error per kernel and output dtype, Triton and torch-on-GPU."""
    out: dict[tuple, dict] = {}
    for r in rows:
        key = (r["kernel"], r["dtype"])
        s = out.setdefault(key, {"kernel": r["kernel"], "dtype": r["dtype"], "cases": 0,
                                 "triton_worst": 0.0, "torch_gpu_worst": 0.0,
                                 "triton_vs_torch_worst": 0.0})
        s["cases"] += 1
        s["triton_vs_torch_worst"] = max(s["triton_vs_torch_worst"], r["vs_torch"])
        s["triton_worst"] = max(s["triton_worst"], r["triton"])
        s["torch_gpu_worst"] = max(s["torch_gpu_worst"], r["torch_gpu_fp32"])
    return list(out.values())


def main(argv: list[str] | None = None) -> int:
    import argparse

    from kvedge.bench import gpu_runtime

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="toy sizes (a CPU smoke run)")
    ap.add_argument("--only", default="", help="comma-separated sections to run")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    result: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                    "torch": torch.__version__}
    try:
        import transformers
        import triton
        result.update(triton=triton.__version__, transformers=transformers.__version__)
    except ImportError as e:
        result["import_error"] = str(e)
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    small = {"n_kv": 2, "segments": 3, "tokens": 70} if args.quick else {}
    sections = [("ceilings", lambda: ceilings(device), True),
                ("kernels", lambda: kernel_checks(device), interpreted),
                ("kernel_speed", lambda: kernel_speed(device), False),
                ("blocks", lambda: block_sweep(device), False),
                ("graph", lambda: gpu_runtime.hf_static_decode(device, args.quick), True),
                ("static", lambda: gpu_runtime.static_check(device, args.quick), True),
                ("sdpa", lambda: gpu_runtime.sdpa_probe(device), False),
                ("realign", lambda: realign_check(device, **small), True),
                ("runtime", lambda: gpu_runtime.runtime_check(device, args.quick), True),
                ("key_cut", lambda: key_cut(device, args.quick), True),
                ("key_votes", lambda: key_votes_chunks(device, args.quick), True)]
    only = set(filter(None, args.only.split(",")))
    for name, run, on_cpu in sections:
        if (only and name not in only) or (device == "cpu" and not on_cpu):
            continue
        start = time.perf_counter()
        try:
            result[name] = run()
        except Exception:  # noqa: BLE001 - a failed section is reported, the rest still run
            result[f"{name}_error"] = traceback.format_exc()
            print(result[f"{name}_error"], file=sys.stderr, flush=True)
        result[f"{name}_s"] = time.perf_counter() - start
        print(f"{name}: {result[f'{name}_s']:.1f} s", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
        json.dump(result, f, indent=1)
    for row in result.get("runtime", []):
        for who, text in row.get("profile", {}).items():
            print(f"## profile: {who}, {row['dtype']}, {row['context']} tokens\n{text}")
    print({k: v for k, v in result.items() if not isinstance(v, (list, dict))})
    if "kernels" in result:
        print(_table("kernels: worst ‖out − ref‖/‖ref‖ against float64",
                     _kernel_summary(result["kernels"])))
    for name in ("ceilings", "kernel_speed", "blocks", "graph", "static", "sdpa", "realign",
                 "runtime", "key_cut", "key_votes"):
        if name in result:
            print(_table(name, result[name]))
    return 1 if any(k.endswith("_error") for k in result) else 0


if __name__ == "__main__":
    sys.exit(main())
