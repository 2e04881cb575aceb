"""`kvctl needle`: a needle question answered by the embedded model on CPU.

The context is prefilled as independent segments (as the cloud will store them, each from
position 0), realigned to its place in the prompt, then answered two ways: full recompute of
the whole prompt (the ceiling) and reuse of the realigned segment KV with only the question
computed fresh (PIE-style). The end-to-end demo through cloud and edge replaces this one.
"""
from __future__ import annotations

import random
import time

import torch

FILLER = [
    "The {a} market opened early and the {b} traders argued about the price of {c}.",
    "In the old {a} quarter, a {b} bridge crossed the river near the {c} mill.",
    "Scientists in {a} reported that the {b} samples behaved like {c} under pressure.",
    "The committee from {a} postponed the {b} vote until the {c} report arrived.",
    "Every {b} morning the ferry to {a} carried crates of {c} across the bay.",
]
WORDS = ["copper", "amber", "granite", "willow", "saffron", "cobalt", "juniper", "marble",
         "linen", "cedar", "harbor", "orchard", "quartz", "velvet", "tundra", "meadow"]
CITIES = ["Lisbon", "Nairobi", "Osaka", "Quito", "Tallinn", "Hobart", "Tromsø", "Cusco"]
SEGMENT_TOKENS = 256


def needle_prompt(tokenizer, n_tokens: int, seed: int):
    """(segments of token ids, question token ids, city, answer) for a haystack of ~n_tokens."""
    rng = random.Random(seed)
    city, number = rng.choice(CITIES), str(rng.randint(1_000_000, 9_999_999))
    sentences, count = [], 0
    while count < n_tokens:
        s = rng.choice(FILLER).format(a=rng.choice(CITIES), b=rng.choice(WORDS), c=rng.choice(WORDS))
        sentences.append(s)
        count += len(tokenizer(" " + s)["input_ids"])
    sentences.insert(rng.randrange(len(sentences) // 5, 4 * len(sentences) // 5),
                     f"The special magic number for {city} is {number}.")
    ids = tokenizer(" ".join(sentences))["input_ids"]
    head = tokenizer.apply_chat_template([{"role": "user", "content": "@@"}],
                                         add_generation_prompt=True, tokenize=False).split("@@")
    prefix = tokenizer(head[0])["input_ids"]
    question = tokenizer(f"\n\nWhat is the special magic number for {city}? Answer with the "
                         f"number only.{head[1]}")["input_ids"]
    segments = [prefix] + [ids[i:i + SEGMENT_TOKENS] for i in range(0, len(ids), SEGMENT_TOKENS)]
    return segments, question, city, number


def _answer(rt, tok, cache, ids, start, max_new=32):
    from kvedge.common.model.generate import generate
    from kvedge.common.model.textstream import TextStream

    stream, t0, ttft = TextStream(tok), time.perf_counter(), None
    for token in generate(rt, cache, torch.tensor(ids), torch.arange(start, start + len(ids)),
                          max_new, stop_ids=(tok.eos_token_id,)):
        ttft = ttft or time.perf_counter() - t0
        if token != tok.eos_token_id:
            stream.push(token)
    return stream.text.strip(), ttft


def run_needle_demo(model_name: str, n_tokens: int, seed: int, echo=print) -> bool:
    from kvedge.common.model.models import load_model
    from kvedge.common.model.runtime import Runtime

    t0 = time.perf_counter()
    loaded = load_model(model_name)
    rt, tok = Runtime(loaded), loaded.tokenizer
    echo(f"model {loaded.name} loaded in {time.perf_counter() - t0:.1f} s "
         f"(fingerprint {loaded.fingerprint[:12]})")
    segments, question, city, number = needle_prompt(tok, n_tokens, seed)
    context = [t for seg in segments for t in seg]
    echo(f"context: {len(context)} tokens in {len(segments)} segments; needle: {city} → {number}")

    # the cloud's job: each segment prefilled on its own, from position 0, keys kept pre-RoPE
    parts = [rt.prefill(torch.tensor(seg), logits="none") for seg in segments]
    keys = [torch.cat([p.keys[i] for p in parts], 1) for i in range(rt.n_layers)]
    values = [torch.cat([p.values[i] for p in parts], 1) for i in range(rt.n_layers)]

    full_cache = rt.empty_cache(reserve=len(context) + len(question) + 16)
    full, full_ttft = _answer(rt, tok, full_cache, context + question, 0)
    reuse_cache = rt.dense_cache(keys, values, torch.arange(len(context)), reserve=len(question) + 16)
    reuse, reuse_ttft = _answer(rt, tok, reuse_cache, question, len(context))

    rows = [("full recompute", full, full_ttft), ("realigned reuse", reuse, reuse_ttft)]
    for label, text, ttft in rows:
        echo(f"{label:16s} {'✓' if number in text else '✗'}  TTFT {ttft:6.2f} s  answer: {text!r}")
    echo(f"TTFT ratio reuse / full = {reuse_ttft / full_ttft:.3f}")
    return number in full
