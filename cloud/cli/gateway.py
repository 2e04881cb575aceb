"""`kvctl cloud up` (run the gateway) and `kvctl token` (issue namespace-scoped tokens)."""
from __future__ import annotations

import click

from kvedge.common.cli import CLOUD_ADDRESS, home_path
from kvedge.common.config import configurable
from kvedge.common.model.models import DEFAULT_MODEL
from kvedge.common.pack.codecs import DEFAULT_CODEC
from kvedge.common.net.tls import server_options


@click.group("cloud")
def cloud_group():
    """Run the cloud gateway."""


@configurable("cloud.up")
@cloud_group.command("up")
@click.option("--data", "data_dir", type=click.Path(), default=None,
              help="catalog, staging and tokens [default: $KVEDGE_HOME/cloud]")
@click.option("--address", default=CLOUD_ADDRESS, show_default=True, help="host:port to listen on")
@click.option("--ray-address", default=None, help="join this Ray cluster (default: start in-process)")
@click.option("--store", "store_url", default=None,
              help="where packs live: a folder or an fsspec URL; s3://bucket/prefix (AWS S3 or "
              "an S3-compatible server) reads its endpoint and keys from the standard AWS "
              "settings: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
              "AWS_DEFAULT_REGION or ~/.aws [default: <data>/store]")
@click.option("--model", "model_name", default=DEFAULT_MODEL, show_default=True)
@click.option("--segment-tokens", default=512, show_default=True)
@click.option("--codec", default=DEFAULT_CODEC, show_default=True,
              help="codec of the base pack variant")
@click.option("--anchored/--alone", default=False, show_default=True,
              help="prefill each segment behind the chat prefix (kept out of the pack) or alone")
@click.option("--side-tensors/--no-side-tensors", default=False, show_default=True,
              help="SamKV's query cache and block summaries in every pack (43 KB a pack on "
              "Qwen2.5-0.5B); without them SamKV scores with the question's query alone")
@click.option("--actors", default=1, show_default=True, help="prefill actors (one model each)")
@click.option("--cpus-per-actor", default=None, type=int, help="[default: all CPUs / actors]")
@click.option("--metrics", "metrics_address", default=None, metavar="HOST:PORT",
              help="serve Prometheus metrics at HOST:PORT/metrics, same TLS as gRPC, no token "
              "[default: off]")
@server_options
def cloud_up(data_dir, address, ray_address, store_url, model_name, segment_tokens, codec,
             anchored, side_tensors, actors, cpus_per_actor, metrics_address, tls_mode,
             tls_cert, tls_key, tls_hosts, tls_client_ca, insecure):
    """Start the gateway (blocks; Ctrl-C or SIGTERM stops it gracefully, and the Ray it
    started, and exits 0)."""
    import logging
    import os
    from pathlib import Path

    import ray

    from kvedge.cloud.gateway import GatewayConfig, serve
    from kvedge.cloud.workers import start_ray
    from kvedge.common.net.metrics import MetricsServer, daemon_registry
    from kvedge.common.net.rpc import StopSignal, run_until_signal
    from kvedge.common.net.tls import check_listen, describe, server_tls

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cpus = cpus_per_actor or max(1, (os.cpu_count() or 1) // actors)
    config = GatewayConfig(Path(data_dir) if data_dir else home_path("cloud"), store_url,
                           model_name, segment_tokens, codec, actors, cpus,
                           anchored=anchored, side_tensors=side_tensors)
    tls = server_tls(config.data_dir, address, tls_mode, tls_cert, tls_key, tls_client_ca,
                     tls_hosts)
    check_listen(address, tls, insecure)  # before Ray starts: a refusal costs nothing
    if metrics_address:
        MetricsServer.check(metrics_address, tls, insecure)
    stop = StopSignal()  # from here a SIGTERM, even during start-up, ends in a clean stop
    start_ray(ray_address, num_cpus=None if ray_address else max(os.cpu_count() or 1, cpus))
    stop.listen()  # ray.init replaced the handlers
    registry = daemon_registry()
    server, gateway, port = serve(config, address, tls=tls, insecure=insecure, registry=registry)
    host, data = address.rsplit(":", 1)[0], config.data_dir
    click.echo(f"gateway listening on {host}:{port} ({describe(tls)}; data {data}, store "
               f"{config.store_url}); admin token in {data / 'admin.token'}", err=True)
    stops = [ray.shutdown]
    if metrics_address:
        scrape = MetricsServer(metrics_address, registry, tls, insecure)
        click.echo(f"metrics on {scrape.url}", err=True)
        stops.insert(0, scrape.stop)
    run_until_signal(server, stop, on_stop=stops)
    click.echo("gateway stopped", err=True)


@cloud_group.command("client-cert")
@click.argument("name")
@click.option("--data", "data_dir", type=click.Path(), default=None,
              help="the gateway's data dir: its --tls auto CA signs [default: $KVEDGE_HOME/cloud]")
@click.option("--out", type=click.Path(file_okay=False), default=".", show_default=True)
def client_cert(name, data_dir, out):
    """Issue a client certificate for mutual TLS (`cloud up --tls auto --tls-client-ca
    <data>/tls/ca.pem`; the edge passes it as --cloud-tls-cert/--cloud-tls-key)."""
    from pathlib import Path

    from kvedge.common.net.auth import check_name
    from kvedge.common.net.tls import issue_client

    root = Path(data_dir) if data_dir else home_path("cloud")
    cert, key = issue_client(root / "tls", check_name("client", name), out)
    click.echo(f"{cert}\n{key}")


@click.command("token")
@click.option("--data", "data_dir", type=click.Path(), default=None,
              help="the gateway's (or edge's) data dir [default: $KVEDGE_HOME/cloud]")
@click.option("--namespace", "-n", "namespaces", multiple=True, required=True)
@click.option("--name", default="user", show_default=True)
def token_cmd(data_dir, namespaces, name):
    """Issue an access token for some namespaces (printed once; only its hash is stored)."""
    from pathlib import Path

    from kvedge.common.net.auth import TokenStore

    root = Path(data_dir) if data_dir else home_path("cloud")
    click.echo(TokenStore(root / "tokens.json").issue(name, list(namespaces)))


COMMANDS = [cloud_group, token_cmd]
