"""`kvctl cloud up` (run the gateway) and `kvctl token` (issue namespace-scoped tokens)."""
from __future__ import annotations

import sys

import click

from kvedge.common.cli import CLOUD_ADDRESS, home_path
from kvedge.common.models import DEFAULT_MODEL
from kvedge.common.pack.codecs import DEFAULT_CODEC


@click.group("cloud")
def cloud_group():
    """Run the cloud gateway."""


@cloud_group.command("up")
@click.option("--data", "data_dir", type=click.Path(), default=None,
              help="catalog, staging and tokens [default: $KVEDGE_HOME/cloud]")
@click.option("--address", default=CLOUD_ADDRESS, show_default=True, help="host:port to listen on")
@click.option("--ray-address", default=None, help="join this Ray cluster (default: start in-process)")
@click.option("--store", "store_url", default=None, help="fsspec URL for packs [default: <data>/store]")
@click.option("--model", "model_name", default=DEFAULT_MODEL, show_default=True)
@click.option("--segment-tokens", default=512, show_default=True)
@click.option("--codec", default=DEFAULT_CODEC, show_default=True,
              help="codec of the base pack variant")
@click.option("--anchored/--alone", default=False, show_default=True,
              help="prefill each segment behind the chat prefix (kept out of the pack) or alone")
@click.option("--actors", default=1, show_default=True, help="prefill actors (one model each)")
@click.option("--cpus-per-actor", default=None, type=int, help="[default: all CPUs / actors]")
def cloud_up(data_dir, address, ray_address, store_url, model_name, segment_tokens, codec,
             anchored, actors, cpus_per_actor):
    """Start the gateway (blocks; Ctrl-C or SIGTERM stops it and the Ray it started)."""
    import logging
    import os
    import signal
    from pathlib import Path

    from kvedge.cloud.gateway import GatewayConfig, serve
    from kvedge.cloud.workers import start_ray

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    cpus = cpus_per_actor or max(1, (os.cpu_count() or 1) // actors)
    config = GatewayConfig(Path(data_dir) if data_dir else home_path("cloud"), store_url,
                           model_name, segment_tokens, codec, actors, cpus,
                           anchored=anchored)
    start_ray(ray_address, num_cpus=None if ray_address else max(os.cpu_count() or 1, cpus))
    server, gateway, port = serve(config, address)
    host = address.rsplit(":", 1)[0]
    click.echo(f"gateway listening on {host}:{port} (data {config.data_dir}, store "
               f"{config.store_url}); admin token in {config.data_dir / 'admin.token'}", err=True)
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop(2)
        import ray

        ray.shutdown()


@click.command("token")
@click.option("--data", "data_dir", type=click.Path(), default=None,
              help="the gateway's (or edge's) data dir [default: $KVEDGE_HOME/cloud]")
@click.option("--namespace", "-n", "namespaces", multiple=True, required=True)
@click.option("--name", default="user", show_default=True)
def token_cmd(data_dir, namespaces, name):
    """Issue an access token for some namespaces (printed once; only its hash is stored)."""
    from pathlib import Path

    from kvedge.common.auth import TokenStore

    root = Path(data_dir) if data_dir else home_path("cloud")
    click.echo(TokenStore(root / "tokens.json").issue(name, list(namespaces)))


COMMANDS = [cloud_group, token_cmd]
