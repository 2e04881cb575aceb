"""The device check's runtime sections (`kvedge.bench.gpu_check` runs them): SDPA backends
for one decode query, and the runtime on CUDA against transformers — logits, greedy tokens,
ms per token and per prefill, a profile of the decode step."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from kvedge.bench.gpu_timing import median_ms, rel_err, sync


# ---------------------------------------------------------------------- decode attention
def _backends(names):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, n) for n in names])


SDPA_VARIANTS = {  # name → (backends or None for torch's own choice, K/V made contiguous)
    "default_view": (None, False),
    "default_contiguous": (None, True),
    "flash_view": (("FLASH_ATTENTION",), False),
    "efficient_view": (("EFFICIENT_ATTENTION",), False),
    "math_view": (("MATH",), False),
    "cudnn_view": (("CUDNN_ATTENTION",), False),
    "no_cudnn_view": (("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"), False),
}


def sdpa_probe(device, heads=14, kv_heads=2, dim=64, start=1300, calls=40) -> list[dict]:
    """One decode query against a growing cache, as `batch._attend_past` calls it: q
    (1, Hq, 1, D) against views k[:, :n] of a preallocated (Hkv, capacity, D) buffer, n
    growing by one per call — ms per call (host wall, synchronized once per 40 calls) for
    each backend choice, and with the same n every call (a backend that plans per shape)."""
    import torch.nn.functional as F

    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        k = torch.randn(kv_heads, start + 2 * calls, dim, device=device, dtype=dtype)
        v = torch.randn_like(k)
        q = torch.randn(1, heads, 1, dim, device=device, dtype=dtype)
        for name, (backends, contiguous) in SDPA_VARIANTS.items():
            for growing in (True, False):
                def run():
                    for i in range(calls):
                        n = start + (i if growing else 0)
                        kk, vv = k[None, :, :n], v[None, :, :n]
                        if contiguous:
                            kk, vv = kk.contiguous(), vv.contiguous()
                        F.scaled_dot_product_attention(q, kk, vv, enable_gqa=True)
                try:
                    if backends is None:
                        ms = median_ms(run, device, repeats=5, warmup=1) / calls
                    else:
                        with _backends(backends):
                            ms = median_ms(run, device, repeats=5, warmup=1) / calls
                    rows.append({"dtype": str(dtype).split(".")[1], "variant": name,
                                 "n": "growing" if growing else "fixed", "ms_per_call": ms})
                except Exception as e:  # noqa: BLE001 - a backend that refuses is a finding
                    rows.append({"dtype": str(dtype).split(".")[1], "variant": name,
                                 "n": "growing" if growing else "fixed",
                                 "error": str(e).split("\n")[0][:120]})
    return rows


# ---------------------------------------------------------------------- runtime
def _qwen_shape(quick: bool):
    from transformers import Qwen2Config

    if quick:
        return Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=4096, rope_theta=1e6,
                           tie_word_embeddings=True)
    return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                       num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                       max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True)


def _hf_decode_ms(model, ids, steps, device) -> float:
    from transformers import DynamicCache

    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        last = [model(ids[None], past_key_values=cache, use_cache=True).logits[0, -1].argmax()]

        def step():
            last[0] = model(last[0].view(1, 1), past_key_values=cache,
                            use_cache=True).logits[0, -1].argmax()
            last[0].item()  # the token goes back to the host, as a server's does
        return median_ms(step, device, repeats=steps, warmup=2)


class _torch_sdpa_choice:
    """The runtime's attention calls with torch's own backend choice (cuDNN included), as
    before `kvedge.common.model.attention.sdpa` left cuDNN out on CUDA."""

    def __enter__(self):
        import torch.nn.functional as F

        from kvedge.common.model import attention, batch
        self.saved = attention.sdpa, batch.sdpa
        attention.sdpa = batch.sdpa = F.scaled_dot_product_attention

    def __exit__(self, *exc):
        from kvedge.common.model import attention, batch
        attention.sdpa, batch.sdpa = self.saved


def _kv_decode_ms(rt, ids, steps, batch, device) -> float:
    from kvedge.common.model.batch import decode_step
    from kvedge.common.model.decoding import Decoding, Prompt

    states = []
    for _ in range(batch):
        cache = rt.empty_cache(reserve=ids.numel() + steps + 8)
        states.append(Decoding.start(rt, Prompt(cache, ids, torch.arange(ids.numel())),
                                     steps + 8))
    return median_ms(lambda: decode_step(rt, states, row_multiple=1), device,
                     repeats=steps, warmup=2)


def _profile(rt, model, ids, device, steps: int = 5) -> dict:
    """torch.profiler over `steps` decode steps of kvedge and of transformers: the ops that
    take the host's time (a decode step of a small model on a GPU is launch-bound)."""
    from torch.profiler import ProfilerActivity, profile

    from kvedge.common.model.batch import decode_step
    from kvedge.common.model.decoding import Decoding, Prompt

    cache = rt.empty_cache(reserve=ids.numel() + steps + 8)
    state = Decoding.start(rt, Prompt(cache, ids, torch.arange(ids.numel())), steps + 8)
    out = {}
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            decode_step(rt, [state], row_multiple=1)
        sync(device)
    out["kvedge"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18,
                                              max_name_column_width=60)
    from transformers import DynamicCache
    with torch.no_grad():
        hf_cache = DynamicCache(config=model.config)
        last = model(ids[None].to(device), past_key_values=hf_cache).logits[0, -1].argmax()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                last = model(last.view(1, 1), past_key_values=hf_cache).logits[0, -1].argmax()
                last.item()
    out["transformers"] = prof.key_averages().table(sort_by="self_cpu_time_total",
                                                    row_limit=12, max_name_column_width=60)
    return out


