"""NVIDIA kvpress's presses as external reference points, on our model and our token ids.

Importing kvpress patches transformers' attention functions globally (`kvpress/__init__.py`),
so it never runs in the benchmark's process: `run_kvpress` starts
`python -m kvedge.bench.kvpress_ref`, sends the job as JSON on stdin and reads the answers
from the last line of stdout. The child loads the same model by name (same weights, same
fingerprint) and, for each context, does what kvpress's `KVPressTextGenerationPipeline._forward`
does: one prefill of the context under the press (compressed once, query-agnostic), then each
question answered with the pipeline's greedy `generate_answer`, its tokens removed from the
cache before the next (`_remove_answer_from_cache`). Only the token ids are ours — the same
[chat head][context] and [question + instruction + assistant header] our edge composes — so
the answers differ from ours only by the press and by transformers' forward. kvpress compresses
the chat head with the context (its design); its KVzip masks evicted keys instead of dropping
them, so no KV bytes are reported for it.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

# our method name → kvpress class; "full" is kvpress's pipeline with no press (its ceiling)
PRESSES = {"full": None, "kvzip": "KVzipPress", "snapkv": "SnapKVPress",
           "streamingllm": "StreamingLLMPress"}


class KVPressError(RuntimeError):
    """kvpress is missing, or its run failed (the message carries its stderr)."""


@dataclass
class KVPressItem:
    context_ids: list[int]                     # [chat head][context], as our edge composes it
    questions: list[tuple[list[int], int]]     # (question ids, max new tokens)


def _known(name: str) -> str:
    if name not in PRESSES:
        raise KVPressError(f"unknown kvpress method {name!r}; choose one of {sorted(PRESSES)}")
    return name


def make_press(name: str, budget: float):
    """kvpress's press keeping `budget` of the KV (its compression_ratio is the share evicted)."""
    if PRESSES[_known(name)] is None:
        return None
    if not 0 < budget <= 1:
        raise KVPressError(f"budget must be in (0, 1], got {budget}")
    import kvpress

    return getattr(kvpress, PRESSES[name])(compression_ratio=1.0 - budget)


def run_kvpress(model: str, press: str, budget: float, items: list[KVPressItem],
                timeout_s: float = 3600) -> list[dict]:
    """[{answers, compress_s, prefill_s}] per item, from a child process."""
    job = {"model": model, "press": _known(press), "budget": budget, "items": [asdict(i) for i in items]}
    proc = subprocess.run([sys.executable, "-m", "kvedge.bench.kvpress_ref"],
                          input=json.dumps(job), capture_output=True, text=True,
                          timeout=timeout_s)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise KVPressError(f"kvpress {press}@{budget:g} failed (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[-2000:]}")
    return json.loads(lines[-1])


def answer_items(model_name: str, press_name: str, budget: float, items: list[dict]) -> list[dict]:
    """In the child: compress each context once with the press, answer its questions."""
    import torch

    try:
        from kvpress import KVPressTextGenerationPipeline
    except ImportError as err:
        raise KVPressError(f"kvpress is not installed ({err}): pip install 'kvedge[kvpress]'")
    from transformers import DynamicCache

    from kvedge.common.model.models import load_model

    loaded = load_model(model_name)
    model = loaded.model
    model.generation_config.eos_token_id = loaded.tokenizer.eos_token_id  # our decoder's stop
    pipe = KVPressTextGenerationPipeline(model=model, tokenizer=loaded.tokenizer)
    out = []
    with torch.inference_mode():
        for item in items:
            ids = torch.tensor([item["context_ids"]])
            start = time.perf_counter()
            model.model(input_ids=ids, past_key_values=DynamicCache())
            prefill_s = time.perf_counter() - start
            press, cache = make_press(press_name, budget), DynamicCache()
            start = time.perf_counter()
            with press(model) if press is not None else contextlib.nullcontext():
                model.model(input_ids=ids, past_key_values=cache)
            compress_s = time.perf_counter() - start
            answers = []
            for q_ids, max_new in item["questions"]:
                lengths = [cache.get_seq_length(layer) for layer in range(len(cache))]
                answers.append(pipe.generate_answer(torch.tensor([q_ids]), cache, ids.shape[1],
                                                    max_new).strip())
                pipe._remove_answer_from_cache(cache, lengths)
            out.append({"answers": answers, "prefill_s": prefill_s,
                        "compress_s": compress_s if press is not None else None})
    return out


def main() -> None:
    import logging

    logging.disable(logging.WARNING)  # KVzipPress warns about its cost on every construction
    job = json.loads(sys.stdin.read())
    result = answer_items(job["model"], job["press"], job["budget"], job["items"])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
