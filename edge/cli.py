"""`kvedge`: the edge daemon's command (serving arrives with the pack sync; generation today)."""
from __future__ import annotations

import time

import click

from kvedge.cloud.cli import KvedgeGroup


@click.group(cls=KvedgeGroup)
def main():
    """kvedge edge node."""


@main.command("generate")
@click.argument("prompt")
@click.option("--model", "model_name", default="smollm2-135m-instruct", show_default=True)
@click.option("--max-new-tokens", default=64, show_default=True)
@click.option("--temperature", default=0.0, show_default=True, help="0 = greedy")
@click.option("--seed", default=None, type=int)
def generate_cmd(prompt, model_name, max_new_tokens, temperature, seed):
    """Answer one chat prompt locally with the runtime, streaming tokens."""
    import torch

    from kvedge.common.generate import Sampler, generate
    from kvedge.common.models import load_model
    from kvedge.common.runtime import Runtime
    from kvedge.common.textstream import TextStream

    loaded = load_model(model_name)
    tok, rt = loaded.tokenizer, Runtime(loaded)
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                  add_generation_prompt=True, return_dict=False)
    cache = rt.empty_cache(reserve=len(ids) + max_new_tokens)
    start, stream = time.perf_counter(), TextStream(tok)
    for token in generate(rt, cache, torch.tensor(ids), torch.arange(len(ids)), max_new_tokens,
                          sampler=Sampler(temperature, seed=seed), stop_ids=(tok.eos_token_id,)):
        if token == tok.eos_token_id:
            break
        click.echo(stream.push(token), nl=False)
    click.echo(f"\n[{len(stream.ids)} tokens, {time.perf_counter() - start:.2f} s]", err=True)