def hf_static_decode(device, quick: bool = False, context: int = 1300, steps: int = 40,
                     dtype=torch.bfloat16) -> dict:
    """transformers' own model of the same shape over a `StaticCache`: ms per decode step
    eager and, on CUDA, with the step captured once as a CUDA graph and replayed (its token
    and position updated inside the graph). The reference point for what graphs over a
    static cache make of this step (issue 28); not kvedge's runtime."""
    from transformers import Qwen2ForCausalLM, StaticCache

    config = _qwen_shape(quick)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype).eval()
    n = 64 if quick else context
    ids = torch.randint(0, config.vocab_size, (1, n), device=device)
    cache = StaticCache(config=config, max_cache_len=n + 2 * steps + 64)
    out = {"dtype": str(dtype).split(".")[1], "context": n}
    with torch.no_grad():
        logits = model(ids, past_key_values=cache, use_cache=True,
                       cache_position=torch.arange(n, device=device)).logits
        tok, pos = logits[0, -1].argmax().view(1, 1), torch.tensor([n], device=device)

        def step():
            step_logits = model(tok, past_key_values=cache, cache_position=pos,
                                use_cache=True).logits
            tok.copy_(step_logits[0, -1].argmax().view(1, 1))
            pos.add_(1)

        out["eager_ms"] = median_ms(lambda: (step(), tok.item()), device, repeats=10, warmup=2)
        if torch.device(device).type == "cuda":
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            out["graph_ms"] = median_ms(lambda: (graph.replay(), tok.item()), device,
                                        repeats=steps, warmup=2)
    return out


def _random_runtime(config, dtype, device):
    """transformers' Qwen2 of `config` with seeded random weights in `dtype` on `device`, and
    the runtime over it."""
    from transformers import Qwen2ForCausalLM

    from kvedge.common.model.runtime import Runtime

    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype).eval()
    return model, Runtime(SimpleNamespace(model=model, config=config))


