"""`kvedge`: the edge node — `serve` (sync packs, answer over gRPC), `strategies` (the reuse
strategies and their options), `generate` (one local chat answer with the runtime)."""
from __future__ import annotations

import time

import click

from kvedge.common.cli import CLOUD_ADDRESS, EDGE_ADDRESS, KvedgeGroup, RegistryChoice
from kvedge.common.models import DEFAULT_MODEL


def _strategies():
    from kvedge.edge.strategies import STRATEGIES

    return STRATEGIES


@click.group(cls=KvedgeGroup)
def main():
    """kvedge edge node: serve knowledge bases synced from the cloud, list reuse strategies."""


@main.command("generate")
@click.argument("prompt")
@click.option("--model", "model_name", default=DEFAULT_MODEL, show_default=True)
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


@main.command("serve")
@click.option("--cloud", "cloud_address", default=CLOUD_ADDRESS, show_default=True)
@click.option("--cloud-token", default=None,
              help="token for the gateway [default: $KVEDGE_TOKEN or the local admin token]")
@click.option("--kb", "kbs", multiple=True, required=True,
              help="KB to serve: NAME, NS/NAME or NS/NAME@VARIANT (repeatable)")
@click.option("--address", default=EDGE_ADDRESS, show_default=True)
@click.option("--state", "state_dir", type=click.Path(), default=None,
              help="pack cache and KB manifests [default: $KVEDGE_HOME/edge]")
@click.option("--model", "model_name", default=DEFAULT_MODEL, show_default=True)
@click.option("--strategy", default="a3", show_default=True, type=RegistryChoice(_strategies),
              help="default reuse strategy")
@click.option("--top-k", default=3, show_default=True)
@click.option("--max-new-tokens", default=48, show_default=True)
@click.option("--sync-interval", default=5.0, show_default=True, help="seconds between syncs")
@click.option("--cache-bytes", default=0, help="pack cache budget (0 = unbounded); served KBs "
              "are pinned")
def serve_cmd(cloud_address, cloud_token, kbs, address, state_dir, model_name, strategy, top_k,
              max_new_tokens, sync_interval, cache_bytes):
    """Sync the given KBs' packs from the cloud and answer questions about them."""
    import logging
    import signal
    import sys
    from pathlib import Path

    from kvedge.common.cli import home_path
    from kvedge.common.cloud_client import CloudClient
    from kvedge.common.models import load_model
    from kvedge.common.rpc import read_token
    from kvedge.edge.engine import EdgeEngine
    from kvedge.edge.packcache import PackCache
    from kvedge.edge.server import serve
    from kvedge.edge.sync import Syncer, Target

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    state = Path(state_dir) if state_dir else home_path("edge")
    targets = [Target.parse(spec) for spec in kbs]
    loaded = load_model(model_name)
    cache = PackCache(state / "packs", loaded.fingerprint, cache_bytes)
    cloud = CloudClient(cloud_address, read_token(cloud_token, home_path("cloud", "admin.token")))
    syncer = Syncer(cloud, cache, state, targets, loaded.tokenizer.decode)
    engine = EdgeEngine(loaded, cache, state)
    server, port = serve(engine, state, address, syncer, sync_interval, default_strategy=strategy,
                         top_k=top_k, max_new_tokens=max_new_tokens)
    click.echo(f"edge listening on {address.rsplit(':', 1)[0]}:{port}, serving "
               f"{[t.key for t in targets]} from {cloud_address}; token in {state / 'edge.token'}",
               err=True)
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        pass
    finally:
        syncer.stop()
        server.stop(2)


@main.command("strategies")
def strategies_cmd():
    """The reuse strategies this edge can answer with, and their options (kvctl ask --opt)."""
    import sys

    from kvedge.common.registry import describe
    from kvedge.edge.strategies import STRATEGIES

    for name, cls in STRATEGIES.items():
        doc = (sys.modules[cls.__module__].__doc__ or "").strip().splitlines()[0]
        click.echo(f"{name:12s} {doc}")
        for line in describe(cls):
            click.echo(f"{'':14s}{line}")
