"""`kvctl upload` and `kvctl kb list|status|rm`: knowledge bases on the gateway."""
from __future__ import annotations

import click

from kvedge.cloud.cli.connect import cloud_client, with_cloud
from kvedge.common.cli import advance, echo_json, echo_messages, progress_bar, proto_dict


@click.command("upload")
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@click.option("--name", required=True, help="knowledge base name")
@with_cloud
@click.option("--segment-tokens", default=0, help="tokens per segment [default: the gateway's]")
@click.option("--whole", is_flag=True, help="KBQA mode: the whole KB as one context")
@click.option("--codec", default="", help="pack codec [default: the gateway's]")
@click.option("--no-wait", is_flag=True, help="return once uploaded, before ingest finishes")
def upload_cmd(folder, name, address, token, tls_ca, namespace, segment_tokens, whole, codec,
               no_wait):
    """Upload a folder of .txt/.md files as a knowledge base (unchanged files are skipped)."""
    with cloud_client(address, token, tls_ca) as cloud:
        bar = progress_bar(unit="B", unit_scale=True, desc="upload")

        def sent(done, total):
            advance(bar, done, total)

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
        seg_bar = progress_bar(desc="prefill", unit="seg")

        def ingest(info):
            advance(seg_bar, info.segments_done, info.segments_total or None)

        info = cloud.wait_ready(namespace, name, progress=ingest)
        seg_bar.close()
        click.echo(f"ready: {info.n_files} files, {info.n_tokens} tokens, "
                   f"{len(info.segments)} segments, "
                   f"{sum(s.pack_bytes for s in info.segments) / 1e6:.1f} MB of packs")


@click.group("kb")
def kb_group():
    """List, inspect and remove knowledge bases."""


@kb_group.command("list")
@with_cloud
@click.option("--json", "as_json", is_flag=True)
def kb_list(address, token, tls_ca, namespace, as_json):
    with cloud_client(address, token, tls_ca) as cloud:
        kbs = cloud.list_kbs(namespace)
    echo_messages(kbs, as_json, lambda info: click.echo(
        f"{info.namespace}/{info.kb:24s} {info.status:10s} {info.mode:5s} "
        f"{info.n_files:4d} files {info.n_tokens:8d} tokens {len(info.segments):5d} segments"))


@kb_group.command("status")
@click.argument("name")
@with_cloud
@click.option("--variant", default="", help="a compressed variant [default: base]")
@click.option("--json", "as_json", is_flag=True)
def kb_status(name, address, token, tls_ca, namespace, variant, as_json):
    with cloud_client(address, token, tls_ca) as cloud:
        info = cloud.get_kb(namespace, name, variant)
    if as_json:
        echo_json(proto_dict(info))
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
def kb_rm(name, address, token, tls_ca, namespace):
    with cloud_client(address, token, tls_ca) as cloud:
        cloud.remove_kb(namespace, name)
    click.echo(f"removed {namespace}/{name}")


COMMANDS = [upload_cmd, kb_group]