def static_check(device, quick: bool, steps: int = 40) -> list[dict]:
    """The runtime's own decode in fixed buffers (`kvedge.common.model.static_decode`) on
    random Qwen2.5-0.5B shapes: ms per token of the runtime's unpadded step, of the static
    step eager and, on CUDA, replayed as a CUDA graph; the largest logit difference against
    the runtime's step and whether the greedy tokens agree, over `steps` steps."""
    from kvedge.common.model.batch import decode_step
    from kvedge.common.model.decoding import Decoding, Prompt
    from kvedge.common.model.static_decode import StaticDecode

    config = _qwen_shape(quick)
    steps = 8 if quick else steps
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        rt = _random_runtime(config, dtype, device)[1]
        for context in ((64,) if quick else (1300, 8192)):
            ids = torch.randint(0, config.vocab_size, (context,),
                                generator=torch.Generator().manual_seed(2))

            def started():
                cache = rt.empty_cache(reserve=context + 3 * steps + 16)
                return Decoding.start(rt, Prompt(cache, ids, torch.arange(context)),
                                      3 * steps + 16)

            row = {"dtype": str(dtype).split(".")[1], "context": context}
            ref, state = started(), started()
            run = StaticDecode(rt, state)
            worst, agree, first = 0.0, 0, None
            for i in range(steps):  # the same answer both ways, compared step by step
                decode_step(rt, [ref], row_multiple=1)
                token = run.advance()
                gap = float((state.logits - ref.logits).abs().max())
                first = gap if first is None else first
                if agree == i:  # every token so far agreed: both ran the same text
                    worst = max(worst, gap)
                    agree += token == ref.token
            # past the first token that differs the two answers run on different text: their
            # logits are compared while the tokens agree
            row["static_first_step_max_abs"] = first
            row["static_logits_max_abs"] = worst
            row["static_tokens_agree"] = f"{agree}/{steps}"
            row["runtime_ms"] = median_ms(lambda: decode_step(rt, [ref], row_multiple=1),
                                          device, repeats=steps, warmup=2)
            row["static_eager_ms"] = median_ms(run.advance, device, repeats=steps, warmup=2)
            if torch.device(device).type == "cuda":
                run = StaticDecode(rt, started())
                run.graph()
                row["static_graph_ms"] = median_ms(run.advance, device, repeats=steps,
                                                   warmup=2)
            rows.append(row)
        rt = None
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return rows


def runtime_check(device, quick: bool, profile: bool = True) -> list[dict]:
    from transformers import Qwen2ForCausalLM

    from kvedge.common.model.generate import greedy_answer

    config = _qwen_shape(quick)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        model, rt = _random_runtime(config, dtype, device)
        # the same (rounded) weights in fp32: what either bf16 forward's error is measured by
        upcast = Qwen2ForCausalLM(config).to(device).eval() if dtype != torch.float32 else None
        if upcast is not None:
            upcast.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        gen = torch.Generator().manual_seed(2)
        for context in ((300,) if quick else (1300, 8192)):
            ids = torch.randint(0, config.vocab_size, (context,), generator=gen)
            row = {"dtype": str(dtype).split(".")[1], "context": context,
                   "weights_MB": weight_bytes / 1e6}
            with torch.no_grad():
                hf = model(ids[None].to(device)).logits[0, -1].float().cpu()
            ours = rt.prefill(ids).logits[-1].float().cpu()
            row["prefill_logits_max_abs"] = float((ours - hf).abs().max())
            row["prefill_logits_rel"] = rel_err(ours, hf)
            row["prefill_argmax_equal"] = bool(ours.argmax() == hf.argmax())
            if upcast is not None:
                with torch.no_grad():
                    ref = upcast(ids[None].to(device)).logits[0, -1].float().cpu()
                row["hf_vs_fp32_rel"], row["kvedge_vs_fp32_rel"] = (rel_err(hf, ref),
                                                                    rel_err(ours, ref))
            n_new = 24
            with torch.no_grad():
                hf_tokens = model.generate(ids[None].to(device), max_new_tokens=n_new,
                                           do_sample=False, min_new_tokens=n_new,
                                           pad_token_id=0)[0, context:].tolist()
            ours_tokens = greedy_answer(rt, ids.tolist(), n_new)
            same = next((i for i, (a, b) in enumerate(zip(ours_tokens, hf_tokens)) if a != b),
                        min(len(ours_tokens), len(hf_tokens)))
            row["greedy_tokens_agree_first"] = same
            steps = 8 if quick else 40
            row["hf_ms_per_token"] = _hf_decode_ms(model, ids.to(device), steps, device)
            row["kvedge_ms_per_token"] = _kv_decode_ms(rt, ids, steps, 1, device)
            with _torch_sdpa_choice():
                row["kvedge_ms_torch_sdpa_choice"] = _kv_decode_ms(rt, ids, steps, 1, device)
            with torch.no_grad():
                row["hf_prefill_ms"] = median_ms(lambda: model(ids[None].to(device)), device,
                                                 repeats=5, warmup=1)
            row["kvedge_prefill_ms"] = median_ms(lambda: rt.prefill(ids), device, repeats=5,
                                                 warmup=1)
            row["kvedge_ms_per_step_b16"] = _kv_decode_ms(rt, ids, steps, 16 if not quick
                                                          else 2, device)
            rows.append(row)
        if profile and not quick:
            rows[-1]["profile"] = _profile(rt, model, ids, device)
        model = rt = upcast = None  # the next dtype's model replaces them on the device
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return rows
