"""`kvctl`: the operator's and user's control tool (models, packs, demo; uploads and jobs later)."""
from __future__ import annotations

import sys

import click

from kvedge.common.errors import KvedgeError

CLOUD_ADDRESS = "127.0.0.1:50051"
EDGE_ADDRESS = "127.0.0.1:50052"


def home_path(*parts):
    from kvedge.common.models import kvedge_home

    return kvedge_home().joinpath(*parts)


class KvedgeGroup(click.Group):
    """Turns kvedge's named errors into one clear line and exit code 2, not a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KvedgeError as err:
            click.echo(f"error: {type(err).__name__}: {err}", err=True)
            sys.exit(2)


@click.group(cls=KvedgeGroup)
def kvctl():
    """kvedge control: models, packs, the demo."""


def _register_groups():
    from kvedge.bench.__main__ import bench
    from kvedge.common.pack.cli import pack

    kvctl.add_command(pack)
    kvctl.add_command(bench)


_register_groups()


@kvctl.command("models")
def models_cmd():
    """List the models kvedge can load (and whether their files are installed)."""
    from kvedge.common.models import REGISTRY

    for entry in REGISTRY.values():
        ok, where = entry.available()
        click.echo(f"{entry.name:24s} {'ok ' if ok else 'missing'}  {entry.description}")
        if not ok:
            click.echo(f"{'':24s}   {where}")
    click.echo("(any local Hugging Face folder path works as a model too)")


@kvctl.group("model")
def model_group():
    """Check a model before trusting it."""


@model_group.command("verify")
@click.option("--model", "model_name", required=True, help="registered name or local folder")
@click.option("--tokens", default=96, show_default=True, help="random prompt length")
@click.option("--tolerance", default=1e-4, show_default=True, help="max |Δlogits| allowed")
def verify_cmd(model_name, tokens, tolerance):
    """Runtime vs the transformers forward: max |Δlogits| per mode; non-zero exit above tolerance."""
    from kvedge.common.models import load_model
    from kvedge.common.runtime import Runtime
    from kvedge.common.verify import verify_runtime

    loaded = load_model(model_name)
    click.echo(f"model {loaded.name}  fingerprint {loaded.fingerprint[:16]}  "
               f"({loaded.config.model_type}, {loaded.config.num_hidden_layers} layers)")
    checks = verify_runtime(Runtime(loaded), n_tokens=tokens, tolerance=tolerance)
    for check in checks:
        click.echo(f"  {'ok  ' if check.ok else 'FAIL'} {check.name:48s} "
                   f"max|Δlogits| = {check.max_abs_diff:.2e}")
    if not all(c.ok for c in checks):
        click.echo(f"runtime is NOT exact on this model (tolerance {tolerance:g})", err=True)
        sys.exit(1)
    click.echo(f"runtime is exact on this model (tolerance {tolerance:g})")


def main():  # pragma: no cover - console-script convenience
    kvctl()


# ---------------------------------------------------------------------- cloud gateway

@kvctl.group("cloud")
def cloud_group():
    """Run the cloud gateway."""


@cloud_group.command("up")
@click.option("--data", "data_dir", type=click.Path(), default=None,
              help="catalog, staging and tokens [default: $KVEDGE_HOME/cloud]")
@click.option("--address", default=CLOUD_ADDRESS, show_default=True, help="host:port to listen on")
@click.option("--ray-address", default=None, help="join this Ray cluster (default: start in-process)")
@click.option("--store", "store_url", default=None, help="fsspec URL for packs [default: <data>/store]")
@click.option("--model", "model_name", default="smollm2-135m-instruct", show_default=True)
@click.option("--segment-tokens", default=512, show_default=True)
@click.option("--codec", default="fp16", show_default=True, help="codec of the base pack variant")
@click.option("--actors", default=1, show_default=True, help="prefill actors (one model each)")
@click.option("--cpus-per-actor", default=None, type=int, help="[default: all CPUs / actors]")
def cloud_up(data_dir, address, ray_address, store_url, model_name, segment_tokens, codec, actors,
             cpus_per_actor):
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
                           model_name, segment_tokens, codec, actors, cpus)
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


def _cloud(address, token):
    from kvedge.cloud.client import CloudClient
    from kvedge.common.rpc import read_token

    return CloudClient(address, read_token(token, home_path("cloud", "admin.token")))


cloud_options = [
    click.option("--cloud", "address", default=CLOUD_ADDRESS, show_default=True,
                 help="gateway address"),
    click.option("--token", default=None, help="[default: $KVEDGE_TOKEN or the local admin token]"),
    click.option("--namespace", "-n", default="default", show_default=True),
]


def with_cloud(fn):
    for option in reversed(cloud_options):
        fn = option(fn)
    return fn


@kvctl.command("upload")
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@click.option("--name", required=True, help="knowledge base name")
@with_cloud
@click.option("--segment-tokens", default=0, help="tokens per segment [default: the gateway's]")
@click.option("--whole", is_flag=True, help="KBQA mode: the whole KB as one context")
@click.option("--codec", default="", help="pack codec [default: the gateway's]")
@click.option("--no-wait", is_flag=True, help="return once uploaded, before ingest finishes")
def upload_cmd(folder, name, address, token, namespace, segment_tokens, whole, codec, no_wait):
    """Upload a folder of .txt/.md files as a knowledge base (unchanged files are skipped)."""
    from tqdm import tqdm

    with _cloud(address, token) as cloud:
        bar = tqdm(unit="B", unit_scale=True, desc="upload", leave=True)

        def sent(done, total):
            bar.total = total
            bar.n = done
            bar.refresh()

        reply = cloud.upload(folder, namespace, name, segment_tokens=segment_tokens, whole=whole,
                             codec=codec, progress=sent)
        bar.close()
        click.echo(f"{namespace}/{name}: {reply.files_received} file(s) sent, "
                   f"{reply.files_skipped} unchanged")
        if reply.ignored:
            click.echo(f"not uploaded (only .txt/.md are ingested): {', '.join(reply.ignored)}",
                       err=True)
        if no_wait:
            return
        seg_bar = tqdm(desc="prefill", unit="seg")

        def ingest(info):
            seg_bar.total = info.segments_total or None
            seg_bar.n = info.segments_done
            seg_bar.refresh()

        info = cloud.wait_ready(namespace, name, progress=ingest)
        seg_bar.close()
        click.echo(f"ready: {info.n_files} files, {info.n_tokens} tokens, "
                   f"{len(info.segments)} segments, "
                   f"{sum(s.pack_bytes for s in info.segments) / 1e6:.1f} MB of packs")


@kvctl.group("kb")
def kb_group():
    """List, inspect and remove knowledge bases."""


@kb_group.command("list")
@with_cloud
def kb_list(address, token, namespace):
    with _cloud(address, token) as cloud:
        for info in cloud.list_kbs(namespace):
            click.echo(f"{info.namespace}/{info.kb:24s} {info.status:10s} {info.mode:5s} "
                       f"{info.n_files:4d} files {info.n_tokens:8d} tokens "
                       f"{len(info.segments):5d} segments")


@kb_group.command("status")
@click.argument("name")
@with_cloud
@click.option("--variant", default="", help="a compressed variant [default: base]")
@click.option("--json", "as_json", is_flag=True)
def kb_status(name, address, token, namespace, variant, as_json):
    from google.protobuf.json_format import MessageToDict

    with _cloud(address, token) as cloud:
        info = cloud.get_kb(namespace, name, variant)
    if as_json:
        import json

        click.echo(json.dumps(MessageToDict(info), indent=1))
        return
    click.echo(f"{info.namespace}/{info.kb} [{info.variant or 'base'}]: {info.status} "
               f"{info.error}".rstrip())
    click.echo(f"  mode {info.mode}, {info.n_files} files, {info.n_tokens} tokens, "
               f"{info.segments_done}/{info.segments_total} segments, model "
               f"{info.model_fingerprint[:16]}, variants {list(info.variants)}")
    packed = sum(s.pack_bytes for s in info.segments)
    fp16 = sum(s.fp16_bytes for s in info.segments)
    if fp16:
        click.echo(f"  packs {packed / 1e6:.2f} MB vs fp16 full KV {fp16 / 1e6:.2f} MB "
                   f"({fp16 / packed:.2f}× smaller)")


@kb_group.command("rm")
@click.argument("name")
@with_cloud
def kb_rm(name, address, token, namespace):
    with _cloud(address, token) as cloud:
        cloud.remove_kb(namespace, name)
    click.echo(f"removed {namespace}/{name}")


@kvctl.command("token")
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


# ---------------------------------------------------------------------- asking an edge

@kvctl.command("ask")
@click.argument("question")
@click.option("--kb", required=True)
@click.option("--namespace", "-n", default="default", show_default=True)
@click.option("--strategy", default="", help="recompute | full-reuse | pie | a3 [default: the edge's]")
@click.option("--top-k", default=0, help="segments to retrieve [default: the edge's]")
@click.option("--max-new-tokens", default=0)
@click.option("--ratio", default=0.0, help="recompute ratio for a3")
@click.option("--edge", "address", default=EDGE_ADDRESS, show_default=True)
@click.option("--token", default=None, help="[default: $KVEDGE_TOKEN or the local edge token]")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object at the end")
def ask_cmd(question, kb, namespace, strategy, top_k, max_new_tokens, ratio, address, token,
            as_json):
    """Ask an edge daemon a question about a knowledge base; the answer streams."""
    import json

    from google.protobuf.json_format import MessageToDict

    from kvedge.common.rpc import read_token
    from kvedge.edge.client import EdgeClient

    with EdgeClient(address, read_token(token, home_path("edge", "edge.token"))) as edge:
        for event in edge.ask(namespace, kb, question, strategy=strategy, top_k=top_k,
                              max_new_tokens=max_new_tokens, ratio=ratio):
            if isinstance(event, str):
                if not as_json:
                    click.echo(event, nl=False)
                continue
            if as_json:
                click.echo(json.dumps(MessageToDict(event, always_print_fields_with_no_presence=True)))
            else:
                click.echo(f"\n[{event.strategy}: TTFT {event.ttft_s:.3f} s, TPOT "
                           f"{event.tpot_s * 1000:.0f} ms, {event.tokens} tokens, segments "
                           f"{list(event.segments)}, {event.bytes_loaded / 1e6:.2f} MB of packs]",
                           err=True)


@kvctl.command("demo")
@click.option("--model", "model_name", default="smollm2-135m-instruct", show_default=True)
@click.option("--keep", is_flag=True, help="keep the demo's data folder")
@click.option("--codec", default="int8", show_default=True, help="pack codec")
@click.option("--kb-dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="another KB folder with a questions.json [default: the bundled one]")
def demo_cmd(model_name, keep, codec, kb_dir):
    """Gateway + edge on this machine: upload the bundled KB, ask its questions, compare."""
    from kvedge.cloud.demo import DEMO_KB, run_demo

    ok = run_demo(model_name, keep=keep, echo=click.echo, codec=codec, kb_dir=kb_dir or DEMO_KB)
    sys.exit(0 if ok else 1)


@kvctl.command("needle")
@click.option("--model", "model_name", default="smollm2-135m-instruct", show_default=True)
@click.option("--tokens", default=1500, show_default=True, help="haystack length")
@click.option("--seed", default=0, show_default=True)
def needle_cmd(model_name, tokens, seed):
    """The runtime alone: a needle question over realigned segment KV vs full recompute."""
    from kvedge.cloud.needle import run_needle_demo

    ok = run_needle_demo(model_name, tokens, seed, echo=click.echo)
    sys.exit(0 if ok else 1)


# ---------------------------------------------------------------------- batch jobs

@kvctl.group("job")
def job_group():
    """Batch compression jobs: new pack variants per (method, budget, codec)."""


def _print_job(job):
    fails = f", {len(job.failures)} failed" if job.failures else ""
    click.echo(f"{job.job_id}  {job.status:9s} {job.method}@{job.budget:g} {job.codec:12s} "
               f"{job.done}/{job.total} contexts{fails}  → variant {job.variant}  "
               f"kbs {list(job.kbs)}")
    for f in job.failures:
        click.echo(f"    {f.kb} segment {f.segment}: {f.error}")


@job_group.command("submit")
@click.option("--kb", "kbs", multiple=True, required=True, help="repeatable")
@click.option("--method", required=True,
              help="contrastkv | kvzip | snapkv | streamingllm | random | none (codec only)")
@click.option("--budget", type=float, default=1.0, show_default=True,
              help="fraction of KV pairs kept")
@click.option("--codec", default="fp16", show_default=True)
@with_cloud
@click.option("--wait/--no-wait", default=True, show_default=True)
def job_submit(kbs, method, budget, codec, address, token, namespace, wait):
    """Compress every context of the KBs; the result is a new variant of each KB."""
    from tqdm import tqdm

    with _cloud(address, token) as cloud:
        job = cloud.submit_job(namespace, list(kbs), method, budget, codec)
        click.echo(f"job {job.job_id} submitted: {job.total} contexts → variant {job.variant}")
        if not wait:
            return
        bar = tqdm(total=job.total, unit="ctx", desc=job.job_id)
        for job in cloud.watch_job(namespace, job.job_id):
            bar.n = job.done
            bar.refresh()
        bar.close()
        _print_job(job)
        if job.status != "done":
            sys.exit(1)


@job_group.command("status")
@click.argument("job_id")
@with_cloud
def job_status(job_id, address, token, namespace):
    with _cloud(address, token) as cloud:
        _print_job(cloud.get_job(namespace, job_id))


@job_group.command("list")
@with_cloud
def job_list(address, token, namespace):
    with _cloud(address, token) as cloud:
        for job in cloud.list_jobs(namespace):
            _print_job(job)


@job_group.command("cancel")
@click.argument("job_id")
@with_cloud
def job_cancel(job_id, address, token, namespace):
    with _cloud(address, token) as cloud:
        _print_job(cloud.cancel_job(namespace, job_id))
